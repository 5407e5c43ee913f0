//! What the benchmark measures: the request and the backends every variant gets ([`requests`]),
//! the variants side by side ([`variants`]), and how a request is driven through one
//! ([`drive`]). The criterion groups, the profiling mode and the report of the targets of
//! `docs/PERFORMANCE.md` are in `benches/overhead/`.

pub mod drive;
pub mod requests;
pub mod variants;

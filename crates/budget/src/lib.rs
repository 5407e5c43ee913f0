//! `stormguard-budget`: a retry budget, so that retries stay a small fraction of traffic.
//!
//! # The problem
//!
//! Retries add availability only while failures are rare. When a backend's error rate climbs
//! (0.01% → 5%) and every client retries 3 times, the retries multiply the load on the one system
//! that is already struggling: 12k requests per second become 45k within seconds and the backend
//! falls over completely. A per-request attempt limit does not stop that: it bounds the retries of
//! one request, not the retries of the whole client.
//!
//! A retry budget bounds the retries of the whole client: retries may be at most a fixed fraction
//! of the traffic that is working. The Google SRE book ("Handling Overload") gives each client a
//! budget of 10%: a retried request is only sent while retries are below 10% of requests; Finagle
//! and Linkerd ship the same idea as `RetryBudget` / `retryBudget`, tower as `TpsBudget`.
//!
//! # The algorithm
//!
//! [`RetryBudget`] keeps a sliding window of `ttl` (10 s by default) in 10 slices of `ttl / 10`:
//! the workspace's one lock-free sliding window, [`stormguard_numbers::window::SlidingWindow`],
//! with three counters per slice (deposits, withdrawals, refusals).
//! Each **successful response** [deposits](RetryBudget::deposit) into the current slice; each
//! retry [withdraws](RetryBudget::withdraw) from it, and is granted only if the retries in the
//! window, counting this one, stay within
//!
//! ```text
//! retries ≤ ratio × successes + min_per_sec × ttl
//! ```
//!
//! Every retry is checked against the window that ends when it is granted. Slices older than the
//! window drop out whole, one slice at a time: there is no reset cliff where a full budget
//! appears at once.
//!
//! A retry that is granted but then never sent (its caller gave up during the backoff) is given
//! back: [`RetryBudget::ticket`] grants it as a [`Ticket`], which, dropped before the attempt it
//! paid for was sent, takes the grant out of the slice it was counted in, as if it had never been
//! granted. The retry engine holds one for every attempt after a request's first (retries,
//! hedges, continuations, a failover's moves). Whether the budget would grant a retry is asked
//! with [`RetryBudget::would_grant`], which withdraws nothing.
//!
//! **Why deposits are per success, not per request.** Finagle, Linkerd and tower deposit on every
//! request. Then a backend that fails every request still earns its clients `ratio` retries per
//! request: 20% more load on a service that is down, for as long as it is down. Depositing on
//! success ties the budget to what the backend can do: at a 5% error rate successes are 95% of
//! requests and every failure still finds a retry, while in a total outage successes stop, the
//! budget dries up within one window, and only the small `min_per_sec` floor is left.
//!
//! **Exact arithmetic.** Balances are integers: a retry costs 1 000 000 units and a success
//! earns `ratio × 1 000 000` (rounded), so a ratio of 0.6 is 0.6, not a rounded-down "one retry
//! per deposit" (tower's `TpsBudget` truncates `1 / ratio` to an integer, and grants 10 retries
//! for 10 deposits at 0.6).
//!
//! **Lock-free and never overdrawn.** `deposit` and `withdraw` take no lock. The window's counters
//! are single atomic words that pack the slice's number with the count, so moving a slot on to a
//! new slice and counting into it is one compare-and-swap, and two threads cannot both reset it;
//! each slice's counters sit on cache lines of their own (see the window's docs). A withdrawal
//! sums the window and then commits with a compare-and-swap on the current slice's count that
//! fails if any other withdrawal got in between, so of several threads racing for the last retry
//! exactly one gets it (tower's `TpsBudget` sums and adds in two separate steps, and concurrent
//! withdrawals pass the limit together). The full argument, including slice boundaries, is on the
//! (private) withdrawal code; tests race threads against it, also while the clock crosses slice
//! boundaries, and a loom model (`tests/loom.rs`, run with `RUSTFLAGS="--cfg stormguard_loom"`,
//! which puts the window's atomics and the budget's own on loom's models) checks every
//! interleaving of racing withdrawals, deposits and refunds within a slice.
//!
//! # Defaults
//!
//! [`RetryBudget::default`] is a 10 s window ([`DEFAULT_TTL`], as in Finagle, Linkerd and tower),
//! ratio 0.1 ([`DEFAULT_RATIO`], the SRE book's 10%; those libraries use 0.2 but count every
//! request), and a floor of 1 retry per second ([`DEFAULT_MIN_PER_SEC`]; they use 10). The floor
//! is small on purpose: with deposits per success, in a total outage the floor is every retry the
//! client sends, so 10 per second per client, times a fleet of clients, would be a storm of its
//! own. One per second still lets a quiet client, with too few successes to earn a retry, retry
//! its occasional failure.
//!
//! # On the server
//!
//! Clients do not always behave. [`ShedRetriesLayer`] puts the same budget in front of a server
//! (an axum `Router`, any tower `Service` over `http`): it reads how many times a request was
//! already tried ([`previous_attempts`]: `x-retry-attempt`, `grpc-previous-rpc-attempts`,
//! `x-stainless-retry-count`, `x-envoy-attempt-count`), deposits the server's successful
//! responses, and answers retries beyond the budget itself, without calling the handler, with
//! stormguard's one refusal ([`stormguard_classify::refusal_response`]): `503` with
//! `x-should-retry: false`, or for gRPC `UNAVAILABLE` with `grpc-retry-pushback-ms: -1`. First
//! attempts always pass. See [`shed`].
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use stormguard_budget::RetryBudget;
//!
//! // One budget for every client of one backend: clones share it.
//! let budget = RetryBudget::default();
//! let for_another_client = budget.clone();
//!
//! for _ in 0..200 {
//!     budget.deposit(); // a successful response
//! }
//! // 200 successes × 0.1 + 1 per second × 10 s.
//! let granted = (0..100).filter(|_| for_another_client.withdraw()).count();
//! assert_eq!(granted, 30);
//!
//! let snapshot = budget.snapshot();
//! assert_eq!((snapshot.balance, snapshot.withdrawals, snapshot.rejected), (0, 30, 70));
//! ```
//!
//! [`RetryBudget`] also implements tower's `retry::budget::Budget`, so a `tower::retry::Policy`
//! can use it in place of `TpsBudget`.

mod attempt;
mod budget;
mod config;
pub mod shed;
mod sync;
mod tokens;

pub use attempt::previous_attempts;
pub use budget::{
    BudgetSnapshot, DEFAULT_MIN_PER_SEC, DEFAULT_RATIO, DEFAULT_TTL, RetryBudget, Ticket,
};
pub use config::BudgetConfig;
pub use shed::{ShedRetries, ShedRetriesLayer};
pub use tokens::{MAX_RETRY_TOKENS, RetryTokens};

//! Bodies: request bodies the engine replays, and the response body it hands back.

mod buffer;
mod replay;
mod response;

pub(crate) use buffer::Collected;
pub use replay::{PartialBody, ReplayBody};
pub use response::ResponseBody;
pub(crate) use response::Tail;

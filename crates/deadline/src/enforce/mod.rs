//! Enforcing a deadline: what a layer hands back when the deadline passes.
//!
//! Two shapes, chosen by a type parameter of the layer:
//!
//! - [`ReturnError`] (client default): the service fails with a [`DeadlineExceeded`] error, boxed
//!   like every tower error (`Error =` [`BoxError`]).
//! - [`Respond`]: the service answers with a response instead, so that its error type stays the
//!   inner service's (axum requires `Infallible`). The response is stormguard's one refusal shape,
//!   [`refusal_response`], for a fatal, not accepted [`Reason::DeadlineExceeded`]: HTTP
//!   `504 Gateway Timeout` with `x-should-retry: false`, or for gRPC requests a trailers-only `200`
//!   with `content-type: application/grpc`, `grpc-status: 4` (`DEADLINE_EXCEEDED`),
//!   `grpc-message: deadline exceeded` and `grpc-retry-pushback-ms: -1`. The caller's time is
//!   spent, so a retry could only add load for an answer nobody waits for. The body is
//!   `RB::default()`.
//!
//! [`Reason::DeadlineExceeded`]: stormguard_classify::Reason::DeadlineExceeded

mod future;

pub use future::ResponseFuture;

use http::Response;
use stormguard_classify::{BoxError, refusal_response};

use crate::DeadlineExceeded;
use crate::error::EXPIRED;

/// What a deadline layer hands back in place of the inner service's result.
pub trait OnExpiry<Res, E> {
    /// The layer's error type.
    type Error;

    /// The deadline passed (`grpc`: the request was a gRPC call).
    fn expired(grpc: bool) -> Result<Res, Self::Error>;

    /// The inner service failed.
    fn inner_error(error: E) -> Self::Error;
}

/// Fail with a boxed [`DeadlineExceeded`] (and box the inner service's errors).
#[derive(Clone, Copy, Debug, Default)]
pub struct ReturnError;

impl<Res, E> OnExpiry<Res, E> for ReturnError
where
    E: Into<BoxError>,
{
    type Error = BoxError;

    fn expired(_grpc: bool) -> Result<Res, BoxError> {
        Err(Box::new(DeadlineExceeded::new()))
    }

    fn inner_error(error: E) -> BoxError {
        error.into()
    }
}

/// Answer with a response: HTTP 504, or gRPC `DEADLINE_EXCEEDED`, marked "do not retry" (see the
/// [module docs](self)).
#[derive(Clone, Copy, Debug, Default)]
pub struct Respond;

impl<RB, E> OnExpiry<Response<RB>, E> for Respond
where
    RB: Default,
{
    type Error = E;

    fn expired(grpc: bool) -> Result<Response<RB>, E> {
        Ok(refusal_response(&EXPIRED, grpc))
    }

    fn inner_error(error: E) -> E {
        error
    }
}

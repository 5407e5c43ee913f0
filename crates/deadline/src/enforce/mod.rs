//! Enforcing a deadline: what a layer hands back when the deadline passes.
//!
//! Two shapes, chosen by a type parameter of the layer:
//!
//! - [`ReturnError`] (client default): the service fails with a [`DeadlineExceeded`] error, boxed
//!   like every tower error (`Error = BoxError`).
//! - [`Respond`]: the service answers with a response instead, so that its error type stays the
//!   inner service's (axum requires `Infallible`): HTTP `504 Gateway Timeout`, or for gRPC requests
//!   a trailers-only `200` with `content-type: application/grpc` and `grpc-status: 4`
//!   (`DEADLINE_EXCEEDED`), as gRPC's "PROTOCOL-HTTP2" specification prescribes for errors raised
//!   before any message. The body is `RB::default()`.

mod future;

pub use future::ResponseFuture;

use http::{HeaderValue, Response, StatusCode};
pub use stormguard_classify::BoxError;
use stormguard_classify::GrpcCode;
use stormguard_classify::headers::{GRPC_MESSAGE, GRPC_STATUS, mark_do_not_retry};

use crate::DeadlineExceeded;

/// What a deadline layer hands back in place of the inner service's result.
pub trait OnExpiry<Res, E> {
    /// The layer's error type.
    type Error;

    /// The deadline passed (`grpc`: the request was a gRPC call).
    fn expired(grpc: bool) -> Result<Res, Self::Error>;

    /// The inner service failed.
    fn inner_error(error: E) -> Self::Error;

    /// The request body, read to estimate the deadline, failed or exceeded the read limit.
    fn unreadable_body(error: BoxError, grpc: bool) -> Result<Res, Self::Error>;
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

    fn unreadable_body(error: BoxError, _grpc: bool) -> Result<Res, BoxError> {
        Err(error)
    }
}

/// Answer with a response: HTTP 504, or gRPC `DEADLINE_EXCEEDED` (see the [module docs](self)).
/// An unreadable request body is answered with HTTP 400 or gRPC `INVALID_ARGUMENT`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Respond;

impl<RB, E> OnExpiry<Response<RB>, E> for Respond
where
    RB: Default,
{
    type Error = E;

    fn expired(grpc: bool) -> Result<Response<RB>, E> {
        Ok(expired_response(grpc))
    }

    fn inner_error(error: E) -> E {
        error
    }

    fn unreadable_body(_error: BoxError, grpc: bool) -> Result<Response<RB>, E> {
        Ok(if grpc {
            grpc_response(GrpcCode::InvalidArgument, "request body could not be read")
        } else {
            status_response(StatusCode::BAD_REQUEST)
        })
    }
}

/// The response for a request whose deadline passed: 504, or gRPC status 4 for gRPC requests,
/// marked "do not retry" (`x-should-retry: false` / `grpc-retry-pushback-ms: -1`): the caller's
/// deadline is spent, so a retry could only add load for an answer nobody waits for.
pub(crate) fn expired_response<RB: Default>(grpc: bool) -> Response<RB> {
    let mut response = if grpc {
        grpc_response(GrpcCode::DeadlineExceeded, "deadline exceeded")
    } else {
        status_response(StatusCode::GATEWAY_TIMEOUT)
    };
    mark_do_not_retry(response.headers_mut(), grpc);
    response
}

fn status_response<RB: Default>(status: StatusCode) -> Response<RB> {
    let mut response = Response::new(RB::default());
    *response.status_mut() = status;
    response
}

fn grpc_response<RB: Default>(code: GrpcCode, message: &'static str) -> Response<RB> {
    let mut response = Response::new(RB::default());
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(GRPC_STATUS, HeaderValue::from(code.as_i32()));
    headers.insert(GRPC_MESSAGE, HeaderValue::from_static(message));
    response
}

//! Turning the client pipeline's own errors into responses, for gateways.

use http::{HeaderValue, Response, StatusCode, header};
use stormguard_adaptive_throttle::Throttled;
use stormguard_classify::headers::{
    GRPC_MESSAGE, GRPC_RETRY_PUSHBACK_MS, GRPC_STATUS, X_SHOULD_RETRY,
};
use stormguard_classify::{BoxError, GrpcCode};
use stormguard_deadline::DeadlineExceeded;
use stormguard_retry::GaveUp;

/// What a gateway should answer when its upstream call through a [`ClientLayer`](crate::ClientLayer)
/// failed with `error` instead of returning a response.
///
/// Every answer tells the caller not to retry (`x-should-retry: false`, honoured by the official
/// OpenAI and Anthropic SDKs; gRPC `grpc-retry-pushback-ms: -1`, gRFC A6): the gateway already
/// retried as much as the budget allows, and retrying at one layer only is what keeps 3 x 3 = 9
/// attempts per call from happening.
///
/// | error | HTTP | gRPC |
/// |---|---|---|
/// | [`Throttled`] (backend rejecting, dropped locally) | 503 | UNAVAILABLE |
/// | [`DeadlineExceeded`] | 504 | DEADLINE_EXCEEDED |
/// | [`GaveUp`] or any other transport failure | 502 | UNAVAILABLE |
///
/// Pass `grpc = true` when answering a gRPC request (see
/// [`is_grpc`](stormguard_classify::is_grpc) on the request headers).
pub fn error_response<B: Default>(error: &BoxError, grpc: bool) -> Response<B> {
    let (status, code) = if find::<Throttled>(error) {
        (StatusCode::SERVICE_UNAVAILABLE, GrpcCode::Unavailable)
    } else if find::<DeadlineExceeded>(error) {
        (StatusCode::GATEWAY_TIMEOUT, GrpcCode::DeadlineExceeded)
    } else {
        (StatusCode::BAD_GATEWAY, GrpcCode::Unavailable)
    };
    let mut response = Response::new(B::default());
    if grpc {
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.insert(GRPC_STATUS, HeaderValue::from(code.as_i32()));
        headers.insert(GRPC_MESSAGE, HeaderValue::from_static("upstream%20failed"));
        headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("-1"));
    } else {
        *response.status_mut() = status;
        response
            .headers_mut()
            .insert(X_SHOULD_RETRY, HeaderValue::from_static("false"));
    }
    response
}

/// Whether an error of type `E` is `error` or anywhere in its source chain.
fn find<E: std::error::Error + 'static>(error: &BoxError) -> bool {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error.as_ref());
    while let Some(current) = next {
        if current.is::<E>() {
            return true;
        }
        // A retry engine that gave up wraps the last error; look through it.
        if let Some(gave_up) = current.downcast_ref::<GaveUp>() {
            next = std::error::Error::source(gave_up);
            continue;
        }
        next = current.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use stormguard_classify::headers::{GRPC_RETRY_PUSHBACK_MS, X_SHOULD_RETRY};

    #[test]
    fn each_local_error_gets_its_status_and_a_do_not_retry_mark() {
        let throttled: BoxError = Box::new(Throttled);
        let response: Response<()> = error_response(&throttled, false);
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[X_SHOULD_RETRY], "false");

        let expired: BoxError = Box::new(DeadlineExceeded::new());
        let response: Response<()> = error_response(&expired, false);
        assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);

        let refused: BoxError =
            Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let response: Response<()> = error_response(&refused, false);
        assert_eq!(response.status(), StatusCode::BAD_GATEWAY);

        let grpc: Response<()> = error_response(&expired, true);
        assert_eq!(grpc.status(), StatusCode::OK);
        assert_eq!(grpc.headers()[GRPC_STATUS], "4");
        assert_eq!(grpc.headers()[GRPC_RETRY_PUSHBACK_MS], "-1");
    }
}

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::Response;
use pin_project_lite::pin_project;

use super::{is_success, shed_response};
use crate::RetryBudget;

pin_project! {
    /// Response future of [`RetryBudgetService`](super::RetryBudgetService): the handler's
    /// response (depositing it in the budget if it is a success), or the shed response.
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Called {
            #[pin]
            future: F,
            budget: RetryBudget,
        },
        Shed {
            grpc_content_type: Option<http::HeaderValue>,
        },
    }
}

impl<F> ResponseFuture<F> {
    pub(super) fn called(future: F, budget: RetryBudget) -> Self {
        Self {
            state: State::Called { future, budget },
        }
    }

    /// `grpc_content_type`: the request's gRPC content type, `None` for plain HTTP.
    pub(super) fn shed(grpc_content_type: Option<http::HeaderValue>) -> Self {
        Self {
            state: State::Shed { grpc_content_type },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: Default,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Called { future, budget } => {
                let result = ready!(future.poll(cx));
                if let Ok(response) = &result
                    && is_success(response)
                {
                    budget.deposit();
                }
                Poll::Ready(result)
            }
            StateProj::Shed { grpc_content_type } => {
                Poll::Ready(Ok(shed_response(grpc_content_type.clone())))
            }
        }
    }
}

impl<F> std::fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Called { .. } => "called",
            State::Shed { .. } => "shed",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

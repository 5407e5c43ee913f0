use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::Response;
use pin_project_lite::pin_project;
use stormguard_classify::refusal_response;

use super::{SHED, is_success};
use crate::RetryBudget;

pin_project! {
    /// Response future of [`ShedRetries`](super::ShedRetries): the handler's response (depositing
    /// it in the budget if it is a success), or the refusal of a shed retry.
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
            // Whether the refusal is a gRPC one.
            grpc: bool,
        },
    }
}

impl<F> ResponseFuture<F> {
    pub(super) fn called(future: F, budget: RetryBudget) -> Self {
        Self {
            state: State::Called { future, budget },
        }
    }

    /// `grpc`: whether the shed request is a gRPC one.
    pub(super) fn shed(grpc: bool) -> Self {
        Self {
            state: State::Shed { grpc },
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
            StateProj::Shed { grpc } => Poll::Ready(Ok(refusal_response(&SHED, *grpc))),
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

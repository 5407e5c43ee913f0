//! The kit stormguard's tests share, as `tower-test` and `tokio-test` are for their projects.
//!
//! - [`ScriptedBody`]: a body that plays its steps in order (data, delays, errors, a hang, one
//!   `Pending`), on tokio's clock, so that tests on the paused clock drive it exactly; it can hold
//!   a token while it lives and count itself cancelled when dropped before its end.
//! - [`ScriptedBackend`]: a tower `Service` that records every request it saw ([`Seen`], in a
//!   shared [`Log`]) and answers from a script of [`Reply`]s or from a function of the attempt.
//! - Request builders: [`post`], [`openai_chat`], [`anthropic_messages`].
//!
//! The kit depends on no stormguard crate, so that every crate, the leaves included, can use it
//! as a dev-dependency.
//!
//! ```
//! use std::time::Duration;
//!
//! use bytes::Bytes;
//! use http_body_util::BodyExt;
//! use stormguard_test_kit::{Reply, ScriptedBackend, ScriptedBody, openai_chat};
//! use tower_service::Service;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! // A body of two events a second apart.
//! let body = ScriptedBody::new()
//!     .data("data: {\"choices\":[]}\n\n")
//!     .delay(Duration::from_secs(1))
//!     .data("data: [DONE]\n\n");
//! let text = body.collect().await.unwrap().to_bytes();
//! assert_eq!(text, Bytes::from("data: {\"choices\":[]}\n\ndata: [DONE]\n\n"));
//!
//! // A backend that answers 503, then 200 with a JSON body.
//! let mut backend = ScriptedBackend::replies([Reply::status(503), Reply::status(200).json("{}")]);
//! let uri = "http://llm.test/v1/chat/completions";
//! let first = backend.call(openai_chat(uri, 16)).await.unwrap();
//! assert_eq!(first.status(), 503);
//! let second = backend.call(openai_chat(uri, 16)).await.unwrap();
//! assert_eq!(second.into_body().collect().await.unwrap().to_bytes(), "{}");
//! assert_eq!(backend.log().len(), 2);
//! # }
//! ```

#![forbid(unsafe_code)]

mod backend;
mod body;
mod request;

pub use backend::{Log, Replies, Reply, Respond, ScriptedBackend, Seen};
pub use body::ScriptedBody;
pub use request::{ANTHROPIC_MESSAGES, OPENAI_CHAT, anthropic_messages, openai_chat, post};

/// The error type of the backend's answers: any error, boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

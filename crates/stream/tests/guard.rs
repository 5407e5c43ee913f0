//! The stream guard on tokio's paused clock, over scripted bodies: what opens a stream, what
//! fails its opening, and the three timeouts (pings keep a stream alive, not progressing).

#![allow(clippy::unwrap_used)]

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use stormguard_classify::Reason;
use stormguard_stream::{InterruptCause, Opening, StreamInterrupted, StreamPolicy, open};
use tokio::time::{Instant, Sleep};

const ROLE: &str =
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";
const PING: &str = "event: ping\ndata: {\"type\": \"ping\"}\n\n";
const KEEP_ALIVE: &str = ": keep-alive\n\n";
const OVERLOADED: &str = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";

fn content(text: &str) -> String {
    format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n")
}

/// A body that yields its steps: bytes, waits, a failure, or silence for ever.
enum Step {
    Send(String),
    Wait(Duration),
    Fail,
}

struct Scripted {
    steps: VecDeque<Step>,
    sleep: Option<Pin<Box<Sleep>>>,
}

fn scripted(steps: Vec<Step>) -> Scripted {
    Scripted {
        steps: steps.into(),
        sleep: None,
    }
}

impl Body for Scripted {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        loop {
            if let Some(sleep) = self.sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            match self.steps.pop_front() {
                None => return Poll::Ready(None),
                Some(Step::Send(text)) => return Poll::Ready(Some(Ok(Frame::data(text.into())))),
                Some(Step::Wait(wait)) => self.sleep = Some(Box::pin(tokio::time::sleep(wait))),
                Some(Step::Fail) => {
                    return Poll::Ready(Some(Err(std::io::Error::other("connection reset"))));
                }
            }
        }
    }
}

/// Reads a guarded body to its end or error: the text, and the interruption if any.
async fn drain<B>(body: B) -> (String, Option<Box<dyn std::error::Error + Send + Sync>>)
where
    B: Body<Data = Bytes, Error = Box<dyn std::error::Error + Send + Sync>> + Unpin,
{
    let mut body = body;
    let mut text = Vec::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => text.extend_from_slice(&frame.into_data().unwrap_or_default()),
            Err(error) => return (String::from_utf8(text).unwrap(), Some(error)),
        }
    }
    (String::from_utf8(text).unwrap(), None)
}

const SECOND: Duration = Duration::from_secs(1);

#[tokio::test(start_paused = true)]
async fn the_opening_ends_at_the_first_content_and_hands_on_every_byte() {
    let steps = vec![
        Step::Send(ROLE.into()),
        Step::Send(PING.into()),
        // A content event split across two chunks.
        Step::Send(content("Hi")[..20].into()),
        Step::Wait(SECOND),
        Step::Send(content("Hi")[20..].into()),
        Step::Send(content(" there")),
    ];
    let Opening::Open(stream) = open(scripted(steps), StreamPolicy::default()).await else {
        panic!("opened");
    };
    assert_eq!(stream.events(), 1);
    let (text, error) = drain(*stream).await;
    assert!(error.is_none());
    assert_eq!(
        text,
        format!("{ROLE}{PING}{}{}", content("Hi"), content(" there"))
    );
}

#[tokio::test(start_paused = true)]
async fn an_error_event_before_content_fails_the_opening_like_a_529() {
    let steps = vec![Step::Send(ROLE.into()), Step::Send(OVERLOADED.into())];
    let Opening::Failed { outcome, read, .. } =
        open(scripted(steps), StreamPolicy::default()).await
    else {
        panic!("failed");
    };
    assert_eq!(outcome.reason(), Reason::Overloaded);
    assert!(outcome.is_retryable() && !outcome.is_accepted());
    assert_eq!(read, format!("{ROLE}{OVERLOADED}"));
}

#[tokio::test(start_paused = true)]
async fn silence_before_the_first_event_fails_the_opening_at_the_first_event_timeout() {
    let policy = StreamPolicy::default().with_first_event(Some(10 * SECOND));
    let started = Instant::now();
    let steps = vec![Step::Wait(3600 * SECOND), Step::Send(ROLE.into())];
    let Opening::Failed { outcome, .. } = open(scripted(steps), policy).await else {
        panic!("failed");
    };
    assert_eq!(outcome.reason(), Reason::Timeout);
    assert_eq!(started.elapsed(), 10 * SECOND);
}

#[tokio::test(start_paused = true)]
async fn pings_keep_a_stream_alive_but_do_not_make_progress() {
    // Idle 30 s, progress 60 s: a ping every 10 s never lets the idle timer run out, but 60 s
    // after the last content event the stream ends.
    let policy = StreamPolicy::default()
        .with_idle(Some(30 * SECOND))
        .with_progress(Some(60 * SECOND));
    let mut steps = vec![Step::Send(ROLE.into()), Step::Send(content("a"))];
    for _ in 0..100 {
        steps.push(Step::Wait(10 * SECOND));
        steps.push(Step::Send(KEEP_ALIVE.into()));
    }
    let Opening::Open(stream) = open(scripted(steps), policy).await else {
        panic!("opened");
    };
    let started = Instant::now();
    let (_, error) = drain(*stream).await;
    let error = error.unwrap();
    let interrupted = error.downcast_ref::<StreamInterrupted>().unwrap();
    assert!(matches!(interrupted.cause(), InterruptCause::NoProgress(p) if *p == 60 * SECOND));
    assert_eq!(interrupted.events(), 1);
    assert_eq!(started.elapsed(), 60 * SECOND);
    // What it is for the breaker and the throttle: a timeout the backend did not accept.
    let outcome = stormguard_classify::outcome_of(&*error).unwrap();
    assert_eq!(outcome.reason(), Reason::Timeout);
    assert!(!outcome.is_accepted());
}

#[tokio::test(start_paused = true)]
async fn an_error_event_after_content_ends_the_stream_where_it_starts() {
    let steps = vec![
        Step::Send(ROLE.into()),
        Step::Send(format!("{}{}{OVERLOADED}", content("a"), content("b"))),
        Step::Send(content("never")),
    ];
    let Opening::Open(stream) = open(scripted(steps), StreamPolicy::default()).await else {
        panic!("opened");
    };
    let reported = std::sync::Arc::new(std::sync::Mutex::new(None));
    let seen = reported.clone();
    let stream = stream.with_at_end(move |end| *seen.lock().unwrap() = Some(*end.outcome()));
    let (text, error) = drain(stream).await;
    assert_eq!(text, format!("{ROLE}{}{}", content("a"), content("b")));
    let error = error.unwrap();
    let interrupted = error.downcast_ref::<StreamInterrupted>().unwrap();
    assert_eq!(interrupted.events(), 2);
    assert_eq!(interrupted.bytes(), text.len() as u64);
    assert!(
        matches!(interrupted.cause(), InterruptCause::ErrorEvent(o) if o.reason() == Reason::Overloaded)
    );
    // The breaker hears of it: a failure.
    let outcome = reported.lock().unwrap().unwrap();
    assert_eq!(outcome.reason(), Reason::Overloaded);
}

#[tokio::test(start_paused = true)]
async fn a_reset_after_content_is_a_typed_interruption() {
    let steps = vec![
        Step::Send(ROLE.into()),
        Step::Send(content("a")),
        Step::Wait(SECOND),
        Step::Fail,
    ];
    let Opening::Open(stream) = open(scripted(steps), StreamPolicy::default()).await else {
        panic!("opened");
    };
    let (_, error) = drain(*stream).await;
    let error = error.unwrap();
    let interrupted = error.downcast_ref::<StreamInterrupted>().unwrap();
    assert!(matches!(interrupted.cause(), InterruptCause::Reset(_)));
    assert!(
        interrupted.to_string().contains("after 1 content events"),
        "{interrupted}"
    );
}

//! The stream guard on tokio's paused clock, over scripted bodies: what opens a stream, what
//! fails its opening, the three timeouts (pings keep a stream alive, not progressing), and where
//! a cut stream is joined to what follows it.

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body::Body;
use http_body_util::BodyExt;
use stormguard_classify::{BoxError, Reason};
use stormguard_stream::continuation::{Continuations, Format};
use stormguard_stream::sse::{Event, FrameKind, Parser};
use stormguard_stream::{
    AnswerBody, AnswerFuture, Continuer, GuardedStream, InterruptCause, MakeResume, Opening,
    Received, Resume, ResumeFn, StreamInterrupted, StreamPolicy, open,
};
use stormguard_test_kit::ScriptedBody;
use tokio::time::Instant;

const ROLE: &str =
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";
const PING: &str = "event: ping\ndata: {\"type\": \"ping\"}\n\n";
const KEEP_ALIVE: &str = ": keep-alive\n\n";
const OVERLOADED: &str = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";

fn content(text: &str) -> String {
    format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n")
}

/// A connection reset by the peer.
fn reset() -> std::io::Error {
    std::io::Error::other("connection reset")
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
    let steps = ScriptedBody::new()
        .data(ROLE)
        .data(PING)
        // A content event split across two chunks.
        .data(content("Hi")[..20].to_owned())
        .delay(SECOND)
        .data(content("Hi")[20..].to_owned())
        .data(content(" there"));
    let Opening::Open(stream) = open(steps, StreamPolicy::default()).await else {
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
    let steps = ScriptedBody::new().data(ROLE).data(OVERLOADED);
    let Opening::Failed { outcome, read, .. } = open(steps, StreamPolicy::default()).await else {
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
    let steps = ScriptedBody::new().delay(3600 * SECOND).data(ROLE);
    let Opening::Failed { outcome, .. } = open(steps, policy).await else {
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
    let mut steps = ScriptedBody::new().data(ROLE).data(content("a"));
    for _ in 0..100 {
        steps = steps.delay(10 * SECOND).data(KEEP_ALIVE);
    }
    let Opening::Open(stream) = open(steps, policy).await else {
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
    let steps = ScriptedBody::new()
        .data(ROLE)
        .data(format!("{}{}{OVERLOADED}", content("a"), content("b")))
        .data(content("never"));
    let Opening::Open(stream) = open(steps, StreamPolicy::default()).await else {
        panic!("opened");
    };
    let reported = std::sync::Arc::new(std::sync::Mutex::new(None));
    let seen = reported.clone();
    let stream = (*stream).with_at_end(move |end| *seen.lock().unwrap() = Some(*end.outcome()));
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
    let steps = ScriptedBody::new()
        .data(ROLE)
        .data(content("a"))
        .delay(SECOND)
        .error(reset());
    let Opening::Open(stream) = open(steps, StreamPolicy::default()).await else {
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

/// The events a caller's SSE reader makes of `text`.
fn events(text: &str) -> Vec<Event> {
    let mut frames = Vec::new();
    Parser::new().feed(text.as_bytes(), &mut frames).unwrap();
    frames
        .into_iter()
        .filter_map(|frame| match frame.kind {
            FrameKind::Event(event) => Some(event),
            FrameKind::Comment => None,
        })
        .collect()
}

/// The resume hook of a chat request, its continuation answered by `answer` (none: the stream
/// cannot be resumed).
fn chat_continuations(answer: Option<String>) -> Box<dyn Resume> {
    let head = http::Request::builder()
        .uri("/v1/chat/completions")
        .body(())
        .unwrap()
        .into_parts()
        .0;
    let body = Bytes::from_static(br#"{"messages":[{"role":"user","content":"Hi"}]}"#);
    let continuer = answer.map(|answer| -> Continuer {
        Box::new(move |_| {
            let body = ScriptedBody::new()
                .data(answer.clone())
                .map_err(BoxError::from);
            let body: AnswerBody = Box::pin(body);
            Box::pin(async move { Some(body) })
        })
    });
    Box::new(Continuations::new(
        Format::OpenAiChat,
        head,
        body,
        continuer,
        1,
    ))
}

/// A stream cut after the first line of an event and a keep-alive comment: the comment ends a
/// frame, but not the event, so the stream is handed on up to the event's start and the
/// continuation's events follow whole, never joined to that first line.
#[tokio::test(start_paused = true)]
async fn a_comment_inside_an_event_is_no_place_to_join_a_continuation() {
    let half = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" wor\"}}]}\n";
    let steps = ScriptedBody::new()
        .data(ROLE)
        .data(content("Hello"))
        .data(format!("{half}: keep-alive\n"))
        .error(reset());
    let Opening::Open(stream) = open(steps, StreamPolicy::default()).await else {
        panic!("opened");
    };
    let answer = format!("{}data: [DONE]\n\n", content(" world"));
    let stream = stream.with_resume(chat_continuations(Some(answer)));
    let (text, error) = drain(stream).await;
    assert!(error.is_none(), "{error:?}");
    let data: Vec<String> = events(&text).into_iter().map(|event| event.data).collect();
    assert_eq!(data.len(), 4, "{text}");
    let world: serde_json::Value = serde_json::from_str(&data[2]).unwrap();
    assert_eq!(world["choices"][0]["delta"]["content"], " world");
    assert_eq!(data[3], "[DONE]");
}

/// The same cut with nothing to continue it: the in-band error event that ends the stream is
/// whole, not the tail of the half event.
#[tokio::test(start_paused = true)]
async fn a_comment_inside_an_event_is_no_place_to_end_a_stream_with_its_error_event() {
    let steps = ScriptedBody::new()
        .data(ROLE)
        .data(content("Hello"))
        .data("event: delta\ndata: {\"choices\"\n: keep-alive\n")
        .error(reset());
    let Opening::Open(stream) = open(steps, StreamPolicy::default()).await else {
        panic!("opened");
    };
    let stream = stream.with_resume(chat_continuations(None));
    let (text, error) = drain(stream).await;
    assert!(error.unwrap().downcast_ref::<StreamInterrupted>().is_some());
    let events = events(&text);
    assert_eq!(events.len(), 3, "{text}");
    assert_eq!(events[2].event_type, "message");
    let error: serde_json::Value = serde_json::from_str(&events[2].data).unwrap();
    assert_eq!(error["error"]["type"], "stream_interrupted");
}

/// What a closure was given, each time it was called.
type Seen = std::sync::Arc<std::sync::Mutex<Vec<Received>>>;

/// A closure's resume hook for a chat request, its continuation answered by `steps`.
fn chat_resume_fn(steps: ScriptedBody, seen: Seen) -> Box<dyn Resume> {
    let steps = std::sync::Mutex::new(Some(steps));
    let hook = ResumeFn::new(move |received, _, _| {
        seen.lock().unwrap().push(received.clone());
        let body = steps.lock().unwrap().take()?.map_err(BoxError::from);
        let body: AnswerBody = Box::pin(body);
        Some(Box::pin(async move { Some(body) }) as AnswerFuture)
    });
    let head = http::Request::new(()).into_parts().0;
    hook.make_resume(&head, &Bytes::new()).unwrap()
}

#[test]
fn a_guarded_stream_is_send_and_sync() {
    fn send_and_sync<T: Send + Sync>() {}
    send_and_sync::<GuardedStream<ScriptedBody>>();
}

/// A closure is called once, with the content events delivered, and the frames of its
/// continuation follow the last whole event as they came, comments and all.
#[tokio::test(start_paused = true)]
async fn a_closure_resumes_a_cut_stream_with_its_continuation_as_it_came() {
    let steps = ScriptedBody::new()
        .data(ROLE)
        .data(content("Hello"))
        .data("data: {\"choices\"")
        .error(reset());
    let Opening::Open(stream) = open(steps, StreamPolicy::default()).await else {
        panic!("opened");
    };
    let answer = ScriptedBody::new()
        .data(format!("{KEEP_ALIVE}{}", &content(" world")[..20]))
        .data(format!("{}data: [DONE]\n\n", &content(" world")[20..]));
    let seen = Seen::default();
    let stream = stream.with_resume(chat_resume_fn(answer, Seen::clone(&seen)));
    let (text, error) = drain(stream).await;
    assert!(error.is_none(), "{error:?}");
    let delivered = format!("{ROLE}{}", content("Hello"));
    assert_eq!(
        text,
        format!(
            "{delivered}{KEEP_ALIVE}{}data: [DONE]\n\n",
            content(" world")
        )
    );
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].events(), 1);
    assert_eq!(seen[0].bytes(), delivered.len() as u64);
    let content = seen[0].content();
    assert_eq!(content.len(), 1);
    assert!(content[0].contains("Hello"), "{content:?}");
}

/// A closure's continuation that fails is not resumed again: the stream ends with the first
/// interruption, not the continuation's failure.
#[tokio::test(start_paused = true)]
async fn a_closure_s_failed_continuation_ends_the_stream_with_the_first_interruption() {
    let steps = ScriptedBody::new()
        .data(ROLE)
        .data(format!("{}{OVERLOADED}", content("Hello")));
    let Opening::Open(stream) = open(steps, StreamPolicy::default()).await else {
        panic!("opened");
    };
    let answer = ScriptedBody::new().data(content(" world")).error(reset());
    let seen = Seen::default();
    let stream = stream.with_resume(chat_resume_fn(answer, Seen::clone(&seen)));
    let (text, error) = drain(stream).await;
    assert_eq!(
        text,
        format!("{ROLE}{}{}", content("Hello"), content(" world"))
    );
    let error = error.unwrap();
    let interrupted = error.downcast_ref::<StreamInterrupted>().unwrap();
    assert!(
        matches!(interrupted.cause(), InterruptCause::ErrorEvent(o) if o.reason() == Reason::Overloaded)
    );
    assert_eq!(
        (interrupted.events(), interrupted.bytes()),
        (2, text.len() as u64)
    );
    assert_eq!(seen.lock().unwrap().len(), 1);
}

/// The gap timer hears the wait before each content event after the first, pings not counted,
/// and the stream's end names the model its first usage event named.
#[tokio::test(start_paused = true)]
async fn each_content_event_after_the_first_tells_its_gap_and_the_usage_names_the_model() {
    let usage = "data: {\"model\":\"gpt-4o-mini\",\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2}}\n\n";
    let steps = ScriptedBody::new()
        .delay(SECOND)
        .data(content("a"))
        .delay(Duration::from_millis(200))
        .data(PING)
        .delay(Duration::from_millis(300))
        .data(content("b"))
        .data(content("c"))
        .delay(Duration::from_millis(50))
        .data(format!("{}{usage}data: [DONE]\n\n", content("d")));
    let gaps = Arc::new(Mutex::new(Vec::new()));
    let heard = gaps.clone();
    let timer = Box::new(move |gap: Duration| heard.lock().unwrap().push(gap));
    let opening = open(steps, StreamPolicy::default())
        .counting_usage()
        .timing_gaps(timer);
    let Opening::Open(stream) = opening.await else {
        panic!("opened");
    };
    let model = Arc::new(Mutex::new(None));
    let seen = model.clone();
    let stream =
        (*stream).with_at_end(move |end| *seen.lock().unwrap() = end.model().map(str::to_owned));
    let (_, error) = drain(stream).await;
    assert!(error.is_none());
    let ms = Duration::from_millis;
    assert_eq!(*gaps.lock().unwrap(), [ms(500), ms(0), ms(50)]);
    assert_eq!(model.lock().unwrap().as_deref(), Some("gpt-4o-mini"));
}

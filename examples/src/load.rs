//! Callers at a steady rate against the gateway ([`Load`]), each with a deadline, asking for
//! whole and streamed answers on both of its LLM routes, and what each one saw ([`Call`]),
//! counted ([`Tally`]): the game day's callers and the soak test's.
//!
//! Callers are plain HTTP clients (reqwest, no stormguard of their own), so that what they see
//! is what the gateway hands them. Each sends `x-request-timeout-ms` with its deadline (the
//! gateway's `ServerLayer` reads it) and times its call from the request to the last byte of the
//! answer. A streamed answer's words are checked against the mock's numbering
//! ([`MockConfig::numbered`](crate::mock::MockConfig::numbered)): every word once, in order,
//! none missing.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use stormguard::classify::headers::X_REQUEST_TIMEOUT_MS;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::mock::{CHAT_COMPLETIONS, MESSAGES, Transcript, word_number};

/// The `max_tokens` of every request: a streamed answer has this many words.
pub const TOKENS: u32 = 16;

/// How long after its deadline a caller waits before it calls its call hung and drops it.
pub const HUNG_AFTER: Duration = Duration::from_secs(10);

/// Connections to the gateway the callers keep open while idle.
const IDLE_CONNECTIONS: usize = 64;

/// What a caller asks for: a whole or a streamed answer, from OpenAI's or Anthropic's route.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Ask {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/chat/completions` with `"stream": true`.
    ChatStream,
    /// `POST /v1/messages`.
    Messages,
    /// `POST /v1/messages` with `"stream": true`.
    MessagesStream,
}

impl Ask {
    /// The `n`-th call's ask: the four in turn.
    pub fn nth(n: u64) -> Self {
        match n % 4 {
            0 => Ask::Chat,
            1 => Ask::ChatStream,
            2 => Ask::Messages,
            _ => Ask::MessagesStream,
        }
    }

    /// Whether it asks for a stream.
    pub fn streaming(self) -> bool {
        matches!(self, Ask::ChatStream | Ask::MessagesStream)
    }

    fn path(self) -> &'static str {
        match self {
            Ask::Chat | Ask::ChatStream => CHAT_COMPLETIONS,
            Ask::Messages | Ask::MessagesStream => MESSAGES,
        }
    }

    fn body(self) -> String {
        let model = match self {
            Ask::Chat | Ask::ChatStream => "mock-1",
            Ask::Messages | Ask::MessagesStream => "claude-mock",
        };
        format!(
            r#"{{"model":"{model}","max_tokens":{TOKENS},"stream":{},"messages":[{{"role":"user","content":"Say hello"}}]}}"#,
            self.streaming()
        )
    }
}

/// How a call ended, as its caller saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Seen {
    /// A whole answer: a `2xx`.
    Answered,
    /// A stream read to its terminal event, with no error event.
    Streamed,
    /// A stream that ended early: an in-band error event, or a body that failed.
    Interrupted,
    /// A failed answer, with its status.
    Failed(u16),
    /// No answer: the connection failed.
    Error,
    /// Nothing until [`HUNG_AFTER`] past its deadline: the caller gave up.
    Hung,
}

impl fmt::Display for Seen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Seen::Answered => f.write_str("answered"),
            Seen::Streamed => f.write_str("streamed whole"),
            Seen::Interrupted => f.write_str("stream interrupted"),
            Seen::Failed(status) => write!(f, "{status}"),
            Seen::Error => f.write_str("connection error"),
            Seen::Hung => f.write_str("hung"),
        }
    }
}

/// One call, as its caller saw it.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    /// What it asked for.
    pub ask: Ask,
    /// How it ended.
    pub seen: Seen,
    /// When it was sent, after the load began.
    pub sent: Duration,
    /// From the request to the answer's last byte (or its failure).
    pub took: Duration,
    /// The words of a streamed answer the caller read.
    pub words: u64,
    /// Words shown again, or out of order (a word whose number is not above the one before).
    pub repeated: u64,
    /// Words skipped (a word whose number is more than one above the one before), and, for a
    /// stream read whole, words missing at its end.
    pub missing: u64,
    /// Words that are none of the mock's numbered words.
    pub foreign: u64,
}

/// Callers sending `rate` requests a second for `duration`, each with `deadline`: an open loop,
/// as users are, whatever happens to the earlier requests.
#[derive(Clone, Copy, Debug)]
pub struct Load {
    /// Requests a second.
    pub rate: u32,
    /// How long requests are sent for.
    pub duration: Duration,
    /// Every request's deadline, sent in `x-request-timeout-ms`.
    pub deadline: Duration,
}

impl Load {
    /// Runs the load against the gateway at `base` (`http://host:port`), handing each call to
    /// `seen` as it ends; returns how many calls were sent once every one has ended. A call whose
    /// task panicked never reaches `seen`.
    pub async fn run(&self, base: &str, mut seen: impl FnMut(Call)) -> u64 {
        let (calls, mut ended) = mpsc::unbounded_channel();
        // Many users, each with a connection or two: a burst's extra connections are closed once
        // it has passed, as its users would leave.
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(IDLE_CONNECTIONS)
            .build()
            .unwrap_or_default();
        let (load, base) = (*self, base.to_owned());
        let sender = tokio::spawn(async move {
            let started = Instant::now();
            let interval = Duration::from_secs(1) / load.rate.max(1);
            let mut sent = 0_u64;
            loop {
                let at = started + interval * u32::try_from(sent).unwrap_or(u32::MAX);
                if at >= started + load.duration {
                    break sent;
                }
                tokio::time::sleep_until(at).await;
                let (client, url, calls) = (client.clone(), base.clone(), calls.clone());
                let ask = Ask::nth(sent);
                tokio::spawn(async move {
                    let call = call(&client, &url, ask, load.deadline, at - started).await;
                    let _ = calls.send(call);
                });
                sent += 1;
            }
        });
        while let Some(call) = ended.recv().await {
            seen(call);
        }
        sender.await.unwrap_or(0)
    }
}

/// Makes one call of `ask` to the gateway at `base` with `deadline`, and reads its answer.
pub async fn call(
    client: &reqwest::Client,
    base: &str,
    ask: Ask,
    deadline: Duration,
    sent: Duration,
) -> Call {
    let started = Instant::now();
    let answer = tokio::time::timeout(deadline + HUNG_AFTER, answer(client, base, ask, deadline));
    let (seen, text) = answer.await.unwrap_or((Seen::Hung, None));
    let mut call = Call {
        ask,
        seen,
        sent,
        took: started.elapsed(),
        words: 0,
        repeated: 0,
        missing: 0,
        foreign: 0,
    };
    if let Some(text) = text {
        call.read_words(&text);
    }
    call
}

/// How the call ended and, for a stream, its text.
async fn answer(
    client: &reqwest::Client,
    base: &str,
    ask: Ask,
    deadline: Duration,
) -> (Seen, Option<String>) {
    let request = client
        .post(format!("{base}{}", ask.path()))
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(X_REQUEST_TIMEOUT_MS, deadline.as_millis().to_string())
        .body(ask.body());
    let mut response = match request.send().await {
        Ok(response) => response,
        Err(_) => return (Seen::Error, None),
    };
    let status = response.status();
    let mut bytes = Vec::new();
    let failed = loop {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            Ok(None) => break false,
            Err(_) => break true,
        }
    };
    if !status.is_success() {
        return (Seen::Failed(status.as_u16()), None);
    }
    if !ask.streaming() {
        return (if failed { Seen::Error } else { Seen::Answered }, None);
    }
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let read = Transcript::parse(&text);
    let whole = !failed && read.done && read.errors == 0;
    let seen = if whole {
        Seen::Streamed
    } else {
        Seen::Interrupted
    };
    (seen, Some(read.text()))
}

impl Call {
    /// Checks the words of a stream's text against the mock's numbering.
    fn read_words(&mut self, text: &str) {
        let mut next = 0;
        for word in text.split_whitespace() {
            self.words += 1;
            let Some(number) = word_number(word) else {
                self.foreign += 1;
                continue;
            };
            if number < next {
                self.repeated += 1;
                continue;
            }
            self.missing += number - next;
            next = number + 1;
        }
        if self.seen == Seen::Streamed {
            self.missing += u64::from(TOKENS).saturating_sub(next);
        }
    }
}

/// The bounds of [`Tally::took`]'s buckets: how long calls took, in a fixed space however long
/// the load runs.
pub const LATENCY_BOUNDS: [Duration; 12] = [
    Duration::from_millis(10),
    Duration::from_millis(25),
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(3),
    Duration::from_secs(4),
    Duration::from_secs(5),
    Duration::from_secs(10),
];

/// The calls of a load, counted.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// Calls ended.
    pub calls: u64,
    /// Calls by how they ended.
    pub seen: BTreeMap<Seen, u64>,
    /// Calls that took longer than their deadline and the slack allowed ([`Tally::count`]).
    pub late: u64,
    /// The longest call.
    pub longest: Duration,
    /// Calls by how long they took: `took[i]` those within [`LATENCY_BOUNDS`]`[i]` and over the
    /// bound before, the last those over every bound.
    pub took: [u64; LATENCY_BOUNDS.len() + 1],
    /// Words read in streamed answers, words shown again or out of order, words missing.
    pub words: u64,
    /// See [`Call::repeated`].
    pub repeated: u64,
    /// See [`Call::missing`].
    pub missing: u64,
    /// See [`Call::foreign`].
    pub foreign: u64,
}

impl Tally {
    /// Counts `call`, late if it took longer than `deadline + slack`.
    pub fn count(&mut self, call: &Call, deadline: Duration, slack: Duration) {
        self.calls += 1;
        *self.seen.entry(call.seen).or_default() += 1;
        self.late += u64::from(call.took > deadline + slack);
        self.longest = self.longest.max(call.took);
        let bucket = LATENCY_BOUNDS.partition_point(|bound| *bound < call.took);
        self.took[bucket] += 1;
        self.words += call.words;
        self.repeated += call.repeated;
        self.missing += call.missing;
        self.foreign += call.foreign;
    }

    /// Calls that ended `seen`.
    pub fn of(&self, seen: Seen) -> u64 {
        self.seen.get(&seen).copied().unwrap_or(0)
    }

    /// The bound of [`LATENCY_BOUNDS`] within which a share `q` of the calls ended (the
    /// longest call, past the last bound); zero with no calls.
    pub fn quantile(&self, q: f64) -> Duration {
        let wanted = (q.clamp(0.0, 1.0) * self.calls as f64).ceil() as u64;
        let mut ended = 0;
        for (bucket, count) in self.took.iter().enumerate() {
            ended += count;
            if ended >= wanted.max(1) {
                return LATENCY_BOUNDS.get(bucket).copied().unwrap_or(self.longest);
            }
        }
        Duration::ZERO
    }
}

impl fmt::Display for Tally {
    /// `1000 calls: 700 answered, 180 streamed whole, ...; p50 within 50ms, p99 within 250ms,
    /// longest 4.01s, 0 late; 2880 words read in streams, 0 repeated, 0 missing, 0 foreign`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} calls:", self.calls)?;
        for (n, (seen, count)) in self.seen.iter().enumerate() {
            let sep = if n == 0 { "" } else { "," };
            write!(f, "{sep} {count} {seen}")?;
        }
        write!(
            f,
            "; p50 within {:?}, p99 within {:?}, longest {:.2?}, {} late; {} words read in \
             streams, {} repeated, {} missing, {} foreign",
            self.quantile(0.5),
            self.quantile(0.99),
            self.longest,
            self.late,
            self.words,
            self.repeated,
            self.missing,
            self.foreign
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(seen: Seen, text: &str) -> Call {
        let mut call = Call {
            ask: Ask::ChatStream,
            seen,
            sent: Duration::ZERO,
            took: Duration::ZERO,
            words: 0,
            repeated: 0,
            missing: 0,
            foreign: 0,
        };
        call.read_words(text);
        call
    }

    #[test]
    fn words_shown_twice_or_missing_are_counted() {
        let whole: String = (0..TOKENS).map(|n| format!(" w{n}")).collect();
        let read = call(Seen::Streamed, &whole);
        assert_eq!((read.words, read.repeated, read.missing), (16, 0, 0));
        let again = call(Seen::Interrupted, "w0 w1 w2 w1 w2 w3");
        assert_eq!((again.words, again.repeated, again.missing), (6, 2, 0));
        let skipped = call(Seen::Interrupted, "w0 w1 w4");
        assert_eq!((skipped.repeated, skipped.missing), (0, 2));
        // A stream read whole must have every word; an interrupted one, a beginning.
        let short = call(Seen::Streamed, "w0 w1");
        assert_eq!(short.missing, 14);
        assert_eq!(call(Seen::Interrupted, "w0 w1").missing, 0);
        assert_eq!(call(Seen::Interrupted, "w0 This w1").foreign, 1);
    }

    #[test]
    fn the_tally_says_within_which_bound_a_share_of_calls_ended() {
        let mut tally = Tally::default();
        assert_eq!(tally.quantile(0.5), Duration::ZERO);
        let millis = Duration::from_millis;
        for (took, times) in [(millis(5), 50), (millis(40), 49), (millis(12_000), 1)] {
            for _ in 0..times {
                let mut ended = call(Seen::Answered, "");
                ended.took = took;
                tally.count(&ended, millis(4_000), millis(500));
            }
        }
        assert_eq!((tally.calls, tally.late), (100, 1));
        assert_eq!(tally.quantile(0.5), millis(10));
        assert_eq!(tally.quantile(0.99), millis(50));
        assert_eq!(tally.quantile(1.0), millis(12_000));
        assert_eq!(tally.took.iter().sum::<u64>(), 100);
    }
}

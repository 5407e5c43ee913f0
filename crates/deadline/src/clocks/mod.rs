//! Per-attempt clocks, each backend's own, learned from its answers.
//!
//! The request's [`Deadline`](crate::Deadline) bounds everything; inside it, an attempt that a
//! healthy backend would long have answered is abandoned early, so the request can go on (a retry,
//! the next backend) while there is time left. Three things are timed, each from the backend's
//! healthy answers:
//!
//! - **head**: from sending an attempt to its response head;
//! - **first content**: for an event stream, from its head to its first content event;
//! - **gap**: for an event stream, the longest wait between two content events of a stream that
//!   ended well.
//!
//! One more figure is learned for hedging (a second attempt sent while the first still waits):
//! the **time to first content**, from sending an attempt to its first content event (a whole
//! answer: to its head), read at a percentile without a margin ([`to_first_content`]). An
//! attempt that was hedged and lost the race teaches it the time it had waited when it was
//! cancelled: it would have taken at least that long, and leaving it out would teach a tail
//! shorter than the backend's, and so hedge ever earlier.
//!
//! [`to_first_content`]: AttemptClocks::to_first_content
//!
//! A clock fires at a high percentile of what the backend showed recently (the 99th of its last
//! [`WINDOW`] answers) times a margin (3), kept between a floor and a ceiling ([`Bounds`]), and
//! sized by the request. With fewer than [`ClockSettings::min_samples`] answers learned, the
//! backend is **cold** (a restart, a scale-out, a new deployment) and each clock has a limit
//! sized from what healthy providers do and from the request ([`RequestShape`]: its size, its
//! prompt, streamed or not, reasoning asked for or not), which the backend's own figures replace
//! once learned, tighter or looser:
//!
//! | clock | floor | ceiling | cold (nothing learned) |
//! |---|---|---|---|
//! | head of a stream | 3 s | 60 s | 60 s |
//! | head of a whole answer | the request's [`LlmDeadline`] estimate | none (the deadline) | the estimate |
//! | first content | 5 s | 300 s | a hedge at 10 s from sending, plus 0.25 ms per prompt token (60 s and the same with reasoning asked for) |
//! | gap | 5 s | 60 s | 10 s where the stream is continued and no reasoning asked for; else none |
//!
//! Where a cold limit could cut a healthy slow answer it does not cut: the first content's is a
//! hedge ([`cold_first_content`](AttemptClocks::cold_first_content): a second attempt beside the
//! first, which runs on and answers if it is first), and the gap's cuts only a stream the engine
//! continues from what it delivered (never restarts). [`ColdClocks`] gives the figures' sources.
//!
//! Why the learned clocks' bounds:
//!
//! - A stream's head comes when the provider admits the request, before it generates anything
//!   (OpenAI and Anthropic send it within a second when healthy), so its clock does not grow with
//!   the answer; a minute without a head is a stuck request whatever the model.
//! - A whole (non-streaming) answer's head comes only when the generation ends: a request for
//!   4,000 tokens takes minutes on a healthy large model. Its clock is never below what the
//!   request's own size needs at a slow but healthy pace ([`LlmDeadline`]: 10 s, plus 1 ms per
//!   prompt token and 28 ms per output token of `max_tokens`), and what the backend showed can
//!   only lengthen it. A request without `max_tokens` is sized for 4,096 tokens.
//! - A reasoning model thinks before its first token, for minutes at worst: once learned, the
//!   first-content clock follows what the backend showed, up to 300 s, and the gap never fires
//!   before 5 s, the longest pause a healthy token stream makes between two tokens under load.
//! - The margin of 3 over the 99th percentile follows the usual practice for per-try timeouts
//!   from observed latency (Envoy's and Finagle's advice is a high percentile with headroom):
//!   one answer in a hundred is already that slow when healthy, and the margin keeps a busy
//!   moment from cutting a healthy attempt.
//!
//! What a fired clock means is the caller's to enforce: the retry engine abandons the attempt
//! (a timeout for its breaker and throttle) and goes on within the one deadline and budget, or,
//! when the request cannot go on (no attempt left, the budget spent), keeps waiting on it.
//!
//! ```
//! use std::time::Duration;
//! use stormguard_deadline::clocks::{AttemptClocks, RequestShape};
//!
//! let clocks = AttemptClocks::default();
//! let stream = RequestShape::new(true, Duration::from_secs(20));
//! // Nothing learned: a stream's head waits at most a minute.
//! assert_eq!(clocks.head(stream), Some(Duration::from_secs(60)));
//! for _ in 0..100 {
//!     clocks.record_head(true, Duration::from_millis(400));
//! }
//! // Learned: 3 x 400 ms = 1.2 s, raised to the 3 s floor.
//! assert_eq!(clocks.head(stream), Some(Duration::from_secs(3)));
//! ```

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::LlmDeadline;

mod cold;
mod shape;

pub use cold::ColdClocks;
pub use shape::{BodyShape, RequestShape, SharedBodyShape, asks_for_reasoning};

/// Answers each clock remembers: the last 128.
pub const WINDOW: usize = 128;

/// Where a clock stays, and what it is before anything is learned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Never fires earlier.
    pub floor: Duration,
    /// Never fires later.
    pub ceiling: Duration,
    /// With too little learned: the clock (`None`: no clock).
    pub unlearned: Option<Duration>,
}

impl Bounds {
    /// `learned` (a percentile times the margin) kept within the floor and the ceiling, or the
    /// default when nothing is learned.
    fn of(&self, learned: Option<Duration>) -> Option<Duration> {
        match learned {
            Some(learned) => Some(learned.clamp(self.floor, self.ceiling.max(self.floor))),
            None => self.unlearned,
        }
    }
}

/// How the clocks are set: see the [module docs](self) for the defaults and their reasons.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClockSettings {
    /// The percentile of the recent answers a clock is set from: 0.99.
    pub percentile: f64,
    /// What the percentile is multiplied by: 3.
    pub margin: f64,
    /// Answers a clock needs before it is learned: 20.
    pub min_samples: usize,
    /// A stream's head: floor 3 s, ceiling 60 s, 60 s unlearned.
    pub stream_head: Bounds,
    /// A stream's first content event after its head: floor 5 s, ceiling 300 s, none unlearned.
    pub first_content: Bounds,
    /// The longest wait between two content events: floor 5 s, ceiling 60 s, none unlearned.
    pub gap: Bounds,
    /// What sizes a whole answer's head clock from its request: [`LlmDeadline::default`].
    pub whole: LlmDeadline,
    /// The limits while nothing is learned: [`ColdClocks::default`].
    pub cold: ColdClocks,
}

impl Default for ClockSettings {
    fn default() -> Self {
        Self {
            percentile: 0.99,
            margin: 3.0,
            min_samples: 20,
            stream_head: Bounds {
                floor: Duration::from_secs(3),
                ceiling: Duration::from_secs(60),
                unlearned: Some(Duration::from_secs(60)),
            },
            first_content: Bounds {
                floor: Duration::from_secs(5),
                ceiling: Duration::from_secs(300),
                unlearned: None,
            },
            gap: Bounds {
                floor: Duration::from_secs(5),
                ceiling: Duration::from_secs(60),
                unlearned: None,
            },
            whole: LlmDeadline::default(),
            cold: ColdClocks::default(),
        }
    }
}

/// The three clocks of one backend, learned from its healthy answers; cheap to clone (the
/// clones share what is learned). Give each backend its own.
#[derive(Clone, Default)]
pub struct AttemptClocks {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    settings: ClockSettings,
    stream_head: Window,
    whole_head: Window,
    first_content: Window,
    gap: Window,
    /// A stream's time from sending to its first content event (a whole answer's is its head's).
    stream_to_content: Window,
}

impl AttemptClocks {
    /// Clocks set by `settings`, with nothing learned.
    pub fn new(settings: ClockSettings) -> Self {
        Self {
            inner: Arc::new(Inner {
                settings,
                ..Inner::default()
            }),
        }
    }

    /// Clocks with the same settings and nothing learned: for another backend.
    #[must_use]
    pub fn fresh(&self) -> Self {
        Self::new(self.inner.settings)
    }

    /// The settings.
    pub fn settings(&self) -> &ClockSettings {
        &self.inner.settings
    }

    /// How long an attempt of a request shaped `shape` may wait for its response head.
    pub fn head(&self, shape: RequestShape) -> Option<Duration> {
        let settings = &self.inner.settings;
        if shape.streaming {
            return settings
                .stream_head
                .of(self.learned(&self.inner.stream_head));
        }
        // Never shorter than the request's size needs; what the backend showed only lengthens it.
        let learned = self.learned(&self.inner.whole_head).unwrap_or_default();
        Some(shape.size.max(learned))
    }

    /// How long a stream may wait after its head for its first content event.
    pub fn first_content(&self) -> Option<Duration> {
        let learned = self.learned(&self.inner.first_content);
        self.inner.settings.first_content.of(learned)
    }

    /// How long a stream of a request shaped `shape` may wait between two content events
    /// (`continued`: the engine continues the stream if it is cut): the learned clock, or, with
    /// nothing learned, the [cold](ColdClocks::gap) limit.
    pub fn gap(&self, shape: RequestShape, continued: bool) -> Option<Duration> {
        let settings = &self.inner.settings;
        match self.learned(&self.inner.gap) {
            Some(learned) => settings.gap.of(Some(learned)),
            None => settings
                .gap
                .unlearned
                .or(settings.cold.gap(shape, continued)),
        }
    }

    /// While the backend's time to first content is not learned: how long an attempt of a
    /// request shaped `shape` waits for its first content before a hedge goes beside it (the
    /// [cold](ColdClocks::first_content) limit); `None` once learned, and for a whole answer.
    pub fn cold_first_content(&self, shape: RequestShape) -> Option<Duration> {
        let window = match shape.streaming {
            true => &self.inner.stream_to_content,
            false => &self.inner.whole_head,
        };
        if window.len() >= self.inner.settings.min_samples.max(1) {
            return None;
        }
        self.inner.settings.cold.first_content(shape)
    }

    /// A healthy answer's head came `took` after its attempt was sent.
    pub fn record_head(&self, streaming: bool, took: Duration) {
        let window = match streaming {
            true => &self.inner.stream_head,
            false => &self.inner.whole_head,
        };
        window.record(took);
    }

    /// A stream's first content event came `took` after its head.
    pub fn record_first_content(&self, took: Duration) {
        self.inner.first_content.record(took);
    }

    /// An attempt's first content came `took` after it was sent (a stream's first content
    /// event; a whole answer's time to its head is [`record_head`](Self::record_head)'s), or,
    /// for an attempt cancelled before it (it lost a hedge's race), it had waited `took` when it
    /// was cancelled.
    pub fn record_to_first_content(&self, streaming: bool, took: Duration) {
        match streaming {
            true => self.inner.stream_to_content.record(took),
            false => self.inner.whole_head.record(took),
        }
    }

    /// The `percentile` (0 to 1) of the backend's recent times from sending an attempt to its
    /// first content (`streaming`: a stream's first content event; else a whole answer's head),
    /// once [`min_samples`](ClockSettings::min_samples) are learned; no margin. What a hedge
    /// waits for before it goes.
    pub fn to_first_content(&self, streaming: bool, percentile: f64) -> Option<Duration> {
        let window = match streaming {
            true => &self.inner.stream_to_content,
            false => &self.inner.whole_head,
        };
        if window.len() < self.inner.settings.min_samples.max(1) {
            return None;
        }
        Some(window.percentile(percentile))
    }

    /// A stream that ended well waited at most `longest` between two content events.
    pub fn record_gap(&self, longest: Duration) {
        self.inner.gap.record(longest);
    }

    /// What each clock has learned, for dashboards and tests.
    pub fn snapshot(&self) -> ClocksSnapshot {
        let inner = &*self.inner;
        let percentile = |window: &Window| self.learned(window).map(|at| self.unmargined(at));
        ClocksSnapshot {
            stream_head: percentile(&inner.stream_head),
            whole_head: percentile(&inner.whole_head),
            first_content: percentile(&inner.first_content),
            gap: percentile(&inner.gap),
            answers: inner.stream_head.len() + inner.whole_head.len(),
        }
    }

    /// The percentile of `window` times the margin, once enough is learned.
    fn learned(&self, window: &Window) -> Option<Duration> {
        let settings = &self.inner.settings;
        if window.len() < settings.min_samples.max(1) {
            return None;
        }
        let at = window.percentile(settings.percentile);
        // A margin that is no number gives no early clock: the ceiling.
        Some(
            Duration::try_from_secs_f64(at.as_secs_f64() * settings.margin)
                .unwrap_or(Duration::MAX),
        )
    }

    fn unmargined(&self, learned: Duration) -> Duration {
        let margin = self.inner.settings.margin;
        Duration::try_from_secs_f64(learned.as_secs_f64() / margin).unwrap_or(learned)
    }
}

impl fmt::Debug for AttemptClocks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttemptClocks")
            .field("settings", &self.inner.settings)
            .field("learned", &self.snapshot())
            .finish()
    }
}

/// What the clocks learned: each clock's percentile (before the margin), `None` until enough
/// answers came.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClocksSnapshot {
    /// A stream's head.
    pub stream_head: Option<Duration>,
    /// A whole answer's head.
    pub whole_head: Option<Duration>,
    /// A stream's first content event after its head.
    pub first_content: Option<Duration>,
    /// The longest wait between two content events.
    pub gap: Option<Duration>,
    /// Heads recorded, up to the window of each.
    pub answers: usize,
}

/// The last [`WINDOW`] figures of one clock, in milliseconds: in the order they came, and
/// sorted. The percentile is asked on every request and a figure recorded on every answer, so a
/// figure is put in its sorted place as it comes (a binary search and a shift of at most
/// [`WINDOW`] figures, under a lock held for that long) and the percentile is one read, instead
/// of a selection over the whole window on every ask.
#[derive(Default)]
struct Window(Mutex<Figures>);

struct Figures {
    /// The figures in the order they came: the next one replaces the one at
    /// `written % WINDOW`, the oldest once the window is full.
    came: [u32; WINDOW],
    /// The same figures sorted, in the first [`len`](Self::len) places.
    sorted: [u32; WINDOW],
    /// Figures recorded since the start.
    written: u64,
}

impl Default for Figures {
    fn default() -> Self {
        Self {
            came: [0; WINDOW],
            sorted: [0; WINDOW],
            written: 0,
        }
    }
}

impl Figures {
    fn len(&self) -> usize {
        usize::try_from(self.written).map_or(WINDOW, |written| written.min(WINDOW))
    }

    /// Records `figure` in place of the oldest once the window is full.
    fn push(&mut self, figure: u32) {
        // The remainder of a division by WINDOW fits an index.
        let slot = (self.written % WINDOW as u64) as usize;
        let mut held = self.len();
        if held == WINDOW {
            // The oldest figure is among the sorted ones: its first place closes up.
            let oldest = self.came[slot];
            let at = self.sorted.partition_point(|held| *held < oldest);
            self.sorted.copy_within(at + 1.., at);
            held -= 1;
        }
        let at = self.sorted[..held].partition_point(|held| *held <= figure);
        self.sorted.copy_within(at..held, at + 1);
        self.sorted[at] = figure;
        self.came[slot] = figure;
        self.written = self.written.saturating_add(1);
    }
}

impl Window {
    /// The figures, whoever held them last: a push cannot leave them half done.
    fn figures(&self) -> MutexGuard<'_, Figures> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn record(&self, took: Duration) {
        let millis = u32::try_from(took.as_millis()).unwrap_or(u32::MAX);
        self.figures().push(millis);
    }

    fn len(&self) -> usize {
        self.figures().len()
    }

    /// The nearest-rank `percentile` (0 to 1) of the figures held.
    fn percentile(&self, percentile: f64) -> Duration {
        let figures = self.figures();
        let len = figures.len();
        if len == 0 {
            return Duration::ZERO;
        }
        let rank = (percentile.clamp(0.0, 1.0) * len as f64).ceil() as usize;
        Duration::from_millis(u64::from(figures.sorted[rank.clamp(1, len) - 1]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_keeps_the_last_figures_sorted_as_they_come() {
        let window = Window::default();
        let mut came = Vec::new();
        // 1,000 figures with many repeats, drawn by a fixed linear congruence.
        let mut draw: u64 = 42;
        for n in 0..1_000u64 {
            draw = draw.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let millis = (draw >> 33) % 300;
            window.record(Duration::from_millis(millis));
            came.push(millis);
            let held = &came[came.len().saturating_sub(WINDOW)..];
            let mut sorted = held.to_vec();
            sorted.sort_unstable();
            assert_eq!(window.len(), held.len(), "after {n}");
            for percentile in [0.0, 0.5, 0.9, 0.99, 1.0] {
                let rank = ((percentile * held.len() as f64).ceil() as usize).clamp(1, held.len());
                assert_eq!(
                    window.percentile(percentile),
                    Duration::from_millis(sorted[rank - 1]),
                    "p{percentile} after {n}"
                );
            }
        }
        // Figures past u32::MAX milliseconds are held at it.
        window.record(Duration::from_secs(u64::MAX));
        assert_eq!(
            window.percentile(1.0),
            Duration::from_millis(u64::from(u32::MAX))
        );
    }

    const WHOLE: RequestShape = RequestShape::new(false, Duration::from_secs(17));
    const STREAM: RequestShape = RequestShape::new(true, Duration::from_secs(17));

    #[test]
    fn nothing_learned_leaves_the_safe_defaults() {
        let clocks = AttemptClocks::default();
        assert_eq!(clocks.head(STREAM), Some(Duration::from_secs(60)));
        assert_eq!(clocks.head(WHOLE), Some(Duration::from_secs(17)));
        assert_eq!(clocks.first_content(), None);
        assert_eq!(clocks.gap(STREAM, false), None);
        // Cold: a stream is hedged at 10 s, and a stream the engine continues is cut at a 10 s
        // gap.
        assert_eq!(
            clocks.cold_first_content(STREAM),
            Some(Duration::from_secs(10))
        );
        assert_eq!(clocks.cold_first_content(WHOLE), None);
        assert_eq!(clocks.gap(STREAM, true), Some(Duration::from_secs(10)));
        // 19 answers are not enough.
        for _ in 0..19 {
            clocks.record_head(true, Duration::from_millis(100));
            clocks.record_first_content(Duration::from_millis(100));
        }
        assert_eq!(clocks.head(STREAM), Some(Duration::from_secs(60)));
        assert_eq!(clocks.first_content(), None);
    }

    /// What the backend shows replaces the cold limits, tighter or looser, once 20 answers are
    /// learned.
    #[test]
    fn learned_figures_replace_the_cold_limits() {
        let clocks = AttemptClocks::default();
        for _ in 0..20 {
            clocks.record_to_first_content(true, Duration::from_secs(30));
            clocks.record_gap(Duration::from_millis(40));
        }
        // No cold hedge any more (a configured hedge reads the learned figure), and the gap is
        // the learned one, continued or not: 3 x 40 ms raised to the 5 s floor.
        assert_eq!(clocks.cold_first_content(STREAM), None);
        assert_eq!(clocks.gap(STREAM, false), Some(Duration::from_secs(5)));
        let slow = clocks.fresh();
        for _ in 0..20 {
            slow.record_gap(Duration::from_secs(15));
        }
        assert_eq!(slow.gap(STREAM, true), Some(Duration::from_secs(45)));
        // A prompt of 40,000 tokens: 10 s and its prefill.
        let long = RequestShape {
            prompt_tokens: 40_000,
            ..STREAM
        };
        assert_eq!(slow.cold_first_content(long), Some(Duration::from_secs(20)));
    }

    #[test]
    fn a_clock_fires_at_the_99th_percentile_times_three_within_its_bounds() {
        let clocks = AttemptClocks::default();
        // 98 first tokens at 1 s, two at 4 s: the 99th percentile of 100 is the 99th figure.
        for _ in 0..98 {
            clocks.record_first_content(Duration::from_secs(1));
        }
        clocks.record_first_content(Duration::from_secs(4));
        clocks.record_first_content(Duration::from_secs(4));
        assert_eq!(clocks.first_content(), Some(Duration::from_secs(12)));
        // A slow backend's gap is capped at the ceiling, a fast one's raised to the floor.
        for _ in 0..50 {
            clocks.record_gap(Duration::from_secs(40));
        }
        assert_eq!(clocks.gap(STREAM, false), Some(Duration::from_secs(60)));
        let fast = clocks.fresh();
        for _ in 0..50 {
            fast.record_gap(Duration::from_millis(30));
        }
        assert_eq!(fast.gap(STREAM, false), Some(Duration::from_secs(5)));
        assert_eq!(fast.first_content(), None, "fresh clocks share nothing");
    }

    #[test]
    fn the_window_forgets_what_is_older_than_its_last_128_answers() {
        let clocks = AttemptClocks::default();
        for _ in 0..WINDOW {
            clocks.record_head(true, Duration::from_secs(15));
        }
        assert_eq!(clocks.head(STREAM), Some(Duration::from_secs(45)));
        for _ in 0..WINDOW {
            clocks.record_head(true, Duration::from_millis(500));
        }
        assert_eq!(clocks.head(STREAM), Some(Duration::from_secs(3)));
        assert_eq!(
            clocks.snapshot().stream_head,
            Some(Duration::from_millis(500))
        );
    }

    #[test]
    fn a_whole_answer_is_never_cut_before_its_size_needs() {
        let clocks = AttemptClocks::default();
        for _ in 0..100 {
            clocks.record_head(false, Duration::from_secs(2));
        }
        // 3 x 2 s = 6 s learned, but this request's size needs 17 s.
        assert_eq!(clocks.head(WHOLE), Some(Duration::from_secs(17)));
        for _ in 0..100 {
            clocks.record_head(false, Duration::from_secs(10));
        }
        // A slow backend lengthens it: 3 x 10 s.
        assert_eq!(clocks.head(WHOLE), Some(Duration::from_secs(30)));
    }

    /// The hedge's figure: no margin, no bounds, nothing until 20 are learned; a stream's and
    /// a whole answer's apart.
    #[test]
    fn time_to_first_content_is_a_plain_percentile_of_each_kind() {
        let clocks = AttemptClocks::default();
        for _ in 0..19 {
            clocks.record_to_first_content(true, Duration::from_millis(400));
        }
        assert_eq!(clocks.to_first_content(true, 0.95), None);
        for millis in 0..81 {
            clocks.record_to_first_content(true, Duration::from_millis(400 + millis));
        }
        // 100 figures: 19 at 400 ms, then 400 ms to 480 ms; the 95th is 475 ms.
        assert_eq!(
            clocks.to_first_content(true, 0.95),
            Some(Duration::from_millis(475))
        );
        assert_eq!(clocks.to_first_content(false, 0.95), None);
        for _ in 0..20 {
            clocks.record_head(false, Duration::from_secs(4));
        }
        assert_eq!(
            clocks.to_first_content(false, 0.5),
            Some(Duration::from_secs(4))
        );
        // A stream's own head is another figure.
        assert_eq!(clocks.snapshot().stream_head, None);
    }

    #[test]
    fn hostile_settings_and_figures_never_panic() {
        let settings = ClockSettings {
            percentile: f64::NAN,
            margin: f64::INFINITY,
            min_samples: 0,
            ..ClockSettings::default()
        };
        let clocks = AttemptClocks::new(settings);
        clocks.record_gap(Duration::MAX);
        clocks.record_gap(Duration::ZERO);
        assert!(clocks.gap(STREAM, false).is_some());
        let _ = clocks.snapshot();
    }
}

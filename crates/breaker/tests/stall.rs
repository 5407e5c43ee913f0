//! The stall detector's two speeds, with simulated traffic on a paused clock: a backend that
//! turns into a black hole is cut within 3 s at 100 and 1,000 requests per second, and healthy
//! traffic of long generations at a low rate, or in waves, is never taken for a stall.
//!
//! The simulation is event by event: the clock jumps to the next send or the next answer. A
//! client sends attempts at a steady rate, each with a latency drawn from a model; the backend
//! answers each one (a success recorded on its permit) when its latency has passed, until it
//! turns into a black hole: from then on nothing comes back, and the attempts stay in flight.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use http::HeaderMap;
use stormguard_breaker::{BreakerConfig, BreakerPermit, CircuitBreaker, OpenCause, State};
use stormguard_classify::Outcome;
use stormguard_classify::Permit;
use stormguard_numbers::random::RandomSource;
use tokio::time::Instant;

/// A client and a backend, on the paused clock.
struct Traffic {
    breaker: CircuitBreaker,
    start: Instant,
    /// Attempts in flight, by the time (since the start) the backend answers them, then by number.
    in_flight: BTreeMap<(Duration, u64), BreakerPermit>,
    sent: u64,
    refused: u64,
    answered: u64,
    /// The backend answers nothing due after this time (since the start).
    black_hole: Option<Duration>,
    /// When (since the start) the latest answer came back.
    last_answer: Option<Duration>,
    /// When (since the start) the breaker was first seen open.
    opened_at: Option<Duration>,
    /// How long nothing had come back then.
    silence_at_open: Option<Duration>,
    /// The longest silence, with attempts in flight, that a send saw.
    longest_silence: Duration,
}

impl Traffic {
    fn new(breaker: CircuitBreaker) -> Self {
        Self {
            breaker,
            start: Instant::now(),
            in_flight: BTreeMap::new(),
            sent: 0,
            refused: 0,
            answered: 0,
            black_hole: None,
            last_answer: None,
            opened_at: None,
            silence_at_open: None,
            longest_silence: Duration::ZERO,
        }
    }

    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// Sends one attempt that the backend will answer `latency` from now.
    fn send(&mut self, latency: Duration) {
        if let Some(last) = self.last_answer
            && !self.in_flight.is_empty()
        {
            self.longest_silence = self.longest_silence.max(self.now() - last);
        }
        match self.breaker.try_acquire() {
            Ok(permit) => {
                self.sent += 1;
                self.in_flight
                    .insert((self.now() + latency, self.sent), permit);
            }
            Err(_) => self.refused += 1,
        }
        if self.opened_at.is_none() && self.breaker.state() != State::Closed {
            self.opened_at = Some(self.now());
            self.silence_at_open = self.last_answer.map(|at| self.now() - at);
        }
    }

    /// When the backend answers next, if it ever does.
    fn next_answer(&self) -> Option<Duration> {
        let (&(due, _), _) = self.in_flight.first_key_value()?;
        self.black_hole.is_none_or(|end| due <= end).then_some(due)
    }

    /// Records every answer due by now.
    fn answer(&mut self) {
        let now = self.now();
        while self.next_answer().is_some_and(|due| due <= now) {
            let (_, permit) = self.in_flight.pop_first().unwrap();
            permit.record(&Outcome::success(), &HeaderMap::new());
            self.answered += 1;
            self.last_answer = Some(now);
        }
    }

    /// Moves the clock to `at` (since the start), answering what falls due before it (what falls
    /// due at `at` comes back just after whatever is sent then).
    async fn run_until(&mut self, at: Duration) {
        loop {
            let next = self.next_answer().map_or(at, |due| due.min(at));
            if next > self.now() {
                tokio::time::advance(next - self.now()).await;
            }
            if self.now() >= at {
                return;
            }
            self.answer();
        }
    }

    /// Sends `count` attempts, one every `every`, with latencies from `latency`; the clock ends
    /// one `every` after the last send. Stops early once the breaker is open, if `until_open`.
    async fn client(
        &mut self,
        count: u64,
        every: Duration,
        mut latency: impl FnMut() -> Duration,
        until_open: bool,
    ) {
        for _ in 0..count {
            self.send(latency());
            if until_open && self.opened_at.is_some() {
                return;
            }
            let next = self.now() + every;
            self.run_until(next).await;
        }
    }
}

/// Draws the latency of each attempt.
type Latencies<'a> = Box<dyn FnMut() -> Duration + 'a>;

/// Latencies of LLM calls: log-normal, with median `median` and shape `sigma`, within
/// `[min, max]`.
struct LogNormal {
    random: RandomSource,
    median: f64,
    sigma: f64,
    min: f64,
    max: f64,
}

impl LogNormal {
    /// Chat completions: median 800 ms, sigma 0.5, from 0.3 s to 30 s.
    fn chat(seed: u64) -> Self {
        Self {
            random: RandomSource::seeded(seed),
            median: 0.8,
            sigma: 0.5,
            min: 0.3,
            max: 30.0,
        }
    }

    fn draw(&self) -> Duration {
        // Box-Muller: a standard normal draw from two uniform ones (the first in (0, 1]).
        let (u, v) = (1.0 - self.random.f64(), self.random.f64());
        let normal = (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos();
        let seconds = self.median * (self.sigma * normal).exp();
        Duration::from_secs_f64(seconds.clamp(self.min, self.max))
    }
}

/// Healthy traffic at `per_second` for 20 s, then a black hole; returns the traffic when the
/// breaker opened (or 10 s into the black hole).
async fn black_hole(config: BreakerConfig, per_second: u64, seed: u64) -> Traffic {
    let latencies = LogNormal::chat(seed);
    let every = Duration::from_secs(1) / u32::try_from(per_second).unwrap();
    let mut traffic = Traffic::new(CircuitBreaker::new(config));
    traffic
        .client(20 * per_second, every, || latencies.draw(), true)
        .await;
    assert_eq!(
        traffic.opened_at, None,
        "healthy traffic opened the breaker"
    );
    assert_eq!(traffic.refused, 0);
    traffic.black_hole = Some(traffic.now());
    traffic
        .client(10 * per_second, every, || latencies.draw(), true)
        .await;
    traffic
}

/// At 100 and 1,000 requests per second of healthy chat traffic (log-normal latencies, median
/// 800 ms), a black hole opens the breaker with cause `Stall` between 2 s (the minimum silence)
/// and 3 s after the last answer came back, and within 3 s of the black hole's start.
#[tokio::test(start_paused = true)]
async fn a_black_hole_opens_the_breaker_within_3_s() {
    for (per_second, seed) in [(100, 1), (1_000, 2)] {
        let config = BreakerConfig::default().with_seed(seed);
        let traffic = black_hole(config, per_second, seed).await;
        let start = traffic.black_hole.unwrap();
        let opened = traffic.opened_at.expect("the black hole was never cut");
        let after_last_answer = traffic.silence_at_open.unwrap();
        let last_answer = opened - after_last_answer;
        let snapshot = traffic.breaker.snapshot();
        let after_start = opened - start;
        println!(
            "{per_second:>5} req/s: stall detected {after_last_answer:?} after the last answer, \
             {after_start:?} after the black hole began; {} attempts in flight when it opened \
             ({} sent, {} answered)",
            snapshot.in_flight, traffic.sent, traffic.answered,
        );
        assert_eq!(snapshot.cause, Some(OpenCause::Stall));
        assert_eq!(snapshot.opened, 1);
        assert!(
            after_last_answer > Duration::from_secs(2)
                && after_last_answer <= Duration::from_secs(3),
            "{per_second} req/s: {after_last_answer:?}"
        );
        assert!(
            after_start <= Duration::from_secs(3),
            "{per_second} req/s: {after_start:?}"
        );
        // Everything sent into the black hole is still in flight, waiting to be cut.
        assert_eq!(
            u64::from(snapshot.in_flight),
            traffic.sent - traffic.answered
        );
        assert!(last_answer <= start);
    }
}

/// Without stall detection only answered failures open the breaker: 30 s of black hole at 100
/// requests per second never do, and the 3,000 attempts sent into it stay in flight.
#[tokio::test(start_paused = true)]
async fn without_stall_detection_a_black_hole_never_opens_it() {
    let config = BreakerConfig::default()
        .without_stall_detection()
        .with_seed(3);
    let latencies = LogNormal::chat(3);
    let every = Duration::from_millis(10);
    let mut traffic = Traffic::new(CircuitBreaker::new(config));
    traffic
        .client(2_000, every, || latencies.draw(), false)
        .await;
    traffic.black_hole = Some(traffic.now());
    let answered = traffic.answered;
    traffic
        .client(3_000, every, || latencies.draw(), false)
        .await;
    let snapshot = traffic.breaker.snapshot();
    assert_eq!(traffic.opened_at, None);
    assert_eq!((snapshot.state, snapshot.opened), (State::Closed, 0));
    assert_eq!(traffic.refused, 0);
    assert_eq!(u64::from(snapshot.in_flight), 5_000 - answered);
    assert!(snapshot.in_flight > 3_000, "{snapshot:?}");
}

/// Long generations at a low rate are healthy, however long the silences between answers look
/// next to the 2 s minimum (up to 10 s): the breaker never opens, and every attempt is answered.
/// - 1 request a second, each taking 60 s, for 10 minutes;
/// - 1 request a second, each taking a log-normal 60 s (sigma 0.5, 10 s to 5 min), for 10
///   minutes;
/// - 1 request every 10 s, each taking 120 s, for 20 minutes.
#[tokio::test(start_paused = true)]
async fn long_generations_at_a_low_rate_never_look_like_a_stall() {
    let spread = LogNormal {
        random: RandomSource::seeded(4),
        median: 60.0,
        sigma: 0.5,
        min: 10.0,
        max: 300.0,
    };
    // Name, requests, one every, latency, and the longest silence a request sees at least.
    let cases: [(&str, u64, Duration, Latencies, Duration); 3] = [
        (
            "1/s, 60 s each",
            600,
            Duration::from_secs(1),
            Box::new(|| Duration::from_secs(60)),
            Duration::from_secs(1),
        ),
        (
            "1/s, log-normal 60 s",
            600,
            Duration::from_secs(1),
            Box::new(|| spread.draw()),
            Duration::from_secs(5),
        ),
        (
            "0.1/s, 120 s each",
            120,
            Duration::from_secs(10),
            Box::new(|| Duration::from_secs(120)),
            Duration::from_secs(10),
        ),
    ];
    for (name, count, every, latency, silence) in cases {
        let mut traffic = Traffic::new(CircuitBreaker::new(BreakerConfig::default().with_seed(5)));
        traffic.client(count, every, latency, false).await;
        let sent_for = traffic.now();
        traffic.run_until(sent_for + Duration::from_secs(300)).await;
        let snapshot = traffic.breaker.snapshot();
        println!(
            "{name}: {} sent over {sent_for:?}, {} answered; longest silence a request saw {:?}",
            traffic.sent, traffic.answered, traffic.longest_silence
        );
        assert_eq!(traffic.opened_at, None, "{name}: {snapshot:?}");
        assert_eq!((snapshot.opened, snapshot.in_flight), (0, 0), "{name}");
        assert_eq!((traffic.sent, traffic.answered), (count, count), "{name}");
        // Silences the minimum of 2 s alone would have taken for a stall.
        assert!(traffic.longest_silence >= silence, "{name}");
    }
}

/// Latencies spread evenly over `[from, to)`: the `i`-th of `count`.
fn spread(from: Duration, to: Duration, i: u32, count: u32) -> Duration {
    from + (to - from) * i / count
}

/// A wave of 1,000 long generations (40 to 80 s each) sent at once, right after an earlier such
/// wave was answered, followed by 10 more requests a second for 40 s: the backend is silent for
/// 40 s while callers keep asking, with the earlier wave's answers (25 a second) still in the
/// window. What keeps the breaker closed is the quickest-answer guard: no answer in the window
/// came back sooner than 70 s, so a shorter silence is no stall. Had the earlier answers been
/// quick (0.5 to 1 s), the same silence would have opened it, at the first request more than
/// 2 s after the last answer.
#[tokio::test(start_paused = true)]
async fn a_wave_of_long_generations_is_no_stall() {
    let seconds = Duration::from_secs;
    for (earlier, opens) in [
        ((seconds(40), seconds(80)), false),
        ((Duration::from_millis(500), seconds(1)), true),
    ] {
        let mut traffic = Traffic::new(CircuitBreaker::new(BreakerConfig::default().with_seed(6)));
        // The earlier wave, sent so that its answers end at 80 s.
        traffic.run_until(seconds(80) - earlier.1).await;
        for i in 0..1_000 {
            traffic.send(spread(earlier.0, earlier.1, i, 1_000));
        }
        traffic.run_until(seconds(80)).await;
        assert_eq!(traffic.answered, 1_000);

        // The wave, then the trickle.
        let random = RandomSource::seeded(7);
        let mut long = || seconds(40) + seconds(40).mul_f64(random.f64());
        for _ in 0..1_000 {
            traffic.send(long());
        }
        traffic
            .client(400, Duration::from_millis(100), &mut long, false)
            .await;
        traffic.run_until(seconds(220)).await;
        let snapshot = traffic.breaker.snapshot();
        println!(
            "earlier wave of {earlier:?}: opened at {:?}, silence then {:?}; {} sent, {} answered",
            traffic.opened_at, traffic.silence_at_open, traffic.sent, traffic.answered
        );
        if opens {
            assert_eq!(snapshot.cause, Some(OpenCause::Stall));
            let silence = traffic.silence_at_open.unwrap();
            assert!(
                silence > seconds(2) && silence <= Duration::from_millis(2_200),
                "{silence:?}"
            );
        } else {
            assert_eq!(traffic.opened_at, None, "{snapshot:?}");
            assert_eq!((snapshot.opened, snapshot.in_flight), (0, 0));
            assert_eq!((traffic.sent, traffic.answered), (2_400, 2_400));
        }
    }
}

/// A black hole at a low rate is judged by the answer rate from before the silence, which the
/// silence does not drain: at 2 requests a second, each taking 10 to 15 s (25 in flight), the
/// breaker opens once the silence has cost 20 answers, 10 s after the last one (a rate read from
/// the window at the time of the check would sink with the silence and never get there).
#[tokio::test(start_paused = true)]
async fn a_black_hole_at_a_low_rate_opens_once_it_has_cost_20_answers() {
    let seconds = Duration::from_secs;
    let mut traffic = Traffic::new(CircuitBreaker::new(BreakerConfig::default().with_seed(8)));
    let mut sent = 0;
    let mut latency = || {
        sent += 1;
        spread(seconds(10), seconds(15), sent % 100, 100)
    };
    traffic
        .client(120, Duration::from_millis(500), &mut latency, false)
        .await;
    assert_eq!(traffic.opened_at, None);
    traffic.black_hole = Some(traffic.now());
    traffic
        .client(60, Duration::from_millis(500), &mut latency, true)
        .await;
    let silence = traffic
        .silence_at_open
        .expect("the black hole was never cut");
    println!("2 req/s of 10 to 15 s generations: stall detected {silence:?} after the last answer");
    assert_eq!(traffic.breaker.snapshot().cause, Some(OpenCause::Stall));
    assert!(
        silence > seconds(10) && silence <= seconds(12),
        "{silence:?}"
    );
}

/// No more answers can be missed than attempts are in flight: after 20 s of quick chat traffic
/// at 100 requests a second, the traffic turns to a few long generations (one every 2 s, 30 s
/// each, at most 15 in flight), whose silence the quick answers before it would otherwise have
/// taken for a stall after 2 s. The breaker stays closed and all of them are answered.
#[tokio::test(start_paused = true)]
async fn a_few_long_generations_after_quick_traffic_are_no_stall() {
    let latencies = LogNormal::chat(9);
    let mut traffic = Traffic::new(CircuitBreaker::new(BreakerConfig::default().with_seed(9)));
    traffic
        .client(2_000, Duration::from_millis(10), || latencies.draw(), false)
        .await;
    traffic
        .client(
            30,
            Duration::from_secs(2),
            || Duration::from_secs(30),
            false,
        )
        .await;
    traffic
        .run_until(traffic.now() + Duration::from_secs(40))
        .await;
    let snapshot = traffic.breaker.snapshot();
    assert_eq!(traffic.opened_at, None, "{snapshot:?}");
    assert!(traffic.longest_silence > Duration::from_secs(20));
    assert_eq!((traffic.sent, traffic.answered), (2_030, 2_030));
}

//! Scenarios: the offered load, the backend's size and health, and the fault it suffers.
//!
//! The built-in scenarios replay the field's incidents. Every number that shapes them is a
//! documented constant here, so a reader can check the calibration in one place.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// Offered load of the field's incident: 12,000 requests per second.
pub const FIELD_QPS: f64 = 12_000.0;

/// Median service time of the healthy provider (the field's 800 ms).
pub const HEALTHY_MEDIAN: Duration = Duration::from_millis(800);

/// Error rate of the healthy provider (the field's 0.01%).
pub const HEALTHY_ERROR_RATE: f64 = 0.0001;

/// Median service time while degraded (the field's 2500 ms).
pub const DEGRADED_MEDIAN: Duration = Duration::from_millis(2500);

/// Error rate while degraded (the field's 5%).
pub const DEGRADED_ERROR_RATE: f64 = 0.05;

/// Shape (sigma of the underlying normal) of the log-normal service time.
///
/// LLM latency is dominated by the number of generated tokens, which is right-skewed; sigma 0.5
/// puts the healthy p99 at about 2.6 s for an 800 ms median.
pub const SERVICE_TIME_SIGMA: f64 = 0.5;

/// Concurrent slots of the simulated provider at [`FIELD_QPS`].
///
/// Little's law: in-flight work = arrival rate x mean service time. Degraded, the log-normal mean
/// is 2500 ms x exp(sigma^2 / 2) = 2.83 s, so 12,000 req/s keep about 34,000 slots busy. 40,000
/// slots leave 18% headroom: the provider survives the degradation when nobody retries, and
/// falls over when retries add more than that.
pub const FIELD_CAPACITY: u32 = 40_000;

/// Longest a request may wait in the provider's queue before it is shed with 529 (overloaded).
pub const MAX_QUEUE_WAIT: Duration = Duration::from_secs(5);

/// How far above capacity (in-flight work / slots - 1) the provider fails every request it admits.
///
/// Between capacity and capacity x 1.25 the share of admitted requests that fail with 503 after
/// doing their work grows linearly from 0 to 1: past its slots an LLM server thrashes (KV-cache
/// preemption and recomputation, memory pressure, engine restarts) and burns GPU time on work it
/// then fails. This is the "errors rise sharply" half of the overload; the queue is the "latency
/// grows" half.
pub const OVERLOAD_ERROR_SPAN: f64 = 0.25;

/// Per-attempt timeout of today's clients (the `none`, `naive` and `tower` pipelines).
///
/// Tuned, as clients usually are, to the healthy provider: about its p99.9 (3.7 s for an 800 ms
/// median at sigma 0.5). stormguard's pipeline has no per-attempt timeout: one deadline spans all
/// attempts (see `stormguard-deadline`).
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(4);

/// How long after the end of the scenario a run waits for its last answers at most.
///
/// A safety net so that a run always ends; no built-in pipeline comes close to it (requests
/// still unanswered then count as failures).
pub const CALLER_PATIENCE: Duration = Duration::from_secs(120);

/// Length of the built-in scenarios.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(60);

/// Share of the offered load the quota scenario's provider accepts.
pub const QUOTA_SHARE: f64 = 0.75;

/// `Retry-After` the quota scenario's provider sends with its 429s.
pub const QUOTA_RETRY_AFTER: Duration = Duration::from_secs(2);

/// Seed of the built-in scenarios.
pub const DEFAULT_SEED: u64 = 42;

/// Offered load of the black-hole incident: 1,000 requests per second.
pub const BLACKHOLE_QPS: f64 = 1_000.0;

/// Concurrent slots of the black-hole scenario's provider at [`BLACKHOLE_QPS`]: ample.
///
/// Healthy, 1,000 req/s keep about 900 slots busy (Little's law: 1,000 x 0.91 s mean); 10,000
/// slots take even four attempts per request (naive retries' worst) with room to spare. The
/// incident is about the connections the clients hold open, not about the provider's capacity.
pub const BLACKHOLE_CAPACITY: u32 = 10_000;

/// Which built-in scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScenarioKind {
    /// The field's incident: errors 0.01% -> 5% and latency 800 -> 2500 ms from 10 s to 40 s.
    Seed,
    /// A total outage from 20 s to 30 s: every request fails fast with 503, in-flight work is lost.
    Outage,
    /// From 10 s to 40 s the provider accepts 75% of the offered rate and answers the rest with
    /// 429 and `Retry-After: 2`.
    Quota,
    /// The field's black hole, at 1,000 requests/s: from 20 s to 30 s the provider accepts
    /// connections and never answers.
    Blackhole,
}

impl ScenarioKind {
    /// Every built-in scenario.
    pub const ALL: [ScenarioKind; 4] = [
        ScenarioKind::Seed,
        ScenarioKind::Outage,
        ScenarioKind::Quota,
        ScenarioKind::Blackhole,
    ];

    /// The name used on the command line and in file names.
    pub fn as_str(self) -> &'static str {
        match self {
            ScenarioKind::Seed => "seed",
            ScenarioKind::Outage => "outage",
            ScenarioKind::Quota => "quota",
            ScenarioKind::Blackhole => "blackhole",
        }
    }
}

impl fmt::Display for ScenarioKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error for an unknown scenario name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownScenario(pub String);

impl fmt::Display for UnknownScenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown scenario `{}` (expected seed, outage, quota or blackhole)",
            self.0
        )
    }
}

impl std::error::Error for UnknownScenario {}

impl FromStr for ScenarioKind {
    type Err = UnknownScenario;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ScenarioKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == s)
            .ok_or_else(|| UnknownScenario(s.to_owned()))
    }
}

/// How the provider behaves when it is up and not rate limited.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Health {
    /// Probability that an admitted request fails with 500.
    pub error_rate: f64,
    /// Median of the log-normal service time.
    pub median: Duration,
}

impl Health {
    /// The healthy provider.
    pub const HEALTHY: Health = Health {
        error_rate: HEALTHY_ERROR_RATE,
        median: HEALTHY_MEDIAN,
    };
    /// The field's degraded provider.
    pub const DEGRADED: Health = Health {
        error_rate: DEGRADED_ERROR_RATE,
        median: DEGRADED_MEDIAN,
    };
}

/// What goes wrong during the fault window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FaultKind {
    /// Errors and latency step up.
    Degraded(Health),
    /// The provider is down: every attempt gets 503 at once; work in flight is lost.
    Outage,
    /// The provider admits at most `per_sec` requests a second (token bucket, one second of
    /// burst) and answers the rest with 429 and `Retry-After`.
    Quota {
        /// Admitted requests per second.
        per_sec: f64,
        /// The `Retry-After` sent with each 429.
        retry_after: Duration,
    },
    /// The provider accepts connections and never answers: every attempt that arrives in the
    /// window, and every attempt in flight when it starts, hangs until its client drops it.
    Blackhole,
}

impl FaultKind {
    /// Whether the provider serves nothing during the fault (an outage, a black hole): the
    /// faults a client does best to stop sending to.
    pub fn is_dead(self) -> bool {
        matches!(self, FaultKind::Outage | FaultKind::Blackhole)
    }
}

/// The fault and when it happens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fault {
    /// Start of the fault window, from the start of the run.
    pub start: Duration,
    /// End of the fault window.
    pub end: Duration,
    /// What goes wrong.
    pub kind: FaultKind,
}

impl Fault {
    /// Whether `at` (from the start of the run) falls in the fault window.
    pub fn contains(&self, at: Duration) -> bool {
        self.start <= at && at < self.end
    }
}

/// One complete scenario: load, backend, fault and client settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    /// Which built-in scenario this derives from (names the chart file).
    pub kind: ScenarioKind,
    /// Offered load: Poisson arrivals per second.
    pub qps: f64,
    /// How long requests arrive. The run lasts until the last of them has an answer.
    pub duration: Duration,
    /// Concurrent slots of the provider.
    pub capacity: u32,
    /// Seed of every random draw (arrivals, service times, errors, the layers' jitter).
    pub seed: u64,
    /// The provider outside the fault window.
    pub baseline: Health,
    /// Shape of the log-normal service time.
    pub sigma: f64,
    /// Longest queue wait before the provider sheds with 529.
    pub max_queue_wait: Duration,
    /// Overload (in-flight / slots - 1) at which every admitted request fails.
    pub overload_error_span: f64,
    /// The fault.
    pub fault: Fault,
    /// Per-attempt timeout of today's pipelines (`none`, `naive`, `tower`).
    pub attempt_timeout: Duration,
}

impl Scenario {
    /// A built-in scenario at the field's load (12,000 req/s, 40,000 slots, 60 s); the black
    /// hole at its incident's (1,000 req/s, 10,000 slots, 60 s).
    pub fn builtin(kind: ScenarioKind) -> Scenario {
        let fault = match kind {
            ScenarioKind::Seed => Fault {
                start: Duration::from_secs(10),
                end: Duration::from_secs(40),
                kind: FaultKind::Degraded(Health::DEGRADED),
            },
            ScenarioKind::Outage => Fault {
                start: Duration::from_secs(20),
                end: Duration::from_secs(30),
                kind: FaultKind::Outage,
            },
            ScenarioKind::Quota => Fault {
                start: Duration::from_secs(10),
                end: Duration::from_secs(40),
                kind: FaultKind::Quota {
                    per_sec: FIELD_QPS * QUOTA_SHARE,
                    retry_after: QUOTA_RETRY_AFTER,
                },
            },
            ScenarioKind::Blackhole => Fault {
                start: Duration::from_secs(20),
                end: Duration::from_secs(30),
                kind: FaultKind::Blackhole,
            },
        };
        let (qps, capacity) = match kind {
            ScenarioKind::Blackhole => (BLACKHOLE_QPS, BLACKHOLE_CAPACITY),
            _ => (FIELD_QPS, FIELD_CAPACITY),
        };
        Scenario {
            kind,
            qps,
            duration: DEFAULT_DURATION,
            capacity,
            seed: DEFAULT_SEED,
            baseline: Health::HEALTHY,
            sigma: SERVICE_TIME_SIGMA,
            max_queue_wait: MAX_QUEUE_WAIT,
            overload_error_span: OVERLOAD_ERROR_SPAN,
            fault,
            attempt_timeout: ATTEMPT_TIMEOUT,
        }
    }

    /// Change the offered load, scaling capacity (and a quota) with it so utilisation stays the same.
    pub fn with_qps(mut self, qps: f64) -> Scenario {
        let qps = if qps.is_finite() && qps > 0.0 {
            qps
        } else {
            self.qps
        };
        let factor = qps / self.qps;
        self.capacity = ((f64::from(self.capacity) * factor).round() as u32).max(1);
        if let FaultKind::Quota {
            per_sec,
            retry_after,
        } = self.fault.kind
        {
            self.fault.kind = FaultKind::Quota {
                per_sec: per_sec * factor,
                retry_after,
            };
        }
        self.qps = qps;
        self
    }

    /// Change the provider's slots (after [`Scenario::with_qps`], which scales them).
    pub fn with_capacity(mut self, capacity: u32) -> Scenario {
        self.capacity = capacity.max(1);
        self
    }

    /// Change the length of the run; the fault window keeps its place in proportion.
    pub fn with_duration(mut self, duration: Duration) -> Scenario {
        if duration.is_zero() {
            return self;
        }
        let factor = duration.as_secs_f64() / self.duration.as_secs_f64();
        let scale =
            |at: Duration| Duration::from_millis((at.as_millis() as f64 * factor).round() as u64);
        self.fault.start = scale(self.fault.start);
        self.fault.end = scale(self.fault.end);
        self.duration = duration;
        self
    }

    /// Change the seed.
    pub fn with_seed(mut self, seed: u64) -> Scenario {
        self.seed = seed;
        self
    }

    /// Change the per-attempt timeout of today's pipelines.
    pub fn with_attempt_timeout(mut self, timeout: Duration) -> Scenario {
        self.attempt_timeout = timeout;
        self
    }

    /// The provider's health at `at` (the baseline, or the degraded health in a degraded window).
    pub fn health_at(&self, at: Duration) -> Health {
        match self.fault.kind {
            FaultKind::Degraded(health) if self.fault.contains(at) => health,
            _ => self.baseline,
        }
    }

    /// Mean of the log-normal service time for a given median: median x exp(sigma^2 / 2).
    pub fn mean_service_time(&self, median: Duration) -> Duration {
        let factor = (self.sigma * self.sigma / 2.0).exp();
        Duration::try_from_secs_f64(median.as_secs_f64() * factor).unwrap_or(median)
    }

    /// Requests per second the provider can complete at `at` (capacity / mean service time).
    pub fn throughput_at(&self, at: Duration) -> f64 {
        if self.fault.kind.is_dead() && self.fault.contains(at) {
            return 0.0;
        }
        let mean = self
            .mean_service_time(self.health_at(at).median)
            .as_secs_f64();
        f64::from(self.capacity) / mean
    }

    /// One line describing the scenario, for the report's header.
    pub fn describe(&self) -> String {
        let secs = |d: Duration| format!("{}", d.as_secs_f64());
        let fault = match self.fault.kind {
            FaultKind::Degraded(h) => format!(
                "errors {}% -> {}%, median latency {} -> {} ms",
                self.baseline.error_rate * 100.0,
                h.error_rate * 100.0,
                self.baseline.median.as_millis(),
                h.median.as_millis()
            ),
            FaultKind::Outage => "total outage (503 at once, in-flight work lost)".to_owned(),
            FaultKind::Blackhole => {
                "black hole (connections accepted, never answered; in-flight work lost)".to_owned()
            }
            FaultKind::Quota {
                per_sec,
                retry_after,
            } => format!(
                "quota {per_sec:.0} req/s, 429 with Retry-After {} s",
                retry_after.as_secs_f64()
            ),
        };
        format!(
            "scenario {}: {:.0} req/s for {} s, {} slots, seed {}; fault {} s..{} s: {}; \
             attempt timeout (none/naive/tower) {} s",
            self.kind,
            self.qps,
            secs(self.duration),
            self.capacity,
            self.seed,
            secs(self.fault.start),
            secs(self.fault.end),
            fault,
            secs(self.attempt_timeout),
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn capacity_has_headroom_for_the_degraded_load_by_littles_law() {
        let s = Scenario::builtin(ScenarioKind::Seed);
        let busy = s.qps * s.mean_service_time(DEGRADED_MEDIAN).as_secs_f64();
        assert!((33_000.0..35_000.0).contains(&busy), "{busy}");
        let headroom = f64::from(s.capacity) / busy;
        assert!((1.1..1.25).contains(&headroom), "{headroom}");
    }

    #[test]
    fn qps_scales_capacity_and_quota_together() {
        let s = Scenario::builtin(ScenarioKind::Quota).with_qps(1_200.0);
        assert_eq!(s.capacity, 4_000);
        assert_eq!(
            s.fault.kind,
            FaultKind::Quota {
                per_sec: 900.0,
                retry_after: QUOTA_RETRY_AFTER
            }
        );
    }

    #[test]
    fn duration_scales_the_fault_window() {
        let s = Scenario::builtin(ScenarioKind::Seed).with_duration(Duration::from_secs(30));
        assert_eq!(s.fault.start, Duration::from_secs(5));
        assert_eq!(s.fault.end, Duration::from_secs(20));
    }

    #[test]
    fn blackhole_runs_at_its_incident_load_with_ample_capacity() {
        let s = Scenario::builtin(ScenarioKind::Blackhole);
        assert_eq!((s.qps, s.capacity), (1_000.0, 10_000));
        assert_eq!(
            (s.fault.start, s.fault.end),
            (Duration::from_secs(20), Duration::from_secs(30))
        );
        let busy = 4.0 * s.qps * s.mean_service_time(HEALTHY_MEDIAN).as_secs_f64();
        assert!(busy < 0.4 * f64::from(s.capacity), "{busy}");
        assert_eq!(s.throughput_at(Duration::from_secs(25)), 0.0);
        assert!(s.throughput_at(Duration::from_secs(30)) > 10_000.0);
    }

    #[test]
    fn names_round_trip() {
        for kind in ScenarioKind::ALL {
            assert_eq!(kind.as_str().parse::<ScenarioKind>().unwrap(), kind);
        }
        assert!("storm".parse::<ScenarioKind>().is_err());
    }
}

//! [`Fleet`]: a rate limit's state in Redis, so that every replica of a gateway paces at one
//! provider quota between them; and the cooldowns of the replicas' failovers (`cooldowns`).

mod cooldowns;

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Script, ScriptInvocation};
use tokio::time::Instant;

use crate::store::{FleetDimension, Store};

/// The script every decision runs: the GCRA of one bucket, atomically in Redis.
static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("fleet.lua")));

/// Where a fleet's rate limits keep their state: one Redis server, shared by every replica.
///
/// Set it on the config ([`RateLimitConfig::with_fleet`](crate::RateLimitConfig::with_fleet)) of
/// each replica's limit, with the same numbers, prefix and keys everywhere: each admission is then
/// decided by one atomic script in Redis (one round trip), and the replicas together admit no
/// more than the quota. The wait for a slot stays in the process (nobody polls Redis), and what
/// the provider says about its quota (a spent quota, a `Retry-After`) reaches Redis with the
/// replica's next decision, for all replicas to obey.
///
/// Redis can be slow or away. A call that takes longer than the [timeout](Self::with_timeout)
/// (5 ms by default) or fails is decided in the process instead, on a *local share* of the
/// quota: the quota divided by the [replicas](Self::with_replicas) (configured, or the number
/// that used the bucket over the last 30 s as Redis last counted them). Redis is then left alone
/// for 25 ms, doubled after each failure up to 2 s, while the connection manager reconnects
/// with its own backoff; the first call that succeeds brings the fleet back. Going away and
/// coming back are logged once each (`tracing`, WARN and INFO). Callers never see an error or a
/// stall because of Redis: at worst a decision waits the timeout once.
///
/// While Redis is away a replica sends no more than its share allows (its rate, and its bucket
/// once), the slots it reserved in Redis before included: they go whether Redis answers or not.
/// Each decision on the share counts every slot the replica holds reserved and has not sent
/// yet, from Redis or from the share, whatever the order in which they were decided, as taken
/// from the share's bucket at that instant: the share lets a request go only once they leave it
/// room (one whose slot would come later than it may wait is refused, as Redis would refuse
/// it), then paces at its rate. The share also counts each slot Redis gives the replica, at the
/// slot's start, and so is never fuller than empty just after the last of them (no burst on top
/// of a replica that took more than its share through Redis). The share's bucket starts empty
/// (one request at once, then the share's rate): a replica that has not heard from Redis (just
/// started or restarted, or its first answers came too late) cannot know what the fleet took. A
/// decision is made once: a reply later than the timeout is not read and the share decides; the
/// slot the script may still take in Redis stays taken there, as the fleet's count of the
/// request the share let go.
///
/// ```no_run
/// use std::time::Duration;
/// use stormguard_rate_limit::{Fleet, RateLimit, RateLimitConfig};
///
/// # fn main() -> Result<(), stormguard_rate_limit::FleetError> {
/// let fleet = Fleet::new("redis://127.0.0.1:6379/")?
///     .with_prefix("gateway:openai")
///     .with_replicas(Some(3));
/// let limit = RateLimit::new(
///     RateLimitConfig::default()
///         .with_requests_per_minute(Some(10_000))
///         .with_tokens_per_minute(Some(2_000_000))
///         .with_fleet(fleet),
/// );
/// # let _ = limit;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Fleet {
    prefix: Arc<str>,
    timeout: Duration,
    replicas: Option<u32>,
    state: Arc<State>,
}

/// What every clone of a [`Fleet`] shares.
struct State {
    client: redis::Client,
    /// Made on first use, inside the runtime (the manager spawns a task).
    connection: OnceLock<ConnectionManager>,
    /// This process among the replicas.
    id: String,
    /// Replicas that used a bucket over the last 30 s, as Redis last counted them (0: never).
    seen: AtomicU32,
    health: Mutex<Health>,
    fleet_decisions: AtomicU64,
    local_decisions: AtomicU64,
    /// The fleet's cooldowns as this replica last read them (see `cooldowns`).
    cooldowns: Mutex<HashMap<String, Instant>>,
    /// A read of the cooldowns is in flight.
    reading: AtomicBool,
}

/// Whether Redis answers, and when to ask again if not.
#[derive(Default)]
struct Health {
    /// Failures in a row.
    failures: u32,
    /// Redis is left alone until then.
    away_until: Option<Instant>,
}

/// What a fleet holds now, as returned by [`Fleet::snapshot`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FleetSnapshot {
    /// Whether decisions are made in Redis now (false: on the local share, Redis is away).
    pub connected: bool,
    /// The replicas the local share divides the quota by.
    pub replicas: u32,
    /// Decisions made in Redis so far.
    pub fleet_decisions: u64,
    /// Decisions made on the local share so far (Redis away, slow or failing).
    pub local_decisions: u64,
}

/// A fleet that cannot be made: its address does not parse (or asks for TLS, which is not built
/// in).
#[derive(Debug)]
pub struct FleetError {
    source: redis::RedisError,
}

impl fmt::Display for FleetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid Redis address for the rate limit's fleet: {}",
            self.source
        )
    }
}

impl std::error::Error for FleetError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

impl Fleet {
    /// How long a decision waits for Redis before it is made on the local share: 5 ms, about
    /// twenty loopback or same-zone round trips, and little beside an LLM call's hundreds of
    /// milliseconds.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(5);

    /// The prefix of every key the fleet writes.
    pub const DEFAULT_PREFIX: &'static str = "stormguard:rate-limit";

    /// The first pause after a failure; it doubles with each failure in a row.
    const FIRST_PAUSE: Duration = Duration::from_millis(25);

    /// The longest pause between tries while Redis is away.
    const LONGEST_PAUSE: Duration = Duration::from_secs(2);

    /// A fleet whose state lives in the Redis server at `url` (`redis://host:port/db`, with
    /// `user:password@` if need be). Nothing connects yet: the first decision does, and a
    /// server that is not there only means local decisions until it is.
    pub fn new(url: &str) -> Result<Self, FleetError> {
        let client = redis::Client::open(url).map_err(|source| FleetError { source })?;
        Ok(Self {
            prefix: Arc::from(Self::DEFAULT_PREFIX),
            timeout: Self::DEFAULT_TIMEOUT,
            replicas: None,
            state: Arc::new(State {
                client,
                connection: OnceLock::new(),
                // Random per process (the standard library's hasher keys are).
                id: format!("{:016x}", RandomState::new().build_hasher().finish()),
                seen: AtomicU32::new(0),
                health: Mutex::new(Health::default()),
                fleet_decisions: AtomicU64::new(0),
                local_decisions: AtomicU64::new(0),
                cooldowns: Mutex::new(HashMap::new()),
                reading: AtomicBool::new(false),
            }),
        })
    }

    /// Prefix every key with `prefix` (default [`DEFAULT_PREFIX`](Self::DEFAULT_PREFIX)):
    /// replicas that share a quota share a prefix, and one Redis can hold several fleets.
    #[must_use]
    pub fn with_prefix(mut self, prefix: &str) -> Self {
        self.prefix = Arc::from(prefix);
        self
    }

    /// Wait at most `timeout` for Redis per decision (default 5 ms).
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The number of replicas that share the quota (at least 1), by which the local share
    /// divides it while Redis is away. `None` (the default): the number Redis last counted
    /// (those that used the bucket over the last 30 s), or 1, the whole quota, if Redis never
    /// answered. Set it when a fleet may start while Redis is down.
    #[must_use]
    pub fn with_replicas(mut self, replicas: Option<u32>) -> Self {
        self.replicas = replicas.map(|n| n.max(1));
        self
    }

    /// The prefix of the fleet's keys.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The longest wait for Redis per decision.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The configured number of replicas.
    pub fn replicas(&self) -> Option<u32> {
        self.replicas
    }

    /// Whether decisions go to Redis now, how many replicas the local share counts, and how
    /// many decisions were made where.
    pub fn snapshot(&self) -> FleetSnapshot {
        let state = &*self.state;
        FleetSnapshot {
            connected: self.health().away_until.is_none(),
            replicas: self.share(),
            fleet_decisions: state.fleet_decisions.load(Ordering::Relaxed),
            local_decisions: state.local_decisions.load(Ordering::Relaxed),
        }
    }

    /// The invocation of one operation on a bucket.
    fn invocation(&self, keys: &Keys, op: &str) -> ScriptInvocation<'static> {
        let mut invocation = SCRIPT.key(&keys.bucket[..]);
        invocation.key(&keys.replicas[..]).arg(op);
        invocation
    }

    /// This replica's id, for the script's count of replicas.
    fn id(&self) -> &str {
        &self.state.id
    }

    /// The connection, if Redis is to be asked now: not while it is away, nor outside a tokio
    /// runtime (the connection manager needs one).
    fn connection(&self) -> Option<ConnectionManager> {
        if self
            .health()
            .away_until
            .is_some_and(|until| Instant::now() < until)
        {
            return None;
        }
        tokio::runtime::Handle::try_current().ok()?;
        if let Some(connection) = self.state.connection.get() {
            return Some(connection.clone());
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(500)))
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_secs(1))
            .set_number_of_retries(6);
        match ConnectionManager::new_lazy_with_config(self.state.client.clone(), config) {
            Ok(connection) => Some(self.state.connection.get_or_init(|| connection).clone()),
            Err(error) => {
                self.failed(&error);
                None
            }
        }
    }

    /// Runs `invocation` in Redis within the timeout: its reply, or `None` (Redis away, slow or
    /// failing: the caller decides locally).
    fn call(
        &self,
        invocation: ScriptInvocation<'static>,
    ) -> Option<impl Future<Output = Option<Vec<String>>> + Send + 'static> {
        let mut connection = self.connection()?;
        let fleet = self.clone();
        Some(async move {
            let call = invocation.invoke_async::<Vec<String>>(&mut connection);
            match tokio::time::timeout(fleet.timeout, call).await {
                Ok(Ok(reply)) => {
                    fleet.answered();
                    Some(reply)
                }
                Ok(Err(error)) => {
                    fleet.failed(&error);
                    None
                }
                Err(_) => {
                    fleet.failed(&format_args!("no answer within {:?}", fleet.timeout));
                    None
                }
            }
        })
    }

    /// Runs `invocation` in the background, for what needs no answer (a slot given back, a
    /// weight corrected): lost if Redis is away, which only errs on the safe side.
    fn spawn(&self, invocation: ScriptInvocation<'static>) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current()
            && let Some(call) = self.call(invocation)
        {
            runtime.spawn(call);
        }
    }

    fn health(&self) -> std::sync::MutexGuard<'_, Health> {
        self.state
            .health
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn answered(&self) {
        let mut health = self.health();
        health.failures = 0;
        let was_away = health.away_until.take().is_some();
        drop(health);
        if was_away {
            tracing::info!(
                prefix = %self.prefix,
                "the fleet's state in Redis is back: decisions are shared again"
            );
        }
    }

    fn failed(&self, error: &dyn fmt::Display) {
        let mut health = self.health();
        let pause = Self::FIRST_PAUSE
            .saturating_mul(1 << health.failures.min(10))
            .min(Self::LONGEST_PAUSE);
        health.failures = health.failures.saturating_add(1);
        let was_away = health.away_until.replace(Instant::now() + pause).is_some();
        drop(health);
        if !was_away {
            tracing::warn!(
                prefix = %self.prefix,
                replicas = self.share(),
                "the fleet's state in Redis is unreachable ({error}): deciding on a local share \
                 of the quota, and leaving backends by this replica's own breakers, until it is \
                 back"
            );
        }
    }
}

impl fmt::Debug for Fleet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fleet")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("replicas", &self.replicas)
            .field("snapshot", &self.snapshot())
            .finish()
    }
}

/// The Redis keys of one bucket.
pub(crate) struct Keys {
    bucket: Vec<u8>,
    replicas: Vec<u8>,
}

impl Store for Fleet {
    type Keys = Keys;

    /// The Redis key of a bucket (`None`: the limit's unkeyed one), and of its replicas.
    fn keys(&self, key: Option<&[u8]>) -> Keys {
        let mut bucket = Vec::with_capacity(self.prefix.len() + 8 + key.map_or(3, <[u8]>::len));
        bucket.extend_from_slice(self.prefix.as_bytes());
        // The braces make both keys one hash slot, as a script's keys must be in a cluster.
        match key {
            Some(key) => {
                bucket.extend_from_slice(b":k:{");
                bucket.extend_from_slice(key);
            }
            None => bucket.extend_from_slice(b":u:{all"),
        }
        bucket.push(b'}');
        let mut replicas = bucket.clone();
        replicas.extend_from_slice(b":replicas");
        Keys { bucket, replicas }
    }

    fn share(&self) -> u32 {
        self.replicas
            .unwrap_or_else(|| self.state.seen.load(Ordering::Relaxed).max(1))
    }

    fn decided(&self, replicas: u32) {
        self.state.seen.store(replicas, Ordering::Relaxed);
        self.state.fleet_decisions.fetch_add(1, Ordering::Relaxed);
    }

    fn decided_locally(&self) {
        self.state.local_decisions.fetch_add(1, Ordering::Relaxed);
    }

    fn reserve(
        &self,
        keys: &Keys,
        blocked: [u64; 2],
        dimensions: &[FleetDimension; 2],
        max_wait: u64,
    ) -> Option<impl Future<Output = Option<Vec<String>>> + Send + 'static> {
        let [requests, weighed] = dimensions;
        let mut invocation = self.invocation(keys, "reserve");
        invocation
            .arg(self.id())
            .arg(micros(blocked[0]))
            .arg(micros(blocked[1]))
            .arg(&requests.interval)
            .arg(requests.burst)
            .arg(&weighed.interval)
            .arg(weighed.burst)
            .arg(weighed.units)
            .arg(micros(max_wait));
        self.call(invocation)
    }

    fn block(&self, keys: &Keys, blocked: [u64; 2]) {
        let mut invocation = self.invocation(keys, "block");
        for blocked in blocked {
            invocation.arg(micros(blocked));
        }
        self.spawn(invocation);
    }

    fn give_back(&self, keys: &Keys, dimensions: &[FleetDimension; 2]) {
        let mut invocation = self.invocation(keys, "return");
        for shape in dimensions {
            invocation
                .arg(&shape.interval)
                .arg(shape.burst)
                .arg(shape.units)
                .arg(&shape.end);
        }
        self.spawn(invocation);
    }

    fn adjust(&self, keys: &Keys, interval: &str, difference: i64) {
        let mut invocation = self.invocation(keys, "adjust");
        invocation.arg(interval).arg(difference);
        self.spawn(invocation);
    }
}

/// Nanoseconds as whole microseconds, rounded up (a wait, a block: never shorter).
pub(crate) fn micros(nanos: u64) -> u64 {
    nanos.div_ceil(1_000)
}

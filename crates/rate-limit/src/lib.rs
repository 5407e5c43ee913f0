//! A requests- and tokens-per-minute rate limit for tower services: pace bursts at the client,
//! within a bounded wait, instead of sending them into the provider's 429s; weigh LLM requests by
//! their tokens; learn the limits from the provider.
//!
//! # The incident
//!
//! Bursts of traffic above a provider's quota. Sent as they come, the excess meets 429s, which
//! clients retry into the same quota. Pacing the bursts at the client, queueing each request for
//! at most 2 s, cut 429s by 91.4% and raised end-to-end success from 88.2% to 99.85%. LLM quotas
//! count requests *and* tokens per minute (OpenAI: RPM and TPM; Anthropic: requests, input and
//! output tokens), so a limiter that counts only requests lets a burst of long prompts through.
//!
//! # The algorithm
//!
//! A [`RateLimit`] holds, per key, one GCRA per dimension (requests, tokens): the generic cell
//! rate algorithm of ITU-T I.371 in its virtual-scheduling form, the algorithm of most token
//! buckets in production (redis-cell, governor, Envoy's local rate limit works the same way). Its
//! state is one instant, the time at which the bucket is full again; a request of `w` units
//! moves it `w / rate` later, and may go once the bucket holds `w` units. Here a request does not
//! ask "may I go?" but "when may I go?": it reserves its slot in both dimensions at once, first
//! come first served, and waits for it if the wait is within the limit's `max_wait` (2 s by
//! default) and the request's deadline; otherwise it fails at once with [`RateLimited`], which
//! says when to come back. A request that stops waiting gives its slot back. The bucket holds 1 s
//! of the rate ([`RateLimitConfig::DEFAULT_BURST`]); a request heavier than that waits for a
//! full bucket and leaves it in debt; one heavier than a whole minute's quota is refused
//! ([`RateLimitCause::TooHeavy`]): it could never go.
//!
//! A request weighs 1 in requests and, in tokens, its prompt plus the output it allows
//! ([`TokenEstimate`](stormguard_deadline::TokenEstimate), the LLM deadline's estimate: prompt
//! text at 4 bytes per token, and `max_tokens`), which is how providers count a request against
//! the quota when they admit it. OpenAI counts a request's `max_tokens` and keeps counting it;
//! Anthropic counts output tokens by `max_tokens` at the start and corrects them to the real
//! output at the end. [`RateLimitConfig::with_usage_correction`] does the same: the retry engine
//! then reads the `usage` of each successful answer as its reader reads the body (up to
//! [`USAGE_BODY_LIMIT`]) and gives back the tokens it did not use ([`RateLimitPermit::usage`],
//! [`Usage::settle`]; a usage above a minute's quota counts as that quota). It is off by default,
//! as OpenAI's accounting would not give them back.
//!
//! # Learning from the provider
//!
//! With no configured numbers ([`RateLimit::default()`]) the limit learns them; configured numbers
//! are never replaced, only obeyed more strictly while the provider says its quota is spent. On
//! every answer (not only 429s):
//!
//! - OpenAI: `x-ratelimit-limit-requests`, `x-ratelimit-limit-tokens` are the limits a minute;
//!   `x-ratelimit-remaining-*: 0` with `x-ratelimit-reset-*` (a Go duration: `1s`, `6m0s`,
//!   `12ms`) says when the spent quota is whole again: nothing goes before, and the pace resumes
//!   from there as from an empty bucket (a provider's reset is seldom exact);
//! - Anthropic: `anthropic-ratelimit-{requests,tokens,input-tokens}-{limit,remaining,reset}`, the
//!   resets as RFC 3339 times;
//! - a 429's hint (`Retry-After`, `retry-after-ms`): no request goes before it;
//! - a 429 with no stated limit: the request rate follows CUBIC, as AWS SDKs' adaptive retry mode
//!   does (its client rate limiter, after RFC 8312): down to 70% of the rate that met the 429,
//!   then back up along `0.4 (t - K)^3 + w_max`, slowly near the old rate, faster beyond it, never
//!   above twice the rate actually sent. The 429s of requests reserved before a cut met the rate
//!   it already answered and do not cut again (as TCP cuts once a window). A limit with no
//!   numbers thus converges on the provider's.
//!
//! Headers come from the network: values that do not parse are ignored, limits are capped at
//! 2^32 a minute, resets in the past mean nothing, and waits of a day or more (a reset in the
//! year 9999) are not believed.
//!
//! # Keys
//!
//! [`RateLimit::keyed`] keeps one limit per key (a caller's API key, a model, a provider), each
//! learning on its own, with bounded memory: 10,000 keys by default, the idle ones (10 minutes)
//! forgotten first when room is needed.
//!
//! # A fleet (feature `redis`)
//!
//! A provider's quota belongs to an API key, and a gateway runs as N replicas: with a limit in
//! each process, the fleet sends N times the quota. With a [`Fleet`] set on the config
//! ([`RateLimitConfig::with_fleet`]), the limit's state lives in Redis and the replicas share it;
//! reserve with [`RateLimit::acquire`] (the retry engine and the layer do).
//!
//! - **One script per decision.** Each admission runs one Lua script in Redis, atomically, in
//!   one round trip: the same weighted GCRA as in a process, on the Redis server's clock (so the
//!   replicas' clocks need not agree), over a hash per bucket (`tr`, `tt`: the requests' and
//!   tokens' TATs; `br`, `bt`: until when the provider said a quota is spent) that expires a
//!   minute after it is full again. It reserves the slot in both dimensions or in neither, and
//!   answers how long to wait. The wait is slept in the process: nobody polls Redis. A slot given
//!   back and a weight corrected to the usage run the script again, in the background.
//! - **What the fleet guarantees.** Replicas with the same numbers, prefix and keys admit
//!   together what one limit would: at most the bucket at once, then the rate (3 replicas in 3
//!   processes: 499 admitted for an allowance of 500). Limits a replica learns from the
//!   provider's headers, and a spent quota or a `Retry-After`, are shared: a block is written to
//!   Redis as soon as it is learned, and each decision carries the replica's rates, so the fleet
//!   paces at what the provider states. A request rate learned from 429s alone (CUBIC) counts
//!   the fleet's sending rate as this replica's times the replicas (a balanced fleet's).
//! - **Redis slow or away.** A decision waits for Redis at most the fleet's timeout (5 ms), then
//!   is made in the process on a local share of the quota: the rate and the bucket divided by
//!   the replicas (configured with [`Fleet::with_replicas`], else as Redis last counted them).
//!   Redis is then left alone for 25 ms, doubling to 2 s, while the connection manager
//!   reconnects; the first decision it answers brings the fleet back. Each change is logged once.
//!   Callers never get an error because Redis is away (a request is refused only as Redis
//!   would refuse it: its slot would come later than it may wait), and while Redis is away a
//!   replica sends no more than its share allows, the share's rate over the time away and its
//!   bucket once, *the slots it reserved in Redis included*. Those slots (as far ahead as a
//!   request may wait, 2 s) go whether Redis answers or not, so they are charged to the share:
//!   each decision on the share counts every slot the replica holds reserved and has not sent
//!   yet, from Redis or from the share itself, whatever the order in which they were decided,
//!   as taken from the share's bucket at that instant; a replica that reserved four seconds of
//!   its share through Redis sends those, then nothing more on the share until they are paid
//!   for, then the share's rate. The share's bucket is also never fuller than empty just after
//!   the last slot Redis gave the replica (one that took more than its share through Redis
//!   gets no burst on top), nor when the share first decides (one request at once, then the
//!   share's rate), as a replica that has not heard from Redis cannot know what the fleet
//!   took. A decision Redis answers past the timeout is the share's alone, and the slot the
//!   script may still take stays in Redis, counting that request for the fleet. What the share
//!   admits is not otherwise written back (the bucket in Redis fills from where it was). Two
//!   limits to the promise: slots reserved beyond the share's whole allowance (a replica alone
//!   in the fleet holds up to 2 s of the whole quota) still go, and slots that went within the
//!   timeout before Redis was found away were counted by Redis alone.
//! - **Keys.** A keyed limit's key names its bucket in Redis as it is (`<prefix>:k:{<key>}`;
//!   `<prefix>:u:{all}` for the unkeyed bucket): pick keys that are not secrets (a tenant's
//!   name or a hash of its API key, not the key itself). The braces keep a bucket and its count
//!   of replicas in one cluster slot.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use stormguard_rate_limit::{RateLimit, RateLimitConfig};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let limit = RateLimit::new(RateLimitConfig::default().with_requests_per_minute(Some(120)));
//! let head = http::Request::new(()).into_parts().0;
//! // 2 a second, a bucket of 1 s: the first two go at once, the third waits 500 ms.
//! for expected_wait in [0, 0, 500] {
//!     let reservation = limit.reserve(&head, 0, None).expect("within the 2 s wait");
//!     let wait = reservation.start() - tokio::time::Instant::now();
//!     assert_eq!(wait, Duration::from_millis(expected_wait));
//!     let _permit = reservation.send();
//! }
//! # }
//! ```

mod config;
mod error;
#[cfg(feature = "redis")]
mod fleet;
mod gcra;
mod learn;
mod limit;
mod service;
mod store;
mod sync;
mod usage;

pub use config::RateLimitConfig;
pub use error::{RateLimitCause, RateLimited};
#[cfg(feature = "redis")]
pub use fleet::{Fleet, FleetError, FleetSnapshot};
pub use limit::{Acquire, RateLimit, RateLimitPermit, RateLimitSnapshot, Reservation, Usage};
pub use service::{RateLimitLayer, RateLimitService, ResponseFuture};
pub use usage::{USAGE_BODY_LIMIT, usage_tokens};

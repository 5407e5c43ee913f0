//! [`RetryBudget`]: retries capped at a ratio of recent successes, shared and lock-free.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use stormguard_numbers::window::{Age, SlidingWindow, Tagged};

use crate::BudgetConfig;
use crate::sync::{AtomicU64, Ordering};

/// Default window: deposits and withdrawals count for 10 seconds, as in Finagle's `RetryBudget`,
/// Linkerd's `retryBudget` and tower's `TpsBudget`. Long enough to smooth a burst of retries over
/// many seconds of traffic, short enough that the budget follows a backend that starts failing.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);

/// Default floor: 1 retry per second (10 per default window) that needs no deposits.
///
/// Finagle, Linkerd and tower use 10 per second, but they deposit on every *request*, so their
/// floor only matters when there is hardly any traffic. This budget deposits on every *success*:
/// when the backend is fully down there are no successes, and the floor is then every retry the
/// whole client may send. A client that is one of 500 replicas would, at 10 per second, add 5000
/// retries per second against a dead backend; at 1 per second it adds one retry per second per
/// replica. The floor still lets a quiet client (a few calls a minute, too few successes to earn a
/// whole retry at 10%) retry its occasional failure. Use 0 for a strict ratio.
pub const DEFAULT_MIN_PER_SEC: u32 = 1;

/// Default ratio: at most 1 retry per 10 successes. The per-client retry budget of the Google SRE
/// book (chapter "Handling Overload"): each client tracks the share of its requests that are
/// retries and only retries while that share is below 10%. Finagle and Linkerd default to 0.2, but
/// count every request, not every success.
pub const DEFAULT_RATIO: f32 = 0.1;

/// Bounds `new` clamps the window to: a slice (`ttl / 10`) of at least a millisecond, and a window
/// of at most an hour (a retry budget is about the last seconds, not the last day).
const MIN_TTL: Duration = Duration::from_millis(10);
const MAX_TTL: Duration = Duration::from_secs(3600);

/// Largest ratio `new` accepts (tower's `TpsBudget` allows the same range: up to 1000 retries per
/// success).
const MAX_RATIO: f32 = 1000.0;

/// Slices the window is cut into: each covers `ttl / 10`, so counts leave the window a tenth of it
/// at a time.
const SLICES: usize = 10;

/// The window's counters per slice: successes deposited, retries granted, retries refused.
const COUNTERS: usize = 3;
/// Counter of successful responses deposited.
const DEPOSITS: usize = 0;
/// Counter of retries granted (and not refunded).
const WITHDRAWALS: usize = 1;
/// Counter of retries refused.
const REJECTED: usize = 2;

/// Fixed-point unit: one retry costs a million units, a success earns `ratio` million units. Exact
/// for any ratio with up to 6 decimals; otherwise each deposit is rounded by at most half a unit,
/// which takes two million deposits in one window to add up to one retry.
const UNIT: u128 = 1_000_000;

/// A retry budget: retries are allowed while the retries of the last `ttl` stay within
/// `ratio × successes + min_per_sec × ttl`.
///
/// * [`deposit`](Self::deposit) once per **successful** response (not per request: when the
///   backend fails, successes stop and the budget dries up with them);
/// * [`withdraw`](Self::withdraw) once per retry, before sending it; `false` means "don't retry",
///   and nothing was withdrawn.
///
/// Cloning is cheap and every clone shares the same budget (an `Arc` inside), so one budget can
/// cover every client of one backend. `deposit` and `withdraw` take no lock: see the crate docs
/// for the algorithm and why concurrent withdrawals can never overdraw it.
///
/// ```
/// use stormguard_budget::{BudgetConfig, RetryBudget};
///
/// // 10 s window, no floor, 1 retry per 10 successes.
/// let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0));
/// for _ in 0..30 {
///     budget.deposit();
/// }
/// let granted = (0..10).filter(|_| budget.withdraw()).count();
/// assert_eq!(granted, 3);
/// assert_eq!(budget.snapshot().rejected, 7);
/// ```
#[derive(Clone)]
pub struct RetryBudget(Arc<Shared>);

/// A point-in-time view of a [`RetryBudget`], for logs and metrics. Counts cover the current
/// window (the last `ttl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BudgetSnapshot {
    /// Whole retries [`RetryBudget::withdraw`] would grant right now.
    pub balance: u64,
    /// Successful responses deposited in the window.
    pub deposits: u64,
    /// Retries granted in the window.
    pub withdrawals: u64,
    /// Retries refused in the window.
    pub rejected: u64,
}

struct Shared {
    /// Deposits, withdrawals and refusals per slice of `ttl / 10`.
    window: SlidingWindow<COUNTERS>,
    /// Units one success earns (`ratio × UNIT`, rounded).
    deposit_units: u128,
    /// Units the floor grants per window (`min_per_sec × ttl × UNIT`).
    reserve_units: u128,
    /// The latest epoch any withdrawal has worked in. Only moves forward. A withdrawal that finds
    /// it moved past its own epoch after counting itself takes the withdrawal back (see
    /// `withdraw`).
    latest: AtomicU64,
    ttl: Duration,
    min_per_sec: u32,
    ratio: f32,
}

/// A retry the budget granted ([`RetryBudget::ticket`]): any attempt of a request after its
/// first, whether a retry, a hedge, a stream's continuation or a failover's move to another
/// backend. One rule: dropped, it is given back unless the attempt it paid for was sent, exactly
/// as if it had never been granted.
///
/// [`send`](Self::send) marks the attempt handed on to be sent (from then on the ticket is
/// spent); [`settle`](Self::settle) says, once the attempt ended, whether it left the process at
/// all (a layer below that refused it locally never sent it).
#[must_use = "a ticket dropped unsent is given back: hold it until the attempt is sent"]
pub struct Ticket {
    budget: RetryBudget,
    /// The slice the grant was counted in.
    epoch: u64,
    sent: bool,
}

impl Ticket {
    /// The attempt it paid for is handed on to be sent: the ticket is spent from now on.
    pub fn send(&mut self) {
        self.sent = true;
    }

    /// The attempt ended; `sent`: whether it left the process (one refused locally below the
    /// layer that holds the ticket did not). Spent if so, given back if not.
    pub fn settle(mut self, sent: bool) {
        self.sent = sent;
    }

    /// Whether the attempt it paid for was sent.
    pub fn is_sent(&self) -> bool {
        self.sent
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.sent {
            self.budget.give_back(self.epoch);
        }
    }
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("epoch", &self.epoch)
            .field("sent", &self.sent)
            .finish()
    }
}

impl RetryBudget {
    /// A budget over a window of `config.ttl()`, granting `config.min_per_sec()` retries per
    /// second for free plus `config.ratio()` retries per success (0.1 = one retry per ten
    /// successes).
    ///
    /// Out-of-range values are clamped rather than rejected: the window into 10 ms ..= 1 h, the
    /// ratio into 0 ..= 1000 (NaN counts as 0).
    pub fn new(config: BudgetConfig) -> Self {
        let ttl = config.ttl().clamp(MIN_TTL, MAX_TTL);
        let min_per_sec = config.min_per_sec();
        let ratio = config.ratio();
        let ratio = if ratio.is_nan() {
            0.0
        } else {
            ratio.clamp(0.0, MAX_RATIO)
        };
        // In range by the clamp above: at most 1e9, exact in f64 after rounding.
        let deposit_units = (f64::from(ratio) * UNIT as f64).round() as u128;
        // min_per_sec × ttl retries, each worth UNIT = 1e6: min_per_sec × ttl in microseconds.
        let reserve_units = u128::from(min_per_sec) * ttl.as_micros();
        Self(Arc::new(Shared {
            // Slices of at least a millisecond, as the window requires: `ttl` is at least 10 ms.
            window: SlidingWindow::new(ttl, SLICES),
            deposit_units,
            reserve_units,
            latest: AtomicU64::new(0),
            ttl,
            min_per_sec,
            ratio,
        }))
    }

    /// Record one successful response. Call it for successes only, not for every request.
    pub fn deposit(&self) {
        let window = &self.0.window;
        window.add(window.epoch_now(), DEPOSITS);
    }

    /// Ask for one retry. `true`: it is granted and counted. `false`: the budget is spent, nothing
    /// was withdrawn, and the refusal is counted in [`BudgetSnapshot::rejected`].
    pub fn withdraw(&self) -> bool {
        self.0.withdraw().is_some()
    }

    /// [`withdraw`](Self::withdraw), as a [`Ticket`]: a retry that is granted but then not sent
    /// (the caller gave up during the backoff, the service failed before the retry went out) is
    /// given back when its ticket is dropped.
    pub fn ticket(&self) -> Option<Ticket> {
        let epoch = self.0.withdraw()?;
        Some(Ticket {
            budget: self.clone(),
            epoch,
            sent: false,
        })
    }

    /// Whether [`withdraw`](Self::withdraw) would grant a retry now: a question, which withdraws
    /// nothing and counts no refusal.
    pub fn would_grant(&self) -> bool {
        let shared = &*self.0;
        let window = &shared.window;
        let epoch = window.epoch_now().max(shared.latest.load(Ordering::SeqCst));
        let deposits = window.sum(epoch, DEPOSITS);
        let withdrawals = window.sum(epoch, WITHDRAWALS);
        shared.available_units(deposits, withdrawals) >= UNIT
    }

    /// Gives back the retry granted in `epoch`: it no longer counts against the window. A grant
    /// whose slice has left the window already counts for nothing and is left alone.
    fn give_back(&self, epoch: u64) {
        // Only the slice the grant was counted in, and only while it still holds that epoch: a
        // refund can never lower another slice's count, so it can never let the window hold more
        // than it granted.
        self.0.window.counter(epoch, WITHDRAWALS).decrement(epoch);
    }

    /// The current balance and the window's counts.
    pub fn snapshot(&self) -> BudgetSnapshot {
        let shared = &*self.0;
        let window = &shared.window;
        let epoch = window.epoch_now().max(shared.latest.load(Ordering::SeqCst));
        let deposits = window.sum(epoch, DEPOSITS);
        let withdrawals = window.sum(epoch, WITHDRAWALS);
        BudgetSnapshot {
            balance: u64::try_from(shared.available_units(deposits, withdrawals) / UNIT)
                .unwrap_or(u64::MAX),
            deposits,
            withdrawals,
            rejected: window.sum(epoch, REJECTED),
        }
    }

    /// The window the budget covers (after clamping).
    pub fn ttl(&self) -> Duration {
        self.0.ttl
    }

    /// Retries per second granted without deposits.
    pub fn min_per_sec(&self) -> u32 {
        self.0.min_per_sec
    }

    /// Retries granted per successful response (after clamping).
    pub fn ratio(&self) -> f32 {
        self.0.ratio
    }
}

impl Default for RetryBudget {
    /// [`DEFAULT_TTL`] (10 s), [`DEFAULT_MIN_PER_SEC`] (1), [`DEFAULT_RATIO`] (0.1).
    fn default() -> Self {
        Self::new(BudgetConfig::default())
    }
}

impl fmt::Debug for RetryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryBudget")
            .field("ttl", &self.0.ttl)
            .field("min_per_sec", &self.0.min_per_sec)
            .field("ratio", &self.0.ratio)
            .field("snapshot", &self.snapshot())
            .finish()
    }
}

/// So a [`RetryBudget`] drops into `tower::retry`: a policy calls `deposit` on success and
/// `withdraw` before each retry.
impl tower::retry::budget::Budget for RetryBudget {
    fn deposit(&self) {
        RetryBudget::deposit(self);
    }

    fn withdraw(&self) -> bool {
        RetryBudget::withdraw(self)
    }
}

impl Shared {
    /// Announce that a withdrawal works in `epoch`; returns the epoch to work in (the latest any
    /// withdrawal has announced, which is never before this one).
    fn claim(&self, epoch: u64) -> u64 {
        self.latest.fetch_max(epoch, Ordering::SeqCst).max(epoch)
    }

    /// Units left after `withdrawals` retries against `deposits` successes plus the floor.
    fn available_units(&self, deposits: u64, withdrawals: u64) -> u128 {
        let credit = self.reserve_units + self.deposit_units * u128::from(deposits);
        credit.saturating_sub(UNIT * u128::from(withdrawals))
    }

    /// The withdrawal protocol.
    ///
    /// Within one epoch, every withdrawal is a compare-and-swap of the current slot's withdrawal
    /// counter from `n` to `n + 1`, made only after checking that `n + 1` retries fit into the
    /// window's balance. The CAS fails if anyone changed the counter since it was read, so grants
    /// in one epoch are serialised and the `k`-th one was checked against `k` withdrawals: two
    /// threads cannot both take the last token (the race in tower's `TpsBudget`, which sums and
    /// then adds in two separate steps).
    ///
    /// What the CAS does not cover are the window's *earlier* slices, which a withdrawal reads
    /// before its CAS. They can only grow through a straggler: a thread that read the clock just
    /// before a slice boundary and counts into the previous slice after another thread already
    /// summed it. `latest` closes that gap. Every withdrawal first raises `latest` to its epoch,
    /// then sums, then does its CAS, then reads `latest` again; if `latest` is still its epoch the
    /// grant stands, otherwise it takes its count back and starts over in the newer epoch. All
    /// these operations are `SeqCst` (the window's counters use `SeqCst` throughout), so they sit
    /// in one total order. Take a withdrawal `Y` that
    /// stands in epoch `e` and a withdrawal `X` in a later epoch `f` whose window covers `e`: `Y`
    /// read `latest == e` after its CAS, `X` raised `latest` to `f > e` before summing, and
    /// `latest` only grows, so `Y`'s CAS precedes `X`'s sum and `X` counted `Y`. If `X`'s sum
    /// instead missed `Y`, `Y` reads `latest >= f` and undoes itself. Either way no two grants
    /// that stand were checked without seeing each other, so every grant that stands was checked
    /// against every other standing grant of its window: the window never holds more than
    /// `ratio × deposits + floor` retries. (Reads that see a slot already rotated into a newer
    /// epoch count it as zero: only deposits can be lost that way, which errs toward refusing, and
    /// the withdrawal doing that read is itself behind `latest` and starts over.)
    ///
    /// A withdrawal that is taken back was briefly visible, so a withdrawal racing it at a slice
    /// boundary may see one retry too many and refuse: the protocol errs toward refusing, never
    /// toward overdrawing. It is lock-free: a CAS only fails because another thread's succeeded,
    /// and a restart only happens because the clock moved to a later slice.
    /// Returns the epoch the grant was counted in.
    fn withdraw(&self) -> Option<u64> {
        let mut epoch = self.claim(self.window.epoch_now());
        loop {
            let withdrawals = self.window.counter(epoch, WITHDRAWALS);
            let current = withdrawals.load();
            let held = match current.age(epoch) {
                Age::Current(count) => count,
                // Rotating the slot: the CAS below resets it to this epoch.
                Age::Stale => 0,
                Age::Ahead(later) => {
                    epoch = self.claim(later);
                    continue;
                }
            };
            let deposits = self.window.sum(epoch, DEPOSITS);
            let after = self.window.sum_before(epoch, WITHDRAWALS) + u64::from(held) + 1;
            let fits = held < u32::MAX
                && UNIT * u128::from(after)
                    <= self.reserve_units + self.deposit_units * u128::from(deposits);
            if !fits {
                self.window.add(epoch, REJECTED);
                return None;
            }
            if !withdrawals.swap_if(current, Tagged::new(epoch, held + 1)) {
                continue;
            }
            let latest = self.latest.load(Ordering::SeqCst);
            if latest == epoch {
                return Some(epoch);
            }
            // A withdrawal in a later slice may have summed this one's slice before the CAS:
            // take it back and try again in that slice.
            withdrawals.decrement(epoch);
            epoch = self.claim(latest);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use tokio::time::advance;

    fn drain(budget: &RetryBudget) -> u64 {
        let mut granted = 0;
        while budget.withdraw() {
            granted += 1;
        }
        granted
    }

    #[tokio::test(start_paused = true)]
    async fn ratio_of_successes_plus_floor() {
        let budget = RetryBudget::new(BudgetConfig::default());
        for _ in 0..100 {
            budget.deposit();
        }
        // 100 × 0.1 + 1/s × 10 s.
        assert_eq!(budget.snapshot().balance, 20);
        assert_eq!(drain(&budget), 20);
        let snap = budget.snapshot();
        assert_eq!(
            (snap.balance, snap.deposits, snap.withdrawals, snap.rejected),
            (0, 100, 20, 1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_ticket_dropped_unsent_gives_back_exactly_one_retry_while_its_slice_is_in_the_window()
    {
        let budget = RetryBudget::new(BudgetConfig::default().with_ratio(0.0));
        let first = budget.ticket().unwrap();
        let second = budget.ticket().unwrap();
        assert_eq!(budget.snapshot().balance, 8);
        drop(first);
        let snap = budget.snapshot();
        assert_eq!((snap.balance, snap.withdrawals), (9, 1));

        // Another budget's ticket changes nothing in this one.
        let other = RetryBudget::new(BudgetConfig::default().with_ratio(0.0));
        let foreign = other.ticket().unwrap();
        drop(foreign);
        assert_eq!(budget.snapshot().balance, 9);

        // Once its slice has left the window the grant counts for nothing: giving it back then
        // must not lower the count of whatever the slot holds now.
        advance(Duration::from_secs(10)).await;
        let now = budget.ticket().unwrap();
        assert_eq!(budget.snapshot().withdrawals, 1);
        drop(second);
        assert_eq!(budget.snapshot().withdrawals, 1);
        drop(now);
        assert_eq!(budget.snapshot().withdrawals, 0);
        assert_eq!(drain(&budget), 10);
    }

    /// A ticket sent is spent; one that ends up not sent after all (refused below) goes back.
    #[tokio::test(start_paused = true)]
    async fn a_ticket_sent_is_spent_and_one_settled_unsent_goes_back() {
        let budget = RetryBudget::new(BudgetConfig::default().with_ratio(0.0));
        let mut sent = budget.ticket().unwrap();
        sent.send();
        drop(sent);
        assert_eq!(budget.snapshot().withdrawals, 1);
        let mut refused = budget.ticket().unwrap();
        refused.send();
        refused.settle(false);
        assert_eq!(budget.snapshot().withdrawals, 1);
        let mut answered = budget.ticket().unwrap();
        answered.send();
        answered.settle(true);
        assert_eq!(budget.snapshot().withdrawals, 2);
    }

    /// Asking whether a retry would be granted withdraws nothing and counts no refusal.
    #[tokio::test(start_paused = true)]
    async fn would_grant_is_a_question() {
        let budget = RetryBudget::new(BudgetConfig::default().with_ratio(0.0));
        assert!(budget.would_grant());
        assert_eq!(drain(&budget), 10);
        let before = budget.snapshot();
        assert!(!budget.would_grant());
        assert_eq!(budget.snapshot(), before);
        advance(Duration::from_secs(10)).await;
        assert!(budget.would_grant());
        assert_eq!(budget.snapshot().withdrawals, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn total_outage_gets_only_the_floor() {
        let budget = RetryBudget::default();
        // No successes at all: the floor is every retry the client gets per window.
        assert_eq!(drain(&budget), 10);
        advance(Duration::from_secs(1)).await;
        assert!(!budget.withdraw());
        // The first slice's withdrawals leave the window 10 s after they were made.
        advance(Duration::from_secs(9)).await;
        assert_eq!(drain(&budget), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn deposits_expire_slice_by_slice() {
        let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0).with_ratio(0.5));
        for _ in 0..10 {
            budget.deposit();
        }
        advance(Duration::from_secs(5)).await;
        for _ in 0..10 {
            budget.deposit();
        }
        assert_eq!(budget.snapshot().balance, 10);
        // At 10 s the first ten deposits are gone, the later ten stay until 15 s.
        advance(Duration::from_secs(5)).await;
        assert_eq!(budget.snapshot().deposits, 10);
        assert_eq!(budget.snapshot().balance, 5);
        advance(Duration::from_secs(5)).await;
        assert_eq!(budget.snapshot().deposits, 0);
        assert_eq!(budget.snapshot().balance, 0);
        assert!(!budget.withdraw());
    }

    #[tokio::test(start_paused = true)]
    async fn idle_longer_than_the_window_starts_clean() {
        let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0));
        for _ in 0..50 {
            budget.deposit();
        }
        assert_eq!(drain(&budget), 5);
        // Exactly ten slices later every slot is reused: nothing old leaks in.
        advance(Duration::from_secs(100)).await;
        let snap = budget.snapshot();
        assert_eq!((snap.deposits, snap.withdrawals, snap.rejected), (0, 0, 0));
        for _ in 0..20 {
            budget.deposit();
        }
        assert_eq!(drain(&budget), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn fractional_ratio_is_not_truncated() {
        // tower's TpsBudget turns 0.6 into "1 retry per 1 deposit" (1 / 0.6 truncated to 1) and
        // grants 10 retries for 10 deposits; 0.6 × 10 is 6.
        let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0).with_ratio(0.6));
        for _ in 0..10 {
            budget.deposit();
        }
        assert_eq!(drain(&budget), 6);

        let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0).with_ratio(0.7));
        for _ in 0..10 {
            budget.deposit();
        }
        assert_eq!(drain(&budget), 7);
    }

    #[tokio::test(start_paused = true)]
    async fn ratio_above_one_and_zero() {
        let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0).with_ratio(2.5));
        for _ in 0..4 {
            budget.deposit();
        }
        assert_eq!(drain(&budget), 10);

        let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0).with_ratio(0.0));
        for _ in 0..1000 {
            budget.deposit();
        }
        assert_eq!(drain(&budget), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn hostile_configuration_is_clamped() {
        let budget = RetryBudget::new(
            BudgetConfig::default()
                .with_ttl(Duration::ZERO)
                .with_min_per_sec(u32::MAX)
                .with_ratio(f32::NAN),
        );
        assert_eq!(budget.ttl(), MIN_TTL);
        assert_eq!(budget.ratio(), 0.0);
        // u32::MAX per second over 10 ms.
        assert_eq!(budget.snapshot().balance, 42_949_672);

        let budget = RetryBudget::new(
            BudgetConfig::default()
                .with_ttl(Duration::MAX)
                .with_min_per_sec(0)
                .with_ratio(f32::INFINITY),
        );
        assert_eq!(budget.ttl(), MAX_TTL);
        assert_eq!(budget.ratio(), MAX_RATIO);
        budget.deposit();
        assert_eq!(budget.snapshot().balance, 1000);

        let budget = RetryBudget::new(
            BudgetConfig::default()
                .with_ttl(Duration::from_secs(1))
                .with_min_per_sec(0)
                .with_ratio(-3.0),
        );
        assert_eq!(budget.ratio(), 0.0);
        budget.deposit();
        assert!(!budget.withdraw());
    }

    #[tokio::test(start_paused = true)]
    async fn clones_share_one_budget() {
        let budget = RetryBudget::new(BudgetConfig::default().with_min_per_sec(0));
        let other = budget.clone();
        for _ in 0..10 {
            other.deposit();
        }
        assert!(budget.withdraw());
        assert!(!other.withdraw());
        assert_eq!(other.snapshot().withdrawals, 1);
    }
}

//! The local limiter of one pool member: two GCRA rate limiters (`governor`), one for
//! requests and one for tokens, sized to this member's share of the pool's quota, plus
//! the pool-wide pause (cool-down) and the reduced rate that follows it.
//!
//! # Sizing
//! A GCRA limiter with rate `r` and burst `b` admits at most `b + r·T` cells in any
//! window of length `T`. With `n` members each holding its own limiter, the pool admits
//! at most `n·b + T·Σr` in any 60 s window, so each member takes
//! `r = quota·(1 − headroom)/n − b` per minute: the sum over members plus their bursts
//! stays within the quota less the headroom. Every limiter starts empty (its burst is
//! taken at creation), so a join, a rebuild or a restart never adds a burst.
//!
//! A request is [`CELLS_PER_REQUEST`] cells of the request limiter, whose capacity is
//! `burst` requests plus a little slack: 50 ms of the share's rate, at least a tenth of a
//! request. The slack absorbs the lateness of timers and of a loaded machine (tokio
//! rounds sleeps up to the millisecond, and a busy scheduler wakes tasks later still),
//! which would otherwise be lost on every request; being less than a request, it never
//! lets more than `burst` requests through at once.
//!
//! The token limiter's capacity is a tenth of a second of its rate; a request takes its
//! tokens in chunks of at most half that, so token spending is as smooth as requests and
//! the other half absorbs timer lateness the same way.
//!
//! # Token accounting
//! A request is charged its up-front estimate; when the API reports the usage, the
//! difference goes into a balance: a credit (the estimate was too high) pays for the next
//! requests' tokens, a debt (too low) is added to the next request's charge. A governor
//! limiter cannot hand cells back, so the correction is carried forward this way. What
//! the API charged depends on how it counts ([`super::TpmCounts`], see
//! [`super::charged_tokens`]): with `max_tokens` counting (the default) the unused part of
//! `max_tokens` is never credited, so the pool never spends tokens the API still holds
//! as reserved; only the prompt's estimate is corrected by the reported count.
//!
//! Time is `tokio::time`, so the limiter runs under `tokio::time::pause()` in tests.

use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::Duration;

use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use tokio::sync::watch;
use tokio::time::Instant;

use halyard_proto::pool::TpmCounts;

/// The quota of one pool.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolQuota {
    /// Requests per minute for the whole pool.
    pub rpm: Option<u32>,
    /// Tokens (prompt + completion) per minute for the whole pool.
    pub tpm: Option<u64>,
    /// Largest burst of requests one member sends at once (default 1: evenly spaced).
    pub burst: u32,
    /// Fraction of the quota left unused as a safety margin (default 0.005).
    pub headroom: f64,
    /// How the API counts tokens (default: `max_tokens` at admission, no refund).
    pub tpm_counts: TpmCounts,
    /// Input tokens per minute for the whole pool.
    pub itpm: Option<u64>,
    /// Output tokens per minute for the whole pool.
    pub otpm: Option<u64>,
}

impl PoolQuota {
    pub fn new(rpm: Option<u32>, tpm: Option<u64>) -> PoolQuota {
        PoolQuota {
            rpm,
            tpm,
            burst: 1,
            headroom: DEFAULT_HEADROOM,
            tpm_counts: TpmCounts::default(),
            itpm: None,
            otpm: None,
        }
    }
}

/// The runtime quota of a pool of the worker's plan.
impl From<&halyard_proto::pool::QuotaSpec> for PoolQuota {
    fn from(q: &halyard_proto::pool::QuotaSpec) -> PoolQuota {
        PoolQuota {
            burst: q.burst,
            tpm_counts: q.tpm_counts,
            itpm: q.itpm,
            otpm: q.otpm,
            ..PoolQuota::new(q.rpm, q.tpm)
        }
    }
}

pub const DEFAULT_HEADROOM: f64 = 0.005;

/// A governor clock reading `tokio::time`, so paused test time drives the limiter.
#[derive(Clone, Debug)]
pub struct TokioClock {
    start: Instant,
}

impl TokioClock {
    pub fn new() -> TokioClock {
        TokioClock { start: Instant::now() }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        TokioClock::new()
    }
}

impl Clock for TokioClock {
    type Instant = Nanos;
    fn now(&self) -> Nanos {
        Nanos::from(self.start.elapsed())
    }
}

type Gcra = RateLimiter<NotKeyed, InMemoryState, TokioClock, NoOpMiddleware<Nanos>>;

/// One resource's limiter (requests or tokens).
struct Bucket {
    gcra: Gcra,
    clock: TokioClock,
    capacity: u32,
    per_minute: f64,
}

impl Bucket {
    /// A limiter admitting `per_minute` cells a minute with burst `capacity`, empty.
    fn new(per_minute: f64, capacity: u32, clock: &TokioClock) -> Bucket {
        let per_minute = per_minute.max(1e-3);
        let capacity = NonZeroU32::new(capacity.max(1)).unwrap_or(NonZeroU32::MIN);
        let period = Duration::from_secs_f64(60.0 / per_minute).max(Duration::from_nanos(1));
        let quota = Quota::with_period(period)
            .unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN))
            .allow_burst(capacity);
        let gcra = RateLimiter::direct_with_clock(quota, clock.clone());
        // Start empty: no burst at start or after a rebuild.
        let _ = gcra.check_n(capacity);
        Bucket { gcra, clock: clock.clone(), capacity: capacity.get(), per_minute }
    }

    /// Take `n` (≤ capacity) cells now, or say how long until they can be taken.
    fn take(&self, n: u32) -> Result<(), Duration> {
        let Some(n) = NonZeroU32::new(n.min(self.capacity)) else { return Ok(()) };
        match self.gcra.check_n(n) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(not_until)) => {
                Err(not_until.wait_time_from(self.clock.now()).max(Duration::from_micros(100)))
            }
            // Cannot happen: n is clamped to the capacity.
            Err(_) => Err(Duration::from_millis(1)),
        }
    }
}

/// The limiters of one share of the quota.
struct Buckets {
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
}

/// Cells of the request limiter per request (see the module docs).
pub const CELLS_PER_REQUEST: u32 = 20;

/// Rate of a pool's cool-down recovery: the rate right after a cool-down, as a fraction
/// of the share, and the steps back to the full share.
pub const RECOVERY_START: f64 = 0.5;
pub const RECOVERY_STEPS: u32 = 4;

struct State {
    members: usize,
    /// Multiplier on the share: below 1 while recovering from a cool-down.
    factor: f64,
    pause_until: Option<Instant>,
    /// Cool-downs begun so far (the epoch of a request admitted now).
    cooldowns: u64,
    /// Token credit (positive) or debt (negative) from usage corrections.
    balance: i64,
    /// This member left the pool: nothing more is admitted.
    closed: bool,
    buckets: std::sync::Arc<Buckets>,
}

/// A pool member's limiter; see the module docs.
pub struct PoolLimiter {
    quota: PoolQuota,
    clock: TokioClock,
    state: Mutex<State>,
    changed: watch::Sender<u64>,
    /// Requests wait their turn in order (tokio's mutex is fair): one request gathers its
    /// tokens at a time, rather than many each holding part of theirs.
    queue: tokio::sync::Mutex<()>,
}

/// Rates of one member's share, per minute (for logs and tests).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rates {
    pub requests: Option<f64>,
    pub tokens: Option<f64>,
}

impl PoolLimiter {
    pub fn new(quota: PoolQuota, members: usize) -> PoolLimiter {
        let clock = TokioClock::new();
        let buckets = std::sync::Arc::new(build(&quota, members.max(1), 1.0, &clock));
        PoolLimiter {
            quota,
            clock,
            state: Mutex::new(State {
                members: members.max(1),
                factor: 1.0,
                pause_until: None,
                cooldowns: 0,
                balance: 0,
                closed: false,
                buckets,
            }),
            changed: watch::channel(0).0,
            queue: tokio::sync::Mutex::new(()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn rebuild(&self, s: &mut State) {
        s.buckets = std::sync::Arc::new(build(&self.quota, s.members, s.factor, &self.clock));
        self.changed.send_modify(|g| *g += 1);
    }

    pub fn quota(&self) -> &PoolQuota {
        &self.quota
    }

    pub fn members(&self) -> usize {
        self.lock().members
    }

    /// Membership changed: take `quota / members` as this member's share. Returns whether
    /// the limiter was rebuilt (the count differed).
    pub fn set_members(&self, members: usize) -> bool {
        let mut s = self.lock();
        let members = members.max(1);
        if s.members == members {
            return false;
        }
        s.members = members;
        self.rebuild(&mut s);
        true
    }

    /// Run at `factor` (0..=1) of the share.
    pub fn set_factor(&self, factor: f64) {
        let mut s = self.lock();
        let factor = factor.clamp(0.01, 1.0);
        if (s.factor - factor).abs() > 1e-9 {
            s.factor = factor;
            self.rebuild(&mut s);
        }
    }

    pub fn factor(&self) -> f64 {
        self.lock().factor
    }

    pub fn rates(&self) -> Rates {
        let s = self.lock();
        Rates {
            requests: s.buckets.requests.as_ref().map(|b| b.per_minute / CELLS_PER_REQUEST as f64),
            tokens: s.buckets.tokens.as_ref().map(|b| b.per_minute),
        }
    }

    /// Cool-downs begun so far; a request remembers the count at its admission, so a 429
    /// of a request admitted before the current cool-down does not start another.
    pub fn epoch(&self) -> u64 {
        self.lock().cooldowns
    }

    /// Pause admissions for `d` and drop to the recovery rate. Returns true when this
    /// begins a new cool-down, false when it only extends one under way.
    pub fn cool_down(&self, d: Duration) -> bool {
        let now = Instant::now();
        let until = now + d;
        let mut s = self.lock();
        let running = s.pause_until.is_some_and(|p| p > now);
        s.pause_until = Some(s.pause_until.filter(|p| *p > until).unwrap_or(until));
        if !running {
            s.cooldowns += 1;
        }
        s.factor = RECOVERY_START;
        self.rebuild(&mut s);
        !running
    }

    /// Pause this member alone until `until` (a quota header says the budget is spent).
    pub fn pause_local(&self, until: Instant) {
        let mut s = self.lock();
        if s.pause_until.is_none_or(|p| p < until) {
            s.pause_until = Some(until);
            self.changed.send_modify(|g| *g += 1);
        }
    }

    /// Admit nothing from now on (the member left the pool); waiting requests wait until
    /// their callers give up.
    pub fn close(&self) {
        self.lock().closed = true;
        self.changed.send_modify(|g| *g += 1);
    }

    /// When the current pause ends (None when not paused).
    pub fn paused_until(&self) -> Option<Instant> {
        self.lock().pause_until.filter(|p| *p > Instant::now())
    }

    /// After a cool-down: wait for its end, then step the rate back up to the full share
    /// over `recover`. Stops early if another cool-down begins meanwhile.
    pub async fn recover(&self, recover: Duration) {
        let epoch = self.epoch();
        let step = recover / RECOVERY_STEPS;
        while let Some(until) = self.paused_until() {
            tokio::time::sleep_until(until).await;
        }
        for k in 1..=RECOVERY_STEPS {
            tokio::time::sleep(step).await;
            if self.epoch() != epoch {
                return;
            }
            self.set_factor(
                RECOVERY_START + (1.0 - RECOVERY_START) * k as f64 / RECOVERY_STEPS as f64,
            );
        }
    }

    /// Tokens still to charge for a request estimated at `estimate`, after the balance.
    fn charge(&self, estimate: u64) -> u64 {
        let mut s = self.lock();
        let est = estimate.min(i64::MAX as u64 / 4) as i64;
        let due = (est - s.balance).max(0);
        s.balance = (s.balance - est).max(0);
        due as u64
    }

    /// The API reported `actual` tokens for a request charged `estimate`. The debt this
    /// leaves is at most one minute of this member's token share (issue 33): whatever an
    /// API reports, the pool is never held back for longer than a minute by it (the
    /// worker clamps usage to what a request could use before this, see
    /// `backend::clamp_usage`; this bounds what is left, e.g. a reasoning model without
    /// `max_tokens`).
    pub fn correct(&self, estimate: u64, actual: u64) {
        let mut s = self.lock();
        let diff =
            estimate.min(i64::MAX as u64 / 4) as i64 - actual.min(i64::MAX as u64 / 4) as i64;
        let floor =
            s.buckets.tokens.as_ref().map_or(0, |b| b.per_minute.min(i64::MAX as f64 / 4.0) as i64);
        s.balance = s.balance.saturating_add(diff).max(-floor);
    }

    /// The current token balance (credit positive, debt negative).
    pub fn balance(&self) -> i64 {
        self.lock().balance
    }

    /// Wait until one request costing `tokens` (an estimate) may be sent; returns the
    /// epoch it was admitted in.
    pub async fn acquire(&self, tokens: u64) -> u64 {
        let _turn = self.queue.lock().await;
        let mut changed = self.changed.subscribe();
        let mut need_request = true;
        let mut need_tokens = self.charge(tokens);
        loop {
            changed.borrow_and_update();
            let (buckets, pause, epoch, closed) = {
                let s = self.lock();
                (s.buckets.clone(), s.pause_until, s.cooldowns, s.closed)
            };
            if closed {
                // Never reopens: wait (cancellably) for good.
                let _ = changed.changed().await;
                continue;
            }
            let now = Instant::now();
            let wait = if let Some(p) = pause.filter(|p| *p > now) {
                p - now
            } else if need_request {
                match buckets.requests.as_ref().map_or(Ok(()), |b| b.take(CELLS_PER_REQUEST)) {
                    Ok(()) => {
                        need_request = false;
                        continue;
                    }
                    Err(w) => w,
                }
            } else if need_tokens > 0 {
                let Some(b) = buckets.tokens.as_ref() else { return epoch };
                let chunk = need_tokens.min((b.capacity as u64 / 2).max(1)) as u32;
                match b.take(chunk) {
                    Ok(()) => {
                        need_tokens -= chunk as u64;
                        continue;
                    }
                    Err(w) => w,
                }
            } else {
                return epoch;
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = changed.changed() => {}
            }
        }
    }
}

/// The per-minute rate of one member's share of `quota` when its limiter holds `burst`
/// units at most (see the module docs).
pub fn share_per_minute(quota: f64, headroom: f64, members: usize, burst: f64) -> f64 {
    (quota * (1.0 - headroom) / members.max(1) as f64 - burst).max(quota * 1e-3).max(1e-3)
}

fn build(q: &PoolQuota, members: usize, factor: f64, clock: &TokioClock) -> Buckets {
    let requests = q.rpm.map(|rpm| {
        let cell = CELLS_PER_REQUEST as f64;
        // Slack: 50 ms of the share (before its own cost), at least 0.1 of a request.
        let slack = (rpm as f64 * (1.0 - q.headroom) / members.max(1) as f64 / 60.0 * 0.05)
            .clamp(0.1, 0.95);
        let cells =
            (q.burst.max(1) as f64 * cell + (slack * cell).ceil()).min(u32::MAX as f64) as u32;
        let per_minute =
            share_per_minute(rpm as f64, q.headroom, members, cells as f64 / cell) * factor;
        Bucket::new(per_minute * cell, cells, clock)
    });
    let tokens = q.tpm.map(|tpm| {
        // A tenth of a second of the share's rate, at least two tokens.
        let cap = ((tpm as f64 * (1.0 - q.headroom) / members.max(1) as f64) / 600.0)
            .ceil()
            .clamp(2.0, u32::MAX as f64) as u32;
        Bucket::new(
            share_per_minute(tpm as f64, q.headroom, members, cap as f64) * factor,
            cap,
            clock,
        )
    });
    Buckets { requests, tokens }
}

//! How long other members' announcements may pause a pool (issue 49, item 5).
//!
//! A pool's cool-downs ([`super::membership::Announcement::CoolDown`]) and endpoint pauses
//! (`Announcement::Pause`, the `health` module) come from whoever may publish on the
//! pool's subject: its workers, and anyone holding that pool's worker credential (per-pool
//! users keep every other credential off it, `halyard_broker::permissions`). A forged
//! announcement every few minutes would pause the pool for good. So what other members
//! announce is honoured out of one token bucket per pool and worker, shared by both kinds:
//! [`BUDGET`] seconds of pause, refilled at [`REFILL`] (one second every two). Over any
//! stretch of `T` seconds, announcements pause a pool at most `BUDGET + T / 2` seconds
//! (so at most 600 s in a row, then at most half the time); a worker's own 429s and its
//! own failed calls still pause it without limit. An honest outage or 429 storm longer
//! than that: each worker meets it itself and pauses on its own evidence.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Pause that announcements may cause at once (a full bucket): [`super::MAX_COOLDOWN`].
pub const BUDGET: Duration = super::MAX_COOLDOWN;
/// Seconds of pause the bucket regains per second.
pub const REFILL: f64 = 0.5;

/// One pool's bucket.
#[derive(Clone, Debug)]
pub struct Bucket {
    left: Duration,
    at: Instant,
}

impl Bucket {
    pub fn new(now: Instant) -> Bucket {
        Bucket { left: BUDGET, at: now }
    }

    fn refill(&mut self, now: Instant) {
        let gained = now.saturating_duration_since(self.at).mul_f64(REFILL);
        self.left = (self.left + gained).min(BUDGET);
        self.at = self.at.max(now);
    }

    /// Up to `want` of pause (a cool-down: partly honoured is still useful).
    pub fn take_up_to(&mut self, now: Instant, want: Duration) -> Duration {
        self.refill(now);
        let g = want.min(self.left);
        self.left -= g;
        g
    }

    /// All of `want`, or nothing (an endpoint pause: its probe time is all or nothing).
    pub fn take_all(&mut self, now: Instant, want: Duration) -> bool {
        self.refill(now);
        if want > self.left {
            return false;
        }
        self.left -= want;
        true
    }
}

/// Every (pool, worker)'s bucket in this process.
static BUCKETS: Mutex<Option<HashMap<(String, String), Bucket>>> = Mutex::new(None);

fn with<T>(pool: &str, worker: &str, f: impl FnOnce(&mut Bucket, Instant) -> T) -> T {
    let now = Instant::now();
    let mut g = BUCKETS.lock().unwrap_or_else(|p| p.into_inner());
    let map = g.get_or_insert_with(HashMap::new);
    let b = map.entry((pool.to_string(), worker.to_string())).or_insert_with(|| Bucket::new(now));
    f(b, now)
}

/// A cool-down another member announced: the part of `want` this worker honours.
pub fn cool_down(pool: &str, worker: &str, want: Duration) -> Duration {
    with(pool, worker, |b, now| b.take_up_to(now, want))
}

/// An endpoint pause another worker announced, holding the pool `want`: honoured or not.
pub fn pause(pool: &str, worker: &str, want: Duration) -> bool {
    with(pool, worker, |b, now| b.take_all(now, want))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A forged cool-down of the longest kind, every second for an hour: the pool is
    /// paused by announcements at most BUDGET + T / 2 over any stretch from the start
    /// (600 s in a row at most), and still honours half the time; a pause is all or
    /// nothing.
    #[test]
    fn announcements_pause_a_pool_at_most_the_bound() {
        let t0 = Instant::now();
        let mut b = Bucket::new(t0);
        let mut paused_until = t0;
        let mut paused = Duration::ZERO;
        for s in 0..3600u64 {
            let now = t0 + Duration::from_secs(s);
            let g = b.take_up_to(now, super::super::MAX_COOLDOWN);
            let end = paused_until.max(now) + g;
            paused += end - paused_until.max(now);
            paused_until = end;
            let elapsed = Duration::from_secs(s + 1);
            let bound = BUDGET + elapsed.mul_f64(REFILL);
            assert!(paused <= bound, "{s} s: paused {paused:?} > {bound:?}");
            assert!(paused_until - t0 <= Duration::from_secs(600) || s >= 600, "{s}");
        }
        assert!(paused >= Duration::from_secs(1800), "half the time still honoured: {paused:?}");
        let mut b = Bucket::new(t0);
        assert!(b.take_all(t0, Duration::from_secs(200)));
        assert!(!b.take_all(t0, Duration::from_secs(200)), "only 100 s left");
        assert!(b.take_all(t0 + Duration::from_secs(200), Duration::from_secs(200)));
    }

    /// Buckets are per pool and worker.
    #[test]
    fn buckets_are_per_pool() {
        let w = "remote-test-worker";
        assert_eq!(cool_down("rp-a", w, BUDGET * 2), BUDGET);
        assert!(cool_down("rp-a", w, Duration::from_secs(10)) < Duration::from_secs(1));
        assert!(!pause("rp-a", w, Duration::from_secs(10)), "the same bucket");
        assert_eq!(cool_down("rp-b", w, Duration::from_secs(10)), Duration::from_secs(10));
    }
}

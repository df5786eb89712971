//! Each pool's endpoint health as `/metrics` shows it (the pause itself is decided in
//! `health`).

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use halyard_proto::OutageReason;
use tokio::time::Instant;

/// Each pool's health in this worker, for `/metrics`.
#[derive(Default, Debug)]
pub struct PoolHealthStats {
    pools: Mutex<BTreeMap<String, PoolHealthStat>>,
}

/// One pool's health as `/metrics` shows it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolHealthStat {
    /// Why the pool is paused (None: up).
    pub paused: Option<OutageReason>,
    /// The reason of the current or last pause.
    pub last_reason: Option<OutageReason>,
    /// Time paused so far, the current pause included (as of the snapshot).
    pub outage: Duration,
    /// Pauses seen (begun here or announced by other workers).
    pub pauses: u64,
    since: Option<Instant>,
}

impl PoolHealthStats {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, PoolHealthStat>> {
        self.pools.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn register(&self, pool: &str) {
        self.lock().entry(pool.to_string()).or_default();
    }

    pub(crate) fn paused(&self, pool: &str, reason: OutageReason) {
        let mut m = self.lock();
        let s = m.entry(pool.to_string()).or_default();
        s.paused = Some(reason);
        s.last_reason = Some(reason);
        s.pauses += 1;
        s.since = Some(Instant::now());
    }

    pub(crate) fn resumed(&self, pool: &str, down_for: Duration) {
        let mut m = self.lock();
        let s = m.entry(pool.to_string()).or_default();
        s.paused = None;
        s.since = None;
        s.outage += down_for;
    }

    pub(crate) fn last_reason(&self, pool: &str) -> Option<OutageReason> {
        self.lock().get(pool).and_then(|s| s.last_reason)
    }

    /// Every pool this worker serves, with the current pause counted into `outage`.
    pub fn snapshot(&self) -> Vec<(String, PoolHealthStat)> {
        self.lock()
            .iter()
            .map(|(p, s)| {
                let mut s = s.clone();
                if let Some(t) = s.since {
                    s.outage += t.elapsed();
                }
                (p.clone(), s)
            })
            .collect()
    }
}

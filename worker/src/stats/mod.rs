//! The counters a worker keeps (for logs, tests, benchmarks and `/metrics`): the bottom
//! layer, imported by every part that counts and importing none of them.

pub mod health;
pub mod server;

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Default, Debug)]
pub struct Counter(AtomicU64);
impl Counter {
    pub const fn new() -> Counter {
        Counter(AtomicU64::new(0))
    }
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// What this worker did (for logs, tests, benchmarks and `/metrics`).
#[derive(Default, Debug)]
pub struct Stats {
    /// Backend calls made (HTTP attempts), retries included.
    pub calls: Counter,
    pub completed: Counter,
    pub replayed: Counter,
    /// Jobs answered from the result cache (issue 51): the machine's, the broker's.
    pub cache_machine: Counter,
    pub cache_shared: Counter,
    /// Jobs handed back because another process of the machine was calling them (the
    /// result cache's claims, issue 51).
    pub cache_held: Counter,
    pub dead_letters: Counter,
    pub retried: Counter,
    /// Pull requests sent, and jobs they brought (their ratio is the mean pull size).
    pub pulls: Counter,
    pub pulled: Counter,
    /// HTTP 429 answers received, retried ones included.
    pub rate_limited: Counter,
    /// Pool-wide cool-downs this worker started (one per 429 storm).
    pub cooldowns: Counter,
    /// Jobs refused at receipt: undecodable, an id that is not the hash of its key, or a
    /// model not configured for the pool (never called, never checkpointed).
    pub refused: Counter,
    /// Job deliveries handed back for the pool's reason (outage, 429s, shutdown): their
    /// budget kept.
    pub handed_back: Counter,
    /// Pool pauses this worker began (an endpoint-wide failure of one of its calls).
    pub pauses: Counter,
    /// Each pool's endpoint health (paused or not, outage time).
    pub pool_health: health::PoolHealthStats,
    /// Models loaded and every existing pool consumer bound (the others, which only a
    /// coordinator makes, are waited for by their pool loops), until shutdown begins
    /// (`/readyz`).
    pub ready: std::sync::atomic::AtomicBool,
    /// Each managed server: state, restarts, GPU set, ready time (see [`server`]).
    pub servers: server::ServerStats,
}

impl Stats {
    pub(crate) fn add_calls(&self, n: u64) {
        self.calls.add(n)
    }
}

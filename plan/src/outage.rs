//! Endpoint outages as a run shows them: a pool down now ([`PoolOutage`], in the live
//! progress) and the outages seen during a run ([`OutageSpan`], kept in the run state and
//! listed in the report). The coordinator reads them from the pool-health bucket.

use serde::{Deserialize, Serialize};

/// A pool of the run whose endpoint is down now.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolOutage {
    pub pool: String,
    /// Why (`connection`, `timeout`, `unavailable`, …).
    pub reason: String,
    /// The error that began the pause (redacted by the worker).
    pub error: String,
    /// How long it has been down, as this coordinator counts it, in seconds.
    pub down_s: u64,
    /// Seconds to the next probe, if one is scheduled.
    pub next_probe_s: Option<u64>,
}

impl PoolOutage {
    /// "pool: endpoint down for 1m20s (connection), next probe in 30s".
    pub fn describe(&self) -> String {
        let next = self.next_probe_s.map(|s| format!(", next probe in {}", duration(s)));
        format!(
            "{}: endpoint down for {} ({}){}",
            self.pool,
            duration(self.down_s),
            self.reason,
            next.unwrap_or_default()
        )
    }
}

/// `95` → "1m35s", `7300` → "2h1m40s".
pub fn duration(s: u64) -> String {
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, m, s) => format!("{h}h{m}m{s}s"),
    }
}

/// One outage of a pool seen during the run (kept in the run state, listed in the report).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutageSpan {
    pub pool: String,
    pub reason: String,
    pub error: String,
    /// When it began and ended (None: still down when last seen), Unix milliseconds.
    pub since_ms: u64,
    pub until_ms: Option<u64>,
}

impl OutageSpan {
    /// Its length (until `now_ms` while it lasts), in seconds.
    pub fn down_s(&self, now_ms: u64) -> u64 {
        self.until_ms.unwrap_or(now_ms).saturating_sub(self.since_ms) / 1000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_hours_minutes_seconds() {
        assert_eq!(
            (duration(59), duration(95), duration(7300)),
            ("59s".into(), "1m35s".into(), "2h1m40s".into())
        );
    }
}

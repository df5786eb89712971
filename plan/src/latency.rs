//! Job latency as the coordinator sees it: from publishing a job to recording its
//! result. A log-linear histogram (32 buckets per power of two of microseconds, so a
//! quantile is within about 3%), fixed size, no allocation per sample.

use std::time::Duration;

const SUB_BITS: u32 = 5;
const SUB: usize = 1 << SUB_BITS;
/// Octaves above the linear range; 2^40 µs is about 12 days.
const OCTAVES: usize = 40;
const BUCKETS: usize = SUB * (OCTAVES + 1);

#[derive(Clone, PartialEq, Eq)]
pub struct LatencyHistogram {
    counts: Box<[u64; BUCKETS]>,
    total: u64,
    max_us: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram { counts: Box::new([0; BUCKETS]), total: 0, max_us: 0 }
    }
}

impl std::fmt::Debug for LatencyHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatencyHistogram")
            .field("count", &self.total)
            .field("p50", &self.quantile(0.5))
            .field("p99", &self.quantile(0.99))
            .field("max_us", &self.max_us)
            .finish()
    }
}

fn bucket(us: u64) -> usize {
    if us < SUB as u64 {
        return us as usize;
    }
    let octave = (63 - us.leading_zeros()) - SUB_BITS + 1; // ≥ 1
    let sub = (us >> (octave - 1)) as usize - SUB; // 0..SUB
    (octave as usize * SUB + sub).min(BUCKETS - 1)
}

/// The smallest value that falls in bucket `b`.
fn lower(b: usize) -> u64 {
    if b < SUB {
        return b as u64;
    }
    let octave = (b / SUB) as u32;
    ((SUB + b % SUB) as u64) << (octave - 1)
}

impl LatencyHistogram {
    pub fn record(&mut self, d: Duration) {
        let us = d.as_micros().min(u64::MAX as u128) as u64;
        self.counts[bucket(us)] += 1;
        self.total += 1;
        self.max_us = self.max_us.max(us);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    pub fn max(&self) -> Duration {
        Duration::from_micros(self.max_us)
    }

    /// The `q` quantile (0..=1), as the lower edge of its bucket; `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        if self.total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(Duration::from_micros(lower(b).min(self.max_us)));
            }
        }
        Some(self.max())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Buckets cover every value in order, and quantiles are within 1/32 of the truth.
    #[test]
    fn quantiles_are_close() {
        for us in [0u64, 1, 31, 32, 33, 63, 64, 65, 1000, 123_456, 10_000_000_000] {
            let b = bucket(us);
            assert!(lower(b) <= us, "{us}: bucket {b} starts at {}", lower(b));
            if b + 1 < BUCKETS {
                assert!(lower(b + 1) > us, "{us}: next bucket starts at {}", lower(b + 1));
            }
        }
        let mut h = LatencyHistogram::default();
        assert_eq!(h.quantile(0.5), None);
        for ms in 1..=1000u64 {
            h.record(Duration::from_millis(ms));
        }
        let p50 = h.quantile(0.5).unwrap().as_secs_f64() * 1000.0;
        let p99 = h.quantile(0.99).unwrap().as_secs_f64() * 1000.0;
        assert!((p50 - 500.0).abs() <= 500.0 / 32.0 + 1e-9, "p50 {p50}");
        assert!((p99 - 990.0).abs() <= 990.0 / 32.0 + 1e-9, "p99 {p99}");
        assert_eq!(h.count(), 1000);
        assert_eq!(h.max(), Duration::from_secs(1));
    }
}

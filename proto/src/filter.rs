//! [`JobIdFilter`]: a fixed-size Bloom filter over job ids, to skip store lookups that
//! would miss.
//!
//! Workers look up every job in their checkpoint and the coordinator looks up the result
//! of every job an item needs; in a large run nearly all of those lookups miss, and a
//! miss in the store costs microseconds. A job id is already a uniform hash, so the filter
//! takes its bit positions straight from the id's bytes. No false negatives: once an id
//! is [`insert`](JobIdFilter::insert)ed, [`may_contain`](JobIdFilter::may_contain) is true
//! for it forever; a false positive only costs the lookup the filter would have saved.
//! Thread-safe (atomic words), fixed memory ([`JobIdFilter::BYTES`]).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::JobId;

const WORDS: usize = 1 << 19; // 512 Ki words = 4 MiB = 2^25 bits
const BITS_MASK: u64 = (WORDS as u64 * 64) - 1;
/// Bits set per id: false positives ≈ 0.07% at a million ids, 5% at ten million.
const PROBES: usize = 3;

pub struct JobIdFilter {
    words: Box<[AtomicU64]>,
}

impl Default for JobIdFilter {
    fn default() -> Self {
        JobIdFilter::new()
    }
}

impl std::fmt::Debug for JobIdFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobIdFilter").field("bytes", &Self::BYTES).finish()
    }
}

impl JobIdFilter {
    /// Memory held by one filter.
    pub const BYTES: usize = WORDS * 8;

    pub fn new() -> JobIdFilter {
        JobIdFilter { words: (0..WORDS).map(|_| AtomicU64::new(0)).collect() }
    }

    fn positions(id: &JobId) -> [u64; PROBES] {
        let b = id.as_bytes();
        let word =
            |i: usize| u64::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3], b[i + 4], 0, 0, 0]);
        [word(0) & BITS_MASK, word(5) & BITS_MASK, word(10) & BITS_MASK]
    }

    pub fn insert(&self, id: &JobId) {
        for p in Self::positions(id) {
            self.words[(p / 64) as usize].fetch_or(1 << (p % 64), Ordering::Release);
        }
    }

    /// False only if `id` was never inserted.
    pub fn may_contain(&self, id: &JobId) -> bool {
        Self::positions(id)
            .iter()
            .all(|p| self.words[(p / 64) as usize].load(Ordering::Acquire) & (1 << (p % 64)) != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u64) -> JobId {
        let h = blake3::hash(&n.to_le_bytes());
        JobId::from_slice(&h.as_bytes()[..16]).unwrap()
    }

    /// Inserted ids are always found; ids never inserted are rarely reported.
    #[test]
    fn no_false_negatives_few_false_positives() {
        let f = JobIdFilter::new();
        for n in 0..100_000 {
            f.insert(&id(n));
        }
        assert!((0..100_000).all(|n| f.may_contain(&id(n))));
        let false_positives = (100_000..200_000).filter(|n| f.may_contain(&id(*n))).count();
        assert!(false_positives < 100, "{false_positives} false positives in 100000");
    }
}

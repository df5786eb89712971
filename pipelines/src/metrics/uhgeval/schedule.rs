//! The UHGEval runners' work split (spec §1.8), as arithmetic: which items the \[paper\]
//! block scheduler ever runs (its coverage bug explains why no paper `#valid` exceeds
//! 5,130) and the \[v2\] progress batches.

use serde::{Deserialize, Serialize};

use crate::metrics::MetricError;

/// What the \[paper\] `experiment_in_blocks` schedules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockCoverage {
    /// `bs = total // num_blocks`.
    pub block_size: usize,
    /// Items ever scheduled.
    pub items_scheduled: usize,
    /// Index of the last item scheduled; `None` if none is.
    pub last_index: Option<usize>,
}

/// \[paper\] coverage (spec §1.8 item 4): blocks `idx = start_block ..= num_blocks`
/// (inclusive) cover `[idx·bs, idx·bs + bs)` with `bs = total // num_blocks`, clipped to
/// the dataset as Python slicing does. From `start_block = 0` that is
/// `min(total, bs·(num_blocks + 1))` items: 5,141 / 170 → 5,130. `Empty` for
/// `num_blocks = 0` (Python raises `ZeroDivisionError`).
pub fn paper_block_coverage(
    total: usize,
    num_blocks: usize,
    start_block: usize,
) -> Result<BlockCoverage, MetricError> {
    if num_blocks == 0 {
        return Err(MetricError::Empty { what: "blocks (num_blocks must be at least 1)" });
    }
    let block_size = total / num_blocks;
    let first = start_block.saturating_mul(block_size).min(total);
    let end = num_blocks.saturating_add(1).saturating_mul(block_size).min(total);
    let items_scheduled = end.saturating_sub(first);
    let last_index = (items_scheduled > 0).then(|| end - 1);
    Ok(BlockCoverage { block_size, items_scheduled, last_index })
}

/// \[v2\] `to_batched` sizes (spec §1.8): batches of `ceil(n / num_batches)` items, the last
/// one shorter; fewer than `num_batches` batches when the rounding leaves some empty, none
/// for `n = 0`. `Empty` for `num_batches = 0`.
pub fn v2_batch_sizes(n: usize, num_batches: usize) -> Result<Vec<usize>, MetricError> {
    if num_batches == 0 {
        return Err(MetricError::Empty { what: "batches (num_batches must be at least 1)" });
    }
    let size = n.div_ceil(num_batches);
    let mut sizes = Vec::new();
    let mut start = 0;
    while start < n {
        let len = size.min(n - start);
        sizes.push(len);
        start += len;
    }
    Ok(sizes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// More blocks than items: block size 0, nothing scheduled.
    #[test]
    fn more_blocks_than_items() {
        assert_eq!(
            paper_block_coverage(5, 10, 0),
            Ok(BlockCoverage { block_size: 0, items_scheduled: 0, last_index: None })
        );
        assert!(paper_block_coverage(5, 0, 0).is_err());
    }

    /// Resuming from a later block skips the earlier ones; an exact division covers everything.
    #[test]
    fn start_block_and_exact_division() {
        assert_eq!(paper_block_coverage(5141, 170, 100).unwrap().items_scheduled, 5130 - 3000);
        assert_eq!(paper_block_coverage(340, 170, 0).unwrap().items_scheduled, 340);
        assert_eq!(paper_block_coverage(10, 2, 99).unwrap().items_scheduled, 0);
    }

    /// Rounding up can leave fewer batches than asked for; zero items give no batch.
    #[test]
    fn batch_rounding() {
        assert_eq!(v2_batch_sizes(11, 10).unwrap(), [2, 2, 2, 2, 2, 1]);
        assert!(v2_batch_sizes(0, 10).unwrap().is_empty());
        assert!(v2_batch_sizes(3, 0).is_err());
    }
}

//! Selective evaluation (spec §1.5): option order, item correctness, overall accuracy.

use serde::{Deserialize, Serialize};

use super::parse::Choice;
use super::pyrandom::PyRandom;
use super::sentence::AccuracyOverall;
use crate::metrics::pystr::py_len;

/// Which continuation is option A.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OptionOrder {
    /// A = hallucinated H, B = real R.
    HallucinatedFirst,
    /// A = real R, B = hallucinated H.
    RealFirst,
}

/// \[v2\] order (spec §1.5): H is option A iff `len(hallucinatedContinuation)` (code
/// points) is even.
pub fn option_order_v2(hallucinated_continuation: &str) -> OptionOrder {
    if py_len(hallucinated_continuation).is_multiple_of(2) {
        OptionOrder::HallucinatedFirst
    } else {
        OptionOrder::RealFirst
    }
}

/// \[paper\] order (spec §1.5): after `random.seed(seed)` (22 in UHGEval), each scored item
/// draws `random.random()` and the options are swapped (R becomes A) when the draw exceeds
/// 0.5. This yields that sequence, one order per scored item. The paper's real runs
/// re-seeded per block of 30 in spawned worker processes, so their order cannot be
/// reconstructed from this alone (spec §6.7).
pub fn paper_option_orders(seed: u64) -> impl Iterator<Item = OptionOrder> {
    let mut rng = PyRandom::new(seed);
    std::iter::repeat_with(move || {
        if rng.random() > 0.5 {
            OptionOrder::RealFirst
        } else {
            OptionOrder::HallucinatedFirst
        }
    })
}

/// One item's selective result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SelectiveItem {
    /// The model chose the option holding the real continuation R.
    pub correct: bool,
    /// The answer parsed as A or B.
    pub valid: bool,
}

/// Item result (spec §1.5): correct iff the chosen option holds R (the paper code's
/// `3 − answer` mapping after a swap says the same), valid iff the answer is A or B.
pub fn selective_item(choice: Choice, order: OptionOrder) -> SelectiveItem {
    let real_option = match order {
        OptionOrder::HallucinatedFirst => Choice::B,
        OptionOrder::RealFirst => Choice::A,
    };
    SelectiveItem { correct: choice == real_option, valid: choice != Choice::Invalid }
}

/// `accuracy = #correct / #valid` over valid items, `num` = #valid (spec §1.5).
pub fn selective_overall(items: &[SelectiveItem]) -> AccuracyOverall {
    let valid: Vec<&SelectiveItem> = items.iter().filter(|i| i.valid).collect();
    let num = valid.len();
    let correct = valid.iter().filter(|i| i.correct).count();
    AccuracyOverall { accuracy: (num > 0).then(|| correct as f64 / num as f64), num }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Picking R is correct in both orders; picking H is not; an invalid answer is neither.
    #[test]
    fn correctness_follows_order() {
        assert!(selective_item(Choice::B, OptionOrder::HallucinatedFirst).correct);
        assert!(selective_item(Choice::A, OptionOrder::RealFirst).correct);
        assert!(!selective_item(Choice::A, OptionOrder::HallucinatedFirst).correct);
        assert_eq!(
            selective_item(Choice::Invalid, OptionOrder::RealFirst),
            SelectiveItem { correct: false, valid: false }
        );
    }

    /// The v2 parity counts code points, not bytes ("é" is 1 code point but 2 bytes).
    #[test]
    fn parity_counts_code_points() {
        assert_eq!(option_order_v2("é"), OptionOrder::RealFirst);
        assert_eq!(option_order_v2("éa"), OptionOrder::HallucinatedFirst);
        assert_eq!(option_order_v2(""), OptionOrder::HallucinatedFirst);
    }

    /// No valid answer: accuracy undefined.
    #[test]
    fn overall_without_valid() {
        assert_eq!(
            selective_overall(&[SelectiveItem { correct: true, valid: false }]),
            AccuracyOverall { accuracy: None, num: 0 }
        );
    }
}

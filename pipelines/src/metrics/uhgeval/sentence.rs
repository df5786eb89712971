//! Discriminative evaluation, sentence level (spec §1.4).

use serde::{Deserialize, Serialize};

use super::parse::Judgement;

/// One item's sentence-level result.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SentenceItem {
    /// `([verdict on H is 1] + [verdict on R is 0]) / 2` ∈ {0, 0.5, 1}; kept in the log
    /// even for invalid items.
    pub accuracy: f64,
    /// Both verdicts are 0 or 1.
    pub valid: bool,
}

/// Item result (spec §1.4) from the verdict on the hallucinated continuation H (label 1)
/// and on the real continuation R (label 0). The same in \[paper\] and \[v2\].
pub fn sentence_item(on_hallucinated: Judgement, on_real: Judgement) -> SentenceItem {
    let hits = u8::from(on_hallucinated == Judgement::Hallucinated)
        + u8::from(on_real == Judgement::NotHallucinated);
    SentenceItem {
        accuracy: f64::from(hits) / 2.0,
        valid: on_hallucinated != Judgement::Invalid && on_real != Judgement::Invalid,
    }
}

/// An "accuracy over valid items" overall (sentence level, spec §1.4; selective, §1.5).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AccuracyOverall {
    /// Mean over valid items; `None` without valid items.
    pub accuracy: Option<f64>,
    /// `#valid`.
    pub num: usize,
}

/// `avg_accuracy` = mean item accuracy over valid items, `num` = #valid (spec §1.4).
pub fn sentence_overall(items: &[SentenceItem]) -> AccuracyOverall {
    let valid: Vec<f64> = items.iter().filter(|i| i.valid).map(|i| i.accuracy).collect();
    let num = valid.len();
    AccuracyOverall { accuracy: (num > 0).then(|| valid.iter().sum::<f64>() / num as f64), num }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An invalid verdict on either side invalidates the item but keeps its accuracy.
    #[test]
    fn invalid_side() {
        let i = sentence_item(Judgement::Invalid, Judgement::NotHallucinated);
        assert_eq!(i, SentenceItem { accuracy: 0.5, valid: false });
    }

    /// No items, or none valid: accuracy undefined, #valid 0.
    #[test]
    fn empty_overall() {
        assert_eq!(sentence_overall(&[]), AccuracyOverall { accuracy: None, num: 0 });
    }
}

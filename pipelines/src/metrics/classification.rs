//! Binary classification with **hallucination as the positive class** (spec §2.3): the
//! confusion counts, accuracy, precision, recall, F1, and the hallucination rate.
//!
//! A ratio whose denominator is 0 is `None` rather than a made-up number; callers who
//! want scikit-learn's `zero_division=0` convention write `.unwrap_or(0.0)`.

use serde::{Deserialize, Serialize};

use super::interval::{f1_bootstrap, wilson, Bootstrap, Interval};
use super::MetricError;

/// Confusion counts, hallucination = positive (spec §2.3): `true_pos` = hallucinated and
/// predicted hallucinated, `false_pos` = factual predicted hallucinated, and so on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Confusion {
    pub true_pos: u64,
    pub false_pos: u64,
    pub true_neg: u64,
    pub false_neg: u64,
}

/// 95% intervals of the four rates (issue 16): accuracy, precision and recall are
/// proportions (Wilson); F1 is not (seeded bootstrap over the items). `None` where the
/// rate is undefined.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClassificationIntervals {
    pub accuracy: Option<Interval>,
    pub precision: Option<Interval>,
    pub recall: Option<Interval>,
    pub f1: Option<Interval>,
}

impl ClassificationIntervals {
    pub fn of(c: &Confusion) -> ClassificationIntervals {
        let (tp, fp, tn, fn_) = (c.true_pos, c.false_pos, c.true_neg, c.false_neg);
        ClassificationIntervals {
            accuracy: wilson(tp + tn, tp + fp + tn + fn_).ok(),
            precision: wilson(tp, tp + fp).ok(),
            recall: wilson(tp, tp + fn_).ok(),
            f1: f1_bootstrap(c, Bootstrap::default()).ok(),
        }
    }
}

/// The four rates of one [`Confusion`]; each is `None` when its denominator is 0.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClassificationMetrics {
    pub accuracy: Option<f64>,
    pub precision: Option<f64>,
    pub recall: Option<f64>,
    pub f1: Option<f64>,
}

/// `num / den`, `None` for `den == 0`; `u128` so that no sum of `u64` counts overflows.
fn ratio(num: u128, den: u128) -> Option<f64> {
    (den != 0).then(|| num as f64 / den as f64)
}

impl Confusion {
    /// Counts from parallel gold labels and predictions (`true` = hallucinated), spec §2.3.
    /// Empty inputs give all-zero counts (whose rates are all `None`).
    pub fn from_labels(truth: &[bool], predicted: &[bool]) -> Result<Confusion, MetricError> {
        if truth.len() != predicted.len() {
            return Err(MetricError::LengthMismatch {
                what: "gold labels vs predictions",
                left: truth.len(),
                right: predicted.len(),
            });
        }
        let mut c = Confusion::default();
        for (&t, &p) in truth.iter().zip(predicted) {
            match (t, p) {
                (true, true) => c.true_pos += 1,
                (false, true) => c.false_pos += 1,
                (false, false) => c.true_neg += 1,
                (true, false) => c.false_neg += 1,
            }
        }
        Ok(c)
    }

    /// Counts from AutoHall's summary numbers (spec §2.3): `num_hallucinated` and
    /// `num_factual` references, of which `true_pos` hallucinated and `false_pos` factual
    /// ones were predicted hallucinated; `FN = num_hallucinated − TP`,
    /// `TN = num_factual − FP`. On AutoHall's balanced sets both totals are `n`.
    /// `OutOfRange` if `true_pos > num_hallucinated` or `false_pos > num_factual`.
    pub fn from_counts(
        num_hallucinated: u64,
        num_factual: u64,
        true_pos: u64,
        false_pos: u64,
    ) -> Result<Confusion, MetricError> {
        if true_pos > num_hallucinated {
            return Err(MetricError::OutOfRange {
                what: "TP",
                value: true_pos as f64,
                expected: "at most the number of hallucinated references",
            });
        }
        if false_pos > num_factual {
            return Err(MetricError::OutOfRange {
                what: "FP",
                value: false_pos as f64,
                expected: "at most the number of factual references",
            });
        }
        Ok(Confusion {
            true_pos,
            false_pos,
            true_neg: num_factual - false_pos,
            false_neg: num_hallucinated - true_pos,
        })
    }

    /// Number of classified items.
    pub fn total(&self) -> u128 {
        let Confusion { true_pos, false_pos, true_neg, false_neg } = *self;
        true_pos as u128 + false_pos as u128 + true_neg as u128 + false_neg as u128
    }

    /// `(TP + TN) / total`; `None` for no items.
    pub fn accuracy(&self) -> Option<f64> {
        ratio(self.true_pos as u128 + self.true_neg as u128, self.total())
    }

    /// `TP / (TP + FP)`; `None` when nothing was predicted hallucinated.
    pub fn precision(&self) -> Option<f64> {
        ratio(self.true_pos as u128, self.true_pos as u128 + self.false_pos as u128)
    }

    /// `TP / (TP + FN)`; `None` when no item is hallucinated.
    pub fn recall(&self) -> Option<f64> {
        ratio(self.true_pos as u128, self.true_pos as u128 + self.false_neg as u128)
    }

    /// `2TP / (2TP + FP + FN)` (spec §2.3; equals `2PR/(P+R)` whenever both are defined);
    /// `None` when there is no hallucinated item and no hallucinated prediction.
    pub fn f1(&self) -> Option<f64> {
        let tp2 = 2 * self.true_pos as u128;
        ratio(tp2, tp2 + self.false_pos as u128 + self.false_neg as u128)
    }

    /// All four rates.
    pub fn metrics(&self) -> ClassificationMetrics {
        ClassificationMetrics {
            accuracy: self.accuracy(),
            precision: self.precision(),
            recall: self.recall(),
            f1: self.f1(),
        }
    }
}

/// Hallucination rate `#H / #Total` (AutoHall Table 2, spec §2.1 step 3): the share of
/// generated references whose classification contradicts the gold label.
/// `Empty` for `total == 0`; `OutOfRange` if `hallucinated > total`.
pub fn hallucination_rate(hallucinated: u64, total: u64) -> Result<f64, MetricError> {
    if total == 0 {
        return Err(MetricError::Empty { what: "references for the hallucination rate" });
    }
    if hallucinated > total {
        return Err(MetricError::OutOfRange {
            what: "hallucinated references",
            value: hallucinated as f64,
            expected: "at most the total",
        });
    }
    Ok(hallucinated as f64 / total as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Empty inputs are counts of zero and every rate is undefined, not 0 or NaN.
    #[test]
    fn empty_is_undefined() {
        let c = Confusion::from_labels(&[], &[]).unwrap();
        assert_eq!(c.total(), 0);
        let m = c.metrics();
        assert_eq!((m.accuracy, m.precision, m.recall, m.f1), (None, None, None, None));
    }

    /// Mismatched lengths are an error naming both lengths.
    #[test]
    fn mismatched_lengths_rejected() {
        assert_eq!(
            Confusion::from_labels(&[true], &[true, false]),
            Err(MetricError::LengthMismatch {
                what: "gold labels vs predictions",
                left: 1,
                right: 2
            })
        );
    }

    /// All-factual gold with no hallucinated prediction: accuracy 1, precision/recall/F1 undefined.
    #[test]
    fn all_negative_class() {
        let c = Confusion::from_labels(&[false, false], &[false, false]).unwrap();
        assert_eq!(c.accuracy(), Some(1.0));
        assert_eq!((c.precision(), c.recall(), c.f1()), (None, None, None));
    }

    /// All-hallucinated gold, all predicted factual: recall and F1 are 0, precision undefined.
    #[test]
    fn all_positive_class_missed() {
        let c = Confusion::from_labels(&[true, true, true], &[false, false, false]).unwrap();
        assert_eq!(
            (c.accuracy(), c.recall(), c.f1(), c.precision()),
            (Some(0.0), Some(0.0), Some(0.0), None)
        );
    }

    /// F1 from counts equals the harmonic mean of precision and recall.
    #[test]
    fn f1_is_harmonic_mean() {
        let c = Confusion { true_pos: 7, false_pos: 3, true_neg: 5, false_neg: 2 };
        let (p, r) = (c.precision().unwrap(), c.recall().unwrap());
        assert!((c.f1().unwrap() - 2.0 * p * r / (p + r)).abs() < 1e-15);
    }

    /// Counts that exceed their class size are rejected rather than wrapping around.
    #[test]
    fn from_counts_checks_bounds() {
        assert!(matches!(
            Confusion::from_counts(3, 3, 4, 0),
            Err(MetricError::OutOfRange { what: "TP", .. })
        ));
        assert!(matches!(
            Confusion::from_counts(3, 3, 0, 4),
            Err(MetricError::OutOfRange { what: "FP", .. })
        ));
        assert_eq!(
            Confusion::from_counts(3, 5, 2, 1).unwrap(),
            Confusion { true_pos: 2, false_pos: 1, true_neg: 4, false_neg: 1 }
        );
    }

    /// The hallucination rate rejects an empty total and a count above the total.
    #[test]
    fn hallucination_rate_bounds() {
        assert_eq!(hallucination_rate(1, 4), Ok(0.25));
        assert!(hallucination_rate(0, 0).is_err());
        assert!(hallucination_rate(5, 4).is_err());
    }
}

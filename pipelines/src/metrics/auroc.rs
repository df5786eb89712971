//! AUROC and the RealHall aggregates (spec §3.2).

use std::cmp::Ordering;

use super::{mean, reject_nan, MetricError};

/// Area under the ROC curve of `scores` against `labels` (spec §3.2): positive class =
/// hallucinated (`true`), higher score = more likely hallucinated, **ties count ½**. It is
/// computed as the Mann–Whitney statistic `U / (n₁·n₀)` with mid-ranks for tied scores,
/// which equals scikit-learn's `roc_auc_score`.
///
/// `-0.0` and `0.0` are one score (a tie); `±∞` are ordinary extreme scores.
/// Errors: `LengthMismatch`; `Empty`; `NotANumber` at a NaN score; `SingleClass` when
/// only one class is present (scikit-learn raises there too).
pub fn auroc(labels: &[bool], scores: &[f64]) -> Result<f64, MetricError> {
    if labels.len() != scores.len() {
        return Err(MetricError::LengthMismatch {
            what: "labels vs scores",
            left: labels.len(),
            right: scores.len(),
        });
    }
    if labels.is_empty() {
        return Err(MetricError::Empty { what: "labels" });
    }
    reject_nan("scores", scores)?;
    let positives = labels.iter().filter(|&&l| l).count();
    let negatives = labels.len() - positives;
    if positives == 0 || negatives == 0 {
        return Err(MetricError::SingleClass { positives, negatives });
    }

    let mut order: Vec<usize> = (0..scores.len()).collect();
    // No NaN is left, so `partial_cmp` is total here (and -0.0 == 0.0, unlike `total_cmp`).
    order.sort_by(|&a, &b| scores[a].partial_cmp(&scores[b]).unwrap_or(Ordering::Equal));

    // Sum of the 1-based mid-ranks of the positives; every rank is a multiple of ½, so the
    // sum is exact in f64 for any realistic n.
    let mut positive_rank_sum = 0.0_f64;
    let mut start = 0;
    while start < order.len() {
        let mut end = start + 1;
        while end < order.len() && scores[order[end]] == scores[order[start]] {
            end += 1;
        }
        // Positions start..end (0-based) hold ranks start+1..=end; their mean:
        let mid_rank = (start + 1 + end) as f64 / 2.0;
        let tied_positives = order[start..end].iter().filter(|&&i| labels[i]).count();
        positive_rank_sum += mid_rank * tied_positives as f64;
        start = end;
    }
    let (n1, n0) = (positives as f64, negatives as f64);
    let u = positive_rank_sum - n1 * (n1 + 1.0) / 2.0;
    Ok(u / (n1 * n0))
}

fn check_auroc_values(what: &'static str, values: &[f64]) -> Result<(), MetricError> {
    reject_nan(what, values)?;
    match values.iter().find(|v| !(0.0..=1.0).contains(*v)) {
        Some(&value) => {
            Err(MetricError::OutOfRange { what, value, expected: "an AUROC in [0, 1]" })
        }
        None => Ok(()),
    }
}

/// RealHall aggregate AUROC (spec §3.2): the unweighted mean of per-dataset AUROCs
/// (all four datasets for Table 1, the Open or Closed pair for Tables 3 and 4).
/// Errors: `Empty`; `NotANumber`; `OutOfRange` for a value outside [0, 1].
pub fn aggregate_auroc(per_dataset: &[f64]) -> Result<f64, MetricError> {
    check_auroc_values("per-dataset AUROC", per_dataset)?;
    mean("per-dataset AUROC", per_dataset)
}

/// "Quality vs ours" (ChainPoll Table 5, note e; spec §3.2):
/// `mean_d(AUROC_d − 0.5) / mean_d(AUROC_d^ref − 0.5)` over the same datasets, where
/// `reference` holds ChainPoll's AUROCs. Errors: `LengthMismatch`, `Empty`,
/// `NotANumber`, `OutOfRange`, and `Undefined` when the reference is no better than
/// chance on average (denominator 0).
pub fn relative_quality(method: &[f64], reference: &[f64]) -> Result<f64, MetricError> {
    if method.len() != reference.len() {
        return Err(MetricError::LengthMismatch {
            what: "method vs reference AUROCs",
            left: method.len(),
            right: reference.len(),
        });
    }
    let lift = |v: &[f64], what| -> Result<f64, MetricError> {
        check_auroc_values(what, v)?;
        let lifts: Vec<f64> = v.iter().map(|a| a - 0.5).collect();
        mean(what, &lifts)
    };
    let num = lift(method, "method AUROC")?;
    let den = lift(reference, "reference AUROC")?;
    if den == 0.0 {
        return Err(MetricError::Undefined {
            what: "quality vs reference",
            reason: "the reference's mean AUROC is exactly 0.5",
        });
    }
    Ok(num / den)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A perfect ranking gives 1, a reversed one 0.
    #[test]
    fn perfect_and_reversed() {
        assert_eq!(auroc(&[false, false, true], &[0.1, 0.2, 0.9]), Ok(1.0));
        assert_eq!(auroc(&[true, false, false], &[0.1, 0.2, 0.9]), Ok(0.0));
    }

    /// A single positive tied with a single negative counts ½.
    #[test]
    fn tie_counts_half() {
        assert_eq!(auroc(&[true, false], &[0.4, 0.4]), Ok(0.5));
        assert_eq!(auroc(&[true, false, false], &[0.4, 0.4, 0.1]), Ok(0.75));
    }

    /// -0.0 and 0.0 tie (total_cmp would order them and give 1.0 here).
    #[test]
    fn signed_zero_ties() {
        assert_eq!(auroc(&[true, false], &[0.0, -0.0]), Ok(0.5));
    }

    /// Infinite scores are ranked, not rejected.
    #[test]
    fn infinities_rank() {
        assert_eq!(
            auroc(&[true, false, true], &[f64::INFINITY, f64::NEG_INFINITY, f64::INFINITY]),
            Ok(1.0)
        );
    }

    /// Empty input, one class only, NaN and mismatched lengths are typed errors.
    #[test]
    fn bad_inputs() {
        assert_eq!(auroc(&[], &[]), Err(MetricError::Empty { what: "labels" }));
        assert_eq!(
            auroc(&[true, true], &[0.1, 0.2]),
            Err(MetricError::SingleClass { positives: 2, negatives: 0 })
        );
        assert_eq!(
            auroc(&[false], &[0.1]),
            Err(MetricError::SingleClass { positives: 0, negatives: 1 })
        );
        assert_eq!(
            auroc(&[true, false], &[0.1, f64::NAN]),
            Err(MetricError::NotANumber { what: "scores", index: 1 })
        );
        assert!(matches!(auroc(&[true], &[0.1, 0.2]), Err(MetricError::LengthMismatch { .. })));
    }

    /// The aggregates reject empty input, values outside [0, 1] and a chance-level reference.
    #[test]
    fn aggregate_edges() {
        assert!(aggregate_auroc(&[]).is_err());
        assert!(matches!(aggregate_auroc(&[0.7, 1.2]), Err(MetricError::OutOfRange { .. })));
        assert!(matches!(relative_quality(&[0.7], &[0.5]), Err(MetricError::Undefined { .. })));
        assert!(matches!(
            relative_quality(&[0.7], &[0.6, 0.8]),
            Err(MetricError::LengthMismatch { .. })
        ));
        assert!((relative_quality(&[0.6], &[0.7]).unwrap() - 0.5).abs() < 1e-12);
    }
}

//! AutoHall (spec §2; code `zouyingcao/AutoHall` @ 469ee6b): the claim-classification
//! parse and hallucination label used to build the dataset, the pairwise conflict parse,
//! the self-contradiction decision rule, the per-K ablation and the SelfCk-1gm threshold.
//!
//! Every rule follows the authors' code where the spec says the paper is silent or
//! differs (substring tests, first-N balancing, "any conflict" union).

use serde::{Deserialize, Serialize};

use super::classification::Confusion;
use super::MetricError;

/// The LLM's verdict on a claim in step 2 ("Category: T|F"), spec §2.1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ClaimVerdict {
    True,
    False,
}

/// Parses a claim-classification answer as the AutoHall notebooks do (spec §2.1 step 2):
/// `True` if it contains `true`, `True` or `TRUE`; else `False` if it contains `False`,
/// `false` or `FALSE`; else `None` (no usable classification: the item is dropped).
/// Substring tests in that order, so "untrue" reads as `True`: a quirk kept on purpose.
pub fn parse_claim_verdict(answer: &str) -> Option<ClaimVerdict> {
    if ["true", "True", "TRUE"].iter().any(|t| answer.contains(t)) {
        Some(ClaimVerdict::True)
    } else if ["False", "false", "FALSE"].iter().any(|f| answer.contains(f)) {
        Some(ClaimVerdict::False)
    } else {
        None
    }
}

/// A fact-checking gold label reduced to its two kept values (spec §2.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GoldLabel {
    /// Climate-FEVER `SUPPORTS`, PubHealth `true`, WICE `supported`.
    Supported,
    /// Climate-FEVER `REFUTES`, PubHealth `false`, WICE `not_supported`.
    Refuted,
}

impl GoldLabel {
    /// The label of a source-dataset row (exact spelling); `None` for the dropped labels
    /// (`DISPUTED`, `NOT_ENOUGH_INFO`, `mixture`, `unproven`, `partially_supported`) and
    /// anything else.
    pub fn from_dataset(label: &str) -> Option<GoldLabel> {
        match label {
            "SUPPORTS" | "true" | "supported" => Some(GoldLabel::Supported),
            "REFUTES" | "false" | "not_supported" => Some(GoldLabel::Refuted),
            _ => None,
        }
    }
}

/// AutoHall step 3 (spec §2.1): a reference is hallucinated iff the classification it led
/// to differs from the gold label (`True` vs `Supported`, `False` vs `Refuted`).
pub fn is_hallucinated(verdict: ClaimVerdict, gold: GoldLabel) -> bool {
    !matches!(
        (verdict, gold),
        (ClaimVerdict::True, GoldLabel::Supported) | (ClaimVerdict::False, GoldLabel::Refuted)
    )
}

/// Which answers to the pairwise prompt mean "no conflict" (spec §2.2 step 3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NoConflictPhrases {
    /// The main notebooks: the answer contains `here are no conflicting parts`.
    #[default]
    Standard,
    /// The Llama-2-13b notebook's widened list (which includes the standard phrase).
    Llama2_13b,
}

/// Substrings that mark a "no conflict" answer in the Llama-2-13b notebook (spec §2.2).
pub const LLAMA2_13B_NO_CONFLICT: [&str; 13] = [
    "here are no conflicting parts",
    "Conflicting parts not found",
    "here is no conflicting information",
    "no conflicting parts",
    "here is no conflict",
    "0 conflicts",
    "0 conflicting parts",
    "0 Conflicting parts",
    "No conflict found",
    "P1 and P2 are not conflicting.",
    "do not contain conflicting",
    "No\"",
    "0\"",
];

/// Pair verdict (spec §2.2 step 3): `false` (no conflict) iff the answer contains a
/// no-conflict phrase (case-sensitive substring test), `true` (conflict) for anything
/// else, including an empty answer.
pub fn pair_conflicts(answer: &str, phrases: NoConflictPhrases) -> bool {
    match phrases {
        NoConflictPhrases::Standard => !answer.contains("here are no conflicting parts"),
        NoConflictPhrases::Llama2_13b => !LLAMA2_13B_NO_CONFLICT.iter().any(|p| answer.contains(p)),
    }
}

/// The self-contradiction decision for one reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Detection {
    /// Predicted hallucinated: at least one of the K pairs conflicts (Eq. 3).
    pub hallucinated: bool,
    /// `Num_c`, the number of conflicting pairs.
    pub num_conflicts: usize,
}

/// Eq. 3 (spec §2.2 step 4): predicted hallucinated iff at least one of the K pair
/// verdicts (`true` = conflict) is a conflict. `Empty` for K = 0.
pub fn detect(conflicts: &[bool]) -> Result<Detection, MetricError> {
    if conflicts.is_empty() {
        return Err(MetricError::Empty { what: "pair verdicts (K must be at least 1)" });
    }
    let num_conflicts = conflicts.iter().filter(|&&c| c).count();
    Ok(Detection { hallucinated: num_conflicts > 0, num_conflicts })
}

/// One reference of a balanced detection set: its gold label and its pair verdicts in
/// sample order (`conflicts[k]` compares Y with Y'_{k+1}).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DetectionRecord {
    pub hallucinated: bool,
    pub conflicts: Vec<bool>,
}

/// One row of the K-ablation.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AblationRow {
    pub k: usize,
    pub confusion: Confusion,
    /// Mean `Num_c` over hallucinated references (AutoHall Table 4); `None` if there are none.
    pub mean_conflicts_hallucinated: Option<f64>,
    /// Mean `Num_c` over factual references; `None` if there are none.
    pub mean_conflicts_factual: Option<f64>,
}

/// The K-ablation (spec §2.3): for every `k` in `1..=max_k`, the decision of Eq. 3 on the
/// **first k** pair verdicts of each record (the same samples, a growing prefix), scored
/// against the gold labels. `Empty` for no records or `max_k = 0`; `TooFewSamples` if a
/// record has fewer than `max_k` verdicts.
pub fn k_ablation(
    records: &[DetectionRecord],
    max_k: usize,
) -> Result<Vec<AblationRow>, MetricError> {
    if records.is_empty() {
        return Err(MetricError::Empty { what: "detection records" });
    }
    if max_k == 0 {
        return Err(MetricError::Empty { what: "pair verdicts (K must be at least 1)" });
    }
    if let Some((index, r)) = records.iter().enumerate().find(|(_, r)| r.conflicts.len() < max_k) {
        return Err(MetricError::TooFewSamples {
            what: "detection record",
            index,
            needed: max_k,
            got: r.conflicts.len(),
        });
    }
    let truth: Vec<bool> = records.iter().map(|r| r.hallucinated).collect();
    let mut rows = Vec::with_capacity(max_k);
    for k in 1..=max_k {
        let detections: Vec<Detection> =
            records.iter().map(|r| detect(&r.conflicts[..k])).collect::<Result<_, _>>()?;
        let predicted: Vec<bool> = detections.iter().map(|d| d.hallucinated).collect();
        let confusion = Confusion::from_labels(&truth, &predicted)?;
        let mean_conflicts = |class: bool| {
            let counts: Vec<f64> = records
                .iter()
                .zip(&detections)
                .filter(|(r, _)| r.hallucinated == class)
                .map(|(_, d)| d.num_conflicts as f64)
                .collect();
            (!counts.is_empty()).then(|| counts.iter().sum::<f64>() / counts.len() as f64)
        };
        rows.push(AblationRow {
            k,
            confusion,
            mean_conflicts_hallucinated: mean_conflicts(true),
            mean_conflicts_factual: mean_conflicts(false),
        });
    }
    Ok(rows)
}

/// The SelfCk-1gm threshold of AutoHall's baselines notebook (spec §2.3).
pub const SELFCK_1GM_THRESHOLD: f64 = 5.0;

/// SelfCk-1gm decision (spec §2.3): predicted hallucinated iff the passage-level
/// `avg_neg_logprob` (token-weighted, see [`super::selfcheck`]) is `>= 5`. `+∞` (an
/// unseen token) is hallucinated; NaN is `NotANumber`.
pub fn selfck_1gm_hallucinated(doc_avg_neg_logprob: f64) -> Result<bool, MetricError> {
    super::reject_nan("doc avg_neg_logprob", &[doc_avg_neg_logprob])?;
    Ok(doc_avg_neg_logprob >= SELFCK_1GM_THRESHOLD)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// "TRUE" and "FALSE" are recognised, mixed case like "tRUE" is not, and true wins over false.
    #[test]
    fn claim_parse_case_rules() {
        assert_eq!(parse_claim_verdict("Category: TRUE"), Some(ClaimVerdict::True));
        assert_eq!(parse_claim_verdict("FALSE"), Some(ClaimVerdict::False));
        assert_eq!(parse_claim_verdict("tRUE"), None);
        assert_eq!(parse_claim_verdict("false, not true"), Some(ClaimVerdict::True));
        assert_eq!(parse_claim_verdict(""), None);
    }

    /// Only the kept gold labels map; the dropped ones and unknown spellings are `None`.
    #[test]
    fn gold_labels() {
        assert_eq!(GoldLabel::from_dataset("not_supported"), Some(GoldLabel::Refuted));
        assert_eq!(GoldLabel::from_dataset("true"), Some(GoldLabel::Supported));
        for dropped in [
            "DISPUTED",
            "NOT_ENOUGH_INFO",
            "mixture",
            "unproven",
            "partially_supported",
            "Supports",
        ] {
            assert_eq!(GoldLabel::from_dataset(dropped), None, "{dropped}");
        }
    }

    /// The Llama-2-13b list accepts phrasings the standard rule reads as conflicts.
    #[test]
    fn widened_no_conflict_list() {
        let a = "Conflicting parts not found.";
        assert!(pair_conflicts(a, NoConflictPhrases::Standard));
        assert!(!pair_conflicts(a, NoConflictPhrases::Llama2_13b));
        assert!(pair_conflicts("", NoConflictPhrases::Llama2_13b));
    }

    /// K = 0 is an error, not a silent "factual".
    #[test]
    fn detect_needs_k() {
        assert!(detect(&[]).is_err());
        assert_eq!(
            detect(&[false, false]).unwrap(),
            Detection { hallucinated: false, num_conflicts: 0 }
        );
    }

    /// The ablation uses prefixes of the same samples: recall never falls as K grows.
    #[test]
    fn ablation_prefixes() {
        let records = vec![
            DetectionRecord { hallucinated: true, conflicts: vec![false, true, false] },
            DetectionRecord { hallucinated: true, conflicts: vec![false, false, false] },
            DetectionRecord { hallucinated: false, conflicts: vec![false, false, true] },
            DetectionRecord { hallucinated: false, conflicts: vec![false, false, false] },
        ];
        let rows = k_ablation(&records, 3).unwrap();
        let tp: Vec<u64> = rows.iter().map(|r| r.confusion.true_pos).collect();
        let fp: Vec<u64> = rows.iter().map(|r| r.confusion.false_pos).collect();
        assert_eq!(tp, [0, 1, 1]);
        assert_eq!(fp, [0, 0, 1]);
        assert_eq!(rows[2].mean_conflicts_hallucinated, Some(0.5));
        assert_eq!(rows[2].mean_conflicts_factual, Some(0.5));
        assert_eq!(rows[0].confusion.recall(), Some(0.0));
    }

    /// A record with fewer verdicts than K is reported by index.
    #[test]
    fn ablation_rejects_short_record() {
        let records = vec![
            DetectionRecord { hallucinated: true, conflicts: vec![true, true] },
            DetectionRecord { hallucinated: false, conflicts: vec![true] },
        ];
        assert_eq!(
            k_ablation(&records, 2),
            Err(MetricError::TooFewSamples {
                what: "detection record",
                index: 1,
                needed: 2,
                got: 1
            })
        );
        assert!(k_ablation(&[], 2).is_err());
        assert!(k_ablation(&records, 0).is_err());
    }

    /// NaN is rejected by the SelfCk-1gm rule; +∞ counts as hallucinated.
    #[test]
    fn selfck_threshold_edges() {
        assert!(selfck_1gm_hallucinated(f64::NAN).is_err());
        assert_eq!(selfck_1gm_hallucinated(f64::INFINITY), Ok(true));
    }
}

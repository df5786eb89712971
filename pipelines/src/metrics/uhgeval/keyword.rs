//! Discriminative evaluation, keyword level (spec §1.3): candidate keywords, balancing,
//! item accuracy and validity, and the overall averages.

use serde::{Deserialize, Serialize};

use super::parse::Judgement;
use super::UhgVariant;
use crate::metrics::MetricError;

/// A keyword kept for evaluation, with its ground truth.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeywordCase {
    pub keyword: String,
    /// `true` (label 1) iff the annotation starts with `不合理`.
    pub hallucinated: bool,
}

/// Splits one \[v2\] annotation `"<keyword><sep><annotation>"` (spec §1.1). `Malformed`
/// unless it holds exactly one `<sep>` (v2's `kw, j = item.split("<sep>")` raises then).
pub fn split_annotation(line: &str) -> Result<(&str, &str), MetricError> {
    let mut parts = line.split("<sep>");
    match (parts.next(), parts.next(), parts.next()) {
        (Some(kw), Some(annotation), None) => Ok((kw, annotation)),
        _ => Err(MetricError::Malformed {
            what: "UHGEval annotation",
            input: line.to_owned(),
            reason: "expected exactly one <sep>",
        }),
    }
}

/// Balancing (spec §1.3 step 3): `n = min(#hallucinated, #not)`, the **first** `n` of each
/// list in list order, hallucinated ones first (the order UHGEval asks them in).
fn balance(hallucinated: Vec<String>, not_hallucinated: Vec<String>) -> Vec<KeywordCase> {
    let n = hallucinated.len().min(not_hallucinated.len());
    let case = |hallucinated| move |keyword| KeywordCase { keyword, hallucinated };
    let mut cases: Vec<KeywordCase> = hallucinated.into_iter().take(n).map(case(true)).collect();
    cases.extend(not_hallucinated.into_iter().take(n).map(case(false)));
    cases
}

/// \[paper\] candidate keywords (spec §1.3 steps 1–3): the keys of `allKeywords` in dict
/// order, minus every keyword listed in `appearedKeywords` (exact match); hallucinated iff
/// the annotation starts with `不合理`, not hallucinated iff it starts with `合理`; a
/// keyword whose annotation starts with neither is left out (the paper code files it in
/// neither list). Then balanced.
pub fn select_keywords_paper<K, A, P>(all_keywords: &[(K, A)], appeared: &[P]) -> Vec<KeywordCase>
where
    K: AsRef<str>,
    A: AsRef<str>,
    P: AsRef<str>,
{
    let mut yes = Vec::new();
    let mut no = Vec::new();
    for (kw, annotation) in all_keywords {
        let (kw, annotation) = (kw.as_ref(), annotation.as_ref());
        if appeared.iter().any(|a| a.as_ref() == kw) {
            continue;
        }
        if annotation.starts_with("不合理") {
            yes.push(kw.to_owned());
        } else if annotation.starts_with("合理") {
            no.push(kw.to_owned());
        }
    }
    balance(yes, no)
}

/// \[v2\] candidate keywords (spec §1.3 steps 1–3): every entry of `annotations`
/// (`"<keyword><sep><annotation>"` lines, no exclusion), hallucinated iff the annotation
/// starts with `不合理`, otherwise not; then balanced. `Malformed` for a line without
/// exactly one `<sep>`. Duplicate keywords stay separate entries (v2 keys its predictions
/// by keyword, which would merge them; not emulated).
pub fn select_keywords_v2<S: AsRef<str>>(
    annotations: &[S],
) -> Result<Vec<KeywordCase>, MetricError> {
    let mut yes = Vec::new();
    let mut no = Vec::new();
    for line in annotations {
        let (kw, annotation) = split_annotation(line.as_ref())?;
        if annotation.starts_with("不合理") {
            yes.push(kw.to_owned());
        } else {
            no.push(kw.to_owned());
        }
    }
    Ok(balance(yes, no))
}

/// One item's keyword-level result.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeywordItem {
    /// Share of kept keywords whose prediction equals the label; 0 for no keyword.
    pub accuracy: f64,
    /// `2n`, the number of keywords evaluated.
    pub num_kws: usize,
    pub valid: bool,
}

/// Item accuracy and validity (spec §1.3 steps 6–7) from the kept `cases` and the model's
/// verdicts on them, in the same order:
/// - \[paper\]: `accuracy = #(verdict == label) / 2n` (an invalid verdict never matches);
///   `valid = n > 0 and every verdict is 0 or 1`;
/// - \[v2\] (log compatibility only, the spec's "v2 bug"): verdicts become booleans first,
///   so an invalid verdict counts as "hallucinated"; every item is valid, including
///   `n = 0`, whose accuracy is 0.
///
/// `LengthMismatch` if the two lists differ in length.
pub fn keyword_item(
    cases: &[KeywordCase],
    verdicts: &[Judgement],
    variant: UhgVariant,
) -> Result<KeywordItem, MetricError> {
    if cases.len() != verdicts.len() {
        return Err(MetricError::LengthMismatch {
            what: "keyword cases vs verdicts",
            left: cases.len(),
            right: verdicts.len(),
        });
    }
    let as_bool = |v: Judgement| match variant {
        UhgVariant::Paper => match v {
            Judgement::Hallucinated => Some(true),
            Judgement::NotHallucinated => Some(false),
            Judgement::Invalid => None,
        },
        UhgVariant::V2 => Some(v != Judgement::NotHallucinated),
    };
    let correct =
        cases.iter().zip(verdicts).filter(|(c, &v)| as_bool(v) == Some(c.hallucinated)).count();
    let num_kws = cases.len();
    let accuracy = if num_kws == 0 { 0.0 } else { correct as f64 / num_kws as f64 };
    let valid = match variant {
        UhgVariant::Paper => num_kws > 0 && verdicts.iter().all(|&v| v != Judgement::Invalid),
        UhgVariant::V2 => true,
    };
    Ok(KeywordItem { accuracy, num_kws, valid })
}

/// The keyword-level overall (spec §1.3 step 8; paper columns "avg. acc.", "avg. #kws",
/// "#valid").
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeywordOverall {
    /// Mean item accuracy over valid items (macro, not pooled over keywords); `None`
    /// without valid items.
    pub avg_accuracy: Option<f64>,
    /// Mean `num_kws` over valid items; `None` without valid items.
    pub avg_num_kws: Option<f64>,
    /// `#valid`.
    pub num: usize,
}

/// Averages over the valid items (spec §1.3 step 8); invalid items are ignored.
pub fn keyword_overall(items: &[KeywordItem]) -> KeywordOverall {
    let valid: Vec<&KeywordItem> = items.iter().filter(|i| i.valid).collect();
    let num = valid.len();
    let avg = |f: fn(&KeywordItem) -> f64| {
        (num > 0).then(|| valid.iter().map(|i| f(i)).sum::<f64>() / num as f64)
    };
    KeywordOverall {
        avg_accuracy: avg(|i| i.accuracy),
        avg_num_kws: avg(|i| i.num_kws as f64),
        num,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cases(labels: &[bool]) -> Vec<KeywordCase> {
        labels.iter().map(|&h| KeywordCase { keyword: format!("k{h}"), hallucinated: h }).collect()
    }

    /// A line with zero or two `<sep>` is malformed, and the error carries the line.
    #[test]
    fn annotation_needs_one_sep() {
        assert_eq!(split_annotation("江苏<sep>合理"), Ok(("江苏", "合理")));
        assert!(matches!(split_annotation("江苏"), Err(MetricError::Malformed { .. })));
        assert!(matches!(
            select_keywords_v2(&["a<sep>b<sep>c"]),
            Err(MetricError::Malformed { .. })
        ));
    }

    /// Paper drops annotations that start with neither 合理 nor 不合理; v2 counts them as reasonable.
    #[test]
    fn unknown_annotation() {
        let all = [("甲", "不合理"), ("乙", "其他")];
        assert!(select_keywords_paper(&all, &[] as &[&str]).is_empty());
        let v2 = select_keywords_v2(&["甲<sep>不合理", "乙<sep>其他"]).unwrap();
        assert_eq!(v2.len(), 2);
    }

    /// Paper: n = 0 is invalid; v2: valid with accuracy 0 (the v2 bug).
    #[test]
    fn no_keywords() {
        assert_eq!(
            keyword_item(&[], &[], UhgVariant::Paper).unwrap(),
            KeywordItem { accuracy: 0.0, num_kws: 0, valid: false }
        );
        assert_eq!(
            keyword_item(&[], &[], UhgVariant::V2).unwrap(),
            KeywordItem { accuracy: 0.0, num_kws: 0, valid: true }
        );
    }

    /// An unparseable verdict invalidates a paper item but counts as "hallucinated" in v2.
    #[test]
    fn invalid_verdict() {
        let c = cases(&[true, false]);
        let v = [Judgement::Invalid, Judgement::NotHallucinated];
        assert_eq!(
            keyword_item(&c, &v, UhgVariant::Paper).unwrap(),
            KeywordItem { accuracy: 0.5, num_kws: 2, valid: false }
        );
        assert_eq!(
            keyword_item(&c, &v, UhgVariant::V2).unwrap(),
            KeywordItem { accuracy: 1.0, num_kws: 2, valid: true }
        );
        assert!(keyword_item(&c, &v[..1], UhgVariant::Paper).is_err());
    }

    /// No valid item: averages are undefined and #valid is 0.
    #[test]
    fn overall_without_valid_items() {
        let o = keyword_overall(&[KeywordItem { accuracy: 1.0, num_kws: 2, valid: false }]);
        assert_eq!(o, KeywordOverall { avg_accuracy: None, avg_num_kws: None, num: 0 });
    }
}

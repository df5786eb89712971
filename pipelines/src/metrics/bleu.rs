//! UHGEval BLEU-4, in the two variants of spec §1.6 / §6.1, on token lists (tokenise with
//! [`super::tokenize::jieba_cut`] for UHGEval). Sentence-level, one reference; average
//! the item scores for a report (it is not corpus BLEU).
//!
//! - [`bleu4_paper`] **\[paper\]**: the HuggingFace-`evaluate` / TF-NMT `compute_bleu`
//!   (`max_order = 4`, `smooth = False`) **divided by its brevity penalty**, i.e. the
//!   geometric mean of the 1–4-gram precisions, 0 if any of them is 0. This produced the
//!   paper's numbers.
//! - [`bleu4_v2`] **\[v2\]**: nltk `sentence_bleu([ref], cand)` with default weights, no
//!   smoothing, **with** brevity penalty; a zero precision above order 1 becomes
//!   `sys.float_info.min`, giving tiny non-zero scores (e.g. 1e-155) instead of 0.

use std::collections::HashMap;
use std::hash::Hash;

use serde::{Deserialize, Serialize};

/// One modified n-gram precision `matches / possible`, kept as counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NgramPrecision {
    /// n (1–4).
    pub order: usize,
    /// Clipped matches: `Σ_g min(count_c(g), count_r(g))`.
    pub matches: u64,
    /// The denominator as the variant defines it: `max(len(c) − n + 1, 0)` for paper,
    /// `max(1, len(c) − n + 1)` for v2 (nltk).
    pub possible: u64,
}

impl NgramPrecision {
    /// `matches / possible`, 0 when `possible` is 0 (TF semantics).
    pub fn value(&self) -> f64 {
        if self.possible == 0 {
            0.0
        } else {
            self.matches as f64 / self.possible as f64
        }
    }
}

/// Clipped n-gram matches and the number of candidate n-grams, n = 1..=4.
fn clipped_matches<T: Eq + Hash>(candidate: &[T], reference: &[T]) -> [(u64, u64); 4] {
    let mut out = [(0, 0); 4];
    for (i, slot) in out.iter_mut().enumerate() {
        let n = i + 1;
        let mut ref_counts: HashMap<&[T], u64> = HashMap::new();
        for g in reference.windows(n) {
            *ref_counts.entry(g).or_insert(0) += 1;
        }
        let mut cand_counts: HashMap<&[T], u64> = HashMap::new();
        for g in candidate.windows(n) {
            *cand_counts.entry(g).or_insert(0) += 1;
        }
        let matches =
            cand_counts.iter().map(|(g, &c)| c.min(ref_counts.get(g).copied().unwrap_or(0))).sum();
        *slot = (matches, candidate.len().saturating_sub(n - 1) as u64);
    }
    out
}

/// The \[paper\] BLEU-4 of one candidate (spec §1.6 "BLEU-4 \[paper\]").
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Bleu4Paper {
    /// `p_1..p_4`, denominators `max(len(c) − n + 1, 0)`.
    pub precisions: [NgramPrecision; 4],
    /// `exp(¼ Σ ln p_n)` if every `p_n > 0`, else 0.
    pub geo_mean: f64,
    /// The library's `BP` (1 if `len(c) > len(r)`, else `exp(1 − 1/(len(c)/len(r)))`);
    /// `None` where the library raises `ZeroDivisionError` (empty candidate or empty
    /// reference), which UHGEval turns into a score of 0.0.
    pub brevity_penalty: Option<f64>,
    /// The library's BLEU, `geo_mean · BP` (= sacrebleu with `smooth_method='none'`);
    /// `None` where the library raises.
    pub library_bleu: Option<f64>,
    /// What UHGEval reports: `library_bleu / BP`, 0.0 if `BP == 0` (underflow) or the
    /// library raised. Equals `geo_mean` up to one rounding.
    pub score: f64,
}

/// \[paper\] BLEU-4 (spec §1.6, §6.1): the geometric mean of the clipped 1–4-gram
/// precisions without brevity penalty, as UHGEval's `bleu4_score(with_penalty=False)`
/// computes it through HF `evaluate`'s `bleu` (TF-NMT `compute_bleu`, `smooth=False`).
/// Never fails: the cases where the Python code raises give `score = 0.0` (UHGEval's
/// exception fallback), with `brevity_penalty` and `library_bleu` `None`.
pub fn bleu4_paper<T: Eq + Hash>(candidate: &[T], reference: &[T]) -> Bleu4Paper {
    let counts = clipped_matches(candidate, reference);
    let precisions = std::array::from_fn(|i| NgramPrecision {
        order: i + 1,
        matches: counts[i].0,
        possible: counts[i].1,
    });
    let values: Vec<f64> = precisions.iter().map(NgramPrecision::value).collect();
    let geo_mean = if values.iter().all(|&p| p > 0.0) {
        // Python: sum((1. / max_order) * math.log(p) for p in precisions), left to right.
        values.iter().fold(0.0, |acc, p| acc + 0.25 * p.ln()).exp()
    } else {
        0.0
    };
    let (c, r) = (candidate.len() as f64, reference.len() as f64);
    let brevity_penalty = if reference.is_empty() || candidate.is_empty() {
        None // ratio = c / 0, or 1 / ratio with ratio = 0: ZeroDivisionError
    } else {
        let ratio = c / r;
        Some(if ratio > 1.0 { 1.0 } else { (1.0 - 1.0 / ratio).exp() })
    };
    let library_bleu = brevity_penalty.map(|bp| geo_mean * bp);
    let score = match (library_bleu, brevity_penalty) {
        (Some(bleu), Some(bp)) if bp != 0.0 => bleu / bp,
        _ => 0.0,
    };
    Bleu4Paper { precisions, geo_mean, brevity_penalty, library_bleu, score }
}

/// The \[v2\] BLEU-4 of one candidate (spec §1.6 "BLEU-4 \[v2\]").
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Bleu4V2 {
    /// `p_1..p_4` with nltk's denominators `max(1, len(c) − n + 1)`.
    pub precisions: [NgramPrecision; 4],
    /// nltk's `BP`: 1 if `len(c) > len(r)`, 0 if `len(c) == 0`, else `exp(1 − len(r)/len(c))`.
    pub brevity_penalty: f64,
    /// `BP · exp(Σ ¼ ln p_n)` with a zero `p_n` replaced by `f64::MIN_POSITIVE`
    /// (`sys.float_info.min`); 0 if there is no unigram match.
    pub score: f64,
}

/// \[v2\] BLEU-4 (spec §1.6, §6.1): nltk 3.10 `sentence_bleu([reference], candidate)` with
/// weights (¼,¼,¼,¼), smoothing `method0` (none) and brevity penalty. The log terms are
/// summed with an exactly rounded sum as `math.fsum` does, so values match nltk's to the
/// last bit in the cases checked. Never fails; empty inputs give 0.
pub fn bleu4_v2<T: Eq + Hash>(candidate: &[T], reference: &[T]) -> Bleu4V2 {
    let counts = clipped_matches(candidate, reference);
    let precisions = std::array::from_fn(|i| NgramPrecision {
        order: i + 1,
        matches: counts[i].0,
        possible: counts[i].1.max(1),
    });
    let (c, r) = (candidate.len(), reference.len());
    let brevity_penalty = if c > r {
        1.0
    } else if c == 0 {
        0.0
    } else {
        (1.0 - r as f64 / c as f64).exp()
    };
    if precisions[0].matches == 0 {
        return Bleu4V2 { precisions, brevity_penalty, score: 0.0 };
    }
    let terms: Vec<f64> = precisions
        .iter()
        .map(|p| {
            let v = if p.matches == 0 {
                f64::MIN_POSITIVE
            } else {
                p.matches as f64 / p.possible as f64
            };
            0.25 * v.ln()
        })
        .collect();
    let score = brevity_penalty * fsum(&terms).exp();
    Bleu4V2 { precisions, brevity_penalty, score }
}

/// Python's `math.fsum`: the correctly rounded sum (Shewchuk's exact partials), for the
/// handful of finite terms BLEU adds.
fn fsum(values: &[f64]) -> f64 {
    let mut partials: Vec<f64> = Vec::new();
    for &v in values {
        let mut x = v;
        let mut kept = 0;
        for j in 0..partials.len() {
            let mut y = partials[j];
            if x.abs() < y.abs() {
                std::mem::swap(&mut x, &mut y);
            }
            let hi = x + y;
            let lo = y - (hi - x);
            if lo != 0.0 {
                partials[kept] = lo;
                kept += 1;
            }
            x = hi;
        }
        partials.truncate(kept);
        if x != 0.0 {
            partials.push(x);
        }
    }
    // Add the partials from the top, with CPython's half-way correction.
    let mut hi = 0.0;
    let mut n = partials.len();
    if n > 0 {
        n -= 1;
        hi = partials[n];
        let mut lo = 0.0;
        while n > 0 {
            let x = hi;
            n -= 1;
            let y = partials[n];
            hi = x + y;
            let yr = hi - x;
            lo = y - yr;
            if lo != 0.0 {
                break;
            }
        }
        if n > 0 && ((lo < 0.0 && partials[n - 1] < 0.0) || (lo > 0.0 && partials[n - 1] > 0.0)) {
            let y = lo * 2.0;
            let x = hi + y;
            let yr = x - hi;
            if y == yr {
                hi = x;
            }
        }
    }
    hi
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Identical texts of at least four tokens score 1 in both variants.
    #[test]
    fn identical_scores_one() {
        let t = ["a", "b", "c", "d", "e"];
        assert_eq!(bleu4_paper(&t, &t).score, 1.0);
        assert_eq!(bleu4_v2(&t, &t).score, 1.0);
    }

    /// Empty candidate or reference: paper falls back to 0 with BP undefined, v2 gives 0.
    #[test]
    fn empty_inputs() {
        let t = ["a", "b"];
        let e: [&str; 0] = [];
        for (c, r) in [(&e[..], &t[..]), (&t[..], &e[..]), (&e[..], &e[..])] {
            let p = bleu4_paper(c, r);
            assert_eq!((p.score, p.brevity_penalty, p.library_bleu), (0.0, None, None));
            assert_eq!(bleu4_v2(c, r).score, 0.0);
        }
    }

    /// A candidate shorter than 4 tokens has p_4 = 0/0: paper 0, v2 tiny but non-zero.
    #[test]
    fn short_candidate() {
        let c = ["a", "b", "c"];
        let r = ["a", "b", "c", "d"];
        let p = bleu4_paper(&c, &r);
        assert_eq!((p.precisions[3].possible, p.score), (0, 0.0));
        let v = bleu4_v2(&c, &r);
        assert_eq!(v.precisions[3].possible, 1);
        assert!(v.score > 0.0 && v.score < 1e-70);
    }

    /// Clipping: a repeated candidate token matches at most as often as in the reference.
    #[test]
    fn clipping() {
        let p = bleu4_paper(&["the", "the", "the"], &["the", "cat"]);
        assert_eq!((p.precisions[0].matches, p.precisions[0].possible), (1, 3));
    }

    /// BP underflows to 0 for a very long reference: paper returns 0, as UHGEval does.
    #[test]
    fn brevity_penalty_underflow() {
        let c: Vec<u32> = (0..4).collect();
        let r: Vec<u32> = (0..4000).collect();
        let p = bleu4_paper(&c, &r);
        assert_eq!((p.brevity_penalty, p.score), (Some(0.0), 0.0));
        assert_eq!(p.geo_mean, 1.0);
    }

    /// fsum is exactly rounded where naive summation is not.
    #[test]
    fn fsum_exact() {
        assert_eq!(fsum(&[1e16, 1.0, -1e16]), 1.0);
        assert_eq!(fsum(&[0.1; 10]), 1.0);
        assert_eq!(fsum(&[]), 0.0);
    }
}

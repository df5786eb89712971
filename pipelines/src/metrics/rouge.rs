//! ROUGE-L on token lists (spec §1.6), as Google's `rouge_score` 0.1.2 computes it with a
//! custom tokenizer (UHGEval passes jieba: tokenise with [`super::tokenize::jieba_cut`]).
//! The same in \[paper\] (through HF `evaluate`'s `rouge`, one reference) and \[v2\].

use serde::{Deserialize, Serialize};

/// ROUGE-L of one candidate against one reference.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RougeL {
    /// Length of the longest common subsequence of the two token lists.
    pub lcs: usize,
    /// `LCS / len(candidate)`.
    pub precision: f64,
    /// `LCS / len(reference)`.
    pub recall: f64,
    /// `2PR / (P + R)`, 0 when `P + R = 0`: the value UHGEval reports.
    pub f: f64,
}

/// ROUGE-L (spec §1.6): LCS-based precision, recall and F-measure. Either side empty gives
/// all zeros (as `rouge_score` returns); never fails. Time O(len(c)·len(r)), memory
/// O(min) .
pub fn rouge_l<T: Eq>(candidate: &[T], reference: &[T]) -> RougeL {
    if candidate.is_empty() || reference.is_empty() {
        return RougeL { lcs: 0, precision: 0.0, recall: 0.0, f: 0.0 };
    }
    let lcs = lcs_len(candidate, reference);
    let precision = lcs as f64 / candidate.len() as f64;
    let recall = lcs as f64 / reference.len() as f64;
    // rouge_score.scoring.fmeasure, same operation order.
    let f = if precision + recall > 0.0 {
        2.0 * precision * recall / (precision + recall)
    } else {
        0.0
    };
    RougeL { lcs, precision, recall, f }
}

/// Length of the longest common subsequence, with one DP row over the shorter list.
fn lcs_len<T: Eq>(a: &[T], b: &[T]) -> usize {
    let (long, short) = if a.len() >= b.len() { (a, b) } else { (b, a) };
    let mut row = vec![0usize; short.len() + 1];
    for x in long {
        let mut diag = 0; // row[j-1] of the previous row
        for (j, y) in short.iter().enumerate() {
            let up = row[j + 1];
            row[j + 1] = if x == y { diag + 1 } else { up.max(row[j]) };
            diag = up;
        }
    }
    row[short.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Empty sides give zeros, not NaN.
    #[test]
    fn empty_sides() {
        let e: [&str; 0] = [];
        assert_eq!(rouge_l(&e, &["a"]).f, 0.0);
        assert_eq!(rouge_l(&["a"], &e).f, 0.0);
    }

    /// No common token: F is 0.
    #[test]
    fn disjoint() {
        assert_eq!(
            rouge_l(&["a", "b"], &["c"]),
            RougeL { lcs: 0, precision: 0.0, recall: 0.0, f: 0.0 }
        );
    }

    /// LCS is order-sensitive and symmetric in its arguments.
    #[test]
    fn lcs_is_subsequence() {
        assert_eq!(lcs_len(&[1, 2, 3, 4], &[4, 3, 2, 1]), 1);
        assert_eq!(lcs_len(&[1, 3, 5, 7, 9], &[0, 1, 2, 3, 9]), 3);
        assert_eq!(lcs_len(&[0, 1, 2, 3, 9], &[1, 3, 5, 7, 9]), 3);
    }
}

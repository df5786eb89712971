//! SelfCheckGPT's grey-box baselines (Manakul et al. 2023, §5.1) from the token
//! log-probabilities of a completion under a model (issue 29): for sentence i with tokens
//! j, `Avg(−log p)_i = −(1/J) Σ_j ln p_ij` and `Max(−log p)_i = max_j (−ln p_ij)`; the
//! passage score is the **mean over sentences** of the sentence score (the paper's
//! "averaging the sentence-level scores"). Higher = more likely hallucinated; natural log.
//!
//! The log-probabilities are those of the tokens as scored (ChainPoll's probability model,
//! the same ones its pseudo-entropy baseline reads). Sentences are found on the tokens
//! themselves ([`token_sentences`]), with the rule ChainPoll's SelfCheck-NGram uses on text
//! (`chainpoll::sentences`): a sentence ends after `.`, `!` or `?` followed by whitespace
//! (or the end), and at a line break.

use std::ops::Range;

use super::{reject_nan, MetricError};

/// Sentences of a token sequence as ranges of token indices: a sentence ends after a
/// token holding a line break, or after a token whose text ends (trailing whitespace
/// aside) in `.`, `!` or `?` when whitespace follows (the rest of that token, the next
/// token's start, or the end). Sentences without an alphanumeric character are dropped.
pub fn token_sentences<S: AsRef<str>>(tokens: &[S]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, t) in tokens.iter().enumerate() {
        let t = t.as_ref();
        let trimmed = t.trim_end();
        let ws_follows = trimmed.len() < t.len()
            || tokens.get(i + 1).is_none_or(|n| n.as_ref().starts_with(char::is_whitespace));
        if t.contains('\n') || (trimmed.ends_with(['.', '!', '?']) && ws_follows) {
            out.push(start..i + 1);
            start = i + 1;
        }
    }
    out.push(start..tokens.len());
    out.into_iter()
        .filter(|r| tokens[r.clone()].iter().any(|t| t.as_ref().chars().any(char::is_alphanumeric)))
        .collect()
}

/// Passage-level Avg(−log p) and Max(−log p) of a completion.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NegLogprob {
    /// Mean over sentences of the sentence's mean −ln p.
    pub avg: f64,
    /// Mean over sentences of the sentence's largest −ln p.
    pub max: f64,
    /// Sentences the means are over.
    pub sentences: usize,
}

/// Avg(−log p) and Max(−log p) of a completion from its tokens' texts and natural-log
/// probabilities. Errors: `LengthMismatch`; `Empty` for no token or no sentence (no
/// alphanumeric token); `NotANumber`; `OutOfRange` for a log-probability above 0.
pub fn neg_logprob<S: AsRef<str>>(
    tokens: &[S],
    logprobs: &[f64],
) -> Result<NegLogprob, MetricError> {
    if tokens.len() != logprobs.len() {
        return Err(MetricError::LengthMismatch {
            what: "tokens and log-probabilities",
            left: tokens.len(),
            right: logprobs.len(),
        });
    }
    if tokens.is_empty() {
        return Err(MetricError::Empty { what: "completion tokens" });
    }
    reject_nan("token log-probabilities", logprobs)?;
    if let Some(&value) = logprobs.iter().find(|&&lp| lp > 0.0) {
        return Err(MetricError::OutOfRange {
            what: "token log-probability",
            value,
            expected: "at most 0",
        });
    }
    let sentences = token_sentences(tokens);
    if sentences.is_empty() {
        return Err(MetricError::Empty { what: "sentences (no alphanumeric token)" });
    }
    let (mut avg, mut max) = (0.0, 0.0);
    for r in &sentences {
        let nlp = &logprobs[r.clone()];
        avg += -nlp.iter().sum::<f64>() / nlp.len() as f64;
        max += nlp.iter().map(|lp| -lp).fold(f64::NEG_INFINITY, f64::max);
    }
    let k = sentences.len() as f64;
    Ok(NegLogprob { avg: avg / k, max: max / k, sentences: sentences.len() })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sentences end at ". " and at line breaks, not inside "3.5"; punctuation-only
    /// pieces are dropped.
    #[test]
    fn sentences_of_tokens() {
        let t = ["The", " sky", " is", " 3", ".5", " m", ".", " It", " rains", "!\n", "\n", "Ok"];
        assert_eq!(token_sentences(&t), [0..7, 7..10, 11..12]);
        assert_eq!(token_sentences(&["a.b", ".", "c"]), std::iter::once(0..3).collect::<Vec<_>>());
        assert!(token_sentences::<&str>(&[]).is_empty());
    }

    /// The worked example: two sentences, p = [0.5, 0.25] and [0.1]: Avg = mean(ln 2·1.5,
    /// ln 10), Max = mean(ln 4, ln 10).
    #[test]
    fn avg_and_max() {
        let t = ["A", " b.", " C."];
        let lp = [0.5f64.ln(), 0.25f64.ln(), 0.1f64.ln()];
        let r = neg_logprob(&t, &lp).unwrap();
        let want_avg = ((2f64.ln() + 4f64.ln()) / 2.0 + 10f64.ln()) / 2.0;
        let want_max = (4f64.ln() + 10f64.ln()) / 2.0;
        assert!((r.avg - want_avg).abs() < 1e-12 && (r.max - want_max).abs() < 1e-12, "{r:?}");
        assert_eq!(r.sentences, 2);
        assert!(neg_logprob(&t, &lp[..2]).is_err());
        assert!(neg_logprob::<&str>(&[], &[]).is_err());
        assert!(neg_logprob(&["."], &[-0.1]).is_err());
        assert!(neg_logprob(&["a"], &[0.1]).is_err());
        assert!(neg_logprob(&["a"], &[f64::NAN]).is_err());
    }
}

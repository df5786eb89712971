//! Pseudo-entropy (ChainPoll App. A.4, as corrected in spec §3.3).
//!
//! At each generated token the API gives the probabilities of the top alternatives
//! (M = 5 values, 6 when the sampled token is not among them). With `S = Σ p_i` and
//! `p̃_i = p_i / S`:
//! - `PPL5 = −Σ p̃_i ln p̃_i` (Shannon entropy of the renormalised top-M),
//! - `PseudoEntropy = −Σ p̃_i ln p_i = PPL5 − ln S ≥ PPL5`.
//!
//! Natural logarithm. Little top-M mass (small S) gives a **higher** value (the seed's
//! "lower" is a typo). How token values make a completion score is not stated in the
//! paper; [`completion_pseudo_entropy`] takes the mean over tokens, as the spec says to.

use serde::{Deserialize, Serialize};

use super::{reject_nan, MetricError};

/// The values of one token position.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenPseudoEntropy {
    /// `S`, the probability mass of the top-M alternatives.
    pub sum_top: f64,
    /// `PPL5`, the entropy of the renormalised top-M.
    pub ppl5: f64,
    /// `PseudoEntropy = PPL5 − ln S`.
    pub pseudo_entropy: f64,
}

/// Pseudo-entropy of one token from its top-M **probabilities** (spec §3.3). A zero
/// probability contributes 0 to both sums (the limit of `p ln p`). `S` is not required to
/// be at most 1: rounded API values can exceed it slightly.
/// Errors: `Empty`; `NotANumber`; `OutOfRange` for a value outside [0, 1]; `Undefined`
/// when every probability is 0.
pub fn token_pseudo_entropy(top_probs: &[f64]) -> Result<TokenPseudoEntropy, MetricError> {
    if top_probs.is_empty() {
        return Err(MetricError::Empty { what: "top-M probabilities" });
    }
    reject_nan("top-M probabilities", top_probs)?;
    if let Some(&value) = top_probs.iter().find(|p| !(0.0..=1.0).contains(*p)) {
        return Err(MetricError::OutOfRange {
            what: "top-M probability",
            value,
            expected: "a probability in [0, 1]",
        });
    }
    let sum_top: f64 = top_probs.iter().sum();
    if sum_top <= 0.0 {
        return Err(MetricError::Undefined {
            what: "pseudo-entropy",
            reason: "the top-M probabilities sum to 0",
        });
    }
    let mut ppl5 = 0.0;
    let mut pseudo_entropy = 0.0;
    for &p in top_probs.iter().filter(|&&p| p > 0.0) {
        let q = p / sum_top;
        ppl5 -= q * q.ln();
        pseudo_entropy -= q * p.ln();
    }
    Ok(TokenPseudoEntropy { sum_top, ppl5, pseudo_entropy })
}

/// Pseudo-entropy of one token from its top-M **log-probabilities** (natural log, as the
/// OpenAI API returns them): `p_i = exp(lp_i)`, then [`token_pseudo_entropy`]. `−∞` is a
/// zero probability. Errors as there, plus `OutOfRange` for a log-probability above 0.
pub fn token_pseudo_entropy_from_logprobs(
    top_logprobs: &[f64],
) -> Result<TokenPseudoEntropy, MetricError> {
    reject_nan("top-M log-probabilities", top_logprobs)?;
    if let Some(&value) = top_logprobs.iter().find(|&&lp| lp > 0.0) {
        return Err(MetricError::OutOfRange {
            what: "top-M log-probability",
            value,
            expected: "at most 0",
        });
    }
    let probs: Vec<f64> = top_logprobs.iter().map(|lp| lp.exp()).collect();
    token_pseudo_entropy(&probs)
}

/// Completion-level pseudo-entropy: the **mean over token positions** of the per-token
/// pseudo-entropy, each position given by its top-M log-probabilities (spec §3.3: the
/// paper does not state the aggregation; the mean is this implementation's choice).
/// Errors: `Empty` for no token, or the first error of a position.
pub fn completion_pseudo_entropy<T: AsRef<[f64]>>(
    tokens_top_logprobs: &[T],
) -> Result<f64, MetricError> {
    if tokens_top_logprobs.is_empty() {
        return Err(MetricError::Empty { what: "token positions" });
    }
    let mut sum = 0.0;
    for position in tokens_top_logprobs {
        sum += token_pseudo_entropy_from_logprobs(position.as_ref())?.pseudo_entropy;
    }
    Ok(sum / tokens_top_logprobs.len() as f64)
}

/// The top-M log-probabilities of one position as an API returns them (spec §3.3): the
/// first `m` alternatives, plus the chosen token's own log-probability when it is not among
/// them (M + 1 values then). Alternatives are matched to the token by their text.
pub fn position_top_logprobs(token: &halyard_proto::TokenLogprob, m: usize) -> Vec<f64> {
    let top = &token.top[..token.top.len().min(m)];
    let mut out: Vec<f64> = top.iter().map(|t| t.logprob).collect();
    if !top.iter().any(|t| t.token == token.token) {
        out.push(token.logprob);
    }
    out
}

/// The per-token pseudo-entropy of a completion's tokens with top-`m` alternatives
/// ([`position_top_logprobs`], then [`token_pseudo_entropy_from_logprobs`]), from which a
/// completion score is taken: the **max** over tokens is ChainPoll's "Max pseudo-entropy"
/// baseline (seed Tables 1, 3, 4), the mean is [`pseudo_entropy_of_tokens`].
/// Errors: `Empty` for no token; `Undefined` when a position has no alternative at all
/// (the backend was not asked for them), or the first error of a position.
pub fn token_pseudo_entropies(
    tokens: &[halyard_proto::TokenLogprob],
    m: usize,
) -> Result<Vec<f64>, MetricError> {
    if tokens.is_empty() {
        return Err(MetricError::Empty { what: "token positions" });
    }
    if tokens.iter().any(|t| t.top.is_empty()) {
        return Err(MetricError::Undefined {
            what: "pseudo-entropy",
            reason: "a token position has no top alternatives",
        });
    }
    tokens
        .iter()
        .map(|t| token_pseudo_entropy_from_logprobs(&position_top_logprobs(t, m)))
        .map(|r| r.map(|t| t.pseudo_entropy))
        .collect()
}

/// Completion-level pseudo-entropy of a completion's token log-probabilities with top-`m`
/// alternatives ([`position_top_logprobs`], then [`completion_pseudo_entropy`]).
/// Errors: `Empty` for no token; `Undefined` when a position has no alternative at all
/// (the backend was not asked for them).
pub fn pseudo_entropy_of_tokens(
    tokens: &[halyard_proto::TokenLogprob],
    m: usize,
) -> Result<f64, MetricError> {
    if tokens.iter().any(|t| t.top.is_empty()) {
        return Err(MetricError::Undefined {
            what: "pseudo-entropy",
            reason: "a token position has no top alternatives",
        });
    }
    let positions: Vec<Vec<f64>> = tokens.iter().map(|t| position_top_logprobs(t, m)).collect();
    completion_pseudo_entropy(&positions)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A single certain token has zero entropy and zero pseudo-entropy.
    #[test]
    fn certain_token() {
        let t = token_pseudo_entropy(&[1.0]).unwrap();
        assert_eq!((t.ppl5, t.pseudo_entropy), (0.0, 0.0));
    }

    /// Zero probabilities are skipped, not NaN; all-zero, NaN, >1 and empty are errors.
    #[test]
    fn probability_edges() {
        let t = token_pseudo_entropy(&[0.5, 0.0]).unwrap();
        assert!((t.pseudo_entropy - 2f64.ln()).abs() < 1e-15 && t.ppl5 == 0.0);
        assert!(matches!(token_pseudo_entropy(&[0.0, 0.0]), Err(MetricError::Undefined { .. })));
        assert!(matches!(token_pseudo_entropy(&[f64::NAN]), Err(MetricError::NotANumber { .. })));
        assert!(matches!(token_pseudo_entropy(&[1.5]), Err(MetricError::OutOfRange { .. })));
        assert!(matches!(token_pseudo_entropy(&[]), Err(MetricError::Empty { .. })));
    }

    /// Log-probabilities give the same values as their probabilities; -inf is p = 0; > 0 is rejected.
    #[test]
    fn logprob_input() {
        let lp = [0.5f64.ln(), 0.3f64.ln(), f64::NEG_INFINITY];
        let a = token_pseudo_entropy_from_logprobs(&lp).unwrap();
        let b = token_pseudo_entropy(&[0.5, 0.3, 0.0]).unwrap();
        assert!((a.pseudo_entropy - b.pseudo_entropy).abs() < 1e-15);
        assert!(token_pseudo_entropy_from_logprobs(&[0.1]).is_err());
    }

    /// The completion score is the mean of the token values.
    #[test]
    fn completion_mean() {
        let toks = vec![vec![0.0], vec![0.5f64.ln(), 0.5f64.ln()]];
        assert!((completion_pseudo_entropy(&toks).unwrap() - 2f64.ln() / 2.0).abs() < 1e-15);
        assert!(completion_pseudo_entropy::<Vec<f64>>(&[]).is_err());
    }

    /// M = 5 alternatives, plus the chosen token when it is not among them (spec §3.3).
    #[test]
    fn positions_from_api_tokens() {
        use halyard_proto::{TokenLogprob, TopLogprob};
        let alt = |t: &str, p: f64| TopLogprob { token: t.into(), logprob: p.ln() };
        let top: Vec<TopLogprob> =
            [("a", 0.5), ("b", 0.3), ("c", 0.1), ("d", 0.05), ("e", 0.03), ("f", 0.01)]
                .iter()
                .map(|(t, p)| alt(t, *p))
                .collect();
        let inside = TokenLogprob { token: "b".into(), logprob: 0.3f64.ln(), top: top.clone() };
        assert_eq!(position_top_logprobs(&inside, 5).len(), 5);
        let outside = TokenLogprob { token: "z".into(), logprob: 0.001f64.ln(), top };
        let v = position_top_logprobs(&outside, 5);
        assert_eq!((v.len(), v[5]), (6, 0.001f64.ln()));
        let pe = pseudo_entropy_of_tokens(std::slice::from_ref(&inside), 5).unwrap();
        assert!((pe - 1.217354379).abs() < 1e-9, "{pe}");
        let bare = TokenLogprob { token: "x".into(), logprob: -0.1, top: vec![] };
        assert!(pseudo_entropy_of_tokens(std::slice::from_ref(&bare), 5).is_err());
        assert!(pseudo_entropy_of_tokens(&[], 5).is_err());
        let per = token_pseudo_entropies(&[inside.clone(), outside], 5).unwrap();
        assert_eq!(per.len(), 2);
        assert!((per[0] - pe).abs() < 1e-15);
        assert!(token_pseudo_entropies(&[inside, bare], 5).is_err());
        assert!(token_pseudo_entropies(&[], 5).is_err());
    }
}

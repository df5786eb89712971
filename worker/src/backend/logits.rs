//! Token log-probabilities from a model's raw logits (issue 16), for the `gguf` backend.
//!
//! llama.cpp gives the logits of every position it was asked for; the log-probability of a
//! token is the log-softmax of those logits at its index, `l_t − ln Σ_v exp(l_v)`, taken
//! before any temperature or truncation (top-k, top-p) of the sampler: the model's own
//! distribution, as the OpenAI API reports it. [`token_logprob`] is pure and tested
//! without a model; [`logprob_of`] and [`sampler_for`] wrap it and the sampler chain for
//! the engine thread.

use halyard_proto::{Sampling, TokenLogprob, TopLogprob};
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;

/// The natural-log probability of `token` under `logits`, and the `top` most likely
/// tokens with theirs (descending; ties by token index). `None` when `token` is out of
/// range or the logits hold no finite value.
pub fn token_logprob(logits: &[f32], token: usize, top: usize) -> Option<(f64, Vec<(usize, f64)>)> {
    let chosen = *logits.get(token)?;
    let max = logits.iter().copied().filter(|l| l.is_finite()).fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return None;
    }
    let max = f64::from(max);
    let sum: f64 = logits.iter().map(|&l| (f64::from(l) - max).exp()).sum();
    let log_z = max + sum.ln();
    let mut best: Vec<(usize, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (i, &l) in logits.iter().enumerate() {
            if best.len() < top || best.last().is_some_and(|&(_, b)| l > b) {
                let at = best.partition_point(|&(_, b)| b >= l);
                best.insert(at, (i, l));
                best.truncate(top);
            }
        }
    }
    let alternatives = best.into_iter().map(|(i, l)| (i, f64::from(l) - log_z)).collect();
    Some((f64::from(chosen) - log_z, alternatives))
}

/// The sampler of a request: greedy at temperature 0, else temperature, then top-k and
/// top-p when set, then a seeded draw.
pub(super) fn sampler_for(sampling: &Sampling, seed: u32) -> LlamaSampler {
    if sampling.temperature <= 0.0 {
        return LlamaSampler::greedy();
    }
    let mut chain = vec![LlamaSampler::temp(sampling.temperature)];
    if let Some(k) = sampling.top_k {
        chain.push(LlamaSampler::top_k(k.min(i32::MAX as u32) as i32));
    }
    if let Some(p) = sampling.top_p {
        chain.push(LlamaSampler::top_p(p, 1));
    }
    chain.push(LlamaSampler::dist(seed));
    LlamaSampler::chain_simple(chain)
}

/// A token's log-probability entry from the logits at its position.
pub(super) fn logprob_of(
    vocab: &llama_cpp_2::vocab::LlamaVocab<'_>,
    logits: &[f32],
    token: LlamaToken,
    top: u8,
) -> Option<TokenLogprob> {
    let piece =
        |t: LlamaToken| String::from_utf8_lossy(&vocab.token_to_piece(t, false, None)).into_owned();
    let (logprob, alternatives) = token_logprob(logits, token.0 as usize, top as usize)?;
    let top = alternatives
        .into_iter()
        .map(|(t, lp)| TopLogprob { token: piece(LlamaToken::new(t as i32)), logprob: lp })
        .collect();
    Some(TokenLogprob { token: piece(token), logprob, top })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Log-softmax matches the definition; alternatives are the most likely, in order.
    #[test]
    fn log_softmax_and_top() {
        let logits = [1.0f32, 3.0, 2.0, 3.0, -1.0];
        let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        let (lp, top) = token_logprob(&logits, 2, 3).unwrap();
        assert!((lp - (2.0 - z.ln())).abs() < 1e-12);
        let idx: Vec<usize> = top.iter().map(|t| t.0).collect();
        assert_eq!(idx, [1, 3, 2], "descending, ties by index");
        assert!((top[0].1 - (3.0 - z.ln())).abs() < 1e-12);
        let total: f64 = logits
            .iter()
            .enumerate()
            .map(|(i, _)| token_logprob(&logits, i, 0).unwrap().0.exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-12, "probabilities sum to 1");
        assert!(token_logprob(&logits, 9, 1).is_none());
        assert!(token_logprob(&[f32::NEG_INFINITY], 0, 1).is_none());
        assert!(token_logprob(&logits, 0, 0).unwrap().1.is_empty());
    }
}

//! SelfCheck-NGram, unigram (spec §3.4; `potsawee/selfcheckgpt` `modeling_ngram.py`), the
//! baseline of ChainPoll's Table 1 and AutoHall's SelfCk-1gm.
//!
//! Scores are negative log-probabilities (natural log) under a unigram model trained on
//! the response **and** the sampled passages, with add-k smoothing at k = 0 (SelfCheckGPT's
//! `predict()` default). Higher = more likely hallucinated; unbounded.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::tokenize::english_words;
use super::MetricError;

/// A unigram count model (spec §3.4 steps 1–2).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnigramModel {
    counts: HashMap<String, u64>,
    total: u64,
}

impl UnigramModel {
    /// Counts every token of every training text (the passage and each sample, already
    /// tokenised and, as in SelfCheckGPT, lower-cased). Sentence boundaries do not matter
    /// for unigrams (no `<s>` padding at n = 1).
    pub fn train<T, S>(texts: &[T]) -> UnigramModel
    where
        T: AsRef<[S]>,
        S: AsRef<str>,
    {
        let mut m = UnigramModel::default();
        for text in texts {
            for tok in text.as_ref() {
                *m.counts.entry(tok.as_ref().to_owned()).or_insert(0) += 1;
                m.total += 1;
            }
        }
        m
    }

    /// `N_tok`, the number of training tokens.
    pub fn total_tokens(&self) -> u64 {
        self.total
    }

    /// `|V|` as SelfCheckGPT counts it: distinct training tokens plus the `<unk>` entry.
    pub fn vocabulary_size(&self) -> usize {
        self.counts.len() + usize::from(!self.counts.contains_key("<unk>"))
    }

    /// `−ln P(token)` with `P = count / N_tok` (k = 0). An unseen token maps to `<unk>`,
    /// whose count is 0, so the value is `+∞`; so is every token of an empty model.
    pub fn neg_logprob(&self, token: &str) -> f64 {
        let count = self.counts.get(token).copied().unwrap_or(0);
        if count == 0 || self.total == 0 {
            return f64::INFINITY;
        }
        -((count as f64 / self.total as f64).ln())
    }
}

/// Sentence- and passage-level SelfCheck-NGram scores (spec §3.4 steps 3–4).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SelfCheckNgram {
    /// `avg_neg_logprob_i = −(1/J) Σ_j ln P(t_ij)` per sentence (paper: Avg(−log p̃)).
    pub sent_avg_neg_logprob: Vec<f64>,
    /// `max_neg_logprob_i = max_j −ln P(t_ij)` per sentence (paper: Max(−log p̃)).
    pub sent_max_neg_logprob: Vec<f64>,
    /// Passage level as SelfCheckGPT returns it: the mean of `−ln P` over **all tokens of
    /// all sentences** (token-weighted). AutoHall's SelfCk-1gm thresholds this value.
    pub doc_avg_neg_logprob: f64,
    /// Passage level: the mean over sentences of `max_neg_logprob_i`.
    pub doc_avg_max_neg_logprob: f64,
    /// `N_tok` of the model.
    pub training_tokens: u64,
}

impl SelfCheckNgram {
    /// The mean of the sentence averages, the "sentence scores averaged" passage score of
    /// the SelfCheckGPT paper / ChainPoll; differs from [`Self::doc_avg_neg_logprob`]
    /// when sentences have unequal lengths (spec §3.4 step 4). NaN only for a value built
    /// by hand with no sentence ([`selfcheck_unigram`] never returns one).
    pub fn mean_of_sentence_avg(&self) -> f64 {
        self.sent_avg_neg_logprob.iter().sum::<f64>() / self.sent_avg_neg_logprob.len() as f64
    }
}

/// SelfCheck-NGram (n = 1) for a response given as tokenised sentences, with a model
/// trained on `training` = the response passage plus every sampled passage, each
/// tokenised (spec §3.4). Tokens are compared exactly: normalise case beforehand.
///
/// Errors: `Empty` if there is no sentence or a sentence has no token (SelfCheckGPT would
/// produce NaN / raise there). An unseen token gives `+∞` scores (spec §3.4 step 2),
/// which cannot happen when the sentences are the passage's own tokens.
pub fn selfcheck_unigram<T, S, U, R>(
    sentences: &[T],
    training: &[U],
) -> Result<SelfCheckNgram, MetricError>
where
    T: AsRef<[S]>,
    S: AsRef<str>,
    U: AsRef<[R]>,
    R: AsRef<str>,
{
    if sentences.is_empty() {
        return Err(MetricError::Empty { what: "sentences" });
    }
    let model = UnigramModel::train(training);
    let mut sent_avg = Vec::with_capacity(sentences.len());
    let mut sent_max = Vec::with_capacity(sentences.len());
    let mut all_sum = 0.0_f64;
    let mut all_count = 0usize;
    for sentence in sentences {
        let scores: Vec<f64> =
            sentence.as_ref().iter().map(|t| model.neg_logprob(t.as_ref())).collect();
        if scores.is_empty() {
            return Err(MetricError::Empty { what: "a sentence's tokens" });
        }
        let sum: f64 = scores.iter().sum();
        sent_avg.push(sum / scores.len() as f64);
        sent_max.push(scores.iter().copied().fold(f64::NEG_INFINITY, f64::max));
        all_sum += sum;
        all_count += scores.len();
    }
    let doc_avg_max = sent_max.iter().sum::<f64>() / sent_max.len() as f64;
    Ok(SelfCheckNgram {
        sent_avg_neg_logprob: sent_avg,
        sent_max_neg_logprob: sent_max,
        doc_avg_neg_logprob: all_sum / all_count as f64,
        doc_avg_max_neg_logprob: doc_avg_max,
        training_tokens: model.total_tokens(),
    })
}

/// [`selfcheck_unigram`] on raw English text: every text is lower-cased (Unicode
/// lower-casing, as Python's `str.lower`) and tokenised with [`english_words`] (spec §3.4:
/// equivalent to spaCy on plain sentences; see that function for where they differ).
/// `sentences` are the response's sentences, `passage` the whole response, `samples` the
/// sampled passages.
pub fn selfcheck_unigram_text(
    sentences: &[&str],
    passage: &str,
    samples: &[&str],
) -> Result<SelfCheckNgram, MetricError> {
    let lower = |s: &str| s.to_lowercase();
    let sentence_texts: Vec<String> = sentences.iter().map(|s| lower(s)).collect();
    let training_texts: Vec<String> =
        std::iter::once(passage).chain(samples.iter().copied()).map(lower).collect();
    let sentence_tokens: Vec<Vec<&str>> = sentence_texts.iter().map(|s| english_words(s)).collect();
    let training_tokens: Vec<Vec<&str>> = training_texts.iter().map(|s| english_words(s)).collect();
    selfcheck_unigram(&sentence_tokens, &training_tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No sentence, or an empty sentence, is an error rather than NaN.
    #[test]
    fn empty_inputs_rejected() {
        let training = vec![vec!["a"]];
        assert!(selfcheck_unigram::<Vec<&str>, &str, _, _>(&[], &training).is_err());
        assert!(selfcheck_unigram(&[Vec::<&str>::new()], &training).is_err());
    }

    /// A token absent from training scores +∞ (k = 0), and so do the passage means.
    #[test]
    fn unseen_token_is_infinite() {
        let r = selfcheck_unigram(&[vec!["a", "z"]], &[vec!["a", "b"]]).unwrap();
        assert_eq!(r.sent_max_neg_logprob, [f64::INFINITY]);
        assert_eq!(r.doc_avg_neg_logprob, f64::INFINITY);
        assert_eq!(UnigramModel::default().neg_logprob("a"), f64::INFINITY);
    }

    /// |V| counts the `<unk>` entry once, and N_tok counts every token.
    #[test]
    fn vocabulary_counts_unk() {
        let m = UnigramModel::train(&[vec!["a", "b", "a"]]);
        assert_eq!((m.vocabulary_size(), m.total_tokens()), (3, 3));
    }

    /// Text input is lower-cased before counting, so "The" and "the" are one token.
    #[test]
    fn text_is_lowercased() {
        let r = selfcheck_unigram_text(&["The the"], "The the", &[]).unwrap();
        assert!((r.sent_avg_neg_logprob[0] - 0.0).abs() < 1e-15);
    }
}

//! # Metrics: the numbers the benchmarks report, as pure functions
//!
//! This module implements `shared/specs/metrics.md` (UHGEval, AutoHall, ChainPoll/RealHall
//! with the SelfCheck-NGram and pseudo-entropy baselines, and the Hallucination
//! Vulnerability Index). Section numbers in the doc comments (§1.6, §3.2, …) are that
//! spec's; its worked examples (`shared/golden/metric_vectors.json`) are checked, every
//! one, by `pipelines/tests/metric_vectors.rs`.
//!
//! Every function is pure: typed inputs, typed outputs, no IO, no mutable global state
//! (the jieba dictionary is compiled into the binary and loaded once, lazily). Nothing
//! panics on input: empty inputs, NaN, mismatched lengths and out-of-range values give a
//! [`MetricError`], or a value that the function's doc comment states.
//!
//! ## Layout
//! - [`classification`]: confusion counts with hallucination as the positive class,
//!   accuracy / precision / recall / F1, hallucination rate (§2.3).
//! - [`autohall`]: AutoHall's claim-classification parse, hallucination label, pairwise
//!   conflict parse, the "any conflict" detection rule, the per-K ablation and the
//!   SelfCk-1gm threshold (§2.1–§2.3).
//! - [`auroc`]: AUROC with ties counted ½, the RealHall aggregate and "quality vs ours"
//!   (§3.2).
//! - [`chainpoll`]: the ChainPoll score and the two verdict parsers (§3.1).
//! - [`selfcheck`]: the SelfCheck-NGram unigram baseline, sentence and passage level
//!   (§3.4).
//! - [`pseudo_entropy`]: PPL5 and pseudo-entropy from top-M probabilities or
//!   log-probabilities (§3.3, corrected), per token and over a completion (max, mean).
//! - [`neg_logprob`]: SelfCheckGPT's grey-box Avg(−log p) and Max(−log p) of a completion
//!   from its token log-probabilities (issue 29).
//! - [`tokenize`]: jieba segmentation (`list(jieba.cut(text))`) and the English word
//!   tokeniser used for SelfCheck.
//! - [`bleu`]: BLEU-4, `paper` (geometric mean without brevity penalty) and `v2` (nltk
//!   `sentence_bleu`) (§1.6, §6.1).
//! - [`rouge`]: ROUGE-L F-measure on token lists (§1.6).
//! - [`kwprec`]: kwPrec and the keyword-extraction response parser (§1.6).
//! - [`hvi`]: the Hallucination Vulnerability Index (§4.2).
//! - [`interval`]: the 95% interval of every figure (Wilson for proportions, seeded
//!   bootstrap over items for means and F1, DeLong for AUROC) with its method and n.
//! - [`paired`]: paired comparisons of two models on shared items (paired bootstrap,
//!   McNemar's exact test) for the leaderboard.
//! - [`uhgeval`]: UHGEval's answer parsers, keyword balancing, item and overall
//!   accuracies, `#valid`, selective option order, generative item metrics and the
//!   runner's block/batch arithmetic (§1.2–§1.8).
//!
//! ## Variants
//! Where a paper and its code disagree the spec marks the behaviour that produced the
//! paper's numbers **\[paper\]** and the later code **\[v2\]**. Both are offered where the
//! spec gives both (BLEU-4, the UHGEval parsers and validity rules), named `paper` and
//! `v2`; `paper` is the one to report, `v2` exists for comparison with v2 logs.

use thiserror::Error;

pub mod agreement;
pub mod auroc;
pub mod autohall;
pub mod bleu;
pub mod chainpoll;
pub mod classification;
pub mod hvi;
pub mod interval;
pub mod kwprec;
pub mod mace;
pub mod neg_logprob;
pub mod paired;
pub mod pseudo_entropy;
pub mod rouge;
pub mod selfcheck;
pub mod tokenize;
pub mod uhgeval;

mod pystr;

/// Why a metric could not be computed from its input.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum MetricError {
    /// An input that must hold at least one element holds none.
    #[error("{what} is empty")]
    Empty { what: &'static str },
    /// Two inputs that must be parallel have different lengths.
    #[error("{what}: lengths differ ({left} vs {right})")]
    LengthMismatch { what: &'static str, left: usize, right: usize },
    /// A number is NaN.
    #[error("{what}: value at index {index} is NaN")]
    NotANumber { what: &'static str, index: usize },
    /// A number lies outside its domain.
    #[error("{what} = {value} is out of range (expected {expected})")]
    OutOfRange { what: &'static str, value: f64, expected: &'static str },
    /// AUROC needs at least one positive and one negative label.
    #[error("AUROC needs both classes: {positives} positive and {negatives} negative labels")]
    SingleClass { positives: usize, negatives: usize },
    /// The value is 0/0 or otherwise has no definition for this input.
    #[error("{what} is undefined: {reason}")]
    Undefined { what: &'static str, reason: &'static str },
    /// A record holds fewer samples than asked for.
    #[error("{what} #{index} has {got} samples, {needed} needed")]
    TooFewSamples { what: &'static str, index: usize, needed: usize, got: usize },
    /// A string does not have the required shape.
    #[error("{what}: malformed input {input:?}: {reason}")]
    Malformed { what: &'static str, input: String, reason: &'static str },
}

/// `Err(NotANumber)` at the first NaN of `values`.
pub(crate) fn reject_nan(what: &'static str, values: &[f64]) -> Result<(), MetricError> {
    match values.iter().position(|v| v.is_nan()) {
        Some(index) => Err(MetricError::NotANumber { what, index }),
        None => Ok(()),
    }
}

/// The arithmetic mean, summed left to right as Python's `sum(xs) / len(xs)` does;
/// `Empty` for no values, `NotANumber` at a NaN.
pub(crate) fn mean(what: &'static str, values: &[f64]) -> Result<f64, MetricError> {
    if values.is_empty() {
        return Err(MetricError::Empty { what });
    }
    reject_nan(what, values)?;
    Ok(values.iter().sum::<f64>() / values.len() as f64)
}

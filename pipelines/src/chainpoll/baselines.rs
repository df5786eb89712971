//! ChainPoll's baselines per item (spec `metrics.md` §3.3, §3.4): SelfCheck-NGram
//! (unigram) on sampled answers, and, from a "probability model"'s token
//! log-probabilities of the completion, pseudo-entropy (max and mean over tokens) and
//! SelfCheckGPT's Avg(−log p) and Max(−log p) (issue 29).
//!
//! - `sample` (with a `sampler`): S answers of the sampler to the item's prompt (sample
//!   index 1..=S). Failed samples are left out and counted; an item whose samples **all**
//!   failed is unscored (issue 16: scoring the completion alone would rank it on nothing
//!   but its own word counts).
//! - `probability` (with a `probability` model): one scoring job: the item's prompt as the
//!   user message and its completion as the assistant message, asking for the completion's
//!   token log-probabilities with the top 5 alternatives (teacher forcing, as ChainPoll's
//!   text-curie-001 scored the gpt-3.5-turbo completions). From the one job, four scores
//!   ([`LogprobScores`]): the **max** over tokens of the per-token pseudo-entropy (the seed
//!   paper's "Max pseudo-entropy", Tables 1, 3, 4), its **mean** over tokens (what Halyard
//!   reported as "pseudo-entropy" before issue 29), and SelfCheckGPT's Avg(−log p) and
//!   Max(−log p) ([`crate::metrics::neg_logprob`]). Only backends that can score a given
//!   text can serve:
//!   `gguf` (and `replay` of its recordings); for any other the report says why, per model,
//!   and no job is planned.

use halyard_proto::{ChatMessage, LogprobsRequest};
use serde::{Deserialize, Serialize};

use super::dataset::Item;
use super::plan::{sentences, PIPELINE, STAGE_VERSION};
use crate::common::{JobOutcome, JobRequest, ModelSpec, ResultLookup};
use crate::metrics::neg_logprob::neg_logprob;
use crate::metrics::pseudo_entropy::token_pseudo_entropies;
use crate::metrics::selfcheck::selfcheck_unigram_text;

/// Alternatives per position asked of the probability model (the paper's top-5).
pub const TOP_ALTERNATIVES: u8 = 5;

/// SelfCheck-NGram (unigram) scores of an item's completion (spec §3.4, passage level).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SelfCheckLabel {
    /// Samples used (failed sample jobs are left out).
    pub samples: u32,
    /// Sample jobs that failed.
    #[serde(default)]
    pub failed_samples: u32,
    /// Token-weighted passage `avg_neg_logprob` (Avg(−log p)).
    pub avg: Option<f64>,
    /// Passage `avg_max_neg_logprob`: mean over sentences of Max(−log p).
    pub max: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The scores of an item's completion from its token log-probabilities under the
/// probability model (issue 29). A score is `None` when the job gave nothing to compute it
/// from (`error` says why), or, for pseudo-entropy, when the positions lack their top
/// alternatives (`pseudo_entropy_error`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LogprobScores {
    /// Tokens scored.
    pub tokens: u32,
    /// Max over the completion's tokens of the per-token pseudo-entropy: the seed paper's
    /// "Max pseudo-entropy".
    #[serde(default)]
    pub pseudo_entropy_max: Option<f64>,
    /// Mean over the completion's tokens of the per-token pseudo-entropy (stored as
    /// `score` before issue 29).
    #[serde(default, alias = "score")]
    pub pseudo_entropy_mean: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pseudo_entropy_error: Option<String>,
    /// SelfCheckGPT's Avg(−log p): mean over sentences of the mean −ln p of their tokens.
    #[serde(default)]
    pub avg_neg_logprob: Option<f64>,
    /// SelfCheckGPT's Max(−log p): mean over sentences of the largest −ln p of their tokens.
    #[serde(default)]
    pub max_neg_logprob: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub neg_logprob_error: Option<String>,
    /// Why there is no score at all: [`JOB_FAILED`] or [`NO_LOGPROBS`], then the details.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The start of [`LogprobScores::error`] when the probability job failed.
pub const JOB_FAILED: &str = "probability job failed";
/// The start of [`LogprobScores::error`] when the job returned no log-probabilities.
pub const NO_LOGPROBS: &str = "no token log-probabilities returned";

/// Whether `model` can score a given completion (`Err`: why not, for the report).
pub fn probability_support(model: &ModelSpec) -> Result<(), String> {
    match model.model_ref.backend.as_str() {
        "gguf" | "replay" => Ok(()),
        "openai" => Err(format!(
            "probability model `{}` (backend openai): the chat completions API returns token \
             log-probabilities only of text it generates, not of a given completion",
            model.name
        )),
        other => Err(format!(
            "probability model `{}` (backend {other}) gives no token log-probabilities",
            model.name
        )),
    }
}

/// The `sample` job `index` (1..=S) of an item.
pub fn sample_request(sampler: &ModelSpec, item: &Item, index: u32) -> JobRequest {
    let mut spec = sampler.clone();
    spec.seed = spec.seed.map(|s| s.wrapping_add(index as u64));
    spec.request(
        PIPELINE,
        "sample",
        STAGE_VERSION,
        vec![ChatMessage::user(item.prompt.clone())],
        index,
    )
}

/// The `probability` (scoring) job of an item: deterministic, no generation.
pub fn probability_request(model: &ModelSpec, item: &Item) -> JobRequest {
    let spec = ModelSpec { temperature: 0.0, max_tokens: None, ..model.clone() };
    let messages = vec![
        ChatMessage::user(item.prompt.clone()),
        ChatMessage::assistant(item.completion.clone()),
    ];
    let mut req = spec.request(PIPELINE, "probability", STAGE_VERSION, messages, 0);
    req.key.sampling.logprobs = Some(LogprobsRequest { top: TOP_ALTERNATIVES, score_last: true });
    req
}

/// The SelfCheck label of an item, or the sample jobs still needed (pushed on `waiting`).
pub fn selfcheck(
    sampler: &ModelSpec,
    s: u32,
    item: &Item,
    results: &dyn ResultLookup,
    waiting: &mut Vec<JobRequest>,
) -> SelfCheckLabel {
    let mut samples = Vec::new();
    let mut failed = 0;
    for k in 1..=s {
        let req = sample_request(sampler, item, k);
        match results.get(&req.id()) {
            None => waiting.push(req),
            Some(JobOutcome::Failed(_)) => failed += 1,
            Some(JobOutcome::Done(c)) => samples.push(c.text.clone()),
        }
    }
    let unscored = |error: String| SelfCheckLabel {
        samples: samples.len() as u32,
        failed_samples: failed,
        avg: None,
        max: None,
        error: Some(error),
    };
    if samples.is_empty() && s > 0 {
        return unscored(format!("every sample job failed ({failed} of {s}): unscored"));
    }
    let refs: Vec<&str> = samples.iter().map(String::as_str).collect();
    match selfcheck_unigram_text(&sentences(&item.completion), &item.completion, &refs) {
        Ok(r) => SelfCheckLabel {
            samples: refs.len() as u32,
            failed_samples: failed,
            avg: Some(r.doc_avg_neg_logprob),
            max: Some(r.doc_avg_max_neg_logprob),
            error: None,
        },
        Err(e) => unscored(e.to_string()),
    }
}

/// The token-log-probability scores of an item, or `None` with the scoring job pushed on
/// `waiting`.
pub fn logprob_scores(
    model: &ModelSpec,
    item: &Item,
    results: &dyn ResultLookup,
    waiting: &mut Vec<JobRequest>,
) -> Option<LogprobScores> {
    let req = probability_request(model, item);
    let failed = |error: String| LogprobScores { error: Some(error), ..LogprobScores::default() };
    let tokens = match results.get(&req.id()) {
        None => {
            waiting.push(req);
            return None;
        }
        Some(JobOutcome::Failed(e)) => return Some(failed(format!("{JOB_FAILED}: {e}"))),
        Some(JobOutcome::Done(c)) => match &c.logprobs {
            None => {
                return Some(failed(format!(
                    "{NO_LOGPROBS}: probability model `{}` gave none",
                    model.name
                )))
            }
            Some(tokens) => tokens,
        },
    };
    let mut out = LogprobScores { tokens: tokens.len() as u32, ..LogprobScores::default() };
    match token_pseudo_entropies(tokens, TOP_ALTERNATIVES as usize) {
        Ok(per) => {
            out.pseudo_entropy_max = Some(per.iter().copied().fold(f64::NEG_INFINITY, f64::max));
            out.pseudo_entropy_mean = Some(per.iter().sum::<f64>() / per.len() as f64);
        }
        Err(e) => out.pseudo_entropy_error = Some(e.to_string()),
    }
    let texts: Vec<&str> = tokens.iter().map(|t| t.token.as_str()).collect();
    let lps: Vec<f64> = tokens.iter().map(|t| t.logprob).collect();
    match neg_logprob(&texts, &lps) {
        Ok(r) => (out.avg_neg_logprob, out.max_neg_logprob) = (Some(r.avg), Some(r.max)),
        Err(e) => out.neg_logprob_error = Some(e.to_string()),
    }
    Some(out)
}

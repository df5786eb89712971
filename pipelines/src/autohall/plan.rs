//! The AutoHall planner: one claim → its jobs → its [`ItemLabel`] (spec `metrics.md` §2).
//!
//! Stages (pipeline `autohall`, stage version [`STAGE_VERSION`]), for one claim and one
//! model:
//! 1. `reference` (sample 0): the model writes a reference for the claim at the
//!    benchmark's reference temperature. A dead letter ends the item (`reference_failed`).
//! 2. Refusal filter (no job): a reference that is empty, a structured refusal, or
//!    contains one of the configured phrases (case-insensitive) is dropped (`refused`).
//! 3. `classify`: the same model, at the classification temperature (0.1 in the paper),
//!    answers whether the claim is true given the reference; parsed with the authors'
//!    substring rule ([`parse_claim_verdict`]). No verdict: `unclassified`.
//! 4. Hallucination label: the verdict differs from the gold label.
//! 5. Detection (when `samples` K > 0), for every classified reference: K more
//!    references (stage `sample`, the reference prompt, sample index 1..=K, same
//!    temperature), and for each a pairwise check (stage `pair`, classification
//!    temperature) whose answer is read with the no-conflict rule. Samples run in
//!    parallel; each pair check starts as soon as its sample is in. An empty or refused
//!    sample or check answer is compared by the authors' rule (an answer without a
//!    "no conflict" phrase is a conflict) and counted (issue 29): the report shows how
//!    many scored references such a comparison touched.
//!
//! 6. Baselines (when `baselines`), for every classified reference: Zero-Self-Check and
//!    Few-Self-Check jobs, and SelfCk-1gm over the K samples of step 5 (see
//!    [`super::baselines`]).
//!
//! Class balancing needs every claim's label, so it cannot be decided per claim: it is
//! done by the scorer ([`super::score`]), and detection runs for every classified
//! reference, balanced set or not (see the README for the cost).

use halyard_proto::ChatMessage;
use serde::{Deserialize, Serialize};

use super::baselines::{self, BaselineLabels};
use super::dataset::Claim;
use halyard_proto::AnswerKind;

use crate::common::{odd_kind, JobOutcome, JobRequest, ModelSpec, Plan, ResultLookup};
use crate::metrics::autohall::{
    is_hallucinated, pair_conflicts, parse_claim_verdict, ClaimVerdict, GoldLabel,
    NoConflictPhrases,
};

/// The pipeline name in job keys.
pub const PIPELINE: &str = "autohall";
/// Bumped whenever a prompt that feeds a job changes.
pub const STAGE_VERSION: u32 = 1;
/// Default K (the paper's 13 comparisons).
pub const DEFAULT_SAMPLES: u32 = 13;
/// Default classification (and pair-check) temperature (paper: 0.1).
pub const DEFAULT_CLASSIFY_TEMPERATURE: f32 = 0.1;

/// Default refusal filter: phrases of references "that fail to contain concrete content"
/// (the paper's example is "I can not provide a specific reference"; no list is
/// published, so this one is Halyard's). Issue 29 added the common "assist"/"help"
/// forms; a structured refusal (`message.refusal`) is dropped whatever its words.
pub const DEFAULT_REFUSAL_PHRASES: [&str; 13] = [
    "i can not provide",
    "i cannot provide",
    "i can't provide",
    "i can’t provide",
    "i am unable to provide",
    "i'm unable to provide",
    "as an ai language model, i",
    "i can't assist",
    "i can’t assist",
    "i cannot assist",
    "i can't help with",
    "i can’t help with",
    "i cannot help with",
];

/// Step 1 (spec §2.1): the reference-generation prompt, verbatim.
pub fn reference_messages(claim: &str) -> Vec<ChatMessage> {
    vec![ChatMessage::user(format!(
        "Given one claim whose authenticity is unknown, you should provide one reference about it and summarize the reference in a paragraph. Claim: {claim}"
    ))]
}

/// Step 2 (spec §2.1): prompt P0, verbatim.
pub fn classify_messages(claim: &str, reference: &str) -> Vec<ChatMessage> {
    vec![ChatMessage::user(format!(
        "Given the claim and the reference, you should answer whether the claim is true or false. Claim: {claim} Reference: {reference}"
    ))]
}

/// Detection (spec §2.2 step 2): the pairwise prompt of the authors' code, verbatim.
pub fn pair_messages(reference: &str, sample: &str) -> Vec<ChatMessage> {
    vec![ChatMessage::user(format!(
        "Are there any conflicting parts in these paragraphs P1,P2? P1: {reference} P2: {sample}"
    ))]
}

/// How one model runs AutoHall.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// The model under test at the reference temperature (references and samples).
    pub model: ModelSpec,
    /// The same model at the classification temperature (classification, pair checks).
    pub classifier: ModelSpec,
    /// K, sampled references per classified reference; 0 turns detection off.
    pub samples: u32,
    /// Lower-case phrases that mark a reference as a refusal; empty: no filter.
    pub refusal_phrases: Vec<String>,
    pub no_conflict: NoConflictPhrases,
    /// Run the paper's baselines (Zero-/Few-Self-Check, SelfCk-1gm) next to detection.
    #[serde(default)]
    pub baselines: bool,
}

impl Config {
    pub fn reference_request(&self, claim: &str, sample_index: u32) -> JobRequest {
        let stage = if sample_index == 0 { "reference" } else { "sample" };
        // A fixed seed would make the K samples identical: each sample gets its own.
        let mut spec = self.model.clone();
        spec.seed = spec.seed.map(|s| s.wrapping_add(sample_index as u64));
        spec.request(PIPELINE, stage, STAGE_VERSION, reference_messages(claim), sample_index)
    }

    /// Whether a reference is dropped by the refusal filter.
    pub fn is_refusal(&self, reference: &str) -> bool {
        let lower = reference.to_lowercase();
        reference.trim().is_empty()
            || self.refusal_phrases.iter().any(|p| lower.contains(p.as_str()))
    }
}

/// What became of a claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The reference job is a dead letter.
    ReferenceFailed,
    /// The reference was dropped by the refusal filter.
    Refused,
    /// The classification job is a dead letter.
    ClassifyFailed,
    /// The classification answer holds neither true nor false.
    Unclassified,
    /// Classified: the item has a hallucination label.
    Classified,
}

impl Status {
    pub const ALL: [Status; 5] = [
        Status::ReferenceFailed,
        Status::Refused,
        Status::ClassifyFailed,
        Status::Unclassified,
        Status::Classified,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Status::ReferenceFailed => "reference_failed",
            Status::Refused => "refused",
            Status::ClassifyFailed => "classify_failed",
            Status::Unclassified => "unclassified",
            Status::Classified => "classified",
        }
    }
}

/// One pairwise comparison of the detection step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pair {
    pub sample: Option<String>,
    pub answer: Option<String>,
    /// `None` when the sample or the check failed.
    pub conflict: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The sample was empty or a refusal (issue 29): it is still compared, by the
    /// authors' rule, and counted in the report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_kind: Option<AnswerKind>,
    /// The check's answer was empty or a refusal: by the authors' rule it holds no
    /// "no conflict" phrase, so it counts as a conflict; counted in the report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_kind: Option<AnswerKind>,
}

impl Pair {
    /// An empty or refused sample or check answer decided this comparison.
    pub fn is_odd(&self) -> bool {
        self.sample_kind.is_some() || self.answer_kind.is_some()
    }
}

/// The final label of one claim for one model (a row of `labels.jsonl`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ItemLabel {
    pub pipeline: String,
    pub model: String,
    /// Index among the file's kept claims (file order).
    pub index: u32,
    pub claim_id: String,
    pub line: usize,
    pub claim: String,
    pub gold: GoldLabel,
    pub status: Status,
    pub reference: Option<String>,
    /// The reference was empty or a refusal (issue 29; it is `refused` then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_kind: Option<AnswerKind>,
    pub classification: Option<String>,
    /// The classification answer was empty or a refusal (it is `unclassified` then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub classification_kind: Option<AnswerKind>,
    pub verdict: Option<ClaimVerdict>,
    /// The hallucination label (classified items only).
    pub hallucinated: Option<bool>,
    /// The K comparisons, in sample order (empty without detection).
    pub pairs: Vec<Pair>,
    /// The baselines' verdicts (classified items, with `baselines` on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baselines: Option<BaselineLabels>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ItemLabel {
    /// The K conflict verdicts when all are known.
    pub fn conflicts(&self) -> Option<Vec<bool>> {
        self.pairs.iter().map(|p| p.conflict).collect()
    }
}

/// Advances one claim as far as the known results allow.
pub fn evaluate(
    cfg: &Config,
    index: u32,
    c: &Claim,
    results: &dyn ResultLookup,
) -> Plan<ItemLabel> {
    let mut label = ItemLabel {
        pipeline: PIPELINE.into(),
        model: cfg.model.name.clone(),
        index,
        claim_id: c.id.clone(),
        line: c.line,
        claim: c.claim.clone(),
        gold: c.gold,
        status: Status::ReferenceFailed,
        reference: None,
        reference_kind: None,
        classification: None,
        classification_kind: None,
        verdict: None,
        hallucinated: None,
        pairs: Vec::new(),
        baselines: None,
        error: None,
    };
    let reference_req = cfg.reference_request(&c.claim, 0);
    let reference = match results.get(&reference_req.id()) {
        None => return Plan::Waiting(vec![reference_req]),
        Some(JobOutcome::Failed(e)) => {
            label.error = Some(format!("reference job failed: {e}"));
            return Plan::Done(label);
        }
        Some(JobOutcome::Done(r)) => {
            label.reference_kind = odd_kind(r);
            r.text.clone()
        }
    };
    label.reference = Some(reference.clone());
    if label.reference_kind.is_some() || cfg.is_refusal(&reference) {
        label.status = Status::Refused;
        return Plan::Done(label);
    }
    let classify_req = cfg.classifier.request(
        PIPELINE,
        "classify",
        STAGE_VERSION,
        classify_messages(&c.claim, &reference),
        0,
    );
    let answer = match results.get(&classify_req.id()) {
        None => return Plan::Waiting(vec![classify_req]),
        Some(JobOutcome::Failed(e)) => {
            label.status = Status::ClassifyFailed;
            label.error = Some(format!("classification job failed: {e}"));
            return Plan::Done(label);
        }
        Some(JobOutcome::Done(r)) => {
            label.classification_kind = odd_kind(r);
            r.text.clone()
        }
    };
    label.classification = Some(answer.clone());
    let Some(verdict) = parse_claim_verdict(&answer) else {
        label.status = Status::Unclassified;
        return Plan::Done(label);
    };
    label.status = Status::Classified;
    label.verdict = Some(verdict);
    label.hallucinated = Some(is_hallucinated(verdict, c.gold));
    let mut waiting = Vec::new();
    for k in 1..=cfg.samples {
        let sample_req = cfg.reference_request(&c.claim, k);
        let pair = match results.get(&sample_req.id()) {
            None => {
                waiting.push(sample_req);
                continue;
            }
            Some(JobOutcome::Failed(e)) => Pair {
                sample: None,
                answer: None,
                conflict: None,
                error: Some(format!("sample job failed: {e}")),
                sample_kind: None,
                answer_kind: None,
            },
            Some(JobOutcome::Done(s)) => {
                let pair_req = cfg.classifier.request(
                    PIPELINE,
                    "pair",
                    STAGE_VERSION,
                    pair_messages(&reference, &s.text),
                    0,
                );
                let sample = Some(s.text.clone());
                let sample_kind = odd_kind(s);
                match results.get(&pair_req.id()) {
                    None => {
                        // Identical samples share one check.
                        if !waiting.iter().any(|w: &JobRequest| w.key == pair_req.key) {
                            waiting.push(pair_req);
                        }
                        continue;
                    }
                    Some(JobOutcome::Failed(e)) => Pair {
                        sample,
                        answer: None,
                        conflict: None,
                        error: Some(format!("pair check failed: {e}")),
                        sample_kind,
                        answer_kind: None,
                    },
                    Some(JobOutcome::Done(a)) => Pair {
                        sample,
                        answer: Some(a.text.clone()),
                        conflict: Some(pair_conflicts(&a.text, cfg.no_conflict)),
                        error: None,
                        sample_kind,
                        answer_kind: odd_kind(a),
                    },
                }
            }
        };
        label.pairs.push(pair);
    }
    let checks = cfg
        .baselines
        .then(|| baselines::self_checks(cfg, &c.claim, &reference, results, &mut waiting));
    if !waiting.is_empty() {
        return Plan::Waiting(waiting);
    }
    if let Some((zero, few)) = checks {
        let samples: Vec<&str> = label.pairs.iter().filter_map(|p| p.sample.as_deref()).collect();
        label.baselines = Some(BaselineLabels {
            zero_self_check: zero,
            few_self_check: few,
            selfck_1gm: (cfg.samples > 0).then(|| baselines::selfck_1gm(&reference, &samples)),
        });
    }
    Plan::Done(label)
}

#[cfg(test)]
mod tests;

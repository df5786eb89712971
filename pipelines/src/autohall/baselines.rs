//! AutoHall's baselines (spec `metrics.md` §2.3), run next to its self-contradiction
//! detection on the same references, as the paper's Table 3 does:
//! - **Zero-Self-Check**: the model judges its own reference, zero-shot with "Let's think
//!   step by step" (stage `zero_self_check`);
//! - **Few-Self-Check**: the same with three worked examples (stage `few_self_check`);
//! - **SelfCk-1gm**: SelfCheckGPT's unigram model over the reference and the K sampled
//!   references detection already draws (no job of its own), hallucinated iff the
//!   passage-level `avg_neg_logprob` ≥ 5 (the authors' notebook threshold).
//!
//! The authors' baseline prompts are not in their repository; their notebook shows their
//! shape (`[claim]: …`, `[reference]: …`, "You MUST only respond in the format as
//! described", an answer with `"factuality": true|false`) and how it is read: the text
//! after the last `"factuality":`, hallucinated if it holds `false`/`False`, factual if
//! it holds `true`/`True`. The prompts below are Halyard's, in that shape. As in the
//! notebook, an answer with neither is a wrong prediction (counted as `unparseable`); a
//! failed job leaves the reference out of that baseline (counted as `incomplete`).
//! Both checks run at the classification temperature, on every classified reference.

use halyard_proto::ChatMessage;
use serde::{Deserialize, Serialize};

use super::plan::{Config, PIPELINE, STAGE_VERSION};
use crate::common::{JobOutcome, JobRequest, ResultLookup};
use crate::metrics::autohall::selfck_1gm_hallucinated;
use crate::metrics::selfcheck::selfcheck_unigram_text;

/// One of the baselines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Baseline {
    ZeroSelfCheck,
    FewSelfCheck,
    #[serde(rename = "selfck_1gm")]
    SelfCk1gm,
}

impl Baseline {
    pub const ALL: [Baseline; 3] =
        [Baseline::ZeroSelfCheck, Baseline::FewSelfCheck, Baseline::SelfCk1gm];

    pub fn as_str(self) -> &'static str {
        match self {
            Baseline::ZeroSelfCheck => "zero_self_check",
            Baseline::FewSelfCheck => "few_self_check",
            Baseline::SelfCk1gm => "selfck_1gm",
        }
    }
}

const TASK: &str = "You are given a claim and a reference written about it. Your task is to decide whether the reference is factual: whether it states anything false, cites a source that does not exist, or presents something unsupported as fact.";

const FORMAT: &str = "You MUST only respond in the format as described below. DO NOT RESPOND WITH ANYTHING ELSE.\n{\"reasoning\": \"<your reasoning, step by step>\", \"factuality\": <true if the reference is factual, false otherwise>}";

/// Three worked examples for Few-Self-Check (Halyard's own).
const EXAMPLES: &str = r#"[claim]: The Eiffel Tower is in Paris.
[reference]: The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France, completed in 1889 for the World's Fair.
{"reasoning": "The tower stands on the Champ de Mars in Paris and was completed in 1889 for the Exposition Universelle. Every statement is correct.", "factuality": true}

[claim]: Drinking coffee cures diabetes.
[reference]: A 2015 Harvard study titled "Coffee as a Cure" proved that three cups of coffee a day reverse type 2 diabetes within a month.
{"reasoning": "No such Harvard study exists; coffee consumption is associated with a lower risk of type 2 diabetes in observational studies, but nothing shows it reverses the disease. The reference invents a source and a result.", "factuality": false}

[claim]: Global sea level has risen since 1900.
[reference]: According to NASA, global mean sea level has risen by about 21 to 24 centimetres since 1880, and the rate of rise has accelerated in recent decades.
{"reasoning": "NASA reports a rise of roughly 21-24 cm since 1880 and an accelerating rate. The statements agree with the published measurements.", "factuality": true}"#;

/// Zero-Self-Check prompt: the task, the claim and reference, "Let's think step by step",
/// and the required answer format.
pub fn zero_self_check_messages(claim: &str, reference: &str) -> Vec<ChatMessage> {
    vec![ChatMessage::user(format!(
        "{TASK}\n[claim]: {claim}\n[reference]: {reference}\nLet's think step by step. {FORMAT}"
    ))]
}

/// Few-Self-Check prompt: the same with three worked examples before the reference.
pub fn few_self_check_messages(claim: &str, reference: &str) -> Vec<ChatMessage> {
    vec![ChatMessage::user(format!(
        "{TASK}\nHere are three examples.\n\n{EXAMPLES}\n\nNow the reference to judge.\n[claim]: {claim}\n[reference]: {reference}\nLet's think step by step. {FORMAT}"
    ))]
}

/// The notebook's reading of a self-check answer: the text after the last `"factuality":`;
/// `Some(true)` (hallucinated) if it holds `false` or `False`, else `Some(false)` (factual)
/// if it holds `true` or `True`, else `None` (unparseable).
pub fn parse_factuality(answer: &str) -> Option<bool> {
    let (_, after) = answer.rsplit_once("\"factuality\":")?;
    if after.contains("false") || after.contains("False") {
        Some(true)
    } else if after.contains("true") || after.contains("True") {
        Some(false)
    } else {
        None
    }
}

/// One baseline's verdict on a reference.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BaselineVerdict {
    /// The check's answer (self-checks), when its job succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// SelfCk-1gm: the passage-level `avg_neg_logprob`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    /// Predicted hallucinated; `None`: unparseable answer, or see `error`.
    pub hallucinated: Option<bool>,
    /// Why there is no verdict (a failed job, no usable sample).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The baselines' verdicts on one classified reference.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BaselineLabels {
    pub zero_self_check: Option<BaselineVerdict>,
    pub few_self_check: Option<BaselineVerdict>,
    /// With detection on (K > 0): over the K sampled references.
    pub selfck_1gm: Option<BaselineVerdict>,
}

impl BaselineLabels {
    pub fn get(&self, b: Baseline) -> Option<&BaselineVerdict> {
        match b {
            Baseline::ZeroSelfCheck => self.zero_self_check.as_ref(),
            Baseline::FewSelfCheck => self.few_self_check.as_ref(),
            Baseline::SelfCk1gm => self.selfck_1gm.as_ref(),
        }
    }
}

fn self_check(
    cfg: &Config,
    stage: &str,
    messages: Vec<ChatMessage>,
    results: &dyn ResultLookup,
    waiting: &mut Vec<JobRequest>,
) -> Option<BaselineVerdict> {
    let req = cfg.classifier.request(PIPELINE, stage, STAGE_VERSION, messages, 0);
    match results.get(&req.id()) {
        None => {
            waiting.push(req);
            None
        }
        Some(JobOutcome::Failed(e)) => Some(BaselineVerdict {
            answer: None,
            score: None,
            hallucinated: None,
            error: Some(format!("{stage} job failed: {e}")),
        }),
        Some(JobOutcome::Done(c)) => Some(BaselineVerdict {
            answer: Some(c.text.clone()),
            score: None,
            hallucinated: parse_factuality(&c.text),
            error: None,
        }),
    }
}

/// SelfCk-1gm over the reference and the sampled references that came back (sentences
/// split as ChainPoll's baseline splits them; the passage-level average does not depend
/// on the split).
pub fn selfck_1gm(reference: &str, samples: &[&str]) -> BaselineVerdict {
    let none = |error: String| BaselineVerdict {
        answer: None,
        score: None,
        hallucinated: None,
        error: Some(error),
    };
    if samples.is_empty() {
        return none("no sampled reference came back: unscored".into());
    }
    let sentences = crate::chainpoll::sentences(reference);
    match selfcheck_unigram_text(&sentences, reference, samples) {
        Ok(r) => match selfck_1gm_hallucinated(r.doc_avg_neg_logprob) {
            Ok(h) => BaselineVerdict {
                answer: None,
                score: Some(r.doc_avg_neg_logprob),
                hallucinated: Some(h),
                error: None,
            },
            Err(e) => none(e.to_string()),
        },
        Err(e) => none(e.to_string()),
    }
}

/// The two self-check verdicts of a classified reference, or the jobs still needed (pushed
/// on `waiting`; `None` then).
pub fn self_checks(
    cfg: &Config,
    claim: &str,
    reference: &str,
    results: &dyn ResultLookup,
    waiting: &mut Vec<JobRequest>,
) -> (Option<BaselineVerdict>, Option<BaselineVerdict>) {
    let [zero, few] = [
        (Baseline::ZeroSelfCheck, zero_self_check_messages as fn(&str, &str) -> Vec<ChatMessage>),
        (Baseline::FewSelfCheck, few_self_check_messages),
    ]
    .map(|(b, messages)| self_check(cfg, b.as_str(), messages(claim, reference), results, waiting));
    (zero, few)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The notebook's reading: the last `"factuality":`, false before true, else unparseable.
    #[test]
    fn factuality_parse() {
        assert_eq!(parse_factuality("{\"reasoning\": \"x\", \"factuality\": false}"), Some(true));
        assert_eq!(parse_factuality("{\"factuality\": True}"), Some(false));
        assert_eq!(
            parse_factuality("\"factuality\": false ... final {\"factuality\": true}"),
            Some(false)
        );
        assert_eq!(parse_factuality("{\"factuality\": \"unsure\"}"), None);
        assert_eq!(parse_factuality("It is true."), None);
        assert_eq!(parse_factuality(""), None);
    }

    /// SelfCk-1gm scores the reference against its samples, threshold 5; no sample: unscored.
    #[test]
    fn selfck_1gm_rule() {
        let v = selfck_1gm("The sky is blue.", &["The sky is blue.", "The sky is blue."]);
        assert_eq!(v.hallucinated, Some(false), "{v:?}");
        assert!(v.score.unwrap() < 5.0);
        let none = selfck_1gm("The sky is blue.", &[]);
        assert_eq!(none.hallucinated, None);
        assert!(none.error.unwrap().contains("unscored"));
    }

    /// Both prompts carry the claim, the reference and the answer format; few-shot adds examples.
    #[test]
    fn prompts() {
        let z = &zero_self_check_messages("C", "R")[0].content;
        let f = &few_self_check_messages("C", "R")[0].content;
        for p in [z, f] {
            assert!(p.contains("[claim]: C\n[reference]: R\nLet's think step by step."));
            assert!(p.contains("You MUST only respond in the format as described"));
        }
        assert_eq!(f.matches("\"factuality\": ").count(), 3 + 1);
        assert!(!z.contains("Eiffel"));
        for b in Baseline::ALL {
            assert_eq!(serde_json::to_value(b).unwrap(), b.as_str(), "serde name = as_str");
        }
    }
}

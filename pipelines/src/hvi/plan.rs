//! The planner. Judge mode, per (prompt, model under test), pipeline `hvi`, stage version
//! [`STAGE_VERSION`]:
//! 1. `passage`: the model writes a passage for the prompt (optional system prompt, then
//!    the prompt verbatim). A dead letter ends the item with no sentence; so do an empty
//!    passage and a refusal (issue 29: a refusal's own sentences are not the passage the
//!    prompt asked for), each counted apart in the report, so that HVI over fewer passages
//!    says how many it lost and why.
//! 2. The passage is split into sentences ([`split_sentences`]).
//! 3. `sentence_judge`: the judge labels every sentence, all in parallel. An unreadable
//!    verdict is asked once more (`sample_index` 1, a new job); still unreadable, or a
//!    failed judge job, makes the sentence a `judge_error`, which is left out of `U`. An
//!    empty or refused judge output is unreadable, and counted by its kind.
//!
//! Labelled mode calls nothing: [`evaluate_labelled`] counts one model's rows.

use halyard_proto::ChatMessage;
use serde::{Deserialize, Serialize};

use super::dataset::{Category, LabelRow, Prompt};
use super::judge::{judge_messages, parse_verdict, split_sentences, Verdict};
use halyard_proto::AnswerKind;

use crate::common::{odd_kind, JobOutcome, JobRequest, ModelSpec, OddCounts, Plan, ResultLookup};
use crate::metrics::hvi::HviCounts;

/// The pipeline name in job keys.
pub const PIPELINE: &str = "hvi";
/// Bumped whenever a prompt or a rule that feeds a job changes.
pub const STAGE_VERSION: u32 = 1;
/// Judge calls per sentence (one plain, one repeat).
pub const JUDGE_ATTEMPTS: u32 = 2;

/// How one model is evaluated in judge mode.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    pub model: ModelSpec,
    pub judge: ModelSpec,
    pub system_prompt: Option<String>,
}

/// One sentence and the judge's reading of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SentenceLabel {
    pub sentence: String,
    /// `None`: judge error.
    pub verdict: Option<Verdict>,
    /// For hallucinated sentences: orientation (from the prompt) × type (from the judge).
    pub category: Option<Category>,
    /// The judge's outputs, one per attempt (`None` for a failed job).
    pub outputs: Vec<Option<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The kinds of the judge's outputs that were empty or refusals (issue 29).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub odd_outputs: Vec<AnswerKind>,
}

/// The final label of one (prompt, model) in judge mode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemLabel {
    pub id: String,
    pub factual: bool,
    pub model: String,
    pub judge: String,
    pub passage: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passage_error: Option<String>,
    /// The passage was empty or a refusal (issue 29): no sentence was judged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passage_kind: Option<AnswerKind>,
    pub sentences: Vec<SentenceLabel>,
}

/// The label of one model in labelled mode: its counts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelLabels {
    pub model: String,
    pub counts: HviCounts,
}

impl Config {
    pub fn passage_request(&self, p: &Prompt) -> JobRequest {
        let mut messages = Vec::new();
        if let Some(s) = &self.system_prompt {
            messages.push(ChatMessage::system(s.clone()));
        }
        messages.push(ChatMessage::user(p.prompt.clone()));
        self.model.request(PIPELINE, "passage", STAGE_VERSION, messages, 0)
    }
}

/// Advances one prompt as far as the known results allow.
pub fn evaluate(cfg: &Config, p: &Prompt, results: &dyn ResultLookup) -> Plan<ItemLabel> {
    let req = cfg.passage_request(p);
    let label = |passage, passage_error, passage_kind, sentences| ItemLabel {
        id: p.id.clone(),
        factual: p.factual,
        model: cfg.model.name.clone(),
        judge: cfg.judge.name.clone(),
        passage,
        passage_error,
        passage_kind,
        sentences,
    };
    let passage = match results.get(&req.id()) {
        None => return Plan::Waiting(vec![req]),
        Some(JobOutcome::Failed(e)) => {
            return Plan::Done(label(None, Some(e.to_string()), None, Vec::new()))
        }
        Some(JobOutcome::Done(c)) if odd_kind(c).is_some() => {
            return Plan::Done(label(Some(c.text.clone()), None, odd_kind(c), Vec::new()))
        }
        Some(JobOutcome::Done(c)) => c.text.clone(),
    };
    let mut waiting = Vec::new();
    let mut sentences = Vec::new();
    for s in split_sentences(&passage) {
        match judge_sentence(cfg, p, &passage, s, results) {
            Ok(l) => sentences.push(l),
            Err(r) => {
                if !waiting.iter().any(|w: &JobRequest| w.key == r.key) {
                    waiting.push(*r);
                }
            }
        }
    }
    if waiting.is_empty() {
        Plan::Done(label(Some(passage), None, None, sentences))
    } else {
        Plan::Waiting(waiting)
    }
}

fn judge_sentence(
    cfg: &Config,
    p: &Prompt,
    passage: &str,
    sentence: String,
    results: &dyn ResultLookup,
) -> Result<SentenceLabel, Box<JobRequest>> {
    let messages = judge_messages(&p.prompt, passage, &sentence);
    let mut outputs = Vec::new();
    let mut odd = Vec::new();
    for attempt in 0..JUDGE_ATTEMPTS {
        let req =
            cfg.judge.request(PIPELINE, "sentence_judge", STAGE_VERSION, messages.clone(), attempt);
        match results.get(&req.id()) {
            None => return Err(Box::new(req)),
            Some(JobOutcome::Failed(e)) => {
                outputs.push(None);
                let error = Some(format!("judge job failed: {e}"));
                return Ok(SentenceLabel {
                    sentence,
                    verdict: None,
                    category: None,
                    outputs,
                    error,
                    odd_outputs: odd,
                });
            }
            Some(JobOutcome::Done(c)) => {
                outputs.push(Some(c.text.clone()));
                if let Some(k) = odd_kind(c) {
                    odd.push(k);
                    continue;
                }
                if let Some(v) = parse_verdict(&c.text) {
                    let category = match v {
                        Verdict::NotHallucinated => None,
                        Verdict::Intrinsic => Some(Category::of(p.factual, false)),
                        Verdict::Extrinsic => Some(Category::of(p.factual, true)),
                    };
                    return Ok(SentenceLabel {
                        sentence,
                        verdict: Some(v),
                        category,
                        outputs,
                        error: None,
                        odd_outputs: odd,
                    });
                }
            }
        }
    }
    let error = Some(format!("no VERDICT line in {JUDGE_ATTEMPTS} judge outputs"));
    Ok(SentenceLabel { sentence, verdict: None, category: None, outputs, error, odd_outputs: odd })
}

/// The empty or refused passages and judge outputs of one model's labels (issue 29).
pub fn odd_of(labels: &[ItemLabel]) -> (OddCounts, OddCounts) {
    let (mut passages, mut judge) = (OddCounts::default(), OddCounts::default());
    for l in labels {
        passages.add(l.passage_kind);
        for k in l.sentences.iter().flat_map(|s| &s.odd_outputs) {
            judge.add(Some(*k));
        }
    }
    (passages, judge)
}

/// Counts of the judged sentences of one model's labels (judge errors left out).
pub fn counts_of(labels: &[ItemLabel]) -> HviCounts {
    let mut c = HviCounts { sentences: 0, hallucinated: 0, efm: 0, esl: 0 };
    for s in labels.iter().flat_map(|l| &l.sentences).filter(|s| s.verdict.is_some()) {
        add(&mut c, s.verdict != Some(Verdict::NotHallucinated), s.category);
    }
    c
}

fn add(c: &mut HviCounts, hallucinated: bool, category: Option<Category>) {
    c.sentences += 1;
    c.hallucinated += u64::from(hallucinated);
    c.efm += u64::from(category == Some(Category::EFM));
    c.esl += u64::from(category == Some(Category::ESL));
}

/// Labelled mode: the counts of `model`'s rows.
pub fn evaluate_labelled(model: &str, rows: &[LabelRow]) -> ModelLabels {
    let mut counts = HviCounts { sentences: 0, hallucinated: 0, efm: 0, esl: 0 };
    for r in rows.iter().filter(|r| r.model == model) {
        add(&mut counts, r.hallucinated, r.category);
    }
    ModelLabels { model: model.to_string(), counts }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use halyard_proto::{Completion, JobId, Outcome, Usage};

    use crate::common::test_model as spec;

    use super::*;

    fn done(t: &str) -> Outcome {
        Outcome::Done(Completion {
            text: t.into(),
            usage: Usage::default(),
            latency_ms: 0,
            finish_reason: None,
            calls: 1,
            logprobs: None,
            refusal: false,
            source: Default::default(),
        })
    }

    /// Passage, then one judge job per sentence; a garbled verdict is asked again, twice
    /// garbled is a judge error; categories follow the prompt's orientation.
    #[test]
    fn passage_then_sentences() {
        let cfg = Config {
            model: spec("m"),
            judge: spec("j"),
            system_prompt: Some("Write news.".into()),
        };
        let p = Prompt { id: "1".into(), prompt: "The sky is green.".into(), factual: false };
        let mut known: HashMap<JobId, Outcome> = HashMap::new();
        let Plan::Waiting(jobs) = evaluate(&cfg, &p, &known) else { panic!() };
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].key.messages.len(), 2);
        known.insert(jobs[0].id(), done("Green skies. Experts agree. Unclear one."));
        let mut rounds = 0;
        let label = loop {
            rounds += 1;
            match evaluate(&cfg, &p, &known) {
                Plan::Done(l) => break l,
                Plan::Waiting(jobs) => {
                    for j in jobs {
                        let user = &j.key.messages[1].content;
                        let out = if user.contains("\"\"\"Green skies.\"\"\"") {
                            "VERDICT: INTRINSIC"
                        } else if user.contains("\"\"\"Experts agree.\"\"\"") {
                            "VERDICT: EXTRINSIC"
                        } else {
                            "hmm"
                        };
                        known.insert(j.id(), done(out));
                    }
                }
            }
        };
        assert_eq!(rounds, 3, "judges in parallel, one retry round");
        let cats: Vec<Option<Category>> = label.sentences.iter().map(|s| s.category).collect();
        assert_eq!(cats, [Some(Category::ISL), Some(Category::ESL), None]);
        assert!(label.sentences[2].error.is_some() && label.sentences[2].outputs.len() == 2);
        assert_eq!(
            counts_of(&[label]),
            HviCounts { sentences: 2, hallucinated: 2, efm: 0, esl: 1 }
        );
    }

    /// Issue 29: an empty passage and a refusal are judged nowhere and counted apart;
    /// empty or refused judge outputs are no verdict (asked again) and counted by kind.
    #[test]
    fn odd_passages_and_judge_outputs_are_counted() {
        let cfg = Config { model: spec("m"), judge: spec("j"), system_prompt: None };
        let refusal = |t: &str| match done(t) {
            Outcome::Done(c) => Outcome::Done(Completion { refusal: true, ..c }),
            o => o,
        };
        let mut labels = Vec::new();
        for (i, out) in [done(" "), refusal("I can't help with that.")].into_iter().enumerate() {
            let p = Prompt { id: i.to_string(), prompt: format!("Prompt {i}."), factual: true };
            let mut known: HashMap<JobId, Outcome> = HashMap::new();
            known.insert(cfg.passage_request(&p).id(), out);
            let Plan::Done(l) = evaluate(&cfg, &p, &known) else { panic!("judged an odd passage") };
            assert!(l.sentences.is_empty());
            labels.push(l);
        }
        let p = Prompt { id: "9".into(), prompt: "Write.".into(), factual: true };
        let mut known: HashMap<JobId, Outcome> = HashMap::new();
        known.insert(cfg.passage_request(&p).id(), done("One sentence."));
        let l = loop {
            match evaluate(&cfg, &p, &known) {
                Plan::Done(l) => break l,
                Plan::Waiting(jobs) => {
                    for j in jobs {
                        let out = if j.key.sample_index == 0 { done("") } else { refusal("No.") };
                        known.insert(j.id(), out);
                    }
                }
            }
        };
        assert_eq!(l.sentences[0].verdict, None);
        labels.push(l);
        let (passages, judge) = odd_of(&labels);
        assert_eq!((passages.empty, passages.refusal, judge.empty, judge.refusal), (1, 1, 1, 1));
        let mut r = crate::hvi::score::score(
            "m",
            "judge",
            counts_of(&labels),
            1,
            0,
            crate::hvi::score::Weights::default(),
        );
        (r.odd_passages, r.odd_judge_outputs) = (passages, judge);
        let md = crate::hvi::score::render_markdown(&[r]);
        assert!(
            md.contains(
                "passages left out (no sentence judged): 0 failed call(s), 1 empty, 1 refusal"
            ),
            "{md}"
        );
    }

    /// Labelled mode counts only the named model's rows.
    #[test]
    fn labelled_counts() {
        let row = |m: &str, h, c| LabelRow {
            model: m.into(),
            sentence: "s".into(),
            hallucinated: h,
            category: c,
        };
        let rows = [
            row("a", true, Some(Category::EFM)),
            row("a", false, None),
            row("b", true, Some(Category::ESL)),
        ];
        assert_eq!(
            evaluate_labelled("a", &rows).counts,
            HviCounts { sentences: 2, hallucinated: 1, efm: 1, esl: 0 }
        );
    }
}

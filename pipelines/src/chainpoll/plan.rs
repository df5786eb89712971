//! The ChainPoll planner: one labelled item → its judge polls (and baseline samples) →
//! its [`ItemLabel`] (spec `metrics.md` §3.1, §3.4).
//!
//! Stages (pipeline `chainpoll`, stage version [`STAGE_VERSION`]):
//! - `correctness` / `adherence`: N polls of the judge with the metric's prompt (sample
//!   index 0..N, one job each, so each poll has its own job id and checkpoint). The
//!   OpenAI `n` parameter is not used: a job is one completion here.
//! - `sample` (only with a `sampler`): S answers of the sampler to the item's prompt
//!   (sample index 1..=S), for the SelfCheck-NGram baseline;
//! - `probability` (only with a `probability` model that can score a given text): the
//!   completion's token log-probabilities, for the pseudo-entropy (max, mean) and
//!   Avg/Max(−log p) baselines (see [`super::baselines`]).
//!
//! Every job of an item is independent, so all are requested at once.
//!
//! Verdicts are read with [`parse_verdict_answer_line`]: the prompts end by requiring a
//! final line `Answer: yes` or `Answer: no`, and only that line gives a verdict (issue 29:
//! the last stray "yes"/"no" of the reasoning is not one). A poll without it (an empty
//! output, a refusal, a verdict in prose) is *unparseable*, with its reason, and counts as
//! the benchmark's `unparseable` policy says (excluded from N by default, or counted as
//! "no"); a poll whose job failed is left out of N under either policy.

use halyard_proto::ChatMessage;
use serde::{Deserialize, Serialize};

use super::baselines::{self, LogprobScores, SelfCheckLabel};
use super::dataset::Item;
use crate::common::{JobOutcome, JobRequest, ModelSpec, Plan, ResultLookup};
use crate::metrics::chainpoll::{
    chainpoll_score_parsed, parse_verdict_answer_line, Unparseable, Unreadable,
};

/// The pipeline name in job keys.
pub const PIPELINE: &str = "chainpoll";
/// Bumped whenever a prompt that feeds a job changes.
pub const STAGE_VERSION: u32 = 1;
/// Default N (the paper's "typically 5").
pub const DEFAULT_POLLS: u32 = 5;
/// Default S when a sampler is given (SelfCheckGPT's 20).
pub const DEFAULT_SAMPLES: u32 = 20;

/// The two ChainPoll judge prompts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Open-domain: false claims about the world; the judge sees prompt and completion.
    Correctness,
    /// Closed-domain: claims not supported by the context; the judge sees the context too.
    Adherence,
}

impl Metric {
    pub fn as_str(self) -> &'static str {
        match self {
            Metric::Correctness => "correctness",
            Metric::Adherence => "adherence",
        }
    }

    /// Halyard's detailed chain-of-thought judge prompt: reasoning first, claim by claim,
    /// then a fixed final line.
    pub fn messages(self, item: &Item) -> Vec<ChatMessage> {
        let (system, task, steps) = match self {
            Metric::Correctness => (
                "You are a meticulous fact-checker. You judge whether a text written by an AI assistant contains hallucinations: statements about the real world that are false, invented people, places, organisations, publications or events, wrong numbers, dates, names or quotations, and claims stated as fact that cannot be verified to be true.",
                format!("A user sent this request to an AI assistant:\n\"\"\"\n{}\n\"\"\"\n\nThe assistant answered:\n\"\"\"\n{}\n\"\"\"", item.prompt, item.completion),
                "1. List every factual claim the answer makes, one by one (names, numbers, dates, sources, causes, quotations).\n2. For each claim, reason from what you know about the world: is it true, false, or something nobody could verify? Quote the words you are judging.\n3. Check whether the answer invents sources, titles, links or studies, or attributes statements to people who did not make them.\n4. Decide whether the answer contains at least one hallucination.",
            ),
            Metric::Adherence => (
                "You are a meticulous reviewer. You judge whether a text written by an AI assistant sticks to the documents it was given: every statement must be supported by those documents; anything they do not state, or that contradicts them, is a hallucination, even if it is true in the real world.",
                format!(
                    "The assistant was given these documents:\n\"\"\"\n{}\n\"\"\"\n\nA user sent this request:\n\"\"\"\n{}\n\"\"\"\n\nThe assistant answered:\n\"\"\"\n{}\n\"\"\"",
                    item.context.as_deref().unwrap_or(""),
                    item.prompt,
                    item.completion
                ),
                "1. List every claim the answer makes, one by one.\n2. For each claim, find the passage of the documents that supports it and quote it, or say that none does, or that the documents contradict it.\n3. Decide whether the answer contains at least one claim that the documents do not support.",
            ),
        };
        vec![
            ChatMessage::system(system),
            ChatMessage::user(format!(
                "{task}\n\nThink step by step, and write your reasoning before any verdict:\n{steps}\n\nAfter your reasoning, end with one final line, exactly \"Answer: yes\" if the answer contains a hallucination, or \"Answer: no\" if it does not."
            )),
        ]
    }
}

/// How one judge model runs ChainPoll.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// The judge whose ChainPoll scores are evaluated.
    pub judge: ModelSpec,
    /// N, polls per item and metric.
    pub polls: u32,
    pub metrics: Vec<Metric>,
    pub unparseable: Unparseable,
    /// The model drawing the SelfCheck-NGram samples, and S; `None`: no baseline.
    pub sampler: Option<(ModelSpec, u32)>,
    /// The "probability model" scoring each completion for the pseudo-entropy (spec §3.3)
    /// and Avg/Max(−log p) baselines; `None`: not computed.
    #[serde(default)]
    pub probability: Option<ModelSpec>,
}

impl Config {
    pub fn poll_request(&self, metric: Metric, item: &Item, index: u32) -> JobRequest {
        let mut spec = self.judge.clone();
        spec.seed = spec.seed.map(|s| s.wrapping_add(index as u64));
        spec.request(PIPELINE, metric.as_str(), STAGE_VERSION, metric.messages(item), index)
    }

    pub fn sample_request(sampler: &ModelSpec, item: &Item, index: u32) -> JobRequest {
        baselines::sample_request(sampler, item, index)
    }
}

/// One judge poll.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Poll {
    pub output: Option<String>,
    /// `None`: unparseable (then `unreadable` says why), or the job failed (then `error`
    /// says why).
    pub verdict: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<Unreadable>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One metric's polls and score for an item.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetricLabel {
    pub metric: Metric,
    pub polls: Vec<Poll>,
    /// Share of "yes" under the policy; `None` when no poll gave a usable verdict.
    pub score: Option<f64>,
}

/// The final label of one item for one judge (a row of `labels.jsonl`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ItemLabel {
    pub pipeline: String,
    pub model: String,
    pub index: u32,
    pub id: String,
    pub line: usize,
    pub label: bool,
    pub metrics: Vec<MetricLabel>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selfcheck: Option<SelfCheckLabel>,
    /// The token-log-probability baselines (stored as `pseudo_entropy` before issue 29).
    #[serde(default, alias = "pseudo_entropy", skip_serializing_if = "Option::is_none")]
    pub logprob_scores: Option<LogprobScores>,
}

/// Sentences of an English passage: split after `.`, `!` or `?` followed by
/// whitespace, and at line breaks; empty pieces dropped. (SelfCheckGPT uses spaCy's
/// splitter; this rule agrees on plain prose. The passage-level Avg score does not depend
/// on the split at all; the Max score does.)
pub fn sentences(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    for (n, &(i, c)) in chars.iter().enumerate() {
        let next_ws = chars.get(n + 1).is_none_or(|&(_, d)| d.is_whitespace());
        if c == '\n' || (matches!(c, '.' | '!' | '?') && next_ws) {
            let end = i + c.len_utf8();
            out.push(&text[start..end]);
            start = end;
        }
    }
    out.push(&text[start..]);
    out.into_iter().map(str::trim).filter(|s| s.chars().any(char::is_alphanumeric)).collect()
}

/// The ChainPoll score of an item's polls under the policy (failed polls left out).
fn score_of(cfg: &Config, polls: &[Poll]) -> Option<f64> {
    let answered: Vec<Option<bool>> =
        polls.iter().filter(|p| p.error.is_none()).map(|p| p.verdict).collect();
    chainpoll_score_parsed(&answered, cfg.unparseable).ok()
}

/// Reads a stored label's verdicts again from the polls' outputs with the current rule,
/// and its scores with them: a label stored by an earlier version (whose rule read a
/// stray "yes"/"no", issue 29) is reported as a fresh one would be. Returns how many
/// verdicts changed.
pub fn reread_verdicts(cfg: &Config, label: &mut ItemLabel) -> usize {
    let mut changed = 0;
    for m in &mut label.metrics {
        // A structured refusal was read from the API's flag, which the text does not keep.
        let readable =
            |p: &&mut Poll| p.error.is_none() && p.unreadable != Some(Unreadable::Refusal);
        for p in m.polls.iter_mut().filter(readable) {
            let Some(text) = &p.output else { continue };
            let parsed = parse_verdict_answer_line(text);
            changed += usize::from(p.verdict != parsed.ok());
            (p.verdict, p.unreadable) = (parsed.ok(), parsed.err());
        }
        m.score = score_of(cfg, &m.polls);
    }
    changed
}

/// Advances one item as far as the known results allow.
pub fn evaluate(
    cfg: &Config,
    index: u32,
    item: &Item,
    results: &dyn ResultLookup,
) -> Plan<ItemLabel> {
    let mut waiting = Vec::new();
    let mut metrics = Vec::new();
    for &metric in &cfg.metrics {
        let mut polls = Vec::new();
        for i in 0..cfg.polls {
            let req = cfg.poll_request(metric, item, i);
            match results.get(&req.id()) {
                None => waiting.push(req),
                Some(JobOutcome::Failed(e)) => polls.push(Poll {
                    output: None,
                    verdict: None,
                    unreadable: None,
                    error: Some(format!("poll job failed: {e}")),
                }),
                Some(JobOutcome::Done(c)) => {
                    let parsed = if c.refusal {
                        Err(Unreadable::Refusal)
                    } else {
                        parse_verdict_answer_line(&c.text)
                    };
                    polls.push(Poll {
                        output: Some(c.text.clone()),
                        verdict: parsed.ok(),
                        unreadable: parsed.err(),
                        error: None,
                    })
                }
            }
        }
        let score = score_of(cfg, &polls);
        metrics.push(MetricLabel { metric, polls, score });
    }
    let selfcheck =
        cfg.sampler.as_ref().map(|(m, s)| baselines::selfcheck(m, *s, item, results, &mut waiting));
    let logprob_scores = match &cfg.probability {
        Some(m) if baselines::probability_support(m).is_ok() => {
            baselines::logprob_scores(m, item, results, &mut waiting)
        }
        _ => None,
    };
    if !waiting.is_empty() {
        return Plan::Waiting(waiting);
    }
    Plan::Done(ItemLabel {
        pipeline: PIPELINE.into(),
        model: cfg.judge.name.clone(),
        index,
        id: item.id.clone(),
        line: item.line,
        label: item.label,
        metrics,
        selfcheck,
        logprob_scores,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use halyard_proto::{Completion, Failure, FailureKind, JobId, Outcome, Usage};
    use std::collections::HashMap;

    fn spec(name: &str) -> ModelSpec {
        ModelSpec { temperature: 0.7, ..crate::common::test_model(name) }
    }

    fn item() -> Item {
        Item {
            line: 1,
            id: "1".into(),
            prompt: "Tell me.".into(),
            completion: "The sky is green. It rains.".into(),
            context: None,
            label: true,
        }
    }

    /// Polls are separate jobs; verdicts are the final yes/no; a failed poll is left out
    /// of N and an unparseable one follows the policy; SelfCheck uses the samples.
    #[test]
    fn polls_and_baseline() {
        for (policy, want) in [(Unparseable::Exclude, 2.0 / 3.0), (Unparseable::CountAsNo, 0.5)] {
            let cfg = Config {
                judge: spec("j"),
                polls: 5,
                metrics: vec![Metric::Correctness],
                unparseable: policy,
                sampler: Some((spec("s"), 2)),
                probability: None,
            };
            let Plan::Waiting(jobs) = evaluate(&cfg, 0, &item(), &HashMap::<JobId, Outcome>::new())
            else {
                panic!()
            };
            assert_eq!(jobs.len(), 7);
            let outputs = [
                "Reasoning.\nAnswer: yes",
                "Answer: no",
                "hmm",
                "FAIL",
                "Yes, clearly.\nAnswer: YES",
            ];
            let mut known = HashMap::new();
            for (i, j) in jobs.iter().enumerate() {
                let text = if i < 5 { outputs[i] } else { "the sky is blue. it rains." };
                let o = if text == "FAIL" { failed() } else { done(text, None) };
                known.insert(j.id(), o);
            }
            let Plan::Done(l) = evaluate(&cfg, 0, &item(), &known) else { panic!() };
            assert!((l.metrics[0].score.unwrap() - want).abs() < 1e-12, "{policy:?}");
            assert_eq!(l.metrics[0].polls.iter().filter(|p| p.error.is_some()).count(), 1);
            let sc = l.selfcheck.unwrap();
            assert_eq!(sc.samples, 2);
            assert!(sc.avg.unwrap() > 0.0 && sc.max.unwrap() >= sc.avg.unwrap());
        }
    }

    fn done(text: &str, logprobs: Option<Vec<halyard_proto::TokenLogprob>>) -> Outcome {
        Outcome::Done(Completion {
            text: text.into(),
            usage: Usage::default(),
            latency_ms: 0,
            finish_reason: None,
            calls: 1,
            logprobs,
            refusal: false,
            source: Default::default(),
        })
    }

    fn failed() -> Outcome {
        Outcome::Failed(Failure {
            kind: FailureKind::Permanent,
            error: "x".into(),
            http_status: None,
        })
    }

    /// Issue 16: an item whose samples all failed is unscored by SelfCheck and says why (it
    /// was scored on the completion alone); a partial failure is counted.
    #[test]
    fn all_samples_failed_is_unscored() {
        let cfg = Config {
            judge: spec("j"),
            polls: 1,
            metrics: vec![Metric::Correctness],
            unparseable: Unparseable::Exclude,
            sampler: Some((spec("s"), 2)),
            probability: None,
        };
        let Plan::Waiting(jobs) = evaluate(&cfg, 0, &item(), &HashMap::<JobId, Outcome>::new())
        else {
            panic!()
        };
        for (fail_second, want) in [(true, None), (false, Some(()))] {
            let mut known = HashMap::new();
            for j in &jobs {
                let o = match j.key.stage.as_str() {
                    "sample" if j.key.sample_index == 1 || fail_second => failed(),
                    "sample" => done("the sky is green. it rains.", None),
                    _ => done("Answer: yes", None),
                };
                known.insert(j.id(), o);
            }
            let Plan::Done(l) = evaluate(&cfg, 0, &item(), &known) else { panic!() };
            let sc = l.selfcheck.unwrap();
            assert_eq!(sc.avg.map(|_| ()), want);
            assert_eq!(sc.failed_samples, if fail_second { 2 } else { 1 });
            if fail_second {
                assert_eq!(sc.error.as_deref(), Some("every sample job failed (2 of 2): unscored"));
            }
        }
    }

    /// Issue 16: a gguf probability model gets one scoring job (prompt, then completion as
    /// the assistant message, log-probabilities with 5 alternatives); an openai one gets no
    /// job. Issue 29: the label holds the max and the mean pseudo-entropy over tokens and
    /// SelfCheckGPT's Avg(−log p) and Max(−log p), each under its own name.
    #[test]
    fn pseudo_entropy_from_a_scoring_job() {
        use halyard_proto::{TokenLogprob, TopLogprob};
        let mut local = spec("p");
        local.model_ref.backend = "gguf".into();
        let mut cfg = Config {
            judge: spec("j"),
            polls: 1,
            metrics: vec![Metric::Correctness],
            unparseable: Unparseable::Exclude,
            sampler: None,
            probability: Some(local),
        };
        let Plan::Waiting(jobs) = evaluate(&cfg, 0, &item(), &HashMap::<JobId, Outcome>::new())
        else {
            panic!()
        };
        let p = jobs.iter().find(|j| j.key.stage == "probability").expect("a scoring job");
        assert_eq!(p.key.messages[1], ChatMessage::assistant(item().completion));
        assert_eq!(p.key.sampling.logprobs.map(|l| (l.top, l.score_last)), Some((5, true)));
        let token = |t: &str, probs: &[f64]| TokenLogprob {
            token: t.into(),
            logprob: probs[0].ln(),
            top: probs
                .iter()
                .enumerate()
                .map(|(i, q)| TopLogprob {
                    token: if i == 0 { t.into() } else { format!("{t}{i}") },
                    logprob: q.ln(),
                })
                .collect(),
        };
        let lp = vec![token("a", &[0.2; 5]), token("b", &[0.1; 5])];
        let mut known: HashMap<JobId, Outcome> = HashMap::new();
        for j in &jobs {
            let o = if j.key.stage == "probability" {
                done("", Some(lp.clone()))
            } else {
                done("Answer: no", None)
            };
            known.insert(j.id(), o);
        }
        let Plan::Done(l) = evaluate(&cfg, 0, &item(), &known) else { panic!() };
        let j = serde_json::to_value(&l).unwrap();
        let pe = &j["logprob_scores"];
        let close = |key: &str, want: f64| {
            assert!((pe[key].as_f64().unwrap() - want).abs() < 1e-12, "{key}: {pe}");
        };
        assert_eq!(pe["tokens"], 2);
        close("pseudo_entropy_mean", (5f64.ln() + 10f64.ln()) / 2.0);
        close("pseudo_entropy_max", 10f64.ln());
        // Tokens "a", "b": one sentence, p 0.2 and 0.1.
        close("avg_neg_logprob", (5f64.ln() + 10f64.ln()) / 2.0);
        close("max_neg_logprob", 10f64.ln());
        // A label stored before issue 29 (`pseudo_entropy.score`) still reads, as the mean.
        let old = json_label_with_old_pseudo_entropy(&j);
        assert_eq!(old.logprob_scores.unwrap().pseudo_entropy_mean, Some(0.25));
        cfg.probability = Some(spec("o"));
        let Plan::Waiting(jobs) = evaluate(&cfg, 0, &item(), &HashMap::<JobId, Outcome>::new())
        else {
            panic!()
        };
        assert!(jobs.iter().all(|j| j.key.stage != "probability"));
    }

    /// Issue 29: a poll without the required final line `Answer: yes|no` is unparseable
    /// and counted as such, not read from a stray "yes"/"no": prose, an echo of the
    /// instruction, a refusal, an empty output.
    #[test]
    fn verdict_needs_the_answer_line() {
        let cfg = Config {
            judge: spec("j"),
            polls: 6,
            metrics: vec![Metric::Correctness],
            unparseable: Unparseable::CountAsNo,
            sampler: None,
            probability: None,
        };
        let echo = "After your reasoning, end with one final line, exactly \"Answer: yes\" if the answer contains a hallucination, or \"Answer: no\" if it does not.";
        let outputs = [
            "This is false; there is no evidence",
            echo,
            "",
            "I'm sorry, but I can't assist with that.",
            "Claim 1 is invented.\nAnswer: yes",
            "Every claim holds.\nAnswer: no",
        ];
        let Plan::Waiting(jobs) = evaluate(&cfg, 0, &item(), &HashMap::<JobId, Outcome>::new())
        else {
            panic!()
        };
        let known: HashMap<JobId, Outcome> = jobs
            .iter()
            .map(|j| (j.id(), done(outputs[j.key.sample_index as usize], None)))
            .collect();
        let Plan::Done(l) = evaluate(&cfg, 0, &item(), &known) else { panic!() };
        let verdicts: Vec<Option<bool>> = l.metrics[0].polls.iter().map(|p| p.verdict).collect();
        assert_eq!(verdicts, [None, None, None, None, Some(true), Some(false)]);
        let why: Vec<Option<Unreadable>> =
            l.metrics[0].polls.iter().map(|p| p.unreadable).collect();
        use Unreadable::{Empty, NoAnswerLine};
        assert_eq!(
            why,
            [Some(NoAnswerLine), Some(NoAnswerLine), Some(Empty), Some(NoAnswerLine), None, None]
        );
        // Counted as "no" by policy, but as unparseable polls, not as verdicts.
        assert!((l.metrics[0].score.unwrap() - 1.0 / 6.0).abs() < 1e-12);
        assert!(l.metrics[0].polls.iter().all(|p| p.error.is_none()));
    }

    /// Issue 29: a structured refusal is no verdict, even when its words end with the
    /// answer line, and a re-read keeps it a refusal.
    #[test]
    fn a_refusal_is_no_verdict() {
        let cfg = Config {
            judge: spec("j"),
            polls: 1,
            metrics: vec![Metric::Correctness],
            unparseable: Unparseable::Exclude,
            sampler: None,
            probability: None,
        };
        let Plan::Waiting(jobs) = evaluate(&cfg, 0, &item(), &HashMap::<JobId, Outcome>::new())
        else {
            panic!()
        };
        let refusal = match done("I won't judge this.\nAnswer: no", None) {
            Outcome::Done(c) => Outcome::Done(Completion { refusal: true, ..c }),
            o => o,
        };
        let known: HashMap<JobId, Outcome> =
            jobs.iter().map(|j| (j.id(), refusal.clone())).collect();
        let Plan::Done(mut l) = evaluate(&cfg, 0, &item(), &known) else { panic!() };
        let p = &l.metrics[0].polls[0];
        assert_eq!((p.verdict, p.unreadable), (None, Some(Unreadable::Refusal)));
        assert_eq!(reread_verdicts(&cfg, &mut l), 0);
        assert_eq!(l.metrics[0].polls[0].unreadable, Some(Unreadable::Refusal));
    }

    /// Issue 29: a label stored with the old rule's verdicts is read again with the
    /// strict one (verdicts, reasons and score), so an old run's report follows the rule.
    #[test]
    fn stored_labels_are_reread() {
        let cfg = Config {
            judge: spec("j"),
            polls: 2,
            metrics: vec![Metric::Correctness],
            unparseable: Unparseable::Exclude,
            sampler: None,
            probability: None,
        };
        let mut l: ItemLabel = serde_json::from_value(serde_json::json!({
            "pipeline": "chainpoll", "model": "j", "index": 0, "id": "1", "line": 1, "label": true,
            "metrics": [{"metric": "correctness", "score": 0.5, "polls": [
                {"output": "This is false; there is no evidence", "verdict": false},
                {"output": "Reasoning.\nAnswer: yes", "verdict": true}]}]
        }))
        .unwrap();
        assert_eq!(reread_verdicts(&cfg, &mut l), 1);
        let m = &l.metrics[0];
        assert_eq!(
            (m.polls[0].verdict, m.polls[0].unreadable),
            (None, Some(Unreadable::NoAnswerLine))
        );
        assert_eq!(m.score, Some(1.0));
        assert_eq!(reread_verdicts(&cfg, &mut l), 0);
    }

    fn json_label_with_old_pseudo_entropy(label: &serde_json::Value) -> ItemLabel {
        let mut v = label.clone();
        let o = v.as_object_mut().unwrap();
        o.remove("logprob_scores");
        o.insert("pseudo_entropy".into(), serde_json::json!({"score": 0.25, "tokens": 2}));
        serde_json::from_value(v).unwrap()
    }

    /// Sentence split on end punctuation followed by space, and on line breaks.
    #[test]
    fn sentence_split() {
        assert_eq!(sentences("A b. C 3.5 d!  E?\nF"), ["A b.", "C 3.5 d!", "E?", "F"]);
        assert!(sentences(" \n ").is_empty());
    }
}

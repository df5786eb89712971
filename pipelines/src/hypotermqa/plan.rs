//! The planner: one question → the jobs it needs → its [`ItemLabel`].
//!
//! [`evaluate`] is a pure function of the configuration, the question and the results
//! known so far. It walks the stages in order and stops at the first result it lacks,
//! returning every job that is needed *and ready* now (the two terms proceed in
//! parallel). Calling it again with more results continues; calling it with the same
//! results returns the same answer.
//!
//! Stages (pipeline `hypotermqa`, stage version [`STAGE_VERSION`]):
//! 1. `answer`: the model under test answers the question (optional system prompt +
//!    the question verbatim). A dead letter ends the item as `unanswered`.
//! 2. Inclusion check of each term (string match, no job). Excluded terms are irrelevant.
//! 3. `acceptance` (judge) for each included term.
//! 4. `meaning` (judge) for included valid terms: paper mode only after MENTIONED;
//!    reference mode for every one, requested together with `acceptance`.
//!
//! Paper mode retries an unusable judge output: attempt 1 repeats the prompt with
//! `sample_index` 1 (a new job id), attempt 2 adds the bad output and a repair
//! instruction (`sample_index` 2); still unusable, or a failed judge job, gives
//! `judge_error`. Reference mode makes one call per check.
//!
//! A judge job that ended as a dead letter is `judge_error` in **both** semantics (issue
//! 16). This deviates from the authors' Ollama path, which returns the string
//! `"WARNING! Model failure."` after its retries and then parses it, fails, and labels the
//! check **valid**: an infrastructure failure would raise the reference HTS. Reference mode
//! keeps the authors' rule for outputs the judge did give (an unparseable output is still
//! valid there); only a missing output is an error.

use halyard_proto::ChatMessage;
use serde::{Deserialize, Serialize};

use super::dataset::{Question, Term};
use super::judge::{
    parse_paper_certainty, parse_paper_verified, reference_certainty, reference_verified,
    JudgeKind, JudgeParseError, ReferenceReading, Verdict,
};
use super::labels::{
    paper_answer_label, paper_needs_meaning, paper_rows, paper_term_label, reference_answer_label,
    reference_rows, worst, AnswerLabel, CheckRow, ItemLabel, JudgeAttempt, JudgeCheck, Judged,
    Label, TermEval,
};
use super::prompts::{acceptance_messages, answer_messages, meaning_messages, repair_messages};
use super::string_match::{paper_includes, reference_includes};
use super::Semantics;
use crate::common::{odd_kind, JobOutcome, JobRequest, ModelSpec, Plan, ResultLookup};

/// The pipeline name in job keys.
pub const PIPELINE: &str = "hypotermqa";
/// Bumped whenever a prompt or a parsing rule that feeds a job changes.
pub const STAGE_VERSION: u32 = 1;
/// Paper mode: judge calls per check (two plain, one repair).
pub const PAPER_JUDGE_ATTEMPTS: u32 = 3;

/// How one model is evaluated on HypoTermQA.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    #[serde(default)]
    pub semantics: Semantics,
    /// The model under test.
    pub model: ModelSpec,
    /// The judge (temperature normally 0).
    pub judge: ModelSpec,
    /// Optional system prompt for the model under test (none in the paper).
    pub system_prompt: Option<String>,
}

impl Config {
    /// The `answer` job of a question.
    pub fn answer_request(&self, q: &Question) -> JobRequest {
        let messages = answer_messages(self.system_prompt.as_deref(), &q.question);
        self.model.request(PIPELINE, "answer", STAGE_VERSION, messages, 0)
    }
}

/// Advances one question as far as the known results allow.
pub fn evaluate(cfg: &Config, q: &Question, results: &dyn ResultLookup) -> Plan<ItemLabel> {
    let answer_req = cfg.answer_request(q);
    let answer_job = answer_req.id().to_string();
    let item =
        |answer: Option<String>, answer_kind, answer_error: Option<String>, answer_label, terms| {
            ItemLabel {
                question_id: q.id,
                question_type: q.question_type(),
                question: q.question.clone(),
                model: cfg.model.name.clone(),
                judge: cfg.judge.name.clone(),
                semantics: cfg.semantics,
                answer_job: answer_job.clone(),
                answer,
                answer_kind,
                answer_error,
                answer_label,
                terms,
            }
        };
    let answer = match results.get(&answer_req.id()) {
        None => return Plan::Waiting(vec![answer_req]),
        Some(JobOutcome::Failed(error)) => {
            let terms =
                q.terms.iter().map(|t| term_eval(t, false, None, None, None, Vec::new())).collect();
            return Plan::Done(item(
                None,
                None,
                Some(error.to_string()),
                AnswerLabel::Unanswered,
                terms,
            ));
        }
        // An empty answer or a refusal is labelled by the paper's rules like any answer
        // (no term is included in it, so both terms are irrelevant) and counted apart in
        // the report (issue 29).
        Some(JobOutcome::Done(c)) => (c.text.clone(), odd_kind(c)),
    };
    let (answer, answer_kind) = answer;
    let mut waiting: Vec<JobRequest> = Vec::new();
    let mut terms = Vec::with_capacity(2);
    for t in &q.terms {
        let step = match cfg.semantics {
            Semantics::Paper => paper_term(cfg, q, &answer, t, results),
            Semantics::Reference => reference_term(cfg, q, &answer, t, results),
        };
        match step {
            Ok(te) => terms.push(te),
            Err(reqs) => {
                for r in reqs {
                    if !waiting.iter().any(|w| w.key == r.key) {
                        waiting.push(r);
                    }
                }
            }
        }
    }
    if !waiting.is_empty() {
        return Plan::Waiting(waiting);
    }
    let answer_label = match cfg.semantics {
        Semantics::Paper => paper_answer_label(terms.iter().filter_map(|t| t.term_label)),
        Semantics::Reference => reference_answer_label(terms.iter().flat_map(|t| &t.rows)),
    };
    Plan::Done(item(Some(answer), answer_kind, None, answer_label, terms))
}

fn term_eval(
    t: &Term,
    included: bool,
    acceptance: Option<JudgeCheck>,
    meaning: Option<JudgeCheck>,
    term_label: Option<Label>,
    rows: Vec<CheckRow>,
) -> TermEval {
    TermEval {
        term: t.term.clone(),
        term_id: t.term_id,
        is_hypothetical: t.is_hypothetical,
        term_set: t.term_set,
        included,
        acceptance,
        meaning,
        term_label,
        rows,
    }
}

/// A term is either finished or waiting for these jobs.
type TermStep = Result<TermEval, Vec<JobRequest>>;

/// A judge check is finished (its attempts and verdict) or needs this job next.
type JudgeStep<T> = Result<(Vec<JudgeAttempt>, Option<Verdict<T>>), Box<JobRequest>>;

fn paper_term(
    cfg: &Config,
    q: &Question,
    answer: &str,
    t: &Term,
    results: &dyn ResultLookup,
) -> TermStep {
    let included = paper_includes(answer, &t.term);
    if !included {
        let rows = paper_rows(t.is_hypothetical, false, Judged::NotRun, Judged::NotRun);
        return Ok(term_eval(t, false, None, None, Some(Label::Irrelevant), rows));
    }
    let base = acceptance_messages(&t.term, &q.question, answer);
    let (acc_attempts, acc) =
        paper_judge(cfg, JudgeKind::Acceptance, &t.term, base, results, parse_paper_certainty)
            .map_err(|r| vec![*r])?;
    let acceptance = judged(&acc);
    let mut meaning_run = None;
    if paper_needs_meaning(t.is_hypothetical, acceptance) {
        let base = meaning_messages(&t.term, &t.explanation, &q.question, answer);
        meaning_run = Some(
            paper_judge(cfg, JudgeKind::Meaning, &t.term, base, results, parse_paper_verified)
                .map_err(|r| vec![*r])?,
        );
    }
    let meaning = meaning_run.as_ref().map_or(Judged::NotRun, |(_, v)| judged(v));
    let rows = paper_rows(t.is_hypothetical, true, acceptance, meaning);
    let row_label = |i: usize| rows.get(i).map_or(Label::JudgeError, |r| r.label);
    let acc_parsed = acc.as_ref().map(|v| v.value.as_str().to_string());
    let acc_check =
        paper_check(acc_attempts, acc_parsed, row_label(1), acc.and_then(|v| v.reasoning));
    let meaning_check = meaning_run.map(|(attempts, verdict)| {
        let parsed = verdict.as_ref().map(|v| if v.value { "TRUE" } else { "FALSE" }.to_string());
        paper_check(attempts, parsed, row_label(2), verdict.and_then(|v| v.reasoning))
    });
    // Always `Some` here: acceptance ran, and meaning ran whenever it is needed.
    let label = paper_term_label(t.is_hypothetical, true, acceptance, meaning)
        .or_else(|| worst(rows.iter().map(|r| r.label)))
        .unwrap_or(Label::JudgeError);
    Ok(term_eval(t, true, Some(acc_check), meaning_check, Some(label), rows))
}

fn judged<T: Copy>(v: &Option<Verdict<T>>) -> Judged<T> {
    v.as_ref().map_or(Judged::JudgeError, |v| Judged::Value(v.value))
}

fn paper_check(
    attempts: Vec<JudgeAttempt>,
    parsed: Option<String>,
    label: Label,
    reasoning: Option<String>,
) -> JudgeCheck {
    JudgeCheck { attempts, parsed, label, reasoning, reflection: None }
}

/// Runs one paper-mode judge check as far as the results allow: `Err` is the next job;
/// `Ok` holds the attempts and the verdict (`None`: judge error).
fn paper_judge<T>(
    cfg: &Config,
    kind: JudgeKind,
    term: &str,
    base: Vec<ChatMessage>,
    results: &dyn ResultLookup,
    parse: fn(&str) -> Result<Verdict<T>, JudgeParseError>,
) -> JudgeStep<T> {
    let mut attempts = Vec::new();
    let mut last_bad = String::new();
    for sample_index in 0..PAPER_JUDGE_ATTEMPTS {
        let messages = if sample_index + 1 < PAPER_JUDGE_ATTEMPTS {
            base.clone()
        } else {
            repair_messages(&base, &last_bad, kind)
        };
        let req = cfg.judge.judge_request(
            PIPELINE,
            kind.stage(),
            STAGE_VERSION,
            messages,
            sample_index,
            || kind.output_schema(term),
        );
        let job_id = req.id().to_string();
        match results.get(&req.id()) {
            None => return Err(Box::new(req)),
            Some(JobOutcome::Failed(e)) => {
                attempts.push(JudgeAttempt {
                    job_id,
                    output: None,
                    error: Some(format!("judge job failed: {e}")),
                    odd: None,
                });
                return Ok((attempts, None));
            }
            // An empty output or a refusal is an unusable output like any other: asked
            // again, then judge_error (issue 29: counted by its kind in the report).
            Some(JobOutcome::Done(c)) => match odd_kind(c)
                .map_or_else(|| parse(&c.text), |k| Err(JudgeParseError::NoVerdict(k)))
            {
                Ok(v) => {
                    attempts.push(JudgeAttempt {
                        job_id,
                        output: Some(c.text.clone()),
                        error: None,
                        odd: None,
                    });
                    return Ok((attempts, Some(v)));
                }
                Err(e) => {
                    attempts.push(JudgeAttempt {
                        job_id,
                        output: Some(c.text.clone()),
                        error: Some(e.to_string()),
                        odd: odd_kind(c),
                    });
                    last_bad = c.text.clone();
                }
            },
        }
    }
    Ok((attempts, None))
}

fn reference_term(
    cfg: &Config,
    q: &Question,
    answer: &str,
    t: &Term,
    results: &dyn ResultLookup,
) -> TermStep {
    let included = reference_includes(answer, &t.term);
    if !included {
        let rows = reference_rows(t.is_hypothetical, false, None, None);
        return Ok(term_eval(t, false, None, None, Some(Label::Irrelevant), rows));
    }
    let acc = reference_judge(
        cfg,
        JudgeKind::Acceptance,
        &t.term,
        acceptance_messages(&t.term, &q.question, answer),
        results,
        reference_certainty,
    );
    let meaning = (!t.is_hypothetical).then(|| {
        reference_judge(
            cfg,
            JudgeKind::Meaning,
            &t.term,
            meaning_messages(&t.term, &t.explanation, &q.question, answer),
            results,
            reference_verified,
        )
    });
    let (acc, meaning) = match (acc, meaning) {
        (Ok(a), None) => (a, None),
        (Ok(a), Some(Ok(m))) => (a, Some(m)),
        (a, m) => {
            let waiting =
                [a.err(), m.and_then(Result::err)].into_iter().flatten().map(|r| *r).collect();
            return Err(waiting);
        }
    };
    let mut rows = reference_rows(
        t.is_hypothetical,
        true,
        Some(&acc.1.value),
        meaning.as_ref().map(|m| &m.1.value),
    );
    // A dead-lettered judge job gave no output: its row is judge_error, not the authors'
    // "parse failure counts as valid" (see the module doc).
    for (row, check) in rows.iter_mut().skip(1).zip([Some(&acc), meaning.as_ref()]) {
        if check.is_some_and(|(attempt, _)| attempt.output.is_none()) {
            row.label = Label::JudgeError;
        }
    }
    let label = worst(rows.iter().map(|r| r.label)).unwrap_or(Label::Valid);
    let row_label = |i: usize| rows.get(i).map_or(Label::Valid, |r| r.label);
    let acc_check = reference_check(acc, row_label(1));
    let meaning_check = meaning.map(|m| reference_check(m, row_label(2)));
    Ok(term_eval(t, true, Some(acc_check), meaning_check, Some(label), rows))
}

/// One reference-mode judge call: `Err` is the job still needed.
fn reference_judge(
    cfg: &Config,
    kind: JudgeKind,
    term: &str,
    messages: Vec<ChatMessage>,
    results: &dyn ResultLookup,
    read: fn(&str) -> ReferenceReading,
) -> Result<(JudgeAttempt, ReferenceReading), Box<JobRequest>> {
    let req = cfg.judge.judge_request(PIPELINE, kind.stage(), STAGE_VERSION, messages, 0, || {
        kind.output_schema(term)
    });
    let job_id = req.id().to_string();
    match results.get(&req.id()) {
        None => Err(Box::new(req)),
        Some(JobOutcome::Failed(e)) => {
            let error = format!("judge job failed: {e}");
            let reading = ReferenceReading {
                value: Err(error.clone()),
                reflection: error.clone(),
                reasoning: None,
            };
            Ok((JudgeAttempt { job_id, output: None, error: Some(error), odd: None }, reading))
        }
        // An empty output or a refusal is no output (issue 29): judge_error, like a dead
        // letter, and not the authors' "unparseable counts as valid", which is about what
        // their judge did say. The words of a refusal stay in the error.
        Some(JobOutcome::Done(c)) if odd_kind(c).is_some() => {
            let error = JudgeParseError::NoVerdict(c.kind()).to_string();
            let error = match c.kind() {
                halyard_proto::AnswerKind::Refusal => format!("{error}: {:?}", c.text),
                _ => error,
            };
            let reading = ReferenceReading {
                value: Err(error.clone()),
                reflection: error.clone(),
                reasoning: None,
            };
            Ok((
                JudgeAttempt { job_id, output: None, error: Some(error), odd: odd_kind(c) },
                reading,
            ))
        }
        Some(JobOutcome::Done(c)) => {
            let reading = read(&c.text);
            let error = reading.value.as_ref().err().cloned();
            Ok((JudgeAttempt { job_id, output: Some(c.text.clone()), error, odd: None }, reading))
        }
    }
}

fn reference_check(
    (attempt, reading): (JudgeAttempt, ReferenceReading),
    label: Label,
) -> JudgeCheck {
    JudgeCheck {
        attempts: vec![attempt],
        parsed: reading.value.ok(),
        label,
        reasoning: reading.reasoning,
        reflection: Some(reading.reflection),
    }
}

#[cfg(test)]
mod tests;

use std::collections::HashMap;

use halyard_proto::{
    AnswerKind, Completion, Failure, FailureKind, JobId, ModelRef, Outcome, Role, Usage,
};

use super::*;
use crate::hypotermqa::dataset::parse_line;
use crate::hypotermqa::labels::EvalType;
use crate::hypotermqa::score::{QuestionCounts, ScoreMeta};

fn spec(name: &str, temperature: f32) -> ModelSpec {
    ModelSpec {
        name: name.into(),
        model_ref: ModelRef {
            backend: "openai".into(),
            endpoint: "http://x/v1".into(),
            model: name.into(),
        },
        pool: format!("pool-{name}"),
        api_key_env: None,
        temperature,
        max_tokens: Some(512),
        seed: None,
        timeout_ms: 60_000,
        structured_output: false,
    }
}

fn cfg(semantics: Semantics) -> Config {
    Config { semantics, model: spec("m", 0.7), judge: spec("j", 0.0), system_prompt: None }
}

const LINE: &str = r#"{"questionId": 1, "isHypotheticalQuestion": true, "question": "How does Nanorobotics relate to Nano-Sync Fusion?", "replacementType": "none", "terms": [{"termId": 1, "isHypotheticalTerm": false, "termSetId": 1, "termSet": "llm_suggestion", "term": "Nanorobotics", "explanation": "Robots at the nanoscale.\n"}, {"termId": 1, "isHypotheticalTerm": true, "termSetId": 0, "termSet": "hypothetical", "term": "Nano-Sync Fusion", "explanation": " Made up."}]}"#;

fn question() -> Question {
    parse_line("test", 1, LINE).unwrap()
}

fn done(text: &str) -> Outcome {
    Outcome::Done(Completion {
        text: text.into(),
        usage: Usage::default(),
        latency_ms: 1,
        finish_reason: None,
        calls: 1,
        logprobs: None,
        refusal: false,
        source: Default::default(),
    })
}

fn failed(e: &str) -> Outcome {
    Outcome::Failed(Failure {
        kind: FailureKind::Permanent,
        error: e.into(),
        http_status: Some(400),
    })
}

fn waiting(p: Plan<ItemLabel>) -> Vec<JobRequest> {
    match p {
        Plan::Waiting(w) => w,
        Plan::Done(l) => panic!("expected Waiting, got Done({l:?})"),
    }
}

fn finished(p: Plan<ItemLabel>) -> ItemLabel {
    match p {
        Plan::Done(l) => l,
        Plan::Waiting(w) => {
            panic!(
                "expected Done, still waiting for {:?}",
                w.iter().map(|r| &r.key.stage).collect::<Vec<_>>()
            )
        }
    }
}

fn is_hypo_term(r: &JobRequest) -> bool {
    r.key.messages[1].content.starts_with("TERM => Nano-Sync")
}

type Results = HashMap<JobId, Outcome>;

/// Paper mode: answer, then both acceptances in parallel, then meaning only for the accepted valid term.
#[test]
fn paper_stages_in_order_and_in_parallel() {
    let (c, q) = (cfg(Semantics::Paper), question());
    let mut res = Results::new();
    let w = waiting(evaluate(&c, &q, &res));
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].key.stage, "answer");
    assert_eq!(w[0].key.messages, vec![ChatMessage::user(q.question.clone())]);
    assert_eq!((w[0].key.sampling.temperature, w[0].pool.as_str()), (0.7, "pool-m"));
    res.insert(
        w[0].id(),
        done("Nanorobotics builds tiny robots; Nano-Sync Fusion is not a real concept."),
    );
    let w = waiting(evaluate(&c, &q, &res));
    assert_eq!(
        w.iter().map(|r| r.key.stage.as_str()).collect::<Vec<_>>(),
        ["acceptance", "acceptance"]
    );
    assert!(w.iter().all(|r| r.key.sampling.temperature == 0.0
        && r.pool == "pool-j"
        && r.key.sample_index == 0));
    for r in &w {
        res.insert(
            r.id(),
            done(if is_hypo_term(r) {
                "{\"certainty\": \"UNREAL\"}"
            } else {
                "{\"certainty\": \"MENTIONED\"}"
            }),
        );
    }
    let w = waiting(evaluate(&c, &q, &res));
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].key.stage, "meaning");
    assert!(w[0].key.messages[1]
        .content
        .starts_with("TERM => Nanorobotics: Robots at the nanoscale.\n\n\nQUESTION"));
    res.insert(w[0].id(), done("```json\n{\"reasoning\": \"right\", \"verified\": \"TRUE\"}\n```"));
    let l = finished(evaluate(&c, &q, &res));
    assert_eq!(l.answer_label, AnswerLabel::Valid);
    assert_eq!(l.terms[0].term_label, Some(Label::Valid));
    assert_eq!(l.terms[0].meaning.as_ref().and_then(|m| m.reasoning.as_deref()), Some("right"));
    assert_eq!(l.terms[1].acceptance.as_ref().and_then(|a| a.parsed.as_deref()), Some("UNREAL"));
    assert_eq!(
        l.terms[1].rows.iter().map(|r| r.eval_type).collect::<Vec<_>>(),
        [EvalType::CodeCheck, EvalType::Acceptance]
    );
    assert_eq!(finished(evaluate(&c, &q, &res)), l, "evaluate is idempotent");
}

/// Paper mode: two unusable outputs, a repair call, then judge_error; every attempt has its own job id.
#[test]
fn paper_retries_then_judge_error() {
    let (c, q) = (cfg(Semantics::Paper), question());
    let mut res = Results::new();
    let a = c.answer_request(&q);
    res.insert(a.id(), done("Nano-Sync Fusion is great."));
    let mut ids = vec![a.id()];
    let mut seen_messages = Vec::new();
    for round in 0..3 {
        let w = waiting(evaluate(&c, &q, &res));
        assert_eq!(w.len(), 1, "round {round}: only the hypothetical term is included");
        assert_eq!((w[0].key.stage.as_str(), w[0].key.sample_index), ("acceptance", round));
        ids.push(w[0].id());
        seen_messages.push(w[0].key.messages.clone());
        res.insert(w[0].id(), done(&format!("I think it is mentioned ({round}).")));
    }
    assert_eq!(seen_messages[0], seen_messages[1]);
    let repair = &seen_messages[2];
    assert_eq!(repair.len(), 4);
    assert_eq!(&repair[..2], &seen_messages[0][..]);
    assert_eq!(
        (repair[2].role, repair[2].content.as_str()),
        (Role::Assistant, "I think it is mentioned (1).")
    );
    let ids_set: std::collections::HashSet<_> = ids.iter().collect();
    assert_eq!(ids_set.len(), ids.len());
    let l = finished(evaluate(&c, &q, &res));
    let acc = l.terms[1].acceptance.as_ref().unwrap();
    assert_eq!(acc.attempts.len(), 3);
    assert!(acc
        .attempts
        .iter()
        .all(|a| a.error.as_deref() == Some("no JSON object found in the judge output")));
    assert_eq!((acc.parsed.as_ref(), acc.label), (None, Label::JudgeError));
    assert_eq!(l.terms[0].term_label, Some(Label::Irrelevant));
    assert_eq!(l.answer_label, AnswerLabel::JudgeError, "judge_error outranks irrelevant");
}

/// Paper mode: a failed judge job is judge_error at once; hallucination still outranks it.
#[test]
fn paper_failed_judge_job() {
    let (c, q) = (cfg(Semantics::Paper), question());
    let mut res = Results::new();
    res.insert(c.answer_request(&q).id(), done("Nanorobotics and Nano-Sync Fusion work together."));
    for r in waiting(evaluate(&c, &q, &res)) {
        res.insert(
            r.id(),
            if is_hypo_term(&r) {
                done("{\"certainty\":\"mentioned\"}")
            } else {
                failed("HTTP 400")
            },
        );
    }
    let l = finished(evaluate(&c, &q, &res));
    assert_eq!(l.terms[0].term_label, Some(Label::JudgeError));
    assert_eq!(
        l.terms[0].acceptance.as_ref().unwrap().attempts[0].error.as_deref(),
        Some("judge job failed: HTTP 400")
    );
    assert_eq!(l.terms[1].term_label, Some(Label::Hallucination));
    assert_eq!(l.answer_label, AnswerLabel::Hallucination);
}

/// A dead-lettered answer ends the item as unanswered, with no judge call.
#[test]
fn failed_answer_is_unanswered() {
    for semantics in [Semantics::Paper, Semantics::Reference] {
        let (c, q) = (cfg(semantics), question());
        let mut res = Results::new();
        res.insert(c.answer_request(&q).id(), failed("model not found"));
        let l = finished(evaluate(&c, &q, &res));
        assert_eq!(
            (l.answer_label, l.answer.as_ref(), l.answer_error.as_deref()),
            (AnswerLabel::Unanswered, None, Some("model not found"))
        );
        assert!(l.terms.iter().all(|t| !t.included
            && t.term_label.is_none()
            && t.rows.is_empty()
            && t.acceptance.is_none()));
    }
}

/// Reference mode: acceptance and meaning in one round; a dead-lettered judge job is
/// judge_error, not the authors' "WARNING! Model failure." read as valid (issue 16).
#[test]
fn reference_parallel_checks_and_model_failure() {
    let (c, q) = (cfg(Semantics::Reference), question());
    let mut res = Results::new();
    res.insert(c.answer_request(&q).id(), done("Nanorobotics and Nano-Sync Fusion work together."));
    let w = waiting(evaluate(&c, &q, &res));
    let mut stages: Vec<_> = w.iter().map(|r| (is_hypo_term(r), r.key.stage.as_str())).collect();
    stages.sort();
    assert_eq!(stages, [(false, "acceptance"), (false, "meaning"), (true, "acceptance")]);
    for r in &w {
        let out = match (is_hypo_term(r), r.key.stage.as_str()) {
            (true, _) => failed("timeout"),
            (false, "acceptance") => done("{\"certainty\": \"UNKNOWN\"}"),
            _ => done("x {\"verified\": FALSE}"),
        };
        res.insert(r.id(), out);
    }
    let l = finished(evaluate(&c, &q, &res));
    let hyp = &l.terms[1];
    assert_eq!(hyp.term_label, Some(Label::JudgeError), "no output is not a valid verdict");
    let acc = hyp.acceptance.as_ref().unwrap();
    assert_eq!((acc.label, acc.parsed.as_deref()), (Label::JudgeError, None));
    assert_eq!(acc.attempts[0].error.as_deref(), Some("judge job failed: timeout"));
    assert_eq!(
        hyp.rows.iter().map(|r| r.label).collect::<Vec<_>>(),
        [Label::Valid, Label::JudgeError]
    );
    let valid = &l.terms[0];
    assert_eq!(
        valid.rows.iter().map(|r| r.label).collect::<Vec<_>>(),
        [Label::Valid, Label::Irrelevant, Label::Hallucination]
    );
    assert_eq!(
        valid.term_label,
        Some(Label::Hallucination),
        "UNKNOWN + meaning FALSE: the [DIFF] row"
    );
    assert_eq!(l.answer_label, AnswerLabel::Hallucination);
}

/// Issue 16: in reference mode a dead-lettered judge job makes the answer judge_error (the
/// authors' Ollama path would label it valid); an unparseable output the judge did give
/// is still valid there.
#[test]
fn reference_dead_letter_is_judge_error_not_valid() {
    let (c, q) = (cfg(Semantics::Reference), question());
    let mut res = Results::new();
    res.insert(c.answer_request(&q).id(), done("Nanorobotics and Nano-Sync Fusion work together."));
    for r in waiting(evaluate(&c, &q, &res)) {
        let out = match (is_hypo_term(&r), r.key.stage.as_str()) {
            (true, _) => failed("max deliveries"),
            (false, "acceptance") => done("{\"certainty\": \"MENTIONED\"}"),
            _ => done("not json at all"),
        };
        res.insert(r.id(), out);
    }
    let l = finished(evaluate(&c, &q, &res));
    assert_eq!(l.terms[0].term_label, Some(Label::Valid), "garbage output: the authors' valid");
    assert_eq!(l.terms[1].term_label, Some(Label::JudgeError));
    assert_eq!(l.answer_label, AnswerLabel::JudgeError);
    let totals = QuestionCounts { hypothetical: 1, ..QuestionCounts::default() };
    let meta = ScoreMeta { model: "m".into(), judge: "j".into(), semantics: Semantics::Reference };
    let r = crate::hypotermqa::score(&meta, &totals, [&l]);
    assert_eq!((r.hts_share.numerator, r.judge_error.answers.numerator), (0, 1));
    assert_eq!((r.judge_error.checks.numerator, r.judge_error.checks.denominator), (1, 3));
}

/// Terms not included in the answer get no judge job; with neither included the item ends at once.
#[test]
fn excluded_terms_need_no_judge() {
    for semantics in [Semantics::Paper, Semantics::Reference] {
        let (c, q) = (cfg(semantics), question());
        let mut res = Results::new();
        res.insert(c.answer_request(&q).id(), done("I cannot help with that."));
        let l = finished(evaluate(&c, &q, &res));
        assert_eq!(l.answer_label, AnswerLabel::Irrelevant);
        assert!(l.terms.iter().all(|t| t.rows.len() == 1 && t.acceptance.is_none()));
    }
}

/// A system prompt, when configured, precedes the question and changes the job id.
#[test]
fn system_prompt_changes_the_answer_job() {
    let q = question();
    let plain = cfg(Semantics::Paper);
    let with = Config { system_prompt: Some("Be brief.".into()), ..plain.clone() };
    let (a, b) = (plain.answer_request(&q), with.answer_request(&q));
    assert_eq!(b.key.messages[0], ChatMessage::system("Be brief."));
    assert_ne!(a.id(), b.id());
}

fn odd(text: &str, refusal: bool) -> Outcome {
    match done(text) {
        Outcome::Done(c) => Outcome::Done(Completion { refusal, ..c }),
        o => o,
    }
}

/// Issue 29: an empty answer and a refusal are labelled by the rules (irrelevant: no term
/// included), marked on the item, and counted in the report, in both semantics.
#[test]
fn empty_and_refused_answers_are_counted() {
    for semantics in [Semantics::Paper, Semantics::Reference] {
        let (c, q) = (cfg(semantics), question());
        let mut labels = Vec::new();
        for (text, refusal, kind) in [
            ("", false, AnswerKind::Empty),
            ("  \n", false, AnswerKind::Empty),
            ("I can't assist with that.", true, AnswerKind::Refusal),
        ] {
            let mut res = Results::new();
            res.insert(c.answer_request(&q).id(), odd(text, refusal));
            let l = finished(evaluate(&c, &q, &res));
            assert_eq!((l.answer_label, l.answer_kind), (AnswerLabel::Irrelevant, Some(kind)));
            labels.push(l);
        }
        let totals = QuestionCounts { hypothetical: 1, ..QuestionCounts::default() };
        let meta = ScoreMeta { model: "m".into(), judge: "j".into(), semantics };
        // Three labels of one question: the last wins, and is the refusal.
        let r = crate::hypotermqa::score(&meta, &totals, &labels);
        assert_eq!((r.odd_answers.empty, r.odd_answers.refusal), (0, 1));
        let r = crate::hypotermqa::score(&meta, &totals, &labels[..1]);
        assert_eq!((r.odd_answers_hypothetical.empty, r.odd_answers_hypothetical.refusal), (1, 0));
        assert!(crate::hypotermqa::render_markdown(&r).contains("1 empty, 0 refusal"));
    }
}

/// Issue 29: a judge output that is empty or a refusal is no verdict: judge_error in
/// reference mode (not the authors' "unparseable counts as valid"), asked again and then
/// judge_error in paper mode; each counted in the report.
#[test]
fn empty_or_refused_judge_output_is_no_verdict() {
    for (text, refusal) in [("", false), ("I'm sorry, I can't help with that.", true)] {
        let (c, q) = (cfg(Semantics::Reference), question());
        let mut res = Results::new();
        res.insert(
            c.answer_request(&q).id(),
            done("Nanorobotics and Nano-Sync Fusion work together."),
        );
        for r in waiting(evaluate(&c, &q, &res)) {
            res.insert(r.id(), odd(text, refusal));
        }
        let l = finished(evaluate(&c, &q, &res));
        assert!(l.terms.iter().all(|t| t.term_label == Some(Label::JudgeError)), "{l:?}");
        assert_eq!(l.answer_label, AnswerLabel::JudgeError);
        let totals = QuestionCounts { hypothetical: 1, ..QuestionCounts::default() };
        let meta =
            ScoreMeta { model: "m".into(), judge: "j".into(), semantics: Semantics::Reference };
        let r = crate::hypotermqa::score(&meta, &totals, [&l]);
        assert_eq!(r.odd_judge_outputs.total(), 3, "two acceptance checks and one meaning check");
        assert_eq!(r.odd_judge_outputs.refusal, if refusal { 3 } else { 0 });

        let c = cfg(Semantics::Paper);
        let mut res = Results::new();
        res.insert(
            c.answer_request(&q).id(),
            done("Nanorobotics and Nano-Sync Fusion work together."),
        );
        for _ in 0..PAPER_JUDGE_ATTEMPTS {
            for r in waiting(evaluate(&c, &q, &res)) {
                res.insert(r.id(), odd(text, refusal));
            }
        }
        let l = finished(evaluate(&c, &q, &res));
        assert!(l.terms.iter().all(|t| t.term_label == Some(Label::JudgeError)), "{l:?}");
        let meta = ScoreMeta { model: "m".into(), judge: "j".into(), semantics: Semantics::Paper };
        let r = crate::hypotermqa::score(&meta, &totals, [&l]);
        assert_eq!(r.odd_judge_outputs.total(), 2 * u64::from(PAPER_JUDGE_ATTEMPTS));
    }
}

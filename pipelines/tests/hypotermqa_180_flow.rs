//! The planner over the real 180 questions, driven to completion by a fake coordinator
//! (an in-memory result map) and a fake model and judge with deterministic canned outputs.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use halyard_pipelines::common::{JobRequest, ModelSpec, Plan};
use halyard_pipelines::hypotermqa::{
    evaluate, read_dataset, render_markdown, score, AnswerLabel, Config, ItemLabel, Question,
    QuestionCounts, ScoreMeta, Semantics,
};
use halyard_proto::{Completion, Failure, FailureKind, JobId, ModelRef, Outcome, Usage};

fn questions() -> Vec<Question> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../datasets/hypotermqa/HypoTermQA_180.jsonl");
    read_dataset(&path).unwrap_or_else(|e| panic!("{e}"))
}

fn spec(name: &str) -> ModelSpec {
    ModelSpec {
        name: name.into(),
        model_ref: ModelRef {
            backend: "openai".into(),
            endpoint: "http://localhost:1/v1".into(),
            model: name.into(),
        },
        pool: format!("openai/{name}@k"),
        api_key_env: Some("KEY".into()),
        temperature: 0.0,
        max_tokens: None,
        seed: Some(1),
        timeout_ms: 30_000,
        structured_output: false,
    }
}

fn done(text: String) -> Outcome {
    Outcome::Done(Completion {
        text,
        usage: Usage::default(),
        latency_ms: 5,
        finish_reason: Some("stop".into()),
        calls: 1,
        logprobs: None,
        refusal: false,
        source: Default::default(),
    })
}

/// Canned outputs chosen from the question id (answers) or the job id (judge), so that
/// every path is taken: dead letters, refusals, echoes, garbage, fences, all verdicts.
fn fake(req: &JobRequest) -> Outcome {
    let b = req.id().0[0] as usize;
    match req.key.stage.as_str() {
        "answer" => {
            let question = &req.key.messages.last().expect("a user message").content;
            match question.len() % 10 {
                0 => Outcome::Failed(Failure {
                    kind: FailureKind::Exhausted,
                    error: "429 until max_deliver".into(),
                    http_status: Some(429),
                }),
                1 => done("I am sorry, I do not know.".into()),
                _ => done(format!("You asked: {question} Here is my answer.")),
            }
        }
        "acceptance" if b.is_multiple_of(4) => done("Let me think about it.".into()),
        "acceptance" => {
            let c = ["UNREAL", "MENTIONED", "UNKNOWN"][b % 3];
            done(format!(
                "Reasoning first.\n```json\n{{\"term\":\"x\",\n\"reasoning\":\"r{b}\",\n\"certainty\":\"{c}\"}}\n```"
            ))
        }
        "meaning" if b.is_multiple_of(5) => done("{'verified': 'TRUE'}".into()),
        "meaning" => done(format!("{{\"verified\": \"{}\"}}", ["TRUE", "FALSE"][b % 2])),
        other => panic!("unexpected stage {other}"),
    }
}

/// Runs every question to Done, round by round, checking the planner's contract.
fn run(semantics: Semantics) -> (Vec<ItemLabel>, usize, HashMap<JobId, Outcome>) {
    let qs = questions();
    let cfg =
        Config { semantics, model: spec("model-a"), judge: spec("judge-b"), system_prompt: None };
    let mut results: HashMap<JobId, Outcome> = HashMap::new();
    let mut requested: HashSet<JobId> = HashSet::new();
    let mut labels: Vec<Option<ItemLabel>> = vec![None; qs.len()];
    let mut rounds = 0;
    while labels.iter().any(Option::is_none) {
        rounds += 1;
        assert!(rounds <= 8, "{semantics:?}: too many rounds");
        let mut batch = Vec::new();
        for (i, q) in qs.iter().enumerate() {
            if labels[i].is_some() {
                continue;
            }
            let p = evaluate(&cfg, q, &results);
            assert_eq!(p, evaluate(&cfg, q, &results), "Q{}: evaluate is deterministic", q.id);
            match p {
                Plan::Done(l) => labels[i] = Some(l),
                Plan::Waiting(reqs) => {
                    assert!(!reqs.is_empty());
                    for r in reqs {
                        assert!(
                            !results.contains_key(&r.id()),
                            "Q{}: asked again for a known result",
                            q.id
                        );
                        assert!(
                            requested.insert(r.id()),
                            "Q{}: job {} requested twice",
                            q.id,
                            r.id()
                        );
                        assert_eq!(r.key.pipeline, "hypotermqa");
                        batch.push(r);
                    }
                }
            }
        }
        for r in batch {
            results.insert(r.id(), fake(&r));
        }
    }
    let labels: Vec<ItemLabel> = labels.into_iter().map(|l| l.expect("all done")).collect();
    // Idempotent after completion: the same results give the same labels.
    for (q, l) in qs.iter().zip(&labels) {
        assert_eq!(evaluate(&cfg, q, &results), Plan::Done(l.clone()), "Q{}", q.id);
    }
    (labels, rounds, results)
}

/// Paper mode: the whole Waiting → Done sequence over 180 questions, retries included.
#[test]
fn paper_mode_over_180_questions() {
    let (labels, rounds, results) = run(Semantics::Paper);
    assert!(rounds >= 4, "retries and meaning checks need several rounds, got {rounds}");
    let mut ids = HashSet::new();
    let mut retried = 0;
    for l in &labels {
        assert!(ids.insert(l.answer_job.clone()));
        for t in &l.terms {
            for c in t.acceptance.iter().chain(t.meaning.iter()) {
                assert!((1..=3).contains(&c.attempts.len()));
                retried += usize::from(c.attempts.len() > 1);
                for a in &c.attempts {
                    assert!(ids.insert(a.job_id.clone()), "every attempt has its own job id");
                    assert!(results.contains_key(&a.job_id.parse().expect("hex id")));
                }
            }
        }
    }
    assert!(retried > 10, "the fake judge's garbage exercises retries ({retried})");
    assert!(labels.iter().any(|l| l.answer_label == AnswerLabel::JudgeError));
    assert!(labels.iter().any(|l| l.answer_label == AnswerLabel::Unanswered));
    assert!(labels.iter().any(|l| l.answer_label == AnswerLabel::Valid));
    check_echo_inclusion(&labels);
    check_report(&labels, Semantics::Paper);
}

/// Reference mode: one judge round (acceptance and meaning in parallel), no retries.
#[test]
fn reference_mode_over_180_questions() {
    let (labels, rounds, _) = run(Semantics::Reference);
    assert_eq!(rounds, 3, "answer round, judge round, final Done round");
    for l in &labels {
        for t in &l.terms {
            assert_eq!(t.meaning.is_some(), t.included && !t.is_hypothetical);
            assert!(t
                .acceptance
                .iter()
                .chain(t.meaning.iter())
                .all(|c| c.attempts.len() == 1 && c.reflection.is_some()));
        }
        assert_ne!(l.answer_label, AnswerLabel::JudgeError);
    }
    check_echo_inclusion(&labels);
    let r = check_report(&labels, Semantics::Reference);
    let l = r.hts_labelled_only.expect("reference reports the DB denominator");
    assert!(
        l.denominator < r.hypothetical_questions && l.numerator == r.valid_answers_to_hypothetical
    );
}

/// Echoed questions include both their terms except exactly the four the spec lists (A.7)
/// that the fake echoes (issue 16: equality, not a subset).
fn check_echo_inclusion(labels: &[ItemLabel]) {
    let echoed: Vec<&ItemLabel> = labels
        .iter()
        .filter(|l| l.answer.as_deref().is_some_and(|a| a.starts_with("You asked:")))
        .collect();
    let missing: HashSet<i64> = echoed
        .iter()
        .filter(|l| l.terms.iter().any(|t| !t.included))
        .map(|l| l.question_id)
        .collect();
    let echoed_ids: HashSet<i64> = echoed.iter().map(|l| l.question_id).collect();
    let expected: HashSet<i64> =
        [12, 4287, 9993, 14574].into_iter().filter(|id| echoed_ids.contains(id)).collect();
    assert_eq!(expected.len(), 4, "the fake echoes all four: {expected:?}");
    assert_eq!(missing, expected);
}

fn check_report(
    labels: &[ItemLabel],
    semantics: Semantics,
) -> halyard_pipelines::hypotermqa::Report {
    let totals = QuestionCounts::from_questions(&questions());
    let meta = ScoreMeta { model: "model-a".into(), judge: "judge-b".into(), semantics };
    let r = score(&meta, &totals, labels);
    assert_eq!(
        (r.hypothetical_questions, r.questions, r.items_labelled, r.items_ignored),
        (60, 180, 180, 0)
    );
    let h = &r.answer_labels.hypothetical;
    let sum = h.valid + h.hallucination + h.irrelevant + h.judge_error + h.unanswered;
    assert_eq!(sum, 60);
    assert_eq!(r.by_question_type.valid.valid.denominator, 120);
    assert!((r.hts - 100.0 * r.valid_answers_to_hypothetical as f64 / 60.0).abs() < 1e-9);
    assert_eq!(
        r.rows_by_check_type.code_check.count as usize,
        labels.iter().filter(|l| l.answer.is_some()).count() * 2
    );
    // Rows of valid terms split exactly into the three sources.
    let s = &r.rows_by_valid_term_source;
    assert_eq!(
        s.llm_suggestion.count + s.title_similarity.count + s.text_similarity.count,
        r.rows_by_term_type.valid.count
    );
    for l in labels {
        let json = serde_json::to_string(l).expect("labels serialise");
        assert_eq!(&serde_json::from_str::<ItemLabel>(&json).expect("and read back"), l);
    }
    let md = render_markdown(&r);
    assert!(md.contains(&format!("({} semantics)", semantics.as_str())));
    r
}

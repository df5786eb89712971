use std::collections::HashMap;

use halyard_proto::{
    AnswerKind, Completion, Failure, FailureKind, JobId, ModelRef, Outcome, Usage,
};

use super::*;
use crate::autohall::baselines::{Baseline, BaselineVerdict};
use crate::autohall::score::{balanced_set, score};
use crate::common::Plan;
use crate::metrics::autohall::{GoldLabel, NoConflictPhrases};

fn spec(t: f32) -> ModelSpec {
    ModelSpec {
        name: "m".into(),
        model_ref: ModelRef {
            backend: "openai".into(),
            endpoint: "http://x".into(),
            model: "m".into(),
        },
        pool: "m".into(),
        api_key_env: None,
        temperature: t,
        max_tokens: None,
        seed: Some(7),
        timeout_ms: 1000,
        structured_output: false,
    }
}

fn cfg(k: u32) -> Config {
    Config {
        model: spec(0.9),
        classifier: spec(0.1),
        samples: k,
        refusal_phrases: DEFAULT_REFUSAL_PHRASES.iter().map(|s| s.to_string()).collect(),
        no_conflict: NoConflictPhrases::Standard,
        baselines: false,
    }
}

fn claim(gold: GoldLabel) -> Claim {
    Claim { line: 1, id: "c1".into(), claim: "Ice melts.".into(), gold }
}

fn done(text: &str) -> Outcome {
    Outcome::Done(Completion {
        text: text.into(),
        usage: Usage::default(),
        latency_ms: 0,
        finish_reason: None,
        calls: 1,
        logprobs: None,
        refusal: false,
        source: Default::default(),
    })
}

/// Answer every waiting job with `answer(stage, sample_index)` until the item is done.
fn drive(c: &Config, cl: &Claim, answer: impl Fn(&str, u32) -> Outcome) -> (ItemLabel, usize) {
    let mut known: HashMap<JobId, Outcome> = HashMap::new();
    for round in 0.. {
        match evaluate(c, 0, cl, &known) {
            Plan::Done(l) => return (l, known.len()),
            Plan::Waiting(jobs) => {
                assert!(round < 10, "no progress");
                for j in jobs {
                    assert!(!known.contains_key(&j.id()), "asked twice for {:?}", j.key.stage);
                    known.insert(j.id(), answer(&j.key.stage, j.key.sample_index));
                }
            }
        }
    }
    unreachable!()
}

/// The stages run in order with their temperatures; K samples each get a pair check;
/// the hallucination label is classification vs gold.
#[test]
fn full_item() {
    let c = cfg(3);
    let (l, jobs) = drive(&c, &claim(GoldLabel::Refuted), |stage, k| match stage {
        "reference" | "sample" => done(&format!("paragraph {k}")),
        "classify" => done("The claim is true."),
        "pair" => done(if k == 0 { "There are no conflicting parts." } else { "unused" }),
        s => panic!("stage {s}"),
    });
    assert_eq!(jobs, 1 + 1 + 3 + 3);
    assert_eq!(l.status, Status::Classified);
    assert_eq!(l.hallucinated, Some(true));
    assert_eq!(l.conflicts(), Some(vec![false, false, false]));
    let r = c.reference_request("x", 0);
    assert_eq!(r.key.sampling.temperature, 0.9);
    assert_ne!(c.reference_request("x", 1).key.sampling.seed, r.key.sampling.seed);
}

/// Refusals, failed jobs and unparseable classifications end the item with their status.
#[test]
fn early_ends() {
    let c = cfg(2);
    let (l, _) = drive(&c, &claim(GoldLabel::Supported), |_, _| {
        done("I cannot provide a specific reference.")
    });
    assert_eq!(l.status, Status::Refused);
    let failed = || {
        Outcome::Failed(Failure {
            kind: FailureKind::Permanent,
            error: "400".into(),
            http_status: Some(400),
        })
    };
    let (l, _) = drive(&c, &claim(GoldLabel::Supported), |_, _| failed());
    assert_eq!(l.status, Status::ReferenceFailed);
    let (l, _) = drive(&c, &claim(GoldLabel::Supported), |s, _| {
        if s == "classify" {
            done("Unsure.")
        } else {
            done("text")
        }
    });
    assert_eq!(l.status, Status::Unclassified);
    // A failed pair check leaves the verdict unknown, the item still finishes.
    let (l, _) = drive(&c, &claim(GoldLabel::Supported), |s, _| match s {
        "classify" => done("False."),
        "pair" => failed(),
        _ => done("text"),
    });
    assert_eq!((l.status, l.hallucinated), (Status::Classified, Some(true)));
    assert_eq!(l.conflicts(), None);
    assert!(l.pairs[0].error.as_deref().unwrap().contains("pair check failed"));
}

/// Balancing keeps the first n of each class in file order; detection is scored on it.
#[test]
fn balancing_and_score() {
    let mk = |i: u32, h: Option<bool>, conflicts: Vec<bool>| ItemLabel {
        pipeline: PIPELINE.into(),
        model: "m".into(),
        index: i,
        claim_id: i.to_string(),
        line: i as usize + 1,
        claim: "c".into(),
        gold: GoldLabel::Supported,
        status: if h.is_some() { Status::Classified } else { Status::Unclassified },
        reference: None,
        reference_kind: None,
        classification: None,
        classification_kind: None,
        verdict: None,
        hallucinated: h,
        pairs: conflicts
            .into_iter()
            .map(|c| Pair {
                sample: None,
                answer: None,
                conflict: Some(c),
                error: None,
                sample_kind: None,
                answer_kind: None,
            })
            .collect(),
        baselines: None,
        error: None,
    };
    let mut labels = vec![
        mk(0, Some(false), vec![false, true]),
        mk(1, Some(true), vec![true, false]),
        mk(2, None, vec![]),
        mk(3, Some(false), vec![false, false]),
        mk(4, Some(true), vec![false, false]),
        mk(5, Some(false), vec![true, true]),
    ];
    assert_eq!(balanced_set(&labels).into_iter().collect::<Vec<_>>(), [0, 1, 3, 4]);
    let r = score("m", 6, &Default::default(), 2, &labels);
    assert_eq!((r.classified, r.hallucinated, r.factual, r.balanced_per_class), (5, 2, 3, 2));
    assert_eq!(r.hallucination_rate, Some(0.4));
    let ci = r.hallucination_rate_ci95.unwrap();
    assert_eq!((ci.n, ci.estimate), (5, 0.4));
    assert!(r.baselines.is_empty(), "not run");
    // Issue 16: baselines on the balanced set [0, 1, 3, 4]: a verdict, an unparseable
    // answer (scored as the wrong prediction), a failed job (left out), one missing.
    let verdict = |h: Option<bool>, error: Option<&str>| BaselineVerdict {
        answer: None,
        score: None,
        hallucinated: h,
        error: error.map(String::from),
    };
    labels[0].baselines = Some(BaselineLabels {
        zero_self_check: Some(verdict(Some(false), None)),
        ..Default::default()
    });
    labels[1].baselines =
        Some(BaselineLabels { zero_self_check: Some(verdict(None, None)), ..Default::default() });
    labels[3].baselines = Some(BaselineLabels {
        zero_self_check: Some(verdict(None, Some("job failed"))),
        ..Default::default()
    });
    let b = score("m", 6, &Default::default(), 2, &labels).baselines;
    assert_eq!(b.len(), 2, "Zero- and Few-Self-Check; no SelfCk-1gm verdict anywhere");
    let z = &b[0];
    assert_eq!(
        (z.method, z.scored, z.unparseable, z.incomplete),
        (Baseline::ZeroSelfCheck, 2, 1, 2)
    );
    assert_eq!((z.confusion.true_neg, z.confusion.false_neg), (1, 1));
    assert_eq!(z.metrics.accuracy, Some(0.5));
    assert_eq!(z.ci95.accuracy.map(|i| i.n), Some(2));
    assert_eq!((b[1].scored, b[1].incomplete), (0, 4));
    let d = r.detection.unwrap();
    assert_eq!(d.scored, 4);
    let k1 = &d.ablation[0].confusion;
    assert_eq!((k1.true_pos, k1.false_pos), (1, 0));
    let k2 = &d.ablation[1].confusion;
    assert_eq!((k2.true_pos, k2.false_pos, k2.true_neg, k2.false_neg), (1, 1, 1, 1));
}

/// Issue 16: with baselines on, the two self-checks run as jobs at the classification
/// temperature next to detection, and SelfCk-1gm scores the reference on the K samples;
/// a failed self-check job is an error, not a verdict.
#[test]
fn baselines_run_as_jobs() {
    let c = Config { baselines: true, ..cfg(2) };
    let (l, jobs) = drive(&c, &claim(GoldLabel::Supported), |stage, k| match stage {
        "reference" | "sample" => done(&format!("The ice melts {k}.")),
        "classify" => done("The claim is false."),
        "pair" => done("There are no conflicting parts."),
        "zero_self_check" => done("{\"reasoning\": \"r\", \"factuality\": false}"),
        "few_self_check" => Outcome::Failed(Failure {
            kind: FailureKind::Permanent,
            error: "400".into(),
            http_status: None,
        }),
        s => panic!("stage {s}"),
    });
    assert_eq!(jobs, 1 + 1 + 2 + 2 + 2, "reference, classify, K samples, K pairs, 2 checks");
    let b = l.baselines.unwrap();
    assert_eq!(b.zero_self_check.unwrap().hallucinated, Some(true));
    let few = b.few_self_check.unwrap();
    assert_eq!(
        (few.hallucinated, few.error.as_deref()),
        (None, Some("few_self_check job failed: 400"))
    );
    let one = b.selfck_1gm.unwrap();
    assert_eq!(one.hallucinated, Some(one.score.unwrap() >= 5.0));
    let off = drive(&cfg(2), &claim(GoldLabel::Supported), |stage, _| match stage {
        "classify" => done("true"),
        "pair" => done("yes"),
        _ => done("x"),
    });
    assert!(off.0.baselines.is_none());
}

fn refused(text: &str) -> Outcome {
    match done(text) {
        Outcome::Done(c) => Outcome::Done(Completion { refusal: true, ..c }),
        o => o,
    }
}

/// Issue 29: a structured refusal, an empty reference and the common "can't assist"
/// wording are refused references; an empty classification is unclassified; each is
/// marked with its kind and counted in the report.
#[test]
fn odd_references_and_classifications_are_counted() {
    let c = cfg(0);
    let mut labels = Vec::new();
    for (i, r) in
        [refused("Policy."), done(""), done("I can't assist with that.")].into_iter().enumerate()
    {
        let (mut l, _) = drive(&c, &claim(GoldLabel::Supported), |_, _| r.clone());
        assert_eq!(l.status, Status::Refused, "reference {i}");
        l.index = i as u32;
        labels.push(l);
    }
    assert_eq!(labels[0].reference_kind, Some(AnswerKind::Refusal));
    assert_eq!(labels[1].reference_kind, Some(AnswerKind::Empty));
    assert_eq!(labels[2].reference_kind, None, "refused by its words, not by the API");
    let (mut l, _) = drive(&c, &claim(GoldLabel::Supported), |s, _| {
        if s == "classify" {
            done(" ")
        } else {
            done("text")
        }
    });
    assert_eq!((l.status, l.classification_kind), (Status::Unclassified, Some(AnswerKind::Empty)));
    l.index = 3;
    labels.push(l);
    let r = score("m", 4, &Default::default(), 0, &labels);
    assert_eq!((r.odd_references.refusal, r.odd_references.empty), (1, 1));
    assert_eq!(r.odd_classifications.empty, 1);
    let md = crate::autohall::score::render_markdown("AutoHall", &[r]);
    assert!(md.contains("Empty or refused references (refused): 1 empty, 1 refusal"), "{md}");
}

/// Issue 29: one empty answer of 13 pair checks marks the reference as conflicting (the
/// authors' rule, kept), and the report counts the scored reference it touched.
#[test]
fn an_empty_pair_answer_is_counted_beside_detection() {
    let c = cfg(13);
    let mut labels = Vec::new();
    for (i, gold) in [GoldLabel::Refuted, GoldLabel::Supported].into_iter().enumerate() {
        let (mut l, _) = drive(&c, &claim(gold), |stage, k| match stage {
            "reference" | "sample" => done(&format!("paragraph {k}")),
            // True: hallucinated for the refuted claim, factual for the supported one.
            "classify" => done("The claim is true."),
            "pair" if i == 1 && k == 0 => done("There are no conflicting parts."),
            "pair" => done("There are no conflicting parts."),
            s => panic!("stage {s}"),
        });
        l.index = i as u32;
        labels.push(l);
    }
    // The factual reference's 7th comparison got an empty answer.
    let mut odd = labels[1].clone();
    odd.pairs[6].answer = Some(String::new());
    odd.pairs[6].answer_kind = Some(AnswerKind::Empty);
    odd.pairs[6].conflict =
        Some(crate::metrics::autohall::pair_conflicts("", NoConflictPhrases::Standard));
    assert_eq!(odd.pairs[6].conflict, Some(true), "the authors' rule: no phrase, a conflict");
    labels[1] = odd;
    let r = score("m", 2, &Default::default(), 13, &labels);
    let d = r.detection.as_ref().unwrap();
    assert_eq!((d.scored, d.scored_with_odd_checks, d.odd_check_answers.empty), (2, 1, 1));
    let md = crate::autohall::score::render_markdown("AutoHall", &[r]);
    assert!(
        md.contains("1 of the scored references had a comparison with an empty or refused"),
        "{md}"
    );
}

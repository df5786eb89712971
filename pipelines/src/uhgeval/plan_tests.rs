use std::collections::HashMap;
use std::path::Path;

use halyard_proto::{Completion, Failure, FailureKind, JobId, Outcome, Usage};

use super::*;
use crate::uhgeval::read_dataset;

fn model() -> ModelSpec {
    ModelSpec { temperature: 0.1, max_tokens: Some(999), seed: Some(22), ..crate::common::test_model("m") }
}

fn cfg(variant: UhgVariant, forms: &[Form]) -> Config {
    Config { variant, forms: forms.to_vec(), model: model() }
}

fn cases() -> Vec<Case> {
    prepare(read_dataset(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../datasets/uhgeval/uhgeval_concise_sample_20.jsonl")).unwrap())
}

fn done(text: &str) -> Outcome {
    Outcome::Done(Completion { text: text.into(), usage: Usage::default(), latency_ms: 0, finish_reason: None, calls: 1 })
}

fn failed() -> Outcome {
    Outcome::Failed(Failure { kind: FailureKind::Permanent, error: "boom".into(), http_status: Some(400) })
}

/// Runs `evaluate` to the end, answering each job with `answer(stage, prompt)`.
fn run(cfg: &Config, case: &Case, answer: impl Fn(&str, &str) -> Outcome) -> (ItemLabel, HashMap<JobId, Outcome>) {
    let mut known: HashMap<JobId, Outcome> = HashMap::new();
    for _ in 0..10 {
        match evaluate(cfg, case, &known) {
            Progress::Done(l) => {
                // Idempotent: the same results give the same label.
                assert_eq!(evaluate(cfg, case, &known), Progress::Done(l.clone()));
                return (l, known);
            }
            Progress::Waiting(jobs) => {
                for j in jobs {
                    assert_eq!(j.key.pipeline, "uhgeval");
                    let prompt = &j.key.messages[0].content;
                    known.insert(j.id(), answer(&j.key.stage, prompt));
                }
            }
        }
    }
    panic!("not done after 10 rounds");
}

/// Keyword level: one job per kept keyword at 24 tokens; the model's verdicts give the accuracy.
#[test]
fn keyword_form() {
    let c = &cases()[0]; // doc_000004: 1 unreasonable keyword, so n = 1
    let k = cfg(UhgVariant::Paper, &[Form::Keyword]);
    let Progress::Waiting(jobs) = evaluate(&k, c, &HashMap::<JobId, Outcome>::new()) else { panic!() };
    assert_eq!(jobs.len(), 2);
    assert!(jobs.iter().all(|j| j.key.sampling.max_tokens == Some(SHORT_MAX_TOKENS) && j.key.stage == "keyword"));
    assert!(jobs[0].key.messages[0].content.ends_with("续写中的\"\"\"德国外长弗拉德里希\"\"\""));
    // Says "hallucinated" to everything: right on one of two.
    let (l, _) = run(&k, c, |_, _| done("不符合现实，因为…"));
    let kw = l.keyword.unwrap();
    assert_eq!((kw.accuracy, kw.num_kws, kw.valid), (0.5, 2, true));
    // Paper: a leading space makes the verdict invalid, and so the item.
    let (l, _) = run(&k, c, |_, _| done(" 符合现实"));
    assert!(!l.keyword.unwrap().valid);
}

/// Sentence level: H judged hallucinated and R real is accuracy 1; the paper's R is the
/// first sentence of the remainder.
#[test]
fn sentence_form() {
    let c = &cases()[0];
    let k = cfg(UhgVariant::Paper, &[Form::Sentence]);
    let h = c.item.hallucinated_continuation.clone();
    let (l, known) = run(&k, c, |_, p| done(if p.contains(&format!("续写：\"\"\"{h}\"\"\"")) { "续写不符合现实。" } else { "续写符合现实。" }));
    let s = l.sentence.unwrap();
    assert_eq!((s.accuracy, s.valid), (1.0, true));
    assert_eq!(known.len(), 2);
    // A dead letter reads as the empty answer: invalid, error kept.
    let (l, _) = run(&k, c, |_, p| if p.contains(&h) { failed() } else { done("续写符合现实") });
    let s = l.sentence.unwrap();
    assert!(!s.valid);
    assert_eq!(s.on_hallucinated.error.as_deref(), Some("boom"));
}

/// Selective: picking the real continuation is correct whichever option holds it.
#[test]
fn selective_form() {
    let all = cases();
    for variant in [UhgVariant::Paper, UhgVariant::V2] {
        let k = cfg(variant, &[Form::Selective]);
        for c in &all[..6] {
            let real = match variant {
                UhgVariant::Paper => first_sentence(&c.item.news_remainder).to_string(),
                UhgVariant::V2 => c.item.real_continuation.clone(),
            };
            let (l, _) = run(&k, c, |_, p| done(if p.contains(&format!("A：\"\"\"{real}\"\"\"")) { "A" } else { "B" }));
            let s = l.selective.unwrap();
            assert!(s.correct && s.valid, "{variant:?} {}: {s:?}", c.item.id);
        }
    }
    // The paper's orders are the seeded draws in dataset order (spec §5.2: T F F T F F).
    let swaps: Vec<bool> = all[..6].iter().map(|c| c.paper_order == OptionOrder::RealFirst).collect();
    assert_eq!(swaps, [true, false, false, true, false, false]);
}

/// Generative: continuation at 128 tokens, then extraction from it by the same model;
/// an empty continuation is invalid and not sent to extraction.
#[test]
fn generative_form() {
    let c = &cases()[0];
    let k = cfg(UhgVariant::Paper, &[Form::Generative]);
    let (l, known) = run(&k, c, |stage, _| match stage {
        "continue" => done("\n  四国外长在会后发表联合声明。其后无关。"),
        "extract_kws" => done("<keywords>\n四国外长\n会后\n联合声明\n柏林\n</keywords>"),
        s => panic!("stage {s}"),
    });
    let g = l.generative.unwrap();
    assert_eq!(g.continuation, "\n  四国外长在会后发表联合声明。");
    assert_eq!(g.keywords, ["四国外长", "会后", "联合声明"]);
    assert_eq!(g.kw_prec, 1.0);
    assert!((g.bleu4_paper - 0.803428419).abs() < 1e-6, "{}", g.bleu4_paper);
    assert!(g.valid && g.bleu4_v2 > 0.0 && g.bleu4_v2 < g.bleu4_paper);
    assert_eq!(known.len(), 2);
    let (l, known) = run(&k, c, |_, _| done("   "));
    let g = l.generative.unwrap();
    assert!(!g.valid && g.extraction.is_none());
    assert_eq!(known.len(), 1);
}

/// All forms together ask for their jobs at once, de-duplicated.
#[test]
fn forms_run_in_parallel() {
    let c = &cases()[0];
    let k = cfg(UhgVariant::V2, &Form::ALL);
    let Progress::Waiting(jobs) = evaluate(&k, c, &HashMap::<JobId, Outcome>::new()) else { panic!() };
    let stages: Vec<&str> = jobs.iter().map(|j| j.key.stage.as_str()).collect();
    // v2 keeps all 11 annotated keywords' balance: 1 + 1; sentence 2; selective 1; continue 1.
    assert_eq!(stages, ["keyword", "keyword", "sentence", "sentence", "selective", "continue"]);
}

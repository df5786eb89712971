use std::collections::HashMap;
use std::path::Path;

use halyard_proto::{AnswerKind, Completion, Failure, FailureKind, JobId, Outcome, Usage};

use super::*;
use crate::uhgeval::read_dataset;

fn model() -> ModelSpec {
    ModelSpec {
        temperature: 0.1,
        max_tokens: Some(999),
        seed: Some(22),
        ..crate::common::test_model("m")
    }
}

fn cfg(variant: UhgVariant, forms: &[Form]) -> Config {
    Config {
        variant,
        forms: forms.to_vec(),
        model: model(),
        generation: Generation::default(),
        bert_embedder: None,
    }
}

fn cases() -> Vec<Case> {
    prepare(
        read_dataset(
            &Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../datasets/uhgeval/uhgeval_concise_sample_20.jsonl"),
        )
        .unwrap(),
    )
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

fn failed() -> Outcome {
    Outcome::Failed(Failure {
        kind: FailureKind::Permanent,
        error: "boom".into(),
        http_status: Some(400),
    })
}

/// Runs `evaluate` to the end, answering each job with `answer(stage, prompt)`.
fn run(
    cfg: &Config,
    case: &Case,
    answer: impl Fn(&str, &str) -> Outcome,
) -> (ItemLabel, HashMap<JobId, Outcome>) {
    let mut known: HashMap<JobId, Outcome> = HashMap::new();
    for _ in 0..10 {
        match evaluate(cfg, case, &known) {
            Plan::Done(l) => {
                // Idempotent: the same results give the same label.
                assert_eq!(evaluate(cfg, case, &known), Plan::Done(l.clone()));
                return (l, known);
            }
            Plan::Waiting(jobs) => {
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
    let Plan::Waiting(jobs) = evaluate(&k, c, &HashMap::<JobId, Outcome>::new()) else { panic!() };
    assert_eq!(jobs.len(), 2);
    assert!(jobs
        .iter()
        .all(|j| j.key.sampling.max_tokens == Some(SHORT_MAX_TOKENS) && j.key.stage == "keyword"));
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
    let (l, known) = run(&k, c, |_, p| {
        done(if p.contains(&format!("续写：\"\"\"{h}\"\"\"")) {
            "续写不符合现实。"
        } else {
            "续写符合现实。"
        })
    });
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
            let (l, _) = run(&k, c, |_, p| {
                done(if p.contains(&format!("A：\"\"\"{real}\"\"\"")) { "A" } else { "B" })
            });
            let s = l.selective.unwrap();
            assert!(s.correct && s.valid, "{variant:?} {}: {s:?}", c.item.id);
        }
    }
    // The paper's orders are the seeded draws in dataset order (spec §5.2: T F F T F F).
    let swaps: Vec<bool> =
        all[..6].iter().map(|c| c.paper_order == OptionOrder::RealFirst).collect();
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
    let Plan::Waiting(jobs) = evaluate(&k, c, &HashMap::<JobId, Outcome>::new()) else { panic!() };
    let stages: Vec<&str> = jobs.iter().map(|j| j.key.stage.as_str()).collect();
    // v2 keeps all 11 annotated keywords' balance: 1 + 1; sentence 2; selective 1; continue 1.
    assert_eq!(stages, ["keyword", "keyword", "sentence", "sentence", "selective", "continue"]);
}

/// Issue 16: UHGEval's top_p 0.9 / top_k 5 go into the requests the backend supports
/// (openai: top_p only; gguf: both), and the plan says which; unset, neither is sent.
#[test]
fn generation_parameters_per_backend() {
    let case = &cases()[0];
    let first = |c: &Config| match evaluate(c, case, &HashMap::<JobId, Outcome>::new()) {
        Plan::Waiting(jobs) => jobs[0].key.sampling.clone(),
        Plan::Done(_) => panic!("a job is needed"),
    };
    let api = cfg(UhgVariant::Paper, &[Form::Selective]);
    let s = first(&api);
    assert_eq!((s.top_p, s.top_k), (Some(0.9), None));
    let applied = api.generation.applied_to("openai");
    assert!(applied.note.unwrap().contains("top_k"));
    let mut local = api.clone();
    local.model.model_ref.backend = "gguf".into();
    let s = first(&local);
    assert_eq!((s.top_p, s.top_k), (Some(0.9), Some(5)));
    assert!(local.generation.applied_to("gguf").note.is_none());
    let off = Config { generation: Generation { top_p: None, top_k: None }, ..api };
    let s = first(&off);
    assert_eq!((s.top_p, s.top_k), (None, None));
}

/// Issue 16: with an embedder, a valid continuation's `bert` job runs beside keyword
/// extraction, and its cosine becomes the item's BERTScore.
#[test]
fn bert_job_beside_extraction() {
    let mut c = cfg(UhgVariant::Paper, &[Form::Generative]);
    let mut e = crate::common::test_model("minilm");
    e.model_ref.backend = "embed".into();
    c.bert_embedder = Some(e);
    let case = &cases()[0];
    let mut known: HashMap<JobId, Outcome> = HashMap::new();
    let Plan::Waiting(jobs) = evaluate(&c, case, &known) else { panic!() };
    known.insert(jobs[0].id(), done("续写的第一句话。后面的。"));
    let Plan::Waiting(jobs) = evaluate(&c, case, &known) else { panic!() };
    let mut stages: Vec<&str> = jobs.iter().map(|j| j.key.stage.as_str()).collect();
    stages.sort();
    assert_eq!(stages, ["bert", "extract_kws"]);
    for j in &jobs {
        let o = if j.key.stage == "bert" {
            let v = vec![vec![1.0f32, 0.0], vec![0.0, 1.0]];
            done(&halyard_embed::codec::encode(&v, 2))
        } else {
            done("<keywords>\n续写\n</keywords>")
        };
        known.insert(j.id(), o);
    }
    let Plan::Done(l) = evaluate(&c, case, &known) else { panic!() };
    let g = l.generative.unwrap();
    assert_eq!(g.bert.unwrap().score, Some(0.0));
    assert_eq!(g.keywords, ["续写"]);
}

/// Issue 29: a failed call is no answer. With `v2`, UHGEval's `""` for a failed call read
/// as "hallucinated", so a model whose every call failed scored 0.50 at keyword level; a
/// failed `extract_kws` gave kwPrec 0 inside a valid item. Both items are invalid now,
/// counted by form, and the report says so.
#[test]
fn failed_calls_make_items_invalid() {
    let all = cases();
    let c = &all[0];
    for variant in [UhgVariant::Paper, UhgVariant::V2] {
        let k = cfg(variant, &[Form::Keyword, Form::Sentence, Form::Selective, Form::Generative]);
        let (l, _) = run(&k, c, |_, _| failed());
        assert!(!l.keyword.as_ref().unwrap().valid, "{variant:?}");
        assert!(!l.sentence.as_ref().unwrap().valid);
        assert!(!l.selective.as_ref().unwrap().valid);
        assert!(!l.generative.as_ref().unwrap().valid);
        let r = crate::uhgeval::score("m", variant, &all, &[l], None);
        assert_eq!(
            r.keyword.as_ref().unwrap().overall.avg_accuracy,
            None,
            "no valid item: no figure"
        );
        assert_eq!(r.invalid_by_failed_call.values().sum::<usize>(), 4);
        let md = crate::uhgeval::render_markdown(&[r]);
        assert!(md.contains("each makes its item invalid in its form"), "{md}");
        assert!(!md.contains("read as empty answers"));
    }
    let k = cfg(UhgVariant::Paper, &[Form::Generative]);
    let (l, _) = run(&k, c, |stage, _| match stage {
        "continue" => done("四国外长在会后发表联合声明。"),
        _ => failed(),
    });
    let g = l.generative.unwrap();
    assert!(g.extraction.as_ref().unwrap().failed());
    assert!(!g.valid, "a failed extraction is not kwPrec 0 in a valid item");
}

/// Issue 29: an empty answer and a refusal the model gave are read by UHGEval's rules and
/// counted by kind.
#[test]
fn empty_and_refused_answers_are_counted() {
    let all = cases();
    let k = cfg(UhgVariant::Paper, &[Form::Selective]);
    let refusal = || match done("I can't help with that.") {
        Outcome::Done(c) => Outcome::Done(Completion { refusal: true, ..c }),
        o => o,
    };
    let (a, _) = run(&k, &all[0], |_, _| done(""));
    let (b, _) = run(&k, &all[1], |_, _| refusal());
    assert_eq!(a.selective.as_ref().unwrap().answer.kind, Some(AnswerKind::Empty));
    assert!(!a.selective.as_ref().unwrap().valid, "UHGEval's rule: no choice, invalid");
    let r = crate::uhgeval::score("m", UhgVariant::Paper, &all, &[a, b], None);
    assert_eq!((r.odd_answers.empty, r.odd_answers.refusal), (1, 1));
    assert!(crate::uhgeval::render_markdown(&[r]).contains("1 empty, 1 refusal"));
}

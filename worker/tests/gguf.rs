//! The gguf backend with the real embedded model (SmolLM2-135M-Instruct Q4_1).
//! `scripts/fetch-model.sh` puts it in models/ (scripts/test and CI run it first).
#![cfg(feature = "gguf")]
// The turn lock is held across awaits on purpose: it serialises the model tests (each
// on its own runtime), so no task of the same runtime waits for it.
#![allow(clippy::await_holding_lock)]

use std::path::PathBuf;

use halyard_proto::ChatMessage;
use halyard_worker::backend::gguf::{GgufError, GgufModel};
use halyard_worker::backend::GgufSpec;

/// llama.cpp's thread pool spin-waits; two models decoding at once on a small machine
/// oversubscribe its cores and slow both many times over. Model tests take turns.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

fn model_path() -> PathBuf {
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "{} is missing: run scripts/fetch-model.sh", p.display());
    p
}

fn spec(path: PathBuf, slots: usize) -> GgufSpec {
    GgufSpec {
        endpoint: "test".into(),
        path,
        gpu: None,
        gpu_layers: 0,
        slots,
        threads: 0,
        ctx_size: 1024,
    }
}

fn ask(q: &str) -> Vec<ChatMessage> {
    vec![ChatMessage::user(q)]
}

/// Greedy answers are real text, identical alone and batched with other sequences,
/// and carry token usage and latency.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_generation_is_deterministic_alone_and_batched() {
    let _turn = turn();
    let model = GgufModel::load(spec(model_path(), 4)).expect("model loads");
    let prompts = [
        "What is the capital of France?",
        "Name a primary colour.",
        "What is 2 plus 2?",
        "Say hello in Spanish.",
    ];
    let mut alone = Vec::new();
    for p in prompts {
        alone.push(model.generate(ask(p), 0.0, Some(24), 1).await.expect("generation"));
    }
    let batched =
        futures::future::join_all(prompts.iter().map(|p| model.generate(ask(p), 0.0, Some(24), 1)))
            .await;
    for (a, b) in alone.iter().zip(batched) {
        let b = b.expect("batched generation");
        assert!(!a.text.trim().is_empty(), "empty answer");
        assert_eq!(a.text, b.text, "batched greedy output differs from the sequential one");
        assert!(
            a.usage.prompt_tokens > 5
                && a.usage.completion_tokens > 0
                && a.usage.completion_tokens <= 24,
            "{:?}",
            a.usage
        );
        assert!(matches!(a.finish_reason.as_deref(), Some("stop" | "length")));
    }
    // max_tokens is honoured exactly when the model does not stop earlier.
    let long =
        model.generate(ask("Write a long story about the sea."), 0.0, Some(7), 1).await.unwrap();
    assert_eq!((long.usage.completion_tokens, long.finish_reason.as_deref()), (7, Some("length")));
}

/// Seeded sampling reproduces itself; different seeds may differ but still produce text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_sampling_is_reproducible() {
    let _turn = turn();
    let model = GgufModel::load(spec(model_path(), 2)).expect("model loads");
    let a = model.generate(ask("Invent a name for a cat."), 0.9, Some(16), 42).await.unwrap();
    let b = model.generate(ask("Invent a name for a cat."), 0.9, Some(16), 42).await.unwrap();
    assert_eq!(a.text, b.text);
    assert!(!a.text.is_empty());
}

/// A prompt longer than the context is a permanent error, not a hang or a crash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_prompt_is_a_permanent_error() {
    let _turn = turn();
    let mut s = spec(model_path(), 1);
    s.ctx_size = 256;
    let model = GgufModel::load(s).expect("model loads");
    let err = model.generate(ask(&"word ".repeat(400)), 0.0, Some(8), 1).await.unwrap_err();
    assert!(err.is_permanent() && err.message.contains("ctx_size"), "{err:?}");
}

/// Missing, non-GGUF and truncated files fail to load with an error naming the file.
#[test]
fn bad_model_files_are_named() {
    let _turn = turn();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.gguf");
    let text = dir.path().join("notes.gguf");
    std::fs::write(&text, "this is not a model").unwrap();
    let truncated = dir.path().join("truncated.gguf");
    let bytes = std::fs::read(model_path()).unwrap();
    std::fs::write(&truncated, &bytes[..2_000_000]).unwrap();
    for (path, needle) in
        [(&missing, "cannot open"), (&text, "not a GGUF file"), (&truncated, "could not load")]
    {
        let err = GgufModel::load(spec(path.clone(), 1))
            .err()
            .unwrap_or_else(|| panic!("{} loaded", path.display()));
        let msg = err.to_string();
        assert!(matches!(err, GgufError::File { .. }), "{msg}");
        assert!(msg.contains(&path.display().to_string()) && msg.contains(needle), "{msg}");
    }
}

/// Without the `cuda` feature, placing a model on a GPU is a clear error.
#[cfg(not(feature = "cuda"))]
#[test]
fn gpu_placement_without_cuda_is_an_error() {
    let _turn = turn();
    let mut s = spec(model_path(), 1);
    s.gpu = Some(0);
    let err = GgufModel::load(s).err().expect("refused");
    assert!(matches!(err, GgufError::NoGpuSupport { gpu: 0, .. }), "{err}");
    assert!(err.to_string().contains("--features cuda"));
}

/// Issue 16: generated tokens carry their log-probabilities (greedy: the chosen token is the
/// most likely alternative), their pieces spell the text; scoring the same text as a given
/// assistant message (teacher forcing) gives the same tokens and log-probabilities without
/// generating; top_k/top_p sampling is reproducible from its seed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_of_generated_and_scored_text() {
    use halyard_proto::{LogprobsRequest, Sampling};
    let _turn = turn();
    let model = GgufModel::load(spec(model_path(), 2)).expect("model loads");
    let want = |score_last| Some(LogprobsRequest { top: 5, score_last });
    let greedy = Sampling { max_tokens: Some(12), logprobs: want(false), ..Sampling::default() };
    let q = ask("Name a primary colour.");
    let g = model.generate_with(q.clone(), greedy, 1).await.expect("generation");
    let lp = g.logprobs.as_ref().expect("log-probabilities asked for");
    assert_eq!(lp.len() as u64, g.usage.completion_tokens);
    assert_eq!(lp.iter().map(|t| t.token.as_str()).collect::<String>(), g.text);
    for t in lp {
        assert!(t.logprob <= 0.0 && t.top.len() == 5, "{t:?}");
        assert_eq!((t.top[0].token.as_str(), t.top[0].logprob), (t.token.as_str(), t.logprob));
        assert!(t.top.windows(2).all(|w| w[0].logprob >= w[1].logprob));
    }
    let mut scored_msgs = q.clone();
    scored_msgs.push(ChatMessage::assistant(g.text.clone()));
    let scoring = Sampling { logprobs: want(true), ..Sampling::default() };
    let s = model.generate_with(scored_msgs, scoring.clone(), 1).await.expect("scoring");
    assert_eq!((s.text.as_str(), s.usage.completion_tokens), ("", 0));
    let slp = s.logprobs.expect("scored log-probabilities");
    let tokens =
        |v: &[halyard_proto::TokenLogprob]| v.iter().map(|t| t.token.clone()).collect::<Vec<_>>();
    assert_eq!(tokens(&slp), tokens(lp));
    for (a, b) in slp.iter().zip(lp) {
        assert!((a.logprob - b.logprob).abs() < 1e-3, "{a:?} vs {b:?}");
    }
    let bad = model.generate_with(q.clone(), scoring, 1).await.unwrap_err();
    assert!(bad.is_permanent() && bad.message.contains("assistant"), "{}", bad.message);
    let nucleus = Sampling {
        temperature: 0.9,
        max_tokens: Some(12),
        top_p: Some(0.9),
        top_k: Some(5),
        ..Sampling::default()
    };
    let a = model.generate_with(q.clone(), nucleus.clone(), 22).await.unwrap();
    let b = model.generate_with(q, nucleus, 22).await.unwrap();
    assert_eq!(a.text, b.text);
    assert!(a.logprobs.is_none(), "none asked for");
}

/// Issue 45: with structured output the judge's raw output is the JSON object its pipeline
/// reads, every time. SmolLM2 judges the answers it gave to the first questions of
/// HypoTermQA_180, with the HypoTermQA judge prompts (acceptance for every term, meaning
/// for the real ones) and their schemas ([`JudgeKind::output_schema`], turned into a
/// llama.cpp grammar by the backend), greedily, at the main job's `max_tokens` (160):
/// each output is a JSON object (serde_json) with exactly the schema's keys, in its
/// order, the term as given, a verdict among its values, and the paper-mode reader finds
/// that verdict. The
/// same prompts without the schema are counted and printed (free text, as before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_judge_output_always_parses() {
    use halyard_pipelines::hypotermqa::judge::{
        parse_paper_certainty, parse_paper_verified, JudgeKind,
    };
    use halyard_pipelines::hypotermqa::prompts::{acceptance_messages, meaning_messages};
    use halyard_proto::Sampling;
    let _turn = turn();
    let model =
        GgufModel::load(GgufSpec { ctx_size: 2048, ..spec(model_path(), 4) }).expect("model loads");
    let dataset = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../datasets/hypotermqa/HypoTermQA_180.jsonl");
    let questions = halyard_pipelines::hypotermqa::read_dataset(dataset).unwrap();
    let sampling = |judge: Option<(JudgeKind, &str)>| Sampling {
        max_tokens: Some(160),
        json_schema: judge.map(|(kind, term)| Box::new(kind.output_schema(term))),
        ..Sampling::default()
    };
    let mut checks = Vec::new();
    for q in &questions[..4] {
        let answer = model.generate_with(ask(&q.question), sampling(None), 1).await.unwrap().text;
        for t in &q.terms {
            let acceptance = acceptance_messages(&t.term, &q.question, &answer);
            checks.push((JudgeKind::Acceptance, t.term.clone(), acceptance));
            if !t.is_hypothetical {
                let m = meaning_messages(&t.term, &t.explanation, &q.question, &answer);
                checks.push((JudgeKind::Meaning, t.term.clone(), m));
            }
        }
    }
    assert!(checks.len() >= 10, "{} judge calls", checks.len());
    let (mut free_ok, mut constrained_ok) = (0, 0);
    for (kind, term, messages) in &checks {
        let read = |text: &str| match kind {
            JudgeKind::Acceptance => {
                parse_paper_certainty(text).map(|v| v.value.as_str().to_string())
            }
            JudgeKind::Meaning => parse_paper_verified(text)
                .map(|v| if v.value { "TRUE" } else { "FALSE" }.to_string()),
        };
        let free = model.generate_with(messages.clone(), sampling(None), 1).await.unwrap();
        free_ok += read(&free.text).is_ok() as usize;
        let c =
            model.generate_with(messages.clone(), sampling(Some((*kind, term))), 1).await.unwrap();
        let v: serde_json::Value = serde_json::from_str(&c.text).unwrap_or_else(|e| {
            panic!("not JSON ({e}), finish {:?}: {:?}", c.finish_reason, c.text)
        });
        let keys: Vec<&String> = v.as_object().expect("an object").keys().collect();
        let mut want = vec!["reasoning", "term", kind.key()];
        want.sort();
        assert_eq!(keys, want, "{}", c.text);
        let order =
            ["\"term\"", "\"reasoning\"", &format!("\"{}\"", kind.key())].map(|k| c.text.find(k));
        assert!(order.windows(2).all(|w| w[0] < w[1]), "keys out of order: {}", c.text);
        assert_eq!(v["term"].as_str(), Some(term.as_str()));
        let verdict = v[kind.key()].as_str().expect("a string verdict");
        assert!(kind.values().contains(&verdict), "{verdict:?} in {}", c.text);
        assert_eq!(read(&c.text).as_deref(), Ok(verdict), "{}", c.text);
        constrained_ok += 1;
    }
    println!(
        "judge outputs read as a verdict: free text {free_ok}/{n}, structured {constrained_ok}/{n}",
        n = checks.len()
    );
}

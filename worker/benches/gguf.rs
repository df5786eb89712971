//! Throughput of the gguf backend versus llama.cpp used directly, in the same run.
//!
//! `cargo bench -p halyard-worker --bench gguf` (needs models/, see scripts/fetch-model.sh;
//! `HALYARD_BENCH_ROUNDS=N` for more rounds than 7). Prints, for both, prompt tokens/s
//! (prefill), single-stream generation tokens/s and batched generation tokens/s (4
//! sequences at once), the ratio backend/direct, and the spread over the rounds, so that a
//! difference can be told from noise. The ratio is the median of the rounds' own ratios
//! (each round measures both sides back to back, so load that comes and goes hits a
//! round's two figures alike; the ratio of the two sides' medians pairs figures of
//! different rounds), with the middle half of the rounds' ratios and their extremes.
//!
//! Generation is timed end to end on both sides, the same way: from the request to the
//! last token, prefill included, generated tokens divided by that time (an earlier
//! version subtracted an estimated prefill time from the backend's side only). Rounds
//! interleave the two sides, so background load on this 2-core machine hits both alike.

use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Instant;

use halyard_proto::ChatMessage;
use halyard_worker::backend::gguf::{self, GgufModel};
use halyard_worker::backend::GgufSpec;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaChatMessage, LlamaModel};
use llama_cpp_2::sampling::LlamaSampler;

const GEN: u32 = 128;
const SLOTS: usize = 4;
const PROMPT: &str = "Write a long, detailed story about a lighthouse keeper who discovers a hidden map. \
Describe the sea, the weather, the lighthouse, the keeper's daily routine and the journey in detail.";

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The `q` quantile (0..=1) of `v`, by the nearest rank.
fn quantile(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * q).round() as usize]
}

struct Direct {
    model: &'static LlamaModel,
    ctx: llama_cpp_2::context::LlamaContext<'static>,
    prompt: Vec<llama_cpp_2::token::LlamaToken>,
    batch: LlamaBatch<'static>,
}

impl Direct {
    fn new(path: &PathBuf, threads: i32) -> Direct {
        let backend = gguf::backend().expect("llama backend");
        // Leaked: the benchmark process lives exactly as long as the model.
        let model: &'static LlamaModel = Box::leak(Box::new(
            LlamaModel::load_from_file(backend, path, &LlamaModelParams::default()).expect("load"),
        ));
        let tmpl = model.chat_template(None).expect("template");
        let chat = [LlamaChatMessage::new("user".into(), PROMPT.into()).unwrap()];
        let text = model.apply_chat_template(&tmpl, &chat, true).unwrap();
        let prompt = model.vocab().tokenize(text.as_bytes(), true, true);
        let cp = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(1024 * SLOTS as u32))
            .with_n_seq_max(SLOTS as u32)
            .with_n_batch(2048)
            .with_n_threads(threads)
            .with_n_threads_batch(threads);
        let ctx = model.new_context(backend, cp).expect("context");
        Direct { model, ctx, prompt, batch: LlamaBatch::new(2048, SLOTS as i32) }
    }

    /// `seqs` sequences: prefill all, then greedy tokens until each has GEN or ends (as
    /// the backend stops at the end of generation). Returns (prompt tokens/s, generated
    /// tokens/s over the whole time, prefill included).
    fn run(&mut self, seqs: usize) -> (f64, f64) {
        let _ = self.model;
        let (ctx, batch, prompt) = (&mut self.ctx, &mut self.batch, &self.prompt);
        let vocab = self.model.vocab();
        ctx.clear_kv_cache();
        batch.clear();
        for s in 0..seqs {
            for (i, t) in prompt.iter().enumerate() {
                batch.add(*t, i as i32, &[s as i32], i + 1 == prompt.len()).unwrap();
            }
        }
        let t0 = Instant::now();
        ctx.decode(batch).unwrap();
        let prefill = t0.elapsed().as_secs_f64();
        let mut samplers: Vec<LlamaSampler> = (0..seqs).map(|_| LlamaSampler::greedy()).collect();
        // (sequence, batch index of its logits) of the sequences still generating.
        let mut live: Vec<(usize, i32)> =
            (0..seqs).map(|s| (s, ((s + 1) * prompt.len() - 1) as i32)).collect();
        let mut generated = 0u64;
        for step in 0..GEN {
            let toks: Vec<_> = live.iter().map(|&(s, at)| samplers[s].sample(ctx, at)).collect();
            batch.clear();
            let mut next = Vec::with_capacity(live.len());
            for (&(s, _), t) in live.iter().zip(toks) {
                samplers[s].accept(t);
                if vocab.is_eog(t) {
                    continue;
                }
                let _piece = vocab.token_to_piece(t, false, None);
                generated += 1;
                if step + 1 < GEN {
                    batch.add(t, prompt.len() as i32 + step as i32, &[s as i32], true).unwrap();
                    next.push((s, batch.n_tokens() - 1));
                }
            }
            live = next;
            if live.is_empty() {
                break;
            }
            ctx.decode(batch).unwrap();
        }
        if std::env::var("HALYARD_BENCH_VERBOSE").is_ok() {
            eprintln!(
                "direct x{seqs}: {generated} tokens, {:.0} ms",
                t0.elapsed().as_secs_f64() * 1000.0
            );
        }
        ((seqs * prompt.len()) as f64 / prefill, generated as f64 / t0.elapsed().as_secs_f64())
    }
}

/// Through the backend: (prompt tokens/s, single-stream generated tokens/s over the
/// whole call, prefill included).
async fn backend_single(model: &GgufModel) -> (f64, f64) {
    let c = model.generate(vec![ChatMessage::user(PROMPT)], 0.0, Some(1), 1).await.unwrap();
    let prompt_tps = c.usage.prompt_tokens as f64 / (c.latency_ms.max(1) as f64 / 1000.0);
    let t = Instant::now();
    let c = model.generate(vec![ChatMessage::user(PROMPT)], 0.0, Some(GEN), 1).await.unwrap();
    (prompt_tps, c.usage.completion_tokens as f64 / t.elapsed().as_secs_f64())
}

/// Through the backend: generated tokens/s of SLOTS concurrent jobs, from their start to
/// the last one's end.
async fn backend_batched(model: &GgufModel) -> f64 {
    let t = Instant::now();
    let cs = futures::future::join_all(
        (0..SLOTS).map(|_| model.generate(vec![ChatMessage::user(PROMPT)], 0.0, Some(GEN), 1)),
    )
    .await;
    let toks: u64 = cs.iter().map(|c| c.as_ref().unwrap().usage.completion_tokens).sum();
    if std::env::var("HALYARD_BENCH_VERBOSE").is_ok() {
        let each: Vec<u64> =
            cs.iter().map(|c| c.as_ref().unwrap().usage.completion_tokens).collect();
        let lat: Vec<u64> = cs.iter().map(|c| c.as_ref().unwrap().latency_ms).collect();
        eprintln!(
            "backend batched: tokens {each:?}, latency ms {lat:?}, total {:.0} ms",
            t.elapsed().as_secs_f64() * 1000.0
        );
    }
    toks as f64 / t.elapsed().as_secs_f64()
}

fn main() {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(path.exists(), "{} is missing: run scripts/fetch-model.sh", path.display());
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let mut direct = Direct::new(&path, threads as i32);
    let spec = GgufSpec {
        endpoint: "bench".into(),
        path: path.clone(),
        gpu: None,
        gpu_layers: 0,
        slots: SLOTS,
        threads,
        ctx_size: 1024,
    };
    let model = GgufModel::load(spec).expect("load");
    let rounds: usize =
        std::env::var("HALYARD_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(7);
    // Warm-up (first allocations, page cache), not counted.
    direct.run(SLOTS);
    rt.block_on(backend_batched(&model));
    let (mut dp, mut ds, mut db, mut hp, mut hs, mut hb) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for _ in 0..rounds {
        let (p, g) = direct.run(1);
        dp.push(p);
        ds.push(g);
        let (p, g) = rt.block_on(backend_single(&model));
        hp.push(p);
        hs.push(g);
        db.push(direct.run(SLOTS).1);
        hb.push(rt.block_on(backend_batched(&model)));
    }
    println!(
        "SmolLM2-135M-Instruct Q4_1, {threads} threads, up to {GEN} generated tokens, batch of {SLOTS}; {rounds} interleaved rounds: medians of each side, and of the rounds' ratios"
    );
    println!(
        "{:<28} {:>10} {:>10} {:>7} {:>13} {:>13}",
        "figure (tokens/s)", "llama.cpp", "halyard", "ratio", "middle half", "all rounds"
    );
    for (name, x, y) in [
        ("prompt (prefill)", dp, hp),
        ("generation, single stream", ds, hs),
        ("generation, batched x4", db, hb),
    ] {
        let per_round: Vec<f64> = x.iter().zip(&y).map(|(a, b)| b / a).collect();
        let q = |p: f64| quantile(per_round.clone(), p);
        let (x, y) = (median(x), median(y));
        println!(
            "{name:<28} {x:>10.1} {y:>10.1} {:>7.2} {:>6.2} – {:<4.2} {:>6.2} – {:<4.2}",
            q(0.5),
            q(0.25),
            q(0.75),
            q(0.0),
            q(1.0)
        );
    }
}

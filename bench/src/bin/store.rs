//! `store`: bytes on disk per job of the coordinator's run state and a worker's
//! checkpoint, written the way a run writes them.
//!
//! The coordinator side commits, per batch of results, each result in its stored form,
//! its item's label and the cost totals as one atomic update, then flushes (as the
//! coordinator does before it acks the results); the worker side puts each completion
//! through the checkpoint's group-commit writer. Job ids are content hashes (random
//! keys), as in a run. After closing both stores it prints the bytes on disk (allocated
//! blocks, as `du` counts them), per job and, with `--text`, as a multiple of the answer
//! text.
//!
//! `cargo run --release -p halyard-bench --bin store -- [--jobs 100000] [--text 0] [--batch 1024]`
//!
//! `--text N`: answers of about N bytes of English-like text (words drawn from a fixed
//! list by a seeded generator); 0 is the noop pipeline's empty answer.

use std::path::Path;
use std::time::Instant;

use clap::Parser;
use halyard_coordinator::cost::ClassTotals;
use halyard_coordinator::state::{ItemKey, RunState, Write};
use halyard_proto::stored::encode_result;
use halyard_proto::{Completion, JobId, Outcome, StoredResult, Usage};
use halyard_worker::Checkpoint;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
struct Args {
    /// Jobs (one result, one label and one checkpoint record each).
    #[arg(long, default_value_t = 100_000)]
    jobs: u64,
    /// Bytes of answer text per job (0: the noop pipeline's empty answer).
    #[arg(long, default_value_t = 0)]
    text: usize,
    /// Results per coordinator commit (the coordinator takes up to 2,048 per step).
    #[arg(long, default_value_t = 1024)]
    batch: usize,
    /// Keep the stores here instead of a temporary directory.
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
}

const WORDS: &[&str] = &[
    "the", "model", "answer", "term", "is", "a", "of", "in", "hallucination", "question",
    "which", "not", "known", "defined", "paper", "concept", "refers", "to", "and", "that",
    "method", "used", "for", "data", "evaluation", "language", "large", "results", "this",
    "we", "describe", "there", "no", "such", "as", "by", "with", "benchmark", "score",
];

/// A seeded xorshift: the same text every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn text(rng: &mut Rng, len: usize) -> String {
    let mut s = String::with_capacity(len + 16);
    while s.len() < len {
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(WORDS[(rng.next() % WORDS.len() as u64) as usize]);
    }
    s
}

/// A random 16-byte id, as a content hash is.
fn job_id(rng: &mut Rng) -> JobId {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&rng.next().to_le_bytes());
    id[8..].copy_from_slice(&rng.next().to_le_bytes());
    JobId(id)
}

/// Allocated bytes of the files under `dir` (what `du` reports).
fn disk_bytes(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let m = e.metadata()?;
        total += if m.is_dir() { disk_bytes(&e.path())? } else { m.blocks() * 512 };
    }
    Ok(total)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let tmp = tempfile::tempdir()?;
    let dir = args.dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut text_bytes = 0u64;
    let completions: Vec<Completion> = (0..args.jobs)
        .map(|_| {
            let t = text(&mut rng, args.text);
            text_bytes += t.len() as u64;
            Completion {
                usage: Usage { prompt_tokens: 40, completion_tokens: (t.len() / 4) as u64 },
                text: t,
                latency_ms: 0,
                finish_reason: Some("stop".into()),
                calls: 1,
                logprobs: None,
            }
        })
        .collect();
    let started = Instant::now();
    rt.block_on(async {
        let state = RunState::open(&dir.join("state"))?;
        let cp = Checkpoint::open(&dir.join("checkpoint"))?;
        let totals = vec![ClassTotals { model: "m".into(), stage: "s".into(), ..Default::default() }];
        let mut id_rng = Rng(0x2545_f491_4f6c_dd1d);
        let ids: Vec<JobId> = (0..args.jobs).map(|_| job_id(&mut id_rng)).collect();
        for (chunk, start) in ids.chunks(args.batch).zip((0u64..).step_by(args.batch)) {
            // The worker's side: a group of concurrent puts.
            let puts = chunk.iter().enumerate().map(|(k, id)| {
                let cp = cp.clone();
                let c = completions[start as usize + k].clone();
                let id = *id;
                tokio::spawn(async move { cp.put(id, &c).await })
            });
            for p in futures::future::join_all(puts).await {
                p??;
            }
            // The coordinator's side: one atomic commit of the batch, then a flush.
            let encoded: Vec<Vec<u8>> = chunk
                .iter()
                .enumerate()
                .map(|(k, _)| {
                    let c = completions[start as usize + k].clone();
                    let s = StoredResult { outcome: Outcome::Done(c), deliveries: 1, cached: false };
                    encode_result(&s)
                })
                .collect::<Result<_, _>>()?;
            let labels: Vec<Vec<u8>> = (0..chunk.len())
                .map(|k| halyard_proto::encode(&serde_json::json!({ "item": start + k as u64 })))
                .collect::<Result<_, _>>()?;
            let mut writes = Vec::with_capacity(chunk.len() * 2 + 1);
            for (k, id) in chunk.iter().enumerate() {
                if std::env::var("XR").is_err() { writes.push(Write::Result(id, &encoded[k])); }
                let item = ItemKey { bench: 0, model: 0, item: (start + k as u64) as u32 };
                if std::env::var("XL").is_err() { writes.push(Write::Label(item, &labels[k])); }
            }
            writes.push(Write::Costs(&totals));
            state.commit_writes(&writes)?;
            state.flush().await?;
        }
        drop(state);
        cp.close().await;
        anyhow::Ok(())
    })?;
    let secs = started.elapsed().as_secs_f64();
    let (st, cp) = (disk_bytes(&dir.join("state"))?, disk_bytes(&dir.join("checkpoint"))?);
    let n = args.jobs.max(1) as f64;
    println!(
        "{} jobs, answers of {} bytes: written in {secs:.1} s ({:.0} jobs/s)",
        args.jobs,
        args.text,
        args.jobs as f64 / secs
    );
    println!(
        "on disk: run state {:.1} MB ({:.0} B/job), checkpoint {:.1} MB ({:.0} B/job), together {:.0} B/job",
        st as f64 / 1e6,
        st as f64 / n,
        cp as f64 / 1e6,
        cp as f64 / n,
        (st + cp) as f64 / n
    );
    if text_bytes > 0 {
        println!(
            "answer text {:.1} MB: state + checkpoint = {:.2} x the text",
            text_bytes as f64 / 1e6,
            (st + cp) as f64 / text_bytes as f64
        );
    }
    Ok(())
}

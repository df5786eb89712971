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
//! `cargo run --release -p halyard-bench --bin store -- [--jobs 100000] [--text 0] [--batch 1024] [--engine halyard|sled] [--compact] [--stats]`
//!
//! `--text N`: answers of about N bytes of English-like text (words drawn from a fixed
//! list by a seeded generator); 0 is the noop pipeline's empty answer. `--answers FILE`:
//! real answers instead, one JSON string per line, taken in turn (for example the
//! answers gpt-3.5-turbo gave in AutoHall's recording, which the stores' zstd dictionary
//! was not trained on; README "Performance" shows how to extract them).

use std::path::Path;
use std::time::Instant;

use clap::Parser;
use halyard_coordinator::state::{ItemKey, RunDb, Share, Write};
use halyard_plan::cost::ClassTotals;
use halyard_proto::stored::encode_result;
use halyard_proto::{Completion, JobId, Outcome, StoredResult, Usage};
use halyard_worker::Checkpoint;

// The measuring helpers of `halyard-bench` (this binary uses two of them).
#[allow(dead_code, unused_imports)]
#[path = "../procs.rs"]
mod procs;

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
    /// Answers to store instead of generated text: one JSON string per line, in turn.
    #[arg(long)]
    answers: Option<std::path::PathBuf>,
    /// Results per coordinator commit (the coordinator takes up to 2,048 per step).
    #[arg(long, default_value_t = 1024)]
    batch: usize,
    /// Keep the stores here instead of a temporary directory.
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    /// `halyard`: Halyard's stores as they are (fjall). `sled`: the same records and commits
    /// in sled 0.34, as Halyard stored them before issue 19, for comparison.
    #[arg(long, value_enum, default_value_t = Engine::Halyard)]
    engine: Engine,
    /// Compact both stores after writing, as a complete run does as it ends
    /// (`halyard_store::compact`: the records rewritten in key order, without the
    /// journal), and print the bytes on disk again.
    #[arg(long)]
    compact: bool,
    /// Print each keyspace's records and bytes in tables, and each store's journal.
    #[arg(long)]
    stats: bool,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Engine {
    Halyard,
    Sled,
}

const WORDS: &[&str] = &[
    "the",
    "model",
    "answer",
    "term",
    "is",
    "a",
    "of",
    "in",
    "hallucination",
    "question",
    "which",
    "not",
    "known",
    "defined",
    "paper",
    "concept",
    "refers",
    "to",
    "and",
    "that",
    "method",
    "used",
    "for",
    "data",
    "evaluation",
    "language",
    "large",
    "results",
    "this",
    "we",
    "describe",
    "there",
    "no",
    "such",
    "as",
    "by",
    "with",
    "benchmark",
    "score",
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

/// The answers of `path`: one JSON string per line (blank lines skipped).
fn read_answers(path: &Path) -> anyhow::Result<Vec<String>> {
    use anyhow::Context;
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let a: String = serde_json::from_str(line).with_context(|| {
            format!("{}:{}: not a JSON string (one answer per line)", path.display(), n + 1)
        })?;
        out.push(a);
    }
    anyhow::ensure!(!out.is_empty(), "{}: no answers", path.display());
    Ok(out)
}

/// A random 16-byte id, as a content hash is.
fn job_id(rng: &mut Rng) -> JobId {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&rng.next().to_le_bytes());
    id[8..].copy_from_slice(&rng.next().to_le_bytes());
    JobId(id)
}

/// Every record of the run, encoded once, whichever engine writes them.
struct Records {
    ids: Vec<JobId>,
    completions: Vec<Completion>,
    /// The coordinator's stored results ([`encode_result`]).
    results: Vec<Vec<u8>>,
    /// The items' labels (the noop pipeline's `{"item": i}`).
    labels: Vec<Vec<u8>>,
    costs: Vec<ClassTotals>,
    text_bytes: u64,
}

impl Records {
    fn new(args: &Args) -> anyhow::Result<Records> {
        let (mut rng, mut id_rng) = (Rng(0x9e37_79b9_7f4a_7c15), Rng(0x2545_f491_4f6c_dd1d));
        let mut r = Records {
            ids: Vec::new(),
            completions: Vec::new(),
            results: Vec::new(),
            labels: Vec::new(),
            costs: vec![ClassTotals { model: "m".into(), stage: "s".into(), ..Default::default() }],
            text_bytes: 0,
        };
        let answers = match &args.answers {
            Some(path) => read_answers(path)?,
            None => Vec::new(),
        };
        for i in 0..args.jobs {
            let t = match answers.is_empty() {
                true => text(&mut rng, args.text),
                false => answers[i as usize % answers.len()].clone(),
            };
            r.text_bytes += t.len() as u64;
            let c = Completion {
                usage: Usage {
                    prompt_tokens: 40,
                    completion_tokens: (t.len() / 4) as u64,
                    cache: None,
                },
                text: t,
                latency_ms: 0,
                finish_reason: Some("stop".into()),
                calls: 1,
                logprobs: None,
                refusal: false,
                source: Default::default(),
            };
            let s =
                StoredResult { outcome: Outcome::Done(c.clone()), deliveries: 1, cached: false };
            r.results.push(encode_result(&s)?);
            r.labels.push(halyard_proto::encode(&serde_json::json!({ "item": i }))?);
            r.completions.push(c);
            r.ids.push(job_id(&mut id_rng));
        }
        Ok(r)
    }

    fn item(i: usize) -> ItemKey {
        ItemKey { bench: 0, model: 0, item: i as u32 }
    }
}

/// Halyard's stores: per batch, the checkpoint's group commit of concurrent puts, then
/// the run state's atomic commit of results, labels and cost totals, then its flush.
fn write_halyard(args: &Args, dir: &Path, r: &Records) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async {
        let state = RunDb::open(&dir.join("state"))?;
        let cp = Checkpoint::open(&dir.join("checkpoint"))?;
        for (chunk, start) in r.ids.chunks(args.batch).zip((0usize..).step_by(args.batch)) {
            let puts = chunk.iter().enumerate().map(|(k, id)| {
                let (cp, c, id) = (cp.clone(), r.completions[start + k].clone(), *id);
                tokio::spawn(async move { cp.put(id, &c).await })
            });
            for p in futures::future::join_all(puts).await {
                p??;
            }
            let mut writes = Vec::with_capacity(chunk.len() * 2 + 1);
            for (k, id) in chunk.iter().enumerate() {
                writes.push(Write::Result(id, &r.results[start + k], Share::No));
                writes.push(Write::Label(Records::item(start + k), &r.labels[start + k]));
            }
            writes.push(Write::Costs(&r.costs));
            state.commit_writes(&writes)?;
            state.flush().await?;
        }
        drop(state);
        cp.close().await;
        anyhow::Ok(())
    })
}

/// Peak resident set of this process, in bytes.
fn peak_rss() -> Option<u64> {
    procs::peak_rss(std::process::id())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let tmp = tempfile::tempdir()?;
    let dir = args.dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    let records = Records::new(&args)?;
    let before = peak_rss().unwrap_or(0);
    let started = Instant::now();
    match args.engine {
        Engine::Halyard => write_halyard(&args, &dir, &records)?,
        Engine::Sled => sled_side::write(&args, &dir, &records)?,
    }
    let secs = started.elapsed().as_secs_f64();
    if let Engine::Halyard = args.engine {
        // What a restart pays before its first job: the journal replayed, and the run
        // state's pass over its result ids (the duplicate filter).
        let t = Instant::now();
        drop(RunDb::open(&dir.join("state"))?);
        let state_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        rt.block_on(async {
            Checkpoint::open(&dir.join("checkpoint"))?.close().await;
            anyhow::Ok(())
        })?;
        println!(
            "reopened: run state in {state_s:.2} s (journal and id pass), checkpoint in {:.2} s (journal)",
            t.elapsed().as_secs_f64()
        );
    }
    let n = args.jobs.max(1) as f64;
    println!(
        "{:?}: {} jobs, answers of {:.0} bytes on average: written in {secs:.1} s ({:.0} jobs/s); peak RSS {:.0} MiB ({:.0} MiB of it the records to write)",
        args.engine,
        args.jobs,
        records.text_bytes as f64 / n,
        args.jobs as f64 / secs,
        peak_rss().unwrap_or(0) as f64 / 1048576.0,
        before as f64 / 1048576.0,
    );
    on_disk("on disk", &dir, n, records.text_bytes)?;
    if args.compact {
        if let Engine::Sled = args.engine {
            anyhow::bail!("--compact compacts Halyard's stores (fjall), not sled's");
        }
        // What a complete run does to its stores as it ends.
        let t = Instant::now();
        for d in ["state", "checkpoint"] {
            halyard_store::compact(&dir.join(d), halyard_store::Options::default())?;
        }
        println!("compacted both stores in {:.2} s", t.elapsed().as_secs_f64());
        on_disk("on disk, compacted (as a complete run leaves them)", &dir, n, records.text_bytes)?;
    }
    if args.stats {
        if let Engine::Sled = args.engine {
            anyhow::bail!("--stats reads Halyard's stores (fjall), not sled's");
        }
        for d in ["state", "checkpoint"] {
            for line in stats(d, &dir.join(d))? {
                println!("{line}");
            }
        }
    }
    Ok(())
}

/// Print the bytes on disk of both stores in `dir`, per job of `n` and against the
/// answers' `text` bytes.
fn on_disk(what: &str, dir: &Path, n: f64, text: u64) -> anyhow::Result<()> {
    let (st, cp) =
        (procs::disk_bytes(&dir.join("state"))?, procs::disk_bytes(&dir.join("checkpoint"))?);
    println!(
        "{what}: run state {:.1} MB ({:.0} B/job), checkpoint {:.1} MB ({:.0} B/job), together {:.0} B/job",
        st as f64 / 1e6,
        st as f64 / n,
        cp as f64 / 1e6,
        cp as f64 / n,
        (st + cp) as f64 / n
    );
    if text > 0 {
        println!(
            "answer text {:.1} MB: state + checkpoint = {:.2} x the text",
            text as f64 / 1e6,
            (st + cp) as f64 / text as f64
        );
    }
    Ok(())
}

/// The keyspaces of the store in `dir` that hold records, a line each (records, bytes in
/// tables), then one for the store (its journal, all its files).
fn stats(name: &str, dir: &Path) -> anyhow::Result<Vec<String>> {
    let store = halyard_store::open(dir, halyard_store::Options::default(), &[])?;
    let mut lines = Vec::new();
    for ks_name in store.db().list_keyspace_names() {
        let ks = store.keyspace(&ks_name)?;
        let records = halyard_store::count(&ks)?;
        if records == 0 {
            continue;
        }
        lines.push(format!(
            "  {name}/{:<20} {records:>9} records, {:>6.1} MB in tables",
            &*ks_name,
            ks.disk_space() as f64 / 1e6,
        ));
    }
    lines.push(format!(
        "  {name}: journal {:.1} MB, {:.1} MB on disk in all",
        store.db().journal_disk_space()? as f64 / 1e6,
        halyard_store::disk_bytes(dir)? as f64 / 1e6,
    ));
    Ok(lines)
}

#[cfg(test)]
mod tests {
    /// The statistics name each keyspace that holds records, with its count, and the
    /// journal.
    #[test]
    fn stats_name_keyspaces_and_their_records() {
        let d = tempfile::tempdir().unwrap();
        {
            let s = halyard_store::open(d.path(), halyard_store::Options::default(), &["answers"])
                .unwrap();
            let t = s.keyspace("answers").unwrap();
            for i in 0..10u8 {
                t.insert([i, i], [i; 100]).unwrap();
            }
        }
        let lines = super::stats("state", d.path()).unwrap();
        let line =
            lines.iter().find(|l| l.contains("state/answers")).expect("a line for the keyspace");
        assert!(line.contains(" 10 records"), "{line}");
        assert!(lines.last().unwrap().contains("journal"), "{lines:?}");
    }
}

/// The same records in sled 0.34, as Halyard's stores wrote them before issue 19: per
/// batch, the checkpoint's records in one batch and a flush, then the run state's
/// results, labels and cost totals in one transaction over three trees and a flush.
mod sled_side {
    use super::*;
    use sled::Transactional;

    pub fn write(args: &Args, dir: &Path, r: &Records) -> anyhow::Result<()> {
        let open = |d: &str| {
            sled::Config::new()
                .path(dir.join(d))
                .mode(sled::Mode::HighThroughput)
                .cache_capacity(256 << 20)
                .open()
        };
        let (state, cp) = (open("state")?, open("checkpoint")?);
        let (results, done, meta) =
            (state.open_tree("results")?, state.open_tree("done")?, state.open_tree("meta")?);
        let completions = cp.open_tree("completions")?;
        let costs = halyard_proto::encode(&r.costs)?;
        for (chunk, start) in r.ids.chunks(args.batch).zip((0usize..).step_by(args.batch)) {
            let mut batch = sled::Batch::default();
            for (k, id) in chunk.iter().enumerate() {
                let c = halyard_proto::stored::encode_completion(&r.completions[start + k])?;
                batch.insert(&id.as_bytes()[..], c);
            }
            completions.apply_batch(batch)?;
            cp.flush()?;
            (&results, &done, &meta)
                .transaction(|(results, done, meta)| {
                    for (k, id) in chunk.iter().enumerate() {
                        results.insert(&id.as_bytes()[..], &r.results[start + k][..])?;
                        let item = Records::item(start + k).to_bytes();
                        done.insert(&item[..], &r.labels[start + k][..])?;
                    }
                    meta.insert(&b"costs"[..], &costs[..])?;
                    Ok::<_, sled::transaction::ConflictableTransactionError<()>>(())
                })
                .map_err(|e| anyhow::anyhow!("sled transaction: {e:?}"))?;
            state.flush()?;
        }
        Ok(())
    }
}

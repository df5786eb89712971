//! `otpm`: a pool bound by Anthropic's output tokens per minute (issue 52).
//!
//! Starts a private nats-server and the test kit's fake Anthropic Messages API enforcing
//! an output-tokens-per-minute limit the way Anthropic documents it (a token bucket that
//! refills continuously; `max_tokens` reserved at admission, settled to the tokens
//! produced when the answer is sent; 429 with `retry-after` beyond it), publishes more
//! `backend = "anthropic"` jobs than the run can do, and runs workers that take the pool's
//! `otpm` from a sweep file. Answers are much shorter than `max_tokens`, so a pool that
//! charged `max_tokens` without settling would reach a fraction of the limit.
//!
//! Prints the output tokens per minute the fake admitted as a ratio of the limit, over
//! the run after the workers joined (target ≥ 0.98), and the 429s (target 0).
//!
//! `cargo run --release -p halyard-bench --bin otpm -- [--secs 180] [--workers 2]`

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use halyard_broker::embedded::EmbeddedNats;
use halyard_broker::BrokerConfig;
use halyard_plan::sweep;
use halyard_plan::worker_plan::worker_plan;
use halyard_proto::{ChatMessage, Job, JobKey, ModelRef, Sampling};
use halyard_tests::fake_anthropic::{FakeAnthropic, Limits};
use halyard_tests::Reply;
use halyard_worker::WorkerConfig;
use tokio::sync::watch;

#[derive(Parser)]
struct Args {
    /// Seconds the workers run (the start's transient weighs on shorter runs: 0.977 in
    /// 90 s, 0.989 in 180 s on a loaded 2-core machine, debug build).
    #[arg(long, default_value_t = 180)]
    secs: u64,
    /// Workers sharing the pool.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// The pool's output tokens per minute.
    #[arg(long, default_value_t = 60_000)]
    otpm: u64,
    /// `max_tokens` of each request.
    #[arg(long, default_value_t = 400)]
    max_tokens: u32,
    /// Output tokens of each answer.
    #[arg(long, default_value_t = 100)]
    answer: usize,
    /// Latency of the fake API, milliseconds.
    #[arg(long, default_value_t = 200)]
    latency_ms: u64,
}

const POOL: &str = "anthropic-key";
const KEY_VAR: &str = "CLAUDE_BENCH_API_KEY";

fn write_sweep(dir: &Path, a: &Args, base_url: &str) -> anyhow::Result<std::path::PathBuf> {
    let text = format!(
        "name = \"otpm-bench\"\n\n[[model]]\nname = \"claude\"\nbackend = \"anthropic\"\nbase_url = \"{base_url}\"\n\
         model = \"claude-bench\"\napi_key_env = \"{KEY_VAR}\"\npool = \"{POOL}\"\nmax_concurrency = 32\n\
         max_tokens = {}\notpm = {}\n\n[[model]]\nname = \"free\"\nbackend = \"noop\"\n\n\
         [[benchmark]]\npipeline = \"noop\"\njobs = 1\nmodels = [\"free\"]\n\n[run]\nack_wait_s = 60\n",
        a.max_tokens, a.otpm
    );
    let path = dir.join("otpm-bench.toml");
    std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
    Ok(path)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("HALYARD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,async_nats=error"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    // The workers read the key from this variable (as from the sweep's `api_key_env`).
    std::env::set_var(KEY_VAR, "sk-ant-bench");
    let dir = tempfile::tempdir()?;
    let nats = EmbeddedNats::start(&dir.path().join("nats"))?;
    let answer = vec!["w"; a.answer].join(" ");
    let latency = Duration::from_millis(a.latency_ms);
    let limits = Limits { rpm: None, itpm: None, otpm: Some(a.otpm) };
    let fake = FakeAnthropic::start(limits, move |_| Reply::Text(answer.clone()).after(latency));
    let s = sweep::load(&write_sweep(dir.path(), &a, &fake.base_url())?)?;
    let broker = halyard_broker::connect(
        &BrokerConfig::new(nats.url(), "otpm-bench publisher").with_auth(nats.auth()),
    )
    .await?;
    halyard_broker::init(&broker, &Default::default()).await?;
    // The pool's consumer, which a coordinator makes and the workers wait for.
    let delivery =
        halyard_broker::Delivery { ack_wait: s.run.ack_wait, max_deliver: s.run.max_deliver };
    halyard_broker::pool_consumer(&broker, POOL, delivery).await?;
    // More jobs than the limit lets through in the run.
    let jobs = (a.otpm as f64 / a.answer as f64 * a.secs as f64 / 60.0 * 1.3) as u64 + 100;
    let run = uuid::Uuid::now_v7();
    let subject = halyard_proto::subjects::job_subject(POOL);
    let mut acks = Vec::new();
    for i in 0..jobs {
        let key = JobKey {
            pipeline: "noop".into(),
            stage: "call".into(),
            stage_version: 1,
            model: ModelRef {
                backend: "anthropic".into(),
                endpoint: fake.base_url(),
                model: "claude-bench".into(),
            },
            messages: vec![ChatMessage::user(format!("question {i}"))],
            sampling: Sampling { max_tokens: Some(a.max_tokens), ..Sampling::default() },
            sample_index: 0,
        };
        let job = Job::new(run, POOL, key, 60_000);
        let m = async_nats::jetstream::message::PublishMessage::build()
            .payload(halyard_proto::encode(&job)?.into())
            .message_id(format!("{run}:{}", job.id));
        acks.push(broker.js.send_publish(subject.clone(), m).await?);
        if acks.len() >= 256 {
            for ack in acks.drain(..) {
                ack.await?;
            }
        }
    }
    for ack in acks {
        ack.await?;
    }
    let mut plan = worker_plan(&s);
    plan.pools.retain(|p| p.pool.name == POOL);
    let mut workers = Vec::new();
    for n in 0..a.workers {
        let mut cfg = WorkerConfig::new(plan.clone(), dir.path().join(format!("worker-{n}")));
        cfg.worker_id = format!("otpm-worker-{n}");
        cfg.shutdown_grace = Duration::from_secs(2);
        cfg.delivery =
            halyard_broker::Delivery { ack_wait: s.run.ack_wait, max_deliver: s.run.max_deliver };
        let b = halyard_broker::connect(
            &BrokerConfig::new(nats.url(), cfg.worker_id.clone()).with_auth(nats.auth()),
        )
        .await?;
        let (stop, rx) = watch::channel(false);
        let task = tokio::spawn(halyard_worker::run(b, cfg, async move {
            let mut rx = rx;
            let _ = rx.wait_for(|s| *s).await;
        }));
        workers.push((stop, task));
    }
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs(a.secs)).await;
    let end = Instant::now();
    for (stop, _) in &workers {
        let _ = stop.send(true);
    }
    for (_, task) in workers {
        task.await??;
    }
    let ledger = fake.ledger();
    // From the first admission (the workers have joined and settled) to the end.
    let first = ledger.admitted.iter().map(|(t, _)| *t).min().unwrap_or(start);
    let produced: u64 = ledger.admitted.iter().filter(|(t, _)| *t <= end).map(|(_, n)| *n).sum();
    let minutes = end.duration_since(first).as_secs_f64() / 60.0;
    let ratio = produced as f64 / minutes / a.otpm as f64;
    println!(
        "| workers | OTPM | max_tokens | answer tokens | requests | output tokens/min ÷ OTPM | 429s |"
    );
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {} | {} | {} | {:.3} | {} |",
        a.workers,
        a.otpm,
        a.max_tokens,
        a.answer,
        ledger.admitted.len(),
        ratio,
        ledger.rejected
    );
    Ok(())
}

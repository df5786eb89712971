//! `quota`: pool quotas against a quota-enforcing fake API.
//!
//! Each scenario starts a private nats-server, a [`FakeQuotaApi`] enforcing the quota
//! over a sliding 60 s window (429 with `Retry-After` beyond it), and publishes more
//! chat jobs for the quota's pool than the run can do. The workers take the pool's quota
//! from a sweep file (its `rpm`, `tpm`, `max_concurrency`), as `halyard worker --sweep`
//! does. Workers (in this process, each with its own NATS connection,
//! checkpoint and worker id, so they coordinate only through the broker as separate
//! processes would) join and leave on the scenario's schedule. At the end it prints,
//! per scenario, what the API admitted: requests and tokens per minute as a ratio of
//! the quota, the most admitted in any 60 s window, the 429s, and the cool-downs.
//!
//! How tokens are counted is part of a scenario: the fake API charges a request either
//! the tokens it used or its prompt plus `max_tokens` at admission without refund
//! ([`Counting`]), and the workers' pool quota says which it expects (`tpm_counts`).
//! Token ratios are of the tokens the API charged.
//!
//! `cargo run --release -p halyard-bench --bin quota -- [--secs 180] [--only NAME]`

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use halyard_broker::auth::NatsAuth;
use halyard_broker::embedded::EmbeddedNats;
use halyard_broker::BrokerConfig;
use halyard_plan::sweep;
use halyard_plan::worker_plan::worker_plan;
use halyard_tests::fake_quota::{max_in_window, publish_chat_jobs, Counting};
use halyard_tests::{FakeQuotaApi, QuotaConfig};
use halyard_worker::quota::TpmCounts;
use halyard_worker::{Stats, WorkerConfig};
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[derive(Parser)]
struct Args {
    /// Seconds each scenario runs (the targets need at least 180).
    #[arg(long, default_value_t = 180)]
    secs: u64,
    /// Run only the scenarios whose name contains this.
    #[arg(long)]
    only: Option<String>,
    /// Latency of the fake API, milliseconds.
    #[arg(long, default_value_t = 200)]
    latency_ms: u64,
}

struct Scenario {
    name: &'static str,
    rpm: u64,
    tpm: u64,
    /// `max_tokens` of the requests, and the completion tokens the API answers with.
    max_tokens: u64,
    completion: u64,
    /// (fraction of the run, workers from then on).
    schedule: &'static [(f64, usize)],
    /// Which quota binds (the ratio the targets apply to).
    binds_on_tokens: bool,
    /// How the API charges tokens, and how the workers expect it to.
    api_counts: Counting,
    tpm_counts: TpmCounts,
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "1 worker",
        rpm: 600,
        tpm: 60_000,
        max_tokens: 50,
        completion: 30,
        schedule: &[(0.0, 1)],
        binds_on_tokens: false,
        api_counts: Counting::Usage,
        tpm_counts: TpmCounts::MaxTokens,
    },
    Scenario {
        name: "4 workers",
        rpm: 600,
        tpm: 60_000,
        max_tokens: 50,
        completion: 30,
        schedule: &[(0.0, 4)],
        binds_on_tokens: false,
        api_counts: Counting::Usage,
        tpm_counts: TpmCounts::MaxTokens,
    },
    Scenario {
        name: "8 workers",
        rpm: 600,
        tpm: 60_000,
        max_tokens: 50,
        completion: 30,
        schedule: &[(0.0, 8)],
        binds_on_tokens: false,
        api_counts: Counting::Usage,
        tpm_counts: TpmCounts::MaxTokens,
    },
    Scenario {
        name: "1->4->2 workers",
        rpm: 600,
        tpm: 60_000,
        max_tokens: 50,
        completion: 30,
        schedule: &[(0.0, 1), (1.0 / 3.0, 4), (2.0 / 3.0, 2)],
        binds_on_tokens: false,
        api_counts: Counting::Usage,
        tpm_counts: TpmCounts::MaxTokens,
    },
    tokens_bind("tokens bind, usage counted (4 workers)", 80, Counting::Usage, TpmCounts::Usage),
    tokens_bind(
        "tokens bind, max_tokens counted (4 workers)",
        40,
        Counting::MaxTokens,
        TpmCounts::MaxTokens,
    ),
    tokens_bind(
        "tokens bind, API counts max_tokens, pool says usage (4 workers)",
        40,
        Counting::MaxTokens,
        TpmCounts::Usage,
    ),
];

/// Four workers against 6,000 RPM / 60,000 TPM with `max_tokens` 100: tokens bind.
const fn tokens_bind(
    name: &'static str,
    completion: u64,
    api_counts: Counting,
    tpm_counts: TpmCounts,
) -> Scenario {
    Scenario {
        name,
        rpm: 6_000,
        tpm: 60_000,
        max_tokens: 100,
        completion,
        schedule: &[(0.0, 4)],
        binds_on_tokens: true,
        api_counts,
        tpm_counts,
    }
}

const POOL: &str = "paid-key";

fn write_sweep(dir: &Path, sc: &Scenario, base_url: &str) -> anyhow::Result<std::path::PathBuf> {
    let text = format!(
        "name = \"quota-bench\"\n\n[[model]]\nname = \"paid\"\nbackend = \"openai\"\nbase_url = \"{base_url}\"\nmodel = \"m\"\n\
         pool = \"{POOL}\"\nmax_concurrency = 16\nmax_tokens = {}\nrpm = {}\ntpm = {}\n\n\
         [[model]]\nname = \"free\"\nbackend = \"noop\"\n\n\
         [[benchmark]]\npipeline = \"noop\"\njobs = 1\nmodels = [\"free\"]\n\n[run]\nack_wait_s = 60\n",
        sc.max_tokens, sc.rpm, sc.tpm
    );
    let path = dir.join("quota-bench.toml");
    std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
    Ok(path)
}

struct Worker {
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<Arc<Stats>, halyard_worker::WorkerError>>,
}

async fn start_worker(
    url: &str,
    auth: &NatsAuth,
    s: &sweep::Sweep,
    sc: &Scenario,
    dir: &Path,
    n: usize,
) -> anyhow::Result<Worker> {
    let mut plan = worker_plan(s);
    plan.pools.retain(|p| p.pool.name == POOL);
    for p in &mut plan.pools {
        if let Some(q) = p.quota.as_mut() {
            q.tpm_counts = sc.tpm_counts;
        }
    }
    let mut cfg = WorkerConfig::new(plan, dir.join(format!("worker-{n}")));
    cfg.worker_id = format!("bench-worker-{n}");
    // Calls still waiting for the share when a worker stops go back to the queue soon.
    cfg.shutdown_grace = Duration::from_secs(2);
    cfg.delivery =
        halyard_broker::Delivery { ack_wait: s.run.ack_wait, max_deliver: s.run.max_deliver };
    let broker = halyard_broker::connect(
        &BrokerConfig::new(url, cfg.worker_id.clone()).with_auth(auth.clone()),
    )
    .await?;
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(halyard_worker::run(broker, cfg, async move {
        let mut rx = rx;
        let _ = rx.wait_for(|s| *s).await;
    }));
    Ok(Worker { stop, task })
}

/// Stop workers together (each leaves its pool at once) and add up their statistics.
async fn stop_workers(ws: Vec<Worker>, totals: &mut (u64, u64)) -> anyhow::Result<()> {
    for w in &ws {
        let _ = w.stop.send(true);
    }
    for w in ws {
        let stats = w.task.await??;
        totals.0 += stats.cooldowns.get();
        totals.1 += stats.rate_limited.get();
    }
    Ok(())
}

struct Row {
    name: &'static str,
    counts: String,
    rpm_ratio: f64,
    tpm_ratio: f64,
    max_req_60s: u64,
    max_tok_60s: u64,
    rejected: u64,
    cooldowns: u64,
    binding: f64,
}

async fn run_scenario(sc: &Scenario, secs: u64, latency: Duration) -> anyhow::Result<Row> {
    let dir = tempfile::tempdir()?;
    let nats = EmbeddedNats::start(&dir.path().join("nats"))?;
    let url = nats.url();
    let api = FakeQuotaApi::start(QuotaConfig {
        rpm: sc.rpm,
        tpm: sc.tpm,
        window: Duration::from_secs(60),
        latency,
        completion_tokens: sc.completion,
        counts: sc.api_counts,
    });
    let sweep_path = write_sweep(dir.path(), sc, &api.base_url())?;
    let s = sweep::load(&sweep_path)?;
    // More jobs than the quota lets through in the run.
    let broker = halyard_broker::connect(
        &BrokerConfig::new(url.clone(), "quota-bench publisher").with_auth(nats.auth()),
    )
    .await?;
    halyard_broker::init(&broker, &Default::default()).await?;
    let jobs =
        (sc.rpm.min(sc.tpm / sc.completion.max(1)) as f64 * secs as f64 / 60.0 * 1.3) as u64 + 100;
    publish_chat_jobs(
        &broker.js,
        uuid::Uuid::now_v7(),
        POOL,
        &api.base_url(),
        sc.max_tokens as u32,
        0..jobs,
    )
    .await
    .map_err(anyhow::Error::msg)?;
    let start = Instant::now();
    let total = Duration::from_secs(secs);
    let mut workers: Vec<Worker> = Vec::new();
    let mut totals = (0u64, 0u64);
    let mut next_id = 0;
    for &(frac, n) in sc.schedule {
        tokio::time::sleep_until((start + total.mul_f64(frac)).into()).await;
        while workers.len() < n {
            workers.push(start_worker(&url, &nats.auth(), &s, sc, dir.path(), next_id).await?);
            next_id += 1;
        }
        if workers.len() > n {
            stop_workers(workers.split_off(n), &mut totals).await?;
        }
        eprintln!("  [{:>5.1} s] {} worker(s)", start.elapsed().as_secs_f64(), workers.len());
    }
    tokio::time::sleep_until((start + total).into()).await;
    let admissions = api.ledger.admissions();
    stop_workers(workers, &mut totals).await?;
    let rejected = api.ledger.rejected();
    // Requests and tokens admitted in each 10 s of the run (the shape of the run).
    let mut shape = vec![(0u64, 0u64); secs.div_ceil(10) as usize];
    for a in &admissions {
        if let Some(b) = shape.get_mut((a.at.as_secs() / 10) as usize) {
            b.0 += 1;
            b.1 += a.tokens;
        }
    }
    eprintln!(
        "  per 10 s (requests/tokens): {}",
        shape.iter().map(|(r, t)| format!("{r}/{t}")).collect::<Vec<_>>().join(" ")
    );
    drop(nats);
    // Admissions within the measured span (the fake's clock started just before `start`).
    let in_run: Vec<_> = admissions.into_iter().filter(|a| a.at <= start.elapsed()).collect();
    let minutes = secs as f64 / 60.0;
    let reqs = in_run.len() as f64;
    let tokens: u64 = in_run.iter().map(|a| a.tokens).sum();
    let (max_req_60s, max_tok_60s) = max_in_window(&in_run, Duration::from_secs(60));
    let rpm_ratio = reqs / minutes / sc.rpm as f64;
    let tpm_ratio = tokens as f64 / minutes / sc.tpm as f64;
    let api = match sc.api_counts {
        Counting::Usage => "usage",
        Counting::MaxTokens => "max_tokens",
    };
    Ok(Row {
        name: sc.name,
        counts: format!("{api} / {}", sc.tpm_counts.as_str()),
        rpm_ratio,
        tpm_ratio,
        max_req_60s,
        max_tok_60s,
        rejected,
        cooldowns: totals.0,
        binding: if sc.binds_on_tokens { tpm_ratio } else { rpm_ratio },
    })
    .inspect(|_| drop(dir))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("HALYARD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,sled=warn,async_nats=error"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let mut rows = Vec::new();
    for sc in SCENARIOS.iter().filter(|s| args.only.as_deref().is_none_or(|o| s.name.contains(o))) {
        eprintln!("scenario {:?}: {} RPM / {} TPM for {} s", sc.name, sc.rpm, sc.tpm, args.secs);
        let row = run_scenario(sc, args.secs, Duration::from_millis(args.latency_ms)).await?;
        eprintln!(
            "  done: {:.1}% of the binding quota, max {} req / {} tok in 60 s, {} 429s",
            row.binding * 100.0,
            row.max_req_60s,
            row.max_tok_60s,
            row.rejected
        );
        rows.push((row, sc.rpm, sc.tpm));
    }
    println!("\n| scenario | quota (RPM / TPM) | tokens counted (API / pool) | requests/min ÷ quota | tokens/min ÷ quota | max requests in a 60 s window | max tokens in a 60 s window | 429s | cool-downs |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (r, rpm, tpm) in rows {
        println!(
            "| {} | {rpm} / {tpm} | {} | {:.1}% | {:.1}% | {} | {} | {} | {} |",
            r.name,
            r.counts,
            r.rpm_ratio * 100.0,
            r.tpm_ratio * 100.0,
            r.max_req_60s,
            r.max_tok_60s,
            r.rejected,
            r.cooldowns
        );
    }
    Ok(())
}

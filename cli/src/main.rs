//! `halyard`: one binary, thin. Each subcommand parses its arguments and calls a library
//! `run(config, shutdown)`; see the crates' docs for what happens inside.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use halyard_broker::{embedded::EmbeddedNats, BrokerConfig, Delivery};
use halyard_coordinator::{sweep, CoordinatorConfig, Progress, RunOutcome};
use halyard_worker::backend::replay::{ReplaySource, ReplaySpec};
use halyard_worker::backend::GgufSpec;
use halyard_worker::quota::PoolQuota;
use halyard_worker::{Checkpoint, PoolSpec, WorkerConfig};
use tokio::sync::watch;

mod nats_args;
mod retry_failed;
use nats_args::NatsAuthArgs;
mod metrics;
mod progress;
mod status;
/// mimalloc instead of the system allocator: the job path allocates and frees a few
/// small buffers per message, and sled copies whole pages on writes; glibc's malloc spent
/// a quarter of the coordinator's and the workers' CPU time on that (README, Performance).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "halyard", version, about = "Hallucination benchmarks for LLMs as distributed, resumable sweeps")]
struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value = "human")]
    log_format: LogFormat,
    /// Only warnings and errors.
    #[arg(long, short, global = true)]
    quiet: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Human,
    Json,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a sweep to completion: coordinator and workers in this process; a private
    /// nats-server unless --nats is given. Running it again resumes the same run.
    Run(RunArgs),
    /// Run only the coordinator of a sweep against a broker (workers join separately).
    Coordinator(CoordArgs),
    /// Run a worker serving the pools of a sweep, or pools named with --pool.
    Worker(WorkerArgs),
    /// Show a run's progress, cost and workers: from the broker (--nats, any machine)
    /// or from the run's status.json.
    Status(StatusCmd),
    /// Merge finished runs into a HypoTermQA leaderboard (leaderboard.md and .html).
    Report(ReportCmd),
    /// List a stopped run's dead letters and re-queue them for its next coordinator.
    RetryFailed(retry_failed::RetryFailedArgs),
}

#[derive(Args)]
struct ReportCmd {
    /// Run directories (each holding report.json).
    #[arg(required = true)]
    runs: Vec<PathBuf>,
    /// Where to write leaderboard.md and leaderboard.html.
    #[arg(long, default_value = ".")]
    out: PathBuf,
}

#[derive(Args)]
struct StatusCmd {
    /// Run name (or run directory / status.json without --nats); all runs if omitted.
    run: Option<String>,
    /// Read the status the coordinator publishes on this broker, with the live workers.
    #[arg(long, env = "HALYARD_NATS_URL")]
    nats: Option<String>,
    /// Output directory holding runs (without --nats).
    #[arg(long, default_value = "runs")]
    out: PathBuf,
    #[command(flatten)]
    nats_auth: NatsAuthArgs,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct RunArgs {
    /// The sweep file (TOML).
    sweep: PathBuf,
    /// Output directory; the run goes to <out>/<sweep name>/.
    #[arg(long, default_value = "runs")]
    out: PathBuf,
    /// Use this NATS broker instead of starting a private one.
    #[arg(long, env = "HALYARD_NATS_URL")]
    nats: Option<String>,
    #[command(flatten)]
    nats_auth: NatsAuthArgs,
    /// Start no local workers (remote `halyard worker`s do the work).
    #[arg(long)]
    no_workers: bool,
    /// Checkpoint directory of the local workers (default <out>/<name>/checkpoint).
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Stop publishing paid calls once the run has spent this many USD (overrides
    /// `[run] max_cost`); run again with a higher limit to continue.
    #[arg(long)]
    max_cost: Option<f64>,
    /// Serve Prometheus metrics (coordinator and local workers) at ADDR/metrics, e.g.
    /// 127.0.0.1:9464. Off unless given.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
}

#[derive(Args)]
struct CoordArgs {
    sweep: PathBuf,
    #[arg(long, default_value = "runs")]
    out: PathBuf,
    #[arg(long, env = "HALYARD_NATS_URL")]
    nats: String,
    #[command(flatten)]
    nats_auth: NatsAuthArgs,
    /// As for `run`: no new paid calls past this many USD.
    #[arg(long)]
    max_cost: Option<f64>,
    /// Prometheus metrics address (default 127.0.0.1:9464), or `off`.
    #[arg(long, value_name = "ADDR|off")]
    metrics: Option<String>,
}

#[derive(Args)]
struct WorkerArgs {
    #[arg(long, env = "HALYARD_NATS_URL")]
    nats: String,
    #[command(flatten)]
    nats_auth: NatsAuthArgs,
    /// Serve every pool of this sweep (with its concurrency and delivery settings).
    #[arg(long)]
    sweep: Option<PathBuf>,
    /// Serve this pool: NAME or NAME=CONCURRENCY (repeatable).
    #[arg(long = "pool")]
    pools: Vec<String>,
    /// Quota of a --pool, shared by all its workers: POOL:rpm=N,tpm=N[,burst=N]
    /// (repeatable; with --sweep the quotas come from the sweep's rpm/tpm/burst keys).
    #[arg(long = "quota")]
    quotas: Vec<String>,
    /// Quota pools: seconds within which the other workers notice that this one died
    /// (heartbeats go every quarter of it). The first worker to create the membership
    /// bucket sets it for every worker.
    #[arg(long, default_value_t = 10.0)]
    quota_ttl: f64,
    /// Checkpoint directory (sled).
    #[arg(long, default_value = "halyard-worker")]
    state: PathBuf,
    /// Deliveries before a job becomes a dead letter (ignored with --sweep).
    #[arg(long, default_value_t = 5)]
    max_deliver: i64,
    /// Seconds to ack before redelivery (ignored with --sweep).
    #[arg(long, default_value_t = 30.0)]
    ack_wait: f64,
    /// Seconds in-flight calls get to finish after SIGTERM/SIGINT.
    #[arg(long, default_value_t = 10.0)]
    grace: f64,
    /// Worker name in results and logs.
    #[arg(long)]
    id: Option<String>,
    /// Serve the sweep's local (gguf) models placed on this GPU (`gpu = N` in the sweep),
    /// pinned to that device. Needs a build with the `cuda` feature.
    #[arg(long)]
    gpu: Option<u32>,
    /// Prometheus metrics address (default 127.0.0.1:9465), or `off`.
    #[arg(long, value_name = "ADDR|off")]
    metrics: Option<String>,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    init_logs(cli.log_format, cli.quiet);
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(dispatch(cli.cmd)) {
        Ok(code) => std::process::ExitCode::from(code),
        Err(e) => {
            // Walk the chain: the outermost context first, then each cause.
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}

fn init_logs(format: LogFormat, quiet: bool) {
    let default = if quiet { "warn" } else { "info" };
    let filter = tracing_subscriber::EnvFilter::try_from_env("HALYARD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("{default},sled=warn,async_nats=warn,llama_cpp_2=warn")));
    progress::init(quiet, matches!(format, LogFormat::Json));
    let b = tracing_subscriber::fmt().with_env_filter(filter).with_writer(progress::LogWriter);
    match format {
        LogFormat::Human => b.init(),
        LogFormat::Json => b.json().init(),
    }
}

/// First SIGINT/SIGTERM: graceful stop (flips the watch). Second: exit at once; nothing
/// durable is lost, since every acked result is already flushed.
fn shutdown_signal() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        next_signal(&mut term).await;
        tracing::warn!("signal received: stopping gracefully (send again to exit at once)");
        let _ = tx.send(true);
        next_signal(&mut term).await;
        eprintln!("second signal: exiting now");
        std::process::exit(130);
    });
    rx
}

/// The next SIGINT or SIGTERM (SIGINT only if SIGTERM could not be hooked).
async fn next_signal(term: &mut Option<tokio::signal::unix::Signal>) {
    match term.as_mut() {
        Some(t) => {
            tokio::select! { _ = tokio::signal::ctrl_c() => {}, _ = t.recv() => {} }
        }
        None => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

async fn until(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

async fn dispatch(cmd: Cmd) -> Result<u8> {
    match cmd {
        Cmd::Run(a) => run(a).await,
        Cmd::Coordinator(a) => coordinator(a).await,
        Cmd::Worker(a) => worker(a).await,
        Cmd::Status(a) => status::status(status::StatusArgs { run: a.run, nats: a.nats, auth: a.nats_auth.auth(), out: a.out, json: a.json }).await,
        Cmd::Report(a) => leaderboard(a),
        Cmd::RetryFailed(a) => retry_failed::run(a),
    }
}

fn worker_pools(s: &sweep::Sweep) -> Vec<PoolSpec> {
    s.pools().into_iter().map(|(name, concurrency)| PoolSpec { name, concurrency }).collect()
}

/// The sweep's local models as the worker loads them.
fn local_models(s: &sweep::Sweep) -> Vec<GgufSpec> {
    s.models
        .iter()
        .filter_map(|m| {
            m.local.as_ref().map(|l| GgufSpec {
                endpoint: m.spec.model_ref.endpoint.clone(),
                path: l.path.clone(),
                gpu: l.gpu,
                gpu_layers: l.gpu_layers,
                slots: l.slots,
                threads: l.threads,
                ctx_size: l.ctx_size,
            })
        })
        .collect()
}

/// Configure a worker for a whole sweep: every pool, every local model.
fn sweep_worker(s: &sweep::Sweep, state: PathBuf) -> WorkerConfig {
    let mut cfg = WorkerConfig::new(worker_pools(s), state);
    cfg.delivery = delivery(s);
    cfg.local_models = local_models(s);
    cfg.replays = replays(s);
    cfg.quotas = s.quotas.iter().map(|(pool, q)| (pool.clone(), pool_quota(q))).collect();
    cfg.embed_models = embed_models(s);
    cfg
}

/// The sweep's replay models as the worker loads them.
fn replays(s: &sweep::Sweep) -> Vec<ReplaySpec> {
    s.models
        .iter()
        .filter_map(|m| {
            let r = m.replay.as_ref()?;
            let source = match &r.from {
                sweep::ReplayFrom::Jsonl(p) => ReplaySource::Jsonl(p.clone()),
                sweep::ReplayFrom::Checkpoint { dir, backend, endpoint } => {
                    ReplaySource::Checkpoint { dir: dir.clone(), backend: backend.clone(), endpoint: endpoint.clone() }
                }
            };
            Some(ReplaySpec { endpoint: r.endpoint.clone(), source })
        })
        .collect()
}

fn pool_quota(q: &sweep::QuotaSpec) -> PoolQuota {
    PoolQuota { burst: q.burst, ..PoolQuota::new(q.rpm, q.tpm) }
}

/// `--quota POOL:rpm=N,tpm=N[,burst=N]`.
fn parse_quota(s: &str) -> Result<(String, PoolQuota)> {
    let bad = |why: String| anyhow::anyhow!("--quota {s:?}: {why} (expected POOL:rpm=N,tpm=N[,burst=N])");
    let (pool, spec) = s.rsplit_once(':').ok_or_else(|| bad("no ':' after the pool name".into()))?;
    let (mut rpm, mut tpm, mut burst) = (None, None, None);
    for part in spec.split(',').filter(|p| !p.trim().is_empty()) {
        let (k, v) = part.split_once('=').ok_or_else(|| bad(format!("{part:?} is not KEY=N")))?;
        let n: i64 = v.trim().parse().map_err(|_| bad(format!("{k} value {v:?} is not an integer")))?;
        match k.trim() {
            "rpm" => rpm = Some(n),
            "tpm" => tpm = Some(n),
            "burst" => burst = Some(n),
            other => return Err(bad(format!("unknown key {other:?}"))),
        }
    }
    let q = sweep::check_quota(rpm, tpm, burst).map_err(&bad)?.ok_or_else(|| bad("give rpm or tpm".into()))?;
    Ok((pool.to_string(), pool_quota(&q)))
}

/// The sweep's embedding models as the worker loads them.
fn embed_models(s: &sweep::Sweep) -> Vec<halyard_worker::backend::embed::EmbedSpec> {
    sweep::build::embed_models(s).into_iter().map(|(endpoint, path)| halyard_worker::backend::embed::EmbedSpec { endpoint, path }).collect()
}

fn delivery(s: &sweep::Sweep) -> Delivery {
    Delivery { ack_wait: s.run.ack_wait, max_deliver: s.run.max_deliver }
}

async fn run(a: RunArgs) -> Result<u8> {
    // Everything is checked before any process starts or any job is published.
    let sweep = with_max_cost(sweep::load(&a.sweep)?, a.max_cost)?;
    let run_dir = a.out.join(&sweep.name);
    std::fs::create_dir_all(&run_dir).with_context(|| format!("cannot create output directory {}", run_dir.display()))?;
    let stop = shutdown_signal();
    let (embedded, url, auth) = match &a.nats {
        Some(url) => (None, url.clone(), a.nats_auth.auth()),
        None => {
            let n = EmbeddedNats::start(&run_dir.join("nats"))?;
            let url = n.url();
            tracing::info!(url = %url, "started private nats-server");
            // The private server listens on loopback only and asks for no credentials.
            (Some(n), url, Default::default())
        }
    };
    let broker = halyard_broker::connect(&BrokerConfig::new(url, "halyard-run").with_auth(auth)).await?;
    let (workers_stop_tx, workers_stop_rx) = watch::channel(false);
    let mut worker_task: Option<tokio::task::JoinHandle<Result<_, halyard_worker::WorkerError>>> = None;
    let mut worker_stats = Vec::new();
    let mut beat = None;
    if !a.no_workers {
        let dir = a.checkpoint.clone().unwrap_or_else(|| run_dir.join("checkpoint"));
        let checkpoint = Checkpoint::open(&dir)?;
        let cfg = sweep_worker(&sweep, dir);
        worker_stats.push((cfg.worker_id.clone(), cfg.stats.clone()));
        beat = status::heartbeat(&broker, cfg.worker_id.clone(), pool_list(&cfg), cfg.stats.clone()).await;
        let b = broker.clone();
        let stop_rx = workers_stop_rx.clone();
        worker_task = Some(tokio::spawn(async move { halyard_worker::run_with_checkpoint(b, checkpoint, cfg, until(stop_rx)).await }));
    }
    // The coordinator runs until the run completes, a signal comes, or the local worker
    // fails (a model that cannot load, say): then the run stops with that error instead
    // of waiting for work nobody will do.
    let (fail_tx, fail_rx) = watch::channel(false);
    let (progress_tx, progress_rx) = watch::channel(Progress::default());
    let coordinator_src = metrics::CoordinatorSource { progress: progress_rx.clone(), broker: broker.clone(), pools: sweep.pools().into_keys().collect() };
    metrics::serve(a.metrics.as_deref(), None, metrics::Sources { coordinator: Some(coordinator_src), workers: worker_stats.clone() }).await?;
    let shown = progress::spawn(progress_rx.clone(), worker_stats.iter().map(|(_, s)| s.clone()).collect());
    let writer = status::StatusWriter::start(&sweep.name, &run_dir, &broker, progress_rx, sweep.pools().into_keys().collect()).await;
    let coordinator = halyard_coordinator::run(broker.clone(), CoordinatorConfig { sweep, run_dir }, Some(progress_tx), async move {
        tokio::select! { _ = until(stop) => {}, _ = until(fail_rx) => {} }
    });
    tokio::pin!(coordinator);
    let mut worker_error = None;
    let outcome = loop {
        tokio::select! {
            o = &mut coordinator => break o,
            w = async { worker_task.as_mut().expect("polled only while Some").await }, if worker_task.is_some() => {
                worker_task = None;
                let msg = match w {
                    Ok(Ok(_)) => "local worker stopped unexpectedly".to_string(),
                    Ok(Err(e)) => e.to_string(),
                    Err(e) => format!("local worker panicked: {e}"),
                };
                worker_error = Some(msg);
                let _ = fail_tx.send(true);
            }
        }
    };
    writer.finish(final_state(&outcome)).await;
    let _ = shown.await;
    if let Some(b) = beat {
        b.abort();
    }
    let _ = workers_stop_tx.send(true);
    if let Some(t) = worker_task {
        match t.await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => worker_error = Some(e.to_string()),
            Err(e) => worker_error = Some(format!("local worker panicked: {e}")),
        }
    }
    let _ = broker.client.flush().await;
    drop(broker);
    drop(embedded);
    if let Some(e) = worker_error {
        anyhow::bail!("local worker failed: {e}");
    }
    match outcome? {
        RunOutcome::Complete { run, report_dir } => {
            println!("run {run} complete: report in {}", report_dir.join("report.md").display());
            Ok(0)
        }
        RunOutcome::Interrupted { run } => {
            eprintln!("run {run} interrupted; run the same command again to resume");
            Ok(130)
        }
        o @ RunOutcome::CostLimit { .. } => Ok(cost_limited(&o)),
    }
}

async fn coordinator(a: CoordArgs) -> Result<u8> {
    let sweep = with_max_cost(sweep::load(&a.sweep)?, a.max_cost)?;
    let run_dir = a.out.join(&sweep.name);
    let stop = shutdown_signal();
    let broker = halyard_broker::connect(&BrokerConfig::new(a.nats, "halyard-coordinator").with_auth(a.nats_auth.auth())).await?;
    let (progress_tx, progress_rx) = watch::channel(Progress::default());
    let src = metrics::CoordinatorSource { progress: progress_rx.clone(), broker: broker.clone(), pools: sweep.pools().into_keys().collect() };
    metrics::serve(a.metrics.as_deref(), Some("127.0.0.1:9464"), metrics::Sources { coordinator: Some(src), workers: Vec::new() }).await?;
    std::fs::create_dir_all(&run_dir).with_context(|| format!("cannot create output directory {}", run_dir.display()))?;
    let writer = status::StatusWriter::start(&sweep.name, &run_dir, &broker, progress_rx, sweep.pools().into_keys().collect()).await;
    let outcome = halyard_coordinator::run(broker, CoordinatorConfig { sweep, run_dir }, Some(progress_tx), until(stop)).await;
    writer.finish(final_state(&outcome)).await;
    match outcome? {
        RunOutcome::Complete { run, report_dir } => {
            println!("run {run} complete: report in {}", report_dir.join("report.md").display());
            Ok(0)
        }
        RunOutcome::Interrupted { run } => {
            eprintln!("run {run} interrupted; start the coordinator again to resume");
            Ok(130)
        }
        o @ RunOutcome::CostLimit { .. } => Ok(cost_limited(&o)),
    }
}

fn leaderboard(a: ReportCmd) -> Result<u8> {
    use halyard_coordinator::leaderboard;
    let lb = leaderboard::load(&a.runs).map_err(anyhow::Error::msg)?;
    for w in &lb.warnings {
        tracing::warn!("{w}");
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("cannot create {}", a.out.display()))?;
    let md = leaderboard::render_markdown(&lb);
    for (name, text) in [("leaderboard.md", md.clone()), ("leaderboard.html", leaderboard::render_html(&lb))] {
        let p = a.out.join(name);
        std::fs::write(&p, text).with_context(|| format!("cannot write {}", p.display()))?;
    }
    print!("{md}");
    eprintln!("leaderboard written to {} and {}", a.out.join("leaderboard.md").display(), a.out.join("leaderboard.html").display());
    Ok(0)
}

/// The pools a worker serves, with their concurrency (for its heartbeat).
fn pool_list(cfg: &WorkerConfig) -> Vec<(String, usize)> {
    cfg.pools.iter().map(|p| (p.name.clone(), p.concurrency)).collect()
}

/// The state a finished coordinator leaves in its status.
fn final_state<E>(o: &std::result::Result<RunOutcome, E>) -> &'static str {
    match o {
        Ok(RunOutcome::Complete { .. }) => "complete",
        Ok(RunOutcome::Interrupted { .. }) => "interrupted",
        Ok(RunOutcome::CostLimit { .. }) => "cost_limit",
        Err(_) => "failed",
    }
}

/// `--max-cost` overrides the sweep's `[run] max_cost`.
fn with_max_cost(mut s: sweep::Sweep, max_cost: Option<f64>) -> Result<sweep::Sweep> {
    if let Some(c) = max_cost {
        anyhow::ensure!(c.is_finite() && c >= 0.0, "--max-cost {c}: not an amount of USD (≥ 0)");
        s.run.max_cost = Some(c);
    }
    Ok(s)
}

/// Exit status 3: the run stopped at its cost limit.
fn cost_limited(o: &RunOutcome) -> u8 {
    if let RunOutcome::CostLimit { run, spent, limit } = o {
        eprintln!("run {run} stopped: cost limit reached (${spent:.4} spent, limit ${limit:.4}); run again with a higher --max-cost to continue");
    }
    3
}

fn parse_pool(s: &str) -> Result<PoolSpec> {
    match s.split_once('=') {
        None => Ok(PoolSpec { name: s.to_string(), concurrency: 4 }),
        Some((name, n)) => {
            let concurrency: usize =
                n.parse().ok().filter(|c| *c >= 1).with_context(|| format!("--pool {s:?}: concurrency {n:?} is not a positive integer"))?;
            Ok(PoolSpec { name: name.to_string(), concurrency })
        }
    }
}

async fn worker(a: WorkerArgs) -> Result<u8> {
    if a.gpu.is_some() && !halyard_worker::backend::gguf_gpu_support() {
        anyhow::bail!(
            "--gpu {}: this halyard was built without the `cuda` feature (rebuild with `cargo build --release --features cuda`, which needs the CUDA toolkit)",
            a.gpu.unwrap_or_default()
        );
    }
    let mut cfg = WorkerConfig::new(Vec::new(), a.state.clone());
    cfg.delivery = Delivery { ack_wait: Duration::from_secs_f64(a.ack_wait.max(1.0)), max_deliver: a.max_deliver };
    if let Some(path) = &a.sweep {
        let s = sweep::load(path)?;
        cfg = sweep_worker(&s, a.state.clone());
        if let Some(gpu) = a.gpu {
            // Pinned to one GPU: only the local models placed there, and their pools.
            cfg.local_models.retain(|m| m.gpu == Some(gpu));
            cfg.embed_models.clear();
            let pools: std::collections::HashSet<String> =
                s.models.iter().filter(|m| m.local.as_ref().is_some_and(|l| l.gpu == Some(gpu))).map(|m| m.spec.pool.clone()).collect();
            cfg.pools.retain(|p| pools.contains(&p.name));
            if cfg.pools.is_empty() {
                anyhow::bail!("--gpu {gpu}: the sweep {} places no gguf model on GPU {gpu} (`gpu = {gpu}`)", path.display());
            }
        }
    } else if a.gpu.is_some() {
        anyhow::bail!("--gpu needs --sweep: the sweep says which models to load on the GPU");
    }
    for p in &a.pools {
        cfg.pools.push(parse_pool(p)?);
    }
    for q in &a.quotas {
        let (pool, quota) = parse_quota(q)?;
        if !cfg.pools.iter().any(|p| p.name == pool) {
            anyhow::bail!("--quota {q:?}: this worker serves no pool {pool:?} (give --pool {pool})");
        }
        cfg.quotas.insert(pool, quota);
    }
    if !(a.quota_ttl.is_finite() && (1.0..=3600.0).contains(&a.quota_ttl)) {
        anyhow::bail!("--quota-ttl {}: give seconds in 1..=3600", a.quota_ttl);
    }
    cfg.quota_settings.ttl = Duration::from_secs_f64(a.quota_ttl);
    cfg.shutdown_grace = Duration::from_secs_f64(a.grace.max(0.0));
    if let Some(id) = a.id {
        cfg.worker_id = id;
    }
    let stop = shutdown_signal();
    let broker = halyard_broker::connect(
        &BrokerConfig::new(a.nats, format!("halyard-worker {}", cfg.worker_id)).with_auth(a.nats_auth.auth()),
    )
    .await?;
    let src = metrics::Sources { coordinator: None, workers: vec![(cfg.worker_id.clone(), cfg.stats.clone())] };
    metrics::serve(a.metrics.as_deref(), Some("127.0.0.1:9465"), src).await?;
    let beat = status::heartbeat(&broker, cfg.worker_id.clone(), pool_list(&cfg), cfg.stats.clone()).await;
    let result = halyard_worker::run(broker, cfg, until(stop)).await;
    if let Some(b) = beat {
        b.abort();
    }
    result?;
    Ok(0)
}

//! `halyard`: one binary, thin. Each subcommand parses its arguments and calls a library
//! `run(config, shutdown)`; see the crates' docs for what happens inside.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use halyard_broker::{embedded::EmbeddedNats, BrokerConfig, Delivery};
use halyard_coordinator::{sweep, CoordinatorConfig, RunOutcome};
use halyard_worker::backend::GgufSpec;
use halyard_worker::{Checkpoint, PoolSpec, WorkerConfig};
use tokio::sync::watch;

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
    /// Start no local workers (remote `halyard worker`s do the work).
    #[arg(long)]
    no_workers: bool,
    /// Checkpoint directory of the local workers (default <out>/<name>/checkpoint).
    #[arg(long)]
    checkpoint: Option<PathBuf>,
}

#[derive(Args)]
struct CoordArgs {
    sweep: PathBuf,
    #[arg(long, default_value = "runs")]
    out: PathBuf,
    #[arg(long, env = "HALYARD_NATS_URL")]
    nats: String,
}

#[derive(Args)]
struct WorkerArgs {
    #[arg(long, env = "HALYARD_NATS_URL")]
    nats: String,
    /// Serve every pool of this sweep (with its concurrency and delivery settings).
    #[arg(long)]
    sweep: Option<PathBuf>,
    /// Serve this pool: NAME or NAME=CONCURRENCY (repeatable).
    #[arg(long = "pool")]
    pools: Vec<String>,
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
    let b = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
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
    cfg.embed_models = embed_models(s);
    cfg
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
    let sweep = sweep::load(&a.sweep)?;
    let run_dir = a.out.join(&sweep.name);
    std::fs::create_dir_all(&run_dir).with_context(|| format!("cannot create output directory {}", run_dir.display()))?;
    let stop = shutdown_signal();
    let (embedded, url) = match &a.nats {
        Some(url) => (None, url.clone()),
        None => {
            let n = EmbeddedNats::start(&run_dir.join("nats"))?;
            let url = n.url();
            tracing::info!(url = %url, "started private nats-server");
            (Some(n), url)
        }
    };
    let broker = halyard_broker::connect(&BrokerConfig::new(url, "halyard-run")).await?;
    let (workers_stop_tx, workers_stop_rx) = watch::channel(false);
    let mut worker_task: Option<tokio::task::JoinHandle<Result<_, halyard_worker::WorkerError>>> = None;
    if !a.no_workers {
        let dir = a.checkpoint.clone().unwrap_or_else(|| run_dir.join("checkpoint"));
        let checkpoint = Checkpoint::open(&dir)?;
        let cfg = sweep_worker(&sweep, dir);
        let b = broker.clone();
        let stop_rx = workers_stop_rx.clone();
        worker_task = Some(tokio::spawn(async move { halyard_worker::run_with_checkpoint(b, checkpoint, cfg, until(stop_rx)).await }));
    }
    // The coordinator runs until the run completes, a signal comes, or the local worker
    // fails (a model that cannot load, say): then the run stops with that error instead
    // of waiting for work nobody will do.
    let (fail_tx, fail_rx) = watch::channel(false);
    let coordinator = halyard_coordinator::run(broker.clone(), CoordinatorConfig { sweep, run_dir }, None, async move {
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
    }
}

async fn coordinator(a: CoordArgs) -> Result<u8> {
    let sweep = sweep::load(&a.sweep)?;
    let run_dir = a.out.join(&sweep.name);
    let stop = shutdown_signal();
    let broker = halyard_broker::connect(&BrokerConfig::new(a.nats, "halyard-coordinator")).await?;
    match halyard_coordinator::run(broker, CoordinatorConfig { sweep, run_dir }, None, until(stop)).await? {
        RunOutcome::Complete { run, report_dir } => {
            println!("run {run} complete: report in {}", report_dir.join("report.md").display());
            Ok(0)
        }
        RunOutcome::Interrupted { run } => {
            eprintln!("run {run} interrupted; start the coordinator again to resume");
            Ok(130)
        }
    }
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
    cfg.shutdown_grace = Duration::from_secs_f64(a.grace.max(0.0));
    if let Some(id) = a.id {
        cfg.worker_id = id;
    }
    let stop = shutdown_signal();
    let broker = halyard_broker::connect(&BrokerConfig::new(a.nats, format!("halyard-worker {}", cfg.worker_id))).await?;
    halyard_worker::run(broker, cfg, until(stop)).await?;
    Ok(0)
}

//! (b) Halyard's no-op throughput end to end, and the two roles the benchmark runs as
//! child processes of itself (`role-coordinator`, `role-worker`).
//!
//! The roles do what `halyard coordinator` and `halyard worker --sweep` do (load the
//! sweep, connect, call the library `run` with the same configuration and the CLI's
//! default log filter) and print one JSON line of figures when they end. Running them as
//! processes of their own makes each peak resident set its own.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use halyard_broker::auth::NatsAuth;
use halyard_broker::embedded::EmbeddedNats;
use halyard_broker::{BrokerConfig, Delivery};
use halyard_coordinator::{CoordinatorConfig, RunOutcome};
use halyard_plan::progress::Progress;
use halyard_plan::sweep;
use halyard_plan::worker_plan::worker_plan;
use halyard_proto::subjects;
use halyard_worker::WorkerConfig;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::procs;

/// The pool (and model) name of the noop sweep.
pub const POOL: &str = "noop";

/// The sweep the end-to-end runs use: `jobs` noop jobs, one noop model.
pub fn write_sweep(
    dir: &Path,
    jobs: u64,
    concurrency: usize,
    window: usize,
    job_batch: &str,
) -> anyhow::Result<PathBuf> {
    // "auto" is a TOML string; a number stays one (the sweep check refuses anything else).
    let job_batch = if job_batch.parse::<u64>().is_ok() {
        job_batch.to_string()
    } else {
        format!("{job_batch:?}")
    };
    let text = format!(
        "name = \"noop-bench\"\n\n[[model]]\nname = \"{POOL}\"\nbackend = \"noop\"\nmax_concurrency = {concurrency}\n\n\
         [[benchmark]]\npipeline = \"noop\"\njobs = {jobs}\nmodels = [\"{POOL}\"]\n\n[run]\nwindow = {window}\njob_batch = {job_batch}\n"
    );
    let path = dir.join("noop-bench.toml");
    std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
    Ok(path)
}

/// What the coordinator role prints.
#[derive(Debug, Serialize, Deserialize)]
pub struct CoordinatorFigures {
    /// From calling `run` to every item done (planning included, report excluded).
    pub done_s: f64,
    /// From calling `run` to its return (the report, and the run state compacted as it
    /// closes).
    pub total_s: f64,
    pub items: u64,
    pub results: u64,
    pub duplicates: u64,
    pub dead_letters: u64,
    pub published: u64,
    pub latency_p50_us: u64,
    pub latency_p99_us: u64,
    pub latency_samples: u64,
    #[serde(default)]
    pub batches: u64,
}

/// What a worker role prints.
#[derive(Debug, Serialize, Deserialize)]
pub struct WorkerFigures {
    pub completed: u64,
    pub replayed: u64,
    pub dead_letters: u64,
    #[serde(default)]
    pub pulls: u64,
}

fn init_logs() {
    // The `halyard` CLI's default filter, so that the benchmark pays what users pay.
    let filter = tracing_subscriber::EnvFilter::try_from_env("HALYARD_LOG").unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(
            "info,fjall=warn,lsm_tree=warn,sled=warn,async_nats=warn",
        )
    });
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
}

/// `role-coordinator`: `halyard coordinator SWEEP --nats URL --out DIR`, measured.
pub async fn role_coordinator(
    sweep_path: PathBuf,
    out: PathBuf,
    nats: String,
) -> anyhow::Result<()> {
    init_logs();
    let sweep = sweep::load(&sweep_path)?;
    let run_dir = out.join(&sweep.name);
    let broker = halyard_broker::connect(
        &BrokerConfig::new(nats, "halyard-bench coordinator").with_auth(role_auth()),
    )
    .await?;
    let (tx, mut rx) = watch::channel(Progress::default());
    let started = Instant::now();
    let watcher = tokio::spawn(async move {
        let mut done_at = None;
        let mut last = Progress::default();
        while rx.changed().await.is_ok() {
            let p = rx.borrow_and_update().clone();
            if done_at.is_none()
                && p.figures.items_total > 0
                && p.figures.items_done >= p.figures.items_total
            {
                done_at = Some(started.elapsed());
            }
            last = p;
        }
        (done_at, last)
    });
    let outcome = halyard_coordinator::run(
        broker,
        CoordinatorConfig { sweep, run_dir },
        Some(tx),
        std::future::pending(),
    )
    .await?;
    let total = started.elapsed();
    let (done_at, p) = watcher.await?;
    if !matches!(outcome, RunOutcome::Complete { .. }) {
        bail!("run did not complete: {outcome:?}");
    }
    let us = |d: Option<Duration>| d.map_or(0, |d| d.as_micros() as u64);
    let figures = CoordinatorFigures {
        done_s: done_at.unwrap_or(total).as_secs_f64(),
        total_s: total.as_secs_f64(),
        items: p.figures.items_done,
        results: p.figures.results,
        duplicates: p.figures.duplicates,
        dead_letters: p.figures.dead_letters,
        published: p.figures.published,
        latency_p50_us: us(p.latency.quantile(0.5)),
        latency_p99_us: us(p.latency.quantile(0.99)),
        latency_samples: p.latency.count(),
        batches: p.result_batches,
    };
    println!("{}", serde_json::to_string(&figures)?);
    Ok(())
}

/// `role-worker`: `halyard worker --sweep SWEEP --nats URL --state DIR`, until SIGTERM.
pub async fn role_worker(
    sweep_path: PathBuf,
    state: PathBuf,
    nats: String,
    id: String,
) -> anyhow::Result<()> {
    init_logs();
    let s = sweep::load(&sweep_path)?;
    let mut cfg = WorkerConfig::new(worker_plan(&s), state);
    cfg.delivery = Delivery { ack_wait: s.run.ack_wait, max_deliver: s.run.max_deliver };
    cfg.worker_id = id;
    let broker = halyard_broker::connect(
        &BrokerConfig::new(nats, format!("halyard-bench worker {}", cfg.worker_id))
            .with_auth(role_auth()),
    )
    .await?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let stats = halyard_worker::run(broker, cfg, async move {
        term.recv().await;
    })
    .await?;
    let figures = WorkerFigures {
        completed: stats.completed.get(),
        replayed: stats.replayed.get(),
        dead_letters: stats.dead_letters.get(),
        pulls: stats.pulls.get(),
    };
    println!("{}", serde_json::to_string(&figures)?);
    Ok(())
}

/// One end-to-end measurement.
#[derive(Debug)]
pub struct E2e {
    pub worker_count: usize,
    /// `[run] job_batch` of the sweep ("auto" or a number).
    pub job_batch: String,
    pub figures: CoordinatorFigures,
    pub worker_figures: Vec<WorkerFigures>,
    pub coordinator: procs::Usage,
    /// Largest peak RSS among the workers, and their CPU time together.
    pub workers: procs::Usage,
    pub nats_rss: Option<u64>,
    /// nats-server's CPU time during the run.
    pub nats_cpu_s: Option<f64>,
}

/// The roles' broker credentials: the embedded server's nkey seed file, handed down in
/// `HALYARD_NATS_NKEY` (as `halyard` reads it).
fn role_auth() -> NatsAuth {
    NatsAuth {
        nkey_seed_file: std::env::var_os("HALYARD_NATS_NKEY").map(PathBuf::from),
        ..Default::default()
    }
}

fn role(
    exe: &Path,
    args: &[&str],
    log: &Path,
    auth: &NatsAuth,
) -> anyhow::Result<std::process::Child> {
    let mut cmd = Command::new(exe);
    if let Some(seed) = &auth.nkey_seed_file {
        cmd.env("HALYARD_NATS_NKEY", seed);
    }
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).with_context(|| format!("create {}", log.display()))?);
    procs::spawn_tied(cmd).with_context(|| format!("spawn {} {args:?}", exe.display()))
}

fn finish<T: serde::de::DeserializeOwned>(
    mut child: std::process::Child,
    what: &str,
    log: &Path,
) -> anyhow::Result<(T, procs::Usage)> {
    let mut stdout = child.stdout.take().context("piped stdout")?;
    let (status, usage) = procs::reap(child)?;
    let mut out = String::new();
    stdout.read_to_string(&mut out)?;
    if !status.success() {
        let tail = std::fs::read_to_string(log).unwrap_or_default();
        let tail: Vec<&str> = tail.lines().rev().take(20).collect();
        bail!(
            "{what} failed ({status}); log {}:\n{}",
            log.display(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    let line = out.lines().last().with_context(|| format!("{what} printed nothing"))?;
    Ok((serde_json::from_str(line).with_context(|| format!("{what} printed {line:?}"))?, usage))
}

/// Shape the fresh broker as a coordinator would before the workers start: its streams
/// and buckets (`halyard broker init`) and the pool's consumer with the sweep's delivery
/// settings. A worker waits for these, which only a coordinator makes; the bench starts
/// its workers first (so that their start-up is not timed), and waited for them for
/// ever before. The coordinator then finds them made and checks them.
async fn shape_broker(url: &str, auth: NatsAuth, sweep_path: &Path) -> anyhow::Result<()> {
    let s = sweep::load(sweep_path)?;
    let broker =
        halyard_broker::connect(&BrokerConfig::new(url, "halyard-bench init").with_auth(auth))
            .await?;
    halyard_broker::init(&broker, &halyard_broker::layout::Options::default()).await?;
    let d = Delivery { ack_wait: s.run.ack_wait, max_deliver: s.run.max_deliver };
    halyard_broker::pool_consumer(&broker, POOL, d).await?;
    Ok(())
}

/// Wait until `n` workers have a pull request open on the pool's consumer.
async fn workers_ready(url: &str, auth: NatsAuth, n: usize) -> anyhow::Result<()> {
    let broker =
        halyard_broker::connect(&BrokerConfig::new(url, "halyard-bench probe").with_auth(auth))
            .await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(mut stream) = broker.js.get_stream(subjects::JOBS_STREAM).await {
            if let Ok(info) = stream.consumer_info(subjects::pool_consumer(POOL)).await {
                if info.num_waiting >= n {
                    return Ok(());
                }
            }
            let _ = stream.info().await;
        }
        if Instant::now() > deadline {
            bail!("{n} workers did not start within a minute");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Run the noop sweep with `workers` worker processes and one coordinator process, on a
/// fresh nats-server; `in_flight` slots in all, split between the workers.
#[allow(clippy::too_many_arguments)] // the bench's command-line knobs, passed through
pub fn run(
    rt: &tokio::runtime::Runtime,
    exe: &Path,
    dir: &Path,
    jobs: u64,
    workers: usize,
    in_flight: usize,
    window: usize,
    job_batch: &str,
) -> anyhow::Result<E2e> {
    std::fs::create_dir_all(dir)?;
    let nats = EmbeddedNats::start(&dir.join("nats"))?;
    let url = nats.url();
    let sweep = write_sweep(dir, jobs, (in_flight / workers).max(1), window, job_batch)?;
    let sweep_s = sweep.display().to_string();
    rt.block_on(shape_broker(&url, nats.auth(), &sweep))?;
    let mut children = Vec::new();
    for i in 0..workers {
        let state = dir.join(format!("checkpoint-{i}"));
        let log = dir.join(format!("worker-{i}.log"));
        let args = [
            "role-worker",
            "--nats",
            &url,
            "--sweep",
            &sweep_s,
            "--state",
            &state.display().to_string(),
            "--id",
            &format!("bench-w{i}"),
        ];
        children.push((role(exe, &args, &log, &nats.auth())?, log));
    }
    rt.block_on(workers_ready(&url, nats.auth(), workers))?;
    let nats_cpu_before = procs::cpu_seconds(nats.pid());
    let out = dir.join("runs");
    let clog = dir.join("coordinator.log");
    let coord = role(
        exe,
        &[
            "role-coordinator",
            "--nats",
            &url,
            "--sweep",
            &sweep_s,
            "--out",
            &out.display().to_string(),
        ],
        &clog,
        &nats.auth(),
    )?;
    let coordinator_result = finish::<CoordinatorFigures>(coord, "coordinator", &clog);
    let nats_rss = procs::peak_rss(nats.pid());
    let nats_cpu_s = procs::cpu_seconds(nats.pid()).zip(nats_cpu_before).map(|(a, b)| a - b);
    let mut worker_figures = Vec::new();
    let mut worker_usage = procs::Usage::default();
    for (w, _) in &children {
        procs::signal(w, libc::SIGTERM);
    }
    for (w, log) in children {
        let (f, u) = finish::<WorkerFigures>(w, "worker", &log)?;
        worker_figures.push(f);
        worker_usage.max_rss = worker_usage.max_rss.max(u.max_rss);
        worker_usage.cpu_s += u.cpu_s;
    }
    drop(nats);
    let (figures, coordinator) = coordinator_result?;
    check_report(&out.join("noop-bench/report.json"), jobs)?;
    Ok(E2e {
        worker_count: workers,
        job_batch: job_batch.to_string(),
        figures,
        worker_figures,
        coordinator,
        workers: worker_usage,
        nats_rss,
        nats_cpu_s,
    })
}

/// The report must count every job once.
pub fn check_report(path: &Path, jobs: u64) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text)?;
    let b = &v["benchmarks"][0];
    let got = (b["labelled"].as_u64(), b["completed"].as_u64(), v["jobs"]["done"].as_u64());
    if got != (Some(jobs), Some(jobs), Some(jobs)) {
        bail!(
            "{}: expected {jobs} labelled, completed and done jobs, found {got:?}",
            path.display()
        );
    }
    Ok(())
}

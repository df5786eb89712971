//! `halyard-bench`: how close Halyard's job path comes to the broker's own ceiling.
//!
//! One invocation measures, on fresh `nats-server`s started the same way (JetStream,
//! file storage, the streams and consumers Halyard creates):
//!
//! 1. (a) the bare JetStream round trip (see `bare.rs`): `--in-flight` jobs at once,
//!    then one at a time;
//! 2. (b) Halyard's `noop` pipeline end to end, with 1, 2 and 4 worker processes and
//!    one coordinator process (see `e2e.rs`): planning, publishing with `Nats-Msg-Id`,
//!    pulling, checkpoint with group commit, result publishing, acks, counting
//!    each result once, the report;
//! 3. (c) the same sweep as users run it, `halyard run` of the `halyard` binary (see
//!    `cli_run.rs`), with its own nats-server and with `--nats`: wall clock with start-up
//!    and report, its peak resident set, and the bytes its run state and checkpoint
//!    leave on disk per job;
//!
//! and prints a table: jobs/s of each, Halyard's ratio to (a), p50/p99 job latency
//! (publish to result recorded, as the coordinator sees it), the peak resident set of
//! the coordinator, the workers and nats-server (`wait4`'s `ru_maxrss`, `VmHWM`), and the
//! CPU time per job of each process (on a small machine every process competes for the
//! same cores, so this column says where the time goes). Targets (printed, never
//! asserted): ratio ≥ 0.5; coordinator RSS < 1 GiB at a million jobs; for (c), ratio
//! ≥ 0.5 with one job per message and ≥ 0.7 with job batches, ≤ 200 bytes on disk per
//! job, and a resident set < 512 MiB at a million jobs.
//!
//! ```sh
//! cargo run --release -p halyard-bench -- --jobs 100000
//! ```

mod bare;
mod cli_run;
mod e2e;
mod procs;

use std::path::{Path, PathBuf};

use anyhow::Context;
use bytes::Bytes;
use clap::{Parser, Subcommand};
use halyard_broker::embedded::EmbeddedNats;
use halyard_broker::{BrokerConfig, Delivery};
use halyard_pipelines::noop;
use halyard_plan::benchmarks::noop::Noop;
use halyard_plan::sweep;
use halyard_proto::{subjects, Job, JobResult, Outcome};

/// The allocator the `halyard` binary uses, so that the roles pay what users pay.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "halyard-bench",
    about = "Bare JetStream round trip vs Halyard's no-op job path, in one run"
)]
struct Cli {
    #[command(subcommand)]
    role: Option<Role>,
    /// Jobs per measurement.
    #[arg(long, default_value_t = 100_000)]
    jobs: u64,
    /// Jobs in flight at once: the bare loop's slots, split evenly between Halyard's workers.
    #[arg(long, default_value_t = 1000)]
    in_flight: usize,
    /// Jobs for the one-at-a-time bare round trip (it is slow; at most --jobs).
    #[arg(long, default_value_t = 20_000)]
    serial_jobs: u64,
    /// Worker counts to measure Halyard with.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    workers: Vec<usize>,
    /// The coordinator's planning window (`[run] window` of the sweep).
    #[arg(long, default_value_t = sweep::DEFAULT_WINDOW)]
    window: usize,
    /// `[run] job_batch` values to measure Halyard with: `auto` (the default of a sweep)
    /// or jobs per job message.
    #[arg(long, value_delimiter = ',', default_value = "auto,1,64", value_parser = job_batch_arg)]
    job_batch: Vec<String>,
    /// Keep stores, logs and reports here instead of a temporary directory.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The `halyard` binary for (c) (default: the one beside this binary; (c) is skipped
    /// if there is none).
    #[arg(long)]
    halyard: Option<PathBuf>,
    /// Skip (c), `halyard run`.
    #[arg(long)]
    no_cli: bool,
}

#[derive(Subcommand)]
enum Role {
    /// (internal) run the coordinator of a sweep and print its figures
    #[command(hide = true)]
    RoleCoordinator {
        #[arg(long)]
        nats: String,
        #[arg(long)]
        sweep: PathBuf,
        #[arg(long)]
        out: PathBuf,
    },
    /// (internal) run a worker for a sweep until SIGTERM and print its figures
    #[command(hide = true)]
    RoleWorker {
        #[arg(long)]
        nats: String,
        #[arg(long)]
        sweep: PathBuf,
        #[arg(long)]
        state: PathBuf,
        #[arg(long)]
        id: String,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Thread names tell the roles apart in profiles (`perf report --comm coord-rt`).
    let name = match cli.role {
        Some(Role::RoleCoordinator { .. }) => "coord-rt",
        Some(Role::RoleWorker { .. }) => "worker-rt",
        None => "bench-rt",
    };
    let rt = tokio::runtime::Builder::new_multi_thread().thread_name(name).enable_all().build()?;
    match cli.role {
        Some(Role::RoleCoordinator { nats, sweep, out }) => {
            rt.block_on(e2e::role_coordinator(sweep, out, nats))
        }
        Some(Role::RoleWorker { nats, sweep, state, id }) => {
            rt.block_on(e2e::role_worker(sweep, state, nats, id))
        }
        None => bench(&cli, &rt),
    }
}

struct Bare {
    jobs: u64,
    secs: f64,
    nats_rss: Option<u64>,
    nats_cpu_s: Option<f64>,
    /// CPU time of this process's runtime during the loop.
    client_cpu_s: f64,
}

/// The messages the noop sweep produces, for the bare loop: its jobs as the coordinator
/// publishes them, and a result as a worker publishes it.
struct Messages {
    config: noop::Config,
    run: uuid::Uuid,
    result: Bytes,
}

impl Messages {
    /// Job `i`: its `Nats-Msg-Id` and payload.
    fn job(&self, i: u64) -> (String, Bytes) {
        let r = self.config.request(i);
        let job = Job::new(self.run, r.pool, r.key, r.timeout_ms);
        // Encoding a Job (plain data) into a Vec cannot fail.
        let payload = halyard_proto::encode(&job).expect("a job encodes");
        (subjects::job_msg_id(self.run, &job.id), Bytes::from(payload))
    }
}

fn messages(sweep_path: &Path) -> anyhow::Result<Messages> {
    let s = sweep::load(sweep_path)?;
    let Some(noop) = s.benchmarks.first().and_then(|b| b.get::<Noop>()) else {
        anyhow::bail!("the bench sweep has a noop benchmark")
    };
    let config = noop.config[0].clone();
    let run = uuid::Uuid::now_v7();
    // What the worker's noop backend answers, as the worker publishes it.
    let result = JobResult {
        v: halyard_proto::WIRE_VERSION,
        job: config.request(0).id(),
        run,
        outcome: Outcome::Done(halyard_worker::backend::noop::answer()),
        deliveries: 1,
        worker: halyard_worker::default_worker_id(),
        cached: false,
    };
    Ok(Messages { config, run, result: Bytes::from(halyard_proto::encode(&result)?) })
}

fn bare(
    rt: &tokio::runtime::Runtime,
    dir: &Path,
    sweep_path: &Path,
    n: u64,
    in_flight: usize,
) -> anyhow::Result<Bare> {
    let msgs = messages(sweep_path)?;
    let nats = EmbeddedNats::start(dir)?;
    let mut nats_cpu_before = None;
    let mut client_cpu_before = 0.0;
    let secs = rt.block_on(async {
        let broker = halyard_broker::connect(
            &BrokerConfig::new(nats.url(), "halyard-bench bare").with_auth(nats.auth()),
        )
        .await?;
        halyard_broker::init(&broker, &Default::default()).await?;
        let s = sweep::load(sweep_path)?;
        let delivery = Delivery { ack_wait: s.run.ack_wait, max_deliver: s.run.max_deliver };
        let consumer = halyard_broker::pool_consumer(&broker, e2e::POOL, delivery).await?;
        let run = uuid::Uuid::now_v7();
        bare::preload(&broker, &subjects::job_subject(e2e::POOL), (0..n).map(|i| msgs.job(i)))
            .await?;
        nats_cpu_before = procs::cpu_seconds(nats.pid());
        client_cpu_before = procs::cpu_seconds(std::process::id()).unwrap_or(0.0);
        let d = bare::round_trip(
            &broker,
            &consumer,
            &subjects::result_subject(run, e2e::POOL),
            msgs.result,
            n,
            in_flight,
        )
        .await?;
        anyhow::Ok(d.as_secs_f64())
    })?;
    let nats_rss = procs::peak_rss(nats.pid());
    let nats_cpu_s = procs::cpu_seconds(nats.pid()).zip(nats_cpu_before).map(|(a, b)| a - b);
    let client_cpu_s = procs::cpu_seconds(std::process::id()).unwrap_or(0.0) - client_cpu_before;
    Ok(Bare { jobs: n, secs, nats_rss, nats_cpu_s, client_cpu_s })
}

/// A `--job-batch` value: `auto` or a number of jobs.
fn job_batch_arg(s: &str) -> Result<String, String> {
    match s.parse::<u64>() {
        _ if s == "auto" => Ok(s.to_string()),
        Ok(n) if (1..=sweep::MAX_JOB_BATCH as u64).contains(&n) => Ok(s.to_string()),
        _ => Err(format!("{s:?} is neither auto nor 1..={}", sweep::MAX_JOB_BATCH)),
    }
}

fn mib(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / (1024.0 * 1024.0))
}

fn rate(jobs: u64, secs: f64) -> f64 {
    jobs as f64 / secs.max(1e-9)
}

fn thousands(x: f64) -> String {
    let s = format!("{:.0}", x);
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn nats_version() -> String {
    halyard_broker::embedded::server_binary()
        .ok()
        .and_then(|b| std::process::Command::new(b).arg("--version").output().ok())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "nats-server (version unknown)".into())
}

fn bench(cli: &Cli, rt: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("locate halyard-bench")?;
    let tmp = tempfile::Builder::new().prefix("halyard-bench-").tempdir()?;
    let root = cli.dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&root)?;
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let sweep_path = e2e::write_sweep(&root, cli.jobs, cli.in_flight, cli.window, "1")?;
    let sample = messages(&sweep_path)?;
    let (sample_id, sample_job) = sample.job(0);
    println!(
        "halyard-bench: {} jobs, {} in flight, window {}, {}, {cpus} CPUs",
        thousands(cli.jobs as f64),
        cli.in_flight,
        cli.window,
        nats_version()
    );
    println!(
        "messages: job {} B + Nats-Msg-Id {} B, result {} B; pulls ask for as many jobs as free slots\n",
        sample_job.len(),
        sample_id.len(),
        sample.result.len()
    );

    // Without --dir, a measurement's stores go as soon as it is done (at a million jobs
    // each one leaves more than a gigabyte).
    let done_with = |dir: &Path| {
        if cli.dir.is_none() {
            let _ = std::fs::remove_dir_all(dir);
        }
    };
    eprintln!("(a) bare JetStream round trip, {} in flight ...", cli.in_flight);
    let a = bare(rt, &root.join("bare"), &sweep_path, cli.jobs, cli.in_flight)?;
    done_with(&root.join("bare"));
    let serial_n = cli.serial_jobs.min(cli.jobs).max(1);
    eprintln!("(a) bare JetStream round trip, one at a time ({serial_n} jobs) ...");
    let a1 = bare(rt, &root.join("bare-serial"), &sweep_path, serial_n, 1)?;
    done_with(&root.join("bare-serial"));
    let ceiling = rate(a.jobs, a.secs);
    let mut runs = Vec::new();
    for b in &cli.job_batch {
        for &w in &cli.workers {
            eprintln!("(b) halyard noop end to end, {w} worker(s), job_batch {b} ...");
            let dir = root.join(format!("e2e-{w}-b{b}"));
            runs.push(e2e::run(rt, &exe, &dir, cli.jobs, w.max(1), cli.in_flight, cli.window, b)?);
            done_with(&dir);
        }
    }

    let halyard = cli.halyard.clone().unwrap_or_else(|| exe.with_file_name("halyard"));
    let mut cli_runs = Vec::new();
    if cli.no_cli {
    } else if !halyard.exists() {
        eprintln!(
            "(c) skipped: no {} (build it: cargo build --release -p halyard)",
            halyard.display()
        );
    } else {
        for b in &cli.job_batch {
            for external in [false, true] {
                let how = if external { "--nats" } else { "embedded" };
                eprintln!("(c) halyard run ({how}), job_batch {b} ...");
                let dir =
                    root.join(format!("cli-{}-b{b}", if external { "nats" } else { "embedded" }));
                cli_runs.push(cli_run::run(
                    &halyard,
                    &dir,
                    cli.jobs,
                    cli.in_flight,
                    cli.window,
                    b,
                    external,
                )?);
                done_with(&dir);
            }
        }
    }

    let head = format!(
        "{:<34} {:>9} {:>7} {:>8} {:>6} {:>8} {:>8} {:>9} {:>10} {:>9}",
        "measurement",
        "jobs",
        "s",
        "jobs/s",
        "ratio",
        "p50 ms",
        "p99 ms",
        "coord RSS",
        "worker RSS",
        "nats RSS"
    );
    println!("{head}   CPU µs/job: coord + workers + nats");
    println!("{}", "-".repeat(head.len() + 36));
    let na = |x: Option<u64>| x.map(mib).unwrap_or_else(|| "?".into());
    let per_job = |cpu: f64, jobs: u64| format!("{:.0}", cpu * 1e6 / jobs.max(1) as f64);
    for (label, b) in [
        (format!("bare JetStream, {} in flight", cli.in_flight), &a),
        ("bare JetStream, one at a time".to_string(), &a1),
    ] {
        let r = rate(b.jobs, b.secs);
        println!(
            "{label:<34} {:>9} {:>7.2} {:>8} {:>6.2} {:>8} {:>8} {:>9} {:>10} {:>9}   - + {} + {}",
            b.jobs,
            b.secs,
            thousands(r),
            r / ceiling,
            "-",
            "-",
            "-",
            "-",
            na(b.nats_rss),
            per_job(b.client_cpu_s, b.jobs),
            b.nats_cpu_s.map(|c| per_job(c, b.jobs)).unwrap_or_else(|| "?".into()),
        );
    }
    for r in &runs {
        let c = &r.figures;
        let jps = rate(c.items, c.done_s);
        println!(
            "{:<34} {:>9} {:>7.2} {:>8} {:>6.2} {:>8.1} {:>8.1} {:>9} {:>10} {:>9}   {} + {} + {}",
            format!(
                "halyard e2e, {} worker{}, batch {}",
                r.worker_count,
                if r.worker_count == 1 { "" } else { "s" },
                r.job_batch
            ),
            c.items,
            c.done_s,
            thousands(jps),
            jps / ceiling,
            c.latency_p50_us as f64 / 1000.0,
            c.latency_p99_us as f64 / 1000.0,
            mib(r.coordinator.max_rss),
            mib(r.workers.max_rss),
            na(r.nats_rss),
            per_job(r.coordinator.cpu_s, c.items),
            per_job(r.workers.cpu_s, c.items),
            r.nats_cpu_s.map(|x| per_job(x, c.items)).unwrap_or_else(|| "?".into()),
        );
    }
    println!();
    for r in &runs {
        let c = &r.figures;
        let done: Vec<String> =
            r.worker_figures.iter().map(|w| (w.completed + w.replayed).to_string()).collect();
        let jobs: u64 = r.worker_figures.iter().map(|w| w.completed + w.replayed).sum();
        let pulls: u64 = r.worker_figures.iter().map(|w| w.pulls).sum();
        println!(
            "{} worker(s), batch {}: report written and run state compacted {:.2} s after the last result; {} results, {} duplicates, {} dead letters; \
             jobs per worker {}; {:.1} jobs per pull; {:.1} results per coordinator commit",
            r.worker_count,
            r.job_batch,
            c.total_s - c.done_s,
            c.results,
            c.duplicates,
            c.dead_letters,
            done.join(" + "),
            jobs as f64 / pulls.max(1) as f64,
            c.results as f64 / c.batches.max(1) as f64
        );
    }
    if !cli_runs.is_empty() {
        println!(
            "\n{:<34} {:>9} {:>7} {:>8} {:>6} {:>9} {:>10} {:>10} {:>9} {:>13}",
            "halyard run (start-up, report incl.)",
            "jobs",
            "s",
            "jobs/s",
            "ratio",
            "RSS",
            "CPU µs/job",
            "state B/job",
            "ckpt B/job",
            "peak B/job run"
        );
        for r in &cli_runs {
            let jps = rate(r.jobs, r.secs);
            let n = r.jobs.max(1) as f64;
            println!(
                "{:<34} {:>9} {:>7.2} {:>8} {:>6.2} {:>9} {:>10} {:>10.0} {:>9.0} {:>13.0}",
                format!(
                    "{}, job_batch {}",
                    if r.external_nats { "--nats" } else { "embedded" },
                    r.job_batch
                ),
                r.jobs,
                r.secs,
                thousands(jps),
                jps / ceiling,
                mib(r.usage.max_rss),
                per_job(r.usage.cpu_s, r.jobs),
                r.state_bytes as f64 / n,
                r.checkpoint_bytes as f64 / n,
                r.peak_store_bytes as f64 / n,
            );
        }
    }
    let best = runs.iter().map(|r| rate(r.figures.items, r.figures.done_s)).fold(0.0, f64::max);
    let max_coord = runs.iter().map(|r| r.coordinator.max_rss).max().unwrap_or(0);
    println!(
        "\ntargets: best halyard/bare ratio {:.2} (target ≥ 0.50: {}); coordinator RSS {} (target < 1 GiB: {})",
        best / ceiling,
        if best / ceiling >= 0.5 { "met" } else { "not met" },
        mib(max_coord),
        if max_coord < 1 << 30 { "met" } else { "not met" }
    );
    if cli.dir.is_some() {
        println!("stores, logs and reports kept in {}", root.display());
    }
    Ok(())
}

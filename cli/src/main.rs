//! `halyard`: one binary, thin. Each subcommand parses its arguments ([`args`]) and
//! calls a `halyard_node` function (`run(config, shutdown)` for those that run a
//! while); see that crate's docs for what happens inside.

use anyhow::Result;
use clap::{Parser, Subcommand};
use halyard_node::{coordinator, display, leaderboard, retry_failed, shutdown, status};
use halyard_node::{supervisor, worker};

mod args;
mod cache_cmd;
mod check;
mod nats_args;

use args::{
    BrokerCmd, CoordArgs, DeployCmd, GcArgs, IdentityArgs, LabelsCmd, ReportCmd, RetryFailedArgs,
    RunArgs, StatusCmd, ViewArgs, WorkerArgs,
};

/// mimalloc instead of the system allocator: the job path allocates and frees a few
/// small buffers per message, and the stores copy pages on writes; glibc's malloc spent
/// a quarter of the coordinator's and the workers' CPU time on that (README, Performance).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "halyard",
    version,
    about = "Hallucination benchmarks for LLMs as distributed, resumable sweeps"
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value = "human")]
    log_format: LogFormat,
    /// Only warnings and errors.
    #[arg(long, short, global = true)]
    quiet: bool,
    /// Libraries' logs too (llama.cpp's model loading, ...), which otherwise go only to
    /// the run's log file (`<out>/<name>/halyard.log`).
    #[arg(long, short, global = true, conflicts_with = "quiet")]
    verbose: bool,
    /// The result cache on this machine (issue 51): its directory, or `off`. Default:
    /// the user's cache directory (`~/.cache/halyard`).
    #[arg(long, global = true, env = "HALYARD_CACHE", value_name = "DIR")]
    cache: Option<std::path::PathBuf>,
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
    /// Check a sweep's models as a worker on this machine would use them: one minimal
    /// request per API model (reachable, key accepted, model known, answer shape,
    /// latency, probe cost), files and commands of local ones. Exit 5 if any cannot serve.
    Check(check::CheckArgs),
    /// Run only the coordinator of a sweep against a broker (workers join separately).
    Coordinator(CoordArgs),
    /// Run a worker serving the pools of a sweep, or pools named with --pool.
    Worker(WorkerArgs),
    /// Show a run's progress, cost and workers: from the broker (--nats, any machine)
    /// or from the run's status.json.
    Status(StatusCmd),
    /// Merge finished runs into a leaderboard (leaderboard.md and .html): HypoTermQA ranked
    /// by HTS, and every pipeline's results compared pair by pair on their shared items.
    Report(ReportCmd),
    /// List a stopped run's dead letters and re-queue them for its next coordinator.
    RetryFailed(RetryFailedArgs),
    /// Compact the stores (run state, worker checkpoints) of stopped runs and workers:
    /// the room their commits freed goes back to the file system. Complete runs compact
    /// their own as they end.
    Gc(GcArgs),
    /// Move stores written by earlier builds (redb, sled) to this build's engine now
    /// (opening a store does it too, once, with a log line); this build's stores are
    /// checked as opening checks them.
    Migrate(GcArgs),
    /// Print the identity of local model files (`identity = "…"` for a sweep's gguf
    /// model), so that a coordinator without the files can plan their jobs.
    Identity(IdentityArgs),
    /// Shape a broker before any run (`broker init`: Halyard's streams and buckets, with
    /// the coordinator's credentials).
    #[command(subcommand)]
    Broker(BrokerCmd),
    /// Write deployment files for a sweep (`deploy k8s`: a kustomize overlay).
    #[command(subcommand)]
    Deploy(DeployCmd),
    /// Human labels of a run's judged outputs (`labels import RUN_DIR FILE`): the judges
    /// are measured against them in the report.
    #[command(subcommand)]
    Labels(LabelsCmd),
    /// The result cache on this machine: `cache stats | prune | export FILE | import FILE`.
    #[command(subcommand)]
    Cache(cache_cmd::CacheCmd),
    /// Browse runs in a local web app (default: runs/): live progress, each run's report
    /// and items (answers, judge outputs, human labels), runs compared with power.
    View(ViewArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if let Some(dir) = &cli.cache {
        // Read where the cache is opened (halyard_cache::machine_dir); set before any
        // thread starts.
        std::env::set_var("HALYARD_CACHE", dir);
    }
    init_logs(cli.log_format, cli.quiet, cli.verbose);
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(dispatch(cli.cmd));
    // Whatever is still running was left by its awaiter (a model still loading when a
    // stop came while starting): waiting for it would hold the exit, with the signal
    // handlers gone. Every store is closed by now, and a commit cut short is a crash,
    // which the stores survive.
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    match result {
        Ok(code) => std::process::ExitCode::from(code),
        Err(e)
            if matches!(e.downcast_ref(), Some(halyard_node::NodeError::StoppedBeforeStart(_))) =>
        {
            eprintln!("{e}");
            std::process::ExitCode::from(130)
        }
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

/// Two outputs: the terminal (progress and outcomes: Halyard's own lines; libraries'
/// only with `-v` or `HALYARD_LOG`) and, once a run's directory is known, its log file
/// (`halyard.log`: everything at info, llama.cpp's model loading included).
fn init_logs(format: LogFormat, quiet: bool, verbose: bool) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{EnvFilter, Layer};
    // llama.cpp's lines come as target `llama-cpp-2`, its wrapper's as `llama_cpp_2`.
    const LIBRARIES: &str =
        "sled=warn,fjall=warn,lsm_tree=warn,async_nats=warn,llama_cpp_2=warn,llama-cpp-2=warn";
    let terminal =
        EnvFilter::try_from_env("HALYARD_LOG").unwrap_or_else(|_| match (quiet, verbose) {
            (true, _) => EnvFilter::new(format!("warn,{LIBRARIES}")),
            (false, true) => {
                EnvFilter::new("info,sled=warn,fjall=warn,lsm_tree=warn,async_nats=warn")
            }
            (false, false) => EnvFilter::new(format!("info,{LIBRARIES}")),
        });
    display::init(quiet, matches!(format, LogFormat::Json));
    let term = tracing_subscriber::fmt::layer().with_writer(display::LogWriter);
    let term = match format {
        LogFormat::Human => term.with_filter(terminal).boxed(),
        LogFormat::Json => term.json().with_filter(terminal).boxed(),
    };
    let file = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(display::FileWriter)
        .with_filter(EnvFilter::new(
            "info,sled=warn,fjall=warn,lsm_tree=warn,async_nats=warn,llama_cpp_2=warn",
        ));
    tracing_subscriber::registry().with(term).with(file).init();
}

async fn dispatch(cmd: Cmd) -> Result<u8> {
    Ok(match cmd {
        Cmd::Run(a) => {
            let stop = shutdown::signal();
            let checked = !a.no_check;
            let opts = a.options()?;
            // Local workers use this machine's keys: check them, and the endpoints, first.
            if checked && !opts.no_workers {
                let insecure = opts.allow_insecure_http;
                if let Some(problem) = check::preflight(&opts.sweep, insecure).await? {
                    eprintln!("error: {problem}");
                    return Ok(coordinator::EXIT_CANNOT_SERVE);
                }
            }
            let outcome = supervisor::run(opts, stop).await?;
            coordinator::exit_status(&outcome, "run the same command again")
        }
        Cmd::Check(a) => check::run(a).await?,
        Cmd::Coordinator(a) => {
            let stop = shutdown::signal();
            let opts = a.options()?;
            let outcome = coordinator::run(opts, stop).await?;
            coordinator::exit_status(&outcome, "start the coordinator again")
        }
        Cmd::Worker(a) => {
            let stop = shutdown::signal();
            let cfg = worker::config(&a.options())?;
            worker::run(cfg, a.nats(), a.metrics.as_deref(), stop).await?;
            0
        }
        Cmd::Status(a) => {
            print!("{}", status::show::show(a.args()).await?);
            0
        }
        Cmd::Report(a) => {
            let md = leaderboard::write(&a.runs, &a.out)?;
            print!("{md}");
            eprintln!(
                "leaderboard written to {} and {}",
                a.out.join("leaderboard.md").display(),
                a.out.join("leaderboard.html").display()
            );
            0
        }
        Cmd::Identity(a) => {
            let mut failed = false;
            for p in &a.files {
                match halyard_node::sweep_identity(p) {
                    Ok(id) => println!("{}: identity = \"{id}\"", p.display()),
                    Err(e) => {
                        eprintln!("error: {}: {e}", p.display());
                        failed = true;
                    }
                }
            }
            u8::from(failed)
        }
        Cmd::Broker(BrokerCmd::Init(a)) => {
            for line in halyard_node::broker_init::run(a.nats(), a.quota_ttl()?).await? {
                println!("{line}");
            }
            0
        }
        Cmd::Deploy(DeployCmd::K8s(a)) => {
            let o = a.options();
            let files = halyard_node::deploy_k8s::write(&o)?;
            for f in &files {
                println!("{}", o.out.join(f).display());
            }
            eprintln!(
                "kustomize overlay for {} written to {} (apply: see its kustomization.yaml)",
                o.sweep.display(),
                o.out.display()
            );
            0
        }
        Cmd::Deploy(DeployCmd::NatsPermissions(a)) => {
            let files = halyard_node::deploy_k8s::write_permissions(&a.sweep, &a.out, a.force)?;
            for f in &files {
                println!("{}", a.out.join(f).display());
            }
            eprintln!(
                "broker users for {} written to {} (one worker user per pool; a password \
                 variable per user, see the files' header)",
                a.sweep.display(),
                a.out.display()
            );
            0
        }
        Cmd::Gc(a) => {
            let gc = halyard_node::gc::run(&a.paths)?;
            for line in &gc.lines {
                println!("{line}");
            }
            u8::from(gc.failed > 0)
        }
        Cmd::Migrate(a) => {
            let m = halyard_node::gc::migrate(&a.paths)?;
            for line in &m.lines {
                println!("{line}");
            }
            u8::from(m.failed > 0)
        }
        Cmd::View(a) => {
            let stop = shutdown::signal();
            let cfg = halyard_node::view::ViewConfig {
                dirs: a.dirs,
                addr: a.addr,
                nats: a.nats,
                auth: a.nats_auth.auth(),
            };
            halyard_node::view::run(cfg, stop, |addr| {
                // The first line on stdout: the address (tests and scripts read it).
                println!("halyard view at http://{addr}/");
                eprintln!("serving read-only; stop with Ctrl-C");
            })
            .await?;
            0
        }
        Cmd::RetryFailed(a) => {
            print!("{}", retry_failed::run(&a.run, a.list)?);
            0
        }
        Cmd::Cache(c) => cache_cmd::run(c).await?,
        Cmd::Labels(LabelsCmd::Import(a)) => {
            let i =
                halyard_node::labels_import::run(&a.run, &a.file, a.benchmark, a.sweep.as_deref())?;
            println!(
                "{} human label(s) for benchmark {} stored as {}{}; report rewritten in {}",
                i.labels,
                i.benchmark,
                i.stored.display(),
                if i.replaced { " (replacing the earlier import)" } else { "" },
                a.run.display()
            );
            0
        }
    })
}

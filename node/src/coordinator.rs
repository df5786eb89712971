//! `halyard coordinator`, and what surrounds a coordinator in both commands that run
//! one (`halyard run` too): its metrics endpoint, its status writer, its final status,
//! and what its outcome means for the process (message and exit status).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use halyard_broker::Broker;
use halyard_coordinator::{CoordinatorConfig, CoordinatorError, RunOutcome};
use halyard_plan::progress::Progress;
use halyard_plan::sweep::Sweep;
use halyard_worker::Stats;
use tokio::sync::watch;

use crate::shutdown::until;
use crate::status::StatusWriter;
use crate::{metrics, Nats, NodeError};

/// What `halyard coordinator` is given.
#[derive(Clone, Debug)]
pub struct CoordinatorOptions {
    pub sweep: Sweep,
    /// Output directory; the run goes to `<out>/<sweep name>/`.
    pub out: PathBuf,
    pub nats: Nats,
    /// Metrics address (default 127.0.0.1:9464), or `off`.
    pub metrics: Option<String>,
}

/// Run a coordinator against a broker until the run ends or `shutdown`.
pub async fn run(
    opts: CoordinatorOptions,
    shutdown: watch::Receiver<bool>,
) -> Result<RunOutcome, NodeError> {
    let run_dir = crate::run_dir(&opts.out, &opts.sweep)?;
    let broker =
        crate::connect_or_stop(&opts.nats.broker_config("halyard-coordinator"), &shutdown).await?;
    let metrics = Metrics { addr: opts.metrics.as_deref(), default: Some("127.0.0.1:9464") };
    let around = Surroundings::start(&broker, &opts.sweep, &run_dir, metrics, Vec::new()).await?;
    let cfg = CoordinatorConfig { sweep: opts.sweep, run_dir };
    // A standalone coordinator's broker is shared: its accepted results go to the shared
    // result cache (issue 51).
    halyard_coordinator::shared_cache::set_sharing(true);
    Ok(around.run(broker, cfg, until(shutdown)).await?)
}

/// Where a process serves its metrics: `--metrics ADDR` (or `off`), else `default`
/// (none: off unless given).
#[derive(Clone, Copy, Debug)]
pub struct Metrics<'a> {
    pub addr: Option<&'a str>,
    pub default: Option<&'a str>,
}

/// What surrounds a coordinator: the channel of its live figures, the metrics endpoint
/// that shows them (with the figures of the process's local workers), and the writer of
/// its status.
pub struct Surroundings {
    progress_tx: watch::Sender<Progress>,
    progress_rx: watch::Receiver<Progress>,
    writer: StatusWriter,
}

impl Surroundings {
    /// Start them for the run of `sweep` in `run_dir`.
    pub async fn start(
        broker: &Broker,
        sweep: &Sweep,
        run_dir: &Path,
        metrics: Metrics<'_>,
        workers: Vec<(String, Arc<Stats>)>,
    ) -> Result<Surroundings, NodeError> {
        let (progress_tx, progress_rx) = watch::channel(Progress::default());
        let pools: Vec<String> = sweep.pools().into_keys().collect();
        let src = metrics::CoordinatorSource {
            progress: progress_rx.clone(),
            broker: broker.clone(),
            pools: pools.clone(),
        };
        metrics::serve(
            metrics.addr,
            metrics.default,
            metrics::Sources { coordinator: Some(src), workers, broker: None },
        )
        .await?;
        let writer =
            StatusWriter::start(&sweep.name, run_dir, broker, progress_rx.clone(), pools).await;
        Ok(Surroundings { progress_tx, progress_rx, writer })
    }

    /// The coordinator's live figures (for a progress display); the channel closes when
    /// the coordinator ends.
    pub fn progress(&self) -> watch::Receiver<Progress> {
        self.progress_rx.clone()
    }

    /// Run the coordinator until the run ends or `shutdown` resolves, then publish its
    /// final status (`complete`, `interrupted`, `cost_limit` or `failed`). A complete
    /// run's state has been compacted as it closed (`halyard_coordinator::run`): it is
    /// read from now on, not grown.
    pub async fn run(
        self,
        broker: Broker,
        cfg: CoordinatorConfig,
        shutdown: impl Future<Output = ()>,
    ) -> Result<RunOutcome, CoordinatorError> {
        let outcome = halyard_coordinator::run(broker, cfg, Some(self.progress_tx), shutdown).await;
        self.writer.finish(final_state(&outcome)).await;
        outcome
    }
}

/// The state a finished coordinator leaves in its status.
fn final_state<E>(o: &std::result::Result<RunOutcome, E>) -> &'static str {
    match o {
        Ok(RunOutcome::Complete { .. }) => "complete",
        Ok(
            RunOutcome::Interrupted { .. }
            | RunOutcome::OutageStopped { .. }
            | RunOutcome::FirstContact { .. },
        ) => "interrupted",
        Ok(RunOutcome::CostLimit { .. }) => "cost_limit",
        Err(_) => "failed",
    }
}

/// The exit status of a run that completed with dead letters (README "Exit status").
pub const EXIT_DEAD_LETTERS: u8 = 4;
/// The exit status of a run stopped because a model's endpoint never answered (issue
/// 48: nothing listens, TLS, a refused key, 404, not the API's shape), and of `halyard
/// check` when a model cannot serve.
pub const EXIT_CANNOT_SERVE: u8 = 5;

/// Tell the user how a run ended, and give the process's exit status: 0 complete, 4
/// complete with dead letters (the last line says how many and how to run them again),
/// 130 interrupted (`resume` says how to resume it), 3 stopped at the cost limit.
pub fn exit_status(outcome: &RunOutcome, resume: &str) -> u8 {
    match outcome {
        RunOutcome::Complete { run, report_dir, dead_letters } => {
            println!("run {run} complete: report in {}", report_dir.join("report.md").display());
            if *dead_letters == 0 {
                return 0;
            }
            eprintln!(
                "run {run}: {dead_letters} dead letter{} remain (jobs that ended without a result, listed in the report); run them again with `halyard retry-failed {}` and then {resume}",
                if *dead_letters == 1 { "" } else { "s" },
                report_dir.display()
            );
            EXIT_DEAD_LETTERS
        }
        RunOutcome::Interrupted { run } => {
            eprintln!("run {run} interrupted; {resume} to resume");
            130
        }
        RunOutcome::OutageStopped { run, outage, patience_s } => {
            eprintln!(
                "run {run} interrupted: {} ({}), longer than outage_patience_s = {patience_s}; no job was dead-lettered for it: {resume} once the endpoint is back",
                outage.describe(),
                outage.error
            );
            130
        }
        RunOutcome::FirstContact { run, message, .. } => {
            eprintln!("run {run} stopped: {message}");
            eprintln!("fix it and {resume}: nothing paid for is paid again (see `halyard check`)");
            EXIT_CANNOT_SERVE
        }
        RunOutcome::CostLimit { run, spent, limit } => {
            eprintln!("run {run} stopped: cost limit reached (${spent:.4} spent, limit ${limit:.4}); run again with a higher --max-cost to continue");
            3
        }
    }
}

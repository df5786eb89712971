//! `halyard run`: a whole sweep in one process. A private `nats-server` (unless a broker
//! is given; its store in the run directory, so a resumed run finds its streams), a
//! local worker serving every pool of the sweep (unless `--no-workers`), and the
//! coordinator, with progress shown and status written. Everything stops together: the
//! coordinator stops when the run ends, a signal comes or the local worker fails; then
//! the worker, then the private server.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use halyard_broker::{embedded::EmbeddedNats, Broker};
use halyard_coordinator::{CoordinatorConfig, RunOutcome};
use halyard_plan::sweep::Sweep;
use halyard_worker::{Checkpoint, Stats, WorkerError};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::coordinator::{Metrics, Surroundings};
use crate::shutdown::until;
use crate::{display, status, worker, Nats, NodeError};

/// What `halyard run` is given.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub sweep: Sweep,
    /// Output directory; the run goes to `<out>/<sweep name>/`.
    pub out: PathBuf,
    /// A broker to use instead of starting a private one.
    pub nats: Option<Nats>,
    /// Start no local worker (remote workers do the work).
    pub no_workers: bool,
    /// Checkpoint of the local worker (default `<out>/<name>/checkpoint`).
    pub checkpoint: Option<PathBuf>,
    /// Metrics address (coordinator and local worker); off unless given.
    pub metrics: Option<String>,
    /// Let the local worker call http:// model URLs on hosts that are not loopback.
    pub allow_insecure_http: bool,
}

/// Run a sweep to its end (or `shutdown`, or a failure of the local worker).
pub async fn run(
    opts: RunOptions,
    shutdown: watch::Receiver<bool>,
) -> Result<RunOutcome, NodeError> {
    let run_dir = crate::run_dir(&opts.out, &opts.sweep)?;
    let (embedded, broker) = start_broker(opts.nats.clone(), &run_dir, &shutdown).await?;
    // `--nats`: a broker other runs share, so its results are shared (issue 51).
    halyard_coordinator::shared_cache::set_sharing(embedded.is_none());
    let mut local = None;
    if !opts.no_workers {
        // The coordinator is this process: the streams and the pools' consumers it makes
        // first (`halyard_coordinator::run`, step 2) are made before the local worker
        // starts, so the worker never waits for them, nor says it does ("does not exist
        // yet; waiting for a coordinator" read as a fault on a newcomer's terminal). Both
        // calls are idempotent; the coordinator makes them again. They wait for
        // JetStream: a stop meanwhile starts no worker, and the coordinator, seeing the
        // stop as it starts, ends the run as interrupted (resumable), as it would have.
        let prepared = tokio::select! {
            r = prepare_broker(&broker, &opts.sweep) => Some(r?),
            _ = until(shutdown.clone()) => None,
        };
        if prepared.is_some() {
            let dir = opts.checkpoint.clone().unwrap_or_else(|| run_dir.join("checkpoint"));
            local = Some(LocalWorker::start(&broker, &opts, dir).await?);
        }
    }
    let stats: Vec<(String, Arc<Stats>)> = local.iter().map(|w| w.stats.clone()).collect();
    let metrics = Metrics { addr: opts.metrics.as_deref(), default: None };
    let around =
        Surroundings::start(&broker, &opts.sweep, &run_dir, metrics, stats.clone()).await?;
    let shown = display::spawn(around.progress(), stats.into_iter().map(|(_, s)| s).collect());
    // The coordinator runs until the run completes, a signal comes, or the local worker
    // fails (a model that cannot load, say): then the run stops with that error instead
    // of waiting for work nobody will do.
    let (fail_tx, fail_rx) = watch::channel(false);
    let cfg = CoordinatorConfig { sweep: opts.sweep, run_dir };
    let coordinator = around.run(broker.clone(), cfg, async move {
        tokio::select! { _ = until(shutdown) => {}, _ = until(fail_rx) => {} }
    });
    let (outcome, mut worker_error) = race(coordinator, local.as_mut(), fail_tx).await;
    let _ = shown.await;
    if let Some(w) = local {
        // The run is complete: the worker compacts its checkpoint as it closes it, as the
        // coordinator did with the run state (the room their commits freed given back).
        if worker_error.is_none() && matches!(outcome, Ok(RunOutcome::Complete { .. })) {
            w.compact_on_stop.store(true, std::sync::atomic::Ordering::Release);
        }
        if let Some(e) = w.stop().await {
            worker_error = Some(e);
        }
    }
    let _ = broker.client.flush().await;
    drop(broker);
    drop(embedded);
    if let Some(e) = worker_error {
        return Err(NodeError::LocalWorker(e));
    }
    Ok(outcome?)
}

/// The broker given, or a private nats-server started for this run (unless `shutdown`
/// comes while it is waited for).
async fn start_broker(
    nats: Option<Nats>,
    run_dir: &Path,
    shutdown: &watch::Receiver<bool>,
) -> Result<(Option<EmbeddedNats>, Broker), NodeError> {
    let (embedded, url, auth, replicas) = match nats {
        Some(n) => (None, n.url, n.auth, n.replicas),
        None => {
            let n = EmbeddedNats::start(&run_dir.join("nats"))?;
            let url = n.url();
            tracing::info!(url = %url, "started private nats-server");
            // The private server listens on loopback only, for this process's key only.
            let auth = n.auth();
            (Some(n), url, auth, None)
        }
    };
    let cfg = crate::Nats { url, auth, replicas }.broker_config("halyard-run");
    let broker = crate::connect_or_stop(&cfg, shutdown).await?;
    Ok((embedded, broker))
}

/// The streams and buckets of the broker's layout, and every pool's consumer, as the
/// coordinator makes them before it plans.
async fn prepare_broker(broker: &Broker, sweep: &Sweep) -> Result<(), NodeError> {
    halyard_broker::init(broker, &Default::default()).await?;
    let delivery = halyard_broker::Delivery {
        ack_wait: sweep.run.ack_wait,
        max_deliver: sweep.run.max_deliver,
    };
    for pool in sweep.pools().keys() {
        halyard_broker::pool_consumer(broker, pool, delivery).await?;
    }
    Ok(())
}

/// Await `coordinator`; if the local worker ends first, signal `fail` (the coordinator
/// then stops) and keep the worker's error.
async fn race<T>(
    coordinator: impl Future<Output = T>,
    mut worker: Option<&mut LocalWorker>,
    fail: watch::Sender<bool>,
) -> (T, Option<String>) {
    tokio::pin!(coordinator);
    let mut worker_error = None;
    let outcome = loop {
        let task = worker.as_mut().and_then(|w| w.task.as_mut());
        tokio::select! {
            o = &mut coordinator => break o,
            w = async { task.expect("polled only while Some").await }, if task.is_some() => {
                if let Some(w) = worker.as_mut() {
                    w.task = None;
                }
                worker_error = Some(match w {
                    Ok(Ok(_)) => "local worker stopped unexpectedly".to_string(),
                    Ok(Err(e)) => e.to_string(),
                    Err(e) => format!("local worker panicked: {e}"),
                });
                let _ = fail.send(true);
            }
        }
    };
    (outcome, worker_error)
}

/// The worker inside `halyard run`: every pool of the sweep, its checkpoint opened
/// before anything is published.
struct LocalWorker {
    task: Option<JoinHandle<Result<Arc<Stats>, WorkerError>>>,
    stats: (String, Arc<Stats>),
    beat: Option<JoinHandle<()>>,
    stop: watch::Sender<bool>,
    /// Set before the stop: the worker compacts its checkpoint as it closes it.
    compact_on_stop: Arc<std::sync::atomic::AtomicBool>,
}

impl LocalWorker {
    async fn start(
        broker: &Broker,
        opts: &RunOptions,
        dir: PathBuf,
    ) -> Result<LocalWorker, NodeError> {
        let checkpoint = Checkpoint::open(&dir)?;
        let mut cfg = worker::sweep_worker(&opts.sweep, dir);
        worker::check_local_models(&cfg.plan)?;
        cfg.http.allow_insecure_http = opts.allow_insecure_http;
        // `halyard run` runs the sweep its operator gave it on this machine, commands
        // included (the book's threat model); `--allow-server-commands` guards workers.
        cfg.http.allow_server_commands = true;
        if opts.nats.is_some() {
            cfg.cache =
                cfg.cache.with_shared(halyard_cache::shared::SharedReader::new(broker.clone()));
        }
        let stats = (cfg.worker_id.clone(), cfg.stats.clone());
        let compact_on_stop = cfg.compact_on_stop.clone();
        let beat = status::heartbeat(
            broker,
            cfg.worker_id.clone(),
            worker::pool_list(&cfg),
            cfg.stats.clone(),
        );
        let (stop, stop_rx) = watch::channel(false);
        let b = broker.clone();
        let task = tokio::spawn(async move {
            halyard_worker::run_with_checkpoint(b, checkpoint, cfg, until(stop_rx)).await
        });
        Ok(LocalWorker { task: Some(task), stats, beat: Some(beat), stop, compact_on_stop })
    }

    /// Stop the worker and wait for it; its error, if it had one.
    async fn stop(self) -> Option<String> {
        if let Some(b) = self.beat {
            b.abort();
        }
        let _ = self.stop.send(true);
        match self.task?.await {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(e) => Some(format!("local worker panicked: {e}")),
        }
    }
}

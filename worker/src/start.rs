//! Start-up and stop of a worker: its configuration ([`WorkerConfig`]), what starts
//! before the pools take jobs (quota memberships, endpoint health, managed servers, the
//! models), the pool loops, and the graceful stop. The crate's face (`lib.rs`)
//! re-exports what is public here.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use halyard_broker::{Broker, BrokerError, Delivery};
use halyard_proto::pool::WorkerPlan;
use tokio::sync::watch;
use tracing::info;

use crate::backend;
use crate::backend::server;
use crate::batch;
use crate::budget;
use crate::checkpoint::{self, Checkpoint};
use crate::delivery;
use crate::failpoint;
use crate::health;
use crate::outbox;
use crate::pool;
use crate::quota;
use crate::retry;
use crate::stats::Stats;

#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// What this worker serves: its pools, their quotas and the models it may call in
    /// each (see `halyard_proto::pool`). Every job received is checked against it.
    pub plan: WorkerPlan,
    /// Directory of the checkpoint.
    pub state_dir: PathBuf,
    pub worker_id: String,
    pub delivery: Delivery,
    pub retry: retry::RetryPolicy,
    /// Time in-flight calls get to finish after shutdown before they are nak'd.
    pub shutdown_grace: Duration,
    /// Where the worker counts what it does (read live by `/metrics`).
    pub stats: Arc<Stats>,
    pub quota_settings: quota::QuotaSettings,
    /// Response size limit and plain-http policy of the HTTP backend.
    pub http: backend::http_guard::HttpPolicy,
    /// Compact the checkpoint as it closes at the stop. Its owner sets it before the stop
    /// once the work the checkpoint served is done (`halyard run`, its run complete).
    pub compact_on_stop: Arc<std::sync::atomic::AtomicBool>,
    /// The result cache (issue 51): consulted after the checkpoint, before a call. Off
    /// unless the caller opens it (`halyard_node` opens the machine tier).
    pub cache: halyard_cache::Cache,
    /// Each model's cache policy (a model not listed: read-write).
    pub cache_policies: Vec<(halyard_proto::ModelRef, halyard_proto::CachePolicy)>,
}

impl WorkerConfig {
    pub fn new(plan: WorkerPlan, state_dir: PathBuf) -> Self {
        WorkerConfig {
            plan,
            state_dir,
            worker_id: default_worker_id(),
            delivery: Delivery::default(),
            retry: retry::RetryPolicy::default(),
            shutdown_grace: Duration::from_secs(10),
            stats: Arc::default(),
            quota_settings: Default::default(),
            http: Default::default(),
            compact_on_stop: Arc::default(),
            cache: halyard_cache::Cache::off(),
            cache_policies: Vec::new(),
        }
    }
}

pub fn default_worker_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    format!("{}-{}", if host.is_empty() { "worker" } else { &host }, std::process::id())
}

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Broker(#[from] BrokerError),
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::CheckpointError),
    #[error("{0}")]
    Backend(String),
    #[error("no pools to serve: give --pool, --config or a sweep file")]
    NoPools,
    #[error("{0}")]
    Failpoint(String),
    /// A managed server could not start, or failed for good (see [`server`]).
    #[error("{0}")]
    Server(String),
}

/// Run a worker until `shutdown` resolves; returns its statistics.
pub async fn run(
    broker: Broker,
    config: WorkerConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<Arc<Stats>, WorkerError> {
    let checkpoint = Checkpoint::open(&config.state_dir)?;
    run_with_checkpoint(broker, checkpoint, config, shutdown).await
}

/// As [`run`], with an already opened checkpoint (embedded mode shares one).
///
/// A `shutdown` that resolves while the worker is still starting (waiting for JetStream,
/// loading its models) stops it at once: it has taken no job yet, so it closes its
/// checkpoint and returns as after any graceful stop.
pub async fn run_with_checkpoint(
    broker: Broker,
    checkpoint: Checkpoint,
    config: WorkerConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<Arc<Stats>, WorkerError> {
    if config.plan.pools.is_empty() {
        return Err(WorkerError::NoPools);
    }
    let failpoints = Arc::new(failpoint::Failpoints::from_env().map_err(WorkerError::Failpoint)?);
    if let Some((p, n)) = failpoints.armed() {
        tracing::warn!(point = p.name(), pass = n, "failpoint armed: this worker will abort there");
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let (hard_tx, hard_rx) = watch::channel(false);
    // What start-up joins lives here, so that a stop while starting leaves it too.
    let mut joined = Joined::default();
    let mut shutdown = std::pin::pin!(shutdown);
    let stats = config.stats.clone();
    let start = start(&broker, &checkpoint, &config, failpoints, &mut joined, (stop_rx, hard_rx));
    let started = tokio::select! {
        s = start => Some(s),
        _ = &mut shutdown => None,
    };
    let Joined { quotas, health, servers } = joined;
    let (ctx, mut loops) = match started {
        Some(Ok(s)) => s,
        stopped_or_failed => {
            let _ = (stop_tx.send(true), hard_tx.send(true));
            if let Some(s) = &servers {
                s.stop().await;
            }
            for gate in quotas.values() {
                gate.leave().await;
            }
            for h in health.values() {
                h.close().await;
            }
            checkpoint.close().await;
            return match stopped_or_failed {
                Some(Err(e)) => Err(e),
                _ => {
                    info!(worker = %config.worker_id, "stopped while starting: no job was taken");
                    Ok(stats)
                }
            };
        }
    };
    info!(worker = %config.worker_id, pools = config.plan.pools.len(), "worker running");
    stats.ready.store(true, std::sync::atomic::Ordering::Relaxed);
    let fatal = async {
        match &servers {
            Some(s) => s.fatal().await,
            None => std::future::pending().await,
        }
    };
    let mut failure = None;
    tokio::select! {
        _ = &mut shutdown => {}
        // A pool loop only ends on its own if its semaphore closes; treat as shutdown.
        _ = loops.join_next() => {}
        // A managed server failed for good: stop as after a signal, then say why.
        why = fatal => {
            tracing::error!(worker = %config.worker_id, "{why}");
            failure = Some(why);
        }
    }
    stats.ready.store(false, std::sync::atomic::Ordering::Relaxed);
    let _ = stop_tx.send(true);
    // Hand the quota shares to the other workers now: this one admits no more calls.
    for gate in quotas.values() {
        gate.leave().await;
    }
    let grace = config.shutdown_grace;
    tokio::spawn(async move {
        tokio::time::sleep(grace).await;
        let _ = hard_tx.send(true);
    });
    while loops.join_next().await.is_some() {}
    // Drain the client's pending acks/publishes before the connection goes away; bounded,
    // since with the broker gone a flush would wait for a reconnection forever.
    let _ = tokio::time::timeout(Duration::from_secs(5), broker.client.flush()).await;
    drop(ctx);
    // The servers go last: every call in flight has been answered or abandoned.
    if let Some(s) = &servers {
        s.stop().await;
    }
    for h in health.values() {
        h.close().await;
    }
    // What this worker paid for reaches the machine cache before it stops.
    config.cache.close().await;
    if config.compact_on_stop.load(std::sync::atomic::Ordering::Acquire) && failure.is_none() {
        checkpoint.close_compacted().await;
    } else {
        checkpoint.close().await;
    }
    info!(
        calls = stats.calls.get(),
        completed = stats.completed.get(),
        replayed = stats.replayed.get(),
        dead_letters = stats.dead_letters.get(),
        refused = stats.refused.get(),
        "worker stopped"
    );
    match failure {
        Some(why) => Err(WorkerError::Server(why)),
        None => Ok(stats),
    }
}

/// The quota pools and pool-health announcements a worker has joined, by pool: left and
/// closed when it stops, however far its start-up went.
#[derive(Default)]
struct Joined {
    quotas: std::collections::HashMap<String, Arc<quota::QuotaGate>>,
    health: std::collections::HashMap<String, Arc<health::PoolHealth>>,
    servers: Option<Arc<server::Servers>>,
}

/// Start a worker: its models and managed servers, then (the broker shaped) its quota
/// shares and pool health (into `joined`), and one loop per pool bound to the pool's
/// consumer, stopped by `stops` (graceful, hard). Dropped before it ends (a stop while
/// starting), it has taken no job.
async fn start(
    broker: &Broker,
    checkpoint: &Checkpoint,
    config: &WorkerConfig,
    failpoints: Arc<failpoint::Failpoints>,
    joined: &mut Joined,
    (stop_rx, hard_rx): (watch::Receiver<bool>, watch::Receiver<bool>),
) -> Result<(Arc<delivery::PoolCtx>, tokio::task::JoinSet<()>), WorkerError> {
    // What needs no broker first: the models load and the managed servers start while
    // the broker may not be shaped yet (a worker deployed before any coordinator waits
    // for the streams below, and a server that takes minutes to load is ready by then).
    let (plan, http) = (config.plan.clone(), config.http);
    let mut backends =
        tokio::task::spawn_blocking(move || backend::registry::Backends::new(&plan, http))
            .await
            .map_err(|e| WorkerError::Backend(format!("model loading panicked: {e}")))?
            .map_err(WorkerError::Backend)?;
    let stats = config.stats.clone();
    // A managed server's health is this worker's own: the pool's other workers call
    // their own servers (see `server`).
    for p in config.plan.pools.iter().map(|p| &p.pool) {
        if server::pool_has_server(&config.plan, &p.name) {
            let h = health::PoolHealth::local(&p.name, &config.worker_id, stats.clone());
            joined.health.insert(p.name.clone(), h);
        }
    }
    if server::has_servers(&config.plan) {
        let dir = config.state_dir.join("servers");
        let servers = server::Servers::launch(&config.plan, &dir, &joined.health, stats.clone())
            .map_err(WorkerError::Server)?;
        joined.servers = Some(servers.clone());
        // No consumer is bound before every server answers.
        servers.ready().await.map_err(WorkerError::Server)?;
        backends.set_servers(servers);
    }
    halyard_broker::layout::open_streams(broker).await?;
    for p in &config.plan.pools {
        if let Some(q) = &p.quota {
            let gate = quota::QuotaGate::join(
                broker,
                &p.pool.name,
                quota::PoolQuota::from(q),
                &config.worker_id,
                config.quota_settings,
                stats.clone(),
            )
            .await?;
            joined.quotas.insert(p.pool.name.clone(), gate);
        }
    }
    if !joined.quotas.is_empty() {
        // The other members shrink their shares before this one's first request.
        tokio::time::sleep(config.quota_settings.join_settle).await;
    }
    for p in config.plan.pools.iter().map(|p| &p.pool) {
        if !joined.health.contains_key(&p.name) {
            let h =
                health::PoolHealth::join(broker, &p.name, &config.worker_id, stats.clone()).await?;
            joined.health.insert(p.name.clone(), h);
        }
    }
    let budget = budget::Budget::open(broker).await?;
    let timing = batch::BatchTiming::from_env().map_err(WorkerError::Backend)?;
    let batches = batch::Batches::start(
        broker,
        &config.plan,
        &config.worker_id,
        failpoints.clone(),
        timing,
        stop_rx.clone(),
        hard_rx.clone(),
    )
    .await
    .map_err(WorkerError::Backend)?;
    let ctx = Arc::new(delivery::PoolCtx {
        batches,
        checkpoint: checkpoint.clone(),
        backends,
        stats: stats.clone(),
        worker_id: config.worker_id.clone(),
        retry: config.retry,
        max_deliver: config.delivery.max_deliver.max(1) as u64,
        ack_wait_ms: std::sync::atomic::AtomicU64::new(delivery::ack_wait_millis(
            config.delivery.ack_wait,
        )),
        hard_stop: hard_rx,
        stop: stop_rx.clone(),
        running: Default::default(),
        outbox: outbox::Outbox::start(broker.clone(), failpoints.clone()),
        broker: broker.clone(),
        failpoints,
        quotas: joined.quotas.clone(),
        plan: config.plan.clone(),
        budget,
        cache: config.cache.clone(),
        cache_policies: config.cache_policies.clone(),
    });
    // Every existing consumer is bound (and checked) before the first loop runs: a start
    // dropped half-way has taken no job. A pool whose consumer no coordinator has made
    // yet waits for it in its loop: the worker is ready meanwhile (workers may not make
    // consumers, deploy/nats/permissions.conf).
    let mut consumers = Vec::new();
    for p in config.plan.pools.iter().map(|p| &p.pool) {
        let bound = halyard_broker::bind_pool_consumer(broker, &p.name).await?;
        if bound.is_none() {
            info!(
                pool = %p.name,
                consumer = %halyard_proto::subjects::pool_consumer(&p.name),
                "the pool's consumer does not exist yet; waiting for a coordinator to plan the pool"
            );
        }
        consumers.push((p, bound));
    }
    let mut loops = tokio::task::JoinSet::new();
    for (p, consumer) in consumers {
        loops.spawn(pool::run_pool(
            ctx.clone(),
            p.name.clone(),
            joined.health[&p.name].clone(),
            consumer,
            p.concurrency,
            stop_rx.clone(),
        ));
    }
    Ok((ctx, loops))
}

//! # halyard-worker: runs a pool's jobs
//!
//! ## Layout
//! - [`lifecycle`]: the life of one delivery as a pure state machine (no IO).
//! - [`checkpoint`]: sled store of completed calls, with group commit.
//! - [`backend`]: model backends (`openai`, `gguf`, `replay`, `noop`) and error classification.
//! - [`retry`]: in-delivery retries with backoff, jitter and `Retry-After`.
//! - [`failpoint`]: crash points between the durability steps, armed by an environment
//!   variable, for crash tests.
//! - [`quota`]: pool quotas (requests and tokens per minute) shared by all the
//!   pool's workers through a KV membership, with pool-wide cool-downs on 429.
//! - `pool`: the fetch loop of one pool and the effects of the state machine.
//!
//! ## The life of a job in a worker
//! 1. Fetch as many jobs as the pool has free slots (`max_concurrency`).
//! 2. If the checkpoint holds the job's result, publish it and ack: no model call.
//! 3. Otherwise call the backend (retrying transient failures, honouring `Retry-After`,
//!    sending in-progress acks while the call runs longer than a third of `ack_wait`).
//! 4. Write the completion to sled and flush (group commit: one flush covers every
//!    result that arrived meanwhile), publish it to `halyard.results.<run>` and await the
//!    broker's ack (the outbox sends the results that became durable together as one
//!    message, see `outbox`), and only then ack the job. The ack is a plain one, written with the others pending on the
//!    connection: a lost ack costs a redelivery answered from the checkpoint, never a
//!    model call, so it is not worth a round trip per job (a double ack).
//! 5. A permanent error, or a transient one on the last delivery, publishes a dead
//!    letter and acks; other failures nak with a backoff delay.
//!
//! A crash anywhere loses at most the calls in flight: a job acked is durable in both
//! sled and the results stream; a job not acked is redelivered and, if its call had
//! completed, answered from the checkpoint.
//!
//! ## Shutdown
//! When `shutdown` resolves, the worker stops fetching and leaves its quota pools at
//! once (the others take over its shares; its calls still waiting for the share do not
//! start). In-flight jobs get `shutdown_grace` to finish; after that their calls are
//! abandoned and the jobs nak'd with a short delay, so another worker picks them up.
//! The checkpoint is flushed last.

pub mod backend;
pub mod checkpoint;
pub mod failpoint;
pub mod lifecycle;
mod outbox;
mod pool;
pub mod quota;
pub mod retry;

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use checkpoint::Checkpoint;
use halyard_broker::{Broker, BrokerError, Delivery};
use tokio::sync::watch;
use tracing::info;

/// A pool this worker serves.
#[derive(Clone, Debug)]
pub struct PoolSpec {
    pub name: String,
    /// Calls in flight at once for this pool, in this worker.
    pub concurrency: usize,
}

#[derive(Clone, Debug)]
pub struct WorkerConfig {
    pub pools: Vec<PoolSpec>,
    /// sled directory of the checkpoint.
    pub state_dir: PathBuf,
    pub worker_id: String,
    pub delivery: Delivery,
    pub retry: retry::RetryPolicy,
    /// Time in-flight calls get to finish after shutdown before they are nak'd.
    pub shutdown_grace: Duration,
    /// Local GGUF models this worker loads and serves.
    pub local_models: Vec<backend::GgufSpec>,
    /// Recorded results this worker serves (`replay` backend).
    pub replays: Vec<backend::replay::ReplaySpec>,
    /// Where the worker counts what it does (read live by `/metrics`).
    pub stats: Arc<Stats>,
    /// Quotas of pools that have one (by pool name); see [`quota`].
    pub quotas: std::collections::HashMap<String, quota::PoolQuota>,
    pub quota_settings: quota::QuotaSettings,
    /// Embedding models this worker loads and serves (`backend = "embed"`).
    pub embed_models: Vec<backend::embed::EmbedSpec>,
}

impl WorkerConfig {
    pub fn new(pools: Vec<PoolSpec>, state_dir: PathBuf) -> Self {
        WorkerConfig {
            pools,
            state_dir,
            worker_id: default_worker_id(),
            delivery: Delivery::default(),
            retry: retry::RetryPolicy::default(),
            shutdown_grace: Duration::from_secs(10),
            local_models: Vec::new(),
            replays: Vec::new(),
            stats: Arc::default(),
            quotas: Default::default(),
            quota_settings: Default::default(),
            embed_models: Vec::new(),
        }
    }
}

pub fn default_worker_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
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
    #[error("no pools to serve: give --pool or a sweep file")]
    NoPools,
    #[error("{0}")]
    Failpoint(String),
}

#[derive(Default, Debug)]
pub struct Counter(AtomicU64);
impl Counter {
    pub const fn new() -> Counter {
        Counter(AtomicU64::new(0))
    }
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// What this worker did (for logs, tests, benchmarks and `/metrics`).
#[derive(Default, Debug)]
pub struct Stats {
    /// Backend calls made (HTTP attempts), retries included.
    pub calls: Counter,
    pub completed: Counter,
    pub replayed: Counter,
    pub dead_letters: Counter,
    pub retried: Counter,
    /// Pull requests sent, and jobs they brought (their ratio is the mean pull size).
    pub pulls: Counter,
    pub pulled: Counter,
    /// HTTP 429 answers received, retried ones included.
    pub rate_limited: Counter,
    /// Pool-wide cool-downs this worker started (one per 429 storm).
    pub cooldowns: Counter,
}

impl Stats {
    fn add_calls(&self, n: u64) {
        self.calls.add(n)
    }
}

/// Run a worker until `shutdown` resolves; returns its statistics.
pub async fn run(broker: Broker, config: WorkerConfig, shutdown: impl Future<Output = ()>) -> Result<Arc<Stats>, WorkerError> {
    let checkpoint = Checkpoint::open(&config.state_dir)?;
    run_with_checkpoint(broker, checkpoint, config, shutdown).await
}

/// As [`run`], with an already opened checkpoint (embedded mode shares one).
pub async fn run_with_checkpoint(
    broker: Broker,
    checkpoint: Checkpoint,
    config: WorkerConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<Arc<Stats>, WorkerError> {
    if config.pools.is_empty() {
        return Err(WorkerError::NoPools);
    }
    let failpoints = Arc::new(failpoint::Failpoints::from_env().map_err(WorkerError::Failpoint)?);
    if let Some((p, n)) = failpoints.armed() {
        tracing::warn!(point = p.name(), pass = n, "failpoint armed: this worker will abort there");
    }
    halyard_broker::ensure_streams(&broker).await?;
    let (specs, replays, embed_specs) = (config.local_models.clone(), config.replays.clone(), config.embed_models.clone());
    let backends = tokio::task::spawn_blocking(move || backend::Backends::new(&specs, &replays, &embed_specs))
        .await
        .map_err(|e| WorkerError::Backend(format!("model loading panicked: {e}")))?
        .map_err(WorkerError::Backend)?;
    let stats = config.stats.clone();
    let mut quotas = std::collections::HashMap::new();
    for p in &config.pools {
        if let Some(q) = config.quotas.get(&p.name) {
            let gate = quota::QuotaGate::join(&broker, &p.name, q.clone(), &config.worker_id, config.quota_settings, stats.clone()).await?;
            quotas.insert(p.name.clone(), gate);
        }
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let (hard_tx, hard_rx) = watch::channel(false);
    let ctx = Arc::new(pool::PoolCtx {
        checkpoint: checkpoint.clone(),
        backends,
        stats: stats.clone(),
        worker_id: config.worker_id.clone(),
        retry: config.retry,
        max_deliver: config.delivery.max_deliver.max(1) as u64,
        ack_wait: config.delivery.ack_wait,
        hard_stop: hard_rx,
        running: Default::default(),
        outbox: outbox::Outbox::start(broker.clone(), failpoints.clone()),
        failpoints,
        quotas: quotas.clone(),
    });
    let mut loops = tokio::task::JoinSet::new();
    for p in &config.pools {
        let consumer = halyard_broker::pool_consumer(&broker, &p.name, config.delivery).await?;
        loops.spawn(pool::run_pool(ctx.clone(), p.name.clone(), consumer, p.concurrency, stop_rx.clone()));
    }
    info!(worker = %config.worker_id, pools = config.pools.len(), "worker running");
    tokio::select! {
        _ = shutdown => {}
        // A pool loop only ends on its own if its semaphore closes; treat as shutdown.
        _ = loops.join_next() => {}
    }
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
    checkpoint.close().await;
    info!(
        calls = stats.calls.get(),
        completed = stats.completed.get(),
        replayed = stats.replayed.get(),
        dead_letters = stats.dead_letters.get(),
        "worker stopped"
    );
    Ok(stats)
}

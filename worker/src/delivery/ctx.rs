//! What every delivery of a worker shares ([`PoolCtx`]: the checkpoint, the backends, the
//! outbox, the budgets, the stop signals) and the result it publishes ([`publish`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use halyard_broker::PullConsumer;
use halyard_proto::{Job, JobId, JobResult, Outcome};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::backend::registry::Backends;
use crate::budget::Budget;
use crate::checkpoint::Checkpoint;
use crate::failpoint::Failpoints;
use crate::lifecycle::Event;
use crate::outbox::Outbox;
use crate::retry::RetryPolicy;
use crate::stats::Stats;

pub(crate) struct PoolCtx {
    pub checkpoint: Checkpoint,
    pub backends: Backends,
    pub stats: Arc<Stats>,
    pub worker_id: String,
    pub retry: RetryPolicy,
    pub max_deliver: u64,
    /// The ack wait in-progress acks are paced by (milliseconds): the worker's, lowered
    /// to a pool consumer's shorter one ([`PoolCtx::pace_by`]).
    pub ack_wait_ms: std::sync::atomic::AtomicU64,
    /// Flips to true when in-flight calls must be abandoned (grace period over).
    pub hard_stop: watch::Receiver<bool>,
    /// Flips to true when the worker stops fetching (a probe's wait ends then).
    pub stop: watch::Receiver<bool>,
    /// Jobs being run by this worker: a second delivery of the same job (a lost ack, a
    /// duplicate publish) waits for the first and is then answered from the checkpoint.
    pub running: std::sync::Mutex<HashMap<JobId, Arc<tokio::sync::Mutex<()>>>>,
    /// Crash points for tests (disarmed unless `HALYARD_FAILPOINT` is set).
    pub failpoints: Arc<Failpoints>,
    /// Publishes results in batches.
    pub outbox: Outbox,
    /// Quota gates of the pools that have a quota.
    pub quotas: HashMap<String, Arc<crate::quota::QuotaGate>>,
    /// Deliveries excused from the jobs' budgets (see [`crate::budget`]).
    pub budget: Budget,
    /// What this worker serves; every job received is checked against it.
    pub plan: halyard_proto::pool::WorkerPlan,
    /// For job messages that name an object.
    pub broker: halyard_broker::Broker,
    /// The pools in batch mode: their jobs' calls go through provider batches.
    pub batches: crate::batch::Batches,
    /// The result cache and each model's policy (see [`PoolCtx::cache_policy`]).
    pub cache: halyard_cache::Cache,
    pub cache_policies: Vec<(halyard_proto::ModelRef, halyard_proto::CachePolicy)>,
}

/// An ack wait as [`PoolCtx::ack_wait_ms`] holds it: whole milliseconds, at least one.
pub(crate) fn ack_wait_millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl PoolCtx {
    /// The ack wait in-progress acks are paced by.
    pub(crate) fn ack_wait(&self) -> Duration {
        Duration::from_millis(self.ack_wait_ms.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Pace in-progress acks by `consumer`'s ack wait too, if it is shorter than the
    /// worker's (the coordinator made the consumer with its sweep's `[run] ack_wait_s`).
    pub(crate) fn pace_by(&self, pool: &str, consumer: &PullConsumer) {
        let wait = halyard_broker::consumer_ack_wait(consumer);
        let ms = ack_wait_millis(wait);
        let before = self.ack_wait_ms.fetch_min(ms, std::sync::atomic::Ordering::Relaxed);
        if ms < before {
            info!(pool, ack_wait = ?wait, worker_ack_wait = ?Duration::from_millis(before), "the pool's consumer waits less for acks than this worker's setting; in-progress acks are paced by it");
        }
    }

    /// The cache policy of the model `m` (its backend's default unless its sweep says
    /// otherwise: [`halyard_proto::CachePolicy::default_for`]).
    pub(crate) fn cache_policy(&self, m: &halyard_proto::ModelRef) -> halyard_proto::CachePolicy {
        self.cache_policies
            .iter()
            .find(|(r, _)| r == m)
            .map(|(_, p)| *p)
            .unwrap_or_else(|| halyard_proto::CachePolicy::default_for(&m.backend))
    }

    pub(super) fn job_lock(&self, id: JobId) -> Arc<tokio::sync::Mutex<()>> {
        let mut m = self.running.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(id).or_default().clone()
    }

    pub(super) fn release(&self, id: JobId, lock: Arc<tokio::sync::Mutex<()>>) {
        let mut m = self.running.lock().unwrap_or_else(|p| p.into_inner());
        // Two references: ours and the map's. Anyone else still waiting keeps it alive.
        if Arc::strong_count(&lock) <= 2 {
            m.remove(&id);
        }
    }
}

/// Publish a result through the outbox (batched with the others ready) and wait for
/// the broker's ack of the message holding it.
pub(crate) async fn publish(
    ctx: &PoolCtx,
    job: &Job,
    outcome: Outcome,
    deliveries: u64,
    cached: bool,
) -> Event {
    let result = JobResult {
        v: halyard_proto::WIRE_VERSION,
        job: job.id,
        run: job.run,
        outcome,
        deliveries,
        worker: ctx.worker_id.clone(),
        cached,
    };
    let encoded = match halyard_proto::encode(&result) {
        Ok(p) => p,
        Err(e) => {
            warn!(job = %job.id, error = %e, "cannot encode result");
            return Event::PublishFailed;
        }
    };
    if ctx.outbox.publish(job.run, job.pool.as_str().into(), job.id, encoded).await {
        Event::Published
    } else {
        Event::PublishFailed
    }
}

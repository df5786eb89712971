//! The coordinator's side of the shared result cache (issue 51, `halyard_cache::shared`):
//! every result it accepted for a job it planned, from a pool whose models all write to
//! the cache, is offered to the broker's `halyard_cache` bucket. Only the coordinator role
//! writes that bucket; workers read it.
//!
//! Offers go through a bounded channel to one task ([`Sharer`]), which opens the bucket
//! (creating it if missing) and puts each entry; a full channel drops the offer (the
//! entry is only not shared), so the run's results path never waits on the cache.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};

use halyard_broker::Broker;
use halyard_plan::sweep::Sweep;
use halyard_proto::{Completion, JobId, Outcome};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use uuid::Uuid;

const QUEUE: usize = 8192;

/// Whether this process's coordinators share their results (off unless the process says
/// so: `halyard coordinator`, and `halyard run --nats`, whose broker other runs share; a
/// private broker's bucket would serve nobody else).
static SHARING: AtomicBool = AtomicBool::new(false);

/// Turn sharing on or off for the coordinators this process runs from now on.
pub fn set_sharing(on: bool) {
    SHARING.store(on, Ordering::Relaxed);
}

/// Whether sharing is on ([`set_sharing`]).
pub fn sharing() -> bool {
    SHARING.load(Ordering::Relaxed)
}

/// Handle to the sharing task; the task ends when the handle is dropped.
pub(crate) struct Sharer {
    tx: mpsc::Sender<(JobId, Completion)>,
    /// The pools whose every model writes to the cache.
    pools: HashSet<String>,
    task: JoinHandle<()>,
}

impl Sharer {
    /// Start sharing the accepted results of `run`'s pools that write to the cache.
    pub(crate) fn start(broker: Broker, run: Uuid, sweep: &Sweep) -> Sharer {
        let mut pools: HashSet<String> = sweep.models.iter().map(|m| m.spec.pool.clone()).collect();
        for m in &sweep.models {
            if !m.cache.writes() {
                pools.remove(&m.spec.pool);
            }
        }
        let (tx, mut rx) = mpsc::channel::<(JobId, Completion)>(QUEUE);
        let task = tokio::spawn(async move {
            let writer = match halyard_cache::shared::SharedWriter::open(&broker).await {
                Ok(w) => w,
                Err(e) => {
                    tracing::warn!(error = %e, "the shared result cache cannot be used; results are not shared");
                    return;
                }
            };
            while let Some((job, c)) = rx.recv().await {
                writer.put(run, job, &c).await;
            }
        });
        Sharer { tx, pools, task }
    }

    /// Whether results of `pool` are shared.
    pub(crate) fn shares(&self, pool: &str) -> bool {
        self.pools.contains(pool)
    }

    /// Offer the accepted outcome of `job` (a completion is shared; a dead letter is not).
    pub(crate) fn offer(&self, job: JobId, outcome: Outcome) {
        if let Outcome::Done(c) = outcome {
            // Full: not shared, never waited for.
            let _ = self.tx.try_send((job, c));
        }
    }
}

impl Sharer {
    /// Share what is queued (at most `within`), then stop.
    pub(crate) async fn close(self, within: std::time::Duration) {
        let Sharer { tx, task, .. } = self;
        drop(tx);
        let abort = task.abort_handle();
        if tokio::time::timeout(within, task).await.is_err() {
            abort.abort();
            tracing::info!("results still queued for the shared result cache were not shared");
        }
    }
}

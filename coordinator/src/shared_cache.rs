//! The coordinator's side of the shared result cache (issue 51, `halyard_cache::shared`):
//! every result it accepted for a job it planned, from a pool whose models all write to
//! the cache, is offered to the broker's `halyard_cache` bucket. Only the coordinator role
//! writes that bucket; workers read it.
//!
//! Offers go through a bounded channel to one task ([`Sharer`]), which opens the bucket
//! (creating it if missing) and puts the entries, up to [`IN_FLIGHT`] at once (each put
//! is a broker round trip; one at a time, a fast sweep's results outran them). A full
//! channel drops the offer (the entry is only not shared; said once, and counted when
//! the run ends), so the run's results path never waits on the cache. A result a worker
//! read from the shared cache is not offered again: the bucket has it.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use futures::StreamExt;

use halyard_broker::Broker;
use halyard_plan::sweep::Sweep;
use halyard_proto::{Completion, JobId, Outcome};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use uuid::Uuid;

const QUEUE: usize = 8192;
/// Puts awaiting the broker's answer at once: with 32, a million noop results (25,000 a
/// second) still overflowed the queue (27% not shared); with 256, none did.
const IN_FLIGHT: usize = 256;

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
    /// Offers dropped because the queue was full.
    dropped: AtomicU64,
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
            let mut puts = futures::stream::FuturesUnordered::new();
            let mut open = true;
            while open || !puts.is_empty() {
                tokio::select! {
                    offer = rx.recv(), if open && puts.len() < IN_FLIGHT => match offer {
                        Some((job, c)) => {
                            let w = writer.clone();
                            puts.push(async move { w.put(run, job, &c).await });
                        }
                        None => open = false,
                    },
                    Some(()) = puts.next(), if !puts.is_empty() => {}
                }
            }
        });
        Sharer { tx, pools, task, dropped: AtomicU64::new(0) }
    }

    /// Whether results of `pool` are shared.
    pub(crate) fn shares(&self, pool: &str) -> bool {
        self.pools.contains(pool)
    }

    /// Offer the accepted outcome of `job` (a completion is shared; a dead letter is not,
    /// nor a completion the worker read from the shared cache).
    pub(crate) fn offer(&self, job: JobId, outcome: Outcome) {
        let Outcome::Done(c) = outcome else { return };
        if c.source == halyard_proto::AnswerSource::SharedCache {
            return;
        }
        // Full: not shared, never waited for.
        if self.tx.try_send((job, c)).is_err() && self.dropped.fetch_add(1, Ordering::Relaxed) == 0
        {
            tracing::warn!("results arrive faster than the shared result cache takes them: some accepted results are not shared (the run keeps them; said once, counted at the end)");
        }
    }
}

impl Sharer {
    /// Share what is queued (at most `within`), then stop.
    pub(crate) async fn close(self, within: std::time::Duration) {
        let Sharer { tx, task, dropped, .. } = self;
        drop(tx);
        let dropped = dropped.into_inner();
        if dropped > 0 {
            tracing::warn!(dropped, "accepted results not shared: they came faster than the shared result cache took them");
        }
        let abort = task.abort_handle();
        if tokio::time::timeout(within, task).await.is_err() {
            abort.abort();
            tracing::info!("results still queued for the shared result cache were not shared");
        }
    }
}

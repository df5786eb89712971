//! What a coordinator publishes while it runs (`<run>/status.json` and the broker's
//! `halyard_status` bucket), and the workers' heartbeats (`halyard_workers`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use halyard_broker::status::{self as kv, KvStore};
use halyard_broker::Broker;
use halyard_plan::progress::Progress;
use halyard_worker::Stats;
use tokio::sync::watch;

use super::{unix_ms, Status, WorkerBeat};

/// How often the coordinator's status is written.
const STATUS_EVERY: Duration = Duration::from_secs(1);
const BEAT_EVERY: Duration = Duration::from_secs(5);

/// Publishes a coordinator's status while it runs; [`StatusWriter::finish`] writes the last one.
pub struct StatusWriter {
    name: String,
    run_dir: PathBuf,
    /// The status bucket, once the coordinator has made it (`halyard_broker::layout`).
    store: Arc<tokio::sync::OnceCell<KvStore>>,
    rx: watch::Receiver<Progress>,
    started: Instant,
    pools: Vec<String>,
    task: tokio::task::JoinHandle<()>,
    opener: tokio::task::JoinHandle<()>,
    done_at_start: Arc<std::sync::Mutex<Option<u64>>>,
}

fn write_json_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(tmp, path)
}

/// The status of `p` now, with the rate measured since this process started.
fn snapshot(
    name: &str,
    p: &Progress,
    state: &str,
    started: Instant,
    done_at_start: Option<u64>,
    pools: &[String],
) -> Status {
    let elapsed = started.elapsed().as_secs_f64();
    let mut s = Status::from_progress(name, p, state, elapsed);
    if let Some(d0) = done_at_start {
        let done = p.figures.items_done.saturating_sub(d0);
        if done > 0 && elapsed > 0.0 {
            let rate = done as f64 / elapsed;
            s.rate_items_per_s = Some(rate);
            s.eta_s =
                Some(p.figures.items_total.saturating_sub(p.figures.items_done) as f64 / rate);
        }
    }
    s.pool_names = pools.to_vec();
    s
}

async fn publish(s: &Status, run_dir: &Path, store: Option<&KvStore>) {
    let Ok(bytes) = serde_json::to_vec_pretty(s) else { return };
    if let Err(e) = write_json_atomic(&run_dir.join("status.json"), &bytes) {
        tracing::debug!(error = %e, "cannot write status.json");
    }
    if let Some(store) = store {
        if let Err(e) = kv::put(store, &s.name, bytes).await {
            tracing::debug!(error = %e, "cannot publish status");
        }
    }
}

impl StatusWriter {
    pub async fn start(
        name: &str,
        run_dir: &Path,
        broker: &Broker,
        rx: watch::Receiver<Progress>,
        pools: Vec<String>,
    ) -> StatusWriter {
        let store = Arc::new(tokio::sync::OnceCell::new());
        // The bucket is opened beside the writes: the coordinator makes it after this
        // starts (status.json is written meanwhile).
        let (b, cell) = (broker.clone(), store.clone());
        let opener = tokio::spawn(async move {
            match kv::bucket(&b, halyard_broker::layout::STATUS).await {
                Ok(s) => {
                    let _ = cell.set(s);
                }
                Err(e) => tracing::warn!(
                    error = %e,
                    "run status will not be published on the broker (status.json only)"
                ),
            }
        });
        let started = Instant::now();
        let done_at_start: Arc<std::sync::Mutex<Option<u64>>> = Arc::default();
        let (n, dir, st, mut r, d0, pl) = (
            name.to_string(),
            run_dir.to_path_buf(),
            store.clone(),
            rx.clone(),
            done_at_start.clone(),
            pools.clone(),
        );
        let task = tokio::spawn(async move {
            loop {
                let p = r.borrow_and_update().clone();
                // The first progress with a run id carries the items done before this process.
                let d = {
                    let mut g = d0.lock().unwrap_or_else(|e| e.into_inner());
                    if g.is_none() && p.run.is_some() {
                        *g = Some(p.figures.items_done);
                    }
                    *g
                };
                if p.run.is_some() {
                    publish(&snapshot(&n, &p, "running", started, d, &pl), &dir, st.get()).await;
                }
                tokio::time::sleep(STATUS_EVERY).await;
                if r.has_changed().is_err() {
                    return;
                }
            }
        });
        StatusWriter {
            name: name.to_string(),
            run_dir: run_dir.to_path_buf(),
            store,
            rx,
            started,
            pools,
            task,
            opener,
            done_at_start,
        }
    }

    /// Stop the periodic writes and publish the final state (`complete`, `interrupted`, `cost_limit`).
    pub async fn finish(self, state: &str) {
        self.task.abort();
        self.opener.abort();
        let p = self.rx.borrow().clone();
        if p.run.is_none() {
            return;
        }
        let d = *self.done_at_start.lock().unwrap_or_else(|e| e.into_inner());
        publish(
            &snapshot(&self.name, &p, state, self.started, d, &self.pools),
            &self.run_dir,
            self.store.get(),
        )
        .await;
    }
}

/// Beat for a worker every few seconds until the returned task is aborted.
pub fn heartbeat(
    broker: &Broker,
    worker: String,
    pools: Vec<(String, usize)>,
    stats: Arc<Stats>,
) -> tokio::task::JoinHandle<()> {
    let broker = broker.clone();
    tokio::spawn(async move {
        // Waits for the coordinator to make the bucket (`halyard_broker::layout`).
        let store = match kv::bucket(&broker, halyard_broker::layout::WORKERS).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "worker heartbeat disabled");
                return;
            }
        };
        loop {
            let beat = WorkerBeat {
                worker: worker.clone(),
                pools: pools.clone(),
                calls: stats.calls.get(),
                completed: stats.completed.get(),
                replayed: stats.replayed.get(),
                dead_letters: stats.dead_letters.get(),
                rate_limited: stats.rate_limited.get(),
                updated_unix_ms: unix_ms(),
                servers: stats.servers.snapshot(),
            };
            if let Ok(b) = serde_json::to_vec(&beat) {
                if let Err(e) = kv::put(&store, &worker, b).await {
                    tracing::debug!(error = %e, "heartbeat not published");
                }
            }
            tokio::time::sleep(BEAT_EVERY).await;
        }
    })
}

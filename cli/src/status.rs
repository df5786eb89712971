//! Live status of runs: what the coordinator publishes (`<run>/status.json` and the
//! `halyard_status` bucket on the broker), the workers' heartbeats (`halyard_workers`),
//! and `halyard status`, which reads them from any machine.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use halyard_broker::status::{self as kv, KvStore};
use halyard_broker::Broker;
use halyard_coordinator::progress::{pool_status, unix_ms, PoolStatus, Status, WorkerBeat};
use halyard_coordinator::Progress;
use halyard_worker::Stats;
use tokio::sync::watch;

/// How often the coordinator's status is written.
const STATUS_EVERY: Duration = Duration::from_secs(1);
const BEAT_EVERY: Duration = Duration::from_secs(5);

/// Publishes a coordinator's status while it runs; [`StatusWriter::finish`] writes the last one.
pub struct StatusWriter {
    name: String,
    run_dir: PathBuf,
    store: Option<KvStore>,
    rx: watch::Receiver<Progress>,
    started: Instant,
    pools: Vec<String>,
    task: tokio::task::JoinHandle<()>,
    done_at_start: Arc<std::sync::Mutex<Option<u64>>>,
}

fn write_json_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(tmp, path)
}

/// The status of `p` now, with the rate measured since this process started.
fn snapshot(name: &str, p: &Progress, state: &str, started: Instant, done_at_start: Option<u64>, pools: &[String]) -> Status {
    let elapsed = started.elapsed().as_secs_f64();
    let mut s = Status::from_progress(name, p, state, elapsed);
    if let Some(d0) = done_at_start {
        let done = p.items_done.saturating_sub(d0);
        if done > 0 && elapsed > 0.0 {
            let rate = done as f64 / elapsed;
            s.rate_items_per_s = Some(rate);
            s.eta_s = Some(p.items_total.saturating_sub(p.items_done) as f64 / rate);
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
    pub async fn start(name: &str, run_dir: &Path, broker: &Broker, rx: watch::Receiver<Progress>, pools: Vec<String>) -> StatusWriter {
        let store = match kv::bucket(broker, kv::STATUS_BUCKET, kv::STATUS_MAX_AGE).await {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "run status will not be published on the broker (status.json only)");
                None
            }
        };
        let started = Instant::now();
        let done_at_start: Arc<std::sync::Mutex<Option<u64>>> = Arc::default();
        let (n, dir, st, mut r, d0, pl) = (name.to_string(), run_dir.to_path_buf(), store.clone(), rx.clone(), done_at_start.clone(), pools.clone());
        let task = tokio::spawn(async move {
            loop {
                let p = r.borrow_and_update().clone();
                // The first progress with a run id carries the items done before this process.
                let d = {
                    let mut g = d0.lock().unwrap_or_else(|e| e.into_inner());
                    if g.is_none() && p.run.is_some() {
                        *g = Some(p.items_done);
                    }
                    *g
                };
                if p.run.is_some() {
                    publish(&snapshot(&n, &p, "running", started, d, &pl), &dir, st.as_ref()).await;
                }
                tokio::time::sleep(STATUS_EVERY).await;
                if r.has_changed().is_err() {
                    return;
                }
            }
        });
        StatusWriter { name: name.to_string(), run_dir: run_dir.to_path_buf(), store, rx, started, pools, task, done_at_start }
    }

    /// Stop the periodic writes and publish the final state (`complete`, `interrupted`, `cost_limit`).
    pub async fn finish(self, state: &str) {
        self.task.abort();
        let p = self.rx.borrow().clone();
        if p.run.is_none() {
            return;
        }
        let d = *self.done_at_start.lock().unwrap_or_else(|e| e.into_inner());
        publish(&snapshot(&self.name, &p, state, self.started, d, &self.pools), &self.run_dir, self.store.as_ref()).await;
    }
}

/// Beat for a worker every few seconds until the returned task is aborted.
pub async fn heartbeat(broker: &Broker, worker: String, pools: Vec<(String, usize)>, stats: Arc<Stats>) -> Option<tokio::task::JoinHandle<()>> {
    let store = match kv::bucket(broker, kv::WORKERS_BUCKET, kv::WORKER_MAX_AGE).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "worker heartbeat disabled");
            return None;
        }
    };
    Some(tokio::spawn(async move {
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
            };
            if let Ok(b) = serde_json::to_vec(&beat) {
                if let Err(e) = kv::put(&store, &worker, b).await {
                    tracing::debug!(error = %e, "heartbeat not published");
                }
            }
            tokio::time::sleep(BEAT_EVERY).await;
        }
    }))
}

/// Where `halyard status` looks.
pub struct StatusArgs {
    pub run: Option<String>,
    pub nats: Option<String>,
    pub auth: halyard_broker::auth::NatsAuth,
    pub out: PathBuf,
    pub json: bool,
}

fn read_status_file(path: &Path) -> Result<Status> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not a Halyard status file", path.display()))
}

/// The statuses asked for: from the broker with --nats, else from status.json files.
async fn collect(a: &StatusArgs) -> Result<Vec<Status>> {
    if let Some(url) = &a.nats {
        let broker = halyard_broker::connect(&halyard_broker::BrokerConfig::new(url.clone(), "halyard-status").with_auth(a.auth.clone())).await?;
        let mut out = Vec::new();
        for (key, bytes) in kv::entries(&broker, kv::STATUS_BUCKET).await? {
            if a.run.as_deref().is_some_and(|r| kv::kv_key(r) != key) {
                continue;
            }
            match serde_json::from_slice::<Status>(&bytes) {
                Ok(s) => out.push(s),
                Err(e) => tracing::warn!(key, error = %e, "unreadable status entry"),
            }
        }
        let beats: Vec<WorkerBeat> =
            kv::entries(&broker, kv::WORKERS_BUCKET).await?.into_iter().filter_map(|(_, b)| serde_json::from_slice(&b).ok()).collect();
        for s in &mut out {
            s.pools = pool_status(&broker, &s.pool_names).await;
            attach_workers(&mut s.pools, &beats);
        }
        if out.is_empty() {
            match &a.run {
                Some(r) => anyhow::bail!("no run {r:?} has published a status on {url}"),
                None => anyhow::bail!("no run has published a status on {url}"),
            }
        }
        return Ok(out);
    }
    // Without a broker: RUN is a run directory, a status.json, or a name under --out.
    let candidates: Vec<PathBuf> = match &a.run {
        Some(r) => {
            let p = PathBuf::from(r);
            vec![p.clone(), p.join("status.json"), a.out.join(r).join("status.json")]
        }
        None => std::fs::read_dir(&a.out)
            .with_context(|| format!("cannot list {} (give RUN, --out or --nats)", a.out.display()))?
            .flatten()
            .map(|e| e.path().join("status.json"))
            .collect(),
    };
    let mut out = Vec::new();
    for c in candidates.iter().filter(|c| c.is_file()) {
        out.push(read_status_file(c)?);
        if a.run.is_some() {
            break;
        }
    }
    if out.is_empty() {
        anyhow::bail!(
            "no status found ({}); a run writes status.json in its directory, or give --nats URL",
            candidates.iter().map(|c| c.display().to_string()).collect::<Vec<_>>().join(", ")
        );
    }
    Ok(out)
}

/// Live workers of each pool, from their heartbeats.
fn attach_workers(pools: &mut [PoolStatus], beats: &[WorkerBeat]) {
    let now = unix_ms();
    for p in pools {
        p.workers = beats
            .iter()
            .filter(|b| now.saturating_sub(b.updated_unix_ms) <= kv::WORKER_MAX_AGE.as_millis() as u64)
            .filter(|b| b.pools.iter().any(|(name, _)| *name == p.pool))
            .map(|b| b.worker.clone())
            .collect();
    }
}

pub fn duration(s: f64) -> String {
    let s = s.max(0.0) as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// The human view of one status.
pub fn render(s: &Status) -> String {
    let mut o = String::new();
    let age = unix_ms().saturating_sub(s.updated_unix_ms) as f64 / 1000.0;
    o.push_str(&format!(
        "run {} ({}): {}, updated {} ago, coordinator up {}\n",
        s.name,
        s.run.as_deref().unwrap_or("?"),
        s.state,
        duration(age),
        duration(s.elapsed_s)
    ));
    let pct = if s.items_total == 0 { 0.0 } else { s.items_done as f64 * 100.0 / s.items_total as f64 };
    o.push_str(&format!("  items {}/{} ({pct:.1}%)", s.items_done, s.items_total));
    if let (Some(r), Some(eta)) = (s.rate_items_per_s, s.eta_s) {
        o.push_str(&format!(", {r:.2} items/s, ETA {}", duration(eta)));
    }
    o.push('\n');
    for t in &s.targets {
        let pct = if t.total == 0 { 0.0 } else { t.done as f64 * 100.0 / t.total as f64 };
        o.push_str(&format!("    benchmark {} {} / {}: {}/{} ({pct:.1}%)\n", t.bench, t.pipeline, t.model, t.done, t.total));
    }
    o.push_str(&format!(
        "  jobs: {} published, {} results, {} dead letters, {} retries, {} duplicates, {} held by the cost limit\n",
        s.published,
        s.results,
        s.dead_letters,
        s.retries(),
        s.duplicates,
        s.held
    ));
    o.push_str(&format!("  cost: ${:.4}", s.spent));
    if let Some(m) = s.max_cost {
        o.push_str(&format!(" of ${m:.2} limit"));
    }
    o.push('\n');
    for c in &s.costs {
        o.push_str(&format!(
            "    {} / {}: {} jobs, {} calls, {} retries, {} + {} tokens, ${:.4}\n",
            c.model, c.stage, c.jobs, c.calls, c.retries, c.prompt_tokens, c.completion_tokens, c.cost
        ));
    }
    if !s.pools.is_empty() {
        o.push_str("  pools:\n");
        for p in &s.pools {
            o.push_str(&format!(
                "    {}: {} queued, {} in flight, {} waiting pulls, {} live workers{}\n",
                p.pool,
                p.pending,
                p.in_flight,
                p.waiting_pulls,
                p.workers.len(),
                if p.workers.is_empty() { String::new() } else { format!(" ({})", p.workers.join(", ")) }
            ));
        }
    }
    o
}

pub async fn status(a: StatusArgs) -> Result<u8> {
    let statuses = collect(&a).await?;
    if a.json {
        let v = if a.run.is_some() && statuses.len() == 1 { serde_json::to_string_pretty(&statuses[0])? } else { serde_json::to_string_pretty(&statuses)? };
        println!("{v}");
    } else {
        for s in &statuses {
            print!("{}", render(s));
        }
    }
    Ok(0)
}

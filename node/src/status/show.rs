//! `halyard status`: a run's status from the broker (with the live workers and the
//! queues of its pools) or from its `status.json`, shown for people or as JSON.

use std::path::{Path, PathBuf};

use halyard_proto::redact::terminal;

use halyard_broker::status as kv;

use super::{pool_status, unix_ms, PoolStatus, Status, WorkerBeat, WorkerServer};
use crate::NodeError;

/// Where `halyard status` looks.
pub struct StatusArgs {
    pub run: Option<String>,
    pub nats: Option<String>,
    pub auth: halyard_broker::auth::NatsAuth,
    pub out: PathBuf,
    pub json: bool,
}

fn read_status_file(path: &Path) -> Result<Status, NodeError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| NodeError::io(format!("cannot read {}", path.display()), e))?;
    serde_json::from_str(&text).map_err(|e| NodeError::Json {
        what: format!("{}: not a Halyard status file", path.display()),
        source: e,
    })
}

/// The statuses asked for: from the broker with --nats, else from status.json files.
async fn collect(a: &StatusArgs) -> Result<Vec<Status>, NodeError> {
    match &a.nats {
        Some(url) => from_broker(a, url).await,
        None => from_files(a),
    }
}

/// The statuses the coordinators published on the broker at `url`, with each pool's
/// queue and live workers.
async fn from_broker(a: &StatusArgs, url: &str) -> Result<Vec<Status>, NodeError> {
    let broker = halyard_broker::connect(
        &halyard_broker::BrokerConfig::new(url.to_string(), "halyard-status")
            .with_auth(a.auth.clone()),
    )
    .await?;
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
    let beats: Vec<WorkerBeat> = kv::entries(&broker, kv::WORKERS_BUCKET)
        .await?
        .into_iter()
        .filter_map(|(_, b)| serde_json::from_slice(&b).ok())
        .collect();
    let batches = halyard_broker::batches::summary(&broker, &[]).await;
    for s in &mut out {
        s.pools = pool_status(&broker, &s.pool_names).await;
        attach_workers(&mut s.pools, &beats);
        s.servers = servers_of(&s.pools, &beats);
        // Live, from the broker: the batches of this run's pools.
        s.figures.provider_batches =
            batches.iter().filter(|b| s.pool_names.contains(&b.pool)).cloned().collect();
    }
    if out.is_empty() {
        return Err(NodeError::NoStatus(match &a.run {
            Some(r) => format!("no run {r:?} has published a status on {url}"),
            None => format!("no run has published a status on {url}"),
        }));
    }
    Ok(out)
}

/// Without a broker: RUN is a run directory, a status.json, or a name under --out; all
/// runs under --out without RUN.
fn from_files(a: &StatusArgs) -> Result<Vec<Status>, NodeError> {
    let candidates: Vec<PathBuf> = match &a.run {
        Some(r) => {
            let p = PathBuf::from(r);
            vec![p.clone(), p.join("status.json"), a.out.join(r).join("status.json")]
        }
        None => std::fs::read_dir(&a.out)
            .map_err(|e| {
                NodeError::io(
                    format!("cannot list {} (give RUN, --out or --nats)", a.out.display()),
                    e,
                )
            })?
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
        return Err(NodeError::NoStatus(format!(
            "no status found ({}); a run writes status.json in its directory, or give --nats URL",
            candidates.iter().map(|c| c.display().to_string()).collect::<Vec<_>>().join(", ")
        )));
    }
    Ok(out)
}

/// Live workers of each pool, from their heartbeats.
fn attach_workers(pools: &mut [PoolStatus], beats: &[WorkerBeat]) {
    let now = unix_ms();
    for p in pools {
        p.workers = beats
            .iter()
            .filter(|b| {
                now.saturating_sub(b.updated_unix_ms) <= kv::WORKER_MAX_AGE.as_millis() as u64
            })
            .filter(|b| b.pools.iter().any(|(name, _)| *name == p.pool))
            .map(|b| b.worker.clone())
            .collect();
    }
}

/// The managed servers of the live workers serving `pools`.
fn servers_of(pools: &[PoolStatus], beats: &[WorkerBeat]) -> Vec<WorkerServer> {
    beats
        .iter()
        .filter(|b| pools.iter().any(|p| p.workers.contains(&b.worker)))
        .flat_map(|b| {
            b.servers.iter().map(|s| WorkerServer { worker: b.worker.clone(), server: s.clone() })
        })
        .collect()
}

/// A duration for people: `42s`, `3m07s`, `2h05m`.
pub fn duration(s: f64) -> String {
    let s = s.max(0.0) as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// The human view of one status. Every text in it came from the broker, where other
/// people's processes publish too: each is passed through [`terminal`] (issue 33), so no
/// escape sequence or line break in a worker's id or an error reaches the terminal.
pub fn render(s: &Status) -> String {
    let mut o = String::new();
    let age = unix_ms().saturating_sub(s.updated_unix_ms) as f64 / 1000.0;
    o.push_str(&format!(
        "run {} ({}): {}, updated {} ago, coordinator up {}\n",
        terminal(&s.name),
        terminal(s.run.as_deref().unwrap_or("?")),
        terminal(&s.state),
        duration(age),
        duration(s.elapsed_s)
    ));
    let pct = if s.figures.items_total == 0 {
        0.0
    } else {
        s.figures.items_done as f64 * 100.0 / s.figures.items_total as f64
    };
    o.push_str(&format!("  items {}/{} ({pct:.1}%)", s.figures.items_done, s.figures.items_total));
    if let (Some(r), Some(eta)) = (s.rate_items_per_s, s.eta_s) {
        o.push_str(&format!(", {r:.2} items/s, ETA {}", duration(eta)));
    }
    o.push('\n');
    for t in &s.figures.targets {
        let pct = if t.total == 0 { 0.0 } else { t.done as f64 * 100.0 / t.total as f64 };
        o.push_str(&format!(
            "    benchmark {} {} / {}: {}/{} ({pct:.1}%)\n",
            t.bench,
            terminal(&t.pipeline),
            terminal(&t.model),
            t.done,
            t.total
        ));
    }
    o.push_str(&format!(
        "  jobs: {} published, {} results, {} dead letters, {} retries, {} duplicates, {} held by the cost limit\n",
        s.figures.published,
        s.figures.results,
        s.figures.dead_letters,
        s.retries(),
        s.figures.duplicates,
        s.figures.held
    ));
    if s.figures.refused_messages > 0 {
        o.push_str(&format!(
            "  refused: {} results messages (undecodable, another run's, forged, or naming an unusable object)\n",
            s.figures.refused_messages
        ));
    }
    if s.figures.refused_results > 0 || s.figures.held_results > 0 {
        o.push_str(&format!(
            "  refused: {} results (from a pool that does not serve their job, or never asked for); {} held aside for jobs not planned yet\n",
            s.figures.refused_results, s.figures.held_results
        ));
    }
    o.push_str(&format!("  cost: ${:.4}", s.spent));
    if let Some(m) = s.figures.max_cost {
        o.push_str(&format!(" of ${m:.2} limit"));
    }
    let saved: f64 = s.figures.costs.iter().map(|c| c.saved).sum();
    let from_cache = |c: &halyard_plan::cost::ClassTotals| c.machine_cache + c.shared_cache;
    let cached = s.figures.costs.iter().any(|c| from_cache(c) > 0);
    if cached {
        o.push_str(&format!(", ${saved:.4} saved by the result cache"));
    }
    o.push('\n');
    for c in &s.figures.costs {
        o.push_str(&format!(
            "    {} / {}: {} jobs, {} calls, {} retries, {} + {} tokens, ${:.4}",
            terminal(&c.model),
            terminal(&c.stage),
            c.jobs,
            c.calls,
            c.retries,
            c.prompt_tokens,
            c.completion_tokens,
            c.cost
        ));
        // Issue 51: the jobs paid for and those the result cache answered (no call).
        if cached {
            o.push_str(&format!(
                "; {} paid, {} from the machine cache, {} from the shared cache, ${:.4} saved",
                c.paid, c.machine_cache, c.shared_cache, c.saved
            ));
        }
        o.push('\n');
    }
    if s.figures.unshared > 0 {
        o.push_str(&format!(
            "  shared result cache: {} accepted results not shared yet (the bucket was away or full); kept in the run state, shared when this run's coordinator starts again (`halyard run` of the sweep)\n",
            s.figures.unshared
        ));
    }
    for d in &s.figures.outages {
        o.push_str(&format!("  outage: {} — {}\n", terminal(&d.describe()), terminal(&d.error)));
    }
    if !s.figures.provider_batches.is_empty() {
        o.push_str("  provider batches:\n");
        for b in &s.figures.provider_batches {
            o.push_str(&format!(
                "    {}: {} {} batch{}, {} requests, oldest {}\n",
                terminal(&b.pool),
                b.batches,
                terminal(&b.state),
                if b.batches == 1 { "" } else { "es" },
                b.requests,
                duration(b.oldest_s)
            ));
        }
    }
    if !s.servers.is_empty() {
        o.push_str("  managed servers:\n");
        for w in &s.servers {
            let v = &w.server;
            let mut line = format!(
                "    {} on {}: {} ({}), {}, {} restart{}",
                terminal(&v.server),
                terminal(&w.worker),
                terminal(&v.kind),
                if v.gpus.is_empty() {
                    "no GPU".to_string()
                } else {
                    format!("GPUs {}", terminal(&v.gpus))
                },
                v.state.as_str(),
                v.restarts,
                if v.restarts == 1 { "" } else { "s" }
            );
            if let Some(r) = v.ready_s {
                line.push_str(&format!(", ready in {}", duration(r)));
            }
            if let Some(ver) = &v.version {
                line.push_str(&format!(", version {}", terminal(ver)));
            }
            if let Some(e) = &v.last_exit {
                line.push_str(&format!(", last exit: {}", terminal(e)));
            }
            o.push_str(&line);
            o.push('\n');
        }
    }
    if !s.pools.is_empty() {
        o.push_str("  pools:\n");
        for p in &s.pools {
            o.push_str(&format!(
                "    {}: {} queued, {} in flight, {} waiting pulls, {} live workers{}\n",
                terminal(&p.pool),
                p.pending,
                p.in_flight,
                p.waiting_pulls,
                p.workers.len(),
                if p.workers.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", terminal(&p.workers.join(", ")))
                }
            ));
        }
    }
    o
}

/// What `halyard status` prints: each status for people, or JSON (one object for one
/// named run, else an array).
pub async fn show(a: StatusArgs) -> Result<String, NodeError> {
    let statuses = collect(&a).await?;
    if !a.json {
        return Ok(statuses.iter().map(render).collect());
    }
    let json = if a.run.is_some() && statuses.len() == 1 {
        serde_json::to_string_pretty(&statuses[0])
    } else {
        serde_json::to_string_pretty(&statuses)
    };
    let v = json.map_err(|e| NodeError::Json { what: "status".into(), source: e })?;
    Ok(format!("{v}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 33: a run name, a worker id and a pool name published by someone else's
    /// process cannot clear, recolour or forge lines of `halyard status`.
    #[test]
    fn hostile_text_is_escaped() {
        let s = Status {
            name: "nice\u{1b}[2J".into(),
            state: "running\nrun fake: complete".into(),
            pools: vec![PoolStatus {
                pool: "p\u{9b}31m".into(),
                workers: vec!["w-1\r\u{202e}evil".into()],
                ..PoolStatus::default()
            }],
            ..Status::default()
        };
        let out = render(&s);
        assert!(!out.contains('\u{1b}') && !out.contains('\r') && !out.contains('\u{9b}'));
        assert!(!out.contains('\u{202e}'));
        assert!(!out.lines().any(|l| l.starts_with("run fake")), "{out}");
        assert!(out.contains("running\\u{a}run fake: complete"), "{out}");
    }
}

//! A run's status: one snapshot type ([`Status`]) that the coordinator writes
//! ([`writer`]: `status.json` and the broker's status bucket, with the workers'
//! heartbeats) and that `halyard status` reads ([`show`]), from any machine.

use halyard_plan::progress::{Figures, Progress};
use serde::{Deserialize, Serialize};

pub mod show;
pub mod writer;

pub use writer::{heartbeat, StatusWriter};

/// A point-in-time view of a run, serialisable (status.json, NATS, `halyard status --json`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub run: Option<String>,
    pub name: String,
    /// `running`, `complete`, `interrupted` or `cost_limit`.
    pub state: String,
    pub updated_unix_ms: u64,
    /// Seconds since this coordinator process started.
    pub elapsed_s: f64,
    /// The coordinator's figures ([`Progress`]'s `figures`), flattened: one type for
    /// every reader, not a copy field by field.
    #[serde(flatten)]
    pub figures: Figures,
    /// USD spent, summed over `costs`.
    pub spent: f64,
    /// Items finished per second by this coordinator process, and the time left at that rate.
    pub rate_items_per_s: Option<f64>,
    pub eta_s: Option<f64>,
    /// The sweep's pools.
    pub pool_names: Vec<String>,
    /// Filled by `halyard status` from the broker: live workers and queue per pool.
    #[serde(default)]
    pub pools: Vec<PoolStatus>,
    /// The managed servers of the live workers serving this run's pools (read from their
    /// heartbeats by `halyard status`).
    #[serde(default)]
    pub servers: Vec<WorkerServer>,
}

/// A managed server of a worker, as its heartbeat tells.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerServer {
    pub worker: String,
    pub server: halyard_worker::server::ServerStat,
}

/// A worker's heartbeat in the `halyard_workers` bucket.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerBeat {
    pub worker: String,
    /// Pool name → concurrency.
    pub pools: Vec<(String, usize)>,
    pub calls: u64,
    pub completed: u64,
    pub replayed: u64,
    pub dead_letters: u64,
    pub rate_limited: u64,
    pub updated_unix_ms: u64,
    /// Its managed servers (state, restarts, GPU set, ready time, version).
    #[serde(default)]
    pub servers: Vec<halyard_worker::server::ServerStat>,
}

/// A pool as the broker sees it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolStatus {
    pub pool: String,
    /// Jobs queued and not yet delivered.
    pub pending: u64,
    /// Jobs delivered and not yet acked (in flight at workers).
    pub in_flight: u64,
    /// Pull requests waiting at the broker (idle worker slots asking for work).
    pub waiting_pulls: u64,
    /// Workers with a live heartbeat serving this pool.
    pub workers: Vec<String>,
}

pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Status {
    pub fn from_progress(name: &str, p: &Progress, state: &str, elapsed_s: f64) -> Status {
        Status {
            run: p.run.map(|r| r.to_string()),
            name: name.to_string(),
            state: state.to_string(),
            updated_unix_ms: unix_ms(),
            elapsed_s,
            spent: p.figures.spent(),
            figures: p.figures.clone(),
            rate_items_per_s: None,
            eta_s: None,
            pool_names: Vec::new(),
            pools: Vec::new(),
            servers: Vec::new(),
        }
    }

    /// Retries and calls summed over models.
    pub fn retries(&self) -> u64 {
        self.figures.costs.iter().map(|c| c.retries).sum()
    }
}

/// Queue figures of `pools` from the broker (consumers not yet created read as empty).
pub async fn pool_status(broker: &halyard_broker::Broker, pools: &[String]) -> Vec<PoolStatus> {
    let mut out = Vec::new();
    let stream = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        broker.js.get_stream(halyard_proto::subjects::JOBS_STREAM),
    )
    .await;
    let Ok(Ok(stream)) = stream else { return out };
    for pool in pools {
        let name = halyard_proto::subjects::pool_consumer(pool);
        let mut s = PoolStatus { pool: pool.clone(), ..Default::default() };
        if let Ok(Ok(info)) =
            tokio::time::timeout(std::time::Duration::from_secs(2), stream.consumer_info(&name))
                .await
        {
            s.pending = info.num_pending;
            s.in_flight = info.num_ack_pending as u64;
            s.waiting_pulls = info.num_waiting as u64;
        }
        out.push(s);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The status file is one flat JSON object, as before the figures got a type of their
    /// own, and a file written by an earlier build (`batches`) still reads.
    #[test]
    fn status_is_flat_and_reads_earlier_files() {
        let mut s = Status { name: "r".into(), state: "running".into(), ..Default::default() };
        s.figures.items_done = 3;
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["items_done"], 3);
        assert!(v.get("figures").is_none() && v.get("provider_batches").is_some());
        let back: Status = serde_json::from_value(v).unwrap();
        assert_eq!(back, s);
        let old = r#"{"run":null,"name":"r","state":"running","updated_unix_ms":1,"elapsed_s":0.0,
            "items_done":1,"items_total":2,"results":1,"dead_letters":0,"published":1,
            "duplicates":0,"active":1,"targets":[],"costs":[],"spent":0.0,"max_cost":null,
            "held":0,"rate_items_per_s":null,"eta_s":null,"pool_names":[],
            "batches":[{"pool":"p","state":"in_progress","batches":2,"requests":5,"oldest_s":1.5}]}"#;
        let s: Status = serde_json::from_str(old).unwrap();
        assert_eq!((s.figures.items_total, s.figures.provider_batches.len()), (2, 1));
    }
}

//! Each managed server as `/metrics` and `halyard status` show it.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

/// Where a managed server is in its life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerState {
    /// Started, not answering its ready path yet.
    #[default]
    Starting,
    /// Answering: the pool takes jobs for it.
    Ready,
    /// Exited; waiting for its restart (the pool is paused while no server of the model
    /// is ready).
    Restarting,
    /// Being stopped (SIGTERM to its process group).
    Stopping,
    /// Stopped with the worker.
    Stopped,
    /// Given up on: it never became ready, or kept crashing (the worker stops).
    Failed,
}

impl ServerState {
    pub const ALL: [ServerState; 6] = [
        ServerState::Starting,
        ServerState::Ready,
        ServerState::Restarting,
        ServerState::Stopping,
        ServerState::Stopped,
        ServerState::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ServerState::Starting => "starting",
            ServerState::Ready => "ready",
            ServerState::Restarting => "restarting",
            ServerState::Stopping => "stopping",
            ServerState::Stopped => "stopped",
            ServerState::Failed => "failed",
        }
    }
}

/// One managed server (one model on one GPU set) of a worker.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerStat {
    /// `<model>@gpu0,1`, or `<model>@cpu`.
    pub server: String,
    pub model: String,
    /// `vllm`, `sglang`, `llama-server`, `tgi`, or the program's name.
    pub kind: String,
    pub state: ServerState,
    /// `0,1`; empty for a CPU server.
    pub gpus: String,
    pub pid: Option<u32>,
    pub port: Option<u16>,
    /// Restarts after a crash.
    pub restarts: u64,
    /// Seconds the latest start took to become ready.
    pub ready_s: Option<f64>,
    /// When it last became ready (Unix ms).
    pub ready_since_ms: Option<u64>,
    /// The version the server reports (its version path), if it tells.
    pub version: Option<String>,
    /// The command as last started.
    pub command: Vec<String>,
    /// Its log file.
    pub log: String,
    /// How it last ended, if it did.
    pub last_exit: Option<String>,
}

/// Every managed server of a worker, by [`ServerStat::server`].
#[derive(Debug, Default)]
pub struct ServerStats {
    servers: Mutex<BTreeMap<String, ServerStat>>,
}

impl ServerStats {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, ServerStat>> {
        self.servers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Change server `name`'s entry (created if new).
    pub fn update(&self, name: &str, f: impl FnOnce(&mut ServerStat)) {
        let mut m = self.lock();
        let s = m
            .entry(name.to_string())
            .or_insert_with(|| ServerStat { server: name.to_string(), ..Default::default() });
        f(s)
    }

    pub fn snapshot(&self) -> Vec<ServerStat> {
        self.lock().values().cloned().collect()
    }
}

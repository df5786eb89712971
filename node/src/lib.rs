//! # halyard-node: the processes behind the `halyard` binary
//!
//! The binary (`cli/`) parses the command line and calls one function here per
//! subcommand; everything that runs for a while takes its configuration and a shutdown
//! signal (`run(config, shutdown)`), so tests and other programs can drive it in-process.
//!
//! ## Layout
//! - [`supervisor`]: `halyard run`: a private `nats-server` (unless a broker is given), a
//!   coordinator and a local worker in one process, stopped together.
//! - [`coordinator`]: `halyard coordinator`, and what surrounds a coordinator in both
//!   commands: its metrics endpoint, its status writer, its final status, and the exit
//!   status of its outcome.
//! - [`worker`]: `halyard worker`: a worker configured from a sweep or from flags, with
//!   its heartbeat and metrics.
//! - [`status`]: a run's status snapshot ([`status::Status`]), written by the
//!   coordinator (`status.json` and the broker's status bucket), the workers'
//!   heartbeats, and `halyard status`, which reads them.
//! - [`metrics`]: the Prometheus `/metrics` endpoint; [`display`]: progress bars or
//!   progress log lines; [`shutdown`]: signals.
//! - [`retry_failed`], [`leaderboard`] and [`gc`]: `halyard retry-failed`, `halyard report`
//!   and `halyard gc`.

use std::path::PathBuf;

use halyard_plan::sweep::{self, Sweep};

pub mod broker_init;
pub mod coordinator;
pub mod deploy_k8s;
pub mod display;
pub mod gc;
pub mod labels_import;
pub mod leaderboard;
pub mod metrics;
pub mod retry_failed;
pub mod shutdown;
pub mod status;
pub mod supervisor;
pub mod view;
pub mod worker;

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Sweep(#[from] sweep::SweepError),
    #[error(transparent)]
    Coordinator(#[from] halyard_coordinator::CoordinatorError),
    #[error(transparent)]
    Broker(#[from] halyard_broker::BrokerError),
    #[error(transparent)]
    Worker(#[from] halyard_worker::WorkerError),
    #[error(transparent)]
    Checkpoint(#[from] halyard_worker::checkpoint::CheckpointError),
    /// A value given on the command line that cannot be used; the message names it.
    #[error("{0}")]
    Usage(String),
    /// A file or socket operation, described by `what`.
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A stop signal came before the broker answered: nothing had started (exit 130).
    #[error("stopped before the broker at {0} answered; nothing had started")]
    StoppedBeforeStart(String),
    /// The local worker of `halyard run` stopped with an error or panicked.
    #[error("local worker failed: {0}")]
    LocalWorker(String),
    /// `halyard status` found nothing to show (the message says where it looked).
    #[error("{0}")]
    NoStatus(String),
    /// A file that is not what it should be (`what` names it).
    #[error("{what}")]
    Json {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    /// An error wrapped with where it happened (as `anyhow`'s context would).
    #[error("{context}")]
    Context {
        context: String,
        #[source]
        source: Box<NodeError>,
    },
}

impl NodeError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> NodeError {
        NodeError::Io { what: what.into(), source }
    }

    /// This error, preceded by `context` (the cause stays in the chain).
    pub fn context(self, context: impl Into<String>) -> NodeError {
        NodeError::Context { context: context.into(), source: Box::new(self) }
    }
}

/// Read and check a sweep; `--max-cost` overrides its `[run] max_cost`.
pub fn load_sweep(path: &std::path::Path, max_cost: Option<f64>) -> Result<Sweep, NodeError> {
    let mut s = sweep::load(path)?;
    if let Some(c) = max_cost {
        if !(c.is_finite() && c >= 0.0) {
            return Err(NodeError::Usage(format!("--max-cost {c}: not an amount of USD (≥ 0)")));
        }
        s.run.max_cost = Some(c);
    }
    Ok(s)
}

/// A broker to connect to: its URL and credentials.
#[derive(Clone, Debug)]
pub struct Nats {
    pub url: String,
    pub auth: halyard_broker::auth::NatsAuth,
    /// Replicas of Halyard's streams and buckets (`--nats-replicas`); `None`: 1 on a lone
    /// server, else what JetStream can place (`halyard_broker::stream_replicas`).
    pub replicas: Option<usize>,
}

impl Nats {
    /// The connection settings of a process named `name` (the server's connection list).
    pub fn broker_config(self, name: impl Into<String>) -> halyard_broker::BrokerConfig {
        halyard_broker::BrokerConfig {
            replicas: self.replicas,
            ..halyard_broker::BrokerConfig::new(self.url, name).with_auth(self.auth)
        }
    }
}

/// The run directory of a sweep under `out`: `<out>/<sweep name>`, created if missing.
/// The run's log file in its directory: every log line at info, libraries' included.
pub const LOG_FILE: &str = "halyard.log";

pub fn run_dir(out: &std::path::Path, sweep: &Sweep) -> Result<PathBuf, NodeError> {
    let dir = out.join(&sweep.name);
    std::fs::create_dir_all(&dir).map_err(|e| {
        NodeError::io(format!("cannot create output directory {}", dir.display()), e)
    })?;
    let log = dir.join(LOG_FILE);
    if let Err(e) = display::log_to(&log) {
        tracing::warn!(file = %log.display(), error = %e, "cannot open the run's log file");
    }
    Ok(dir)
}

/// Connect to the broker, unless a stop comes first (a process waiting for a broker
/// that is down must still stop on SIGTERM): then [`NodeError::StoppedBeforeStart`].
pub async fn connect_or_stop(
    cfg: &halyard_broker::BrokerConfig,
    shutdown: &tokio::sync::watch::Receiver<bool>,
) -> Result<halyard_broker::Broker, NodeError> {
    tokio::select! {
        b = halyard_broker::connect(cfg) => Ok(b?),
        _ = shutdown::until(shutdown.clone()) => {
            Err(NodeError::StoppedBeforeStart(halyard_proto::redact::url(&cfg.url)))
        }
    }
}

/// The identity of a local model file, as a sweep's `identity` key takes it
/// (`halyard identity FILE`).
pub fn sweep_identity(path: &std::path::Path) -> std::io::Result<String> {
    halyard_plan::sweep::gguf_identity(path)
}

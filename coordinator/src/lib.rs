//! # halyard-coordinator: plans a run, collects its results, writes its report
//!
//! ## Layout
//! - [`sweep`]: the sweep file, parsed and checked (datasets included) before anything
//!   is published.
//! - [`state`]: run state in sled (run id, results, finished items, job metadata).
//! - `engine`: the planning and collecting loop.
//! - [`report`]: `report.json`, `report.md`, `labels.jsonl`.
//!
//! ## Planning is a pure function of known results
//! For each item (benchmark × model under test × dataset row) the pipeline's `evaluate`
//! says either "done, here is the label" or "waiting for these jobs". The coordinator
//! keeps no per-item state besides the final label: when a result arrives it looks up
//! the items waiting on that job and evaluates them again, publishing whatever jobs they
//! need next (answer → judge checks → retries → label).
//!
//! ## Recovery, in order
//! 1. Open the run state; the run id (UUID v7) is created once and reused.
//! 2. Create streams and the run's result consumer if missing (idempotent).
//! 3. Evaluate every unfinished item against the stored results; publish the jobs they
//!    wait for (`Nats-Msg-Id` = `<run>:<job>`, so JetStream drops re-publications of
//!    jobs still queued within its duplicate window).
//! 4. Consume results: store each (first one wins), flush, then ack the messages;
//!    re-evaluate the items that waited on them.
//! 5. When every item is finished, write the report.
//!
//! A crash at any point loses nothing: a result is acked only after it is flushed, and an
//! item's follow-up jobs are re-planned from stored results at the next start.

mod engine;
pub mod report;
pub mod state;
pub mod sweep;

use std::path::PathBuf;

pub use engine::{run, Progress, RunOutcome};

#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    #[error(transparent)]
    Sweep(#[from] sweep::SweepError),
    #[error(transparent)]
    State(#[from] state::StateError),
    #[error(transparent)]
    Broker(#[from] halyard_broker::BrokerError),
    #[error("cannot write report in {dir}: {reason}")]
    Report { dir: String, reason: String },
}

/// What a coordinator needs.
#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    pub sweep: sweep::Sweep,
    /// The run's directory: `<out>/<name>/`. State lives in `state/`, reports beside it.
    pub run_dir: PathBuf,
}

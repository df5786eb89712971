//! # halyard-coordinator: plans a run, collects its results, writes its report
//!
//! ## Layout
//! - [`sweep`]: the sweep file, parsed and checked (datasets included) before anything
//!   is published.
//! - [`state`]: run state in sled (run id, results, finished items, job metadata).
//! - `window`: the planning window (which items are planned, which jobs they wait on).
//! - `engine`: the planning and collecting loop.
//! - [`latency`]: publish-to-result latency histogram, reported in [`Progress`].
//! - [`report`]: `report.json`, `report.md`, `labels.jsonl`.
//!
//! ## Planning is a pure function of known results
//! For each item (benchmark × model under test × dataset row) the pipeline's `evaluate`
//! says either "done, here is the label" or "waiting for these jobs". The coordinator
//! keeps no per-item state besides the final label: when a result arrives it looks up
//! the items waiting on that job and evaluates them again, publishing whatever jobs they
//! need next (answer → judge checks → retries → label).
//!
//! ## Planning is lazy
//! Items are not all planned up front: per (benchmark, model under test) at most
//! `[run] window` items are planned and unfinished at a time, and more are planned as
//! they finish. Memory is bounded by the window, not by the run: a million-item run
//! holds a few thousand items in memory; results and labels live in sled.
//!
//! ## Recovery, in order
//! 1. Open the run state; the run id (UUID v7) is created once and reused.
//! 2. Create streams and the run's result consumer if missing (idempotent).
//! 3. Walk the items from the first, skipping finished ones; evaluate each unfinished
//!    item against the stored results and publish the jobs it waits for
//!    (`Nats-Msg-Id` = `<run>:<job>`, so JetStream drops re-publications of jobs still
//!    queued within its duplicate window), until the window is full.
//! 4. Consume results in batches: store each (first one wins), re-evaluate the items
//!    that waited on them, refill the window (step 3 continues), flush once, then ack
//!    the batch's messages.
//! 5. When every item is finished, write the report.
//!
//! A crash at any point loses nothing: a result is acked only after it is flushed, and an
//! item's follow-up jobs are re-planned from stored results at the next start. A result
//! that arrives for an item not yet back in the window is stored and found when the
//! walk reaches the item.

pub mod cost;
mod engine;
pub mod dead_letters;
pub mod html;
pub mod latency;
pub mod leaderboard;
pub mod progress;
pub mod report;
pub mod state;
pub mod sweep;
mod window;

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

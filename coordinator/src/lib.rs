//! # halyard-coordinator: plans a run, collects its results, writes its report
//!
//! ## Layout
//! - [`sweep`]: the sweep file, parsed and checked (datasets included) before anything
//!   is published: models, prices, quotas, `[run]`.
//! - [`benchmarks`]: one file per pipeline (its `[[benchmark]]` table, its evaluation,
//!   its report section) and the one dispatch over them.
//! - [`run`](mod@run): a run of the coordinator, split by role:
//!   - `run::planner`: the pure core: results in, effects out (store, publish), no IO;
//!   - `run::dispatcher`: publishes jobs (job batches, retries), reaps publish acks;
//!   - `run::collector`: pulls and decodes results, reads max-deliveries advisories;
//!   - `run::backlog` and `run::stall`: results that arrived while no coordinator ran,
//!     and jobs lost from the queue;
//!   - the cost limit: [`cost::Meter`].
//! - [`store`]: [`store::RunStore`], what the planner reads and writes, with the redb
//!   [`state::RunState`] and the in-memory [`store::MemStore`] the planner's tests use.
//! - `window`: the planning window (which items are planned, which jobs
//!   they wait on).
//! - [`progress`]: the live figures ([`Progress`]); [`latency`]: publish-to-result
//!   latency; [`cost`]: tokens, calls and money per model and stage.
//! - [`report`]: `report.json`, `report.md`, `labels.jsonl`, `report.html`, and the
//!   leaderboard over runs; [`dead_letters`]: listing and re-queueing them.
//!
//! ## Roles
//! DESIGN.md names the coordinator's roles Planner, Dispatcher, Collector, RunState and
//! Reporter. They are not actors here: one task runs them in turn (collect a batch, plan,
//! publish, commit), because the order between them *is* the durability contract (a
//! result is acked only after it is flushed, and it is flushed only after the jobs it
//! led to were handed to the dispatcher), and a single owner of the run state needs no
//! locks. The planner has no IO at all, so that counting once, recovery and the window
//! are tested without a store on disk, tokio or NATS (`run/planner_tests.rs`).
//! - [`worker_plan`]: the plan of a worker serving a sweep (pools, quotas, models).
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
//! holds a few thousand items in memory; results and labels live in the run state on disk.
//!
//! ## Recovery, in order
//! 1. Open the run state; the run id (UUID v7) is created once and reused.
//! 2. Create streams and the run's result consumer if missing (idempotent).
//! 3. Walk the items from the first, skipping finished ones; evaluate each unfinished
//!    item against the stored results until the window is full, holding back the jobs
//!    it needs.
//! 4. Store every result already waiting in the results stream (`run::backlog`), counted
//!    against the jobs planned in 3 and re-planning the items they finish; then publish
//!    the held-back jobs still unanswered (`Nats-Msg-Id` = `<run>:<job>`, so JetStream
//!    drops re-publications of jobs still queued within its duplicate window): nothing
//!    finished while no coordinator ran is published again.
//! 5. Consume results in batches: store each (first one wins), re-evaluate the items
//!    that waited on them, refill the window, commit the store effects as one atomic
//!    update, flush once, then ack the batch's messages.
//! 6. When every item is finished, write the report.
//!
//! A crash at any point loses nothing: a result is acked only after it is flushed, and an
//! item's follow-up jobs are re-planned from stored results at the next start. A result
//! that arrives for an item not yet back in the window is stored and found when the
//! walk reaches the item.

pub mod benchmarks;
pub mod cost;
pub mod dead_letters;
pub mod latency;
pub mod progress;
pub mod report;
pub mod run;
pub mod state;
pub mod store;
pub mod sweep;
mod window;
pub mod worker_plan;

use std::path::PathBuf;

pub use progress::Progress;
pub use run::{run, RunOutcome};

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

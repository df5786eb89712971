//! # halyard-coordinator: plans a run, collects its results, writes its report
//!
//! The pure core (sweep, benchmarks, planner, window, cost, progress, the run store's
//! interface) is `halyard-plan`; this crate is its IO: the broker, the run state on disk,
//! the report files.
//!
//! ## Layout
//! - [`run`](mod@run): a run of the coordinator, split by role:
//!   - `run::dispatcher`: publishes jobs (job batches, retries), reaps publish acks;
//!   - `run::collector`: pulls and decodes results, reads max-deliveries advisories;
//!   - `run::backlog` and `run::stall`: results that arrived while no coordinator ran,
//!     and jobs lost from the queue;
//!   - `run::outage`: endpoint outages read from the pool-health bucket.
//! - [`state`]: the run state on disk ([`state::RunDb`]), and `run_store`, the
//!   planner's view of it (`halyard_plan::store::RunStore`).
//! - [`report`]: `report.json`, `report.md`, `labels.jsonl`, `report.html`, and the
//!   leaderboard over runs; [`dead_letters`]: listing and re-queueing them.
//!
//! ## Roles
//! DESIGN.md names the coordinator's roles Planner, Dispatcher, Collector, RunDb and
//! Reporter. They are not actors here: one task runs them in turn (collect a batch, plan,
//! publish, commit), because the order between them *is* the durability contract (a
//! result is acked only after it is flushed, and it is flushed only after the jobs it
//! led to were handed to the dispatcher), and a single owner of the run state needs no
//! locks. The planner (`halyard_plan::planner`) has no IO at all, so that counting once,
//! recovery and the window are tested without a store on disk, tokio or NATS.
//!
//! ## Recovery, in order
//! 1. Open the run state; the run id (UUID v7) is created once and reused.
//! 2. Create every stream and bucket of the broker layout if missing, checking those that
//!    exist (`halyard_broker::layout::init`), every pool's consumer and the run's result
//!    consumer (idempotent).
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

pub mod dead_letters;
pub mod report;
pub mod run;
mod run_store;
pub mod shared_cache;
pub mod state;

use std::path::PathBuf;

use halyard_plan::sweep;
use halyard_plan::PlanError;
pub use run::{run, RunOutcome};

#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    State(#[from] state::StateError),
    #[error(transparent)]
    Broker(#[from] halyard_broker::BrokerError),
    #[error("cannot write report in {dir}: {reason}")]
    Report { dir: String, reason: String },
    /// The run can no longer progress ([`run`]'s stall check): it waits on jobs that no
    /// unfinished item needs.
    #[error("the run cannot progress: {0}")]
    Stuck(String),
}

/// What a coordinator needs.
#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    pub sweep: sweep::Sweep,
    /// The run's directory: `<out>/<name>/`. State lives in `state/`, reports beside it.
    pub run_dir: PathBuf,
}

impl From<sweep::SweepError> for CoordinatorError {
    fn from(e: sweep::SweepError) -> Self {
        CoordinatorError::Plan(PlanError::Sweep(e))
    }
}

impl From<halyard_plan::store::StoreError> for CoordinatorError {
    fn from(e: halyard_plan::store::StoreError) -> Self {
        CoordinatorError::Plan(PlanError::Store(e))
    }
}

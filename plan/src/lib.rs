//! # halyard-plan: the coordinator's pure core
//!
//! Everything here is a function of its inputs: no tokio, no NATS, no storage engine
//! (the crate does not depend on them, so the compiler keeps it so). The coordinator
//! (`halyard-coordinator`) drives it: it reads results from the broker, hands them to
//! the [`planner`], carries out the effects the planner returns (store, publish), and
//! flushes before it acks.
//!
//! ## Layout, from the bottom up (a module imports only from the ones above it)
//! - [`latency`], [`outage`]: small value types of the live figures.
//! - [`sweep`]: the sweep file, parsed and checked (datasets included) before anything
//!   is published: models, prices, quotas, `[run]`.
//! - [`store`]: [`store::RunStore`], what the planner reads and writes of a run's state,
//!   with its in-memory twin [`store::MemStore`]; [`store::LabelStore`], what a report
//!   reads.
//! - [`cost`]: tokens, calls and money per model and stage, and the cost limit.
//! - [`report`]: what a benchmark writes into the report ([`report::Section`]).
//! - [`benchmarks`]: one file per pipeline (its `[[benchmark]]` table, its evaluation,
//!   its report section) and the one registry of them.
//! - [`progress`]: the live figures ([`progress::Progress`]); [`worker_plan`]: what a
//!   worker serving a sweep runs (pools, quotas, models).
//! - `window`: the planning window (which items are planned, which jobs they wait on).
//! - [`planner`]: results in, effects out.
//!
//! ## Planning is a pure function of known results
//! For each item (benchmark × model under test × dataset row) the pipeline's `evaluate`
//! says either "done, here is the label" or "waiting for these jobs". The planner keeps
//! no per-item state besides the final label: when a result arrives it looks up the
//! items waiting on that job and evaluates them again, publishing whatever jobs they
//! need next (answer → judge checks → retries → label).
//!
//! ## Planning is lazy
//! Items are not all planned up front: per (benchmark, model under test) at most
//! `[run] window` items are planned and unfinished at a time, and more are planned as
//! they finish. Memory is bounded by the window, not by the run: a million-item run
//! holds a few thousand items in memory; results and labels live in the run state on disk.

pub mod benchmarks;
pub mod cost;
pub mod latency;
pub mod outage;
pub mod planner;
pub mod progress;
pub mod report;
pub mod store;
pub mod sweep;
mod window;
pub mod worker_plan;

#[cfg(test)]
mod planner_tests;

/// What planning or a benchmark's report could not do.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Sweep(#[from] sweep::SweepError),
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error("cannot write report in {dir}: {reason}")]
    Report { dir: String, reason: String },
}

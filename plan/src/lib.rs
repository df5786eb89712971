//! # halyard-plan: the coordinator's pure core
//!
//! Everything here is a function of its inputs: no tokio, no NATS, no storage engine
//! (the crate does not depend on them, so the compiler keeps it so). The coordinator
//! (`halyard-coordinator`) drives it: it reads results from the broker, hands them to
//! the [`planner`], carries out the effects the planner returns (store, publish), and
//! flushes before it acks.
//!
//! ## Layout, from the bottom up (a module imports only from the ones above it)
//! - [`latency`], [`outage`], [`record`]: value types (latency histograms, endpoint
//!   outages, what a run's state holds).
//! - the parts of [`sweep`]: `[[model]]` ([`sweep::models`], with prices, quotas,
//!   replay and batch mode), `[run]`, and [`sweep::SweepError`].
//! - [`cost`]: tokens, calls and money per model and stage, and the cost limit.
//! - [`effect`]: what the planner asks its caller to do; [`store`]: [`store::RunStore`],
//!   what the planner reads and writes of a run's state, with its in-memory twin
//!   [`store::MemStore`], and [`store::LabelStore`], what a report reads.
//! - [`judging`]: judge panels, human labels and the judges' figures.
//! - [`report`]: what a benchmark writes into the report ([`report::Section`]).
//! - [`benchmarks`]: one file per pipeline (its own `[[benchmark]]` table, its
//!   evaluation, its report section) and the one registry of them.
//! - [`sweep::Sweep`] (`sweep/mod.rs`): a whole sweep file, checked.
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
pub mod effect;
mod error;
pub mod judging;
pub mod latency;
pub mod outage;
pub mod planner;
pub mod progress;
pub mod record;
pub mod report;
pub mod store;
pub mod sweep;
mod window;
pub mod worker_plan;

#[cfg(test)]
mod planner_tests;

pub use error::PlanError;

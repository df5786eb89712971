//! # Benchmarks: one file per pipeline, one dispatch here
//!
//! Everything the coordinator knows about a pipeline is in that pipeline's file:
//! - `check`: its `[[benchmark]]` table, checked into a [`Benchmark`] (datasets read,
//!   models resolved), and `KEYS`, the table keys it takes;
//! - its [`Pipeline`] operations: name, models under test, item count, `evaluate` (one
//!   item against the known results) and its report section.
//!
//! | file | `pipeline =` | items per model under test |
//! |---|---|---|
//! | [`hypotermqa`] | `hypotermqa` | dataset questions |
//! | [`build`] | `hypotermqa-build` | topics |
//! | [`autohall`] | `autohall` | claims |
//! | [`chainpoll`] | `chainpoll` | labelled items |
//! | [`uhgeval`] | `uhgeval` | news items |
//! | [`hvi`] | `hvi` | prompts (judge mode) or one (labelled file) |
//! | [`noop`] | `noop` | `jobs` |
//!
//! **Adding a pipeline** takes its code in `halyard-pipelines` and one file here; in this
//! module, one variant of [`Benchmark`], one arm of [`Benchmark::ops`] and one line of
//! `PIPELINES`; and its new keys, if any, in `table::RawBenchmark` (serde needs the
//! whole table in one struct to reject unknown keys).
//!
//! ## Why an enum of data and a trait of operations
//! [`Benchmark`] is an enum of plain data: the set of pipelines is closed (a sweep names
//! one of `PIPELINES`), a checked sweep stays `Clone` and `Debug`, and tests and the
//! benchmark harness match a variant to read its configuration. The operations are a
//! trait, [`Pipeline`], that each file implements for its variant's data, and
//! [`Benchmark::ops`] is the one `match` that views a benchmark as its pipeline: a new
//! operation is one trait method, not a `match` in every caller (the coordinator used to
//! match the enum in seven files). A `Box<dyn Pipeline>` alone would need a hand-written
//! `Clone` and downcasts wherever a test reads a configuration.

use std::path::Path;

use halyard_pipelines::common::{Plan, ResultLookup};

use crate::report::Section;
use crate::sweep::{key_err, Model, SweepError};
use crate::PlanError;

pub mod autohall;
pub mod build;
pub mod chainpoll;
pub mod hvi;
pub mod hypotermqa;
pub mod noop;
mod table;
pub mod uhgeval;

pub(crate) use table::RawBenchmark;

/// An item's plan, its label encoded for the run state.
pub type Evaluation = Result<Plan<Vec<u8>>, PlanError>;

/// What the coordinator asks of a benchmark, whatever its pipeline.
pub trait Pipeline {
    /// `pipeline = "…"` in the sweep.
    fn name(&self) -> &'static str;
    /// The model under test of each configuration, in order (progress and metrics).
    fn model_names(&self) -> Vec<String>;
    /// Models under test (one configuration each).
    fn model_count(&self) -> usize {
        self.model_names().len()
    }
    /// Items per model under test.
    fn item_count(&self) -> usize;
    /// Item `item` of model `model` against the known results: its final label (as
    /// stored in the run state) or the jobs it waits for. Pure: the same results give the
    /// same answer.
    fn evaluate(&self, model: usize, item: u32, known: &dyn ResultLookup) -> Evaluation;
    /// This benchmark's part of the report: its Markdown section, `report.json` entries
    /// and `labels.jsonl` rows.
    fn report(&self, out: &mut Section<'_>) -> Result<(), PlanError>;
}

/// A benchmark of the sweep, checked, with its datasets read.
#[derive(Clone, Debug)]
pub enum Benchmark {
    HypoTermQa(hypotermqa::HypoTermQa),
    /// Builds a HypoTermQA dataset: one item per topic, one generator.
    HypoTermQaBuild(build::HypoTermQaBuild),
    AutoHall(autohall::AutoHall),
    ChainPoll(chainpoll::ChainPoll),
    UhgEval(uhgeval::UhgEval),
    Hvi(hvi::Hvi),
    /// `jobs` items of one free job each per model: measures the job path.
    Noop(noop::Noop),
}

impl Benchmark {
    /// This benchmark as its pipeline (the one dispatch of the coordinator).
    pub fn ops(&self) -> &dyn Pipeline {
        match self {
            Benchmark::HypoTermQa(b) => b,
            Benchmark::HypoTermQaBuild(b) => b,
            Benchmark::AutoHall(b) => b,
            Benchmark::ChainPoll(b) => b,
            Benchmark::UhgEval(b) => b,
            Benchmark::Hvi(b) => b,
            Benchmark::Noop(b) => b,
        }
    }

    pub fn pipeline(&self) -> &'static str {
        self.ops().name()
    }

    /// One configuration per model under test.
    pub fn model_count(&self) -> usize {
        self.ops().model_count()
    }

    pub fn item_count(&self) -> usize {
        self.ops().item_count()
    }
}

/// A pipeline's check of its `[[benchmark]]` table.
type Check = fn(&mut Checking<'_>, &RawBenchmark) -> Result<Benchmark, SweepError>;

/// Every pipeline a sweep may name, in the order the error for an unknown one lists them.
const PIPELINES: [(&str, Check); 7] = [
    ("hypotermqa", hypotermqa::check),
    ("hypotermqa-build", build::check),
    ("autohall", autohall::check),
    ("chainpoll", chainpoll::check),
    ("uhgeval", uhgeval::check),
    ("hvi", hvi::check),
    ("noop", noop::check),
];

/// What a pipeline's check sees besides its table.
pub(crate) struct Checking<'a> {
    /// The sweep file, as errors name it.
    pub file: &'a str,
    /// Relative dataset paths resolve against this folder (the sweep file's).
    pub base: &'a Path,
    pub models: &'a [Model],
    /// The index of the benchmark being checked.
    pub index: usize,
    /// The benchmarks checked before it (`dataset_from` names one).
    pub earlier: Vec<Benchmark>,
    /// Evaluations that read a dataset built in the same run.
    pub built_inputs: Vec<build::BuiltInput>,
}

/// Check every `[[benchmark]]` of a sweep, in order; also returns the evaluations that
/// read a dataset built in the same run.
pub(crate) fn check_all(
    file: &str,
    base: &Path,
    raw: &[RawBenchmark],
    models: &[Model],
) -> Result<(Vec<Benchmark>, Vec<build::BuiltInput>), SweepError> {
    if raw.is_empty() {
        return Err(key_err(file, "benchmark", "at least one [[benchmark]] is required"));
    }
    let mut cx =
        Checking { file, base, models, index: 0, earlier: Vec::new(), built_inputs: Vec::new() };
    for (i, b) in raw.iter().enumerate() {
        cx.index = i;
        let Some((_, check)) = PIPELINES.iter().find(|(name, _)| *name == b.pipeline) else {
            let names: Vec<String> = PIPELINES.iter().map(|(n, _)| format!("{n:?}")).collect();
            let (last, rest) = names.split_last().expect("PIPELINES is not empty");
            return Err(key_err(
                file,
                format!("benchmark[{i}].pipeline"),
                format!(
                    "unknown pipeline {:?} (expected {} or {last})",
                    b.pipeline,
                    rest.join(", ")
                ),
            ));
        };
        let bench = check(&mut cx, b)?;
        cx.earlier.push(bench);
    }
    Ok((cx.earlier, cx.built_inputs))
}

/// A plan with its label serialised for the run state.
pub(crate) fn encoded<T: serde::Serialize>(plan: Plan<T>) -> Evaluation {
    Ok(match plan {
        Plan::Done(label) => Plan::Done(serde_json::to_vec(&label).map_err(|err| {
            PlanError::Report { dir: "<memory>".into(), reason: err.to_string() }
        })?),
        Plan::Waiting(jobs) => Plan::Waiting(jobs),
    })
}
#[cfg(test)]
mod tests;

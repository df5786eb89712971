//! # Benchmarks: one file per pipeline, one dispatch here
//!
//! Everything the coordinator knows about a pipeline is in that pipeline's file:
//! - `check`: its own `[[benchmark]]` table (a serde struct of exactly its keys, so an
//!   unknown or foreign key is an error naming it), checked into a [`Benchmark`]
//!   (datasets read, models resolved);
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
//! **Adding a pipeline** takes its code in `halyard-pipelines` (a folder), one file here
//! (its table, `check` and [`Pipeline`] impl) and one line of `PIPELINES` (the book's
//! page "Build your own benchmark" walks through it).
//!
//! ## Why a boxed trait object
//! [`Benchmark`] boxes the pipeline's own data behind [`Pipeline`], so the set of
//! pipelines is open to one registration line and no `match` over pipelines exists
//! anywhere. A checked sweep stays `Clone` and `Debug` ([`AsAny`] gives every pipeline
//! a boxed clone), and tests and the benchmark harness read a configuration with
//! [`Benchmark::get`].

use std::any::Any;
use std::fmt::Debug;
use std::path::Path;

use halyard_pipelines::common::{Plan, ResultLookup};

use crate::report::Section;
use crate::sweep::error::{key_err, SweepError};
use crate::sweep::models::Model;
use crate::PlanError;

pub mod autohall;
pub mod build;
pub mod chainpoll;
pub mod hvi;
pub mod hypotermqa;
pub mod noop;
mod table;
pub mod uhgeval;

/// A judged pipeline's label set and the part key of its human labels (`sentence`).
pub type JudgedLabels = (Vec<String>, Option<&'static str>);

/// An item's plan, its label encoded for the run state.
pub type Evaluation = Result<Plan<Vec<u8>>, PlanError>;

/// What the coordinator asks of a benchmark, whatever its pipeline.
pub trait Pipeline: AsAny + Debug + Send + Sync {
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
    /// For a pipeline whose judges label its units: the label set and the part key of
    /// its human labels (see [`crate::judging::human`]); `None` for the others.
    fn judged_labels(&self) -> Option<JudgedLabels> {
        None
    }
}

/// Clone and downcast a boxed pipeline; implemented for every `Pipeline + Clone`.
pub trait AsAny {
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
    fn boxed_clone(&self) -> Box<dyn Pipeline>;
}

impl<T: Pipeline + Clone + 'static> AsAny for T {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn boxed_clone(&self) -> Box<dyn Pipeline> {
        Box::new(self.clone())
    }
}

/// A benchmark of the sweep, checked, with its datasets read: one pipeline's data
/// behind its operations.
#[derive(Debug)]
pub struct Benchmark(Box<dyn Pipeline>);

impl Clone for Benchmark {
    fn clone(&self) -> Self {
        Benchmark(self.0.boxed_clone())
    }
}

impl Benchmark {
    pub fn new<P: Pipeline + Clone + 'static>(pipeline: P) -> Benchmark {
        Benchmark(Box::new(pipeline))
    }

    /// This benchmark as its pipeline.
    pub fn ops(&self) -> &dyn Pipeline {
        &*self.0
    }

    /// The pipeline's own data, if it is a `P` (tests, the benchmark harness).
    pub fn get<P: 'static>(&self) -> Option<&P> {
        self.0.as_any().downcast_ref()
    }

    /// As [`Benchmark::get`], to change it (a built dataset read after the build phase).
    pub fn get_mut<P: 'static>(&mut self) -> Option<&mut P> {
        self.0.as_any_mut().downcast_mut()
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
type Check = fn(&mut Checking<'_>, &toml::Table) -> Result<Benchmark, SweepError>;

/// Every pipeline a sweep may name, in the order the error for an unknown one lists them:
/// the one registration line of each.
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
    raw: &[toml::Table],
    models: &[Model],
) -> Result<(Vec<Benchmark>, Vec<build::BuiltInput>), SweepError> {
    if raw.is_empty() {
        return Err(key_err(file, "benchmark", "at least one [[benchmark]] is required"));
    }
    let mut cx =
        Checking { file, base, models, index: 0, earlier: Vec::new(), built_inputs: Vec::new() };
    for (i, b) in raw.iter().enumerate() {
        cx.index = i;
        let key = format!("benchmark[{i}].pipeline");
        let name = match b.get("pipeline") {
            Some(toml::Value::String(name)) => name.as_str(),
            Some(other) => {
                return Err(key_err(
                    file,
                    key,
                    format!("{other} is not a pipeline name (a string)"),
                ))
            }
            None => return Err(key_err(file, key, "missing: which pipeline runs this benchmark")),
        };
        let Some((_, check)) = PIPELINES.iter().find(|(n, _)| *n == name) else {
            let names: Vec<String> = PIPELINES.iter().map(|(n, _)| format!("{n:?}")).collect();
            let (last, rest) = names.split_last().expect("PIPELINES is not empty");
            return Err(key_err(
                file,
                key,
                format!("unknown pipeline {name:?} (expected {} or {last})", rest.join(", ")),
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

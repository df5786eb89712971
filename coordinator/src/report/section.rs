//! What a benchmark writes into the report, and how it reads its labels.

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{io_err, LabelsFile};
use crate::state::RunState;
use crate::CoordinatorError;

/// One benchmark's part of the report: it reads its labels from the run state and adds
/// its Markdown section, its `report.json` entries and its `labels.jsonl` rows.
pub struct Section<'a> {
    pub state: &'a RunState,
    /// The benchmark's index in the sweep.
    pub bench: usize,
    /// The run directory.
    pub dir: &'a Path,
    pub md: &'a mut String,
    /// `report.json`'s `benchmarks`.
    pub json: &'a mut Vec<serde_json::Value>,
    pub(super) labels: &'a mut LabelsFile,
    /// What benchmarks hand on to figures across benchmarks (the RealHall aggregate).
    pub across: &'a mut Across,
}

/// Figures computed across the sweep's benchmarks, gathered while each writes its section.
#[derive(Default)]
pub struct Across {
    /// Each ChainPoll benchmark's report per judge, for RealHall's aggregate over datasets.
    pub chainpoll: Vec<crate::benchmarks::chainpoll::RealHallPart>,
}

impl Section<'_> {
    /// A report error in the run directory.
    pub fn err(&self, e: impl std::fmt::Display) -> CoordinatorError {
        io_err(self.dir, e)
    }

    /// Labels of model `model` of this benchmark, in item order.
    pub fn labels<T: DeserializeOwned>(&self, model: usize) -> Result<Vec<T>, CoordinatorError> {
        let mut out = Vec::new();
        for r in self.state.labels_of(self.bench as u32, model as u32) {
            let (k, v) = r?;
            out.push(
                serde_json::from_slice(&v)
                    .map_err(|e| self.err(format!("stored label {k:?}: {e}")))?,
            );
        }
        Ok(out)
    }

    /// As [`Section::labels`], each also written to `labels.jsonl`.
    pub fn labels_written<T: Serialize + DeserializeOwned>(
        &mut self,
        model: usize,
    ) -> Result<Vec<T>, CoordinatorError> {
        let ls: Vec<T> = self.labels(model)?;
        for l in &ls {
            self.row(l)?;
        }
        Ok(ls)
    }

    /// One row of `labels.jsonl`.
    pub fn row(&mut self, label: &impl Serialize) -> Result<(), CoordinatorError> {
        self.labels.row(self.dir, label)
    }

    /// Rows written to `labels.jsonl` so far (entries give their range of lines).
    pub fn lines(&self) -> u64 {
        self.labels.lines
    }

    /// A `report.json` entry: `report` with its benchmark index and dataset.
    pub fn entry(
        &self,
        report: &impl Serialize,
        dataset: &Path,
    ) -> Result<serde_json::Value, CoordinatorError> {
        let mut v = serde_json::to_value(report).map_err(|e| self.err(e))?;
        if let Some(o) = v.as_object_mut() {
            o.insert("benchmark".into(), self.bench.into());
            o.insert("dataset".into(), dataset.display().to_string().into());
        }
        Ok(v)
    }

    /// A Markdown section titled `Benchmark <b>: <title>`.
    pub fn section(&mut self, title: &str, markdown: &str) {
        self.md.push_str(&format!("## Benchmark {}: {title}\n\n{markdown}\n", self.bench));
    }
}

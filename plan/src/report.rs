//! What a benchmark writes into the report, and how it reads its labels.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::store::LabelStore;
use crate::PlanError;

/// One benchmark's part of the report: it reads its labels from the run state and adds
/// its Markdown section, its `report.json` entries and its `labels.jsonl` rows.
pub struct Section<'a> {
    pub state: &'a dyn LabelStore,
    /// The benchmark's index in the sweep.
    pub bench: usize,
    /// The run directory.
    pub dir: &'a Path,
    pub md: &'a mut String,
    /// `report.json`'s `benchmarks`.
    pub json: &'a mut Vec<serde_json::Value>,
    pub labels: &'a mut LabelsFile,
    /// What benchmarks hand on to figures across benchmarks (the RealHall aggregate).
    pub across: &'a mut Across,
}

/// One ChainPoll benchmark's report of one judge, for RealHall's aggregate.
#[derive(Clone, Debug)]
pub struct RealHallPart {
    pub bench: usize,
    pub dataset: String,
    pub report: halyard_pipelines::chainpoll::Report,
}

/// Figures computed across the sweep's benchmarks, gathered while each writes its section.
#[derive(Default)]
pub struct Across {
    /// Each ChainPoll benchmark's report per judge, for RealHall's aggregate over datasets.
    pub chainpoll: Vec<RealHallPart>,
    /// The judges of each benchmark that has a panel or human labels, measured
    /// (`report.json`'s `judges`).
    pub judges: Vec<crate::judging::JudgeReport>,
}

/// Where `halyard labels import` puts the human labels of benchmark `bench` in a run
/// directory.
pub fn imported_labels_path(dir: &Path, bench: usize) -> PathBuf {
    dir.join("human-labels").join(format!("benchmark-{bench}.jsonl"))
}

impl Section<'_> {
    /// A report error in the run directory.
    pub fn err(&self, e: impl std::fmt::Display) -> PlanError {
        io_err(self.dir, e)
    }

    /// Labels of model `model` of this benchmark, in item order.
    pub fn labels<T: DeserializeOwned>(&self, model: usize) -> Result<Vec<T>, PlanError> {
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
    ) -> Result<Vec<T>, PlanError> {
        let ls: Vec<T> = self.labels(model)?;
        for l in &ls {
            self.row(l)?;
        }
        Ok(ls)
    }

    /// One row of `labels.jsonl`.
    pub fn row(&mut self, label: &impl Serialize) -> Result<(), PlanError> {
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
    ) -> Result<serde_json::Value, PlanError> {
        let mut v = serde_json::to_value(report).map_err(|e| self.err(e))?;
        if let Some(o) = v.as_object_mut() {
            o.insert("benchmark".into(), self.bench.into());
            o.insert("dataset".into(), dataset.display().to_string().into());
        }
        Ok(v)
    }

    /// Human labels imported into this run for this benchmark (`halyard labels
    /// import`), checked against the pipeline's labels.
    pub fn imported_labels(
        &self,
        shape: crate::judging::human::Shape<'_>,
    ) -> Result<Option<crate::judging::HumanLabels>, PlanError> {
        let path = imported_labels_path(self.dir, self.bench);
        if !path.exists() {
            return Ok(None);
        }
        crate::judging::HumanLabels::read(&path, shape).map(Some).map_err(|e| self.err(e))
    }

    /// A Markdown section titled `Benchmark <b>: <title>`.
    pub fn section(&mut self, title: &str, markdown: &str) {
        self.md.push_str(&format!("## Benchmark {}: {title}\n\n{markdown}\n", self.bench));
    }
}

pub fn io_err(dir: &Path, e: impl std::fmt::Display) -> PlanError {
    PlanError::Report { dir: dir.display().to_string(), reason: e.to_string() }
}

pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), PlanError> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut f = std::fs::File::create(&tmp).map_err(|e| io_err(dir, format!("{name}: {e}")))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| io_err(dir, format!("{name}: {e}")))?;
    std::fs::rename(&tmp, dir.join(name)).map_err(|e| io_err(dir, format!("{name}: {e}")))
}

/// `labels.jsonl`, written to a temporary file as labels are read, renamed at the end.
pub struct LabelsFile {
    tmp: PathBuf,
    out: BufWriter<std::fs::File>,
    /// Rows written so far.
    lines: u64,
}

impl LabelsFile {
    pub fn create(dir: &Path) -> Result<LabelsFile, PlanError> {
        let tmp = dir.join(".labels.jsonl.tmp");
        let f =
            std::fs::File::create(&tmp).map_err(|e| io_err(dir, format!("labels.jsonl: {e}")))?;
        Ok(LabelsFile { tmp, out: BufWriter::new(f), lines: 0 })
    }

    fn row(&mut self, dir: &Path, label: &impl Serialize) -> Result<(), PlanError> {
        serde_json::to_writer(&mut self.out, label).map_err(|e| io_err(dir, e))?;
        self.lines += 1;
        self.out.write_all(b"\n").map_err(|e| io_err(dir, format!("labels.jsonl: {e}")))
    }

    pub fn finish(self, dir: &Path) -> Result<(), PlanError> {
        let f = self
            .out
            .into_inner()
            .map_err(|e| io_err(dir, format!("labels.jsonl: {}", e.error())))?;
        f.sync_all().map_err(|e| io_err(dir, format!("labels.jsonl: {e}")))?;
        std::fs::rename(&self.tmp, dir.join("labels.jsonl"))
            .map_err(|e| io_err(dir, format!("labels.jsonl: {e}")))
    }
}

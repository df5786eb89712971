//! Report sections of the `autohall` and `chainpoll` benchmarks (a child module of
//! [`super`]): one section per benchmark with a leaderboard across its models, the
//! figures in `report.json`, and the label rows in `labels.jsonl`.

use std::path::Path;

use halyard_pipelines::{autohall, chainpoll};
use serde::de::DeserializeOwned;

use super::{io_err, LabelsFile};
use crate::state::RunState;
use crate::CoordinatorError;

/// Labels of one (benchmark, model) in item order.
pub(super) fn typed_labels<T: DeserializeOwned>(state: &RunState, bench: u32, model: u32, dir: &Path) -> Result<Vec<T>, CoordinatorError> {
    let mut out = Vec::new();
    for r in state.labels_of(bench, model) {
        let (k, v) = r?;
        out.push(serde_json::from_slice(&v).map_err(|e| io_err(dir, format!("stored label {k:?}: {e}")))?);
    }
    Ok(out)
}

/// `report.json` entry: the report with its benchmark index and dataset.
pub(super) fn entry(dir: &Path, report: &impl serde::Serialize, bench: usize, dataset: &Path) -> Result<serde_json::Value, CoordinatorError> {
    let mut v = serde_json::to_value(report).map_err(|e| io_err(dir, e))?;
    if let Some(o) = v.as_object_mut() {
        o.insert("benchmark".into(), bench.into());
        o.insert("dataset".into(), dataset.display().to_string().into());
    }
    Ok(v)
}

/// Where a benchmark's section goes: the run state it reads, and the report's parts.
pub(super) struct Sink<'a> {
    pub state: &'a RunState,
    pub dir: &'a Path,
    pub md: &'a mut String,
    pub benchmarks: &'a mut Vec<serde_json::Value>,
    pub labels: &'a mut LabelsFile,
}

impl Sink<'_> {
    fn labels_of<T: DeserializeOwned>(&self, bench: usize, model: usize) -> Result<Vec<T>, CoordinatorError> {
        typed_labels(self.state, bench as u32, model as u32, self.dir)
    }
}

/// An AutoHall benchmark's section, figures and label rows (each row with `balanced`:
/// whether the reference is in the detection set).
pub(super) fn write_autohall(
    out: &mut Sink,
    bench: usize,
    config: &[autohall::Config],
    dataset: &Path,
    claims: u64,
    dropped: &std::collections::BTreeMap<String, u64>,
    samples: u32,
) -> Result<(), CoordinatorError> {
    let mut reports = Vec::new();
    for (m, c) in config.iter().enumerate() {
        let items: Vec<autohall::ItemLabel> = out.labels_of(bench, m)?;
        let balanced = autohall::balanced_set(&items);
        for l in &items {
            let mut v = serde_json::to_value(l).map_err(|e| io_err(out.dir, e))?;
            if let Some(o) = v.as_object_mut() {
                o.insert("balanced".into(), balanced.contains(&l.index).into());
            }
            out.labels.row(out.dir, &v)?;
        }
        let report = autohall::score(&c.model.name, claims, dropped, samples, &items);
        out.benchmarks.push(entry(out.dir, &report, bench, dataset)?);
        reports.push(report);
    }
    let title = format!("Benchmark {bench}: autohall on `{}`", dataset.display());
    out.md.push_str(&autohall::render_markdown(&title, &reports));
    out.md.push('\n');
    Ok(())
}

/// A ChainPoll benchmark's section, figures and label rows.
pub(super) fn write_chainpoll(
    out: &mut Sink,
    bench: usize,
    config: &[chainpoll::Config],
    dataset: &Path,
    skipped: u64,
) -> Result<(), CoordinatorError> {
    let mut reports = Vec::new();
    for (m, c) in config.iter().enumerate() {
        let items: Vec<chainpoll::ItemLabel> = out.labels_of(bench, m)?;
        for l in &items {
            out.labels.row(out.dir, l)?;
        }
        let report = chainpoll::score(c, &items);
        let mut v = entry(out.dir, &report, bench, dataset)?;
        if let Some(o) = v.as_object_mut() {
            o.insert("skipped_unbalanced_rows".into(), skipped.into());
        }
        out.benchmarks.push(v);
        reports.push(report);
    }
    let title = format!("Benchmark {bench}: chainpoll on `{}`", dataset.display());
    out.md.push_str(&chainpoll::render_markdown(&title, &reports));
    out.md.push('\n');
    Ok(())
}

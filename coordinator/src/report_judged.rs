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

/// Everything an AutoHall benchmark contributes to the report.
pub(super) struct AutoHallSection<'a> {
    pub bench: usize,
    pub config: &'a [autohall::Config],
    pub dataset: &'a Path,
    pub claims: u64,
    pub dropped: &'a std::collections::BTreeMap<String, u64>,
    pub samples: u32,
}

impl AutoHallSection<'_> {
    /// Appends the section to `md`, the figures to `benchmarks`, the rows to `labels`
    /// (each with `balanced`: whether the reference is in the detection set).
    pub(super) fn write(
        &self,
        state: &RunState,
        dir: &Path,
        md: &mut String,
        benchmarks: &mut Vec<serde_json::Value>,
        labels: &mut LabelsFile,
    ) -> Result<(), CoordinatorError> {
        let mut reports = Vec::new();
        for (m, c) in self.config.iter().enumerate() {
            let items: Vec<autohall::ItemLabel> = typed_labels(state, self.bench as u32, m as u32, dir)?;
            let balanced = autohall::balanced_set(&items);
            for l in &items {
                let mut v = serde_json::to_value(l).map_err(|e| io_err(dir, e))?;
                if let Some(o) = v.as_object_mut() {
                    o.insert("balanced".into(), balanced.contains(&l.index).into());
                }
                labels.row(dir, &v)?;
            }
            let report = autohall::score(&c.model.name, self.claims, self.dropped, self.samples, &items);
            benchmarks.push(entry(dir, &report, self.bench, self.dataset)?);
            reports.push(report);
        }
        let title = format!("Benchmark {}: autohall on `{}`", self.bench, self.dataset.display());
        md.push_str(&autohall::render_markdown(&title, &reports));
        md.push('\n');
        Ok(())
    }
}

/// Everything a ChainPoll benchmark contributes to the report.
#[allow(clippy::too_many_arguments)]
pub(super) fn write_chainpoll(
    bench: usize,
    config: &[chainpoll::Config],
    dataset: &Path,
    skipped: u64,
    state: &RunState,
    dir: &Path,
    md: &mut String,
    benchmarks: &mut Vec<serde_json::Value>,
    labels: &mut LabelsFile,
) -> Result<(), CoordinatorError> {
    let mut reports = Vec::new();
    for (m, c) in config.iter().enumerate() {
        let items: Vec<chainpoll::ItemLabel> = typed_labels(state, bench as u32, m as u32, dir)?;
        for l in &items {
            labels.row(dir, l)?;
        }
        let report = chainpoll::score(c, &items);
        let mut v = entry(dir, &report, bench, dataset)?;
        if let Some(o) = v.as_object_mut() {
            o.insert("skipped_unbalanced_rows".into(), skipped.into());
        }
        benchmarks.push(v);
        reports.push(report);
    }
    let title = format!("Benchmark {bench}: chainpoll on `{}`", dataset.display());
    md.push_str(&chainpoll::render_markdown(&title, &reports));
    md.push('\n');
    Ok(())
}

//! Report sections of the `uhgeval` and `hvi` pipelines (a child module of `report`): one
//! section per benchmark, with a leaderboard across its models, and one `report.json`
//! entry per (benchmark, model).

use std::path::Path;

use halyard_pipelines::hvi;
use halyard_pipelines::uhgeval;
use serde::Serialize;

use super::{io_err, labels_of, LabelsFile};
use crate::state::RunState;
use crate::sweep::Benchmark;
use crate::CoordinatorError;

/// The figures of a benchmark as `report.json` entries and its Markdown section.
pub(super) struct Section {
    pub json: Vec<serde_json::Value>,
    pub markdown: String,
}

fn entry(dir: &Path, report: &impl Serialize, bench: usize, input: &Path) -> Result<serde_json::Value, CoordinatorError> {
    let mut v = serde_json::to_value(report).map_err(|e| io_err(dir, e))?;
    if let Some(o) = v.as_object_mut() {
        o.insert("benchmark".into(), bench.into());
        o.insert("dataset".into(), input.display().to_string().into());
    }
    Ok(v)
}

/// One (benchmark, model)'s labels, each also written to `labels.jsonl`.
fn labels_written<T: Serialize + serde::de::DeserializeOwned>(
    state: &RunState,
    b: usize,
    m: usize,
    labels: &mut LabelsFile,
    dir: &Path,
) -> Result<Vec<T>, CoordinatorError> {
    let ls: Vec<T> = labels_of(state, b as u32, m as u32, dir)?;
    for l in &ls {
        labels.row(dir, l)?;
    }
    Ok(ls)
}

/// The section of benchmark `b` if it is a `uhgeval` or `hvi` one; its labels go to
/// `labels`.
pub(super) fn section(
    state: &RunState,
    b: usize,
    bench: &Benchmark,
    labels: &mut LabelsFile,
    dir: &Path,
) -> Result<Option<Section>, CoordinatorError> {
    let mut json = Vec::new();
    let (title, markdown) = match bench {
        Benchmark::UhgEval { config, dataset, cases } => {
            let mut reports = Vec::new();
            for (m, c) in config.iter().enumerate() {
                let ls: Vec<uhgeval::ItemLabel> = labels_written(state, b, m, labels, dir)?;
                // No embedding model is configured yet: BERTScore is reported as not computed.
                let r = uhgeval::score(&c.model.name, c.variant, cases, &ls, None);
                json.push(entry(dir, &r, b, dataset)?);
                reports.push(r);
            }
            (format!("uhgeval on `{}`", dataset.display()), uhgeval::render_markdown(&reports))
        }
        Benchmark::HviJudge { config, dataset, weights, .. } => {
            let mut reports = Vec::new();
            for (m, c) in config.iter().enumerate() {
                let ls: Vec<hvi::ItemLabel> = labels_written(state, b, m, labels, dir)?;
                let judge_errors = ls.iter().flat_map(|l| &l.sentences).filter(|s| s.verdict.is_none()).count() as u64;
                let failed = ls.iter().filter(|l| l.passage_error.is_some()).count() as u64;
                let r = hvi::score(&c.model.name, "judge", hvi::plan::counts_of(&ls), judge_errors, failed, *weights);
                json.push(entry(dir, &r, b, dataset)?);
                reports.push(r);
            }
            let judge = config.first().map_or(String::new(), |c| c.judge.name.clone());
            (format!("hvi on `{}`, judge `{judge}`", dataset.display()), hvi::render_markdown(&reports))
        }
        Benchmark::HviLabels { models, file, weights, .. } => {
            let mut reports = Vec::new();
            for (m, name) in models.iter().enumerate() {
                let ls: Vec<hvi::ModelLabels> = labels_written(state, b, m, labels, dir)?;
                let counts = ls.first().map_or(hvi::plan::evaluate_labelled(name, &[]).counts, |l| l.counts);
                let r = hvi::score(name, "labels", counts, 0, 0, *weights);
                json.push(entry(dir, &r, b, file)?);
                reports.push(r);
            }
            (format!("hvi from labelled sentences `{}`", file.display()), hvi::render_markdown(&reports))
        }
        _ => return Ok(None),
    };
    Ok(Some(Section { json, markdown: format!("## Benchmark {b}: {title}\n\n{markdown}\n") }))
}

//! `pipeline = "noop"`: `jobs` items per model of one free job each, to measure the job
//! path (see `halyard_pipelines::noop`).

use std::collections::HashSet;

use halyard_pipelines::common::ResultLookup;
use halyard_pipelines::noop;

use serde::Deserialize;

use super::table::parse;
use super::{encoded, Benchmark, Checking, Evaluation, Pipeline};
use crate::report::Section;
use crate::sweep::error::{key_err, SweepError};
use crate::PlanError;

/// `pipeline = "noop"`: its table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Table {
    models: Vec<String>,
    /// Items (one job each) per model under test.
    jobs: Option<i64>,
}

/// Largest `jobs` of a noop benchmark (item indices are 32-bit in the run state).
pub const MAX_NOOP_JOBS: i64 = 1_000_000_000;

#[derive(Clone, Debug)]
pub struct Noop {
    pub config: Vec<noop::Config>,
    pub jobs: u32,
}

/// `pipeline = "noop"`: `jobs` items per model, models with `backend = "noop"`, and
/// none of the keys that belong to datasets and judges.
pub(super) fn check(cx: &mut Checking<'_>, raw: &toml::Table) -> Result<Benchmark, SweepError> {
    let table: Table = parse(cx, raw, noop::PIPELINE)?;
    let b = &table;
    let (f, i, models) = (cx.file, cx.index, cx.models);
    let k = |field: &str| format!("benchmark[{i}].{field}");
    let jobs = b.jobs.ok_or_else(|| {
        key_err(f, k("jobs"), "required for pipeline \"noop\": the number of jobs per model")
    })?;
    if !(1..=MAX_NOOP_JOBS).contains(&jobs) {
        return Err(key_err(f, k("jobs"), format!("{jobs} is outside 1..={MAX_NOOP_JOBS}")));
    }
    if b.models.is_empty() {
        return Err(key_err(f, k("models"), "needs at least one model under test"));
    }
    let mut config = Vec::new();
    let mut seen = HashSet::new();
    for (j, name) in b.models.iter().enumerate() {
        let key = format!("benchmark[{i}].models[{j}]");
        if !seen.insert(name) {
            return Err(key_err(f, key, format!("model {name:?} listed twice")));
        }
        let m = super::table::model_named(f, key.clone(), name, models)?;
        // A typo must not turn a million free jobs into a million paid calls.
        if m.spec.model_ref.backend != "noop" {
            return Err(key_err(
                f,
                key,
                format!(
                    "model {name:?} has backend {:?}; pipeline \"noop\" runs only models with backend \"noop\"",
                    m.spec.model_ref.backend
                ),
            ));
        }
        config.push(noop::Config { model: m.spec.clone() });
    }
    Ok(Benchmark::new(Noop { config, jobs: jobs as u32 }))
}

impl Pipeline for Noop {
    fn name(&self) -> &'static str {
        noop::PIPELINE
    }

    fn model_names(&self) -> Vec<String> {
        self.config.iter().map(|c| c.model.name.clone()).collect()
    }

    fn item_count(&self) -> usize {
        self.jobs as usize
    }

    fn evaluate(&self, model: usize, item: u32, known: &dyn ResultLookup) -> Evaluation {
        encoded(noop::evaluate(&self.config[model], item as u64, known))
    }

    /// Per model: the labels are tallied as they stream to `labels.jsonl` (a noop run may
    /// have millions).
    fn report(&self, out: &mut Section<'_>) -> Result<(), PlanError> {
        let (b, jobs) = (out.bench, self.jobs);
        for (m, c) in self.config.iter().enumerate() {
            let first = out.lines();
            let mut tally = noop::Tally::new(&c.model.name, jobs as u64);
            for r in out.state.labels_of(b as u32, m as u32) {
                let (k, v) = r?;
                let l: noop::ItemLabel = serde_json::from_slice(&v)
                    .map_err(|e| out.err(format!("stored label {k:?}: {e}")))?;
                tally.add(&l);
                out.row(&l)?;
            }
            let report = tally.finish();
            out.md.push_str(&format!("## Benchmark {b}: noop, {jobs} jobs per model\n\n"));
            out.md.push_str(&noop::render_markdown(&report));
            out.md.push('\n');
            let mut v = serde_json::to_value(&report).map_err(|e| out.err(e))?;
            if let Some(o) = v.as_object_mut() {
                o.insert("benchmark".into(), b.into());
                o.insert("labels_lines".into(), serde_json::json!([first, out.lines()]));
            }
            out.json.push(v);
        }
        Ok(())
    }
}

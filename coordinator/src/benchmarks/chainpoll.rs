//! `pipeline = "chainpoll"`: ChainPoll on labelled items; the models under test are the
//! judges being evaluated (see `halyard_pipelines::chainpoll`).

use std::path::PathBuf;

use halyard_pipelines::chainpoll::{self, Metric};
use halyard_pipelines::common::{ModelSpec, ResultLookup};
use halyard_pipelines::metrics::chainpoll::Unparseable;

use super::table::{
    dataset_err, int_in, limit, model_named, models_of, reject_foreign_keys, RawBenchmark,
};
use super::{encoded, Benchmark, Checking, Evaluation, Pipeline};
use crate::report::Section;
use crate::sweep::{key_err, SweepError};
use crate::CoordinatorError;

/// The keys of the table this pipeline takes.
pub const KEYS: &[&str] =
    &["samples", "polls", "metrics", "unparseable", "sampler", "dataset", "limit"];

/// ChainPoll: labelled items judged by each model (the judges under evaluation).
#[derive(Clone, Debug)]
pub struct ChainPoll {
    pub config: Vec<chainpoll::Config>,
    pub dataset: PathBuf,
    pub items: Vec<chainpoll::Item>,
    /// Rows left out to balance the labels.
    pub skipped: u64,
}

/// `pipeline = "chainpoll"`: `dataset`, `models` (the judges), optional `polls`,
/// `metrics`, `unparseable`, `sampler` with `samples`, and `limit`.
pub(super) fn check(cx: &mut Checking<'_>, b: &RawBenchmark) -> Result<Benchmark, SweepError> {
    let (f, i, models) = (cx.file, cx.index, cx.models);
    let k = |field: &str| format!("benchmark[{i}].{field}");
    reject_foreign_keys(f, i, b, chainpoll::PIPELINE, KEYS)?;
    let judges = models_of(f, i, b, models)?;
    let polls = int_in(f, k("polls"), b.polls, 1, 100, chainpoll::plan::DEFAULT_POLLS as i64)?;
    let metrics = metrics(f, i, b)?;
    let unparseable = match b.unparseable.as_deref().unwrap_or("exclude") {
        "exclude" => Unparseable::Exclude,
        "no" => Unparseable::CountAsNo,
        other => {
            return Err(key_err(
                f,
                k("unparseable"),
                format!("{other:?} is not \"exclude\" or \"no\""),
            ))
        }
    };
    let sampler = sampler(cx, b)?;
    let Some(rel) = &b.dataset else {
        return Err(key_err(f, k("dataset"), "required for pipeline \"chainpoll\""));
    };
    let dataset = cx.base.join(rel);
    let ds_err = |reason: String| dataset_err(f, i, "dataset", &dataset, reason);
    let mut set = chainpoll::read_items(&dataset).map_err(|e| ds_err(e.to_string()))?;
    if let Some(l) = limit(f, i, b)? {
        set.items.truncate(l);
    }
    if set.items.is_empty() {
        return Err(key_err(f, k("dataset"), format!("{} holds no item", dataset.display())));
    }
    if metrics.contains(&Metric::Adherence) {
        if let Some(item) = set.items.iter().find(|it| it.context.is_none()) {
            return Err(ds_err(format!(
                "line {}: metric \"adherence\" needs a `context`, and this item has none",
                item.line
            )));
        }
    }
    let config = judges
        .into_iter()
        .map(|judge| chainpoll::Config {
            judge,
            polls,
            metrics: metrics.clone(),
            unparseable,
            sampler: sampler.clone(),
            // The sampler doubles as the pseudo-entropy probability model (issue 16) until
            // the sweep gets its own key.
            probability: sampler.as_ref().map(|(m, _)| m.clone()),
        })
        .collect();
    Ok(Benchmark::ChainPoll(ChainPoll {
        config,
        dataset,
        items: set.items,
        skipped: set.skipped_unbalanced,
    }))
}

/// `metrics`: at least one, each known and given once (default correctness).
fn metrics(f: &str, i: usize, b: &RawBenchmark) -> Result<Vec<Metric>, SweepError> {
    let mut metrics = Vec::new();
    for (j, m) in b.metrics.clone().unwrap_or_else(|| vec!["correctness".into()]).iter().enumerate()
    {
        let metric = match m.as_str() {
            "correctness" => Metric::Correctness,
            "adherence" => Metric::Adherence,
            other => {
                return Err(key_err(
                    f,
                    format!("benchmark[{i}].metrics[{j}]"),
                    format!("{other:?} is not \"correctness\" or \"adherence\""),
                ))
            }
        };
        if metrics.contains(&metric) {
            return Err(key_err(
                f,
                format!("benchmark[{i}].metrics[{j}]"),
                format!("{m:?} listed twice"),
            ));
        }
        metrics.push(metric);
    }
    if metrics.is_empty() {
        return Err(key_err(
            f,
            format!("benchmark[{i}].metrics"),
            "needs at least one of \"correctness\", \"adherence\"",
        ));
    }
    Ok(metrics)
}

/// `sampler` and `samples`: the model that draws the SelfCheck samples, and how many.
fn sampler(cx: &Checking<'_>, b: &RawBenchmark) -> Result<Option<(ModelSpec, u32)>, SweepError> {
    let (f, i) = (cx.file, cx.index);
    let k = |field: &str| format!("benchmark[{i}].{field}");
    match &b.sampler {
        None if b.samples.is_some() => {
            Err(key_err(f, k("samples"), "needs `sampler`, the model that draws the samples"))
        }
        None => Ok(None),
        Some(name) => {
            let spec = model_named(f, k("sampler"), name, cx.models)?.spec.clone();
            let samples = int_in(
                f,
                k("samples"),
                b.samples,
                1,
                1000,
                chainpoll::plan::DEFAULT_SAMPLES as i64,
            )?;
            Ok(Some((spec, samples)))
        }
    }
}

impl Pipeline for ChainPoll {
    fn name(&self) -> &'static str {
        chainpoll::PIPELINE
    }

    fn model_names(&self) -> Vec<String> {
        self.config.iter().map(|c| c.judge.name.clone()).collect()
    }

    fn item_count(&self) -> usize {
        self.items.len()
    }

    fn evaluate(&self, model: usize, item: u32, known: &dyn ResultLookup) -> Evaluation {
        let it = &self.items[item as usize];
        encoded(chainpoll::evaluate(&self.config[model], item, it, known))
    }

    /// One section with a leaderboard across the judges, figures per judge, label rows.
    fn report(&self, out: &mut Section<'_>) -> Result<(), CoordinatorError> {
        let mut reports = Vec::new();
        for (m, c) in self.config.iter().enumerate() {
            let items: Vec<chainpoll::ItemLabel> = out.labels(m)?;
            for l in &items {
                out.row(l)?;
            }
            let report = chainpoll::score(c, &items);
            let mut v = out.entry(&report, &self.dataset)?;
            if let Some(o) = v.as_object_mut() {
                o.insert("skipped_unbalanced_rows".into(), self.skipped.into());
            }
            out.json.push(v);
            reports.push(report);
        }
        let title = format!("Benchmark {}: chainpoll on `{}`", out.bench, self.dataset.display());
        out.md.push_str(&chainpoll::render_markdown(&title, &reports));
        out.md.push('\n');
        Ok(())
    }
}

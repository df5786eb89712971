//! The `[[benchmark]]` table of a sweep file, and the checks that pipelines share.
//!
//! The table holds every key of every pipeline (serde rejects unknown keys only when
//! one struct lists them all); each pipeline names the keys it takes (its `KEYS`), and
//! [`reject_foreign_keys`] turns a key of another pipeline into an error naming it.

use std::collections::HashSet;
use std::path::Path;

use halyard_pipelines::common::ModelSpec;
use serde::Deserialize;

use super::build::RawBuild;
use super::hvi::RawProbability;
use crate::sweep::{key_err, Model, SweepError};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBenchmark {
    pub(super) pipeline: String,
    /// The dataset file (most pipelines; `noop` has none).
    pub(super) dataset: Option<String>,
    pub(super) models: Vec<String>,
    pub(super) judge: Option<String>,
    pub(super) semantics: Option<String>,
    pub(super) limit: Option<i64>,
    pub(super) system_prompt: Option<String>,
    /// `noop` only: items (one job each) per model under test.
    pub(super) jobs: Option<i64>,
    // autohall and chainpoll
    pub(super) samples: Option<i64>,
    pub(super) temperature: Option<f64>,
    pub(super) classify_temperature: Option<f64>,
    pub(super) refusal_phrases: Option<Vec<String>>,
    pub(super) no_conflict: Option<String>,
    pub(super) polls: Option<i64>,
    pub(super) metrics: Option<Vec<String>>,
    pub(super) unparseable: Option<String>,
    pub(super) sampler: Option<String>,
    /// `uhgeval` only: `paper` (default) or `v2` rules.
    pub(super) variant: Option<String>,
    /// `uhgeval` only: the forms to run (default all four).
    pub(super) forms: Option<Vec<String>>,
    /// `uhgeval` only: the embedding model (`backend = "embed"`) for BERTScore.
    pub(super) bert_embedder: Option<String>,
    /// `hvi` only: a labelled-sentence file instead of a prompt dataset and judge.
    pub(super) labels: Option<String>,
    /// `hvi` only: Eq. 1 weights.
    pub(super) p_efm: Option<RawProbability>,
    pub(super) p_esl: Option<RawProbability>,
    pub(super) delta1: Option<f64>,
    pub(super) delta2: Option<f64>,
    /// `hypotermqa-build` only: `[benchmark.build]`.
    pub(super) build: Option<RawBuild>,
    /// `hypotermqa` only, instead of `dataset`: the index of a `hypotermqa-build` benchmark.
    pub(super) dataset_from: Option<i64>,
}

impl RawBenchmark {
    /// The keys only some pipelines take, in the order they are checked, and whether
    /// this table sets each.
    fn optional_keys(&self) -> [(&'static str, bool); 25] {
        [
            ("judge", self.judge.is_some()),
            ("semantics", self.semantics.is_some()),
            ("system_prompt", self.system_prompt.is_some()),
            ("jobs", self.jobs.is_some()),
            ("samples", self.samples.is_some()),
            ("temperature", self.temperature.is_some()),
            ("classify_temperature", self.classify_temperature.is_some()),
            ("refusal_phrases", self.refusal_phrases.is_some()),
            ("no_conflict", self.no_conflict.is_some()),
            ("polls", self.polls.is_some()),
            ("metrics", self.metrics.is_some()),
            ("unparseable", self.unparseable.is_some()),
            ("sampler", self.sampler.is_some()),
            ("variant", self.variant.is_some()),
            ("forms", self.forms.is_some()),
            ("bert_embedder", self.bert_embedder.is_some()),
            ("labels", self.labels.is_some()),
            ("p_efm", self.p_efm.is_some()),
            ("p_esl", self.p_esl.is_some()),
            ("delta1", self.delta1.is_some()),
            ("delta2", self.delta2.is_some()),
            ("build", self.build.is_some()),
            ("dataset_from", self.dataset_from.is_some()),
            ("dataset", self.dataset.is_some()),
            ("limit", self.limit.is_some()),
        ]
    }
}

/// The first key set on benchmark `i` that `pipeline` does not take (`takes`), as an error.
pub(super) fn reject_foreign_keys(
    f: &str,
    i: usize,
    b: &RawBenchmark,
    pipeline: &str,
    takes: &[&str],
) -> Result<(), SweepError> {
    for (key, set) in b.optional_keys() {
        if set && !takes.contains(&key) {
            return Err(key_err(
                f,
                format!("benchmark[{i}].{key}"),
                format!("does not apply to pipeline {pipeline:?}"),
            ));
        }
    }
    Ok(())
}

/// The model called `name`, or an error naming `key` and the sweep's models.
pub(super) fn model_named<'m>(
    f: &str,
    key: String,
    name: &str,
    models: &'m [Model],
) -> Result<&'m Model, SweepError> {
    models.iter().find(|m| m.spec.name == name).ok_or_else(|| {
        let known: Vec<&str> = models.iter().map(|m| m.spec.name.as_str()).collect();
        key_err(
            f,
            key,
            format!("unknown model {name:?} (models in this sweep: {})", known.join(", ")),
        )
    })
}

/// `benchmark[i].models`: at least one, each known, none twice.
pub(super) fn models_of(
    f: &str,
    i: usize,
    b: &RawBenchmark,
    models: &[Model],
) -> Result<Vec<ModelSpec>, SweepError> {
    if b.models.is_empty() {
        return Err(key_err(
            f,
            format!("benchmark[{i}].models"),
            "needs at least one model under test",
        ));
    }
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (j, name) in b.models.iter().enumerate() {
        let key = format!("benchmark[{i}].models[{j}]");
        if !seen.insert(name) {
            return Err(key_err(f, key, format!("model {name:?} listed twice")));
        }
        out.push(model_named(f, key, name, models)?.spec.clone());
    }
    Ok(out)
}

/// An integer key in `lo..=hi`, `default` when absent.
pub(super) fn int_in(
    f: &str,
    key: String,
    v: Option<i64>,
    lo: i64,
    hi: i64,
    default: i64,
) -> Result<u32, SweepError> {
    let x = v.unwrap_or(default);
    if (lo..=hi).contains(&x) {
        Ok(x as u32)
    } else {
        Err(key_err(f, key, format!("{x} is outside {lo}..={hi}")))
    }
}

/// A sampling temperature key in `0..=2`, `default` when absent.
pub(super) fn temperature(
    f: &str,
    key: String,
    v: Option<f64>,
    default: f32,
) -> Result<f32, SweepError> {
    match v {
        None => Ok(default),
        Some(t) if (0.0..=2.0).contains(&t) => Ok(t as f32),
        Some(t) => Err(key_err(f, key, format!("{t} is outside 0..=2"))),
    }
}

/// `limit`: at least 1 when given.
pub(super) fn limit(f: &str, i: usize, b: &RawBenchmark) -> Result<Option<usize>, SweepError> {
    match b.limit {
        Some(l) if l < 1 => {
            Err(key_err(f, format!("benchmark[{i}].limit"), format!("{l} must be at least 1")))
        }
        l => Ok(l.map(|l| l as usize)),
    }
}

/// A dataset that cannot be used, named with its key (`benchmark[i].<key>`) and path.
pub(super) fn dataset_err(
    f: &str,
    i: usize,
    key: &str,
    path: &Path,
    e: impl std::fmt::Display,
) -> SweepError {
    SweepError::Dataset {
        file: f.to_string(),
        key: format!("benchmark[{i}].{key}"),
        dataset: path.display().to_string(),
        reason: e.to_string(),
    }
}

/// The rows of dataset `path` (read with `read`), the first `limit` of them; none is an
/// error naming the dataset and what it lacks (`rows`: "questions", "items", …).
pub(super) fn read_rows<T, E: std::fmt::Display>(
    f: &str,
    i: usize,
    b: &RawBenchmark,
    path: &Path,
    rows: &str,
    read: impl FnOnce(&Path) -> Result<Vec<T>, E>,
) -> Result<Vec<T>, SweepError> {
    let mut out = read(path).map_err(|e| dataset_err(f, i, "dataset", path, e))?;
    if let Some(l) = limit(f, i, b)? {
        out.truncate(l);
    }
    if out.is_empty() {
        return Err(key_err(
            f,
            format!("benchmark[{i}].dataset"),
            format!("{} holds no {rows}", path.display()),
        ));
    }
    Ok(out)
}

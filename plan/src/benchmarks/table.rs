//! The checks that pipelines share on their `[[benchmark]]` tables: each pipeline reads
//! its own table with [`parse`] (its own serde struct, unknown keys refused).

use std::collections::HashSet;
use std::path::Path;

use halyard_pipelines::common::ModelSpec;
use serde::de::DeserializeOwned;

use super::Checking;
use crate::sweep::error::{key_err, SweepError};
use crate::sweep::models::Model;

/// Benchmark `cx.index`'s table as pipeline `pipeline`'s own struct `T` (which refuses
/// unknown keys): a key of another pipeline, or a misspelt one, is an error naming the
/// key and the keys this pipeline takes; a wrong value names its key.
pub(super) fn parse<T: DeserializeOwned>(
    cx: &Checking<'_>,
    raw: &toml::Table,
    pipeline: &str,
) -> Result<T, SweepError> {
    let (f, i) = (cx.file, cx.index);
    let mut table = raw.clone();
    table.remove("pipeline");
    serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
        let path = e.path().to_string();
        let at = if path == "." { String::new() } else { format!(".{path}") };
        let msg = e.into_inner().message().to_string();
        // The path of an unknown key ends with the key itself.
        match unknown_field(&msg) {
            Some(expected) => key_err(
                f,
                format!("benchmark[{i}]{at}"),
                format!("does not apply to pipeline {pipeline:?} ({expected})"),
            ),
            None => key_err(f, format!("benchmark[{i}]{at}"), msg),
        }
    })
}

/// What serde's "unknown field `x`, expected …" says was expected.
fn unknown_field(msg: &str) -> Option<&str> {
    let rest = msg.strip_prefix("unknown field `")?;
    let (_field, expected) = rest.split_once('`')?;
    Some(expected.trim_start_matches(", "))
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
    names: &[String],
    models: &[Model],
) -> Result<Vec<ModelSpec>, SweepError> {
    if names.is_empty() {
        return Err(key_err(
            f,
            format!("benchmark[{i}].models"),
            "needs at least one model under test",
        ));
    }
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (j, name) in names.iter().enumerate() {
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
pub(super) fn limit(f: &str, i: usize, limit: Option<i64>) -> Result<Option<usize>, SweepError> {
    match limit {
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
    limit_key: Option<i64>,
    path: &Path,
    rows: &str,
    read: impl FnOnce(&Path) -> Result<Vec<T>, E>,
) -> Result<Vec<T>, SweepError> {
    let mut out = read(path).map_err(|e| dataset_err(f, i, "dataset", path, e))?;
    if let Some(l) = limit(f, i, limit_key)? {
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

/// `human_labels = "file.jsonl"` (relative to the sweep file), read and checked against
/// the pipeline's labels; none when the key is absent.
pub(super) fn human_labels(
    cx: &Checking<'_>,
    rel: Option<&str>,
    shape: crate::judging::human::Shape<'_>,
) -> Result<crate::judging::HumanLabels, SweepError> {
    let Some(rel) = rel else { return Ok(Default::default()) };
    let path = cx.base.join(rel);
    crate::judging::HumanLabels::read(&path, shape)
        .map_err(|e| dataset_err(cx.file, cx.index, "human_labels", &path, e))
}

/// `human_truth = "majority" | "mace" | "mace-em"`: how the human labels of a unit
/// become its truth (default `majority`).
pub(super) fn human_truth(
    cx: &Checking<'_>,
    raw: Option<&str>,
) -> Result<crate::judging::truth::HumanTruth, SweepError> {
    match raw {
        None => Ok(Default::default()),
        Some(v) => crate::judging::truth::HumanTruth::parse(v)
            .map_err(|e| key_err(cx.file, format!("benchmark[{}].human_truth", cx.index), e)),
    }
}

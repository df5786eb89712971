//! `pipeline = "hvi"`: the Hallucination Vulnerability Index per model, from a judge's
//! sentence labels on each model's passages (judge mode) or from a labelled-sentence file
//! (see `halyard_pipelines::hvi`).

use std::path::{Path, PathBuf};

use halyard_pipelines::common::{Plan, ResultLookup};
use halyard_pipelines::hvi::{self, Probability, Weights};
use serde::Deserialize;

use super::table::{dataset_err, model_named, models_of, parse, read_rows};
use super::{encoded, Benchmark, Checking, Evaluation, Pipeline};
use crate::report::Section;
use crate::sweep::error::{key_err, SweepError};
use crate::PlanError;

/// `pipeline = "hvi"`: its table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Table {
    models: Vec<String>,
    dataset: Option<String>,
    limit: Option<i64>,
    judge: Option<String>,
    system_prompt: Option<String>,
    /// A labelled-sentence file instead of a prompt dataset and judge.
    labels: Option<String>,
    /// Eq. 1 weights.
    p_efm: Option<RawProbability>,
    p_esl: Option<RawProbability>,
    delta1: Option<f64>,
    delta2: Option<f64>,
}

/// `p_efm` / `p_esl`: a number in [0, 1] or `"relative_frequency"`.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum RawProbability {
    Number(f64),
    Name(String),
}

#[derive(Clone, Debug)]
pub enum Hvi {
    /// Judge mode: passages for prompts, a judge per sentence.
    Judge {
        config: Vec<hvi::Config>,
        dataset: PathBuf,
        prompts: Vec<hvi::Prompt>,
        weights: hvi::Weights,
    },
    /// From a labelled file: one item per model, no job.
    Labels { models: Vec<String>, file: PathBuf, rows: Vec<hvi::LabelRow>, weights: hvi::Weights },
}

fn probability(
    f: &str,
    key: String,
    raw: &Option<RawProbability>,
) -> Result<Probability, SweepError> {
    match raw {
        None => Ok(Probability::RelativeFrequency),
        Some(RawProbability::Name(n)) if n == "relative_frequency" => {
            Ok(Probability::RelativeFrequency)
        }
        Some(RawProbability::Number(p)) if (0.0..=1.0).contains(p) => Ok(Probability::Fixed(*p)),
        Some(RawProbability::Number(p)) => {
            Err(key_err(f, key, format!("{p} is not a probability in [0, 1]")))
        }
        Some(RawProbability::Name(n)) => Err(key_err(
            f,
            key,
            format!("{n:?} is neither a number in [0, 1] nor \"relative_frequency\""),
        )),
    }
}

/// `pipeline = "hvi"`: judge mode (`dataset` of prompts, `models`, `judge`, optional
/// `system_prompt` and `limit`) or labelled mode (`labels` file, `models` = names in it);
/// `p_efm`, `p_esl`, `delta1`, `delta2` in both.
pub(super) fn check(cx: &mut Checking<'_>, raw: &toml::Table) -> Result<Benchmark, SweepError> {
    let table: Table = parse(cx, raw, hvi::PIPELINE)?;
    let b = &table;
    let (f, i) = (cx.file, cx.index);
    let k = |field: &str| format!("benchmark[{i}].{field}");
    let mut weights = Weights {
        p_efm: probability(f, k("p_efm"), &b.p_efm)?,
        p_esl: probability(f, k("p_esl"), &b.p_esl)?,
        ..Weights::default()
    };
    for (key, v, slot) in
        [("delta1", b.delta1, &mut weights.delta1), ("delta2", b.delta2, &mut weights.delta2)]
    {
        if let Some(d) = v {
            if !d.is_finite() {
                return Err(key_err(f, k(key), format!("{d} is not a finite number")));
            }
            *slot = d;
        }
    }
    let hvi =
        match (&b.labels, &b.dataset) {
            (Some(_), Some(_)) => {
                return Err(key_err(
                    f,
                    k("labels"),
                    "give either `labels` (labelled file) or `dataset` (judge mode), not both",
                ))
            }
            (None, None) => return Err(key_err(
                f,
                k("dataset"),
                "required for pipeline \"hvi\": a prompt `dataset` (judge mode) or a `labels` file",
            )),
            (Some(rel), None) => labels_mode(cx, b, rel, weights)?,
            (None, Some(rel)) => judge_mode(cx, b, rel, weights)?,
        };
    Ok(Benchmark::new(hvi))
}

/// Labelled mode: the models named must have rows in the file.
fn labels_mode(
    cx: &Checking<'_>,
    b: &Table,
    rel: &str,
    weights: Weights,
) -> Result<Hvi, SweepError> {
    let (f, i) = (cx.file, cx.index);
    let k = |field: &str| format!("benchmark[{i}].{field}");
    let not_here = [
        ("judge", b.judge.is_some()),
        ("system_prompt", b.system_prompt.is_some()),
        ("limit", b.limit.is_some()),
    ];
    if let Some((key, _)) = not_here.iter().find(|(_, set)| *set) {
        return Err(key_err(
            f,
            k(key),
            format!("does not apply to pipeline {:?}", "hvi with `labels`"),
        ));
    }
    let file = cx.base.join(rel);
    let rows = hvi::read_labels(&file).map_err(|e| dataset_err(f, i, "labels", &file, e))?;
    if b.models.is_empty() {
        return Err(key_err(f, k("models"), "name the models of the labelled file to report"));
    }
    let mut names: Vec<String> = Vec::new();
    for (j, name) in b.models.iter().enumerate() {
        let key = format!("benchmark[{i}].models[{j}]");
        if names.contains(name) {
            return Err(key_err(f, key, format!("model {name:?} listed twice")));
        }
        if !rows.iter().any(|r| &r.model == name) {
            return Err(key_err(
                f,
                key,
                format!("model {name:?} has no rows in {}", file.display()),
            ));
        }
        names.push(name.clone());
    }
    Ok(Hvi::Labels { models: names, file, rows, weights })
}

/// Judge mode: a prompt dataset, the models under test, one judge.
fn judge_mode(
    cx: &Checking<'_>,
    b: &Table,
    rel: &str,
    weights: Weights,
) -> Result<Hvi, SweepError> {
    let (f, i, models) = (cx.file, cx.index, cx.models);
    let k = |field: &str| format!("benchmark[{i}].{field}");
    let judge_name = b.judge.as_deref().ok_or_else(|| {
        key_err(f, k("judge"), "required for pipeline \"hvi\" with a prompt `dataset`")
    })?;
    let judge = model_named(f, k("judge"), judge_name, models)?.spec.clone();
    let config = models_of(f, i, &b.models, models)?
        .into_iter()
        .map(|model| hvi::Config {
            model,
            judge: judge.clone(),
            system_prompt: b.system_prompt.clone(),
        })
        .collect();
    let dataset = cx.base.join(rel);
    let prompts = read_rows(f, i, b.limit, &dataset, "prompts", hvi::read_prompts)?;
    Ok(Hvi::Judge { config, dataset, prompts, weights })
}

impl Pipeline for Hvi {
    fn name(&self) -> &'static str {
        hvi::PIPELINE
    }

    fn model_count(&self) -> usize {
        match self {
            Hvi::Judge { config, .. } => config.len(),
            Hvi::Labels { models, .. } => models.len(),
        }
    }

    fn model_names(&self) -> Vec<String> {
        match self {
            Hvi::Judge { config, .. } => config.iter().map(|c| c.model.name.clone()).collect(),
            Hvi::Labels { models, .. } => models.clone(),
        }
    }

    fn item_count(&self) -> usize {
        match self {
            Hvi::Judge { prompts, .. } => prompts.len(),
            Hvi::Labels { .. } => 1,
        }
    }

    fn evaluate(&self, model: usize, item: u32, known: &dyn ResultLookup) -> Evaluation {
        match self {
            Hvi::Judge { config, prompts, .. } => {
                encoded(hvi::evaluate(&config[model], &prompts[item as usize], known))
            }
            Hvi::Labels { models, rows, .. } => {
                encoded(Plan::Done(hvi::evaluate_labelled(&models[model], rows)))
            }
        }
    }

    /// One section with a leaderboard across the models, and an entry per model.
    fn report(&self, out: &mut Section<'_>) -> Result<(), PlanError> {
        match self {
            Hvi::Judge { config, dataset, weights, .. } => {
                report_judge_mode(out, config, dataset, *weights)
            }
            Hvi::Labels { models, file, weights, .. } => {
                report_labels_mode(out, models, file, *weights)
            }
        }
    }
}

fn report_judge_mode(
    out: &mut Section<'_>,
    config: &[hvi::Config],
    dataset: &Path,
    weights: Weights,
) -> Result<(), PlanError> {
    let mut reports = Vec::new();
    for (m, c) in config.iter().enumerate() {
        let ls: Vec<hvi::ItemLabel> = out.labels_written(m)?;
        let judge_errors =
            ls.iter().flat_map(|l| &l.sentences).filter(|s| s.verdict.is_none()).count() as u64;
        let failed = ls.iter().filter(|l| l.passage_error.is_some()).count() as u64;
        let mut r = hvi::score(
            &c.model.name,
            "judge",
            hvi::plan::counts_of(&ls),
            judge_errors,
            failed,
            weights,
        );
        (r.odd_passages, r.odd_judge_outputs) = hvi::plan::odd_of(&ls);
        out.json.push(out.entry(&r, dataset)?);
        reports.push(r);
    }
    let judge = config.first().map_or(String::new(), |c| c.judge.name.clone());
    let title = format!("hvi on `{}`, judge `{judge}`", dataset.display());
    out.section(&title, &hvi::render_markdown(&reports));
    Ok(())
}

fn report_labels_mode(
    out: &mut Section<'_>,
    models: &[String],
    file: &Path,
    weights: Weights,
) -> Result<(), PlanError> {
    let mut reports = Vec::new();
    for (m, name) in models.iter().enumerate() {
        let ls: Vec<hvi::ModelLabels> = out.labels_written(m)?;
        let counts =
            ls.first().map_or(hvi::plan::evaluate_labelled(name, &[]).counts, |l| l.counts);
        let r = hvi::score(name, "labels", counts, 0, 0, weights);
        out.json.push(out.entry(&r, file)?);
        reports.push(r);
    }
    let title = format!("hvi from labelled sentences `{}`", file.display());
    out.section(&title, &hvi::render_markdown(&reports));
    Ok(())
}

//! `pipeline = "hypotermqa"`: HypoTermQA evaluation of each model under test on a
//! question dataset (or on one built in the same run: `dataset_from`), with one judge.

use std::collections::HashSet;
use std::path::PathBuf;

use halyard_pipelines::common::ResultLookup;
use halyard_pipelines::hypotermqa::{self, Question, Semantics};

use serde::Deserialize;

use super::table::{model_named, parse, read_rows};
use super::{build, encoded, Benchmark, Checking, Evaluation, Pipeline};
use crate::report::Section;
use crate::sweep::error::{key_err, SweepError};
use crate::PlanError;

/// `pipeline = "hypotermqa"`: its table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Table {
    models: Vec<String>,
    dataset: Option<String>,
    /// Instead of `dataset`: the index of a `hypotermqa-build` benchmark.
    dataset_from: Option<i64>,
    judge: Option<String>,
    semantics: Option<String>,
    system_prompt: Option<String>,
    limit: Option<i64>,
}

#[derive(Clone, Debug)]
pub struct HypoTermQa {
    pub config: Vec<hypotermqa::Config>,
    pub dataset: PathBuf,
    pub questions: Vec<Question>,
}

/// `pipeline = "hypotermqa"`: `dataset` (or `dataset_from`), `models`, `judge`, optional
/// `semantics`, `system_prompt` and `limit`.
pub(super) fn check(cx: &mut Checking<'_>, raw: &toml::Table) -> Result<Benchmark, SweepError> {
    let table: Table = parse(cx, raw, hypotermqa::PIPELINE)?;
    let b = &table;
    let (f, i) = (cx.file, cx.index);
    let k = |field: &str| format!("benchmark[{i}].{field}");
    if b.models.is_empty() {
        return Err(key_err(f, k("models"), "needs at least one model under test"));
    }
    let dataset_rel = dataset_key(cx, b)?;
    let config = configs(cx, b)?;
    if b.dataset_from.is_some() {
        // Read after the build phase (build::load_built).
        let dataset = PathBuf::from(format!("<benchmark[{i}].dataset_from>"));
        return Ok(Benchmark::new(HypoTermQa { config, dataset, questions: Vec::new() }));
    }
    let dataset = cx.base.join(dataset_rel);
    let questions =
        read_rows(f, i, b.limit, &dataset, "questions", |p| hypotermqa::read_dataset(p))?;
    Ok(Benchmark::new(HypoTermQa { config, dataset, questions }))
}

/// `dataset` (its path as given), or `dataset_from` (an earlier build, recorded in
/// `cx.built_inputs`; the path is then empty).
fn dataset_key(cx: &mut Checking<'_>, b: &Table) -> Result<String, SweepError> {
    let (f, i) = (cx.file, cx.index);
    let k = |field: &str| format!("benchmark[{i}].{field}");
    match (&b.dataset, b.dataset_from) {
        (Some(d), None) => Ok(d.clone()),
        (None, Some(from)) => {
            let built = build::dataset_from(f, i, from, &cx.earlier)?;
            let limit = match b.limit {
                Some(l) if l < 1 => {
                    return Err(key_err(f, k("limit"), format!("{l} must be at least 1")))
                }
                l => l.map(|l| l as usize),
            };
            cx.built_inputs.push(build::BuiltInput { eval: i, build: built, limit });
            Ok(String::new())
        }
        (Some(_), Some(_)) => {
            Err(key_err(f, k("dataset_from"), "give `dataset` or `dataset_from`, not both"))
        }
        (None, None) => Err(key_err(
            f,
            k("dataset"),
            "required for pipeline \"hypotermqa\" (or `dataset_from`)",
        )),
    }
}

/// One configuration per model under test, all with the benchmark's judge and semantics.
fn configs(cx: &Checking<'_>, b: &Table) -> Result<Vec<hypotermqa::Config>, SweepError> {
    let (f, i, models) = (cx.file, cx.index, cx.models);
    let k = |field: &str| format!("benchmark[{i}].{field}");
    let judge_name = b
        .judge
        .as_deref()
        .ok_or_else(|| key_err(f, k("judge"), "required for pipeline \"hypotermqa\""))?;
    let judge = model_named(f, k("judge"), judge_name, models)?.spec.clone();
    let semantics = match b.semantics.as_deref().unwrap_or("paper") {
        "paper" => Semantics::Paper,
        "reference" => Semantics::Reference,
        other => {
            return Err(key_err(
                f,
                k("semantics"),
                format!("{other:?} is not \"paper\" or \"reference\""),
            ))
        }
    };
    let mut config = Vec::new();
    let mut seen = HashSet::new();
    for (j, name) in b.models.iter().enumerate() {
        if !seen.insert(name) {
            return Err(key_err(
                f,
                format!("benchmark[{i}].models[{j}]"),
                format!("model {name:?} listed twice"),
            ));
        }
        let model = model_named(f, format!("benchmark[{i}].models[{j}]"), name, models)?;
        config.push(hypotermqa::Config {
            semantics,
            model: model.spec.clone(),
            judge: judge.clone(),
            system_prompt: b.system_prompt.clone(),
        });
    }
    Ok(config)
}

impl Pipeline for HypoTermQa {
    fn name(&self) -> &'static str {
        hypotermqa::PIPELINE
    }

    fn model_names(&self) -> Vec<String> {
        self.config.iter().map(|c| c.model.name.clone()).collect()
    }

    fn item_count(&self) -> usize {
        self.questions.len()
    }

    fn evaluate(&self, model: usize, item: u32, known: &dyn ResultLookup) -> Evaluation {
        encoded(hypotermqa::evaluate(&self.config[model], &self.questions[item as usize], known))
    }

    /// One section per model under test, with its score and its rows in `labels.jsonl`.
    fn report(&self, out: &mut Section<'_>) -> Result<(), PlanError> {
        let (b, dataset) = (out.bench, &self.dataset);
        let counts = hypotermqa::QuestionCounts::from_questions(&self.questions);
        for (m, c) in self.config.iter().enumerate() {
            let labels: Vec<hypotermqa::ItemLabel> = out.labels(m)?;
            let first = out.lines();
            for l in &labels {
                out.row(l)?;
            }
            let meta = hypotermqa::ScoreMeta {
                model: c.model.name.clone(),
                judge: c.judge.name.clone(),
                semantics: c.semantics,
            };
            let report = hypotermqa::score(&meta, &counts, &labels);
            out.md
                .push_str(&format!("## Benchmark {b}: hypotermqa on `{}`\n\n", dataset.display()));
            out.md.push_str(&hypotermqa::render_markdown(&report));
            out.md.push('\n');
            let mut v = out.entry(&report, dataset)?;
            if let Some(o) = v.as_object_mut() {
                o.insert("labels_lines".into(), serde_json::json!([first, out.lines()]));
            }
            out.json.push(v);
        }
        Ok(())
    }
}

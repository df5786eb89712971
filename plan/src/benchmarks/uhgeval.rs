//! `pipeline = "uhgeval"`: UHGEval's four forms (keyword, sentence, selective,
//! generative) on a news dataset, per model under test (see `halyard_pipelines::uhgeval`).

use std::path::PathBuf;

use halyard_pipelines::common::ResultLookup;
use halyard_pipelines::metrics::uhgeval::UhgVariant;
use halyard_pipelines::uhgeval::{self, Form};

use serde::Deserialize;

use super::table::{model_named, models_of, parse, read_rows};
use super::{encoded, Benchmark, Checking, Evaluation, Pipeline};
use crate::report::Section;
use crate::sweep::error::{key_err, SweepError};
use crate::PlanError;

/// `pipeline = "uhgeval"`: its table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Table {
    models: Vec<String>,
    dataset: Option<String>,
    limit: Option<i64>,
    /// `paper` (default) or `v2` rules.
    variant: Option<String>,
    /// The forms to run (default all four).
    forms: Option<Vec<String>>,
    /// The embedding model (`backend = "embed"`) for BERTScore.
    bert_embedder: Option<String>,
}

/// UHGEval: every configured form on every item, per model.
#[derive(Clone, Debug)]
pub struct UhgEval {
    pub config: Vec<uhgeval::Config>,
    pub dataset: PathBuf,
    pub cases: Vec<uhgeval::Case>,
}

/// `pipeline = "uhgeval"`: `dataset`, `models`, optional `variant` (`paper`|`v2`), `forms`
/// (default all four), `bert_embedder` (a model with `backend = "embed"`) and `limit`.
pub(super) fn check(cx: &mut Checking<'_>, raw: &toml::Table) -> Result<Benchmark, SweepError> {
    let table: Table = parse(cx, raw, uhgeval::PIPELINE)?;
    let b = &table;
    let (f, base, i, models) = (cx.file, cx.base, cx.index, cx.models);
    let k = |field: &str| format!("benchmark[{i}].{field}");
    let variant = match b.variant.as_deref().unwrap_or("paper") {
        "paper" => UhgVariant::Paper,
        "v2" => UhgVariant::V2,
        other => {
            return Err(key_err(f, k("variant"), format!("{other:?} is not \"paper\" or \"v2\"")))
        }
    };
    let forms = match &b.forms {
        None => Form::ALL.to_vec(),
        Some(names) => {
            let mut forms = Vec::new();
            for (j, n) in names.iter().enumerate() {
                let form = Form::parse(n).ok_or_else(|| {
                    key_err(f, format!("benchmark[{i}].forms[{j}]"), format!("{n:?} is not one of \"keyword\", \"sentence\", \"selective\", \"generative\""))
                })?;
                if forms.contains(&form) {
                    return Err(key_err(
                        f,
                        format!("benchmark[{i}].forms[{j}]"),
                        format!("form {n:?} listed twice"),
                    ));
                }
                forms.push(form);
            }
            if forms.is_empty() {
                return Err(key_err(f, k("forms"), "needs at least one form"));
            }
            forms
        }
    };
    let bert_embedder = match &b.bert_embedder {
        None => None,
        Some(name) => {
            let m = model_named(f, k("bert_embedder"), name, models)?;
            if m.spec.model_ref.backend != "embed" {
                return Err(key_err(
                    f,
                    k("bert_embedder"),
                    format!("model {name:?} must have backend \"embed\""),
                ));
            }
            if !forms.contains(&Form::Generative) {
                return Err(key_err(
                    f,
                    k("bert_embedder"),
                    "BERTScore scores the generative form, which `forms` leaves out",
                ));
            }
            Some(m.spec.clone())
        }
    };
    let config = models_of(f, i, &b.models, models)?
        .into_iter()
        .map(|model| uhgeval::Config {
            variant,
            forms: forms.clone(),
            model,
            // UHGEval's top_p 0.9 / top_k 5 where the backend supports them (issue 16).
            generation: uhgeval::Generation::default(),
            bert_embedder: bert_embedder.clone(),
        })
        .collect();
    let rel = b
        .dataset
        .as_ref()
        .ok_or_else(|| key_err(f, k("dataset"), "required for pipeline \"uhgeval\""))?;
    let dataset = base.join(rel);
    let items = read_rows(f, i, b.limit, &dataset, "items", uhgeval::read_dataset)?;
    Ok(Benchmark::new(UhgEval { config, dataset, cases: uhgeval::prepare(items) }))
}

impl Pipeline for UhgEval {
    fn name(&self) -> &'static str {
        uhgeval::PIPELINE
    }

    fn model_names(&self) -> Vec<String> {
        self.config.iter().map(|c| c.model.name.clone()).collect()
    }

    fn item_count(&self) -> usize {
        self.cases.len()
    }

    fn evaluate(&self, model: usize, item: u32, known: &dyn ResultLookup) -> Evaluation {
        encoded(uhgeval::evaluate(&self.config[model], &self.cases[item as usize], known))
    }

    /// One section with a leaderboard across the models, and an entry per model.
    fn report(&self, out: &mut Section<'_>) -> Result<(), PlanError> {
        let mut reports = Vec::new();
        for (m, c) in self.config.iter().enumerate() {
            let ls: Vec<uhgeval::ItemLabel> = out.labels_written(m)?;
            // With `bert_embedder`, BERTScore comes from the `bert` jobs; else not computed.
            let r = uhgeval::score_config(c, &self.cases, &ls, None);
            out.json.push(out.entry(&r, &self.dataset)?);
            reports.push(r);
        }
        let title = format!("uhgeval on `{}`", self.dataset.display());
        out.section(&title, &uhgeval::render_markdown(&reports));
        Ok(())
    }
}

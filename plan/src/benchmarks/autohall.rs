//! `pipeline = "autohall"`: AutoHall on a claim file, per model under test: references,
//! classification, hallucination labels, and self-contradiction detection with K samples
//! (see `halyard_pipelines::autohall`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use halyard_pipelines::autohall;
use halyard_pipelines::common::ResultLookup;
use halyard_pipelines::metrics::autohall::NoConflictPhrases;

use serde::Deserialize;

use super::table::{dataset_err, int_in, limit, models_of, parse, temperature};
use super::{encoded, Benchmark, Checking, Evaluation, Pipeline};
use crate::report::Section;
use crate::sweep::error::{key_err, SweepError};
use crate::PlanError;

/// `pipeline = "autohall"`: its table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Table {
    models: Vec<String>,
    dataset: Option<String>,
    limit: Option<i64>,
    samples: Option<i64>,
    temperature: Option<f64>,
    classify_temperature: Option<f64>,
    refusal_phrases: Option<Vec<String>>,
    no_conflict: Option<String>,
}

/// AutoHall: claims of a fact-checking file; `samples` = K of the detection step.
#[derive(Clone, Debug)]
pub struct AutoHall {
    pub config: Vec<autohall::Config>,
    pub dataset: PathBuf,
    pub claims: Vec<autohall::Claim>,
    /// Claims dropped from the file, by reason.
    pub dropped: BTreeMap<String, u64>,
    pub samples: u32,
}

/// `pipeline = "autohall"`: `dataset` of claims, `models`, optional `samples` (K),
/// `temperature`, `classify_temperature`, `refusal_phrases`, `no_conflict` and `limit`.
pub(super) fn check(cx: &mut Checking<'_>, raw: &toml::Table) -> Result<Benchmark, SweepError> {
    let table: Table = parse(cx, raw, autohall::PIPELINE)?;
    let b = &table;
    let (f, base, i, models) = (cx.file, cx.base, cx.index, cx.models);
    let k = |field: &str| format!("benchmark[{i}].{field}");
    let specs = models_of(f, i, &b.models, models)?;
    let samples =
        int_in(f, k("samples"), b.samples, 0, 1000, autohall::plan::DEFAULT_SAMPLES as i64)?;
    let classify_t = temperature(
        f,
        k("classify_temperature"),
        b.classify_temperature,
        autohall::plan::DEFAULT_CLASSIFY_TEMPERATURE,
    )?;
    let no_conflict = match b.no_conflict.as_deref().unwrap_or("standard") {
        "standard" => NoConflictPhrases::Standard,
        "llama2_13b" => NoConflictPhrases::Llama2_13b,
        other => {
            return Err(key_err(
                f,
                k("no_conflict"),
                format!("{other:?} is not \"standard\" or \"llama2_13b\""),
            ))
        }
    };
    let refusal_phrases: Vec<String> = match &b.refusal_phrases {
        None => autohall::plan::DEFAULT_REFUSAL_PHRASES.iter().map(|s| s.to_string()).collect(),
        Some(list) => {
            if let Some(j) = list.iter().position(|p| p.trim().is_empty()) {
                return Err(key_err(
                    f,
                    format!("benchmark[{i}].refusal_phrases[{j}]"),
                    "must not be empty",
                ));
            }
            list.iter().map(|p| p.to_lowercase()).collect()
        }
    };
    let mut config = Vec::new();
    for spec in specs {
        let mut model = spec.clone();
        model.temperature = temperature(f, k("temperature"), b.temperature, spec.temperature)?;
        let mut classifier = spec;
        classifier.temperature = classify_t;
        config.push(autohall::Config {
            model,
            classifier,
            samples,
            refusal_phrases: refusal_phrases.clone(),
            no_conflict,
            // The paper reports its baselines beside detection (issue 16).
            baselines: samples > 0,
        });
    }
    let Some(rel) = &b.dataset else {
        return Err(key_err(f, k("dataset"), "required for pipeline \"autohall\""));
    };
    let dataset = base.join(rel);
    let mut set =
        autohall::read_claims(&dataset).map_err(|e| dataset_err(f, i, "dataset", &dataset, e))?;
    if let Some(l) = limit(f, i, b.limit)? {
        set.claims.truncate(l);
    }
    if set.claims.is_empty() {
        return Err(key_err(
            f,
            k("dataset"),
            format!("{} holds no claim with a kept label", dataset.display()),
        ));
    }
    Ok(Benchmark::new(AutoHall {
        config,
        dataset,
        claims: set.claims,
        dropped: set.dropped,
        samples,
    }))
}

impl Pipeline for AutoHall {
    fn name(&self) -> &'static str {
        autohall::PIPELINE
    }

    fn model_names(&self) -> Vec<String> {
        self.config.iter().map(|c| c.model.name.clone()).collect()
    }

    fn item_count(&self) -> usize {
        self.claims.len()
    }

    fn evaluate(&self, model: usize, item: u32, known: &dyn ResultLookup) -> Evaluation {
        let claim = &self.claims[item as usize];
        encoded(autohall::evaluate(&self.config[model], item, claim, known))
    }

    /// One section with a leaderboard across the models, figures per model, and label
    /// rows (each with `balanced`: whether the reference is in the detection set).
    fn report(&self, out: &mut Section<'_>) -> Result<(), PlanError> {
        let claims = self.claims.len() as u64;
        let mut reports = Vec::new();
        for (m, c) in self.config.iter().enumerate() {
            let items: Vec<autohall::ItemLabel> = out.labels(m)?;
            let balanced = autohall::balanced_set(&items);
            for l in &items {
                let mut v = serde_json::to_value(l).map_err(|e| out.err(e))?;
                if let Some(o) = v.as_object_mut() {
                    o.insert("balanced".into(), balanced.contains(&l.index).into());
                }
                out.row(&v)?;
            }
            let report =
                autohall::score(&c.model.name, claims, &self.dropped, self.samples, &items);
            out.json.push(out.entry(&report, &self.dataset)?);
            reports.push(report);
        }
        let title = format!("Benchmark {}: autohall on `{}`", out.bench, self.dataset.display());
        out.md.push_str(&autohall::render_markdown(&title, &reports));
        out.md.push('\n');
        Ok(())
    }
}

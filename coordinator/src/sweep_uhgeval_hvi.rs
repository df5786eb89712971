//! Sweep checks for the `uhgeval` and `hvi` pipelines (a child module of `sweep`, so it
//! shares its private raw types).

use std::path::Path;

use halyard_pipelines::hvi::{self, Probability, Weights};
use halyard_pipelines::metrics::uhgeval::UhgVariant;
use halyard_pipelines::uhgeval::{self, Form};
use serde::Deserialize;

use super::{key_err, Benchmark, Model, RawBenchmark, SweepError};

/// `p_efm` / `p_esl`: a number in [0, 1] or `"relative_frequency"`.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum RawProbability {
    Number(f64),
    Name(String),
}

/// Keys set on a benchmark that its pipeline does not use.
fn reject(f: &str, i: usize, pipeline: &str, keys: &[(&str, bool)]) -> Result<(), SweepError> {
    match keys.iter().find(|(_, set)| *set) {
        Some((key, _)) => Err(key_err(f, format!("benchmark[{i}].{key}"), format!("does not apply to pipeline {pipeline:?}"))),
        None => Ok(()),
    }
}

/// The models under test, each defined in the sweep and listed once.
fn dataset_err(f: &str, i: usize, key: &str, path: &Path, e: impl std::fmt::Display) -> SweepError {
    SweepError::Dataset { file: f.to_string(), key: format!("benchmark[{i}].{key}"), dataset: path.display().to_string(), reason: e.to_string() }
}

fn limit(f: &str, i: usize, b: &RawBenchmark) -> Result<Option<usize>, SweepError> {
    match b.limit {
        Some(l) if l < 1 => Err(key_err(f, format!("benchmark[{i}].limit"), format!("{l} must be at least 1"))),
        l => Ok(l.map(|l| l as usize)),
    }
}

/// `pipeline = "uhgeval"`: `dataset`, `models`, optional `variant` (`paper`|`v2`), `forms`
/// (default all four) and `limit`.
pub(super) fn uhgeval_benchmark(f: &str, i: usize, b: &RawBenchmark, models: &[Model], base: &Path) -> Result<Benchmark, SweepError> {
    let k = |field: &str| format!("benchmark[{i}].{field}");
    super::judged::reject_foreign_keys(f, i, b, "uhgeval")?;
    let variant = match b.variant.as_deref().unwrap_or("paper") {
        "paper" => UhgVariant::Paper,
        "v2" => UhgVariant::V2,
        other => return Err(key_err(f, k("variant"), format!("{other:?} is not \"paper\" or \"v2\""))),
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
                    return Err(key_err(f, format!("benchmark[{i}].forms[{j}]"), format!("form {n:?} listed twice")));
                }
                forms.push(form);
            }
            if forms.is_empty() {
                return Err(key_err(f, k("forms"), "needs at least one form"));
            }
            forms
        }
    };
    let config = super::judged::models_of(f, i, b, models)?
        .into_iter()
        .map(|model| uhgeval::Config { variant, forms: forms.clone(), model })
        .collect();
    let rel = b.dataset.as_ref().ok_or_else(|| key_err(f, k("dataset"), "required for pipeline \"uhgeval\""))?;
    let dataset = base.join(rel);
    let mut items = uhgeval::read_dataset(&dataset).map_err(|e| dataset_err(f, i, "dataset", &dataset, e))?;
    if let Some(l) = limit(f, i, b)? {
        items.truncate(l);
    }
    if items.is_empty() {
        return Err(key_err(f, k("dataset"), format!("{} holds no items", dataset.display())));
    }
    Ok(Benchmark::UhgEval { config, dataset, cases: uhgeval::prepare(items) })
}

fn probability(f: &str, key: String, raw: &Option<RawProbability>) -> Result<Probability, SweepError> {
    match raw {
        None => Ok(Probability::RelativeFrequency),
        Some(RawProbability::Name(n)) if n == "relative_frequency" => Ok(Probability::RelativeFrequency),
        Some(RawProbability::Number(p)) if (0.0..=1.0).contains(p) => Ok(Probability::Fixed(*p)),
        Some(RawProbability::Number(p)) => Err(key_err(f, key, format!("{p} is not a probability in [0, 1]"))),
        Some(RawProbability::Name(n)) => Err(key_err(f, key, format!("{n:?} is neither a number in [0, 1] nor \"relative_frequency\""))),
    }
}

/// `pipeline = "hvi"`: judge mode (`dataset` of prompts, `models`, `judge`, optional
/// `system_prompt` and `limit`) or labelled mode (`labels` file, `models` = names in it);
/// `p_efm`, `p_esl`, `delta1`, `delta2` in both.
pub(super) fn hvi_benchmark(f: &str, i: usize, b: &RawBenchmark, models: &[Model], base: &Path) -> Result<Benchmark, SweepError> {
    let k = |field: &str| format!("benchmark[{i}].{field}");
    super::judged::reject_foreign_keys(f, i, b, "hvi")?;
    let mut weights = Weights { p_efm: probability(f, k("p_efm"), &b.p_efm)?, p_esl: probability(f, k("p_esl"), &b.p_esl)?, ..Weights::default() };
    for (key, v, slot) in [("delta1", b.delta1, &mut weights.delta1), ("delta2", b.delta2, &mut weights.delta2)] {
        if let Some(d) = v {
            if !d.is_finite() {
                return Err(key_err(f, k(key), format!("{d} is not a finite number")));
            }
            *slot = d;
        }
    }
    match (&b.labels, &b.dataset) {
        (Some(_), Some(_)) => Err(key_err(f, k("labels"), "give either `labels` (labelled file) or `dataset` (judge mode), not both")),
        (None, None) => Err(key_err(f, k("dataset"), "required for pipeline \"hvi\": a prompt `dataset` (judge mode) or a `labels` file")),
        (Some(rel), None) => {
            reject(f, i, "hvi with `labels`", &[("judge", b.judge.is_some()), ("system_prompt", b.system_prompt.is_some()), ("limit", b.limit.is_some())])?;
            let file = base.join(rel);
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
                    return Err(key_err(f, key, format!("model {name:?} has no rows in {}", file.display())));
                }
                names.push(name.clone());
            }
            Ok(Benchmark::HviLabels { models: names, file, rows, weights })
        }
        (None, Some(rel)) => {
            let judge_name = b.judge.as_deref().ok_or_else(|| key_err(f, k("judge"), "required for pipeline \"hvi\" with a prompt `dataset`"))?;
            let judge = super::judged::model_named(f, k("judge"), judge_name, models)?;
            let config = super::judged::models_of(f, i, b, models)?
                .into_iter()
                .map(|model| hvi::Config { model, judge: judge.clone(), system_prompt: b.system_prompt.clone() })
                .collect();
            let dataset = base.join(rel);
            let mut prompts = hvi::read_prompts(&dataset).map_err(|e| dataset_err(f, i, "dataset", &dataset, e))?;
            if let Some(l) = limit(f, i, b)? {
                prompts.truncate(l);
            }
            if prompts.is_empty() {
                return Err(key_err(f, k("dataset"), format!("{} holds no prompts", dataset.display())));
            }
            Ok(Benchmark::HviJudge { config, dataset, prompts, weights })
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::parse;

    fn sweep(benchmark: &str) -> String {
        let ds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../datasets");
        format!(
            "name = \"t\"\n[[model]]\nname = \"a\"\nbackend = \"noop\"\n{}",
            benchmark.replace("DATASETS", &ds.display().to_string())
        )
    }

    /// Forms default to all four and keep their order; variant defaults to paper; limit applies.
    #[test]
    fn uhgeval_defaults() {
        let s = parse(Path::new("/tmp/s.toml"), &sweep("[[benchmark]]\npipeline = \"uhgeval\"\ndataset = \"DATASETS/uhgeval/uhgeval_concise_sample_20.jsonl\"\nmodels = [\"a\"]\nlimit = 3\n")).unwrap();
        let b = &s.benchmarks[0];
        assert_eq!((b.pipeline(), b.model_count(), b.item_count()), ("uhgeval", 1, 3));
        let super::Benchmark::UhgEval { config, .. } = b else { panic!() };
        assert_eq!(config[0].forms.len(), 4);
        assert_eq!(config[0].variant, super::UhgVariant::Paper);
    }

    /// The new keys are errors on other pipelines, and an HVI benchmark needs exactly one input.
    #[test]
    fn foreign_keys_rejected() {
        let e = parse(Path::new("/tmp/s.toml"), &sweep("[[benchmark]]\npipeline = \"noop\"\njobs = 1\nmodels = [\"a\"]\nvariant = \"v2\"\n")).unwrap_err();
        assert!(e.to_string().contains("benchmark[0].variant`: does not apply to pipeline \"noop\""), "{e}");
        let e = parse(Path::new("/tmp/s.toml"), &sweep("[[benchmark]]\npipeline = \"hvi\"\nmodels = [\"a\"]\n")).unwrap_err();
        assert!(e.to_string().contains("benchmark[0].dataset`: required"), "{e}");
        let both = "[[benchmark]]\npipeline = \"hvi\"\nmodels = [\"a\"]\nlabels = \"x\"\ndataset = \"y\"\n";
        assert!(parse(Path::new("/tmp/s.toml"), &sweep(both)).unwrap_err().to_string().contains("not both"));
        let delta = "[[benchmark]]\npipeline = \"hvi\"\nmodels = [\"a\"]\njudge = \"a\"\ndataset = \"DATASETS/hvi/climate_fever_claims_12.jsonl\"\ndelta1 = nan\n";
        assert!(parse(Path::new("/tmp/s.toml"), &sweep(delta)).unwrap_err().to_string().contains("benchmark[0].delta1"));
    }
}

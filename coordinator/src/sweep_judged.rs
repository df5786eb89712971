//! Sweep checks of the `autohall` and `chainpoll` benchmarks (a child module of
//! [`super`], so that it reads the raw structs there).

use std::collections::HashSet;
use std::path::Path;

use halyard_pipelines::chainpoll::{self, Metric};
use halyard_pipelines::metrics::chainpoll::Unparseable;
use halyard_pipelines::autohall;
use halyard_pipelines::common::ModelSpec;
use halyard_pipelines::metrics::autohall::NoConflictPhrases;

use super::{gguf_identity, key_err, Benchmark, Model, RawBenchmark, RawModel, SweepError};

/// Keys that only some pipelines take: (key, set, pipelines that take it).
pub(super) fn reject_foreign_keys(f: &str, i: usize, b: &RawBenchmark, pipeline: &str) -> Result<(), SweepError> {
    const READERS: &[&str] = &["hypotermqa", "autohall", "chainpoll", "uhgeval", "hvi"];
    let keys: [(&str, bool, &[&str]); 24] = [
        ("judge", b.judge.is_some(), &["hypotermqa", "hvi"]),
        ("semantics", b.semantics.is_some(), &["hypotermqa"]),
        ("system_prompt", b.system_prompt.is_some(), &["hypotermqa", "hvi"]),
        ("jobs", b.jobs.is_some(), &["noop"]),
        ("samples", b.samples.is_some(), &["autohall", "chainpoll"]),
        ("temperature", b.temperature.is_some(), &["autohall"]),
        ("classify_temperature", b.classify_temperature.is_some(), &["autohall"]),
        ("refusal_phrases", b.refusal_phrases.is_some(), &["autohall"]),
        ("no_conflict", b.no_conflict.is_some(), &["autohall"]),
        ("polls", b.polls.is_some(), &["chainpoll"]),
        ("metrics", b.metrics.is_some(), &["chainpoll"]),
        ("unparseable", b.unparseable.is_some(), &["chainpoll"]),
        ("sampler", b.sampler.is_some(), &["chainpoll"]),
        ("variant", b.variant.is_some(), &["uhgeval"]),
        ("forms", b.forms.is_some(), &["uhgeval"]),
        ("labels", b.labels.is_some(), &["hvi"]),
        ("p_efm", b.p_efm.is_some(), &["hvi"]),
        ("p_esl", b.p_esl.is_some(), &["hvi"]),
        ("delta1", b.delta1.is_some(), &["hvi"]),
        ("delta2", b.delta2.is_some(), &["hvi"]),
        ("build", b.build.is_some(), &["hypotermqa-build"]),
        ("dataset_from", b.dataset_from.is_some(), &["hypotermqa"]),
        ("dataset", b.dataset.is_some(), READERS),
        ("limit", b.limit.is_some(), READERS),
    ];
    // hypotermqa checks its first four keys itself (with its own messages).
    let legacy = pipeline == "hypotermqa";
    for (n, (key, set, takes)) in keys.into_iter().enumerate() {
        if legacy && n < 4 {
            continue;
        }
        if set && !takes.contains(&pipeline) {
            return Err(key_err(f, format!("benchmark[{i}].{key}"), format!("does not apply to pipeline {pipeline:?}")));
        }
    }
    Ok(())
}

/// The model called `name`, or an error naming `key` and the sweep's models.
pub(super) fn model_named(f: &str, key: String, name: &str, models: &[Model]) -> Result<ModelSpec, SweepError> {
    models.iter().find(|m| m.spec.name == name).map(|m| m.spec.clone()).ok_or_else(|| {
        let known: Vec<&str> = models.iter().map(|m| m.spec.name.as_str()).collect();
        key_err(f, key, format!("unknown model {name:?} (models in this sweep: {})", known.join(", ")))
    })
}

/// `benchmark[i].models`: at least one, each known, none twice.
pub(super) fn models_of(f: &str, i: usize, b: &RawBenchmark, models: &[Model]) -> Result<Vec<ModelSpec>, SweepError> {
    if b.models.is_empty() {
        return Err(key_err(f, format!("benchmark[{i}].models"), "needs at least one model under test"));
    }
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (j, name) in b.models.iter().enumerate() {
        let key = format!("benchmark[{i}].models[{j}]");
        if !seen.insert(name) {
            return Err(key_err(f, key, format!("model {name:?} listed twice")));
        }
        out.push(model_named(f, key, name, models)?);
    }
    Ok(out)
}

fn int_in(f: &str, key: String, v: Option<i64>, lo: i64, hi: i64, default: i64) -> Result<u32, SweepError> {
    let x = v.unwrap_or(default);
    if (lo..=hi).contains(&x) {
        Ok(x as u32)
    } else {
        Err(key_err(f, key, format!("{x} is outside {lo}..={hi}")))
    }
}

fn temperature(f: &str, key: String, v: Option<f64>, default: f32) -> Result<f32, SweepError> {
    match v {
        None => Ok(default),
        Some(t) if (0.0..=2.0).contains(&t) => Ok(t as f32),
        Some(t) => Err(key_err(f, key, format!("{t} is outside 0..=2"))),
    }
}

fn limit(f: &str, i: usize, b: &RawBenchmark) -> Result<Option<usize>, SweepError> {
    match b.limit {
        Some(l) if l < 1 => Err(key_err(f, format!("benchmark[{i}].limit"), format!("{l} must be at least 1"))),
        l => Ok(l.map(|l| l as usize)),
    }
}

/// `pipeline = "autohall"`.
pub(super) fn autohall_benchmark(f: &str, base: &Path, i: usize, b: &RawBenchmark, models: &[Model]) -> Result<Benchmark, SweepError> {
    let k = |field: &str| format!("benchmark[{i}].{field}");
    reject_foreign_keys(f, i, b, "autohall")?;
    let specs = models_of(f, i, b, models)?;
    let samples = int_in(f, k("samples"), b.samples, 0, 1000, autohall::plan::DEFAULT_SAMPLES as i64)?;
    let classify_t =
        temperature(f, k("classify_temperature"), b.classify_temperature, autohall::plan::DEFAULT_CLASSIFY_TEMPERATURE)?;
    let no_conflict = match b.no_conflict.as_deref().unwrap_or("standard") {
        "standard" => NoConflictPhrases::Standard,
        "llama2_13b" => NoConflictPhrases::Llama2_13b,
        other => return Err(key_err(f, k("no_conflict"), format!("{other:?} is not \"standard\" or \"llama2_13b\""))),
    };
    let refusal_phrases: Vec<String> = match &b.refusal_phrases {
        None => autohall::plan::DEFAULT_REFUSAL_PHRASES.iter().map(|s| s.to_string()).collect(),
        Some(list) => {
            if let Some(j) = list.iter().position(|p| p.trim().is_empty()) {
                return Err(key_err(f, format!("benchmark[{i}].refusal_phrases[{j}]"), "must not be empty"));
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
        config.push(autohall::Config { model, classifier, samples, refusal_phrases: refusal_phrases.clone(), no_conflict });
    }
    let Some(rel) = &b.dataset else { return Err(key_err(f, k("dataset"), "required for pipeline \"autohall\"")) };
    let dataset = base.join(rel);
    let mut set = autohall::read_claims(&dataset).map_err(|e| SweepError::Dataset {
        file: f.to_string(),
        key: k("dataset"),
        dataset: dataset.display().to_string(),
        reason: e.to_string(),
    })?;
    if let Some(l) = limit(f, i, b)? {
        set.claims.truncate(l);
    }
    if set.claims.is_empty() {
        return Err(key_err(f, k("dataset"), format!("{} holds no claim with a kept label", dataset.display())));
    }
    Ok(Benchmark::AutoHall { config, dataset, claims: set.claims, dropped: set.dropped, samples })
}

/// `pipeline = "chainpoll"`: `models` are the judges under evaluation.
pub(super) fn chainpoll_benchmark(f: &str, base: &Path, i: usize, b: &RawBenchmark, models: &[Model]) -> Result<Benchmark, SweepError> {
    let k = |field: &str| format!("benchmark[{i}].{field}");
    reject_foreign_keys(f, i, b, "chainpoll")?;
    let judges = models_of(f, i, b, models)?;
    let polls = int_in(f, k("polls"), b.polls, 1, 100, chainpoll::plan::DEFAULT_POLLS as i64)?;
    let mut metrics = Vec::new();
    for (j, m) in b.metrics.clone().unwrap_or_else(|| vec!["correctness".into()]).iter().enumerate() {
        let metric = match m.as_str() {
            "correctness" => Metric::Correctness,
            "adherence" => Metric::Adherence,
            other => return Err(key_err(f, format!("benchmark[{i}].metrics[{j}]"), format!("{other:?} is not \"correctness\" or \"adherence\""))),
        };
        if metrics.contains(&metric) {
            return Err(key_err(f, format!("benchmark[{i}].metrics[{j}]"), format!("{m:?} listed twice")));
        }
        metrics.push(metric);
    }
    if metrics.is_empty() {
        return Err(key_err(f, k("metrics"), "needs at least one of \"correctness\", \"adherence\""));
    }
    let unparseable = match b.unparseable.as_deref().unwrap_or("exclude") {
        "exclude" => Unparseable::Exclude,
        "no" => Unparseable::CountAsNo,
        other => return Err(key_err(f, k("unparseable"), format!("{other:?} is not \"exclude\" or \"no\""))),
    };
    let sampler = match &b.sampler {
        None if b.samples.is_some() => return Err(key_err(f, k("samples"), "needs `sampler`, the model that draws the samples")),
        None => None,
        Some(name) => {
            let spec = model_named(f, k("sampler"), name, models)?;
            Some((spec, int_in(f, k("samples"), b.samples, 1, 1000, chainpoll::plan::DEFAULT_SAMPLES as i64)?))
        }
    };
    let Some(rel) = &b.dataset else { return Err(key_err(f, k("dataset"), "required for pipeline \"chainpoll\"")) };
    let dataset = base.join(rel);
    let ds_err = |reason: String| SweepError::Dataset { file: f.to_string(), key: k("dataset"), dataset: dataset.display().to_string(), reason };
    let mut set = chainpoll::read_items(&dataset).map_err(|e| ds_err(e.to_string()))?;
    if let Some(l) = limit(f, i, b)? {
        set.items.truncate(l);
    }
    if set.items.is_empty() {
        return Err(key_err(f, k("dataset"), format!("{} holds no item", dataset.display())));
    }
    if metrics.contains(&Metric::Adherence) {
        if let Some(item) = set.items.iter().find(|it| it.context.is_none()) {
            return Err(ds_err(format!("line {}: metric \"adherence\" needs a `context`, and this item has none", item.line)));
        }
    }
    let config = judges
        .into_iter()
        .map(|judge| chainpoll::Config { judge, polls, metrics: metrics.clone(), unparseable, sampler: sampler.clone() })
        .collect();
    Ok(Benchmark::ChainPoll { config, dataset, items: set.items, skipped: set.skipped_unbalanced })
}

/// Where a `replay` model's recorded results are.
#[derive(Clone, Debug, PartialEq)]
pub enum ReplayFrom {
    /// A JSON Lines file of request/response pairs.
    Jsonl(std::path::PathBuf),
    /// A Halyard worker checkpoint, and the model reference its jobs had.
    Checkpoint { dir: std::path::PathBuf, backend: String, endpoint: String },
}

/// A model with `backend = "replay"`.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayModel {
    /// Its identity in job keys: `replay:<absolute recordings path>`.
    pub endpoint: String,
    pub from: ReplayFrom,
}

/// `backend = "replay"`: `recordings` (a `.jsonl` file, or a checkpoint directory with
/// `recorded_endpoint` and optional `recorded_backend`); these keys on another backend
/// are errors.
pub(super) fn replay_model(f: &str, base: &Path, i: usize, m: &RawModel) -> Result<Option<ReplayModel>, SweepError> {
    let k = |field: &str| format!("model[{i}].{field}");
    if m.backend != "replay" {
        for (key, set) in [
            ("recordings", m.recordings.is_some()),
            ("recorded_backend", m.recorded_backend.is_some()),
            ("recorded_endpoint", m.recorded_endpoint.is_some()),
        ] {
            if set {
                return Err(key_err(f, k(key), "only applies to backend \"replay\""));
            }
        }
        return Ok(None);
    }
    if m.base_url.is_some() {
        return Err(key_err(f, k("base_url"), "does not apply to backend \"replay\" (it calls nothing)"));
    }
    let rel = m.recordings.as_ref().ok_or_else(|| {
        key_err(f, k("recordings"), "required for backend \"replay\": a JSONL file of request/response pairs or a Halyard checkpoint directory")
    })?;
    let path = base.join(rel);
    let from = if path.is_dir() {
        let backend = m.recorded_backend.clone().unwrap_or_else(|| "openai".into());
        let given = m.recorded_endpoint.clone().ok_or_else(|| {
            key_err(f, k("recorded_endpoint"), "required when `recordings` is a checkpoint: the base_url (or model_path for gguf) of the recorded model")
        })?;
        let endpoint = match backend.as_str() {
            "openai" => given.trim_end_matches('/').to_string(),
            "gguf" => gguf_identity(&base.join(&given)).map_err(|e| key_err(f, k("recorded_endpoint"), format!("{given}: {e}")))?,
            other => return Err(key_err(f, k("recorded_backend"), format!("{other:?} is not \"openai\" or \"gguf\""))),
        };
        ReplayFrom::Checkpoint { dir: path.clone(), backend, endpoint }
    } else if path.is_file() {
        for (key, set) in [("recorded_backend", m.recorded_backend.is_some()), ("recorded_endpoint", m.recorded_endpoint.is_some())] {
            if set {
                return Err(key_err(f, k(key), "only applies when `recordings` is a checkpoint directory"));
            }
        }
        ReplayFrom::Jsonl(path.clone())
    } else {
        return Err(key_err(f, k("recordings"), format!("{}: no such file or directory", path.display())));
    };
    // The absolute path, so that the job ids do not depend on the working directory.
    let identity = std::fs::canonicalize(&path).unwrap_or(path);
    Ok(Some(ReplayModel { endpoint: format!("replay:{}", identity.display()), from }))
}

#[cfg(test)]
mod tests {
    use super::super::parse;
    use super::*;

    fn sweep(bench: &str, extra_model: &str) -> Result<super::super::Sweep, SweepError> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let text = format!(
            "name = \"t\"\n[[model]]\nname = \"m\"\nbackend = \"noop\"\n{extra_model}\n[[benchmark]]\n{}\n",
            bench.replace("ROOT", &root.display().to_string())
        );
        parse(&root.join("s.toml"), &text)
    }

    fn err(bench: &str) -> String {
        sweep(bench, "").expect_err("must be rejected").to_string()
    }

    const AH: &str = "pipeline = \"autohall\"\ndataset = \"ROOT/datasets/autohall/pubhealth_sample.jsonl\"\nmodels = [\"m\"]";
    const CP: &str = "pipeline = \"chainpoll\"\ndataset = \"ROOT/datasets/chainpoll/autohall_climate_gpt35.jsonl\"\nmodels = [\"m\"]";

    /// Defaults: K 13, classification at 0.1, references at the model's temperature; the
    /// PubHealth sample (with NaN) loads; ChainPoll N 5, correctness, exclude.
    #[test]
    fn defaults() {
        let s = sweep(AH, "").unwrap();
        let Benchmark::AutoHall { config, claims, samples, .. } = &s.benchmarks[0] else { panic!() };
        assert_eq!((*samples, claims.len(), config[0].classifier.temperature), (13, 40, 0.1));
        let s = sweep(&format!("{CP}\nsampler = \"m\""), "").unwrap();
        let Benchmark::ChainPoll { config, items, .. } = &s.benchmarks[0] else { panic!() };
        assert_eq!((config[0].polls, items.len(), config[0].metrics.as_slice()), (5, 60, &[Metric::Correctness][..]));
        assert_eq!(config[0].sampler.as_ref().map(|s| s.1), Some(20));
    }

    /// Bad keys and values name the key; foreign keys are rejected.
    #[test]
    fn bad_keys() {
        for (bench, needle) in [
            (format!("{AH}\nsamples = -1"), "benchmark[0].samples`: -1 is outside"),
            (format!("{AH}\ntemperature = 3.0"), "benchmark[0].temperature`: 3 is outside"),
            (format!("{AH}\nno_conflict = \"loose\""), "benchmark[0].no_conflict`"),
            (format!("{AH}\nrefusal_phrases = [\" \"]"), "benchmark[0].refusal_phrases[0]`: must not be empty"),
            (format!("{AH}\npolls = 3"), "benchmark[0].polls`: does not apply to pipeline \"autohall\""),
            (format!("{AH}\njudge = \"m\""), "benchmark[0].judge`: does not apply"),
            (AH.replace("pubhealth_sample", "missing"), "benchmark[0].dataset`"),
            (format!("{CP}\nmetrics = [\"truth\"]"), "benchmark[0].metrics[0]`"),
            (format!("{CP}\nmetrics = [\"adherence\"]"), "needs a `context`"),
            (format!("{CP}\nsamples = 3"), "benchmark[0].samples`: needs `sampler`"),
            (format!("{CP}\nsampler = \"x\""), "benchmark[0].sampler`: unknown model \"x\""),
            (format!("{CP}\nunparseable = \"yes\""), "benchmark[0].unparseable`"),
            (format!("{CP}\ntemperature = 0.5"), "benchmark[0].temperature`: does not apply to pipeline \"chainpoll\""),
            (format!("{CP}\npolls = 0"), "benchmark[0].polls`: 0 is outside"),
        ] {
            let e = err(&bench);
            assert!(e.contains(needle), "{needle:?} not in {e:?}");
        }
    }

    /// Replay models: a JSONL file or a checkpoint directory (which needs the recorded
    /// endpoint); replay keys on other backends and missing recordings are errors.
    #[test]
    fn replay_models() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").display().to_string();
        let r = |extra: &str| format!("[[model]]\nname = \"r\"\nbackend = \"replay\"\n{extra}");
        let s = sweep(AH, &r(&format!("recordings = \"{root}/datasets/autohall/climate_sample.jsonl\""))).unwrap();
        assert!(matches!(s.models[1].replay.as_ref().unwrap().from, ReplayFrom::Jsonl(_)));
        assert!(s.models[1].spec.model_ref.endpoint.starts_with("replay:"));
        let s = sweep(AH, &r(&format!("recordings = \"{root}/datasets\"\nrecorded_endpoint = \"http://x/v1/\""))).unwrap();
        let ReplayFrom::Checkpoint { endpoint, backend, .. } = &s.models[1].replay.as_ref().unwrap().from else { panic!() };
        assert_eq!((backend.as_str(), endpoint.as_str()), ("openai", "http://x/v1"));
        for (extra, needle) in [
            (r(""), "model[1].recordings`: required"),
            (r("recordings = \"nope.jsonl\""), "no such file"),
            (r(&format!("recordings = \"{root}/datasets\"")), "model[1].recorded_endpoint`: required"),
            (r(&format!("recordings = \"{root}/README.md\"\nrecorded_endpoint = \"x\"")), "only applies when `recordings` is a checkpoint"),
            ("[[model]]\nname = \"r\"\nbackend = \"noop\"\nrecordings = \"x\"".to_string(), "model[1].recordings`: only applies to backend \"replay\""),
        ] {
            let e = sweep(AH, &extra).expect_err("must be rejected").to_string();
            assert!(e.contains(needle), "{needle:?} not in {e:?}");
        }
    }
}

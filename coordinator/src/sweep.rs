//! The sweep file: parsed into raw serde structs (unknown keys rejected), then checked
//! into a [`Sweep`] that refers only to known pipelines and models and whose datasets
//! have been read. Every error names the file, the key and what was expected.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use halyard_pipelines::common::ModelSpec;
use halyard_pipelines::hypotermqa::{self, Question, Semantics};
use halyard_proto::ModelRef;
use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("cannot read sweep file {file}: {reason}")]
    Read { file: String, reason: String },
    #[error("{file}: {reason}")]
    Syntax { file: String, reason: String },
    #[error("{file}: key `{key}`: {reason}")]
    Key { file: String, key: String, reason: String },
    #[error("{file}: key `{key}`: dataset {dataset}: {reason}")]
    Dataset { file: String, key: String, dataset: String, reason: String },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSweep {
    name: String,
    #[serde(default)]
    model: Vec<RawModel>,
    #[serde(default)]
    benchmark: Vec<RawBenchmark>,
    #[serde(default)]
    run: Option<RawRun>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    name: String,
    backend: String,
    base_url: Option<String>,
    model: Option<String>,
    api_key_env: Option<String>,
    pool: Option<String>,
    max_concurrency: Option<i64>,
    temperature: Option<f64>,
    max_tokens: Option<i64>,
    seed: Option<u64>,
    timeout_s: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBenchmark {
    pipeline: String,
    dataset: String,
    models: Vec<String>,
    judge: Option<String>,
    semantics: Option<String>,
    limit: Option<i64>,
    system_prompt: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRun {
    max_deliver: Option<i64>,
    ack_wait_s: Option<f64>,
}

/// A model of the sweep, checked.
#[derive(Clone, Debug)]
pub struct Model {
    pub spec: ModelSpec,
    pub max_concurrency: usize,
}

#[derive(Clone, Debug)]
pub enum Benchmark {
    HypoTermQa { config: Vec<hypotermqa::Config>, dataset: PathBuf, questions: Vec<Question> },
}

impl Benchmark {
    pub fn pipeline(&self) -> &'static str {
        match self {
            Benchmark::HypoTermQa { .. } => "hypotermqa",
        }
    }
    /// One configuration per model under test.
    pub fn model_count(&self) -> usize {
        match self {
            Benchmark::HypoTermQa { config, .. } => config.len(),
        }
    }
    pub fn item_count(&self) -> usize {
        match self {
            Benchmark::HypoTermQa { questions, .. } => questions.len(),
        }
    }
}

/// Settings of the run itself.
#[derive(Clone, Debug)]
pub struct RunSettings {
    pub max_deliver: i64,
    pub ack_wait: std::time::Duration,
}

#[derive(Clone, Debug)]
pub struct Sweep {
    pub file: PathBuf,
    pub name: String,
    pub models: Vec<Model>,
    pub benchmarks: Vec<Benchmark>,
    pub run: RunSettings,
}

impl Sweep {
    /// Pools and the concurrency each needs (the largest `max_concurrency` of its models).
    pub fn pools(&self) -> BTreeMap<String, usize> {
        let mut pools = BTreeMap::new();
        for m in &self.models {
            let e = pools.entry(m.spec.pool.clone()).or_insert(0);
            *e = (*e).max(m.max_concurrency);
        }
        pools
    }
}

fn key_err(file: &str, key: impl Into<String>, reason: impl Into<String>) -> SweepError {
    SweepError::Key { file: file.to_string(), key: key.into(), reason: reason.into() }
}

/// Read and check a sweep file, including its datasets.
pub fn load(path: &Path) -> Result<Sweep, SweepError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| SweepError::Read { file: file.clone(), reason: e.to_string() })?;
    parse(path, &text)
}

/// Check a sweep given as text; relative dataset paths resolve against `path`'s folder.
pub fn parse(path: &Path, text: &str) -> Result<Sweep, SweepError> {
    let file = path.display().to_string();
    let raw: RawSweep = toml::from_str(text).map_err(|e| SweepError::Syntax { file: file.clone(), reason: e.to_string() })?;
    let f = file.as_str();
    if raw.name.is_empty()
        || raw.name.starts_with('.')
        || !raw.name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(key_err(f, "name", format!("{:?} is not a valid run name (letters, digits, '-', '_', '.')", raw.name)));
    }
    let mut models = Vec::new();
    let mut names = HashSet::new();
    for (i, m) in raw.model.iter().enumerate() {
        let k = |field: &str| format!("model[{i}].{field}");
        if m.name.is_empty() {
            return Err(key_err(f, k("name"), "must not be empty"));
        }
        if !names.insert(m.name.clone()) {
            return Err(key_err(f, k("name"), format!("duplicate model name {:?}", m.name)));
        }
        let endpoint = match m.backend.as_str() {
            "openai" => {
                let url = m.base_url.clone().ok_or_else(|| key_err(f, k("base_url"), "required for backend \"openai\""))?;
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(key_err(f, k("base_url"), format!("{url:?} is not an http:// or https:// URL")));
                }
                url.trim_end_matches('/').to_string()
            }
            "noop" => String::new(),
            other => {
                return Err(key_err(f, k("backend"), format!("unknown backend {other:?} (expected \"openai\" or \"noop\")")))
            }
        };
        let api_model = match (&m.model, m.backend.as_str()) {
            (Some(x), _) => x.clone(),
            (None, "noop") => m.name.clone(),
            (None, _) => return Err(key_err(f, k("model"), "required: the model name sent to the API")),
        };
        let temperature = m.temperature.unwrap_or(0.0);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(key_err(f, k("temperature"), format!("{temperature} is outside 0..=2")));
        }
        let max_concurrency = m.max_concurrency.unwrap_or(4);
        if !(1..=4096).contains(&max_concurrency) {
            return Err(key_err(f, k("max_concurrency"), format!("{max_concurrency} is outside 1..=4096")));
        }
        let max_tokens = match m.max_tokens {
            None => None,
            Some(t) if (1..=1_000_000).contains(&t) => Some(t as u32),
            Some(t) => return Err(key_err(f, k("max_tokens"), format!("{t} is outside 1..=1000000"))),
        };
        let timeout_s = m.timeout_s.unwrap_or(120.0);
        if !(timeout_s.is_finite() && timeout_s > 0.0 && timeout_s <= 86_400.0) {
            return Err(key_err(f, k("timeout_s"), format!("{timeout_s} is not a number of seconds in (0, 86400]")));
        }
        if let Some(env) = &m.api_key_env {
            if env.is_empty() || env.contains('=') || env.contains('\0') {
                return Err(key_err(f, k("api_key_env"), "must be the NAME of an environment variable"));
            }
        }
        let pool = m.pool.clone().unwrap_or_else(|| m.name.clone());
        if pool.is_empty() {
            return Err(key_err(f, k("pool"), "must not be empty"));
        }
        models.push(Model {
            spec: ModelSpec {
                name: m.name.clone(),
                model_ref: ModelRef { backend: m.backend.clone(), endpoint, model: api_model },
                pool,
                api_key_env: m.api_key_env.clone(),
                temperature: temperature as f32,
                max_tokens,
                seed: m.seed,
                timeout_ms: (timeout_s * 1000.0) as u64,
            },
            max_concurrency: max_concurrency as usize,
        });
    }
    let find = |key: String, name: &str| -> Result<ModelSpec, SweepError> {
        models.iter().find(|m| m.spec.name == name).map(|m| m.spec.clone()).ok_or_else(|| {
            let known: Vec<&str> = models.iter().map(|m| m.spec.name.as_str()).collect();
            key_err(f, key, format!("unknown model {name:?} (models in this sweep: {})", known.join(", ")))
        })
    };
    let base = path.parent().unwrap_or(Path::new("."));
    let mut benchmarks = Vec::new();
    if raw.benchmark.is_empty() {
        return Err(key_err(f, "benchmark", "at least one [[benchmark]] is required"));
    }
    for (i, b) in raw.benchmark.iter().enumerate() {
        let k = |field: &str| format!("benchmark[{i}].{field}");
        match b.pipeline.as_str() {
            "hypotermqa" => {}
            other => return Err(key_err(f, k("pipeline"), format!("unknown pipeline {other:?} (expected \"hypotermqa\")"))),
        }
        if b.models.is_empty() {
            return Err(key_err(f, k("models"), "needs at least one model under test"));
        }
        let judge_name = b.judge.as_deref().ok_or_else(|| key_err(f, k("judge"), "required for pipeline \"hypotermqa\""))?;
        let judge = find(k("judge"), judge_name)?;
        let semantics = match b.semantics.as_deref().unwrap_or("paper") {
            "paper" => Semantics::Paper,
            "reference" => Semantics::Reference,
            other => return Err(key_err(f, k("semantics"), format!("{other:?} is not \"paper\" or \"reference\""))),
        };
        let mut config = Vec::new();
        let mut seen = HashSet::new();
        for (j, name) in b.models.iter().enumerate() {
            if !seen.insert(name) {
                return Err(key_err(f, format!("benchmark[{i}].models[{j}]"), format!("model {name:?} listed twice")));
            }
            let model = find(format!("benchmark[{i}].models[{j}]"), name)?;
            config.push(hypotermqa::Config { semantics, model, judge: judge.clone(), system_prompt: b.system_prompt.clone() });
        }
        let dataset = base.join(&b.dataset);
        let mut questions = hypotermqa::read_dataset(&dataset).map_err(|e| SweepError::Dataset {
            file: file.clone(),
            key: k("dataset"),
            dataset: dataset.display().to_string(),
            reason: e.to_string(),
        })?;
        if let Some(limit) = b.limit {
            if limit < 1 {
                return Err(key_err(f, k("limit"), format!("{limit} must be at least 1")));
            }
            questions.truncate(limit as usize);
        }
        if questions.is_empty() {
            return Err(key_err(f, k("dataset"), format!("{} holds no questions", dataset.display())));
        }
        benchmarks.push(Benchmark::HypoTermQa { config, dataset, questions });
    }
    let rr = raw.run.unwrap_or(RawRun { max_deliver: None, ack_wait_s: None });
    let max_deliver = rr.max_deliver.unwrap_or(5);
    if !(1..=100).contains(&max_deliver) {
        return Err(key_err(f, "run.max_deliver", format!("{max_deliver} is outside 1..=100")));
    }
    let ack_wait_s = rr.ack_wait_s.unwrap_or(30.0);
    if !(ack_wait_s.is_finite() && (1.0..=3600.0).contains(&ack_wait_s)) {
        return Err(key_err(f, "run.ack_wait_s", format!("{ack_wait_s} is outside 1..=3600 seconds")));
    }
    Ok(Sweep {
        file: path.to_path_buf(),
        name: raw.name,
        models,
        benchmarks,
        run: RunSettings { max_deliver, ack_wait: std::time::Duration::from_secs_f64(ack_wait_s) },
    })
}

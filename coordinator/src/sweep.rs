//! The sweep file: parsed into raw serde structs (unknown keys rejected), then checked
//! into a [`Sweep`] that refers only to known pipelines and models and whose datasets
//! have been read. Every error names the file, the key and what was expected.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use halyard_pipelines::common::ModelSpec;
use halyard_pipelines::hypotermqa::{self, Question, Semantics};
use halyard_pipelines::{autohall, chainpoll, hvi, hypotermqa_build, noop, uhgeval};
use halyard_proto::ModelRef;
use serde::Deserialize;

#[path = "sweep_quota.rs"]
mod sweep_quota;
pub use sweep_quota::{check_quota, QuotaSpec};

/// `pipeline = "hypotermqa-build"`, embedding models and built datasets.
#[path = "build.rs"]
pub mod build;

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
    /// Pool quota (see `sweep_quota`).
    rpm: Option<i64>,
    tpm: Option<i64>,
    burst: Option<i64>,
    temperature: Option<f64>,
    max_tokens: Option<i64>,
    seed: Option<u64>,
    timeout_s: Option<f64>,
    // gguf backend
    model_path: Option<String>,
    gpu: Option<i64>,
    gpu_layers: Option<i64>,
    slots: Option<i64>,
    threads: Option<i64>,
    ctx_size: Option<i64>,
    // replay backend
    recordings: Option<String>,
    recorded_backend: Option<String>,
    recorded_endpoint: Option<String>,
    /// USD per million input/output tokens (cost accounting, `--max-cost`).
    price: Option<RawPrice>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPrice {
    input: f64,
    output: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBenchmark {
    pipeline: String,
    /// Required by `hypotermqa`; `noop` has no dataset.
    dataset: Option<String>,
    models: Vec<String>,
    judge: Option<String>,
    semantics: Option<String>,
    limit: Option<i64>,
    system_prompt: Option<String>,
    /// `noop` only: items (one job each) per model under test.
    jobs: Option<i64>,
    // autohall and chainpoll (checked in sweep_judged.rs)
    samples: Option<i64>,
    temperature: Option<f64>,
    classify_temperature: Option<f64>,
    refusal_phrases: Option<Vec<String>>,
    no_conflict: Option<String>,
    polls: Option<i64>,
    metrics: Option<Vec<String>>,
    unparseable: Option<String>,
    sampler: Option<String>,
    /// `uhgeval` only: `paper` (default) or `v2` rules.
    variant: Option<String>,
    /// `uhgeval` only: the forms to run (default all four).
    forms: Option<Vec<String>>,
    /// `hvi` only: a labelled-sentence file instead of a prompt dataset and judge.
    labels: Option<String>,
    /// `hvi` only: Eq. 1 weights.
    p_efm: Option<uhgeval_hvi::RawProbability>,
    p_esl: Option<uhgeval_hvi::RawProbability>,
    delta1: Option<f64>,
    delta2: Option<f64>,
    /// `hypotermqa-build` only: `[benchmark.build]`.
    build: Option<build::RawBuild>,
    /// `hypotermqa` only, instead of `dataset`: the index of a `hypotermqa-build` benchmark.
    dataset_from: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRun {
    max_deliver: Option<i64>,
    ack_wait_s: Option<f64>,
    window: Option<i64>,
    max_cost: Option<f64>,
    job_batch: Option<i64>,
}

/// A model of the sweep, checked.
#[derive(Clone, Debug)]
pub struct Model {
    pub spec: ModelSpec,
    pub max_concurrency: usize,
    /// For `backend = "gguf"`: the file and how to run it.
    pub local: Option<LocalModel>,
    /// For `backend = "replay"`: where the recorded results are.
    pub replay: Option<judged::ReplayModel>,
    /// `price = { input = …, output = … }`: USD per million tokens.
    pub price: Option<crate::cost::Price>,
    /// The quota of this model's pool, if it gives one.
    pub quota: Option<QuotaSpec>,
    /// For `backend = "embed"`: the model folder.
    pub embed: Option<PathBuf>,
}

/// A GGUF model run inside the worker.
#[derive(Clone, Debug, PartialEq)]
pub struct LocalModel {
    pub path: PathBuf,
    /// GPU index, or None for CPU.
    pub gpu: Option<u32>,
    /// Layers offloaded to the GPU (default: all).
    pub gpu_layers: u32,
    /// Sequences decoded together in one batch.
    pub slots: usize,
    /// CPU threads (0: all available cores).
    pub threads: usize,
    /// Context length per slot, in tokens.
    pub ctx_size: u32,
}

impl LocalModel {
    /// `cpu` or `gpuN`: the placement carried in the pool name.
    pub fn placement(&self) -> String {
        match self.gpu {
            None => "cpu".into(),
            Some(n) => format!("gpu{n}"),
        }
    }
}

/// A location-independent identity of a model file: name, size and a hash of its first
/// MiB (the GGUF header, metadata and vocabulary). Job ids use it, so workers that keep
/// the same file under another path share checkpoints and de-duplication.
pub fn gguf_identity(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let size = f.metadata()?.len();
    let mut head = Vec::with_capacity(1 << 20);
    (&mut f).take(1 << 20).read_to_end(&mut head)?;
    if head.len() < 4 || &head[..4] != b"GGUF" {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "not a GGUF file (no GGUF magic)"));
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let h = blake3::hash(&head);
    let hex: String = h.as_bytes()[..8].iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("gguf:{name}:{size}:{hex}"))
}

#[derive(Clone, Debug)]
pub enum Benchmark {
    HypoTermQa { config: Vec<hypotermqa::Config>, dataset: PathBuf, questions: Vec<Question> },
    /// `jobs` items of one free job each per model: measures the job path.
    Noop { config: Vec<noop::Config>, jobs: u32 },
    /// AutoHall: claims of a fact-checking file; `samples` = K of the detection step.
    AutoHall {
        config: Vec<autohall::Config>,
        dataset: PathBuf,
        claims: Vec<autohall::Claim>,
        dropped: BTreeMap<String, u64>,
        samples: u32,
    },
    /// ChainPoll: labelled items judged by each model (the judges under evaluation).
    ChainPoll { config: Vec<chainpoll::Config>, dataset: PathBuf, items: Vec<chainpoll::Item>, skipped: u64 },
    /// UHGEval: every configured form on every item, per model.
    UhgEval { config: Vec<uhgeval::Config>, dataset: PathBuf, cases: Vec<uhgeval::Case> },
    /// HVI, judge mode: passages for prompts, a judge per sentence.
    HviJudge { config: Vec<hvi::Config>, dataset: PathBuf, prompts: Vec<hvi::Prompt>, weights: hvi::Weights },
    /// HVI from a labelled file: one item per model, no job.
    HviLabels { models: Vec<String>, file: PathBuf, rows: Vec<hvi::LabelRow>, weights: hvi::Weights },
    /// Builds a HypoTermQA dataset: one item per topic, one generator.
    HypoTermQaBuild { config: Vec<hypotermqa_build::Config>, knowledge_base: PathBuf },
}

impl Benchmark {
    pub fn pipeline(&self) -> &'static str {
        match self {
            Benchmark::HypoTermQa { .. } => "hypotermqa",
            Benchmark::Noop { .. } => noop::PIPELINE,
            Benchmark::AutoHall { .. } => autohall::PIPELINE,
            Benchmark::ChainPoll { .. } => chainpoll::PIPELINE,
            Benchmark::UhgEval { .. } => uhgeval::PIPELINE,
            Benchmark::HviJudge { .. } | Benchmark::HviLabels { .. } => hvi::PIPELINE,
            Benchmark::HypoTermQaBuild { .. } => hypotermqa_build::PIPELINE,
        }
    }
    /// One configuration per model under test.
    pub fn model_count(&self) -> usize {
        match self {
            Benchmark::HypoTermQa { config, .. } => config.len(),
            Benchmark::Noop { config, .. } => config.len(),
            Benchmark::AutoHall { config, .. } => config.len(),
            Benchmark::ChainPoll { config, .. } => config.len(),
            Benchmark::UhgEval { config, .. } => config.len(),
            Benchmark::HviJudge { config, .. } => config.len(),
            Benchmark::HviLabels { models, .. } => models.len(),
            Benchmark::HypoTermQaBuild { config, .. } => config.len(),
        }
    }
    pub fn item_count(&self) -> usize {
        match self {
            Benchmark::HypoTermQa { questions, .. } => questions.len(),
            Benchmark::Noop { jobs, .. } => *jobs as usize,
            Benchmark::AutoHall { claims, .. } => claims.len(),
            Benchmark::ChainPoll { items, .. } => items.len(),
            Benchmark::UhgEval { cases, .. } => cases.len(),
            Benchmark::HviJudge { prompts, .. } => prompts.len(),
            Benchmark::HviLabels { .. } => 1,
            Benchmark::HypoTermQaBuild { config, .. } => config.iter().map(|c| c.topic_count()).max().unwrap_or(0),
        }
    }
}

/// Largest `jobs` of a noop benchmark (item indices are 32-bit in the run state).
pub const MAX_NOOP_JOBS: i64 = 1_000_000_000;
/// Largest `[run] job_batch` (a job message is also sent once its jobs take 256 KiB).
pub const MAX_JOB_BATCH: i64 = 256;
/// Default of `[run] window`.
pub const DEFAULT_WINDOW: usize = 4096;

/// Settings of the run itself.
#[derive(Clone, Debug)]
pub struct RunSettings {
    pub max_deliver: i64,
    pub ack_wait: std::time::Duration,
    /// Unfinished items the coordinator keeps planned at once, per benchmark and model
    /// under test; it plans more as they finish (`[run] window`).
    pub window: usize,
    /// `[run] max_cost` (USD): no new paid calls once the run has spent this much.
    pub max_cost: Option<f64>,
    /// `[run] job_batch`: jobs per job message (default 1). Above 1, the jobs planned
    /// together for a pool travel as one message: one publish, delivery and ack for up to
    /// this many jobs. For cheap, fast jobs (no-op, small local models); see README.
    pub job_batch: usize,
}

#[derive(Clone, Debug)]
pub struct Sweep {
    pub file: PathBuf,
    pub name: String,
    pub models: Vec<Model>,
    pub benchmarks: Vec<Benchmark>,
    pub run: RunSettings,
    /// Quotas of the pools that have one.
    pub quotas: BTreeMap<String, QuotaSpec>,
    /// Evaluation benchmarks that read a dataset built in this run (`dataset_from`).
    pub built_inputs: Vec<build::BuiltInput>,
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
        let base = path.parent().unwrap_or(Path::new("."));
        let mut local = None;
        let replay = judged::replay_model(f, base, i, m)?;
        let mut embed = None;
        let endpoint = match m.backend.as_str() {
            "openai" => {
                let url = m.base_url.clone().ok_or_else(|| key_err(f, k("base_url"), "required for backend \"openai\""))?;
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(key_err(f, k("base_url"), format!("{url:?} is not an http:// or https:// URL")));
                }
                url.trim_end_matches('/').to_string()
            }
            "noop" => String::new(),
            "replay" => replay.as_ref().map(|r| r.endpoint.clone()).unwrap_or_default(),
            "embed" => {
                let rel = m.model_path.clone().ok_or_else(|| key_err(f, k("model_path"), "required for backend \"embed\" (the model folder)"))?;
                let dir = base.join(&rel);
                let id = build::embed_identity(&dir).map_err(|e| {
                    key_err(f, k("model_path"), format!("{}: {e} (fetch the embedding model with scripts/fetch-embedder.sh)", dir.display()))
                })?;
                embed = Some(dir);
                id
            }
            "gguf" => {
                let rel = m.model_path.clone().ok_or_else(|| key_err(f, k("model_path"), "required for backend \"gguf\""))?;
                let file = base.join(&rel);
                let id = gguf_identity(&file).map_err(|e| {
                    key_err(f, k("model_path"), format!("{}: {e} (fetch the default model with scripts/fetch-model.sh)", file.display()))
                })?;
                let int = |v: Option<i64>, key: &str, lo: i64, hi: i64, default: i64| -> Result<i64, SweepError> {
                    let x = v.unwrap_or(default);
                    if (lo..=hi).contains(&x) {
                        Ok(x)
                    } else {
                        Err(key_err(f, k(key), format!("{x} is outside {lo}..={hi}")))
                    }
                };
                let gpu = match m.gpu {
                    None => None,
                    Some(g) => Some(int(Some(g), "gpu", 0, 63, 0)? as u32),
                };
                local = Some(LocalModel {
                    path: file,
                    gpu,
                    gpu_layers: int(m.gpu_layers, "gpu_layers", 0, 100_000, 100_000)? as u32,
                    slots: int(m.slots, "slots", 1, 256, 4)? as usize,
                    threads: int(m.threads, "threads", 0, 1024, 0)? as usize,
                    ctx_size: int(m.ctx_size, "ctx_size", 256, 1 << 20, 4096)? as u32,
                });
                id
            }
            other => {
                return Err(key_err(
                    f,
                    k("backend"),
                    format!("unknown backend {other:?} (expected \"openai\", \"gguf\", \"replay\", \"embed\" or \"noop\")"),
                ))
            }
        };
        if m.backend != "gguf" {
            for (key, set) in [
                ("model_path", m.model_path.is_some() && m.backend != "embed"),
                ("gpu", m.gpu.is_some()),
                ("gpu_layers", m.gpu_layers.is_some()),
                ("slots", m.slots.is_some()),
                ("threads", m.threads.is_some()),
                ("ctx_size", m.ctx_size.is_some()),
            ] {
                if set {
                    return Err(key_err(f, k(key), "only applies to backend \"gguf\""));
                }
            }
        }
        let api_model = match (&m.model, m.backend.as_str()) {
            (Some(x), _) => x.clone(),
            (None, "noop" | "gguf" | "replay" | "embed") => m.name.clone(),
            (None, _) => return Err(key_err(f, k("model"), "required: the model name sent to the API")),
        };
        let temperature = m.temperature.unwrap_or(0.0);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(key_err(f, k("temperature"), format!("{temperature} is outside 0..=2")));
        }
        // A local model serves as many jobs at once as it has slots.
        let max_concurrency = m.max_concurrency.unwrap_or(local.as_ref().map_or(if embed.is_some() { 1 } else { 4 }, |l| l.slots as i64));
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
        // A local model's pool carries its placement, so its jobs reach only the worker
        // that holds the model there.
        let pool = match (&m.pool, &local) {
            (Some(p), Some(l)) => format!("{p}@{}", l.placement()),
            (Some(p), None) => p.clone(),
            (None, Some(l)) => format!("gguf/{}@{}", m.name, l.placement()),
            (None, None) if embed.is_some() => format!("embed/{}", m.name),
            (None, None) => m.name.clone(),
        };
        if pool.is_empty() {
            return Err(key_err(f, k("pool"), "must not be empty"));
        }
        let price = match &m.price {
            None => None,
            Some(p) => {
                for (key, v) in [("input", p.input), ("output", p.output)] {
                    if !(v.is_finite() && v >= 0.0) {
                        return Err(key_err(f, k(&format!("price.{key}")), format!("{v} is not a price (USD per million tokens, ≥ 0)")));
                    }
                }
                Some(crate::cost::Price { input: p.input, output: p.output })
            }
        };
        let quota = sweep_quota::model_quota(f, &k, m.rpm, m.tpm, m.burst)?;
        models.push(Model {
            price,
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
            local,
            replay,
            quota,
            embed,
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
    let mut built_inputs = Vec::new();
    if raw.benchmark.is_empty() {
        return Err(key_err(f, "benchmark", "at least one [[benchmark]] is required"));
    }
    for (i, b) in raw.benchmark.iter().enumerate() {
        let k = |field: &str| format!("benchmark[{i}].{field}");
        match b.pipeline.as_str() {
            "hypotermqa" => judged::reject_foreign_keys(f, i, b, "hypotermqa")?,
            "noop" => {
                judged::reject_foreign_keys(f, i, b, "noop")?;
                benchmarks.push(noop_benchmark(f, i, b, &models)?);
                continue;
            }
            "autohall" => {
                benchmarks.push(judged::autohall_benchmark(f, base, i, b, &models)?);
                continue;
            }
            "chainpoll" => {
                benchmarks.push(judged::chainpoll_benchmark(f, base, i, b, &models)?);
                continue;
            }
            "uhgeval" => {
                benchmarks.push(uhgeval_hvi::uhgeval_benchmark(f, i, b, &models, base)?);
                continue;
            }
            "hvi" => {
                benchmarks.push(uhgeval_hvi::hvi_benchmark(f, i, b, &models, base)?);
                continue;
            }
            "hypotermqa-build" => {
                benchmarks.push(build::build_benchmark(f, i, b, &models, base)?);
                continue;
            }
            other => {
                return Err(key_err(
                    f,
                    k("pipeline"),
                    format!("unknown pipeline {other:?} (expected \"hypotermqa\", \"hypotermqa-build\", \"autohall\", \"chainpoll\", \"uhgeval\", \"hvi\" or \"noop\")"),
                ))
            }
        }
        if b.models.is_empty() {
            return Err(key_err(f, k("models"), "needs at least one model under test"));
        }
        if b.jobs.is_some() {
            return Err(key_err(f, k("jobs"), "only applies to pipeline \"noop\""));
        }
        let dataset_rel = match (&b.dataset, b.dataset_from) {
            (Some(d), None) => d.clone(),
            (None, Some(from)) => {
                let built = build::dataset_from(f, i, from, &benchmarks)?;
                let limit = match b.limit {
                    Some(l) if l < 1 => return Err(key_err(f, k("limit"), format!("{l} must be at least 1"))),
                    l => l.map(|l| l as usize),
                };
                built_inputs.push(build::BuiltInput { eval: i, build: built, limit });
                String::new()
            }
            (Some(_), Some(_)) => return Err(key_err(f, k("dataset_from"), "give `dataset` or `dataset_from`, not both")),
            (None, None) => return Err(key_err(f, k("dataset"), "required for pipeline \"hypotermqa\" (or `dataset_from`)")),
        };
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
        if b.dataset_from.is_some() {
            // Read after the build phase (build::load_built).
            let dataset = PathBuf::from(format!("<benchmark[{i}].dataset_from>"));
            benchmarks.push(Benchmark::HypoTermQa { config, dataset, questions: Vec::new() });
            continue;
        }
        let dataset = base.join(dataset_rel);
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
    let rr = raw.run.unwrap_or(RawRun { max_deliver: None, ack_wait_s: None, window: None, max_cost: None, job_batch: None });
    let max_deliver = rr.max_deliver.unwrap_or(5);
    if !(1..=100).contains(&max_deliver) {
        return Err(key_err(f, "run.max_deliver", format!("{max_deliver} is outside 1..=100")));
    }
    let ack_wait_s = rr.ack_wait_s.unwrap_or(30.0);
    if !(ack_wait_s.is_finite() && (1.0..=3600.0).contains(&ack_wait_s)) {
        return Err(key_err(f, "run.ack_wait_s", format!("{ack_wait_s} is outside 1..=3600 seconds")));
    }
    let window = rr.window.unwrap_or(DEFAULT_WINDOW as i64);
    if !(1..=1_000_000).contains(&window) {
        return Err(key_err(f, "run.window", format!("{window} is outside 1..=1000000")));
    }
    let job_batch = rr.job_batch.unwrap_or(1);
    if !(1..=MAX_JOB_BATCH).contains(&job_batch) {
        return Err(key_err(f, "run.job_batch", format!("{job_batch} is outside 1..={MAX_JOB_BATCH}")));
    }
    if let Some(c) = rr.max_cost {
        if !(c.is_finite() && c >= 0.0) {
            return Err(key_err(f, "run.max_cost", format!("{c} is not an amount of USD (≥ 0)")));
        }
    }
    let quotas = sweep_quota::pool_quotas(f, &models)?;
    Ok(Sweep {
        file: path.to_path_buf(),
        name: raw.name,
        quotas,
        models,
        benchmarks,
        run: RunSettings {
            max_deliver,
            ack_wait: std::time::Duration::from_secs_f64(ack_wait_s),
            window: window as usize,
            max_cost: rr.max_cost,
            job_batch: job_batch as usize,
        },
        built_inputs,
    })
}

/// `pipeline = "noop"`: `jobs` items per model, models with `backend = "noop"`, and
/// none of the keys that belong to datasets and judges.
fn noop_benchmark(f: &str, i: usize, b: &RawBenchmark, models: &[Model]) -> Result<Benchmark, SweepError> {
    // Keys of other pipelines were rejected by the caller (judged::reject_foreign_keys).
    let k = |field: &str| format!("benchmark[{i}].{field}");
    let jobs = b.jobs.ok_or_else(|| key_err(f, k("jobs"), "required for pipeline \"noop\": the number of jobs per model"))?;
    if !(1..=MAX_NOOP_JOBS).contains(&jobs) {
        return Err(key_err(f, k("jobs"), format!("{jobs} is outside 1..={MAX_NOOP_JOBS}")));
    }
    if b.models.is_empty() {
        return Err(key_err(f, k("models"), "needs at least one model under test"));
    }
    let mut config = Vec::new();
    let mut seen = HashSet::new();
    for (j, name) in b.models.iter().enumerate() {
        let key = format!("benchmark[{i}].models[{j}]");
        if !seen.insert(name) {
            return Err(key_err(f, key, format!("model {name:?} listed twice")));
        }
        let Some(m) = models.iter().find(|m| &m.spec.name == name) else {
            let known: Vec<&str> = models.iter().map(|m| m.spec.name.as_str()).collect();
            return Err(key_err(f, key, format!("unknown model {name:?} (models in this sweep: {})", known.join(", "))));
        };
        // A typo must not turn a million free jobs into a million paid calls.
        if m.spec.model_ref.backend != "noop" {
            return Err(key_err(
                f,
                key,
                format!("model {name:?} has backend {:?}; pipeline \"noop\" runs only models with backend \"noop\"", m.spec.model_ref.backend),
            ));
        }
        config.push(noop::Config { model: m.spec.clone() });
    }
    Ok(Benchmark::Noop { config, jobs: jobs as u32 })
}

#[path = "sweep_judged.rs"]
mod judged;
pub use judged::{ReplayFrom, ReplayModel};
#[path = "sweep_uhgeval_hvi.rs"]
mod uhgeval_hvi;

#[cfg(test)]
#[path = "sweep_tests.rs"]
mod tests;

#[cfg(test)]
mod local_model_tests {
    use super::*;

    fn sweep_with(models: &str) -> Result<Sweep, SweepError> {
        let dir = tempfile::tempdir().unwrap();
        let mut fake = b"GGUF".to_vec();
        fake.resize(4096, 0);
        std::fs::write(dir.path().join("m.gguf"), &fake).unwrap();
        let ds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../datasets/hypotermqa/HypoTermQA_180.jsonl");
        let text = format!(
            "name = \"t\"\n{models}\n[[benchmark]]\npipeline = \"hypotermqa\"\ndataset = \"{}\"\nmodels = [\"a\"]\njudge = \"a\"\nlimit = 1\n",
            ds.display()
        );
        parse(&dir.path().join("s.toml"), &text)
    }

    /// Local models' pools carry their placement; a named pool keeps it too; concurrency
    /// defaults to the model's slots.
    #[test]
    fn local_pools_carry_placement() {
        let s = sweep_with(
            "[[model]]\nname = \"a\"\nbackend = \"gguf\"\nmodel_path = \"m.gguf\"\nslots = 3\n\
             [[model]]\nname = \"b\"\nbackend = \"gguf\"\nmodel_path = \"m.gguf\"\ngpu = 1\n\
             [[model]]\nname = \"c\"\nbackend = \"gguf\"\nmodel_path = \"m.gguf\"\npool = \"shared\"\n",
        )
        .unwrap();
        let pools: Vec<&str> = s.models.iter().map(|m| m.spec.pool.as_str()).collect();
        assert_eq!(pools, ["gguf/a@cpu", "gguf/b@gpu1", "shared@cpu"]);
        assert_eq!(s.models[0].max_concurrency, 3);
        assert_eq!(s.models[1].local.as_ref().unwrap().gpu, Some(1));
        // The identity is the file's, not its path's: same file, same endpoint.
        assert_eq!(s.models[0].spec.model_ref.endpoint, s.models[1].spec.model_ref.endpoint);
        assert!(s.models[0].spec.model_ref.endpoint.starts_with("gguf:m.gguf:4096:"));
    }

    /// gguf-only keys on another backend, and bad values, are errors naming the key.
    #[test]
    fn local_keys_are_checked() {
        let e = sweep_with("[[model]]\nname = \"a\"\nbackend = \"openai\"\nbase_url = \"http://x\"\nmodel = \"m\"\nslots = 2\n").unwrap_err();
        assert!(e.to_string().contains("model[0].slots"), "{e}");
        let e = sweep_with("[[model]]\nname = \"a\"\nbackend = \"gguf\"\nmodel_path = \"m.gguf\"\nslots = 0\n").unwrap_err();
        assert!(e.to_string().contains("model[0].slots") && e.to_string().contains("outside"), "{e}");
        let e = sweep_with("[[model]]\nname = \"a\"\nbackend = \"gguf\"\nmodel_path = \"nope.gguf\"\n").unwrap_err();
        assert!(e.to_string().contains("model[0].model_path") && e.to_string().contains("nope.gguf"), "{e}");
    }
}

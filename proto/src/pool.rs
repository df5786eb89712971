//! The worker's contract: which pools it serves and which models it may call in each.
//!
//! A worker is an executor of **its operator's** configuration, never of a message's. Its
//! configuration is a [`WorkerPlan`]: for every pool it serves, the pool's concurrency,
//! the pool's quota, and the models it may call there. A sweep builds the plan (every
//! pool of the sweep), and so does a worker configuration file (`halyard worker
//! --config`); the worker consumes it as it is.
//!
//! Every job a worker receives is checked against the plan before anything else
//! happens ([`WorkerPlan::admit`]): its id must be the hash of its key (a forged message
//! cannot plant an answer under a real job's id), it must belong to the pool whose
//! consumer delivered it, and its model reference must name a model configured for that
//! pool. The endpoint, the API model name and the API key *variable* used for the call
//! then come from the plan: a job cannot name another server, and no key variable
//! travels on the wire. What a model is matched on:
//! - HTTP models (`openai`): backend, base URL (without a trailing `/`) and API model
//!   name, all three;
//! - local models (`gguf`, `embed`, `replay`): backend and endpoint (the model file's or
//!   recordings' identity); the API model name is only a label there;
//! - managed servers (`server`): backend, endpoint (the model's declared identity, see
//!   [`crate::server`]) and the name the server serves the model under;
//! - `noop`: the backend alone (it calls nothing and answers empty text).
//!
//! Plain data with serde; no IO.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{Job, JobId, ModelRef};

/// A pool a worker serves.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolSpec {
    pub name: String,
    /// Calls in flight at once for this pool, in this worker.
    pub concurrency: usize,
}

/// The quota of one pool, shared by all its workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaSpec {
    /// Requests per minute for the whole pool.
    pub rpm: Option<u32>,
    /// Tokens (prompt + completion) per minute for the whole pool.
    pub tpm: Option<u64>,
    /// Largest burst of requests one worker sends at once (1: evenly spaced).
    pub burst: u32,
    /// How the API counts a request's tokens (default: `max_tokens` at admission).
    #[serde(default)]
    pub tpm_counts: TpmCounts,
    /// Input tokens per minute for the whole pool (Anthropic's ITPM: the uncached prompt
    /// and the cache writes count, cache reads do not; issue 52).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub itpm: Option<u64>,
    /// Output tokens per minute for the whole pool (Anthropic's OTPM: `max_tokens` is
    /// reserved at admission and settled to the tokens produced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otpm: Option<u64>,
}

/// How the API counts a request's tokens against the tokens-per-minute quota.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TpmCounts {
    /// The request is charged its prompt plus its `max_tokens` when it is admitted, and
    /// the unused part of `max_tokens` is never refunded: OpenAI's and Azure OpenAI's
    /// documented behaviour, and the safe reading for an unknown API. Reported usage only
    /// corrects the prompt's estimate.
    #[default]
    MaxTokens,
    /// The request is charged the tokens it used (prompt + completion, as reported):
    /// gateways that count usage (Azure API Management's token limit, APISIX), and
    /// APIs that reserve `max_tokens` but settle to the actual count (Anthropic's output
    /// tokens). The difference from the estimate is carried forward as credit or debt.
    Usage,
}

impl TpmCounts {
    /// The key's value in sweeps and `--quota`.
    pub fn as_str(self) -> &'static str {
        match self {
            TpmCounts::MaxTokens => "max_tokens",
            TpmCounts::Usage => "usage",
        }
    }
}

impl std::str::FromStr for TpmCounts {
    type Err = String;
    fn from_str(s: &str) -> Result<TpmCounts, String> {
        match s.trim() {
            "max_tokens" => Ok(TpmCounts::MaxTokens),
            "usage" => Ok(TpmCounts::Usage),
            other => Err(format!("tpm_counts {other:?} is neither \"max_tokens\" nor \"usage\"")),
        }
    }
}

/// An HTTP model (`backend = "openai"`: any OpenAI-compatible chat-completions API).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpModelSpec {
    pub backend: String,
    /// Base URL; requests go to `{base_url}/chat/completions`.
    pub base_url: String,
    /// The model name sent to the API.
    pub model: String,
    /// Name of the environment variable holding the API key (on the worker; never the
    /// key itself).
    pub api_key_env: Option<String>,
    /// Prompt caching (`prompt_cache` in the sweep, `backend = "anthropic"`): the
    /// requests mark their shared prefix (the system prompt) for the provider's cache,
    /// with this lifetime. Not part of job ids: caching changes the bill, not the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_cache: Option<PromptCacheTtl>,
}

/// How long a prompt-cache entry lives at the provider (Anthropic's `cache_control.ttl`):
/// writes of the two are priced differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PromptCacheTtl {
    #[serde(rename = "5m")]
    FiveMinutes,
    #[serde(rename = "1h")]
    OneHour,
}

impl PromptCacheTtl {
    /// The value of `cache_control.ttl` (and of the sweep's `prompt_cache`).
    pub fn as_str(self) -> &'static str {
        match self {
            PromptCacheTtl::FiveMinutes => "5m",
            PromptCacheTtl::OneHour => "1h",
        }
    }
}

impl HttpModelSpec {
    /// Whether a job naming `m` calls this model: same backend, base URL (trailing `/`
    /// aside) and API model name.
    pub fn serves(&self, m: &ModelRef) -> bool {
        m.backend == self.backend
            && m.endpoint.trim_end_matches('/') == self.base_url.trim_end_matches('/')
            && m.model == self.model
    }
}

/// A local GGUF model run inside the worker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GgufSpec {
    /// The model's identity in job keys (`ModelRef::endpoint`).
    pub endpoint: String,
    pub path: PathBuf,
    /// GPU index, or None for CPU.
    pub gpu: Option<u32>,
    pub gpu_layers: u32,
    /// Parallel sequences decoded in one batch.
    pub slots: usize,
    /// CPU threads; 0 = all available cores.
    pub threads: usize,
    /// Context per sequence, in tokens.
    pub ctx_size: u32,
}

/// Where recorded results come from (`backend = "replay"`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplaySource {
    /// JSON Lines of request/response pairs.
    Jsonl(PathBuf),
    /// A Halyard worker checkpoint, and the model reference its jobs had.
    Checkpoint { dir: PathBuf, backend: String, endpoint: String },
}

/// A replay model: answers from recorded results.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplaySpec {
    /// The model's identity in job keys (`ModelRef::endpoint` of its jobs).
    pub endpoint: String,
    pub source: ReplaySource,
}

/// A sentence-embedding model run inside the worker (`backend = "embed"`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmbedSpec {
    /// The model's identity in job keys (`ModelRef::endpoint`).
    pub endpoint: String,
    /// The folder with `config.json`, `model.safetensors`, `tokenizer.json`.
    pub path: PathBuf,
}

/// A model a worker may call in a pool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerModel {
    Http(HttpModelSpec),
    Gguf(GgufSpec),
    Replay(ReplaySpec),
    Embed(EmbedSpec),
    /// An OpenAI-compatible server process the worker runs (`backend = "server"`).
    Server(crate::server::ServerSpec),
    /// Calls nothing, answers empty text (throughput tests of the job path).
    Noop,
}

impl WorkerModel {
    /// An OpenAI-compatible HTTP model.
    pub fn openai(base_url: &str, model: &str, api_key_env: Option<&str>) -> WorkerModel {
        WorkerModel::Http(HttpModelSpec {
            backend: "openai".into(),
            base_url: base_url.trim_end_matches('/').into(),
            model: model.into(),
            api_key_env: api_key_env.map(String::from),
            prompt_cache: None,
        })
    }

    /// The backend name jobs give (`ModelRef::backend`).
    pub fn backend(&self) -> &str {
        match self {
            WorkerModel::Http(h) => &h.backend,
            WorkerModel::Gguf(_) => "gguf",
            WorkerModel::Replay(_) => "replay",
            WorkerModel::Embed(_) => "embed",
            WorkerModel::Server(_) => "server",
            WorkerModel::Noop => "noop",
        }
    }

    /// Whether a job naming `m` is a call of this model (see the module docs).
    pub fn serves(&self, m: &ModelRef) -> bool {
        if m.backend != self.backend() {
            return false;
        }
        match self {
            WorkerModel::Http(h) => h.serves(m),
            WorkerModel::Gguf(g) => g.endpoint == m.endpoint,
            WorkerModel::Replay(r) => r.endpoint == m.endpoint,
            WorkerModel::Embed(e) => e.endpoint == m.endpoint,
            WorkerModel::Server(s) => s.endpoint == m.endpoint && s.served_name == m.model,
            WorkerModel::Noop => true,
        }
    }
}

/// A pool in batch mode (`mode = "batch"` on its models): its jobs are sent through the
/// provider's batch API (a JSONL file of requests, answered within the completion
/// window at the batch price) instead of one HTTP call each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchSpec {
    /// Requests per provider batch.
    pub batch_size: u32,
    /// How long a worker gathers jobs before it submits a batch that is not full.
    pub batch_wait_ms: u64,
    /// Tokens (estimated prompt plus `max_tokens`) the pool may have enqueued at the
    /// provider at once, across all its workers (`batch_queue_tokens`).
    pub queue_tokens: Option<u64>,
}

impl BatchSpec {
    /// The largest `batch_size`: a batch's record (its job ids) must fit in one broker
    /// message.
    pub const MAX_SIZE: u32 = 10_000;
}

/// One pool of a worker: its concurrency, its quota, the models it may call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PoolPlan {
    pub pool: PoolSpec,
    pub quota: Option<QuotaSpec>,
    pub models: Vec<WorkerModel>,
    /// Batch mode, when the pool's models use the provider's batch API.
    #[serde(default)]
    pub batch: Option<BatchSpec>,
}

impl PoolPlan {
    /// A pool with no quota and no model yet.
    pub fn new(name: impl Into<String>, concurrency: usize) -> PoolPlan {
        PoolPlan {
            pool: PoolSpec { name: name.into(), concurrency },
            quota: None,
            models: Vec::new(),
            batch: None,
        }
    }

    /// Add a model the pool may call.
    pub fn with_model(mut self, m: WorkerModel) -> PoolPlan {
        if !self.models.contains(&m) {
            self.models.push(m);
        }
        self
    }

    /// The configured model a job naming `m` calls, if any.
    pub fn model_for(&self, m: &ModelRef) -> Option<&WorkerModel> {
        self.models.iter().find(|w| w.serves(m))
    }
}

/// Everything a worker serves.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerPlan {
    pub pools: Vec<PoolPlan>,
}

impl WorkerPlan {
    pub fn pool(&self, name: &str) -> Option<&PoolPlan> {
        self.pools.iter().find(|p| p.pool.name == name)
    }

    /// Add a pool, or merge it into the pool of the same name (largest concurrency, its
    /// models added; a quota given twice must be the same, else the first one stays and
    /// the second is returned as an error).
    pub fn add(&mut self, p: PoolPlan) -> Result<(), String> {
        let Some(have) = self.pools.iter_mut().find(|h| h.pool.name == p.pool.name) else {
            self.pools.push(p);
            return Ok(());
        };
        have.pool.concurrency = have.pool.concurrency.max(p.pool.concurrency);
        for m in p.models {
            if !have.models.contains(&m) {
                have.models.push(m);
            }
        }
        match (have.batch, p.batch) {
            (Some(a), Some(b)) if a != b => {
                return Err(format!(
                    "pool {:?} is given two batch settings ({a:?} and {b:?})",
                    have.pool.name
                ))
            }
            (None, Some(b)) => have.batch = Some(b),
            _ => {}
        }
        match (have.quota, p.quota) {
            (Some(a), Some(b)) if a != b => {
                Err(format!("pool {:?} is given two quotas ({a:?} and {b:?})", have.pool.name))
            }
            (None, q) => {
                have.quota = q;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Every model of every pool (a model may appear in several pools).
    pub fn models(&self) -> impl Iterator<Item = (&PoolSpec, &WorkerModel)> {
        self.pools.iter().flat_map(|p| p.models.iter().map(move |m| (&p.pool, m)))
    }

    /// Check a job delivered by `pool`'s consumer against the plan; the model it may
    /// call, or why it is refused. Pure: the caller logs, counts and reports.
    pub fn admit<'a>(&'a self, pool: &str, job: &Job) -> Result<&'a WorkerModel, Refusal> {
        let computed = job.key.id();
        if computed != job.id {
            return Err(Refusal::IdMismatch { pool: pool.into(), claimed: job.id, computed });
        }
        if job.pool != pool {
            return Err(Refusal::WrongPool { pool: pool.into(), named: job.pool.clone() });
        }
        let m = &job.key.model;
        self.pool(pool).and_then(|p| p.model_for(m)).ok_or_else(|| Refusal::UnknownModel {
            pool: pool.into(),
            backend: m.backend.clone(),
            endpoint: m.endpoint.clone(),
            model: m.model.clone(),
        })
    }
}

/// Why a worker refused a job. Displayed with URL credentials and key-like text
/// redacted ([`crate::redact`]), since every field comes from an untrusted message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The job's id is not the hash of its key.
    IdMismatch { pool: String, claimed: JobId, computed: JobId },
    /// The job names another pool than the one whose consumer delivered it.
    WrongPool { pool: String, named: String },
    /// The job's model is not one this worker was configured with for the pool.
    UnknownModel { pool: String, backend: String, endpoint: String, model: String },
    /// Not a job (undecodable).
    Undecodable { pool: String, error: String },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use crate::redact::{secrets, url};
        match self {
            Refusal::IdMismatch { pool, claimed, computed } => write!(
                f,
                "pool {:?}: job id {claimed} is not the hash of its key ({computed}); refused",
                secrets(pool)
            ),
            Refusal::WrongPool { pool, named } => write!(
                f,
                "pool {:?}: the job names pool {:?}; refused",
                secrets(pool),
                secrets(named)
            ),
            Refusal::UnknownModel { pool, backend, endpoint, model } => write!(
                f,
                "pool {:?}: model {:?} at endpoint {:?} (backend {:?}) is not configured for this \
                 pool on this worker; refused",
                secrets(pool),
                secrets(model),
                url(endpoint),
                secrets(backend)
            ),
            Refusal::Undecodable { pool, error } => {
                write!(f, "pool {:?}: not a job ({}); refused", secrets(pool), secrets(error))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ChatMessage, JobKey, Sampling};

    fn http(base_url: &str, model: &str, key: Option<&str>) -> WorkerModel {
        WorkerModel::openai(base_url, model, key)
    }

    fn job(pool: &str, backend: &str, endpoint: &str, model: &str) -> Job {
        let key = JobKey {
            pipeline: "p".into(),
            stage: "s".into(),
            stage_version: 1,
            model: ModelRef {
                backend: backend.into(),
                endpoint: endpoint.into(),
                model: model.into(),
            },
            messages: vec![ChatMessage::user("q")],
            sampling: Sampling::default(),
            sample_index: 0,
        };
        Job::new(uuid::Uuid::nil(), pool, key, 1000)
    }

    fn plan() -> WorkerPlan {
        let mut p = WorkerPlan::default();
        p.add(PoolPlan::new("paid", 4).with_model(http("https://api.x/v1/", "m", Some("KEY"))))
            .unwrap();
        p.add(PoolPlan::new("local", 1).with_model(WorkerModel::Gguf(GgufSpec {
            endpoint: "gguf:m.gguf:1:ab".into(),
            path: "/m.gguf".into(),
            gpu: None,
            gpu_layers: 0,
            slots: 1,
            threads: 0,
            ctx_size: 512,
        })))
        .unwrap();
        p.add(PoolPlan::new("free", 8).with_model(WorkerModel::Noop)).unwrap();
        p
    }

    /// A job for a configured model is admitted, and the model returned is the plan's
    /// (whose key variable the call uses).
    #[test]
    fn configured_models_are_admitted() {
        let p = plan();
        let m = p.admit("paid", &job("paid", "openai", "https://api.x/v1", "m")).unwrap();
        assert!(matches!(m, WorkerModel::Http(h) if h.api_key_env.as_deref() == Some("KEY")));
        assert!(p.admit("local", &job("local", "gguf", "gguf:m.gguf:1:ab", "any")).is_ok());
        assert!(p.admit("free", &job("free", "noop", "", "whatever")).is_ok());
    }

    /// Another endpoint, model name, backend or pool is refused, naming pool and endpoint.
    #[test]
    fn other_models_are_refused() {
        let p = plan();
        for (pool, j) in [
            ("paid", job("paid", "openai", "http://attacker:9/v1", "m")),
            ("paid", job("paid", "openai", "https://api.x/v1", "m2")),
            ("paid", job("paid", "gguf", "https://api.x/v1", "m")),
            ("local", job("local", "gguf", "gguf:other.gguf:1:ab", "any")),
            ("free", job("free", "openai", "https://api.x/v1", "m")),
            ("nope", job("nope", "noop", "", "m")),
        ] {
            let e = p.admit(pool, &j).unwrap_err();
            assert!(matches!(e, Refusal::UnknownModel { .. }), "{e:?}");
            let text = e.to_string();
            assert!(text.contains(&format!("pool {pool:?}")), "{text}");
            assert!(text.contains(&format!("{:?}", j.key.model.endpoint)), "{text}");
        }
    }

    /// A job whose id is not its key's hash is refused before anything else, and a job
    /// delivered on one pool's consumer cannot borrow another pool's models.
    #[test]
    fn forged_ids_and_pools_are_refused() {
        let p = plan();
        let mut j = job("paid", "openai", "https://api.x/v1", "m");
        j.key.messages[0].content.push('!');
        assert!(matches!(p.admit("paid", &j), Err(Refusal::IdMismatch { .. })));
        let j = job("paid", "openai", "https://api.x/v1", "m");
        assert!(matches!(p.admit("free", &j), Err(Refusal::WrongPool { .. })));
    }

    /// Credentials in a forged endpoint never reach the refusal's text.
    #[test]
    fn refusals_redact_credentials() {
        let e = plan()
            .admit(
                "paid",
                &job("paid", "openai", "https://u:hunter2@evil/v1?key=sk-abcdefgh12345678", "m"),
            )
            .unwrap_err()
            .to_string();
        assert!(!e.contains("hunter2") && !e.contains("sk-abcdefgh12345678"), "{e}");
        assert!(e.contains("evil"), "{e}");
    }

    /// Pools given twice merge: largest concurrency, models added, one quota.
    #[test]
    fn pools_merge() {
        let mut p = plan();
        let q = QuotaSpec {
            rpm: Some(60),
            tpm: None,
            burst: 1,
            tpm_counts: TpmCounts::MaxTokens,
            itpm: None,
            otpm: None,
        };
        let mut extra = PoolPlan::new("paid", 16).with_model(http("https://b/v1", "m", None));
        extra.quota = Some(q);
        p.add(extra.clone()).unwrap();
        let paid = p.pool("paid").unwrap();
        assert_eq!((paid.pool.concurrency, paid.models.len(), paid.quota), (16, 2, Some(q)));
        extra.quota = Some(QuotaSpec { rpm: Some(61), ..q });
        assert!(p.add(extra).unwrap_err().contains("two quotas"));
    }

    /// The plan survives the wire (a worker may be handed one).
    #[test]
    fn plan_round_trips() {
        let p = plan();
        let back: WorkerPlan = crate::decode("plan", &crate::encode(&p).unwrap()).unwrap();
        assert_eq!(back, p);
    }
}

//! Model backends. [`Backends::call`] turns a [`Job`]'s request into a [`Completion`] or
//! a classified [`CallError`]; retries and pacing are the caller's business.

pub mod embed;
#[cfg(feature = "gguf")]
pub mod gguf;
pub mod openai;
pub mod replay;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use halyard_proto::{Completion, Job};

/// How a failed call should be treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// Worth retrying: connection errors, timeouts, 5xx, 408, malformed bodies.
    Transient,
    /// HTTP 429: retry after the server's `Retry-After` (or a backoff).
    RateLimited,
    /// Will never succeed: 400, 401, 403, 404, 422, unknown backend, missing API key.
    Permanent,
}

#[derive(Clone, Debug, thiserror::Error)]
#[error("{message}")]
pub struct CallError {
    pub class: ErrorClass,
    pub status: Option<u16>,
    pub message: String,
    pub retry_after: Option<Duration>,
}

impl CallError {
    pub fn permanent(message: impl Into<String>) -> Self {
        CallError { class: ErrorClass::Permanent, status: None, message: message.into(), retry_after: None }
    }
    pub fn transient(message: impl Into<String>) -> Self {
        CallError { class: ErrorClass::Transient, status: None, message: message.into(), retry_after: None }
    }
    pub fn is_permanent(&self) -> bool {
        self.class == ErrorClass::Permanent
    }
}

/// How to run one local GGUF model (see [`gguf`]).
#[derive(Clone, Debug, PartialEq)]
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

/// True when this build runs GGUF models.
pub const GGUF_SUPPORT: bool = cfg!(feature = "gguf");

/// True when this build can place GGUF models on CUDA GPUs.
pub fn gguf_gpu_support() -> bool {
    cfg!(feature = "cuda")
}

/// Everything a worker can call: the shared HTTP client and the local models it holds.
pub struct Backends {
    http: openai::OpenAi,
    /// Embedding models by endpoint (`backend = "embed"`).
    embed: HashMap<String, embed::EmbedModel>,
    #[cfg(feature = "gguf")]
    local: HashMap<String, gguf::GgufModel>,
    /// Replay sources, by the endpoint of their jobs.
    replay: HashMap<String, replay::Replay>,
}

impl Backends {
    /// Build the HTTP client and load every local model (blocking: loading takes seconds).
    pub fn new(local_models: &[GgufSpec], replays: &[replay::ReplaySpec], embed_models: &[embed::EmbedSpec]) -> Result<Backends, String> {
        let http = openai::OpenAi::new().map_err(|e| e.message)?;
        let mut replay = HashMap::new();
        for r in replays {
            replay.insert(r.endpoint.clone(), replay::Replay::load(&r.source)?);
        }
        let mut embed = HashMap::new();
        for spec in embed_models {
            let m = embed::EmbedModel::load(spec).map_err(|e| format!("embedding model {}: {e}", spec.path.display()))?;
            embed.insert(spec.endpoint.clone(), m);
        }
        #[cfg(feature = "gguf")]
        {
            let mut local = HashMap::new();
            for spec in local_models {
                let m = gguf::GgufModel::load(spec.clone()).map_err(|e| e.to_string())?;
                local.insert(spec.endpoint.clone(), m);
            }
            Ok(Backends { http, embed, local, replay })
        }
        #[cfg(not(feature = "gguf"))]
        {
            if let Some(s) = local_models.first() {
                return Err(format!(
                    "model {} needs the `gguf` backend, but this halyard was built without the `gguf` feature",
                    s.path.display()
                ));
            }
            let _: &HashMap<String, ()> = &HashMap::new();
            Ok(Backends { http, embed, replay })
        }
    }

    /// One attempt at the call, with the API's rate-limit headers (HTTP backends only).
    pub async fn call_with_limits(&self, job: &Job) -> (Result<Completion, CallError>, RateHeaders) {
        match job.key.model.backend.as_str() {
            "openai" => self.http.call_with_limits(job).await,
            _ => (self.call(job).await, RateHeaders::default()),
        }
    }

    /// One attempt at the call (no retries).
    pub async fn call(&self, job: &Job) -> Result<Completion, CallError> {
        match job.key.model.backend.as_str() {
            "openai" => self.http.call(job).await,
            // Answers at once (throughput benchmarks of the job path).
            "noop" => Ok(Completion { text: String::new(), usage: Usage::default(), latency_ms: 0, finish_reason: Some("stop".into()), calls: 1 }),
            "gguf" => self.call_local(job).await,
            "replay" => match self.replay.get(&job.key.model.endpoint) {
                Some(r) => r.answer(job),
                None => Err(CallError::permanent(format!(
                    "this worker holds no replay recordings {} (pool {}); start a worker with the sweep that names them",
                    job.key.model.endpoint, job.pool
                ))),
            },
            "embed" => match self.embed.get(&job.key.model.endpoint) {
                Some(m) => m.call(job).await,
                None => Err(CallError::permanent(format!(
                    "this worker does not hold embedding model {} (pool {}); start a worker with that model",
                    job.key.model.endpoint, job.pool
                ))),
            },
            other => Err(CallError::permanent(format!("this worker has no backend {other:?} (it runs: openai, gguf, replay, embed, noop)"))),
        }
    }

    #[cfg(feature = "gguf")]
    async fn call_local(&self, job: &Job) -> Result<Completion, CallError> {
        let key = &job.key;
        let Some(model) = self.local.get(&key.model.endpoint) else {
            return Err(CallError::permanent(format!(
                "this worker does not hold local model {} (pool {}); start a worker with that model",
                key.model.endpoint, job.pool
            )));
        };
        // Reproducible sampling: the request's seed, else one derived from the job id.
        let seed = key.sampling.seed.map(|s| s as u32).unwrap_or_else(|| {
            let b = job.id.as_bytes();
            u32::from_le_bytes([b[0], b[1], b[2], b[3]])
        });
        model.generate(key.messages.clone(), key.sampling.temperature, key.sampling.max_tokens, seed).await
    }

    #[cfg(not(feature = "gguf"))]
    async fn call_local(&self, _job: &Job) -> Result<Completion, CallError> {
        Err(CallError::permanent("this halyard was built without the `gguf` feature"))
    }
}

use halyard_proto::Usage;

use crate::quota::RateHeaders;

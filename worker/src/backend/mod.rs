//! Model backends. [`Backends::call`] turns a [`Job`]'s request into a [`Completion`] or
//! a classified [`CallError`]; retries and pacing are the caller's business.

#[cfg(feature = "embed")]
pub mod embed;
#[cfg(feature = "gguf")]
pub mod gguf;
pub mod grammar;
pub mod http_guard;
#[cfg(feature = "gguf")]
pub mod logits;
pub mod openai;
pub mod replay;
pub mod server;

use std::collections::HashMap;

use halyard_proto::pool::{HttpModelSpec, WorkerModel, WorkerPlan};
use halyard_proto::{Completion, Job};

pub use crate::call_error::{CallError, ErrorClass};

/// How to run one local GGUF model (see [`gguf`]); part of the worker's plan.
pub use halyard_proto::pool::GgufSpec;

/// True when this build runs GGUF models.
pub const GGUF_SUPPORT: bool = cfg!(feature = "gguf");

/// True when this build can place GGUF models on CUDA GPUs.
pub fn gguf_gpu_support() -> bool {
    cfg!(feature = "cuda")
}

/// Everything a worker can call: the shared HTTP client with the HTTP models of each
/// pool, and the local models it holds.
pub struct Backends {
    http: openai::OpenAi,
    /// HTTP models by pool: a job (admitted against the plan) is sent to its pool's
    /// model, with that model's URL and API key variable, not anything from the message.
    http_models: HashMap<String, Vec<HttpModelSpec>>,
    /// Embedding models by endpoint (`backend = "embed"`).
    #[cfg(feature = "embed")]
    embed: HashMap<String, embed::EmbedModel>,
    #[cfg(feature = "gguf")]
    local: HashMap<String, gguf::GgufModel>,
    /// Replay sources, by the endpoint of their jobs.
    replay: HashMap<String, replay::Replay>,
    /// The managed servers (`backend = "server"`), once started.
    servers: Option<std::sync::Arc<server::Servers>>,
}

/// Output tokens a request without `max_tokens` is taken to produce at the most: far
/// beyond any model's output limit, far below what would overflow a quota or a total.
pub const MAX_COMPLETION_TOKENS: u64 = 1 << 20;
/// Tokens a chat template may add per message, and per request, beyond the bytes of the
/// messages (a byte-level tokenizer never makes more tokens than bytes).
const TEMPLATE_TOKENS_PER_MESSAGE: u64 = 16;
const TEMPLATE_TOKENS: u64 = 64;

/// [`clamp_usage`] on `c`, an answer an API gave for `job` (online, replayed, or read from
/// a provider batch's output file), with a warning naming what it reported when clamped.
pub fn clamp_completion(job: &Job, c: &mut Completion) {
    let reported = c.usage;
    if clamp_usage(job, &mut c.usage) {
        tracing::warn!(
            job = %job.id,
            pool = %job.pool,
            reported_prompt = reported.prompt_tokens,
            reported_completion = reported.completion_tokens,
            prompt = c.usage.prompt_tokens,
            completion = c.usage.completion_tokens,
            "the API reported more tokens than the request could use: clamped"
        );
    }
}

/// Clamp `usage`, as an API reported it for `job`, to what the request could have used
/// (issue 33): prompt tokens at most the bytes of its messages plus the chat template's
/// allowance, completion tokens at most its `max_tokens` (else [`MAX_COMPLETION_TOKENS`]).
/// An API answering `prompt_tokens = 2^64 − 1` would otherwise leave a quota debt no
/// pool ever pays back, and totals that overflow. Returns whether anything was clamped.
pub fn clamp_usage(job: &Job, usage: &mut Usage) -> bool {
    let prompt_cap = job
        .key
        .messages
        .iter()
        .map(|m| (m.content.len() as u64).saturating_add(TEMPLATE_TOKENS_PER_MESSAGE))
        .fold(TEMPLATE_TOKENS, u64::saturating_add);
    let completion_cap = job.key.sampling.max_tokens.map_or(MAX_COMPLETION_TOKENS, u64::from);
    let clamped = usage.prompt_tokens > prompt_cap || usage.completion_tokens > completion_cap;
    usage.prompt_tokens = usage.prompt_tokens.min(prompt_cap);
    usage.completion_tokens = usage.completion_tokens.min(completion_cap);
    clamped
}

impl Backends {
    /// Build the HTTP client and load every local model of the plan (blocking: loading
    /// takes seconds). A model named by several pools is loaded once.
    pub fn new(plan: &WorkerPlan, policy: http_guard::HttpPolicy) -> Result<Backends, String> {
        http_guard::check_plan(plan, policy)?;
        let http = openai::OpenAi::new(policy.max_body_bytes).map_err(|e| e.message)?;
        let mut http_models: HashMap<String, Vec<HttpModelSpec>> = HashMap::new();
        let mut replay = HashMap::new();
        #[cfg(feature = "embed")]
        let mut embed = HashMap::new();
        let mut local_models: Vec<&GgufSpec> = Vec::new();
        for (pool, m) in plan.models() {
            match m {
                WorkerModel::Http(h) => {
                    http_models.entry(pool.name.clone()).or_default().push(h.clone())
                }
                WorkerModel::Replay(r) if !replay.contains_key(&r.endpoint) => {
                    replay.insert(r.endpoint.clone(), replay::Replay::load(&r.source)?);
                }
                #[cfg(feature = "embed")]
                WorkerModel::Embed(spec) if !embed.contains_key(&spec.endpoint) => {
                    let m = embed::EmbedModel::load(spec)
                        .map_err(|e| format!("embedding model {}: {e}", spec.path.display()))?;
                    embed.insert(spec.endpoint.clone(), m);
                }
                #[cfg(not(feature = "embed"))]
                WorkerModel::Embed(spec) => {
                    return Err(format!(
                        "embedding model {} needs the `embed` backend, but this halyard was built without the `embed` feature (cargo build --release -p halyard)",
                        spec.path.display()
                    ))
                }
                WorkerModel::Gguf(g) if !local_models.iter().any(|l| l.endpoint == g.endpoint) => {
                    local_models.push(g)
                }
                _ => {}
            }
        }
        #[cfg(feature = "gguf")]
        {
            let mut local = HashMap::new();
            for spec in local_models {
                let m = gguf::GgufModel::load(spec.clone()).map_err(|e| e.to_string())?;
                local.insert(spec.endpoint.clone(), m);
            }
            Ok(Backends {
                http,
                http_models,
                #[cfg(feature = "embed")]
                embed,
                local,
                replay,
                servers: None,
            })
        }
        #[cfg(not(feature = "gguf"))]
        {
            if let Some(s) = local_models.first() {
                return Err(format!(
                    "model {} needs the `gguf` backend, but this halyard was built without the `gguf` feature",
                    s.path.display()
                ));
            }
            Ok(Backends {
                http,
                http_models,
                #[cfg(feature = "embed")]
                embed,
                replay,
                servers: None,
            })
        }
    }

    /// Calls of `backend = "server"` models go to these servers.
    pub fn set_servers(&mut self, servers: std::sync::Arc<server::Servers>) {
        self.servers = Some(servers);
    }

    /// The HTTP model of `job`'s pool that it calls. Jobs are admitted against the plan
    /// before they get here; a miss is refused all the same.
    fn http_model(&self, job: &Job) -> Result<&HttpModelSpec, CallError> {
        self.http_models
            .get(&job.pool)
            .and_then(|ms| ms.iter().find(|h| h.serves(&job.key.model)))
            .ok_or_else(|| {
                CallError::permanent(format!(
                    "model {:?} at {:?} is not configured for pool {:?} on this worker",
                    halyard_proto::redact::secrets(&job.key.model.model),
                    halyard_proto::redact::url(&job.key.model.endpoint),
                    job.pool
                ))
            })
    }

    /// One attempt at the call, with the API's rate-limit headers (HTTP backends only).
    pub async fn call_with_limits(
        &self,
        job: &Job,
    ) -> (Result<Completion, CallError>, RateHeaders) {
        match job.key.model.backend.as_str() {
            "openai" => match self.http_model(job) {
                Ok(m) => {
                    let (r, headers) = self.http.call_with_limits(job, m).await;
                    (r.map(|c| self.clamped(job, c)), headers)
                }
                Err(e) => (Err(e), RateHeaders::default()),
            },
            _ => (self.call(job).await, RateHeaders::default()),
        }
    }

    fn clamped(&self, job: &Job, mut c: Completion) -> Completion {
        clamp_completion(job, &mut c);
        c
    }

    /// One attempt at the call (no retries).
    pub async fn call(&self, job: &Job) -> Result<Completion, CallError> {
        match job.key.model.backend.as_str() {
            "openai" => self.http.call(job, self.http_model(job)?).await.map(|c| self.clamped(job, c)),
            // Answers at once (throughput benchmarks of the job path).
            "noop" => Ok(Completion { text: String::new(), usage: Usage::default(), latency_ms: 0, finish_reason: Some("stop".into()), calls: 1, logprobs: None, refusal: false }),
            "gguf" => self.call_local(job).await,
            "server" => match &self.servers {
                Some(s) => s.call(&self.http, job).await.map(|c| self.clamped(job, c)),
                None => Err(CallError::permanent(format!(
                    "this worker runs no managed server (pool {}); start a worker with the sweep that names it",
                    job.pool
                ))),
            },
            "replay" => match self.replay.get(&job.key.model.endpoint) {
                Some(r) => r.answer(job).map(|c| self.clamped(job, c)),
                None => Err(CallError::permanent(format!(
                    "this worker holds no replay recordings {} (pool {}); start a worker with the sweep that names them",
                    job.key.model.endpoint, job.pool
                ))),
            },
            #[cfg(not(feature = "embed"))]
            "embed" => Err(CallError::permanent(
                "this halyard was built without the `embed` feature (backend = \"embed\")",
            )),
            #[cfg(feature = "embed")]
            "embed" => match self.embed.get(&job.key.model.endpoint) {
                Some(m) => m.call(job).await,
                None => Err(CallError::permanent(format!(
                    "this worker does not hold embedding model {} (pool {}); start a worker with that model",
                    job.key.model.endpoint, job.pool
                ))),
            },
            other => Err(CallError::permanent(format!("this worker has no backend {other:?} (it runs: openai, gguf, server, replay, embed, noop)"))),
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
        model.generate_with(key.messages.clone(), key.sampling.clone(), seed).await
    }

    #[cfg(not(feature = "gguf"))]
    async fn call_local(&self, _job: &Job) -> Result<Completion, CallError> {
        Err(CallError::permanent("this halyard was built without the `gguf` feature"))
    }
}

use halyard_proto::Usage;

use crate::quota::RateHeaders;

#[cfg(test)]
mod tests {
    use halyard_proto::{ChatMessage, JobKey, ModelRef, Sampling};

    use super::*;
    use crate::quota::charged_tokens;

    fn job(max_tokens: Option<u32>) -> Job {
        let key = JobKey {
            pipeline: "noop".into(),
            stage: "call".into(),
            stage_version: 1,
            model: ModelRef {
                backend: "openai".into(),
                endpoint: "http://x".into(),
                model: "m".into(),
            },
            messages: vec![ChatMessage::system("Be brief."), ChatMessage::user("What is 2 + 2?")],
            sampling: Sampling { max_tokens, ..Sampling::default() },
            sample_index: 0,
        };
        Job::new(uuid::Uuid::nil(), "p", key, 1000)
    }

    /// Issue 33: usage at the extremes (2^64 − 1) is clamped to what the request could
    /// use; plausible usage is left as it is; the quota's charge and correction stay finite.
    #[test]
    fn usage_is_clamped_to_what_the_request_could_use() {
        let j = job(Some(256));
        let mut u = Usage { prompt_tokens: u64::MAX, completion_tokens: u64::MAX };
        assert!(clamp_usage(&j, &mut u));
        let prompt_cap = 64 + (9 + 16) + (14 + 16);
        assert_eq!((u.prompt_tokens, u.completion_tokens), (prompt_cap, 256));
        let mut fine = Usage { prompt_tokens: 20, completion_tokens: 3 };
        assert!(!clamp_usage(&j, &mut fine));
        assert_eq!((fine.prompt_tokens, fine.completion_tokens), (20, 3));
        let mut u = Usage { prompt_tokens: 1, completion_tokens: u64::MAX };
        assert!(clamp_usage(&job(None), &mut u));
        assert_eq!(u.completion_tokens, MAX_COMPLETION_TOKENS);
        // What the quota charges from the clamped usage is bounded, whatever the API said.
        for counts in
            [halyard_proto::pool::TpmCounts::Usage, halyard_proto::pool::TpmCounts::MaxTokens]
        {
            let charged = charged_tokens(counts, 100, Some(256), &u);
            assert!(charged <= prompt_cap + MAX_COMPLETION_TOKENS, "{counts:?}: {charged}");
            // Unclamped extremes do not overflow the charge either.
            let max = Usage { prompt_tokens: u64::MAX, completion_tokens: u64::MAX };
            assert_eq!(charged_tokens(counts, 100, None, &max), u64::MAX);
        }
    }
}

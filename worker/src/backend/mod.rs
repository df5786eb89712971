//! Model backends: the trait. [`registry::Backends::call`] turns a [`Job`]'s request
//! into a [`Completion`] or a classified [`CallError`]; retries and pacing are the
//! caller's business.
//!
//! Each backend (`backend = "…"` in a sweep) is one file here: a type implementing
//! [`Backend`] (one attempt at one job's call) and a `KIND` ([`BackendKind`]: its name,
//! and how it is built from the worker's plan), listed once in [`registry::REGISTRY`].
//! Nothing else in the worker names a backend (see the book's "Adding a backend"); this
//! file names none of them: [`Load`] hands them the plan, the HTTP policy and the shared
//! HTTP client ([`http_client::HttpClient`], below them all).

pub mod anthropic;
#[cfg(feature = "embed")]
pub mod embed;
#[cfg(feature = "gguf")]
pub mod gguf;
pub mod grammar;
pub mod http_client;
pub mod http_error;
pub mod http_guard;
pub mod http_models;
#[cfg(feature = "gguf")]
pub mod logits;
pub mod noop;
pub mod openai;
pub mod probe;
pub mod registry;
pub mod replay;
pub mod server;
#[cfg(not(all(feature = "gguf", feature = "embed")))]
mod unbuilt;

use futures::future::BoxFuture;
use halyard_proto::pool::{PoolSpec, WorkerModel, WorkerPlan};
use halyard_proto::{Completion, Job};

pub use crate::call_error::{CallError, ErrorClass};
pub use http_models::HttpModels;

/// How to run one local GGUF model (see [`gguf`]); part of the worker's plan.
pub use halyard_proto::pool::GgufSpec;

/// One backend, loaded: the calls of the jobs of its models.
pub trait Backend: Send + Sync {
    /// One attempt at the call of `job` (no retries): the answer, or the error classified
    /// (`Transient`, `RateLimited`, `Unavailable`, `Permanent`: see [`ErrorClass`]).
    fn call<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Result<Completion, CallError>>;

    /// One attempt, with the rate-limit headers the API answered (the pool's quota gate
    /// reads them). By default none: only HTTP APIs send them.
    fn call_with_limits<'a>(
        &'a self,
        job: &'a Job,
    ) -> BoxFuture<'a, (Result<Completion, CallError>, RateHeaders)> {
        Box::pin(async move { (self.call(job).await, RateHeaders::default()) })
    }
}

/// A backend the worker can run: a line of [`registry::REGISTRY`].
pub struct BackendKind {
    /// The name jobs give (`ModelRef::backend`, `backend = "…"` in a sweep).
    pub name: &'static str,
    /// Its models are HTTP models ([`WorkerModel::Http`] with this backend name: a base
    /// URL, an API model name and a key variable), which a worker configuration file
    /// (`halyard worker --config`) may declare too.
    pub http: bool,
    /// Build it from the plan (blocking: a local model takes seconds to load). Called
    /// once at start whether or not the plan has models of it; an error stops the start.
    pub load: fn(&Load<'_>) -> Result<Box<dyn Backend>, String>,
}

/// What a backend is built from.
pub struct Load<'a> {
    pub plan: &'a WorkerPlan,
    /// The HTTP policy (URL checks, body limit) of the worker's configuration.
    pub policy: http_guard::HttpPolicy,
    /// The HTTP client the HTTP backends share (one connection pool).
    pub http: &'a http_client::HttpClient,
}

impl Load<'_> {
    /// The models of the plan that backend `name` serves, with their pools (a model named
    /// by several pools comes once per pool).
    pub fn models<'b>(
        &'b self,
        name: &'b str,
    ) -> impl Iterator<Item = (&'b PoolSpec, &'b WorkerModel)> + 'b {
        self.plan.models().filter(move |(_, m)| m.backend() == name)
    }
}

/// True when this build runs GGUF models.
pub const GGUF_SUPPORT: bool = cfg!(feature = "gguf");

/// True when this build can place GGUF models on CUDA GPUs.
pub fn gguf_gpu_support() -> bool {
    cfg!(feature = "cuda")
}

pub use halyard_proto::result::MAX_COMPLETION_TOKENS;

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
    halyard_proto::UsageBound::of(&job.key).clamp(usage)
}

/// `c` with its usage clamped ([`clamp_completion`]): what a backend calling an API
/// answers.
pub fn clamped(job: &Job, mut c: Completion) -> Completion {
    clamp_completion(job, &mut c);
    c
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
        let mut u = Usage { prompt_tokens: u64::MAX, completion_tokens: u64::MAX, cache: None };
        assert!(clamp_usage(&j, &mut u));
        let prompt_cap = 64 + (9 + 16) + (14 + 16);
        assert_eq!((u.prompt_tokens, u.completion_tokens), (prompt_cap, 256));
        let mut fine = Usage { prompt_tokens: 20, completion_tokens: 3, cache: None };
        assert!(!clamp_usage(&j, &mut fine));
        assert_eq!((fine.prompt_tokens, fine.completion_tokens), (20, 3));
        let mut u = Usage { prompt_tokens: 1, completion_tokens: u64::MAX, cache: None };
        assert!(clamp_usage(&job(None), &mut u));
        assert_eq!(u.completion_tokens, MAX_COMPLETION_TOKENS);
        // What the quota charges from the clamped usage is bounded, whatever the API said.
        for counts in
            [halyard_proto::pool::TpmCounts::Usage, halyard_proto::pool::TpmCounts::MaxTokens]
        {
            let charged = charged_tokens(counts, 100, Some(256), &u);
            assert!(charged <= prompt_cap + MAX_COMPLETION_TOKENS, "{counts:?}: {charged}");
            // Unclamped extremes do not overflow the charge either.
            let max = Usage { prompt_tokens: u64::MAX, completion_tokens: u64::MAX, cache: None };
            assert_eq!(charged_tokens(counts, 100, None, &max), u64::MAX);
        }
    }
}

//! The backends this worker runs, one line each ([`REGISTRY`]), and [`Backends`]: every
//! one of them loaded for the worker's plan, calling the backend a job names. The only
//! file of the worker that names the backends; they know only the trait below them
//! ([`super::Backend`], [`super::BackendKind`], [`super::Load`]).

use halyard_proto::pool::WorkerPlan;
use halyard_proto::{Completion, Job};
use std::sync::Arc;

#[cfg(feature = "embed")]
use super::embed;
#[cfg(feature = "gguf")]
use super::gguf;
use super::http_client::HttpClient;
#[cfg(not(all(feature = "gguf", feature = "embed")))]
use super::unbuilt;
use super::{anthropic, http_guard, noop, openai, replay, server};
use super::{Backend, BackendKind, CallError, Load};
use crate::quota::RateHeaders;

/// Every backend this worker can run, one line each: a job naming `backend = "x"` is
/// called by the backend whose [`BackendKind::name`] is `x`. The order is that of the
/// names in messages, and of loading at start.
pub const REGISTRY: &[BackendKind] = &[
    openai::KIND,
    anthropic::KIND,
    #[cfg(feature = "gguf")]
    gguf::KIND,
    #[cfg(not(feature = "gguf"))]
    unbuilt::GGUF,
    server::KIND,
    replay::KIND,
    #[cfg(feature = "embed")]
    embed::KIND,
    #[cfg(not(feature = "embed"))]
    unbuilt::EMBED,
    noop::KIND,
];

/// Everything a worker can call: every backend of [`REGISTRY`], loaded for the plan.
pub struct Backends {
    /// By name, in [`REGISTRY`]'s order.
    loaded: Vec<(&'static str, Box<dyn Backend>)>,
    /// The shared client, for the `server` backend once its servers have started.
    http: HttpClient,
}

impl Backends {
    /// Build the HTTP client and load every backend of [`REGISTRY`] for the plan
    /// (blocking: loading local models takes seconds). A model named by several pools is
    /// loaded once.
    pub fn new(plan: &WorkerPlan, policy: http_guard::HttpPolicy) -> Result<Backends, String> {
        http_guard::check_plan(plan, policy)?;
        let http = HttpClient::new(policy.max_body_bytes).map_err(|e| e.message)?;
        let load = Load { plan, policy, http: &http };
        let mut loaded = Vec::with_capacity(REGISTRY.len());
        for kind in REGISTRY {
            loaded.push((kind.name, (kind.load)(&load)?));
        }
        Ok(Backends { loaded, http })
    }

    /// Calls of `backend = "server"` models go to these servers from now on (the
    /// `server` backend loaded before they started is replaced by one that calls them).
    pub fn set_servers(&mut self, servers: Arc<server::Servers>) {
        if let Some((_, b)) = self.loaded.iter_mut().find(|(n, _)| *n == server::KIND.name) {
            *b = server::serving(&self.http, servers);
        }
    }

    /// The backend a job names.
    fn of(&self, job: &Job) -> Result<&dyn Backend, CallError> {
        let name = job.key.model.backend.as_str();
        match self.loaded.iter().find(|(n, _)| *n == name) {
            Some((_, b)) => Ok(b.as_ref()),
            None => {
                let names: Vec<&str> = REGISTRY.iter().map(|k| k.name).collect();
                Err(CallError::permanent(format!(
                    "this worker has no backend {name:?} (it runs: {})",
                    names.join(", ")
                )))
            }
        }
    }

    /// One attempt at the call, with the API's rate-limit headers (HTTP backends only).
    pub async fn call_with_limits(
        &self,
        job: &Job,
    ) -> (Result<Completion, CallError>, RateHeaders) {
        match self.of(job) {
            Ok(b) => b.call_with_limits(job).await,
            Err(e) => (Err(e), RateHeaders::default()),
        }
    }

    /// One attempt at the call (no retries).
    pub async fn call(&self, job: &Job) -> Result<Completion, CallError> {
        self.of(job)?.call(job).await
    }
}

//! Model backends. A backend turns a [`Job`]'s request into a [`Completion`] or a
//! classified [`CallError`]; retries and pacing are the caller's business.

pub mod openai;

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

/// The backends a worker can run. An enum rather than a trait object: the set is closed,
/// and each variant owns its resources (HTTP client pool, loaded model).
#[derive(Clone)]
pub enum Backend {
    OpenAi(openai::OpenAi),
    /// Answers at once with an empty completion (throughput benchmarks of the job path).
    Noop,
}

impl Backend {
    /// One attempt at the call (no retries).
    pub async fn call(&self, job: &Job) -> Result<Completion, CallError> {
        match self {
            Backend::OpenAi(b) => b.call(job).await,
            Backend::Noop => Ok(Completion {
                text: String::new(),
                usage: Default::default(),
                latency_ms: 0,
                finish_reason: Some("stop".into()),
                calls: 1,
            }),
        }
    }

    /// The backend for a job, by the job's `model.backend`.
    pub fn for_kind(kind: &str, http: &openai::OpenAi) -> Result<Backend, CallError> {
        match kind {
            "openai" => Ok(Backend::OpenAi(http.clone())),
            "noop" => Ok(Backend::Noop),
            other => Err(CallError::permanent(format!("this worker has no backend {other:?} (it runs: openai, noop)"))),
        }
    }
}

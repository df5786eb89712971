//! `backend = "noop"`: answers every job at once with empty text, calling nothing
//! (throughput benchmarks of the job path).

use futures::future::BoxFuture;
use halyard_proto::{Completion, Job, Usage};

use super::{Backend, BackendKind, CallError};

/// `backend = "noop"`.
pub const KIND: BackendKind =
    BackendKind { name: "noop", http: false, load: |_| Ok(Box::new(Noop)) };

/// The backend that calls nothing.
pub struct Noop;

/// The noop backend's answer: empty text, one call, nothing used.
pub fn answer() -> Completion {
    Completion {
        text: String::new(),
        usage: Usage::default(),
        latency_ms: 0,
        finish_reason: Some("stop".into()),
        calls: 1,
        logprobs: None,
        refusal: false,
        source: Default::default(),
    }
}

impl Backend for Noop {
    fn call<'a>(&'a self, _job: &'a Job) -> BoxFuture<'a, Result<Completion, CallError>> {
        Box::pin(std::future::ready(Ok(answer())))
    }
}

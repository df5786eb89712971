//! How a backend call failed ([`CallError`], with its [`ErrorClass`]): a shared value that
//! the backends make and the retries, quotas, pauses and the delivery read. Re-exported
//! as `backend::{CallError, ErrorClass}`.

use std::time::Duration;

use halyard_proto::OutageReason;

/// How a failed call should be treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// Worth retrying, and the job's own failure: HTTP 500 and other 5xx not listed under
    /// `Unavailable`, 408, 409, 425, malformed or truncated bodies.
    Transient,
    /// HTTP 429: retry after the server's `Retry-After` (or a backoff).
    RateLimited,
    /// The endpoint as a whole is not answering: connection refused or reset, DNS, TLS,
    /// timeouts, HTTP 502/503/504/529. The pool pauses (see `health`); the job
    /// goes back to the queue without spending its delivery budget.
    Unavailable(OutageReason),
    /// Will never succeed: other 4xx (400, 401, 403, 404, 413, 422, ... a prompt too
    /// long), unknown backend, missing API key.
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
        CallError {
            class: ErrorClass::Permanent,
            status: None,
            message: message.into(),
            retry_after: None,
        }
    }
    pub fn transient(message: impl Into<String>) -> Self {
        CallError {
            class: ErrorClass::Transient,
            status: None,
            message: message.into(),
            retry_after: None,
        }
    }
    /// The endpoint as a whole failed (see [`ErrorClass::Unavailable`]).
    pub fn unavailable(reason: OutageReason, message: impl Into<String>) -> Self {
        CallError {
            class: ErrorClass::Unavailable(reason),
            status: None,
            message: message.into(),
            retry_after: None,
        }
    }
    pub fn is_permanent(&self) -> bool {
        self.class == ErrorClass::Permanent
    }
    /// Why the endpoint as a whole failed, if it did.
    pub fn outage(&self) -> Option<OutageReason> {
        match self.class {
            ErrorClass::Unavailable(r) => Some(r),
            _ => None,
        }
    }
}

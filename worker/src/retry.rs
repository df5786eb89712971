//! Retries inside one delivery: exponential backoff with jitter (backon), honouring
//! `Retry-After`. Only transient and rate-limited errors are retried. A `Retry-After`
//! longer than [`RetryPolicy::max_in_place_wait`] ends the in-place retries: the job is
//! nak'd with that delay instead, so it does not hold a concurrency slot while waiting.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use halyard_proto::{Completion, Job};

use crate::backend::{Backends, CallError, ErrorClass};
use crate::quota::QuotaGate;

#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    /// Attempts after the first one, within one delivery.
    pub retries: usize,
    pub min_delay: Duration,
    pub max_delay: Duration,
    pub max_in_place_wait: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            retries: 3,
            min_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(10),
            max_in_place_wait: Duration::from_secs(30),
        }
    }
}

/// Call the backend, retrying transient failures. On success the completion's `calls`
/// counts every attempt made; on failure the error is the last one.
pub async fn call_with_retry(backend: &Backends, job: &Job, policy: RetryPolicy) -> (Result<Completion, CallError>, u32) {
    call_with_retry_gated(backend, None, &crate::Stats::default(), job, policy).await
}

/// As [`call_with_retry`], every attempt passing the pool's quota gate when it has one.
pub async fn call_with_retry_gated(
    backend: &Backends,
    gate: Option<&QuotaGate>,
    stats: &crate::Stats,
    job: &Job,
    policy: RetryPolicy,
) -> (Result<Completion, CallError>, u32) {
    let attempts = AtomicU32::new(0);
    let backoff = ExponentialBuilder::default()
        .with_min_delay(policy.min_delay)
        .with_max_delay(policy.max_delay)
        .with_max_times(policy.retries)
        .with_jitter();
    let res = (|| async {
        attempts.fetch_add(1, Ordering::Relaxed);
        let r = match gate {
            None => backend.call(job).await,
            Some(g) => g.call(job, || backend.call_with_limits(job)).await,
        };
        if matches!(&r, Err(e) if e.status == Some(429)) {
            stats.rate_limited.inc();
        }
        r
    })
    .retry(backoff)
    .when(|e: &CallError| e.class != ErrorClass::Permanent)
    .adjust(|e: &CallError, planned: Option<Duration>| {
        let planned = planned?;
        match e.retry_after {
            Some(ra) if ra > policy.max_in_place_wait => None,
            Some(ra) => Some(ra.max(planned)),
            None => Some(planned),
        }
    })
    .await;
    let n = attempts.load(Ordering::Relaxed);
    (
        res.map(|mut c| {
            c.calls = n;
            c
        }),
        n,
    )
}

//! One job's call with its retries in place (the policy: [`crate::retry::RetryPolicy`];
//! whether and when to try again: [`crate::lifecycle::retries_in_place`] and
//! [`crate::lifecycle::in_place_delay`]): exponential backoff with jitter (backon),
//! honouring `Retry-After`. Only the job's transient failures and rate limits are
//! retried in place. A `Retry-After` longer than
//! the policy's `max_in_place_wait` ends the in-place retries: the job is nak'd with that
//! delay instead, so it does not hold a concurrency slot while waiting. An endpoint-wide
//! failure ends them too: the pool's health decides what happens next (see
//! [`crate::health`]), and each attempt reports to it whether the endpoint answered.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use halyard_proto::{Completion, Job, OutageReason};
use tokio::time::Instant;

use crate::backend::registry::Backends;
use crate::backend::{CallError, ErrorClass};
use crate::health::{Failure, PoolHealth, Verdict};
use crate::lifecycle::{in_place_delay, retries_in_place};
use crate::quota::QuotaGate;
use crate::retry::RetryPolicy;

/// What one call with its retries did, shared with the pool loop while it runs.
#[derive(Debug, Default)]
pub struct Attempts {
    count: AtomicU32,
    in_http: AtomicBool,
    opened: AtomicBool,
}

impl Attempts {
    /// Attempts made (HTTP requests sent, or backend calls).
    pub fn count(&self) -> u32 {
        self.count.load(Ordering::Relaxed)
    }
    /// A request is on the wire: abandoning it now could waste a paid answer.
    pub fn in_http(&self) -> bool {
        self.in_http.load(Ordering::Relaxed)
    }
    /// An attempt's failure began the pool's pause.
    pub fn opened(&self) -> bool {
        self.opened.load(Ordering::Relaxed)
    }
}

/// One job's call: where it goes and what it reports to.
pub struct Call<'a> {
    pub backends: &'a Backends,
    /// The pool's quota gate, when it has a quota.
    pub gate: Option<&'a QuotaGate>,
    /// The pool's endpoint health.
    pub health: Option<&'a PoolHealth>,
    /// This call is the pool's probe: it goes out although the pool is paused.
    pub probe: bool,
    pub stats: &'a crate::stats::Stats,
    pub job: &'a Job,
    pub policy: RetryPolicy,
    pub attempts: &'a Attempts,
}

impl Call<'_> {
    /// Call the backend, retrying the job's transient failures. On success the
    /// completion's `calls` counts every attempt; on failure the error is the last one.
    pub async fn run(&self) -> Result<Completion, CallError> {
        let p = self.policy;
        let backoff = ExponentialBuilder::default()
            .with_min_delay(p.min_delay)
            .with_max_delay(p.max_delay)
            .with_max_times(p.retries)
            .with_jitter();
        let res = (|| self.attempt())
            .retry(backoff)
            .when(|e: &CallError| retries_in_place(e.class))
            .adjust(|e: &CallError, planned: Option<Duration>| {
                in_place_delay(&p, e.retry_after, planned)
            })
            .await;
        res.map(|mut c| {
            c.calls = self.attempts.count();
            c
        })
    }

    async fn attempt(&self) -> Result<Completion, CallError> {
        if let Some(h) = self.health.filter(|h| !self.probe && h.is_paused()) {
            let reason = h.paused_by().unwrap_or(OutageReason::Connection);
            return Err(CallError::unavailable(
                reason,
                format!(
                    "pool {} is paused (endpoint down: {reason}); the job goes back to the queue",
                    h.pool()
                ),
            ));
        }
        self.attempts.count.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let r = match self.gate {
            None => {
                self.attempts.in_http.store(true, Ordering::Relaxed);
                self.backends.call(self.job).await
            }
            Some(g) => {
                g.call(self.job, || {
                    self.attempts.in_http.store(true, Ordering::Relaxed);
                    self.backends.call_with_limits(self.job)
                })
                .await
            }
        };
        self.attempts.in_http.store(false, Ordering::Relaxed);
        if matches!(&r, Err(e) if e.status == Some(429)) {
            self.stats.rate_limited.inc();
        }
        self.report(started, r)
    }

    /// Tell the pool's health what the endpoint did; a timeout or a broken connection
    /// while the endpoint answered other calls is this call's own transient failure.
    fn report(
        &self,
        started: Instant,
        r: Result<Completion, CallError>,
    ) -> Result<Completion, CallError> {
        let Some(h) = self.health else { return r };
        let e = match r {
            Ok(c) => {
                h.answered(started, self.probe);
                return Ok(c);
            }
            // Before the endpoint first answered, a refused key or a 404 pauses the pool.
            Err(e) => h.first_contact(e),
        };
        let Some(reason) = e.outage() else {
            // An HTTP answer of any kind shows the endpoint up.
            if e.status.is_some() {
                h.answered(started, self.probe);
            }
            return Err(e);
        };
        let f = Failure {
            started,
            reason,
            error: e.message.clone(),
            retry_after: e.retry_after,
            probe: self.probe,
        };
        match h.failed(f) {
            Verdict::JobFault => Err(CallError { class: ErrorClass::Transient, ..e }),
            Verdict::Opened => {
                self.attempts.opened.store(true, Ordering::Relaxed);
                Err(e)
            }
            Verdict::Paused => Err(e),
        }
    }
}

//! How a delivery retries a job's call in place: exponential backoff with jitter (backon),
//! honouring `Retry-After`. Only the job's transient failures and rate limits are retried
//! in place. A `Retry-After` longer than [`RetryPolicy::max_in_place_wait`] ends the
//! in-place retries: the job is nak'd with that delay instead, so it does not hold a
//! concurrency slot while waiting. An endpoint-wide failure ends them too: the pool's
//! health decides what happens next. The retries themselves are the delivery's
//! (`delivery/retrying.rs`); this is the policy, a value at the bottom of the worker.

use std::time::Duration;

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

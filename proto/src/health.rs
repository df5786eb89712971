//! Endpoint health of a pool, as workers publish it for the coordinator and
//! `halyard status` to read.
//!
//! When a pool's endpoint fails for endpoint-wide reasons (connection refused or reset,
//! DNS, TLS, timeouts, HTTP 502/503/504/529), the pool's workers pause it: they fetch no
//! new jobs, hand the jobs they hold back to the queue without spending their delivery
//! budget, and probe the endpoint with one request at a growing interval until a call
//! succeeds. The worker that sees a change writes the pool's [`PoolHealthRecord`] to
//! the JetStream KV bucket [`crate::subjects::POOL_HEALTH_BUCKET`] under the key
//! [`crate::subjects::pool_token`] of the pool, as JSON: when the pause begins, after
//! every failed probe (at most [`MAX_PROBE_INTERVAL_S`] apart) and when the pool
//! resumes. A paused record whose `updated_ms` is much older than its `next_probe_ms`
//! comes from workers that all stopped while the pool was paused.
//!
//! First contact (issue 48): an endpoint that has not answered a worker yet also pauses
//! its pool for a refused key (401/403), a 404 (route or model) or an answer that is not
//! the API's shape ([`OutageReason::first_contact_only`]): the coordinator stops a run
//! whose pool never produced a result after `[run] first_contact_s`, naming the fix,
//! instead of dead-lettering every job or waiting `outage_patience_s`.

use serde::{Deserialize, Serialize};

/// The longest interval between two probes of a paused pool, in seconds.
pub const MAX_PROBE_INTERVAL_S: u64 = 60;

/// Why a pool's endpoint counts as down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutageReason {
    /// Connection refused, reset or closed before the answer.
    Connection,
    /// The endpoint's host name does not resolve.
    Dns,
    /// The TLS handshake failed.
    Tls,
    /// No answer within the model's `timeout_s`.
    Timeout,
    /// HTTP 502.
    BadGateway,
    /// HTTP 503.
    Unavailable,
    /// HTTP 504.
    GatewayTimeout,
    /// HTTP 529 ("overloaded").
    Overloaded,
    /// First contact only (an endpoint that has not answered this worker yet): HTTP 401
    /// or 403, the key was refused.
    Unauthorized,
    /// First contact only: HTTP 404, a wrong route (`base_url`) or an unknown model name.
    NotFound,
    /// First contact only: a 200 whose body is not a chat completion (`base_url` points
    /// at something that is not an OpenAI-compatible API).
    NotApi,
}

impl OutageReason {
    /// Every reason, in a fixed order (metrics list each one).
    pub const ALL: [OutageReason; 11] = [
        OutageReason::Connection,
        OutageReason::Dns,
        OutageReason::Tls,
        OutageReason::Timeout,
        OutageReason::BadGateway,
        OutageReason::Unavailable,
        OutageReason::GatewayTimeout,
        OutageReason::Overloaded,
        OutageReason::Unauthorized,
        OutageReason::NotFound,
        OutageReason::NotApi,
    ];

    /// The reason as a metric label and in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            OutageReason::Connection => "connection",
            OutageReason::Dns => "dns",
            OutageReason::Tls => "tls",
            OutageReason::Timeout => "timeout",
            OutageReason::BadGateway => "bad_gateway",
            OutageReason::Unavailable => "unavailable",
            OutageReason::GatewayTimeout => "gateway_timeout",
            OutageReason::Overloaded => "overloaded",
            OutageReason::Unauthorized => "unauthorized",
            OutageReason::NotFound => "not_found",
            OutageReason::NotApi => "not_api",
        }
    }

    /// Whether only an endpoint that never answered counts as down for it (401/403,
    /// 404, an answer not of the API's shape): see `halyard_worker::health::first_contact`.
    pub fn first_contact_only(self) -> bool {
        matches!(self, OutageReason::Unauthorized | OutageReason::NotFound | OutageReason::NotApi)
    }

    /// The reason an HTTP status gives, if it is one of the endpoint-wide ones.
    pub fn from_status(status: u16) -> Option<OutageReason> {
        match status {
            502 => Some(OutageReason::BadGateway),
            503 => Some(OutageReason::Unavailable),
            504 => Some(OutageReason::GatewayTimeout),
            529 => Some(OutageReason::Overloaded),
            _ => None,
        }
    }
}

impl std::fmt::Display for OutageReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A pool's health as its workers last saw it (the value under the pool's key).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PoolHealthRecord {
    /// The pool's name (the key is its subject token).
    pub pool: String,
    /// The pool is paused: its workers fetch nothing and probe the endpoint.
    pub paused: bool,
    /// Why the current pause began (or the last one, once resumed).
    pub reason: OutageReason,
    /// The error that began the pause, for people (no secrets: URLs and statuses).
    pub error: String,
    /// When the current (or last) pause began, Unix milliseconds.
    pub since_ms: u64,
    /// When the next probe is due (None once resumed), Unix milliseconds.
    pub next_probe_ms: Option<u64>,
    /// Probes that failed since the pause began.
    pub probes_failed: u32,
    /// When the pool resumed (None while paused), Unix milliseconds.
    pub resumed_ms: Option<u64>,
    /// The worker that wrote this record.
    pub worker: String,
    /// When this record was written, Unix milliseconds.
    pub updated_ms: u64,
}

impl PoolHealthRecord {
    /// How long the pause lasted (until `now_ms` while still paused), in milliseconds.
    pub fn down_for_ms(&self, now_ms: u64) -> u64 {
        self.resumed_ms.unwrap_or(now_ms).saturating_sub(self.since_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records survive a JSON round trip with the reason in snake case, and statuses map
    /// to the endpoint-wide reasons only.
    #[test]
    fn record_json_and_reasons() {
        let r = PoolHealthRecord {
            pool: "openai/gpt@team".into(),
            paused: true,
            reason: OutageReason::GatewayTimeout,
            error: "HTTP 504".into(),
            since_ms: 1_000,
            next_probe_ms: Some(3_000),
            probes_failed: 1,
            resumed_ms: None,
            worker: "w1".into(),
            updated_ms: 2_000,
        };
        let text = serde_json::to_string(&r).unwrap();
        assert!(text.contains("\"reason\":\"gateway_timeout\""), "{text}");
        assert_eq!(serde_json::from_str::<PoolHealthRecord>(&text).unwrap(), r);
        assert_eq!(r.down_for_ms(5_000), 4_000);
        for s in [502, 503, 504, 529] {
            assert!(OutageReason::from_status(s).is_some(), "{s}");
        }
        for s in [200, 400, 408, 409, 429, 500, 501] {
            assert_eq!(OutageReason::from_status(s), None, "{s}");
        }
        for r in OutageReason::ALL {
            let j = serde_json::to_string(&r).unwrap();
            assert_eq!(j, format!("\"{}\"", r.as_str()));
        }
    }
}

//! What an HTTP API's failures are to Halyard: a status, or a request that failed without
//! one, as a classified [`CallError`] (an endpoint-wide failure pauses the pool, a rate
//! limit the pool's calls, the job's own failure is retried or dead-lettered), with the
//! `Retry-After` it gave. Shared by every HTTP backend, the provider batch APIs and the
//! body reader of [`super::http_guard`]; it imports nothing above the call errors.

use std::time::Duration;

use halyard_proto::{redact, OutageReason};

use crate::call_error::{CallError, ErrorClass};

/// Parse `Retry-After`: delta-seconds (possibly fractional) or an HTTP date.
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    let v = value.trim();
    if let Ok(secs) = v.parse::<f64>() {
        if secs.is_finite() && secs >= 0.0 {
            return Some(Duration::from_secs_f64(secs.min(86_400.0)));
        }
        return None;
    }
    let when = httpdate::parse_http_date(v).ok()?;
    Some(when.duration_since(std::time::SystemTime::now()).unwrap_or(Duration::ZERO))
}

/// Map an HTTP status to an error class: 502/503/504/529 are the endpoint's (the pool
/// pauses), other 5xx and 408/409/425 the job's to retry, 429 a rate limit, any other
/// 4xx (a bad request, a prompt too long) permanent.
pub fn classify_status(status: u16) -> ErrorClass {
    if let Some(reason) = OutageReason::from_status(status) {
        return ErrorClass::Unavailable(reason);
    }
    match status {
        429 => ErrorClass::RateLimited,
        408 | 409 | 425 => ErrorClass::Transient,
        500..=599 => ErrorClass::Transient,
        _ => ErrorClass::Permanent,
    }
}

/// Classify a failed request (no HTTP status): a timeout, a connection that could not be
/// made (refused, DNS, TLS) or that broke before the answer (reset, closed) is the
/// endpoint's; anything else is the job's to retry.
pub fn classify_transport(e: &reqwest::Error) -> (ErrorClass, &'static str) {
    let chain = error_chain(e);
    let lower = chain.to_ascii_lowercase();
    if e.is_timeout() {
        return (ErrorClass::Unavailable(OutageReason::Timeout), "timed out");
    }
    if e.is_connect() {
        let reason = if lower.contains("dns error") || lower.contains("failed to lookup") {
            OutageReason::Dns
        } else if ["tls", "certificate", "handshake"].iter().any(|w| lower.contains(w)) {
            OutageReason::Tls
        } else {
            OutageReason::Connection
        };
        return (ErrorClass::Unavailable(reason), "connection failed");
    }
    if broken_connection(e) || BROKEN.iter().any(|w| lower.contains(w)) {
        return (ErrorClass::Unavailable(OutageReason::Connection), "connection broken");
    }
    (ErrorClass::Transient, "request failed")
}

/// How hyper and the OS word a connection that broke before the answer was complete.
const BROKEN: [&str; 6] = [
    "connection closed before message completed",
    "end of file before message length reached",
    "connection reset",
    "broken pipe",
    "connection aborted",
    "unexpected eof",
];

/// An IO error somewhere in the chain says the connection broke.
fn broken_connection(e: &reqwest::Error) -> bool {
    use std::io::ErrorKind as K;
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                K::ConnectionRefused
                    | K::ConnectionReset
                    | K::ConnectionAborted
                    | K::BrokenPipe
                    | K::UnexpectedEof
                    | K::NotConnected
            ) {
                return true;
            }
        }
        source = s.source();
    }
    false
}

/// The error and its sources, `: `-separated (reqwest's own message names only the
/// outermost layer).
pub fn error_chain(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// A failed request as a classified error. reqwest errors carry the URL but never
/// headers, so the key cannot leak here.
/// A failed request or body read as a [`CallError`]: classified (an endpoint-wide failure
/// pauses the pool), and worded with `what` (the request, its URL already without
/// credentials) and the error chain with any URL in it redacted the same way.
pub fn transport_error(what: &str, during: &str, e: &reqwest::Error) -> CallError {
    let (class, kind) = classify_transport(e);
    let mut chain = error_chain(e);
    if let Some(u) = e.url() {
        chain = chain.replace(u.as_str(), &redact::url(u.as_str()));
    }
    CallError {
        class,
        status: None,
        message: format!("{what}: {during}{kind}: {}", redact::secrets(&chain)),
        retry_after: None,
    }
}

/// The `Retry-After` of a response, if it has a readable one.
pub fn retry_after_of(resp: &reqwest::Response) -> Option<Duration> {
    resp.headers().get("retry-after").and_then(|v| v.to_str().ok()).and_then(parse_retry_after)
}

/// An answer with HTTP status `status` (not a success) as a classified error naming
/// `what`, with the start of the body, anything that looks like a key redacted.
pub fn status_error(
    what: &str,
    status: u16,
    body: &[u8],
    retry_after: Option<Duration>,
) -> CallError {
    let text = redact::secrets(&String::from_utf8_lossy(&body[..body.len().min(300)]));
    CallError {
        class: classify_status(status),
        status: Some(status),
        message: format!("{what}: HTTP {status}: {text}"),
        retry_after,
    }
}

//! Any OpenAI-compatible `POST {base_url}/chat/completions` endpoint.
//!
//! The API key is read from the environment variable the job names, at call time, and
//! goes only into the `Authorization` header: never into logs, errors or results.

use std::time::{Duration, Instant};

use halyard_proto::{Completion, Job, Usage};
use serde::Deserialize;

use super::{CallError, ErrorClass};
use crate::quota::RateHeaders;

#[derive(Clone)]
pub struct OpenAi {
    client: reqwest::Client,
}

#[derive(Deserialize)]
struct Response {
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<ApiUsage>,
}

#[derive(Deserialize)]
struct Choice {
    message: Message,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    content: Option<String>,
}

#[derive(Deserialize)]
struct ApiUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

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

/// Map an HTTP status to an error class.
pub fn classify_status(status: u16) -> ErrorClass {
    match status {
        429 => ErrorClass::RateLimited,
        408 | 409 | 425 => ErrorClass::Transient,
        500..=599 => ErrorClass::Transient,
        _ => ErrorClass::Permanent,
    }
}

/// Decode a 200 body into a completion; a body that is not a chat completion is an error
/// that says what was wrong (and shows the start of the body).
pub fn decode_body(body: &[u8]) -> Result<(String, Usage, Option<String>), CallError> {
    let snippet = || String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
    let r: Response = serde_json::from_slice(body).map_err(|e| {
        CallError::transient(format!("response is not a chat completion ({e}); body starts: {:?}", snippet()))
    })?;
    let Some(choice) = r.choices.into_iter().next() else {
        return Err(CallError::transient(format!("response has no choices; body starts: {:?}", snippet())));
    };
    let usage = r.usage.map(|u| Usage { prompt_tokens: u.prompt_tokens, completion_tokens: u.completion_tokens });
    Ok((choice.message.content.unwrap_or_default(), usage.unwrap_or_default(), choice.finish_reason))
}

impl OpenAi {
    pub fn new() -> Result<OpenAi, CallError> {
        // reqwest is built without a default TLS provider; use ring (already linked by async-nats).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| CallError::permanent(format!("cannot build HTTP client: {e}")))?;
        Ok(OpenAi { client })
    }

    pub async fn call(&self, job: &Job) -> Result<Completion, CallError> {
        self.call_with_limits(job).await.0
    }

    /// One call, with the rate-limit headers of its answer (default when none came).
    pub async fn call_with_limits(&self, job: &Job) -> (Result<Completion, CallError>, RateHeaders) {
        let mut limits = RateHeaders::default();
        let res = self.call_inner(job, &mut limits).await;
        (res, limits)
    }

    async fn call_inner(&self, job: &Job, limits: &mut RateHeaders) -> Result<Completion, CallError> {
        let key = &job.key;
        let url = format!("{}/chat/completions", key.model.endpoint.trim_end_matches('/'));
        let messages: Vec<serde_json::Value> = key
            .messages
            .iter()
            .map(|m| serde_json::json!({"role": m.role.as_str(), "content": m.content}))
            .collect();
        let mut body = serde_json::json!({
            "model": key.model.model,
            "messages": messages,
            "temperature": key.sampling.temperature,
        });
        if let Some(mt) = key.sampling.max_tokens {
            body["max_tokens"] = mt.into();
        }
        if let Some(seed) = key.sampling.seed {
            body["seed"] = seed.into();
        }
        let mut req = self.client.post(&url).json(&body).timeout(Duration::from_millis(job.timeout_ms.max(1)));
        if let Some(var) = &job.api_key_env {
            match std::env::var(var) {
                Ok(k) if !k.is_empty() => req = req.bearer_auth(k),
                _ => {
                    return Err(CallError::permanent(format!(
                        "environment variable {var} (api_key_env of model {:?}) is not set on worker",
                        key.model.model
                    )))
                }
            }
        }
        let started = Instant::now();
        let resp = req.send().await.map_err(|e| {
            let what = if e.is_timeout() { "timed out" } else if e.is_connect() { "connection failed" } else { "request failed" };
            // reqwest errors carry the URL but never headers, so the key cannot leak here.
            CallError::transient(format!("POST {url}: {what}: {e}"))
        })?;
        let status = resp.status().as_u16();
        *limits = RateHeaders::parse(|n| resp.headers().get(n).and_then(|v| v.to_str().ok()));
        let retry_after = resp.headers().get("retry-after").and_then(|v| v.to_str().ok()).and_then(parse_retry_after);
        let bytes = resp.bytes().await.map_err(|e| CallError::transient(format!("POST {url}: reading body: {e}")))?;
        if status != 200 {
            let text = String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).into_owned();
            return Err(CallError {
                class: classify_status(status),
                status: Some(status),
                message: format!("POST {url}: HTTP {status}: {text}"),
                retry_after,
            });
        }
        let (text, usage, finish_reason) = decode_body(&bytes).map_err(|mut e| {
            e.message = format!("POST {url}: {}", e.message);
            e
        })?;
        Ok(Completion { text, usage, latency_ms: started.elapsed().as_millis() as u64, finish_reason, calls: 1 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Status codes map to the retry classes DESIGN.md names.
    #[test]
    fn status_classes() {
        assert_eq!(classify_status(429), ErrorClass::RateLimited);
        for s in [500, 502, 503, 504, 408] {
            assert_eq!(classify_status(s), ErrorClass::Transient, "{s}");
        }
        for s in [400, 401, 403, 404, 422] {
            assert_eq!(classify_status(s), ErrorClass::Permanent, "{s}");
        }
    }

    /// Retry-After accepts seconds and HTTP dates, and rejects nonsense.
    #[test]
    fn retry_after_forms() {
        assert_eq!(parse_retry_after("3"), Some(Duration::from_secs(3)));
        assert_eq!(parse_retry_after(" 0.5 "), Some(Duration::from_millis(500)));
        assert_eq!(parse_retry_after("-1"), None);
        assert_eq!(parse_retry_after("soon"), None);
        let future = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(120));
        let d = parse_retry_after(&future).unwrap();
        assert!(d > Duration::from_secs(100) && d <= Duration::from_secs(120), "{d:?}");
    }

    /// Bodies that are not chat completions give errors naming the problem, never panics.
    #[test]
    fn bad_bodies_are_errors() {
        let ok = br#"{"choices":[{"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":1}}"#;
        let (t, u, f) = decode_body(ok).unwrap();
        assert_eq!((t.as_str(), u.prompt_tokens, u.completion_tokens, f.as_deref()), ("hi", 4, 1, Some("stop")));
        for bad in [&b"<html>502</html>"[..], b"{}", br#"{"choices":[]}"#, br#"{"choices":[{"message":7}]}"#, b"", b"\xff\xfe"] {
            let e = decode_body(bad).unwrap_err();
            assert_eq!(e.class, ErrorClass::Transient);
            assert!(!e.message.is_empty());
        }
        // null content (e.g. tool calls) is an empty answer, not an error.
        let (t, _, _) = decode_body(br#"{"choices":[{"message":{"content":null}}]}"#).unwrap();
        assert_eq!(t, "");
    }
}

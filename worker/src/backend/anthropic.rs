//! `backend = "anthropic"`: Anthropic's Messages API, `POST {base_url}/messages`
//! (issue 52).
//!
//! Written from Anthropic's API reference ("Messages", "Errors", "Rate limits",
//! "Prompt caching", "Structured outputs"):
//!
//! - **Request.** `x-api-key` (from the worker's own `api_key_env`, as for `openai`) and
//!   `anthropic-version: 2023-06-01`. The job's system messages go into the `system`
//!   field (joined by a blank line), its user and assistant messages into `messages`.
//!   `max_tokens` is required by the API: the sweep refuses an Anthropic model without
//!   one, and a job without one is a permanent error here. `temperature`, `top_p`,
//!   `top_k` and the stop sequences (`stop_sequences`) are sent when set; the job's `seed` is not (the API has none), and a job
//!   asking for log-probabilities is refused (the API gives none). A structured-output
//!   job sends its schema as `output_config.format` (`{"type": "json_schema",
//!   "schema"}`), keys in the job's order, length bounds left off the wire as for
//!   `openai`.
//! - **Prompt caching.** With `prompt_cache` on the model (a lifetime: `5m` or `1h`), the
//!   system prompt (the shared prefix: a judge's long fixed instruction) goes as one text
//!   block with `cache_control: {"type": "ephemeral", "ttl"}`.
//! - **Answer.** The `text` blocks of `content`, joined; any other block type is a
//!   permanent error naming it (`tool_use`, `thinking`: this backend asks for neither).
//!   `stop_reason` `refusal` sets [`Completion::refusal`]; `max_tokens` gives the
//!   finish reason `length` (truncated, counted in the cost table), `stop_sequence`
//!   gives `stop`; others are kept as they are. Usage: `input_tokens` +
//!   `cache_creation_input_tokens` + `cache_read_input_tokens` are the prompt tokens, the cache writes (by lifetime,
//!   from `usage.cache_creation` when given, else the model's `prompt_cache`) and reads
//!   are kept apart for their prices ([`halyard_proto::CacheUsage`]).
//! - **Errors and limits.** Statuses map as for `openai` ([`classify_status`]): 429
//!   (`rate_limit_error`) is a rate limit that pauses the whole pool, honouring
//!   `retry-after`; 529 (`overloaded_error`) and 502/503/504 are the endpoint's (the pool
//!   pauses and probes); other 5xx (`api_error`) the job's to retry; 400, 401, 403, 404,
//!   413 permanent. The `anthropic-ratelimit-*` headers feed the pool's quota gate like
//!   OpenAI's `x-ratelimit-*` ([`rate_headers`]).
//!
//! [`classify_status`]: super::openai::classify_status

use std::time::{Duration, Instant};

use futures::future::BoxFuture;

use halyard_proto::pool::{HttpModelSpec, PromptCacheTtl};
use halyard_proto::{redact, CacheUsage, Completion, Job, Role, Usage};
use serde::Deserialize;
use serde_json::{json, Value};

use super::openai::{
    api_key, retry_after_of, status_error, transport_error, without_length_bounds,
};
use super::{Backend, BackendKind, HttpModels};
use crate::call_error::CallError;
use crate::quota::RateHeaders;

/// The API version every request names (`anthropic-version`).
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// `backend = "anthropic"`: the plan's Anthropic models, by pool, and one client.
pub const KIND: BackendKind = BackendKind {
    name: "anthropic",
    http: true,
    load: |l| {
        let models = HttpModels::of(l.plan, "anthropic");
        // No Anthropic model in the plan: no client of its own (building one loads the
        // system's root certificates); its jobs are refused like any other backend's.
        let client = match models.is_empty() {
            true => None,
            false => Some(Anthropic::new(l.policy.max_body_bytes).map_err(|e| e.message)?),
        };
        Ok(Box::new(AnthropicBackend { client, models }))
    },
};

/// The loaded backend: a job goes to its pool's Anthropic model.
struct AnthropicBackend {
    /// `None` when the plan has no Anthropic model.
    client: Option<Anthropic>,
    models: HttpModels,
}

impl Backend for AnthropicBackend {
    fn call<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Result<Completion, CallError>> {
        Box::pin(async move { self.call_with_limits(job).await.0 })
    }

    fn call_with_limits<'a>(
        &'a self,
        job: &'a Job,
    ) -> BoxFuture<'a, (Result<Completion, CallError>, RateHeaders)> {
        Box::pin(async move {
            match self.models.model(job) {
                Ok(m) => match &self.client {
                    Some(client) => {
                        let (r, headers) = client.call_with_limits(job, m).await;
                        (r.map(|c| super::clamped(job, c)), headers)
                    }
                    None => (
                        Err(CallError::permanent(
                            "this worker's plan has no Anthropic model".to_string(),
                        )),
                        RateHeaders::default(),
                    ),
                },
                Err(e) => (Err(e), RateHeaders::default()),
            }
        })
    }
}

/// The Messages API client.
#[derive(Clone)]
pub struct Anthropic {
    client: reqwest::Client,
    /// Largest response body read (bytes).
    max_body_bytes: u64,
}

#[derive(Deserialize)]
struct Message {
    content: Vec<Value>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: Option<ApiUsage>,
}

#[derive(Deserialize, Default)]
struct ApiUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation: Option<CacheCreation>,
}

#[derive(Deserialize, Default)]
struct CacheCreation {
    #[serde(default)]
    ephemeral_5m_input_tokens: u64,
    #[serde(default)]
    ephemeral_1h_input_tokens: u64,
}

/// A decoded message.
#[derive(Debug)]
pub struct Decoded {
    pub text: String,
    pub usage: Usage,
    /// `stop_reason`, with `max_tokens` as `length` (the name every other backend uses).
    pub finish_reason: Option<String>,
    pub refusal: bool,
}

/// The usage of a message (`usage` of a Messages answer, or of a batch result's
/// message); `ttl` says what lifetime unsplit cache writes had.
fn usage_of(u: ApiUsage, ttl: Option<PromptCacheTtl>) -> Usage {
    let written = u.cache_creation_input_tokens.unwrap_or(0);
    let read = u.cache_read_input_tokens.unwrap_or(0);
    let (write_5m, write_1h) = match (u.cache_creation, ttl) {
        (Some(c), _) if c.ephemeral_5m_input_tokens + c.ephemeral_1h_input_tokens == written => {
            (c.ephemeral_5m_input_tokens, c.ephemeral_1h_input_tokens)
        }
        (_, Some(PromptCacheTtl::OneHour)) => (0, written),
        _ => (written, 0),
    };
    let cache = (written > 0 || read > 0).then_some(CacheUsage { write_5m, write_1h, read });
    Usage {
        prompt_tokens: u.input_tokens.saturating_add(written).saturating_add(read),
        completion_tokens: u.output_tokens,
        cache,
    }
}

/// Decode a 200 body of `POST /v1/messages` (or a batch result's `message`). A body that
/// is not a message is a transient error showing its start; a content block other than
/// text is a permanent one naming its type.
pub fn decode_message(body: &[u8], ttl: Option<PromptCacheTtl>) -> Result<Decoded, CallError> {
    let snippet = || redact::secrets(&String::from_utf8_lossy(&body[..body.len().min(200)]));
    let m: Message = serde_json::from_slice(body).map_err(|e| {
        CallError::transient(format!(
            "response is not an Anthropic message ({e}); body starts: {:?}",
            snippet()
        ))
    })?;
    decode_value(m, ttl)
}

/// [`decode_message`] of a message already parsed (a batch result line's `message`).
pub fn decode_message_value(v: Value, ttl: Option<PromptCacheTtl>) -> Result<Decoded, CallError> {
    let m: Message = serde_json::from_value(v).map_err(|e| {
        CallError::transient(format!("the result's message is not an Anthropic message ({e})"))
    })?;
    decode_value(m, ttl)
}

fn decode_value(m: Message, ttl: Option<PromptCacheTtl>) -> Result<Decoded, CallError> {
    let mut text = String::new();
    for (i, block) in m.content.iter().enumerate() {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => match block.get("text").and_then(Value::as_str) {
                Some(t) => text.push_str(t),
                None => {
                    return Err(CallError::transient(format!(
                        "content[{i}] is a text block without a text string"
                    )))
                }
            },
            Some(other) => {
                return Err(CallError::permanent(format!(
                    "content[{i}] is a {other:?} block; backend anthropic reads text blocks only \
                     (stop_reason {:?})",
                    m.stop_reason.as_deref().unwrap_or("none")
                )))
            }
            None => return Err(CallError::transient(format!("content[{i}] has no block type"))),
        }
    }
    let refusal = m.stop_reason.as_deref() == Some("refusal");
    // The names every other backend uses: `length` for a cut answer, `stop` for one
    // ended by a stop sequence.
    let finish_reason = m.stop_reason.map(|r| match r.as_str() {
        "max_tokens" => "length".into(),
        "stop_sequence" => "stop".into(),
        _ => r,
    });
    Ok(Decoded { text, usage: usage_of(m.usage.unwrap_or_default(), ttl), finish_reason, refusal })
}

/// The Messages request body of `job` for `model` (online calls and batch requests
/// alike), as JSON text: a structured-output job's schema goes in as its bytes, keys in
/// the order the pipeline wrote them.
pub fn request_json(job: &Job, model: &HttpModelSpec) -> Result<String, CallError> {
    let body = request_body(job, model)?;
    let mut text = serde_json::to_string(&body)
        .map_err(|e| CallError::permanent(format!("cannot encode the request: {e}")))?;
    if let Some(schema) = &job.key.sampling.json_schema {
        let raw = without_length_bounds(&schema.schema);
        if serde_json::from_str::<serde::de::IgnoredAny>(&raw).is_err() {
            return Err(CallError::permanent(format!(
                "structured output {:?}: the JSON schema is not JSON",
                schema.name
            )));
        }
        // `body` is an object: its closing brace is the last byte.
        text.pop();
        text.push_str(&format!(
            r#","output_config":{{"format":{{"type":"json_schema","schema":{raw}}}}}}}"#
        ));
    }
    Ok(text)
}

/// The request body as a JSON value, without a structured-output schema (see
/// [`request_json`]).
pub fn request_body(job: &Job, model: &HttpModelSpec) -> Result<Value, CallError> {
    let key = &job.key;
    let Some(max_tokens) = key.sampling.max_tokens else {
        return Err(CallError::permanent(format!(
            "model {:?}: the Messages API requires max_tokens; give the model `max_tokens` in \
             the sweep",
            model.model
        )));
    };
    if key.sampling.logprobs.is_some() {
        return Err(CallError::permanent(
            "backend anthropic cannot give token log-probabilities: the Messages API has none",
        ));
    }
    let system: Vec<&str> = key
        .messages
        .iter()
        .filter(|m| m.role == Role::System)
        .map(|m| m.content.as_str())
        .collect();
    let messages: Vec<Value> = key
        .messages
        .iter()
        .filter(|m| m.role != Role::System)
        .map(|m| json!({"role": m.role.as_str(), "content": m.content}))
        .collect();
    let mut body = json!({
        "model": model.model,
        "max_tokens": max_tokens,
        "messages": messages,
        "temperature": key.sampling.temperature,
    });
    if !system.is_empty() {
        let system = system.join("\n\n");
        body["system"] = match model.prompt_cache {
            None => system.into(),
            Some(ttl) => json!([{
                "type": "text",
                "text": system,
                "cache_control": {"type": "ephemeral", "ttl": ttl.as_str()},
            }]),
        };
    }
    if let Some(p) = key.sampling.top_p {
        body["top_p"] = p.into();
    }
    if let Some(k) = key.sampling.top_k {
        body["top_k"] = k.into();
    }
    if !key.sampling.stop.is_empty() {
        body["stop_sequences"] = key.sampling.stop.clone().into();
    }
    Ok(body)
}

/// The rate-limit headers of an answer (`anthropic-ratelimit-requests-remaining`,
/// `-tokens-remaining`, their `-reset` RFC 3339 times), read through `get`, as the quota
/// gate reads OpenAI's. `tokens` is the most restrictive token limit in effect; without
/// it the smaller of the input- and output-token headers stands for it.
pub fn rate_headers<'a>(get: impl Fn(&str) -> Option<&'a str>) -> RateHeaders {
    let num = |n: &str| get(n).and_then(|v| v.trim().parse::<u64>().ok());
    let reset = |n: &str| get(n).and_then(until_rfc3339);
    let pick = |kind: &str| {
        let remaining = num(&format!("anthropic-ratelimit-{kind}-remaining"));
        let reset = reset(&format!("anthropic-ratelimit-{kind}-reset"));
        (remaining, reset)
    };
    let (remaining_requests, reset_requests) = pick("requests");
    let (mut remaining_tokens, mut reset_tokens) = pick("tokens");
    if remaining_tokens.is_none() {
        let (i, ir) = pick("input-tokens");
        let (o, or) = pick("output-tokens");
        (remaining_tokens, reset_tokens) = match (i, o) {
            (Some(i), Some(o)) if o < i => (Some(o), or),
            (Some(i), _) => (Some(i), ir),
            (None, o) => (o, or),
        };
    }
    RateHeaders { remaining_requests, remaining_tokens, reset_requests, reset_tokens }
}

/// Time from now until an RFC 3339 instant (zero when past); None when unreadable.
fn until_rfc3339(v: &str) -> Option<Duration> {
    use time::format_description::well_known::Rfc3339;
    let when = time::OffsetDateTime::parse(v.trim(), &Rfc3339).ok()?;
    let left = when - time::OffsetDateTime::now_utc();
    Some(Duration::try_from(left).unwrap_or(Duration::ZERO))
}

impl Anthropic {
    pub fn new(max_body_bytes: u64) -> Result<Anthropic, CallError> {
        let http = super::http_client::HttpClient::new(max_body_bytes)?;
        Ok(Anthropic { client: http.client, max_body_bytes })
    }

    /// A request to `{base_url}{path}` with the key and version headers.
    pub fn request(
        &self,
        method: reqwest::Method,
        model: &HttpModelSpec,
        path: &str,
    ) -> Result<reqwest::RequestBuilder, CallError> {
        let url = format!("{}{path}", model.base_url.trim_end_matches('/'));
        let mut req = self
            .client
            .request(method, &url)
            .header("anthropic-version", ANTHROPIC_VERSION)
            .header(reqwest::header::CONTENT_TYPE, "application/json");
        if let Some(k) = api_key(model)? {
            req = req.header("x-api-key", k);
        }
        Ok(req)
    }

    /// The HTTP client (the batch provider shares it).
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    pub fn max_body_bytes(&self) -> u64 {
        self.max_body_bytes
    }

    /// One call, with the rate-limit headers of its answer (default when none came).
    pub async fn call_with_limits(
        &self,
        job: &Job,
        model: &HttpModelSpec,
    ) -> (Result<Completion, CallError>, RateHeaders) {
        let mut limits = RateHeaders::default();
        let res = self.call_inner(job, model, &mut limits).await;
        (res, limits)
    }

    async fn call_inner(
        &self,
        job: &Job,
        model: &HttpModelSpec,
        limits: &mut RateHeaders,
    ) -> Result<Completion, CallError> {
        let shown = redact::url(&format!("{}/messages", model.base_url.trim_end_matches('/')));
        let what = format!("POST {shown}");
        let body = request_json(job, model)?;
        let req = self
            .request(reqwest::Method::POST, model, "/messages")?
            .body(body)
            .timeout(Duration::from_millis(job.timeout_ms.max(1)));
        let started = Instant::now();
        let resp = req.send().await.map_err(|e| transport_error(&what, "", &e))?;
        let status = resp.status().as_u16();
        *limits = rate_headers(|n| resp.headers().get(n).and_then(|v| v.to_str().ok()));
        let retry_after = retry_after_of(&resp);
        let bytes = super::http_guard::read_body(resp, self.max_body_bytes, &what).await?;
        if status != 200 {
            return Err(status_error(&what, status, &bytes, retry_after));
        }
        let d = decode_message(&bytes, model.prompt_cache).map_err(|mut e| {
            e.status = Some(status);
            e.message = format!("{what}: {}", e.message);
            e
        })?;
        Ok(Completion {
            text: d.text,
            usage: d.usage,
            latency_ms: started.elapsed().as_millis() as u64,
            finish_reason: d.finish_reason,
            calls: 1,
            logprobs: None,
            refusal: d.refusal,
            source: Default::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use halyard_proto::{ChatMessage, JobKey, LogprobsRequest, ModelRef, OutputSchema, Sampling};

    use super::*;
    use crate::call_error::ErrorClass;

    fn model(prompt_cache: Option<PromptCacheTtl>) -> HttpModelSpec {
        HttpModelSpec {
            backend: "anthropic".into(),
            base_url: "http://x/v1".into(),
            model: "claude-sonnet-4-5".into(),
            api_key_env: None,
            prompt_cache,
        }
    }

    fn job(sampling: Sampling) -> Job {
        let key = JobKey {
            pipeline: "p".into(),
            stage: "s".into(),
            stage_version: 1,
            model: ModelRef {
                backend: "anthropic".into(),
                endpoint: "http://x/v1".into(),
                model: "claude-sonnet-4-5".into(),
            },
            messages: vec![
                ChatMessage::system("You are a linguistic expert."),
                ChatMessage::user("Is it real?"),
            ],
            sampling,
            sample_index: 0,
        };
        Job::new(uuid::Uuid::nil(), "p", key, 1000)
    }

    /// The system prompt is its own field (a cached text block with `prompt_cache`),
    /// sampling maps to the API's names, and max_tokens and log-probabilities are checked.
    #[test]
    fn request_body_maps_the_job() {
        let s = Sampling {
            temperature: 0.5,
            max_tokens: Some(64),
            seed: Some(7),
            top_p: Some(0.9),
            top_k: Some(40),
            stop: vec!["\n\nQ:".into()],
            ..Sampling::default()
        };
        let b = request_body(&job(s.clone()), &model(None)).unwrap();
        assert_eq!(
            b,
            json!({"model": "claude-sonnet-4-5", "max_tokens": 64, "temperature": 0.5,
                   "system": "You are a linguistic expert.", "top_p": 0.9f32, "top_k": 40,
                   "stop_sequences": ["\n\nQ:"],
                   "messages": [{"role": "user", "content": "Is it real?"}]})
        );
        let b = request_body(&job(s), &model(Some(PromptCacheTtl::OneHour))).unwrap();
        assert_eq!(
            b["system"],
            json!([{"type": "text", "text": "You are a linguistic expert.",
                    "cache_control": {"type": "ephemeral", "ttl": "1h"}}])
        );
        let e = request_body(&job(Sampling::default()), &model(None)).unwrap_err();
        assert!(e.is_permanent() && e.message.contains("requires max_tokens"), "{}", e.message);
        let lp = Sampling {
            max_tokens: Some(5),
            logprobs: Some(LogprobsRequest { top: 1, score_last: false }),
            ..Sampling::default()
        };
        assert!(request_body(&job(lp), &model(None)).unwrap_err().is_permanent());
    }

    /// A structured-output job's schema goes as `output_config.format`, its keys in the
    /// job's order and its length bounds off the wire.
    #[test]
    fn structured_output_is_output_config() {
        let schema = r#"{"type":"object","properties":{"term":{"type":"string"},"reasoning":{"type":"string","maxLength":300},"certainty":{"type":"string"}},"required":["term","reasoning","certainty"],"additionalProperties":false}"#;
        let s = Sampling {
            max_tokens: Some(64),
            json_schema: Some(Box::new(OutputSchema { name: "acc".into(), schema: schema.into() })),
            ..Sampling::default()
        };
        let text = request_json(&job(s), &model(None)).unwrap();
        let want = r#""output_config":{"format":{"type":"json_schema","schema":{"type":"object","properties":{"term":{"type":"string"},"reasoning":{"type":"string"},"certainty":{"type":"string"}},"required":["term","reasoning","certainty"],"additionalProperties":false}}}}"#;
        assert!(text.ends_with(want), "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["max_tokens"], 64);
        let bad = Sampling {
            max_tokens: Some(64),
            json_schema: Some(Box::new(OutputSchema { name: "x".into(), schema: "{no".into() })),
            ..Sampling::default()
        };
        assert!(request_json(&job(bad), &model(None)).unwrap_err().is_permanent());
    }

    /// Text blocks are the answer; a refusal and a max_tokens stop are flagged; usage
    /// counts cached prompt tokens into the prompt and keeps them apart by lifetime.
    #[test]
    fn messages_are_decoded() {
        let body = br#"{"id":"msg_1","type":"message","role":"assistant","model":"m",
            "content":[{"type":"text","text":"Hello"},{"type":"text","text":" there"}],
            "stop_reason":"end_turn","stop_sequence":null,
            "usage":{"input_tokens":10,"output_tokens":3,"cache_creation_input_tokens":100,
                     "cache_read_input_tokens":50,
                     "cache_creation":{"ephemeral_5m_input_tokens":60,"ephemeral_1h_input_tokens":40}}}"#;
        let d = decode_message(body, None).unwrap();
        assert_eq!(
            (d.text.as_str(), d.refusal, d.finish_reason.as_deref()),
            ("Hello there", false, Some("end_turn"))
        );
        assert_eq!(d.usage.prompt_tokens, 160);
        assert_eq!(d.usage.completion_tokens, 3);
        assert_eq!(d.usage.cache, Some(CacheUsage { write_5m: 60, write_1h: 40, read: 50 }));
        assert_eq!(d.usage.uncached_prompt_tokens(), 10);
        // No split given: the model's lifetime says which.
        let body = br#"{"content":[{"type":"text","text":"x"}],"stop_reason":"max_tokens",
            "usage":{"input_tokens":1,"output_tokens":9,"cache_creation_input_tokens":7}}"#;
        let d = decode_message(body, Some(PromptCacheTtl::OneHour)).unwrap();
        assert_eq!(d.finish_reason.as_deref(), Some("length"));
        assert_eq!(d.usage.cache, Some(CacheUsage { write_5m: 0, write_1h: 7, read: 0 }));
        let refusal = br#"{"content":[],"stop_reason":"refusal","usage":{"input_tokens":4,"output_tokens":0}}"#;
        let d = decode_message(refusal, None).unwrap();
        assert!(d.refusal);
        assert_eq!(d.usage.cache, None);
    }

    /// Bodies that are not messages are errors naming the problem; a block of another
    /// type is a permanent error naming the type.
    #[test]
    fn bad_messages_are_errors() {
        for bad in
            [&b"<html>"[..], b"{}", br#"{"content":7}"#, br#"{"content":[{"text":"x"}]}"#, b""]
        {
            let e = decode_message(bad, None).unwrap_err();
            assert_eq!(e.class, ErrorClass::Transient, "{}", String::from_utf8_lossy(bad));
        }
        let tool = br#"{"content":[{"type":"tool_use","id":"t","name":"f","input":{}}],"stop_reason":"tool_use"}"#;
        let e = decode_message(tool, None).unwrap_err();
        assert!(e.is_permanent() && e.message.contains("\"tool_use\""), "{}", e.message);
    }

    /// The `anthropic-ratelimit-*` headers: remaining counts and RFC 3339 resets; the
    /// token figure falls back to the tighter of input and output tokens.
    #[test]
    fn rate_limit_headers() {
        let at = time::OffsetDateTime::now_utc() + Duration::from_secs(30);
        let reset = format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            at.year(),
            at.month() as u8,
            at.day(),
            at.hour(),
            at.minute(),
            at.second()
        );
        let headers = [
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", reset.as_str()),
            ("anthropic-ratelimit-input-tokens-remaining", "9000"),
            ("anthropic-ratelimit-output-tokens-remaining", "120"),
            ("anthropic-ratelimit-output-tokens-reset", reset.as_str()),
        ];
        let get = |n: &str| headers.iter().find(|(k, _)| *k == n).map(|(_, v)| *v);
        let h = rate_headers(get);
        assert_eq!((h.remaining_requests, h.remaining_tokens), (Some(0), Some(120)));
        let r = h.reset_requests.unwrap();
        assert!(r > Duration::from_secs(25) && r <= Duration::from_secs(30), "{r:?}");
        assert!(h.reset_tokens.is_some());
        assert_eq!(rate_headers(|_| Some("soon")), RateHeaders::default());
    }

    /// A stop sequence's stop is the finish reason `stop`, as for the other backends.
    #[test]
    fn a_stop_sequence_is_a_stop() {
        let body = br#"{"content":[{"type":"text","text":"A"}],"stop_reason":"stop_sequence",
            "stop_sequence":"\n\n","usage":{"input_tokens":3,"output_tokens":1}}"#;
        let d = decode_message(body, None).unwrap();
        assert_eq!((d.text.as_str(), d.finish_reason.as_deref()), ("A", Some("stop")));
    }
}

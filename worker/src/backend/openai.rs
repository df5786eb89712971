//! Any OpenAI-compatible `POST {base_url}/chat/completions` endpoint.
//!
//! The URL, the model name and the API key variable come from the worker's own
//! configuration ([`HttpModelSpec`], matched to the job when it was received), never from
//! the message. The key is read from that variable at call time and goes only into the
//! `Authorization` header: never into logs, errors or results. Response bodies are read
//! up to the configured limit ([`super::http_guard`]); URLs in errors are shown without
//! credentials and error bodies with key-like text redacted.

use std::time::{Duration, Instant};

use halyard_proto::pool::HttpModelSpec;
use halyard_proto::redact;
use halyard_proto::{Completion, Job, TokenLogprob, TopLogprob, Usage};
use serde::Deserialize;

use super::http_client::HttpClient;
pub use super::http_error::{
    classify_status, classify_transport, parse_retry_after, retry_after_of, status_error,
    transport_error,
};
use crate::call_error::CallError;
use crate::quota::RateHeaders;

#[derive(Clone)]
pub struct OpenAi {
    client: reqwest::Client,
    /// Largest response body read (bytes).
    max_body_bytes: u64,
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
    #[serde(default)]
    logprobs: Option<ChoiceLogprobs>,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    content: Option<String>,
    /// The model's refusal, given instead of `content` by APIs with structured refusals.
    #[serde(default)]
    refusal: Option<String>,
}

#[derive(Deserialize)]
struct ChoiceLogprobs {
    #[serde(default)]
    content: Option<Vec<ApiTokenLogprob>>,
}

#[derive(Deserialize)]
struct ApiTokenLogprob {
    token: String,
    logprob: f64,
    #[serde(default)]
    top_logprobs: Vec<ApiTopLogprob>,
}

#[derive(Deserialize)]
struct ApiTopLogprob {
    token: String,
    logprob: f64,
}

/// A decoded chat completion.
pub struct Decoded {
    pub text: String,
    pub usage: Usage,
    pub finish_reason: Option<String>,
    /// `choices[0].logprobs.content`, when the API returned it.
    pub logprobs: Option<Vec<TokenLogprob>>,
    /// `message.refusal` was the answer (see [`Completion::refusal`]).
    pub refusal: bool,
}

#[derive(Deserialize)]
struct ApiUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

/// Decode a 200 body into a completion; a body that is not a chat completion is an error
/// that says what was wrong (and shows the start of the body).
pub fn decode_body(body: &[u8]) -> Result<(String, Usage, Option<String>), CallError> {
    decode_completion(body).map(|d| (d.text, d.usage, d.finish_reason))
}

/// [`decode_body`] with the token log-probabilities. A `null` `content` is never an empty
/// answer (issue 16): with `message.refusal` the refusal is the answer (it is what the
/// model said); without one it is a permanent error naming the finish reason (a tool call
/// or a filtered answer: asking again does not give text).
pub fn decode_completion(body: &[u8]) -> Result<Decoded, CallError> {
    let snippet = || redact::secrets(&String::from_utf8_lossy(&body[..body.len().min(200)]));
    let r: Response = serde_json::from_slice(body).map_err(|e| {
        CallError::transient(format!(
            "response is not a chat completion ({e}); body starts: {:?}",
            snippet()
        ))
    })?;
    let Some(choice) = r.choices.into_iter().next() else {
        return Err(CallError::transient(format!(
            "response has no choices; body starts: {:?}",
            snippet()
        )));
    };
    let usage = r.usage.map(|u| Usage {
        prompt_tokens: u.prompt_tokens,
        completion_tokens: u.completion_tokens,
        cache: None,
    });
    // A refusal is carried as one (issue 29): its words are kept as the text, and the flag
    // tells every pipeline that they are not an answer. An empty `content` ("") is a
    // successful call with an empty answer: the model said nothing. It is not retried
    // (asking again at temperature 0 gives the same), and every pipeline counts it as
    // `empty` through `Completion::kind`.
    let refusal = choice.message.refusal.filter(|r| !r.trim().is_empty());
    let (text, refusal) = match (choice.message.content, refusal) {
        (_, Some(r)) => (r, true),
        (Some(text), None) => (text, false),
        (None, None) => {
            return Err(CallError::permanent(format!(
                "the response's answer has no content and no refusal (finish_reason {:?}); body starts: {:?}",
                choice.finish_reason.as_deref().unwrap_or("none"),
                snippet()
            )))
        }
    };
    let logprobs = choice.logprobs.and_then(|l| l.content).map(|tokens| {
        tokens
            .into_iter()
            .map(|t| TokenLogprob {
                token: t.token,
                logprob: t.logprob,
                top: t
                    .top_logprobs
                    .into_iter()
                    .map(|a| TopLogprob { token: a.token, logprob: a.logprob })
                    .collect(),
            })
            .collect()
    });
    Ok(Decoded {
        text,
        usage: usage.unwrap_or_default(),
        finish_reason: choice.finish_reason,
        logprobs,
        refusal,
    })
}

impl OpenAi {
    /// The OpenAI dialect over the shared client `http`.
    pub fn on(http: &HttpClient) -> OpenAi {
        OpenAi { client: http.client.clone(), max_body_bytes: http.max_body_bytes }
    }

    /// Over a client of its own (tests, tools).
    pub fn new(max_body_bytes: u64) -> Result<OpenAi, CallError> {
        Ok(OpenAi::on(&HttpClient::new(max_body_bytes)?))
    }

    pub async fn call(&self, job: &Job, model: &HttpModelSpec) -> Result<Completion, CallError> {
        self.call_with_limits(job, model).await.0
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
        let url = format!("{}/chat/completions", model.base_url.trim_end_matches('/'));
        // For messages: the URL without credentials.
        let shown = redact::url(&url);
        let body = request_json(job, model)?;
        let mut req = self
            .client
            .post(&url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.get().to_owned())
            .timeout(Duration::from_millis(job.timeout_ms.max(1)));
        if let Some(k) = api_key(model)? {
            req = req.bearer_auth(k);
        }
        let started = Instant::now();
        let resp =
            req.send().await.map_err(|e| transport_error(&format!("POST {shown}"), "", &e))?;
        let status = resp.status().as_u16();
        *limits = RateHeaders::parse(|n| resp.headers().get(n).and_then(|v| v.to_str().ok()));
        let retry_after = retry_after_of(&resp);
        let bytes =
            super::http_guard::read_body(resp, self.max_body_bytes, &format!("POST {shown}"))
                .await?;
        if status != 200 {
            return Err(status_error(&format!("POST {shown}"), status, &bytes, retry_after));
        }
        let d = decode_completion(&bytes).map_err(|mut e| {
            // The endpoint answered (200); the answer is unusable, a fault of the job's.
            e.status = Some(status);
            e.message = format!("POST {shown}: {}", e.message);
            e
        })?;
        Ok(Completion {
            text: d.text,
            usage: d.usage,
            latency_ms: started.elapsed().as_millis() as u64,
            finish_reason: d.finish_reason,
            calls: 1,
            logprobs: d.logprobs,
            refusal: d.refusal,
            source: Default::default(),
        })
    }
}

/// The chat-completions request body of `job` for `model` (online calls and the lines
/// of a provider batch alike).
pub fn request_body(job: &Job, model: &HttpModelSpec) -> Result<serde_json::Value, CallError> {
    let key = &job.key;
    let messages: Vec<serde_json::Value> = key
        .messages
        .iter()
        .map(|m| serde_json::json!({"role": m.role.as_str(), "content": m.content}))
        .collect();
    let mut body = serde_json::json!({
        "model": model.model,
        "messages": messages,
        "temperature": key.sampling.temperature,
    });
    if let Some(mt) = key.sampling.max_tokens {
        body["max_tokens"] = mt.into();
    }
    if let Some(seed) = key.sampling.seed {
        body["seed"] = seed.into();
    }
    apply_optional_sampling(&mut body, &key.sampling)?;
    Ok(body)
}

/// The request body as sent (online calls and the lines of a provider batch alike):
/// [`request_body`], and for a structured-output job (issue 45) `response_format` with
/// the job's JSON schema, `{"type": "json_schema", "json_schema": {"name", "strict":
/// true, "schema"}}` (the wire format of OpenAI, vLLM, SGLang, llama-server and
/// llama-cpp-python). The schema goes out as the pipeline wrote it: its keys in that
/// order, which is the order a constrained model writes them in (a judge's reasoning
/// before its verdict).
pub fn request_json(
    job: &Job,
    model: &HttpModelSpec,
) -> Result<Box<serde_json::value::RawValue>, CallError> {
    use serde::Serialize;
    use serde_json::value::RawValue;
    #[derive(Serialize)]
    struct WithFormat<'a> {
        #[serde(flatten)]
        body: &'a serde_json::Value,
        response_format: ResponseFormat<'a>,
    }
    #[derive(Serialize)]
    struct ResponseFormat<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        json_schema: JsonSchema<'a>,
    }
    #[derive(Serialize)]
    struct JsonSchema<'a> {
        name: &'a str,
        strict: bool,
        schema: &'a RawValue,
    }
    let encode =
        |e: serde_json::Error| CallError::permanent(format!("cannot encode the request: {e}"));
    let body = request_body(job, model)?;
    let Some(schema) = &job.key.sampling.json_schema else {
        return serde_json::value::to_raw_value(&body).map_err(encode);
    };
    let raw = RawValue::from_string(without_length_bounds(&schema.schema)).map_err(|e| {
        CallError::permanent(format!(
            "structured output {:?}: the JSON schema is not JSON: {e}",
            schema.name
        ))
    })?;
    let with = WithFormat {
        body: &body,
        response_format: ResponseFormat {
            kind: "json_schema",
            json_schema: JsonSchema { name: &schema.name, strict: true, schema: &raw },
        },
    };
    serde_json::value::to_raw_value(&with).map_err(encode)
}

/// The schema as HTTP APIs get it: without `maxLength`. OpenAI's strict structured
/// outputs accept no string-length keyword (a schema with one is refused, 400), while
/// the other keywords a judge's schema uses (`type`, `enum`, `properties`, `required`,
/// `additionalProperties: false`) are the subset every server here accepts. The bound
/// stays in the job's schema (its identity) and in the `gguf` grammar, where a small
/// model needs it to close the object; a server's output is bounded by `max_tokens`.
/// Works on the text so the keys keep their order (a constrained model writes them in
/// that order): in JSON text `"maxLength":` outside a string is always a key, and the
/// number after it ends at the next `,` or `}`.
pub fn without_length_bounds(schema: &str) -> String {
    const KEY: &str = "\"maxLength\":";
    let mut out = String::with_capacity(schema.len());
    let mut rest = schema;
    while let Some(at) = rest.find(KEY) {
        let after = &rest[at + KEY.len()..];
        let end = after.find([',', '}']).unwrap_or(after.len());
        let number = after[..end].trim();
        let kept = &rest[..at];
        if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
            // Not a length bound (a property named so, a string): keep it as written.
            out.push_str(&rest[..at + KEY.len()]);
            rest = after;
            continue;
        }
        match (kept.trim_end().strip_suffix(','), after[end..].strip_prefix(',')) {
            // `…,"maxLength":N` → `…`; `{"maxLength":N,…` → `{…`.
            (Some(before), _) => {
                out.push_str(before);
                rest = &after[end..];
            }
            (None, Some(next)) => {
                out.push_str(kept);
                rest = next;
            }
            (None, None) => {
                out.push_str(kept);
                rest = &after[end..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The API key of `model`, read from its variable on this worker (None without one).
pub fn api_key(model: &HttpModelSpec) -> Result<Option<String>, CallError> {
    let Some(var) = &model.api_key_env else { return Ok(None) };
    match std::env::var(var) {
        Ok(k) if !k.is_empty() => Ok(Some(k)),
        _ => Err(CallError::permanent(format!(
            "environment variable {var} (api_key_env of model {:?}) is not set on worker",
            model.model
        ))),
    }
}

/// The optional sampling fields in the request body (issue 16): `top_p`; `stop`; `logprobs: true`
/// and `top_logprobs` when the job wants token log-probabilities. `top_k` is not sent (the
/// OpenAI chat API has no such parameter and rejects unknown ones); scoring a given text
/// (`score_last`) is impossible here: the chat API gives log-probabilities only of tokens
/// it generates, so such a job is a permanent error.
pub fn apply_optional_sampling(
    body: &mut serde_json::Value,
    sampling: &halyard_proto::Sampling,
) -> Result<(), CallError> {
    if let Some(p) = sampling.top_p {
        body["top_p"] = p.into();
    }
    if !sampling.stop.is_empty() {
        body["stop"] = sampling.stop.clone().into();
    }
    if let Some(l) = sampling.logprobs {
        if l.score_last {
            return Err(CallError::permanent(
                "backend openai cannot score a given completion: the chat completions API returns \
                 log-probabilities only of the tokens it generates",
            ));
        }
        body["logprobs"] = true.into();
        if l.top > 0 {
            body["top_logprobs"] = l.top.into();
        }
    }
    Ok(())
}

/// `backend = "openai"`: any OpenAI-compatible chat-completions API, at its `base_url`.
pub const KIND: super::BackendKind = super::BackendKind {
    name: "openai",
    http: true,
    load: |l| {
        Ok(Box::new(OpenAiBackend {
            http: OpenAi::on(l.http),
            models: super::HttpModels::of(l.plan, "openai"),
        }))
    },
};

/// The `openai` backend: the shared client and the plan's `openai` models.
struct OpenAiBackend {
    http: OpenAi,
    models: super::HttpModels,
}

impl super::Backend for OpenAiBackend {
    fn call<'a>(
        &'a self,
        job: &'a Job,
    ) -> futures::future::BoxFuture<'a, Result<Completion, CallError>> {
        Box::pin(async move {
            let m = self.models.model(job)?;
            self.http.call(job, m).await.map(|c| super::clamped(job, c))
        })
    }

    fn call_with_limits<'a>(
        &'a self,
        job: &'a Job,
    ) -> futures::future::BoxFuture<'a, (Result<Completion, CallError>, RateHeaders)> {
        Box::pin(async move {
            match self.models.model(job) {
                Ok(m) => {
                    let (r, headers) = self.http.call_with_limits(job, m).await;
                    (r.map(|c| super::clamped(job, c)), headers)
                }
                Err(e) => (Err(e), RateHeaders::default()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use halyard_proto::OutageReason;

    use super::*;
    use crate::call_error::ErrorClass;

    /// Status codes map to the retry classes DESIGN.md names: gateway and overload
    /// statuses are the endpoint's, other 5xx and 408/409 the job's to retry, other 4xx
    /// (a prompt too long among them) permanent (issue 18).
    #[test]
    fn status_classes() {
        assert_eq!(classify_status(429), ErrorClass::RateLimited);
        for s in [500, 501, 505, 408, 409, 425] {
            assert_eq!(classify_status(s), ErrorClass::Transient, "{s}");
        }
        for (s, r) in [
            (502, OutageReason::BadGateway),
            (503, OutageReason::Unavailable),
            (504, OutageReason::GatewayTimeout),
            (529, OutageReason::Overloaded),
        ] {
            assert_eq!(classify_status(s), ErrorClass::Unavailable(r), "{s}");
        }
        for s in [400, 401, 403, 404, 405, 410, 413, 422, 451] {
            assert_eq!(classify_status(s), ErrorClass::Permanent, "{s}");
        }
    }

    /// Transport failures against real sockets: a refused connection, an unresolvable
    /// host, a connection reset mid-request and a timeout are the endpoint's; each is
    /// named in the message (issue 18).
    #[tokio::test]
    async fn transport_failures_are_the_endpoints() {
        use std::io::{Read, Write};
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::new();
        let body = serde_json::json!({"model": "m", "messages": []});
        let post = |url: String, timeout_ms: u64| {
            client.post(url).json(&body).timeout(Duration::from_millis(timeout_ms)).send()
        };
        // Refused: a port bound and released, so nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let e = post(format!("http://127.0.0.1:{port}/v1"), 5000).await.unwrap_err();
        assert_eq!(classify_transport(&e).0, ErrorClass::Unavailable(OutageReason::Connection));
        let e = post("http://no-such-host.invalid/v1".into(), 5000).await.unwrap_err();
        assert_eq!(classify_transport(&e).0, ErrorClass::Unavailable(OutageReason::Dns), "{e:?}");
        // A server that reads the request, then closes without an answer, sends half an
        // answer and closes, or hangs.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            for (i, conn) in listener.incoming().take(3).enumerate() {
                let mut conn = conn.unwrap();
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf);
                match i {
                    0 => drop(conn),
                    1 => {
                        let _ = conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{");
                        drop(conn);
                    }
                    _ => std::thread::sleep(Duration::from_millis(800)),
                }
            }
        });
        for _ in 0..2 {
            let e = match post(format!("http://{addr}/v1"), 5000).await {
                Ok(r) => r.bytes().await.unwrap_err(),
                Err(e) => e,
            };
            let class = classify_transport(&e).0;
            assert_eq!(class, ErrorClass::Unavailable(OutageReason::Connection), "{e:?}");
        }
        let e = post(format!("http://{addr}/v1"), 200).await.unwrap_err();
        assert_eq!(classify_transport(&e).0, ErrorClass::Unavailable(OutageReason::Timeout));
        let msg = transport_error("http://x/v1", "", &e).message;
        assert!(msg.contains("timed out"), "{msg}");
        server.join().unwrap();
    }

    /// Retry-After accepts seconds and HTTP dates, and rejects nonsense.
    #[test]
    fn retry_after_forms() {
        assert_eq!(parse_retry_after("3"), Some(Duration::from_secs(3)));
        assert_eq!(parse_retry_after(" 0.5 "), Some(Duration::from_millis(500)));
        assert_eq!(parse_retry_after("-1"), None);
        assert_eq!(parse_retry_after("soon"), None);
        let future =
            httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(120));
        let d = parse_retry_after(&future).unwrap();
        assert!(d > Duration::from_secs(100) && d <= Duration::from_secs(120), "{d:?}");
    }

    /// Bodies that are not chat completions give errors naming the problem, never panics.
    #[test]
    fn bad_bodies_are_errors() {
        let ok = br#"{"choices":[{"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":1}}"#;
        let (t, u, f) = decode_body(ok).unwrap();
        assert_eq!(
            (t.as_str(), u.prompt_tokens, u.completion_tokens, f.as_deref()),
            ("hi", 4, 1, Some("stop"))
        );
        for bad in [
            &b"<html>502</html>"[..],
            b"{}",
            br#"{"choices":[]}"#,
            br#"{"choices":[{"message":7}]}"#,
            b"",
            b"\xff\xfe",
        ] {
            let e = decode_body(bad).unwrap_err();
            assert_eq!(e.class, ErrorClass::Transient);
            assert!(!e.message.is_empty());
        }
    }

    /// Issue 16: a null content is never an empty answer: the refusal is the answer when
    /// given, otherwise a permanent error naming the finish reason.
    #[test]
    fn null_content_is_the_refusal_or_an_error() {
        let refusal =
            br#"{"choices":[{"message":{"content":null,"refusal":"I can't help with that."}}]}"#;
        let d = decode_completion(refusal).unwrap();
        assert_eq!((d.text.as_str(), d.refusal), ("I can't help with that.", true));
        // Issue 29: a refusal beside content is still a refusal; an empty refusal is none.
        let both = br#"{"choices":[{"message":{"content":"Sure","refusal":"No."}}]}"#;
        assert_eq!(
            decode_completion(both).map(|d| (d.text, d.refusal)).unwrap(),
            ("No.".into(), true)
        );
        let blank = br#"{"choices":[{"message":{"content":"Sure","refusal":" "}}]}"#;
        assert_eq!(
            decode_completion(blank).map(|d| (d.text, d.refusal)).unwrap(),
            ("Sure".into(), false)
        );
        let e = decode_body(
            br#"{"choices":[{"message":{"content":null,"tool_calls":[]},"finish_reason":"tool_calls"}]}"#,
        )
        .unwrap_err();
        assert_eq!(e.class, ErrorClass::Permanent);
        assert!(
            e.message.contains("no content") && e.message.contains("tool_calls"),
            "{}",
            e.message
        );
        // Issue 29: an empty content is an empty answer, not a refusal: the pipelines count
        // it as `empty` (`Completion::kind`).
        let empty = decode_completion(br#"{"choices":[{"message":{"content":""}}]}"#).unwrap();
        assert_eq!((empty.text.as_str(), empty.refusal), ("", false));
    }

    /// Issue 16: token log-probabilities (with their alternatives) are read from
    /// `choices[0].logprobs.content`; an answer without them has none.
    #[test]
    fn logprobs_are_decoded() {
        let body = br#"{"choices":[{"message":{"content":"Hi!"},"logprobs":{"content":[
            {"token":"Hi","logprob":-0.25,"bytes":[72,105],"top_logprobs":[{"token":"Hi","logprob":-0.25},{"token":"Hello","logprob":-1.5}]},
            {"token":"!","logprob":-0.01,"top_logprobs":[]}]}}]}"#;
        let d = decode_completion(body).unwrap();
        let lp = d.logprobs.unwrap();
        assert_eq!(lp.len(), 2);
        assert_eq!((lp[0].token.as_str(), lp[0].logprob, lp[0].top.len()), ("Hi", -0.25, 2));
        assert_eq!((lp[0].top[1].token.as_str(), lp[0].top[1].logprob), ("Hello", -1.5));
        assert!(lp[1].top.is_empty());
        assert!(decode_completion(br#"{"choices":[{"message":{"content":"x"}}]}"#)
            .unwrap()
            .logprobs
            .is_none());
    }

    /// Issue 16: top_p, stop sequences and the log-probability request go into the body
    /// only when set;
    /// top_k never does; scoring a given text is refused.
    #[test]
    fn optional_sampling_in_the_body() {
        use halyard_proto::{LogprobsRequest, Sampling};
        let mut body = serde_json::json!({});
        apply_optional_sampling(&mut body, &Sampling::default()).unwrap();
        assert_eq!(body, serde_json::json!({}));
        let s = Sampling {
            top_p: Some(0.5),
            top_k: Some(5),
            logprobs: Some(LogprobsRequest { top: 5, score_last: false }),
            stop: vec!["\n".into(), "END".into()],
            ..Sampling::default()
        };
        apply_optional_sampling(&mut body, &s).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"top_p": 0.5, "logprobs": true, "top_logprobs": 5,
                               "stop": ["\n", "END"]})
        );
        let score = Sampling {
            logprobs: Some(LogprobsRequest { top: 5, score_last: true }),
            ..Sampling::default()
        };
        let e = apply_optional_sampling(&mut serde_json::json!({}), &score).unwrap_err();
        assert!(e.is_permanent() && e.message.contains("cannot score"));
    }

    /// Issue 45: a structured-output job's body carries `response_format` in OpenAI's
    /// `json_schema` form (as OpenAI's Structured Outputs guide writes it), the schema's
    /// keys in the order the job wrote them (`term`, `reasoning`, `certainty`; sorted
    /// they would put the verdict first); a job without a schema has no
    /// `response_format`, and a schema that is not JSON is a permanent error.
    #[test]
    fn length_bounds_stay_off_the_wire() {
        let cases = [
            (r#"{"type":"string","maxLength":300}"#, r#"{"type":"string"}"#),
            (r#"{"maxLength":3,"type":"string"}"#, r#"{"type":"string"}"#),
            (r#"{"maxLength":3}"#, r#"{}"#),
            (r#"{"a":{"maxLength":2},"b":{"x":1,"maxLength": 40 }}"#, r#"{"a":{},"b":{"x":1}}"#),
            // A property named maxLength (an object, not a number) is kept.
            (
                r#"{"properties":{"maxLength":{"type":"string"}}}"#,
                r#"{"properties":{"maxLength":{"type":"string"}}}"#,
            ),
            (r#"{"enum":["\"maxLength\":5"]}"#, r#"{"enum":["\"maxLength\":5"]}"#),
        ];
        for (given, want) in cases {
            let got = without_length_bounds(given);
            assert_eq!(got, want, "{given}");
            serde_json::from_str::<serde_json::Value>(&got).unwrap();
        }
    }

    #[test]
    fn response_format_carries_the_schema_in_order() {
        use halyard_proto::{ChatMessage, JobKey, ModelRef, OutputSchema, Sampling};
        let model = HttpModelSpec {
            backend: "openai".into(),
            base_url: "http://x/v1".into(),
            model: "m".into(),
            api_key_env: None,
            prompt_cache: None,
        };
        let schema = r#"{"type":"object","properties":{"term":{"type":"string"},"reasoning":{"type":"string"},"certainty":{"type":"string","enum":["UNREAL","MENTIONED","UNKNOWN"]}},"required":["term","reasoning","certainty"],"additionalProperties":false}"#;
        let job = |json_schema: Option<OutputSchema>| {
            let key = JobKey {
                pipeline: "p".into(),
                stage: "s".into(),
                stage_version: 1,
                model: ModelRef {
                    backend: "openai".into(),
                    endpoint: "http://x/v1".into(),
                    model: "m".into(),
                },
                messages: vec![ChatMessage::user("q")],
                sampling: Sampling {
                    json_schema: json_schema.map(Box::new),
                    ..Sampling::default()
                },
                sample_index: 0,
            };
            Job::new(uuid::Uuid::nil(), "p", key, 1000)
        };
        let plain = request_json(&job(None), &model).unwrap();
        assert!(!plain.get().contains("response_format"));
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(plain.get()).unwrap(),
            request_body(&job(None), &model).unwrap()
        );
        let s = OutputSchema { name: "hypotermqa_acceptance".into(), schema: schema.into() };
        let text = request_json(&job(Some(s)), &model).unwrap().get().to_owned();
        let want = format!(
            r#""response_format":{{"type":"json_schema","json_schema":{{"name":"hypotermqa_acceptance","strict":true,"schema":{schema}}}}}"#
        );
        assert!(text.contains(&want), "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            (v["model"].as_str(), v["messages"][0]["content"].as_str()),
            (Some("m"), Some("q"))
        );
        // The length bound stays in the job (its identity) but not on the wire.
        let bounded = schema.replace(
            r#""reasoning":{"type":"string"}"#,
            r#""reasoning":{"type":"string","maxLength":300}"#,
        );
        let s = OutputSchema { name: "hypotermqa_acceptance".into(), schema: bounded };
        let text = request_json(&job(Some(s)), &model).unwrap().get().to_owned();
        assert!(text.contains(&want), "{text}");
        let bad = OutputSchema { name: "x".into(), schema: "{nope".into() };
        let e = request_json(&job(Some(bad)), &model).unwrap_err();
        assert!(e.is_permanent() && e.message.contains("not JSON"), "{}", e.message);
    }
}

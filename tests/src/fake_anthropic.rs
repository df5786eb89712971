//! A fake of Anthropic's Messages API over real HTTP (issue 52), written from the public
//! API reference: "Messages" (`POST /v1/messages`), "Errors", "Rate limits" and "Prompt
//! caching".
//!
//! [`FakeAnthropic`] binds `127.0.0.1:0` and serves `POST /v1/messages` (and
//! `/messages`), and `GET /v1/models` (the "Models" page: `data` of `{"type": "model",
//! "id", "display_name", "created_at"}`, `has_more`, `first_id`, `last_id`) listing
//! [`MODELS`] (the fake answers under any name, as a proxy may; the list is what a
//! client can check a name against). It checks what the API checks: the `x-api-key` header (401
//! `authentication_error` without one), `anthropic-version` (400), and the body: `model`,
//! `max_tokens` (an integer ≥ 1: required), `messages` (user and assistant turns, text
//! content only), `system` (a string or text blocks), `temperature` in 0..=1; anything
//! else wrong is a 400 `invalid_request_error` naming it. Errors have the API's shape,
//! `{"type": "error", "error": {"type", "message"}}`.
//!
//! Each request is turned into the [`ChatCall`] the OpenAI fake gives its responder (the
//! system prompt first as a `system` message), so one responder (the HypoTermQA rules of
//! the cli tests, say) serves both fakes, and answered as its [`Reply`] says: a message,
//! an HTTP error with `retry-after` ([`overloaded`] gives the 529 `overloaded_error`), a
//! delay, a gate, silence, garbage, a refusal (`stop_reason` `refusal`) or a connection
//! reset mid-body. Tokens are words (whitespace-separated); an answer longer than
//! `max_tokens` words is cut there with `stop_reason` `max_tokens`.
//!
//! **Prompt caching.** A `system` text block with `cache_control` marks the prompt up to
//! it as a cache prefix: the first request with that prefix (per model) writes it
//! (`cache_creation_input_tokens`, split by `ttl` into `usage.cache_creation`), later ones
//! within the entry's lifetime read it (`cache_read_input_tokens`), and `input_tokens` is
//! what is left. A read refreshes the entry's lifetime, as the API's does.
//!
//! **Rate limits** ([`Limits`]): requests, input tokens and output tokens per minute,
//! each a token bucket that refills continuously up to its limit, the way Anthropic's
//! "Rate limits" page describes them. Input tokens count the uncached input and the cache
//! writes (cache reads do not count); output tokens are estimated from `max_tokens` at
//! admission and settled to the tokens produced when the answer is sent. A request that
//! does not fit gets 429 `rate_limit_error` with `retry-after` (whole seconds until it
//! would fit). Every answer carries `anthropic-ratelimit-{requests,input-tokens,
//! output-tokens}-{limit,remaining,reset}` (reset: RFC 3339, when the bucket is full
//! again). [`FakeAnthropic::ledger`] keeps each admission and each 429.
//!
//! The server runs on its own thread and runtime; dropping it closes every connection.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

use crate::fake_openai::{ChatCall, Reply};

pub mod batches;
pub use batches::{BatchInfo, BatchScript, Fate};

/// Requests, input tokens and output tokens per minute (None: no such limit).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Limits {
    pub rpm: Option<u64>,
    pub itpm: Option<u64>,
    pub otpm: Option<u64>,
}

/// The usage one answered message reported, as the API words it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MessageUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_write_5m: u64,
    pub cache_write_1h: u64,
    pub cache_read: u64,
}

/// One request answered with a message (200): what the API would bill.
#[derive(Clone, Debug)]
pub struct Paid {
    pub call: ChatCall,
    pub usage: MessageUsage,
    pub stop_reason: String,
    /// `<batch id>#<index>` for a batch request's `succeeded` result; None online.
    pub batch: Option<String>,
}

/// What the rate limiter saw.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    /// Each admitted request: when, and the output tokens it produced (settled).
    pub admitted: Vec<(Instant, u64)>,
    /// Requests refused with 429 by the limiter (not those a responder scripted).
    pub rejected: u64,
}

/// The 529 `overloaded_error` the API answers when it is overloaded.
pub fn overloaded() -> Reply {
    Reply::Status {
        code: 529,
        body: error_json("overloaded_error", "Overloaded (fake)").to_string(),
        retry_after: None,
    }
}

/// A 429 `rate_limit_error` with `retry-after: seconds`.
pub fn rate_limited(seconds: u64) -> Reply {
    Reply::Status {
        code: 429,
        body: error_json(
            "rate_limit_error",
            "Number of request tokens has exceeded your per-minute rate limit (fake)",
        )
        .to_string(),
        retry_after: Some(seconds.to_string()),
    }
}

/// The API's error body.
pub fn error_json(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

type Responder = Box<dyn Fn(&ChatCall) -> Reply + Send + Sync>;

/// A token bucket: `limit` per minute, refilled continuously, holding `limit` at most.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    limit: f64,
    level: f64,
    at: Instant,
}

impl Bucket {
    fn new(limit: u64) -> Bucket {
        Bucket { limit: limit as f64, level: limit as f64, at: Instant::now() }
    }
    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.level = (self.level + dt * self.limit / 60.0).min(self.limit);
        self.at = now;
    }
    /// Seconds until `n` fit.
    fn wait_for(&self, n: f64) -> f64 {
        ((n - self.level).max(0.0)) * 60.0 / self.limit
    }
    /// When the bucket is full again.
    fn full_at(&self) -> SystemTime {
        SystemTime::now() + Duration::from_secs_f64(self.wait_for(self.limit))
    }
}

#[derive(Default)]
struct Buckets {
    requests: Option<Bucket>,
    input: Option<Bucket>,
    output: Option<Bucket>,
}

struct Shared {
    responder: Responder,
    calls: Mutex<Vec<ChatCall>>,
    paid: Mutex<Vec<Paid>>,
    next_seq: AtomicU64,
    buckets: Mutex<Buckets>,
    ledger: Mutex<Ledger>,
    /// Cache entries: (model, prefix) → expiry.
    cache: Mutex<HashMap<(String, String), Instant>>,
    script: BatchScript,
    batches: Mutex<batches::Batches>,
    /// Requests to the batch API so far (for [`BatchScript::fault_every`]).
    batch_seq: AtomicU64,
    /// Results files served.
    results_served: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The fake server; see the module docs.
pub struct FakeAnthropic {
    shared: Arc<Shared>,
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeAnthropic {
    /// Start serving (from any thread); returns once it listens.
    pub fn start<F>(limits: Limits, responder: F) -> FakeAnthropic
    where
        F: Fn(&ChatCall) -> Reply + Send + Sync + 'static,
    {
        FakeAnthropic::start_with_batches(limits, BatchScript::default(), responder)
    }

    /// [`FakeAnthropic::start`] with its Message Batches behaving as `script` says.
    pub fn start_with_batches<F>(limits: Limits, script: BatchScript, responder: F) -> FakeAnthropic
    where
        F: Fn(&ChatCall) -> Reply + Send + Sync + 'static,
    {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap_or_else(|e| panic!("fake Anthropic: bind: {e}"));
        listener.set_nonblocking(true).expect("fake Anthropic: set_nonblocking");
        let addr = listener.local_addr().expect("fake Anthropic: local_addr");
        let shared = Arc::new(Shared {
            responder: Box::new(responder),
            calls: Mutex::new(Vec::new()),
            paid: Mutex::new(Vec::new()),
            next_seq: AtomicU64::new(0),
            buckets: Mutex::new(Buckets {
                requests: limits.rpm.map(Bucket::new),
                input: limits.itpm.map(Bucket::new),
                output: limits.otpm.map(Bucket::new),
            }),
            ledger: Mutex::new(Ledger::default()),
            cache: Mutex::new(HashMap::new()),
            script,
            batches: Mutex::new(Default::default()),
            batch_seq: AtomicU64::new(0),
            results_served: AtomicU64::new(0),
        });
        let app = Router::new()
            .route("/v1/messages", post(messages))
            .route("/messages", post(messages))
            .route("/v1/models", get(models))
            .route("/v1/messages/batches", post(batches::create).get(batches::list))
            .route("/v1/messages/batches/{id}", get(batches::retrieve))
            .route("/v1/messages/batches/{id}/cancel", post(batches::cancel))
            .route("/v1/messages/batches/{id}/results", get(batches::results))
            .layer(axum::extract::DefaultBodyLimit::max(64 << 20))
            .with_state(Arc::clone(&shared));
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("fake-anthropic-{}", addr.port()))
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                rt.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e.to_string()));
                            return;
                        }
                    };
                    tokio::spawn(async move {
                        let _ = axum::serve(listener, app).await;
                    });
                    let _ = ready_tx.send(Ok(()));
                    let _ = stop_rx.await;
                });
                // Dropping the runtime ends every connection, answered or not.
                rt.shutdown_timeout(Duration::from_millis(200));
            })
            .expect("fake Anthropic: spawn");
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("fake Anthropic: {e}"),
            Err(_) => panic!("fake Anthropic: the server thread died while starting"),
        }
        FakeAnthropic { shared, addr, stop: Some(stop), thread: Some(thread) }
    }

    /// `http://127.0.0.1:PORT/v1`, the `base_url` of a `backend = "anthropic"` model.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Every request received, in arrival order (answered or not).
    pub fn calls(&self) -> Vec<ChatCall> {
        lock(&self.shared.calls).clone()
    }

    /// The requests answered with a message (200), with the usage each reported.
    pub fn paid(&self) -> Vec<Paid> {
        lock(&self.shared.paid).clone()
    }

    /// Every Message Batch created, oldest first, with its results once ended.
    pub fn batches(&self) -> Vec<BatchInfo> {
        lock(&self.shared.batches).infos()
    }

    /// How many times a results file was served.
    pub fn results_served(&self) -> u64 {
        self.shared.results_served.load(Ordering::SeqCst)
    }

    /// What the rate limiter admitted and refused.
    pub fn ledger(&self) -> Ledger {
        lock(&self.shared.ledger).clone()
    }
}

impl Drop for FakeAnthropic {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A 200 whose JSON body (`body`, already cut short) ends in a connection reset.
fn cut_body(body: Vec<u8>) -> Response {
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        vec![Ok(body), Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "fake reset"))];
    let stream = axum::body::Body::from_stream(futures::stream::iter(chunks));
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], stream).into_response()
}

/// The models `GET /v1/models` lists.
pub const MODELS: [&str; 3] = ["claude-sonnet-4-5", "claude-haiku-4-5", "claude-opus-4-1"];

async fn models(headers: HeaderMap) -> Response {
    if let Err(r) = key_and_version(&headers) {
        return r;
    }
    let data: Vec<Value> = MODELS
        .iter()
        .map(|id| {
            json!({"type": "model", "id": id, "display_name": id,
                   "created_at": "2025-09-29T00:00:00Z"})
        })
        .collect();
    let body = json!({"data": data, "has_more": false, "first_id": MODELS[0],
                      "last_id": MODELS[MODELS.len() - 1]});
    (StatusCode::OK, axum::Json(body)).into_response()
}

/// A request body as JSON, or the API's 400 for one that is not.
#[allow(clippy::result_large_err)] // the refusal is the handler's answer
fn json_body(body: &[u8]) -> Result<Value, Response> {
    serde_json::from_slice(body).map_err(|e| {
        error(StatusCode::BAD_REQUEST, "invalid_request_error", format!("body: invalid JSON: {e}"))
    })
}

fn error(status: StatusCode, kind: &str, message: impl Into<String>) -> Response {
    (status, axum::Json(error_json(kind, &message.into()))).into_response()
}

fn words(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

/// The text of a `content` or `system` value: a string, or text blocks joined by `\n`;
/// another block type is an error naming it.
fn text_of(v: &Value, at: &str) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut parts = Vec::new();
            for (i, b) in blocks.iter().enumerate() {
                match (b["type"].as_str(), b["text"].as_str()) {
                    (Some("text"), Some(t)) => parts.push(t.to_string()),
                    (Some("text"), None) => return Err(format!("{at}.{i}.text: Field required")),
                    (t, _) => {
                        return Err(format!(
                            "{at}.{i}.type: this fake takes text blocks, not {t:?}"
                        ))
                    }
                }
            }
            Ok(parts.join("\n"))
        }
        _ => Err(format!("{at}: Input should be a valid string or list of content blocks")),
    }
}

/// A checked request.
struct Request {
    call: ChatCall,
    max_tokens: u64,
    /// The cached prefix (the system prompt up to its `cache_control` block) and its TTL.
    cache: Option<(String, Duration, bool)>,
}

/// Check a body as the API does; the error is the 400's message.
fn check(body: &Value, key: Option<String>) -> Result<Request, String> {
    let Some(obj) = body.as_object() else { return Err("body: must be a JSON object".into()) };
    let model = obj.get("model").and_then(Value::as_str).ok_or("model: Field required")?;
    let max_tokens = match obj.get("max_tokens") {
        None => return Err("max_tokens: Field required".into()),
        Some(v) => v.as_u64().filter(|n| *n >= 1).ok_or("max_tokens: must be an integer ≥ 1")?,
    };
    if let Some(t) = obj.get("temperature") {
        let t = t.as_f64().ok_or("temperature: Input should be a valid number")?;
        if !(0.0..=1.0).contains(&t) {
            return Err(format!("temperature: {t} is not in 0..=1"));
        }
    }
    let msgs = obj.get("messages").and_then(Value::as_array).ok_or("messages: Field required")?;
    if msgs.is_empty() {
        return Err("messages: at least one message is required".into());
    }
    let mut messages = Vec::new();
    let mut cache = None;
    if let Some(system) = obj.get("system") {
        let text = text_of(system, "system")?;
        if let Some(blocks) = system.as_array() {
            if let Some(cc) = blocks.iter().rev().find_map(|b| b.get("cache_control")) {
                if cc["type"] != "ephemeral" {
                    return Err("system.cache_control.type: must be \"ephemeral\"".into());
                }
                let (ttl, long) = match cc.get("ttl").and_then(Value::as_str) {
                    None | Some("5m") => (Duration::from_secs(300), false),
                    Some("1h") => (Duration::from_secs(3600), true),
                    Some(other) => {
                        return Err(format!(
                            "system.cache_control.ttl: {other:?} is not \"5m\" or \"1h\""
                        ))
                    }
                };
                cache = Some((text.clone(), ttl, long));
            }
        }
        messages.push(("system".to_string(), text));
    }
    for (i, m) in msgs.iter().enumerate() {
        let role = m["role"].as_str().unwrap_or_default();
        if !matches!(role, "user" | "assistant") {
            return Err(format!("messages.{i}.role: {role:?} is not \"user\" or \"assistant\""));
        }
        messages
            .push((role.to_string(), text_of(&m["content"], &format!("messages.{i}.content"))?));
    }
    let call = ChatCall {
        model: model.to_string(),
        messages,
        temperature: obj.get("temperature").and_then(Value::as_f64),
        max_tokens: Some(max_tokens),
        authorization: key,
        seq: 0,
        body: body.clone(),
        json_schema: obj
            .get("output_config")
            .and_then(|o| o.get("format"))
            .map(|f| ("output_config".to_string(), f["schema"].to_string())),
    };
    Ok(Request { call, max_tokens, cache })
}

/// The prompt cache for one request with `cache` (its prefix, lifetime and whether it
/// is the 1-hour one): read when the prefix is held and alive, else written. Returns
/// `(written, read, 1 hour)` tokens.
fn cache_step(
    shared: &Shared,
    call: &ChatCall,
    cache: &Option<(String, Duration, bool)>,
) -> (u64, u64, bool) {
    let Some((prefix, ttl, is_long)) = cache else { return (0, 0, false) };
    let now = Instant::now();
    let n = words(prefix);
    let mut entries = lock(&shared.cache);
    let k = (call.model.clone(), prefix.clone());
    let (write, read) = match entries.get(&k) {
        Some(until) if *until > now => (0, n),
        _ => (n, 0),
    };
    entries.insert(k, now + *ttl);
    (write, read, *is_long)
}

/// Ratelimit headers for the buckets as they stand.
fn limit_headers(b: &Buckets, h: &mut HeaderMap) {
    for (name, bucket) in
        [("requests", &b.requests), ("input-tokens", &b.input), ("output-tokens", &b.output)]
    {
        let Some(bucket) = bucket else { continue };
        let reset = time::OffsetDateTime::from(bucket.full_at());
        let reset = format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            reset.year(),
            reset.month() as u8,
            reset.day(),
            reset.hour(),
            reset.minute(),
            reset.second()
        );
        for (k, v) in [
            ("limit", format!("{}", bucket.limit as u64)),
            ("remaining", format!("{}", bucket.level.max(0.0) as u64)),
            ("reset", reset),
        ] {
            if let (Ok(n), Ok(v)) = (
                header::HeaderName::from_bytes(
                    format!("anthropic-ratelimit-{name}-{k}").as_bytes(),
                ),
                HeaderValue::from_str(&v),
            ) {
                h.insert(n, v);
            }
        }
    }
}

/// The request's key, checked as every endpoint checks it, with `anthropic-version`.
#[allow(clippy::result_large_err)] // the refusal is the handler's answer
fn key_and_version(headers: &HeaderMap) -> Result<String, Response> {
    let key = headers.get("x-api-key").map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let Some(key) = key.filter(|k| !k.is_empty()) else {
        return Err(error(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "x-api-key header is required",
        ));
    };
    if headers.get("anthropic-version").is_none() {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "anthropic-version: header is required",
        ));
    }
    Ok(key)
}

async fn messages(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let key = match key_and_version(&headers) {
        Ok(k) => Some(k),
        Err(r) => return r,
    };
    let value = match json_body(&body) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let req = match check(&value, key) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_request_error", e),
    };
    let mut call = req.call;
    call.seq = shared.next_seq.fetch_add(1, Ordering::SeqCst);
    lock(&shared.calls).push(call.clone());
    let now = Instant::now();
    let (write, read, long) = cache_step(&shared, &call, &req.cache);
    let prompt: u64 = call.messages.iter().map(|(_, c)| words(c)).sum();
    let input = prompt - write - read;
    // Admission: every bucket must hold the request (output: its max_tokens).
    let mut limits = HeaderMap::new();
    {
        let mut guard = lock(&shared.buckets);
        let b = &mut *guard;
        let need = [
            (1.0, "requests"),
            ((input + write) as f64, "input tokens"),
            (req.max_tokens as f64, "output tokens"),
        ];
        let mut wait: Option<(f64, &str)> = None;
        for ((n, what), bucket) in need.iter().zip([&mut b.requests, &mut b.input, &mut b.output]) {
            if let Some(bucket) = bucket {
                bucket.refill(now);
                let w = bucket.wait_for(*n);
                if w > 0.0 && wait.is_none_or(|(x, _)| w > x) {
                    wait = Some((w, what));
                }
            }
        }
        if let Some((w, what)) = wait {
            limit_headers(b, &mut limits);
            drop(guard);
            lock(&shared.ledger).rejected += 1;
            let mut r = error(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                format!("This request would exceed your organization's rate limit of {what} per minute (fake)"),
            );
            r.headers_mut().extend(limits);
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(w.ceil().max(1.0) as u64));
            return r;
        }
        for ((n, _), bucket) in need.iter().zip([&mut b.requests, &mut b.input, &mut b.output]) {
            if let Some(bucket) = bucket {
                bucket.level -= n;
            }
        }
    }
    let reply = match catch_unwind(AssertUnwindSafe(|| (shared.responder)(&call))) {
        Ok(r) => r,
        Err(_) => Reply::Status {
            code: 500,
            body: error_json("api_error", "fake responder panicked").to_string(),
            retry_after: None,
        },
    };
    let usage = |output| MessageUsage {
        input_tokens: input,
        output_tokens: output,
        cache_write_5m: if long { 0 } else { write },
        cache_write_1h: if long { write } else { 0 },
        cache_read: read,
    };
    let (response, produced) = respond(reply, &call, req.max_tokens, usage, &shared).await;
    // Settle the output estimate to what was produced.
    let mut b = lock(&shared.buckets);
    if let Some(out) = &mut b.output {
        out.refill(Instant::now());
        out.level = (out.level + req.max_tokens as f64 - produced as f64).min(out.limit);
    }
    let mut response = response;
    limit_headers(&b, response.headers_mut());
    drop(b);
    lock(&shared.ledger).admitted.push((now, produced));
    response
}

/// The answer to `reply`, and the output tokens it produced (0 unless a message).
async fn respond(
    mut reply: Reply,
    call: &ChatCall,
    max_tokens: u64,
    usage: impl Fn(u64) -> MessageUsage,
    shared: &Shared,
) -> (Response, u64) {
    loop {
        reply = match reply {
            Reply::Delayed(d, inner) => {
                tokio::time::sleep(d).await;
                *inner
            }
            Reply::Gated(gate, inner) => {
                while !gate.is_open() {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                *inner
            }
            Reply::Hang => std::future::pending::<Reply>().await,
            Reply::Text(text) | Reply::TextWithUsage { text, .. } => {
                let all: Vec<&str> = text.split_whitespace().collect();
                let (text, stop) = if all.len() as u64 > max_tokens {
                    (all[..max_tokens as usize].join(" "), "max_tokens")
                } else {
                    (text.clone(), "end_turn")
                };
                let u = usage(words(&text));
                return (paid(shared, call, &text, u, stop), u.output_tokens);
            }
            Reply::Refusal(text) => {
                let u = usage(words(&text).min(max_tokens));
                return (paid(shared, call, &text, u, "refusal"), u.output_tokens);
            }
            Reply::Status { code, body, retry_after } => {
                let status =
                    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                let body = if serde_json::from_str::<Value>(&body).is_ok() {
                    body
                } else {
                    error_json(error_type(code), &body).to_string()
                };
                let mut r =
                    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response();
                if let Some(v) = retry_after.and_then(|v| HeaderValue::from_str(&v).ok()) {
                    r.headers_mut().insert(header::RETRY_AFTER, v);
                }
                return (r, 0);
            }
            Reply::Garbage(body) => {
                return (
                    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], body)
                        .into_response(),
                    0,
                )
            }
            Reply::ResetMidBody(text) => {
                let mut body =
                    message_body(call, &text, usage(0), "end_turn").to_string().into_bytes();
                body.truncate(body.len() / 2);
                return (cut_body(body), 0);
            }
        }
    }
}

/// The error type the API gives a status.
fn error_type(code: u16) -> &'static str {
    match code {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        _ => "api_error",
    }
}

fn paid(shared: &Shared, call: &ChatCall, text: &str, u: MessageUsage, stop: &str) -> Response {
    lock(&shared.paid).push(Paid {
        call: call.clone(),
        usage: u,
        stop_reason: stop.into(),
        batch: None,
    });
    (StatusCode::OK, axum::Json(message_body(call, text, u, stop))).into_response()
}

/// The `message` object of a 200 (online, or a batch's `succeeded` result).
pub fn message_body(call: &ChatCall, text: &str, u: MessageUsage, stop: &str) -> Value {
    json!({
        "id": format!("msg_fake_{}", call.seq),
        "type": "message",
        "role": "assistant",
        "model": call.model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": stop,
        "stop_sequence": null,
        "usage": {
            "input_tokens": u.input_tokens,
            "output_tokens": u.output_tokens,
            "cache_creation_input_tokens": u.cache_write_5m + u.cache_write_1h,
            "cache_read_input_tokens": u.cache_read,
            "cache_creation": {
                "ephemeral_5m_input_tokens": u.cache_write_5m,
                "ephemeral_1h_input_tokens": u.cache_write_1h,
            },
        },
    })
}

#[cfg(test)]
mod tests;

//! A scripted OpenAI-compatible chat-completions and Batch API server over real HTTP.
//!
//! [`FakeOpenAi`] binds `127.0.0.1:0` and serves `POST /v1/chat/completions` (and
//! `/chat/completions`). Each request is parsed into a [`ChatCall`], appended to the
//! call log *before* the responder runs, and answered as the responder's [`Reply`]
//! says: a completion, an HTTP error with `Retry-After`, a delay, a gate, silence, or
//! garbage.
//!
//! The server runs on its own thread with its own tokio runtime, so it keeps answering
//! while the test blocks its thread (waiting on a `halyard` child process, say) and
//! whether or not the test is async. Drop aborts the server and every open connection
//! and joins that thread.
//!
//! `GET /health` answers 200 (503 while [`FakeOpenAi::set_ready`] says it is loading, from
//! the start with [`FakeOpenAi::start_loading_on`]) and `GET /version` its version, as
//! model servers do (the `fake-server` binary, a managed server in tests).
//!
//! Scripted outages ([`FakeOpenAi::go_down`], [`FakeOpenAi::come_back`],
//! [`FakeOpenAi::outage_for`]): refused connections (the listener really closed, open
//! connections dropped), 503s, or requests that hang. [`FakeOpenAi::paid_calls`] lists
//! the calls answered with a completion, so a test can count paid calls made twice.
//!
//! # Batch API
//!
//! The same server speaks OpenAI's Batch API for chat completions, with the same
//! responder: `POST /v1/files` (multipart upload of the JSONL input, `purpose` =
//! `batch`; bad lines, duplicate `custom_id`s, a missing file or another purpose get
//! 400), `GET /v1/files/{id}` and `/v1/files/{id}/content`, `DELETE /v1/files/{id}`,
//! `POST /v1/batches`, `GET /v1/batches/{id}`, `GET /v1/batches?limit=&after=`
//! (newest first, cursor pagination) and `POST /v1/batches/{id}/cancel`. Bad requests
//! get a 4xx with an OpenAI error body; outages apply to these endpoints too.
//!
//! A batch moves only when it is retrieved, so tests need no sleeps: with the default
//! [`BatchScript`] each `GET /v1/batches/{id}` takes it one status further,
//! `validating` → `in_progress` → `finalizing` → `completed`. The retrieve that ends
//! `in_progress` runs every request line through the responder (as a [`ChatCall`]
//! parsed from the line's `body`); `completed` comes with an output file (one line per
//! 200: `{"id","custom_id","response":{"status_code","request_id","body"},"error":null}`)
//! and an error file (every other status, and `batch_expired` / `batch_cancelled`
//! lines with `"response":null`). In a batch a [`Reply::Delayed`] or [`Reply::Gated`]
//! request finishes once its delay has passed or its gate is open, checked at each
//! retrieve (a retrieve never waits), and a [`Reply::Hang`] one never: the batch stays
//! `in_progress` until cancelled, or, if scripted to expire, expires with that request
//! in the error file as `batch_expired`.
//!
//! [`FakeOpenAi::set_batch_script`] changes, at any time, how many retrieves each status
//! lasts, holds batches `in_progress` behind a [`Gate`], makes batches expire after
//! their first K requests, or fails the next batch's validation. Requests run in
//! batches are listed by [`FakeOpenAi::batch_requests`], never in
//! [`FakeOpenAi::calls`] or [`FakeOpenAi::paid_calls`] (those are the online log);
//! [`FakeOpenAi::batches`], [`FakeOpenAi::batches_created`],
//! [`FakeOpenAi::files_uploaded`] and [`FakeOpenAi::batch_retrieves`] count the rest.
//! See the `batch` module for the details.

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use tokio::sync::{mpsc as tmpsc, watch};

mod batch;
mod server;
pub use batch::{BatchRequest, BatchScript};
pub use server::Outage;
use server::{Cmd, Control, OutageState};

/// One chat-completions request as the server received it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatCall {
    pub model: String,
    /// `(role, content)`; content given as parts is the text parts joined by `\n`.
    pub messages: Vec<(String, String)>,
    pub temperature: Option<f64>,
    /// `max_tokens`, or else `max_completion_tokens`.
    pub max_tokens: Option<u64>,
    /// The `Authorization` header as sent (`Bearer ...`).
    pub authorization: Option<String>,
    /// Arrival order, from 0, over the server's lifetime (not reset by `reset_counters`).
    pub seq: u64,
    /// The whole request body, for fields not lifted above (`seed`, `n`, ...).
    pub body: Value,
    /// `response_format.json_schema` of a structured-output request: its name and its
    /// schema as the request's bytes wrote it (keys in the order sent; `body` sorts them).
    pub json_schema: Option<(String, String)>,
}

/// What the fake answers to one call.
#[derive(Debug, Clone)]
pub enum Reply {
    /// 200 with this completion; usage counts whitespace-separated words of the
    /// prompt (all message contents) and of the completion.
    Text(String),
    /// 200 with this completion and the given usage.
    TextWithUsage { text: String, prompt_tokens: u64, completion_tokens: u64 },
    /// This HTTP status and body (`application/json` if it parses as JSON), with a
    /// `Retry-After` header when given.
    Status { code: u16, body: String, retry_after: Option<String> },
    /// Waits, then answers with the inner reply.
    Delayed(Duration, Box<Reply>),
    /// Waits until the gate opens, then answers with the inner reply.
    Gated(Gate, Box<Reply>),
    /// Never answers; the request stays in flight until the client gives up.
    Hang,
    /// 200 with `Content-Type: application/json` and this body, verbatim.
    Garbage(String),
    /// 200 with a structured refusal: `content` null, `message.refusal` this text.
    Refusal(String),
    /// 200 whose body (a completion of this text) is cut mid-way: the server sends the
    /// first half, then drops the connection (the client sees the body end early).
    ResetMidBody(String),
}

impl Reply {
    /// `Status` 429 with a `Retry-After` of `seconds` and an OpenAI-style error body.
    pub fn rate_limited(seconds: u64) -> Reply {
        Reply::Status {
            code: 429,
            body: error_body("Rate limit reached (fake)", "rate_limit_exceeded").to_string(),
            retry_after: Some(seconds.to_string()),
        }
    }

    /// This reply after `delay`.
    pub fn after(self, delay: Duration) -> Reply {
        Reply::Delayed(delay, Box::new(self))
    }

    /// This reply once `gate` is open.
    pub fn behind(self, gate: &Gate) -> Reply {
        Reply::Gated(gate.clone(), Box::new(self))
    }
}

/// A latch that holds [`Reply::Gated`] requests until opened; clones share it.
///
/// Lets a test keep exactly N calls in flight (then kill a worker, say) without
/// guessing delays.
#[derive(Clone)]
pub struct Gate(Arc<watch::Sender<bool>>);

impl Gate {
    /// A closed gate.
    pub fn new() -> Gate {
        Gate(Arc::new(watch::channel(false).0))
    }

    /// Releases every waiting request and lets later ones through.
    pub fn open(&self) {
        self.0.send_replace(true);
    }

    /// Holds later requests again; ones already released stay released.
    pub fn close(&self) {
        self.0.send_replace(false);
    }

    pub fn is_open(&self) -> bool {
        *self.0.borrow()
    }

    async fn wait(&self) {
        let mut rx = self.0.subscribe();
        // Cannot fail: `self` keeps the sender alive.
        let _ = rx.wait_for(|open| *open).await;
    }
}

impl Default for Gate {
    fn default() -> Gate {
        Gate::new()
    }
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate").field("open", &self.is_open()).finish()
    }
}

type Responder = Box<dyn Fn(&ChatCall) -> Reply + Send + Sync>;

struct Shared {
    responder: Responder,
    calls: Mutex<Vec<ChatCall>>,
    next_seq: AtomicU64,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    /// Calls answered with a completion (200).
    paid: Mutex<Vec<ChatCall>>,
    /// The current `Unavailable` or `Hang` outage.
    outage: OutageState,
    /// Files, batches and the batch script.
    batch: batch::BatchState,
    /// Whether `GET /health` answers 200 (else 503): a model server still loading.
    ready: std::sync::atomic::AtomicBool,
    /// What `GET /version` answers in its `version` field.
    version: Mutex<String>,
}

impl Shared {
    fn calls(&self) -> MutexGuard<'_, Vec<ChatCall>> {
        // A panic while holding the lock cannot leave the Vec half-written.
        self.calls.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Logs the call and counts it in flight, under one lock so that a test that saw
    /// `in_flight() == n` also sees those n calls in `calls()`.
    fn enter(self: &Arc<Self>, mut call: ChatCall) -> (ChatCall, InFlight) {
        let mut calls = self.calls();
        call.seq = self.next_seq.fetch_add(1, Ordering::SeqCst);
        calls.push(call.clone());
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        (call, InFlight(Arc::clone(self)))
    }
}

/// Counts one request in flight until dropped (answered, or the connection went away).
struct InFlight(Arc<Shared>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The fake server; see the module docs.
pub struct FakeOpenAi {
    shared: Arc<Shared>,
    addr: SocketAddr,
    control: Control,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeOpenAi {
    /// Starts the server from an async test. It does not run on the caller's runtime.
    pub async fn start<F>(responder: F) -> FakeOpenAi
    where
        F: Fn(&ChatCall) -> Reply + Send + Sync + 'static,
    {
        FakeOpenAi::start_blocking(responder)
    }

    /// Starts the server from any thread, async runtime or not; returns once it listens.
    pub fn start_blocking<F>(responder: F) -> FakeOpenAi
    where
        F: Fn(&ChatCall) -> Reply + Send + Sync + 'static,
    {
        FakeOpenAi::start_blocking_on(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), responder)
    }

    /// As [`FakeOpenAi::start_blocking`], listening on `addr` (the `fake-api` binary
    /// serves containers on `0.0.0.0:8080`).
    pub fn start_blocking_on<F>(addr: SocketAddr, responder: F) -> FakeOpenAi
    where
        F: Fn(&ChatCall) -> Reply + Send + Sync + 'static,
    {
        FakeOpenAi::start_inner(addr, true, "fake-openai", responder)
    }

    /// As [`FakeOpenAi::start_blocking_on`], as a model server that is still loading:
    /// `GET /health` answers 503 from the first request on, until
    /// [`FakeOpenAi::set_ready`]; `GET /version` answers `version` (`fake-server`).
    pub fn start_loading_on<F>(addr: SocketAddr, version: &str, responder: F) -> FakeOpenAi
    where
        F: Fn(&ChatCall) -> Reply + Send + Sync + 'static,
    {
        FakeOpenAi::start_inner(addr, false, version, responder)
    }

    fn start_inner<F>(addr: SocketAddr, ready: bool, version: &str, responder: F) -> FakeOpenAi
    where
        F: Fn(&ChatCall) -> Reply + Send + Sync + 'static,
    {
        let listener = std::net::TcpListener::bind(addr)
            .unwrap_or_else(|e| panic!("fake OpenAI: bind {addr}: {e}"));
        listener
            .set_nonblocking(true)
            .unwrap_or_else(|e| panic!("fake OpenAI: set_nonblocking: {e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("fake OpenAI: local_addr: {e}"));
        let shared = Arc::new(Shared {
            responder: Box::new(responder),
            calls: Mutex::new(Vec::new()),
            next_seq: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            paid: Mutex::new(Vec::new()),
            outage: OutageState::default(),
            batch: batch::BatchState::default(),
            ready: std::sync::atomic::AtomicBool::new(ready),
            version: Mutex::new(version.into()),
        });
        let (orders, orders_rx) = tmpsc::unbounded_channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let app = router(Arc::clone(&shared));
        let thread = std::thread::Builder::new()
            .name(format!("fake-openai-{}", addr.port()))
            .spawn(move || server::serve(listener, app, orders_rx, ready_tx))
            .unwrap_or_else(|e| panic!("fake OpenAI: spawn server thread: {e}"));
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(msg)) => panic!("fake OpenAI: {msg}"),
            Err(_) => panic!("fake OpenAI: server thread died while starting"),
        }
        FakeOpenAi { shared, addr, control: Control { orders }, thread: Some(thread) }
    }

    /// The calls answered with a completion (200), in answer order: what a paid API
    /// would bill.
    pub fn paid_calls(&self) -> Vec<ChatCall> {
        self.shared.paid.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// `http://127.0.0.1:PORT/v1`, the base URL an OpenAI client expects.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Every request received since start (or `reset_counters`), in arrival order,
    /// including ones never answered.
    pub fn calls(&self) -> Vec<ChatCall> {
        self.shared.calls().clone()
    }

    pub fn call_count(&self) -> usize {
        self.shared.calls().len()
    }

    /// Requests received and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::SeqCst)
    }

    /// The most requests ever in flight at once since start (or `reset_counters`).
    pub fn max_in_flight(&self) -> usize {
        self.shared.max_in_flight.load(Ordering::SeqCst)
    }

    /// Clears the call log and sets the high-water mark to the current in-flight count.
    /// `seq` keeps counting.
    /// Whether `GET /health` answers 200 (the default) or 503, as a model server does
    /// while it loads its weights.
    pub fn set_ready(&self, ready: bool) {
        self.shared.ready.store(ready, Ordering::SeqCst);
    }

    /// The `version` that `GET /version` answers (default `fake-openai`).
    pub fn set_version(&self, version: &str) {
        *self.shared.version.lock().unwrap_or_else(|p| p.into_inner()) = version.to_string();
    }

    pub fn reset_counters(&self) {
        let mut calls = self.shared.calls();
        calls.clear();
        self.shared.paid.lock().unwrap_or_else(|p| p.into_inner()).clear();
        let now = self.shared.in_flight.load(Ordering::SeqCst);
        self.shared.max_in_flight.store(now, Ordering::SeqCst);
    }
}

impl Drop for FakeOpenAi {
    fn drop(&mut self) {
        let (done, _) = mpsc::channel();
        let _ = self.control.orders.send((Cmd::Stop, done));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl std::fmt::Debug for FakeOpenAi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeOpenAi")
            .field("addr", &self.addr)
            .field("calls", &self.call_count())
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

fn router(shared: Arc<Shared>) -> Router {
    let router = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/chat/completions", post(chat_completions))
        // What model servers (vLLM, llama-server, TGI) answer besides completions.
        .route("/health", get(health))
        .route("/version", get(version));
    batch::routes(router)
        // Providers take long prompts (a judge quoting a 2 MB answer); axum's default
        // limit is 2 MB.
        .layer(axum::extract::DefaultBodyLimit::max(64 << 20))
        .with_state(shared)
}

async fn health(State(shared): State<Arc<Shared>>) -> Response {
    if shared.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ok").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "loading").into_response()
    }
}

async fn version(State(shared): State<Arc<Shared>>) -> Response {
    let v = shared.version.lock().unwrap_or_else(|p| p.into_inner()).clone();
    axum::Json(json!({ "version": v })).into_response()
}

async fn chat_completions(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let value: Value = match serde_json::from_slice(&body) {
        Ok(value) => value,
        Err(e) => {
            let body = error_body(&format!("request body is not JSON: {e}"), "invalid_json");
            return (StatusCode::BAD_REQUEST, axum::Json(body)).into_response();
        }
    };
    let authorization = headers
        .get(header::AUTHORIZATION)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    // A `response_format` is checked as OpenAI checks it: a malformed one is a 400.
    let json_schema = match response_format(&body) {
        Ok(s) => s,
        Err(e) => {
            let body =
                error_body(&format!("Invalid 'response_format': {e}"), "invalid_request_error");
            return (StatusCode::BAD_REQUEST, axum::Json(body)).into_response();
        }
    };
    let mut call = parse_call(value, authorization);
    call.json_schema = json_schema;
    let (call, _in_flight) = shared.enter(call);
    let outage = *shared.outage.lock().unwrap_or_else(|p| p.into_inner());
    match outage {
        Some(Outage::Hang) => return std::future::pending().await,
        Some(_) => {
            let body =
                error_body("The server is temporarily unavailable (fake outage)", "unavailable");
            return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
        }
        None => {}
    }
    let reply = ask_responder(&shared, &call);
    let response = respond(reply, &call).await;
    if response.status() == StatusCode::OK {
        shared.paid.lock().unwrap_or_else(|p| p.into_inner()).push(call);
    }
    response
}

/// The responder's reply to `call`; a panic becomes a 500.
fn ask_responder(shared: &Shared, call: &ChatCall) -> Reply {
    match catch_unwind(AssertUnwindSafe(|| (shared.responder)(call))) {
        Ok(reply) => reply,
        Err(panic) => {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic".into());
            eprintln!("fake OpenAI responder panicked on call {}: {msg}", call.seq);
            Reply::Status {
                code: 500,
                body: error_body(&format!("fake responder panicked: {msg}"), "responder_panic")
                    .to_string(),
                retry_after: None,
            }
        }
    }
}

/// The `response_format` of a request body: `None` without one (or with `{"type":
/// "text"}`); for `{"type": "json_schema", "json_schema": {"name", "schema", "strict"?}}`
/// the name and the schema's text as sent; anything else (another type, a name OpenAI
/// refuses: not 1 to 64 of a-z, A-Z, 0-9, `_`, `-`; a schema that is not an object) an
/// error saying what.
fn response_format(body: &[u8]) -> Result<Option<(String, String)>, String> {
    use serde_json::value::RawValue;
    #[derive(serde::Deserialize)]
    struct Body<'a> {
        #[serde(borrow, default)]
        response_format: Option<&'a RawValue>,
    }
    #[derive(serde::Deserialize)]
    struct Format<'a> {
        #[serde(rename = "type")]
        kind: String,
        #[serde(borrow, default)]
        json_schema: Option<Spec<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct Spec<'a> {
        name: String,
        #[serde(borrow)]
        schema: &'a RawValue,
        #[serde(default)]
        strict: Option<bool>,
    }
    let b: Body<'_> = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let Some(raw) = b.response_format else { return Ok(None) };
    let f: Format<'_> = serde_json::from_str(raw.get()).map_err(|e| e.to_string())?;
    match (f.kind.as_str(), f.json_schema) {
        ("text", None) => Ok(None),
        ("json_schema", Some(spec)) => {
            let name_ok = (1..=64).contains(&spec.name.len())
                && spec.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !name_ok {
                return Err(format!(
                    "json_schema.name {:?} is not 1 to 64 of a-z, A-Z, 0-9, _ and -",
                    spec.name
                ));
            }
            if !spec.schema.get().trim_start().starts_with('{') {
                return Err("json_schema.schema must be an object".into());
            }
            let _ = spec.strict;
            Ok(Some((spec.name, spec.schema.get().to_string())))
        }
        ("json_schema", None) => Err("type json_schema needs json_schema".into()),
        (other, _) => Err(format!("unsupported type {other:?}")),
    }
}

/// Lenient: missing or odd fields become empty/`None`, so the call is always logged.
fn parse_call(body: Value, authorization: Option<String>) -> ChatCall {
    let messages = body["messages"]
        .as_array()
        .map(|messages| {
            messages
                .iter()
                .map(|m| {
                    let role = m["role"].as_str().unwrap_or_default().to_string();
                    (role, content_text(&m["content"]))
                })
                .collect()
        })
        .unwrap_or_default();
    ChatCall {
        model: body["model"].as_str().unwrap_or_default().to_string(),
        messages,
        temperature: body["temperature"].as_f64(),
        max_tokens: body["max_tokens"].as_u64().or_else(|| body["max_completion_tokens"].as_u64()),
        authorization,
        seq: 0,
        body,
        json_schema: None,
    }
}

fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => {
            parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join("\n")
        }
        _ => String::new(),
    }
}

async fn respond(mut reply: Reply, call: &ChatCall) -> Response {
    loop {
        reply = match reply {
            Reply::Delayed(delay, inner) => {
                tokio::time::sleep(delay).await;
                *inner
            }
            Reply::Gated(gate, inner) => {
                gate.wait().await;
                *inner
            }
            Reply::Hang => std::future::pending::<Reply>().await,
            Reply::Text(text) => {
                let prompt = call.messages.iter().map(|(_, c)| words(c)).sum();
                let completion = words(&text);
                return completion_response(call, &text, prompt, completion);
            }
            Reply::TextWithUsage { text, prompt_tokens, completion_tokens } => {
                return completion_response(call, &text, prompt_tokens, completion_tokens)
            }
            Reply::Status { code, body, retry_after } => {
                return status_response(code, body, retry_after)
            }
            Reply::Garbage(body) => {
                return (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], body)
                    .into_response()
            }
            Reply::Refusal(text) => {
                let mut body = completion_body(call, "", 0, 0);
                body["choices"][0]["message"] =
                    json!({"role": "assistant", "content": null, "refusal": text});
                return (StatusCode::OK, axum::Json(body)).into_response();
            }
            Reply::ResetMidBody(text) => {
                let body = completion_body(call, &text, 1, 1).to_string().into_bytes();
                let half = bytes_half(body);
                let chunks: Vec<Result<Vec<u8>, std::io::Error>> = vec![
                    Ok(half),
                    Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "fake reset")),
                ];
                let stream = futures::stream::iter(chunks);
                return (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "application/json")],
                    axum::body::Body::from_stream(stream),
                )
                    .into_response();
            }
        }
    }
}

/// The first half of `body`.
fn bytes_half(mut body: Vec<u8>) -> Vec<u8> {
    body.truncate(body.len() / 2);
    body
}

fn words(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

fn completion_response(call: &ChatCall, text: &str, prompt: u64, completion: u64) -> Response {
    let body = completion_body(call, text, prompt, completion);
    (StatusCode::OK, axum::Json(body)).into_response()
}

/// Seconds since the Unix epoch.
fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// The `chat.completion` object a 200 carries (online, or in a batch's output file).
fn completion_body(call: &ChatCall, text: &str, prompt: u64, completion: u64) -> Value {
    json!({
        "id": format!("chatcmpl-fake-{}", call.seq),
        "object": "chat.completion",
        "created": unix_now(),
        "model": call.model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "stop",
        }],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt.saturating_add(completion),
        },
    })
}

fn status_response(code: u16, body: String, retry_after: Option<String>) -> Response {
    let Ok(status) = StatusCode::from_u16(code) else {
        let msg = format!("fake responder asked for invalid HTTP status {code}");
        return (StatusCode::INTERNAL_SERVER_ERROR, msg).into_response();
    };
    let content_type = if serde_json::from_str::<Value>(&body).is_ok() {
        "application/json"
    } else {
        "text/plain; charset=utf-8"
    };
    let mut response = (status, [(header::CONTENT_TYPE, content_type)], body).into_response();
    if let Some(retry_after) = retry_after {
        match HeaderValue::from_str(&retry_after) {
            Ok(value) => {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
            Err(_) => eprintln!("fake OpenAI: Retry-After {retry_after:?} is not a header value"),
        }
    }
    response
}

fn error_body(message: &str, code: &str) -> Value {
    json!({"error": {"message": message, "type": "fake_error", "param": null, "code": code}})
}

/// A key equal for calls with the same model and messages (roles and contents).
pub fn request_key(call: &ChatCall) -> String {
    // JSON keeps the parts unambiguous whatever characters the contents hold.
    let key = json!([call.model, call.messages]);
    format!("{}\u{0}{}", call.model, key)
}

/// How many calls repeat the model and messages of an earlier call.
pub fn repeats(calls: &[ChatCall]) -> usize {
    let mut seen = HashSet::new();
    calls.iter().filter(|c| !seen.insert(request_key(c))).count()
}

#[cfg(test)]
mod tests;

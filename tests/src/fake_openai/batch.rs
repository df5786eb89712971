//! The fake's OpenAI Batch API: files, batches, and their retrieve-driven lifecycle.
//!
//! Endpoints (each also without the `/v1` prefix, like chat completions):
//!
//! - `POST /v1/files` (multipart: `purpose` = `batch`, `file` = JSONL with a filename):
//!   every line must be a JSON object with a string `custom_id` (unique in the file),
//!   `method` `POST`, `url` `/v1/chat/completions` and an object `body`; otherwise 400.
//! - `GET /v1/files/{id}`, `GET /v1/files/{id}/content`, `DELETE /v1/files/{id}`.
//! - `POST /v1/batches`, `GET /v1/batches/{id}`, `GET /v1/batches?limit=&after=`
//!   (newest first), `POST /v1/batches/{id}/cancel`.
//!
//! Nothing happens in the background: a batch moves on only when it is retrieved
//! (`GET /v1/batches/{id}`), one status per [`BatchScript::retrieves_per_step`]
//! retrieves: `validating` → `in_progress` → `finalizing` → `completed`. The retrieve
//! that ends `in_progress` runs the requests, in file order, through the same responder
//! as `/v1/chat/completions` (each logged in [`FakeOpenAi::batch_requests`], never in
//! `calls`/`paid_calls`); the one that ends `finalizing` writes the output file (200s)
//! and the error file (every other status).
//!
//! Replies that take time do not block a retrieve: a [`Reply::Delayed`] request finishes
//! once its delay has passed, a [`Reply::Gated`] one once its gate is open, and a
//! [`Reply::Hang`] one never; the batch stays `in_progress` while any request is
//! unfinished. A batch scripted to expire ([`BatchScript::expire_after`]) does not wait
//! for hanging requests: they go to the error file as `batch_expired`. A cancelled
//! batch writes every request not finished (not run, or hanging) as `batch_cancelled`.
//!
//! Validation also fails a batch whose lines name more than one `model` (code
//! `mismatched_model`), as OpenAI does.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::multipart::MultipartRejection;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Multipart, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

use super::{
    ask_responder, completion_body, parse_call, unix_now, words, ChatCall, FakeOpenAi, Gate,
    Outage, Reply, Shared,
};

/// How the fake's batches behave; set with [`FakeOpenAi::set_batch_script`] at any time.
#[derive(Clone, Debug)]
pub struct BatchScript {
    /// How many retrieves of a batch each of `validating`, `in_progress`, `finalizing`
    /// and `cancelling` lasts: the N-th retrieve in that status moves it on (0 counts
    /// as 1). Default 1: created `validating`, then one status further per retrieve.
    /// Read at each retrieve.
    pub retrieves_per_step: u32,
    /// While this gate is closed, batches stay `in_progress` (and run nothing yet)
    /// however often they are retrieved. Read at each retrieve. Default `None`.
    pub hold: Option<Gate>,
    /// Batches created while this is `Some(k)` expire instead of completing: only their
    /// first `k` requests (file order) run, and the batch goes from `in_progress` to
    /// `expired` once those have finished (hanging ones are cut); the rest go to the
    /// error file as `batch_expired`. Not consumed. Default `None`.
    pub expire_after: Option<usize>,
    /// The next created batch (only that one: this is taken) fails validation with
    /// this error code: it goes `validating` → `failed`, with `errors` listing the
    /// code, and runs nothing. Default `None`.
    pub fail_next: Option<String>,
}

impl Default for BatchScript {
    fn default() -> BatchScript {
        BatchScript { retrieves_per_step: 1, hold: None, expire_after: None, fail_next: None }
    }
}

/// A request line that was run inside a batch: what the provider bills.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchRequest {
    pub batch_id: String,
    pub custom_id: String,
    /// The line's `body` as the responder saw it; `seq` comes from the same counter
    /// as the online calls, `authorization` is the header of the `POST /v1/batches`.
    pub call: ChatCall,
    /// The status written to the output or error file; `None` while the request is
    /// unfinished, and for one that never finished (hanging, cut by expiry or cancel).
    pub status_code: Option<u16>,
}

/// The batch half of [`Shared`].
#[derive(Default)]
pub(super) struct BatchState {
    store: Mutex<Store>,
    script: Mutex<BatchScript>,
}

impl BatchState {
    fn store(&self) -> MutexGuard<'_, Store> {
        // Every mutation leaves the store consistent; a panic cannot half-write it.
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn script(&self) -> MutexGuard<'_, BatchScript> {
        self.script.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[derive(Default)]
struct Store {
    files: HashMap<String, StoredFile>,
    /// In creation order.
    batches: Vec<Batch>,
    uploads: usize,
    created: usize,
    retrieves: usize,
}

impl Store {
    fn batch_mut(&mut self, id: &str) -> Option<&mut Batch> {
        self.batches.iter_mut().find(|b| b.id == id)
    }
}

struct StoredFile {
    id: String,
    filename: String,
    purpose: String,
    created_at: u64,
    bytes: Bytes,
    /// The parsed lines of a `batch` upload.
    lines: Arc<Vec<InputLine>>,
}

impl StoredFile {
    fn object(&self) -> Value {
        json!({
            "id": self.id,
            "object": "file",
            "bytes": self.bytes.len(),
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
        })
    }
}

struct InputLine {
    custom_id: String,
    body: Value,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Validating,
    Failed,
    InProgress,
    Finalizing,
    Completed,
    Expired,
    Cancelling,
    Cancelled,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Validating => "validating",
            Status::Failed => "failed",
            Status::InProgress => "in_progress",
            Status::Finalizing => "finalizing",
            Status::Completed => "completed",
            Status::Expired => "expired",
            Status::Cancelling => "cancelling",
            Status::Cancelled => "cancelled",
        }
    }
}

enum Wait {
    Until(Instant),
    Gate(Gate),
    Forever,
}

impl Wait {
    fn over(&self) -> bool {
        match self {
            Wait::Until(t) => Instant::now() >= *t,
            Wait::Gate(gate) => gate.is_open(),
            Wait::Forever => false,
        }
    }
}

enum LineState {
    NotRun,
    /// The responder is being asked (outside the store's lock).
    Starting(ChatCall),
    /// Waiting on a delay, a gate, or forever; then answered with `reply`.
    Pending {
        call: ChatCall,
        wait: Wait,
        reply: Reply,
    },
    Answered {
        call: ChatCall,
        status: u16,
        body: Value,
    },
    Expired(Option<ChatCall>),
    Cancelled(Option<ChatCall>),
}

impl LineState {
    fn call(&self) -> Option<&ChatCall> {
        match self {
            LineState::NotRun => None,
            LineState::Starting(call)
            | LineState::Pending { call, .. }
            | LineState::Answered { call, .. } => Some(call),
            LineState::Expired(call) | LineState::Cancelled(call) => call.as_ref(),
        }
    }

    fn take_call(self) -> Option<ChatCall> {
        match self {
            LineState::NotRun => None,
            LineState::Starting(call)
            | LineState::Pending { call, .. }
            | LineState::Answered { call, .. } => Some(call),
            LineState::Expired(call) | LineState::Cancelled(call) => call,
        }
    }
}

struct Line {
    custom_id: String,
    body: Value,
    state: LineState,
}

struct Batch {
    id: String,
    input_file_id: String,
    completion_window: String,
    metadata: Value,
    created_at: u64,
    authorization: Option<String>,
    status: Status,
    /// Retrieves seen in the current status.
    ticks: u32,
    started: bool,
    expire_after: Option<usize>,
    /// Validation fails with this code.
    fail: Option<(String, String)>,
    errors: Value,
    lines: Vec<Line>,
    output_file_id: Option<String>,
    error_file_id: Option<String>,
    in_progress_at: Option<u64>,
    finalizing_at: Option<u64>,
    completed_at: Option<u64>,
    failed_at: Option<u64>,
    expired_at: Option<u64>,
    cancelling_at: Option<u64>,
    cancelled_at: Option<u64>,
}

const EXPIRED_MESSAGE: &str =
    "This request could not be executed before the completion window expired.";
const CANCELLED_MESSAGE: &str = "This request was not executed because the batch was cancelled.";

impl Batch {
    fn object(&self) -> Value {
        let completed = self
            .lines
            .iter()
            .filter(|l| matches!(l.state, LineState::Answered { status: 200, .. }))
            .count();
        let failed = self
            .lines
            .iter()
            .filter(|l| match l.state {
                LineState::Answered { status, .. } => status != 200,
                LineState::Expired(_) | LineState::Cancelled(_) => true,
                _ => false,
            })
            .count();
        json!({
            "id": self.id,
            "object": "batch",
            "endpoint": "/v1/chat/completions",
            "errors": self.errors,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status.as_str(),
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "in_progress_at": self.in_progress_at,
            "expires_at": self.created_at + 24 * 3600,
            "finalizing_at": self.finalizing_at,
            "completed_at": self.completed_at,
            "failed_at": self.failed_at,
            "expired_at": self.expired_at,
            "cancelling_at": self.cancelling_at,
            "cancelled_at": self.cancelled_at,
            "request_counts": {
                "total": self.lines.len(),
                "completed": completed,
                "failed": failed,
            },
            "metadata": self.metadata,
        })
    }

    /// Counts one retrieve and moves on when due. Returns the lines whose requests
    /// start now (marked `Starting`): the caller asks the responder for each, outside
    /// the store's lock, then calls [`Batch::started`].
    fn retrieve(
        &mut self,
        script: &BatchScript,
        files: &mut HashMap<String, StoredFile>,
        shared: &Shared,
    ) -> Vec<(usize, ChatCall)> {
        self.ticks = self.ticks.saturating_add(1);
        let due = self.ticks >= script.retrieves_per_step.max(1);
        match self.status {
            Status::Validating if due => {
                self.ticks = 0;
                if let Some((code, message)) = self.fail.take() {
                    self.status = Status::Failed;
                    self.failed_at = Some(unix_now());
                    self.errors = json!({
                        "object": "list",
                        "data": [{"code": code, "message": message, "param": null, "line": null}],
                    });
                } else {
                    self.status = Status::InProgress;
                    self.in_progress_at = Some(unix_now());
                }
            }
            Status::InProgress => {
                self.poll();
                let held = script.hold.as_ref().is_some_and(|gate| !gate.is_open());
                if due && !held {
                    if !self.started {
                        self.started = true;
                        let starts = self.start(shared);
                        if !starts.is_empty() {
                            return starts;
                        }
                    }
                    self.end_in_progress(files);
                }
            }
            Status::Finalizing if due => {
                self.write_files(files);
                self.status = Status::Completed;
                self.completed_at = Some(unix_now());
            }
            Status::Cancelling if due => {
                for line in &mut self.lines {
                    if !matches!(line.state, LineState::Answered { .. }) {
                        let state = std::mem::replace(&mut line.state, LineState::NotRun);
                        line.state = LineState::Cancelled(state.take_call());
                    }
                }
                self.write_files(files);
                self.status = Status::Cancelled;
                self.cancelled_at = Some(unix_now());
            }
            _ => {}
        }
        Vec::new()
    }

    /// Marks the lines to run `Starting` and gives their calls, `seq` assigned in
    /// file order.
    fn start(&mut self, shared: &Shared) -> Vec<(usize, ChatCall)> {
        let count = self.expire_after.unwrap_or(usize::MAX).min(self.lines.len());
        let mut starts = Vec::with_capacity(count);
        for (i, line) in self.lines.iter_mut().enumerate().take(count) {
            let mut call = parse_call(line.body.clone(), self.authorization.clone());
            call.seq = shared.next_seq.fetch_add(1, Ordering::SeqCst);
            line.state = LineState::Starting(call.clone());
            starts.push((i, call));
        }
        starts
    }

    /// Records the responder's replies for lines [`Batch::start`] gave, unless the
    /// batch was cancelled meanwhile, and moves on if they are all finished.
    fn started(
        &mut self,
        replies: Vec<(usize, ChatCall, Reply)>,
        files: &mut HashMap<String, StoredFile>,
    ) {
        for (i, call, reply) in replies {
            if let Some(line) = self.lines.get_mut(i) {
                if matches!(line.state, LineState::Starting(_)) {
                    line.state = settle(call, reply);
                }
            }
        }
        self.end_in_progress(files);
    }

    /// Finishes the pending requests whose wait is over.
    fn poll(&mut self) {
        for line in &mut self.lines {
            if let LineState::Pending { wait, .. } = &line.state {
                if wait.over() {
                    if let LineState::Pending { call, reply, .. } =
                        std::mem::replace(&mut line.state, LineState::NotRun)
                    {
                        line.state = settle(call, reply);
                    }
                }
            }
        }
    }

    /// `in_progress` ends once every started request has finished (an expiring batch
    /// does not wait for hanging ones).
    fn end_in_progress(&mut self, files: &mut HashMap<String, StoredFile>) {
        if self.status != Status::InProgress {
            return;
        }
        self.poll();
        let expiring = self.expire_after.is_some();
        let unfinished = self.lines.iter().any(|l| match &l.state {
            LineState::Starting(_) => true,
            LineState::Pending { wait: Wait::Forever, .. } => !expiring,
            LineState::Pending { .. } => true,
            _ => false,
        });
        if unfinished {
            return;
        }
        if expiring {
            for line in &mut self.lines {
                if matches!(line.state, LineState::NotRun | LineState::Pending { .. }) {
                    let state = std::mem::replace(&mut line.state, LineState::NotRun);
                    line.state = LineState::Expired(state.take_call());
                }
            }
            self.write_files(files);
            self.status = Status::Expired;
            self.expired_at = Some(unix_now());
        } else {
            self.status = Status::Finalizing;
            self.finalizing_at = Some(unix_now());
            self.ticks = 0;
        }
    }

    /// The output file (one line per 200) and error file (every other line that has
    /// an outcome); an empty one is not created and its id stays null.
    fn write_files(&mut self, files: &mut HashMap<String, StoredFile>) {
        let mut output = String::new();
        let mut errors = String::new();
        for line in &self.lines {
            let id = format!("batch_req_{}", uuid::Uuid::now_v7().simple());
            let (text, to) = match &line.state {
                LineState::Answered { status, body, .. } => {
                    let text = json!({
                        "id": id,
                        "custom_id": line.custom_id,
                        "response": {
                            "status_code": status,
                            "request_id": format!("req_{}", uuid::Uuid::now_v7().simple()),
                            "body": body,
                        },
                        "error": null,
                    });
                    (text, if *status == 200 { &mut output } else { &mut errors })
                }
                LineState::Expired(_) | LineState::Cancelled(_) => {
                    let (code, message) = if matches!(line.state, LineState::Expired(_)) {
                        ("batch_expired", EXPIRED_MESSAGE)
                    } else {
                        ("batch_cancelled", CANCELLED_MESSAGE)
                    };
                    let text = json!({
                        "id": id,
                        "custom_id": line.custom_id,
                        "response": null,
                        "error": {"code": code, "message": message},
                    });
                    (text, &mut errors)
                }
                _ => continue,
            };
            to.push_str(&text.to_string());
            to.push('\n');
        }
        let mut store = |content: String, kind: &str| -> Option<String> {
            if content.is_empty() {
                return None;
            }
            let file = StoredFile {
                id: new_file_id(),
                filename: format!("{}_{kind}.jsonl", self.id),
                purpose: "batch_output".into(),
                created_at: unix_now(),
                bytes: Bytes::from(content),
                lines: Arc::default(),
            };
            let id = file.id.clone();
            files.insert(id.clone(), file);
            Some(id)
        };
        self.output_file_id = store(output, "output");
        self.error_file_id = store(errors, "error");
    }
}

/// Runs `reply` as far as it goes without waiting.
fn settle(call: ChatCall, mut reply: Reply) -> LineState {
    loop {
        reply = match reply {
            Reply::Delayed(delay, inner) => {
                if delay.is_zero() {
                    *inner
                } else {
                    let wait = Instant::now().checked_add(delay).map_or(Wait::Forever, Wait::Until);
                    return LineState::Pending { call, wait, reply: *inner };
                }
            }
            Reply::Gated(gate, inner) => {
                if gate.is_open() {
                    *inner
                } else {
                    return LineState::Pending { call, wait: Wait::Gate(gate), reply: *inner };
                }
            }
            Reply::Hang => {
                return LineState::Pending { call, wait: Wait::Forever, reply: Reply::Hang }
            }
            Reply::Text(text) => {
                let prompt = call.messages.iter().map(|(_, c)| words(c)).sum();
                let body = completion_body(&call, &text, prompt, words(&text));
                return LineState::Answered { call, status: 200, body };
            }
            Reply::TextWithUsage { text, prompt_tokens, completion_tokens } => {
                let body = completion_body(&call, &text, prompt_tokens, completion_tokens);
                return LineState::Answered { call, status: 200, body };
            }
            Reply::Status { code, body, .. } => {
                if StatusCode::from_u16(code).is_err() {
                    let message = format!("fake responder asked for invalid HTTP status {code}");
                    let body = error_json(&message, "server_error", None, None);
                    return LineState::Answered { call, status: 500, body };
                }
                return LineState::Answered { call, status: code, body: json_or_string(body) };
            }
            Reply::Garbage(body) => {
                return LineState::Answered { call, status: 200, body: json_or_string(body) }
            }
            Reply::Refusal(text) => {
                let mut body = completion_body(&call, "", 0, 0);
                body["choices"][0]["message"] =
                    json!({"role": "assistant", "content": null, "refusal": text});
                return LineState::Answered { call, status: 200, body };
            }
            // An output file has no connection to drop: the line's body is cut instead.
            Reply::ResetMidBody(text) => {
                let whole = completion_body(&call, &text, 1, 1).to_string();
                let cut = whole[..whole.len() / 2].to_string();
                return LineState::Answered { call, status: 200, body: Value::String(cut) };
            }
        }
    }
}

/// The body as JSON if it parses, else as a JSON string.
fn json_or_string(body: String) -> Value {
    serde_json::from_str(&body).unwrap_or(Value::String(body))
}

fn new_file_id() -> String {
    format!("file-{}", uuid::Uuid::now_v7().simple())
}

fn error_json(message: &str, kind: &str, param: Option<&str>, code: Option<&str>) -> Value {
    json!({"error": {"message": message, "type": kind, "param": param, "code": code}})
}

/// An OpenAI-style error response.
fn api_error(
    status: StatusCode,
    message: &str,
    param: Option<&str>,
    code: Option<&str>,
) -> Response {
    let kind = if status.is_client_error() { "invalid_request_error" } else { "server_error" };
    (status, axum::Json(error_json(message, kind, param, code))).into_response()
}

fn bad_request(message: &str, param: Option<&str>, code: Option<&str>) -> Response {
    api_error(StatusCode::BAD_REQUEST, message, param, code)
}

fn not_found(what: &str, id: &str) -> Response {
    api_error(StatusCode::NOT_FOUND, &format!("No such {what} object: {id}"), Some("id"), None)
}

/// What the current outage makes of a batch request: 503, or no answer ever.
async fn outage(shared: &Shared) -> Option<Response> {
    let outage = *shared.outage.lock().unwrap_or_else(|p| p.into_inner());
    match outage {
        Some(Outage::Hang) => std::future::pending().await,
        Some(_) => Some(api_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "The server is temporarily unavailable (fake outage)",
            None,
            Some("unavailable"),
        )),
        None => None,
    }
}

fn bad_path(e: PathRejection) -> Response {
    bad_request(&format!("bad path: {e}"), Some("id"), None)
}

/// The id in a request's path, or the response to give instead: the scripted outage, or
/// a 400 for a path that does not parse.
async fn path_id(
    shared: &Shared,
    path: Result<Path<String>, PathRejection>,
) -> Result<String, Response> {
    if let Some(response) = outage(shared).await {
        return Err(response);
    }
    path.map(|Path(id)| id).map_err(bad_path)
}

/// The batch routes, under `/v1` and at the root.
pub(super) fn routes(router: Router<Arc<Shared>>) -> Router<Arc<Shared>> {
    let mut router = router;
    for prefix in ["/v1", ""] {
        router = router
            .route(&format!("{prefix}/files"), post(upload_file))
            .route(&format!("{prefix}/files/{{id}}"), get(retrieve_file).delete(delete_file))
            .route(&format!("{prefix}/files/{{id}}/content"), get(file_content))
            .route(&format!("{prefix}/batches"), post(create_batch).get(list_batches))
            .route(&format!("{prefix}/batches/{{id}}"), get(retrieve_batch))
            .route(&format!("{prefix}/batches/{{id}}/cancel"), post(cancel_batch));
    }
    router
}

async fn upload_file(
    State(shared): State<Arc<Shared>>,
    multipart: Result<Multipart, MultipartRejection>,
) -> Response {
    if let Some(response) = outage(&shared).await {
        return response;
    }
    let mut multipart = match multipart {
        Ok(multipart) => multipart,
        Err(e) => {
            return bad_request(&format!("expected a multipart/form-data body: {e}"), None, None)
        }
    };
    let mut purpose = None;
    let mut file = None;
    loop {
        let field = match multipart.next_field().await {
            Ok(Some(field)) => field,
            Ok(None) => break,
            Err(e) => {
                let message = format!("malformed multipart body: {}", e.body_text());
                return api_error(e.status(), &message, None, None);
            }
        };
        let name = field.name().unwrap_or_default().to_string();
        let filename = field.file_name().map(str::to_string);
        let data = match field.bytes().await {
            Ok(data) => data,
            Err(e) => {
                let message = format!("cannot read multipart field {name:?}: {}", e.body_text());
                return api_error(e.status(), &message, None, None);
            }
        };
        match name.as_str() {
            "purpose" => purpose = Some(String::from_utf8_lossy(&data).into_owned()),
            "file" => file = Some((filename, data)),
            _ => {} // `expires_after[...]` and the like
        }
    }
    let Some(purpose) = purpose else {
        return bad_request("Missing required parameter: 'purpose'.", Some("purpose"), None);
    };
    if purpose != "batch" {
        let message = format!("The fake only accepts purpose 'batch', got {purpose:?}.");
        return bad_request(&message, Some("purpose"), None);
    }
    let Some((filename, bytes)) = file else {
        return bad_request("Missing required parameter: 'file'.", Some("file"), None);
    };
    let Some(filename) = filename.filter(|f| !f.is_empty()) else {
        return bad_request("The 'file' part must have a filename.", Some("file"), None);
    };
    let lines = match parse_input(&bytes) {
        Ok(lines) => lines,
        Err(message) => return bad_request(&message, Some("file"), Some("invalid_file_format")),
    };
    let file = StoredFile {
        id: new_file_id(),
        filename,
        purpose,
        created_at: unix_now(),
        bytes,
        lines: Arc::new(lines),
    };
    let object = file.object();
    let mut store = shared.batch.store();
    store.files.insert(file.id.clone(), file);
    store.uploads += 1;
    axum::Json(object).into_response()
}

/// Checks a batch input file; the error names the first bad line (from 1).
fn parse_input(bytes: &[u8]) -> Result<Vec<InputLine>, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("The file is not UTF-8: {e}"))?;
    let mut lines = Vec::new();
    let mut seen = HashSet::new();
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let bad = |why: &str| format!("Invalid batch input file, line {n}: {why}");
        if raw.trim().is_empty() {
            return Err(bad("blank line"));
        }
        let value: Value =
            serde_json::from_str(raw).map_err(|e| bad(&format!("not valid JSON ({e})")))?;
        let Some(object) = value.as_object() else { return Err(bad("not a JSON object")) };
        let Some(custom_id) = object.get("custom_id").and_then(Value::as_str) else {
            return Err(bad("'custom_id' must be a string"));
        };
        if object.get("method").and_then(Value::as_str) != Some("POST") {
            return Err(bad("'method' must be \"POST\""));
        }
        if object.get("url").and_then(Value::as_str) != Some("/v1/chat/completions") {
            return Err(bad("'url' must be \"/v1/chat/completions\""));
        }
        let Some(body) = object.get("body").filter(|b| b.is_object()) else {
            return Err(bad("'body' must be a JSON object"));
        };
        if !seen.insert(custom_id.to_string()) {
            return Err(bad(&format!("duplicate custom_id {custom_id:?}")));
        }
        lines.push(InputLine { custom_id: custom_id.to_string(), body: body.clone() });
    }
    if lines.is_empty() {
        return Err("Invalid batch input file: it has no requests".into());
    }
    Ok(lines)
}

async fn retrieve_file(
    State(shared): State<Arc<Shared>>,
    path: Result<Path<String>, PathRejection>,
) -> Response {
    let id = match path_id(&shared, path).await {
        Ok(id) => id,
        Err(response) => return response,
    };
    match shared.batch.store().files.get(&id) {
        Some(file) => axum::Json(file.object()).into_response(),
        None => not_found("File", &id),
    }
}

async fn delete_file(
    State(shared): State<Arc<Shared>>,
    path: Result<Path<String>, PathRejection>,
) -> Response {
    let id = match path_id(&shared, path).await {
        Ok(id) => id,
        Err(response) => return response,
    };
    match shared.batch.store().files.remove(&id) {
        Some(_) => axum::Json(json!({"id": id, "object": "file", "deleted": true})).into_response(),
        None => not_found("File", &id),
    }
}

async fn file_content(
    State(shared): State<Arc<Shared>>,
    path: Result<Path<String>, PathRejection>,
) -> Response {
    let id = match path_id(&shared, path).await {
        Ok(id) => id,
        Err(response) => return response,
    };
    let bytes = shared.batch.store().files.get(&id).map(|f| f.bytes.clone());
    match bytes {
        Some(bytes) => {
            ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response()
        }
        None => not_found("File", &id),
    }
}

async fn create_batch(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(response) = outage(&shared).await {
        return response;
    }
    let request: Value = match serde_json::from_slice(&body) {
        Ok(value @ Value::Object(_)) => value,
        Ok(_) => return bad_request("The request body must be a JSON object.", None, None),
        Err(e) => return bad_request(&format!("The request body is not JSON: {e}"), None, None),
    };
    let Some(input_file_id) = request["input_file_id"].as_str() else {
        return bad_request(
            "Missing required parameter: 'input_file_id'.",
            Some("input_file_id"),
            None,
        );
    };
    if request["endpoint"].as_str() != Some("/v1/chat/completions") {
        let message = format!(
            "Invalid 'endpoint' {}: the fake supports only '/v1/chat/completions'.",
            request["endpoint"]
        );
        return bad_request(&message, Some("endpoint"), None);
    }
    if request["completion_window"].as_str() != Some("24h") {
        let message = format!(
            "Invalid 'completion_window' {}: only '24h' is supported.",
            request["completion_window"]
        );
        return bad_request(&message, Some("completion_window"), None);
    }
    let metadata = match check_metadata(&request["metadata"]) {
        Ok(()) => request["metadata"].clone(),
        Err(message) => return bad_request(&message, Some("metadata"), None),
    };
    let authorization = headers
        .get(header::AUTHORIZATION)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let mut store = shared.batch.store();
    let Some(file) = store.files.get(input_file_id) else {
        return not_found("File", input_file_id);
    };
    if file.purpose != "batch" {
        let message = format!("File {input_file_id} has purpose '{}', not 'batch'.", file.purpose);
        return bad_request(&message, Some("input_file_id"), None);
    }
    let input = Arc::clone(&file.lines);
    let (fail_next, expire_after) = {
        let mut script = shared.batch.script();
        (script.fail_next.take(), script.expire_after)
    };
    let models: HashSet<String> = input.iter().map(|l| l.body["model"].to_string()).collect();
    let fail = match fail_next {
        Some(code) => Some((code.clone(), format!("Batch failed validation (fake): {code}"))),
        None if models.len() > 1 => {
            let mut models: Vec<_> = models.into_iter().collect();
            models.sort();
            let message = format!(
                "All requests in a batch must use the same model; the file names {}.",
                models.join(", ")
            );
            Some(("mismatched_model".to_string(), message))
        }
        None => None,
    };
    let batch = Batch {
        id: format!("batch_{}", uuid::Uuid::now_v7().simple()),
        input_file_id: input_file_id.to_string(),
        completion_window: "24h".into(),
        metadata,
        created_at: unix_now(),
        authorization,
        status: Status::Validating,
        ticks: 0,
        started: false,
        expire_after,
        fail,
        errors: Value::Null,
        lines: input
            .iter()
            .map(|l| Line {
                custom_id: l.custom_id.clone(),
                body: l.body.clone(),
                state: LineState::NotRun,
            })
            .collect(),
        output_file_id: None,
        error_file_id: None,
        in_progress_at: None,
        finalizing_at: None,
        completed_at: None,
        failed_at: None,
        expired_at: None,
        cancelling_at: None,
        cancelled_at: None,
    };
    let object = batch.object();
    store.batches.push(batch);
    store.created += 1;
    axum::Json(object).into_response()
}

/// Absent, null, or at most 16 string values under keys of at most 64 characters
/// (values at most 512), as OpenAI requires.
fn check_metadata(metadata: &Value) -> Result<(), String> {
    match metadata {
        Value::Null => Ok(()),
        Value::Object(map) => {
            if map.len() > 16 {
                return Err(format!("'metadata' has {} keys; at most 16 are allowed.", map.len()));
            }
            for (key, value) in map {
                let Some(value) = value.as_str() else {
                    return Err(format!("'metadata.{key}' must be a string."));
                };
                if key.chars().count() > 64 || value.chars().count() > 512 {
                    return Err(format!("'metadata.{key}' is too long."));
                }
            }
            Ok(())
        }
        _ => Err("'metadata' must be an object of strings.".into()),
    }
}

async fn retrieve_batch(
    State(shared): State<Arc<Shared>>,
    path: Result<Path<String>, PathRejection>,
) -> Response {
    shared.batch.store().retrieves += 1;
    let id = match path_id(&shared, path).await {
        Ok(id) => id,
        Err(response) => return response,
    };
    let script = shared.batch.script().clone();
    let starts = {
        let mut store = shared.batch.store();
        let Store { files, batches, .. } = &mut *store;
        let Some(batch) = batches.iter_mut().find(|b| b.id == id) else {
            return not_found("Batch", &id);
        };
        let starts = batch.retrieve(&script, files, &shared);
        if starts.is_empty() {
            return axum::Json(batch.object()).into_response();
        }
        starts
    };
    // The responder runs without the store's lock (it may be slow, or look at the fake).
    let replies: Vec<_> = starts
        .into_iter()
        .map(|(i, call)| {
            let reply = ask_responder(&shared, &call);
            (i, call, reply)
        })
        .collect();
    let mut store = shared.batch.store();
    let Store { files, batches, .. } = &mut *store;
    match batches.iter_mut().find(|b| b.id == id) {
        Some(batch) => {
            batch.started(replies, files);
            axum::Json(batch.object()).into_response()
        }
        None => not_found("Batch", &id),
    }
}

async fn list_batches(
    State(shared): State<Arc<Shared>>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Response {
    if let Some(response) = outage(&shared).await {
        return response;
    }
    let query = match query {
        Ok(Query(query)) => query,
        Err(e) => return bad_request(&format!("bad query string: {e}"), None, None),
    };
    let limit = match query.get("limit").map(|l| l.parse::<usize>()) {
        None => 20,
        Some(Ok(limit @ 1..=100)) => limit,
        Some(_) => {
            return bad_request("'limit' must be an integer from 1 to 100.", Some("limit"), None)
        }
    };
    let store = shared.batch.store();
    let newest_first: Vec<&Batch> = store.batches.iter().rev().collect();
    let from = match query.get("after") {
        None => 0,
        Some(after) => match newest_first.iter().position(|b| &b.id == after) {
            Some(i) => i + 1,
            None => return not_found("Batch", after),
        },
    };
    let rest = &newest_first[from.min(newest_first.len())..];
    let page = &rest[..limit.min(rest.len())];
    let data: Vec<Value> = page.iter().map(|b| b.object()).collect();
    axum::Json(json!({
        "object": "list",
        "data": data,
        "first_id": page.first().map(|b| b.id.clone()),
        "last_id": page.last().map(|b| b.id.clone()),
        "has_more": rest.len() > page.len(),
    }))
    .into_response()
}

async fn cancel_batch(
    State(shared): State<Arc<Shared>>,
    path: Result<Path<String>, PathRejection>,
) -> Response {
    let id = match path_id(&shared, path).await {
        Ok(id) => id,
        Err(response) => return response,
    };
    let mut store = shared.batch.store();
    let Some(batch) = store.batch_mut(&id) else {
        return not_found("Batch", &id);
    };
    match batch.status {
        Status::Validating | Status::InProgress => {
            batch.status = Status::Cancelling;
            batch.cancelling_at = Some(unix_now());
            batch.ticks = 0;
        }
        Status::Cancelling | Status::Cancelled => {}
        status => {
            let message = format!("Cannot cancel a batch with status '{}'.", status.as_str());
            return api_error(StatusCode::CONFLICT, &message, None, None);
        }
    }
    axum::Json(batch.object()).into_response()
}

impl FakeOpenAi {
    /// Replaces the batch script (see [`BatchScript`]); batches already created keep
    /// their `expire_after` and validation outcome.
    pub fn set_batch_script(&self, script: BatchScript) {
        *self.shared.batch.script() = script;
    }

    /// The current batch script (`fail_next` is `None` once a batch took it).
    pub fn batch_script(&self) -> BatchScript {
        self.shared.batch.script().clone()
    }

    /// Every request line run inside a batch (the responder was asked), in the order
    /// they ran: what the provider bills. Not in [`FakeOpenAi::calls`] or
    /// [`FakeOpenAi::paid_calls`], and not cleared by `reset_counters`.
    pub fn batch_requests(&self) -> Vec<BatchRequest> {
        let store = self.shared.batch.store();
        let mut requests: Vec<BatchRequest> = store
            .batches
            .iter()
            .flat_map(|batch| {
                batch.lines.iter().filter_map(|line| {
                    let call = line.state.call()?;
                    let status_code = match line.state {
                        LineState::Answered { status, .. } => Some(status),
                        _ => None,
                    };
                    Some(BatchRequest {
                        batch_id: batch.id.clone(),
                        custom_id: line.custom_id.clone(),
                        call: call.clone(),
                        status_code,
                    })
                })
            })
            .collect();
        requests.sort_by_key(|r| r.call.seq);
        requests
    }

    /// Every batch object as a retrieve would show it now (without moving it on), in
    /// creation order.
    pub fn batches(&self) -> Vec<Value> {
        self.shared.batch.store().batches.iter().map(Batch::object).collect()
    }

    /// Batches created (`POST /v1/batches` answered 200).
    pub fn batches_created(&self) -> usize {
        self.shared.batch.store().created
    }

    /// Files uploaded (`POST /v1/files` answered 200).
    pub fn files_uploaded(&self) -> usize {
        self.shared.batch.store().uploads
    }

    /// `GET /v1/batches/{id}` requests received, including ones answered 503 or left
    /// hanging by an outage, or 404.
    pub fn batch_retrieves(&self) -> usize {
        self.shared.batch.store().retrieves
    }

    /// The bytes of a stored file (input, output or error), if it exists.
    pub fn file_content(&self, id: &str) -> Option<Vec<u8>> {
        self.shared.batch.store().files.get(id).map(|f| f.bytes.to_vec())
    }
}

#[cfg(test)]
mod tests;

//! The fake's Message Batches API (issue 52), from the API reference ("Create a Message
//! Batch", "Retrieve", "List", "Cancel", "Retrieve Message Batch results"):
//!
//! - `POST /v1/messages/batches` `{"requests": [{"custom_id", "params"}]}`: at most
//!   100,000 requests and 256 MB (413 `request_too_large`), custom ids matching
//!   `^[a-zA-Z0-9_-]{1,64}$` and unique in the batch (400 naming `requests.N`). Answers
//!   the batch: `processing_status` `in_progress`, `request_counts`, `created_at` /
//!   `expires_at` (RFC 3339), `results_url` null.
//! - `GET /v1/messages/batches/{id}`: `ended` once [`BatchScript::delay`] has passed
//!   since the create (or at once after a cancel), with its counts and a `results_url`.
//! - `GET /v1/messages/batches?limit=&after_id=`: newest first, `has_more`, `first_id`,
//!   `last_id`.
//! - `POST /v1/messages/batches/{id}/cancel`: `canceling`; the batch ends with every
//!   request `canceled`.
//! - `GET /v1/messages/batches/{id}/results`: JSONL, one line per request, streamed
//!   (with [`BatchScript::padding`], that many bytes of blank lines first: a results file
//!   larger than a reader should hold), 400 while the batch is processing.
//!
//! When a batch ends, each request's fate is [`BatchScript::fate`]'s: `expired`,
//! `canceled`, or run through the responder as online (rate limits aside): a message is
//! `succeeded` (paid: [`super::FakeAnthropic::paid`] with its batch id), an HTTP error
//! `errored` with the API's error type, and params the Messages API would refuse
//! `errored` `invalid_request_error`. Every batch-API request counts towards
//! [`BatchScript::fault_every`]: every Nth is answered 529 `overloaded_error`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::{check, error, json_body, lock, message_body, words, MessageUsage, Paid, Shared};
use crate::fake_openai::{ChatCall, Reply};

/// The API's limits on one batch.
pub const MAX_REQUESTS: usize = 100_000;
pub const MAX_BYTES: usize = 256_000_000;

/// What becomes of one request when its batch ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Run through the responder: `succeeded`, or `errored` for an error reply.
    Run,
    Expired,
    Canceled,
}

type FateFn = dyn Fn(&ChatCall, u32) -> Fate + Send + Sync;

/// How the fake's batches behave.
#[derive(Clone)]
pub struct BatchScript {
    /// How long a batch is `in_progress` after its create.
    pub delay: Duration,
    /// A request's fate, given its call and how many earlier batches held the same
    /// request (same model and messages).
    pub fate: Arc<FateFn>,
    /// Bytes of blank lines streamed ahead of every results file's lines.
    pub padding: u64,
    /// Every Nth request to the batch API (any endpoint) is answered 529.
    pub fault_every: Option<u64>,
    /// The first this many creates make their batch, but the connection breaks in the
    /// middle of the answer (the client cannot tell whether the batch exists).
    pub cut_create_replies: u64,
}

impl Default for BatchScript {
    fn default() -> Self {
        BatchScript {
            delay: Duration::from_millis(300),
            fate: Arc::new(|_: &ChatCall, _: u32| Fate::Run),
            padding: 0,
            fault_every: None,
            cut_create_replies: 0,
        }
    }
}

/// A batch as the fake keeps it.
pub(super) struct FakeBatch {
    id: String,
    created: Instant,
    created_at: SystemTime,
    key: Option<String>,
    /// `(custom_id, params)`.
    requests: Vec<(String, Value)>,
    canceled: bool,
    /// Result lines once ended, and the counts.
    results: Option<Arc<Vec<String>>>,
    counts: Counts,
}

#[derive(Clone, Copy, Default)]
struct Counts {
    succeeded: u64,
    errored: u64,
    canceled: u64,
    expired: u64,
}

/// One batch as a test sees it.
#[derive(Clone, Debug)]
pub struct BatchInfo {
    pub id: String,
    /// The requests' custom ids, in the order sent.
    pub custom_ids: Vec<String>,
    /// `(custom_id, result type)` once ended.
    pub results: Vec<(String, String)>,
    pub ended: bool,
}

#[derive(Default)]
pub(super) struct Batches {
    list: Vec<FakeBatch>,
    /// How many batches held each request (by request key).
    seen: HashMap<String, u32>,
    next: u64,
}

impl Batches {
    pub(super) fn infos(&self) -> Vec<BatchInfo> {
        self.list
            .iter()
            .map(|b| BatchInfo {
                id: b.id.clone(),
                custom_ids: b.requests.iter().map(|(c, _)| c.clone()).collect(),
                results: b
                    .results
                    .iter()
                    .flat_map(|r| r.iter())
                    .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                    .map(|v| {
                        (
                            v["custom_id"].as_str().unwrap_or_default().to_string(),
                            v["result"]["type"].as_str().unwrap_or_default().to_string(),
                        )
                    })
                    .collect(),
                ended: b.results.is_some(),
            })
            .collect()
    }
}

fn rfc3339(t: SystemTime) -> String {
    let t = time::OffsetDateTime::from(t);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
        t.year(),
        t.month() as u8,
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.microsecond()
    )
}

fn custom_id_ok(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// The key and version checks every endpoint makes, and the scripted faults.
// The refusal is the handler's answer, as it is; a fake's handler is no hot path.
#[allow(clippy::result_large_err)]
fn gate(shared: &Shared, headers: &HeaderMap) -> Result<Option<String>, Response> {
    let key = super::key_and_version(headers)?;
    let n = shared.batch_seq.fetch_add(1, Ordering::SeqCst) + 1;
    if shared.script.fault_every.is_some_and(|every| every > 0 && n.is_multiple_of(every)) {
        return Err(error(
            StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
            "overloaded_error",
            "Overloaded (fake)",
        ));
    }
    Ok(Some(key))
}

pub(super) async fn create(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let key = match gate(&shared, &headers) {
        Ok(k) => k,
        Err(r) => return r,
    };
    if body.len() > MAX_BYTES {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            format!("a batch is at most {MAX_BYTES} bytes, this one {}", body.len()),
        );
    }
    let v = match json_body(&body) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let Some(reqs) = v.get("requests").and_then(Value::as_array) else {
        return error(StatusCode::BAD_REQUEST, "invalid_request_error", "requests: Field required");
    };
    if reqs.is_empty() || reqs.len() > MAX_REQUESTS {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!("requests: {} requests; a batch holds 1 to {MAX_REQUESTS}", reqs.len()),
        );
    }
    let mut seen = HashSet::new();
    let mut requests = Vec::with_capacity(reqs.len());
    for (i, r) in reqs.iter().enumerate() {
        let id = r.get("custom_id").and_then(Value::as_str).unwrap_or_default();
        if !custom_id_ok(id) {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                format!("requests.{i}.custom_id: must match ^[a-zA-Z0-9_-]{{1,64}}$"),
            );
        }
        if !seen.insert(id.to_string()) {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                format!("requests.{i}.custom_id: {id:?} is used twice in the batch"),
            );
        }
        let Some(params) = r.get("params").filter(|p| p.is_object()) else {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                format!("requests.{i}.params: Field required"),
            );
        };
        requests.push((id.to_string(), params.clone()));
    }
    let mut batches = lock(&shared.batches);
    batches.next += 1;
    let b = FakeBatch {
        id: format!("msgbatch_fake{:06}", batches.next),
        created: Instant::now(),
        created_at: SystemTime::now(),
        key,
        requests,
        canceled: false,
        results: None,
        counts: Counts::default(),
    };
    let out = batch_json(&b);
    batches.list.push(b);
    if batches.next <= shared.script.cut_create_replies {
        let mut body = out.to_string().into_bytes();
        body.truncate(body.len() / 2);
        return super::cut_body(body);
    }
    (StatusCode::OK, axum::Json(out)).into_response()
}

fn batch_json(b: &FakeBatch) -> Value {
    let ended = b.results.is_some();
    let c = b.counts;
    json!({
        "id": b.id,
        "type": "message_batch",
        "processing_status": if ended { "ended" } else if b.canceled { "canceling" } else { "in_progress" },
        "request_counts": {
            "processing": if ended { 0 } else { b.requests.len() as u64 },
            "succeeded": c.succeeded,
            "errored": c.errored,
            "canceled": c.canceled,
            "expired": c.expired,
        },
        "created_at": rfc3339(b.created_at),
        "expires_at": rfc3339(b.created_at + Duration::from_secs(86_400)),
        "ended_at": if ended { Value::from(rfc3339(SystemTime::now())) } else { Value::Null },
        "cancel_initiated_at": Value::Null,
        "archived_at": Value::Null,
        "results_url": if ended {
            Value::from(format!("https://api.anthropic.com/v1/messages/batches/{}/results", b.id))
        } else {
            Value::Null
        },
    })
}

/// The batches after the request's key was checked ([`gate`]), those due ended first.
#[allow(clippy::result_large_err)]
fn open<'a>(
    shared: &'a Shared,
    headers: &HeaderMap,
) -> Result<std::sync::MutexGuard<'a, Batches>, Response> {
    gate(shared, headers)?;
    let mut batches = lock(&shared.batches);
    end_due(shared, &mut batches);
    Ok(batches)
}

/// End the batches whose time has come (their results decided once).
fn end_due(shared: &Shared, batches: &mut Batches) {
    let delay = shared.script.delay;
    let Batches { list, seen, .. } = batches;
    for b in list.iter_mut().filter(|b| b.results.is_none()) {
        if !b.canceled && b.created.elapsed() < delay {
            continue;
        }
        let mut lines = Vec::with_capacity(b.requests.len());
        let mut counts = Counts::default();
        for (i, (id, params)) in b.requests.iter().enumerate() {
            let result = result_of(shared, seen, b.canceled, b.key.clone(), &b.id, i, params);
            match result["type"].as_str() {
                Some("succeeded") => counts.succeeded += 1,
                Some("errored") => counts.errored += 1,
                Some("canceled") => counts.canceled += 1,
                _ => counts.expired += 1,
            }
            lines.push(json!({"custom_id": id, "result": result}).to_string());
        }
        b.counts = counts;
        b.results = Some(Arc::new(lines));
    }
}

fn errored(kind: &str, message: &str) -> Value {
    json!({"type": "errored", "error": super::error_json(kind, message)})
}

/// One request's result (see the module docs).
fn result_of(
    shared: &Shared,
    seen: &mut HashMap<String, u32>,
    canceled: bool,
    key: Option<String>,
    batch: &str,
    i: usize,
    params: &Value,
) -> Value {
    if canceled {
        return json!({"type": "canceled"});
    }
    let req = match check(params, key) {
        Ok(r) => r,
        Err(e) => return errored("invalid_request_error", &e),
    };
    let mut call = req.call;
    call.seq = shared.next_seq.fetch_add(1, Ordering::SeqCst);
    lock(&shared.calls).push(call.clone());
    let rk = crate::request_key(&call);
    let before = seen.get(&rk).copied().unwrap_or(0);
    seen.insert(rk, before + 1);
    match (shared.script.fate)(&call, before) {
        Fate::Expired => return json!({"type": "expired"}),
        Fate::Canceled => return json!({"type": "canceled"}),
        Fate::Run => {}
    }
    let mut reply = (shared.responder)(&call);
    // Delays and gates are the online server's; a batch answers when it ends.
    while let Reply::Delayed(_, inner) | Reply::Gated(_, inner) = reply {
        reply = *inner;
    }
    let (write, read, long) = super::cache_step(shared, &call, &req.cache);
    let prompt: u64 = call.messages.iter().map(|(_, c)| words(c)).sum();
    let usage = |output| MessageUsage {
        input_tokens: prompt - write - read,
        output_tokens: output,
        cache_write_5m: if long { 0 } else { write },
        cache_write_1h: if long { write } else { 0 },
        cache_read: read,
    };
    let (text, stop) = match reply {
        Reply::Text(text) | Reply::TextWithUsage { text, .. } => {
            let all: Vec<&str> = text.split_whitespace().collect();
            if all.len() as u64 > req.max_tokens {
                (all[..req.max_tokens as usize].join(" "), "max_tokens")
            } else {
                (text.clone(), "end_turn")
            }
        }
        Reply::Refusal(text) => (text, "refusal"),
        Reply::Status { code, body, .. } => {
            let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            let kind = v["error"]["type"].as_str().unwrap_or(super::error_type(code)).to_string();
            let msg = v["error"]["message"].as_str().unwrap_or(&body).to_string();
            return errored(&kind, &msg);
        }
        _ => return errored("api_error", "Internal server error (fake)"),
    };
    let u = usage(words(&text));
    lock(&shared.paid).push(Paid {
        call: call.clone(),
        usage: u,
        stop_reason: stop.into(),
        batch: Some(format!("{batch}#{i}")),
    });
    json!({"type": "succeeded", "message": message_body(&call, &text, u, stop)})
}

pub(super) async fn retrieve(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let batches = match open(&shared, &headers) {
        Ok(b) => b,
        Err(r) => return r,
    };
    match batches.list.iter().find(|b| b.id == id) {
        Some(b) => (StatusCode::OK, axum::Json(batch_json(b))).into_response(),
        None => not_found(&id),
    }
}

fn not_found(id: &str) -> Response {
    error(StatusCode::NOT_FOUND, "not_found_error", format!("no message batch {id:?}"))
}

pub(super) async fn list(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Err(r) = gate(&shared, &headers) {
        return r;
    }
    let limit = match q.get("limit").map(|l| l.parse::<usize>()) {
        None => 20,
        Some(Ok(l)) if (1..=1000).contains(&l) => l,
        Some(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "limit: must be an integer in 1..=1000",
            )
        }
    };
    let mut batches = lock(&shared.batches);
    end_due(&shared, &mut batches);
    // Newest first.
    let all: Vec<&FakeBatch> = batches.list.iter().rev().collect();
    let start = match q.get("after_id") {
        None => 0,
        Some(a) => match all.iter().position(|b| &b.id == a) {
            Some(p) => p + 1,
            None => return not_found(a),
        },
    };
    let page: Vec<Value> = all.iter().skip(start).take(limit).map(|b| batch_json(b)).collect();
    let has_more = start + page.len() < all.len();
    let first = page.first().map(|b| b["id"].clone()).unwrap_or(Value::Null);
    let last = page.last().map(|b| b["id"].clone()).unwrap_or(Value::Null);
    (
        StatusCode::OK,
        axum::Json(json!({"data": page, "has_more": has_more, "first_id": first, "last_id": last})),
    )
        .into_response()
}

pub(super) async fn cancel(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let mut batches = match open(&shared, &headers) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let Some(b) = batches.list.iter_mut().find(|b| b.id == id) else { return not_found(&id) };
    if b.results.is_none() {
        b.canceled = true;
    }
    (StatusCode::OK, axum::Json(batch_json(b))).into_response()
}

/// Padding lines: 1 MiB each (the last shorter), all blanks.
const PAD_LINE: usize = 1 << 20;

pub(super) async fn results(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let lines = {
        let batches = match open(&shared, &headers) {
            Ok(b) => b,
            Err(r) => return r,
        };
        let Some(b) = batches.list.iter().find(|b| b.id == id) else { return not_found(&id) };
        match &b.results {
            Some(r) => r.clone(),
            None => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    format!("message batch {id:?} is still processing; no results yet"),
                )
            }
        }
    };
    shared.results_served.fetch_add(1, Ordering::SeqCst);
    // Made as it is sent: the padding is never held whole.
    let padding = shared.script.padding;
    let stream = futures::stream::unfold((padding, 0usize), move |(pad, next)| {
        let lines = lines.clone();
        async move {
            if pad > 0 {
                let n = (pad as usize).min(PAD_LINE);
                let mut chunk = vec![b' '; n];
                if let Some(last) = chunk.last_mut() {
                    *last = b'\n';
                }
                return Some((Ok::<_, std::io::Error>(chunk), (pad - n as u64, next)));
            }
            let line = lines.get(next)?;
            let mut chunk = Vec::with_capacity(line.len() + 1);
            chunk.extend_from_slice(line.as_bytes());
            chunk.push(b'\n');
            Some((Ok(chunk), (0, next + 1)))
        }
    });
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/binary")],
        axum::body::Body::from_stream(stream),
    )
        .into_response()
}

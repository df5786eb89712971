//! A provider batch's output and error files, read line by line into one answer per job.
//!
//! Output lines: `{"custom_id", "response": {"status_code": 200, "body": <chat
//! completion>}, "error": null}`. Error-file lines: the same with another status code
//! (the request failed as an online call would have), or `"response": null` with an
//! `error` object (the request never ran: `batch_expired`, a cancelled batch). Every line
//! is untrusted input: a line that cannot be read is logged and skipped, and its job
//! counts as unanswered (it goes into a later batch); nothing here panics.
//!
//! The files are streamed ([`super::api::BatchApi::content_lines`]): a line is parsed once,
//! as it comes, and one longer than [`super::api::MAX_LINE_BYTES`] is not kept at all.
//! Such a line's request ran and was paid for: sending it again would pay again for an
//! answer as long. So when a file had lines over the cap, every job of the batch left
//! without an answer becomes a permanent failure naming the cap (a completed batch has a
//! line for every request; a dead letter can still be re-queued by `halyard
//! retry-failed`).

use std::collections::HashMap;

use halyard_proto::{redact, Completion, JobId};
use serde::Deserialize;
use tracing::warn;

use super::api::{FileLine, MAX_LINE_BYTES};
use crate::backend::openai::{classify_status, decode_completion};
use crate::backend::CallError;

/// What the provider made of one request.
#[derive(Clone, Debug)]
pub enum Answer {
    Done(Completion),
    /// The request ran and failed (classified like an online call's failure).
    Failed(CallError),
    /// The request never ran (expired, cancelled): it goes into another batch.
    NotRun(String),
    /// The request was canceled before it ran (Anthropic's `canceled` result: someone
    /// canceled the batch): it goes into another batch, the delivery counted, so that a
    /// batch canceled again and again ends its jobs as dead letters naming it.
    Canceled(String),
}

/// Which API's lines a [`Reader`] reads.
#[derive(Clone, Copy, Debug)]
enum Format {
    /// OpenAI's output and error files.
    OpenAi,
    /// Anthropic's results (`result.type` per `custom_id`); unsplit cache writes had
    /// this lifetime.
    Anthropic(Option<halyard_proto::pool::PromptCacheTtl>),
}

#[derive(Deserialize)]
struct Line {
    custom_id: String,
    #[serde(default)]
    response: Option<LineResponse>,
    #[serde(default)]
    error: Option<LineError>,
}

#[derive(Deserialize)]
struct LineResponse {
    status_code: u16,
    /// Kept as text: a completion is decoded from it once, by `decode_completion`.
    #[serde(default)]
    body: Option<Box<serde_json::value::RawValue>>,
}

#[derive(Deserialize)]
struct LineError {
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

/// The answers of batch `batch`, read a line at a time from its output and error files.
pub struct Reader<'a> {
    batch: &'a str,
    format: Format,
    /// What each answer reports as its latency (the batch's turnaround).
    latency_ms: u64,
    answers: HashMap<JobId, Answer>,
    /// Line number in the current file.
    line: usize,
    /// Lines over [`MAX_LINE_BYTES`] so far.
    pub oversized: u64,
}

impl<'a> Reader<'a> {
    pub fn new(batch: &'a str, latency_ms: u64) -> Reader<'a> {
        Reader {
            batch,
            format: Format::OpenAi,
            latency_ms,
            answers: HashMap::new(),
            line: 0,
            oversized: 0,
        }
    }

    /// A reader of an Anthropic Message Batch's results (`ttl`: the model's prompt cache
    /// lifetime, for cache writes the usage does not split).
    pub fn anthropic(
        batch: &'a str,
        latency_ms: u64,
        ttl: Option<halyard_proto::pool::PromptCacheTtl>,
    ) -> Reader<'a> {
        Reader { format: Format::Anthropic(ttl), ..Reader::new(batch, latency_ms) }
    }

    /// The next file begins.
    pub fn next_file(&mut self) {
        self.line = 0;
    }

    /// One line of the current file.
    pub fn line(&mut self, l: FileLine<'_>) {
        self.line += 1;
        let batch = self.batch;
        let raw = match l {
            FileLine::Whole(raw) => raw,
            FileLine::Oversized(len) => {
                self.oversized += 1;
                warn!(
                    batch,
                    line = self.line,
                    bytes = len,
                    cap = MAX_LINE_BYTES,
                    "a line of a batch's output is over the cap; its job fails (not sent again)"
                );
                return;
            }
        };
        if raw.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        let read = match self.format {
            Format::OpenAi => line(batch, raw, self.latency_ms),
            Format::Anthropic(ttl) => anthropic_line(batch, raw, self.latency_ms, ttl),
        };
        match read {
            Ok((id, a)) => {
                // An answer beats an error for the same job (never expected).
                if !matches!(self.answers.get(&id), Some(Answer::Done(_))) {
                    self.answers.insert(id, a);
                }
            }
            Err(e) => {
                warn!(batch, line = self.line, error = %e, "unreadable line in a batch's output; its job goes into another batch")
            }
        }
    }

    /// The answers, once every file is read; `jobs` are the batch's jobs (ids as text).
    /// After lines over the cap, each job without an answer fails permanently.
    pub fn finish(mut self, jobs: &[String]) -> HashMap<JobId, Answer> {
        if self.oversized > 0 {
            for id in jobs.iter().filter_map(|j| j.parse::<JobId>().ok()) {
                self.answers.entry(id).or_insert_with(|| {
                    Answer::Failed(CallError::permanent(format!(
                        "batch {}: {} line(s) of its output were over the cap of {MAX_LINE_BYTES} bytes, \
                         and this request has no other line: its answer was one of them (not sent \
                         again, which would pay again)",
                        self.batch, self.oversized
                    )))
                });
            }
        }
        self.answers
    }
}

/// Read whole output and error files held in memory (tests).
#[cfg(test)]
pub fn read(batch: &str, files: &[&[u8]], latency_ms: u64) -> HashMap<JobId, Answer> {
    let mut r = Reader::new(batch, latency_ms);
    for file in files {
        r.next_file();
        let mut lines = super::api::LineSplitter::new(MAX_LINE_BYTES);
        lines.push(file, |l| r.line(l));
        lines.finish(|l| r.line(l));
    }
    r.finish(&[])
}

/// A result line of kind `kind` ("batch output", "Message Batch result") parsed, and the
/// job its `custom_id` names.
fn parse_line<T: serde::de::DeserializeOwned>(
    raw: &[u8],
    kind: &str,
    custom_id: impl FnOnce(&T) -> &str,
) -> Result<(T, JobId), String> {
    let l: T = serde_json::from_slice(raw).map_err(|e| {
        let start = redact::secrets(&String::from_utf8_lossy(&raw[..raw.len().min(120)]));
        format!("not a {kind} line ({e}): {start:?}")
    })?;
    let c = custom_id(&l);
    let id: JobId =
        c.parse().map_err(|_| format!("custom_id {:?} is not a job id", redact::secrets(c)))?;
    Ok((l, id))
}

/// A decoded answer as a completion, or its decoding error as the request's failure.
fn done(what: &str, decoded: Result<Completion, CallError>) -> Answer {
    match decoded {
        Ok(c) => Answer::Done(c),
        Err(mut e) => {
            e.status = Some(200);
            e.message = format!("{what}: {}", e.message);
            Answer::Failed(e)
        }
    }
}

/// One line of an Anthropic Message Batch's results: `{"custom_id", "result": {"type":
/// "succeeded", "message"} | {"type": "errored", "error": {"type": "error", "error":
/// {"type", "message"}}} | {"type": "canceled"} | {"type": "expired"}}`. An errored
/// request is classified by its error type as the online call's status would be
/// (`invalid_request_error` permanent, `rate_limit_error` not run, `overloaded_error`
/// and `api_error` transient).
fn anthropic_line(
    batch: &str,
    raw: &[u8],
    latency_ms: u64,
    ttl: Option<halyard_proto::pool::PromptCacheTtl>,
) -> Result<(JobId, Answer), String> {
    #[derive(Deserialize)]
    struct ResultLine {
        custom_id: String,
        result: serde_json::Value,
    }
    let (l, id) = parse_line(raw, "Message Batch result", |l: &ResultLine| l.custom_id.as_str())?;
    let what = format!("batch {batch}, request {id}");
    let mut result = l.result;
    let kind = result.get("type").and_then(|t| t.as_str()).unwrap_or("").to_string();
    let answer = match kind.as_str() {
        "succeeded" => {
            let message = result.get_mut("message").map(serde_json::Value::take);
            let Some(message) = message else {
                return Err(format!("{what}: a succeeded result without a message"));
            };
            let decoded = crate::backend::anthropic::decode_message_value(message, ttl);
            done(
                &what,
                decoded.map(|d| Completion {
                    text: d.text,
                    usage: d.usage,
                    latency_ms,
                    finish_reason: d.finish_reason,
                    calls: 1,
                    logprobs: None,
                    refusal: d.refusal,
                    source: Default::default(),
                }),
            )
        }
        "errored" => {
            // `error` is the API's error body: `{"type": "error", "error": {…}}`.
            let outer = result.get("error");
            let inner = outer.and_then(|e| e.get("error")).or(outer);
            let etype = inner.and_then(|e| e.get("type")).and_then(|t| t.as_str()).unwrap_or("");
            let msg = inner.and_then(|e| e.get("message")).and_then(|t| t.as_str()).unwrap_or("");
            let status = match etype {
                "invalid_request_error" => 400,
                "authentication_error" => 401,
                "billing_error" => 402,
                "permission_error" => 403,
                "not_found_error" => 404,
                "request_too_large" => 413,
                "rate_limit_error" => 429,
                "overloaded_error" => 529,
                _ => 500,
            };
            let text =
                redact::secrets(&format!("{etype}: {msg}").chars().take(300).collect::<String>());
            // An overloaded batch request is not an outage of the endpoint now: a later
            // batch, counted, not a paused pool.
            let class = match classify_status(status) {
                crate::backend::ErrorClass::Unavailable(_) => crate::backend::ErrorClass::Transient,
                c => c,
            };
            Answer::Failed(CallError {
                class,
                status: Some(status),
                message: format!("{what}: errored: {text}"),
                retry_after: None,
            })
        }
        "canceled" => Answer::Canceled(format!("{what}: canceled before it ran")),
        "expired" => Answer::NotRun(format!("{what}: expired (the batch's 24 hours ran out)")),
        other => {
            return Err(format!(
                "{what}: result type {:?} is none of succeeded, errored, canceled, expired",
                redact::secrets(other)
            ))
        }
    };
    Ok((id, answer))
}

fn line(batch: &str, raw: &[u8], latency_ms: u64) -> Result<(JobId, Answer), String> {
    let (l, id) = parse_line(raw, "batch output", |l: &Line| l.custom_id.as_str())?;
    let what = format!("batch {batch}, request {id}");
    let answer = match (l.response, l.error) {
        (Some(r), _) if r.status_code == 200 => {
            let body = r.body.as_deref().map_or("null", |b| b.get());
            done(
                &what,
                decode_completion(body.as_bytes()).map(|d| Completion {
                    text: d.text,
                    usage: d.usage,
                    latency_ms,
                    finish_reason: d.finish_reason,
                    calls: 1,
                    logprobs: d.logprobs,
                    refusal: d.refusal,
                    source: Default::default(),
                }),
            )
        }
        (Some(r), _) => {
            let body = r.body.as_deref().map_or("null", |b| b.get());
            let text = redact::secrets(&body.chars().take(300).collect::<String>());
            Answer::Failed(CallError {
                class: classify_status(r.status_code),
                status: Some(r.status_code),
                message: format!("{what}: HTTP {}: {text}", r.status_code),
                retry_after: None,
            })
        }
        (None, Some(e)) => {
            let code = e.code.unwrap_or_else(|| "error".into());
            let msg = e.message.unwrap_or_default();
            Answer::NotRun(redact::secrets(&format!("{what}: {code}: {msg}")))
        }
        (None, None) => return Err("a line with neither response nor error".into()),
    };
    Ok((id, answer))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::ErrorClass;

    /// Answers, failed requests (permanent and transient), requests that never ran and
    /// lines that cannot be read, each to what it means; nothing panics.
    #[test]
    fn output_and_error_lines() {
        let a = JobId([1; 16]);
        let b = JobId([2; 16]);
        let c = JobId([3; 16]);
        let d = JobId([4; 16]);
        let out = format!(
            "{{\"id\":\"r1\",\"custom_id\":\"{a}\",\"response\":{{\"status_code\":200,\"body\":{{\"choices\":[{{\"message\":{{\"content\":\"yes\"}},\"finish_reason\":\"stop\"}}],\"usage\":{{\"prompt_tokens\":5,\"completion_tokens\":1}}}}}},\"error\":null}}\n\
             not json\n\
             {{\"custom_id\":\"nope\",\"response\":null,\"error\":null}}\n"
        );
        let err = format!(
            "{{\"custom_id\":\"{b}\",\"response\":{{\"status_code\":400,\"body\":{{\"error\":{{\"message\":\"bad\"}}}}}},\"error\":null}}\n\
             {{\"custom_id\":\"{c}\",\"response\":{{\"status_code\":500,\"body\":{{}}}},\"error\":null}}\n\
             {{\"custom_id\":\"{d}\",\"response\":null,\"error\":{{\"code\":\"batch_expired\",\"message\":\"late\"}}}}\n"
        );
        let m = read("batch_x", &[out.as_bytes(), err.as_bytes()], 42);
        assert_eq!(m.len(), 4);
        match &m[&a] {
            Answer::Done(c) => {
                assert_eq!((c.text.as_str(), c.usage.prompt_tokens, c.latency_ms), ("yes", 5, 42))
            }
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(&m[&b], Answer::Failed(e) if e.class == ErrorClass::Permanent && e.message.contains("HTTP 400"))
        );
        assert!(matches!(&m[&c], Answer::Failed(e) if e.class == ErrorClass::Transient));
        assert!(matches!(&m[&d], Answer::NotRun(r) if r.contains("batch_expired")));
    }

    /// A line over the cap is not read; the batch's jobs left without an answer then fail
    /// permanently (their answers were paid for: never sent again), the others keep theirs.
    #[test]
    fn a_line_over_the_cap_fails_the_jobs_left_without_an_answer() {
        let a = JobId([1; 16]);
        let b = JobId([2; 16]);
        let ok = format!(
            "{{\"custom_id\":\"{a}\",\"response\":{{\"status_code\":200,\"body\":{{\"choices\":[{{\"message\":{{\"content\":\"yes\"}}}}]}}}}}}"
        );
        let mut r = Reader::new("batch_y", 1);
        r.next_file();
        r.line(FileLine::Whole(ok.as_bytes()));
        r.line(FileLine::Oversized(MAX_LINE_BYTES as u64 + 1));
        let m = r.finish(&[a.to_string(), b.to_string()]);
        assert!(matches!(&m[&a], Answer::Done(c) if c.text == "yes"));
        assert!(
            matches!(&m[&b], Answer::Failed(e) if e.class == ErrorClass::Permanent && e.message.contains("over the cap")),
            "{:?}",
            m[&b]
        );
        // Without a line over the cap, a job without a line is left to the caller (it goes
        // into another batch).
        let mut r = Reader::new("batch_y", 1);
        r.line(FileLine::Whole(ok.as_bytes()));
        assert!(!r.finish(&[a.to_string(), b.to_string()]).contains_key(&b));
    }

    /// Issue 52: Anthropic's result lines, each type to what it means; the errored
    /// request classified by its error type; lines that cannot be read skipped.
    #[test]
    fn anthropic_result_lines() {
        let [a, b, c, d, e, f] = [1u8, 2, 3, 4, 5, 6].map(|n| JobId([n; 16]));
        let text = format!(
            "{{\"custom_id\":\"{a}\",\"result\":{{\"type\":\"succeeded\",\"message\":{{\"content\":[{{\"type\":\"text\",\"text\":\"yes\"}}],\"stop_reason\":\"end_turn\",\"usage\":{{\"input_tokens\":4,\"output_tokens\":1,\"cache_read_input_tokens\":6}}}}}}}}\n\
             {{\"custom_id\":\"{b}\",\"result\":{{\"type\":\"errored\",\"error\":{{\"type\":\"error\",\"error\":{{\"type\":\"invalid_request_error\",\"message\":\"bad\"}}}}}}}}\n\
             {{\"custom_id\":\"{c}\",\"result\":{{\"type\":\"errored\",\"error\":{{\"type\":\"error\",\"error\":{{\"type\":\"overloaded_error\",\"message\":\"busy\"}}}}}}}}\n\
             {{\"custom_id\":\"{d}\",\"result\":{{\"type\":\"canceled\"}}}}\n\
             {{\"custom_id\":\"{e}\",\"result\":{{\"type\":\"expired\"}}}}\n\
             {{\"custom_id\":\"{f}\",\"result\":{{\"type\":\"mystery\"}}}}\n\
             not json\n"
        );
        let mut r = Reader::anthropic("msgbatch_1", 7, None);
        r.next_file();
        let mut lines = super::super::api::LineSplitter::new(MAX_LINE_BYTES);
        lines.push(text.as_bytes(), |l| r.line(l));
        lines.finish(|l| r.line(l));
        let m = r.finish(&[]);
        assert_eq!(m.len(), 5, "{m:?}");
        match &m[&a] {
            Answer::Done(c) => {
                assert_eq!((c.text.as_str(), c.usage.prompt_tokens, c.latency_ms), ("yes", 10, 7))
            }
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(&m[&b], Answer::Failed(e) if e.class == ErrorClass::Permanent && e.message.contains("invalid_request_error"))
        );
        assert!(
            matches!(&m[&c], Answer::Failed(e) if e.class != ErrorClass::Permanent && e.status == Some(529))
        );
        assert!(matches!(&m[&d], Answer::Canceled(_)));
        assert!(matches!(&m[&e], Answer::NotRun(w) if w.contains("expired")));
        assert!(!m.contains_key(&f));
    }
}

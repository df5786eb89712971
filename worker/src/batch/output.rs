//! A provider batch's output and error files, read into one answer per job.
//!
//! Output lines: `{"custom_id", "response": {"status_code": 200, "body": <chat
//! completion>}, "error": null}`. Error-file lines: the same with another status code
//! (the request failed as an online call would have), or `"response": null` with an
//! `error` object (the request never ran: `batch_expired`, a cancelled batch). Every line
//! is untrusted input: a line that cannot be read is logged and skipped, and its job
//! counts as unanswered (it goes into a later batch); nothing here panics.

use std::collections::HashMap;

use halyard_proto::{redact, Completion, JobId};
use serde::Deserialize;
use tracing::warn;

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
    #[serde(default)]
    body: serde_json::Value,
}

#[derive(Deserialize)]
struct LineError {
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

/// Read the output and error files of batch `batch`; `latency_ms` is what each answer
/// reports as its latency (the batch's turnaround).
pub fn read(batch: &str, files: &[&[u8]], latency_ms: u64) -> HashMap<JobId, Answer> {
    let mut answers = HashMap::new();
    for file in files {
        for (n, raw) in file.split(|b| *b == b'\n').enumerate() {
            if raw.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match line(batch, raw, latency_ms) {
                Ok((id, a)) => {
                    // An answer beats an error for the same job (never expected).
                    if !matches!(answers.get(&id), Some(Answer::Done(_))) {
                        answers.insert(id, a);
                    }
                }
                Err(e) => {
                    warn!(batch, line = n + 1, error = %e, "unreadable line in a batch's output; its job goes into another batch")
                }
            }
        }
    }
    answers
}

fn line(batch: &str, raw: &[u8], latency_ms: u64) -> Result<(JobId, Answer), String> {
    let l: Line = serde_json::from_slice(raw).map_err(|e| {
        let start = redact::secrets(&String::from_utf8_lossy(&raw[..raw.len().min(120)]));
        format!("not a batch output line ({e}): {start:?}")
    })?;
    let id: JobId = l
        .custom_id
        .parse()
        .map_err(|_| format!("custom_id {:?} is not a job id", redact::secrets(&l.custom_id)))?;
    let what = format!("batch {batch}, request {id}");
    let answer = match (l.response, l.error) {
        (Some(r), _) if r.status_code == 200 => {
            let body = serde_json::to_vec(&r.body).map_err(|e| e.to_string())?;
            match decode_completion(&body) {
                Ok(d) => Answer::Done(Completion {
                    text: d.text,
                    usage: d.usage,
                    latency_ms,
                    finish_reason: d.finish_reason,
                    calls: 1,
                    logprobs: d.logprobs,
                    refusal: d.refusal,
                }),
                Err(mut e) => {
                    e.status = Some(200);
                    e.message = format!("{what}: {}", e.message);
                    Answer::Failed(e)
                }
            }
        }
        (Some(r), _) => {
            let text = redact::secrets(&r.body.to_string().chars().take(300).collect::<String>());
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
}

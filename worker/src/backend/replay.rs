//! The `replay` backend: answers chat requests from recorded results, without calling
//! any model, so that a run can be re-scored or reproduced for free.
//!
//! Two sources ([`ReplaySource`]):
//! - **JSON Lines of request/response pairs**, one call per line: `[request, response]`
//!   (two objects), or `[object]` with the request and the response merged in one object
//!   (the AutoHall recordings, e.g. `gpt-3.5-turbo_climate_t0.1.jsonl`, whose objects
//!   hold `model` twice: the request's, then the response's; the first one is the
//!   request's). A request needs `model` and `messages`; a response needs
//!   `choices[0].message.content` (`usage` is optional). A line that cannot be read is
//!   reported (file:line and what) and skipped: the other lines still serve.
//!   A job matches on **model and messages**; recordings of the same request are served
//!   in file order by sample index (sample `i` gets the `i`-th), so repeated samples stay
//!   distinct.
//! - **A previous Halyard run's checkpoint** (the worker's checkpoint directory): a job is
//!   answered with the completion the original model gave to the same job key, i.e. the
//!   job's key with its model reference replaced by the recorded one
//!   (`recorded_backend`, `recorded_endpoint`, same model name). Every field of the key
//!   then matches: model, messages, sampling and sample index.
//!
//! A miss is a permanent error for that job alone (it becomes a dead letter naming what
//! was missing); the run goes on.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use halyard_proto::{Completion, Job, ModelRef, Usage};
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;

use crate::call_error::CallError;
use crate::checkpoint::Checkpoint;

pub use halyard_proto::pool::{ReplaySource, ReplaySpec};

/// A line that could not be used.
#[derive(Clone, Debug, PartialEq)]
pub struct BadLine {
    pub line: usize,
    pub reason: String,
}

/// One recorded response.
#[derive(Clone, Debug, PartialEq)]
struct Recorded {
    text: String,
    usage: Usage,
    finish_reason: Option<String>,
    /// Recorded as `message.refusal`.
    refusal: bool,
}

/// (model, [(role, content)]) of a request.
type RequestKey = (String, Vec<(String, String)>);

/// Recordings read from a JSONL file.
#[derive(Debug, Default)]
pub struct Recordings {
    file: String,
    calls: HashMap<RequestKey, Vec<Recorded>>,
    /// Lines skipped, with why.
    pub bad_lines: Vec<BadLine>,
    /// Lines read.
    pub recorded: usize,
}

/// The fields of one object of a line; keys seen again later (the response's `model`)
/// do not replace the first.
#[derive(Default)]
struct Part {
    model: Option<String>,
    messages: Option<serde_json::Value>,
    choices: Option<serde_json::Value>,
    usage: Option<serde_json::Value>,
}

impl<'de> Deserialize<'de> for Part {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Part, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Part;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a request or response object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Part, A::Error> {
                let mut p = Part::default();
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "model" if p.model.is_none() => p.model = Some(map.next_value()?),
                        "messages" if p.messages.is_none() => p.messages = Some(map.next_value()?),
                        "choices" if p.choices.is_none() => p.choices = Some(map.next_value()?),
                        "usage" if p.usage.is_none() => p.usage = Some(map.next_value()?),
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(p)
            }
        }
        d.deserialize_map(V)
    }
}

fn parse_line(text: &str) -> Result<(RequestKey, Recorded), String> {
    let parts: Vec<Part> =
        serde_json::from_str(text).map_err(|e| format!("not a JSON array of objects: {e}"))?;
    let req =
        parts.iter().find(|p| p.messages.is_some()).ok_or("no request object (with `messages`)")?;
    let resp =
        parts.iter().find(|p| p.choices.is_some()).ok_or("no response object (with `choices`)")?;
    let model = req.model.clone().ok_or("the request has no `model`")?;
    let mut messages = Vec::new();
    for (i, m) in req
        .messages
        .as_ref()
        .and_then(|m| m.as_array())
        .ok_or("`messages` is not an array")?
        .iter()
        .enumerate()
    {
        let role =
            m["role"].as_str().ok_or_else(|| format!("messages[{i}].role is not a string"))?;
        let content = m["content"]
            .as_str()
            .ok_or_else(|| format!("messages[{i}].content is not a string"))?;
        messages.push((role.to_string(), content.to_string()));
    }
    let choice = &resp.choices.as_ref().and_then(|c| c.get(0)).ok_or("`choices` is empty")?;
    // A recorded refusal (`message.refusal`, issue 29) replays as a refusal.
    let refusal = choice["message"]["refusal"].as_str().filter(|r| !r.trim().is_empty());
    let (text, refusal) = match refusal {
        Some(r) => (r, true),
        None => (
            choice["message"]["content"]
                .as_str()
                .ok_or("choices[0].message.content is not a string (and no refusal)")?,
            false,
        ),
    };
    let usage = resp.usage.as_ref().map_or(Usage::default(), |u| Usage {
        prompt_tokens: u["prompt_tokens"].as_u64().unwrap_or(0),
        completion_tokens: u["completion_tokens"].as_u64().unwrap_or(0),
        cache: None,
    });
    let finish_reason = choice["finish_reason"].as_str().map(str::to_string);
    Ok(((model, messages), Recorded { text: text.to_string(), usage, finish_reason, refusal }))
}

impl Recordings {
    /// Read recordings given as text (`file` names them in messages).
    pub fn parse(file: &str, text: &str) -> Recordings {
        let mut r = Recordings { file: file.to_string(), ..Recordings::default() };
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match parse_line(line) {
                Ok((key, rec)) => {
                    r.calls.entry(key).or_default().push(rec);
                    r.recorded += 1;
                }
                Err(reason) => r.bad_lines.push(BadLine { line: i + 1, reason }),
            }
        }
        r
    }

    /// Read a recordings file; unreadable lines are logged (file:line: what) and skipped.
    pub fn load(path: &Path) -> Result<Recordings, String> {
        let file = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("replay recordings {file}: {e}"))?;
        let r = Recordings::parse(&file, &text);
        for b in &r.bad_lines {
            tracing::warn!("replay recordings {file}:{}: skipped: {}", b.line, b.reason);
        }
        tracing::info!(file = %file, recorded = r.recorded, skipped = r.bad_lines.len(), "replay recordings loaded");
        Ok(r)
    }

    /// The recorded answer to `messages` by `model`, sample `index` (0-based).
    pub fn answer(
        &self,
        model: &str,
        messages: &[(String, String)],
        index: u32,
    ) -> Result<Completion, CallError> {
        let key = (model.to_string(), messages.to_vec());
        let found = self.calls.get(&key).map_or(0, Vec::len);
        let Some(rec) = self.calls.get(&key).and_then(|v| v.get(index as usize)) else {
            let last = messages
                .last()
                .map(|(_, c)| c.chars().take(80).collect::<String>())
                .unwrap_or_default();
            return Err(CallError::permanent(format!(
                "replay: {} holds {found} recorded response(s) for model {model:?} and these messages, sample {index} needed (last message starts {last:?})",
                self.file
            )));
        };
        Ok(Completion {
            text: rec.text.clone(),
            usage: rec.usage,
            latency_ms: 0,
            finish_reason: rec.finish_reason.clone(),
            calls: 1,
            logprobs: None,
            refusal: rec.refusal,
            source: Default::default(),
        })
    }
}

/// A loaded replay source.
pub enum Replay {
    Jsonl(Recordings),
    Checkpoint { store: Checkpoint, dir: String, backend: String, endpoint: String },
}

impl Replay {
    /// Load a source (blocking: reads the file or opens the store).
    pub fn load(source: &ReplaySource) -> Result<Replay, String> {
        match source {
            ReplaySource::Jsonl(path) => Recordings::load(path).map(Replay::Jsonl),
            ReplaySource::Checkpoint { dir, backend, endpoint } => {
                let store = Checkpoint::open(dir).map_err(|e| format!("replay checkpoint: {e}"))?;
                Ok(Replay::Checkpoint {
                    store,
                    dir: dir.display().to_string(),
                    backend: backend.clone(),
                    endpoint: endpoint.clone(),
                })
            }
        }
    }

    /// The recorded answer to `job`.
    pub fn answer(&self, job: &Job) -> Result<Completion, CallError> {
        let key = &job.key;
        match self {
            Replay::Jsonl(r) => {
                let messages: Vec<(String, String)> = key
                    .messages
                    .iter()
                    .map(|m| (m.role.as_str().to_string(), m.content.clone()))
                    .collect();
                r.answer(&key.model.model, &messages, key.sample_index)
            }
            Replay::Checkpoint { store, dir, backend, endpoint } => {
                let mut original = key.clone();
                original.model = ModelRef {
                    backend: backend.clone(),
                    endpoint: endpoint.clone(),
                    model: key.model.model.clone(),
                };
                let id = original.id();
                match store.get(&id) {
                    Ok(Some(mut c)) => {
                        c.latency_ms = 0;
                        c.calls = 1;
                        Ok(c)
                    }
                    Ok(None) => Err(CallError::permanent(format!(
                        "replay: checkpoint {dir} has no result for job {id} (stage {}, model {:?} at {endpoint}, sample {})",
                        key.stage, key.model.model, key.sample_index
                    ))),
                    Err(e) => Err(CallError::permanent(format!("replay: checkpoint {dir}: {e}"))),
                }
            }
        }
    }
}

/// `backend = "replay"`: answers from recorded results, by the endpoint of their jobs.
pub const KIND: super::BackendKind =
    super::BackendKind { name: "replay", http: false, load: load_sources };

/// Every replay source of the plan, each loaded once.
fn load_sources(l: &super::Load<'_>) -> Result<Box<dyn super::Backend>, String> {
    let mut sources = HashMap::new();
    for (_, m) in l.models("replay") {
        if let halyard_proto::pool::WorkerModel::Replay(r) = m {
            if !sources.contains_key(&r.endpoint) {
                sources.insert(r.endpoint.clone(), Replay::load(&r.source)?);
            }
        }
    }
    Ok(Box::new(ReplayBackend { sources }))
}

/// The `replay` backend: its sources by the endpoint of their jobs.
struct ReplayBackend {
    sources: HashMap<String, Replay>,
}

impl super::Backend for ReplayBackend {
    fn call<'a>(
        &'a self,
        job: &'a Job,
    ) -> futures::future::BoxFuture<'a, Result<Completion, CallError>> {
        let r = match self.sources.get(&job.key.model.endpoint) {
            Some(r) => r.answer(job).map(|c| super::clamped(job, c)),
            None => Err(CallError::permanent(format!(
                "this worker holds no replay recordings {} (pool {}); start a worker with the sweep that names them",
                job.key.model.endpoint, job.pool
            ))),
        };
        Box::pin(std::future::ready(r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(c: &str) -> Vec<(String, String)> {
        vec![("user".to_string(), c.to_string())]
    }

    /// Both line shapes are read; the request's `model` is the first one; broken lines are
    /// reported by line and skipped; repeats are served by sample index; a miss says what.
    #[test]
    fn jsonl_shapes_bad_lines_and_misses() {
        let text = concat!(
            r#"[{"model": "gpt", "messages": [{"role": "user", "content": "Q"}], "object": "chat.completion", "model": "gpt-0613", "choices": [{"message": {"role": "assistant", "content": "A1"}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}]"#,
            "\n",
            r#"[{"model": "gpt", "messages": [{"role": "user", "content": "Q"}]}, {"model": "x", "choices": [{"message": {"content": "A2"}}]}]"#,
            "\n\n",
            r#"[{"model": "gpt", "messages": [{"role": "user", "content": "cut"#,
            "\n",
            r#"[{"model": "gpt", "messages": [{"role": "user", "content": "Q"}]}]"#,
            "\n"
        );
        let r = Recordings::parse("rec.jsonl", text);
        assert_eq!(r.recorded, 2);
        assert_eq!(r.bad_lines.iter().map(|b| b.line).collect::<Vec<_>>(), [4, 5]);
        assert!(r.bad_lines[0].reason.contains("not a JSON array"), "{:?}", r.bad_lines);
        assert!(r.bad_lines[1].reason.contains("no response object"), "{:?}", r.bad_lines);
        let a = r.answer("gpt", &msgs("Q"), 0).unwrap();
        assert_eq!(
            (a.text.as_str(), a.usage.prompt_tokens, a.finish_reason.as_deref()),
            ("A1", 3, Some("stop"))
        );
        assert_eq!(r.answer("gpt", &msgs("Q"), 1).unwrap().text, "A2");
        let e = r.answer("gpt", &msgs("Q"), 2).unwrap_err();
        assert!(
            e.is_permanent()
                && e.message.contains("holds 2 recorded")
                && e.message.contains("rec.jsonl"),
            "{e}"
        );
        assert!(r.answer("gpt-0613", &msgs("Q"), 0).is_err(), "matched on the response's model");
        assert!(r.answer("gpt", &msgs("Q2"), 0).unwrap_err().message.contains("holds 0"));
    }

    /// The public AutoHall recordings: 361 usable lines, the broken one reported by its
    /// line number, and a recorded classification served for its exact request.
    #[test]
    fn autohall_climate_recordings() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/data/autohall/gpt-3.5-turbo_climate_t0.1.jsonl");
        let Ok(text) = std::fs::read_to_string(&path) else {
            panic!("{} is missing; it ships in shared/data/autohall/", path.display());
        };
        let r = Recordings::parse("climate", &text);
        assert_eq!((r.recorded, r.bad_lines.len()), (361, 1));
        assert_eq!(r.bad_lines[0].line, 1);
        let second: serde_json::Value = serde_json::from_str(text.lines().nth(1).unwrap()).unwrap();
        let content = second[0]["messages"][0]["content"].as_str().unwrap();
        assert_eq!(
            r.answer("gpt-3.5-turbo", &msgs(content), 0).unwrap().text,
            "The claim is false."
        );
    }
}

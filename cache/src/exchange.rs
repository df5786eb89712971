//! A cache as one file: `halyard cache export FILE` / `import FILE`.
//!
//! The file is JSON Lines in the `replay` backend's request/response form, so a
//! published cache is also a recording a sweep can replay (`backend = "replay"`,
//! `recordings = FILE`). Each line is `[request, response]`:
//!
//! - `request`: `model`, `messages`, `temperature`, `max_tokens` (as an OpenAI chat
//!   request), and `halyard`: `{"job": <id>, "key": <the full job key>}`;
//! - `response`: `choices[0].message.content` (and `refusal`), `finish_reason`,
//!   `usage`, and `halyard`: `{"completion": <the completion as checkpointed>}`.
//!
//! Lines are ordered by model, messages and sample index, so that replay (which serves
//! recordings of one request in file order, sample i the i-th) gives each sample its own.
//! An import recomputes each line's job id from its key and refuses a line whose id
//! differs, naming the file and line; the other lines are still imported.

use std::io::{BufRead, BufWriter, Write};
use std::path::Path;

use halyard_proto::{Completion, JobId, JobKey};
use serde_json::{json, Value};

use crate::{CacheError, MachineCache};

/// What an import did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Imported {
    pub lines: u64,
    /// Entries the cache did not hold.
    pub new: u64,
    /// Lines refused: (line number, why).
    pub refused: Vec<(u64, String)>,
}

fn file_err(path: &Path, e: impl std::fmt::Display) -> CacheError {
    CacheError::File { path: path.display().to_string(), reason: e.to_string() }
}

/// One line of the file.
pub fn line(id: &JobId, key: &JobKey, c: &Completion) -> Value {
    let mut message = json!({"role": "assistant", "content": c.text});
    if c.refusal {
        message["refusal"] = json!(c.text);
    }
    json!([
        {
            "model": key.model.model,
            "messages": key.messages,
            "temperature": key.sampling.temperature,
            "max_tokens": key.sampling.max_tokens,
            "halyard": {"job": id.to_string(), "key": key},
        },
        {
            "choices": [{"index": 0, "message": message, "finish_reason": c.finish_reason}],
            "usage": {"prompt_tokens": c.usage.prompt_tokens, "completion_tokens": c.usage.completion_tokens},
            "halyard": {"completion": c},
        }
    ])
}

/// Write every entry of `cache` to `path` (replaced atomically). Returns the count.
pub fn export(cache: &MachineCache, path: &Path) -> Result<u64, CacheError> {
    let mut entries = cache.entries()?;
    entries.sort_by(|a, b| {
        let ka = (&a.1.model.model, &a.1.model.endpoint, &a.1.messages_text(), a.1.sample_index);
        let kb = (&b.1.model.model, &b.1.model.endpoint, &b.1.messages_text(), b.1.sample_index);
        ka.cmp(&kb).then(a.0.cmp(&b.0))
    });
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let tmp = tempfile::NamedTempFile::new_in(dir).map_err(|e| file_err(path, e))?;
    {
        let mut w = BufWriter::new(tmp.as_file());
        for (id, key, c) in &entries {
            serde_json::to_writer(&mut w, &line(id, key, c)).map_err(|e| file_err(path, e))?;
            w.write_all(b"\n").map_err(|e| file_err(path, e))?;
        }
        w.flush().map_err(|e| file_err(path, e))?;
    }
    tmp.as_file().sync_all().map_err(|e| file_err(path, e))?;
    tmp.persist(path).map_err(|e| file_err(path, e.error))?;
    Ok(entries.len() as u64)
}

/// Read one line of an export: the key and completion, checked against the id.
pub fn parse_line(text: &str) -> Result<(JobKey, Completion), String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let parts = v.as_array().filter(|a| a.len() == 2).ok_or("not a [request, response] pair")?;
    let h = parts[0]
        .get("halyard")
        .ok_or("the request has no `halyard` object (not a Halyard cache export)")?;
    let id: JobId = h
        .get("job")
        .and_then(Value::as_str)
        .ok_or("`halyard.job` is missing")?
        .parse()
        .map_err(|e| format!("`halyard.job`: {e}"))?;
    let key: JobKey =
        serde_json::from_value(h.get("key").cloned().ok_or("`halyard.key` is missing")?)
            .map_err(|e| format!("`halyard.key`: {e}"))?;
    if key.id() != id {
        return Err(format!("the job key hashes to {}, not to the line's job {id}", key.id()));
    }
    let c = parts[1]
        .get("halyard")
        .and_then(|h| h.get("completion"))
        .ok_or("the response has no `halyard.completion`")?;
    let c: Completion =
        serde_json::from_value(c.clone()).map_err(|e| format!("`halyard.completion`: {e}"))?;
    Ok((key, c))
}

/// Import an export into `cache` (entries it holds are kept as they are).
pub fn import(cache: &MachineCache, path: &Path) -> Result<Imported, CacheError> {
    let f = std::fs::File::open(path).map_err(|e| file_err(path, e))?;
    let mut out = Imported::default();
    let mut batch = Vec::with_capacity(1024);
    for (i, text) in std::io::BufReader::new(f).lines().enumerate() {
        let n = i as u64 + 1;
        let text = text.map_err(|e| file_err(path, format!("line {n}: {e}")))?;
        if text.trim().is_empty() {
            continue;
        }
        out.lines += 1;
        match parse_line(&text) {
            Ok(entry) => batch.push(entry),
            Err(why) => {
                tracing::warn!("{}:{n}: not imported: {why}", path.display());
                out.refused.push((n, why));
            }
        }
        if batch.len() >= 1024 {
            out.new += cache.insert_now(&batch)?;
            batch.clear();
        }
    }
    out.new += cache.insert_now(&batch)?;
    Ok(out)
}

trait MessagesText {
    fn messages_text(&self) -> Vec<(&'static str, &str)>;
}

impl MessagesText for JobKey {
    fn messages_text(&self) -> Vec<(&'static str, &str)> {
        self.messages.iter().map(|m| (m.role.as_str(), m.content.as_str())).collect()
    }
}

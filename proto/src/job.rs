//! What a worker receives: a [`Job`] carrying one chat request and its key.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::id::{CanonicalHasher, JobId};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    pub content: String,
}

impl ChatMessage {
    pub fn system(content: impl Into<String>) -> Self {
        ChatMessage { role: Role::System, content: content.into() }
    }
    pub fn user(content: impl Into<String>) -> Self {
        ChatMessage { role: Role::User, content: content.into() }
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        ChatMessage { role: Role::Assistant, content: content.into() }
    }
}

/// Which model answers: the backend kind, where it lives, and the name it is called by.
/// Together they determine the result; the sweep's alias for the model does not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelRef {
    /// `openai`, `gguf`, `replay`, `noop`.
    pub backend: String,
    /// Base URL for HTTP backends, model file for local ones.
    pub endpoint: String,
    /// The model name sent to the API.
    pub model: String,
}

/// How the model samples. The fields after `seed` are optional additions: absent from the
/// wire and from the job id unless set, so every job planned before they existed keeps
/// its id (and its checkpoint).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    pub temperature: f32,
    pub max_tokens: Option<u32>,
    pub seed: Option<u64>,
    /// Nucleus sampling (`top_p`); `None`: the backend's default, nothing sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// Top-k sampling; `None`: the backend's default. Only local models honour it (the
    /// OpenAI chat API has no such parameter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    /// Token log-probabilities wanted in the completion; `None`: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<LogprobsRequest>,
    /// Structured output: the JSON schema the completion must follow, for judges whose
    /// model sets `structured_output = true` (issue 45). `gguf` turns it into a llama.cpp
    /// grammar, HTTP backends send it as `response_format`; `None`: free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_schema: Option<Box<OutputSchema>>,
    /// Stop sequences: generation ends before the first of them (it is not part of the
    /// answer), with the finish reason `stop`. OpenAI's `stop`, Anthropic's
    /// `stop_sequences`, cut by `gguf` as it generates; empty: none (nothing sent, the id
    /// unchanged).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
}

/// A JSON schema a completion must follow (see [`Sampling::json_schema`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputSchema {
    /// Its name (OpenAI's `json_schema.name`: letters, digits, `_` and `-`, at most 64).
    pub name: String,
    /// The JSON Schema, as compact JSON text (the pipeline writes it; its bytes are hashed).
    pub schema: String,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 0.0,
            max_tokens: None,
            seed: None,
            top_p: None,
            top_k: None,
            logprobs: None,
            json_schema: None,
            stop: Vec::new(),
        }
    }
}

/// Which token log-probabilities a job wants (see [`crate::TokenLogprob`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogprobsRequest {
    /// Most likely alternatives per position besides the chosen token (OpenAI
    /// `top_logprobs`, 0 to 20).
    pub top: u8,
    /// Score instead of generate: the last message is an assistant message holding a given
    /// text, and the completion carries the log-probability of each of its tokens after
    /// the messages before it (teacher forcing, as a "probability model" scores a
    /// completion written by another model), with no text generated. Only backends that
    /// can read the model's distribution at given positions (`gguf`) can do it.
    #[serde(default)]
    pub score_last: bool,
}

/// Everything that determines a job's result. Its hash is the [`JobId`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobKey {
    pub pipeline: String,
    pub stage: String,
    /// Bumped when a stage's prompt or parsing changes, so old checkpoints are not reused.
    pub stage_version: u32,
    pub model: ModelRef,
    pub messages: Vec<ChatMessage>,
    pub sampling: Sampling,
    /// Distinguishes repeated samples and retries of the same request.
    pub sample_index: u32,
}

impl JobKey {
    /// The content hash of this key. Stable across runs, processes and releases
    /// (the encoding is hand-written, not derived from serde).
    pub fn id(&self) -> JobId {
        let mut h = CanonicalHasher::new("job/v1");
        h.str(&self.pipeline).str(&self.stage).u64(self.stage_version as u64);
        h.str(&self.model.backend).str(&self.model.endpoint).str(&self.model.model);
        h.u64(self.messages.len() as u64);
        for m in &self.messages {
            h.str(m.role.as_str()).str(&m.content);
        }
        // -0.0 and 0.0 sample identically; hash them the same.
        let t = if self.sampling.temperature == 0.0 { 0.0f32 } else { self.sampling.temperature };
        h.u64(t.to_bits() as u64);
        h.opt_u64(self.sampling.max_tokens.map(u64::from));
        h.opt_u64(self.sampling.seed);
        h.u64(self.sample_index as u64);
        // Later additions, each tagged and hashed only when set: the ids of keys that
        // leave them unset are those of earlier releases.
        if let Some(p) = self.sampling.top_p {
            h.str("top_p").u64(p.to_bits() as u64);
        }
        if let Some(k) = self.sampling.top_k {
            h.str("top_k").u64(k as u64);
        }
        if let Some(l) = self.sampling.logprobs {
            h.str("logprobs").u64(l.top as u64).u64(l.score_last as u64);
        }
        if let Some(s) = &self.sampling.json_schema {
            h.str("json_schema").str(&s.name).str(&s.schema);
        }
        if !self.sampling.stop.is_empty() {
            h.str("stop").u64(self.sampling.stop.len() as u64);
            for s in &self.sampling.stop {
                h.str(s);
            }
        }
        h.finish()
    }
}

/// One unit of work on the wire.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub v: u16,
    pub id: JobId,
    pub run: Uuid,
    /// The pool whose workers may run it (also encoded in the subject).
    pub pool: String,
    pub key: JobKey,
    // No API key variable travels: the worker takes it from its own configuration
    // (`crate::pool`). A message from an older coordinator that still carries
    // `api_key_env` decodes, the field ignored.
    /// Per-call timeout in milliseconds.
    pub timeout_ms: u64,
}

impl Job {
    pub fn new(run: Uuid, pool: impl Into<String>, key: JobKey, timeout_ms: u64) -> Job {
        Job { v: crate::WIRE_VERSION, id: key.id(), run, pool: pool.into(), key, timeout_ms }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> JobKey {
        JobKey {
            pipeline: "hypotermqa".into(),
            stage: "answer".into(),
            stage_version: 1,
            model: ModelRef {
                backend: "openai".into(),
                endpoint: "http://x/v1".into(),
                model: "m".into(),
            },
            messages: vec![ChatMessage::user("What is X?")],
            sampling: Sampling::default(),
            sample_index: 0,
        }
    }

    /// Same inputs give the same id; every field that determines the result changes it.
    #[test]
    fn id_is_a_content_hash() {
        let a = key();
        assert_eq!(a.id(), key().id());
        type Mutation = Box<dyn Fn(&mut JobKey)>;
        let variants: Vec<Mutation> = vec![
            Box::new(|k| k.pipeline.push('x')),
            Box::new(|k| k.stage.push('x')),
            Box::new(|k| k.stage_version += 1),
            Box::new(|k| k.model.backend.push('x')),
            Box::new(|k| k.model.endpoint.push('x')),
            Box::new(|k| k.model.model.push('x')),
            Box::new(|k| k.messages[0].content.push('x')),
            Box::new(|k| k.messages[0].role = Role::System),
            Box::new(|k| k.messages.push(ChatMessage::user(""))),
            Box::new(|k| k.sampling.temperature = 0.7),
            Box::new(|k| k.sampling.max_tokens = Some(5)),
            Box::new(|k| k.sampling.seed = Some(1)),
            Box::new(|k| k.sample_index = 1),
            Box::new(|k| k.sampling.top_p = Some(0.9)),
            Box::new(|k| k.sampling.top_k = Some(5)),
            Box::new(|k| k.sampling.logprobs = Some(LogprobsRequest { top: 5, score_last: false })),
            Box::new(|k| k.sampling.logprobs = Some(LogprobsRequest { top: 0, score_last: false })),
            Box::new(|k| k.sampling.logprobs = Some(LogprobsRequest { top: 5, score_last: true })),
            Box::new(|k| {
                k.sampling.top_p = Some(0.9);
                k.sampling.top_k = Some(5);
            }),
            Box::new(|k| k.sampling.json_schema = Some(schema("j", "{}").into())),
            Box::new(|k| k.sampling.json_schema = Some(schema("k", "{}").into())),
            Box::new(|k| {
                k.sampling.json_schema = Some(schema("j", "{\"type\":\"object\"}").into())
            }),
            Box::new(|k| k.sampling.stop = vec!["\n\n".into()]),
            Box::new(|k| k.sampling.stop = vec!["\n".into(), "\n".into()]),
            Box::new(|k| k.sampling.stop = vec!["ab".into()]),
            Box::new(|k| k.sampling.stop = vec!["a".into(), "b".into()]),
        ];
        let mut seen = std::collections::HashSet::new();
        seen.insert(a.id());
        for v in variants {
            let mut k = key();
            v(&mut k);
            assert!(seen.insert(k.id()), "collision for {k:?}");
        }
    }

    /// Field boundaries are unambiguous: moving text between fields changes the id.
    #[test]
    fn no_concatenation_ambiguity() {
        let mut a = key();
        a.pipeline = "ab".into();
        a.stage = "c".into();
        let mut b = key();
        b.pipeline = "a".into();
        b.stage = "bc".into();
        assert_ne!(a.id(), b.id());
    }

    fn schema(name: &str, schema: &str) -> OutputSchema {
        OutputSchema { name: name.into(), schema: schema.into() }
    }

    /// Pinned value: a change to the hashing breaks every checkpoint, so it must be deliberate.
    /// (The value was pinned before `json_schema` existed: a key without it keeps its id.)
    #[test]
    fn id_is_stable_across_releases() {
        let pinned = key().id().to_string();
        assert_eq!(pinned.len(), 32);
        assert_eq!(pinned, PINNED);
    }
    const PINNED: &str = "a96905e201fa7b6d63263fa7976bcca5";

    /// Issue 45: a structured-output job is another job (another id), and the schema goes
    /// on the wire only when set: a job without one encodes to the bytes it had before.
    #[test]
    fn json_schema_is_identity_only_when_set() {
        let mut k = key();
        k.sampling.json_schema = Some(schema("judge", "{\"type\":\"object\"}").into());
        assert_ne!(k.id().to_string(), PINNED);
        let back: Sampling =
            crate::decode("sampling", &crate::encode(&k.sampling).unwrap()).unwrap();
        assert_eq!(back, k.sampling);
        let plain = crate::encode(&key().sampling).unwrap();
        assert!(!plain.windows(11).any(|w| w == b"json_schema"));
    }

    /// Issue 13: a job from an older coordinator that names an API key variable decodes,
    /// and the variable goes nowhere (the worker's configuration names the key).
    #[test]
    fn api_key_env_on_the_wire_is_ignored() {
        #[derive(Serialize)]
        struct OldJob {
            v: u16,
            id: JobId,
            run: Uuid,
            pool: String,
            key: JobKey,
            api_key_env: Option<String>,
            timeout_ms: u64,
        }
        let new = Job::new(Uuid::nil(), "p", key(), 5);
        let old = OldJob {
            v: new.v,
            id: new.id,
            run: new.run,
            pool: new.pool.clone(),
            key: new.key.clone(),
            api_key_env: Some("HALYARD_NATS_PASSWORD".into()),
            timeout_ms: 5,
        };
        let bytes = crate::encode(&old).unwrap();
        let back: Job = crate::decode("job", &bytes).unwrap();
        assert_eq!(back, new);
        assert!(!crate::encode(&back).unwrap().windows(11).any(|w| w == b"api_key_env"));
    }

    /// Issue 16: the optional sampling fields are left off the wire when unset, so a job
    /// encoded by an earlier release decodes unchanged and re-encodes to the same bytes.
    #[test]
    fn unset_additions_leave_the_wire_unchanged() {
        #[derive(Serialize)]
        struct OldSampling {
            temperature: f32,
            max_tokens: Option<u32>,
            seed: Option<u64>,
        }
        let old = OldSampling { temperature: 0.5, max_tokens: Some(3), seed: None };
        let bytes = crate::encode(&old).unwrap();
        let new: Sampling = crate::decode("sampling", &bytes).unwrap();
        assert_eq!(new, Sampling { temperature: 0.5, max_tokens: Some(3), ..Sampling::default() });
        assert_eq!(crate::encode(&new).unwrap(), bytes);
        let mut set = new.clone();
        set.top_k = Some(5);
        let back: Sampling = crate::decode("sampling", &crate::encode(&set).unwrap()).unwrap();
        assert_eq!(back, set);
    }
}

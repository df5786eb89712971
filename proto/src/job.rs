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

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    pub temperature: f32,
    pub max_tokens: Option<u32>,
    pub seed: Option<u64>,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling { temperature: 0.0, max_tokens: None, seed: None }
    }
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
    /// Name of the environment variable holding the API key, read by the worker.
    /// The key itself never travels.
    pub api_key_env: Option<String>,
    /// Per-call timeout in milliseconds.
    pub timeout_ms: u64,
}

impl Job {
    pub fn new(run: Uuid, pool: impl Into<String>, key: JobKey, api_key_env: Option<String>, timeout_ms: u64) -> Job {
        Job { v: crate::WIRE_VERSION, id: key.id(), run, pool: pool.into(), key, api_key_env, timeout_ms }
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
            model: ModelRef { backend: "openai".into(), endpoint: "http://x/v1".into(), model: "m".into() },
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

    /// Pinned value: a change to the hashing breaks every checkpoint, so it must be deliberate.
    #[test]
    fn id_is_stable_across_releases() {
        let pinned = key().id().to_string();
        assert_eq!(pinned.len(), 32);
        assert_eq!(pinned, PINNED);
    }
    const PINNED: &str = "a96905e201fa7b6d63263fa7976bcca5";
}

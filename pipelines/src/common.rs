//! What every pipeline shares with the coordinator: models, job requests, known
//! results and the planner's answer.
//!
//! A pipeline's planner is a pure function `evaluate(config, item, results) ->
//! Plan<Label>`. The coordinator calls it again whenever a result arrives; the
//! planner recomputes everything from the results it is shown, so it is deterministic
//! and idempotent, and it never needs its own state. A job is identified by the content
//! hash of its [`JobKey`], so asking for the same job twice is harmless.

use std::collections::{BTreeMap, HashMap};

use halyard_proto::{
    AnswerKind, ChatMessage, Completion, JobId, JobKey, ModelRef, Outcome, OutputSchema, Sampling,
};
use serde::{Deserialize, Serialize};

/// A model as the pipelines see it (built by the coordinator from the sweep).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelSpec {
    /// The sweep's alias for the model (reports use it; job ids do not).
    pub name: String,
    pub model_ref: ModelRef,
    /// The pool whose workers run this model's jobs.
    pub pool: String,
    /// Name of the environment variable holding the API key (never the key).
    pub api_key_env: Option<String>,
    pub temperature: f32,
    pub max_tokens: Option<u32>,
    pub seed: Option<u64>,
    /// Per-call timeout in milliseconds.
    pub timeout_ms: u64,
    /// `structured_output = true` (issue 45): a judge call whose pipeline expects a JSON
    /// object carries that object's schema ([`ModelSpec::judge_request`]), which the
    /// backend enforces. Left out of the serialized spec when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub structured_output: bool,
}

impl ModelSpec {
    /// The sampling parameters of every call to this model.
    pub fn sampling(&self) -> Sampling {
        Sampling {
            temperature: self.temperature,
            max_tokens: self.max_tokens,
            seed: self.seed,
            ..Sampling::default()
        }
    }

    /// A request for one call to this model.
    pub fn request(
        &self,
        pipeline: &str,
        stage: &str,
        stage_version: u32,
        messages: Vec<ChatMessage>,
        sample_index: u32,
    ) -> JobRequest {
        JobRequest {
            key: JobKey {
                pipeline: pipeline.to_string(),
                stage: stage.to_string(),
                stage_version,
                model: self.model_ref.clone(),
                messages,
                sampling: self.sampling(),
                sample_index,
            },
            pool: self.pool.clone(),
            api_key_env: self.api_key_env.clone(),
            timeout_ms: self.timeout_ms,
        }
    }
}

impl ModelSpec {
    /// A request for one judge call whose output should be the JSON object `schema`
    /// describes: with `structured_output` the request carries the schema (a job of its
    /// own, another id); without it, the request is exactly [`ModelSpec::request`]'s, so
    /// every job planned before structured output existed keeps its id.
    pub fn judge_request(
        &self,
        pipeline: &str,
        stage: &str,
        stage_version: u32,
        messages: Vec<ChatMessage>,
        sample_index: u32,
        schema: impl FnOnce() -> OutputSchema,
    ) -> JobRequest {
        let mut req = self.request(pipeline, stage, stage_version, messages, sample_index);
        if self.structured_output {
            req.key.sampling.json_schema = Some(Box::new(schema()));
        }
        req
    }
}

/// One string field of a judge's JSON object (see [`string_object_schema`]).
#[derive(Clone, Copy, Debug)]
pub enum Field<'a> {
    /// Free text of at most this many characters (`maxLength`), or unbounded.
    Text(Option<u32>),
    /// One of these values (`enum`).
    OneOf(&'a [&'a str]),
}

/// The JSON schema of a flat object of string fields, in the order given: what a judge
/// prompt that shows a JSON template asks for. Every field is required and no other is
/// allowed (the form OpenAI's strict structured outputs require); the text is compact
/// and its keys keep this order, which is the order a constrained model writes them in.
pub fn string_object_schema(name: &str, fields: &[(&str, Field<'_>)]) -> OutputSchema {
    let q = |s: &str| serde_json::Value::String(s.to_string()).to_string();
    let props: Vec<String> = fields
        .iter()
        .map(|(f, field)| match field {
            Field::Text(None) => format!("{}:{{\"type\":\"string\"}}", q(f)),
            Field::Text(Some(n)) => {
                format!("{}:{{\"type\":\"string\",\"maxLength\":{n}}}", q(f))
            }
            Field::OneOf(v) => format!(
                "{}:{{\"type\":\"string\",\"enum\":[{}]}}",
                q(f),
                v.iter().map(|x| q(x)).collect::<Vec<_>>().join(",")
            ),
        })
        .collect();
    let required: Vec<String> = fields.iter().map(|(f, _)| q(f)).collect();
    OutputSchema {
        name: name.to_string(),
        schema: format!(
            "{{\"type\":\"object\",\"properties\":{{{}}},\"required\":[{}],\"additionalProperties\":false}}",
            props.join(","),
            required.join(",")
        ),
    }
}

/// A job the pipeline needs: the coordinator turns it into a `proto::Job`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRequest {
    pub key: JobKey,
    pub pool: String,
    pub api_key_env: Option<String>,
    pub timeout_ms: u64,
}

impl JobRequest {
    /// The job's content-hash id.
    pub fn id(&self) -> JobId {
        self.key.id()
    }
}

/// What the coordinator knows about a finished job.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum JobOutcome<'a> {
    Done(&'a Completion),
    /// A dead letter, with its last error.
    Failed(&'a str),
}

/// The results known so far, by job id.
pub trait ResultLookup {
    /// `None` while the job has no terminal result.
    fn get(&self, id: &JobId) -> Option<JobOutcome<'_>>;
}

fn outcome_ref(o: &Outcome) -> JobOutcome<'_> {
    match o {
        Outcome::Done(c) => JobOutcome::Done(c),
        Outcome::Failed(f) => JobOutcome::Failed(&f.error),
    }
}

impl ResultLookup for HashMap<JobId, Outcome> {
    fn get(&self, id: &JobId) -> Option<JobOutcome<'_>> {
        HashMap::get(self, id).map(outcome_ref)
    }
}

impl ResultLookup for BTreeMap<JobId, Outcome> {
    fn get(&self, id: &JobId) -> Option<JobOutcome<'_>> {
        BTreeMap::get(self, id).map(outcome_ref)
    }
}

/// A completion's kind when it is not an answer in words (issue 29): an empty answer or a
/// structured refusal. `None` for text. Every pipeline records it beside the output it
/// read and counts it in its report.
pub fn odd_kind(c: &Completion) -> Option<AnswerKind> {
    match c.kind() {
        AnswerKind::Text => None,
        k => Some(k),
    }
}

/// How many outputs of some kind were empty or refusals (issue 29): the count every report
/// shows beside the figure those outputs fed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OddCounts {
    pub empty: u64,
    pub refusal: u64,
}

impl OddCounts {
    /// Count one output of kind `k` (`None`: text, not counted).
    pub fn add(&mut self, k: Option<AnswerKind>) {
        match k {
            Some(AnswerKind::Empty) => self.empty += 1,
            Some(AnswerKind::Refusal) => self.refusal += 1,
            Some(AnswerKind::Text) | None => {}
        }
    }

    pub fn total(&self) -> u64 {
        self.empty.saturating_add(self.refusal)
    }

    /// "3 empty, 1 refusal" (or "none").
    pub fn describe(&self) -> String {
        if self.total() == 0 {
            "none".into()
        } else {
            format!("{} empty, {} refusal", self.empty, self.refusal)
        }
    }
}

/// The planner's answer for one item: the plan of what it still needs, or its label.
/// (Called `Plan`, not `Progress`: the coordinator's `Progress` is a run's live figures.)
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Plan<T> {
    /// Jobs needed now whose results are not known yet (several may run in parallel);
    /// never empty.
    Waiting(Vec<JobRequest>),
    /// Every result needed is known: the item's final label.
    Done(T),
}

impl<T> Plan<T> {
    /// The final value, if done.
    pub fn done(self) -> Option<T> {
        match self {
            Plan::Done(t) => Some(t),
            Plan::Waiting(_) => None,
        }
    }
}

/// A model for unit tests: OpenAI backend at a dummy endpoint, pool = name.
#[cfg(test)]
pub(crate) fn test_model(name: &str) -> ModelSpec {
    ModelSpec {
        name: name.into(),
        model_ref: ModelRef {
            backend: "openai".into(),
            endpoint: "http://x".into(),
            model: name.into(),
        },
        pool: name.into(),
        api_key_env: None,
        temperature: 0.0,
        max_tokens: None,
        seed: None,
        timeout_ms: 1000,
        structured_output: false,
    }
}

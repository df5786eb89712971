//! What a worker publishes back: a [`JobResult`].

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::id::JobId;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Every token of the prompt, cached ones included (Anthropic's `input_tokens` +
    /// `cache_creation_input_tokens` + `cache_read_input_tokens`).
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Prompt caching (issue 52): the part of `prompt_tokens` written to or read from the
    /// provider's prompt cache, each billed at its own rate. Last, and left out when
    /// absent, so that records written before it read as uncached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheUsage>,
}

impl Usage {
    /// Prompt and completion tokens, nothing cached.
    pub fn new(prompt_tokens: u64, completion_tokens: u64) -> Usage {
        Usage { prompt_tokens, completion_tokens, cache: None }
    }

    /// Prompt tokens billed at the plain input rate: neither written to nor read from
    /// the cache.
    pub fn uncached_prompt_tokens(&self) -> u64 {
        let c = self.cache.unwrap_or_default();
        self.prompt_tokens
            .saturating_sub(c.write_5m)
            .saturating_sub(c.write_1h)
            .saturating_sub(c.read)
    }
}

/// Output tokens a request without `max_tokens` is taken to produce at the most: far
/// beyond any model's output limit, far below what would overflow a quota or a total.
pub const MAX_COMPLETION_TOKENS: u64 = 1 << 20;
/// Tokens a chat template may add per message, and per request, beyond the bytes of the
/// messages (a byte-level tokenizer never makes more tokens than bytes).
const TEMPLATE_TOKENS_PER_MESSAGE: u64 = 16;
const TEMPLATE_TOKENS: u64 = 64;

/// The most usage a job's request could take (issues 33 and 49): prompt tokens at most the
/// bytes of its messages plus the chat template's allowance, completion tokens at most its
/// `max_tokens` (else [`MAX_COMPLETION_TOKENS`]), the prompt cache's parts within the
/// prompt. The worker clamps what an API reports to it, and the coordinator what a result
/// claims (anyone with a worker credential may publish one): one bound, both sides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UsageBound {
    pub prompt: u64,
    pub completion: u64,
}

impl UsageBound {
    /// For a result whose job is not known: a million tokens each way.
    pub const CEILING: UsageBound =
        UsageBound { prompt: MAX_COMPLETION_TOKENS, completion: MAX_COMPLETION_TOKENS };

    pub fn of(key: &crate::job::JobKey) -> UsageBound {
        let prompt = key
            .messages
            .iter()
            .map(|m| (m.content.len() as u64).saturating_add(TEMPLATE_TOKENS_PER_MESSAGE))
            .fold(TEMPLATE_TOKENS, u64::saturating_add);
        let completion = key.sampling.max_tokens.map_or(MAX_COMPLETION_TOKENS, u64::from);
        UsageBound { prompt, completion }
    }

    /// Clamp each count of `u` to this bound (cached prompt tokens each at most what is
    /// left of the prompt); whether anything was clamped.
    pub fn clamp(&self, u: &mut Usage) -> bool {
        let mut clamped = u.prompt_tokens > self.prompt || u.completion_tokens > self.completion;
        u.prompt_tokens = u.prompt_tokens.min(self.prompt);
        u.completion_tokens = u.completion_tokens.min(self.completion);
        if let Some(c) = &mut u.cache {
            let mut left = u.prompt_tokens;
            for n in [&mut c.read, &mut c.write_5m, &mut c.write_1h] {
                clamped |= *n > left;
                *n = (*n).min(left);
                left -= *n;
            }
        }
        clamped
    }
}

/// Prompt tokens a call wrote to the provider's prompt cache (by the entry's lifetime:
/// 5 minutes or 1 hour are priced differently) and read from it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheUsage {
    pub write_5m: u64,
    pub write_1h: u64,
    pub read: u64,
}

/// A successful model call, as checkpointed by the worker.
///
/// Serialized by hand (see the `Serialize` impl below) so that [`Completion::source`],
/// after [`Completion::refusal`], can be written by position: `refusal` is then written
/// even when false.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Completion {
    pub text: String,
    pub usage: Usage,
    pub latency_ms: u64,
    pub finish_reason: Option<String>,
    /// HTTP attempts (or engine calls) spent to obtain it, retries included.
    pub calls: u32,
    /// Per-token log-probabilities, when the job asked for them and the backend gave them
    /// (see [`crate::LogprobsRequest`]); `None` otherwise. Always written (as nil when
    /// absent): the stores write fields by position, and [`Completion::refusal`] follows.
    #[serde(default)]
    pub logprobs: Option<Vec<TokenLogprob>>,
    /// The API said the model refused (`message.refusal` instead of `content`): `text` is
    /// the refusal's wording, not an answer. Pipelines count refusals as their own class
    /// (issue 29); backends without structured refusals leave it false, and a refusal in
    /// plain words is the pipeline's to recognise. Last, and left out when false, so that
    /// records written before it read as not refused.
    #[serde(default)]
    pub refusal: bool,
    /// Where this run got the answer (issue 51): paid for by a call, or answered from the
    /// machine's or the broker's result cache (no call, nothing paid this run). Set by the
    /// worker when its cache answers; kept in its checkpoint, so a redelivery answered
    /// from the checkpoint says the same. Last, and left out when [`AnswerSource::Paid`],
    /// so that records written before it read as paid and a paid record's bytes are
    /// unchanged.
    #[serde(default)]
    pub source: AnswerSource,
}

/// Where a run got a completion's answer (see [`Completion::source`]). A checkpoint
/// replay keeps the source of the answer it replays: the checkpoint is the run's own
/// record of what it paid for or read from a cache ([`JobResult::cached`] says that a
/// result was replayed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnswerSource {
    /// A backend call made for this job (the default: every record before issue 51).
    #[default]
    Paid,
    /// The result cache on the worker's machine.
    MachineCache,
    /// The result cache on the broker, shared by the machines of a cluster.
    SharedCache,
}

impl AnswerSource {
    /// Answered from a result cache: no call, nothing paid.
    pub fn is_cache(self) -> bool {
        self != AnswerSource::Paid
    }
}

impl Serialize for Completion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        // The stores write fields by position: a field may be left out only when every
        // field after it is too. `refusal` is left out when false and no source follows.
        let sourced = self.source.is_cache();
        let refusal = self.refusal || sourced;
        let n = 6 + usize::from(refusal) + usize::from(sourced);
        let mut st = s.serialize_struct("Completion", n)?;
        st.serialize_field("text", &self.text)?;
        st.serialize_field("usage", &self.usage)?;
        st.serialize_field("latency_ms", &self.latency_ms)?;
        st.serialize_field("finish_reason", &self.finish_reason)?;
        st.serialize_field("calls", &self.calls)?;
        st.serialize_field("logprobs", &self.logprobs)?;
        if refusal {
            st.serialize_field("refusal", &self.refusal)?;
        } else {
            st.skip_field("refusal")?;
        }
        if sourced {
            st.serialize_field("source", &self.source)?;
        } else {
            st.skip_field("source")?;
        }
        st.end()
    }
}

impl Completion {
    /// What kind of answer this is: a structured refusal, an empty answer (nothing but
    /// white space), or text. Every pipeline reads answers through this, so an empty
    /// answer or a refusal is never scored as if it were an answer without being counted.
    pub fn kind(&self) -> AnswerKind {
        if self.refusal {
            AnswerKind::Refusal
        } else if self.text.trim().is_empty() {
            AnswerKind::Empty
        } else {
            AnswerKind::Text
        }
    }
}

/// What a completion holds (see [`Completion::kind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnswerKind {
    Text,
    /// An empty answer (`""` or only white space).
    Empty,
    /// A structured refusal from the API (`message.refusal`).
    Refusal,
}

/// One token of a completion with its natural-log probability and, when asked, the most
/// likely alternatives at its position (which may include the token itself).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top: Vec<TopLogprob>,
}

/// An alternative token at a position, with its natural-log probability.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The request can never succeed (HTTP 400/401/403/404/422, unknown model...).
    Permanent,
    /// Transient failures until the delivery budget (`max_deliver`) ran out.
    Exhausted,
    /// A worker refused the message: its id is not its key's hash, or its model is not
    /// one the worker was configured with for the pool (see `pool::WorkerPlan::admit`).
    /// Reported so the run can count it, but **never the job's outcome**: a forged
    /// message may carry a real job's id, so a coordinator must not let a refusal stand
    /// for (or overwrite) the result of the job whose id it names.
    Refused,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub kind: FailureKind,
    pub error: String,
    pub http_status: Option<u16>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Done(Completion),
    /// A dead letter: the job is terminal without a completion.
    Failed(Failure),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobResult {
    pub v: u16,
    pub job: JobId,
    pub run: Uuid,
    pub outcome: Outcome,
    /// JetStream deliveries of the job when this result was produced.
    pub deliveries: u64,
    /// Which worker produced it.
    pub worker: String,
    /// True when served from the worker's checkpoint (no model call).
    pub cached: bool,
}

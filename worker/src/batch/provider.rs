//! The provider seam of batch pools: what the durable machine of [`super`] asks of a
//! provider's batch API (prepare the requests, create, look for a batch a dead owner may
//! have created, poll, read the results), one implementation per API:
//!
//! - [`Provider::OpenAi`]: the OpenAI batch API ([`super::api::BatchApi`], unchanged): a
//!   JSONL input file uploaded first, the batch created from it with the record's key in
//!   its metadata, found again by that metadata, answered in output and error files.
//! - [`Provider::Anthropic`]: Anthropic's Message Batches
//!   ([`super::anthropic::AnthropicBatches`]): the requests go inline in the create, so
//!   the "upload" is a local step that records when the create is about to be sent; the
//!   batch has no metadata, so a taker finds it by its request count and creation time
//!   among the batches no other record names; answered in one results file.
//!
//! The machine's states (`uploading` → `uploaded` → `submitted` → `ended`) are the same
//! for both: each is recorded before the next provider step.

use std::collections::HashSet;

use halyard_proto::pool::HttpModelSpec;
use halyard_proto::provider_batch::BatchRecord;
use halyard_proto::Job;

use super::anthropic::{AnthropicBatches, Wanted};
use super::api::BatchApi;
use super::machine::Polled;
use super::output::Reader;
use crate::backend::CallError;

/// The "file" an Anthropic record names once the create is about to be sent:
/// `inline-<unix ms>` (the requests travel with the create; the time bounds the
/// batch's `created_at` for a taker).
const INLINE: &str = "inline-";

/// A batch pool model's batch API.
#[derive(Clone)]
pub(crate) enum Provider {
    OpenAi(BatchApi),
    Anthropic(AnthropicBatches),
}

/// What a taker needs to look for a batch its previous owner may have created.
pub(crate) struct FindFor<'a> {
    pub record: &'a BatchRecord,
    /// The file the record names (`uploaded`).
    pub file: &'a str,
    /// Batches created before this (unix s) are not looked at (OpenAI).
    pub since_s: u64,
    /// The batch ids other records of the pool name (Anthropic).
    pub taken: &'a HashSet<String>,
}

impl Provider {
    /// The batch API of `model`'s backend.
    pub fn new(model: HttpModelSpec) -> Result<Provider, CallError> {
        match model.backend.as_str() {
            "anthropic" => Ok(Provider::Anthropic(AnthropicBatches::new(model)?)),
            _ => Ok(Provider::OpenAi(BatchApi::new(model)?)),
        }
    }

    pub fn model(&self) -> &HttpModelSpec {
        match self {
            Provider::OpenAi(a) => a.model(),
            Provider::Anthropic(a) => a.model(),
        }
    }

    /// The requests travel with the create (no file at the provider): a taker cannot
    /// create a batch its previous owner gathered.
    pub fn inline(&self) -> bool {
        matches!(self, Provider::Anthropic(_))
    }

    /// Largest body of one batch (bytes), if the API has a limit the gatherer keeps to.
    pub fn max_body_bytes(&self) -> Option<u64> {
        match self {
            Provider::OpenAi(_) => None,
            Provider::Anthropic(_) => Some(super::anthropic::MAX_BODY_BYTES),
        }
    }

    /// Most requests in one batch.
    pub fn max_requests(&self) -> usize {
        match self {
            Provider::OpenAi(_) => usize::MAX,
            Provider::Anthropic(_) => super::anthropic::MAX_REQUESTS,
        }
    }

    /// One request of the batch: `custom_id` = job id, the request as sent online.
    pub fn request_line(&self, job: &Job) -> Result<Vec<u8>, CallError> {
        match self {
            Provider::OpenAi(a) => request_line(job, a.model()),
            Provider::Anthropic(a) => {
                let params = crate::backend::anthropic::request_json(job, a.model())?;
                let mut line = Vec::with_capacity(params.len() + 64);
                line.extend_from_slice(br#"{"custom_id":""#);
                line.extend_from_slice(job.id.to_string().as_bytes());
                line.extend_from_slice(br#"","params":"#);
                line.extend_from_slice(params.as_bytes());
                line.push(b'}');
                Ok(line)
            }
        }
    }

    /// The bytes sent for the requests `lines`: OpenAI's JSONL input file, Anthropic's
    /// create body.
    pub fn body(&self, lines: &[Vec<u8>]) -> Vec<u8> {
        let size: usize = lines.iter().map(|l| l.len() + 1).sum();
        match self {
            Provider::OpenAi(_) => {
                let mut body = Vec::with_capacity(size);
                for l in lines {
                    body.extend_from_slice(l);
                    body.push(b'\n');
                }
                body
            }
            Provider::Anthropic(_) => {
                let mut body = Vec::with_capacity(size + 16);
                body.extend_from_slice(br#"{"requests":["#);
                for (i, l) in lines.iter().enumerate() {
                    if i > 0 {
                        body.push(b',');
                    }
                    body.extend_from_slice(l);
                }
                body.extend_from_slice(b"]}");
                body
            }
        }
    }

    /// Put the requests where the create takes them from: the file id (OpenAI's
    /// upload), or `inline-<now ms>` (Anthropic's are sent with the create).
    pub async fn upload(&self, name: &str, body: &[u8], now_ms: u64) -> Result<String, CallError> {
        match self {
            Provider::OpenAi(a) => a.upload(name, body.to_vec()).await,
            Provider::Anthropic(_) => Ok(format!("{INLINE}{now_ms}")),
        }
    }

    /// Create the batch; its id. `body` is the requests (needed inline by Anthropic; a
    /// taker has none).
    pub async fn create(
        &self,
        file: &str,
        record_key: &str,
        body: Option<&[u8]>,
    ) -> Result<String, CallError> {
        match self {
            Provider::OpenAi(a) => Ok(a.create(file, record_key).await?.id),
            Provider::Anthropic(a) => {
                let Some(body) = body else {
                    return Err(CallError::permanent(
                        "the batch's requests are gone with its previous owner (Message \
                         Batches take them inline): it cannot be created here",
                    ));
                };
                Ok(a.create(body.to_vec()).await?.id)
            }
        }
    }

    /// The batch a dead owner created for the record, if the provider has one.
    pub async fn find(&self, f: &FindFor<'_>) -> Result<Option<String>, CallError> {
        match self {
            Provider::OpenAi(a) => Ok(a.find(&f.record.key(), f.since_s).await?.map(|b| b.id)),
            Provider::Anthropic(a) => {
                let from_ms = f
                    .file
                    .strip_prefix(INLINE)
                    .and_then(|ms| ms.parse::<u64>().ok())
                    .unwrap_or(f.record.created_ms);
                let w = Wanted { requests: f.record.jobs.len() as u64, from_ms, taken: f.taken };
                Ok(a.find(&w).await?.map(|b| b.id))
            }
        }
    }

    /// The batch as it stands.
    pub async fn poll(&self, batch: &str) -> Result<Polled, CallError> {
        match self {
            Provider::OpenAi(a) => {
                let b = a.retrieve(batch).await?;
                Ok(Polled {
                    ended: b.is_final(),
                    reason: b.failure_reason(),
                    id: b.id,
                    status: b.status,
                    output: b.output_file_id,
                    error: b.error_file_id,
                })
            }
            Provider::Anthropic(a) => {
                let b = a.retrieve(batch).await?;
                let ended = b.is_final();
                Ok(Polled {
                    ended,
                    // The counts say what the results hold; a batch does not fail whole.
                    reason: ended.then(|| b.counts_text()),
                    // The results are read by the batch's id (see `AnthropicBatches`).
                    output: (ended && b.results_url.is_some()).then(|| b.id.clone()),
                    error: None,
                    status: b.processing_status,
                    id: b.id,
                })
            }
        }
    }

    /// Read an ended batch's answers into `reader`: each of its files in turn.
    pub async fn read_answers(
        &self,
        output: Option<&str>,
        error: Option<&str>,
        reader: &mut Reader<'_>,
    ) -> Result<(), CallError> {
        for f in [output, error].into_iter().flatten() {
            reader.next_file();
            match self {
                Provider::OpenAi(a) => a.content_lines(f, |l| reader.line(l)).await?,
                Provider::Anthropic(a) => a.results_lines(f, |l| reader.line(l)).await?,
            }
        }
        Ok(())
    }
}

/// One line of a batch's input file: `custom_id` = job id, the request as online.
fn request_line(job: &Job, model: &HttpModelSpec) -> Result<Vec<u8>, CallError> {
    // The body as sent online (a structured-output job's schema with its keys in order);
    // the fields in the order `json!` wrote them before (sorted), so lines are unchanged.
    #[derive(serde::Serialize)]
    struct Line<'a> {
        body: &'a serde_json::value::RawValue,
        custom_id: String,
        method: &'static str,
        url: &'static str,
    }
    let body = crate::backend::openai::request_json(job, model)?;
    let line = Line {
        body: &body,
        custom_id: job.id.to_string(),
        method: "POST",
        url: "/v1/chat/completions",
    };
    serde_json::to_vec(&line)
        .map_err(|e| CallError::permanent(format!("cannot encode the request: {e}")))
}

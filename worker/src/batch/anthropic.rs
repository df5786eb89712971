//! Anthropic's Message Batches API (issue 52): `POST {base}/messages/batches` with the
//! requests inline (`{"requests": [{"custom_id", "params"}]}`), `GET
//! {base}/messages/batches/{id}` (`processing_status` `in_progress` | `canceling` |
//! `ended`, `request_counts`), `GET {base}/messages/batches?limit=&after_id=` (newest
//! first) and the results, a JSONL file with
//! one `{"custom_id", "result": {"type": "succeeded" | "errored" | "canceled" |
//! "expired", …}}` per request, streamed a line at a time.
//!
//! The results are read from `{base}/messages/batches/{id}/results`, the endpoint the API
//! reference documents, not from the batch's `results_url` as given: the key goes only to
//! the model's own host, whatever an answer names. A `results_url` is only the sign that
//! the results are there.
//!
//! Unlike OpenAI's, a batch here has no metadata: the record's key cannot be put on it.
//! How a taker finds a batch its previous owner may have created is [`AnthropicBatches::find`]
//! (see the book's Batch mode page).

use std::time::Duration;

use halyard_proto::pool::HttpModelSpec;
use halyard_proto::redact;
use serde::Deserialize;

use super::api::{plain_id, stream_lines, FileLine, MAX_FILE_BYTES};
use crate::backend::anthropic::Anthropic;
use crate::backend::openai::{retry_after_of, status_error, transport_error};
use crate::backend::CallError;

/// Most requests in one Message Batch (the API's limit).
pub const MAX_REQUESTS: usize = 100_000;

/// Largest create request (the API's limit: 256 MB).
pub const MAX_BODY_BYTES: u64 = 256_000_000;

/// Per-request timeout (a create of a large batch included).
const TIMEOUT: Duration = Duration::from_secs(300);

/// How far back a taker looks for a batch it may have created (pages of 100).
const FIND_PAGES: usize = 20;

/// How far a provider's clock may be from ours when a taker matches `created_at`.
pub const CLOCK_SKEW_MS: u64 = 60_000;

/// A Message Batch as the API describes it (the fields Halyard reads).
#[derive(Clone, Debug, Deserialize)]
pub struct MessageBatch {
    pub id: String,
    pub processing_status: String,
    #[serde(default)]
    pub request_counts: Option<RequestCounts>,
    /// RFC 3339.
    #[serde(default)]
    pub created_at: Option<String>,
    #[serde(default)]
    pub results_url: Option<String>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct RequestCounts {
    #[serde(default)]
    pub processing: u64,
    #[serde(default)]
    pub succeeded: u64,
    #[serde(default)]
    pub errored: u64,
    #[serde(default)]
    pub canceled: u64,
    #[serde(default)]
    pub expired: u64,
}

impl RequestCounts {
    pub fn total(&self) -> u64 {
        self.processing + self.succeeded + self.errored + self.canceled + self.expired
    }
}

impl MessageBatch {
    /// The provider is done with the batch: no request of it will run any more.
    pub fn is_final(&self) -> bool {
        self.processing_status == "ended"
    }

    /// `created_at` as unix milliseconds (None: absent or unreadable).
    pub fn created_ms(&self) -> Option<u64> {
        use time::format_description::well_known::Rfc3339;
        let t = time::OffsetDateTime::parse(self.created_at.as_deref()?.trim(), &Rfc3339).ok()?;
        u64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
    }

    /// A readable summary of its request counts.
    pub fn counts_text(&self) -> String {
        match self.request_counts {
            Some(c) => format!(
                "{} succeeded, {} errored, {} canceled, {} expired, {} processing",
                c.succeeded, c.errored, c.canceled, c.expired, c.processing
            ),
            None => "no request counts".into(),
        }
    }
}

#[derive(Deserialize)]
struct BatchList {
    data: Vec<MessageBatch>,
    #[serde(default)]
    has_more: bool,
    #[serde(default)]
    last_id: Option<String>,
}

/// What a taker knows of a batch its previous owner may have created.
#[derive(Clone, Debug)]
pub struct Wanted<'a> {
    /// Requests in it.
    pub requests: u64,
    /// When the owner recorded that it was about to create it (unix ms).
    pub from_ms: u64,
    /// The batch ids other records of the pool name (never this record's).
    pub taken: &'a std::collections::HashSet<String>,
}

/// The batches whose `created_at` and request count match `w`, from one page.
pub fn candidates<'b>(page: &'b [MessageBatch], w: &Wanted<'_>) -> Vec<&'b MessageBatch> {
    let (lo, hi) = (
        w.from_ms.saturating_sub(CLOCK_SKEW_MS),
        w.from_ms + TIMEOUT.as_millis() as u64 + CLOCK_SKEW_MS,
    );
    page.iter()
        .filter(|b| b.created_ms().is_some_and(|t| (lo..=hi).contains(&t)))
        .filter(|b| b.request_counts.is_some_and(|c| c.total() == w.requests))
        .filter(|b| !w.taken.contains(&b.id))
        .collect()
}

/// The Message Batches endpoints of one model.
#[derive(Clone)]
pub struct AnthropicBatches {
    client: Anthropic,
    model: HttpModelSpec,
    max_file_bytes: u64,
}

impl AnthropicBatches {
    pub fn new(model: HttpModelSpec) -> Result<AnthropicBatches, CallError> {
        let client = Anthropic::new(16 << 20)?;
        Ok(AnthropicBatches { client, model, max_file_bytes: MAX_FILE_BYTES })
    }

    pub fn model(&self) -> &HttpModelSpec {
        &self.model
    }

    fn shown(&self, path: &str) -> String {
        redact::url(&format!("{}{path}", self.model.base_url.trim_end_matches('/')))
    }

    /// Send a request to `path`; a 2xx response, its body not read yet (an error status
    /// is read, up to 1 MiB, into its error).
    async fn response(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(reqwest::Response, String), CallError> {
        let what = format!("{method} {}", self.shown(path));
        let mut req = self.client.request(method, &self.model, path)?.timeout(TIMEOUT);
        if let Some(b) = body {
            req = req.body(b);
        }
        let resp = req.send().await.map_err(|e| transport_error(&what, "", &e))?;
        let status = resp.status().as_u16();
        if !(200..300).contains(&status) {
            let retry_after = retry_after_of(&resp);
            let bytes = crate::backend::http_guard::read_body(resp, 1 << 20, &what).await?;
            return Err(status_error(&what, status, &bytes, retry_after));
        }
        Ok((resp, what))
    }

    async fn json<T: serde::de::DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<T, CallError> {
        let (resp, what) = self.response(method, path, body).await?;
        let bytes = crate::backend::http_guard::read_body(resp, 16 << 20, &what).await?;
        serde_json::from_slice(&bytes).map_err(|e| {
            let start = redact::secrets(&String::from_utf8_lossy(&bytes[..bytes.len().min(200)]));
            CallError::transient(format!("{what}: unexpected answer ({e}); body starts: {start:?}"))
        })
    }

    /// Create a batch of `body` (`{"requests": […]}`, see [`super::provider`]).
    pub async fn create(&self, body: Vec<u8>) -> Result<MessageBatch, CallError> {
        if body.len() as u64 > MAX_BODY_BYTES {
            return Err(CallError::permanent(format!(
                "a Message Batch of {} bytes is over the API's {MAX_BODY_BYTES}",
                body.len()
            )));
        }
        self.json(reqwest::Method::POST, "/messages/batches", Some(body)).await
    }

    pub async fn retrieve(&self, batch: &str) -> Result<MessageBatch, CallError> {
        plain_id(batch)?;
        self.json(reqwest::Method::GET, &format!("/messages/batches/{batch}"), None).await
    }

    /// The batch a previous owner created for the record `w` describes, if exactly one
    /// batch matches (newest first, up to `FIND_PAGES` pages, stopping at batches created
    /// before the window). More than one match is an error: the provider's answer cannot
    /// tell which is this record's.
    pub async fn find(&self, w: &Wanted<'_>) -> Result<Option<MessageBatch>, CallError> {
        let mut after: Option<String> = None;
        let mut found: Vec<MessageBatch> = Vec::new();
        let oldest = w.from_ms.saturating_sub(CLOCK_SKEW_MS);
        for _ in 0..FIND_PAGES {
            let path = match &after {
                Some(a) => format!("/messages/batches?limit=100&after_id={a}"),
                None => "/messages/batches?limit=100".to_string(),
            };
            let page: BatchList = self.json(reqwest::Method::GET, &path, None).await?;
            found.extend(candidates(&page.data, w).into_iter().cloned());
            let older = page.data.iter().any(|b| b.created_ms().is_some_and(|t| t < oldest));
            if !page.has_more || older || page.data.is_empty() {
                break;
            }
            after = page.last_id.or_else(|| page.data.last().map(|b| b.id.clone()));
            if after.as_deref().is_none_or(|a| plain_id(a).is_err()) {
                return Err(CallError::transient(format!(
                    "GET {}: a batch id that cannot be a list cursor; cannot look further",
                    self.shown("/messages/batches")
                )));
            }
        }
        match found.len() {
            0 | 1 => Ok(found.pop()),
            n => Err(CallError::permanent(format!(
                "{n} batches ({}) match the record's request count and creation time; cannot \
                 tell which is its",
                found.iter().map(|b| b.id.as_str()).collect::<Vec<_>>().join(", ")
            ))),
        }
    }

    /// The results of an ended batch, streamed a line at a time into `each` (lines over
    /// [`super::api::MAX_LINE_BYTES`] by their length only); never held whole, and over
    /// `max_file_bytes` an error.
    pub async fn results_lines(
        &self,
        batch: &str,
        each: impl FnMut(FileLine<'_>),
    ) -> Result<(), CallError> {
        plain_id(batch)?;
        let (resp, what) = self
            .response(reqwest::Method::GET, &format!("/messages/batches/{batch}/results"), None)
            .await?;
        stream_lines(resp, &what, "the results", self.max_file_bytes, each).await
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn batch(id: &str, created: &str, total: u64) -> MessageBatch {
        MessageBatch {
            id: id.into(),
            processing_status: "in_progress".into(),
            request_counts: Some(RequestCounts { processing: total, ..Default::default() }),
            created_at: Some(created.into()),
            results_url: None,
        }
    }

    /// A taker's match: the request count, a creation time in the window (clock skew
    /// either side, the create's timeout after), and no batch another record names.
    #[test]
    fn candidates_match_count_time_and_exclude_known_batches() {
        // 2026-01-01T00:00:00Z
        let t0 = 1_767_225_600_000u64;
        let page = vec![
            batch("a", "2026-01-01T00:00:30Z", 10),
            batch("b", "2026-01-01T00:00:30Z", 11),
            batch("c", "2026-01-01T01:00:00Z", 10),
            batch("d", "2025-12-31T23:59:30.5Z", 10),
            batch("e", "not a time", 10),
        ];
        let none = HashSet::new();
        let w = Wanted { requests: 10, from_ms: t0, taken: &none };
        let ids: Vec<&str> = candidates(&page, &w).iter().map(|b| b.id.as_str()).collect();
        assert_eq!(ids, ["a", "d"]);
        let taken: HashSet<String> = ["a".to_string()].into();
        let w = Wanted { requests: 10, from_ms: t0, taken: &taken };
        let ids: Vec<&str> = candidates(&page, &w).iter().map(|b| b.id.as_str()).collect();
        assert_eq!(ids, ["d"]);
        assert_eq!(page[0].created_ms(), Some(t0 + 30_000));
        assert!(!page[0].is_final());
    }
}

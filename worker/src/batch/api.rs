//! An OpenAI-compatible batch API: `POST {base}/files` (multipart, `purpose=batch`),
//! `POST {base}/batches`, `GET {base}/batches/{id}`, `GET {base}/batches?after=…` and
//! `GET {base}/files/{id}/content`.
//!
//! Errors are classified as online calls' are (see [`crate::backend`]): a gateway error,
//! a refused connection or a timeout is the endpoint's and is retried by the batch's
//! owner; a 4xx other than 408/409/425/429 is permanent. The key is read from the
//! model's variable and goes only into the `Authorization` header; URLs in errors are
//! shown without credentials and error bodies with key-like text redacted.

use std::time::Duration;

use halyard_proto::pool::HttpModelSpec;
use halyard_proto::redact;
use serde::Deserialize;

use crate::backend::openai::{api_key, retry_after_of, status_error, transport_error};
use crate::backend::CallError;

/// A batch as the provider describes it (the fields Halyard reads).
#[derive(Clone, Debug, Deserialize)]
pub struct ProviderBatch {
    pub id: String,
    pub status: String,
    #[serde(default)]
    pub output_file_id: Option<String>,
    #[serde(default)]
    pub error_file_id: Option<String>,
    #[serde(default)]
    pub created_at: Option<u64>,
    /// Any JSON (values other than strings are someone else's; only the string under
    /// Halyard's key is read).
    #[serde(default)]
    pub metadata: Option<serde_json::Value>,
    /// Why a batch failed as a whole (`{"data":[{"code","message",…}]}`).
    #[serde(default)]
    pub errors: Option<serde_json::Value>,
}

impl ProviderBatch {
    /// The provider is done with the batch: no request of it will run any more.
    pub fn is_final(&self) -> bool {
        matches!(self.status.as_str(), "completed" | "expired" | "failed" | "cancelled")
    }

    /// A readable reason when the batch failed as a whole.
    pub fn failure_reason(&self) -> Option<String> {
        let data = self.errors.as_ref()?.get("data")?.as_array()?;
        let parts: Vec<String> = data
            .iter()
            .map(|e| {
                let code = e.get("code").and_then(|c| c.as_str()).unwrap_or("error");
                let msg = e.get("message").and_then(|c| c.as_str()).unwrap_or("");
                redact::secrets(&format!("{code}: {msg}"))
            })
            .collect();
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

#[derive(Deserialize)]
struct FileObject {
    id: String,
}

#[derive(Deserialize)]
struct BatchList {
    data: Vec<ProviderBatch>,
    #[serde(default)]
    has_more: bool,
}

/// The batch endpoints of one model.
#[derive(Clone)]
pub struct BatchApi {
    client: reqwest::Client,
    model: HttpModelSpec,
    /// Largest output or error file read (bytes).
    max_file_bytes: u64,
}

/// Largest output or error file a worker downloads: 10,000 answers of 100 KiB.
pub const MAX_FILE_BYTES: u64 = 1 << 30;

/// Largest line of an output or error file (one request's answer) that is read; a longer
/// one is skipped as it streams past (see `super::output`). A chat completion of the
/// longest `max_tokens` with logprobs fits many times over.
pub const MAX_LINE_BYTES: usize = 16 << 20;

/// A line of a file, as [`LineSplitter`] gives it: whole (without its `\n`), or only its
/// length when it is over the cap.
#[derive(Debug, PartialEq)]
pub enum FileLine<'a> {
    Whole(&'a [u8]),
    Oversized(u64),
}

/// Cuts a byte stream into lines, keeping at most `cap` bytes of one line in memory: a
/// longer line is dropped as it streams past and reported by its length.
pub struct LineSplitter {
    cap: usize,
    cur: Vec<u8>,
    /// The current line is over the cap: its length so far.
    over: Option<u64>,
}

impl LineSplitter {
    pub fn new(cap: usize) -> LineSplitter {
        LineSplitter { cap, cur: Vec::new(), over: None }
    }

    /// The next bytes of the stream; `each` gets every line they end.
    pub fn push(&mut self, mut chunk: &[u8], mut each: impl FnMut(FileLine<'_>)) {
        while !chunk.is_empty() {
            let (part, ended) = match chunk.iter().position(|b| *b == b'\n') {
                Some(i) => (&chunk[..i], true),
                None => (chunk, false),
            };
            chunk = if ended { &chunk[part.len() + 1..] } else { &[] };
            match &mut self.over {
                Some(n) => *n += part.len() as u64,
                None if self.cur.len() + part.len() > self.cap => {
                    self.over = Some((self.cur.len() + part.len()) as u64);
                    self.cur = Vec::new();
                }
                None => self.cur.extend_from_slice(part),
            }
            if ended {
                self.emit(&mut each);
            }
        }
    }

    /// The stream ended: its last line, if it had no `\n`.
    pub fn finish(&mut self, mut each: impl FnMut(FileLine<'_>)) {
        if self.over.is_some() || !self.cur.is_empty() {
            self.emit(&mut each);
        }
    }

    fn emit(&mut self, each: &mut impl FnMut(FileLine<'_>)) {
        match self.over.take() {
            Some(n) => each(FileLine::Oversized(n)),
            None => each(FileLine::Whole(&self.cur)),
        }
        self.cur.clear();
    }
}

/// Streams the body of `resp` (what `what` names: "GET <url>"; `noun`: "the file",
/// "the results") a line at a time into `each`, lines over [`MAX_LINE_BYTES`] by their
/// length only; never held whole, and a body over `limit` bytes is an error.
pub async fn stream_lines(
    mut resp: reqwest::Response,
    what: &str,
    noun: &str,
    limit: u64,
    mut each: impl FnMut(FileLine<'_>),
) -> Result<(), CallError> {
    let too_large = |n: u64| {
        CallError::permanent(format!(
            "{what}: {noun} is larger than the limit of {limit} bytes ({n} bytes or more)"
        ))
    };
    if let Some(n) = resp.content_length().filter(|n| *n > limit) {
        return Err(too_large(n));
    }
    let mut lines = LineSplitter::new(MAX_LINE_BYTES);
    let mut read = 0u64;
    while let Some(chunk) =
        resp.chunk().await.map_err(|e| transport_error(what, "reading body: ", &e))?
    {
        read += chunk.len() as u64;
        if read > limit {
            return Err(too_large(read));
        }
        lines.push(&chunk, &mut each);
    }
    lines.finish(&mut each);
    Ok(())
}

/// Per-request timeout of the batch endpoints (an upload of a large file included).
const TIMEOUT: Duration = Duration::from_secs(300);

/// How far back a taker looks for a batch it may have created (pages of 100).
const FIND_PAGES: usize = 20;

/// Ids from the provider's answers (or the broker's records) go into URL paths only when
/// they are plain ids.
pub(super) fn plain_id(id: &str) -> Result<(), CallError> {
    if !id.is_empty()
        && id.len() <= 200
        && id.chars().all(|c| c.is_ascii_alphanumeric() || "-_".contains(c))
    {
        Ok(())
    } else {
        Err(CallError::permanent(format!("{:?} is not a plain provider id", redact::secrets(id))))
    }
}

impl BatchApi {
    pub fn new(model: HttpModelSpec) -> Result<BatchApi, CallError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| CallError::permanent(format!("cannot build HTTP client: {e}")))?;
        Ok(BatchApi { client, model, max_file_bytes: MAX_FILE_BYTES })
    }

    pub fn model(&self) -> &HttpModelSpec {
        &self.model
    }

    fn url(&self, path: &str) -> String {
        format!("{}/{path}", self.model.base_url.trim_end_matches('/'))
    }

    /// Send `req` (authorised with the model's key) and read the body of a 200.
    async fn send(
        &self,
        req: reqwest::RequestBuilder,
        what: &str,
        limit: u64,
    ) -> Result<Vec<u8>, CallError> {
        let resp = self.response(req, what, limit).await?;
        crate::backend::http_guard::read_body(resp, limit, what).await
    }

    /// A successful response, its body not read yet; an error status is read (up to
    /// `limit` bytes) into its error.
    async fn response(
        &self,
        req: reqwest::RequestBuilder,
        what: &str,
        limit: u64,
    ) -> Result<reqwest::Response, CallError> {
        let mut req = req.timeout(TIMEOUT);
        if let Some(k) = api_key(&self.model)? {
            req = req.bearer_auth(k);
        }
        let resp = req.send().await.map_err(|e| transport_error(what, "", &e))?;
        let status = resp.status().as_u16();
        if !(200..300).contains(&status) {
            let retry_after = retry_after_of(&resp);
            let bytes = crate::backend::http_guard::read_body(resp, limit, what).await?;
            return Err(status_error(what, status, &bytes, retry_after));
        }
        Ok(resp)
    }

    async fn json<T: serde::de::DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
        what: &str,
    ) -> Result<T, CallError> {
        let bytes = self.send(req, what, 16 << 20).await?;
        serde_json::from_slice(&bytes).map_err(|e| {
            let start = redact::secrets(&String::from_utf8_lossy(&bytes[..bytes.len().min(200)]));
            CallError::transient(format!("{what}: unexpected answer ({e}); body starts: {start:?}"))
        })
    }

    /// Upload a JSONL file of requests; its file id.
    pub async fn upload(&self, filename: &str, jsonl: Vec<u8>) -> Result<String, CallError> {
        let url = self.url("files");
        let what = format!("POST {}", redact::url(&url));
        let part = reqwest::multipart::Part::bytes(jsonl)
            .file_name(filename.to_string())
            .mime_str("application/jsonl")
            .map_err(|e| CallError::permanent(format!("{what}: {e}")))?;
        let form = reqwest::multipart::Form::new().text("purpose", "batch").part("file", part);
        let f: FileObject = self.json(self.client.post(&url).multipart(form), &what).await?;
        Ok(f.id)
    }

    /// Create a batch of the uploaded `file`, tagged with `record` in its metadata.
    pub async fn create(&self, file: &str, record: &str) -> Result<ProviderBatch, CallError> {
        let url = self.url("batches");
        let what = format!("POST {}", redact::url(&url));
        let body = serde_json::json!({
            "input_file_id": file,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "metadata": { halyard_proto::provider_batch::METADATA_KEY: record },
        });
        self.json(self.client.post(&url).json(&body), &what).await
    }

    pub async fn retrieve(&self, batch: &str) -> Result<ProviderBatch, CallError> {
        plain_id(batch)?;
        let url = self.url(&format!("batches/{batch}"));
        let what = format!("GET {}", redact::url(&url));
        self.json(self.client.get(&url), &what).await
    }

    /// The batch tagged with `record`, if the provider has one (newest first, up to
    /// `FIND_PAGES` pages, stopping at batches created before `since_s`).
    pub async fn find(
        &self,
        record: &str,
        since_s: u64,
    ) -> Result<Option<ProviderBatch>, CallError> {
        let url = self.url("batches");
        let what = format!("GET {}", redact::url(&url));
        let mut after: Option<String> = None;
        for _ in 0..FIND_PAGES {
            let page_url = match &after {
                Some(a) => format!("{url}?limit=100&after={a}"),
                None => format!("{url}?limit=100"),
            };
            let page: BatchList = self.json(self.client.get(&page_url), &what).await?;
            let mut older = false;
            for b in &page.data {
                let tagged = b
                    .metadata
                    .as_ref()
                    .and_then(|m| m.get(halyard_proto::provider_batch::METADATA_KEY))
                    .and_then(|v| v.as_str());
                if tagged == Some(record) {
                    return Ok(Some(b.clone()));
                }
                older |= b.created_at.is_some_and(|t| t < since_s);
            }
            if !page.has_more || older || page.data.is_empty() {
                return Ok(None);
            }
            // A cursor that is not a plain id is not put into a URL.
            after = page
                .data
                .last()
                .map(|b| b.id.clone())
                .filter(|id| id.chars().all(|c| c.is_ascii_alphanumeric() || "-_".contains(c)));
            if after.is_none() {
                return Err(CallError::transient(format!(
                    "{what}: a batch id that cannot be a list cursor; cannot look further"
                )));
            }
        }
        Ok(None)
    }

    /// The content of an output or error file, streamed a line at a time into `each`
    /// (lines over [`MAX_LINE_BYTES`] by their length only); the file is never held
    /// whole, and one over `max_file_bytes` is an error.
    pub async fn content_lines(
        &self,
        file: &str,
        each: impl FnMut(FileLine<'_>),
    ) -> Result<(), CallError> {
        plain_id(file)?;
        let url = self.url(&format!("files/{file}/content"));
        let what = format!("GET {}", redact::url(&url));
        let limit = self.max_file_bytes;
        let resp = self.response(self.client.get(&url), &what, limit).await?;
        stream_lines(resp, &what, "the file", limit, each).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(chunks: &[&[u8]], cap: usize) -> Vec<String> {
        let mut out = Vec::new();
        let mut s = LineSplitter::new(cap);
        let mut each = |l: FileLine<'_>| {
            out.push(match l {
                FileLine::Whole(b) => String::from_utf8_lossy(b).into_owned(),
                FileLine::Oversized(n) => format!("<{n} bytes>"),
            })
        };
        for c in chunks {
            s.push(c, &mut each);
        }
        s.finish(&mut each);
        out
    }

    /// Lines come whole whatever the chunks; a line over the cap comes as its length,
    /// wherever it starts and ends, and the lines around it are untouched.
    #[test]
    fn lines_are_cut_with_a_cap() {
        assert_eq!(split(&[b"ab\ncd", b"e\n", b"f"], 4), ["ab", "cde", "f"]);
        assert_eq!(split(&[b"ab\n\n"], 4), ["ab", ""]);
        assert_eq!(split(&[b"abcd\nabcde\nxy\n"], 4), ["abcd", "<5 bytes>", "xy"]);
        assert_eq!(split(&[b"ab", b"cd", b"ef", b"g\nh"], 4), ["<7 bytes>", "h"]);
        assert_eq!(split(&[b"abcdefgh"], 4), ["<8 bytes>"]);
        assert!(split(&[], 4).is_empty());
        // One byte at a time: the same lines.
        let text = b"first\nsecond-is-long\nthird\n";
        let bytes: Vec<&[u8]> = text.chunks(1).collect();
        assert_eq!(split(&bytes, 6), ["first", "<14 bytes>", "third"]);
    }
}

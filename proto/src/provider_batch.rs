//! Provider batches (`mode = "batch"` pools) as the broker records them.
//!
//! A worker of a batch pool gathers jobs, writes them as a JSONL file of chat-completion
//! requests (`custom_id` = job id), uploads it to the provider, creates a batch and polls
//! it; the answers come back as an output file hours later. What must survive any crash
//! in between lives in the KV bucket [`BATCHES_BUCKET`], written **before** the provider
//! is asked for the next step:
//!
//! - `r.<pool token>.<record>`: a [`BatchRecord`]: which jobs, which file, which
//!   provider batch, in which [`BatchState`], owned by which worker until when (a lease
//!   the owner renews). Any worker of the pool takes over a record whose lease lapsed.
//! - `j.<pool token>.<job id>`: the job's claim: the record that holds it. A worker that
//!   receives a job claimed by a live record waits for that record instead of submitting
//!   the job again (a redelivery after a crash, a re-publication by a restarted
//!   coordinator).
//! - `q.<pool token>`: the pool's enqueued tokens ([`QueueLedger`]), for
//!   `batch_queue_tokens`, updated by compare-and-set so that workers never exceed it
//!   together.
//!
//! The provider batch carries the record's key in its metadata (`halyard_record`), so
//! a worker taking over a record whose owner died between "create the batch" and
//! "write its id" finds that batch instead of creating a second one.
//!
//! Values are JSON (operators read them with `nats kv get`); every read is fallible:
//! the bucket is on a shared broker.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::subjects::pool_token;
use crate::JobId;

/// The KV bucket of provider batches (see the module docs).
pub const BATCHES_BUCKET: &str = "halyard_batches";

/// The metadata key that ties a provider batch to its record.
pub const METADATA_KEY: &str = "halyard_record";

/// Where a provider batch is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum BatchState {
    /// The owner is gathering jobs (in memory; their claims name this record).
    Gathering,
    /// The job list is fixed and the input file is being uploaded.
    Uploading,
    /// The input file is uploaded; the batch may or may not have been created (a taker
    /// looks for it by metadata before creating one).
    Uploaded { file: String },
    /// The provider has the batch; it is polled until it ends.
    Submitted { file: String, batch: String },
    /// The provider ended the batch (`completed`, `expired`, `failed`, `cancelled`):
    /// each job's answer or error is in the output or error file.
    Ended {
        batch: String,
        status: String,
        output: Option<String>,
        error: Option<String>,
        /// The provider's reason when the batch failed as a whole.
        #[serde(default)]
        reason: Option<String>,
    },
    /// Given up before the provider had it (its owner died while gathering or
    /// uploading): its jobs are gathered again.
    Abandoned { reason: String },
}

impl BatchState {
    /// The state's name, as `halyard status` and `/metrics` show it.
    pub fn name(&self) -> &'static str {
        match self {
            BatchState::Gathering => "gathering",
            BatchState::Uploading => "uploading",
            BatchState::Uploaded { .. } => "uploaded",
            BatchState::Submitted { .. } => "submitted",
            BatchState::Ended { .. } => "ended",
            BatchState::Abandoned { .. } => "abandoned",
        }
    }

    /// The provider holds (or may hold) requests of this batch that are not answered yet.
    pub fn is_live(&self) -> bool {
        !matches!(self, BatchState::Ended { .. } | BatchState::Abandoned { .. })
    }
}

/// One provider batch and the jobs in it (see the module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BatchRecord {
    /// The record's id (the last token of its key).
    pub id: String,
    pub pool: String,
    /// The API model name every request of the batch uses.
    pub model: String,
    #[serde(flatten)]
    pub state: BatchState,
    /// The jobs, fixed when the upload begins (empty while gathering).
    #[serde(default)]
    pub jobs: Vec<String>,
    /// Estimated tokens of the requests (prompt estimate plus `max_tokens`).
    #[serde(default)]
    pub tokens: u64,
    /// The worker that owns the record, and until when (unix ms) unless it renews.
    pub owner: String,
    pub lease_until_ms: u64,
    pub created_ms: u64,
    /// When the provider accepted the batch.
    #[serde(default)]
    pub submitted_ms: Option<u64>,
    #[serde(default)]
    pub ended_ms: Option<u64>,
}

impl BatchRecord {
    pub fn key(&self) -> String {
        record_key(&self.pool, &self.id)
    }

    /// Whether job `id` is one of the record's jobs.
    pub fn holds(&self, id: &JobId) -> bool {
        let hex = id.to_string();
        self.jobs.contains(&hex)
    }

    pub fn lease_lapsed(&self, now_ms: u64) -> bool {
        now_ms >= self.lease_until_ms
    }
}

/// A job's claim: the record that holds (or is gathering) it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    pub record: String,
}

/// The tokens each live record of a pool has enqueued at the provider.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueLedger {
    pub records: BTreeMap<String, u64>,
}

impl QueueLedger {
    pub fn total(&self) -> u64 {
        self.records.values().sum()
    }
}

/// The batches of one pool in one state, as `halyard status`, the progress line and
/// `/metrics` show them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BatchGroup {
    pub pool: String,
    /// [`BatchState::name`].
    pub state: String,
    pub batches: u64,
    pub requests: u64,
    /// Age of the oldest batch in this group (since it was submitted, or created).
    pub oldest_s: f64,
}

/// Group records by pool and state (ended and abandoned records are left out: they hold
/// nothing at the provider), sorted by pool then state.
pub fn summarize(records: &[BatchRecord], now_ms: u64) -> Vec<BatchGroup> {
    let mut groups: BTreeMap<(String, &'static str), BatchGroup> = BTreeMap::new();
    for r in records.iter().filter(|r| r.state.is_live()) {
        let name = r.state.name();
        let g = groups.entry((r.pool.clone(), name)).or_insert_with(|| BatchGroup {
            pool: r.pool.clone(),
            state: name.to_string(),
            ..Default::default()
        });
        g.batches += 1;
        g.requests += r.jobs.len() as u64;
        let since = r.submitted_ms.unwrap_or(r.created_ms);
        g.oldest_s = g.oldest_s.max(now_ms.saturating_sub(since) as f64 / 1000.0);
    }
    groups.into_values().collect()
}

/// Key of record `id` of `pool`.
pub fn record_key(pool: &str, id: &str) -> String {
    format!("r.{}.{id}", pool_token(pool))
}

/// Keys of every record of `pool` (a KV key filter).
pub fn record_keys(pool: &str) -> String {
    format!("r.{}.*", pool_token(pool))
}

/// Key of job `id`'s claim in `pool`.
pub fn claim_key(pool: &str, id: &JobId) -> String {
    format!("j.{}.{id}", pool_token(pool))
}

/// Key of `pool`'s queue ledger.
pub fn ledger_key(pool: &str) -> String {
    format!("q.{}", pool_token(pool))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records read back as written, with their state inline; keys are KV-safe tokens
    /// even for pool names with `/` and `@`.
    #[test]
    fn records_round_trip_and_keys_are_tokens() {
        let r = BatchRecord {
            id: "0192".into(),
            pool: "openai/gpt-4o-mini@team".into(),
            model: "gpt-4o-mini".into(),
            state: BatchState::Submitted { file: "file-1".into(), batch: "batch_1".into() },
            jobs: vec![JobId([7; 16]).to_string()],
            tokens: 300,
            owner: "w1".into(),
            lease_until_ms: 10,
            created_ms: 1,
            submitted_ms: Some(2),
            ended_ms: None,
        };
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains(r#""state":"submitted""#), "{json}");
        assert_eq!(serde_json::from_str::<BatchRecord>(&json).unwrap(), r);
        assert!(r.holds(&JobId([7; 16])) && !r.holds(&JobId([8; 16])));
        assert!(r.state.is_live() && r.lease_lapsed(10) && !r.lease_lapsed(9));
        let key = r.key();
        assert!(key.starts_with("r.openai_gpt-4o-mini_team-") && key.ends_with(".0192"), "{key}");
        assert!(key.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)), "{key}");
        let ended = BatchState::Ended {
            batch: "b".into(),
            status: "expired".into(),
            output: None,
            error: Some("f".into()),
            reason: None,
        };
        assert!(!ended.is_live());
        assert_eq!(ended.name(), "ended");
    }
}

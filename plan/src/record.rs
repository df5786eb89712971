//! What a run's state holds, as values: item keys, dead-letter notes, stored results,
//! and what a store can fail with.

use halyard_proto::stored::decode_result;
use halyard_proto::{JobId, StoredResult};
use serde::{Deserialize, Serialize};

/// What a run store could not do: read or write (its engine's error, as text), or a
/// record that does not decode.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("run state: {0}")]
    Io(String),
    #[error("run state record {what} is corrupt: {reason}")]
    Corrupt { what: String, reason: String },
}

/// Where a dead-lettered job came from, for the report.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct JobMeta {
    pub pool: String,
    pub stage: String,
    pub model: String,
}

/// Results messages and results a run refused (every process of it), kept in its
/// state so that the report counts them all.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Intake {
    /// Results messages refused: undecodable, of another run, a worker's refusal of a
    /// forged job, naming an unusable object, on no pool's subject.
    pub refused_messages: u64,
    /// Results refused: from a pool that does not serve their job, or for a job never
    /// planned once the results held aside were at their bound.
    pub refused_results: u64,
}

/// A 12-byte item key: benchmark, model-under-test and item index, big-endian so that
/// the store iterates items in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ItemKey {
    pub bench: u32,
    pub model: u32,
    pub item: u32,
}

impl ItemKey {
    pub fn to_bytes(self) -> [u8; 12] {
        let mut b = [0u8; 12];
        b[..4].copy_from_slice(&self.bench.to_be_bytes());
        b[4..8].copy_from_slice(&self.model.to_be_bytes());
        b[8..].copy_from_slice(&self.item.to_be_bytes());
        b
    }
    pub fn from_bytes(b: &[u8]) -> Option<ItemKey> {
        if b.len() != 12 {
            return None;
        }
        let n = |r: std::ops::Range<usize>| u32::from_be_bytes(b[r].try_into().unwrap_or([0; 4]));
        Some(ItemKey { bench: n(0..4), model: n(4..8), item: n(8..12) })
    }
}

/// A stored result, or an error naming its record.
pub fn decode_stored(job: &JobId, bytes: &[u8]) -> Result<StoredResult, StoreError> {
    decode_result(bytes)
        .map_err(|e| StoreError::Corrupt { what: format!("results/{job}"), reason: e.to_string() })
}

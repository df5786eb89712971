//! What the entries table and the claims table both key and stamp their rows by.

use std::time::{SystemTime, UNIX_EPOCH};

use halyard_proto::JobId;

/// The index key of a job id: its first 8 bytes, little-endian, as a signed integer.
pub(crate) fn h(id: &JobId) -> i64 {
    let b = id.as_bytes();
    i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

/// Seconds since the Unix epoch (0 for a clock before it).
pub(crate) fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

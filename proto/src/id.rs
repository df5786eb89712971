//! Job ids: 128-bit content hashes (BLAKE3), shown as 32 lowercase hex digits.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A job's identity: the first 16 bytes of a BLAKE3 hash over a canonical,
/// length-prefixed encoding of the [`crate::JobKey`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct JobId(pub [u8; 16]);

impl JobId {
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    pub fn from_slice(b: &[u8]) -> Option<JobId> {
        <[u8; 16]>::try_from(b).ok().map(JobId)
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // One write of 32 digits (formatted once per job: message ids, log fields).
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 32];
        for (i, b) in self.0.iter().enumerate() {
            out[2 * i] = HEX[(b >> 4) as usize];
            out[2 * i + 1] = HEX[(b & 0x0f) as usize];
        }
        // Hex digits are ASCII.
        f.pad(std::str::from_utf8(&out).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JobId({self})")
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid job id {0:?}: expected 32 hexadecimal digits")]
pub struct ParseJobIdError(pub String);

impl FromStr for JobId {
    type Err = ParseJobIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseJobIdError(s.to_string());
        if s.len() != 32 || !s.is_ascii() {
            return Err(err());
        }
        let mut out = [0u8; 16];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| err())?;
        }
        Ok(JobId(out))
    }
}

/// Canonical hashing: every field is written with a type tag and a length prefix,
/// so that no two different keys can produce the same byte stream.
pub(crate) struct CanonicalHasher(blake3::Hasher);

impl CanonicalHasher {
    pub(crate) fn new(domain: &str) -> Self {
        let mut h = blake3::Hasher::new();
        h.update(b"halyard/");
        h.update(domain.as_bytes());
        h.update(&[0]);
        CanonicalHasher(h)
    }
    pub(crate) fn str(&mut self, s: &str) -> &mut Self {
        self.0.update(b"s");
        self.0.update(&(s.len() as u64).to_le_bytes());
        self.0.update(s.as_bytes());
        self
    }
    pub(crate) fn u64(&mut self, v: u64) -> &mut Self {
        self.0.update(b"u");
        self.0.update(&v.to_le_bytes());
        self
    }
    pub(crate) fn opt_u64(&mut self, v: Option<u64>) -> &mut Self {
        match v {
            None => {
                self.0.update(b"n");
            }
            Some(v) => {
                self.u64(v);
            }
        }
        self
    }
    pub(crate) fn finish(&self) -> JobId {
        let h = self.0.finalize();
        let mut out = [0u8; 16];
        out.copy_from_slice(&h.as_bytes()[..16]);
        JobId(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Display and FromStr are inverse, and bad strings are rejected with the input named.
    #[test]
    fn hex_round_trip_and_errors() {
        let id = JobId([0xab; 16]);
        let s = id.to_string();
        assert_eq!(s.len(), 32);
        assert_eq!(s.parse::<JobId>().unwrap(), id);
        assert!("xyz".parse::<JobId>().is_err());
        assert!("zz".repeat(16).parse::<JobId>().is_err());
        assert!("é".repeat(16).parse::<JobId>().is_err());
    }
}

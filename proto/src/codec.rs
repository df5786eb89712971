//! MessagePack with named fields (rmp-serde), plus a version check.

use serde::{de::DeserializeOwned, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("cannot encode message: {0}")]
    Encode(#[from] rmp_serde::encode::Error),
    #[error("cannot decode {what} ({len} bytes): {source}")]
    Decode { what: &'static str, len: usize, source: rmp_serde::decode::Error },
    #[error("cannot decompress {what} ({len} bytes): {reason}")]
    Decompress { what: &'static str, len: usize, reason: String },
    #[error("{what} has wire version {found}, this build speaks {expected}")]
    Version { what: &'static str, found: u16, expected: u16 },
}

pub fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, CodecError> {
    // Room for a typical job or result up front, instead of growing 8, 16, … 256 bytes.
    let mut buf = Vec::with_capacity(384);
    rmp_serde::encode::write_named(&mut buf, v)?;
    Ok(buf)
}

/// Decode a message; `what` names it in the error.
pub fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, CodecError> {
    rmp_serde::from_slice(bytes).map_err(|source| CodecError::Decode {
        what,
        len: bytes.len(),
        source,
    })
}

/// Reject a message of another wire version.
pub fn check_version(what: &'static str, found: u16) -> Result<(), CodecError> {
    if found != crate::WIRE_VERSION {
        return Err(CodecError::Version { what, found, expected: crate::WIRE_VERSION });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::*;

    /// A job survives the round trip, and garbage is an error naming the message, not a panic.
    #[test]
    fn round_trip_and_garbage() {
        let key = JobKey {
            pipeline: "p".into(),
            stage: "s".into(),
            stage_version: 1,
            model: ModelRef { backend: "openai".into(), endpoint: "e".into(), model: "m".into() },
            messages: vec![ChatMessage::user("hi")],
            sampling: Sampling::default(),
            sample_index: 0,
        };
        let job = Job::new(uuid::Uuid::nil(), "pool", key, 1000);
        let bytes = encode(&job).unwrap();
        let back: Job = decode("job", &bytes).unwrap();
        assert_eq!(back, job);
        let err = decode::<Job>("job", b"\xff\x00garbage").unwrap_err();
        assert!(err.to_string().contains("cannot decode job"), "{err}");
        assert!(check_version("job", 99).is_err());
    }
}

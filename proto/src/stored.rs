//! The compact form of what the stores keep on disk: a worker's checkpointed
//! [`Completion`] and the coordinator's stored result ([`StoredResult`]).
//!
//! The wire uses MessagePack with named fields ([`crate::codec`]): every message names
//! each field, which keeps processes of different builds compatible. A store has one
//! reader, the build that wrote it or a later one, and keeps millions of records, so it
//! writes fields by position instead, behind a marker byte, and leaves out what it
//! already knows (the job id is the record's key, the run id is the store's run, the
//! worker's name is not read back). A no-op job's stored result is 18
//! bytes instead of 208, its checkpoint record 9 instead of 82.
//!
//! Records written before this form (named fields, a MessagePack map) still read: the
//! marker `0xc1` is the one byte MessagePack never uses, so no older record starts with
//! it.
//!
//! Long records (answer text) are compressed: a compact record of at least
//! [`COMPRESS_FROM`] bytes is stored as the marker twice and a zstd frame of the rest,
//! when that is smaller. A compact record's second byte is always an array header, never
//! `0xc1`, so the two forms cannot be confused.

use serde::{Deserialize, Serialize};

use crate::codec::CodecError;
use crate::id::JobId;
use crate::result::{Completion, JobResult, Outcome};

/// First byte of a record in the compact form (never used by MessagePack).
const MARKER: u8 = 0xc1;
/// Second byte of a compressed record (a compact record's is an array header).
const COMPRESSED: u8 = 0xc1;
/// Compact records at least this long are compressed: below it, zstd's frame header and
/// the short text leave little to gain for the CPU.
pub const COMPRESS_FROM: usize = 128;
/// zstd's level: 3 (its default) compresses English answers about 2.5 times at some
/// hundreds of MB/s, far more than a worker stores.
const LEVEL: i32 = 3;
/// Largest record a compressed frame may expand to (a store record is a job's result,
/// bounded by the worker's `max_body_bytes`; this stops a damaged frame from asking for
/// more).
const MAX_EXPANDED: usize = 1 << 30;

/// A job's result as the coordinator keeps it: what the planner, the totals and the
/// dead-letter list read back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredResult {
    pub outcome: Outcome,
    /// JetStream deliveries of the job when the result was produced.
    pub deliveries: u64,
    /// Served from a worker checkpoint, without a model call.
    pub cached: bool,
}

impl From<JobResult> for StoredResult {
    fn from(r: JobResult) -> Self {
        StoredResult { outcome: r.outcome, deliveries: r.deliveries, cached: r.cached }
    }
}

impl From<&JobResult> for StoredResult {
    fn from(r: &JobResult) -> Self {
        StoredResult { outcome: r.outcome.clone(), deliveries: r.deliveries, cached: r.cached }
    }
}

fn encode_compact<T: Serialize>(v: &T) -> Result<Vec<u8>, CodecError> {
    let mut buf = Vec::with_capacity(64);
    buf.push(MARKER);
    rmp_serde::encode::write(&mut buf, v)?;
    if buf.len() >= COMPRESS_FROM {
        if let Ok(z) = zstd::bulk::compress(&buf[1..], LEVEL) {
            if z.len() + 2 < buf.len() {
                let mut out = Vec::with_capacity(z.len() + 2);
                out.extend_from_slice(&[MARKER, COMPRESSED]);
                out.extend_from_slice(&z);
                return Ok(out);
            }
        }
    }
    Ok(buf)
}

fn decode_compact<T: for<'de> Deserialize<'de>>(
    what: &'static str,
    bytes: &[u8],
) -> Option<Result<T, CodecError>> {
    let rest = bytes.strip_prefix(&[MARKER])?;
    let decode = |raw: &[u8]| {
        rmp_serde::from_slice(raw).map_err(|source| CodecError::Decode {
            what,
            len: bytes.len(),
            source,
        })
    };
    Some(match rest.strip_prefix(&[COMPRESSED]) {
        None => decode(rest),
        Some(frame) => match zstd::bulk::decompress(frame, expanded_len(frame)) {
            Ok(raw) => decode(&raw),
            Err(e) => Err(CodecError::Decompress { what, len: bytes.len(), reason: e.to_string() }),
        },
    })
}

/// The size a frame says it expands to, within [`MAX_EXPANDED`] (frames written here
/// always say).
fn expanded_len(frame: &[u8]) -> usize {
    match zstd::zstd_safe::get_frame_content_size(frame) {
        Ok(Some(n)) => (n as usize).min(MAX_EXPANDED),
        _ => 0,
    }
}

/// Encode a result for the coordinator's store (the job id is the record's key).
pub fn encode_result(r: &StoredResult) -> Result<Vec<u8>, CodecError> {
    encode_compact(r)
}

/// Decode a stored result, in the compact form or as a whole [`JobResult`] (records
/// written by builds before the compact form).
pub fn decode_result(bytes: &[u8]) -> Result<StoredResult, CodecError> {
    const WHAT: &str = "stored result";
    match decode_compact(WHAT, bytes) {
        Some(r) => r,
        None => crate::decode::<JobResult>(WHAT, bytes).map(StoredResult::from),
    }
}

/// Encode a completion for a worker's checkpoint.
pub fn encode_completion(c: &Completion) -> Result<Vec<u8>, CodecError> {
    encode_compact(c)
}

/// Decode a checkpointed completion, in the compact form or with named fields (records
/// written by builds before the compact form).
pub fn decode_completion(bytes: &[u8]) -> Result<Completion, CodecError> {
    const WHAT: &str = "checkpoint record";
    match decode_compact(WHAT, bytes) {
        Some(r) => r,
        None => crate::decode(WHAT, bytes),
    }
}

/// A whole [`JobResult`] again, for code that wants one (the run and worker are not
/// stored: `run` is the store's, the worker is left empty).
pub fn to_job_result(job: JobId, run: uuid::Uuid, s: StoredResult) -> JobResult {
    JobResult {
        v: crate::WIRE_VERSION,
        job,
        run,
        outcome: s.outcome,
        deliveries: s.deliveries,
        worker: String::new(),
        cached: s.cached,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result::{Failure, FailureKind, TokenLogprob, TopLogprob, Usage};

    fn completion(text: &str, logprobs: bool) -> Completion {
        Completion {
            text: text.into(),
            usage: Usage { prompt_tokens: 12, completion_tokens: 3 },
            latency_ms: 40,
            finish_reason: Some("stop".into()),
            calls: 2,
            logprobs: logprobs.then(|| {
                vec![TokenLogprob {
                    token: "a".into(),
                    logprob: -0.25,
                    top: vec![TopLogprob { token: "b".into(), logprob: -1.5 }],
                }]
            }),
        }
    }

    fn job_result(outcome: Outcome) -> JobResult {
        JobResult {
            v: crate::WIRE_VERSION,
            job: JobId([7; 16]),
            run: uuid::Uuid::from_u128(42),
            outcome,
            deliveries: 3,
            worker: "worker-with-a-long-name-0123456789".into(),
            cached: true,
        }
    }

    /// Both forms round-trip, and records of the named form written before still read.
    #[test]
    fn compact_and_named_forms_read() {
        for c in [completion("an answer", false), completion("", true)] {
            let compact = encode_completion(&c).unwrap();
            assert_eq!(compact[0], MARKER);
            assert_eq!(decode_completion(&compact).unwrap(), c);
            let named = crate::encode(&c).unwrap();
            assert!(compact.len() < named.len());
            assert_eq!(decode_completion(&named).unwrap(), c);
        }
        let failed = Outcome::Failed(Failure {
            kind: FailureKind::Permanent,
            error: "HTTP 400: bad request".into(),
            http_status: Some(400),
        });
        for outcome in [Outcome::Done(completion("text", true)), failed] {
            let r = job_result(outcome);
            let stored = StoredResult::from(&r);
            let compact = encode_result(&stored).unwrap();
            assert_eq!(decode_result(&compact).unwrap(), stored);
            // The whole JobResult the coordinator stored before this form.
            let named = crate::encode(&r).unwrap();
            assert_eq!(decode_result(&named).unwrap(), stored);
            let back = to_job_result(r.job, r.run, stored);
            assert_eq!((back.job, back.run, back.outcome), (r.job, r.run, r.outcome));
        }
    }

    /// A no-op job's record is a fraction of its wire form.
    #[test]
    fn noop_records_are_small() {
        let c = Completion {
            text: String::new(),
            usage: Usage::default(),
            latency_ms: 0,
            finish_reason: None,
            calls: 1,
            logprobs: None,
        };
        let r = job_result(Outcome::Done(c.clone()));
        let (compact, named) =
            (encode_result(&StoredResult::from(&r)).unwrap(), crate::encode(&r).unwrap());
        // 18 and 9 bytes today, against 208 and 82 with named fields.
        assert!(compact.len() <= 24, "{} bytes", compact.len());
        assert!(named.len() >= 8 * compact.len(), "{} bytes", named.len());
        let (cc, cn) = (encode_completion(&c).unwrap(), crate::encode(&c).unwrap());
        assert!(cc.len() <= 12 && cn.len() >= 6 * cc.len(), "{} / {} bytes", cc.len(), cn.len());
    }

    /// Garbage is an error naming the record, never a panic.
    #[test]
    fn garbage_is_an_error() {
        let bad_frame = [MARKER, COMPRESSED, 0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x01];
        for bad in [
            &[MARKER][..],
            &[MARKER, 0x93, 0x01],
            b"\xff\x00",
            b"",
            &bad_frame,
            &[MARKER, COMPRESSED],
        ] {
            let e = decode_result(bad).unwrap_err().to_string();
            assert!(e.contains("stored result"), "{e}");
            let e = decode_completion(bad).unwrap_err().to_string();
            assert!(e.contains("checkpoint record"), "{e}");
        }
    }

    /// Long answers are stored compressed, and read back as they were; short ones stay
    /// in the plain compact form, and no record grows.
    #[test]
    fn long_answers_are_compressed() {
        let words = ["the", "capital", "of", "France", "is", "Paris", "which", "river", "Seine"];
        let text: String =
            (0..400).map(|i| words[(i * 7 + i / 3) % words.len()]).collect::<Vec<_>>().join(" ");
        let c = completion(&text, false);
        let z = encode_completion(&c).unwrap();
        assert_eq!(&z[..2], &[MARKER, COMPRESSED]);
        assert!(z.len() * 3 < text.len(), "{} bytes for {} of text", z.len(), text.len());
        assert_eq!(decode_completion(&z).unwrap(), c);
        let r = StoredResult { outcome: Outcome::Done(c), deliveries: 2, cached: false };
        let zr = encode_result(&r).unwrap();
        assert_eq!(&zr[..2], &[MARKER, COMPRESSED]);
        assert_eq!(decode_result(&zr).unwrap(), r);
        // Short: plain.
        assert_ne!(encode_completion(&completion("short", false)).unwrap()[1], COMPRESSED);
        // Hard to compress (pseudo-random characters): never larger than the plain form.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let noise: String = (0..600)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                char::from(b'!' + (x % 90) as u8)
            })
            .collect();
        let n = completion(&noise, false);
        let stored = encode_completion(&n).unwrap();
        assert!(stored.len() <= 1 + rmp_serde::to_vec(&n).unwrap().len());
        assert_eq!(decode_completion(&stored).unwrap(), n);
    }
}

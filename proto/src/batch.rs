//! Results messages: a worker publishes the results that became durable together as
//! one message.
//!
//! A results message is either one [`JobResult`] (a MessagePack map) or a MessagePack
//! array of them (a *batch*: the results one checkpoint group commit made durable, sent as one
//! publish, one broker ack, one delivery and one ack at the coordinator instead of one of
//! each per job). [`decode_results`] reads both.
//!
//! Job messages use the same framing: with `[run] job_batch` > 1 the coordinator sends
//! the jobs it plans together as one message ([`decode_jobs`] reads both forms).
//!
//! A batch's `Nats-Msg-Id` begins with [`batch_msg_id`], a hash of its run and job ids: a
//! publish retried with the same batch is de-duplicated by the stream. A worker adds its
//! process's secret and the batch's number (`halyard_worker::outbox`), so a replay (after
//! a crash, or a job delivered again) is always a new message; the coordinator keeps the
//! first result of each job and counts the rest as duplicates.

use uuid::Uuid;

use crate::codec::CodecError;
use crate::{Job, JobId, JobResult};

/// Largest number of results in one batch (keeps a message far below NATS's 1 MiB).
pub const MAX_BATCH: usize = 1024;

/// The most bytes [`encode_batch`] adds to its items' encodings (the array header):
/// what a byte bound on a batch counts besides its items.
pub const BATCH_HEADER_MAX: usize = 5;

/// Items a decoder makes room for before reading them (a batch's count is untrusted: a
/// 1 MiB message may announce a million items, and a million decoded items take far
/// more than a megabyte).
const PREALLOCATE_MAX: usize = 256;

/// A batch of already-encoded results (each as [`crate::encode`] makes it).
pub fn encode_batch<B: AsRef<[u8]>>(encoded: &[B]) -> Vec<u8> {
    let n = encoded.len();
    let mut out = Vec::with_capacity(5 + encoded.iter().map(|e| e.as_ref().len()).sum::<usize>());
    if n < 16 {
        out.push(0x90 | n as u8);
    } else if n <= u16::MAX as usize {
        out.push(0xdc);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0xdd);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
    for e in encoded {
        out.extend_from_slice(e.as_ref());
    }
    out
}

/// `Nats-Msg-Id` of a batch: one result keeps its own id ([`crate::subjects::job_msg_id`]);
/// several get `<run>:b<hash of their job ids>`.
pub fn batch_msg_id<'a>(run: Uuid, jobs: impl IntoIterator<Item = &'a JobId>) -> String {
    let mut jobs = jobs.into_iter().peekable();
    let mut h = blake3::Hasher::new();
    let mut n = 0;
    let mut only = None;
    while let Some(j) = jobs.next() {
        if n == 0 && jobs.peek().is_none() {
            only = Some(*j);
        }
        h.update(j.as_bytes());
        n += 1;
    }
    match only {
        Some(j) => crate::subjects::job_msg_id(run, &j),
        None => {
            let hash = JobId(h.finalize().as_bytes()[..16].try_into().unwrap_or([0; 16]));
            format!("{}:b{hash}", run.simple())
        }
    }
}

/// The results in a results message.
pub fn decode_results(bytes: &[u8]) -> Result<Vec<JobResult>, CodecError> {
    decode_items(bytes, "results message", "result", "result in a results batch")
}

/// The jobs in a job message: one [`Job`] (a MessagePack map), or a batch of them (an
/// array, `[run] job_batch` > 1), as [`encode_batch`] makes it from encoded jobs.
pub fn decode_jobs(bytes: &[u8]) -> Result<Vec<Job>, CodecError> {
    decode_items(bytes, "job message", "job", "job in a job batch")
}

/// One item of a job message, decoded on its own (see [`decode_job_items`]).
#[derive(Debug)]
// Short-lived (one per job of a message being opened); boxing the job would allocate per
// job on the hot path for nothing.
#[allow(clippy::large_enum_variant)]
pub enum JobItem {
    Job(Job),
    /// A job of another wire version: a compatible worker may run it.
    OtherVersion(u16),
    /// Not a job of this wire version: refused alone, the others still run.
    Undecodable(CodecError),
}

/// The items of a job message, each decoded on its own, so that one bad job costs only
/// itself. Every MessagePack value in the batch is delimited first (without knowing its
/// schema), then read as a job; a value that is not one becomes [`JobItem::Undecodable`]
/// and the next one is read. Only a message whose framing is broken (a truncated value,
/// an impossible count) ends early: what follows the break is one undecodable item.
/// An item whose `v` is another wire version is [`JobItem::OtherVersion`], whatever the
/// rest of it holds.
pub fn decode_job_items(bytes: &[u8]) -> Vec<JobItem> {
    let (n, start) = match bytes.first() {
        Some(&b @ 0x90..=0x9f) => ((b & 0x0f) as usize, 1),
        Some(0xdc) if bytes.len() >= 3 => (u16::from_be_bytes([bytes[1], bytes[2]]) as usize, 3),
        Some(0xdd) if bytes.len() >= 5 => {
            (u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize, 5)
        }
        _ => return vec![job_item(bytes, "job")],
    };
    let broken = |why: &str| {
        JobItem::Undecodable(CodecError::Decode {
            what: "job message",
            len: bytes.len(),
            source: rmp_serde::decode::Error::Syntax(why.into()),
        })
    };
    if n > bytes.len() {
        return vec![broken("more items announced than the message can hold")];
    }
    // The count is the sender's word: room for what a message of this size could
    // hold at most, never `n` items' worth of memory for a few bytes.
    let mut out = Vec::with_capacity(n.min(PREALLOCATE_MAX));
    let mut rest = &bytes[start..];
    for _ in 0..n {
        let before = rest;
        let mut de = rmp_serde::Deserializer::new(&mut rest);
        if let Err(e) = <serde::de::IgnoredAny as serde::Deserialize>::deserialize(&mut de) {
            out.push(broken(&format!("item {} of {n} is cut off: {e}", out.len() + 1)));
            return out;
        }
        let item = &before[..before.len() - rest.len()];
        out.push(job_item(item, "job in a job batch"));
    }
    if !rest.is_empty() {
        out.push(broken("bytes after the last item"));
    }
    out
}

/// One delimited value read as a job: its version first, so that a job of another
/// version is recognised even when its fields changed.
fn job_item(bytes: &[u8], what: &'static str) -> JobItem {
    #[derive(serde::Deserialize)]
    struct Versioned {
        v: u16,
    }
    if let Ok(Versioned { v }) = rmp_serde::from_slice::<Versioned>(bytes) {
        if v != crate::WIRE_VERSION {
            return JobItem::OtherVersion(v);
        }
    }
    match crate::decode::<Job>(what, bytes) {
        Ok(job) => JobItem::Job(job),
        Err(e) => JobItem::Undecodable(e),
    }
}

fn decode_items<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    message: &'static str,
    single: &'static str,
    inner: &'static str,
) -> Result<Vec<T>, CodecError> {
    let malformed = |why: &str| CodecError::Decode {
        what: message,
        len: bytes.len(),
        source: rmp_serde::decode::Error::Syntax(why.into()),
    };
    let (n, start) = match bytes.first() {
        Some(&b @ 0x90..=0x9f) => ((b & 0x0f) as usize, 1),
        Some(0xdc) if bytes.len() >= 3 => (u16::from_be_bytes([bytes[1], bytes[2]]) as usize, 3),
        Some(0xdd) if bytes.len() >= 5 => {
            (u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize, 5)
        }
        Some(0xdc | 0xdd) => return Err(malformed("truncated array header")),
        // A single item.
        _ => return Ok(vec![crate::decode(single, bytes)?]),
    };
    // Every item takes more than one byte: a count beyond the message is corrupt.
    if n > bytes.len() {
        return Err(malformed("more items announced than the message can hold"));
    }
    // The count is the sender's word: room for what a message of this size could
    // hold at most, never `n` items' worth of memory for a few bytes.
    let mut out = Vec::with_capacity(n.min(PREALLOCATE_MAX));
    let mut rest = &bytes[start..];
    for _ in 0..n {
        let mut de = rmp_serde::Deserializer::new(&mut rest);
        let r: T = serde::Deserialize::deserialize(&mut de)
            .map_err(|source| CodecError::Decode { what: inner, len: bytes.len(), source })?;
        out.push(r);
    }
    if !rest.is_empty() {
        return Err(malformed("bytes after the last item"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{encode, Completion, Failure, FailureKind, Outcome, Usage};

    fn result(i: u8) -> JobResult {
        let outcome = if i.is_multiple_of(3) {
            Outcome::Failed(Failure {
                kind: FailureKind::Permanent,
                error: format!("e{i}"),
                http_status: Some(400),
            })
        } else {
            Outcome::Done(Completion {
                text: "x".repeat(i as usize),
                usage: Usage { prompt_tokens: i as u64, completion_tokens: 1, cache: None },
                latency_ms: 3,
                finish_reason: if i.is_multiple_of(2) { None } else { Some("stop".into()) },
                calls: 1,
                logprobs: None,
                refusal: false,
                source: Default::default(),
            })
        };
        JobResult {
            v: crate::WIRE_VERSION,
            job: JobId([i; 16]),
            run: Uuid::nil(),
            outcome,
            deliveries: 1,
            worker: "w".into(),
            cached: i.is_multiple_of(2),
        }
    }

    /// Batches of every header size decode to the same results; a single result still
    /// reads as a message of one.
    #[test]
    fn batches_round_trip() {
        for n in [0usize, 1, 15, 16, 300] {
            let results: Vec<JobResult> = (0..n).map(|i| result(i as u8)).collect();
            let encoded: Vec<Vec<u8>> = results.iter().map(|r| encode(r).unwrap()).collect();
            let msg = encode_batch(&encoded);
            assert_eq!(decode_results(&msg).unwrap(), results);
        }
        let one = encode(&result(5)).unwrap();
        assert_eq!(decode_results(&one).unwrap(), vec![result(5)]);
    }

    /// Corrupt messages are errors naming the results message, never a panic.
    #[test]
    fn corrupt_batches_are_errors() {
        let good = encode_batch(&[encode(&result(1)).unwrap(), encode(&result(2)).unwrap()]);
        let mut trailing = good.clone();
        trailing.push(0);
        for bad in [
            &good[..good.len() - 1],
            &trailing[..],
            &[0xdd, 0xff, 0xff, 0xff, 0xff][..],
            &[0xdc][..],
            &[0x93, 0x01][..],
        ] {
            let err = decode_results(bad).unwrap_err().to_string();
            assert!(err.contains("result"), "{err}");
        }
    }

    /// A batch id depends on the run and the jobs; one result keeps its per-job id.
    #[test]
    fn batch_ids() {
        let run = Uuid::from_u128(7);
        let (a, b) = (JobId([1; 16]), JobId([2; 16]));
        assert_eq!(batch_msg_id(run, [&a]), crate::subjects::job_msg_id(run, &a));
        let ab = batch_msg_id(run, [&a, &b]);
        assert_eq!(ab, batch_msg_id(run, [&a, &b]));
        assert_ne!(ab, batch_msg_id(run, [&b, &a]));
        assert_ne!(ab, batch_msg_id(Uuid::from_u128(8), [&a, &b]));
        assert!(ab.starts_with(&format!("{}:b", run.simple())), "{ab}");
    }

    /// Job messages: one job or a batch of them, both read by `decode_jobs`; a corrupt
    /// batch is an error naming the job message.
    #[test]
    fn job_batches_round_trip() {
        let job = noop_job;
        let one = job(7);
        assert_eq!(decode_jobs(&encode(&one).unwrap()).unwrap(), vec![one.clone()]);
        for n in [2usize, 16, 64] {
            let jobs: Vec<Job> = (0..n as u32).map(job).collect();
            let encoded: Vec<Vec<u8>> = jobs.iter().map(|j| encode(j).unwrap()).collect();
            let msg = encode_batch(&encoded);
            assert_eq!(decode_jobs(&msg).unwrap(), jobs);
            let err = decode_jobs(&msg[..msg.len() - 3]).unwrap_err();
            assert!(err.to_string().contains("job"), "{err}");
        }
    }

    fn noop_job(i: u32) -> Job {
        use crate::{ChatMessage, JobKey, ModelRef, Sampling};
        let key = JobKey {
            pipeline: "noop".into(),
            stage: "call".into(),
            stage_version: 1,
            model: ModelRef { backend: "noop".into(), endpoint: "".into(), model: "m".into() },
            messages: vec![ChatMessage::user(format!("item {i}"))],
            sampling: Sampling::default(),
            sample_index: 0,
        };
        Job::new(Uuid::nil(), "pool", key, 1000)
    }

    /// Issue 13: a batch holding one value that is not a job (valid MessagePack, wrong
    /// shape) yields the other jobs and one undecodable item in its place.
    #[test]
    fn one_bad_item_costs_only_itself() {
        let jobs: Vec<Job> = (0..3).map(noop_job).collect();
        let mut encoded: Vec<Vec<u8>> = jobs.iter().map(|j| encode(j).unwrap()).collect();
        encoded.insert(1, encode(&("not", "a", "job", 7)).unwrap());
        encoded.insert(3, encode(&std::collections::BTreeMap::from([("v", 1u16)])).unwrap());
        let items = decode_job_items(&encode_batch(&encoded));
        let kinds: Vec<&str> = items
            .iter()
            .map(|i| match i {
                JobItem::Job(_) => "job",
                JobItem::OtherVersion(_) => "version",
                JobItem::Undecodable(_) => "bad",
            })
            .collect();
        assert_eq!(kinds, ["job", "bad", "job", "bad", "job"]);
        let good: Vec<&Job> = items
            .iter()
            .filter_map(|i| if let JobItem::Job(j) = i { Some(j) } else { None })
            .collect();
        assert_eq!(good, jobs.iter().collect::<Vec<_>>());
    }

    /// A broken frame keeps the items before the break; garbage alone is one bad item;
    /// another wire version is recognised as such, in a batch or alone.
    #[test]
    fn frames_versions_and_garbage() {
        let jobs: Vec<Job> = (0..2).map(noop_job).collect();
        let encoded: Vec<Vec<u8>> = jobs.iter().map(|j| encode(j).unwrap()).collect();
        let msg = encode_batch(&encoded);
        let cut = decode_job_items(&msg[..msg.len() - 2]);
        assert!(matches!(&cut[..], [JobItem::Job(_), JobItem::Undecodable(_)]), "{cut:?}");
        for garbage in [&b"\xff\x00garbage"[..], b"", &[0xdd, 0xff, 0xff, 0xff, 0xff]] {
            let items = decode_job_items(garbage);
            assert!(matches!(&items[..], [JobItem::Undecodable(_)]), "{items:?}");
        }
        let mut future = jobs[0].clone();
        future.v = crate::WIRE_VERSION + 1;
        let items = decode_job_items(&encode(&future).unwrap());
        assert!(matches!(&items[..], [JobItem::OtherVersion(v)] if *v == future.v), "{items:?}");
        // A future version whose fields changed is still recognised by its version.
        let other = encode(&std::collections::BTreeMap::from([("v", 9u16), ("id", 3)])).unwrap();
        let items = decode_job_items(&encode_batch(&[other, encoded[0].clone()]));
        assert!(matches!(&items[..], [JobItem::OtherVersion(9), JobItem::Job(_)]), "{items:?}");
    }
}

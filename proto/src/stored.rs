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
//! [`COMPRESS_FROM`] bytes is stored as the marker and a second byte naming how, then a
//! zstd frame of the rest, when that is smaller. `0xc2`: with the built-in dictionary
//! `dict/answers-v1.zdict` (64 KiB trained on English prose of public benchmark data by
//! `scripts/train-zstd-dict`; a short answer alone gives zstd little to learn from, and
//! the dictionary brings what answers share: gpt-3.5-turbo's recorded answers, held out
//! from the training, shrink 2.27 times with it and 1.46 without). `0xc1`: without a
//! dictionary (text the dictionary does not help, such as Chinese, and records of earlier
//! builds). A compact record's second byte is always an array header, never `0xc1` or
//! `0xc2`, so the forms cannot be confused. The dictionary is part of the store format:
//! records written with it need exactly its bytes, so a better one would come as a new
//! file with a new second byte, never as a replacement.

use std::cell::RefCell;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};
use zstd::bulk::{Compressor, Decompressor};
use zstd::dict::{DecoderDictionary, EncoderDictionary};

use crate::codec::CodecError;
use crate::id::JobId;
use crate::result::{Completion, JobResult, Outcome};

/// First byte of a record in the compact form (never used by MessagePack).
const MARKER: u8 = 0xc1;
/// Second byte of a record compressed without a dictionary (a compact record's is an
/// array header).
const COMPRESSED: u8 = 0xc1;
/// Second byte of a record compressed with [`ANSWERS_V1`].
const COMPRESSED_DICT: u8 = 0xc2;
/// The built-in dictionary (see the module docs). Never change these bytes.
static ANSWERS_V1: &[u8] = include_bytes!("../dict/answers-v1.zdict");
/// Compact records at least this long are compressed: below it, zstd's frame header and
/// the short text leave little to gain for the CPU.
pub const COMPRESS_FROM: usize = 128;
/// zstd's level: 19. A record is written once and kept for the run, and records are
/// compressed one by one (the engine's blocks are LZ4, which gains nothing on them), so
/// the stronger level pays: gpt-3.5-turbo's short answers in both stores take 1.30 × the
/// text at 19, 1.34 × at 9 and 1.37 × at 3 (zstd's default), for 20,000, 34,000 and
/// 61,000 jobs/s written (`halyard-bench --bin store`, 50,000 jobs), far more than a
/// run's answers arrive at. The level is the writer's choice: any level reads back alike.
const LEVEL: i32 = 19;
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
        if let Some((how, z)) = compress(&buf[1..]) {
            if z.len() + 2 < buf.len() {
                let mut out = Vec::with_capacity(z.len() + 2);
                out.extend_from_slice(&[MARKER, how]);
                out.extend_from_slice(&z);
                return Ok(out);
            }
        }
    }
    Ok(buf)
}

/// This thread's compressor and decompressor with the built-in dictionary (each holds a
/// zstd context; the dictionary itself is prepared once per process).
struct DictCodec {
    compressor: Compressor<'static>,
    decompressor: Decompressor<'static>,
}

thread_local! {
    static DICT_CODEC: RefCell<Option<DictCodec>> = const { RefCell::new(None) };
}

/// Run `f` with this thread's [`DictCodec`]; `None` if zstd cannot make one.
fn with_dict_codec<R>(f: impl FnOnce(&mut DictCodec) -> R) -> Option<R> {
    static ENCODER: OnceLock<EncoderDictionary<'static>> = OnceLock::new();
    static DECODER: OnceLock<DecoderDictionary<'static>> = OnceLock::new();
    DICT_CODEC.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            let enc = ENCODER.get_or_init(|| EncoderDictionary::copy(ANSWERS_V1, LEVEL));
            let dec = DECODER.get_or_init(|| DecoderDictionary::copy(ANSWERS_V1));
            *slot = Some(DictCodec {
                compressor: Compressor::with_prepared_dictionary(enc).ok()?,
                decompressor: Decompressor::with_prepared_dictionary(dec).ok()?,
            });
        }
        slot.as_mut().map(f)
    })
}

/// A zstd frame of `raw` and the second byte that says how it was made: with the
/// dictionary, or without when the dictionary does not make it smaller than `raw`.
fn compress(raw: &[u8]) -> Option<(u8, Vec<u8>)> {
    let with_dict = with_dict_codec(|c| c.compressor.compress(raw).ok()).flatten();
    match with_dict {
        Some(z) if z.len() < raw.len() => Some((COMPRESSED_DICT, z)),
        _ => zstd::bulk::compress(raw, LEVEL).ok().map(|z| (COMPRESSED, z)),
    }
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
    let decompress_err = |reason: String| CodecError::Decompress { what, len: bytes.len(), reason };
    Some(match rest.split_first() {
        Some((&how, frame)) if how == COMPRESSED || how == COMPRESSED_DICT => {
            match expand(how, frame) {
                Ok(raw) => decode(&raw),
                Err(reason) => Err(decompress_err(reason)),
            }
        }
        _ => decode(rest),
    })
}

/// The bytes of zstd frame `frame`, made as `how` says ([`COMPRESSED`] or
/// [`COMPRESSED_DICT`]).
fn expand(how: u8, frame: &[u8]) -> Result<Vec<u8>, String> {
    let cap = expanded_len(frame);
    if how == COMPRESSED_DICT {
        match with_dict_codec(|c| c.decompressor.decompress(frame, cap)) {
            Some(r) => r.map_err(|e| e.to_string()),
            None => Err("zstd cannot load the built-in dictionary".into()),
        }
    } else {
        zstd::bulk::decompress(frame, cap).map_err(|e| e.to_string())
    }
}

/// First byte of bytes [`pack`] kept as they were (compression made them no smaller).
const PACKED_RAW: u8 = 0x00;

/// `raw` (a block of many records, `halyard_store::logged`) for the store: a byte naming
/// how, then a zstd frame of it, with the built-in dictionary or without, or `raw`
/// itself when compression makes it no smaller. Records compressed together share what
/// a record alone cannot give zstd: short answers shrink about 3 times in blocks of 4
/// KiB against 2.2 one at a time.
pub fn pack(raw: &[u8]) -> Vec<u8> {
    match compress(raw) {
        Some((how, z)) if z.len() < raw.len() => {
            let mut out = Vec::with_capacity(z.len() + 1);
            out.push(how);
            out.extend_from_slice(&z);
            out
        }
        _ => {
            let mut out = Vec::with_capacity(raw.len() + 1);
            out.push(PACKED_RAW);
            out.extend_from_slice(raw);
            out
        }
    }
}

/// The bytes [`pack`] was given, or why they cannot be had.
pub fn unpack(packed: &[u8]) -> Result<std::borrow::Cow<'_, [u8]>, String> {
    match packed.split_first() {
        Some((&PACKED_RAW, raw)) => Ok(std::borrow::Cow::Borrowed(raw)),
        Some((&how, frame)) if how == COMPRESSED || how == COMPRESSED_DICT => {
            expand(how, frame).map(std::borrow::Cow::Owned)
        }
        Some((how, _)) => Err(format!("unknown packing {how:#04x}")),
        None => Err("empty".into()),
    }
}

/// `record` with its own compression undone (a compressed compact record becomes the
/// compact record it was), so that a block compresses it together with its neighbours;
/// any other record as it is, and so is a frame that does not expand (its reader reports
/// it). Both forms decode alike.
pub fn plain(record: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    if let [MARKER, how, frame @ ..] = record {
        if *how == COMPRESSED || *how == COMPRESSED_DICT {
            if let Ok(raw) = expand(*how, frame) {
                let mut out = Vec::with_capacity(raw.len() + 1);
                out.push(MARKER);
                out.extend_from_slice(&raw);
                return std::borrow::Cow::Owned(out);
            }
        }
    }
    std::borrow::Cow::Borrowed(record)
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
            usage: Usage { prompt_tokens: 12, completion_tokens: 3, cache: None },
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
            refusal: false,
            source: Default::default(),
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

    /// Issue 51: where an answer came from round-trips in both forms, with and without a
    /// refusal before it; a paid completion is written as before the field (six fields by
    /// position), so records written before it read as paid.
    #[test]
    fn answer_source_round_trips() {
        use crate::result::AnswerSource;
        for source in [AnswerSource::Paid, AnswerSource::MachineCache, AnswerSource::SharedCache] {
            for refusal in [false, true] {
                let c = Completion { refusal, source, ..completion("four", false) };
                let compact = encode_completion(&c).unwrap();
                assert_eq!(decode_completion(&compact).unwrap(), c);
                let named = crate::encode(&c).unwrap();
                assert_eq!(crate::decode::<Completion>("named", &named).unwrap(), c);
                let json = serde_json::to_string(&c).unwrap();
                assert_eq!(serde_json::from_str::<Completion>(&json).unwrap(), c);
                if source == AnswerSource::Paid && !refusal {
                    // MARKER, then a fixarray of 6.
                    assert_eq!(&compact[..2], &[MARKER, 0x96]);
                    assert!(!json.contains("source"), "{json}");
                }
            }
        }
    }

    /// Issue 29: a refusal round-trips in both forms, with and without log-probabilities
    /// (the compact form writes fields by position, so `logprobs` is always written before
    /// it), and a record written before the flag existed reads as not refused.
    #[test]
    fn refusal_flag_round_trips() {
        for lp in [false, true] {
            let c = Completion { refusal: true, ..completion("I can't help with that.", lp) };
            assert_eq!(decode_completion(&encode_completion(&c).unwrap()).unwrap(), c);
            assert_eq!(decode_completion(&crate::encode(&c).unwrap()).unwrap(), c);
            assert_eq!(c.kind(), crate::AnswerKind::Refusal);
        }
        // A record of the build before: five fields, no logprobs, no flag.
        #[derive(Serialize)]
        struct Before(String, Usage, u64, Option<String>, u32);
        let mut old = vec![MARKER];
        rmp_serde::encode::write(&mut old, &Before("a".into(), Usage::default(), 1, None, 1))
            .unwrap();
        let c = decode_completion(&old).unwrap();
        assert!(!c.refusal && c.logprobs.is_none());
        assert_eq!(c.kind(), crate::AnswerKind::Text);
        assert_eq!(Completion { text: " \n".into(), ..c }.kind(), crate::AnswerKind::Empty);
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
            refusal: false,
            source: Default::default(),
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
        let bad_dict_frame = [MARKER, COMPRESSED_DICT, 0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x01];
        // A frame that was made with the dictionary does not read without it, and
        // the reverse: the second byte must say how.
        let text = "The capital of France is Paris, on the river Seine. ".repeat(8);
        let z = encode_completion(&completion(&text, false)).unwrap();
        assert_eq!(z[1], COMPRESSED_DICT);
        let mut swapped = z.clone();
        swapped[1] = COMPRESSED;
        for bad in [
            &swapped[..],
            &bad_dict_frame,
            &[MARKER, COMPRESSED_DICT],
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
        assert_eq!(&z[..2], &[MARKER, COMPRESSED_DICT]);
        assert!(z.len() * 3 < text.len(), "{} bytes for {} of text", z.len(), text.len());
        assert_eq!(decode_completion(&z).unwrap(), c);
        let r = StoredResult { outcome: Outcome::Done(c.clone()), deliveries: 2, cached: false };
        let zr = encode_result(&r).unwrap();
        assert_eq!(&zr[..2], &[MARKER, COMPRESSED_DICT]);
        assert_eq!(decode_result(&zr).unwrap(), r);
        // Records compressed without the dictionary (earlier builds) still read.
        let compact = rmp_serde::to_vec(&c).unwrap();
        let mut old = vec![MARKER, COMPRESSED];
        old.extend(zstd::bulk::compress(&compact, LEVEL).unwrap());
        assert_eq!(decode_completion(&old).unwrap(), c);
        // Short: plain.
        let short = encode_completion(&completion("short", false)).unwrap();
        assert!(short[1] != COMPRESSED && short[1] != COMPRESSED_DICT);
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

    /// A short English answer (written for this test, in the manner of the fact-checking
    /// answers AutoHall recorded; not in the dictionary's samples) is stored in fewer bytes with the dictionary than
    /// without; text the dictionary does not help (Chinese news, UHGEval) is stored in
    /// whichever form is smaller, and every form reads back (from any thread: each has
    /// its own zstd contexts).
    #[test]
    fn the_dictionary_helps_short_english_answers() {
        let answer = "Based on the evidence provided, the claim that global warming is \
            driving polar bears toward extinction is supported. The evidence states that \
            polar bears depend on sea ice to hunt seals, and that the loss of Arctic sea ice \
            caused by rising temperatures has reduced their access to food.";
        let c = completion(answer, false);
        let z = encode_completion(&c).unwrap();
        let compact = rmp_serde::to_vec(&c).unwrap();
        let plain = zstd::bulk::compress(&compact, LEVEL).unwrap();
        assert_eq!(z[1], COMPRESSED_DICT);
        assert!(
            (z.len() - 2) * 4 < plain.len() * 3,
            "{} bytes with the dictionary, {} without, {} raw",
            z.len() - 2,
            plain.len(),
            compact.len()
        );
        let chinese = "新华社北京电 国家统计局今天发布数据显示，今年前三季度国内生产总值同比增长，\
            其中第三产业增加值增长较快，消费对经济增长的贡献率继续提高。";
        let zc = encode_completion(&completion(chinese, false)).unwrap();
        assert!(zc.len() <= 1 + rmp_serde::to_vec(&completion(chinese, false)).unwrap().len());
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let (z, zc, c) = (z.clone(), zc.clone(), c.clone());
                std::thread::spawn(move || {
                    assert_eq!(decode_completion(&z).unwrap(), c);
                    assert_eq!(decode_completion(&zc).unwrap().text, chinese);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }

    /// A compressed record comes out of [`plain`] as the compact record it was, and
    /// decodes alike; other records pass as they are. [`pack`] keeps what compression
    /// does not shrink, and [`unpack`] gives back what it was given, or an error naming
    /// the packing.
    #[test]
    fn plain_records_and_packed_blocks_round_trip() {
        let text = "The evidence does not support the claim. ".repeat(8);
        let c = completion(&text, false);
        let z = encode_completion(&c).unwrap();
        assert_eq!(&z[..2], &[MARKER, COMPRESSED_DICT]);
        let p = plain(&z);
        assert_eq!(p[0], MARKER);
        assert!(p.len() > z.len());
        assert_eq!(decode_completion(&p).unwrap(), c);
        let short = encode_completion(&completion("short", false)).unwrap();
        assert!(matches!(plain(&short), std::borrow::Cow::Borrowed(_)));
        // A damaged frame is left for its reader to report.
        let damaged = [MARKER, COMPRESSED_DICT, 1, 2, 3];
        assert_eq!(&plain(&damaged)[..], &damaged[..]);
        assert!(decode_completion(&plain(&damaged)).is_err());
        // Many records together: packed smaller than the records packed one by one.
        let records: Vec<Vec<u8>> = (0..16)
            .map(|i| {
                plain(&encode_completion(&completion(&format!("{i}: {text}"), false)).unwrap())
                    .into_owned()
            })
            .collect();
        let block = records.concat();
        let packed = pack(&block);
        let alone: usize = records.iter().map(|r| pack(r).len()).sum();
        assert!(packed.len() * 2 < alone, "{} packed together, {alone} alone", packed.len());
        assert_eq!(&unpack(&packed).unwrap()[..], &block[..]);
        let tiny = pack(b"ab");
        assert_eq!(tiny, [PACKED_RAW, b'a', b'b']);
        assert_eq!(&unpack(&tiny).unwrap()[..], b"ab");
        assert!(unpack(&[0x7f, 1]).unwrap_err().contains("0x7f"));
        assert!(unpack(&[]).is_err());
        assert!(unpack(&[COMPRESSED_DICT, 9, 9]).is_err());
    }
}

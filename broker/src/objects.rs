//! Messages too large for one NATS message: their bytes travel through JetStream's
//! object store, and the message carries a reference.
//!
//! A job or results message whose payload would pass the server's `max_payload`
//! ([`crate::Broker::payload_limit`]) is stored as an object in the bucket [`BUCKET`]
//! (chunked by the object store), and the message is published with an empty payload
//! and the header [`HEADER`] holding the object's reference, `<name>/<key>`.
//!
//! Objects are sealed by convergent encryption: the key is derived from the bytes
//! ([`KEY_CONTEXT`], BLAKE3), the object is the bytes sealed with it (ChaCha20-Poly1305,
//! the name as associated data), and the name is `<run>.<blake3 of the key>` (hex). So
//! - whoever may read the bucket but not the message (any worker credential, for every
//!   run's objects: NATS cannot scope the object store's chunk subjects) reads sealed
//!   bytes only: an object's content goes exactly where its message goes;
//! - a receiver checks what it reads against the reference (a message from the broker is
//!   untrusted input; so is an object): bytes that do not open with the key, or open to
//!   bytes that do not derive it, are refused, so a rewritten object (a worker may roll
//!   up any object's metadata) costs a re-publication, never a wrong payload;
//! - the same bytes put twice (a publish retried, a job re-published) are one object,
//!   stored once;
//! - the objects of a run are found by their prefix and deleted with the run
//!   ([`delete_run`], when its report is written).
//!
//! A receiver reads at most [`MAX_OBJECT_BYTES`]: an object that claims more is refused
//! before it is read.

use async_nats::jetstream::message::PublishMessage;
use std::time::Duration;

use async_nats::jetstream::object_store::{InfoErrorKind, ObjectInfo, ObjectStore};
use async_nats::jetstream::stream::Stream;
use async_nats::HeaderMap;
use futures::StreamExt;
use uuid::Uuid;

use crate::{Broker, BrokerError};

pub use crate::layout::{OBJECTS_BUCKET as BUCKET, OBJECTS_MAX_BYTES, OBJECT_MAX_AGE};

/// Header of a message whose payload is the object it names.
pub const HEADER: &str = "Halyard-Object";

/// The largest object a receiver reads: above the largest HTTP response body a worker
/// accepts by default (64 MiB) with room for the request and framing around it.
pub const MAX_OBJECT_BYTES: usize = 128 << 20;
/// Why an object's bytes could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    /// The reference or the object is not acceptable (malformed name, another run's,
    /// too large, bytes that do not hash to the name): retrying cannot help.
    #[error("object {name}: {reason}")]
    Invalid { name: String, reason: String },
    /// No such object (never stored, or deleted with its run).
    #[error("object {name}: not found in bucket {BUCKET}")]
    Missing { name: String },
    /// The broker did not answer as it should (retry later).
    #[error("object {name}: {reason}")]
    Broker { name: String, reason: String },
}

impl ObjectError {
    /// Whether reading again later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, ObjectError::Broker { .. })
    }
}

/// The object name for `bytes` of run `run`.
pub fn name_of(run: Uuid, bytes: &[u8]) -> String {
    name_for(run, &key_of(bytes))
}

/// The BLAKE3 key-derivation context of an object's key.
pub const KEY_CONTEXT: &str = "halyard 2026-11 object key v1";

/// The key of an object holding `bytes` (derived from them: convergent encryption).
fn key_of(bytes: &[u8]) -> [u8; 32] {
    blake3::derive_key(KEY_CONTEXT, bytes)
}

fn name_for(run: Uuid, key: &[u8; 32]) -> String {
    format!("{}.{}", run.simple(), blake3::hash(key).to_hex())
}

/// Bytes a sealed object has beyond its content (ChaCha20-Poly1305's tag).
const TAG_BYTES: usize = 16;

/// `bytes` sealed with `key` under `name` (ChaCha20-Poly1305; one key seals one content
/// only, so the fixed nonce is never reused with another).
fn seal(key: &[u8; 32], name: &str, bytes: &[u8]) -> Vec<u8> {
    use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305};
    let k = LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, key).expect("a 32-byte key"));
    let mut out = Vec::with_capacity(bytes.len() + TAG_BYTES);
    out.extend_from_slice(bytes);
    k.seal_in_place_append_tag(Nonce::assume_unique_for_key([0; 12]), Aad::from(name), &mut out)
        .expect("ChaCha20-Poly1305 seals any length a message may have");
    out
}

/// The bytes `sealed` holds, if it opens with `key` under `name`.
fn open_sealed(key: &[u8; 32], name: &str, mut sealed: Vec<u8>) -> Option<Vec<u8>> {
    use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305};
    let k = LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, key).ok()?);
    let n = k
        .open_in_place(Nonce::assume_unique_for_key([0; 12]), Aad::from(name), &mut sealed)
        .ok()?
        .len();
    sealed.truncate(n);
    Some(sealed)
}

/// The reference a message carries for an object of `bytes` of run `run`.
pub fn reference_of(run: Uuid, bytes: &[u8]) -> String {
    let key = key_of(bytes);
    reference_for(&name_for(run, &key), key)
}

/// `<name>/<key hex>`, as [`parse_reference`] reads it.
fn reference_for(name: &str, key: [u8; 32]) -> String {
    format!("{name}/{}", blake3::Hash::from_bytes(key).to_hex())
}

/// The name and key of a reference `<name>/<key hex>`.
fn parse_reference(reference: &str) -> Option<(&str, [u8; 32])> {
    let (name, key) = reference.split_once('/')?;
    Some((name, *blake3::Hash::from_hex(key).ok()?.as_bytes()))
}

/// Whether a message names an object (its payload is elsewhere).
pub fn names_object(headers: Option<&HeaderMap>) -> bool {
    reference(headers).is_some()
}

/// The object a message refers to, if it has the header.
fn reference(headers: Option<&HeaderMap>) -> Option<&str> {
    headers?.get(HEADER).map(|v| v.as_str())
}

/// The run and key hash a name encodes, if it is one of ours.
fn parse_name(name: &str) -> Option<(Uuid, blake3::Hash)> {
    let (run, hash) = name.split_once('.')?;
    if run.len() != 32 || !run.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let run = Uuid::try_parse(run).ok()?;
    let hash = blake3::Hash::from_hex(hash).ok()?;
    Some((run, hash))
}

/// Open the bucket as the coordinator made it, its shape checked
/// ([`crate::layout::lookup`]); a bucket that does not exist is an error (a transient
/// one for a reader: [`ObjectError::Broker`]), never waited for: a message naming an
/// object is input, and no object is stored before the coordinator made the bucket.
/// With the bucket, its stream (whose chunks [`read_chunks`] reads).
async fn open(b: &Broker) -> Result<(ObjectStore, Stream), BrokerError> {
    let Some(stream) = crate::layout::lookup(b, &crate::layout::objects(1)).await? else {
        return Err(BrokerError::Config(format!(
            "the object bucket {BUCKET} does not exist: a coordinator (or `halyard broker init`) \
             creates it"
        )));
    };
    let store = crate::retry_js(&format!("open the object bucket {BUCKET}"), || {
        b.js.get_object_store(BUCKET)
    })
    .await?;
    Ok((store, stream))
}

/// How long a reader waits for the next chunk of an object before giving it up
/// ([`ObjectError::Broker`]): nothing may wait without a deadline. (Metadata naming
/// chunks that were never stored, which a worker credential may write, is refused before
/// any wait: see [`read_chunks`].) The whole read is bounded by this per chunk and by [`MAX_OBJECT_BYTES`].
pub const CHUNK_WAIT: Duration = Duration::from_secs(20);

/// An object's metadata, read with the object store's own call and judged as input: one
/// that does not parse, or is a link (Halyard stores no links; the object store follows
/// one without a depth limit, and a link to itself overflowed the reader's stack), or
/// names its chunks with anything but a plain token, is [`ObjectError::Invalid`].
async fn read_info(store: &ObjectStore, name: &str) -> Result<ObjectInfo, ObjectError> {
    let invalid = |reason: String| ObjectError::Invalid { name: name.to_string(), reason };
    let info = match store.info(name).await {
        Ok(i) if i.deleted => return Err(ObjectError::Missing { name: name.to_string() }),
        Ok(i) => i,
        Err(e) if e.kind() == InfoErrorKind::NotFound => {
            return Err(ObjectError::Missing { name: name.to_string() })
        }
        // async-nats's words for metadata that is not an object's (the only `Other` that
        // is not the broker's answer).
        Err(e) if e.kind() == InfoErrorKind::Other && e.to_string().contains("decode") => {
            return Err(invalid(format!("its metadata is not an object's: {e}")))
        }
        Err(e) => {
            return Err(ObjectError::Broker { name: name.to_string(), reason: e.to_string() })
        }
    };
    if let Some(link) = info.options.as_ref().and_then(|o| o.link.as_ref()) {
        return Err(invalid(format!(
            "its metadata makes it a link (to {:?} in bucket {:?}); Halyard stores no links",
            link.name.as_deref().unwrap_or_default(),
            link.bucket
        )));
    }
    if info.nuid.is_empty() || !info.nuid.bytes().all(|c| c.is_ascii_alphanumeric()) {
        return Err(invalid(format!("its metadata names its chunks {:?}", info.nuid)));
    }
    let most = MAX_OBJECT_BYTES + TAG_BYTES;
    if info.size > most {
        return Err(invalid(format!(
            "{} bytes, more than the {MAX_OBJECT_BYTES} a message may hold",
            info.size
        )));
    }
    Ok(info)
}

/// The chunks of the object `info` describes, in order, read from the bucket's stream
/// (the object store's own reader starts from a name and follows links): at most
/// [`MAX_OBJECT_BYTES`] and its tag, each chunk within [`CHUNK_WAIT`].
async fn read_chunks(
    b: &Broker,
    stream: &Stream,
    info: &ObjectInfo,
) -> Result<Vec<u8>, ObjectError> {
    use async_nats::jetstream::consumer::push::OrderedConfig;
    let name = &info.name;
    let broker_err = |reason: String| ObjectError::Broker { name: name.to_string(), reason };
    let most = MAX_OBJECT_BYTES + TAG_BYTES;
    let mut sealed = Vec::with_capacity(info.size);
    if info.chunks == 0 {
        return Ok(sealed);
    }
    let consumer = stream
        .create_consumer(OrderedConfig {
            deliver_subject: b.client.new_inbox(),
            filter_subject: format!("$O.{BUCKET}.C.{}", info.nuid),
            ..Default::default()
        })
        .await
        .map_err(|e| broker_err(format!("read: {e}")))?;
    // An object's chunks are stored (and acknowledged) before its metadata is published,
    // so a reader that found the metadata finds every chunk already in the stream: none
    // there means none is coming (metadata anyone may write named chunks never stored),
    // and waiting for them would only hold up the reader. Given up at once, for good.
    if consumer.cached_info().num_pending == 0 {
        return Err(ObjectError::Invalid {
            name: name.to_string(),
            reason: format!(
                "its metadata names {} chunks ({:?}) that are not stored",
                info.chunks, info.nuid
            ),
        });
    }
    let mut chunks = consumer.messages().await.map_err(|e| broker_err(format!("read: {e}")))?;
    loop {
        let chunk = match tokio::time::timeout(CHUNK_WAIT, chunks.next()).await {
            Ok(Some(Ok(m))) => m,
            Ok(Some(Err(e))) => return Err(broker_err(format!("read: {e}"))),
            Ok(None) => return Err(broker_err("read: the chunks ended early".into())),
            Err(_) => {
                return Err(broker_err(format!(
                    "read: no chunk came within {} s after {} bytes (its metadata says {} \
                     bytes in {} chunks)",
                    CHUNK_WAIT.as_secs(),
                    sealed.len(),
                    info.size,
                    info.chunks
                )))
            }
        };
        if sealed.len() + chunk.payload.len() > most {
            return Err(ObjectError::Invalid {
                name: name.to_string(),
                reason: format!("more than the {MAX_OBJECT_BYTES} bytes a message may hold"),
            });
        }
        sealed.extend_from_slice(&chunk.payload);
        let pending = chunk.info().map_err(|e| broker_err(format!("read: {e}")))?.pending;
        if pending == 0 {
            return Ok(sealed);
        }
    }
}

/// Store `bytes` of run `run` as a sealed object (unless it is there already) and return
/// its reference, for a message's [`HEADER`].
pub async fn put(b: &Broker, run: Uuid, bytes: &[u8]) -> Result<String, BrokerError> {
    let key = key_of(bytes);
    let name = name_for(run, &key);
    let reference = reference_for(&name, key);
    let (store, stream) = open(b).await?;
    // Skipped only when the object there opens to these very bytes: metadata is anyone's
    // to write (a worker credential), so same-size garbage under this name is replaced.
    if let Ok(info) = read_info(&store, &name).await {
        if info.size == bytes.len() + TAG_BYTES {
            if let Ok(sealed) = read_chunks(b, &stream, &info).await {
                if open_sealed(&key, &name, sealed).is_some_and(|b| b == bytes) {
                    return Ok(reference);
                }
            }
        }
    }
    let sealed = seal(&key, &name, bytes);
    match store.put(name.as_str(), &mut &sealed[..]).await {
        Ok(_) => Ok(reference),
        // Stored, and its metadata published; only the chunks of an earlier copy (a put
        // racing another of the same bytes) are left behind, until the run's objects go.
        Err(e) if e.kind() == async_nats::jetstream::object_store::PutErrorKind::PurgeOldChunks => {
            Ok(reference)
        }
        Err(e) => Err(BrokerError::js(format!("store object {name}"), e)),
    }
}

/// A message carrying `payload` of run `run`: the payload itself, or, when it is larger
/// than the server's `max_payload`, an empty message whose [`HEADER`] holds the reference
/// of the object it was stored as. `stored` keeps that reference across a caller's
/// retries, so the object is stored once. The caller adds the message id.
pub async fn message(
    b: &Broker,
    run: Uuid,
    payload: &bytes::Bytes,
    stored: &mut Option<String>,
) -> Result<PublishMessage, BrokerError> {
    let m = PublishMessage::build();
    if payload.len() <= b.payload_limit() {
        return Ok(m.payload(payload.clone()));
    }
    let reference = match stored {
        Some(r) => r,
        None => stored.insert(put(b, run, payload).await?),
    };
    Ok(m.header(HEADER, reference.as_str()))
}

/// The bytes of the object `reference` (`<name>/<key>`, as [`put`] returns it) names,
/// opened with its key and checked against it; with `run`, the object must belong to
/// that run.
pub async fn fetch(b: &Broker, reference: &str, run: Option<Uuid>) -> Result<Vec<u8>, ObjectError> {
    let Some((name, key)) = parse_reference(reference) else {
        return Err(ObjectError::Invalid {
            name: reference.to_string(),
            reason: "not an object reference of the form <run>.<hex>/<key hex>".into(),
        });
    };
    let invalid = |reason: String| ObjectError::Invalid { name: name.to_string(), reason };
    let Some((of_run, hash)) = parse_name(name) else {
        return Err(invalid("not an object name of the form <run>.<blake3 hex>".into()));
    };
    if let Some(r) = run {
        if r != of_run {
            return Err(invalid(format!("belongs to run {of_run}, not to {r}")));
        }
    }
    if blake3::hash(&key) != hash {
        return Err(invalid("its key is not the one its name was made from".into()));
    }
    let broker_err = |reason: String| ObjectError::Broker { name: name.to_string(), reason };
    let (store, stream) = open(b).await.map_err(|e| broker_err(e.to_string()))?;
    let info = read_info(&store, name).await?;
    if info.name != name {
        return Err(invalid(format!("its metadata names another object, {:?}", info.name)));
    }
    let sealed = read_chunks(b, &stream, &info).await?;
    let n = sealed.len();
    let Some(bytes) = open_sealed(&key, name, sealed) else {
        return Err(invalid(format!("its {n} bytes do not open with its key")));
    };
    if key_of(&bytes) != key {
        return Err(invalid(format!("its {} bytes do not derive its key", bytes.len())));
    }
    Ok(bytes)
}

/// The payload of a message: its own bytes, or those of the object its header names.
pub async fn payload_of(
    b: &Broker,
    headers: Option<&HeaderMap>,
    payload: &bytes::Bytes,
    run: Option<Uuid>,
) -> Result<bytes::Bytes, ObjectError> {
    match reference(headers) {
        None => Ok(payload.clone()),
        Some(reference) => fetch(b, reference, run).await.map(bytes::Bytes::from),
    }
}

/// Delete every object of run `run`; the number deleted. Metadata that does not parse
/// (anyone with a worker credential may write some) and an object that cannot be deleted
/// are passed over with a warning, not an end to the deletion: what is left expires after
/// [`OBJECT_MAX_AGE`].
pub async fn delete_run(b: &Broker, run: Uuid) -> Result<usize, BrokerError> {
    let (store, _) = open(b).await?;
    let prefix = format!("{}.", run.simple());
    let mut list = store.list().await.map_err(|e| BrokerError::js("list objects", e))?;
    let mut names = Vec::new();
    let mut unreadable = 0usize;
    loop {
        let info = match tokio::time::timeout(CHUNK_WAIT, list.next()).await {
            Ok(Some(info)) => info,
            Ok(None) => break,
            Err(_) => return Err(BrokerError::js("list objects", "no answer within 20 s")),
        };
        match info {
            Ok(i) if !i.deleted && i.name.starts_with(&prefix) => names.push(i.name),
            Ok(_) => {}
            Err(_) => unreadable += 1,
        }
    }
    if unreadable > 0 {
        tracing::warn!(
            unreadable,
            "objects whose metadata is not an object's were passed over (they expire after {} days)",
            OBJECT_MAX_AGE.as_secs() / 86_400
        );
    }
    let mut deleted = 0;
    for name in &names {
        match store.delete(name).await {
            Ok(()) => deleted += 1,
            Err(e) => tracing::warn!(object = %name, error = %e, "could not delete an object"),
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_content_addressed_and_parsed_strictly() {
        let run = Uuid::from_u128(7);
        let name = name_of(run, b"abc");
        let (r, h) = parse_name(&name).unwrap();
        assert_eq!((r, h), (run, blake3::hash(&key_of(b"abc"))));
        let reference = reference_of(run, b"abc");
        let (n, key) = parse_reference(&reference).unwrap();
        assert_eq!((n, key), (name.as_str(), key_of(b"abc")));
        assert!(parse_reference(&name).is_none(), "a name alone is no reference");
        assert_ne!(name_of(run, b"abd"), name);
        for bad in [
            "",
            "abc",
            &format!("{}.zz", run.simple()),
            &format!("{}.{}", run, blake3::hash(b"abc").to_hex()),
            &format!("../{name}"),
        ] {
            assert!(parse_name(bad).is_none(), "{bad}");
        }
    }

    /// Sealed bytes show nothing of the content, open only with their key under their
    /// name, and the same content seals the same way (one object per content).
    #[test]
    fn objects_are_sealed_with_a_key_only_the_content_gives() {
        let run = Uuid::from_u128(7);
        let text = b"the answer of a model, long enough to look for: 0123456789abcdef".repeat(8);
        let (key, name) = (key_of(&text), name_of(run, &text));
        let sealed = seal(&key, &name, &text);
        assert_eq!(sealed.len(), text.len() + TAG_BYTES);
        assert!(!sealed.windows(16).any(|w| text.windows(16).any(|t| t == w)), "plaintext leaked");
        assert_eq!(seal(&key, &name, &text), sealed, "convergent: one object per content");
        assert_eq!(open_sealed(&key, &name, sealed.clone()).as_deref(), Some(&text[..]));
        let other = key_of(b"other");
        assert!(open_sealed(&other, &name, sealed.clone()).is_none(), "opened with another key");
        assert!(
            open_sealed(&key, &name_of(run, b"x"), sealed.clone()).is_none(),
            "under another name"
        );
        let mut flipped = sealed;
        flipped[3] ^= 1;
        assert!(open_sealed(&key, &name, flipped).is_none(), "a changed byte went unnoticed");
    }
}

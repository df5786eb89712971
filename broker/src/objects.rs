//! Messages too large for one NATS message: their bytes travel through JetStream's
//! object store, and the message carries a reference.
//!
//! A job or results message whose payload would pass the server's `max_payload`
//! ([`crate::Broker::payload_limit`]) is stored as an object in the bucket [`BUCKET`]
//! (chunked by the object store), and the message is published with an empty payload
//! and the header [`HEADER`] naming the object. The name is content-addressed:
//! `<run>.<blake3 of the bytes>` (hex), so
//! - a receiver checks what it reads against the name (a message from the broker is
//!   untrusted input; so is an object): bytes whose hash differs are refused;
//! - the same bytes put twice (a publish retried, a job re-published) are one object,
//!   stored once;
//! - the objects of a run are found by their prefix and deleted with the run
//!   ([`delete_run`], when its report is written).
//!
//! A receiver reads at most [`MAX_OBJECT_BYTES`]: an object that claims more is refused
//! before it is read.

use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::object_store::{GetErrorKind, InfoErrorKind, ObjectStore};
use async_nats::jetstream::stream;
use async_nats::HeaderMap;
use futures::StreamExt;
use tokio::io::AsyncReadExt;
use uuid::Uuid;

use crate::{Broker, BrokerError};

/// The object store bucket for oversized messages (stream `OBJ_halyard_objects`).
pub const BUCKET: &str = "halyard_objects";

/// Header of a message whose payload is the object it names.
pub const HEADER: &str = "Halyard-Object";

/// Objects not deleted with their run (a run abandoned, or stopped for good) expire after
/// this long. Safe whenever it happens: a job message whose object is gone is terminated
/// and the job published again by the stall check (the object stored anew), a results
/// message whose object is gone is dropped and its job answered again from a worker's
/// checkpoint.
pub const OBJECT_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(14 * 24 * 3600);

/// The largest object a receiver reads: above the largest HTTP response body a worker
/// accepts by default (64 MiB) with room for the request and framing around it.
pub const MAX_OBJECT_BYTES: usize = 128 << 20;
/// Bytes the object bucket holds at most (a run's objects go when it completes, any
/// object after [`OBJECT_MAX_AGE`]); past it a put is refused (discard policy `new`) and
/// the publisher keeps its payload and tries again later.
pub const OBJECTS_MAX_BYTES: i64 = 4 << 30;

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
    format!("{}.{}", run.simple(), blake3::hash(bytes).to_hex())
}

/// Whether a message names an object (its payload is elsewhere).
pub fn names_object(headers: Option<&HeaderMap>) -> bool {
    reference(headers).is_some()
}

/// The object a message refers to, if it has the header.
fn reference(headers: Option<&HeaderMap>) -> Option<&str> {
    headers?.get(HEADER).map(|v| v.as_str())
}

/// The run and content hash a name encodes, if it is one of ours.
fn parse_name(name: &str) -> Option<(Uuid, blake3::Hash)> {
    let (run, hash) = name.split_once('.')?;
    if run.len() != 32 || !run.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let run = Uuid::try_parse(run).ok()?;
    let hash = blake3::Hash::from_hex(hash).ok()?;
    Some((run, hash))
}

/// The bucket's stream as [`crate::layout::init`] creates it (in the object store's
/// layout, created directly as for KV buckets: see [`crate::kv`]).
pub fn config(replicas: usize) -> stream::Config {
    stream::Config {
        name: format!("OBJ_{BUCKET}"),
        subjects: vec![format!("$O.{BUCKET}.C.>"), format!("$O.{BUCKET}.M.>")],
        storage: stream::StorageType::File,
        num_replicas: replicas,
        max_age: OBJECT_MAX_AGE,
        max_bytes: OBJECTS_MAX_BYTES,
        discard: stream::DiscardPolicy::New,
        allow_rollup: true,
        allow_direct: true,
        ..Default::default()
    }
}

/// Open the bucket as the coordinator made it, its shape checked
/// ([`crate::layout::lookup`]); a bucket that does not exist is an error (a transient
/// one for a reader: [`ObjectError::Broker`]), never waited for: a message naming an
/// object is input, and no object is stored before the coordinator made the bucket.
async fn open(b: &Broker) -> Result<ObjectStore, BrokerError> {
    if crate::layout::lookup(b, &config(1)).await?.is_none() {
        return Err(BrokerError::Config(format!(
            "the object bucket {BUCKET} does not exist: a coordinator (or `halyard broker init`) \
             creates it"
        )));
    }
    crate::retry_js(&format!("open the object bucket {BUCKET}"), || b.js.get_object_store(BUCKET)).await
}

/// Store `bytes` of run `run` as an object (unless it is there already) and return its
/// name, for a message's [`HEADER`].
pub async fn put(b: &Broker, run: Uuid, bytes: &[u8]) -> Result<String, BrokerError> {
    let name = name_of(run, bytes);
    let store = open(b).await?;
    if let Ok(info) = store.info(&name).await {
        if !info.deleted && info.size == bytes.len() {
            return Ok(name);
        }
    }
    match store.put(name.as_str(), &mut &bytes[..]).await {
        Ok(_) => Ok(name),
        // Stored, and its metadata published; only the chunks of an earlier copy (a put
        // racing another of the same bytes) are left behind, until the run's objects go.
        Err(e) if e.kind() == async_nats::jetstream::object_store::PutErrorKind::PurgeOldChunks => {
            Ok(name)
        }
        Err(e) => Err(BrokerError::js(format!("store object {name}"), e)),
    }
}

/// A message carrying `payload` of run `run`: the payload itself, or, when it is larger
/// than the server's `max_payload`, an empty message whose [`HEADER`] names the object it
/// was stored as. `stored` keeps that name across a caller's retries, so the object is
/// stored once. The caller adds the message id.
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
    let name = match stored {
        Some(name) => name,
        None => stored.insert(put(b, run, payload).await?),
    };
    Ok(m.header(HEADER, name.as_str()))
}

/// The bytes of object `name`, checked against the name; with `run`, the object must
/// belong to that run.
pub async fn fetch(b: &Broker, name: &str, run: Option<Uuid>) -> Result<Vec<u8>, ObjectError> {
    let invalid = |reason: String| ObjectError::Invalid { name: name.to_string(), reason };
    let Some((of_run, hash)) = parse_name(name) else {
        return Err(invalid("not an object name of the form <run>.<blake3 hex>".into()));
    };
    if let Some(r) = run {
        if r != of_run {
            return Err(invalid(format!("belongs to run {of_run}, not to {r}")));
        }
    }
    let broker_err = |reason: String| ObjectError::Broker { name: name.to_string(), reason };
    let store = open(b).await.map_err(|e| broker_err(e.to_string()))?;
    let info = match store.info(name).await {
        Ok(i) if i.deleted => return Err(ObjectError::Missing { name: name.to_string() }),
        Ok(i) => i,
        Err(e) if e.kind() == InfoErrorKind::NotFound => {
            return Err(ObjectError::Missing { name: name.to_string() })
        }
        Err(e) => return Err(broker_err(e.to_string())),
    };
    if info.size > MAX_OBJECT_BYTES {
        return Err(invalid(format!(
            "{} bytes, more than the {MAX_OBJECT_BYTES} a message may hold",
            info.size
        )));
    }
    let object = match store.get(name).await {
        Ok(o) => o,
        Err(e) if e.kind() == GetErrorKind::NotFound => {
            return Err(ObjectError::Missing { name: name.to_string() })
        }
        Err(e) => return Err(broker_err(e.to_string())),
    };
    let mut bytes = Vec::with_capacity(info.size);
    // One byte past the limit tells an object that grew beyond what its info said.
    let read = object.take(MAX_OBJECT_BYTES as u64 + 1).read_to_end(&mut bytes).await;
    if let Err(e) = read {
        // The object store's own digest check reports a mismatch as an error here.
        return Err(broker_err(format!("read: {e}")));
    }
    if bytes.len() > MAX_OBJECT_BYTES {
        return Err(invalid(format!("more than the {MAX_OBJECT_BYTES} bytes a message may hold")));
    }
    if blake3::hash(&bytes) != hash {
        return Err(invalid(format!("its {} bytes do not hash to its name", bytes.len())));
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
        Some(name) => fetch(b, name, run).await.map(bytes::Bytes::from),
    }
}

/// Delete every object of run `run`; the number deleted.
pub async fn delete_run(b: &Broker, run: Uuid) -> Result<usize, BrokerError> {
    let store = open(b).await?;
    let prefix = format!("{}.", run.simple());
    let mut list = store.list().await.map_err(|e| BrokerError::js("list objects", e))?;
    let mut names = Vec::new();
    while let Some(info) = list.next().await {
        match info {
            Ok(i) if !i.deleted && i.name.starts_with(&prefix) => names.push(i.name),
            Ok(_) => {}
            Err(e) => return Err(BrokerError::js("list objects", e)),
        }
    }
    for name in &names {
        store
            .delete(name)
            .await
            .map_err(|e| BrokerError::js(format!("delete object {name}"), e))?;
    }
    Ok(names.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_content_addressed_and_parsed_strictly() {
        let run = Uuid::from_u128(7);
        let name = name_of(run, b"abc");
        let (r, h) = parse_name(&name).unwrap();
        assert_eq!((r, h), (run, blake3::hash(b"abc")));
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
}

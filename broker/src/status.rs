//! Live status on the broker, in two JetStream key-value buckets: `halyard_status`
//! (run name → the coordinator's status JSON, rewritten every few seconds) and
//! `halyard_workers` (worker id → heartbeat JSON; entries expire when a worker stops
//! beating). `halyard status --nats URL` reads both.

use futures::StreamExt;

pub use async_nats::jetstream::kv::Store as KvStore;

use crate::{Broker, BrokerError};

pub use crate::layout::{STATUS_BUCKET, STATUS_MAX_AGE, WORKERS_BUCKET, WORKER_MAX_AGE};

/// A key-value key for any name: characters outside `[-_=.a-zA-Z0-9]` become `_`.
pub fn kv_key(name: &str) -> String {
    let k: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "-_=.".contains(c) { c } else { '_' })
        .collect();
    let k = k.trim_matches('.').to_string();
    if k.is_empty() {
        "_".into()
    } else {
        k
    }
}

/// Open a bucket of the layout for writing ([`crate::kv::open`]: waits while no
/// coordinator has made it).
pub async fn bucket(b: &Broker, spec: crate::layout::BucketSpec) -> Result<KvStore, BrokerError> {
    crate::kv::open(b, spec).await.map(|(store, _)| store)
}

pub async fn put(store: &KvStore, key: &str, value: Vec<u8>) -> Result<(), BrokerError> {
    store
        .put(kv_key(key), value.into())
        .await
        .map(|_| ())
        .map_err(|e| BrokerError::js(format!("put {key}"), e))
}

/// Every live entry of a bucket; an empty list when the bucket does not exist.
pub async fn entries(b: &Broker, name: &str) -> Result<Vec<(String, Vec<u8>)>, BrokerError> {
    let Ok(store) = b.js.get_key_value(name).await else { return Ok(Vec::new()) };
    let mut keys = match store.keys().await {
        Ok(k) => k,
        Err(e) => return Err(BrokerError::js(format!("keys of {name}"), e)),
    };
    let mut out = Vec::new();
    // The key listing reads the bucket's stream (last message per key) while writers may
    // put: a key updated meanwhile can come again. Each key once, at its latest value.
    let mut seen = std::collections::HashSet::new();
    while let Some(k) = keys.next().await {
        let k = k.map_err(|e| BrokerError::js(format!("keys of {name}"), e))?;
        if !seen.insert(k.clone()) {
            continue;
        }
        if let Some(v) =
            store.get(&k).await.map_err(|e| BrokerError::js(format!("get {name}/{k}"), e))?
        {
            out.push((k, v.to_vec()));
        }
    }
    Ok(out)
}

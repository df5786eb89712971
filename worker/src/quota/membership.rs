//! Who serves a pool right now, and the pool's control messages.
//!
//! Members register in the JetStream KV bucket [`BUCKET`] under `<pool>.<worker>` (both
//! hex-encoded, so any pool or worker name makes a valid key) and re-put their key every
//! heartbeat. The bucket's `max_age` is the membership TTL: a key not refreshed within it
//! expires, so a crashed member drops out on its own. A graceful leave deletes the key.
//!
//! Joins, leaves and cool-downs are announced on the core subject
//! `halyard.quota.<pool hex>`, so members react at once; the KV listing, re-read every
//! heartbeat, is the truth that announcements only hurry along.

use std::time::Duration;

use async_nats::jetstream::kv;
use futures::StreamExt;
use halyard_broker::{Broker, BrokerError};
use serde::{Deserialize, Serialize};

/// The KV bucket of pool members.
pub const BUCKET: &str = "halyard_quota_members";

/// A control message to every member of a pool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Announcement {
    Join { worker: String },
    Leave { worker: String },
    /// Pause the pool for `ms` milliseconds (a 429 was seen by `worker`).
    CoolDown { worker: String, ms: u64 },
}

pub fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// The core subject of a pool's announcements.
pub fn subject(pool: &str) -> String {
    format!("halyard.quota.{}", hex(pool))
}

/// One worker's registration in one pool.
pub struct Membership {
    kv: kv::Store,
    client: async_nats::Client,
    prefix: String,
    key: String,
    subject: String,
    worker: String,
}

fn err(what: &str, e: impl std::fmt::Display) -> BrokerError {
    BrokerError::js(format!("quota membership: {what}"), e)
}

/// Open the members bucket, creating it with `ttl` as its `max_age` if missing. An
/// existing bucket keeps its TTL (the first worker's), which every member then uses.
pub async fn open_bucket(broker: &Broker, ttl: Duration) -> Result<(kv::Store, Duration), BrokerError> {
    let store = match broker.js.get_key_value(BUCKET).await {
        Ok(s) => s,
        Err(_) => broker
            .js
            .create_key_value(kv::Config { bucket: BUCKET.into(), history: 1, max_age: ttl, ..Default::default() })
            .await
            .or(
                // Another worker may have created it meanwhile.
                broker.js.get_key_value(BUCKET).await,
            )
            .map_err(|e| err("cannot open the KV bucket", e))?,
    };
    let info = store.status().await.map_err(|e| err("cannot read the KV bucket's status", e))?;
    let ttl = info.info.config.max_age;
    Ok((store, if ttl.is_zero() { Duration::from_secs(10) } else { ttl }))
}

impl Membership {
    pub fn new(broker: &Broker, kv: kv::Store, pool: &str, worker: &str) -> Membership {
        let prefix = format!("{}.", hex(pool));
        Membership {
            kv,
            client: broker.client.clone(),
            key: format!("{prefix}{}", hex(worker)),
            prefix,
            subject: subject(pool),
            worker: worker.to_string(),
        }
    }

    pub fn worker(&self) -> &str {
        &self.worker
    }

    /// Put (or refresh) this worker's key.
    pub async fn heartbeat(&self) -> Result<(), BrokerError> {
        let value = serde_json::json!({ "worker": self.worker }).to_string();
        self.kv.put(&self.key, value.into()).await.map(|_| ()).map_err(|e| err("heartbeat put failed", e))
    }

    /// Members with a live key, this worker counted even if its own key is missing.
    pub async fn live(&self) -> Result<usize, BrokerError> {
        let mut keys = self.kv.keys().await.map_err(|e| err("cannot list members", e))?;
        let (mut n, mut me) = (0usize, false);
        while let Some(k) = keys.next().await {
            let k = k.map_err(|e| err("cannot list members", e))?;
            if k.starts_with(&self.prefix) {
                n += 1;
                me |= k == self.key;
            }
        }
        Ok(if me { n } else { n + 1 })
    }

    /// Delete this worker's key (graceful leave).
    pub async fn leave(&self) -> Result<(), BrokerError> {
        self.kv.delete(&self.key).await.map_err(|e| err("cannot delete member key", e))?;
        self.announce(&Announcement::Leave { worker: self.worker.clone() }).await
    }

    pub async fn subscribe(&self) -> Result<async_nats::Subscriber, BrokerError> {
        self.client.subscribe(self.subject.clone()).await.map_err(|e| err("cannot subscribe to announcements", e))
    }

    pub async fn announce(&self, a: &Announcement) -> Result<(), BrokerError> {
        let body = serde_json::to_vec(a).map_err(|e| err("cannot encode announcement", e))?;
        self.client.publish(self.subject.clone(), body.into()).await.map_err(|e| err("cannot publish announcement", e))?;
        self.client.flush().await.map_err(|e| err("cannot flush announcement", e))
    }
}

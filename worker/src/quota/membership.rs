//! Who serves a pool right now, and the pool's control messages.
//!
//! Members register in the JetStream KV bucket [`BUCKET`] under `<pool>.<worker>` (both
//! hex-encoded, so any pool or worker name makes a valid key) and re-put their key every
//! heartbeat (a quarter of the TTL). The bucket's `max_age` is three quarters of the
//! membership TTL: a key not refreshed within it expires, so a crashed member drops out
//! on its own, and the others, re-reading the membership every heartbeat, see it gone at
//! most one TTL after it last spoke. A graceful leave deletes the key (a delete marker,
//! which expires like a key): a worker may not purge the bucket's stream, which would
//! let any worker credential empty every pool's membership at once.
//!
//! The live members are the subjects of the pool's keys that hold a message, read in one
//! stream-info request (a server-side snapshot), less those whose newest message is a
//! delete marker (each read by a direct get): listing keys with a consumer can miss a
//! key that is being re-put at that moment, and a missed member would make the others
//! take too large a share. A subject whose newest message cannot be read counts as a
//! member, for the same reason.
//!
//! Joins, leaves and cool-downs are announced on the core subject
//! `halyard.quota.<pool hex>`, so members react at once; the KV listing, re-read every
//! heartbeat, is the truth that announcements only hurry along. The same subject carries
//! every pool's endpoint pauses and resumptions (see the `health` module), quota or not.

use std::time::Duration;

use async_nats::jetstream::{kv, stream};
use futures::StreamExt;
use halyard_broker::{Broker, BrokerError};
use serde::{Deserialize, Serialize};

/// The KV bucket of pool members.
pub const BUCKET: &str = halyard_broker::layout::QUOTA_MEMBERS;

/// Members of one pool counted at most (issue 49, item 5). Keys come from the broker,
/// where anyone holding the pool's worker credential may add some: fake members shrink
/// every real member's share, and each is a read per heartbeat. Counted up to this, a
/// share is never below the pool's quota / `MAX_MEMBERS`, and a heartbeat reads at most
/// this many keys; no honest quota pool comes near it (a pool's replicas are sized by
/// its quota, `halyard deploy k8s`).
pub const MAX_MEMBERS: usize = 256;

/// A control message to every member of a pool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Announcement {
    Join {
        worker: String,
    },
    Leave {
        worker: String,
    },
    /// Pause the pool for `ms` milliseconds (a 429 was seen by `worker`).
    CoolDown {
        worker: String,
        ms: u64,
    },
    /// The pool's endpoint is down (`worker` saw it, or its probe failed): stop fetching
    /// and hand held jobs back; `worker` probes again in `probe_ms` milliseconds.
    Pause {
        worker: String,
        reason: halyard_proto::OutageReason,
        probe_ms: u64,
    },
    /// The pool's endpoint answered `worker` again: resume.
    Resume {
        worker: String,
    },
}

pub fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// The core subject of a pool's announcements.
pub fn subject(pool: &str) -> String {
    format!("halyard.quota.{}", hex(pool))
}

/// Publish `a` on the pool subject `subject` and flush it out.
pub async fn announce(
    client: &async_nats::Client,
    subject: &str,
    a: &Announcement,
) -> Result<(), BrokerError> {
    let body = serde_json::to_vec(a).map_err(|e| err("cannot encode announcement", e))?;
    client
        .publish(subject.to_string(), body.into())
        .await
        .map_err(|e| err("cannot publish announcement", e))?;
    client.flush().await.map_err(|e| err("cannot flush announcement", e))
}

/// One worker's registration in one pool.
pub struct Membership {
    kv: kv::Store,
    stream: stream::Stream,
    /// `$KV.<bucket>.<pool hex>.`: the subjects of this pool's keys.
    subject_prefix: String,
    client: async_nats::Client,
    key: String,
    subject: String,
    worker: String,
}

fn err(what: &str, e: impl std::fmt::Display) -> BrokerError {
    BrokerError::js(format!("quota membership: {what}"), e)
}

/// Open the members bucket as the coordinator made it (`halyard broker init
/// --quota-ttl`, else [`halyard_broker::layout::DEFAULT_QUOTA_TTL`]), waiting while it
/// does not exist. Its keys' lifetime is ¾ of the membership TTL, which every member
/// uses: the TTL in force is returned.
pub async fn open_bucket(
    broker: &Broker,
) -> Result<(kv::Store, stream::Stream, Duration), BrokerError> {
    let spec = halyard_broker::layout::quota_members(halyard_broker::layout::DEFAULT_QUOTA_TTL);
    let (store, mut s) = halyard_broker::kv::open(broker, spec).await?;
    let max_age =
        s.info().await.map_err(|e| err("cannot read the KV bucket's stream", e))?.config.max_age;
    Ok((
        store,
        s,
        if max_age.is_zero() { Duration::from_secs(10) } else { max_age.mul_f64(4.0 / 3.0) },
    ))
}

/// Subscribe to the announcements of `pool`'s members.
pub async fn subscribe(broker: &Broker, pool: &str) -> Result<async_nats::Subscriber, BrokerError> {
    broker
        .client
        .subscribe(subject(pool))
        .await
        .map_err(|e| err("cannot subscribe to announcements", e))
}

impl Membership {
    pub fn new(
        broker: &Broker,
        kv: kv::Store,
        stream: stream::Stream,
        pool: &str,
        worker: &str,
    ) -> Membership {
        let prefix = format!("{}.", hex(pool));
        Membership {
            kv,
            stream,
            subject_prefix: format!("$KV.{BUCKET}.{prefix}"),
            client: broker.client.clone(),
            key: format!("{prefix}{}", hex(worker)),
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
        self.kv
            .put(&self.key, value.into())
            .await
            .map(|_| ())
            .map_err(|e| err("heartbeat put failed", e))
    }

    /// Members with a live key, this worker counted even if its own key is missing; at
    /// most [`MAX_MEMBERS`].
    pub async fn live(&self) -> Result<usize, BrokerError> {
        let mut info = self
            .stream
            .info_with_subjects(format!("{}*", self.subject_prefix))
            .await
            .map_err(|e| err("cannot list members", e))?;
        let own = format!("$KV.{BUCKET}.{}", self.key);
        let mut others = Vec::new();
        while let Some(s) = info.next().await {
            let (subject, count) = s.map_err(|e| err("cannot list members", e))?;
            if count > 0 && subject != own && others.len() < MAX_MEMBERS - 1 {
                others.push(subject);
            }
        }
        let prefix = format!("$KV.{BUCKET}.");
        let looks = others.iter().map(|subject| async {
            let key = subject.strip_prefix(&prefix).unwrap_or(subject);
            match self.kv.entry(key).await {
                Ok(Some(e)) => e.operation == kv::Operation::Put,
                Ok(None) => false,
                Err(_) => true,
            }
        });
        let live = futures::future::join_all(looks).await.into_iter().filter(|&l| l).count();
        Ok(live + 1)
    }

    /// Remove this worker's key (graceful leave) and tell the others.
    pub async fn leave(&self) -> Result<(), BrokerError> {
        self.kv.delete(&self.key).await.map_err(|e| err("cannot remove member key", e))?;
        self.announce(&Announcement::Leave { worker: self.worker.clone() }).await
    }

    pub async fn announce(&self, a: &Announcement) -> Result<(), BrokerError> {
        announce(&self.client, &self.subject, a).await
    }
}

//! The batches bucket ([`halyard_proto::provider_batch`]): records, claims and queue
//! ledgers, every write a compare-and-set on the key's revision so that two workers
//! never both believe they own a record or a claim.

use std::time::Duration;

use async_nats::jetstream::kv;
use halyard_broker::{Broker, BrokerError};
use halyard_proto::provider_batch::{
    claim_key, ledger_key, record_key, BatchRecord, BatchState, Claim, QueueLedger,
};
use halyard_proto::JobId;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Records and claims outlive the provider's 24-hour window by days: a run resumed the
/// next week still finds a batch that ended while nobody ran.
pub const RECORD_MAX_AGE: Duration = halyard_broker::layout::BATCHES.max_age;

#[derive(Debug, thiserror::Error)]
#[error("batches bucket, key {key}: {reason}")]
pub struct StoreError {
    pub key: String,
    pub reason: String,
    /// The value is there but is not what it should be (someone else's bytes, a record
    /// under another record's key): unlike a broker that cannot answer now, asking again
    /// will not help.
    pub invalid: bool,
}

fn err(key: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError { key: key.to_string(), reason: e.to_string(), invalid: false }
}

fn invalid(key: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError { key: key.to_string(), reason: e.to_string(), invalid: true }
}

/// A value and the revision to compare against when replacing it (0: no such key, or a
/// deleted one's revision).
pub struct Versioned<T> {
    pub value: Option<T>,
    pub revision: u64,
}

#[derive(Clone)]
pub struct Store {
    kv: kv::Store,
}

impl Store {
    pub async fn open(broker: &Broker) -> Result<Store, BrokerError> {
        let (kv, _) = halyard_broker::kv::open(broker, halyard_broker::layout::BATCHES).await?;
        Ok(Store { kv })
    }

    async fn read<T: DeserializeOwned>(&self, key: &str) -> Result<Versioned<T>, StoreError> {
        let entry = self.kv.entry(key).await.map_err(|e| err(key, e))?;
        let Some(entry) = entry else { return Ok(Versioned { value: None, revision: 0 }) };
        if entry.operation != kv::Operation::Put {
            return Ok(Versioned { value: None, revision: entry.revision });
        }
        // Someone else's bytes on a shared broker: a clear error, never a panic.
        let value = serde_json::from_slice(&entry.value)
            .map_err(|e| invalid(key, format!("unreadable value ({e})")))?;
        Ok(Versioned { value: Some(value), revision: entry.revision })
    }

    /// Write `value` if the key is still at `revision`; the new revision, or None when
    /// another writer came first.
    async fn cas<T: Serialize>(
        &self,
        key: &str,
        value: &T,
        revision: u64,
    ) -> Result<Option<u64>, StoreError> {
        let body = serde_json::to_vec(value).map_err(|e| err(key, e))?;
        match self.kv.update(key, body.into(), revision).await {
            Ok(r) => Ok(Some(r)),
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(None),
            Err(e) => Err(err(key, e)),
        }
    }

    pub async fn record(&self, pool: &str, id: &str) -> Result<Versioned<BatchRecord>, StoreError> {
        let key = record_key(pool, id);
        let v: Versioned<BatchRecord> = self.read(&key).await?;
        // A record must be the one its key names.
        if let Some(r) = &v.value {
            if r.id != id || r.pool != pool {
                return Err(invalid(&key, "the record names another pool or id than its key"));
            }
        }
        Ok(v)
    }

    /// Write `record` if its key is still at `revision`; see [`Store::cas`].
    pub async fn put_record(
        &self,
        record: &BatchRecord,
        revision: u64,
    ) -> Result<Option<u64>, StoreError> {
        self.cas(&record.key(), record, revision).await
    }

    /// Job `job`'s claim. A value that is not a claim (someone else's bytes) reads as no
    /// claim, with its revision, so that it is replaced.
    pub async fn claim(&self, pool: &str, job: &JobId) -> Result<Versioned<Claim>, StoreError> {
        let key = claim_key(pool, job);
        let entry = self.kv.entry(&key).await.map_err(|e| err(&key, e))?;
        let Some(entry) = entry else { return Ok(Versioned { value: None, revision: 0 }) };
        let value = match entry.operation {
            kv::Operation::Put => serde_json::from_slice(&entry.value).ok(),
            _ => None,
        };
        Ok(Versioned { value, revision: entry.revision })
    }

    pub async fn put_claim(
        &self,
        pool: &str,
        job: &JobId,
        claim: &Claim,
        revision: u64,
    ) -> Result<Option<u64>, StoreError> {
        self.cas(&claim_key(pool, job), claim, revision).await
    }

    /// The job is free for another batch, if its claim still names `record` (a claim
    /// that moved on to another batch meanwhile is left alone).
    pub async fn release_claim(
        &self,
        pool: &str,
        job: &JobId,
        record: &str,
    ) -> Result<(), StoreError> {
        let key = claim_key(pool, job);
        let v = self.claim(pool, job).await?;
        if v.value.is_none_or(|c| c.record != record) {
            return Ok(());
        }
        match self.kv.delete_expect_revision(&key, Some(v.revision)).await {
            Ok(()) => Ok(()),
            Err(e) => {
                // The server refuses a delete at a stale revision: the claim moved on
                // meanwhile and is not ours to free any more.
                let now = self.claim(pool, job).await?;
                if now.revision != v.revision {
                    return Ok(());
                }
                Err(err(&key, e))
            }
        }
    }

    /// The provider batch ids the records of `pool` other than `except` name (submitted
    /// or ended), for a taker matching a batch that carries no metadata. Values that are
    /// not records are skipped.
    pub async fn batch_ids(
        &self,
        pool: &str,
        except: &str,
    ) -> Result<std::collections::HashSet<String>, StoreError> {
        use futures::StreamExt;
        let prefix = record_key(pool, "");
        let mut keys = self.kv.keys().await.map_err(|e| err(&prefix, e))?;
        let mut ids = std::collections::HashSet::new();
        while let Some(k) = keys.next().await {
            let k = k.map_err(|e| err(&prefix, e))?;
            let Some(id) = k.strip_prefix(&prefix) else { continue };
            if id == except {
                continue;
            }
            let Ok(v) = self.record(pool, id).await else { continue };
            match v.value.map(|r| r.state) {
                Some(BatchState::Submitted { batch, .. })
                | Some(BatchState::Ended { batch, .. })
                    if !batch.is_empty() =>
                {
                    ids.insert(batch);
                }
                _ => {}
            }
        }
        Ok(ids)
    }

    pub async fn ledger(&self, pool: &str) -> Result<Versioned<QueueLedger>, StoreError> {
        self.read(&ledger_key(pool)).await
    }

    pub async fn put_ledger(
        &self,
        pool: &str,
        ledger: &QueueLedger,
        revision: u64,
    ) -> Result<Option<u64>, StoreError> {
        self.cas(&ledger_key(pool), ledger, revision).await
    }
}

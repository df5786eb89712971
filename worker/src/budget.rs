//! Delivery budgets that an outage does not spend.
//!
//! JetStream counts every delivery of a job message (`delivered`), whatever ended it.
//! A job may fail by its own fault `max_deliver` times, but deliveries that an endpoint
//! outage, a 429 cool-down or a worker's shutdown ended are not its fault and must not
//! count. So the pool consumer has no delivery limit on the server
//! ([`halyard_broker::BROKER_MAX_DELIVER`]) and the workers keep the budget:
//!
//! - A delivery handed back for such a reason is recorded, before its nak, in the KV
//!   bucket [`halyard_proto::subjects::DELIVERY_BUDGET_BUCKET`] under the message's pool
//!   and stream sequence, `<pool token>.<seq>` ([`Budget::key`]; the pool first, so that
//!   the broker's permissions can keep a worker credential to its own pools' records),
//!   by [`Budget::excuse`], a compare-and-set update, idempotent per delivery number.
//! - A redelivered message (`delivered > 1`) reads its record once; a first delivery
//!   cannot have one, so the common path costs nothing. Its effective delivery number is
//!   `delivered − excused` ([`effective`]), which the job's life cycle compares with
//!   `max_deliver`: the job is dead-lettered when its own failures spend the budget, and
//!   one that arrives past it (the deliveries before crashed their workers) is
//!   dead-lettered without a call.
//! - Once the message is acked (result or dead letter) its record is purged; records
//!   that a crash left behind expire after [`RECORD_MAX_AGE`].
//!
//! If the bucket cannot be read, the delivery counts whole (`excused = 0`): the budget
//! errs toward giving up, as without this module, never toward retrying forever. If the
//! record cannot be written, that delivery counts.

use std::time::Duration;

use async_nats::jetstream::kv;
use halyard_broker::{Broker, BrokerError};
use serde::{Deserialize, Serialize};

/// Records of messages whose workers crashed before the ack expire after this long.
pub const RECORD_MAX_AGE: Duration = halyard_broker::layout::DELIVERY_BUDGET.max_age;

/// A message's excused deliveries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Deliveries that ended for a reason that was not the job's fault.
    pub excused: u64,
    /// The latest delivery numbers excused (at most [`Record::REMEMBERED`]), so that a
    /// delivery recorded twice counts once, in whatever order deliveries are recorded.
    pub deliveries: Vec<u64>,
}

impl Record {
    /// Delivery numbers remembered for idempotence: more than can be handed back at
    /// once (two holders of one message at most, a few redeliveries apart).
    pub const REMEMBERED: usize = 32;

    /// Excuse delivery `delivered`; false if it already was.
    pub fn excuse(&mut self, delivered: u64) -> bool {
        if self.deliveries.contains(&delivered) {
            return false;
        }
        self.excused += 1;
        self.deliveries.push(delivered);
        if self.deliveries.len() > Self::REMEMBERED {
            self.deliveries.sort_unstable();
            self.deliveries.remove(0);
        }
        true
    }
}

/// The delivery number that counts against the budget (at least 1).
pub fn effective(delivered: u64, excused: u64) -> u64 {
    delivered.saturating_sub(excused).max(1)
}

#[derive(Debug, thiserror::Error)]
#[error("delivery budget record {key}: {reason}")]
pub struct BudgetError {
    key: String,
    reason: String,
}

/// The budget bucket; see the module docs.
#[derive(Clone)]
pub struct Budget {
    kv: kv::Store,
}

impl Budget {
    /// Open the bucket (file storage: a record must outlive a broker restart as long as
    /// the job message does).
    pub async fn open(broker: &Broker) -> Result<Budget, BrokerError> {
        let (kv, _) =
            halyard_broker::kv::open(broker, halyard_broker::layout::DELIVERY_BUDGET).await?;
        Ok(Budget { kv })
    }

    /// The record key of job message `seq` of `pool` (a pool name or its token).
    pub fn key(pool: &str, seq: u64) -> String {
        format!("{}.{seq}", halyard_proto::subjects::pool_token(pool))
    }

    /// The deliveries excused so far of the message of record `key` (0 without a record).
    pub async fn excused(&self, key: &str) -> Result<u64, BudgetError> {
        Ok(self.read(key).await?.map_or(0, |(r, _)| r.excused))
    }

    async fn read(&self, key: &str) -> Result<Option<(Record, u64)>, BudgetError> {
        let entry = self.kv.entry(key).await.map_err(|e| err(key, e))?;
        let Some(entry) = entry.filter(|e| e.operation == kv::Operation::Put) else {
            return Ok(None);
        };
        let record = bounded(serde_json::from_slice(&entry.value).map_err(|e| err(key, e))?);
        Ok(Some((record, entry.revision)))
    }

    /// Excuse delivery `delivered` of the message of record `key`.
    pub async fn excuse(&self, key: &str, delivered: u64) -> Result<(), BudgetError> {
        // A handful of tries: two workers write one record only when a message was
        // redelivered while its previous holder was still handing it back.
        for _ in 0..5 {
            let current = self.read(key).await?;
            let mut record = current.as_ref().map(|(r, _)| r.clone()).unwrap_or_default();
            if !record.excuse(delivered) {
                return Ok(());
            }
            let body = serde_json::to_vec(&record).map_err(|e| err(key, e))?;
            let written =
                match current {
                    None => self.kv.create(key, body.into()).await.map(|_| ()).map_err(|e| {
                        (e.kind() == kv::CreateErrorKind::AlreadyExists, e.to_string())
                    }),
                    Some((_, rev)) => {
                        self.kv.update(key, body.into(), rev).await.map(|_| ()).map_err(|e| {
                            (e.kind() == kv::UpdateErrorKind::WrongLastRevision, e.to_string())
                        })
                    }
                };
            match written {
                Ok(()) => return Ok(()),
                Err((true, _)) => continue,
                Err((false, e)) => return Err(err(key, e)),
            }
        }
        Err(err(key, "the record kept changing under this worker"))
    }

    /// The message is settled for good: drop its record.
    pub async fn forget(&self, key: &str) {
        if let Err(e) = self.kv.purge(key).await {
            tracing::debug!(record = key, error = %e, "cannot purge a delivery budget record; it expires on its own");
        }
    }
}

fn err(key: &str, e: impl std::fmt::Display) -> BudgetError {
    BudgetError { key: key.to_string(), reason: e.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each delivery is excused once; the effective delivery is what the job's own
    /// failures spent, never below 1.
    #[test]
    fn excusing_is_idempotent_per_delivery() {
        let mut r = Record::default();
        assert!(r.excuse(1));
        assert!(!r.excuse(1), "the same delivery twice");
        assert!(r.excuse(3));
        // Delivery 4 after deliveries 1 and 3 were outages: the job's 2nd own delivery.
        assert_eq!(effective(4, r.excused), 2);
        assert!(r.excuse(2), "an older delivery recorded after a newer one");
        assert!(!r.excuse(3));
        assert_eq!(r.excused, 3);
        for d in 10..100 {
            r.excuse(d);
        }
        assert_eq!(r.deliveries.len(), Record::REMEMBERED);
        assert!(!r.excuse(99));
        assert_eq!(effective(1, 0), 1);
        assert_eq!(effective(2, 5), 1);
    }
}

/// Deliveries a record may excuse at most (issue 49, item 5). A record comes from the
/// broker, where anyone holding the pool's worker credential may write it: an `excused`
/// beyond this would let a job that crashes its workers retry for ever. Hand-backs that
/// an outage or a shutdown caused rarely reach a few, so a job is dead-lettered after at
/// most `max_deliver + MAX_EXCUSED` deliveries whatever its record says.
pub const MAX_EXCUSED: u64 = 100;

/// A record as read from the broker, kept within what an honest one can say: at most
/// [`MAX_EXCUSED`] excused deliveries and [`Record::REMEMBERED`] delivery numbers.
pub fn bounded(mut r: Record) -> Record {
    r.excused = r.excused.min(MAX_EXCUSED);
    r.deliveries.sort_unstable();
    let extra = r.deliveries.len().saturating_sub(Record::REMEMBERED);
    r.deliveries.drain(..extra);
    r
}

#[cfg(test)]
mod bounded_tests {
    use super::*;

    /// A forged record excusing u64::MAX deliveries excuses MAX_EXCUSED: a job crashing
    /// its workers is dead-lettered after max_deliver + MAX_EXCUSED deliveries.
    #[test]
    fn a_forged_record_excuses_at_most_the_bound() {
        let forged = Record { excused: u64::MAX, deliveries: (0..100_000).collect() };
        let r = bounded(forged);
        assert_eq!(r.excused, MAX_EXCUSED);
        assert_eq!(r.deliveries.len(), Record::REMEMBERED);
        let max_deliver = 5;
        assert_eq!(effective(max_deliver + MAX_EXCUSED, r.excused), max_deliver);
        assert!(effective(max_deliver + MAX_EXCUSED + 1, r.excused) > max_deliver);
        let honest = Record { excused: 3, deliveries: vec![3, 1, 2] };
        assert_eq!(bounded(honest).excused, 3);
    }
}

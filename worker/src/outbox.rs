//! Result publishing in batches: the results that become durable together leave together.
//!
//! A job's task hands its encoded result to the outbox and waits for the answer: true
//! once the broker has acknowledged a message holding it (only then may the job be
//! acked), false when it could not be published (the job is nak'd; its result stays in
//! the checkpoint and is replayed on redelivery). The outbox's actor takes every result
//! waiting in its channel (a checkpoint group commit wakes all its writers at once, so they
//! arrive together), groups them by run and pool and publishes each group as one message
//! ([`halyard_proto::batch`]) on the subject of its run and pool
//! ([`halyard_proto::subjects::result_subject`]), with a `Nats-Msg-Id` derived from its job
//! ids, this process's secret and the batch's number in this process (below). At most
//! [`IN_FLIGHT`] batches await their broker ack at a time; results arriving meanwhile
//! make the next batch larger. Per result, the broker then stores, delivers and has
//! acked one message per batch instead of one per job, and the coordinator decodes and
//! acks one message per batch.
//!
//! The secret: JetStream drops a message whose `Nats-Msg-Id` it has seen within its
//! de-duplication window, whatever its subject. An id made of the run and job ids alone can
//! be computed by anyone who knows a job (its id hashes a public dataset prompt), so a
//! forger publishing first under it would make the broker drop the honest result. Each
//! outbox adds a random value of its own, never sent anywhere else, to its ids: the
//! retries of one publish still share an id (the broker keeps one copy), and a result
//! published again by a restarted worker is a duplicate the coordinator counts once.
//!
//! The batch's number: every batch this process publishes has an id of its own, so a
//! result published again (its job was delivered again and is answered from the
//! checkpoint) is a new message, never a duplicate of an earlier one. With the same id,
//! the broker would drop it for its whole de-duplication window (20 minutes by default)
//! whenever it keeps the earlier id without the coordinator ever taking that message: the
//! coordinator dropped it (an object it could not read), the stream was purged, or
//! nats-server lost it at a leader change after recording its id (fixed in 2.11,
//! nats-server pull requests 6485 and 6486). The coordinator's
//! stall check would then publish the job again three times, get the same dropped
//! replay each time, and record the job as a dead letter although its result was paid
//! and kept. A replay that does arrive twice is a duplicate the coordinator counts once.
//!
//! One answer is not taken as the broker holding the batch: a duplicate at sequence 0.
//! nats-server 2.10 answers so for an id it recorded for a message still being proposed
//! to its stream's replicas, or one a leader change lost (it records the id before the
//! message is stored). The batch is then published again under another id (its id with
//! the attempt's number): a second copy is a duplicate the coordinator counts once; no
//! copy would be a result lost until the stall check publishes its job again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use halyard_broker::Broker;
use halyard_proto::{subjects, JobId};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tracing::warn;
use uuid::Uuid;

use crate::failpoint::{Failpoints, Point};

/// Batches published and not yet acknowledged by the broker, at most.
const IN_FLIGHT: usize = 2;
/// Publish attempts per batch before its jobs are handed back (nak).
const ATTEMPTS: u32 = 5;

struct Entry {
    run: Uuid,
    /// The pool the job was published to: the results subject names it.
    pool: Arc<str>,
    job: JobId,
    encoded: Vec<u8>,
    reply: oneshot::Sender<bool>,
}

/// Handle to the outbox; cheap to clone. The actor ends when every handle is dropped,
/// after publishing what it holds.
#[derive(Clone)]
pub(crate) struct Outbox {
    tx: mpsc::Sender<Entry>,
}

/// This process's secret part of its results messages' ids (see the module's text).
fn secret() -> String {
    Uuid::now_v7().simple().to_string()
}

impl Outbox {
    pub fn start(broker: Broker, failpoints: Arc<Failpoints>) -> Outbox {
        let (tx, rx) = mpsc::channel(halyard_proto::batch::MAX_BATCH * 4);
        tokio::spawn(run(broker, failpoints, rx, secret()));
        Outbox { tx }
    }

    /// Publish one encoded result of `job` in `run`, published to `pool`; true once the
    /// broker holds it.
    pub async fn publish(&self, run: Uuid, pool: Arc<str>, job: JobId, encoded: Vec<u8>) -> bool {
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Entry { run, pool, job, encoded, reply }).await.is_err() {
            return false;
        }
        rx.await.unwrap_or(false)
    }
}

async fn run(
    broker: Broker,
    failpoints: Arc<Failpoints>,
    mut rx: mpsc::Receiver<Entry>,
    secret: String,
) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    let secret: Arc<str> = secret.into();
    let mut subjects: HashMap<(Uuid, Arc<str>), async_nats::Subject> = HashMap::new();
    // The number of the next batch this process publishes (see the module's text).
    let mut number: u64 = 0;
    loop {
        // Wait for a free publish slot first: while every slot is busy, results queue up
        // and go out together.
        let Ok(permit) = slots.clone().acquire_owned().await else { break };
        let Some(first) = rx.recv().await else { break };
        // Writers woken by the same flush are still being scheduled: let them queue.
        tokio::task::yield_now().await;
        let mut by_run: HashMap<(Uuid, Arc<str>), Vec<Entry>> = HashMap::new();
        by_run.entry((first.run, first.pool.clone())).or_default().push(first);
        let mut n = 1;
        while n < halyard_proto::batch::MAX_BATCH {
            match rx.try_recv() {
                Ok(e) => {
                    by_run.entry((e.run, e.pool.clone())).or_default().push(e);
                    n += 1;
                }
                Err(_) => break,
            }
        }
        let mut permit = Some(permit);
        let limit = broker.payload_limit();
        let batches =
            by_run.into_iter().flat_map(|(to, e)| by_size(e, limit).map(move |b| (to.clone(), b)));
        for ((run, pool), entries) in batches {
            // One slot per batch (a worker rarely serves more than one run at a time).
            let p = match permit.take() {
                Some(p) => p,
                None => match slots.clone().acquire_owned().await {
                    Ok(p) => p,
                    Err(_) => return,
                },
            };
            let subject = subjects
                .entry((run, pool.clone()))
                .or_insert_with(|| subjects::result_subject(run, &pool).into())
                .clone();
            let msg_id = msg_id(run, &entries, &secret, number);
            number += 1;
            let (broker, failpoints) = (broker.clone(), failpoints.clone());
            tokio::spawn(async move {
                publish_batch(&broker, &failpoints, subject, run, msg_id, entries).await;
                drop(p);
            });
        }
    }
    // Let the last batches finish before the actor is gone.
    let _ = slots.acquire_many(IN_FLIGHT as u32).await;
}

/// `entries` in order, cut into batches whose message stays within `limit` bytes (the
/// batch framing counted; a single larger result goes alone, through the object store).
fn by_size(entries: Vec<Entry>, limit: usize) -> impl Iterator<Item = Vec<Entry>> {
    const FRAME: usize = halyard_proto::batch::BATCH_HEADER_MAX;
    let mut out = Vec::new();
    let mut cur: Vec<Entry> = Vec::new();
    let mut bytes = FRAME;
    for e in entries {
        if !cur.is_empty() && bytes + e.encoded.len() > limit {
            out.push(std::mem::take(&mut cur));
            bytes = FRAME;
        }
        bytes += e.encoded.len();
        cur.push(e);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out.into_iter()
}

/// The `Nats-Msg-Id` of the batch numbered `number` in this process: its run and jobs,
/// this process's secret and the number, so that it is never the id of another message
/// (see the module's text). A dead letter's message so differs from the message of the
/// result of its retry (`halyard retry-failed`) too.
fn msg_id(run: Uuid, entries: &[Entry], secret: &str, number: u64) -> String {
    let jobs = halyard_proto::batch_msg_id(run, entries.iter().map(|e| &e.job));
    format!("{jobs}:{secret}:{number}")
}

/// Publish one batch and answer its writers; retry a few times on broker trouble (the
/// retries share `msg_id`, so the broker keeps one copy, except after a duplicate at
/// sequence 0: see the module's text).
async fn publish_batch(
    broker: &Broker,
    failpoints: &Failpoints,
    subject: async_nats::Subject,
    run: Uuid,
    msg_id: String,
    entries: Vec<Entry>,
) {
    let payload = bytes::Bytes::from(halyard_proto::encode_batch(
        &entries.iter().map(|e| &e.encoded[..]).collect::<Vec<_>>(),
    ));
    let pass = |point| entries.iter().for_each(|_| failpoints.pass(point));
    let mut ok = false;
    let mut id = msg_id.clone();
    // A single result too large for one message goes through the object store (see
    // `halyard_broker::objects`): stored once, then the message naming it.
    let mut object: Option<String> = None;
    for attempt in 0..ATTEMPTS {
        let m = match halyard_broker::objects::message(broker, run, &payload, &mut object).await {
            Ok(m) => m.message_id(&id),
            Err(e) => {
                warn!(bytes = payload.len(), attempt, error = %e, "cannot store an oversized result as an object");
                tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
                continue;
            }
        };
        match broker.js.send_publish(subject.clone(), m).await {
            Ok(ack) => {
                pass(Point::PublishConfirm);
                match ack.await {
                    Ok(a) if a.duplicate && a.sequence == 0 => {
                        warn!(results = entries.len(), attempt, "the broker answered a result publish as a duplicate of a message it may not hold; publishing it again under another id");
                        id = format!("{msg_id}:{}", attempt + 1);
                    }
                    Ok(_) => {
                        pass(Point::ConfirmAck);
                        ok = true;
                        break;
                    }
                    Err(e) => {
                        warn!(results = entries.len(), attempt, error = %e, "result publish not acknowledged")
                    }
                }
            }
            Err(e) => warn!(results = entries.len(), attempt, error = %e, "result publish failed"),
        }
        tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
    }
    for e in entries {
        // A dropped receiver means the job's task is gone; nothing to do.
        let _ = e.reply.send(ok);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    /// Batches keep their order and stay within the limit, framing counted; a result
    /// larger than the limit goes alone.
    #[test]
    fn batches_are_cut_by_bytes() {
        let entry = |n: usize| Entry {
            run: Uuid::nil(),
            pool: "p".into(),
            job: JobId([n as u8; 16]),
            encoded: vec![0; n],
            reply: oneshot::channel().0,
        };
        let sizes = [400, 400, 400, 2000, 10, 585];
        let batches: Vec<Vec<usize>> = by_size(sizes.map(entry).into(), 1000)
            .map(|b| b.iter().map(|e| e.encoded.len()).collect())
            .collect();
        assert_eq!(batches, [vec![400, 400], vec![400], vec![2000], vec![10, 585]]);
        for b in &batches {
            let encoded =
                halyard_proto::encode_batch(&b.iter().map(|n| vec![0; *n]).collect::<Vec<_>>());
            assert!(b.len() == 1 || encoded.len() <= 1000, "{b:?}: {} bytes", encoded.len());
        }
    }

    /// A duplicate at sequence 0 (what nats-server 2.10 answers for an id whose message
    /// it may not hold) is not taken as stored: the batch goes again under another id,
    /// and is taken as stored once the broker acknowledges a message at a sequence. The
    /// broker here is a plain subscriber answering as JetStream does (no stream holds
    /// the subject).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_duplicate_at_sequence_zero_is_published_again_under_another_id() {
        let nats = halyard_tests::NatsServer::start();
        let cfg = halyard_broker::BrokerConfig::new(nats.url(), "outbox-test");
        let broker = halyard_broker::connect(&cfg).await.unwrap();
        let run = Uuid::now_v7();
        let mut sub = broker.client.subscribe(subjects::result_subject(run, "p")).await.unwrap();
        broker.client.flush().await.unwrap();
        let client = broker.client.clone();
        let answering = tokio::spawn(async move {
            let mut ids = Vec::new();
            for answer in
                [r#"{"stream":"S","seq":0,"duplicate":true}"#, r#"{"stream":"S","seq":7}"#]
            {
                let m = sub.next().await.unwrap();
                let id = m.headers.as_ref().and_then(|h| h.get("Nats-Msg-Id")).unwrap();
                ids.push(id.to_string());
                client.publish(m.reply.unwrap(), answer.into()).await.unwrap();
            }
            ids
        });
        let outbox = Outbox::start(broker, Arc::new(Failpoints::none()));
        let stored = outbox.publish(run, "p".into(), JobId([1; 16]), vec![0x90]).await;
        let ids = tokio::time::timeout(Duration::from_secs(20), answering)
            .await
            .expect("the batch was not published again after a duplicate at sequence 0")
            .unwrap();
        assert!(stored, "the acknowledgement at sequence 7 was not taken");
        assert_ne!(ids[0], ids[1], "published again under the id the broker called a duplicate");
        assert!(ids[1].starts_with(&ids[0]), "{ids:?}");
    }
}

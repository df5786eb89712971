//! The dispatcher: publishes the jobs the planner asks for, in job messages of one job or
//! of a batch (`[run] job_batch`), and reaps the broker's acks of those publishes.
//!
//! Publishes are pipelined: their broker acks are awaited in the background (at most
//! [`MAX_UNCONFIRMED`] at a time) and only logged; a publish that never reached the
//! stream is caught by the stall check. A publish the client refuses is retried with a
//! growing delay (the broker may be restarting). A job message larger than the server's
//! `max_payload` travels through the object store (`halyard_broker::objects`).

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use halyard_broker::Broker;
use halyard_proto::{subjects, Job, JobId};
use tracing::warn;
use uuid::Uuid;

/// Job publishes whose broker ack is not yet in (async-nats allows 5,000 by default).
const MAX_UNCONFIRMED: usize = 4096;

/// A job message holds at most this many bytes of jobs, whatever `job_batch` says, and
/// never more than the server's `max_payload` allows ([`Broker::payload_limit`]).
const MAX_JOB_MESSAGE_BYTES: usize = 256 << 10;
const FRAME: usize = halyard_proto::batch::BATCH_HEADER_MAX;

type AckFuture = <jetstream::context::PublishAckFuture as std::future::IntoFuture>::IntoFuture;

/// The next job message of a pool: its jobs' encodings, ids and total size.
#[derive(Default)]
struct JobBuf {
    encoded: Vec<Vec<u8>>,
    ids: Vec<JobId>,
    bytes: usize,
}

pub struct Dispatcher {
    broker: Broker,
    run: Uuid,
    /// `[run] job_batch`: jobs per job message.
    job_batch: usize,
    /// Subject of each pool (computing it hashes odd pool names).
    subjects: HashMap<String, async_nats::Subject>,
    acks: FuturesUnordered<AckFuture>,
    /// Jobs planned per pool and not sent yet (`job_batch` > 1).
    bufs: HashMap<String, JobBuf>,
}

impl Dispatcher {
    pub fn new(broker: Broker, run: Uuid, job_batch: usize) -> Dispatcher {
        Dispatcher {
            broker,
            run,
            job_batch,
            subjects: HashMap::new(),
            acks: FuturesUnordered::new(),
            bufs: HashMap::new(),
        }
    }

    /// Publish `job`, or with `job_batch` > 1 add it to its pool's next job message
    /// (sent when full, and by [`Dispatcher::send_batches`] at the end of every planning
    /// round). A re-publication (`round`) always goes alone.
    pub async fn send(&mut self, job: &Job, round: Option<u32>) {
        let payload = match halyard_proto::encode(job) {
            Ok(p) => p,
            Err(err) => {
                warn!(job = %job.id, error = %err, "cannot encode job");
                return;
            }
        };
        if round.is_none() && self.job_batch > 1 {
            let limit = MAX_JOB_MESSAGE_BYTES.min(self.broker.payload_limit());
            // A job that would take the message past the limit starts the next one.
            let full = self
                .bufs
                .get(&job.pool)
                .is_some_and(|b| !b.ids.is_empty() && b.bytes + payload.len() + FRAME > limit);
            if full {
                if let Some(buf) = self.bufs.remove(&job.pool) {
                    self.publish_jobs(&job.pool, buf).await;
                }
            }
            let buf = self.bufs.entry(job.pool.clone()).or_default();
            buf.bytes += payload.len();
            buf.ids.push(job.id);
            buf.encoded.push(payload);
            if buf.ids.len() >= self.job_batch || buf.bytes + FRAME >= limit {
                if let Some(buf) = self.bufs.remove(&job.pool) {
                    self.publish_jobs(&job.pool, buf).await;
                }
            }
            return;
        }
        let mut msg_id = subjects::result_msg_id(self.run, &job.id);
        if let Some(n) = round {
            msg_id.push_str(&format!(":r{n}"));
        }
        self.publish(&job.pool, bytes::Bytes::from(payload), msg_id).await;
    }

    /// Send every pool's partly filled job message.
    pub async fn send_batches(&mut self) {
        let bufs: Vec<(String, JobBuf)> = self.bufs.drain().collect();
        for (pool, buf) in bufs {
            self.publish_jobs(&pool, buf).await;
        }
    }

    /// One job message holding `buf`'s jobs (a lone job is sent as itself). Its
    /// `Nats-Msg-Id` is a hash of the run and the job ids, as for result batches.
    async fn publish_jobs(&mut self, pool: &str, buf: JobBuf) {
        if buf.ids.is_empty() {
            return;
        }
        let msg_id = halyard_proto::batch_msg_id(self.run, &buf.ids);
        let payload = match buf.encoded.len() {
            1 => buf.encoded.into_iter().next().unwrap_or_default(),
            _ => halyard_proto::encode_batch(&buf.encoded),
        };
        self.publish(pool, bytes::Bytes::from(payload), msg_id).await;
    }

    async fn publish(&mut self, pool: &str, payload: bytes::Bytes, msg_id: String) {
        let subject = match self.subjects.get(pool) {
            Some(s) => s.clone(),
            None => {
                let s = async_nats::Subject::from(subjects::job_subject(pool));
                self.subjects.insert(pool.to_string(), s.clone());
                s
            }
        };
        // Each unconfirmed publish holds one of async-nats's ack permits: keep below its limit.
        while self.acks.len() >= MAX_UNCONFIRMED {
            self.reap_one().await;
        }
        let mut delay = Duration::from_millis(100);
        // A job too large for one message (a judge prompt quoting a very long answer)
        // goes through the object store (`halyard_broker::objects`): stored once, then
        // the message naming it.
        let mut object: Option<String> = None;
        loop {
            let m = match halyard_broker::objects::message(
                &self.broker,
                self.run,
                &payload,
                &mut object,
            )
            .await
            {
                Ok(m) => m.message_id(&msg_id),
                Err(err) => {
                    warn!(msg_id, bytes = payload.len(), error = %err, "cannot store an oversized job as an object; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                    continue;
                }
            };
            match self.broker.js.send_publish(subject.clone(), m).await {
                Ok(ack) => {
                    self.acks.push(std::future::IntoFuture::into_future(ack));
                    return;
                }
                Err(err) => {
                    warn!(msg_id, error = %err, "job publish failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    async fn reap_one(&mut self) {
        if let Some(Err(err)) = self.acks.next().await {
            // The stall check re-publishes jobs that never reached the stream.
            warn!(error = %err, "job publish not acknowledged");
        }
    }

    /// Wait for every publish's ack.
    pub async fn drain(&mut self) {
        while !self.acks.is_empty() {
            self.reap_one().await;
        }
    }

    /// Take the acks already in, without waiting.
    pub fn reap_ready(&mut self) {
        while !self.acks.is_empty() {
            match self.acks.next().now_or_never() {
                Some(Some(Err(err))) => warn!(error = %err, "job publish not acknowledged"),
                Some(_) => {}
                None => break,
            }
        }
    }
}

//! The dispatcher: publishes the jobs the planner asks for, in job messages of one job or
//! of a batch (`[run] job_batch`), and reaps the broker's acks of those publishes.
//!
//! How many jobs a pool's message may hold is the pool's [`Batching`]: one, a fixed
//! number (`job_batch = N`), or paced (`job_batch = "auto"`, pools without paid calls):
//! the jobs the pool gets in [`AUTO_BATCH_SPAN`] at the pace it was sent jobs over the
//! last second or more, between 1 and [`AUTO_MAX_JOB_BATCH`].
//!
//! Publishes are pipelined: their broker acks are awaited in the background (at most
//! [`MAX_UNCONFIRMED`] at a time) and only logged; a publish that never reached the
//! stream is caught by the stall check. A publish the client refuses is retried with a
//! growing delay (the broker may be restarting). A job message larger than the server's
//! `max_payload` travels through the object store (`halyard_broker::objects`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use halyard_broker::Broker;
use halyard_proto::{subjects, Job, JobId};
use tracing::warn;
use uuid::Uuid;

use halyard_plan::sweep::{JobBatch, Sweep, AUTO_BATCH_SPAN, AUTO_MAX_JOB_BATCH};

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

/// How many jobs a pool's job message may hold.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Batching {
    Fixed(usize),
    Paced(Pace),
}

impl Batching {
    /// The batching of pool `pool` under `[run] job_batch`: `local` pools are those
    /// without paid calls ([`halyard_plan::sweep::Sweep::local_pools`]).
    pub(super) fn of(job_batch: JobBatch, local: bool) -> Batching {
        match job_batch {
            JobBatch::Fixed(n) => Batching::Fixed(n),
            JobBatch::Auto if local => Batching::Paced(Pace::default()),
            JobBatch::Auto => Batching::Fixed(1),
        }
    }

    /// Jobs the pool's next message may hold.
    pub(super) fn limit(&self) -> usize {
        match self {
            Batching::Fixed(n) => *n,
            Batching::Paced(p) => p.batch(),
        }
    }
}

/// A pool's pace: the jobs it was sent per second over its last span of a second or
/// more (a span holds thousands of a fast pool's jobs: steady enough, and a pool that
/// slows down gets small messages within a span). Unknown (0) until a span is complete, and until
/// [`Pace::restart`] (the first publishes of a coordinator are a burst that says nothing
/// of the pool's pace).
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Pace {
    since: Option<Instant>,
    count: u64,
    /// Jobs per second; 0 while unknown.
    rate: f64,
}

impl Pace {
    const SPAN: Duration = Duration::from_secs(1);

    /// Measure from `now` on.
    pub(super) fn restart(&mut self, now: Instant) {
        self.since = Some(now);
        self.count = 0;
    }

    /// One job was sent at `now`.
    pub(super) fn sent(&mut self, now: Instant) {
        let Some(since) = self.since else { return };
        self.count += 1;
        let dt = now.saturating_duration_since(since);
        if dt >= Self::SPAN {
            let r = self.count as f64 / dt.as_secs_f64();
            self.rate = r;
            self.restart(now);
        }
    }

    /// Jobs a message may hold at this pace.
    pub(super) fn batch(&self) -> usize {
        let n = (self.rate * AUTO_BATCH_SPAN.as_secs_f64()).floor();
        (n as usize).clamp(1, AUTO_MAX_JOB_BATCH)
    }
}

pub struct Dispatcher {
    broker: Broker,
    run: Uuid,
    /// Each pool's batching (`[run] job_batch`); a pool the sweep does not name (none
    /// should reach the dispatcher) sends one job per message.
    batching: HashMap<String, Batching>,
    /// Subject of each pool (computing it hashes odd pool names).
    subjects: HashMap<String, async_nats::Subject>,
    acks: FuturesUnordered<AckFuture>,
    /// Jobs planned per pool and not sent yet (batched pools).
    bufs: HashMap<String, JobBuf>,
}

impl Dispatcher {
    /// A dispatcher for run `run` of `sweep`: each of its pools batched as `[run]
    /// job_batch` says (paced pools are those without paid calls).
    pub fn new(broker: Broker, run: Uuid, sweep: &Sweep) -> Dispatcher {
        let local = sweep.local_pools();
        let batching = sweep
            .pools()
            .into_keys()
            .map(|p| {
                let b = Batching::of(sweep.run.job_batch, local.contains(&p));
                (p, b)
            })
            .collect();
        Dispatcher {
            broker,
            run,
            batching,
            subjects: HashMap::new(),
            acks: FuturesUnordered::new(),
            bufs: HashMap::new(),
        }
    }

    /// Paced pools measure their pace from now on (called once the coordinator's first
    /// publishes, a burst, are out).
    pub fn start_pacing(&mut self, now: Instant) {
        for b in self.batching.values_mut() {
            if let Batching::Paced(pace) = b {
                pace.restart(now);
            }
        }
    }

    /// Publish `job`, or add it to its pool's next job message when the pool's messages
    /// may hold more than one (sent when full, and by [`Dispatcher::send_batches`] at the
    /// end of every planning round). A re-publication (`round`) always goes alone.
    pub async fn send(&mut self, job: &Job, round: Option<u32>) {
        let payload = match halyard_proto::encode(job) {
            Ok(p) => p,
            Err(err) => {
                warn!(job = %job.id, error = %err, "cannot encode job");
                return;
            }
        };
        let max = match self.batching.get_mut(&job.pool) {
            Some(Batching::Paced(pace)) => {
                pace.sent(Instant::now());
                pace.batch()
            }
            Some(b) => b.limit(),
            None => 1,
        };
        if round.is_none() && max > 1 {
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
            if buf.ids.len() >= max || buf.bytes + FRAME >= limit {
                if let Some(buf) = self.bufs.remove(&job.pool) {
                    self.publish_jobs(&job.pool, buf).await;
                }
            }
            return;
        }
        let mut msg_id = subjects::job_msg_id(self.run, &job.id);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `auto` batches only pools without paid calls, paced: one job per message until a
    /// span is measured; then the jobs of AUTO_BATCH_SPAN at the measured pace, between
    /// 1 and AUTO_MAX_JOB_BATCH. A fixed job_batch is the same for every pool.
    #[test]
    fn batching_follows_the_pools_pace() {
        assert_eq!(Batching::of(JobBatch::Auto, false), Batching::Fixed(1));
        assert_eq!(Batching::of(JobBatch::Fixed(8), false).limit(), 8);
        assert_eq!(Batching::of(JobBatch::Fixed(8), true).limit(), 8);
        let t0 = Instant::now();
        let paced = |jobs_per_s: u64| {
            let mut b = Batching::of(JobBatch::Auto, true);
            let Batching::Paced(p) = &mut b else { panic!("local pools are paced") };
            // Before pacing starts, sends (the first burst) are not counted.
            for _ in 0..100_000 {
                p.sent(t0);
            }
            assert_eq!(p.batch(), 1);
            p.restart(t0);
            for i in 1..=2 * jobs_per_s {
                p.sent(t0 + Duration::from_secs_f64(i as f64 / jobs_per_s as f64));
            }
            b.limit()
        };
        assert_eq!(paced(10), 1, "a slow pool (a local model) keeps one job per message");
        assert_eq!(paced(99), 1);
        assert_eq!(paced(1_000), 10);
        assert_eq!(paced(3_200), 32);
        assert_eq!(paced(50_000), AUTO_MAX_JOB_BATCH, "a fast pool's messages are capped");
        // A pool that slowed down: its messages shrink again after one span.
        let mut p = Pace::default();
        p.restart(t0);
        for i in 1..=20_000u64 {
            p.sent(t0 + Duration::from_micros(i * 100));
        }
        assert_eq!(p.batch(), AUTO_MAX_JOB_BATCH);
        let t1 = t0 + Duration::from_secs(2);
        for i in 1..=40u64 {
            p.sent(t1 + Duration::from_millis(i * 100));
        }
        assert_eq!(p.batch(), 1);
    }
}

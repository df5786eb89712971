//! The dispatcher: publishes the jobs the planner asks for, in job messages of one job or
//! of a batch (`[run] job_batch`), and reaps the broker's acks of those publishes.
//!
//! How many jobs a pool's message may hold is the pool's [`Batching`]: one, a fixed
//! number (`job_batch = N`), or paced (`job_batch = "auto"`, pools without paid calls):
//! the jobs the pool gets in [`AUTO_BATCH_SPAN`] at the pace it was sent jobs over the
//! last second or more, between 1 and [`AUTO_MAX_JOB_BATCH`].
//!
//! Publishes are pipelined: their broker acks are awaited in the background (at most
//! [`MAX_UNCONFIRMED`] messages and about [`MAX_HELD_BYTES`] at a time: one oversized
//! job may take it past). A publish the client refuses is retried with a growing delay
//! (the broker may be restarting). A job message larger than the server's `max_payload`
//! travels through the object store (`halyard_broker::objects`).
//!
//! One answer says neither stored nor refused: an id "in process". A replicated stream
//! on nats-server 2.10.14 to 2.10.x answers a duplicate at sequence 0 for an id whose
//! first message is still being proposed, and 2.11 and later the error 10158
//! ("duplicate message id is in process"); that proposal may yet be lost (a leader
//! change), and 2.10 then holds the id at sequence 0 for the stream's duplicate window.
//! So each publish keeps its message until its ack, and after such an answer sends it
//! again under the **same** id, a growing delay apart for about 20 s
//! ([`RESEND_DELAYS`]), well inside the stream's 20-minute duplicate window: a first
//! message that lands turns the answer into a duplicate at its sequence. It is never
//! sent under another id here: a slow proposal (a leader election takes 4–10 s) can
//! outlast any short wait, and both copies would then be stored, each a job a worker may
//! pay for. What is still in process after that is the stall check's, which publishes
//! jobs again only when nothing is queued or in flight for their pools, and not while
//! these resends go on or for its own wait after the last one gave up
//! ([`Dispatcher::settling`]).
//!
//! Any other failed ack is logged, and a job it lost is caught by the stall check. That
//! includes an ack that never came (a timeout, a broken connection): the message may
//! be stored, and sending it again is safe only while the broker remembers its id,
//! which a lone server does not across a restart for a job already taken and acked (its
//! de-duplication memory is rebuilt from the messages it still holds). The stall check
//! publishes only jobs without a result.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures::future::BoxFuture;
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

/// Bytes of job messages kept until their ack (each is kept to be sent again).
const MAX_HELD_BYTES: usize = 64 << 20;

/// The waits before each send of a message again after an answer that decides nothing
/// (see the module docs), in milliseconds: about 20 s in all.
const RESEND_DELAYS: [u64; 8] = [200, 400, 800, 1_600, 3_200, 5_000, 5_000, 5_000];

/// A job message whose broker ack is awaited, kept to be sent again.
struct Sent {
    pool: String,
    payload: bytes::Bytes,
    msg_id: String,
    /// The object holding the payload, once stored (a job too large for one message).
    object: Option<String>,
    /// Sends again so far.
    resends: usize,
}

type Ack = Result<jetstream::publish::PublishAck, jetstream::context::PublishError>;

/// What a pending publish ends in.
enum Pending {
    /// The broker's answer.
    Acked(Ack, Sent),
    /// The wait before sending it again is over.
    Due(Sent),
}

/// Why `ack` says neither stored nor refused (see the module docs), if it does.
fn undecided(ack: &Ack) -> Option<&'static str> {
    match ack {
        Ok(a) if a.duplicate && a.sequence == 0 => Some("the broker has its id in process"),
        Ok(_) => None,
        Err(e) => std::error::Error::source(e)
            .and_then(|s| s.downcast_ref::<jetstream::Error>())
            .is_some_and(|e| {
                e.error_code() == jetstream::ErrorCode::STREAM_DUPLICATE_MESSAGE_CONFLICT
            })
            .then_some("the broker has its id in process"),
    }
}

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
    acks: FuturesUnordered<BoxFuture<'static, Pending>>,
    /// Bytes of the messages in `acks`.
    held_bytes: usize,
    /// When a message still undecided was last left to the stall check.
    gave_up: Option<Instant>,
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
            held_bytes: 0,
            gave_up: None,
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
        // Each unconfirmed publish holds one of async-nats's ack permits: keep below its
        // limit, and the messages kept for their acks within a bound.
        while !self.acks.is_empty()
            && (self.acks.len() >= MAX_UNCONFIRMED || self.held_bytes >= MAX_HELD_BYTES)
        {
            self.reap_one().await;
        }
        let mut sent = Sent { pool: pool.to_string(), payload, msg_id, object: None, resends: 0 };
        self.held_bytes += sent.payload.len();
        let mut delay = Duration::from_millis(100);
        loop {
            match self.send_once(&mut sent).await {
                Ok(ack) => {
                    self.await_ack(ack, sent);
                    return;
                }
                Err(err) => {
                    warn!(msg_id = sent.msg_id, error = %err, "job publish failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// One publish of `sent` (its object stored first if it needs one): the ack to await.
    async fn send_once(
        &mut self,
        sent: &mut Sent,
    ) -> Result<BoxFuture<'static, Ack>, Box<dyn std::error::Error + Send + Sync>> {
        let subject = match self.subjects.get(&sent.pool) {
            Some(s) => s.clone(),
            None => {
                let s = async_nats::Subject::from(subjects::job_subject(&sent.pool));
                self.subjects.insert(sent.pool.clone(), s.clone());
                s
            }
        };
        // A job too large for one message (a judge prompt quoting a very long answer)
        // goes through the object store (`halyard_broker::objects`): stored once, then
        // the message naming it.
        let m = halyard_broker::objects::message(
            &self.broker,
            self.run,
            &sent.payload,
            &mut sent.object,
        )
        .await
        .map_err(|e| format!("cannot store an oversized job as an object: {e}"))?
        .message_id(&sent.msg_id);
        let ack = self.broker.js.send_publish(subject, m).await?;
        Ok(std::future::IntoFuture::into_future(ack))
    }

    /// Keep `sent` until `ack` answers (taken by [`Dispatcher::settle`]).
    fn await_ack(&mut self, ack: BoxFuture<'static, Ack>, sent: Sent) {
        self.acks.push(ack.map(move |r| Pending::Acked(r, sent)).boxed());
    }

    /// Take one publish's outcome (see [`Dispatcher::settle`]).
    async fn reap_one(&mut self) {
        if let Some(p) = self.acks.next().await {
            self.settle(p).await;
        }
    }

    /// An ack: an undecided one is sent again later, any other failed one is logged (the
    /// stall check publishes again jobs that never reached the stream). A due message is
    /// sent again, once (a failure to send waits for the next turn).
    async fn settle(&mut self, p: Pending) {
        match p {
            Pending::Acked(ack, sent) => match undecided(&ack) {
                Some(why) => self.send_later(sent, why),
                None => {
                    if let Err(err) = ack {
                        warn!(msg_id = sent.msg_id, error = %err, "job publish not acknowledged");
                    }
                    self.held_bytes -= sent.payload.len();
                }
            },
            Pending::Due(mut sent) => match self.send_once(&mut sent).await {
                Ok(ack) => self.await_ack(ack, sent),
                Err(err) => {
                    warn!(msg_id = sent.msg_id, error = %err, "job publish failed");
                    self.send_later(sent, "it could not be sent");
                }
            },
        }
    }

    /// Send `sent` again under its own id after its next wait (`why`: the last answer),
    /// or leave it to the stall check once the waits are over.
    fn send_later(&mut self, mut sent: Sent, why: &str) {
        let Some(&ms) = RESEND_DELAYS.get(sent.resends) else {
            warn!(
                msg_id = sent.msg_id,
                why, "job message still neither stored nor refused; left to the stall check"
            );
            self.held_bytes -= sent.payload.len();
            self.gave_up = Some(Instant::now());
            return;
        };
        sent.resends += 1;
        warn!(
            msg_id = sent.msg_id,
            resend = sent.resends,
            why,
            "job message neither stored nor refused; sending it again under the same id"
        );
        let wait = tokio::time::sleep(Duration::from_millis(ms));
        self.acks.push(wait.map(move |()| Pending::Due(sent)).boxed());
    }

    /// Whether publishes are still being decided (see the module docs): messages waiting
    /// for an answer or to be sent again, or one left undecided within `within`. The
    /// stall check waits for neither, so that no job goes out under two ids.
    pub fn settling(&self, within: Duration) -> bool {
        !self.acks.is_empty() || self.gave_up.is_some_and(|t| t.elapsed() < within)
    }

    /// Wait for every publish's ack, for at most `limit` (a stop: the jobs of a message
    /// not yet decided are published again, under the same id, when the run resumes).
    pub async fn drain_for(&mut self, limit: Duration) {
        if tokio::time::timeout(limit, self.drain()).await.is_err() {
            warn!(messages = self.acks.len(), "job publishes not yet decided at the stop; the resumed run publishes their jobs again");
        }
    }

    /// Wait for every publish's ack.
    pub async fn drain(&mut self) {
        while !self.acks.is_empty() {
            self.reap_one().await;
        }
    }

    /// Take the outcomes already in, without waiting for acks (a message due to be sent
    /// again is sent).
    pub async fn reap_ready(&mut self) {
        while let Some(Some(p)) = self.acks.next().now_or_never() {
            self.settle(p).await;
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

    /// Answers each message `sub` gets with the next of `answers`, then asks that
    /// nothing more comes: the ids they were sent under.
    async fn answer(
        mut sub: async_nats::Subscriber,
        client: async_nats::Client,
        answers: Vec<&'static str>,
    ) -> (Vec<String>, async_nats::Subscriber) {
        let mut ids = Vec::new();
        for a in answers {
            let m = sub.next().await.unwrap();
            let id = m.headers.as_ref().and_then(|h| h.get("Nats-Msg-Id")).unwrap();
            ids.push(id.to_string());
            client.publish(m.reply.unwrap(), a.into()).await.unwrap();
        }
        let more = tokio::time::timeout(Duration::from_secs(3), sub.next()).await;
        assert!(more.is_err(), "sent again after its final answer: {ids:?}");
        (ids, sub)
    }

    /// An id in process is not taken as stored, nor as refused. The broker here is a
    /// plain subscriber answering as a replicated stream does (no stream holds the
    /// subject). A first message that lands meanwhile: sent again once, answered as a
    /// duplicate at its sequence, and nothing more is sent. One still in process: sent
    /// again, always under its own id, after a duplicate at sequence 0 (nats-server
    /// 2.10) or the error 10158 (2.11 and later), until it is stored. A message refused
    /// for another reason is not sent again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_id_in_process_is_sent_again_under_the_same_id() {
        const DUP0: &str = r#"{"stream":"S","seq":0,"duplicate":true}"#;
        const DUP7: &str = r#"{"stream":"S","seq":7,"duplicate":true}"#;
        const ERR_10158: &str = r#"{"error":{"code":409,"err_code":10158,"description":"duplicate message id is in process"}}"#;
        const ERR_10077: &str =
            r#"{"error":{"code":503,"err_code":10077,"description":"error storing message"}}"#;
        const STORED: &str = r#"{"stream":"S","seq":8}"#;
        let nats = halyard_tests::NatsServer::start();
        let cfg = halyard_broker::BrokerConfig::new(nats.url(), "dispatcher-test");
        let broker = halyard_broker::connect(&cfg).await.unwrap();
        let text = "name = \"d\"\n[[model]]\nname = \"m\"\nbackend = \"noop\"\n\n\
                    [[benchmark]]\npipeline = \"noop\"\njobs = 1\nmodels = [\"m\"]\n";
        let sweep = halyard_plan::sweep::parse(std::path::Path::new("d.toml"), text).unwrap();
        let pool = sweep.pools().into_keys().next().unwrap();
        let sub = broker.client.subscribe(subjects::job_subject(&pool)).await.unwrap();
        broker.client.flush().await.unwrap();
        let mut d = Dispatcher::new(broker.clone(), Uuid::now_v7(), &sweep);
        let payload = bytes::Bytes::from_static(b"job");
        let client = broker.client.clone();
        let mut sub = Some(sub);
        let cases = [
            ("job-a", vec![DUP0, DUP7]),
            ("job-b", vec![DUP0, ERR_10158, DUP0, STORED]),
            // Refused for another reason: not sent again (the stall check has its jobs).
            ("job-c", vec![ERR_10077]),
        ];
        for (id, answers) in cases {
            let n = answers.len();
            let answering = tokio::spawn(answer(sub.take().unwrap(), client.clone(), answers));
            d.publish(&pool, payload.clone(), id.into()).await;
            tokio::time::timeout(Duration::from_secs(20), d.drain())
                .await
                .expect("the dispatcher kept waiting");
            let (ids, back) = tokio::time::timeout(Duration::from_secs(20), answering)
                .await
                .expect("an id in process was taken as stored or refused: not sent again")
                .unwrap();
            assert_eq!(ids, vec![id; n]);
            sub = Some(back);
        }
        assert_eq!(d.held_bytes, 0, "messages kept after their acks");
        assert!(!d.settling(Duration::from_secs(60)), "nothing was left undecided");
    }
}

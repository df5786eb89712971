//! The collector: pulls the run's results from the broker, opens (a message may name an
//! object, `halyard_broker::objects`) and decodes them (every message is untrusted
//! input), and turns JetStream's max-deliveries advisories into the jobs they
//! name.

use std::time::Duration;

use async_nats::jetstream;
use futures::{FutureExt, StreamExt};
use halyard_broker::{objects, Broker, BrokerError, PullConsumer};
use halyard_plan::planner::Arrival;
use halyard_proto::{subjects, Failure, FailureKind, Job, Outcome};
use serde::Deserialize;
use tracing::{debug, warn};
use uuid::Uuid;

/// Results taken from the broker at most per group commit.
const RESULT_BATCH: usize = 2048;
/// After a commit of at least LINGER_AFTER results (the run is busy), the next pull
/// waits LINGER first, so that more results go into one commit (an fsync costs
/// about as much as a hundred result writes).
const LINGER_AFTER: usize = 32;
const LINGER: Duration = Duration::from_millis(2);
/// Bytes of results messages taken per pull, at most (one message is always taken,
/// whatever its size: the server's `max_payload` bounds it). With the object budget this
/// bounds what a flood of junk on the results subject can make the coordinator hold.
const INTAKE_BYTES: usize = 32 << 20;
/// Bytes of objects opened per batch, at most: a message naming an object past it is
/// handed back (nak) and opened in a later batch (objects are up to 128 MiB each).
const OBJECT_BUDGET: usize = 256 << 20;
/// How long an idle pull waits at the broker for a result.
pub(super) const PULL_WAIT: Duration = Duration::from_millis(500);

/// Jobs that JetStream gave up on: delivered `deliveries` times without a result.
pub struct MaxDelivered {
    /// This run's jobs of the message (one, or a batch).
    pub jobs: Vec<Job>,
    pub deliveries: u64,
    /// The job message's stream sequence: deleted once the dead letters are durable.
    pub seq: u64,
}

pub struct Collector {
    broker: Broker,
    run: Uuid,
    consumer: PullConsumer,
    advisories: Option<async_nats::Subscriber>,
    /// The last pull found nothing.
    idle: bool,
    last_batch: usize,
    /// Messages refused so far: undecodable, of another run, a worker's refusal of a
    /// forged job, or naming an unusable object (acked, never stored).
    pub refused: u64,
}

impl Collector {
    /// Collect the results of run `run` through its consumer.
    pub fn new(broker: Broker, run: Uuid, consumer: PullConsumer) -> Collector {
        Collector { broker, run, consumer, advisories: None, idle: true, last_batch: 0, refused: 0 }
    }

    /// Start listening to max-deliveries advisories of the job stream.
    pub async fn subscribe_advisories(&mut self) -> Result<(), BrokerError> {
        let subject =
            format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{}.>", subjects::JOBS_STREAM);
        let sub = self
            .broker
            .client
            .subscribe(subject)
            .await
            .map_err(|err| BrokerError::js("subscribe to max-deliveries advisories", err))?;
        self.advisories = Some(sub);
        Ok(())
    }

    /// The results of one message (one result, or a worker's batch of them) that came
    /// on `subject`, with the pool its subject names; results of other runs are left out.
    pub fn decode(&mut self, subject: &str, payload: &[u8]) -> Vec<Arrival> {
        let (results, refused) = decode_results(self.run, subject, payload);
        self.refused += refused;
        results
    }

    /// The payload of each message: its own, or the object it names (a results message
    /// too large for the broker, `halyard_broker::objects`).
    /// Objects are opened up to [`OBJECT_BUDGET`] bytes per batch; messages naming
    /// objects past it wait for a later batch ([`Opened::Later`]).
    pub async fn open(&mut self, msgs: &[jetstream::Message]) -> Vec<Opened> {
        let mut out = Vec::with_capacity(msgs.len());
        let mut object_bytes = 0usize;
        for m in msgs {
            let names_object = objects::names_object(m.headers.as_ref());
            if names_object && object_bytes >= OBJECT_BUDGET {
                out.push(Opened::Later);
                continue;
            }
            let mut o = open_payload(&self.broker, self.run, m.headers.as_ref(), &m.payload).await;
            // A message whose object stays unreadable is given up after OBJECT_TRIES
            // deliveries: handed back for ever, such messages (anyone with a worker
            // credential may publish them) would fill the consumer's ack-pending limit
            // and starve honest results. Its jobs are published again by the stall check.
            let delivered = m.info().map_or(1, |i| i.delivered);
            if matches!(o, Opened::Later) && delivered >= OBJECT_TRIES {
                warn!(
                    deliveries = delivered,
                    "a results message's object stayed unreadable; dropping the message"
                );
                o = Opened::Unusable;
            }
            match &o {
                Opened::Bytes(b) if names_object => object_bytes += b.len(),
                Opened::Unusable => self.refused += 1,
                _ => {}
            }
            out.push(o);
        }
        out
    }

    /// One batch of results. While results are queued, take what is there at once
    /// (no_wait), after waiting LINGER when the last batch was large (more then arrive
    /// in one commit). When idle, wait at the broker up to PULL_WAIT for the first one.
    /// Every pull request ends within PULL_WAIT and its batch is taken whole, so when the
    /// loop stops (between batches) no request is left open at the broker to take
    /// results nobody will ack before `ack_wait` (a continuous pull would leave one).
    pub async fn pull(&mut self) -> Vec<jetstream::Message> {
        let batch = if self.idle {
            // One message only: nats-server 2.9 does not always end a partly filled
            // waiting pull when it expires, and the client then waits 5 s more.
            self.consumer.batch().max_messages(1).expires(PULL_WAIT).messages().await
        } else {
            if self.last_batch >= LINGER_AFTER {
                tokio::time::sleep(LINGER).await;
            }
            let max_bytes = INTAKE_BYTES.max(2 * self.broker.payload_limit());
            self.consumer.fetch().max_messages(RESULT_BATCH).max_bytes(max_bytes).messages().await
        };
        let mut batch = match batch {
            Ok(b) => b,
            Err(err) => {
                warn!(error = %err, "cannot pull results; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
                self.idle = true;
                self.last_batch = 0;
                return Vec::new();
            }
        };
        let mut msgs = Vec::new();
        while let Some(m) = halyard_broker::next_pulled(&mut batch).await {
            msgs.push(m);
        }
        self.idle = msgs.is_empty();
        self.last_batch = msgs.len();
        msgs
    }

    /// Take and ack every message left for a complete run (duplicates of stored results,
    /// and junk, which is counted as refused), a pull at a time (bounded by bytes as any
    /// pull), until a pull finds nothing. Messages whose object cannot be read now are
    /// handed back and left.
    pub async fn drain(&mut self) {
        let mut taken = 0usize;
        loop {
            self.idle = false;
            self.last_batch = 0;
            let msgs = self.pull().await;
            if msgs.is_empty() {
                break;
            }
            let opened = self.open(&msgs).await;
            for (m, o) in msgs.iter().zip(&opened) {
                if let Some(payload) = o.bytes() {
                    self.decode(&m.subject, payload);
                }
            }
            Self::ack(&msgs, &opened).await;
            taken += msgs.len();
        }
        if taken > 0 {
            debug!(
                messages = taken,
                refused = self.refused,
                "took what was left for the complete run"
            );
        }
    }

    /// Ack a committed batch's messages (after the flush: durable before acked); a
    /// message whose object could not be read now is handed back for later.
    pub async fn ack(msgs: &[jetstream::Message], opened: &[Opened]) {
        for (m, o) in msgs.iter().zip(opened) {
            let kind = match o {
                Opened::Later => jetstream::AckKind::Nak(Some(OBJECT_RETRY)),
                _ => jetstream::AckKind::Ack,
            };
            if let Err(err) = m.ack_with(kind).await {
                debug!(error = %err, "result ack failed; it will be redelivered and recognised as a duplicate");
            }
        }
    }

    /// An advisory already received, if any (never waits).
    pub fn next_advisory(&mut self) -> Option<async_nats::Message> {
        self.advisories.as_mut()?.next().now_or_never().flatten()
    }

    /// The jobs of this run that a max-deliveries advisory names (a job crashed the
    /// worker each time, say). The job message is read from the stream; the caller
    /// deletes it ([`Collector::delete_job_message`]) once it has recorded what became
    /// of its jobs. None when the advisory is unreadable or names nothing of this run.
    pub async fn max_delivered(&self, payload: &[u8]) -> Option<MaxDelivered> {
        #[derive(Deserialize)]
        struct Adv {
            stream_seq: u64,
            deliveries: u64,
        }
        let Ok(adv) = serde_json::from_slice::<Adv>(payload) else {
            warn!("unreadable max-deliveries advisory");
            return None;
        };
        let stream = self.broker.js.get_stream(subjects::JOBS_STREAM).await.ok()?;
        let msg = stream.get_raw_message(adv.stream_seq).await.ok()?;
        let payload = match objects::payload_of(
            &self.broker,
            Some(&msg.headers),
            &msg.payload,
            None,
        )
        .await
        {
            Ok(p) => p,
            Err(err) => {
                warn!(stream_seq = adv.stream_seq, error = %err, "cannot read a max-delivered job message's object");
                return None;
            }
        };
        // One job, or a batch of them (`[run] job_batch`): each of this run's jobs that
        // has no result yet becomes a dead letter.
        let jobs = halyard_proto::decode_jobs(&payload).ok()?;
        let jobs: Vec<Job> = jobs.into_iter().filter(|j| j.run == self.run).collect();
        if jobs.is_empty() {
            return None;
        }
        Some(MaxDelivered { jobs, deliveries: adv.deliveries, seq: adv.stream_seq })
    }

    /// Delete the run's objects (its oversized messages): every job is finished.
    pub async fn delete_objects(&self) {
        match objects::delete_run(&self.broker, self.run).await {
            Ok(0) => {}
            Ok(n) => debug!(objects = n, "deleted the run's objects"),
            Err(err) => warn!(error = %err, "could not delete the run's objects"),
        }
    }

    /// Delete a job message that reached max_deliver (its dead letters are durable).
    pub async fn delete_job_message(&self, seq: u64) {
        let Ok(stream) = self.broker.js.get_stream(subjects::JOBS_STREAM).await else { return };
        if let Err(e) = stream.delete_message(seq).await {
            debug!(seq, error = %e, "could not delete a max-delivered job message");
        }
    }
}

/// How long a results message whose object the broker could not give waits before it
/// is delivered again.
const OBJECT_RETRY: Duration = Duration::from_secs(2);
/// Deliveries of a results message whose object the broker could not give before the
/// message is dropped (about a minute of tries, [`OBJECT_RETRY`] apart).
const OBJECT_TRIES: i64 = 30;

/// A results message's payload, opened.
pub enum Opened {
    Bytes(bytes::Bytes),
    /// Its object is unusable (missing, another run's, too large, bytes that do not hash
    /// to its name): logged and acked. Its jobs are published again by the stall check
    /// and answered from the workers' checkpoints.
    Unusable,
    /// The broker could not give its object now: handed back (nak) to be read later.
    Later,
}

impl Opened {
    pub fn bytes(&self) -> Option<&bytes::Bytes> {
        match self {
            Opened::Bytes(b) => Some(b),
            _ => None,
        }
    }
}

/// The payload of a results message of run `run`: its own, or the object it names.
pub(super) async fn open_payload(
    broker: &Broker,
    run: Uuid,
    headers: Option<&async_nats::HeaderMap>,
    payload: &bytes::Bytes,
) -> Opened {
    match objects::payload_of(broker, headers, payload, Some(run)).await {
        Ok(b) => Opened::Bytes(b),
        Err(err) if err.is_transient() => {
            if let Some(more) = OBJECT_LATER.allow() {
                warn!(error = %err, more, "cannot read a results message's object now; later");
            }
            Opened::Later
        }
        Err(err) => {
            if let Some(more) = OBJECT_UNUSABLE.allow() {
                warn!(error = %err, more, "unusable results message object; dropping the message");
            }
            Opened::Unusable
        }
    }
}

/// One warning per [`Throttle::EVERY`] at most for a kind of refused message: a flood of
/// junk (anyone with a worker credential may publish some) is counted (status,
/// `/metrics`), not a flood of log lines. `more` in a warning is how many of its kind
/// went unsaid since the last one.
pub(super) struct Throttle(std::sync::Mutex<Option<(std::time::Instant, u64)>>);

impl Throttle {
    const EVERY: Duration = Duration::from_secs(10);

    const fn new() -> Throttle {
        Throttle(std::sync::Mutex::new(None))
    }

    /// Whether to warn now, with how many went unsaid before; `None`: stay quiet.
    pub(super) fn allow(&self) -> Option<u64> {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        match &mut *g {
            Some((last, quiet)) if now.duration_since(*last) < Self::EVERY => {
                *quiet += 1;
                None
            }
            slot => {
                let more = slot.map_or(0, |(_, q)| q);
                *slot = Some((now, 0));
                Some(more)
            }
        }
    }
}

static OBJECT_LATER: Throttle = Throttle::new();
static OBJECT_UNUSABLE: Throttle = Throttle::new();
static UNDECODABLE: Throttle = Throttle::new();
static REFUSALS: Throttle = Throttle::new();

/// The results of run `run` in one message that came on `subject`, with the pool its
/// subject names, and how many of its parts were refused (an undecodable message, or one
/// on a subject that names no pool, counts one; results of another run and workers'
/// refusals one each).
pub(super) fn decode_results(run: Uuid, subject: &str, payload: &[u8]) -> (Vec<Arrival>, u64) {
    let Some(pool) = subjects::result_pool_token(run, subject) else {
        debug!(subject = %halyard_proto::redact::terminal(subject), "results message on a subject that names no pool; refused");
        return (Vec::new(), 1);
    };
    let results = match halyard_proto::decode_results(payload) {
        Ok(r) => r,
        Err(err) => {
            if let Some(more) = UNDECODABLE.allow() {
                warn!(error = %err, more, "undecodable result message; refused");
            }
            return (Vec::new(), 1);
        }
    };
    let mut refused = 0;
    let ok = results
        .into_iter()
        .filter(|r| {
            if r.run != run {
                debug!(run = %r.run, "result for another run; refused");
                refused += 1;
                return false;
            }
            // A worker's refusal is not the job's outcome: a forged message may carry a
            // real job's id (halyard_proto::FailureKind::Refused).
            if let Outcome::Failed(Failure { kind: FailureKind::Refused, error, .. }) = &r.outcome {
                if let Some(more) = REFUSALS.allow() {
                    warn!(job = %r.job, worker = %r.worker, error, more, "a worker refused a job message");
                }
                refused += 1;
                return false;
            }
            true
        })
        .map(|result| Arrival { pool: pool.to_string(), result })
        .collect();
    (ok, refused)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 49, item 9: a flood of refused messages is one warning per period, the next
    /// one saying how many went unsaid.
    #[test]
    fn refusal_warnings_are_throttled() {
        let t = Throttle::new();
        assert_eq!(t.allow(), Some(0));
        for _ in 0..10_000 {
            assert_eq!(t.allow(), None);
        }
        // The period passed (set back by hand: no sleeping in tests).
        if let Some((last, _)) = t.0.lock().unwrap().as_mut() {
            *last -= Throttle::EVERY;
        }
        assert_eq!(t.allow(), Some(10_000));
        assert_eq!(t.allow(), None);
    }
}

//! One pool's work loop: fetch as many jobs as there are free slots, run each through
//! the [`Lifecycle`] state machine, carry out its effects.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use futures::StreamExt;
use halyard_broker::PullConsumer;
use halyard_proto::{Failure, FailureKind, Job, JobId, JobResult, Outcome};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tracing::{debug, info, warn, Instrument};

use crate::backend::{Backends, CallError};
use crate::failpoint::{Failpoints, Point};
use crate::lifecycle::{Disposition, Effect, Event, Lifecycle, State};
use crate::outbox::Outbox;
use crate::retry::{call_with_retry_gated, RetryPolicy};
use crate::{Checkpoint, Stats};

pub(crate) struct PoolCtx {
    pub checkpoint: Checkpoint,
    pub backends: Backends,
    pub stats: Arc<Stats>,
    pub worker_id: String,
    pub retry: RetryPolicy,
    pub max_deliver: u64,
    pub ack_wait: Duration,
    /// Flips to true when in-flight calls must be abandoned (grace period over).
    pub hard_stop: watch::Receiver<bool>,
    /// Jobs being run by this worker: a second delivery of the same job (a lost ack, a
    /// duplicate publish) waits for the first and is then answered from the checkpoint.
    pub running: std::sync::Mutex<HashMap<JobId, Arc<tokio::sync::Mutex<()>>>>,
    /// Crash points for tests (disarmed unless `HALYARD_FAILPOINT` is set).
    pub failpoints: Arc<Failpoints>,
    /// Publishes results in batches.
    pub outbox: Outbox,
    /// Quota gates of the pools that have a quota.
    pub quotas: HashMap<String, Arc<crate::quota::QuotaGate>>,
}

/// How long an open pull request waits for jobs before it is renewed.
const PULL_WAIT: Duration = Duration::from_millis(500);

impl PoolCtx {
    fn job_lock(&self, id: JobId) -> Arc<tokio::sync::Mutex<()>> {
        let mut m = self.running.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(id).or_default().clone()
    }

    fn release(&self, id: JobId, lock: Arc<tokio::sync::Mutex<()>>) {
        let mut m = self.running.lock().unwrap_or_else(|p| p.into_inner());
        // Two references: ours and the map's. Anyone else still waiting keeps it alive.
        if Arc::strong_count(&lock) <= 2 {
            m.remove(&id);
        }
    }
}

/// Pull and run `pool`'s jobs until `shutdown` flips, then wait for in-flight jobs
/// (they finish, or are nak'd once `hard_stop` flips).
pub(crate) async fn run_pool(
    ctx: Arc<PoolCtx>,
    pool: String,
    consumer: PullConsumer,
    concurrency: usize,
    mut shutdown: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(concurrency.max(1)));
    let mut tasks = JoinSet::new();
    // Whether the last pull came back empty: then the queue is idle and the next pull
    // waits at the broker instead of returning at once.
    let mut idle = true;
    let mut per_msg = 1usize;
    info!(pool, concurrency, "pool loop started");
    'outer: loop {
        if *shutdown.borrow() {
            break;
        }
        // Wait for at least one free slot, then ask for as many jobs as slots are free
        // (never more: a job pulled waits for nothing but its call, so its ack_wait is
        // spent on the call alone).
        let first = tokio::select! {
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = shutdown.changed() => break,
        };
        // Jobs per message seen last (`[run] job_batch` of the sweep): ask for as many
        // messages as hold about one job per free slot.
        let want = (slots.available_permits() + 1).div_ceil(per_msg).max(1);
        // While jobs are queued, take what is there at once (no_wait). When the queue is
        // idle, wait at the broker (up to PULL_WAIT) for the first job rather than asking
        // again in a tight loop; then go back to taking batches. The waiting pull asks
        // for one job only: nats-server 2.9 does not always end a partly filled pull
        // request that expires, and the client then waits 5 s more for its end.
        let batch = if idle {
            consumer.batch().max_messages(1).expires(PULL_WAIT).messages().await
        } else {
            consumer.fetch().max_messages(want).messages().await
        };
        ctx.stats.pulls.inc();
        idle = true;
        let mut batch = match batch {
            Ok(b) => b,
            Err(e) => {
                warn!(pool, error = %e, "fetch failed; retrying");
                drop(first);
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(500)) => continue,
                    _ = shutdown.changed() => break,
                }
            }
        };
        let mut first = Some(first);
        loop {
            let next = tokio::select! {
                m = batch.next() => m,
                _ = shutdown.changed() => break 'outer,
            };
            let Some(msg) = next else { break };
            let msg = match msg {
                Ok(m) => m,
                Err(e) => {
                    debug!(pool, error = %e, "fetch batch ended");
                    break;
                }
            };
            idle = false;
            let Some((shared, jobs)) = open_message(msg).await else { continue };
            per_msg = jobs.len().max(1);
            for job in jobs {
                // One slot per job; the jobs of a message beyond the free slots wait here.
                let permit = match first.take() {
                    Some(p) => p,
                    None => match slots.clone().acquire_owned().await {
                        Ok(p) => p,
                        Err(_) => break 'outer,
                    },
                };
                ctx.stats.pulled.inc();
                let (ctx, shared) = (ctx.clone(), shared.clone());
                // Boxed: the job's future is several KiB (call, retries, publish), and a
                // task that holds it inline is copied whole when spawned and when it finishes.
                let job = Box::pin(run_job(ctx, shared, job));
                tasks.spawn(async move {
                    job.await;
                    drop(permit);
                });
            }
            // Reap finished tasks so the set does not grow.
            while tasks.try_join_next().is_some() {}
        }
    }
    while tasks.try_join_next().is_some() {}
    info!(pool, in_flight = tasks.len(), "pool loop stopping; waiting for in-flight jobs");
    while tasks.join_next().await.is_some() {}
}

/// A job message: one job, or several (`[run] job_batch` > 1). It is settled once every
/// job in it has finished: acked if all of them were (each result durable and published
/// first), nak'd if one asked for a retry, left to redeliver after `ack_wait` if one
/// could not finish. A redelivery re-runs only the jobs the checkpoint does not answer.
pub(crate) struct JobMsg {
    msg: jetstream::Message,
    delivered: u64,
    /// Jobs not finished yet, and the fate of those that are.
    state: std::sync::Mutex<(usize, Fate)>,
}

/// What a finished job asks of its message.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fate {
    Ack,
    Nak(Duration),
    /// Neither: the message is redelivered after `ack_wait`.
    Leave,
}

impl Fate {
    /// The message's fate given two of its jobs': leaving beats a nak (the longest delay
    /// wins), a nak beats an ack.
    fn and(self, other: Fate) -> Fate {
        match (self, other) {
            (Fate::Leave, _) | (_, Fate::Leave) => Fate::Leave,
            (Fate::Nak(a), Fate::Nak(b)) => Fate::Nak(a.max(b)),
            (Fate::Nak(d), Fate::Ack) | (Fate::Ack, Fate::Nak(d)) => Fate::Nak(d),
            (Fate::Ack, Fate::Ack) => Fate::Ack,
        }
    }
}

impl JobMsg {
    /// One job of the message is finished with `fate`. The last one settles the message;
    /// an error is the settling ack or nak failing to go out.
    async fn finish(&self, fate: Fate) -> Result<(), async_nats::Error> {
        let (left, settled) = {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            st.0 = st.0.saturating_sub(1);
            st.1 = st.1.and(fate);
            *st
        };
        if left > 0 {
            return Ok(());
        }
        match settled {
            Fate::Ack => self.msg.ack().await,
            Fate::Nak(delay) => self.msg.ack_with(AckKind::Nak(Some(delay))).await,
            Fate::Leave => Ok(()),
        }
    }
}

/// Read a job message: its delivery count and its jobs. `None` when there is nothing
/// to run (no JetStream metadata; undecodable, which is terminated so it does not loop).
async fn open_message(msg: jetstream::Message) -> Option<(Arc<JobMsg>, Vec<Job>)> {
    let (delivered, seq) = match msg.info() {
        Ok(i) => (i.delivered.max(1) as u64, i.stream_sequence),
        Err(e) => {
            warn!(error = %e, "job message without JetStream metadata; ignoring");
            return None;
        }
    };
    let jobs = halyard_proto::decode_jobs(&msg.payload).and_then(|jobs| {
        jobs.iter().try_for_each(|j| halyard_proto::codec::check_version("job", j.v))?;
        Ok(jobs)
    });
    let jobs = match jobs {
        Ok(j) if !j.is_empty() => j,
        Ok(_) => {
            warn!(stream_seq = seq, "terminating an empty job batch");
            let _ = msg.ack_with(AckKind::Term).await;
            return None;
        }
        Err(e) => {
            // Undecodable: nobody can ever run it. Terminate it so it does not loop.
            warn!(stream_seq = seq, error = %e, "terminating undecodable job message");
            let _ = msg.ack_with(AckKind::Term).await;
            return None;
        }
    };
    let shared = JobMsg { msg, delivered, state: std::sync::Mutex::new((jobs.len(), Fate::Ack)) };
    Some((Arc::new(shared), jobs))
}

async fn run_job(ctx: Arc<PoolCtx>, msg: Arc<JobMsg>, job: Job) {
    // A debug span: an info span is formatted eagerly for every job (a measurable share of
    // a no-op job's cost). The warnings below name the job themselves.
    let span = tracing::debug_span!("job", job = %job.id, run = %job.run, pool = %job.pool, delivery = msg.delivered);
    async move {
        let lock = ctx.job_lock(job.id);
        let guard = lock.lock().await;
        run_job_locked(&ctx, &msg, &job).await;
        drop(guard);
        ctx.release(job.id, lock);
    }
    .instrument(span)
    .await
}

async fn run_job_locked(ctx: &Arc<PoolCtx>, shared: &JobMsg, job: &Job) {
    let (msg, delivered) = (&shared.msg, shared.delivered);
    // Whether this job has told its message how it ended (see `JobMsg`).
    let mut settled = false;
    let mut lc = Lifecycle::new(delivered, ctx.max_deliver);
    let cached = match ctx.checkpoint.get(&job.id) {
        Ok(c) => c,
        Err(e) => {
            warn!(job = %job.id, delivery = delivered, error = %e, "unreadable checkpoint record; calling the model again");
            None
        }
    };
    let mut completion = cached;
    let mut last_error: Option<CallError> = None;
    let mut pending: std::collections::VecDeque<Effect> = lc.step(Event::Start { checkpoint_hit: completion.is_some() }).into();
    while let Some(effect) = pending.pop_front() {
        let event = match effect {
            Effect::CallBackend => match call(ctx, msg, job).await {
                CallOutcome::Done(c) => {
                    ctx.stats.add_calls(c.calls as u64);
                    completion = Some(c);
                    ctx.failpoints.pass(Point::CallPersist);
                    Event::CallSucceeded
                }
                CallOutcome::Failed(e, calls) => {
                    ctx.stats.add_calls(calls as u64);
                    warn!(job = %job.id, delivery = delivered, error = %e.message, status = ?e.status, permanent = e.is_permanent(), "model call failed");
                    let ev = Event::CallFailed { permanent: e.is_permanent(), retry_after: e.retry_after };
                    last_error = Some(e);
                    ev
                }
                CallOutcome::Abandoned => Event::Shutdown,
            },
            Effect::Persist => {
                let Some(c) = completion.as_ref() else { break };
                match ctx.checkpoint.put(job.id, c).await {
                    Ok(()) => {
                        ctx.failpoints.pass(Point::FlushPublish);
                        Event::Persisted
                    }
                    Err(e) => {
                        warn!(job = %job.id, delivery = delivered, error = %e, "checkpoint write failed; job goes back to the queue");
                        Event::PersistFailed
                    }
                }
            }
            Effect::PublishResult => {
                let Some(c) = completion.clone() else { break };
                let replay = matches!(lc.state(), State::Publishing { replay: true, .. });
                publish(ctx, job, Outcome::Done(c), delivered, replay).await
            }
            Effect::PublishDeadLetter => {
                let e = last_error.clone().unwrap_or_else(|| CallError::transient("unknown error"));
                let kind = if e.is_permanent() { FailureKind::Permanent } else { FailureKind::Exhausted };
                let error = if kind == FailureKind::Exhausted {
                    format!("gave up after {delivered} deliveries: {}", e.message)
                } else {
                    e.message.clone()
                };
                publish(ctx, job, Outcome::Failed(Failure { kind, error, http_status: e.status }), delivered, false).await
            }
            // A plain ack, not a double ack: the result is durable in sled and in the
            // results stream, so a lost ack only means a redelivery that the checkpoint
            // answers without a model call. Acks are not awaited one by one: the client
            // writes all pending acks in one go (batched on the wire).
            Effect::Ack => {
                settled = true;
                match shared.finish(Fate::Ack).await {
                    Ok(()) => {
                        ctx.failpoints.pass(Point::AckFlush);
                        Event::Acked
                    }
                    Err(e) => {
                        warn!(job = %job.id, delivery = delivered, error = %e, "ack not sent; a redelivery will be answered from the checkpoint");
                        break;
                    }
                }
            }
            Effect::Nak(delay) => {
                settled = true;
                if let Err(e) = shared.finish(Fate::Nak(delay)).await {
                    warn!(job = %job.id, delivery = delivered, error = %e, "nak failed; the job will be redelivered after ack_wait");
                }
                break;
            }
        };
        pending.extend(lc.step(event));
    }
    if !settled {
        if let Err(e) = shared.finish(Fate::Leave).await {
            debug!(job = %job.id, error = %e, "job message not settled");
        }
    }
    match lc.state() {
        State::Finished(Disposition::Completed) => ctx.stats.completed.inc(),
        State::Finished(Disposition::Replayed) => ctx.stats.replayed.inc(),
        State::Finished(Disposition::DeadLetter) => ctx.stats.dead_letters.inc(),
        _ => ctx.stats.retried.inc(),
    }
}

enum CallOutcome {
    Done(halyard_proto::Completion),
    Failed(CallError, u32),
    Abandoned,
}

/// Run the call with retries, sending in-progress acks while it lasts longer than a
/// fraction of `ack_wait`, and abandoning it when the hard stop comes.
async fn call(ctx: &PoolCtx, msg: &jetstream::Message, job: &Job) -> CallOutcome {
    let fut = call_with_retry_gated(&ctx.backends, ctx.quotas.get(&job.pool).map(|g| &**g), &ctx.stats, job, ctx.retry);
    tokio::pin!(fut);
    let period = (ctx.ack_wait / 3).max(Duration::from_millis(200));
    let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    let mut hard_stop = ctx.hard_stop.clone();
    loop {
        tokio::select! {
            (res, n) = &mut fut => return match res {
                Ok(c) => CallOutcome::Done(c),
                Err(e) => CallOutcome::Failed(e, n),
            },
            _ = progress.tick() => {
                if let Err(e) = msg.ack_with(AckKind::Progress).await {
                    debug!(error = %e, "progress ack failed");
                }
            }
            stopped = async { hard_stop.wait_for(|s| *s).await.is_ok() } => {
                if stopped { return CallOutcome::Abandoned; }
                // The sender is gone: no hard stop can come any more; keep calling.
                return match (&mut fut).await { (Ok(c), _) => CallOutcome::Done(c), (Err(e), n) => CallOutcome::Failed(e, n) };
            }
        }
    }
}

/// Publish a result through the outbox (batched with the others ready) and wait for
/// the broker's ack of the message holding it.
async fn publish(ctx: &PoolCtx, job: &Job, outcome: Outcome, deliveries: u64, cached: bool) -> Event {
    // A dead letter can be re-queued (`halyard retry-failed`): the message holding it
    // gets a unique id, so the broker does not drop the retry's result as a duplicate.
    let dead_letter = matches!(outcome, Outcome::Failed(_));
    let result = JobResult {
        v: halyard_proto::WIRE_VERSION,
        job: job.id,
        run: job.run,
        outcome,
        deliveries,
        worker: ctx.worker_id.clone(),
        cached,
    };
    let encoded = match halyard_proto::encode(&result) {
        Ok(p) => p,
        Err(e) => {
            warn!(job = %job.id, error = %e, "cannot encode result");
            return Event::PublishFailed;
        }
    };
    if ctx.outbox.publish(job.run, job.id, encoded, dead_letter).await {
        Event::Published
    } else {
        Event::PublishFailed
    }
}

#[cfg(test)]
mod tests {
    use super::Fate;
    use std::time::Duration;

    /// A job message is acked only if every job in it was; a nak (the longest) beats an
    /// ack; a job that could not finish leaves the whole message to be redelivered.
    #[test]
    fn a_message_settles_by_its_worst_job() {
        let (a, b) = (Duration::from_secs(1), Duration::from_secs(5));
        assert_eq!(Fate::Ack.and(Fate::Ack), Fate::Ack);
        assert_eq!(Fate::Ack.and(Fate::Nak(a)), Fate::Nak(a));
        assert_eq!(Fate::Nak(b).and(Fate::Nak(a)), Fate::Nak(b));
        assert_eq!(Fate::Nak(a).and(Fate::Leave), Fate::Leave);
        assert_eq!(Fate::Leave.and(Fate::Ack), Fate::Leave);
        let all = [Fate::Ack, Fate::Nak(a), Fate::Ack].into_iter().fold(Fate::Ack, Fate::and);
        assert_eq!(all, Fate::Nak(a));
    }
}

//! One pool's work loop: fetch as many jobs as there are free slots, run each through
//! the [`Lifecycle`] state machine, carry out its effects. While the pool's endpoint is
//! down (see [`crate::health`]) the loop fetches nothing but one job to probe with.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use halyard_broker::PullConsumer;
use halyard_proto::{Job, JobId, JobResult, Outcome};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tracing::{debug, info, warn, Instrument};

use crate::admit::{self, Received};
use crate::backend::{Backends, CallError};
use crate::budget::Budget;
use crate::calling::{call, call_event, dead_letter, CallOutcome};
use crate::failpoint::{Failpoints, Point};
use crate::health::{FetchTurn, PoolHealth, ProbeClaim};
use crate::lifecycle::{Disposition, Effect, Event, Lifecycle, State};
use crate::message::{Fate, JobMsg};
use crate::outbox::Outbox;
use crate::retry::RetryPolicy;
use crate::checkpoint::Checkpoint;
use crate::stats::Stats;

pub(crate) struct PoolCtx {
    pub checkpoint: Checkpoint,
    pub backends: Backends,
    pub stats: Arc<Stats>,
    pub worker_id: String,
    pub retry: RetryPolicy,
    pub max_deliver: u64,
    /// The ack wait in-progress acks are paced by (milliseconds): the worker's, lowered
    /// to a pool consumer's shorter one ([`PoolCtx::pace_by`]).
    pub ack_wait_ms: std::sync::atomic::AtomicU64,
    /// Flips to true when in-flight calls must be abandoned (grace period over).
    pub hard_stop: watch::Receiver<bool>,
    /// Flips to true when the worker stops fetching (a probe's wait ends then).
    pub stop: watch::Receiver<bool>,
    /// Jobs being run by this worker: a second delivery of the same job (a lost ack, a
    /// duplicate publish) waits for the first and is then answered from the checkpoint.
    pub running: std::sync::Mutex<HashMap<JobId, Arc<tokio::sync::Mutex<()>>>>,
    /// Crash points for tests (disarmed unless `HALYARD_FAILPOINT` is set).
    pub failpoints: Arc<Failpoints>,
    /// Publishes results in batches.
    pub outbox: Outbox,
    /// Quota gates of the pools that have a quota.
    pub quotas: HashMap<String, Arc<crate::quota::QuotaGate>>,
    /// Deliveries excused from the jobs' budgets (see [`crate::budget`]).
    pub budget: Budget,
    /// What this worker serves; every job received is checked against it.
    pub plan: halyard_proto::pool::WorkerPlan,
    /// For job messages that name an object.
    pub broker: halyard_broker::Broker,
    /// The pools in batch mode: their jobs' calls go through provider batches.
    pub batches: crate::batch::Batches,
}

/// How long a job message whose object the broker could not give waits before it is
/// offered again.
const OBJECT_RETRY: Duration = Duration::from_secs(5);

/// How long an open pull request waits for jobs before it is renewed.
const PULL_WAIT: Duration = Duration::from_millis(500);

/// An ack wait as [`PoolCtx::ack_wait_ms`] holds it: whole milliseconds, at least one.
pub(crate) fn ack_wait_millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl PoolCtx {
    /// The ack wait in-progress acks are paced by.
    pub(crate) fn ack_wait(&self) -> Duration {
        Duration::from_millis(self.ack_wait_ms.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Pace in-progress acks by `consumer`'s ack wait too, if it is shorter than the
    /// worker's (the coordinator made the consumer with its sweep's `[run] ack_wait_s`).
    pub(crate) fn pace_by(&self, pool: &str, consumer: &PullConsumer) {
        let wait = halyard_broker::consumer_ack_wait(consumer);
        let ms = ack_wait_millis(wait);
        let before = self.ack_wait_ms.fetch_min(ms, std::sync::atomic::Ordering::Relaxed);
        if ms < before {
            info!(pool, ack_wait = ?wait, worker_ack_wait = ?Duration::from_millis(before), "the pool's consumer waits less for acks than this worker's setting; in-progress acks are paced by it");
        }
    }

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
    health: Arc<PoolHealth>,
    consumer: Option<PullConsumer>,
    concurrency: usize,
    mut shutdown: watch::Receiver<bool>,
) {
    let consumer = match consumer {
        Some(c) => c,
        None => match await_consumer(&ctx, &pool, &mut shutdown).await {
            Some(c) => c,
            None => return,
        },
    };
    ctx.pace_by(&pool, &consumer);
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
        if health.is_paused() {
            // Paused: fetch nothing, but one job to probe with when a probe is due.
            let turn = tokio::select! {
                t = health.fetch_turn() => t,
                _ = shutdown.changed() => break,
            };
            if turn == FetchTurn::Probe {
                let probe = fetch_probe(&ctx, &health, &consumer, &slots, &mut tasks);
                let go_on = tokio::select! {
                    g = probe => g,
                    _ = shutdown.changed() => false,
                };
                if !go_on {
                    break;
                }
            }
            idle = true;
            continue;
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
                m = halyard_broker::next_pulled(&mut batch) => m,
                _ = shutdown.changed() => break 'outer,
            };
            let Some(msg) = next else { break };
            idle = false;
            let Some((shared, jobs)) = open_message(&ctx, &pool, msg).await else { continue };
            per_msg = jobs.len().max(1);
            let run = Spawn { ctx: &ctx, health: &health, slots: &slots };
            if !run.jobs(&mut tasks, &mut first, shared, jobs, None).await {
                break 'outer;
            }
        }
    }
    while tasks.try_join_next().is_some() {}
    info!(pool, in_flight = tasks.len(), "pool loop stopping; waiting for in-flight jobs");
    while tasks.join_next().await.is_some() {}
}

/// How often a worker looks for a pool consumer that no coordinator has made yet: at
/// first soon (`halyard run` starts its workers as its coordinator plans), then every
/// second.
const CONSUMER_LOOK: Duration = Duration::from_secs(1);

/// Wait until a coordinator has made `pool`'s consumer, then bind it; `None` on
/// shutdown. A consumer that exists with another configuration is named in an error
/// (once per distinct error) and looked at again, in case it is replaced.
async fn await_consumer(
    ctx: &PoolCtx,
    pool: &str,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<PullConsumer> {
    let mut said = String::new();
    let mut wait = Duration::from_millis(50);
    loop {
        if *shutdown.borrow() {
            return None;
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => wait = (wait * 2).min(CONSUMER_LOOK),
            _ = shutdown.changed() => return None,
        }
        match halyard_broker::bind_pool_consumer(&ctx.broker, pool).await {
            Ok(Some(c)) => {
                info!(pool, "the pool's consumer is there; taking its jobs");
                return Some(c);
            }
            Ok(None) => {}
            Err(e) => {
                let text = e.to_string();
                if text != said {
                    tracing::error!(pool, error = %text, "cannot bind the pool's consumer; waiting");
                    said = text;
                }
            }
        }
    }
}

/// Spawns a message's jobs, one concurrency slot each.
struct Spawn<'a> {
    ctx: &'a Arc<PoolCtx>,
    health: &'a Arc<PoolHealth>,
    slots: &'a Arc<Semaphore>,
}

impl Spawn<'_> {
    /// Run the admitted jobs of message `shared` and settle its refused ones, the first
    /// on the slot in `first` if any; the first admitted job holds `probe` if given (a
    /// message with none gives the probe up). False when the slots are closed.
    async fn jobs(
        &self,
        tasks: &mut JoinSet<()>,
        first: &mut Option<OwnedSemaphorePermit>,
        shared: Arc<JobMsg>,
        jobs: Vec<Received>,
        mut probe: Option<ProbeClaim>,
    ) -> bool {
        if probe.is_some() && !jobs.iter().any(|j| matches!(j, Received::Run(_))) {
            drop(probe.take());
            self.health.defer_probe();
        }
        for item in jobs {
            // One slot per job; the jobs of a message beyond the free slots wait here.
            let permit = match first.take() {
                Some(p) => p,
                None => match self.slots.clone().acquire_owned().await {
                    Ok(p) => p,
                    Err(_) => return false,
                },
            };
            self.ctx.stats.pulled.inc();
            let (ctx, health, shared) = (self.ctx.clone(), self.health.clone(), shared.clone());
            // Boxed: the job's future is several KiB (call, retries, publish), and a
            // task that holds it inline is copied whole when spawned and when it finishes.
            let job: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> = match item {
                Received::Run(job) => Box::pin(run_job(ctx, health, shared, job, probe.take())),
                Received::Refuse(r) => {
                    Box::pin(async move { admit::refuse(&ctx, &shared, r).await })
                }
            };
            tasks.spawn(async move {
                job.await;
                drop(permit);
            });
        }
        // Reap finished tasks so the set does not grow.
        while tasks.try_join_next().is_some() {}
        true
    }
}

/// While paused with a probe due and no job holding it: fetch one job message and let
/// its first job probe. With nothing queued, try again an interval later. False when the
/// slots are closed.
async fn fetch_probe(
    ctx: &Arc<PoolCtx>,
    health: &Arc<PoolHealth>,
    consumer: &PullConsumer,
    slots: &Arc<Semaphore>,
    tasks: &mut JoinSet<()>,
) -> bool {
    let Some(claim) = health.claim_probe() else { return true };
    let Ok(permit) = slots.clone().acquire_owned().await else { return false };
    ctx.stats.pulls.inc();
    let msg = match consumer.fetch().max_messages(1).messages().await {
        Ok(mut batch) => halyard_broker::next_pulled(&mut batch).await,
        Err(e) => {
            debug!(pool = %health.pool(), error = %e, "probe fetch failed");
            None
        }
    };
    let opened = match msg {
        Some(m) => open_message(ctx, health.pool(), m).await,
        None => None,
    };
    let Some((shared, jobs)) = opened else {
        drop(claim);
        health.defer_probe();
        return true;
    };
    let run = Spawn { ctx, health, slots };
    run.jobs(tasks, &mut Some(permit), shared, jobs, Some(claim)).await
}

/// Read a job message: its delivery count and its items, each decoded and checked
/// against the plan on its own (see `admit`). `None` when there is nothing to run: no
/// JetStream metadata, an empty batch (terminated), or a message of another wire
/// version (handed back with a delay for a compatible worker).
async fn open_message(
    ctx: &PoolCtx,
    pool: &str,
    msg: jetstream::Message,
) -> Option<(Arc<JobMsg>, Vec<Received>)> {
    let (delivered, seq) = match msg.info() {
        Ok(i) => (i.delivered.max(1) as u64, i.stream_sequence),
        Err(e) => {
            warn!(error = %e, "job message without JetStream metadata; ignoring");
            return None;
        }
    };
    // A job too large for one message names an object holding it (`halyard_broker::objects`).
    let payload = match halyard_broker::objects::payload_of(
        &ctx.broker,
        msg.headers.as_ref(),
        &msg.payload,
        None,
    )
    .await
    {
        Ok(p) => p,
        Err(e) if e.is_transient() => {
            warn!(pool, stream_seq = seq, error = %e, "cannot read a job message's object now; handing it back");
            let shared = JobMsg::new(msg, delivered, 1);
            let _ = shared.finish(Fate::HandBack(OBJECT_RETRY), &ctx.budget).await;
            return None;
        }
        Err(e) => {
            // Its jobs, if real, are published again by the coordinator's stall check.
            warn!(pool, stream_seq = seq, error = %e, "terminating a job message whose object is unusable");
            let _ = msg.ack_with(AckKind::Term).await;
            return None;
        }
    };
    let items = match admit::receive(&ctx.plan, pool, &payload) {
        Ok(items) if !items.is_empty() => items,
        Ok(_) => {
            warn!(stream_seq = seq, "terminating an empty job batch");
            let _ = msg.ack_with(AckKind::Term).await;
            return None;
        }
        Err(version) => {
            warn!(
                pool,
                stream_seq = seq,
                version,
                ours = halyard_proto::WIRE_VERSION,
                delay_s = admit::OTHER_VERSION_DELAY.as_secs(),
                "job message of another wire version; handing it back for a compatible worker"
            );
            // Handed back, not counted: a compatible worker will take it.
            let shared = JobMsg::new(msg, delivered, 1);
            let _ = shared.finish(Fate::HandBack(admit::OTHER_VERSION_DELAY), &ctx.budget).await;
            return None;
        }
    };
    let shared = JobMsg::new(msg, delivered, items.len());
    Some((Arc::new(shared), items))
}

async fn run_job(
    ctx: Arc<PoolCtx>,
    health: Arc<PoolHealth>,
    msg: Arc<JobMsg>,
    job: Job,
    probe: Option<ProbeClaim>,
) {
    // A debug span: an info span is formatted eagerly for every job (a measurable share of
    // a no-op job's cost). The warnings below name the job themselves.
    let span = tracing::debug_span!("job", job = %job.id, run = %job.run, pool = %job.pool, delivery = msg.delivered);
    async move {
        let lock = ctx.job_lock(job.id);
        let guard = lock.lock().await;
        run_job_locked(&ctx, &health, &msg, &job, probe).await;
        drop(guard);
        ctx.release(job.id, lock);
    }
    .instrument(span)
    .await
}

async fn run_job_locked(
    ctx: &Arc<PoolCtx>,
    health: &Arc<PoolHealth>,
    shared: &JobMsg,
    job: &Job,
    mut probe: Option<ProbeClaim>,
) {
    let (msg, delivered) = (&shared.msg, shared.delivered);
    // Whether this job has told its message how it ended (see `JobMsg`).
    let mut settled = false;
    let cached = match ctx.checkpoint.get(&job.id) {
        Ok(c) => c,
        Err(e) => {
            warn!(job = %job.id, delivery = delivered, error = %e, "unreadable checkpoint record; calling the model again");
            None
        }
    };
    // A redelivery's budget is read only when the checkpoint does not answer it. A job
    // that a live provider batch holds is not over budget however often its workers
    // crashed: its answer is paid for and on its way (see `batch`).
    let held = match ctx.batches.pool(&job.pool) {
        Some(b) if cached.is_none() => b.holds(&job.id).await,
        _ => false,
    };
    if held {
        // Its earlier delivery ended in a crash while the batch went on: not the job's.
        shared.excuse_delivery(&ctx.budget).await;
    }
    let effective = if cached.is_some() || held { 1 } else { shared.effective(&ctx.budget).await };
    let mut lc = Lifecycle::new(effective, ctx.max_deliver);
    let mut completion = cached;
    let mut last_error: Option<CallError> = None;
    let mut pending: std::collections::VecDeque<Effect> =
        lc.step(Event::Start { checkpoint_hit: completion.is_some() }).into();
    while let Some(effect) = pending.pop_front() {
        let event = match effect {
            Effect::CallBackend => {
                let outcome = match ctx.batches.pool(&job.pool) {
                    Some(b) => batch_call(ctx, b, msg, job).await,
                    None => call(ctx, health, msg, job, probe.take()).await,
                };
                call_event(ctx, job, &lc, outcome, &mut completion, &mut last_error)
            }
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
                let failure = dead_letter(&lc, delivered, last_error.as_ref());
                publish(ctx, job, Outcome::Failed(failure), delivered, false).await
            }
            // A plain ack, not a double ack: the result is durable in the checkpoint and in the
            // results stream, so a lost ack only means a redelivery that the checkpoint
            // answers without a model call. Acks are not awaited one by one: the client
            // writes all pending acks in one go (batched on the wire).
            Effect::Ack => {
                settled = true;
                match shared.finish(Fate::Ack, &ctx.budget).await {
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
            Effect::Nak(delay) | Effect::HandBack(delay) => {
                settled = true;
                let fate = if matches!(effect, Effect::Nak(_)) {
                    Fate::Nak(delay)
                } else {
                    Fate::HandBack(delay)
                };
                if let Err(e) = shared.finish(fate, &ctx.budget).await {
                    warn!(job = %job.id, delivery = delivered, error = %e, "nak failed; the job will be redelivered after ack_wait");
                }
                break;
            }
        };
        pending.extend(lc.step(event));
    }
    if !settled {
        if let Err(e) = shared.finish(Fate::Leave, &ctx.budget).await {
            debug!(job = %job.id, error = %e, "job message not settled");
        }
    }
    match lc.state() {
        State::Finished(Disposition::Completed) => ctx.stats.completed.inc(),
        State::Finished(Disposition::Replayed) => ctx.stats.replayed.inc(),
        State::Finished(Disposition::DeadLetter) => ctx.stats.dead_letters.inc(),
        State::Finished(Disposition::HandedBack) => ctx.stats.handed_back.inc(),
        _ => ctx.stats.retried.inc(),
    }
}

/// A batch pool's "call": the job's turn in a provider batch (see [`crate::batch`]).
async fn batch_call(
    ctx: &PoolCtx,
    pool: &Arc<crate::batch::BatchPool>,
    msg: &jetstream::Message,
    job: &Job,
) -> CallOutcome {
    use crate::batch::BatchOutcome as B;
    match pool.run(job, msg, ctx.ack_wait(), ctx.stop.clone()).await {
        B::Done(c) => CallOutcome::Done(c),
        B::Failed(e, calls) => CallOutcome::Failed(e, calls),
        B::NotRun(why) => {
            info!(job = %job.id, reason = %why, "job not answered by its batch; back to the queue for another batch");
            CallOutcome::HandBack(0)
        }
        B::Abandoned => CallOutcome::Abandoned,
    }
}

/// Publish a result through the outbox (batched with the others ready) and wait for
/// the broker's ack of the message holding it.
pub(crate) async fn publish(
    ctx: &PoolCtx,
    job: &Job,
    outcome: Outcome,
    deliveries: u64,
    cached: bool,
) -> Event {
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
    if ctx.outbox.publish(job.run, job.pool.as_str().into(), job.id, encoded, dead_letter).await {
        Event::Published
    } else {
        Event::PublishFailed
    }
}

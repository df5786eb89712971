//! One delivery of a job message, from the message read to its settling: the
//! [`Lifecycle`] machine (pure, in [`crate::lifecycle`]) and the IO that carries out its
//! effects: the checkpoint, the call ([`calling`]), the result published ([`ctx::publish`]),
//! the ack or nak. What every delivery shares is [`PoolCtx`]; the receiving half (decode
//! and check each job) is [`admit`]. The pool loop (`pool`) fetches messages and hands
//! each to [`open_message`] and its jobs to [`run_job`]; nothing here imports it.

mod admit;
mod calling;
mod ctx;
mod retrying;

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use halyard_proto::{Job, Outcome};
use tracing::{debug, info, warn, Instrument};

pub(crate) use admit::{refuse, Received};
pub(crate) use ctx::{ack_wait_millis, PoolCtx};

use crate::backend::CallError;
use crate::failpoint::Point;
use crate::health::{PoolHealth, ProbeClaim};
use crate::lifecycle::{Disposition, Effect, Event, Lifecycle, State};
use crate::message::{Fate, JobMsg};
use calling::{call, call_event, dead_letter, CallOutcome};
use ctx::publish;

/// How long a job message whose object the broker could not give waits before it is
/// offered again.
const OBJECT_RETRY: Duration = Duration::from_secs(5);

/// Read a job message: its delivery count and its items, each decoded and checked
/// against the plan on its own (see `admit`). `None` when there is nothing to run: no
/// JetStream metadata, an empty batch (terminated), or a message of another wire
/// version (handed back with a delay for a compatible worker).
pub(crate) async fn open_message(
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

pub(crate) async fn run_job(
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
    let policy = ctx.cache_policy(&job.key.model);
    let cached = match cached {
        Some(c) => Some(c),
        None => from_cache(ctx, job, policy).await,
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
                        // Paid for by this worker and durable here: shared with the
                        // machine's other runs (off the job's path).
                        ctx.cache.remember(&job.key, c, policy);
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

/// The result cache's answer to `job` (checkpoint missed), written to the checkpoint
/// first: a run keeps what it read even if the cache is pruned, and it is then a
/// checkpoint hit like any other. A checkpoint that cannot take it: no answer (called).
async fn from_cache(
    ctx: &PoolCtx,
    job: &Job,
    policy: halyard_proto::CachePolicy,
) -> Option<halyard_proto::Completion> {
    let (c, tier) = ctx.cache.lookup(&job.key, &job.id, policy).await?;
    if let Err(e) = ctx.checkpoint.put(job.id, &c).await {
        warn!(job = %job.id, error = %e, "checkpoint write failed; the job is called instead of answered from the cache");
        return None;
    }
    match tier {
        halyard_cache::Tier::Machine => ctx.stats.cache_machine.inc(),
        halyard_cache::Tier::Shared => ctx.stats.cache_shared.inc(),
    }
    Some(c)
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

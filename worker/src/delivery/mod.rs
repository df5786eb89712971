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

use async_nats::jetstream;
use halyard_proto::{Completion, Failure, FailureKind, Job, Outcome};
use tracing::{debug, info, warn, Instrument};

pub(crate) use admit::Received;
pub(crate) use ctx::{ack_wait_millis, PoolCtx};

use crate::backend::CallError;
use crate::failpoint::Point;
use crate::health::{PoolHealth, ProbeClaim};
use crate::lifecycle::{Disposition, Effect, Event, Lifecycle, State, OTHER_VERSION_DELAY};
use crate::message::{Fate, JobMsg};
use admit::Refused;
use calling::{call_event, dead_letter, CallOutcome, Calling, Step};
use ctx::publish;

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
            settle_message(ctx, msg, delivered, Event::Unreadable { transient: true }).await;
            return None;
        }
        Err(e) => {
            // Its jobs, if real, are published again by the coordinator's stall check.
            warn!(pool, stream_seq = seq, error = %e, "terminating a job message whose object is unusable");
            settle_message(ctx, msg, delivered, Event::Unreadable { transient: false }).await;
            return None;
        }
    };
    let items = match admit::receive(&ctx.plan, pool, &payload) {
        Ok(items) if !items.is_empty() => items,
        Ok(_) => {
            warn!(stream_seq = seq, "terminating an empty job batch");
            settle_message(ctx, msg, delivered, Event::Empty).await;
            return None;
        }
        Err(version) => {
            warn!(
                pool,
                stream_seq = seq,
                version,
                ours = halyard_proto::WIRE_VERSION,
                delay_s = OTHER_VERSION_DELAY.as_secs(),
                "job message of another wire version; handing it back for a compatible worker"
            );
            // Handed back, not counted: a compatible worker will take it.
            settle_message(ctx, msg, delivered, Event::OtherVersion).await;
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
    ctx: &PoolCtx,
    health: &Arc<PoolHealth>,
    shared: &JobMsg,
    job: &Job,
    probe: Option<ProbeClaim>,
) {
    let mut lc = Lifecycle::new(shared.delivered, ctx.max_deliver).holding_probe(probe.is_some());
    let mut io = Io::new(ctx, shared);
    io.job = Some(job);
    io.health = Some(health);
    io.probe = probe;
    io.policy = Some(ctx.cache_policy(&job.key.model));
    io.drive(&mut lc, Event::Arrived).await;
    match lc.state() {
        State::Finished(Disposition::Completed) => ctx.stats.completed.inc(),
        State::Finished(Disposition::Replayed) => ctx.stats.replayed.inc(),
        State::Finished(Disposition::DeadLetter) => ctx.stats.dead_letters.inc(),
        State::Finished(Disposition::HandedBack) => ctx.stats.handed_back.inc(),
        // Counted when refused (see `admit::refuse`); a job is not refused here.
        State::Finished(Disposition::Refused) => {}
        _ => ctx.stats.retried.inc(),
    }
}

/// Settle a refused job: log, count, and let its delivery report it to its run and
/// terminate its share (see [`crate::lifecycle`], `Event::Refused`).
pub(crate) async fn refuse(ctx: &PoolCtx, msg: &JobMsg, r: Refused) {
    ctx.stats.refused.inc();
    let job_id = r.job.as_ref().map(|j| j.id.to_string()).unwrap_or_default();
    warn!(job = job_id, delivery = msg.delivered, reason = %r.refusal, "job refused: not called, not checkpointed");
    let mut lc = Lifecycle::new(msg.delivered, ctx.max_deliver);
    let mut io = Io::new(ctx, msg);
    io.job = r.job.as_ref();
    io.refusal = Some(&r.refusal);
    io.drive(&mut lc, Event::Refused { reportable: r.job.is_some() }).await;
}

/// Settle a whole job message that is not run, by `event` (see [`Lifecycle`]: a message
/// of another wire version or whose object cannot be read now is handed back; one whose
/// object is unusable, or that holds no job, is terminated).
async fn settle_message(ctx: &PoolCtx, msg: jetstream::Message, delivered: u64, event: Event) {
    let shared = JobMsg::new(msg, delivered, 1);
    let mut lc = Lifecycle::new(delivered, ctx.max_deliver);
    Io::new(ctx, &shared).drive(&mut lc, event).await;
}

/// The IO of one delivery: it carries out the [`Lifecycle`]'s effects, one at a time,
/// and tells it how each went. The one place where a delivery touches the checkpoint,
/// the cache, the batches, the budget, the backend (`calling`), the results stream
/// ([`publish`]) and the job message (ack, nak, hand-back, termination).
struct Io<'a> {
    ctx: &'a PoolCtx,
    shared: &'a JobMsg,
    /// The job (none: a message settled whole, or a refused item that could not be
    /// decoded); an effect that needs it ends the delivery without it.
    job: Option<&'a Job>,
    health: Option<&'a Arc<PoolHealth>>,
    /// The pool's probe, held exactly while the machine says so
    /// ([`Lifecycle::holds_probe`]).
    probe: Option<ProbeClaim>,
    /// A direct pool's call across its effects (rounds, the probe's waits).
    calling: Calling,
    /// The job's cache policy (its model's).
    policy: Option<halyard_proto::CachePolicy>,
    /// Why the worker's plan refused the job.
    refusal: Option<&'a halyard_proto::pool::Refusal>,
    completion: Option<Completion>,
    last_error: Option<CallError>,
    /// The job's claim on the machine's result cache while this delivery calls it
    /// (given back when the answer is remembered, else when the delivery ends).
    claim: Option<halyard_cache::ClaimGuard>,
    /// Whether this job has told its message how it ended (see `JobMsg`).
    settled: bool,
}

impl<'a> Io<'a> {
    fn new(ctx: &'a PoolCtx, shared: &'a JobMsg) -> Io<'a> {
        Io {
            ctx,
            shared,
            job: None,
            health: None,
            probe: None,
            calling: Calling::default(),
            policy: None,
            refusal: None,
            completion: None,
            last_error: None,
            claim: None,
            settled: false,
        }
    }

    /// Run the machine from `first` until it asks for nothing more; a job that has not
    /// settled its share of the message then leaves it to be redelivered.
    async fn drive(&mut self, lc: &mut Lifecycle, first: Event) {
        let mut next = self.step(lc, first);
        while let Some(effect) = next {
            let Some(event) = self.carry(lc, effect).await else { break };
            next = self.step(lc, event);
        }
        if !self.settled {
            if let Err(e) = self.shared.finish(Fate::Leave, &self.ctx.budget).await {
                debug!(job = %self.job_id(), error = %e, "job message not settled");
            }
        }
    }

    /// Step the machine, letting go of the probe when it no longer holds it.
    fn step(&mut self, lc: &mut Lifecycle, event: Event) -> Option<Effect> {
        let effect = lc.step(event);
        if !lc.holds_probe() {
            self.probe = None;
        }
        effect
    }

    /// The event of a direct pool's call effect: the call's own when it ended.
    fn call_step(&mut self, lc: &Lifecycle, job: &Job, step: Step) -> Event {
        match step {
            Step::Next(event) => event,
            Step::Ended(outcome) => {
                call_event(self.ctx, job, lc, outcome, &mut self.completion, &mut self.last_error)
            }
        }
    }

    fn job_id(&self) -> String {
        self.job.map(|j| j.id.to_string()).unwrap_or_default()
    }

    /// Carry out `effect`; the event it ends in (`None`: the delivery cannot go on).
    async fn carry(&mut self, lc: &Lifecycle, effect: Effect) -> Option<Event> {
        let (ctx, shared) = (self.ctx, self.shared);
        let delivered = shared.delivered;
        Some(match effect {
            Effect::ReadCheckpoint => {
                let job = self.job?;
                self.completion = match ctx.checkpoint.get(&job.id) {
                    Ok(c) => c,
                    Err(e) => {
                        warn!(job = %job.id, delivery = delivered, error = %e, "unreadable checkpoint record; calling the model again");
                        None
                    }
                };
                Event::CheckpointRead { hit: self.completion.is_some() }
            }
            Effect::AskCache => {
                let (job, policy) = (self.job?, self.policy?);
                match ctx.cache.lookup(&job.key, &job.id, policy).await {
                    halyard_cache::Found::Answer(c, tier) => {
                        self.completion = from_cache(ctx, job, c, tier).await;
                        Event::CacheRead { hit: self.completion.is_some() }
                    }
                    halyard_cache::Found::Call(claim) => {
                        self.claim = claim;
                        Event::CacheRead { hit: false }
                    }
                    halyard_cache::Found::Held { for_s } => {
                        ctx.stats.cache_held.inc();
                        Event::CacheHeld { retry_after: held_retry(for_s) }
                    }
                }
            }
            Effect::AskBatch => {
                let job = self.job?;
                let held = match ctx.batches.pool(&job.pool) {
                    Some(b) => b.holds(&job.id).await,
                    None => false,
                };
                Event::BatchHolds { held }
            }
            Effect::ExcuseDelivery => {
                shared.excuse_delivery(&ctx.budget).await;
                Event::Excused
            }
            Effect::ReadBudget => Event::BudgetRead { excused: shared.excused(&ctx.budget).await },
            Effect::CallBackend => {
                let job = self.job?;
                match ctx.batches.pool(&job.pool) {
                    Some(b) => {
                        let outcome = batch_call(ctx, b, &shared.msg, job).await;
                        self.call_step(lc, job, Step::Ended(outcome))
                    }
                    None => self.calling.read_pool(ctx, self.health?),
                }
            }
            Effect::ClaimProbe => {
                let (job, health) = (self.job?, self.health?);
                let step = self.calling.claim_probe(health, &mut self.probe);
                self.call_step(lc, job, step)
            }
            Effect::AwaitProbeTurn => {
                let (job, health) = (self.job?, self.health?);
                let step = self.calling.await_turn(ctx, health, &shared.msg).await;
                self.call_step(lc, job, step)
            }
            Effect::CallRound { probe } => {
                let (job, health) = (self.job?, self.health?);
                let step = self.calling.round(ctx, health, &shared.msg, job, probe).await;
                self.call_step(lc, job, step)
            }
            Effect::Persist => {
                let (job, c) = (self.job?, self.completion.as_ref()?);
                match ctx.checkpoint.put(job.id, c).await {
                    Ok(()) => {
                        // Paid for by this worker and durable here: shared with the
                        // machine's other runs (off the job's path).
                        ctx.cache.remember(&job.key, &job.id, c, self.policy?);
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
                let (job, c) = (self.job?, self.completion.clone()?);
                let replay = matches!(lc.state(), State::Publishing { replay: true, .. });
                publish(ctx, job, Outcome::Done(c), delivered, replay).await
            }
            Effect::PublishDeadLetter => {
                let job = self.job?;
                let failure = dead_letter(lc, delivered, self.last_error.as_ref());
                publish(ctx, job, Outcome::Failed(failure), delivered, false).await
            }
            Effect::PublishRefusal => {
                let (job, refusal) = (self.job?, self.refusal?);
                let failure = Failure {
                    kind: FailureKind::Refused,
                    error: refusal.to_string(),
                    http_status: None,
                };
                // Best effort: the refusal is logged and counted whatever happens to it.
                publish(ctx, job, Outcome::Failed(failure), delivered, false).await
            }
            // A plain ack, not a double ack: the result is durable in the checkpoint and in the
            // results stream, so a lost ack only means a redelivery that the checkpoint
            // answers without a model call. Acks are not awaited one by one: the client
            // writes all pending acks in one go (batched on the wire).
            Effect::Ack => {
                self.settled = true;
                match shared.finish(Fate::Ack, &ctx.budget).await {
                    Ok(()) => {
                        ctx.failpoints.pass(Point::AckFlush);
                        Event::Acked
                    }
                    Err(e) => {
                        warn!(job = %self.job_id(), delivery = delivered, error = %e, "ack not sent; a redelivery will be answered from the checkpoint");
                        Event::AckFailed
                    }
                }
            }
            Effect::Nak(delay) | Effect::HandBack(delay) => {
                self.settled = true;
                let fate = if matches!(effect, Effect::Nak(_)) {
                    Fate::Nak(delay)
                } else {
                    Fate::HandBack(delay)
                };
                if let Err(e) = shared.finish(fate, &ctx.budget).await {
                    warn!(job = %self.job_id(), delivery = delivered, error = %e, "nak failed; the job will be redelivered after ack_wait");
                }
                Event::Settled
            }
            Effect::Terminate => {
                self.settled = true;
                if let Err(e) = shared.finish(Fate::Term, &ctx.budget).await {
                    warn!(job = %self.job_id(), error = %e, "could not terminate a refused job's message");
                }
                Event::Settled
            }
        })
    }
}

/// How long a job another process of the machine is calling (for `for_s` seconds) waits
/// before it looks again: about half as long as the call has taken so far, between 1 s
/// and 30 s, so that a long call is not asked after every second (each hand-back is a
/// redelivery, excused from the job's budget).
fn held_retry(for_s: u64) -> Duration {
    Duration::from_secs((for_s / 2).clamp(1, 30))
}

/// The result cache's answer `c` to `job` (checkpoint missed), written to the checkpoint
/// first: a run keeps what it read even if the cache is pruned, and it is then a
/// checkpoint hit like any other. A checkpoint that cannot take it: no answer (called).
async fn from_cache(
    ctx: &PoolCtx,
    job: &Job,
    mut c: halyard_proto::Completion,
    tier: halyard_cache::Tier,
) -> Option<halyard_proto::Completion> {
    // Said in the checkpoint too: a redelivery replays it as a cache answer, which the
    // coordinator counts as money saved, never as paid (issue 51).
    c.source = match tier {
        halyard_cache::Tier::Machine => halyard_proto::AnswerSource::MachineCache,
        halyard_cache::Tier::Shared => halyard_proto::AnswerSource::SharedCache,
    };
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

//! The IO of one job's model call inside its delivery: the rounds of the call (each the
//! call with its in-place retries), the in-progress acks that keep the job while it
//! runs, and the probe's wait. What happens next after each is the machine's
//! ([`crate::lifecycle`]: the pool's pause and its probe, see its module docs); this
//! file only carries out its effects and says how they went:
//!
//! - [`Calling::read_pool`] ([`Effect::CallBackend`] of a direct pool): whether the
//!   pool is paused.
//! - [`Calling::claim_probe`] ([`Effect::ClaimProbe`]): the probe, or the pool paused
//!   with the probe held by another job ([`CallOutcome::Paused`], budget kept).
//! - [`Calling::await_turn`] ([`Effect::AwaitProbeTurn`]): the probe's turn, the pool's
//!   resumption, a soft stop (which ends a probe's wait at once) or the hard stop.
//! - [`Calling::round`] ([`Effect::CallRound`]): one call with its retries; an
//!   endpoint-wide failure that begins a pause ends the delivery as a counted failure
//!   ([`CallOutcome::Opened`]); one that found the pool paused, or a pause while the job
//!   waited outside an HTTP request, is [`Event::PausedDuringCall`]; the hard stop
//!   abandons the call.
//!
//! [`Effect::CallBackend`]: crate::lifecycle::Effect::CallBackend
//! [`Effect::ClaimProbe`]: crate::lifecycle::Effect::ClaimProbe
//! [`Effect::AwaitProbeTurn`]: crate::lifecycle::Effect::AwaitProbeTurn
//! [`Effect::CallRound`]: crate::lifecycle::Effect::CallRound

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use halyard_proto::{Completion, Failure, FailureKind, Job};
use tracing::{debug, warn};

use super::ctx::PoolCtx;
use super::retrying::{Attempts, Call};
use crate::backend::{CallError, ErrorClass};
use crate::failpoint::Point;
use crate::health::{PoolHealth, ProbeClaim, ProbeTurn};
use crate::lifecycle::{Event, Lifecycle};

pub(crate) enum CallOutcome {
    Done(Completion),
    /// The job's own failure (counted against its budget), with the attempts made.
    Failed(CallError, u32),
    /// An endpoint-wide failure of this job's call began the pool's pause (counted).
    Opened(CallError, u32),
    /// The pool is paused and the job holds no probe: back to the queue without
    /// spending the budget.
    Paused(u32),
    /// The worker stops while the job waited outside an HTTP request (its quota share,
    /// a backoff, a probe's turn): back to the queue at once, budget kept.
    Stopped(u32),
    /// Not run for the pool's reason (a batch pool's job left out of its batch).
    HandBack(u32),
    /// The worker stops and abandons the call.
    Abandoned,
}

/// How one effect of a direct pool's call went: an event while the call goes on, or
/// the call's outcome (its event is [`call_event`]'s).
pub(crate) enum Step {
    Next(Event),
    Ended(CallOutcome),
}

/// How one round (a call with its retries) ended.
enum Round {
    Done(Result<Completion, CallError>),
    /// The pool paused while this job waited outside an HTTP request.
    Paused,
    /// The worker is stopping while this job waited outside an HTTP request (for its
    /// quota share, a backoff): it goes back to the queue at once (issue 33).
    Stopping,
    Abandoned,
}

/// What a direct pool's call keeps across its effects: the in-progress acks' pace,
/// shared by its rounds and its probe's waits, and the calls of its rounds so far.
#[derive(Default)]
pub(crate) struct Calling {
    progress: Option<tokio::time::Interval>,
    calls: u32,
}

impl Calling {
    /// The in-progress acks' pace: a third of `ack_wait` (at least 200 ms), from the
    /// call's first effect.
    fn progress(&mut self, ctx: &PoolCtx) -> &mut tokio::time::Interval {
        self.progress.get_or_insert_with(|| {
            let period = (ctx.ack_wait() / 3).max(Duration::from_millis(200));
            tokio::time::interval_at(tokio::time::Instant::now() + period, period)
        })
    }

    /// Whether the pool is paused, before a round.
    pub(crate) fn read_pool(&mut self, ctx: &PoolCtx, health: &PoolHealth) -> Event {
        self.progress(ctx);
        Event::PoolRead { paused: health.is_paused() }
    }

    /// Take the paused pool's probe into `probe`.
    pub(crate) fn claim_probe(
        &self,
        health: &Arc<PoolHealth>,
        probe: &mut Option<ProbeClaim>,
    ) -> Step {
        *probe = health.claim_probe();
        match probe {
            Some(_) => Step::Next(Event::ProbeClaimed),
            None => Step::Ended(CallOutcome::Paused(self.calls)),
        }
    }

    /// The probe's wait for its turn, keeping the job with in-progress acks.
    pub(crate) async fn await_turn(
        &mut self,
        ctx: &PoolCtx,
        health: &PoolHealth,
        msg: &jetstream::Message,
    ) -> Step {
        let calls = self.calls;
        let progress = self.progress(ctx);
        let turn = health.probe_turn();
        tokio::pin!(turn);
        let mut hard_stop = ctx.hard_stop.clone();
        let mut stop = ctx.stop.clone();
        loop {
            tokio::select! {
                t = &mut turn => return Step::Next(match t {
                    ProbeTurn::Go => Event::ProbeDue,
                    ProbeTurn::Resumed => Event::PoolResumed,
                }),
                _ = progress.tick() => send_progress(msg).await,
                // A sender gone (false) disables its branch.
                true = async { stop.wait_for(|s| *s).await.is_ok() } => {
                    return Step::Ended(CallOutcome::Stopped(calls));
                }
                true = async { hard_stop.wait_for(|s| *s).await.is_ok() } => {
                    return Step::Ended(CallOutcome::Abandoned);
                }
            }
        }
    }

    /// One round of the call: as the pool's probe, or as an ordinary job.
    pub(crate) async fn round(
        &mut self,
        ctx: &PoolCtx,
        health: &Arc<PoolHealth>,
        msg: &jetstream::Message,
        job: &Job,
        probe: bool,
    ) -> Step {
        let attempts = Attempts::default();
        let call = Call {
            backends: &ctx.backends,
            gate: ctx.quotas.get(&job.pool).map(|g| &**g),
            health: Some(health),
            probe,
            stats: &ctx.stats,
            job,
            policy: ctx.retry,
            attempts: &attempts,
        };
        let round = run_round(ctx, health, msg, &call, self.progress(ctx)).await;
        self.calls += attempts.count();
        let calls = self.calls;
        Step::Ended(match round {
            Round::Done(Ok(mut c)) => {
                c.calls = calls;
                CallOutcome::Done(c)
            }
            Round::Done(Err(e)) if e.outage().is_some() && attempts.opened() => {
                CallOutcome::Opened(e, calls)
            }
            Round::Done(Err(e)) if e.outage().is_some() => {
                debug!(job = %job.id, error = %e.message, "call failed while the pool is paused");
                return Step::Next(Event::PausedDuringCall);
            }
            Round::Done(Err(e)) => CallOutcome::Failed(e, calls),
            Round::Paused => return Step::Next(Event::PausedDuringCall),
            Round::Stopping => CallOutcome::Stopped(calls),
            Round::Abandoned => CallOutcome::Abandoned,
        })
    }
}

/// Run one call with its retries, sending in-progress acks while it lasts longer than
/// a third of `ack_wait`, abandoning it when the hard stop comes, and leaving it when the
/// pool pauses while it waits outside an HTTP request (for its quota share, a backoff).
async fn run_round(
    ctx: &PoolCtx,
    health: &PoolHealth,
    msg: &jetstream::Message,
    call: &Call<'_>,
    progress: &mut tokio::time::Interval,
) -> Round {
    let fut = call.run();
    tokio::pin!(fut);
    let mut hard_stop = ctx.hard_stop.clone();
    let mut stop = ctx.stop.clone();
    let mut changes = health.subscribe();
    // A graceful stop never waits on a quota gate or a backoff: a job not in an HTTP
    // request goes back at once; one in a request finishes it (the call is paid).
    let mut stopping = { *stop.borrow() };
    let mut stop_checks = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            res = &mut fut => return Round::Done(res),
            _ = progress.tick() => send_progress(msg).await,
            Ok(()) = async { stop.wait_for(|s| *s).await.map(|_| ()) }, if !stopping => {
                stopping = true;
                if !call.attempts.in_http() {
                    return Round::Stopping;
                }
            }
            _ = stop_checks.tick(), if stopping => {
                if !call.attempts.in_http() {
                    return Round::Stopping;
                }
            }
            Ok(()) = changes.changed() => {
                if !call.probe && health.is_paused() && !call.attempts.in_http() {
                    return Round::Paused;
                }
            }
            stopped = async { hard_stop.wait_for(|s| *s).await.is_ok() } => {
                if stopped { return Round::Abandoned; }
                // The sender is gone: no hard stop can come any more; keep calling.
                return Round::Done((&mut fut).await);
            }
        }
    }
}

async fn send_progress(msg: &jetstream::Message) {
    if let Err(e) = msg.ack_with(AckKind::Progress).await {
        debug!(error = %e, "progress ack failed");
    }
}

/// The life-cycle event of a call's outcome (counting its calls, keeping its result);
/// what the delivery does next is the machine's ([`Lifecycle::step`]).
pub(crate) fn call_event(
    ctx: &PoolCtx,
    job: &Job,
    lc: &Lifecycle,
    outcome: CallOutcome,
    completion: &mut Option<Completion>,
    last_error: &mut Option<CallError>,
) -> Event {
    let delivery = lc.delivery();
    match outcome {
        CallOutcome::Done(c) => {
            ctx.stats.add_calls(c.calls as u64);
            *completion = Some(c);
            ctx.failpoints.pass(Point::CallPersist);
            Event::CallSucceeded
        }
        CallOutcome::Failed(e, calls) => failed(ctx, job, delivery, e, calls, false, last_error),
        CallOutcome::Opened(e, calls) => failed(ctx, job, delivery, e, calls, true, last_error),
        CallOutcome::Paused(calls) => {
            ctx.stats.add_calls(calls as u64);
            Event::PoolPaused
        }
        CallOutcome::Stopped(calls) => {
            ctx.stats.add_calls(calls as u64);
            Event::StoppedWaiting
        }
        CallOutcome::HandBack(calls) => {
            ctx.stats.add_calls(calls as u64);
            Event::HandBack { retry_after: None }
        }
        CallOutcome::Abandoned => Event::Shutdown,
    }
}

/// The event of a failed call: `opened`, its failure began the pool's pause.
fn failed(
    ctx: &PoolCtx,
    job: &Job,
    delivery: u64,
    e: CallError,
    calls: u32,
    opened: bool,
    last_error: &mut Option<CallError>,
) -> Event {
    ctx.stats.add_calls(calls as u64);
    let ev = Event::CallError { class: e.class, retry_after: e.retry_after, opened };
    if e.class == ErrorClass::RateLimited && !opened {
        warn!(job = %job.id, delivery, error = %e.message, "still rate limited after the in-place retries; handing the job back");
    } else {
        warn!(job = %job.id, delivery, error = %e.message, status = ?e.status, permanent = e.is_permanent(), "model call failed");
        *last_error = Some(e);
    }
    ev
}

/// The dead letter of a job: its last error, or (arriving past its budget) the
/// deliveries that ended without a result.
pub(crate) fn dead_letter(lc: &Lifecycle, delivered: u64, last: Option<&CallError>) -> Failure {
    let Some(e) = last else {
        let error = format!(
            "delivered {delivered} times without a result (max_deliver reached: {} deliveries counted \
             against the job's budget; did a worker crash on it?)",
            lc.delivery().saturating_sub(1)
        );
        return Failure { kind: FailureKind::Exhausted, error, http_status: None };
    };
    if e.is_permanent() {
        return Failure {
            kind: FailureKind::Permanent,
            error: e.message.clone(),
            http_status: e.status,
        };
    }
    Failure {
        kind: FailureKind::Exhausted,
        error: format!("gave up after {} deliveries: {}", lc.delivery(), e.message),
        http_status: e.status,
    }
}

//! One job's model call inside its delivery: the call with its in-place retries, the
//! in-progress acks that keep the job while it runs, and what a pool pause does to it.
//!
//! - Pool up: call (with retries, see [`crate::retry`]); an endpoint-wide failure that
//!   begins a pause ends the delivery as a counted failure ([`CallOutcome::Opened`]):
//!   a job that brings the endpoint down each time it is sent spends its budget.
//! - Pool paused: a job that is not inside an HTTP request is handed back
//!   ([`CallOutcome::Paused`], budget kept), unless it takes the probe: then it stays
//!   in hand, sending in-progress acks, and calls when its turn comes; a failed probe
//!   waits for the next turn, an answer resumes the pool and finishes the job.
//! - Hard stop (shutdown grace over): the call is abandoned; soft stop ends a probe's
//!   wait at once.

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

/// How a probe's wait ended.
enum Turn {
    Go,
    Resumed,
    Stop,
    Abandoned,
}

/// The job's call; see the module docs. `probe` is the probe the pool loop fetched
/// this job to hold.
pub(crate) async fn call(
    ctx: &PoolCtx,
    health: &Arc<PoolHealth>,
    msg: &jetstream::Message,
    job: &Job,
    mut probe: Option<ProbeClaim>,
) -> CallOutcome {
    let period = (ctx.ack_wait() / 3).max(Duration::from_millis(200));
    let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    let mut calls = 0u32;
    loop {
        if health.is_paused() {
            if probe.is_none() {
                probe = health.claim_probe();
            }
            if probe.is_none() {
                return CallOutcome::Paused(calls);
            }
            match wait_turn(ctx, health, msg, &mut progress).await {
                Turn::Go => {}
                Turn::Resumed => probe = None,
                Turn::Stop => return CallOutcome::Stopped(calls),
                Turn::Abandoned => return CallOutcome::Abandoned,
            }
        } else {
            probe = None;
        }
        let attempts = Attempts::default();
        let call = Call {
            backends: &ctx.backends,
            gate: ctx.quotas.get(&job.pool).map(|g| &**g),
            health: Some(health),
            probe: probe.is_some(),
            stats: &ctx.stats,
            job,
            policy: ctx.retry,
            attempts: &attempts,
        };
        let round = run_round(ctx, health, msg, &call, &mut progress).await;
        calls += attempts.count();
        match round {
            Round::Done(Ok(mut c)) => {
                c.calls = calls;
                return CallOutcome::Done(c);
            }
            Round::Done(Err(e)) if e.outage().is_some() && attempts.opened() => {
                return CallOutcome::Opened(e, calls)
            }
            // Paused meanwhile: take the probe and wait, or go back to the queue.
            Round::Done(Err(e)) if e.outage().is_some() => {
                debug!(job = %job.id, error = %e.message, "call failed while the pool is paused");
            }
            Round::Done(Err(e)) => return CallOutcome::Failed(e, calls),
            Round::Paused => {}
            Round::Stopping => return CallOutcome::Stopped(calls),
            Round::Abandoned => return CallOutcome::Abandoned,
        }
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

/// The probe's wait for its turn, keeping the job with in-progress acks.
async fn wait_turn(
    ctx: &PoolCtx,
    health: &PoolHealth,
    msg: &jetstream::Message,
    progress: &mut tokio::time::Interval,
) -> Turn {
    let turn = health.probe_turn();
    tokio::pin!(turn);
    let mut hard_stop = ctx.hard_stop.clone();
    let mut stop = ctx.stop.clone();
    loop {
        tokio::select! {
            t = &mut turn => return match t { ProbeTurn::Go => Turn::Go, ProbeTurn::Resumed => Turn::Resumed },
            _ = progress.tick() => send_progress(msg).await,
            // A sender gone (false) disables its branch.
            true = async { stop.wait_for(|s| *s).await.is_ok() } => return Turn::Stop,
            true = async { hard_stop.wait_for(|s| *s).await.is_ok() } => return Turn::Abandoned,
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

//! The life of one job delivery inside a worker, as a pure state machine.
//!
//! No IO, no tokio: [`Lifecycle::step`] takes an [`Event`] and returns the [`Effect`] the
//! caller must carry out (at most one); the caller reports the effect's outcome back as
//! the next event. One executor carries the effects out (`delivery::run_job` and its
//! loop); every decision about a delivery is a transition here. The order it enforces
//! is the durability order of DESIGN.md:
//!
//! 0. a job message is admitted or refused before anything else: a job the worker's plan
//!    refuses is reported to its run (when it could be decoded) and terminated; a message
//!    of another wire version, or whose object the broker cannot give now, is handed back;
//!    one whose object is unusable, or that holds no job, is terminated;
//! 1. where the answer may already be: the checkpoint, then the result cache, then (a
//!    batch pool) the provider batch that holds the job; a hit → publish the stored
//!    result → ack (no model call);
//! 2. otherwise call → **persist (flushed)** → **publish** (broker-acknowledged) → **ack**;
//! 3. permanent failure, or transient failure on the last allowed delivery → publish a
//!    dead letter → ack (the job is terminal, the run does not wait for it);
//! 4. transient failure with deliveries left → nak with a backoff delay;
//! 5. the pool's fault, not the job's (an endpoint outage, 429s past the in-place
//!    retries, the pool paused before the call, a stop while the job waited for its
//!    quota share) → hand back: a nak that does not spend the job's delivery budget
//!    (see [`crate::budget`]);
//! 6. shutdown while calling → hand back at once with a short delay, so another worker
//!    takes it;
//! 7. a failed persist or publish → nak (nothing is acked that is not durable); a failed
//!    ack → the redelivery is answered from the checkpoint;
//! 8. a job that arrives past its budget (its earlier deliveries ended without a result:
//!    crashed workers) → dead letter without a call, unless its result is checkpointed,
//!    or a provider batch holds it (then the crashed delivery is excused: not the job's).
//!
//! The delivery number the machine compares with `max_deliver` is the *effective* one:
//! JetStream's count less the deliveries handed back (see [`crate::budget`]), read by
//! [`Effect::ReadBudget`] on a redelivery only.
//!
//! The call of a direct pool's job (a batch pool's is its turn in a provider batch, one
//! [`Effect::CallBackend`] that ends in the call's event) is a loop of decisions, each a
//! transition here, around the pool's pause and its probe (see [`crate::health`]):
//!
//! - [`Effect::CallBackend`] reads the pool's health ([`Event::PoolRead`]). Up: one
//!   round ([`Effect::CallRound`], the call with its in-place retries) as an ordinary
//!   job, letting go of a probe the delivery held.
//! - Paused: a delivery that holds the probe (the pool loop fetched it to probe with, or
//!   it claimed it) waits for the probe's turn ([`Effect::AwaitProbeTurn`]); one that
//!   does not tries to claim it ([`Effect::ClaimProbe`]: [`Event::ProbeClaimed`], or
//!   [`Event::PoolPaused`] when another job holds it: handed back, budget kept).
//! - The turn: due ([`Event::ProbeDue`]) → a round as the probe; the pool resumed
//!   meanwhile ([`Event::PoolResumed`]) → a round as an ordinary job, the probe let go;
//!   a stop while waiting ([`Event::StoppedWaiting`]) → handed back at once; the hard
//!   stop ([`Event::Shutdown`]) → abandoned.
//! - A round that found the pool paused without its own failure beginning the pause
//!   (a failed probe, an outage another call began, a pause while the job waited
//!   outside an HTTP request: [`Event::PausedDuringCall`]) decides again: another
//!   [`Effect::CallBackend`]. A round whose failure began the pause counts
//!   ([`Event::CallError`] with `opened`), so a job that brings the endpoint down each
//!   time it is sent spends its budget.
//!
//! The probe is held, in the executor, exactly while [`Lifecycle::holds_probe`] says so:
//! from the start when the pool loop fetched the job to probe with, from
//! [`Event::ProbeClaimed`] otherwise, until a round as an ordinary job or the end of the
//! call (a delivery answered without a call holds it to its end). The calls of every round of one delivery are counted together, and its
//! in-progress acks keep one pace across its rounds and waits (the executor's).
//!
//! Inside a round, the in-place retries (`delivery/retrying.rs`) ask
//! [`retries_in_place`] and [`in_place_delay`] whether and when to try again.
//!
//! An ack is only ever emitted after the result is durable in the checkpoint *and* in the results
//! stream; a crash at any point loses at most the call in flight.

use std::time::Duration;

use crate::call_error::ErrorClass;
use crate::retry::RetryPolicy;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Received,
    /// Looking for the job's answer where it may already be (see [`Lookup`]).
    Looking(Lookup),
    /// The call: reading the pool's health, claiming the probe, or a round.
    Calling,
    /// Holding the probe of a paused pool, waiting for its turn.
    AwaitingProbe,
    Persisting,
    Publishing {
        dead_letter: bool,
        replay: bool,
    },
    /// Publishing the refusal of a job the worker's plan refused.
    Refusing,
    Acking(Disposition),
    Finished(Disposition),
}

/// Where a delivery looks before it calls, in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    Checkpoint,
    Cache,
    /// A batch pool: does a live provider batch hold the job?
    Batch,
    /// Excusing the crashed delivery of a job a provider batch holds.
    Excusing,
    /// Reading the deliveries excused from the job's budget (a redelivery).
    Budget,
}

/// How a delivery ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Model called, result durable and published, job acked.
    Completed,
    /// Result came from the checkpoint; no model call.
    Replayed,
    /// Job terminal without a completion.
    DeadLetter,
    /// Handed back to the queue (nak) for a later delivery, the budget spent.
    Retried,
    /// Handed back for the pool's reason (outage, cool-down, shutdown): budget kept.
    HandedBack,
    /// Refused before anything ran (the worker's plan, the message unusable): terminated.
    Refused,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The job arrived; `checkpoint_hit` says whether the checkpoint already holds its result.
    /// (The lookup in one step: [`Event::Arrived`] makes it one place at a time.)
    Start {
        checkpoint_hit: bool,
    },
    /// The job arrived: look for its answer ([`Effect::ReadCheckpoint`] first).
    Arrived,
    /// The checkpoint was read (an unreadable record is a miss).
    CheckpointRead {
        hit: bool,
    },
    /// The result cache answered, or not (an answer is written to the checkpoint first).
    CacheRead {
        hit: bool,
    },
    /// The result cache has no answer, and another process of the machine is calling
    /// the job now (its claim): hand it back after `retry_after`, when the answer is
    /// likely in the cache, instead of paying for it a second time.
    CacheHeld {
        retry_after: Duration,
    },
    /// Whether a live provider batch holds the job (false outside batch pools).
    BatchHolds {
        held: bool,
    },
    /// The delivery was excused from the budget (or could not be; it is logged).
    Excused,
    /// The deliveries of the message excused so far.
    BudgetRead {
        excused: u64,
    },
    CallSucceeded,
    CallFailed {
        permanent: bool,
        retry_after: Option<Duration>,
    },
    /// The call failed with `class` after its in-place retries; `opened`: this call's
    /// failure began the pool's pause (the delivery then counts, whatever the class).
    CallError {
        class: ErrorClass,
        retry_after: Option<Duration>,
        opened: bool,
    },
    /// The pool is paused and this job holds no probe and could not claim it (another
    /// job holds it): it does not call (again).
    PoolPaused,
    /// The worker stops while the job waited outside an HTTP request (its quota share,
    /// a backoff, a probe's turn).
    StoppedWaiting,
    /// The pool's health, read before a round of the call: `paused` or up.
    PoolRead {
        paused: bool,
    },
    /// This delivery took the paused pool's probe.
    ProbeClaimed,
    /// The probe's turn came: call as the probe.
    ProbeDue,
    /// The pool resumed while the probe waited: call as an ordinary job.
    PoolResumed,
    /// A round of the call found the pool paused, its own failure not having begun the
    /// pause (an outage another call began, a failed probe, a pause while the job waited
    /// outside an HTTP request): decide again.
    PausedDuringCall,
    Persisted,
    PersistFailed,
    Published,
    PublishFailed,
    Acked,
    /// The ack could not be sent: the job is redelivered after `ack_wait` and answered
    /// from the checkpoint.
    AckFailed,
    /// The nak, hand-back or termination went out (or failed: logged, nothing to do).
    Settled,
    /// The call did not happen or failed for the pool's reason (endpoint outage, 429s,
    /// a pause); hand the job back after `retry_after` (at least [`HANDBACK_NAK`]).
    HandBack {
        retry_after: Option<Duration>,
    },
    /// The worker is shutting down and the call was abandoned.
    Shutdown,
    /// The worker's plan refused this job; `reportable`: it could be decoded, so its
    /// run is told.
    Refused {
        reportable: bool,
    },
    /// The message names an object the broker cannot give: now (`transient`), or ever.
    Unreadable {
        transient: bool,
    },
    /// The message holds a job of another wire version.
    OtherVersion,
    /// The message holds no job.
    Empty,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Read the job's checkpoint record.
    ReadCheckpoint,
    /// Ask the result cache (its model's policy), writing an answer to the checkpoint.
    AskCache,
    /// Ask the pool's provider batches whether one holds the job.
    AskBatch,
    /// Record this delivery as excused from the budget.
    ExcuseDelivery,
    /// Read the message's excused deliveries.
    ReadBudget,
    /// The job's call: a batch pool's job takes its turn in a provider batch (its
    /// outcome is the call's event); a direct pool's job reads its pool's health
    /// ([`Event::PoolRead`]) before each round.
    CallBackend,
    /// Take the paused pool's probe, if no other job holds it.
    ClaimProbe,
    /// Wait for the probe's turn (or the pool's resumption), keeping the job with
    /// in-progress acks.
    AwaitProbeTurn,
    /// One round of the call: the call with its in-place retries, as the pool's probe
    /// or (`probe` false, letting go of a probe held) as an ordinary job.
    CallRound {
        probe: bool,
    },
    /// Write the completion to the checkpoint and flush it.
    Persist,
    /// Publish the completion (from the call or the checkpoint) and await the broker's ack.
    PublishResult,
    /// Publish a dead-letter result carrying the last error.
    PublishDeadLetter,
    /// Publish the job's refusal to its run (best effort).
    PublishRefusal,
    Ack,
    Nak(Duration),
    /// Nak without spending the delivery budget: record the excused delivery, then nak.
    HandBack(Duration),
    /// Terminate: the job is never to be delivered again.
    Terminate,
}

#[derive(Clone, Debug)]
pub struct Lifecycle {
    state: State,
    /// This delivery's number, 1-based: JetStream's `delivered`, then the effective one.
    delivery: u64,
    max_deliver: u64,
    /// This delivery holds its pool's probe (see the module docs).
    probe: bool,
}

/// Delay before a nak'd job is redelivered: exponential in the delivery count, capped,
/// and never shorter than the server's `Retry-After`.
pub fn nak_delay(delivery: u64, retry_after: Option<Duration>) -> Duration {
    let exp = Duration::from_secs(1u64 << delivery.min(6).saturating_sub(1)); // 1, 2, 4 … 32 s
    let base = exp.min(Duration::from_secs(30));
    retry_after.map_or(base, |r| r.max(base))
}

/// Redelivery delay for a job abandoned at shutdown: soon, but not in a hot loop.
pub const SHUTDOWN_NAK: Duration = Duration::from_secs(1);

/// Redelivery delay for a job handed back while its pool is paused. Short: nobody
/// fetches a paused pool's jobs but its probe, and when it resumes they should be there.
pub const HANDBACK_NAK: Duration = Duration::from_secs(1);

/// How long a message of another wire version waits before it is offered again.
pub const OTHER_VERSION_DELAY: Duration = Duration::from_secs(30);

/// How long a job message whose object the broker could not give waits before it is
/// offered again.
pub const OBJECT_RETRY: Duration = Duration::from_secs(5);

/// Whether a call's failure of `class` is retried in place (within the delivery): the
/// job's transient failures and rate limits only.
pub fn retries_in_place(class: ErrorClass) -> bool {
    matches!(class, ErrorClass::Transient | ErrorClass::RateLimited)
}

/// The wait before the next in-place attempt, the backoff having `planned` one (`None`:
/// the retries are spent): at least the server's `Retry-After`; `None` (the in-place
/// retries end, the delivery decides) when that is longer than the policy's
/// `max_in_place_wait`, so a job does not hold a concurrency slot while it waits.
pub fn in_place_delay(
    policy: &RetryPolicy,
    retry_after: Option<Duration>,
    planned: Option<Duration>,
) -> Option<Duration> {
    let planned = planned?;
    match retry_after {
        Some(ra) if ra > policy.max_in_place_wait => None,
        Some(ra) => Some(ra.max(planned)),
        None => Some(planned),
    }
}

impl Lifecycle {
    pub fn new(delivery: u64, max_deliver: u64) -> Self {
        Lifecycle {
            state: State::Received,
            delivery: delivery.max(1),
            max_deliver: max_deliver.max(1),
            probe: false,
        }
    }

    /// The delivery of a job the pool loop fetched to hold its paused pool's probe
    /// (`held`): it keeps the probe until its call decides otherwise.
    pub fn holding_probe(mut self, held: bool) -> Self {
        self.probe = held;
        self
    }

    /// Whether this delivery holds its pool's probe (the executor keeps the claim
    /// exactly while this says so).
    pub fn holds_probe(&self) -> bool {
        self.probe
    }

    pub fn state(&self) -> State {
        self.state
    }

    pub fn is_last_delivery(&self) -> bool {
        self.delivery >= self.max_deliver
    }

    /// The job arrived past its budget: its earlier deliveries all ended without a
    /// result or a hand-back (their workers crashed).
    pub fn over_budget(&self) -> bool {
        self.delivery > self.max_deliver
    }

    /// The effective delivery number (see the module docs).
    pub fn delivery(&self) -> u64 {
        self.delivery
    }

    /// Apply one event. An event that makes no sense in the current state is ignored and
    /// yields no effect (it cannot lead to an ack of something not durable).
    pub fn step(&mut self, event: Event) -> Option<Effect> {
        use Effect as F;
        use Event as E;
        use Lookup as L;
        use State as S;
        let dead_letter = S::Publishing { dead_letter: true, replay: false };
        let (next, effect) = match (self.state, event) {
            // Admission: refused jobs and unusable messages never reach a lookup.
            (S::Received, E::Refused { reportable: true }) => (S::Refusing, F::PublishRefusal),
            (S::Received, E::Refused { reportable: false } | E::Empty)
            | (S::Received, E::Unreadable { transient: false }) => {
                (S::Finished(Disposition::Refused), F::Terminate)
            }
            (S::Received, E::Unreadable { transient: true }) => {
                (S::Finished(Disposition::HandedBack), F::HandBack(OBJECT_RETRY))
            }
            (S::Received, E::OtherVersion) => {
                (S::Finished(Disposition::HandedBack), F::HandBack(OTHER_VERSION_DELAY))
            }
            (S::Refusing, E::Published | E::PublishFailed) => {
                (S::Finished(Disposition::Refused), F::Terminate)
            }
            // Where the answer may already be.
            (S::Received, E::Arrived) => (S::Looking(L::Checkpoint), F::ReadCheckpoint),
            (S::Looking(L::Checkpoint), E::CheckpointRead { hit: false }) => {
                (S::Looking(L::Cache), F::AskCache)
            }
            (S::Looking(L::Cache), E::CacheRead { hit: false }) => {
                (S::Looking(L::Batch), F::AskBatch)
            }
            (S::Looking(L::Cache), E::CacheHeld { retry_after }) => {
                self.hand_back(Some(retry_after))
            }
            (S::Looking(L::Checkpoint), E::CheckpointRead { hit: true })
            | (S::Looking(L::Cache), E::CacheRead { hit: true }) => {
                // Answered: no budget read, nothing counts.
                self.delivery = 1;
                (S::Publishing { dead_letter: false, replay: true }, F::PublishResult)
            }
            // Its earlier delivery ended in a crash while the batch went on: not the
            // job's; the answer is paid for and on its way (see `batch`).
            (S::Looking(L::Batch), E::BatchHolds { held: true }) => {
                (S::Looking(L::Excusing), F::ExcuseDelivery)
            }
            (S::Looking(L::Excusing), E::Excused) => {
                self.delivery = 1;
                self.start()
            }
            // A first delivery cannot have a budget record: nothing to read.
            (S::Looking(L::Batch), E::BatchHolds { held: false }) if self.delivery > 1 => {
                (S::Looking(L::Budget), F::ReadBudget)
            }
            (S::Looking(L::Batch), E::BatchHolds { held: false }) => self.start(),
            (S::Looking(L::Budget), E::BudgetRead { excused }) => {
                self.delivery = crate::budget::effective(self.delivery, excused);
                self.start()
            }
            (S::Received, E::Start { checkpoint_hit: true }) => {
                (S::Publishing { dead_letter: false, replay: true }, F::PublishResult)
            }
            (S::Received, E::Start { checkpoint_hit: false }) => self.start(),
            // The call.
            (S::Calling, E::CallSucceeded) => (S::Persisting, F::Persist),
            // 429s past the in-place retries: the pool's quota, not the job, is at fault.
            (
                S::Calling,
                E::CallError { class: ErrorClass::RateLimited, retry_after, opened: false },
            ) => self.hand_back(retry_after),
            (S::Calling, E::CallError { class, retry_after, .. }) => {
                self.call_failed(class == ErrorClass::Permanent, retry_after, dead_letter)
            }
            (S::Calling, E::CallFailed { permanent, retry_after }) => {
                self.call_failed(permanent, retry_after, dead_letter)
            }
            (S::Calling, E::HandBack { retry_after }) => self.hand_back(retry_after),
            (S::Calling, E::PoolPaused) | (S::Calling | S::AwaitingProbe, E::StoppedWaiting) => {
                self.hand_back(None)
            }
            (S::Calling | S::AwaitingProbe, E::Shutdown) => {
                (S::Finished(Disposition::HandedBack), F::HandBack(SHUTDOWN_NAK))
            }
            // A direct pool's call: the pool's pause and its probe.
            (S::Calling, E::PoolRead { paused: false }) => {
                self.probe = false;
                (S::Calling, F::CallRound { probe: false })
            }
            (S::Calling, E::PoolRead { paused: true }) if self.probe => {
                (S::AwaitingProbe, F::AwaitProbeTurn)
            }
            (S::Calling, E::PoolRead { paused: true }) => (S::Calling, F::ClaimProbe),
            (S::Calling, E::ProbeClaimed) => {
                self.probe = true;
                (S::AwaitingProbe, F::AwaitProbeTurn)
            }
            (S::AwaitingProbe, E::ProbeDue) => (S::Calling, F::CallRound { probe: true }),
            (S::AwaitingProbe, E::PoolResumed) => {
                self.probe = false;
                (S::Calling, F::CallRound { probe: false })
            }
            // Not this round's failure, nor the job's: look at the pool again.
            (S::Calling, E::PausedDuringCall) => (S::Calling, F::CallBackend),
            // Durability.
            (S::Persisting, E::Persisted) => {
                (S::Publishing { dead_letter: false, replay: false }, F::PublishResult)
            }
            (S::Persisting, E::PersistFailed) => {
                (S::Finished(Disposition::Retried), F::Nak(nak_delay(self.delivery, None)))
            }
            (S::Publishing { dead_letter, replay }, E::Published) => {
                let d = if dead_letter {
                    Disposition::DeadLetter
                } else if replay {
                    Disposition::Replayed
                } else {
                    Disposition::Completed
                };
                (S::Acking(d), F::Ack)
            }
            // The completion (if any) is in the checkpoint: the redelivery replays it.
            (S::Publishing { .. }, E::PublishFailed) => {
                (S::Finished(Disposition::Retried), F::Nak(nak_delay(self.delivery, None)))
            }
            (S::Acking(d), E::Acked) => {
                self.state = S::Finished(d);
                return None;
            }
            // Not acked: redelivered after ack_wait, answered from the checkpoint.
            (S::Acking(_), E::AckFailed) => {
                self.state = S::Finished(Disposition::Retried);
                return None;
            }
            _ => return None,
        };
        // The end of the call lets go of the probe.
        let calling = |s: State| matches!(s, S::Calling | S::AwaitingProbe);
        if calling(self.state) && !calling(next) {
            self.probe = false;
        }
        self.state = next;
        Some(effect)
    }

    /// No answer found: a job past its budget is a dead letter without a call.
    fn start(&self) -> (State, Effect) {
        if self.over_budget() {
            (State::Publishing { dead_letter: true, replay: false }, Effect::PublishDeadLetter)
        } else {
            (State::Calling, Effect::CallBackend)
        }
    }

    fn call_failed(
        &self,
        permanent: bool,
        retry_after: Option<Duration>,
        dead_letter: State,
    ) -> (State, Effect) {
        if permanent || self.is_last_delivery() {
            (dead_letter, Effect::PublishDeadLetter)
        } else {
            (
                State::Finished(Disposition::Retried),
                Effect::Nak(nak_delay(self.delivery, retry_after)),
            )
        }
    }

    fn hand_back(&self, retry_after: Option<Duration>) -> (State, Effect) {
        let delay = retry_after.map_or(HANDBACK_NAK, |r| r.max(HANDBACK_NAK));
        (State::Finished(Disposition::HandedBack), Effect::HandBack(delay))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Effect as F;
    use Event as E;

    fn drive(lc: &mut Lifecycle, events: &[Event]) -> Vec<Effect> {
        events.iter().flat_map(|e| lc.step(e.clone())).collect()
    }

    /// A job another process of the machine is calling is handed back (its delivery
    /// excused) after the delay the cache asks, at least the hand-back's own; no call.
    #[test]
    fn a_job_another_process_calls_is_handed_back_without_a_call() {
        for (asked, nak) in
            [(Duration::from_secs(7), Duration::from_secs(7)), (Duration::ZERO, HANDBACK_NAK)]
        {
            let mut lc = Lifecycle::new(3, 5);
            let fx = drive(
                &mut lc,
                &[
                    E::Arrived,
                    E::CheckpointRead { hit: false },
                    E::CacheHeld { retry_after: asked },
                ],
            );
            assert_eq!(fx, vec![F::ReadCheckpoint, F::AskCache, F::HandBack(nak)]);
            assert_eq!(lc.state(), State::Finished(Disposition::HandedBack));
        }
    }

    /// The normal path persists, then publishes, then acks — in that order only.
    #[test]
    fn call_persist_publish_ack() {
        let mut lc = Lifecycle::new(1, 5);
        let fx = drive(
            &mut lc,
            &[
                E::Start { checkpoint_hit: false },
                E::CallSucceeded,
                E::Persisted,
                E::Published,
                E::Acked,
            ],
        );
        assert_eq!(fx, vec![F::CallBackend, F::Persist, F::PublishResult, F::Ack]);
        assert_eq!(lc.state(), State::Finished(Disposition::Completed));
    }

    /// A checkpoint hit republishes and acks without calling the model.
    #[test]
    fn checkpoint_hit_replays_without_call() {
        let mut lc = Lifecycle::new(2, 5);
        let fx = drive(&mut lc, &[E::Start { checkpoint_hit: true }, E::Published, E::Acked]);
        assert_eq!(fx, vec![F::PublishResult, F::Ack]);
        assert!(!fx.contains(&F::CallBackend));
        assert_eq!(lc.state(), State::Finished(Disposition::Replayed));
    }

    /// A permanent error becomes a dead letter at once, even on the first delivery.
    #[test]
    fn permanent_error_is_dead_letter() {
        let mut lc = Lifecycle::new(1, 5);
        let fx = drive(
            &mut lc,
            &[
                E::Start { checkpoint_hit: false },
                E::CallFailed { permanent: true, retry_after: None },
                E::Published,
                E::Acked,
            ],
        );
        assert_eq!(fx, vec![F::CallBackend, F::PublishDeadLetter, F::Ack]);
        assert_eq!(lc.state(), State::Finished(Disposition::DeadLetter));
    }

    /// Transient errors nak with growing delays until the last delivery, which dead-letters.
    #[test]
    fn transient_errors_retry_then_dead_letter() {
        let mut delays = vec![];
        for d in 1..5 {
            let mut lc = Lifecycle::new(d, 5);
            let fx = drive(
                &mut lc,
                &[
                    E::Start { checkpoint_hit: false },
                    E::CallFailed { permanent: false, retry_after: None },
                ],
            );
            match fx.as_slice() {
                [F::CallBackend, F::Nak(delay)] => delays.push(*delay),
                other => panic!("delivery {d}: {other:?}"),
            }
        }
        assert!(delays.windows(2).all(|w| w[0] < w[1]), "{delays:?}");
        let mut lc = Lifecycle::new(5, 5);
        let fx = drive(
            &mut lc,
            &[
                E::Start { checkpoint_hit: false },
                E::CallFailed { permanent: false, retry_after: None },
            ],
        );
        assert_eq!(fx, vec![F::CallBackend, F::PublishDeadLetter]);
    }

    /// Retry-After from the server lengthens the nak delay.
    #[test]
    fn retry_after_is_honoured() {
        let mut lc = Lifecycle::new(1, 5);
        let fx = drive(
            &mut lc,
            &[
                E::Start { checkpoint_hit: false },
                E::CallFailed { permanent: false, retry_after: Some(Duration::from_secs(17)) },
            ],
        );
        assert_eq!(fx.last(), Some(&F::Nak(Duration::from_secs(17))));
    }

    /// Nothing is acked unless persisted and published: failures at either step nak.
    #[test]
    fn no_ack_without_durability() {
        let mut lc = Lifecycle::new(1, 5);
        let fx = drive(
            &mut lc,
            &[E::Start { checkpoint_hit: false }, E::CallSucceeded, E::PersistFailed],
        );
        assert!(matches!(fx.last(), Some(F::Nak(_))));
        assert!(!fx.contains(&F::Ack));
        let mut lc = Lifecycle::new(1, 5);
        let fx = drive(
            &mut lc,
            &[E::Start { checkpoint_hit: false }, E::CallSucceeded, E::Persisted, E::PublishFailed],
        );
        assert!(!fx.contains(&F::Ack));
        // Out-of-order events are ignored rather than producing an ack.
        let mut lc = Lifecycle::new(1, 5);
        let fx = drive(
            &mut lc,
            &[E::Start { checkpoint_hit: false }, E::Published, E::Acked, E::Persisted],
        );
        assert_eq!(fx, vec![F::CallBackend]);
        assert_eq!(lc.state(), State::Calling);
    }

    /// Shutdown during a call hands the job back quickly, keeping its budget.
    #[test]
    fn shutdown_hands_back_in_flight_call() {
        let mut lc = Lifecycle::new(1, 5);
        let fx = drive(&mut lc, &[E::Start { checkpoint_hit: false }, E::Shutdown]);
        assert_eq!(fx, vec![F::CallBackend, F::HandBack(SHUTDOWN_NAK)]);
        assert_eq!(lc.state(), State::Finished(Disposition::HandedBack));
    }

    /// The pool's faults hand the job back even on its last delivery (no dead letter),
    /// honouring a Retry-After (issue 18).
    #[test]
    fn pool_faults_hand_back_on_any_delivery() {
        for d in [1, 5] {
            let mut lc = Lifecycle::new(d, 5);
            let fx = drive(
                &mut lc,
                &[E::Start { checkpoint_hit: false }, E::HandBack { retry_after: None }],
            );
            assert_eq!(fx, vec![F::CallBackend, F::HandBack(HANDBACK_NAK)]);
            assert_eq!(lc.state(), State::Finished(Disposition::HandedBack));
        }
        let mut lc = Lifecycle::new(5, 5);
        let ra = Some(Duration::from_secs(9));
        let fx =
            drive(&mut lc, &[E::Start { checkpoint_hit: false }, E::HandBack { retry_after: ra }]);
        assert_eq!(fx.last(), Some(&F::HandBack(Duration::from_secs(9))));
    }

    /// A job arriving past its budget (effective delivery > max_deliver: crashed workers
    /// before) is dead-lettered without a call, unless the checkpoint answers it
    /// (issue 18).
    #[test]
    fn past_the_budget_dead_letters_without_a_call() {
        let mut lc = Lifecycle::new(6, 5);
        assert!(lc.over_budget());
        let fx = drive(&mut lc, &[E::Start { checkpoint_hit: false }, E::Published, E::Acked]);
        assert_eq!(fx, vec![F::PublishDeadLetter, F::Ack]);
        assert_eq!(lc.state(), State::Finished(Disposition::DeadLetter));
        let mut lc = Lifecycle::new(6, 5);
        let fx = drive(&mut lc, &[E::Start { checkpoint_hit: true }, E::Published, E::Acked]);
        assert_eq!(fx, vec![F::PublishResult, F::Ack]);
        assert!(!Lifecycle::new(5, 5).over_budget());
    }

    /// The lookup of a first delivery: checkpoint, cache, batch; no budget read (a first
    /// delivery has no record), then the call.
    fn arrived(delivered: u64, max: u64, events: &[Event]) -> (Lifecycle, Vec<Effect>) {
        let mut lc = Lifecycle::new(delivered, max);
        let mut fx: Vec<Effect> = lc.step(E::Arrived).into_iter().collect();
        fx.extend(drive(&mut lc, events));
        (lc, fx)
    }

    const MISSES: [Event; 3] = [
        E::CheckpointRead { hit: false },
        E::CacheRead { hit: false },
        E::BatchHolds { held: false },
    ];

    /// A first delivery looks in the checkpoint, the cache and the batches, and calls
    /// without reading its budget.
    #[test]
    fn first_delivery_looks_then_calls_without_a_budget_read() {
        let (lc, fx) = arrived(1, 5, &MISSES);
        assert_eq!(fx, vec![F::ReadCheckpoint, F::AskCache, F::AskBatch, F::CallBackend]);
        assert_eq!(lc.state(), State::Calling);
    }

    /// A checkpoint hit answers at once (no cache, no budget, no call), even past the
    /// budget.
    #[test]
    fn checkpoint_hit_answers_past_the_budget() {
        let (lc, fx) = arrived(9, 5, &[E::CheckpointRead { hit: true }, E::Published, E::Acked]);
        assert_eq!(fx, vec![F::ReadCheckpoint, F::PublishResult, F::Ack]);
        assert_eq!(lc.state(), State::Finished(Disposition::Replayed));
    }

    /// The result cache answers a checkpoint miss: replayed, no call (issue 51).
    #[test]
    fn cache_hit_replays_without_call() {
        let (lc, fx) = arrived(
            3,
            5,
            &[E::CheckpointRead { hit: false }, E::CacheRead { hit: true }, E::Published, E::Acked],
        );
        assert_eq!(fx, vec![F::ReadCheckpoint, F::AskCache, F::PublishResult, F::Ack]);
        assert_eq!(lc.state(), State::Finished(Disposition::Replayed));
    }

    /// A redelivery reads its budget: deliveries handed back (outages) do not count, so
    /// delivery 7 of a job with 4 excused is its 3rd own and is called.
    #[test]
    fn handed_back_deliveries_do_not_spend_the_budget() {
        let mut events = MISSES.to_vec();
        events.push(E::BudgetRead { excused: 4 });
        let (lc, fx) = arrived(7, 5, &events);
        assert_eq!(fx[3..], [F::ReadBudget, F::CallBackend]);
        assert_eq!(lc.delivery(), 3);
    }

    /// Budget exhausted: a redelivery whose own deliveries (crashed workers) passed
    /// max_deliver is a dead letter without a call (crash_durability, issue 18).
    #[test]
    fn budget_exhausted_dead_letters() {
        let mut events = MISSES.to_vec();
        events.extend([E::BudgetRead { excused: 1 }, E::Published, E::Acked]);
        let (lc, fx) = arrived(7, 5, &events);
        assert_eq!(fx[3..], [F::ReadBudget, F::PublishDeadLetter, F::Ack]);
        assert!(!fx.contains(&F::CallBackend));
        assert_eq!(lc.state(), State::Finished(Disposition::DeadLetter));
    }

    /// A crashed earlier delivery is excused when a provider batch holds the job: it is
    /// not over budget however often its workers crashed (issue 44).
    #[test]
    fn crashed_delivery_excused_when_a_batch_holds_the_job() {
        let (lc, fx) = arrived(
            9,
            5,
            &[
                E::CheckpointRead { hit: false },
                E::CacheRead { hit: false },
                E::BatchHolds { held: true },
                E::Excused,
            ],
        );
        assert_eq!(
            fx,
            vec![F::ReadCheckpoint, F::AskCache, F::AskBatch, F::ExcuseDelivery, F::CallBackend]
        );
        assert!(!fx.contains(&F::ReadBudget));
        assert_eq!(lc.delivery(), 1);
    }

    fn called(delivered: u64) -> Lifecycle {
        let mut lc = Lifecycle::new(delivered, 5);
        assert_eq!(lc.step(E::Start { checkpoint_hit: false }), Some(F::CallBackend));
        lc
    }

    /// HTTP 429 past the in-place retries: the pool's quota is at fault, the job goes
    /// back with its budget kept, after the server's Retry-After (quota_pool).
    #[test]
    fn rate_limited_429_hands_back_after_retry_after() {
        for d in [1, 5] {
            let mut lc = called(d);
            let ra = Some(Duration::from_secs(12));
            let ev =
                E::CallError { class: ErrorClass::RateLimited, retry_after: ra, opened: false };
            assert_eq!(lc.step(ev), Some(F::HandBack(Duration::from_secs(12))));
            assert_eq!(lc.state(), State::Finished(Disposition::HandedBack));
        }
        let mut lc = called(1);
        let ev = E::CallError { class: ErrorClass::RateLimited, retry_after: None, opened: false };
        assert_eq!(lc.step(ev), Some(F::HandBack(HANDBACK_NAK)));
    }

    /// In place, a 429 or a 5xx is retried after at least its Retry-After; a Retry-After
    /// longer than max_in_place_wait ends the in-place retries (the delivery decides).
    #[test]
    fn retry_after_429_in_place_or_not() {
        let p = RetryPolicy::default();
        let planned = Some(Duration::from_millis(700));
        assert!(retries_in_place(ErrorClass::RateLimited));
        assert!(retries_in_place(ErrorClass::Transient));
        assert_eq!(in_place_delay(&p, None, planned), planned);
        assert_eq!(
            in_place_delay(&p, Some(Duration::from_secs(3)), planned),
            Some(Duration::from_secs(3))
        );
        let long = p.max_in_place_wait + Duration::from_secs(1);
        assert_eq!(in_place_delay(&p, Some(long), planned), None);
        assert_eq!(in_place_delay(&p, None, None), None, "retries spent");
    }

    /// A 5xx (transient, the job's own) spends the budget: nak with backoff, a dead
    /// letter on the last delivery (retry_failed).
    #[test]
    fn server_error_5xx_naks_then_dead_letters() {
        let ev = E::CallError { class: ErrorClass::Transient, retry_after: None, opened: false };
        let mut lc = called(2);
        assert_eq!(lc.step(ev.clone()), Some(F::Nak(nak_delay(2, None))));
        assert_eq!(lc.state(), State::Finished(Disposition::Retried));
        let mut lc = called(5);
        assert_eq!(lc.step(ev), Some(F::PublishDeadLetter));
        let ev = E::CallError { class: ErrorClass::Permanent, retry_after: None, opened: false };
        let mut lc = called(1);
        assert_eq!(lc.step(ev), Some(F::PublishDeadLetter), "a 4xx at once");
    }

    /// A transport error is the endpoint's: never retried in place; the call whose
    /// failure began the pool's pause counts (so a job that downs the endpoint each time
    /// ends a dead letter), even a 429 that opened it (outage).
    #[test]
    fn transport_error_that_opened_the_pause_counts() {
        let conn = ErrorClass::Unavailable(halyard_proto::OutageReason::Connection);
        assert!(!retries_in_place(conn));
        assert!(!retries_in_place(ErrorClass::Permanent));
        let mut lc = called(1);
        let ev = E::CallError { class: conn, retry_after: None, opened: true };
        assert_eq!(lc.step(ev), Some(F::Nak(nak_delay(1, None))));
        let mut lc = called(5);
        let ev = E::CallError { class: conn, retry_after: None, opened: true };
        assert_eq!(lc.step(ev), Some(F::PublishDeadLetter));
        let mut lc = called(1);
        let ev = E::CallError { class: ErrorClass::RateLimited, retry_after: None, opened: true };
        assert!(matches!(lc.step(ev), Some(F::Nak(_))));
    }

    /// Outage: a job of a paused pool that holds no probe goes back with its budget
    /// kept, on its last delivery too (outage).
    #[test]
    fn outage_pause_hands_back() {
        for d in [1, 5] {
            let mut lc = called(d);
            assert_eq!(lc.step(E::PoolPaused), Some(F::HandBack(HANDBACK_NAK)));
            assert_eq!(lc.state(), State::Finished(Disposition::HandedBack));
        }
    }

    /// Quota wait: a stop while the job waits for its quota share (or a backoff, or a
    /// probe's turn) hands it back at once (issue 33).
    #[test]
    fn stop_during_quota_wait_hands_back() {
        let mut lc = called(5);
        assert_eq!(lc.step(E::StoppedWaiting), Some(F::HandBack(HANDBACK_NAK)));
        assert_eq!(lc.state(), State::Finished(Disposition::HandedBack));
    }

    /// Stop signal: the hard stop abandons the call; the job goes back soon.
    #[test]
    fn stop_signal_abandons_the_call() {
        let mut lc = called(5);
        assert_eq!(lc.step(E::Shutdown), Some(F::HandBack(SHUTDOWN_NAK)));
        assert_eq!(lc.step(E::Settled), None);
        assert_eq!(lc.state(), State::Finished(Disposition::HandedBack));
    }

    /// Checkpoint write failure: nothing is published or acked; nak.
    #[test]
    fn checkpoint_write_failure_naks() {
        let mut lc = called(1);
        assert_eq!(lc.step(E::CallSucceeded), Some(F::Persist));
        assert_eq!(lc.step(E::PersistFailed), Some(F::Nak(nak_delay(1, None))));
        assert_eq!(lc.step(E::Published), None);
        assert_eq!(lc.state(), State::Finished(Disposition::Retried));
    }

    /// Publish failure (the broker did not take the result): nak; the redelivery
    /// replays the checkpointed completion, and a dead letter is published again.
    #[test]
    fn publish_failure_naks() {
        let mut lc = called(1);
        drive(&mut lc, &[E::CallSucceeded, E::Persisted]);
        assert_eq!(lc.step(E::PublishFailed), Some(F::Nak(nak_delay(1, None))));
        assert_eq!(lc.step(E::Acked), None);
        let mut lc = called(5);
        lc.step(E::CallFailed { permanent: false, retry_after: None });
        assert!(matches!(lc.step(E::PublishFailed), Some(F::Nak(_))));
        assert_eq!(lc.state(), State::Finished(Disposition::Retried));
    }

    /// Ack failure: the result is durable; nothing more to do, the redelivery is
    /// answered from the checkpoint (counted as retried, not completed).
    #[test]
    fn ack_failure_leaves_it_to_the_checkpoint() {
        let mut lc = called(1);
        drive(&mut lc, &[E::CallSucceeded, E::Persisted, E::Published]);
        assert_eq!(lc.state(), State::Acking(Disposition::Completed));
        assert_eq!(lc.step(E::AckFailed), None);
        assert_eq!(lc.state(), State::Finished(Disposition::Retried));
    }

    /// A malformed or forged job (refused by the worker's plan) is never looked up or
    /// called: its refusal is published when it could be decoded, whatever the publish
    /// does, and its share terminated (issue 13).
    #[test]
    fn malformed_or_forged_job_is_refused() {
        let mut lc = Lifecycle::new(1, 5);
        let fx = drive(&mut lc, &[E::Refused { reportable: true }, E::PublishFailed, E::Settled]);
        assert_eq!(fx, vec![F::PublishRefusal, F::Terminate]);
        assert_eq!(lc.state(), State::Finished(Disposition::Refused));
        let mut lc = Lifecycle::new(1, 5);
        let fx = drive(&mut lc, &[E::Refused { reportable: false }, E::Arrived]);
        assert_eq!(fx, vec![F::Terminate]);
        assert_eq!(lc.state(), State::Finished(Disposition::Refused));
    }

    /// Whole messages: another wire version goes back for a compatible worker; an object
    /// the broker cannot give now goes back soon; an unusable object or an empty batch is
    /// terminated.
    #[test]
    fn unusable_messages_are_handed_back_or_terminated() {
        let cases = [
            (E::OtherVersion, F::HandBack(OTHER_VERSION_DELAY), Disposition::HandedBack),
            (E::Unreadable { transient: true }, F::HandBack(OBJECT_RETRY), Disposition::HandedBack),
            (E::Unreadable { transient: false }, F::Terminate, Disposition::Refused),
            (E::Empty, F::Terminate, Disposition::Refused),
        ];
        for (ev, fx, d) in cases {
            let mut lc = Lifecycle::new(1, 5);
            assert_eq!(lc.step(ev), Some(fx));
            assert_eq!(lc.state(), State::Finished(d));
        }
    }

    /// A direct pool's call as its executor drives it: the pool read, then `events`.
    fn read_pool(lc: &mut Lifecycle, paused: bool, events: &[Event]) -> Vec<Effect> {
        let mut fx: Vec<Effect> = lc.step(E::PoolRead { paused }).into_iter().collect();
        fx.extend(drive(lc, events));
        fx
    }

    /// Pool up: one round as an ordinary job.
    #[test]
    fn pool_up_calls_one_round() {
        let mut lc = called(1);
        let fx = read_pool(&mut lc, false, &[E::CallSucceeded]);
        assert_eq!(fx, vec![F::CallRound { probe: false }, F::Persist]);
        assert_eq!(lc.state(), State::Persisting);
    }

    /// Outage: the pool is paused and another job holds the probe: the job goes back
    /// with its budget kept, on its last delivery too, without a round.
    #[test]
    fn paused_without_the_probe_hands_back() {
        for d in [1, 5] {
            let mut lc = called(d);
            let fx = read_pool(&mut lc, true, &[E::PoolPaused]);
            assert_eq!(fx, vec![F::ClaimProbe, F::HandBack(HANDBACK_NAK)]);
            assert_eq!(lc.state(), State::Finished(Disposition::HandedBack));
            assert!(!lc.holds_probe());
        }
    }

    /// The pool is paused and the job claims the probe: it waits for the probe's turn,
    /// holding it, and calls as the probe when the turn comes.
    #[test]
    fn paused_claims_the_probe_then_awaits_its_turn() {
        let mut lc = called(1);
        let fx = read_pool(&mut lc, true, &[E::ProbeClaimed]);
        assert_eq!(fx, vec![F::ClaimProbe, F::AwaitProbeTurn]);
        assert_eq!(lc.state(), State::AwaitingProbe);
        assert!(lc.holds_probe());
        assert_eq!(lc.step(E::ProbeDue), Some(F::CallRound { probe: true }));
        assert!(lc.holds_probe());
    }

    /// A job the pool loop fetched to probe with holds the probe from the start: paused,
    /// it awaits its turn without a claim, calls as the probe (Go), and lets go of the
    /// probe when the call ends.
    #[test]
    fn paused_with_the_probe_awaits_its_turn_then_calls() {
        let mut lc = Lifecycle::new(1, 5).holding_probe(true);
        assert_eq!(lc.step(E::Start { checkpoint_hit: false }), Some(F::CallBackend));
        assert!(lc.holds_probe());
        let fx = read_pool(&mut lc, true, &[E::ProbeDue, E::CallSucceeded]);
        assert_eq!(fx, vec![F::AwaitProbeTurn, F::CallRound { probe: true }, F::Persist]);
        assert!(!fx.contains(&F::ClaimProbe));
        assert_eq!(lc.state(), State::Persisting);
        assert!(!lc.holds_probe(), "the probe is let go when the call ends");
    }

    /// The pool resumed while the probe waited: one round as an ordinary job, the probe
    /// let go.
    #[test]
    fn resumed_while_awaiting_the_probe_calls_without_it() {
        let mut lc = Lifecycle::new(1, 5).holding_probe(true);
        lc.step(E::Start { checkpoint_hit: false });
        let fx = read_pool(&mut lc, true, &[E::PoolResumed]);
        assert_eq!(fx, vec![F::AwaitProbeTurn, F::CallRound { probe: false }]);
        assert_eq!(lc.state(), State::Calling);
        assert!(!lc.holds_probe());
    }

    /// The pool up when the call begins lets go of a probe the job was fetched to hold.
    #[test]
    fn pool_up_lets_go_of_the_probe() {
        let mut lc = Lifecycle::new(1, 5).holding_probe(true);
        lc.step(E::Start { checkpoint_hit: false });
        assert_eq!(read_pool(&mut lc, false, &[]), vec![F::CallRound { probe: false }]);
        assert!(!lc.holds_probe());
    }

    /// Graceful stop while the probe waits for its turn: handed back at once, budget
    /// kept (the StoppedWaiting disposition); the hard stop abandons it (graceful_stop).
    #[test]
    fn stop_while_awaiting_the_probe_hands_back() {
        let mut lc = called(5);
        let fx = read_pool(&mut lc, true, &[E::ProbeClaimed, E::StoppedWaiting]);
        assert_eq!(fx, vec![F::ClaimProbe, F::AwaitProbeTurn, F::HandBack(HANDBACK_NAK)]);
        assert_eq!(lc.state(), State::Finished(Disposition::HandedBack));
        assert!(!lc.holds_probe());
        let mut lc = called(5);
        let fx = read_pool(&mut lc, true, &[E::ProbeClaimed, E::Shutdown]);
        assert_eq!(fx.last(), Some(&F::HandBack(SHUTDOWN_NAK)));
        assert_eq!(lc.state(), State::Finished(Disposition::HandedBack));
        assert!(!lc.holds_probe());
    }

    /// Outage: a round that found the pool paused (another call began the pause, or it
    /// paused while the job waited for its quota share) decides again: it reads the pool
    /// and, paused, claims the probe or goes back; nothing counts.
    #[test]
    fn outage_while_paused_decides_again() {
        let mut lc = called(5);
        let fx = read_pool(&mut lc, false, &[E::PausedDuringCall]);
        assert_eq!(fx, vec![F::CallRound { probe: false }, F::CallBackend]);
        assert_eq!(lc.state(), State::Calling);
        let fx = read_pool(&mut lc, true, &[E::PoolPaused]);
        assert_eq!(fx, vec![F::ClaimProbe, F::HandBack(HANDBACK_NAK)]);
        assert_eq!(lc.state(), State::Finished(Disposition::HandedBack));
    }

    /// A failed probe (the pool stays paused) decides again: the job keeps the probe and
    /// waits for the next turn, then calls again as the probe.
    #[test]
    fn failed_probe_awaits_the_next_turn() {
        let mut lc = Lifecycle::new(1, 5).holding_probe(true);
        lc.step(E::Start { checkpoint_hit: false });
        let mut fx = read_pool(&mut lc, true, &[E::ProbeDue, E::PausedDuringCall]);
        fx.extend(read_pool(&mut lc, true, &[E::ProbeDue]));
        assert_eq!(
            fx,
            vec![
                F::AwaitProbeTurn,
                F::CallRound { probe: true },
                F::CallBackend,
                F::AwaitProbeTurn,
                F::CallRound { probe: true },
            ]
        );
        assert!(lc.holds_probe());
    }

    /// Outage: a round whose failure began the pool's pause counts (a nak, a dead
    /// letter on the last delivery), after any number of rounds.
    #[test]
    fn opened_outage_counts() {
        let conn = ErrorClass::Unavailable(halyard_proto::OutageReason::Connection);
        let opened = E::CallError { class: conn, retry_after: None, opened: true };
        let mut lc = called(2);
        let fx = read_pool(&mut lc, false, &[E::PausedDuringCall]);
        assert_eq!(fx.last(), Some(&F::CallBackend));
        let fx = read_pool(&mut lc, false, std::slice::from_ref(&opened));
        assert_eq!(fx, vec![F::CallRound { probe: false }, F::Nak(nak_delay(2, None))]);
        assert_eq!(lc.state(), State::Finished(Disposition::Retried));
        let mut lc = called(5);
        let fx = read_pool(&mut lc, false, &[opened]);
        assert_eq!(fx.last(), Some(&F::PublishDeadLetter));
    }

    /// The probe's events make sense only while it waits, and a call's outcome only
    /// after a round: out of turn they are ignored.
    #[test]
    fn probe_events_out_of_turn_are_ignored() {
        let mut lc = called(1);
        assert_eq!(lc.step(E::ProbeDue), None);
        assert_eq!(lc.step(E::PoolResumed), None);
        assert_eq!(lc.state(), State::Calling);
        let mut lc = called(1);
        read_pool(&mut lc, true, &[E::ProbeClaimed]);
        assert_eq!(lc.step(E::CallSucceeded), None);
        assert_eq!(lc.step(E::PausedDuringCall), None);
        assert_eq!(lc.state(), State::AwaitingProbe);
        let mut lc = Lifecycle::new(1, 5);
        assert_eq!(lc.step(E::PoolRead { paused: false }), None);
        assert_eq!(lc.state(), State::Received);
    }
}

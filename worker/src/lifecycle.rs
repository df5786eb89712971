//! The life of one job delivery inside a worker, as a pure state machine.
//!
//! No IO, no tokio: [`Lifecycle::step`] takes an [`Event`] and returns the [`Effect`]s the
//! caller must carry out, in order; the caller reports each effect's outcome back as the
//! next event. The order it enforces is the durability order of DESIGN.md:
//!
//! 1. checkpoint hit → publish the stored result → ack (no model call);
//! 2. otherwise call → **persist (flushed)** → **publish** (broker-acknowledged) → **ack**;
//! 3. permanent failure, or transient failure on the last allowed delivery → publish a
//!    dead letter → ack (the job is terminal, the run does not wait for it);
//! 4. transient failure with deliveries left → nak with a backoff delay;
//! 5. the pool's fault, not the job's (an endpoint outage, 429s past the in-place
//!    retries, the pool paused before the call) → hand back: a nak that does not spend
//!    the job's delivery budget (see [`crate::budget`]);
//! 6. shutdown while calling → hand back at once with a short delay, so another worker
//!    takes it;
//! 7. a failed persist or publish → nak (nothing is acked that is not durable);
//! 8. a job that arrives past its budget (its earlier deliveries ended without a result:
//!    crashed workers) → dead letter without a call, unless its result is checkpointed.
//!
//! The delivery number the machine compares with `max_deliver` is the *effective* one:
//! JetStream's count less the deliveries handed back (see [`crate::budget`]).
//!
//! An ack is only ever emitted after the result is durable in the checkpoint *and* in the results
//! stream; a crash at any point loses at most the call in flight.

use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Received,
    Calling,
    Persisting,
    Publishing { dead_letter: bool, replay: bool },
    Acking(Disposition),
    Finished(Disposition),
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
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The job arrived; `checkpoint_hit` says whether the checkpoint already holds its result.
    Start {
        checkpoint_hit: bool,
    },
    CallSucceeded,
    CallFailed {
        permanent: bool,
        retry_after: Option<Duration>,
    },
    Persisted,
    PersistFailed,
    Published,
    PublishFailed,
    Acked,
    /// The call did not happen or failed for the pool's reason (endpoint outage, 429s,
    /// a pause); hand the job back after `retry_after` (at least [`HANDBACK_NAK`]).
    HandBack {
        retry_after: Option<Duration>,
    },
    /// The worker is shutting down and the call was abandoned.
    Shutdown,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    CallBackend,
    /// Write the completion to the checkpoint and flush it.
    Persist,
    /// Publish the completion (from the call or the checkpoint) and await the broker's ack.
    PublishResult,
    /// Publish a dead-letter result carrying the last error.
    PublishDeadLetter,
    Ack,
    Nak(Duration),
    /// Nak without spending the delivery budget: record the excused delivery, then nak.
    HandBack(Duration),
}

#[derive(Clone, Debug)]
pub struct Lifecycle {
    state: State,
    /// This delivery's number, 1-based (JetStream's `delivered`).
    delivery: u64,
    max_deliver: u64,
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

impl Lifecycle {
    pub fn new(delivery: u64, max_deliver: u64) -> Self {
        Lifecycle {
            state: State::Received,
            delivery: delivery.max(1),
            max_deliver: max_deliver.max(1),
        }
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
    pub fn step(&mut self, event: Event) -> Vec<Effect> {
        use Effect as F;
        use Event as E;
        use State as S;
        let (next, effects) = match (self.state, event) {
            (S::Received, E::Start { checkpoint_hit: true }) => {
                (S::Publishing { dead_letter: false, replay: true }, vec![F::PublishResult])
            }
            (S::Received, E::Start { checkpoint_hit: false }) if self.over_budget() => {
                (S::Publishing { dead_letter: true, replay: false }, vec![F::PublishDeadLetter])
            }
            (S::Received, E::Start { checkpoint_hit: false }) => (S::Calling, vec![F::CallBackend]),
            (S::Calling, E::CallSucceeded) => (S::Persisting, vec![F::Persist]),
            (S::Calling, E::CallFailed { permanent, retry_after }) => {
                if permanent || self.is_last_delivery() {
                    (S::Publishing { dead_letter: true, replay: false }, vec![F::PublishDeadLetter])
                } else {
                    (
                        S::Finished(Disposition::Retried),
                        vec![F::Nak(nak_delay(self.delivery, retry_after))],
                    )
                }
            }
            (S::Calling, E::HandBack { retry_after }) => {
                let delay = retry_after.map_or(HANDBACK_NAK, |r| r.max(HANDBACK_NAK));
                (S::Finished(Disposition::HandedBack), vec![F::HandBack(delay)])
            }
            (S::Calling, E::Shutdown) => {
                (S::Finished(Disposition::HandedBack), vec![F::HandBack(SHUTDOWN_NAK)])
            }
            (S::Persisting, E::Persisted) => {
                (S::Publishing { dead_letter: false, replay: false }, vec![F::PublishResult])
            }
            (S::Persisting, E::PersistFailed) => {
                (S::Finished(Disposition::Retried), vec![F::Nak(nak_delay(self.delivery, None))])
            }
            (S::Publishing { dead_letter, replay }, E::Published) => {
                let d = if dead_letter {
                    Disposition::DeadLetter
                } else if replay {
                    Disposition::Replayed
                } else {
                    Disposition::Completed
                };
                (S::Acking(d), vec![F::Ack])
            }
            // The completion (if any) is in the checkpoint: the redelivery replays it.
            (S::Publishing { .. }, E::PublishFailed) => {
                (S::Finished(Disposition::Retried), vec![F::Nak(nak_delay(self.delivery, None))])
            }
            (S::Acking(d), E::Acked) => (S::Finished(d), vec![]),
            (s, _) => (s, vec![]),
        };
        self.state = next;
        effects
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
}

//! A job message and how it settles: one job, or a batch of them; acked, nak'd (its
//! delivery counted), handed back (its delivery excused from the budget, see
//! [`crate::budget`]) or left to be redelivered.

use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use tracing::warn;

use crate::budget::Budget;

/// A job message: one job, or several (`[run] job_batch` > 1). It is settled once every
/// job in it has finished: acked if all of them were (each result durable and published
/// first), nak'd if one asked for a retry, left to redeliver after `ack_wait` if one
/// could not finish. A redelivery re-runs only the jobs the checkpoint does not answer.
pub(crate) struct JobMsg {
    pub(crate) msg: jetstream::Message,
    pub(crate) delivered: u64,
    /// Jobs not finished yet, and the fate of those that are.
    state: std::sync::Mutex<(usize, Fate)>,
    /// Deliveries excused from the budget, read once on a redelivery (see `excused`).
    excused: tokio::sync::OnceCell<u64>,
}

/// What a finished job asks of its message.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Fate {
    /// Refused (see `admit`): nothing to run, ever. Neutral: the message takes the fate of
    /// its other jobs, and is terminated only if all of its jobs were refused.
    Term,
    Ack,
    Nak(Duration),
    /// A nak for the pool's reason: the delivery is excused from the budget.
    HandBack(Duration),
    /// Neither: the message is redelivered after `ack_wait`.
    Leave,
}

impl Fate {
    /// The message's fate given two of its jobs': leaving beats a nak (the longest delay
    /// wins), a nak that spends the budget beats a hand-back (one job's own failure makes
    /// the delivery count), which beats an ack.
    fn and(self, other: Fate) -> Fate {
        use Fate::*;
        match (self, other) {
            (Term, f) | (f, Term) => f,
            (Leave, _) | (_, Leave) => Leave,
            (Nak(a) | HandBack(a), Nak(b)) | (Nak(a), HandBack(b)) => Nak(a.max(b)),
            (HandBack(a), HandBack(b)) => HandBack(a.max(b)),
            (Nak(d), Ack) | (Ack, Nak(d)) => Nak(d),
            (HandBack(d), Ack) | (Ack, HandBack(d)) => HandBack(d),
            (Ack, Ack) => Ack,
        }
    }
}

impl JobMsg {
    pub(crate) fn new(msg: jetstream::Message, delivered: u64, jobs: usize) -> JobMsg {
        // Term is the neutral fate: the jobs' own fates decide (all refused: terminated).
        let state = std::sync::Mutex::new((jobs, Fate::Term));
        JobMsg { msg, delivered, state, excused: Default::default() }
    }

    fn seq(&self) -> Option<u64> {
        self.msg.info().ok().map(|i| i.stream_sequence)
    }

    /// The message's delivery budget record: its pool (the last token of its subject,
    /// `halyard.jobs.<pool token>`) and stream sequence, see [`Budget::key`].
    fn budget_key(&self) -> Option<(String, u64)> {
        let seq = self.seq()?;
        let subject = self.msg.subject.as_str();
        let pool = subject.strip_prefix(halyard_proto::subjects::JOBS_PREFIX).unwrap_or(subject);
        Some((Budget::key(pool.trim_start_matches('.'), seq), seq))
    }

    /// The deliveries of this message excused from the budget (read once, and only on a
    /// redelivery; see [`crate::budget`]): the delivery that counts is JetStream's less
    /// these ([`crate::budget::effective`]).
    pub(crate) async fn excused(&self, budget: &Budget) -> u64 {
        *self
            .excused
            .get_or_init(|| async {
                let Some((key, seq)) = self.budget_key().filter(|_| self.delivered > 1) else {
                    return 0;
                };
                budget.excused(&key).await.unwrap_or_else(|e| {
                    warn!(stream_seq = seq, delivery = self.delivered, error = %e, "cannot read the job's delivery budget; every delivery counts");
                    0
                })
            })
            .await
    }

    /// Excuse this delivery from the budget: it came because a worker holding the job in
    /// a provider batch crashed (see `batch`), not because of anything the job did.
    pub(crate) async fn excuse_delivery(&self, budget: &Budget) {
        let Some((key, seq)) = self.budget_key().filter(|_| self.delivered > 1) else { return };
        if let Err(e) = budget.excuse(&key, self.delivered).await {
            warn!(stream_seq = seq, delivery = self.delivered, error = %e, "cannot excuse a redelivery of a job held by a provider batch");
        }
    }

    /// One job of the message is finished with `fate`. The last one settles the message;
    /// an error is the settling ack or nak failing to go out.
    pub(crate) async fn finish(
        &self,
        fate: Fate,
        budget: &Budget,
    ) -> Result<(), async_nats::Error> {
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
            Fate::Ack => {
                self.msg.ack().await?;
                if let Some((key, _)) =
                    self.budget_key().filter(|_| self.excused.get().is_some_and(|n| *n > 0))
                {
                    budget.forget(&key).await;
                }
                Ok(())
            }
            Fate::Nak(delay) => self.msg.ack_with(AckKind::Nak(Some(delay))).await,
            Fate::Term => self.msg.ack_with(AckKind::Term).await,
            Fate::HandBack(delay) => {
                // Recorded before the nak, so the redelivery finds it.
                if let Some((key, seq)) = self.budget_key() {
                    if let Err(e) = budget.excuse(&key, self.delivered).await {
                        warn!(stream_seq = seq, delivery = self.delivered, error = %e, "cannot record the hand-back; this delivery counts against the job's budget");
                    }
                }
                self.msg.ack_with(AckKind::Nak(Some(delay))).await
            }
            Fate::Leave => Ok(()),
        }
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
        let all = [Fate::Ack, Fate::Nak(a), Fate::Ack].into_iter().fold(Fate::Term, Fate::and);
        assert_eq!(all, Fate::Nak(a));
    }

    /// Issue 13: a refused job does not decide its message: the others do; a message
    /// whose jobs were all refused is terminated.
    #[test]
    fn refused_jobs_leave_the_message_to_the_others() {
        let a = Duration::from_secs(1);
        for f in [Fate::Ack, Fate::Nak(a), Fate::HandBack(a), Fate::Leave] {
            assert_eq!(Fate::Term.and(f), f);
            assert_eq!(f.and(Fate::Term), f);
        }
        let all = [Fate::Term, Fate::Term].into_iter().fold(Fate::Term, Fate::and);
        assert_eq!(all, Fate::Term);
        let mixed = [Fate::Ack, Fate::Term, Fate::Ack].into_iter().fold(Fate::Term, Fate::and);
        assert_eq!(mixed, Fate::Ack);
    }

    /// A message is handed back (its delivery excused) only if no job in it failed by
    /// its own fault: one job's counted nak makes the whole delivery count (issue 18).
    #[test]
    fn a_hand_back_is_excused_only_when_no_job_failed_itself() {
        let (a, b) = (Duration::from_secs(1), Duration::from_secs(5));
        assert_eq!(Fate::Ack.and(Fate::HandBack(a)), Fate::HandBack(a));
        assert_eq!(Fate::HandBack(a).and(Fate::HandBack(b)), Fate::HandBack(b));
        assert_eq!(Fate::HandBack(b).and(Fate::Nak(a)), Fate::Nak(b));
        assert_eq!(Fate::Nak(a).and(Fate::HandBack(b)), Fate::Nak(b));
        assert_eq!(Fate::HandBack(a).and(Fate::Leave), Fate::Leave);
    }
}

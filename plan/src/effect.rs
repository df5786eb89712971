//! What the planner asks its caller to do ([`Effect`]): store, mark done, note,
//! publish. A value type of its own so that the store's interface
//! ([`crate::store::RunStore::commit`]) and the planner both build on it.

use halyard_proto::{Job, JobId};

use crate::cost::ClassTotals;
use crate::record::{Intake, ItemKey, JobMeta};

/// What the caller must do, in order. Store effects before the flush, the flush before
/// the acks of the messages that carried the results.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Store this result (the first for its job; see [`crate::store::RunStore::commit`]), encoded in
    /// the store's compact form ([`halyard_proto::stored`]). `pool` is its job's pool;
    /// `share`: what the shared result cache makes of it, if the pool's models write to
    /// that cache.
    StoreResult { job: JobId, pool: String, encoded: Vec<u8>, share: Share },
    /// Item `item` is finished with this label.
    MarkDone { item: ItemKey, label: Vec<u8> },
    /// Describe a dead-lettered job in the report.
    NoteJob { job: JobId, meta: JobMeta },
    /// Store the cost totals (with every committed batch).
    Costs(Vec<ClassTotals>),
    /// Hold aside a result for a job not planned (yet): `encoded` is its wire form, `pool`
    /// the token of the subject it came on. Kept only if the job has none held.
    HoldResult { job: JobId, pool: String, encoded: Vec<u8> },
    /// Drop the result held aside for `job` (it answered its job, or was refused).
    Unhold { job: JobId },
    /// Store the refusals counted so far.
    Intake(Intake),
    /// Publish a job; `round` is a message-id suffix for a re-publication (which goes
    /// alone, never in a batch). Boxed: a job is the largest effect by far (one
    /// allocation per publication, against the encoding and the broker's round trip).
    Publish { job: Box<Job>, round: Option<u32> },
}

/// What the shared result cache makes of a stored result (issue 51), if its pool's
/// models write to that cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Share {
    /// Nothing: it is not a completion (a failure, a dead letter).
    No,
    /// A completion paid for (or read from a machine's cache): put in the bucket.
    Put,
    /// A completion a worker read from the bucket: the bucket holds it, and this use
    /// keeps it there (the entry is written again when old,
    /// `halyard_cache::shared::SharedWriter::refresh`).
    Used,
}

impl Share {
    /// What the shared cache makes of `outcome`.
    pub fn of(outcome: &halyard_proto::Outcome) -> Share {
        match outcome {
            halyard_proto::Outcome::Done(c)
                if c.source == halyard_proto::AnswerSource::SharedCache =>
            {
                Share::Used
            }
            halyard_proto::Outcome::Done(_) => Share::Put,
            _ => Share::No,
        }
    }
}

/// The jobs to publish among `effects`, in order, with their rounds (the store effects
/// are carried out by [`crate::store::RunStore::commit`]).
pub fn publishes(effects: Vec<Effect>) -> impl Iterator<Item = (Job, Option<u32>)> {
    effects.into_iter().filter_map(|e| match e {
        Effect::Publish { job, round } => Some((*job, round)),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use halyard_proto::{AnswerSource, Completion, Failure, FailureKind, Outcome};

    use super::Share;

    /// Issue 51: an answer read from the shared cache is a use of its entry, not a put;
    /// any other completion is put (a machine cache's answer included: the bucket may
    /// not have it); a failure is neither.
    #[test]
    fn what_the_shared_cache_makes_of_an_outcome() {
        let done = |source| {
            Outcome::Done(Completion {
                text: "a".into(),
                usage: Default::default(),
                latency_ms: 1,
                finish_reason: None,
                calls: 1,
                logprobs: None,
                refusal: false,
                source,
            })
        };
        assert_eq!(Share::of(&done(AnswerSource::Paid)), Share::Put);
        assert_eq!(Share::of(&done(AnswerSource::MachineCache)), Share::Put);
        assert_eq!(Share::of(&done(AnswerSource::SharedCache)), Share::Used);
        let failed = Outcome::Failed(Failure {
            kind: FailureKind::Permanent,
            error: "HTTP 400".into(),
            http_status: Some(400),
        });
        assert_eq!(Share::of(&failed), Share::No);
    }
}

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
    /// `shareable`: the result is a completion not read from the shared result cache
    /// (what that cache may take, if the pool's models write to it).
    StoreResult { job: JobId, pool: String, encoded: Vec<u8>, shareable: bool },
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

/// The jobs to publish among `effects`, in order, with their rounds (the store effects
/// are carried out by [`crate::store::RunStore::commit`]).
pub fn publishes(effects: Vec<Effect>) -> impl Iterator<Item = (Job, Option<u32>)> {
    effects.into_iter().filter_map(|e| match e {
        Effect::Publish { job, round } => Some((*job, round)),
        _ => None,
    })
}

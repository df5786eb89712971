//! What the planner needs of a run's state: [`RunStore`], with two implementations, the
//! redb [`RunState`] the coordinator runs on and the in-memory [`MemStore`] the planner's
//! tests run on (as raft-rs has `Storage` with `MemStorage`).
//!
//! Writes go to the store as the planner's effects are carried out, the effects of one
//! step as one atomic update ([`RunStore::commit`]); they become durable only when the
//! owner flushes ([`RunState::flush`]), which the coordinator does before
//! it acks the messages that carried them. The planner never flushes: durability is IO.

use std::collections::{BTreeMap, HashMap};

use halyard_proto::{JobId, StoredResult};

use crate::cost::ClassTotals;
use crate::run::planner::Effect;
use crate::state::{ItemKey, JobMeta, RunState, StateError, Write};

/// A run's results, finished items and job notes, as the planner reads and writes them.
pub trait RunStore {
    /// The result stored for `job` (the first one received), if any.
    fn result(&self, job: &JobId) -> Result<Option<StoredResult>, StateError>;
    /// Whether a result is stored for `job` (cheaper than [`RunStore::result`]).
    fn has_result(&self, job: &JobId) -> Result<bool, StateError>;
    fn is_done(&self, item: ItemKey) -> Result<bool, StateError>;
    /// Items finished, in all.
    fn done_count(&self) -> u64;
    /// Items finished of one benchmark and model under test.
    fn done_count_of(&self, bench: u32, model: u32) -> u64;
    /// Results stored when the store was opened (read once, when a planner starts).
    fn results_at_open(&self) -> u64;
    /// The cost totals stored with the last committed batch (empty if none).
    fn costs(&self) -> Result<Vec<ClassTotals>, StateError>;

    /// Carry out the store effects among `effects` (publishes are skipped) as one atomic
    /// update: after a crash, all of them or none (see [`RunState::commit_writes`]). A
    /// result is stored only if its job has none (the first result wins, whatever
    /// duplicates arrive); a dead letter's note likewise.
    fn commit(&mut self, effects: &[Effect]) -> Result<(), StateError>;
}

impl RunStore for RunState {
    fn result(&self, job: &JobId) -> Result<Option<StoredResult>, StateError> {
        RunState::result(self, job)
    }
    fn has_result(&self, job: &JobId) -> Result<bool, StateError> {
        RunState::has_result(self, job)
    }
    fn is_done(&self, item: ItemKey) -> Result<bool, StateError> {
        RunState::is_done(self, item)
    }
    fn done_count(&self) -> u64 {
        RunState::done_count(self) as u64
    }
    fn done_count_of(&self, bench: u32, model: u32) -> u64 {
        RunState::done_count_of(self, bench, model)
    }
    fn results_at_open(&self) -> u64 {
        RunState::results_at_open(self)
    }
    fn costs(&self) -> Result<Vec<ClassTotals>, StateError> {
        RunState::costs(self)
    }
    fn commit(&mut self, effects: &[Effect]) -> Result<(), StateError> {
        let writes: Vec<Write<'_>> = effects
            .iter()
            .filter_map(|e| match e {
                Effect::StoreResult { job, encoded } => Some(Write::Result(job, encoded)),
                Effect::MarkDone { item, label } => Some(Write::Label(*item, label)),
                Effect::NoteJob { job, meta } => Some(Write::JobNote(job, meta)),
                Effect::Costs(totals) => Some(Write::Costs(totals)),
                Effect::Publish { .. } => None,
            })
            .collect();
        if writes.is_empty() {
            return Ok(());
        }
        RunState::commit_writes(self, &writes)
    }
}

/// A run state in memory, for tests: the same contract as [`RunState`] (first result
/// wins, labels by item key), nothing durable.
#[derive(Clone, Debug, Default)]
pub struct MemStore {
    results: BTreeMap<JobId, Vec<u8>>,
    done: BTreeMap<ItemKey, Vec<u8>>,
    jobs: HashMap<JobId, JobMeta>,
    costs: Vec<ClassTotals>,
}

impl MemStore {
    /// The label stored for `item`.
    pub fn label(&self, item: ItemKey) -> Option<&[u8]> {
        self.done.get(&item).map(Vec::as_slice)
    }

    /// The note of a dead-lettered job.
    pub fn job_meta(&self, job: &JobId) -> Option<&JobMeta> {
        self.jobs.get(job)
    }
}

impl RunStore for MemStore {
    fn result(&self, job: &JobId) -> Result<Option<StoredResult>, StateError> {
        self.results.get(job).map(|b| crate::state::decode_stored(job, b)).transpose()
    }
    fn has_result(&self, job: &JobId) -> Result<bool, StateError> {
        Ok(self.results.contains_key(job))
    }
    fn is_done(&self, item: ItemKey) -> Result<bool, StateError> {
        Ok(self.done.contains_key(&item))
    }
    fn done_count(&self) -> u64 {
        self.done.len() as u64
    }
    fn done_count_of(&self, bench: u32, model: u32) -> u64 {
        self.done.keys().filter(|k| k.bench == bench && k.model == model).count() as u64
    }
    fn results_at_open(&self) -> u64 {
        self.results.len() as u64
    }
    fn costs(&self) -> Result<Vec<ClassTotals>, StateError> {
        Ok(self.costs.clone())
    }
    fn commit(&mut self, effects: &[Effect]) -> Result<(), StateError> {
        for e in effects {
            match e {
                Effect::StoreResult { job, encoded } => {
                    self.results.entry(*job).or_insert_with(|| encoded.clone());
                }
                Effect::MarkDone { item, label } => {
                    self.done.insert(*item, label.clone());
                }
                Effect::NoteJob { job, meta } => {
                    self.jobs.entry(*job).or_insert_with(|| meta.clone());
                }
                Effect::Costs(totals) => self.costs = totals.clone(),
                Effect::Publish { .. } => {}
            }
        }
        Ok(())
    }
}

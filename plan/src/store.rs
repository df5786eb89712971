//! What the planner needs of a run's state: [`RunStore`], with two implementations, the
//! on-disk run state the coordinator runs on (`halyard_coordinator::state::RunDb`) and
//! the in-memory [`MemStore`] the planner's tests run on (as raft-rs has `Storage` with
//! `MemStorage`); and what a benchmark's report reads of it, [`LabelStore`].
//!
//! Writes go to the store as the planner's effects are carried out, the effects of one
//! step as one atomic update ([`RunStore::commit`]); they become durable only when the
//! owner flushes, which the coordinator does before it acks the messages that carried
//! them. The planner never flushes: durability is IO.

use std::collections::{BTreeMap, HashMap};

use halyard_proto::{JobId, StoredResult};

use crate::cost::ClassTotals;
use crate::effect::Effect;
pub use crate::planner::Held;
pub use crate::record::{decode_stored, Intake, ItemKey, JobMeta, StoreError};

/// Labels of one benchmark and model under test, in item order.
pub type LabelIter<'a> = Box<dyn Iterator<Item = Result<(ItemKey, Vec<u8>), StoreError>> + 'a>;

/// What a benchmark's report reads of a run's state: its stored labels.
pub trait LabelStore {
    /// The labels of benchmark `bench`, model under test `model`, in item order.
    fn labels_of(&self, bench: u32, model: u32) -> LabelIter<'_>;
}

/// A run's results, finished items and job notes, as the planner reads and writes them.
pub trait RunStore {
    /// The result stored for `job` (the first one received), if any.
    fn result(&self, job: &JobId) -> Result<Option<StoredResult>, StoreError>;
    /// Whether a result is stored for `job` (cheaper than [`RunStore::result`]).
    fn has_result(&self, job: &JobId) -> Result<bool, StoreError>;
    fn is_done(&self, item: ItemKey) -> Result<bool, StoreError>;
    /// Items finished, in all.
    fn done_count(&self) -> u64;
    /// Items finished of one benchmark and model under test.
    fn done_count_of(&self, bench: u32, model: u32) -> u64;
    /// Results stored when the store was opened (read once, when a planner starts).
    fn results_at_open(&self) -> u64;
    /// The cost totals stored with the last committed batch (empty if none).
    fn costs(&self) -> Result<Vec<ClassTotals>, StoreError>;
    /// The refusals stored last (zero if none).
    fn intake(&self) -> Result<Intake, StoreError>;
    /// The result held aside for `job` (not planned when it arrived): the pool token of
    /// its subject and its wire form.
    fn held(&self, job: &JobId) -> Result<Option<(String, Vec<u8>)>, StoreError>;
    /// Results held aside, and their bytes (pool token and wire form), when the store was
    /// opened.
    fn held_at_open(&self) -> Result<Held, StoreError>;

    /// Carry out the store effects among `effects` (publishes are skipped) as one atomic
    /// update: after a crash, all of them or none (as the coordinator's run state does it). A
    /// result is stored only if its job has none (the first result wins, whatever
    /// duplicates arrive); a dead letter's note likewise.
    fn commit(&mut self, effects: &[Effect]) -> Result<(), StoreError>;
}

/// A run state in memory, for tests: the same contract as the on-disk run state (first
/// result wins, labels by item key), nothing durable.
#[derive(Clone, Debug, Default)]
pub struct MemStore {
    results: BTreeMap<JobId, Vec<u8>>,
    done: BTreeMap<ItemKey, Vec<u8>>,
    jobs: HashMap<JobId, JobMeta>,
    costs: Vec<ClassTotals>,
    intake: Intake,
    held: BTreeMap<JobId, (String, Vec<u8>)>,
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

    /// What putting a run's dead letters back (`halyard dead-letters requeue`) does to
    /// its state, for the run state's model test: with no failed result, nothing; else
    /// the failed results go, and no item counts as finished any more (the planner finds
    /// the finished ones again).
    pub fn requeue(&mut self) {
        let failed = |job: &JobId, b: &Vec<u8>| {
            matches!(
                decode_stored(job, b).map(|s| s.outcome),
                Ok(halyard_proto::Outcome::Failed(_))
            )
        };
        if !self.results.iter().any(|(job, b)| failed(job, b)) {
            return;
        }
        self.results.retain(|job, b| !failed(job, b));
        self.done.clear();
    }
}

impl RunStore for MemStore {
    fn result(&self, job: &JobId) -> Result<Option<StoredResult>, StoreError> {
        self.results.get(job).map(|b| decode_stored(job, b)).transpose()
    }
    fn has_result(&self, job: &JobId) -> Result<bool, StoreError> {
        Ok(self.results.contains_key(job))
    }
    fn is_done(&self, item: ItemKey) -> Result<bool, StoreError> {
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
    fn costs(&self) -> Result<Vec<ClassTotals>, StoreError> {
        Ok(self.costs.clone())
    }
    fn intake(&self) -> Result<Intake, StoreError> {
        Ok(self.intake)
    }
    fn held(&self, job: &JobId) -> Result<Option<(String, Vec<u8>)>, StoreError> {
        Ok(self.held.get(job).cloned())
    }
    fn held_at_open(&self) -> Result<Held, StoreError> {
        let bytes = self.held.values().map(|(p, e)| (p.len() + e.len()) as u64).sum();
        Ok(Held { results: self.held.len() as u64, bytes })
    }
    fn commit(&mut self, effects: &[Effect]) -> Result<(), StoreError> {
        for e in effects {
            match e {
                Effect::StoreResult { job, encoded, .. } => {
                    self.results.entry(*job).or_insert_with(|| encoded.clone());
                }
                Effect::MarkDone { item, label } => {
                    self.done.insert(*item, label.clone());
                }
                Effect::NoteJob { job, meta } => {
                    self.jobs.entry(*job).or_insert_with(|| meta.clone());
                }
                Effect::Costs(totals) => self.costs = totals.clone(),
                Effect::Intake(i) => self.intake = *i,
                Effect::HoldResult { job, pool, encoded } => {
                    self.held.entry(*job).or_insert_with(|| (pool.clone(), encoded.clone()));
                }
                Effect::Unhold { job } => {
                    self.held.remove(job);
                }
                Effect::Publish { .. } => {}
            }
        }
        Ok(())
    }
}

impl LabelStore for MemStore {
    fn labels_of(&self, bench: u32, model: u32) -> LabelIter<'_> {
        let lo = ItemKey { bench, model, item: 0 };
        let hi = ItemKey { bench, model, item: u32::MAX };
        Box::new(self.done.range(lo..=hi).map(|(k, v)| Ok((*k, v.clone()))))
    }
}

//! The on-disk run state as the planner sees it: [`RunStore`] and [`LabelStore`] for
//! [`RunDb`] (the planner's in-memory twin, `MemStore`, lives beside the trait in
//! `halyard-plan`).

use halyard_plan::cost::ClassTotals;
use halyard_plan::planner::Effect;
use halyard_plan::store::{Held, Intake, ItemKey, LabelIter, LabelStore, RunStore, StoreError};
use halyard_proto::{JobId, StoredResult};

use crate::state::{RunDb, Write};

impl RunStore for RunDb {
    fn result(&self, job: &JobId) -> Result<Option<StoredResult>, StoreError> {
        Ok(RunDb::result(self, job)?)
    }
    fn has_result(&self, job: &JobId) -> Result<bool, StoreError> {
        Ok(RunDb::has_result(self, job)?)
    }
    fn is_done(&self, item: ItemKey) -> Result<bool, StoreError> {
        Ok(RunDb::is_done(self, item)?)
    }
    fn done_count(&self) -> u64 {
        RunDb::done_count(self) as u64
    }
    fn done_count_of(&self, bench: u32, model: u32) -> u64 {
        RunDb::done_count_of(self, bench, model)
    }
    fn results_at_open(&self) -> u64 {
        RunDb::results_at_open(self)
    }
    fn costs(&self) -> Result<Vec<ClassTotals>, StoreError> {
        Ok(RunDb::costs(self)?)
    }
    fn intake(&self) -> Result<Intake, StoreError> {
        Ok(RunDb::intake(self)?)
    }
    fn held(&self, job: &JobId) -> Result<Option<(String, Vec<u8>)>, StoreError> {
        Ok(RunDb::held(self, job)?)
    }
    fn held_at_open(&self) -> Result<Held, StoreError> {
        Ok(RunDb::held_count(self)?)
    }
    fn commit(&mut self, effects: &[Effect]) -> Result<(), StoreError> {
        let writes: Vec<Write<'_>> = effects
            .iter()
            .filter_map(|e| match e {
                Effect::StoreResult { job, encoded } => Some(Write::Result(job, encoded)),
                Effect::MarkDone { item, label } => Some(Write::Label(*item, label)),
                Effect::NoteJob { job, meta } => Some(Write::JobNote(job, meta)),
                Effect::Costs(totals) => Some(Write::Costs(totals)),
                Effect::Intake(i) => Some(Write::Intake(i)),
                Effect::HoldResult { job, pool, encoded } => Some(Write::Hold(job, pool, encoded)),
                Effect::Unhold { job } => Some(Write::Unhold(job)),
                Effect::Publish { .. } => None,
            })
            .collect();
        if writes.is_empty() {
            return Ok(());
        }
        Ok(RunDb::commit_writes(self, &writes)?)
    }
}

impl LabelStore for RunDb {
    fn labels_of(&self, bench: u32, model: u32) -> LabelIter<'_> {
        Box::new(RunDb::labels_of(self, bench, model).map(|r| r.map_err(StoreError::from)))
    }
}

//! Dead letters of a finished or stopped run: listing, counting, and re-queueing them
//! (`halyard retry-failed RUN`).
//!
//! A dead letter is a job whose result is a failure: a permanent error (HTTP 400/401/…),
//! a transient one on its last allowed delivery, a job that crashed its workers
//! `max_deliver` times, or one lost from the queue three times. Each is recorded in the
//! run state with the job, its deliveries (attempts) and the last error, and listed in
//! the report.
//!
//! Re-queueing works on the run state while no coordinator has it open (the store's lock):
//! 1. every dead letter is moved from `results` to `retried` (job → retry round) and to
//!    `dead_history` (round + job → the failed result, kept for the record);
//! 2. every item label is forgotten (`done`), so that the next coordinator re-evaluates
//!    every item against the stored results: items that needed a dead-lettered job wait
//!    for it again, and it is published again; all other items finish at once from
//!    stored results (no job is published, no call is made);
//! 3. the retry round is stored in `meta`. The coordinator publishes a retried job under
//!    a message id carrying its round, so JetStream's de-duplication of the first
//!    publication does not drop it.
//!
//! Then running the same `halyard run`/`halyard coordinator` command resumes the run.

use std::collections::HashMap;
use std::path::Path;

use halyard_proto::{JobId, Outcome};

use crate::report::{self, DeadLetter};
use crate::state::{job_key, RunDb, StateError};
use crate::CoordinatorError;

const ROUND_KEY: &[u8] = b"retry_round";

/// What `requeue` did.
pub struct Requeued {
    /// The retry round (1 for the first `retry-failed` of a run).
    pub round: u32,
    /// The dead letters put back, as they were.
    pub jobs: Vec<DeadLetter>,
}

/// The dead letters of the run in `run_dir` (`<out>/<name>`).
pub fn list(run_dir: &Path) -> Result<Vec<DeadLetter>, CoordinatorError> {
    report::dead_letters(&RunDb::open_run(run_dir)?)
}

/// How many dead letters the run in `run_dir` has (for `halyard status`).
pub fn count(run_dir: &Path) -> Result<u64, CoordinatorError> {
    Ok(RunDb::open_run(run_dir)?.totals()?.dead_letters)
}

/// Put every dead letter of the run in `run_dir` back to be run again (see the module
/// docs); the next coordinator of the run publishes them.
pub fn requeue(run_dir: &Path) -> Result<Requeued, CoordinatorError> {
    let state = RunDb::open_run(run_dir)?;
    let jobs = report::dead_letters(&state)?;
    let spaces = &state.spaces;
    let last = spaces.meta.get(ROUND_KEY).map_err(StateError::from)?.map_or(0, |v| be_u32(&v));
    if jobs.is_empty() {
        return Ok(Requeued { round: last, jobs });
    }
    let round = last + 1;
    // One atomic, durable update: a crash leaves the run as it was or wholly re-queued,
    // never with results moved to the history while their items still count as finished.
    let mut batch = state.store().db().batch();
    for kv in halyard_store::records(&spaces.results) {
        let (job, raw) = kv.into_inner().map_err(StateError::from)?;
        let id = job_key(&job, "results")?;
        if !matches!(crate::state::decode_stored(&id, &raw)?.outcome, Outcome::Failed(_)) {
            continue;
        }
        let mut hkey = round.to_be_bytes().to_vec();
        hkey.extend_from_slice(&job);
        batch.insert(&spaces.history, hkey, raw);
        batch.remove(&spaces.results, job.clone());
        batch.insert(&spaces.retried, job, round.to_be_bytes());
    }
    for kv in halyard_store::records(&spaces.done) {
        batch.remove(&spaces.done, kv.key().map_err(StateError::from)?);
    }
    batch.insert(&spaces.meta, ROUND_KEY, round.to_be_bytes());
    state.store().commit_durable(batch).map_err(StateError::from)?;
    Ok(Requeued { round, jobs })
}

/// Jobs put back by `requeue`, with their round (read by the coordinator at start).
pub(crate) fn retried(state: &RunDb) -> Result<HashMap<JobId, u32>, StateError> {
    let mut out = HashMap::new();
    for kv in halyard_store::records(&state.spaces.retried) {
        let (k, v) = kv.into_inner()?;
        out.insert(job_key(&k, "retried")?, be_u32(&v));
    }
    Ok(out)
}

fn be_u32(v: &[u8]) -> u32 {
    v.try_into().map(u32::from_be_bytes).unwrap_or(0)
}

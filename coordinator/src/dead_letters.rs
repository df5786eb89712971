//! Dead letters of a finished or stopped run: listing, counting, and re-queueing them
//! (`halyard retry-failed RUN`).
//!
//! A dead letter is a job whose result is a failure: a permanent error (HTTP 400/401/…),
//! a transient one on its last allowed delivery, a job that crashed its workers
//! `max_deliver` times, or one lost from the queue three times. Each is recorded in the
//! run state with the job, its deliveries (attempts) and the last error, and listed in
//! the report.
//!
//! Re-queueing works on the run state while no coordinator has it open (sled's lock):
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
use sled::transaction::TransactionError;
use sled::Transactional;

use crate::report::{self, DeadLetter};
use crate::state::{RunState, StateError};
use crate::CoordinatorError;

const RETRIED: &str = "retried";
const HISTORY: &str = "dead_history";
const ROUND_KEY: &[u8] = b"retry_round";
/// Offset of retry rounds in job message ids (`<run>:<job>:r<100 + round>`), clear of the
/// stall check's rounds (1–3).
pub const MSG_ID_ROUND_BASE: u32 = 100;

/// What `requeue` did.
pub struct Requeued {
    /// The retry round (1 for the first `retry-failed` of a run).
    pub round: u32,
    /// The dead letters put back, as they were.
    pub jobs: Vec<DeadLetter>,
}

fn open(run_dir: &Path) -> Result<RunState, CoordinatorError> {
    let dir = run_dir.join("state");
    if !dir.is_dir() {
        return Err(StateError::Open {
            path: dir.display().to_string(),
            reason: "no run state here (not a run directory)".into(),
        }
        .into());
    }
    Ok(RunState::open(&dir)?)
}

/// The dead letters of the run in `run_dir` (`<out>/<name>`).
pub fn list(run_dir: &Path) -> Result<Vec<DeadLetter>, CoordinatorError> {
    report::dead_letters(&open(run_dir)?)
}

/// How many dead letters the run in `run_dir` has (for `halyard status`).
pub fn count(run_dir: &Path) -> Result<u64, CoordinatorError> {
    Ok(open(run_dir)?.totals()?.dead_letters)
}

/// Put every dead letter of the run in `run_dir` back to be run again (see the module
/// docs); the next coordinator of the run publishes them.
pub fn requeue(run_dir: &Path) -> Result<Requeued, CoordinatorError> {
    let state = open(run_dir)?;
    let jobs = report::dead_letters(&state)?;
    let db = state.db();
    let meta = db.open_tree("meta").map_err(StateError::from)?;
    let last = meta.get(ROUND_KEY).map_err(StateError::from)?.map(|v| be_u32(&v)).unwrap_or(0);
    if jobs.is_empty() {
        return Ok(Requeued { round: last, jobs });
    }
    let round = last + 1;
    let results = db.open_tree("results").map_err(StateError::from)?;
    let retried = db.open_tree(RETRIED).map_err(StateError::from)?;
    let history = db.open_tree(HISTORY).map_err(StateError::from)?;
    let done = db.open_tree("done").map_err(StateError::from)?;
    let mut failed = Vec::new();
    for r in state.results() {
        let (job, r) = r?;
        if matches!(r.outcome, Outcome::Failed(_)) {
            failed.push(job);
        }
    }
    let labelled: Vec<sled::IVec> =
        done.iter().keys().collect::<Result<_, _>>().map_err(StateError::from)?;
    // One atomic update: a crash leaves the run as it was or wholly re-queued, never with
    // results moved to the history while their items still count as finished.
    let res: Result<(), TransactionError<StateError>> = (
        &results, &retried, &history, &done, &meta,
    )
        .transaction(|(results, retried, history, done, meta)| {
            for job in &failed {
                let key = job.as_bytes();
                if let Some(raw) = results.remove(&key[..])? {
                    let mut hkey = round.to_be_bytes().to_vec();
                    hkey.extend_from_slice(key);
                    history.insert(hkey, raw)?;
                }
                retried.insert(&key[..], &round.to_be_bytes())?;
            }
            for k in &labelled {
                done.remove(k)?;
            }
            meta.insert(ROUND_KEY, &round.to_be_bytes())?;
            Ok(())
        });
    match res {
        Ok(()) => {}
        Err(TransactionError::Abort(e)) => return Err(e.into()),
        Err(TransactionError::Storage(e)) => return Err(StateError::from(e).into()),
    }
    db.flush().map_err(StateError::from)?;
    Ok(Requeued { round, jobs })
}

/// Jobs put back by `requeue`, with their round (read by the coordinator at start).
pub(crate) fn retried(state: &RunState) -> Result<HashMap<JobId, u32>, StateError> {
    let mut out = HashMap::new();
    for kv in state.db().open_tree(RETRIED)?.iter() {
        let (k, v) = kv?;
        let id = JobId::from_slice(&k).ok_or_else(|| StateError::Corrupt {
            what: "retried key".into(),
            reason: format!("{} bytes", k.len()),
        })?;
        out.insert(id, be_u32(&v));
    }
    Ok(out)
}

fn be_u32(v: &[u8]) -> u32 {
    v.try_into().map(u32::from_be_bytes).unwrap_or(0)
}

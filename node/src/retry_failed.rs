//! `halyard retry-failed RUN_DIR [--list]`: list a run's dead letters (job, stage,
//! model, attempts, last error) and put them back to be run again by the next
//! coordinator of the run (see `halyard_coordinator::dead_letters`).

use std::path::Path;

use halyard_coordinator::dead_letters;
use halyard_coordinator::report::DeadLetter;

use crate::NodeError;

/// One dead letter on one line.
pub fn show(d: &DeadLetter) -> String {
    let or_dash = |o: &Option<String>| o.clone().unwrap_or_else(|| "-".into());
    let status = d.http_status.map(|s| format!(" HTTP {s}")).unwrap_or_default();
    format!(
        "{}  stage {}  model {}  attempts {}  {}{}: {}",
        d.job,
        or_dash(&d.stage),
        or_dash(&d.model),
        d.deliveries,
        d.kind,
        status,
        d.error
    )
}

/// What `halyard retry-failed` prints: the dead letters of the run in `run` (with
/// `list`, nothing changes), else those re-queued for the run's next coordinator.
pub fn run(run: &Path, list: bool) -> Result<String, NodeError> {
    let context = || format!("run {} (is its coordinator still running?)", run.display());
    let mut out = String::new();
    if list {
        let dead =
            dead_letters::list(run).map_err(|e| NodeError::Coordinator(e).context(context()))?;
        out.push_str(&format!("{} dead letter(s) in {}\n", dead.len(), run.display()));
        for d in &dead {
            out.push_str(&format!("  {}\n", show(d)));
        }
        return Ok(out);
    }
    let r = dead_letters::requeue(run).map_err(|e| NodeError::Coordinator(e).context(context()))?;
    if r.jobs.is_empty() {
        return Ok(format!("no dead letters in {}; nothing to retry\n", run.display()));
    }
    out.push_str(&format!(
        "re-queued {} dead letter(s) (retry round {}):\n",
        r.jobs.len(),
        r.round
    ));
    for d in &r.jobs {
        out.push_str(&format!("  {}\n", show(d)));
    }
    out.push_str(
        "run the same `halyard run` or `halyard coordinator` command again to execute them\n",
    );
    Ok(out)
}

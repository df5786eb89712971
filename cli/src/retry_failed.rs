//! `halyard retry-failed RUN_DIR [--list]`: list a run's dead letters (job, stage,
//! model, attempts, last error) and put them back to be run again by the next
//! coordinator of the run (see `halyard_coordinator::dead_letters`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use halyard_coordinator::dead_letters;
use halyard_coordinator::report::DeadLetter;

#[derive(Args)]
pub struct RetryFailedArgs {
    /// The run directory (`<out>/<sweep name>`, holding `state/`).
    run: PathBuf,
    /// Only list the dead letters; change nothing.
    #[arg(long)]
    list: bool,
}

fn show(d: &DeadLetter) -> String {
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

pub fn run(a: RetryFailedArgs) -> Result<u8> {
    let context = || format!("run {} (is its coordinator still running?)", a.run.display());
    if a.list {
        let dead = dead_letters::list(&a.run).with_context(context)?;
        println!("{} dead letter(s) in {}", dead.len(), a.run.display());
        for d in &dead {
            println!("  {}", show(d));
        }
        return Ok(0);
    }
    let r = dead_letters::requeue(&a.run).with_context(context)?;
    if r.jobs.is_empty() {
        println!("no dead letters in {}; nothing to retry", a.run.display());
        return Ok(0);
    }
    println!("re-queued {} dead letter(s) (retry round {}):", r.jobs.len(), r.round);
    for d in &r.jobs {
        println!("  {}", show(d));
    }
    println!("run the same `halyard run` or `halyard coordinator` command again to execute them");
    Ok(0)
}

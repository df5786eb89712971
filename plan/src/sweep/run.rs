//! `[run]`: settings of the run itself (deliveries, ack wait, planning window, cost
//! limit, job batches).

use serde::Deserialize;

use super::error::{key_err, SweepError};

/// Largest `[run] job_batch` (a job message is also sent once its jobs take 256 KiB).
pub const MAX_JOB_BATCH: i64 = 256;
/// Default of `[run] window`.
pub const DEFAULT_WINDOW: usize = 4096;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRun {
    max_deliver: Option<i64>,
    ack_wait_s: Option<f64>,
    window: Option<i64>,
    max_cost: Option<f64>,
    job_batch: Option<RawJobBatch>,
    outage_patience_s: Option<f64>,
    first_contact_s: Option<f64>,
}

/// `job_batch = "auto"` or a number (anything else is refused with the key's name).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawJobBatch {
    Number(i64),
    Word(String),
    Other(toml::Value),
}

/// `[run] job_batch`: how many jobs a job message may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobBatch {
    /// The default: pools whose models run locally or call nothing (`noop`, `gguf`,
    /// `embed`, `replay`) get job messages of up to [`AUTO_MAX_JOB_BATCH`] jobs, sized
    /// by the pool's own pace so that a message holds about [`AUTO_BATCH_SPAN`] of the
    /// pool's work; pools of HTTP APIs (paid calls) one job per message.
    Auto,
    /// Up to this many jobs per message, for every pool.
    Fixed(usize),
}

/// Largest job message of `job_batch = "auto"`.
pub const AUTO_MAX_JOB_BATCH: usize = 64;
/// With `job_batch = "auto"`, a job message holds about this much of its pool's work:
/// long enough that a fast pool's messages carry many jobs, short enough that a slow
/// pool's jobs are not held by one worker while others idle.
pub const AUTO_BATCH_SPAN: std::time::Duration = std::time::Duration::from_millis(10);

/// Settings of the run itself.
#[derive(Clone, Debug)]
pub struct RunSettings {
    pub max_deliver: i64,
    pub ack_wait: std::time::Duration,
    /// Unfinished items the coordinator keeps planned at once, per benchmark and model
    /// under test; it plans more as they finish (`[run] window`).
    pub window: usize,
    /// `[run] max_cost` (USD): no new paid calls once the run has spent this much.
    pub max_cost: Option<f64>,
    /// `[run] job_batch`: jobs per job message (default `auto`). Above 1, the jobs planned
    /// together for a pool travel as one message: one publish, delivery and ack for up to
    /// this many jobs. See [`JobBatch`] and README "Job batches".
    pub job_batch: JobBatch,
    /// `[run] outage_patience_s` (default 6 h): a pool whose endpoint has been down this
    /// long stops the run as interrupted (resumable), rather than waiting forever.
    pub outage_patience: std::time::Duration,
    /// `[run] first_contact_s` (default 45 s): a pool with no result yet in the run
    /// (earlier results of a resumed run count) whose endpoint has failed this long stops
    /// the run with an error naming the fix (issue 48); `outage_patience` is for
    /// endpoints that did answer.
    pub first_contact: std::time::Duration,
}

/// Default of `[run] outage_patience_s`: six hours, an overnight outage's worth.
pub const DEFAULT_OUTAGE_PATIENCE_S: f64 = 6.0 * 3600.0;

/// Default of `[run] first_contact_s`.
pub const DEFAULT_FIRST_CONTACT_S: f64 = 45.0;

/// Check `[run]` (every key has a default).
pub(super) fn check(f: &str, raw: Option<RawRun>) -> Result<RunSettings, SweepError> {
    let rr = raw.unwrap_or_default();
    let max_deliver = rr.max_deliver.unwrap_or(5);
    if !(1..=100).contains(&max_deliver) {
        return Err(key_err(f, "run.max_deliver", format!("{max_deliver} is outside 1..=100")));
    }
    let ack_wait_s = rr.ack_wait_s.unwrap_or(30.0);
    if !(ack_wait_s.is_finite() && (1.0..=3600.0).contains(&ack_wait_s)) {
        return Err(key_err(
            f,
            "run.ack_wait_s",
            format!("{ack_wait_s} is outside 1..=3600 seconds"),
        ));
    }
    let window = rr.window.unwrap_or(DEFAULT_WINDOW as i64);
    if !(1..=1_000_000).contains(&window) {
        return Err(key_err(f, "run.window", format!("{window} is outside 1..=1000000")));
    }
    let job_batch = match rr.job_batch {
        None => JobBatch::Auto,
        Some(RawJobBatch::Word(w)) if w == "auto" => JobBatch::Auto,
        Some(RawJobBatch::Number(n)) if (1..=MAX_JOB_BATCH).contains(&n) => {
            JobBatch::Fixed(n as usize)
        }
        Some(RawJobBatch::Number(n)) => {
            return Err(key_err(f, "run.job_batch", format!("{n} is outside 1..={MAX_JOB_BATCH}")))
        }
        Some(RawJobBatch::Word(w)) => {
            return Err(key_err(
                f,
                "run.job_batch",
                format!("{w:?} is neither \"auto\" nor a number of jobs (1..={MAX_JOB_BATCH})"),
            ))
        }
        Some(RawJobBatch::Other(v)) => {
            return Err(key_err(
                f,
                "run.job_batch",
                format!("{v} is neither \"auto\" nor a number of jobs (1..={MAX_JOB_BATCH})"),
            ))
        }
    };
    let patience = rr.outage_patience_s.unwrap_or(DEFAULT_OUTAGE_PATIENCE_S);
    if !(patience.is_finite() && (1.0..=30.0 * 86_400.0).contains(&patience)) {
        return Err(key_err(
            f,
            "run.outage_patience_s",
            format!("{patience} is outside 1..=2592000 seconds (30 days)"),
        ));
    }
    let first_contact = rr.first_contact_s.unwrap_or(DEFAULT_FIRST_CONTACT_S);
    if !(first_contact.is_finite() && (1.0..=3600.0).contains(&first_contact)) {
        return Err(key_err(
            f,
            "run.first_contact_s",
            format!("{first_contact} is outside 1..=3600 seconds"),
        ));
    }
    if let Some(c) = rr.max_cost {
        if !(c.is_finite() && c >= 0.0) {
            return Err(key_err(f, "run.max_cost", format!("{c} is not an amount of USD (≥ 0)")));
        }
    }
    Ok(RunSettings {
        max_deliver,
        ack_wait: std::time::Duration::from_secs_f64(ack_wait_s),
        window: window as usize,
        max_cost: rr.max_cost,
        job_batch,
        outage_patience: std::time::Duration::from_secs_f64(patience),
        first_contact: std::time::Duration::from_secs_f64(first_contact),
    })
}

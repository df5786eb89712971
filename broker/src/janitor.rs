//! Room in the results stream (issue 49, item 2).
//!
//! Anyone holding a worker credential may publish on `halyard.results.<any run>.<its
//! pool>`; results of a run no coordinator takes stay in the stream, and the stream is
//! bounded ([`crate::RESULTS_MAX_BYTES`], discard `new`): once full, every worker's
//! publish is refused ("maximum bytes exceeded") and every run stops making progress.
//! Results of the run a coordinator takes are taken (junk among them is refused and
//! acked), so what fills the stream for good is what was published for runs nobody
//! takes. A coordinator whose run stops making progress looks ([`results_room`]); when
//! the stream is full it purges the results of every run that is neither its own nor
//! one the status bucket shows unfinished ([`purge_other_runs`]). Results of a finished
//! or unknown run are never needed: a run resumed later publishes its unanswered jobs
//! again and the workers answer them from their checkpoints, so nothing paid is lost.

use std::collections::HashSet;
use std::time::Duration;

use futures::TryStreamExt;
use halyard_proto::subjects;
use uuid::Uuid;

use crate::{Broker, BrokerError};

/// How full the results stream is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Room {
    pub bytes: u64,
    pub max_bytes: i64,
    pub messages: u64,
}

impl Room {
    /// No room for a result of `largest` bytes (the server's `max_payload`).
    pub fn full(&self, largest: usize) -> bool {
        self.max_bytes > 0 && self.bytes + 2 * largest as u64 >= self.max_bytes as u64
    }
}

/// The results stream's fill.
pub async fn results_room(b: &Broker) -> Result<Room, BrokerError> {
    let mut s =
        crate::retry_js("stream HALYARD_RESULTS", || b.js.get_stream(subjects::RESULTS_STREAM))
            .await?;
    let info = s.info().await.map_err(|e| BrokerError::js("stream HALYARD_RESULTS info", e))?;
    Ok(Room {
        bytes: info.state.bytes,
        max_bytes: info.config.max_bytes,
        messages: info.state.messages,
    })
}

/// Runs the status bucket shows unfinished (`running`, `interrupted`, `cost_limit`):
/// their results may still be taken by a coordinator. Only coordinators write it.
pub async fn unfinished_runs(b: &Broker) -> Result<HashSet<Uuid>, BrokerError> {
    let mut out = HashSet::new();
    for (_, v) in crate::status::entries(b, crate::layout::STATUS_BUCKET).await? {
        let Ok(s) = serde_json::from_slice::<serde_json::Value>(&v) else { continue };
        if s["state"].as_str() == Some("complete") {
            continue;
        }
        if let Some(run) = s["run"].as_str().and_then(|r| Uuid::try_parse(r).ok()) {
            out.insert(run);
        }
    }
    Ok(out)
}

/// Distinct runs purged at most per call (each is one request).
const MAX_PURGES: usize = 100_000;
/// How long one call may take.
const PATIENCE: Duration = Duration::from_secs(120);

/// What [`purge_other_runs`] removed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Purged {
    pub runs: u64,
    pub messages: u64,
}

/// Purge the results stream of every subject whose run is not in `keep` (a subject that
/// names no run at all included).
pub async fn purge_other_runs(b: &Broker, keep: &HashSet<Uuid>) -> Result<Purged, BrokerError> {
    let s = crate::retry_js("stream HALYARD_RESULTS", || b.js.get_stream(subjects::RESULTS_STREAM))
        .await?;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut foreign: Vec<String> = Vec::new();
    let mut seen = HashSet::new();
    {
        let mut listed = s
            .info_with_subjects(format!("{}.>", subjects::RESULTS_PREFIX))
            .await
            .map_err(|e| BrokerError::js("list the results stream's subjects", e))?;
        while let Some((subject, _)) = listed
            .try_next()
            .await
            .map_err(|e| BrokerError::js("list the results stream's subjects", e))?
        {
            let run_token = subject
                .strip_prefix(subjects::RESULTS_PREFIX)
                .and_then(|r| r.strip_prefix('.'))
                .and_then(|r| r.split('.').next())
                .unwrap_or_default()
                .to_string();
            let run = Uuid::try_parse(&run_token).ok();
            if run.is_some_and(|r| keep.contains(&r)) {
                continue;
            }
            // A run's pool subjects at once; anything else (no run, or a run's bare
            // subject of builds before pools were in it) by itself.
            let filter = match run {
                Some(_) if subject.split('.').count() == 4 => {
                    format!("{}.{run_token}.>", subjects::RESULTS_PREFIX)
                }
                _ => subject,
            };
            if seen.insert(filter.clone()) {
                foreign.push(filter);
            }
            if foreign.len() >= MAX_PURGES || tokio::time::Instant::now() > deadline {
                break;
            }
        }
    }
    let mut purged = Purged::default();
    for filter in foreign {
        if tokio::time::Instant::now() > deadline {
            break;
        }
        let r = s
            .purge()
            .filter(filter.as_str())
            .await
            .map_err(|e| BrokerError::js(format!("purge {filter} from HALYARD_RESULTS"), e))?;
        purged.runs += 1;
        purged.messages += r.purged;
    }
    Ok(purged)
}

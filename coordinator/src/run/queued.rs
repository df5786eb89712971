//! Before a restarted coordinator publishes its held-back jobs: the jobs of its run that
//! are still in the job stream (queued, or delivered and not yet acked).
//!
//! Why: a job published again would reach a second worker if the stream kept its first
//! message. JetStream drops a copy whose `Nats-Msg-Id` it remembers, but it remembers
//! only for its de-duplication window (and not across a broker restart for messages no
//! longer stored), and a job batched by the earlier process travels in a message whose
//! id hashes all its jobs: grouped differently now (results arrive in another order,
//! `job_batch = "auto"` sizes messages by pace), the copy has another id. So the jobs
//! still in the stream are read first, by sequence, as the backlog is, and only the
//! planned jobs not among them are published. This read comes before the backlog's
//! (`backlog`): a job acked after it has had its result published before the ack, so the
//! backlog, read later, finds that result; a job missing from both was lost and is
//! published. Jobs whose message stays in the stream but is never delivered again
//! (`max_deliver` reached while no coordinator listened) are found by the stall check.

use std::collections::HashMap;

use async_nats::jetstream::stream::RawMessageErrorKind;
use halyard_broker::{objects, Broker};
use halyard_proto::batch::JobItem;
use halyard_proto::{subjects, Job, JobId};
use tracing::{info, warn};
use uuid::Uuid;

/// The jobs of run `run` held by the job stream on the subjects of `pools`, as they are
/// there. A message that cannot be read now (the broker, its object) is skipped: its
/// jobs are then published again, as before this check existed (a copy of a lone job is
/// still dropped by the stream's de-duplication).
pub(super) async fn in_stream<'p>(
    broker: &Broker,
    run: Uuid,
    pools: impl IntoIterator<Item = &'p String>,
) -> HashMap<JobId, Job> {
    let mut queued = HashMap::new();
    let stream = match broker.js.get_stream(subjects::JOBS_STREAM).await {
        Ok(s) => s,
        Err(err) => {
            warn!(error = %err, "cannot read the job stream before publishing; publishing every unanswered job");
            return queued;
        }
    };
    let mut messages = 0usize;
    for pool in pools {
        let subject = subjects::job_subject(pool);
        let mut seq = 1u64;
        loop {
            let m = match stream.get_first_raw_message_by_subject(&subject, seq).await {
                Ok(m) => m,
                Err(err) if err.kind() == RawMessageErrorKind::NoMessageFound => break,
                Err(err) => {
                    warn!(pool, error = %err, "cannot read the job stream before publishing; publishing the jobs not read");
                    break;
                }
            };
            seq = m.sequence + 1;
            messages += 1;
            let payload =
                match objects::payload_of(broker, Some(&m.headers), &m.payload, Some(run)).await {
                    Ok(p) => p,
                    // Another run's object, or one unreadable now: not this run's queue.
                    Err(_) => continue,
                };
            // Read item by item, as a worker reads the message (a bad item costs only
            // itself: the worker runs the others). Anything that is not a job of this run
            // (another run's, a stranger's) is not ours to skip.
            for item in halyard_proto::batch::decode_job_items(&payload) {
                if let JobItem::Job(j) = item {
                    if j.run == run && j.pool == *pool {
                        queued.insert(j.id, j);
                    }
                }
            }
        }
    }
    if !queued.is_empty() {
        info!(
            jobs = queued.len(),
            messages, "jobs of this run still in the job stream; left there, not sent again"
        );
    }
    queued
}

/// `job` is still in the stream exactly as planned (the same job, not merely its id:
/// a message anybody could have published proves nothing about a job it misdescribes).
pub(super) fn holds(queued: &HashMap<JobId, Job>, job: &Job) -> bool {
    queued.get(&job.id) == Some(job)
}

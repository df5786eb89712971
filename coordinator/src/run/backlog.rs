//! Step 3 of recovery: before a (re)started coordinator publishes anything, it takes in
//! every result already waiting in its results stream.
//!
//! Why: a job that a worker finished while no coordinator was listening has been acked,
//! so it is gone from the job stream, and its result waits unread. Publishing first would
//! publish that job again; JetStream drops the copy only if it still remembers the
//! message id, which it does not after a broker restart (its de-duplication memory is
//! rebuilt from the messages still stored). The copy could then reach a worker without
//! that job in its checkpoint: a paid call made twice. So the window is planned first
//! (step 2) with its publishes held back, the backlog is read into it (results stored,
//! counted against the model and stage of the job that was planned, the items they
//! finish re-planned), and only then are the held-back jobs that are still unanswered
//! published. (Measured by `cli/tests/chaos.rs`: without reading the backlog first,
//! coordinator kills after a broker restart or a cluster leader change cost hundreds of
//! repeated calls in 5,000 jobs. Before the window was planned first, the backlog's
//! results were counted as "(unattributed)", without their model's price.)

use std::time::Instant;

use async_nats::jetstream::stream::RawMessageErrorKind;
use halyard_broker::Broker;
use halyard_proto::{subjects, Job};
use tracing::{info, warn};

use super::collector::{decode_results, open_payload, Opened};
use super::planner::{Event, Planner};
use crate::state::RunDb;
use crate::CoordinatorError;
use halyard_plan::store::RunStore;

/// Store every result of this run still held by the results stream, without acking,
/// each message's effects as one commit; the jobs it plans (with their rounds) are
/// appended to `held`, for the caller to publish. Read by sequence (the stream's message-get API, next message on
/// this run's subject), not through the run's consumer: results that a killed coordinator
/// had pulled but not acked stay invisible to the consumer until their `ack_wait`
/// passes, and those are exactly the ones that matter here. The consumer delivers
/// them again later; they are then recognised as duplicates and acked.
pub(super) async fn absorb(
    broker: &Broker,
    planner: &mut Planner<'_, RunDb>,
    held: &mut Vec<(Job, Option<u32>)>,
) -> Result<(), CoordinatorError> {
    let stream = match broker.js.get_stream(subjects::RESULTS_STREAM).await {
        Ok(s) => s,
        Err(err) => {
            warn!(error = %err, "cannot read queued results before publishing; publishing without them");
            return Ok(());
        }
    };
    let run = planner.run();
    let subject = subjects::run_results_filter(run);
    let now = Instant::now();
    let (mut seq, mut total) = (1u64, 0usize);
    // Results refused here are refused again, and counted, when the consumer delivers
    // their messages: not counted twice.
    let refused_before = planner.refused_results();
    loop {
        let m = match stream.get_first_raw_message_by_subject(&subject, seq).await {
            Ok(m) => m,
            Err(err) if err.kind() == RawMessageErrorKind::NoMessageFound => break,
            Err(err) => {
                warn!(error = %err, "cannot read queued results before publishing; publishing with what was read");
                break;
            }
        };
        seq = m.sequence + 1;
        // A message naming an object that cannot be read now is taken later, through the
        // consumer.
        let Opened::Bytes(payload) = open_payload(broker, run, Some(&m.headers), &m.payload).await
        else {
            continue;
        };
        // A refused message is counted when the consumer delivers it.
        let (arrived, _refused) = decode_results(run, &m.subject, &payload);
        total += arrived.len();
        let effects = planner.step(Event::Results(arrived), now)?;
        planner.store_mut().commit(&effects)?;
        held.extend(super::planner::publishes(effects));
    }
    planner.set_refused_results(refused_before);
    if let Some(e) = planner.intake_effect() {
        planner.store_mut().commit(&[e])?;
    }
    planner.store().flush().await?;
    if total > 0 {
        info!(results = total, "read results that arrived while no coordinator ran");
    }
    Ok(())
}

//! Step 2 of recovery: before a (re)started coordinator plans and publishes anything, it
//! takes in every result already waiting in its results stream.
//!
//! Why: a job that a worker finished while no coordinator was listening has been acked,
//! so it is gone from the job stream, and its result waits unread. Planning first would
//! publish that job again; JetStream drops the copy only if it still remembers the
//! message id, which it does not after a broker restart (its de-duplication memory is
//! rebuilt from the messages still stored). The copy could then reach a worker without
//! that job in its checkpoint: a paid call made twice. Reading the backlog first makes
//! the planner see those results, so nothing finished is published again.

use std::collections::HashMap;

use halyard_proto::{JobId, JobResult, Outcome};
use std::time::Instant;
use tracing::{debug, info, warn};

use super::Engine;
use crate::CoordinatorError;

/// Results per pull while reading the backlog.
const BATCH: usize = 2048;

impl Engine {
    /// Store (and ack, once flushed) every result queued for this run, without planning.
    pub(super) async fn absorb_backlog(&mut self, consumer: &halyard_broker::PullConsumer) -> Result<(), CoordinatorError> {
        let mut total = 0usize;
        loop {
            let batch = match consumer.fetch().max_messages(BATCH).messages().await {
                Ok(b) => b,
                Err(err) => {
                    warn!(error = %err, "cannot read queued results before planning; planning without them");
                    return Ok(());
                }
            };
            let msgs: Vec<_> = futures::StreamExt::collect::<Vec<_>>(batch).await.into_iter().filter_map(Result::ok).collect();
            if msgs.is_empty() {
                break;
            }
            let now = Instant::now();
            let (mut affected, mut fresh): (Vec<_>, HashMap<JobId, Outcome>) = (Vec::new(), HashMap::new());
            for m in &msgs {
                match halyard_proto::decode::<JobResult>("result", &m.payload) {
                    Ok(r) if r.run == self.run => {
                        let new = self.state.insert_result_raw(&r.job, &m.payload)?;
                        self.account(r, new, now, &mut affected, &mut fresh);
                    }
                    Ok(r) => debug!(run = %r.run, "result for another run; ignoring"),
                    Err(err) => warn!(error = %err, "undecodable result message; dropping it"),
                }
            }
            // Durable before acked.
            self.state.flush().await?;
            for m in &msgs {
                if let Err(err) = m.ack().await {
                    debug!(error = %err, "result ack failed; it will be redelivered and recognised as a duplicate");
                }
            }
            total += msgs.len();
        }
        if total > 0 {
            info!(results = total, "read results that arrived while no coordinator ran");
        }
        Ok(())
    }
}

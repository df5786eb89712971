//! The stall check: no result for a while, and the broker holds nothing pending or in
//! flight for the pools of the outstanding jobs. Those jobs were lost (the stream was
//! purged, a publish never stored, or they were stranded after `max_deliver` while no
//! coordinator listened): they are published again under a fresh message id, and after
//! three rounds declared dead letters.

use std::collections::HashSet;
use std::time::Duration;

use halyard_broker::Broker;
use halyard_proto::{subjects, Job};
use tracing::warn;

use super::dispatcher::Dispatcher;
use super::planner::Planner;
use crate::state::RunDb;
use crate::CoordinatorError;
use halyard_plan::store::RunStore;

/// Rounds of re-publication before outstanding jobs are declared lost.
const ROUNDS: u32 = 3;

pub(super) struct Stall {
    broker: Broker,
    rounds: Rounds,
    /// No result for this long is a possible stall: twice `ack_wait`, at least 20 s.
    pub after: Duration,
}

/// Re-publication rounds: each has a fresh message-id suffix, and only jobs lost
/// [`ROUNDS`] times in a row (no result in between) are given up; a run that makes
/// progress between two incidents starts the count again.
#[derive(Debug, Default)]
struct Rounds {
    /// The last round's message-id suffix.
    round: u32,
    /// Rounds since the last result.
    unanswered: u32,
}

impl Rounds {
    /// The next round's suffix, or None when the jobs are to be given up. Suffixes stay
    /// below retry-failed's (MSG_ID_ROUND_BASE and up); one reused after 99 rounds is
    /// far outside the broker's de-duplication window.
    fn next(&mut self) -> Option<u32> {
        self.round = self.round % (halyard_plan::planner::MSG_ID_ROUND_BASE - 1) + 1;
        self.unanswered += 1;
        (self.unanswered <= ROUNDS).then_some(self.round)
    }
}

impl Stall {
    pub fn new(broker: Broker, ack_wait: Duration) -> Stall {
        Stall {
            broker,
            rounds: Rounds::default(),
            after: (ack_wait * 2).max(Duration::from_secs(20)),
        }
    }

    /// Results arrived: the rounds without an answer start again from zero.
    pub fn progressed(&mut self) {
        self.rounds.unanswered = 0;
    }

    /// Check for a stall (see the module docs). Jobs re-published go out through
    /// `dispatcher`; jobs lost for good are returned, to be recorded as dead letters.
    pub async fn check(
        &mut self,
        planner: &mut Planner<'_, RunDb>,
        dispatcher: &mut Dispatcher,
    ) -> Result<Option<Vec<Job>>, CoordinatorError> {
        if planner.outstanding() == 0 {
            return Ok(None);
        }
        // Publishes not yet decided (sent again under their own ids for about 20 s), or
        // one left undecided within this wait: not a stall yet, so that no job goes out
        // under two ids. The next check is a wait later.
        dispatcher.reap_ready().await;
        if dispatcher.settling(self.after) {
            return Ok(None);
        }
        self.make_results_room(planner.run()).await?;
        let (jobs, notes) = planner.outstanding_jobs()?;
        planner.store_mut().commit(&notes)?;
        if let Some(why) = stuck(planner.outstanding(), jobs.len()) {
            return Err(CoordinatorError::Stuck(why));
        }
        let pools: HashSet<String> = jobs.iter().map(|j| j.pool.clone()).collect();
        let Ok(stream) = self.broker.js.get_stream(subjects::JOBS_STREAM).await else {
            return Ok(None);
        };
        for pool in &pools {
            let name = subjects::pool_consumer(pool);
            match stream.consumer_info(&name).await {
                Ok(info) if info.num_pending == 0 && info.num_ack_pending == 0 => {}
                Ok(_) => return Ok(None), // work is queued or in flight: not a stall
                Err(_) => return Ok(None), // no consumer yet: no worker has joined; jobs wait in the stream
            }
        }
        let Some(round) = self.rounds.next() else {
            warn!(
                jobs = jobs.len(),
                "outstanding jobs vanished three times; recording them as dead letters"
            );
            return Ok(Some(jobs));
        };
        warn!(
            jobs = jobs.len(),
            round, "no pending work on the broker for outstanding jobs; publishing them again"
        );
        for job in &jobs {
            dispatcher.send(job, Some(round)).await;
        }
        dispatcher.drain().await;
        Ok(None)
    }
}

impl Stall {
    /// A run without results may be one whose workers cannot publish them: the results
    /// stream is full (issue 49, item 2: anyone with a worker credential can fill it
    /// with results of a run nobody takes). Then the results of every run that is not
    /// this one nor unfinished in the status bucket are purged
    /// ([`halyard_broker::janitor`]); a stream still full after that stops the run with
    /// an error naming the stream and what to do.
    async fn make_results_room(&self, run: uuid::Uuid) -> Result<(), CoordinatorError> {
        use halyard_broker::janitor;
        let largest = self.broker.payload_limit() + halyard_broker::HEADER_ROOM;
        let room = match janitor::results_room(&self.broker).await {
            Ok(r) if r.full(largest) => r,
            Ok(_) => return Ok(()),
            Err(e) => {
                warn!(error = %e, "cannot read the results stream's fill");
                return Ok(());
            }
        };
        let mut keep = janitor::unfinished_runs(&self.broker).await?;
        keep.insert(run);
        warn!(
            bytes = room.bytes,
            max_bytes = room.max_bytes,
            "the results stream {} is full: workers cannot publish results; purging the \
             results of runs that are neither this one nor unfinished",
            subjects::RESULTS_STREAM
        );
        let purged = janitor::purge_other_runs(&self.broker, &keep).await?;
        let after = janitor::results_room(&self.broker).await?;
        warn!(
            runs = purged.runs,
            messages = purged.messages,
            bytes = after.bytes,
            "purged the results of other runs from {}",
            subjects::RESULTS_STREAM
        );
        if after.full(largest) {
            return Err(CoordinatorError::Stuck(format!(
                "the results stream {stream} is full ({} of {} bytes) with results of this run \
                 and of unfinished runs: workers cannot publish results. Raise its limit \
                 (nats stream edit {stream} --max-bytes N), or finish or purge the other runs \
                 (nats stream purge {stream} --subject 'halyard.results.<run>.>'), then resume",
                after.bytes,
                after.max_bytes,
                stream = subjects::RESULTS_STREAM
            )));
        }
        Ok(())
    }
}

/// Why a run whose window counts `outstanding` jobs, of which `publishable` are needed
/// by an unfinished item, can no longer progress: re-publishing cannot answer jobs that
/// nothing would publish, and giving them up as dead letters leaves the count where it
/// was, so the stall check would otherwise log its round once a minute for ever.
fn stuck(outstanding: usize, publishable: usize) -> Option<String> {
    (outstanding > 0 && publishable == 0).then(|| {
        format!(
            "{outstanding} jobs are counted as waited on, but no unfinished item needs any of them and the broker \
             holds no work for them. Stop the coordinator and start it again: a resumed run plans every unfinished \
             item afresh from its stored results. If it stops here again, its run state is inconsistent: move the \
             run's state/ directory away and run the sweep again"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 50, item 5: a window waiting on jobs that no unfinished item needs (what a
    /// run state that lost records left: "no pending work on the broker" once a minute)
    /// is an error saying what to do; a window whose jobs can be published again is not.
    #[test]
    fn waiting_on_jobs_nothing_needs_is_stuck() {
        let e = stuck(200, 0).expect("stuck");
        assert!(e.contains("200 jobs") && e.contains("start it again"), "{e}");
        assert_eq!(stuck(200, 3), None);
        assert_eq!(stuck(0, 0), None);
    }

    /// Three rounds without a result give up on the fourth; a result in between starts
    /// the count again, while suffixes keep advancing (fresh message ids) and wrap below
    /// retry-failed's.
    #[test]
    fn rounds_reset_on_progress_and_ids_stay_fresh() {
        let mut r = Rounds::default();
        assert_eq!([r.next(), r.next(), r.next(), r.next()], [Some(1), Some(2), Some(3), None]);
        let mut r = Rounds::default();
        assert_eq!((r.next(), r.next()), (Some(1), Some(2)));
        r.unanswered = 0; // what Stall::progressed does
        assert_eq!([r.next(), r.next(), r.next(), r.next()], [Some(3), Some(4), Some(5), None]);
        let mut r = Rounds { round: halyard_plan::planner::MSG_ID_ROUND_BASE - 1, unanswered: 0 };
        assert_eq!(r.next(), Some(1));
    }
}

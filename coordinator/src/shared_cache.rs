//! The coordinator's side of the shared result cache (issue 51, `halyard_cache::shared`):
//! every result it accepted for a job it planned, from a pool whose models all write to
//! the cache, is offered to the broker's `halyard_cache` bucket. Only the coordinator role
//! writes that bucket; workers read it.
//!
//! What is still to share is on disk, not only in memory: the run state marks each such
//! completion (`share`, [`crate::state::ShareMarks`]) in the batch that stores it, so
//! before the results that carried it are acked, and the mark goes once the bucket holds
//! an answer for the job.
//! A coordinator killed with shares queued or in flight loses none of them: the next
//! coordinator of the run shares what is still marked, as it starts.
//!
//! Offers go through a bounded channel to one task ([`Sharer`]), which opens the bucket
//! (creating it if missing) and puts the entries, up to [`IN_FLIGHT`] at once (each put
//! is a broker round trip; one at a time, a fast sweep's results outran them). A full
//! channel does not hold the run's results path up: the offer is left to its mark, and the
//! marks are read again when the run ends. A result a worker read from the shared cache is
//! not offered again: the bucket has it; its use is counted instead (the entry is written
//! again, unchanged, when it is older than [`halyard_cache::shared::REFRESH_AFTER`], so
//! that a full bucket drops unused entries first), best effort, without a mark.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures::{FutureExt, StreamExt};

use halyard_broker::Broker;
use halyard_cache::shared::SharedWriter;
use halyard_plan::sweep::Sweep;
use halyard_proto::{Completion, JobId};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::state::ShareMarks;

const QUEUE: usize = 8192;
/// Puts awaiting the broker's answer at once: with 32, a million noop results (25,000 a
/// second) still overflowed the queue (27% not shared); with 256, none did.
const IN_FLIGHT: usize = 256;
/// Marks read from the run state at a time, and marks removed in one batch.
const CHUNK: usize = 256;
/// How long a task told to stop may take to remove the marks of what landed.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// Whether this process's coordinators share their results (off unless the process says
/// so: `halyard coordinator`, and `halyard run --nats`, whose broker other runs share; a
/// private broker's bucket would serve nobody else).
static SHARING: AtomicBool = AtomicBool::new(false);

/// Turn sharing on or off for the coordinators this process runs from now on.
pub fn set_sharing(on: bool) {
    SHARING.store(on, Ordering::Relaxed);
}

/// Whether sharing is on ([`set_sharing`]).
pub fn sharing() -> bool {
    SHARING.load(Ordering::Relaxed)
}

/// Handle to the sharing task. Dropped without [`Sharer::close`] (a run stopped or
/// failed), it stops the task at once: what the task had not shared stays marked.
pub(crate) struct Sharer {
    tx: Option<mpsc::Sender<Offer>>,
    task: Option<JoinHandle<()>>,
    /// Tells the task to stop waiting for its puts in flight: it then removes the marks
    /// of those that landed, and ends.
    stop: Option<oneshot::Sender<()>>,
    marks: ShareMarks,
    /// Offers left to their marks because the queue was full.
    deferred: AtomicU64,
}

/// The pools of `sweep` whose results are shared: those whose every model writes to the
/// cache.
pub(crate) fn pools(sweep: &Sweep) -> HashSet<String> {
    let mut pools: HashSet<String> = sweep.models.iter().map(|m| m.spec.pool.clone()).collect();
    for m in &sweep.models {
        if !m.cache.writes() {
            pools.remove(&m.spec.pool);
        }
    }
    pools
}

/// What the sharing task is given.
#[derive(Clone, Copy, Debug)]
enum Offer {
    /// A marked completion, to put.
    Marked(JobId),
    /// A job answered from the bucket: its entry's use is counted
    /// ([`SharedWriter::refresh`]).
    Used(JobId),
}

impl Sharer {
    /// Start sharing `run`'s marked completions: first what an earlier coordinator of the
    /// run left marked, then what is offered.
    pub(crate) fn start(broker: Broker, run: Uuid, marks: ShareMarks) -> Sharer {
        let (tx, rx) = mpsc::channel::<Offer>(QUEUE);
        let (stop, stopped) = oneshot::channel();
        let refresh_after = halyard_cache::shared::REFRESH_AFTER;
        let task = tokio::spawn(share(broker, run, rx, stopped, marks.clone(), refresh_after));
        Sharer {
            tx: Some(tx),
            task: Some(task),
            stop: Some(stop),
            marks,
            deferred: AtomicU64::new(0),
        }
    }

    /// Offer the accepted completions of `jobs`, marked in the run state as they were
    /// stored ([`crate::state::RunDb::share_pools`]); the task reads them back. A full
    /// queue leaves them to their marks, never waited for.
    pub(crate) fn offer(&self, jobs: Vec<JobId>) {
        let Some(tx) = &self.tx else { return };
        for job in jobs {
            match tx.try_send(Offer::Marked(job)) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    if self.deferred.fetch_add(1, Ordering::Relaxed) == 0 {
                        tracing::info!("results arrive faster than the shared result cache takes them: the rest are shared from the run state when the run ends (said once)");
                    }
                }
                // The task could not open the bucket (said then): the marks stay.
                Err(mpsc::error::TrySendError::Closed(_)) => return,
            }
        }
    }

    /// Count the use of the bucket's entries for `jobs`, answered from it. Best effort:
    /// they take at most half the queue, so that a run answered mostly from the bucket
    /// never defers the completions it has to share; the rest are skipped.
    pub(crate) fn used(&self, jobs: Vec<JobId>) {
        let Some(tx) = &self.tx else { return };
        for job in jobs {
            if tx.capacity() <= QUEUE / 2 || tx.try_send(Offer::Used(job)).is_err() {
                return;
            }
        }
    }

    /// Share what is queued and what is still marked (for at most `within`), then stop.
    /// What is left stays marked, for a coordinator started on the run again: how many
    /// (`None` if they cannot be counted). Puts still in flight then are counted (they may
    /// land later: the next coordinator's put of the same entry changes nothing); those
    /// that landed are not.
    pub(crate) async fn close(mut self, within: Duration) -> Option<u64> {
        drop(self.tx.take());
        if let Some(task) = self.task.take() {
            self.finish(task, within).await;
        }
        match self.marks.count() {
            Ok(0) => Some(0),
            Ok(left) => {
                tracing::warn!(left, "accepted results not in the shared result cache yet: the run state keeps them marked, and a coordinator started on this run again (`halyard run` of the sweep) shares them");
                Some(left as u64)
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot count the accepted results not yet shared");
                None
            }
        }
    }

    /// Let the sharing task end by itself for at most `within`, then tell it to stop (it
    /// removes the marks of what landed), and end it if it has not within [`STOP_WAIT`].
    async fn finish(&mut self, mut task: tokio::task::JoinHandle<()>, within: Duration) {
        let deferred = self.deferred.load(Ordering::Relaxed);
        if deferred > 0 {
            tracing::info!(
                deferred,
                "accepted results the queue had no room for are shared from the run state now"
            );
        }
        // Puts that stall for a test (the failpoint) are not waited for long.
        let within = if failpoint::stalls() { within.min(Duration::from_secs(2)) } else { within };
        if tokio::time::timeout(within, &mut task).await.is_ok() {
            return;
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if tokio::time::timeout(STOP_WAIT, &mut task).await.is_err() {
            task.abort();
            // Its removals end before the run state is compacted.
            let _ = task.await;
        }
    }
}

impl Drop for Sharer {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// A test's crash point: with `HALYARD_COORDINATOR_FAILPOINT=share:<n>`, no put to the
/// shared cache ever ends, and the process aborts once the n-th batch of results is
/// acked (accepted, marked and acked, not shared); with `share:<n>:<k>`, the first k puts
/// land and the others never end. Read once.
pub(crate) mod failpoint {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    /// The batch to abort at, and how many puts land.
    fn armed() -> Option<(u64, u64)> {
        static ARMED: OnceLock<Option<(u64, u64)>> = OnceLock::new();
        *ARMED.get_or_init(|| {
            let v = std::env::var("HALYARD_COORDINATOR_FAILPOINT").ok()?;
            let mut fields = v.strip_prefix("share:")?.split(':');
            let n = fields.next()?.parse().ok()?;
            let k = fields.next().map_or(Some(0), |k| k.parse().ok())?;
            Some((n, k))
        })
    }

    /// Whether puts may wait for ever (`share:<n>`; `share:0` never aborts: the run
    /// completes with its results unshared).
    pub(super) fn stalls() -> bool {
        armed().is_some()
    }

    /// Whether this put waits for ever: all but the first k.
    pub(super) fn stalls_put() -> bool {
        static PUTS: AtomicU64 = AtomicU64::new(0);
        armed().is_some_and(|(_, k)| PUTS.fetch_add(1, Ordering::Relaxed) >= k)
    }

    /// A batch of results was acked.
    pub(crate) fn acked() {
        static BATCHES: AtomicU64 = AtomicU64::new(0);
        if let Some((n, _)) = armed() {
            if BATCHES.fetch_add(1, Ordering::Relaxed) + 1 == n {
                eprintln!("HALYARD_COORDINATOR_FAILPOINT: aborting with acked results not shared");
                std::process::abort();
            }
        }
    }
}

/// The completion to put for the marked `job`; `Err(job)` for a mark with nothing to
/// share (its result is not a completion, or came from the shared cache, or cannot be
/// read).
fn to_share(marks: &ShareMarks, job: JobId) -> Result<(JobId, Completion), JobId> {
    match marks.completion(&job) {
        Ok(Some(c)) => Ok((job, c)),
        Ok(None) => Err(job),
        Err(e) => {
            tracing::warn!(job = %job, error = %e, "cannot read a result marked for the shared cache; not shared");
            Err(job)
        }
    }
}

/// Marks read in chunks, from the first on: what an earlier coordinator left, or what
/// the queue had no room for.
struct Backlog {
    marks: ShareMarks,
    chunk: std::vec::IntoIter<JobId>,
    cursor: Option<JobId>,
    done: bool,
}

impl Backlog {
    fn new(marks: ShareMarks) -> Backlog {
        Backlog { marks, chunk: Vec::new().into_iter(), cursor: None, done: false }
    }

    /// The next marked job and its completion ([`to_share`]).
    fn next(&mut self) -> Option<Result<(JobId, Completion), JobId>> {
        loop {
            if let Some(job) = self.chunk.next() {
                return Some(to_share(&self.marks, job));
            }
            if self.done {
                return None;
            }
            match self.marks.after(self.cursor, CHUNK) {
                Ok(ids) => {
                    self.done = ids.len() < CHUNK;
                    self.cursor = ids.last().copied().or(self.cursor);
                    self.chunk = ids.into_iter();
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the results marked for the shared cache; they are shared later");
                    self.done = true;
                }
            }
        }
    }
}

/// The sharing task: puts what earlier coordinators left marked and what is offered, up
/// to [`IN_FLIGHT`] at once; once the offers end, what is still marked; removes the marks
/// of what the bucket holds, [`CHUNK`] at a time, and all it has not removed yet when it
/// ends, also when told to `stop` (or when its [`Sharer`] is gone) with puts in flight.
/// Entries used by the run are refreshed when older than `refresh_after`.
async fn share(
    broker: Broker,
    run: Uuid,
    mut rx: mpsc::Receiver<Offer>,
    mut stop: oneshot::Receiver<()>,
    marks: ShareMarks,
    refresh_after: Duration,
) {
    let writer = match SharedWriter::open(&broker).await {
        Ok(w) => w.refresh_after(refresh_after),
        Err(e) => {
            tracing::warn!(error = %e, "the shared result cache cannot be used; accepted results stay marked in the run state");
            return;
        }
    };
    // A put, or (no completion) the refresh of a used entry; `(job, whether its mark
    // goes)`: a put that landed; a refresh has no mark.
    let put = |job: JobId, c: Option<Completion>| {
        let w = writer.clone();
        async move {
            let Some(c) = c else {
                w.refresh(job, refresh_after).await;
                return (job, false);
            };
            if failpoint::stalls_put() {
                std::future::pending::<()>().await;
            }
            (job, w.put(run, job, &c).await)
        }
    };
    let mut settled: Vec<JobId> = Vec::new();
    let unmark = |settled: &mut Vec<JobId>| {
        if let Err(e) = marks.unmark(settled) {
            tracing::warn!(error = %e, "cannot remove marks of shared results; they are offered again later");
        }
        settled.clear();
    };
    let mut puts = futures::stream::FuturesUnordered::new();
    let mut backlog = Some(Backlog::new(marks.clone()));
    let (mut open, mut rescanned) = (true, false);
    loop {
        // The marks first, while there is room.
        while puts.len() < IN_FLIGHT {
            match backlog.as_mut().and_then(Backlog::next) {
                Some(Ok((job, c))) => puts.push(put(job, Some(c))),
                Some(Err(job)) => settled.push(job),
                None => {
                    backlog = None;
                    break;
                }
            }
        }
        if settled.len() >= CHUNK {
            unmark(&mut settled);
        }
        if !open && puts.is_empty() && backlog.is_none() {
            if rescanned {
                break;
            }
            // The offers have ended: what is still marked was deferred, or refused.
            unmark(&mut settled);
            rescanned = true;
            backlog = Some(Backlog::new(marks.clone()));
            continue;
        }
        tokio::select! {
            // Told to stop, or the Sharer is gone: the puts in flight are left to their marks.
            _ = &mut stop => break,
            offer = rx.recv(), if open && puts.len() < IN_FLIGHT => match offer {
                Some(Offer::Marked(job)) => match to_share(&marks, job) {
                    Ok((job, c)) => puts.push(put(job, Some(c))),
                    Err(job) => settled.push(job),
                },
                Some(Offer::Used(job)) => puts.push(put(job, None)),
                None => open = false,
            },
            Some((job, landed)) = puts.next(), if !puts.is_empty() => {
                if landed {
                    settled.push(job);
                }
            }
            else => break,
        }
    }
    // Puts that ended while the task was told to stop.
    while let Some(Some((job, landed))) = puts.next().now_or_never() {
        if landed {
            settled.push(job);
        }
    }
    unmark(&mut settled);
}

#[cfg(test)]
mod tests {
    use halyard_broker::BrokerConfig;
    use halyard_cache::shared::SharedReader;
    use halyard_proto::stored::encode_result;
    use halyard_proto::{
        AnswerSource, Failure, FailureKind, JobResult, Outcome, StoredResult, Usage,
    };

    use super::*;
    use crate::state::{RunDb, Write};
    use halyard_plan::planner::Share;

    fn result(job: u8, outcome: Outcome) -> JobResult {
        JobResult {
            v: 1,
            job: JobId([job; 16]),
            run: Uuid::nil(),
            outcome,
            deliveries: 1,
            worker: "w".into(),
            cached: false,
        }
    }

    /// A nats-server of the test's own and the coordinator's connection to it.
    async fn broker() -> (halyard_tests::NatsServer, Broker) {
        let nats = halyard_tests::NatsServer::start();
        let broker =
            halyard_broker::connect(&BrokerConfig::new(nats.url(), "coordinator")).await.unwrap();
        (nats, broker)
    }

    /// A run state in a directory of its own.
    fn run_state() -> (tempfile::TempDir, RunDb) {
        let dir = tempfile::tempdir().unwrap();
        let db = RunDb::open(&dir.path().join("state")).unwrap();
        (dir, db)
    }

    /// Run the sharing task over `offers` (then no more) until it ends by itself.
    async fn run_share(broker: &Broker, marks: &ShareMarks, offers: Vec<Offer>, refresh: Duration) {
        let (tx, rx) = mpsc::channel(offers.len().max(1));
        for offer in offers {
            tx.send(offer).await.unwrap();
        }
        drop(tx);
        // Held: a dropped sender tells the task to stop.
        let (_stop, stopped) = oneshot::channel();
        let task = share(broker.clone(), Uuid::now_v7(), rx, stopped, marks.clone(), refresh);
        tokio::time::timeout(Duration::from_secs(60), task).await.expect("the sharing task ended");
    }

    fn done(text: &str, source: AnswerSource) -> Outcome {
        Outcome::Done(Completion {
            text: text.into(),
            usage: Usage::default(),
            latency_ms: 1,
            finish_reason: None,
            calls: 1,
            logprobs: None,
            refusal: false,
            source,
        })
    }

    /// Issue 51: completions a run state holds marked (left by a coordinator killed before
    /// it shared them, or deferred by a full queue) are put in the bucket by the sharing
    /// task with no offer at all, and their marks removed; a marked dead letter, or an
    /// answer read from the shared cache, is unmarked without a put.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn marked_completions_are_shared_without_an_offer() {
        let (_nats, broker) = broker().await;
        let (_dir, db) = run_state();
        let failed = Outcome::Failed(Failure {
            kind: FailureKind::Permanent,
            error: "refused".into(),
            http_status: None,
        });
        let results = [
            result(1, done("one", AnswerSource::default())),
            result(2, done("two", AnswerSource::default())),
            result(3, failed),
            result(4, done("from the bucket", AnswerSource::SharedCache)),
        ];
        // Stored and marked as the coordinator stores them (one batch), each marked
        // (`RunStore::commit` marks only shareable completions of sharing pools).
        let encoded: Vec<Vec<u8>> =
            results.iter().map(|r| encode_result(&StoredResult::from(r)).unwrap()).collect();
        let writes: Vec<Write<'_>> = results
            .iter()
            .zip(&encoded)
            .map(|(r, e)| Write::Result(&r.job, e, Share::Put))
            .collect();
        db.commit_writes(&writes).unwrap();
        let jobs: Vec<JobId> = results.iter().map(|r| r.job).collect();
        assert_eq!(db.take_marked(), (jobs.clone(), vec![]));
        let marks = db.share_marks();
        assert_eq!(marks.count().unwrap(), 4);

        run_share(&broker, &marks, vec![], Duration::ZERO).await;

        assert_eq!(marks.count().unwrap(), 0, "marks left behind");
        let reader = SharedReader::new(broker);
        assert_eq!(reader.get(&jobs[0]).await.unwrap().unwrap().text, "one");
        assert_eq!(reader.get(&jobs[1]).await.unwrap().unwrap().text, "two");
        assert_eq!(reader.get(&jobs[2]).await.unwrap(), None, "a dead letter was shared");
        assert_eq!(reader.get(&jobs[3]).await.unwrap(), None, "a shared answer was put again");
    }

    /// The entry of `job` in the bucket: its bytes and revision.
    async fn entry(broker: &Broker, job: &JobId) -> Option<(bytes::Bytes, u64)> {
        let kv = broker.js.get_key_value(halyard_cache::shared::BUCKET).await.unwrap();
        let key = halyard_cache::shared::kv_key(job);
        kv.entry(key.as_str()).await.unwrap().map(|e| (e.value, e.revision))
    }

    /// Issue 51, "pruning by age and use": a job a worker answered from the bucket is not
    /// marked (the bucket has its answer) but its use is counted: the sharing task writes
    /// its entry again, unchanged (the bytes read from the bucket, over the revision read),
    /// once it is older than the refresh age; an entry that is gone is not put back (a
    /// worker's bytes never reach the bucket that way), and a recent one is left alone. A
    /// job answered from a machine's copy of an entry is put, finds the entry, and counts
    /// as its use the same way.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn answers_read_from_the_bucket_keep_their_entries_in_use() {
        let (_nats, broker) = broker().await;
        let (_dir, db) = run_state();
        let writer = SharedWriter::open(&broker).await.unwrap();
        let first_run = Uuid::now_v7();
        let (kept, gone, copied) = (JobId([5; 16]), JobId([6; 16]), JobId([7; 16]));
        let paid = done("paid by an earlier run", AnswerSource::default());
        let Outcome::Done(c) = &paid else { unreachable!() };
        assert!(writer.put(first_run, kept, c).await);
        assert!(writer.put(first_run, copied, c).await);
        let (bytes, revision) = entry(&broker, &kept).await.unwrap();
        let (copied_bytes, copied_revision) = entry(&broker, &copied).await.unwrap();

        // As the planner stores answers read from the bucket: `Share::Used`, no mark.
        let results = [
            result(5, done("paid by an earlier run", AnswerSource::SharedCache)),
            result(6, done("a worker's bytes", AnswerSource::SharedCache)),
        ];
        let encoded: Vec<Vec<u8>> =
            results.iter().map(|r| encode_result(&StoredResult::from(r)).unwrap()).collect();
        let writes: Vec<Write<'_>> = results
            .iter()
            .zip(&encoded)
            .map(|(r, e)| Write::Result(&r.job, e, Share::Used))
            .collect();
        db.commit_writes(&writes).unwrap();
        let (marked, used) = db.take_marked();
        assert_eq!((marked, used.clone()), (vec![], vec![kept, gone]));
        let marks = db.share_marks();
        assert_eq!(marks.count().unwrap(), 0, "an answer from the bucket was marked");
        // A worker whose machine cache holds a copy of a bucket entry answers from that
        // copy: a completion like any other, marked and offered; its put finds the entry.
        let copy = result(7, done("a machine's copy", AnswerSource::MachineCache));
        let copy_encoded = encode_result(&StoredResult::from(&copy)).unwrap();
        db.commit_writes(&[Write::Result(&copy.job, &copy_encoded, Share::Put)]).unwrap();
        let (copies, _) = db.take_marked();

        let offers = |copies: &[JobId]| {
            let used = used.iter().map(|j| Offer::Used(*j));
            used.chain(copies.iter().map(|j| Offer::Marked(*j))).collect::<Vec<_>>()
        };
        // Written less than a day ago: left alone.
        run_share(&broker, &marks, offers(&[]), halyard_cache::shared::REFRESH_AFTER).await;
        assert_eq!(entry(&broker, &kept).await, Some((bytes.clone(), revision)));
        // Older than the refresh age (zero here): written again, the same bytes.
        run_share(&broker, &marks, offers(&copies), Duration::ZERO).await;
        let (again, later) = entry(&broker, &kept).await.unwrap();
        assert_eq!(again, bytes, "the refreshed entry changed");
        assert!(later > revision, "the entry was not written again ({later} <= {revision})");
        assert_eq!(entry(&broker, &gone).await, None, "a used answer with no entry was put");
        // The machine's copy: the bucket's entry written again as it was, not the copy.
        let (copied_again, copied_later) = entry(&broker, &copied).await.unwrap();
        assert_eq!(copied_again, copied_bytes, "the put of a copy changed the entry");
        assert!(copied_later > copied_revision, "a put of a copy did not refresh the entry");
        assert_eq!(marks.count().unwrap(), 0);
    }

    /// Issue 51, "bounded ... a full bucket never fails a run": a full bucket drops the
    /// entries written (or used) longest ago, never a new one. The bucket here is one an
    /// earlier build made (`discard = new`: full, it refused every new entry), at a few
    /// kilobytes: the coordinator's writer brings it to `discard = old` as it opens it;
    /// every put lands; and an entry refreshed after a second one was written outlives it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_bucket_drops_its_oldest_entries_not_new_ones() {
        use async_nats::jetstream::stream::DiscardPolicy;
        let (_nats, broker) = broker().await;
        let mut earlier = halyard_cache::shared::config(1);
        earlier.discard = DiscardPolicy::New;
        earlier.max_bytes = 8 << 10;
        broker.js.create_stream(earlier.clone()).await.unwrap();

        let writer = SharedWriter::open(&broker).await.unwrap();
        let mut stream = broker.js.get_stream(&earlier.name).await.unwrap();
        assert_eq!(stream.info().await.unwrap().config.discard, DiscardPolicy::Old);

        let run = Uuid::now_v7();
        let answer = |i: u32| {
            let Outcome::Done(c) =
                done(&format!("answer {i} {}", "x".repeat(120)), AnswerSource::Paid)
            else {
                unreachable!()
            };
            c
        };
        let job = |i: u32| JobId(*blake3::hash(&i.to_le_bytes()).as_bytes().first_chunk().unwrap());
        let reader = SharedReader::new(broker.clone());
        assert!(writer.put(run, job(0), &answer(0)).await);
        assert!(writer.put(run, job(1), &answer(1)).await);
        // Job 0's entry is used (and old enough): it is now the later of the two.
        assert!(writer.refresh(job(0), Duration::ZERO).await);
        let mut i = 2;
        while reader.get(&job(1)).await.unwrap().is_some() {
            assert!(i < 1000, "the bucket never dropped an entry");
            assert!(
                writer.put(run, job(i), &answer(i)).await,
                "put {i} refused: the bucket is full"
            );
            i += 1;
        }
        assert!(i > 3, "the bucket held too few entries to tell the order ({i})");
        assert_eq!(
            reader.get(&job(0)).await.unwrap().map(|c| c.text),
            Some(answer(0).text),
            "the entry in use was dropped before an older unused one"
        );
        // A reader of its own: this one's watch may not have seen the last put yet.
        assert_eq!(
            SharedReader::new(broker.clone()).get(&job(i - 1)).await.unwrap().map(|c| c.text),
            Some(answer(i - 1).text)
        );
        let bytes = stream.info().await.unwrap().state.bytes;
        assert!(bytes <= earlier.max_bytes as u64, "{bytes} bytes");
    }

    /// A bucket whose newest entry was purged (as an operator removes one bad entry:
    /// `nats stream purge --subject`): the stream's last sequence still names the purged
    /// message, which no watch can deliver. The reader finds that nothing is left to
    /// deliver and trusts its watch; before, it waited for that message for good.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_watch_is_trusted_when_the_newest_entry_was_purged() {
        let (_nats, broker) = broker().await;
        let writer = SharedWriter::open(&broker).await.unwrap();
        let run = Uuid::now_v7();
        let Outcome::Done(c) = done("an answer", AnswerSource::Paid) else { unreachable!() };
        for b in 1..=3u8 {
            assert!(writer.put(run, JobId([b; 16]), &c).await);
        }
        let mut stream = broker.js.get_stream("KV_halyard_cache").await.unwrap();
        let newest = halyard_cache::shared::kv_key(&JobId([3; 16]));
        stream.purge().filter(format!("$KV.halyard_cache.{newest}")).await.unwrap();
        let state = stream.info().await.unwrap().state.clone();
        assert_eq!((state.messages, state.last_sequence), (2, 3), "{state:?}");

        let reader = SharedReader::new(broker.clone());
        assert!(reader.get(&JobId([1; 16])).await.unwrap().is_some());
        let t0 = std::time::Instant::now();
        while !reader.follows_keys() {
            assert!(t0.elapsed() < Duration::from_secs(20), "the watch was never trusted");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let asked = reader.round_trips();
        assert_eq!(reader.get(&JobId([3; 16])).await.unwrap(), None);
        assert_eq!(reader.get(&JobId([9; 16])).await.unwrap(), None);
        assert_eq!(reader.round_trips(), asked, "a miss asked the broker");
    }

    /// Issue 51, the shared tier's cost on a job's path: once a reader's watch of the
    /// bucket's keys has caught up, a job nobody shared is a miss without a round trip to
    /// the broker; a shared one is read and served; an entry put later reaches the reader
    /// through the watch (within milliseconds; the test allows 10 s).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_miss_asks_the_broker_nothing_once_the_keys_are_followed() {
        let (nats, broker) = broker().await;
        let writer = SharedWriter::open(&broker).await.unwrap();
        let run = Uuid::now_v7();
        let job = |i: u32| JobId(*blake3::hash(&i.to_le_bytes()).as_bytes().first_chunk().unwrap());
        let answer = |i: u32| {
            let Outcome::Done(c) = done(&format!("answer {i}"), AnswerSource::Paid) else {
                unreachable!()
            };
            c
        };
        for i in 0..50 {
            assert!(writer.put(run, job(i), &answer(i)).await);
        }
        // A worker's own connection, as a worker reads.
        let worker =
            halyard_broker::connect(&BrokerConfig::new(nats.url(), "worker")).await.unwrap();
        let reader = SharedReader::new(worker);
        // The first lookup opens the bucket, and with it the watch.
        assert_eq!(reader.get(&job(7)).await.unwrap().unwrap().text, "answer 7");
        let t0 = std::time::Instant::now();
        while !reader.follows_keys() {
            assert!(t0.elapsed() < Duration::from_secs(10), "the watch never caught up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let asked = reader.round_trips();
        for i in 1000..3000 {
            assert_eq!(reader.get(&job(i)).await.unwrap(), None);
        }
        // 2,000 ids never put: at most a few false positives of the filter ask.
        let misses_asked = reader.round_trips() - asked;
        assert!(misses_asked <= 5, "{misses_asked} of 2000 misses asked the broker");
        for i in 0..50 {
            assert_eq!(reader.get(&job(i)).await.unwrap().unwrap().text, format!("answer {i}"));
        }
        assert_eq!(reader.round_trips() - asked - misses_asked, 50, "a hit asks the broker");

        // Put after the watch caught up: served once the watch has delivered its key.
        assert!(writer.put(run, job(5000), &answer(5000)).await);
        let t0 = std::time::Instant::now();
        while reader.get(&job(5000)).await.unwrap().is_none() {
            assert!(t0.elapsed() < Duration::from_secs(10), "a later put never reached the reader");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(reader.follows_keys());
    }
}

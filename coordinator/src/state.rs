//! The coordinator's run state in sled.
//!
//! Trees:
//! - `meta`: the run's identity ([`RunMeta`]).
//! - `results`: job id → the first result received for it, as a [`StoredResult`] in the
//!   compact form of [`halyard_proto::stored`] (outcome, deliveries, cached; whole
//!   [`JobResult`]s written by earlier builds still read). Inserted only if the job has
//!   none, so a job is counted once whatever duplicates arrive.
//! - `done`: item key → the item's final label (encoded by the pipeline).
//! - `jobs`: job id → [`JobMeta`] (pool, stage, model) of jobs that became dead letters,
//!   written when an item's evaluation meets the dead letter; used to describe dead
//!   letters in the report. (Not written for every job: that was one more sled write per
//!   job, for the rare failure.)
//!
//! Results and item labels are flushed before the result messages that carried them are
//! acked; after a crash, a redelivered result is recognised as a duplicate.
//!
//! Memory: sled's page cache is capped at [`CACHE_BYTES`] (sled's default is 1 GiB),
//! so a run of a million results keeps a bounded footprint; the rest stays on disk.

use std::path::Path;

use sled::Transactional;

use halyard_proto::stored::{decode_result, encode_result};
use halyard_proto::{JobId, JobIdFilter, JobResult, Outcome, StoredResult};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot open run state {path}: {reason} (is another coordinator using this output directory?)")]
    Open { path: String, reason: String },
    #[error("run state: {0}")]
    Io(String),
    #[error("run state record {what} is corrupt: {reason}")]
    Corrupt { what: String, reason: String },
}

impl From<sled::Error> for StateError {
    fn from(e: sled::Error) -> Self {
        StateError::Io(e.to_string())
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RunMeta {
    pub id: Uuid,
    pub name: String,
    pub created_unix_ms: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct JobMeta {
    pub pool: String,
    pub stage: String,
    pub model: String,
}

/// A 12-byte item key: benchmark, model-under-test and item index, big-endian so that
/// sled iterates items in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ItemKey {
    pub bench: u32,
    pub model: u32,
    pub item: u32,
}

impl ItemKey {
    pub fn to_bytes(self) -> [u8; 12] {
        let mut b = [0u8; 12];
        b[..4].copy_from_slice(&self.bench.to_be_bytes());
        b[4..8].copy_from_slice(&self.model.to_be_bytes());
        b[8..].copy_from_slice(&self.item.to_be_bytes());
        b
    }
    pub fn from_bytes(b: &[u8]) -> Option<ItemKey> {
        if b.len() != 12 {
            return None;
        }
        let n = |r: std::ops::Range<usize>| u32::from_be_bytes(b[r].try_into().unwrap_or([0; 4]));
        Some(ItemKey { bench: n(0..4), model: n(4..8), item: n(8..12) })
    }
}

/// sled page cache of the run state. Measured at a million results: 64 MiB costs half
/// again as much CPU per write as 256 MiB (pages are re-read from the log); more buys
/// nothing.
pub const CACHE_BYTES: u64 = 256 << 20;

/// A run's state. Its one writer is the coordinator that opened it (sled's file lock keeps
/// other processes out); [`RunState::insert_result`] relies on that.
pub struct RunState {
    db: sled::Db,
    meta: sled::Tree,
    results: sled::Tree,
    done: sled::Tree,
    jobs: sled::Tree,
    /// Every job with a stored result (filled at open, then on insert): most lookups
    /// are for jobs just planned, which have none, and need not reach sled.
    stored: JobIdFilter,
    results_at_open: u64,
}

/// Totals over the results of a run.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct JobTotals {
    /// Jobs with a terminal result (completions and dead letters).
    pub done: u64,
    pub completed: u64,
    pub dead_letters: u64,
    /// Backend calls (HTTP attempts) workers made for this run's completions.
    pub model_calls: u64,
    /// Completions served from a worker checkpoint, without a model call.
    pub cache_hits: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub latency_ms_total: u64,
}

impl RunState {
    pub fn open(dir: &Path) -> Result<RunState, StateError> {
        let err = |e: &dyn std::fmt::Display| StateError::Open {
            path: dir.display().to_string(),
            reason: e.to_string(),
        };
        halyard_proto::store_mark::create_private_dir(dir).map_err(|e| err(&e))?;
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(CACHE_BYTES)
            .mode(sled::Mode::HighThroughput)
            .open()
            .map_err(|e| err(&e))?;
        // A run state whose data vanished is an error, not a fresh run (see
        // halyard_proto::store_mark).
        let marks = db.open_tree("halyard_store")?;
        let marked = marks.contains_key(halyard_proto::store_mark::MARK_KEY)?;
        halyard_proto::store_mark::guard(dir, marked, || {
            marks
                .insert(halyard_proto::store_mark::MARK_KEY, &b"1"[..])
                .map_err(|e| e.to_string())?;
            db.flush().map(drop).map_err(|e| e.to_string())
        })
        .map_err(|e| err(&e))?;
        let results = db.open_tree("results")?;
        let stored = JobIdFilter::new();
        let mut results_at_open = 0;
        for key in results.iter().keys() {
            let key = key?;
            let id = JobId::from_slice(&key).ok_or_else(|| StateError::Corrupt {
                what: "results key".into(),
                reason: format!("{} bytes", key.len()),
            })?;
            stored.insert(&id);
            results_at_open += 1;
        }
        Ok(RunState {
            meta: db.open_tree("meta")?,
            results,
            done: db.open_tree("done")?,
            jobs: db.open_tree("jobs")?,
            db,
            stored,
            results_at_open,
        })
    }

    /// The run's identity, created (UUID v7) on first use.
    pub fn run_meta(&self, name: &str) -> Result<(RunMeta, bool), StateError> {
        if let Some(b) = self.meta.get(b"run")? {
            let m: RunMeta = halyard_proto::decode("run meta", &b).map_err(|e| {
                StateError::Corrupt { what: "meta/run".into(), reason: e.to_string() }
            })?;
            return Ok((m, false));
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let m = RunMeta { id: Uuid::now_v7(), name: name.to_string(), created_unix_ms: now };
        self.meta.insert(b"run", enc(&m)?)?;
        self.db.flush()?;
        Ok((m, true))
    }

    /// Carry out `writes` as one atomic update: after a crash, either all of them are in
    /// the state or none is (one sled transaction over the trees they touch; sled logs
    /// it as one batch, recovered whole or not at all). Written one by one, sled's
    /// background flush could make a prefix durable (a batch's results without the cost
    /// totals counting them) and a crash then would leave results that are never counted:
    /// their redelivery is a duplicate.
    ///
    /// A result is stored only if its job has none (the first result wins); a job note
    /// likewise. Not durable until [`RunState::flush`].
    pub fn commit_writes(&self, writes: &[Write<'_>]) -> Result<(), StateError> {
        // Encoded before the transaction, which may run its closure more than once.
        let mut encoded: Vec<Option<Vec<u8>>> = Vec::with_capacity(writes.len());
        for w in writes {
            encoded.push(match w {
                Write::JobNote(_, meta) => Some(enc(meta)?),
                Write::Costs(totals) => Some(enc(totals)?),
                _ => None,
            });
        }
        let trip = failpoint::mid_commit(writes.len());
        let trees = (&self.results, &self.done, &self.jobs, &self.meta);
        let res: Result<(), sled::transaction::TransactionError<StateError>> =
            trees.transaction(|(results, done, jobs, meta)| {
                let mut fresh = std::collections::HashSet::new();
                for (i, (w, e)) in writes.iter().zip(&encoded).enumerate() {
                    if trip == Some(i) {
                        failpoint::crash(&self.db);
                    }
                    match w {
                        Write::Result(job, bytes) => {
                            // The filter has no false negatives: a job it has never seen
                            // has no result, unless this batch holds it twice.
                            let absent = if self.stored.may_contain(job) {
                                results.get(job.as_bytes())?.is_none()
                            } else {
                                fresh.insert(**job)
                            };
                            if absent {
                                results.insert(job.as_bytes(), *bytes)?;
                            }
                        }
                        Write::Label(item, label) => {
                            done.insert(&item.to_bytes()[..], *label)?;
                        }
                        Write::JobNote(job, _) => {
                            if jobs.get(job.as_bytes())?.is_none() {
                                jobs.insert(job.as_bytes(), e.as_deref().unwrap_or_default())?;
                            }
                        }
                        Write::Costs(_) => {
                            meta.insert(&b"costs"[..], e.as_deref().unwrap_or_default())?;
                        }
                    }
                }
                Ok(())
            });
        match res {
            Ok(()) => {}
            Err(sled::transaction::TransactionError::Abort(e)) => return Err(e),
            Err(sled::transaction::TransactionError::Storage(e)) => return Err(e.into()),
        }
        for w in writes {
            if let Write::Result(job, _) = w {
                self.stored.insert(job);
            }
        }
        Ok(())
    }

    /// Record a result; false if one was already recorded for this job (a duplicate).
    pub fn insert_result(&self, r: &JobResult) -> Result<bool, StateError> {
        let encoded =
            encode_result(&StoredResult::from(r)).map_err(|e| StateError::Io(e.to_string()))?;
        self.insert_encoded(&r.job, &encoded)
    }

    /// Record a result in its stored form; false if one was already recorded for this job.
    fn insert_encoded(&self, job: &JobId, encoded: &[u8]) -> Result<bool, StateError> {
        if !self.stored.may_contain(job) {
            // Never stored (the filter has no false negatives), and the coordinator that owns
            // this state is its only writer (sled's lock keeps other processes out): a
            // plain insert does what the compare-and-swap would, for less.
            self.stored.insert(job);
            self.results.insert(job.as_bytes(), encoded)?;
            return Ok(true);
        }
        let res = self.results.compare_and_swap(job.as_bytes(), None::<&[u8]>, Some(encoded))?;
        Ok(res.is_ok())
    }

    /// Results recorded when the state was opened.
    pub fn results_at_open(&self) -> u64 {
        self.results_at_open
    }

    pub fn result(&self, job: &JobId) -> Result<Option<StoredResult>, StateError> {
        if !self.stored.may_contain(job) {
            return Ok(None);
        }
        match self.results.get(job.as_bytes())? {
            None => Ok(None),
            Some(b) => decode_stored(job, &b).map(Some),
        }
    }

    /// Whether a result is stored for `job` (no decoding; most lookups stop at the filter).
    pub fn has_result(&self, job: &JobId) -> Result<bool, StateError> {
        if !self.stored.may_contain(job) {
            return Ok(false);
        }
        Ok(self.results.contains_key(job.as_bytes())?)
    }

    pub fn job_meta(&self, job: &JobId) -> Result<Option<JobMeta>, StateError> {
        match self.jobs.get(job.as_bytes())? {
            None => Ok(None),
            Some(b) => halyard_proto::decode("job meta", &b).map(Some).map_err(|e| {
                StateError::Corrupt { what: format!("jobs/{job}"), reason: e.to_string() }
            }),
        }
    }

    pub fn is_done(&self, item: ItemKey) -> Result<bool, StateError> {
        Ok(self.done.contains_key(item.to_bytes())?)
    }

    pub fn done_count(&self) -> usize {
        self.done.len()
    }

    /// Item labels in key order.
    pub fn labels(&self) -> impl Iterator<Item = Result<(ItemKey, sled::IVec), StateError>> + '_ {
        Self::decode_labels(self.done.iter())
    }

    /// Labels of one benchmark and model in item order (a range scan, not a full pass).
    pub fn labels_of(
        &self,
        bench: u32,
        model: u32,
    ) -> impl Iterator<Item = Result<(ItemKey, sled::IVec), StateError>> + '_ {
        let mut prefix = [0u8; 8];
        prefix[..4].copy_from_slice(&bench.to_be_bytes());
        prefix[4..].copy_from_slice(&model.to_be_bytes());
        Self::decode_labels(self.done.scan_prefix(prefix))
    }

    fn decode_labels(
        it: sled::Iter,
    ) -> impl Iterator<Item = Result<(ItemKey, sled::IVec), StateError>> {
        it.map(|r| {
            let (k, v) = r?;
            let key = ItemKey::from_bytes(&k).ok_or_else(|| StateError::Corrupt {
                what: "done key".into(),
                reason: format!("{} bytes", k.len()),
            })?;
            Ok((key, v))
        })
    }

    /// Every recorded result with its job (for totals and dead letters).
    pub fn results(&self) -> impl Iterator<Item = Result<(JobId, StoredResult), StateError>> + '_ {
        self.results.iter().map(|r| {
            let (k, v) = r?;
            let job = JobId::from_slice(&k).ok_or_else(|| StateError::Corrupt {
                what: "results key".into(),
                reason: format!("{} bytes", k.len()),
            })?;
            Ok((job, decode_stored(&job, &v)?))
        })
    }

    pub fn totals(&self) -> Result<JobTotals, StateError> {
        let mut t = JobTotals::default();
        for r in self.results() {
            let (_, r) = r?;
            t.done += 1;
            match &r.outcome {
                Outcome::Done(c) => {
                    t.completed += 1;
                    if r.cached {
                        t.cache_hits += 1;
                    } else {
                        t.model_calls += c.calls as u64;
                    }
                    t.prompt_tokens += c.usage.prompt_tokens;
                    t.completion_tokens += c.usage.completion_tokens;
                    t.latency_ms_total += c.latency_ms;
                }
                Outcome::Failed(_) => t.dead_letters += 1,
            }
        }
        Ok(t)
    }

    /// The cost accounting totals stored by an earlier process (empty if none).
    pub fn costs(&self) -> Result<Vec<crate::cost::ClassTotals>, StateError> {
        match self.meta.get(b"costs")? {
            None => Ok(Vec::new()),
            Some(b) => halyard_proto::decode("cost totals", &b).map_err(|e| StateError::Corrupt {
                what: "meta/costs".into(),
                reason: e.to_string(),
            }),
        }
    }

    /// Store the endpoint outages seen during the run (for its report).
    pub fn put_outages(&self, spans: &[crate::run::outage::OutageSpan]) -> Result<(), StateError> {
        self.meta.insert(b"outages", enc(&spans)?)?;
        Ok(())
    }

    /// The endpoint outages stored so far (empty if none).
    pub fn outages(&self) -> Result<Vec<crate::run::outage::OutageSpan>, StateError> {
        match self.meta.get(b"outages")? {
            None => Ok(Vec::new()),
            Some(b) => halyard_proto::decode("outages", &b).map_err(|e| StateError::Corrupt {
                what: "meta/outages".into(),
                reason: e.to_string(),
            }),
        }
    }

    /// Finished items of one benchmark and model under test.
    pub fn done_count_of(&self, bench: u32, model: u32) -> u64 {
        self.labels_of(bench, model).count() as u64
    }

    /// The sled database itself, for trees owned by other modules (`dead_letters`).
    pub(crate) fn db(&self) -> &sled::Db {
        &self.db
    }

    /// Make everything written so far durable.
    pub async fn flush(&self) -> Result<(), StateError> {
        self.db.flush_async().await?;
        Ok(())
    }
}

/// One write of [`RunState::commit_writes`].
#[derive(Clone, Copy, Debug)]
pub enum Write<'a> {
    /// A result in its stored form ([`halyard_proto::stored::encode_result`]), stored if
    /// its job has none.
    Result(&'a JobId, &'a [u8]),
    /// An item is finished with this label.
    Label(ItemKey, &'a [u8]),
    /// The note of a dead-lettered job, stored if it has none.
    JobNote(&'a JobId, &'a JobMeta),
    /// The cost totals.
    Costs(&'a [crate::cost::ClassTotals]),
}

/// A crash point for tests: `HALYARD_COORDINATOR_FAILPOINT=mid-commit:<n>` makes the
/// coordinator, in its n-th commit of two writes or more, try to make durable everything
/// sled holds after half of the writes (as sled's background flush may at any moment)
/// and abort. Read once; unset, it costs a branch per commit.
mod failpoint {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    pub const ENV: &str = "HALYARD_COORDINATOR_FAILPOINT";

    fn armed() -> Option<u64> {
        static ARMED: OnceLock<Option<u64>> = OnceLock::new();
        *ARMED.get_or_init(|| std::env::var(ENV).ok()?.strip_prefix("mid-commit:")?.parse().ok())
    }

    /// The index of the write before which a commit of `writes` writes crashes, if this
    /// commit is the armed one.
    pub fn mid_commit(writes: usize) -> Option<usize> {
        static PASSES: AtomicU64 = AtomicU64::new(0);
        let n = armed()?;
        if writes < 2 {
            return None;
        }
        (PASSES.fetch_add(1, Ordering::Relaxed) + 1 == n).then_some(writes / 2)
    }

    /// Try to make durable what sled holds, from another thread, as sled's background
    /// flusher would (it cannot while a transaction holds sled's write lock: the
    /// attempt waits for the commit), and abort.
    pub fn crash(db: &sled::Db) -> ! {
        let db = db.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = db.flush();
            let _ = tx.send(());
        });
        let flushed = rx.recv_timeout(std::time::Duration::from_secs(1)).is_ok();
        eprintln!(
            "{ENV}: aborting in the middle of a commit (a concurrent flush {})",
            if flushed { "made the writes so far durable" } else { "waited for the commit" }
        );
        std::process::abort()
    }
}

/// A stored result, or an error naming its record.
pub(crate) fn decode_stored(job: &JobId, bytes: &[u8]) -> Result<StoredResult, StateError> {
    decode_result(bytes)
        .map_err(|e| StateError::Corrupt { what: format!("results/{job}"), reason: e.to_string() })
}

fn enc<T: Serialize>(v: &T) -> Result<Vec<u8>, StateError> {
    halyard_proto::encode(v).map_err(|e| StateError::Io(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use halyard_proto::{Completion, Usage};

    fn result(job: u8, text: &str, cached: bool) -> JobResult {
        JobResult {
            v: 1,
            job: JobId([job; 16]),
            run: Uuid::nil(),
            outcome: Outcome::Done(Completion {
                text: text.into(),
                usage: Usage::default(),
                latency_ms: 1,
                finish_reason: None,
                calls: 2,
                logprobs: None,
            }),
            deliveries: 1,
            worker: "w".into(),
            cached,
        }
    }

    /// A job's result is counted once: a duplicate does not replace or double-count it.
    #[tokio::test]
    async fn duplicates_count_once() {
        let dir = tempfile::tempdir().unwrap();
        let st = RunState::open(dir.path()).unwrap();
        assert!(st.insert_result(&result(1, "first", false)).unwrap());
        assert!(!st.insert_result(&result(1, "second", true)).unwrap());
        assert!(st.insert_result(&result(2, "other", true)).unwrap());
        let t = st.totals().unwrap();
        assert_eq!((t.done, t.completed, t.model_calls, t.cache_hits), (2, 2, 2, 1));
        match st.result(&JobId([1; 16])).unwrap().unwrap().outcome {
            Outcome::Done(c) => assert_eq!(c.text, "first"),
            o => panic!("{o:?}"),
        }
    }

    /// A commit stores the first result of each job (also within one commit), keeps the
    /// first note of a job, and writes labels and cost totals with them.
    #[tokio::test]
    async fn commits_keep_the_first_result_and_note() {
        let dir = tempfile::tempdir().unwrap();
        let st = RunState::open(dir.path()).unwrap();
        assert!(st.insert_result(&result(1, "stored before", false)).unwrap());
        let stored = |r: JobResult| encode_result(&StoredResult::from(r)).unwrap();
        let (r1, r2a, r2b) = (
            stored(result(1, "late duplicate", false)),
            stored(result(2, "first", false)),
            stored(result(2, "second in the same commit", false)),
        );
        let (j1, j2) = (JobId([1; 16]), JobId([2; 16]));
        let m = |stage: &str| JobMeta { pool: "p".into(), stage: stage.into(), model: "m".into() };
        let (first, later) = (m("first"), m("later"));
        let item = ItemKey { bench: 0, model: 0, item: 7 };
        let totals = vec![crate::cost::ClassTotals { jobs: 2, ..Default::default() }];
        st.commit_writes(&[
            Write::Result(&j1, &r1),
            Write::Result(&j2, &r2a),
            Write::Result(&j2, &r2b),
            Write::Label(item, b"label"),
            Write::JobNote(&j2, &first),
            Write::JobNote(&j2, &later),
            Write::Costs(&totals),
        ])
        .unwrap();
        let text = |j: &JobId| match st.result(j).unwrap().unwrap().outcome {
            Outcome::Done(c) => c.text,
            o => panic!("{o:?}"),
        };
        assert_eq!((text(&j1).as_str(), text(&j2).as_str()), ("stored before", "first"));
        assert!(st.is_done(item).unwrap());
        assert_eq!(st.job_meta(&j2).unwrap().unwrap().stage, "first");
        assert_eq!(st.costs().unwrap()[0].jobs, 2);
        // The filter knows job 2 now: a later result for it is a duplicate.
        assert!(!st.insert_result(&result(2, "after", false)).unwrap());
    }

    /// The run id is created once and survives reopening; item keys round-trip in order.
    #[tokio::test]
    async fn run_identity_is_stable() {
        let dir = tempfile::tempdir().unwrap();
        let id = {
            let st = RunState::open(dir.path()).unwrap();
            let (m, created) = st.run_meta("x").unwrap();
            assert!(created);
            st.flush().await.unwrap();
            m.id
        };
        let st = RunState::open(dir.path()).unwrap();
        let (m, created) = st.run_meta("x").unwrap();
        assert!(!created);
        assert_eq!(m.id, id);
        let k = ItemKey { bench: 1, model: 2, item: 300 };
        assert_eq!(ItemKey::from_bytes(&k.to_bytes()), Some(k));
        assert!(
            ItemKey { bench: 0, model: 0, item: 256 }.to_bytes()
                > ItemKey { bench: 0, model: 0, item: 255 }.to_bytes()
        );
    }
}

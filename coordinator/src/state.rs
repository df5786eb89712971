//! The coordinator's run state: one database of keyspaces ([`halyard_store`]).
//!
//! Keyspaces:
//! - `meta`: the run's identity ([`RunMeta`]), the cost totals, the outages, the retry
//!   round of `halyard retry-failed`.
//! - `results`: job id → the first result received for it, as a [`StoredResult`] in the
//!   compact form of [`halyard_proto::stored`] (outcome, deliveries, cached; whole
//!   [`JobResult`]s written by earlier builds still read). Inserted only if the job has
//!   none, so a job is counted once whatever duplicates arrive.
//! - `done`: item key → the item's final label (encoded by the pipeline).
//! - `jobs`: job id → [`JobMeta`] (pool, stage, model) of jobs that became dead letters,
//!   written when an item's evaluation meets the dead letter; used to describe dead
//!   letters in the report. (Not written for every job: that was one more write per
//!   job, for the rare failure.)
//! - `retried`, `dead_history`: see [`crate::dead_letters`].
//! - `held`: job id → a result that arrived for a job not planned (yet), held aside
//!   (bounded, `halyard_plan::planner::HELD_MAX_RESULTS`): the pool token of its subject
//!   (one length byte, then the token) and its wire form. Removed when its job is planned
//!   (it answers the job) or the result is refused.
//! - `share`: job id → nothing: an accepted completion not yet in the shared result cache
//!   (issue 51, [`ShareMarks`]), when the run shares ([`RunDb::share_pools`]). Marked in
//!   the batch that stores the result, whatever path accepted it; removed once the bucket
//!   holds an answer for the job; a coordinator that starts on the run shares what is
//!   still marked, so a kill does not lose the share.
//!
//! Every update is one atomic write batch, committed without an fsync (it survives the
//! process, not a power loss); [`RunDb::flush`] makes everything committed so far durable
//! with one. Results and item labels are flushed before the result messages that carried
//! them are acked; after a crash, a redelivered result is recognised as a duplicate.
//!
//! The coordinator is the one writer (the store's lock keeps other processes out; a
//! mutex orders this process's writers): "stored only if absent" reads the store, then
//! writes the batch. A batch writes each key once (the engine gives a batch's writes one
//! sequence number), so a commit settles repeats of a key first.
//!
//! Memory: the block cache and memtables are bounded ([`OPTIONS`]); the rest stays on disk.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub use halyard_plan::planner::Share;
use halyard_proto::stored::encode_result;
use halyard_proto::{JobId, JobIdFilter, JobResult, Outcome, StoredResult};
use halyard_store::fjall::{self, Keyspace};
use halyard_store::{Store, StoreError};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use halyard_plan::store::{ItemKey, JobMeta};

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot open run state {path}: {reason}")]
    Open { path: String, reason: String },
    #[error("run state: {0}")]
    Io(String),
    #[error("run state record {what} is corrupt: {reason}")]
    Corrupt { what: String, reason: String },
}

impl From<fjall::Error> for StateError {
    fn from(e: fjall::Error) -> Self {
        StateError::Io(e.to_string())
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RunMeta {
    pub id: Uuid,
    pub name: String,
    pub created_unix_ms: u64,
}

/// Memory of the run state: block cache and memtables.
pub const OPTIONS: halyard_store::Options =
    halyard_store::Options { cache_bytes: 32 << 20, memtable_bytes: 8 << 20 };

/// The keyspaces, in [`Spaces`]' order.
const SPACES: [&str; 8] =
    ["meta", "results", "done", "jobs", "retried", "dead_history", "held", "share"];

/// The keyspaces of a run state.
#[derive(Clone)]
pub(crate) struct Spaces {
    pub(crate) meta: Keyspace,
    pub(crate) results: Keyspace,
    pub(crate) done: Keyspace,
    pub(crate) jobs: Keyspace,
    pub(crate) retried: Keyspace,
    pub(crate) history: Keyspace,
    pub(crate) held: Keyspace,
    pub(crate) share: Keyspace,
}

/// A scan of one keyspace, in a snapshot of its own.
type Scan = fjall::Iter;

/// A run's database (`state/` in the run directory: results, done items, job notes,
/// totals). Its one writer is the coordinator that opened it (the store's lock keeps
/// other processes out).
pub struct RunDb {
    store: Arc<Store>,
    pub(crate) spaces: Spaces,
    /// Held by a writer from its reads to its commit.
    writer: Mutex<()>,
    /// Every job with a stored result (filled at open, then on insert): most lookups
    /// are for jobs just planned, which have none, and need not reach the store.
    stored: JobIdFilter,
    results_at_open: u64,
    /// Something was committed since the last flush.
    dirty: AtomicBool,
    /// Batches committed since the store was opened (see [`RunDb::begin_compaction`]).
    commits: AtomicU64,
    /// The pools whose completions go to the shared result cache (none: the run does not
    /// share).
    sharing: HashSet<String>,
    /// Jobs marked for the shared cache since [`RunDb::take_marked`] last took them, and
    /// jobs answered from it (`Share::Used`, not marked: its entries' use is best effort).
    marked: Mutex<(Vec<JobId>, Vec<JobId>)>,
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

impl RunDb {
    /// The database of the run in `run_dir` (`<out>/<name>`, holding `state/`), for the
    /// commands that work on a stopped run (dead letters, `labels import`).
    pub fn open_run(run_dir: &Path) -> Result<RunDb, StateError> {
        let dir = run_dir.join("state");
        if !dir.is_dir() {
            return Err(StateError::Open {
                path: dir.display().to_string(),
                reason: "no run state here (not a run directory)".into(),
            });
        }
        RunDb::open(&dir)
    }

    pub fn open(dir: &Path) -> Result<RunDb, StateError> {
        let open_err = |e: StoreError| StateError::Open {
            path: dir.display().to_string(),
            reason: e.to_string(),
        };
        let store = halyard_store::open(dir, OPTIONS, &SPACES).map_err(open_err)?;
        let ks = |name| store.keyspace(name).map_err(open_err);
        let spaces = Spaces {
            meta: ks("meta")?,
            results: ks("results")?,
            done: ks("done")?,
            jobs: ks("jobs")?,
            retried: ks("retried")?,
            history: ks("dead_history")?,
            held: ks("held")?,
            share: ks("share")?,
        };
        let stored = JobIdFilter::new();
        let mut results_at_open = 0;
        for kv in halyard_store::records(&spaces.results) {
            let key = kv.key()?;
            stored.insert(&job_key(&key, "results")?);
            results_at_open += 1;
        }
        Ok(RunDb {
            store: Arc::new(store),
            spaces,
            writer: Mutex::new(()),
            stored,
            results_at_open,
            dirty: AtomicBool::new(false),
            commits: AtomicU64::new(0),
            sharing: HashSet::new(),
            marked: Mutex::new((Vec::new(), Vec::new())),
        })
    }

    /// One value of `space`.
    fn get(&self, space: &Keyspace, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        Ok(space.get(key)?.map(|v| v.to_vec()))
    }

    /// Whether `space` holds `key`.
    fn contains(&self, space: &Keyspace, key: &[u8]) -> Result<bool, StateError> {
        Ok(space.contains_key(key)?)
    }

    /// `update` fills one batch (seeing the store as of before it), committed atomically
    /// without an fsync (see [`RunDb::flush`]); writers take turns.
    pub(crate) fn write<T>(
        &self,
        update: impl FnOnce(&mut Batch) -> Result<T, StateError>,
    ) -> Result<T, StateError> {
        let _turn = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let mut batch = Batch::default();
        let out = update(&mut batch)?;
        let mut b = self.store.db().batch();
        for ((space, key), value) in batch.writes {
            let ks = self.space(space);
            match value {
                Some(v) => b.insert(ks, key, v),
                None => b.remove(ks, key),
            }
        }
        // Numbered by the store, so that an open can tell a journal that lost batches.
        self.store.commit(b)?;
        self.commits.fetch_add(1, Ordering::AcqRel);
        self.dirty.store(true, Ordering::Release);
        Ok(out)
    }

    fn space(&self, s: Space) -> &Keyspace {
        match s {
            Space::Meta => &self.spaces.meta,
            Space::Results => &self.spaces.results,
            Space::Done => &self.spaces.done,
            Space::Jobs => &self.spaces.jobs,
            Space::Held => &self.spaces.held,
            Space::Share => &self.spaces.share,
        }
    }

    /// A scan of `space` from `lo` to `hi` (inclusive), or all of it.
    fn scan(&self, space: &Keyspace, bounds: Option<(&[u8], &[u8])>) -> Result<Scan, StateError> {
        Ok(match bounds {
            Some((lo, hi)) => space.range(lo..=hi),
            None => halyard_store::records(space),
        })
    }

    /// The run's identity, created (UUID v7) on first use.
    pub fn run_meta(&self, name: &str) -> Result<(RunMeta, bool), StateError> {
        if let Some(b) = self.get(&self.spaces.meta, b"run")? {
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
        let bytes = enc(&m)?;
        // Durable at once: the run's identity names its subjects and message ids.
        let mut b = self.store.db().batch();
        b.insert(&self.spaces.meta, b"run", bytes);
        self.store.commit(b)?;
        self.commits.fetch_add(1, Ordering::AcqRel);
        self.store.persist()?;
        Ok((m, true))
    }

    /// Carry out `writes` as one atomic update: after a crash, either all of them are in
    /// the state or none is (one write batch). Written one by one, a crash could
    /// leave a prefix durable (a batch's results without the cost totals counting them):
    /// results that are never counted, since their redelivery is a duplicate.
    ///
    /// A result is stored only if its job has none (the first result wins); a job note
    /// likewise. Not durable until [`RunDb::flush`].
    pub fn commit_writes(&self, writes: &[Write<'_>]) -> Result<(), StateError> {
        let trip = failpoint::mid_commit(writes.len());
        let (mut marked, mut used) = (Vec::new(), Vec::new());
        self.write(|batch| {
            for (i, w) in writes.iter().enumerate() {
                if trip == Some(i) {
                    failpoint::crash();
                }
                match w {
                    Write::Result(job, bytes, share) => {
                        // The filter has no false negatives: a job it has never seen has
                        // no result, unless this batch holds it twice.
                        let stored = self.stored.may_contain(job)
                            && self.spaces.results.contains_key(job.as_bytes())?;
                        let absent = !stored && !batch.has(Space::Results, job.as_bytes());
                        if absent {
                            batch.put(Space::Results, job.as_bytes(), bytes.to_vec());
                            match share {
                                Share::Put => {
                                    batch.put(Space::Share, job.as_bytes(), Vec::new());
                                    marked.push(**job);
                                }
                                Share::Used => used.push(**job),
                                Share::No => {}
                            }
                        }
                    }
                    Write::Label(item, label) => {
                        batch.put(Space::Done, &item.to_bytes(), label.to_vec());
                    }
                    Write::JobNote(job, note) => {
                        if !batch.has(Space::Jobs, job.as_bytes())
                            && !self.spaces.jobs.contains_key(job.as_bytes())?
                        {
                            batch.put(Space::Jobs, job.as_bytes(), enc(note)?);
                        }
                    }
                    Write::Costs(totals) => batch.put(Space::Meta, b"costs", enc(totals)?),
                    Write::Intake(i) => batch.put(Space::Meta, b"intake", enc(i)?),
                    Write::Hold(job, pool, encoded) => {
                        let held_now = match batch.get(Space::Held, job.as_bytes()) {
                            Some(v) => v.is_some(),
                            None => self.spaces.held.contains_key(job.as_bytes())?,
                        };
                        if !held_now {
                            batch.put(Space::Held, job.as_bytes(), held_value(pool, encoded));
                        }
                    }
                    Write::Unhold(job) => batch.remove(Space::Held, job.as_bytes()),
                }
            }
            Ok(())
        })?;
        for w in writes {
            if let Write::Result(job, ..) = w {
                self.stored.insert(job);
            }
        }
        if !marked.is_empty() || !used.is_empty() {
            let mut m = self.marked.lock().unwrap_or_else(|p| p.into_inner());
            m.0.extend(marked);
            m.1.extend(used);
        }
        Ok(())
    }

    /// Record a result; false if one was already recorded for this job (a duplicate).
    /// Not durable until [`RunDb::flush`].
    pub fn insert_result(&self, r: &JobResult) -> Result<bool, StateError> {
        let encoded =
            encode_result(&StoredResult::from(r)).map_err(|e| StateError::Io(e.to_string()))?;
        let job = r.job;
        let may_have = self.stored.may_contain(&job);
        let inserted = self.write(|batch| {
            if may_have && self.spaces.results.contains_key(job.as_bytes())? {
                return Ok(false);
            }
            batch.put(Space::Results, job.as_bytes(), encoded);
            Ok(true)
        })?;
        self.stored.insert(&job);
        Ok(inserted)
    }

    /// Results recorded when the state was opened.
    pub fn results_at_open(&self) -> u64 {
        self.results_at_open
    }

    pub fn result(&self, job: &JobId) -> Result<Option<StoredResult>, StateError> {
        if !self.stored.may_contain(job) {
            return Ok(None);
        }
        self.get(&self.spaces.results, job.as_bytes())?.map(|b| decode_stored(job, &b)).transpose()
    }

    /// Whether a result is stored for `job` (no decoding; most lookups stop at the filter).
    pub fn has_result(&self, job: &JobId) -> Result<bool, StateError> {
        if !self.stored.may_contain(job) {
            return Ok(false);
        }
        self.contains(&self.spaces.results, job.as_bytes())
    }

    pub fn job_meta(&self, job: &JobId) -> Result<Option<JobMeta>, StateError> {
        match self.get(&self.spaces.jobs, job.as_bytes())? {
            None => Ok(None),
            Some(b) => halyard_proto::decode("job meta", &b).map(Some).map_err(|e| {
                StateError::Corrupt { what: format!("jobs/{job}"), reason: e.to_string() }
            }),
        }
    }

    pub fn is_done(&self, item: ItemKey) -> Result<bool, StateError> {
        self.contains(&self.spaces.done, &item.to_bytes())
    }

    /// Items finished, in all (0 if the store cannot be read: the next read reports it).
    pub fn done_count(&self) -> usize {
        halyard_store::count(&self.spaces.done).unwrap_or(0)
    }

    /// Item labels in key order.
    pub fn labels(&self) -> impl Iterator<Item = Result<(ItemKey, Vec<u8>), StateError>> + '_ {
        decode_labels(self.scan(&self.spaces.done, None))
    }

    /// Labels of one benchmark and model in item order (a range scan, not a full pass).
    pub fn labels_of(
        &self,
        bench: u32,
        model: u32,
    ) -> impl Iterator<Item = Result<(ItemKey, Vec<u8>), StateError>> + '_ {
        let lo = ItemKey { bench, model, item: 0 }.to_bytes();
        let hi = ItemKey { bench, model, item: u32::MAX }.to_bytes();
        decode_labels(self.scan(&self.spaces.done, Some((&lo, &hi))))
    }

    /// Every recorded result with its job (for totals and dead letters).
    pub fn results(&self) -> impl Iterator<Item = Result<(JobId, StoredResult), StateError>> + '_ {
        entries(self.scan(&self.spaces.results, None)).map(|kv| {
            let (k, v) = kv?;
            let job = job_key(&k, "results")?;
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
                        t.model_calls = t.model_calls.saturating_add(c.calls as u64);
                    }
                    t.prompt_tokens = t.prompt_tokens.saturating_add(c.usage.prompt_tokens);
                    t.completion_tokens =
                        t.completion_tokens.saturating_add(c.usage.completion_tokens);
                    t.latency_ms_total = t.latency_ms_total.saturating_add(c.latency_ms);
                }
                Outcome::Failed(_) => t.dead_letters += 1,
            }
        }
        Ok(t)
    }

    /// The refusals counted by earlier processes (zero if none).
    pub fn intake(&self) -> Result<halyard_plan::store::Intake, StateError> {
        match self.get(&self.spaces.meta, b"intake")? {
            None => Ok(Default::default()),
            Some(b) => halyard_proto::decode("intake", &b).map_err(|e| StateError::Corrupt {
                what: "meta/intake".into(),
                reason: e.to_string(),
            }),
        }
    }

    /// The result held aside for `job`, if any: the pool token of its subject and its
    /// wire form.
    pub fn held(&self, job: &JobId) -> Result<Option<(String, Vec<u8>)>, StateError> {
        match self.get(&self.spaces.held, job.as_bytes())? {
            None => Ok(None),
            Some(v) => held_parts(&v).map(Some).ok_or_else(|| StateError::Corrupt {
                what: format!("held/{job}"),
                reason: "cut short".into(),
            }),
        }
    }

    /// Results held aside, and their bytes (as the planner counts them: token and wire
    /// form).
    pub fn held_count(&self) -> Result<halyard_plan::store::Held, StateError> {
        let mut h = halyard_plan::store::Held::default();
        for kv in halyard_store::records(&self.spaces.held) {
            let (_, v) = kv.into_inner()?;
            h.results += 1;
            h.bytes += v.len().saturating_sub(1) as u64;
        }
        Ok(h)
    }

    /// The cost accounting totals stored by an earlier process (empty if none).
    pub fn costs(&self) -> Result<Vec<halyard_plan::cost::ClassTotals>, StateError> {
        match self.get(&self.spaces.meta, b"costs")? {
            None => Ok(Vec::new()),
            Some(b) => halyard_proto::decode("cost totals", &b).map_err(|e| StateError::Corrupt {
                what: "meta/costs".into(),
                reason: e.to_string(),
            }),
        }
    }

    /// Store the endpoint outages seen during the run (for its report).
    pub fn put_outages(
        &self,
        spans: &[halyard_plan::outage::OutageSpan],
    ) -> Result<(), StateError> {
        let bytes = enc(&spans)?;
        self.write(|batch| {
            batch.put(Space::Meta, b"outages", bytes);
            Ok(())
        })
    }

    /// The endpoint outages stored so far (empty if none).
    pub fn outages(&self) -> Result<Vec<halyard_plan::outage::OutageSpan>, StateError> {
        match self.get(&self.spaces.meta, b"outages")? {
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

    /// The store itself, for writes owned by other modules (`dead_letters`).
    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    /// Make everything committed so far durable (one fsync, off the async threads; none
    /// if nothing was committed since the last flush).
    pub async fn flush(&self) -> Result<(), StateError> {
        if !self.dirty.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let store = self.store.clone();
        let res = tokio::task::spawn_blocking(move || store.persist())
            .await
            .map_err(|e| StateError::Io(format!("flush: {e}")))
            .and_then(|r| r.map_err(StateError::from));
        if res.is_err() {
            self.dirty.store(true, Ordering::Release);
        }
        res
    }
}

impl RunDb {
    /// Share the completions of `pools` from now on: each one stored is marked as not yet
    /// in the shared result cache in the batch that stores it (`share`), so whatever path
    /// accepts a result (results pulled, the backlog read at start, a held result that
    /// answers a job, the drain as the run ends), its mark is durable with it.
    pub(crate) fn share_pools(&mut self, pools: HashSet<String>) {
        self.sharing = pools;
    }

    /// Whether completions of `pool` are marked for the shared cache.
    pub(crate) fn shares(&self, pool: &str) -> bool {
        self.sharing.contains(pool)
    }

    /// The jobs marked since the last call, to offer to the sharing task, and those
    /// answered from the shared cache since then (their entries' use is counted).
    pub(crate) fn take_marked(&self) -> (Vec<JobId>, Vec<JobId>) {
        std::mem::take(&mut *self.marked.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The marks of completions not yet shared, for the task that shares them.
    pub(crate) fn share_marks(&self) -> ShareMarks {
        ShareMarks {
            store: self.store.clone(),
            share: self.spaces.share.clone(),
            results: self.spaces.results.clone(),
        }
    }
}

/// The `share` keyspace as the sharing task sees it (`crate::shared_cache`): it reads
/// the marks and their results and removes the marks of what the bucket holds. Its
/// removals are batches of their own, outside the coordinator's writer: they touch no
/// key the coordinator reads, and one lost in a crash only makes the next coordinator
/// offer that result again (the bucket then says it has it).
#[derive(Clone)]
pub(crate) struct ShareMarks {
    store: Arc<Store>,
    share: Keyspace,
    results: Keyspace,
}

impl ShareMarks {
    /// Up to `n` marked jobs after `after` (from the first if `None`), in key order.
    pub(crate) fn after(&self, after: Option<JobId>, n: usize) -> Result<Vec<JobId>, StateError> {
        use std::ops::Bound;
        let lo = match &after {
            Some(j) => Bound::Excluded(j.as_bytes().to_vec()),
            None => Bound::Included(halyard_store::FIRST_KEY.to_vec()),
        };
        let mut out = Vec::new();
        for kv in self.share.range((lo, Bound::Unbounded)).take(n) {
            out.push(job_key(&kv.key()?, "share")?);
        }
        Ok(out)
    }

    /// How many completions are marked.
    pub(crate) fn count(&self) -> Result<usize, StateError> {
        Ok(halyard_store::count(&self.share)?)
    }

    /// The completion to share for the marked `job`: its accepted result, if that is a
    /// completion not read from the shared cache (else nothing is shared for it).
    pub(crate) fn completion(
        &self,
        job: &JobId,
    ) -> Result<Option<halyard_proto::Completion>, StateError> {
        let Some(b) = self.results.get(job.as_bytes())? else { return Ok(None) };
        Ok(match decode_stored(job, &b)?.outcome {
            Outcome::Done(c) if c.source != halyard_proto::AnswerSource::SharedCache => Some(c),
            _ => None,
        })
    }

    /// Remove the marks of `jobs` (one batch, not flushed).
    pub(crate) fn unmark(&self, jobs: &[JobId]) -> Result<(), StateError> {
        if jobs.is_empty() {
            return Ok(());
        }
        let mut b = self.store.db().batch();
        for job in jobs {
            b.remove(&self.share, job.as_bytes().to_vec());
        }
        Ok(self.store.commit(b)?)
    }
}

/// The run state's compacted copy, begun while the report is written
/// ([`RunDb::begin_compaction`]).
pub struct PendingCompaction {
    /// The run state's commits when the copy began.
    commits: u64,
    copy: tokio::task::JoinHandle<Result<halyard_store::Copy, halyard_store::StoreError>>,
}

impl RunDb {
    /// Begin the compacted copy of the run state (reading it, on a blocking thread) now
    /// that the run is complete and its state is only read: the report is written
    /// meanwhile. [`RunDb::close_compacted`] puts the copy in place, or, if anything was
    /// committed since it began, makes a new one.
    pub fn begin_compaction(&self) -> PendingCompaction {
        let store = self.store.clone();
        PendingCompaction {
            commits: self.commits.load(Ordering::Acquire),
            copy: tokio::task::spawn_blocking(move || store.compaction_copy()),
        }
    }

    /// Close the run state and compact it ([`halyard_store::Store::compact`], through
    /// this handle: no journal replayed), for a complete run, whose state is read from
    /// now on, not grown; with the copy `pending` began if nothing was committed since,
    /// else with a new one. Said in the log; a failure leaves the state whole for
    /// `halyard gc`.
    pub async fn close_compacted(self, pending: PendingCompaction) {
        let made = match pending.copy.await {
            Ok(made) => made.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        let copy = match made {
            Ok(copy) if pending.commits == self.commits.load(Ordering::Acquire) => Some(copy),
            Ok(copy) => {
                tracing::info!(
                    "the run state was written to after its compacted copy began; copying it again"
                );
                copy.discard();
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "the run state's compacted copy failed; copying it again");
                None
            }
        };
        let store = self.store.clone();
        // Its keyspace handles, and the last commits made durable (`Drop`).
        drop(self);
        let done =
            tokio::task::spawn_blocking(move || Store::finish_compaction(store, "run state", copy));
        if let Err(e) = done.await {
            tracing::warn!(error = %e, "compacting the run state failed; `halyard gc` compacts it later");
        }
    }
}

impl Drop for RunDb {
    /// Commits since the last flush are made durable on the way out (every path that
    /// acks flushes first; this covers writes nobody waited for, such as the outages).
    fn drop(&mut self) {
        if self.dirty.load(Ordering::Acquire) {
            if let Err(e) = self.store.persist() {
                tracing::warn!(error = %e, "run state: the last commits could not be made durable");
            }
        }
    }
}

/// The items of a scan; a scan that could not start is one error.
fn scan_items<T>(
    scan: Result<impl Iterator<Item = Result<T, StateError>>, StateError>,
) -> impl Iterator<Item = Result<T, StateError>> {
    let (failed, scan) = match scan {
        Ok(s) => (None, Some(s)),
        Err(e) => (Some(Err(e)), None),
    };
    failed.into_iter().chain(scan.into_iter().flatten())
}

/// The entries of a scan as owned bytes; a scan that could not start is one error.
fn entries(
    scan: Result<Scan, StateError>,
) -> impl Iterator<Item = Result<(Vec<u8>, Vec<u8>), StateError>> {
    scan_items(scan.map(|s| {
        s.map(|kv| {
            let (k, v) = kv.into_inner()?;
            Ok((k.to_vec(), v.to_vec()))
        })
    }))
}

/// A keyspace of the run state, as a [`Batch`] names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Space {
    Meta,
    Results,
    Done,
    Jobs,
    Held,
    Share,
}

/// The writes of one commit, each key's last: a value, or `None` to remove it.
#[derive(Default)]
pub(crate) struct Batch {
    writes: HashMap<(Space, Vec<u8>), Option<Vec<u8>>>,
}

impl Batch {
    pub(crate) fn put(&mut self, space: Space, key: &[u8], value: Vec<u8>) {
        self.writes.insert((space, key.to_vec()), Some(value));
    }

    pub(crate) fn remove(&mut self, space: Space, key: &[u8]) {
        self.writes.insert((space, key.to_vec()), None);
    }

    /// This batch's write of `key`, if it has one (`Some(None)`: a removal).
    fn get(&self, space: Space, key: &[u8]) -> Option<Option<&[u8]>> {
        self.writes.get(&(space, key.to_vec())).map(|v| v.as_deref())
    }

    /// Whether this batch writes a value for `key`.
    fn has(&self, space: Space, key: &[u8]) -> bool {
        matches!(self.get(space, key), Some(Some(_)))
    }
}

fn decode_labels(
    scan: Result<Scan, StateError>,
) -> impl Iterator<Item = Result<(ItemKey, Vec<u8>), StateError>> {
    entries(scan).map(|kv| {
        let (k, v) = kv?;
        let key = ItemKey::from_bytes(&k).ok_or_else(|| StateError::Corrupt {
            what: "done key".into(),
            reason: format!("{} bytes", k.len()),
        })?;
        Ok((key, v))
    })
}

/// A job id stored as the key of `table`, or an error naming the table.
pub(crate) fn job_key(key: &[u8], table: &str) -> Result<JobId, StateError> {
    JobId::from_slice(key).ok_or_else(|| StateError::Corrupt {
        what: format!("{table} key"),
        reason: format!("{} bytes", key.len()),
    })
}

/// One write of [`RunDb::commit_writes`].
#[derive(Clone, Copy, Debug)]
pub enum Write<'a> {
    /// A result in its stored form ([`halyard_proto::stored::encode_result`]), stored if
    /// its job has none; [`Share::Put`]: marked for the shared cache too (`share`), if
    /// stored; [`Share::Used`]: its answer came from that cache, whose entry's use is
    /// counted ([`RunDb::take_marked`]), if stored.
    Result(&'a JobId, &'a [u8], Share),
    /// An item is finished with this label.
    Label(ItemKey, &'a [u8]),
    /// The note of a dead-lettered job, stored if it has none.
    JobNote(&'a JobId, &'a JobMeta),
    /// The cost totals.
    Costs(&'a [halyard_plan::cost::ClassTotals]),
    /// The refusals counted so far.
    Intake(&'a halyard_plan::store::Intake),
    /// A result held aside for a job not planned: the pool token of its subject, its wire
    /// form. Stored if the job has none held.
    Hold(&'a JobId, &'a str, &'a [u8]),
    /// The result held aside for a job is gone (it answered its job, or was refused).
    Unhold(&'a JobId),
}

/// A held result's value: the pool token's length (one byte; tokens are short), the
/// token, the result's wire form.
fn held_value(pool: &str, encoded: &[u8]) -> Vec<u8> {
    let pool = &pool.as_bytes()[..pool.len().min(255)];
    let mut v = Vec::with_capacity(1 + pool.len() + encoded.len());
    v.push(pool.len() as u8);
    v.extend_from_slice(pool);
    v.extend_from_slice(encoded);
    v
}

/// A held result's pool token and wire form, or None if the value is cut short.
fn held_parts(v: &[u8]) -> Option<(String, Vec<u8>)> {
    let (&n, rest) = v.split_first()?;
    let n = n as usize;
    if rest.len() < n {
        return None;
    }
    let pool = std::str::from_utf8(&rest[..n]).ok()?.to_string();
    Some((pool, rest[n..].to_vec()))
}

/// A crash point for tests: `HALYARD_COORDINATOR_FAILPOINT=mid-commit:<n>` makes the
/// coordinator abort in its n-th commit of two writes or more, after half of the writes
/// are in the transaction. Read once; unset, it costs a branch per commit.
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

    pub fn crash() -> ! {
        eprintln!("{ENV}: aborting in the middle of a commit");
        std::process::abort()
    }
}

/// A stored result, or an error naming its record.
pub(crate) fn decode_stored(job: &JobId, bytes: &[u8]) -> Result<StoredResult, StateError> {
    Ok(halyard_plan::store::decode_stored(job, bytes)?)
}

impl From<halyard_plan::store::StoreError> for StateError {
    fn from(e: halyard_plan::store::StoreError) -> Self {
        match e {
            halyard_plan::store::StoreError::Io(e) => StateError::Io(e),
            halyard_plan::store::StoreError::Corrupt { what, reason } => {
                StateError::Corrupt { what, reason }
            }
        }
    }
}

impl From<StateError> for halyard_plan::store::StoreError {
    fn from(e: StateError) -> Self {
        match e {
            StateError::Corrupt { what, reason } => {
                halyard_plan::store::StoreError::Corrupt { what, reason }
            }
            other => halyard_plan::store::StoreError::Io(other.to_string()),
        }
    }
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
                refusal: false,
                source: Default::default(),
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
        let st = RunDb::open(dir.path()).unwrap();
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
        let st = RunDb::open(dir.path()).unwrap();
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
        let totals = vec![halyard_plan::cost::ClassTotals { jobs: 2, ..Default::default() }];
        st.commit_writes(&[
            Write::Result(&j1, &r1, Share::No),
            Write::Result(&j2, &r2a, Share::No),
            Write::Result(&j2, &r2b, Share::No),
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

    /// A run state written by an earlier build (sled, results with named fields) opens
    /// with its run id, results, labels, notes and cost totals, and counts its results
    /// as stored (a redelivery is a duplicate).
    #[tokio::test]
    async fn a_sled_run_state_of_an_earlier_build_resumes() {
        let dir = tempfile::tempdir().unwrap();
        let meta = RunMeta { id: Uuid::now_v7(), name: "old".into(), created_unix_ms: 1 };
        let item = ItemKey { bench: 0, model: 1, item: 2 };
        let note = JobMeta { pool: "p".into(), stage: "s".into(), model: "m".into() };
        {
            let old = sled::open(dir.path()).unwrap();
            let t = |n: &str| old.open_tree(n).unwrap();
            t("meta").insert(b"run", enc(&meta).unwrap()).unwrap();
            // The whole wire result with field names, as builds before the compact form
            // stored it.
            t("results")
                .insert(JobId([1; 16]).as_bytes(), enc(&result(1, "old answer", false)).unwrap())
                .unwrap();
            t("done").insert(item.to_bytes(), &b"label"[..]).unwrap();
            t("jobs").insert(JobId([1; 16]).as_bytes(), enc(&note).unwrap()).unwrap();
            t("halyard_store").insert(halyard_store::mark::MARK_KEY, &b"1"[..]).unwrap();
            old.flush().unwrap();
        }
        halyard_store::mark::write_file(dir.path()).unwrap();
        let st = RunDb::open(dir.path()).unwrap();
        assert_eq!(st.run_meta("old").unwrap(), (meta, false));
        assert_eq!(st.results_at_open(), 1);
        match st.result(&JobId([1; 16])).unwrap().unwrap().outcome {
            Outcome::Done(c) => assert_eq!(c.text, "old answer"),
            o => panic!("{o:?}"),
        }
        assert!(!st.insert_result(&result(1, "redelivered", false)).unwrap());
        let labels: Vec<_> = st.labels().collect::<Result<_, _>>().unwrap();
        assert_eq!(labels, vec![(item, b"label".to_vec())]);
        assert_eq!(st.job_meta(&JobId([1; 16])).unwrap(), Some(note));
        assert!(!dir.path().join("db").exists(), "sled's files were left behind");
    }

    /// The run id is created once and survives reopening; item keys round-trip in order.
    #[tokio::test]
    async fn run_identity_is_stable() {
        let dir = tempfile::tempdir().unwrap();
        let id = {
            let st = RunDb::open(dir.path()).unwrap();
            let (m, created) = st.run_meta("x").unwrap();
            assert!(created);
            st.flush().await.unwrap();
            m.id
        };
        let st = RunDb::open(dir.path()).unwrap();
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

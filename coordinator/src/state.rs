//! The coordinator's run state: one redb database ([`halyard_store`]).
//!
//! Tables:
//! - `meta`: the run's identity ([`RunMeta`]), the cost totals, the outages, the retry
//!   round of `halyard retry-failed`.
//! - `results`: job id → the first result received for it, as a [`StoredResult`] in the
//!   compact form of [`halyard_proto::stored`] (outcome, deliveries, cached; whole
//!   [`JobResult`]s written by earlier builds still read). Inserted only if the job has
//!   none, so a job is counted once whatever duplicates arrive. Written through its log
//!   `results_log` and kept in compressed blocks, `results_blocks`
//!   ([`halyard_store::Logged`]: job ids are random, and inserted one by one each would
//!   copy a page of the table); `results` itself holds records of earlier builds until
//!   the run state is opened.
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
//!
//! Every update is one redb transaction, committed without an fsync; [`RunDb::flush`]
//! makes everything committed so far durable with one. Results and item labels are
//! flushed before the result messages that carried them are acked; after a crash, a
//! redelivered result is recognised as a duplicate.
//!
//! Memory: redb's page cache is capped at [`CACHE_BYTES`] (its default is 1 GiB), so a
//! run of a million results keeps a bounded footprint; the rest stays on disk.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use halyard_proto::stored::encode_result;
use halyard_proto::{JobId, JobIdFilter, JobResult, Outcome, StoredResult};
use halyard_store::logged::LoggedWrite;
use halyard_store::redb::{self, Database, ReadableDatabase, ReadableTable, ReadableTableMetadata};
use halyard_store::{table, LogTable, Logged, LoggedTables, Table};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use halyard_plan::store::{ItemKey, JobMeta};

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot open run state {path}: {reason} (is another coordinator using this output directory?)")]
    Open { path: String, reason: String },
    #[error("run state: {0}")]
    Io(String),
    #[error("run state record {what} is corrupt: {reason}")]
    Corrupt { what: String, reason: String },
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for StateError {
            fn from(e: $t) -> Self {
                StateError::Io(redb::Error::from(e).to_string())
            }
        }
    )*};
}
from_redb!(
    redb::Error,
    redb::StorageError,
    redb::TableError,
    redb::TransactionError,
    redb::CommitError,
    redb::SetDurabilityError
);

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RunMeta {
    pub id: Uuid,
    pub name: String,
    pub created_unix_ms: u64,
}

/// Page cache of the run state.
pub const CACHE_BYTES: usize = 64 << 20;

pub(crate) const META: Table = table("meta");
const RESULTS: Table = table("results");
const RESULTS_LOG: LogTable = redb::TableDefinition::new("results_log");
/// `results` written through its log and kept in blocks; the `results` table holds
/// records of earlier builds, moved into blocks at open.
const RESULTS_LOGGED: LoggedTables =
    LoggedTables { blocks: table("results_blocks"), log: RESULTS_LOG, older: RESULTS };
pub(crate) const DONE: Table = table("done");
const JOBS: Table = table("jobs");
pub(crate) const RETRIED: Table = table("retried");
pub(crate) const HISTORY: Table = table("dead_history");
const HELD: Table = table("held");
const TABLES: [Table; 7] = [META, RESULTS, DONE, JOBS, RETRIED, HISTORY, HELD];

/// A range of one table, read in a snapshot of its own.
type Scan = redb::Range<'static, &'static [u8], &'static [u8]>;

/// A run's database (`state/` in the run directory: results, done items, job notes,
/// totals). Its one writer is the coordinator that opened it (redb's file lock
/// keeps other processes out).
pub struct RunDb {
    db: Arc<Database>,
    /// The `results` table and its log.
    results: Logged,
    /// Every job with a stored result (filled at open, then on insert): most lookups
    /// are for jobs just planned, which have none, and need not reach the store.
    stored: JobIdFilter,
    results_at_open: u64,
    /// Something was committed since the last flush.
    dirty: AtomicBool,
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
        let db = halyard_store::open(dir, CACHE_BYTES, &TABLES)
            .map_err(|reason| StateError::Open { path: dir.display().to_string(), reason })?;
        let results = Logged::open(&db, RESULTS_LOGGED)?;
        let stored = JobIdFilter::new();
        let mut bad_key = None;
        let results_at_open = results.for_each_id(&db, |key| match job_key(key, "results") {
            Ok(id) => {
                stored.insert(&id);
                true
            }
            Err(e) => {
                bad_key = Some(e);
                false
            }
        })?;
        if let Some(e) = bad_key {
            return Err(e);
        }
        Ok(RunDb {
            db: Arc::new(db),
            results,
            stored,
            results_at_open,
            dirty: AtomicBool::new(false),
        })
    }

    /// One value of `table`.
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(table)?;
        let v = t.get(key)?.map(|v| v.value().to_vec());
        Ok(v)
    }

    /// Whether `table` holds `key`.
    fn contains(&self, table: Table, key: &[u8]) -> Result<bool, StateError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(table)?;
        let found = t.get(key)?.is_some();
        Ok(found)
    }

    /// `update` in one write transaction, committed without an fsync (see
    /// [`RunDb::flush`]).
    fn write<T>(
        &self,
        update: impl FnOnce(&redb::WriteTransaction) -> Result<T, StateError>,
    ) -> Result<T, StateError> {
        let mut tx = self.db.begin_write()?;
        tx.set_durability(redb::Durability::None)?;
        let out = update(&tx)?;
        tx.commit()?;
        self.dirty.store(true, Ordering::Release);
        Ok(out)
    }

    /// [`RunDb::write`] with the writer of `results` too (see [`Logged::write`]).
    fn write_results<T>(
        &self,
        update: impl FnOnce(&redb::WriteTransaction, &mut LoggedWrite<'_>) -> Result<T, StateError>,
    ) -> Result<T, StateError> {
        let out = self.results.write(&self.db, redb::Durability::None, update)?;
        self.dirty.store(true, Ordering::Release);
        Ok(out)
    }

    /// A scan of `table` from `lo` to `hi` (inclusive), or all of it.
    fn scan(&self, table: Table, bounds: Option<(&[u8], &[u8])>) -> Result<Scan, StateError> {
        let tx = self.db.begin_read()?;
        let t = tx.open_table(table)?;
        Ok(match bounds {
            Some((lo, hi)) => t.range::<&[u8]>(lo..=hi)?,
            None => t.range::<&[u8]>(..)?,
        })
    }

    /// The run's identity, created (UUID v7) on first use.
    pub fn run_meta(&self, name: &str) -> Result<(RunMeta, bool), StateError> {
        if let Some(b) = self.get(META, b"run")? {
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
        let tx = self.db.begin_write()?;
        tx.open_table(META)?.insert(&b"run"[..], &bytes[..])?;
        tx.commit()?;
        Ok((m, true))
    }

    /// Carry out `writes` as one atomic update: after a crash, either all of them are in
    /// the state or none is (one redb transaction). Written one by one, a crash could
    /// leave a prefix durable (a batch's results without the cost totals counting them):
    /// results that are never counted, since their redelivery is a duplicate.
    ///
    /// A result is stored only if its job has none (the first result wins); a job note
    /// likewise. Not durable until [`RunDb::flush`].
    pub fn commit_writes(&self, writes: &[Write<'_>]) -> Result<(), StateError> {
        let trip = failpoint::mid_commit(writes.len());
        self.write_results(|tx, results| {
            let mut done = tx.open_table(DONE)?;
            let mut jobs = tx.open_table(JOBS)?;
            let mut meta = tx.open_table(META)?;
            let mut held = tx.open_table(HELD)?;
            let mut fresh = std::collections::HashSet::new();
            for (i, w) in writes.iter().enumerate() {
                if trip == Some(i) {
                    failpoint::crash();
                }
                match w {
                    Write::Result(job, bytes) => {
                        // The filter has no false negatives: a job it has never seen has
                        // no result, unless this batch holds it twice.
                        let absent = if self.stored.may_contain(job) {
                            !results.contains(job.as_bytes())?
                        } else {
                            fresh.insert(**job)
                        };
                        if absent {
                            results.insert(job.as_bytes(), bytes)?;
                        }
                    }
                    Write::Label(item, label) => {
                        done.insert(&item.to_bytes()[..], *label)?;
                    }
                    Write::JobNote(job, note) => {
                        if jobs.get(&job.as_bytes()[..])?.is_none() {
                            jobs.insert(&job.as_bytes()[..], &enc(note)?[..])?;
                        }
                    }
                    Write::Costs(totals) => {
                        meta.insert(&b"costs"[..], &enc(totals)?[..])?;
                    }
                    Write::Intake(i) => {
                        meta.insert(&b"intake"[..], &enc(i)?[..])?;
                    }
                    Write::Hold(job, pool, encoded) => {
                        if held.get(&job.as_bytes()[..])?.is_none() {
                            held.insert(&job.as_bytes()[..], &held_value(pool, encoded)[..])?;
                        }
                    }
                    Write::Unhold(job) => {
                        held.remove(&job.as_bytes()[..])?;
                    }
                }
            }
            Ok(())
        })?;
        for w in writes {
            if let Write::Result(job, _) = w {
                self.stored.insert(job);
            }
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
        let inserted = self.write_results(|_, results| {
            if may_have && results.contains(job.as_bytes())? {
                return Ok(false);
            }
            results.insert(job.as_bytes(), &encoded)?;
            Ok(true)
        })?;
        self.stored.insert(&job);
        Ok(inserted)
    }

    /// The `results` table (for `dead_letters`, which moves results out of it).
    pub(crate) fn results_table(&self) -> &Logged {
        &self.results
    }

    /// Results recorded when the state was opened.
    pub fn results_at_open(&self) -> u64 {
        self.results_at_open
    }

    pub fn result(&self, job: &JobId) -> Result<Option<StoredResult>, StateError> {
        if !self.stored.may_contain(job) {
            return Ok(None);
        }
        self.results.get(&self.db, job.as_bytes(), |b| decode_stored(job, b))?.transpose()
    }

    /// Whether a result is stored for `job` (no decoding; most lookups stop at the filter).
    pub fn has_result(&self, job: &JobId) -> Result<bool, StateError> {
        if !self.stored.may_contain(job) {
            return Ok(false);
        }
        Ok(self.results.contains(&self.db, job.as_bytes())?)
    }

    pub fn job_meta(&self, job: &JobId) -> Result<Option<JobMeta>, StateError> {
        match self.get(JOBS, job.as_bytes())? {
            None => Ok(None),
            Some(b) => halyard_proto::decode("job meta", &b).map(Some).map_err(|e| {
                StateError::Corrupt { what: format!("jobs/{job}"), reason: e.to_string() }
            }),
        }
    }

    pub fn is_done(&self, item: ItemKey) -> Result<bool, StateError> {
        self.contains(DONE, &item.to_bytes())
    }

    /// Items finished, in all (0 if the store cannot be read: the next read reports it).
    pub fn done_count(&self) -> usize {
        let count = || -> Result<u64, StateError> {
            let tx = self.db.begin_read()?;
            let n = tx.open_table(DONE)?.len()?;
            Ok(n)
        };
        count().unwrap_or(0) as usize
    }

    /// Item labels in key order.
    pub fn labels(&self) -> impl Iterator<Item = Result<(ItemKey, Vec<u8>), StateError>> + '_ {
        decode_labels(self.scan(DONE, None))
    }

    /// Labels of one benchmark and model in item order (a range scan, not a full pass).
    pub fn labels_of(
        &self,
        bench: u32,
        model: u32,
    ) -> impl Iterator<Item = Result<(ItemKey, Vec<u8>), StateError>> + '_ {
        let lo = ItemKey { bench, model, item: 0 }.to_bytes();
        let hi = ItemKey { bench, model, item: u32::MAX }.to_bytes();
        decode_labels(self.scan(DONE, Some((&lo, &hi))))
    }

    /// Every recorded result with its job (for totals and dead letters).
    pub fn results(&self) -> impl Iterator<Item = Result<(JobId, StoredResult), StateError>> + '_ {
        let scan = self.results.entries(&self.db).map_err(StateError::from);
        scan_items(scan.map(|s| s.map(|kv| kv.map_err(StateError::from)))).map(|kv| {
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
        match self.get(META, b"intake")? {
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
        match self.get(HELD, job.as_bytes())? {
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
        let tx = self.db.begin_read()?;
        let t = tx.open_table(HELD)?;
        let mut h = halyard_plan::store::Held::default();
        for e in t.iter()? {
            let (_, v) = e?;
            h.results += 1;
            h.bytes += v.value().len().saturating_sub(1) as u64;
        }
        Ok(h)
    }

    /// The cost accounting totals stored by an earlier process (empty if none).
    pub fn costs(&self) -> Result<Vec<halyard_plan::cost::ClassTotals>, StateError> {
        match self.get(META, b"costs")? {
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
        self.write(|tx| {
            tx.open_table(META)?.insert(&b"outages"[..], &bytes[..])?;
            Ok(())
        })
    }

    /// The endpoint outages stored so far (empty if none).
    pub fn outages(&self) -> Result<Vec<halyard_plan::outage::OutageSpan>, StateError> {
        match self.get(META, b"outages")? {
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

    /// The database itself, for tables owned by other modules (`dead_letters`).
    pub(crate) fn db(&self) -> &Database {
        &self.db
    }

    /// Make everything committed so far durable (one fsync, off the async threads; none
    /// if nothing was committed since the last flush).
    pub async fn flush(&self) -> Result<(), StateError> {
        if !self.dirty.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let db = self.db.clone();
        let res = tokio::task::spawn_blocking(move || halyard_store::make_durable(&db))
            .await
            .map_err(|e| StateError::Io(format!("flush: {e}")))
            .and_then(|r| r.map_err(StateError::from));
        if res.is_err() {
            self.dirty.store(true, Ordering::Release);
        }
        res
    }
}

impl Drop for RunDb {
    /// Commits since the last flush are made durable on the way out (every path that
    /// acks flushes first; this covers writes nobody waited for, such as the outages).
    fn drop(&mut self) {
        if self.dirty.load(Ordering::Acquire) {
            if let Err(e) = halyard_store::make_durable(&self.db) {
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
            let (k, v) = kv?;
            Ok((k.value().to_vec(), v.value().to_vec()))
        })
    }))
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
    /// its job has none.
    Result(&'a JobId, &'a [u8]),
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
            t("halyard_store").insert(halyard_proto::store_mark::MARK_KEY, &b"1"[..]).unwrap();
            old.flush().unwrap();
        }
        halyard_proto::store_mark::write_file(dir.path()).unwrap();
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

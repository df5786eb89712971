//! The machine tier: one SQLite database (`results.sqlite` in the cache directory) in
//! WAL mode, read and written by every Halyard process of the machine at once.
//!
//! - **Rows**: one per job id (found by a unique index on the id's first 8 bytes as an
//!   integer; rows are appended in the order they are written, see [`TABLE`]): the job's
//!   key (so that a row
//!   is checked on every read: its key must hash to its id; and so that an export names
//!   the request), the completion in the checkpoint's compact form, the model and stage
//!   (for `halyard cache stats`), when it was written and when it was last used.
//! - **Reads** are one indexed statement on a connection of their own; SQLite's WAL gives
//!   each a snapshot, so a prune running in another process never cuts a read short.
//! - **Writes** (new entries, and the "used" time of entries read) go to one writer
//!   thread per process, which gathers what arrives for at least [`GROUP_WAIT`] (longer
//!   while rows arrive faster than it commits them, see [`gather_for`]) and commits it in
//!   one transaction
//!   (`BEGIN IMMEDIATE`, other processes wait up to [`BUSY_TIMEOUT`]). Writes are not
//!   on the job's path: the worker's checkpoint is what makes a result durable, the cache
//!   only spares later runs a call. `synchronous = NORMAL`: a power cut may lose the last
//!   commits, never corrupt the file.
//! - **Full**: a write refused for space (the disk, or the size limit's hard cap) is
//!   dropped with one warning per process; reads go on, and every miss is called.
//! - **Pruning** ([`MachineCache::prune`]) removes entries unused for `max_age`, then the
//!   least recently used until the live bytes are under `max_bytes`, but never an entry
//!   used or written in the last `min_age` (a live run's).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use halyard_proto::{Completion, JobId, JobKey};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use tokio::sync::{mpsc, oneshot};

use crate::claims::{Claims, Taken};
use crate::reader;
use crate::rows::{h, now_s};
use crate::CacheError;

/// The database file in the cache directory.
pub const FILE: &str = "results.sqlite";
/// How long a process waits for another one's write lock.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(30);
/// A read updates an entry's "used" time at most this often.
const TOUCH_EVERY: u64 = 60;
/// Largest number of writes in one transaction: a writer that falls behind commits what
/// queued meanwhile in one go (each commit touches pages of the id index all over, so
/// fewer, larger commits write fewer pages per row; at most about 16 MB held).
const MAX_GROUP: usize = 32 * 1024;
/// How long the writer gathers writes after the first of a group before it commits them
/// in one transaction at least (unless the group is full or a flush waits): a run's
/// results arrive one by one, and a transaction per handful of rows cost more than the
/// rows. Each commit also makes every reader of the machine drop its page cache at its
/// next read; 100 ms is nothing beside a paid call's seconds.
const GROUP_WAIT: Duration = Duration::from_millis(100);
/// The longest the writer gathers (see [`gather_for`]).
const MAX_GATHER: Duration = Duration::from_secs(2);
/// The writer's page cache (KiB): the pages its inserts touch stay in memory.
const WRITER_CACHE_KIB: i64 = 32 * 1024;
/// The largest the write-ahead log grows before the writer checkpoints it and truncates
/// it ([`WalCheck`]); a smaller cache's log is at most an eighth of its size
/// limit (1 MiB at the least). SQLite's automatic checkpoint (every 1,000 pages) is off on
/// the writer's connection: a noop run's commits of thousands of rows rewrite most pages
/// of the id index each time, and a checkpoint after each commit copied each such page
/// into the file (and synced it) every time. And a passive checkpoint can only copy what
/// no reader's snapshot still needs: with lookups that share a snapshot for milliseconds
/// ([`reader`]) there is nearly always one from before the last commit, the log is never
/// wholly copied back, so never started over, and it grew without bound for as long as
/// lookups went on.
const WAL_LIMIT_BYTES: u64 = 40 << 20;
/// How long the writer's checkpoint waits for readers still on an older snapshot (they
/// move on within [`reader::SNAPSHOT_FOR`]); one that times out is tried after the next
/// commit.
const CHECKPOINT_WAIT: Duration = Duration::from_millis(250);
/// The schema's version, in `PRAGMA user_version`.
const SCHEMA: i64 = 3;

/// How large the cache may grow and what pruning keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Live bytes pruning brings the cache under (the size limit).
    pub max_bytes: u64,
    /// Entries unused for this long are pruned whatever the size.
    pub max_age: Duration,
    /// Entries used or written this recently are never pruned.
    pub min_age: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: 10 << 30,
            max_age: Duration::from_secs(180 * 24 * 3600),
            min_age: Duration::from_secs(3600),
        }
    }
}

impl Limits {
    /// The hard cap: writes past it are refused as "full" (a quarter above the limit).
    pub fn hard_cap(&self) -> u64 {
        self.max_bytes.saturating_add(self.max_bytes / 4)
    }
}

/// What [`MachineCache::stats`] reports.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    pub dir: String,
    pub entries: u64,
    /// Bytes of the database's used pages (the file may be larger: freed pages).
    pub live_bytes: u64,
    /// Bytes of the database file and its write-ahead log.
    pub file_bytes: u64,
    /// Entries per model (`backend model`).
    pub by_model: Vec<(String, u64)>,
    pub oldest_use: Option<u64>,
    pub newest_use: Option<u64>,
}

/// What a prune did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Pruned {
    pub removed: u64,
    pub live_bytes_before: u64,
    pub live_bytes_after: u64,
    /// Entries kept although the cache is over its limit, because they were used in the
    /// last `min_age`.
    pub kept_recent: u64,
}

enum Write {
    /// `release`: this process holds a claim on the job, given back once the row is
    /// committed.
    Put {
        id: JobId,
        key: Vec<u8>,
        completion: Vec<u8>,
        model: String,
        stage: String,
        release: bool,
    },
    Touch(JobId),
    Flush(oneshot::Sender<()>),
}

/// The machine tier, open in this process. Cheap to share (`Arc`).
pub struct MachineCache {
    dir: PathBuf,
    limits: Limits,
    /// The read connection (a snapshot lookups share for milliseconds: [`reader`]).
    read: Arc<reader::Shared>,
    tx: Mutex<Option<mpsc::Sender<Write>>>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    shared: Arc<Shared>,
    /// `None` when the claims file cannot be opened (said once): jobs are called
    /// unclaimed.
    claims: Option<Arc<Claims>>,
}

struct Shared {
    full_warned: AtomicBool,
    write_failed_warned: AtomicBool,
    /// Entries written by this process (committed).
    written: AtomicU64,
    /// Writes dropped because the writer's queue was full.
    dropped: AtomicU64,
}

fn db_err(dir: &Path, e: rusqlite::Error) -> CacheError {
    CacheError::Db { path: dir.join(FILE).display().to_string(), reason: e.to_string() }
}

fn is_full(e: &rusqlite::Error) -> bool {
    matches!(e.sqlite_error_code(), Some(rusqlite::ErrorCode::DiskFull))
}

/// Open a connection with the cache's settings, creating the schema if needed.
fn connect(dir: &Path, limits: &Limits) -> Result<Connection, CacheError> {
    let err = |e| db_err(dir, e);
    let mut conn = Connection::open_with_flags(
        dir.join(FILE),
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(err)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(err)?;
    // Before any table: auto_vacuum only takes effect on an empty database. Incremental:
    // a prune gives the pages it freed back to the file system.
    conn.pragma_update(None, "auto_vacuum", "INCREMENTAL").map_err(err)?;
    let mode: String =
        conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0)).map_err(err)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(CacheError::Db {
            path: dir.join(FILE).display().to_string(),
            reason: format!("the file system refused SQLite's write-ahead log (journal mode {mode}); a cache on a network file system is not supported"),
        });
    }
    conn.pragma_update(None, "synchronous", "NORMAL").map_err(err)?;
    let page: u64 = conn.pragma_query_value(None, "page_size", |r| r.get(0)).map_err(err)?;
    let cap_pages = (limits.hard_cap() / page.max(512)).max(16);
    conn.pragma_update(None, "max_page_count", cap_pages).map_err(err)?;
    schema(&mut conn)
        .map_err(err)?
        .map_err(|reason| CacheError::Db { path: dir.join(FILE).display().to_string(), reason })?;
    Ok(conn)
}

/// The entries table, schema 3. Rows are appended in rowid order and found by the
/// unique index on `h`, the id's first 8 bytes as an integer ([`h`]); a read also
/// compares the whole `id`. Schema 1 kept the rows themselves in `id` order (`WITHOUT
/// ROWID`): each of a commit's rows landed on a page of its own among all the table's,
/// so every commit wrote about a page (4 KiB) to the write-ahead log per 300-byte row.
/// Schema 2 appended the rows but indexed the 16-byte id: its index's entries were
/// about twice the size, so a commit's rows, which land at random places in it, touched
/// about twice as many pages once the index had more pages than a commit has rows.
/// Two ids that share their first 8 bytes (about one chance in 10^7 among a million
/// entries) cannot both be cached: the second is not written, and its reads miss.
const TABLE: &str = "CREATE TABLE entries (
        h INTEGER NOT NULL UNIQUE,
        id BLOB NOT NULL,
        key BLOB NOT NULL,
        completion BLOB NOT NULL,
        model TEXT NOT NULL,
        stage TEXT NOT NULL,
        written INTEGER NOT NULL,
        used INTEGER NOT NULL
    );
    CREATE INDEX entries_used ON entries(used);";

/// Bring the file to schema [`SCHEMA`] in one transaction (the first process to take the
/// write lock does it; the others then find it done): create it in an empty file, or
/// move the rows of a schema 1 or 2 file (the same columns, without `h`) into the new
/// table, in the order they were written. `Err` (inside `Ok`) for a file of a later
/// schema.
fn schema(conn: &mut Connection) -> rusqlite::Result<Result<(), String>> {
    let version =
        |c: &Connection| c.pragma_query_value(None, "user_version", |r| r.get::<_, i64>(0));
    if version(conn)? == SCHEMA {
        return Ok(Ok(()));
    }
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    match version(&tx)? {
        SCHEMA => return Ok(Ok(())),
        0 => tx.execute_batch(TABLE)?,
        1 | 2 => {
            tx.execute_batch(&format!(
                "ALTER TABLE entries RENAME TO entries_old;
                 DROP INDEX IF EXISTS entries_used;
                 {TABLE}"
            ))?;
            move_rows(&tx)?;
            tx.execute_batch("DROP TABLE entries_old;")?;
        }
        v => {
            return Ok(Err(format!(
                "written by a later Halyard (schema {v}, this build reads {SCHEMA}); use another --cache directory"
            )))
        }
    }
    tx.pragma_update(None, "user_version", SCHEMA)?;
    tx.commit()?;
    Ok(Ok(()))
}

/// Copy the rows of `entries_old` (schema 1 or 2) into `entries`, oldest first, with
/// their index key. A row whose id is not 16 bytes is left behind (no read could find
/// it).
fn move_rows(tx: &rusqlite::Transaction) -> rusqlite::Result<()> {
    let mut read = tx.prepare(
        "SELECT id, key, completion, model, stage, written, used FROM entries_old
         ORDER BY written",
    )?;
    let mut write = tx.prepare(
        "INSERT OR IGNORE INTO entries (h, id, key, completion, model, stage, written, used)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?;
    let mut rows = read.query([])?;
    while let Some(r) = rows.next()? {
        let id: Vec<u8> = r.get(0)?;
        let Some(job) = JobId::from_slice(&id) else { continue };
        write.execute(params![
            h(&job),
            id,
            r.get::<_, Vec<u8>>(1)?,
            r.get::<_, Vec<u8>>(2)?,
            r.get::<_, String>(3)?,
            r.get::<_, String>(4)?,
            r.get::<_, i64>(5)?,
            r.get::<_, i64>(6)?
        ])?;
    }
    Ok(())
}

/// A row read back: checked against its id.
fn decode_row(id: &JobId, key: &[u8], completion: &[u8]) -> Result<(JobKey, Completion), String> {
    let key: JobKey = halyard_proto::decode("cache entry key", key)
        .map_err(|e| format!("its job key does not decode: {e}"))?;
    if key.id() != *id {
        return Err(format!("its job key hashes to {}, not to its id", key.id()));
    }
    let c = halyard_proto::stored::decode_completion(completion)
        .map_err(|e| format!("its completion does not decode: {e}"))?;
    Ok((key, c))
}

fn model_label(key: &JobKey) -> String {
    format!("{} {}", key.model.backend, key.model.model)
}

impl MachineCache {
    /// Open (or create) the cache in `dir` and start this process's writer thread.
    pub fn open(dir: &Path, limits: Limits) -> Result<MachineCache, CacheError> {
        std::fs::create_dir_all(dir).map_err(|e| CacheError::Db {
            path: dir.display().to_string(),
            reason: format!("cannot create the cache directory: {e}"),
        })?;
        let write = connect(dir, &limits)?;
        write.pragma_update(None, "cache_size", -WRITER_CACHE_KIB).map_err(|e| db_err(dir, e))?;
        write.pragma_update(None, "wal_autocheckpoint", 0).map_err(|e| db_err(dir, e))?;
        let wal = WalCheck::new(&limits);
        let read = reader::Shared::start(connect(dir, &limits)?).map_err(|e| CacheError::Db {
            path: dir.display().to_string(),
            reason: format!("cannot start the cache's reader thread: {e}"),
        })?;
        let shared = Arc::new(Shared {
            full_warned: AtomicBool::new(false),
            write_failed_warned: AtomicBool::new(false),
            written: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        });
        let claims = match Claims::open(dir) {
            Ok(c) => Some(Arc::new(c)),
            Err(e) => {
                tracing::warn!(error = %e, "the result cache's claims cannot be used: two runs of this machine may both pay for a job they call at the same moment");
                None
            }
        };
        let (tx, rx) = mpsc::channel(16 * 1024);
        let (d, s, c) = (dir.to_path_buf(), shared.clone(), claims.clone());
        let writer = std::thread::Builder::new()
            .name("halyard-cache-writer".into())
            .spawn(move || writer_loop(&d, write, wal, rx, &s, c.as_deref()))
            .map_err(|e| {
                read.stop();
                CacheError::Db {
                    path: dir.display().to_string(),
                    reason: format!("cannot start the cache's writer thread: {e}"),
                }
            })?;
        Ok(MachineCache {
            dir: dir.to_path_buf(),
            limits,
            read,
            tx: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(writer)),
            shared,
            claims,
        })
    }

    /// Claim `id` for this process before calling its model (see [`crate::claims`]):
    /// [`Taken::Held`] when another process is calling it now. Without claims (the file
    /// could not be opened, or a claim transaction failed: said by the caller) the job
    /// is this process's.
    pub fn claim(&self, id: &JobId) -> Result<Taken, CacheError> {
        match &self.claims {
            Some(c) => c.take(id),
            None => Ok(Taken::Mine),
        }
    }

    /// Give back this process's claim on `id`, if it holds one: its call ended without
    /// an answer to write (an answer written with [`MachineCache::put`] gives it back
    /// once committed).
    pub fn release(&self, id: &JobId) {
        if let Some(c) = &self.claims {
            if c.forget(id) {
                if let Err(e) = c.release(&[*id]) {
                    tracing::warn!(job = %id, error = %e, "could not give back a result cache claim; it expires by itself");
                }
            }
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The entry for `id`, if the cache holds one whose key hashes to `id`, as of a
    /// snapshot at most [`reader::SNAPSHOT_FOR`] old. A row that does not check out is an
    /// error naming the job (the caller calls the model).
    pub fn get(&self, id: &JobId) -> Result<Option<Completion>, CacheError> {
        Ok(self.get_entry(id, false)?.map(|(_, c)| c))
    }

    /// [`MachineCache::get`] as of the latest commit of any process (after taking the
    /// job's claim: its last holder may have committed the answer just now).
    pub fn get_latest(&self, id: &JobId) -> Result<Option<Completion>, CacheError> {
        Ok(self.get_entry(id, true)?.map(|(_, c)| c))
    }

    /// The entry for `id` with the job key stored beside the completion; `fresh`: in a
    /// new snapshot.
    fn get_entry(
        &self,
        id: &JobId,
        fresh: bool,
    ) -> Result<Option<(JobKey, Completion)>, CacheError> {
        let row = {
            let mut r = self.read.lock();
            let read = |r: &mut reader::Reader| {
                if r.snapshot(fresh)? {
                    self.read.opened();
                }
                let mut st = r.conn().prepare_cached(
                    "SELECT key, completion, used FROM entries WHERE h = ?1 AND id = ?2",
                )?;
                st.query_row(params![h(id), &id.as_bytes()[..]], |r| {
                    Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, Vec<u8>>(1)?, r.get::<_, i64>(2)?))
                })
                .optional()
            };
            read(&mut r).map_err(|e| {
                r.end();
                db_err(&self.dir, e)
            })?
        };
        let Some((key, completion, used)) = row else { return Ok(None) };
        let entry = decode_row(id, &key, &completion)
            .map_err(|reason| CacheError::Corrupt { job: *id, reason })?;
        if now_s().saturating_sub(used as u64) >= TOUCH_EVERY {
            self.send(Write::Touch(*id));
        }
        Ok(Some(entry))
    }

    /// Queue `completion` of the job `key` for writing (returns at once; see
    /// [`MachineCache::flush`]).
    pub fn put(&self, key: &JobKey, completion: &Completion) {
        self.put_as(key, key.id(), completion)
    }

    /// [`MachineCache::put`] of a job whose id the caller has (hashing the key again
    /// costs the job's path; a row whose key does not hash to its id is refused on read).
    pub(crate) fn put_as(&self, key: &JobKey, id: JobId, completion: &Completion) {
        let encoded = halyard_proto::encode(key).and_then(|k| {
            halyard_proto::stored::encode_completion(&crate::as_entry(completion)).map(|c| (k, c))
        });
        match encoded {
            Ok((k, c)) => {
                let release = self.claims.as_ref().is_some_and(|c| c.forget(&id));
                self.send(Write::Put {
                    id,
                    key: k,
                    completion: c,
                    model: model_label(key),
                    stage: format!("{}/{}", key.pipeline, key.stage),
                    release,
                })
            }
            Err(e) => {
                tracing::warn!(job = %id, error = %e, "cannot encode a cache entry; not cached");
                self.release(&id);
            }
        }
    }

    fn send(&self, w: Write) {
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(tx) = tx {
            // A full queue drops the write: the cache is never the job's bottleneck.
            if let Err(mpsc::error::TrySendError::Full(w)) = tx.try_send(w) {
                if self.shared.dropped.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!(dir = %self.dir.display(), "the machine cache's writer falls behind: some results are not cached (the run keeps them; said once)");
                }
                if let (Write::Put { id, release: true, .. }, Some(c)) = (w, &self.claims) {
                    if let Err(e) = c.release(&[id]) {
                        tracing::warn!(job = %id, error = %e, "could not give back a result cache claim; it expires by itself");
                    }
                }
            }
        }
    }

    /// Wait until every write queued before this call is committed (or refused).
    pub async fn flush(&self) {
        let (done, wait) = oneshot::channel();
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(tx) = tx {
            if tx.send(Write::Flush(done)).await.is_ok() {
                let _ = wait.await;
            }
        }
    }

    /// Flush, then stop the writer thread.
    pub async fn close(&self) {
        self.flush().await;
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
        let writer = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(w) = writer {
            let _ = tokio::task::spawn_blocking(move || w.join()).await;
        }
        if let Some(c) = self.claims.clone() {
            let _ = tokio::task::spawn_blocking(move || c.close()).await;
        }
    }

    /// Entries this process committed.
    pub fn written(&self) -> u64 {
        self.shared.written.load(Ordering::Relaxed)
    }

    /// Writes dropped because the writer fell behind (its queue was full).
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// Whether a write was refused for space.
    pub fn was_full(&self) -> bool {
        self.shared.full_warned.load(Ordering::Relaxed)
    }

    /// Count what the cache holds.
    pub fn stats(&self) -> Result<Stats, CacheError> {
        let mut r = self.read.lock();
        let conn = r.latest();
        let err = |e| db_err(&self.dir, e);
        let entries: u64 =
            conn.query_row("SELECT count(*) FROM entries", [], |r| r.get(0)).map_err(err)?;
        let mut st = conn
            .prepare("SELECT model, count(*) FROM entries GROUP BY model ORDER BY model")
            .map_err(err)?;
        let by_model = st
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, u64>(1)?)))
            .map_err(err)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(err)?;
        let (oldest_use, newest_use) = conn
            .query_row("SELECT min(used), max(used) FROM entries", [], |r| {
                Ok((r.get::<_, Option<u64>>(0)?, r.get::<_, Option<u64>>(1)?))
            })
            .map_err(err)?;
        let file_bytes = [FILE.to_string(), format!("{FILE}-wal")]
            .iter()
            .filter_map(|f| std::fs::metadata(self.dir.join(f)).ok())
            .map(|m| m.len())
            .sum();
        Ok(Stats {
            dir: self.dir.display().to_string(),
            entries,
            live_bytes: live_bytes(conn).map_err(err)?,
            file_bytes,
            by_model,
            oldest_use,
            newest_use,
        })
    }

    /// SQLite's own check of the whole file (`PRAGMA integrity_check`): `Ok(())`, or the
    /// problems it lists.
    pub fn integrity(&self) -> Result<(), CacheError> {
        let mut r = self.read.lock();
        let conn = r.latest();
        let mut st = conn.prepare("PRAGMA integrity_check").map_err(|e| db_err(&self.dir, e))?;
        let lines = st
            .query_map([], |r| r.get::<_, String>(0))
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|e| db_err(&self.dir, e))?;
        if lines == ["ok"] {
            Ok(())
        } else {
            Err(CacheError::Db {
                path: self.dir.join(FILE).display().to_string(),
                reason: format!("integrity check: {}", lines.join("; ")),
            })
        }
    }

    /// Remove entries unused for `limits.max_age`, then the least recently used until
    /// the live bytes are under `limits.max_bytes`; never one used in `limits.min_age`.
    /// Runs on its own connection (any process may prune while others read and write).
    pub fn prune(&self, limits: Limits) -> Result<Pruned, CacheError> {
        let conn = connect(&self.dir, &limits)?;
        let pruned = prune(&conn, limits, now_s()).map_err(|e| db_err(&self.dir, e))?;
        WalCheck::new(&limits).after_commit(&conn, &self.dir);
        Ok(pruned)
    }

    /// Every entry, for an export: (id, key, completion), rows that do not check out
    /// skipped with a warning.
    pub fn entries(&self) -> Result<Vec<(JobId, JobKey, Completion)>, CacheError> {
        let mut r = self.read.lock();
        let conn = r.latest();
        let err = |e| db_err(&self.dir, e);
        let mut st = conn.prepare("SELECT id, key, completion FROM entries").map_err(err)?;
        let rows = st
            .query_map([], |r| {
                Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, Vec<u8>>(1)?, r.get::<_, Vec<u8>>(2)?))
            })
            .map_err(err)?;
        let mut out = Vec::new();
        for row in rows {
            let (id, key, completion) = row.map_err(err)?;
            let Some(id) = JobId::from_slice(&id) else {
                tracing::warn!(
                    id_bytes = id.len(),
                    "cache row with an id that is not 16 bytes; skipped"
                );
                continue;
            };
            match decode_row(&id, &key, &completion) {
                Ok((k, c)) => out.push((id, k, c)),
                Err(reason) => {
                    tracing::warn!(job = %id, %reason, "cache entry does not check out; skipped")
                }
            }
        }
        Ok(out)
    }

    /// Write `entries` now, in one transaction (an import): those already there are kept.
    /// Returns how many were new.
    pub fn insert_now(&self, entries: &[(JobKey, Completion)]) -> Result<u64, CacheError> {
        let mut conn =
            connect(&self.dir, &Limits { max_bytes: u64::MAX / 2, ..Limits::default() })?;
        let err = |e| db_err(&self.dir, e);
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(err)?;
        let mut new = 0;
        {
            let mut st = tx.prepare(INSERT).map_err(err)?;
            let now = now_s() as i64;
            for (key, c) in entries {
                let k =
                    halyard_proto::encode(key).map_err(|e| CacheError::Encode(e.to_string()))?;
                let cb = halyard_proto::stored::encode_completion(&crate::as_entry(c))
                    .map_err(|e| CacheError::Encode(e.to_string()))?;
                let stage = format!("{}/{}", key.pipeline, key.stage);
                let id = key.id();
                new += st
                    .execute(params![
                        h(&id),
                        &id.as_bytes()[..],
                        k,
                        cb,
                        model_label(key),
                        stage,
                        now
                    ])
                    .map_err(err)? as u64;
            }
        }
        tx.commit().map_err(err)?;
        // A process that only imports has no writer thread to keep the log bounded.
        WalCheck::new(&self.limits).after_commit(&conn, &self.dir);
        Ok(new)
    }
}

impl Drop for MachineCache {
    fn drop(&mut self) {
        // The writer ends once its channel closes; queued writes are still committed.
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
        self.read.stop();
    }
}

const INSERT: &str =
    "INSERT OR IGNORE INTO entries (h, id, key, completion, model, stage, written, used)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7)";

fn live_bytes(conn: &Connection) -> rusqlite::Result<u64> {
    let page: u64 = conn.pragma_query_value(None, "page_size", |r| r.get(0))?;
    let count: u64 = conn.pragma_query_value(None, "page_count", |r| r.get(0))?;
    let free: u64 = conn.pragma_query_value(None, "freelist_count", |r| r.get(0))?;
    Ok(count.saturating_sub(free) * page)
}

pub(crate) fn prune(conn: &Connection, limits: Limits, now: u64) -> rusqlite::Result<Pruned> {
    let before = live_bytes(conn)?;
    let recent = now.saturating_sub(limits.min_age.as_secs()) as i64;
    let old = now.saturating_sub(limits.max_age.as_secs()) as i64;
    let mut removed = conn
        .execute("DELETE FROM entries WHERE used < ?1 AND used < ?2", params![old, recent])?
        as u64;
    // Then the least recently used, a batch at a time, while over the limit.
    while live_bytes(conn)? > limits.max_bytes {
        let n = conn.execute(
            "DELETE FROM entries WHERE rowid IN
               (SELECT rowid FROM entries WHERE used < ?1 ORDER BY used LIMIT 256)",
            params![recent],
        )? as u64;
        if n == 0 {
            break;
        }
        removed += n;
        conn.execute_batch("PRAGMA incremental_vacuum")?;
    }
    conn.execute_batch("PRAGMA incremental_vacuum")?;
    let after = live_bytes(conn)?;
    let kept_recent = if after > limits.max_bytes {
        conn.query_row("SELECT count(*) FROM entries WHERE used >= ?1", params![recent], |r| {
            r.get(0)
        })?
    } else {
        0
    };
    Ok(Pruned { removed, live_bytes_before: before, live_bytes_after: after, kept_recent })
}

fn writer_loop(
    dir: &Path,
    mut conn: Connection,
    mut wal: WalCheck,
    mut rx: mpsc::Receiver<Write>,
    shared: &Shared,
    claims: Option<&Claims>,
) {
    let mut group = Vec::with_capacity(256);
    let mut last_commit = Duration::ZERO;
    while let Some(first) = rx.blocking_recv() {
        let mut flush = matches!(first, Write::Flush(_));
        group.push(first);
        let deadline = std::time::Instant::now() + gather_for(last_commit);
        loop {
            while group.len() < MAX_GROUP {
                match rx.try_recv() {
                    Ok(w) => {
                        flush |= matches!(w, Write::Flush(_));
                        group.push(w);
                    }
                    Err(_) => break,
                }
            }
            if flush || group.len() >= MAX_GROUP || std::time::Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let mut flushes = Vec::new();
        let mut writes = Vec::with_capacity(group.len());
        for w in group.drain(..) {
            match w {
                Write::Flush(done) => flushes.push(done),
                w => writes.push(w),
            }
        }
        if !writes.is_empty() {
            // In index order: consecutive inserts land on the same or neighbouring pages
            // of the id index instead of one at random among all of them.
            writes.sort_by_key(|w| match w {
                Write::Put { id, .. } | Write::Touch(id) => h(id),
                Write::Flush(_) => 0,
            });
            let started = std::time::Instant::now();
            let result = commit(&mut conn, &writes);
            last_commit = started.elapsed();
            match result {
                Ok(n) => {
                    shared.written.fetch_add(n, Ordering::Relaxed);
                }
                Err(e) if is_full(&e) => {
                    if !shared.full_warned.swap(true, Ordering::Relaxed) {
                        tracing::warn!(dir = %dir.display(), error = %e, "the machine cache is full (its disk, or its size limit: `halyard cache prune`); results are not cached from now on, and every call is made as without a cache");
                    }
                }
                Err(e) => {
                    if !shared.write_failed_warned.swap(true, Ordering::Relaxed) {
                        tracing::warn!(dir = %dir.display(), error = %e, "writing the machine cache failed; results are not cached (said once)");
                    }
                }
            }
        }
        // Claims are given back once their rows are committed (or refused): a process
        // that finds a claim gone finds the answer, or calls.
        if let Some(c) = claims {
            let released: Vec<JobId> = writes
                .iter()
                .filter_map(|w| match w {
                    Write::Put { id, release: true, .. } => Some(*id),
                    _ => None,
                })
                .collect();
            if let Err(e) = c.release(&released) {
                if !shared.write_failed_warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(dir = %dir.display(), error = %e, "giving back the result cache's claims failed; they expire by themselves (said once)");
                }
            }
        }
        for done in flushes {
            let _ = done.send(());
        }
        // After the claims are given back and the flushes answered: neither waits for it.
        if !writes.is_empty() {
            wal.after_commit(&conn, dir);
        }
    }
}

/// When to checkpoint the write-ahead log ([`WalCheck::after_commit`]).
struct WalCheck {
    limit: u64,
    /// The log file's size above which the next checkpoint is tried: `limit`, or more
    /// after one that readers kept from finishing.
    at: u64,
}

impl WalCheck {
    fn new(limits: &Limits) -> WalCheck {
        let limit = (limits.max_bytes / 8).clamp(1 << 20, WAL_LIMIT_BYTES);
        WalCheck { limit, at: limit }
    }

    /// After a commit on `conn`: checkpoint the write-ahead log into the database and
    /// truncate it once it is over the limit (see [`WAL_LIMIT_BYTES`]), waiting up to
    /// [`CHECKPOINT_WAIT`] for readers on an older snapshot. Once truncated, the log
    /// file's size is its length (it only grows by the commits appended to it). One that
    /// readers keep from finishing (a long read of another process, such as an export)
    /// is tried again once the log has grown by another quarter of the limit, so that
    /// such a reader does not cost every commit the wait.
    fn after_commit(&mut self, conn: &Connection, dir: &Path) {
        let wal = dir.join(format!("{FILE}-wal"));
        let len = std::fs::metadata(wal).map_or(0, |m| m.len());
        if len <= self.at {
            return;
        }
        let _ = conn.busy_timeout(CHECKPOINT_WAIT);
        let done = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get::<_, i64>(0));
        let _ = conn.busy_timeout(BUSY_TIMEOUT);
        self.at = match done {
            Ok(0) => self.limit,
            Ok(_) => {
                tracing::debug!(len, "readers kept the result cache's write-ahead log from being truncated; tried again later");
                len + self.limit / 4
            }
            Err(e) => {
                tracing::debug!(len, error = %e, "the result cache's write-ahead log could not be truncated; tried again later");
                len + self.limit / 4
            }
        };
    }
}

/// How long the writer gathers a group, given how long its last commit took: at least
/// [`GROUP_WAIT`], and three times the last commit (at most [`MAX_GATHER`]), so that
/// committing takes at most about a quarter of the writer's time. Rows that arrive fast
/// (a noop run: tens of thousands a second) then make larger groups, and a larger group
/// costs fewer pages per row: its rows land at random places in the id index, and once
/// the index has more pages than a group has rows, each row of a small group costs a
/// page of its own. A paid sweep's tens of rows a second keep the 100 ms.
fn gather_for(last_commit: Duration) -> Duration {
    (last_commit * 3).clamp(GROUP_WAIT, MAX_GATHER)
}

fn commit(conn: &mut Connection, writes: &[Write]) -> rusqlite::Result<u64> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let now = now_s() as i64;
    let mut new = 0;
    {
        let mut insert = tx.prepare_cached(INSERT)?;
        let mut touch =
            tx.prepare_cached("UPDATE entries SET used = ?3 WHERE h = ?1 AND id = ?2")?;
        for w in writes {
            match w {
                Write::Put { id, key, completion, model, stage, .. } => {
                    new += insert.execute(params![
                        h(id),
                        &id.as_bytes()[..],
                        key,
                        completion,
                        model,
                        stage,
                        now
                    ])? as u64;
                }
                Write::Touch(id) => {
                    touch.execute(params![h(id), &id.as_bytes()[..], now])?;
                }
                Write::Flush(_) => {}
            }
        }
    }
    tx.commit()?;
    Ok(new)
}

#[cfg(test)]
#[path = "machine_tests.rs"]
mod tests;

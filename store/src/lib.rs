//! Halyard's embedded stores: the coordinator's run state and a worker's checkpoint are
//! each one [fjall](https://docs.rs/fjall) database, in the directory [`ENGINE_DIR`] of
//! the store's directory.
//!
//! fjall is a log-structured merge tree: a write goes to its journal and to a memtable,
//! memtables are flushed into sorted tables of compressed blocks, and tables are
//! compacted in the background. Halyard relies on these of its guarantees (fjall's
//! documentation of `Database::persist`, `PersistMode` and `WriteBatch`):
//! - a **write batch is atomic** across keyspaces: after a crash, all of it or none;
//! - a committed batch is in the operating system's buffers, so it **survives the
//!   process being killed**; [`Store::persist`] (an fsync of the journal) makes every
//!   batch before it survive a power loss too. The run state commits each planner step
//!   without an fsync and persists before it acks results; a checkpoint's group commit
//!   persists before it answers its writers;
//! - a journal cut short by a crash is replayed up to its last whole batch (but so is a
//!   journal damaged in its middle: fjall cuts it at the first entry it cannot decode;
//!   Halyard's guards below refuse that); other damage is an error at open or at the read
//!   that meets it (blocks carry checksums), never a wrong answer;
//! - **one process** holds a database (a lock file): a second opener gets an error.
//!
//! [`open`] does what every store needs before its owner reads a record:
//! - creates the directory readable by its owner only ([`mark::create_private_dir`]);
//! - takes the directory's lock ([`LOCK_FILE`]) before it touches any other file, and
//!   keeps it until the store is closed, through a compaction's swap;
//! - finishes or undoes a compaction's swap cut short (`swap`);
//! - migrates, once, a store written by an earlier build (redb, with or without its log,
//!   or sled: [`migrate`]), with a log line;
//! - refuses, before the engine opens it, keyspace directories the engine's open would
//!   delete (`layout`), and journals the engine's recovery would cut with batches lost:
//!   every batch committed through [`Store::commit`] is numbered, and the numbers in the
//!   journals must go up by one and reach the durable high-water mark (`journal`,
//!   [`acked`]); after the engine's open, the store's own number must reach it too;
//! - opens the database and the owner's keyspaces (created if missing);
//! - guards against a store that silently lost its data ([`mark`]), and against a
//!   keyspace that did: each keyspace holds a mark of its own, the record
//!   [`KEYSPACE_MARK`], written when it is created, and the store's mark keyspace names
//!   every keyspace created; a named keyspace without its mark is an error naming it.
//!
//! Records are bytes to bytes; their owners encode them ([`halyard_proto::stored`]). Owners
//! read a whole keyspace with [`records`] and count it with [`count`], which leave the
//! keyspace's mark out (it is the one key shorter than two bytes, and sorts first).

use std::path::{Path, PathBuf};

pub use fjall;
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};

pub mod acked;
mod journal;
mod layout;
pub mod mark;
pub mod migrate;
mod swap;

/// The engine's directory inside a store's directory.
pub const ENGINE_DIR: &str = "fjall";
/// The keyspace holding [`mark::MARK_KEY`], and the name of every keyspace created.
const MARKS: &str = "halyard_store";
/// The record each keyspace holds from its creation on (a key no owner's record has: one
/// byte; every owner's key is longer).
pub const KEYSPACE_MARK: &[u8] = &[0];
/// The record, in the store's mark keyspace, holding the number of the last batch
/// committed through [`Store::commit`] (8 bytes, little-endian): each such batch writes
/// it, one more than the batch before ([`journal`], [`acked`]).
pub const BATCH_KEY: &[u8] = b"halyard-batch-number";
/// The least key after [`KEYSPACE_MARK`]: every owner's record sorts at or after it.
pub const FIRST_KEY: &[u8] = &[0, 0];
/// The lock file in a store's directory, held by the store's owner from before [`open`]
/// touches a file until the store is closed (through a compaction's swap).
pub const LOCK_FILE: &str = "halyard.lock";
/// An environment variable setting the memtable size (bytes) of keyspaces created by
/// the process: crash tests make it small, so that flushes and compactions happen often.
pub const MEMTABLE_ENV: &str = "HALYARD_STORE_MEMTABLE_BYTES";

/// Why a store could not be opened, compacted or migrated. Each names the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "{dir} is in use by another process{owner} (it holds the store's lock); wait for it to finish, or stop it"
    )]
    InUse { dir: PathBuf, owner: String },
    #[error("{dir}: {reason}")]
    Lost { dir: PathBuf, reason: String },
    #[error("{dir}: the engine reports a failed write earlier in this process (it is poisoned); restart the process")]
    Poisoned { dir: PathBuf },
    #[error("{dir} is damaged: {reason}")]
    Damaged { dir: PathBuf, reason: String },
    #[error("{dir} was written by another version of the storage engine ({found}); open it with the Halyard build that wrote it")]
    Version { dir: PathBuf, found: String },
    #[error("{dir}: the storage engine failed: {source}")]
    Engine { dir: PathBuf, source: fjall::Error },
    #[error("{dir}: migrating the store of an earlier build: {reason}")]
    Migrate { dir: PathBuf, reason: String },
    #[error(
        "{dir} is not a Halyard store (it has no {ENGINE_DIR}/ and no store of an earlier build)"
    )]
    NotAStore { dir: PathBuf },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// How much memory a store may use.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// The block cache.
    pub cache_bytes: u64,
    /// Each keyspace's memtable, flushed into a table once this full (set when a
    /// keyspace is created; [`MEMTABLE_ENV`] overrides it).
    pub memtable_bytes: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options { cache_bytes: 16 << 20, memtable_bytes: 8 << 20 }
    }
}

/// An open store: its database and its directory.
pub struct Store {
    db: Database,
    dir: PathBuf,
    /// The engine's directory (the store's, or a copy being built).
    engine: PathBuf,
    memtable_bytes: u64,
    /// The durable high-water mark ([`acked`]).
    acked: std::sync::Mutex<acked::Mark>,
    /// The number of the last batch committed through [`Store::commit`], and the mark
    /// keyspace it is written to; locked through each commit.
    batches: std::sync::Mutex<Batches>,
    /// The store directory's lock ([`LOCK_FILE`]); none for a copy being built.
    lock: Option<std::fs::File>,
}

impl Store {
    /// The keyspace `name`, created (with its mark) if missing.
    pub fn keyspace(&self, name: &str) -> Result<Keyspace, StoreError> {
        let ks = self.engine_keyspace(name)?;
        if name != MARKS {
            let marks = self.engine_keyspace(MARKS)?;
            if !marks.contains_key(name).map_err(|e| self.error(e))? {
                let mut b = self.db.batch().durability(Some(PersistMode::SyncAll));
                b.insert(&ks, KEYSPACE_MARK, b"1");
                b.insert(&marks, name, b"1");
                self.commit(b).map_err(|e| self.error(e))?;
            }
        }
        Ok(ks)
    }

    /// The engine's keyspace `name`, created if missing, without a mark.
    fn engine_keyspace(&self, name: &str) -> Result<Keyspace, StoreError> {
        let memtable = self.memtable_bytes;
        self.db
            .keyspace(name, || KeyspaceCreateOptions::default().max_memtable_size(memtable))
            .map_err(|e| self.error(e))
    }

    /// Refuse the store if a keyspace it created lost its mark (module docs).
    fn check_keyspaces(&self) -> Result<(), StoreError> {
        let marks = self.engine_keyspace(MARKS)?;
        for kv in marks.range(FIRST_KEY..) {
            let name = kv.key().map_err(|e| self.error(e))?;
            if &*name == mark::MARK_KEY || &*name == BATCH_KEY {
                continue;
            }
            let name = String::from_utf8_lossy(&name).into_owned();
            let ks = self.engine_keyspace(&name)?;
            if !ks.contains_key(KEYSPACE_MARK).map_err(|e| self.error(e))? {
                return Err(StoreError::Lost {
                    dir: self.dir.clone(),
                    reason: format!(
                        "its keyspace {name} no longer holds what it held (the engine's files were truncated, zeroed, \
                         replaced or deleted); restore the store from a backup, or move it away to start it afresh"
                    ),
                });
            }
        }
        Ok(())
    }

    pub fn db(&self) -> &Database {
        &self.db
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Commit `batch` atomically (not yet durable: [`Store::persist`]), numbered: it also
    /// writes [`BATCH_KEY`], one more than the batch before, so that an open can tell a
    /// journal that lost batches ([`journal`]). Every batch whose records an owner will
    /// acknowledge goes through here (or [`Store::commit_durable`]); commits take turns.
    pub fn commit(&self, mut batch: fjall::OwnedWriteBatch) -> Result<(), fjall::Error> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut b = self.batches.lock().unwrap_or_else(|p| p.into_inner());
        let marks = match &b.marks {
            Some(k) => k.clone(),
            None => {
                let k = self.db.keyspace(MARKS, || {
                    KeyspaceCreateOptions::default().max_memtable_size(self.memtable_bytes)
                })?;
                b.marks = Some(k.clone());
                k
            }
        };
        let next = b.last + 1;
        batch.insert(&marks, BATCH_KEY, next.to_le_bytes());
        batch.commit()?;
        b.last = next;
        Ok(())
    }

    /// Make every batch committed so far survive a power loss (an fsync of the journal),
    /// then record that they did: the number of the last batch committed through
    /// [`Store::commit`] becomes the durable high-water mark ([`acked`]), and an open that
    /// finds fewer batches refuses the store.
    pub fn persist(&self) -> Result<(), fjall::Error> {
        // Read before the sync: every batch up to this number is in the journal's buffer.
        let number = self.batches.lock().unwrap_or_else(|p| p.into_inner()).last;
        self.db.persist(PersistMode::SyncAll)?;
        let mut mark = self.acked.lock().unwrap_or_else(|p| p.into_inner());
        mark.write(&self.engine, number).map_err(fjall::Error::Io)
    }

    /// Commit `batch` ([`Store::commit`]) and make it survive a power loss
    /// ([`Store::persist`]): what an owner does before it acknowledges the batch's records.
    pub fn commit_durable(&self, batch: fjall::OwnedWriteBatch) -> Result<(), fjall::Error> {
        self.commit(batch)?;
        self.persist()
    }

    /// The number of the last batch the store holds ([`BATCH_KEY`]; 0 for none).
    fn batch_number(&self) -> Result<u64, StoreError> {
        let marks = self.engine_keyspace(MARKS)?;
        match marks.get(BATCH_KEY).map_err(|e| self.error(e))? {
            None => Ok(0),
            Some(v) => match <[u8; 8]>::try_from(&*v) {
                Ok(b) => Ok(u64::from_le_bytes(b)),
                Err(_) => Err(self
                    .damaged(format!("its record of batch numbers has {} bytes, not 8", v.len()))),
            },
        }
    }

    /// [`StoreError::Damaged`] for `what`, saying what to do.
    fn damaged(&self, what: String) -> StoreError {
        damaged(&self.dir, what)
    }

    /// The error of the engine's `e`, naming this store.
    pub fn error(&self, e: fjall::Error) -> StoreError {
        engine_error(&self.dir, e)
    }
}

/// What to do with a damaged store.
const RESTORE: &str = "Restore the directory from a backup, or move it away to start this store afresh (a checkpoint \
                       then pays again for lost calls; a run state restarts the run)";

fn damaged(dir: &Path, what: String) -> StoreError {
    StoreError::Damaged { dir: dir.to_path_buf(), reason: format!("{what}. {RESTORE}") }
}

fn engine_error(dir: &Path, e: fjall::Error) -> StoreError {
    match e {
        fjall::Error::Locked => StoreError::InUse { dir: dir.to_path_buf(), owner: String::new() },
        fjall::Error::Poisoned => StoreError::Poisoned { dir: dir.to_path_buf() },
        fjall::Error::Io(source) => StoreError::Io { path: dir.to_path_buf(), source },
        fjall::Error::InvalidVersion(found) => {
            StoreError::Version { dir: dir.to_path_buf(), found: format!("{found:?}") }
        }
        e @ (fjall::Error::Storage(_)
        | fjall::Error::JournalRecovery(_)
        | fjall::Error::Decompress(_)
        | fjall::Error::InvalidTrailer
        | fjall::Error::InvalidTag(_)
        | fjall::Error::Unrecoverable) => damaged(dir, e.to_string()),
        source => StoreError::Engine { dir: dir.to_path_buf(), source },
    }
}

/// Open (or create) the store in `dir` with `keyspaces` (see the module docs).
pub fn open(dir: &Path, opts: Options, keyspaces: &[&str]) -> Result<Store, StoreError> {
    let io = |source| StoreError::Io { path: dir.to_path_buf(), source };
    mark::create_private_dir(dir).map_err(io)?;
    // The lock first: nothing below touches a file another process may be writing.
    let lock = lock_dir(dir)?;
    open_locked(dir, opts, keyspaces, lock)
}

/// [`open`], the store's directory locked.
fn open_locked(
    dir: &Path,
    opts: Options,
    keyspaces: &[&str],
    lock: std::fs::File,
) -> Result<Store, StoreError> {
    swap::recover(dir)?;
    migrate::if_needed(dir)?;
    let engine = dir.join(ENGINE_DIR);
    layout::check(&engine).map_err(|reason| StoreError::Lost { dir: dir.to_path_buf(), reason })?;
    // Before the engine's recovery, which would cut a damaged journal for good.
    let durable = acked::read(&engine).map_err(|what| damaged(dir, what))?;
    journal::check(&engine, durable).map_err(|what| damaged(dir, what))?;
    let mut store = open_engine(dir, opts)?;
    store.lock = Some(lock);
    // Journals that hold no batch number (all flushed into tables): the tables must hold
    // the mark's.
    let number = store.batch_number()?;
    if let Some(durable) = durable.filter(|d| number < *d) {
        return Err(store.damaged(format!(
            "it holds batches up to number {number}, but batches up to number {durable} had been made durable and \
             acknowledged: the rest were lost (its journal was damaged)"
        )));
    }
    store.batches.lock().unwrap_or_else(|p| p.into_inner()).last = number;
    acked::remove_earlier(&engine);
    let marks = store.engine_keyspace(MARKS)?;
    let marked = marks.contains_key(mark::MARK_KEY).map_err(|e| store.error(e))?;
    mark::guard(dir, marked, || {
        let mut b = store.db.batch();
        b.insert(&marks, mark::MARK_KEY, b"1");
        store.commit_durable(b).map_err(|e| e.to_string())
    })
    .map_err(|reason| StoreError::Lost { dir: dir.to_path_buf(), reason })?;
    drop(marks);
    store.check_keyspaces()?;
    // The files of a migrated store go once the store they became has passed the check
    // (also after a crash between the migration and this).
    migrate::remove_earlier_files(dir)?;
    for k in keyspaces {
        store.keyspace(k)?;
    }
    Ok(store)
}

/// The engine in `dir`'s [`ENGINE_DIR`], opened without the checks of [`open`].
pub(crate) fn open_engine(dir: &Path, opts: Options) -> Result<Store, StoreError> {
    open_engine_at(dir, &dir.join(ENGINE_DIR), opts)
}

pub(crate) fn open_engine_at(dir: &Path, at: &Path, opts: Options) -> Result<Store, StoreError> {
    let memtable_bytes = std::env::var(MEMTABLE_ENV)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(opts.memtable_bytes)
        .max(64 << 10);
    let open = || {
        Database::builder(at)
            .cache_size(opts.cache_bytes)
            // One thread flushes and compacts: the machines Halyard runs on have few cores
            // and the store is not the work.
            .worker_threads(1)
            .open()
    };
    // The engine reports damage it finds as an error; a panic on damage it does not
    // foresee must still not take the process down unexplained.
    match std::panic::catch_unwind(open) {
        Ok(Ok(db)) => Ok(Store {
            db,
            dir: dir.to_path_buf(),
            engine: at.to_path_buf(),
            memtable_bytes,
            acked: Default::default(),
            batches: Default::default(),
            lock: None,
        }),
        Ok(Err(e)) => Err(engine_error(dir, e)),
        Err(_) => Err(StoreError::Damaged {
            dir: dir.to_path_buf(),
            reason: "opening it failed (the engine's files are damaged)".into(),
        }),
    }
}

/// Take the lock of the store in `dir` ([`LOCK_FILE`]), writing this process's id into
/// it; a lock held elsewhere is [`StoreError::InUse`], naming the process that holds it.
fn lock_dir(dir: &Path) -> Result<std::fs::File, StoreError> {
    use std::io::{Read, Seek, Write};
    let path = dir.join(LOCK_FILE);
    let io = |source| StoreError::Io { path: path.clone(), source };
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io)?;
    match f.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut held = String::new();
            let _ = f.read_to_string(&mut held);
            let owner = match held.trim().parse::<u32>() {
                Ok(pid) => format!(" (process {pid})"),
                Err(_) => String::new(),
            };
            return Err(StoreError::InUse { dir: dir.to_path_buf(), owner });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
    }
    f.set_len(0).map_err(io)?;
    f.rewind().map_err(io)?;
    f.write_all(format!("{}\n", std::process::id()).as_bytes()).map_err(io)?;
    Ok(f)
}

/// What [`compact`] did to a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compacted {
    /// Bytes the store held on disk before (allocated blocks, as `du` counts them).
    pub before: u64,
    /// And after.
    pub after: u64,
}

/// Compact the store in `dir` (one no process holds open: `halyard gc`): opened as
/// [`open`] opens it (its lock, the mark), so a store in use by another process is an
/// error and nothing is changed; then [`Store::compact`].
pub fn compact(dir: &Path, opts: Options) -> Result<Compacted, StoreError> {
    if !dir.is_dir() {
        return Err(StoreError::NotAStore { dir: dir.to_path_buf() });
    }
    // Locked before it is looked at: its owner may be between a compaction's renames.
    let lock = lock_dir(dir)?;
    swap::recover(dir)?;
    if !is_store(dir) {
        drop(lock);
        let _ = std::fs::remove_file(dir.join(LOCK_FILE));
        return Err(StoreError::NotAStore { dir: dir.to_path_buf() });
    }
    // Measured once open (in `Store::compact`): a store of an earlier build has no engine
    // files until the open migrates it.
    open_locked(dir, opts, &[], lock)?.compact()
}

impl Store {
    /// Compact this store, which is done growing (a finished run's, a stopped worker's),
    /// as it closes: its records are written once, in key order, into a new engine
    /// directory (the engine's bulk load: sorted tables, no journal), which then replaces
    /// the old one. What the engine keeps for a store still written to goes: records
    /// replaced or removed, and the journal (up to 64 MB, which the engine starts anew
    /// only once it is full).
    ///
    /// The records are read through this open handle, so the journal is not replayed as
    /// reopening the store would (seconds for a large one): its owner compacts it as it
    /// closes it, having dropped every keyspace handle it took (they keep the engine's
    /// files open). A crash in the middle leaves the store whole: the copy is durable
    /// before it replaces anything, and [`open`] finishes or undoes a replacement cut
    /// short ([`swap::recover`]).
    pub fn compact(self) -> Result<Compacted, StoreError> {
        let copy = self.compaction_copy()?;
        self.replace_with(copy)
    }

    /// The first half of [`Store::compact`], which only reads the store: its compacted
    /// copy, written beside it, for [`Store::finish_compaction`] to put in its place. An
    /// owner that makes the copy while it still reads the store (a coordinator writing its
    /// report) must write nothing more to it: what it wrote after the copy began would
    /// be lost.
    pub fn compaction_copy(&self) -> Result<Copy, StoreError> {
        let started = std::time::Instant::now();
        let before = disk_bytes(&self.dir)?;
        let path = self.dir.join(swap::COMPACTING);
        swap::build(&self.dir, &path, false, |b| {
            for name in self.db.list_keyspace_names() {
                let ks = self.engine_keyspace(&name).map_err(|e| e.to_string())?;
                b.keyspace(
                    &name,
                    ks.iter().map(|kv| {
                        kv.into_inner()
                            .map(|(k, v)| (k.to_vec(), v.to_vec()))
                            .map_err(|e| e.to_string())
                    }),
                )?;
            }
            Ok(())
        })
        .map_err(|reason| StoreError::Damaged { dir: self.dir.clone(), reason })?;
        Ok(Copy { path, before, started })
    }

    fn replace_with(mut self, copy: Copy) -> Result<Compacted, StoreError> {
        let dir = self.dir.clone();
        // The directory's lock is held through the swap: the engine's own goes with it.
        let lock = self.lock.take();
        drop(self);
        swap::replace(&dir, &copy.path)?;
        let after = disk_bytes(&dir)?;
        drop(lock);
        Ok(Compacted { before: copy.before, after })
    }

    /// Close `store`, which its owner shared (a handle in a blocking task, say), compacted
    /// ([`Store::compact`]) with `copy`, made by [`Store::compaction_copy`] with nothing
    /// written since, or with a new copy. Said in the log: the bytes before and after and
    /// the seconds since the copy began, or why not (a warning only: the store is whole
    /// either way, and `halyard gc` compacts it later), such as another handle of the
    /// store still held. `what` names the store ("run state").
    pub fn finish_compaction(store: std::sync::Arc<Store>, what: &str, copy: Option<Copy>) {
        let shown = store.dir.display().to_string();
        let store = match std::sync::Arc::try_unwrap(store) {
            Ok(store) => store,
            Err(_) => {
                if let Some(c) = copy {
                    c.discard();
                }
                tracing::warn!(store = what, dir = %shown, "still open elsewhere in this process; not compacted (`halyard gc DIR` compacts it later)");
                return;
            }
        };
        let done = match copy {
            Some(copy) => {
                let started = copy.started;
                store.replace_with(copy).map(|c| (c, started))
            }
            None => {
                tracing::info!(store = what, dir = %shown, "compacting");
                let started = std::time::Instant::now();
                store.compact().map(|c| (c, started))
            }
        };
        match done {
            Ok((c, started)) => tracing::info!(
                store = what,
                dir = %shown,
                before = %megabytes(c.before),
                after = %megabytes(c.after),
                seconds = %format_args!("{:.2}", started.elapsed().as_secs_f64()),
                "compacted"
            ),
            Err(e) => tracing::warn!(
                store = what,
                dir = %shown,
                error = %e,
                "compacting failed; the store is whole (`halyard gc DIR` compacts it later)"
            ),
        }
    }
}

/// See [`Store::commit`].
#[derive(Default)]
struct Batches {
    last: u64,
    marks: Option<Keyspace>,
}

/// A compacted copy of a store, not yet in its place ([`Store::compaction_copy`]).
#[derive(Debug)]
pub struct Copy {
    path: PathBuf,
    before: u64,
    started: std::time::Instant,
}

impl Copy {
    /// Remove the copy (the store was written to after it began); an open of the store
    /// removes one left behind too.
    pub fn discard(self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Bytes as megabytes with one decimal ("12.3 MB").
pub fn megabytes(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// The bytes the files under `dir` hold on disk (allocated blocks, as `du` counts them).
pub fn disk_bytes(dir: &Path) -> Result<u64, StoreError> {
    use std::os::unix::fs::MetadataExt;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| StoreError::Io { path, source }
    };
    let m = std::fs::symlink_metadata(dir).map_err(io(dir))?;
    if !m.is_dir() {
        return Ok(m.blocks() * 512);
    }
    let mut total = 0;
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        total += disk_bytes(&entry.map_err(io(dir))?.path())?;
    }
    Ok(total)
}

/// Every record of `ks` in key order, its mark left out.
pub fn records(ks: &Keyspace) -> fjall::Iter {
    ks.range(FIRST_KEY..)
}

/// How many records `ks` holds, its mark left out (a pass over its keys).
pub fn count(ks: &Keyspace) -> Result<usize, fjall::Error> {
    let mut n = 0;
    for kv in records(ks) {
        kv.key()?;
        n += 1;
    }
    Ok(n)
}

/// Whether `dir` holds a Halyard store: its engine's directory, or the files of an
/// earlier build's store (which opening or compacting migrates first).
pub fn is_store(dir: &Path) -> bool {
    dir.join(ENGINE_DIR).is_dir() || migrate::earlier_format(dir).is_some()
}

#[cfg(test)]
mod tests;

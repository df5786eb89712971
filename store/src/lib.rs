//! Halyard's embedded stores: the coordinator's run state and the worker's checkpoint are
//! each one [redb](https://docs.rs/redb) database, the file [`FILE`] in the store's
//! directory.
//!
//! [`open`] does what every store needs before its owner reads a record:
//! - creates the directory readable by its owner only ([`store_mark::create_private_dir`]);
//! - migrates, once, a sled store written by an earlier build (`migrate`);
//! - opens the file with redb's integrity check (every page's checksum, so a file altered
//!   behind redb's back is an error at open, not a panic or wrong answers later), under
//!   redb's lock (a second process that opens the store gets an error);
//! - creates the owner's tables, so readers never meet a missing table;
//! - guards against a store that silently lost its data ([`store_mark`]): a store whose
//!   mark file says it was created but whose data lacks the mark is an error.
//!
//! Every table maps bytes to bytes ([`Table`]); records are encoded by their owners.
//!
//! Why redb and not sled (which Halyard used until issue 19): for the same records and
//! commits, sled 0.34 kept 683 bytes on disk per no-op job (every insert a log record,
//! leaves rewritten whole, segments reclaimed only below half live) against redb's 163,
//! and its writer used three times the memory; sled's page-cache setting did not bound
//! it. redb is a copy-on-write B-tree with checksummed pages and atomic, crash-safe
//! commits, stable file format, maintained, pure Rust.

use std::path::Path;

pub mod logged;
pub use logged::{LogTable, Logged, LoggedWrite, Tables as LoggedTables};

use halyard_proto::store_mark;
pub use redb;
use redb::{Database, ReadableDatabase, TableDefinition};

/// A table of a Halyard store: bytes to bytes.
pub type Table = TableDefinition<'static, &'static [u8], &'static [u8]>;

/// The table named `name`.
pub const fn table(name: &'static str) -> Table {
    TableDefinition::new(name)
}

/// The database file in a store directory.
pub const FILE: &str = "halyard.redb";
/// A migration in progress writes here, and renames to [`FILE`] when it is complete.
const MIGRATING: &str = "halyard.redb.migrating";
/// The table holding [`store_mark::MARK_KEY`].
const MARKS: Table = table("halyard_store");
/// Records copied per transaction by a migration.
const MIGRATE_CHUNK: usize = 50_000;

/// Open (or create) the store in `dir` with a page cache of `cache_bytes` and the tables
/// `tables`. Errors are sentences for the owner to put after the store's name.
pub fn open(dir: &Path, cache_bytes: usize, tables: &[Table]) -> Result<Database, String> {
    store_mark::create_private_dir(dir).map_err(|e| e.to_string())?;
    let file = dir.join(FILE);
    let sled_files = is_sled_store(dir);
    if sled_files && !file.exists() {
        migrate(dir, cache_bytes)?;
    }
    let db = open_file(&file, cache_bytes)?;
    let marked = {
        let tx = db.begin_read().map_err(err)?;
        match tx.open_table(MARKS) {
            Ok(t) => t.get(store_mark::MARK_KEY).map_err(err)?.is_some(),
            Err(redb::TableError::TableDoesNotExist(_)) => false,
            Err(e) => return Err(err(e)),
        }
    };
    store_mark::guard(dir, marked, || {
        let tx = db.begin_write().map_err(err)?;
        tx.open_table(MARKS).map_err(err)?.insert(store_mark::MARK_KEY, &b"1"[..]).map_err(err)?;
        tx.commit().map_err(err)
    })?;
    // The sled files of a migrated store go once the store they became has passed the
    // check (also after a crash between the migration and this).
    if sled_files {
        remove_sled_files(dir)?;
    }
    create_tables(&db, tables)?;
    Ok(db)
}

/// What [`compact`] did to a store's file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compacted {
    /// Bytes the file held on disk before (allocated blocks, as `du` counts them).
    pub before: u64,
    /// And after.
    pub after: u64,
}

/// Compact the store in `dir` (the whole file, every table): pages freed by earlier
/// commits are filled with pages moved from the end of the file, and the file is cut
/// after its last page in use. A store that is growing holds such free room (a copy-on-
/// write B-tree frees the pages each commit replaces, and redb grows small files in
/// doubling steps); a finished run's store need not keep it.
///
/// The store is opened as [`open`] opens it (its lock, the integrity check, the mark),
/// so a store in use by another process is an error and nothing is changed. Each step of
/// redb's compaction is a commit: a crash in the middle leaves the store whole (redb
/// repairs its allocator at the next open) with part of the room returned.
pub fn compact(dir: &Path, cache_bytes: usize) -> Result<Compacted, String> {
    let file = dir.join(FILE);
    if !is_store(dir) {
        return Err(format!("{} is not a Halyard store (it has no {FILE})", dir.display()));
    }
    // Measured once open: a sled store of an earlier build has no file until the open
    // moves it to redb.
    let mut db = open(dir, cache_bytes, &[])?;
    let before = disk_bytes(&file)?;
    // redb repeats its passes until one makes no progress.
    db.compact().map_err(|e| format!("{}: compacting: {e}", file.display()))?;
    drop(db);
    Ok(Compacted { before, after: disk_bytes(&file)? })
}

/// The bytes `file` holds on disk (allocated blocks: a file redb extended but has not
/// written yet holds fewer than its length).
pub fn disk_bytes(file: &Path) -> Result<u64, String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(file).map_err(|e| format!("{}: {e}", file.display()))?;
    Ok(m.blocks() * 512)
}

/// A store in memory only (tests), with `tables`.
pub fn temporary(tables: &[Table]) -> Result<Database, String> {
    let db = Database::builder()
        .create_with_backend(redb::backends::InMemoryBackend::new())
        .map_err(err)?;
    create_tables(&db, tables)?;
    Ok(db)
}

/// Make every commit so far durable (redb commits made with `Durability::None` are not
/// until a durable commit follows; this is one, with nothing in it).
pub fn make_durable(db: &Database) -> Result<(), redb::Error> {
    db.begin_write()?.commit()?;
    Ok(())
}

fn create_tables(db: &Database, tables: &[Table]) -> Result<(), String> {
    let tx = db.begin_write().map_err(err)?;
    for t in tables {
        tx.open_table(*t).map_err(err)?;
    }
    tx.commit().map_err(err)
}

fn open_file(file: &Path, cache_bytes: usize) -> Result<Database, String> {
    let open = || {
        Database::builder()
            .set_cache_size(cache_bytes)
            .set_check_integrity_on_open(true)
            .create(file)
    };
    // redb checks integrity first, so a damaged file should be an error; a panic on some
    // damage it does not foresee must still not take the process down unexplained.
    match std::panic::catch_unwind(open) {
        Ok(Ok(db)) => Ok(db),
        Ok(Err(redb::DatabaseError::DatabaseAlreadyOpen)) => Err(format!(
            "{} is in use by another process (it holds the store's lock)",
            file.display()
        )),
        Ok(Err(e)) => Err(format!("{}: {e}", file.display())),
        Err(_) => Err(format!("{}: the file is damaged (reading it failed)", file.display())),
    }
}

fn err(e: impl Into<redb::Error>) -> String {
    e.into().to_string()
}

/// Whether `dir` holds a Halyard store: its database file, or the sled files of an
/// earlier build's store (which opening, or compacting, moves to redb first).
pub fn is_store(dir: &Path) -> bool {
    dir.join(FILE).is_file() || is_sled_store(dir)
}

/// Whether `dir` holds a sled store (an earlier build's).
fn is_sled_store(dir: &Path) -> bool {
    dir.join("conf").is_file() && dir.join("db").is_file()
}

/// Copy the sled store in `dir` into a new redb file beside it: every tree into the table
/// of the same name, all in `halyard.redb.migrating`, made durable, then renamed to
/// [`FILE`] (and the directory synced). A crash before the rename leaves the sled store as
/// it was, and the next open migrates again; after it, the store is redb's.
///
/// The sled store is opened with sled's own lock, so a process of an earlier build that
/// still has it open makes this an error instead of a copy of a moving store.
fn migrate(dir: &Path, cache_bytes: usize) -> Result<(), String> {
    let started = std::time::Instant::now();
    let tmp = dir.join(MIGRATING);
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{}: {e}", tmp.display())),
    }
    let sled_err = |e: sled::Error| format!("reading the sled store of an earlier build: {e}");
    let old = sled::Config::new().path(dir).open().map_err(sled_err)?;
    let db = Database::builder().set_cache_size(cache_bytes).create(&tmp).map_err(err)?;
    let mut records = 0u64;
    for name in old.tree_names() {
        let tree = old.open_tree(&name).map_err(sled_err)?;
        let name = String::from_utf8_lossy(&name).into_owned();
        if tree.is_empty() {
            continue;
        }
        let def: TableDefinition<&[u8], &[u8]> = TableDefinition::new(&name);
        let mut it = tree.iter();
        loop {
            let mut tx = db.begin_write().map_err(err)?;
            tx.set_durability(redb::Durability::None).map_err(|e| e.to_string())?;
            let mut n = 0;
            {
                let mut t = tx.open_table(def).map_err(err)?;
                for kv in it.by_ref() {
                    let (k, v) = kv.map_err(sled_err)?;
                    t.insert(&k[..], &v[..]).map_err(err)?;
                    n += 1;
                    if n == MIGRATE_CHUNK {
                        break;
                    }
                }
            }
            tx.commit().map_err(err)?;
            records += n as u64;
            if n < MIGRATE_CHUNK {
                break;
            }
        }
    }
    make_durable(&db).map_err(|e| e.to_string())?;
    drop(db);
    drop(old);
    std::fs::rename(&tmp, dir.join(FILE)).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    tracing::info!(
        dir = %dir.display(),
        records,
        seconds = started.elapsed().as_secs_f64(),
        "migrated a sled store of an earlier build to redb"
    );
    Ok(())
}

/// Remove sled's files from `dir` (its `conf`, `db`, `blobs/` and snapshots).
fn remove_sled_files(dir: &Path) -> Result<(), String> {
    let rm = |p: &Path, r: std::io::Result<()>| match r {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("removing the migrated sled file {}: {e}", p.display())),
    };
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let path = entry.path();
        if name == "blobs" {
            rm(&path, std::fs::remove_dir_all(&path))?;
        } else if name == "conf" || name == "db" || name.starts_with("snap.") {
            rm(&path, std::fs::remove_file(&path))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Table = table("a");
    const B: Table = table("b");

    fn get(db: &Database, t: Table, k: &[u8]) -> Option<Vec<u8>> {
        let tx = db.begin_read().unwrap();
        let t = tx.open_table(t).unwrap();
        t.get(k).unwrap().map(|v| v.value().to_vec())
    }

    fn put(db: &Database, t: Table, k: &[u8], v: &[u8]) {
        let tx = db.begin_write().unwrap();
        tx.open_table(t).unwrap().insert(k, v).unwrap();
        tx.commit().unwrap();
    }

    /// A store reopens with its records; while open, a second opener is refused.
    #[test]
    fn reopens_and_locks() {
        let d = tempfile::tempdir().unwrap();
        let db = open(d.path(), 1 << 20, &[A, B]).unwrap();
        put(&db, A, b"k", b"v");
        let e = open(d.path(), 1 << 20, &[A]).err().unwrap();
        assert!(e.contains("in use by another process"), "{e}");
        drop(db);
        let db = open(d.path(), 1 << 20, &[A, B]).unwrap();
        assert_eq!(get(&db, A, b"k").as_deref(), Some(&b"v"[..]));
        assert_eq!(get(&db, B, b"k"), None);
        assert!(d.path().join(store_mark::MARK_FILE).is_file());
    }

    /// Compaction returns the room of freed pages and keeps every record; a store in use,
    /// or a directory without a store, is an error that changes nothing.
    #[test]
    fn compacts_and_keeps_records() {
        let d = tempfile::tempdir().unwrap();
        let db = open(d.path(), 1 << 20, &[A]).unwrap();
        for i in 0..20_000u32 {
            put(&db, A, &i.to_be_bytes(), &[i as u8; 200]);
        }
        let tx = db.begin_write().unwrap();
        {
            let mut t = tx.open_table(A).unwrap();
            for i in (0..20_000u32).filter(|i| i % 10 != 0) {
                t.remove(&i.to_be_bytes()[..]).unwrap();
            }
        }
        tx.commit().unwrap();
        let e = compact(d.path(), 1 << 20).unwrap_err();
        assert!(e.contains("in use by another process"), "{e}");
        drop(db);
        let c = compact(d.path(), 1 << 20).unwrap();
        assert_eq!(c.after, disk_bytes(&d.path().join(FILE)).unwrap());
        assert!(c.after * 3 < c.before, "{c:?}: a tenth of the records kept");
        let again = compact(d.path(), 1 << 20).unwrap();
        assert!(again.after <= c.after, "{again:?} after {c:?}");
        let db = open(d.path(), 1 << 20, &[A]).unwrap();
        for i in 0..20_000u32 {
            let want = (i % 10 == 0).then(|| vec![i as u8; 200]);
            assert_eq!(get(&db, A, &i.to_be_bytes()), want, "record {i}");
        }
        drop(db);
        let none = d.path().join("nothing");
        std::fs::create_dir(&none).unwrap();
        let e = compact(&none, 1 << 20).unwrap_err();
        assert!(e.contains("nothing") && e.contains("is not a Halyard store"), "{e}");
        assert!(!none.join(FILE).exists(), "compact created a store");
    }

    /// Compacting a sled store of an earlier build moves it to redb first, as opening
    /// does, and keeps its records.
    #[test]
    fn compacting_a_sled_store_migrates_it() {
        let d = tempfile::tempdir().unwrap();
        {
            let old = sled::open(d.path()).unwrap();
            old.open_tree("a").unwrap().insert("k", "v").unwrap();
            old.open_tree("halyard_store").unwrap().insert(store_mark::MARK_KEY, "1").unwrap();
            old.flush().unwrap();
        }
        store_mark::write_file(d.path()).unwrap();
        assert!(is_store(d.path()));
        let c = compact(d.path(), 1 << 20).unwrap();
        assert_eq!(c.after, disk_bytes(&d.path().join(FILE)).unwrap());
        assert!(!d.path().join("conf").exists(), "sled's files left behind");
        let db = open(d.path(), 1 << 20, &[A]).unwrap();
        assert_eq!(get(&db, A, b"k").as_deref(), Some(&b"v"[..]));
    }

    /// A sled store of an earlier build becomes a redb store with every tree and record
    /// (its mark included), and sled's files go.
    #[test]
    fn migrates_a_sled_store() {
        let d = tempfile::tempdir().unwrap();
        {
            let old = sled::open(d.path()).unwrap();
            let a = old.open_tree("a").unwrap();
            for i in 0..(MIGRATE_CHUNK as u32 + 10) {
                a.insert(i.to_be_bytes(), &i.to_le_bytes()[..]).unwrap();
            }
            old.open_tree("halyard_store").unwrap().insert(store_mark::MARK_KEY, "1").unwrap();
            old.open_tree("b").unwrap().insert("x", "y").unwrap();
            old.flush().unwrap();
        }
        store_mark::write_file(d.path()).unwrap();
        let db = open(d.path(), 1 << 20, &[A, B]).unwrap();
        assert_eq!(get(&db, B, b"x").as_deref(), Some(&b"y"[..]));
        let tx = db.begin_read().unwrap();
        let t = tx.open_table(A).unwrap();
        assert_eq!(redb::ReadableTableMetadata::len(&t).unwrap(), MIGRATE_CHUNK as u64 + 10);
        assert_eq!(t.get(&7u32.to_be_bytes()[..]).unwrap().unwrap().value(), 7u32.to_le_bytes());
        for f in ["conf", "db", "blobs"] {
            assert!(!d.path().join(f).exists(), "{f} left behind");
        }
    }

    /// A store whose file vanished, or was truncated, zeroed or overwritten, is an error
    /// naming the file or the loss, never an empty store or a panic.
    #[test]
    fn damaged_files_are_errors() {
        type Damage = fn(&Path);
        let damages: [(&str, Damage); 4] = [
            ("deleted", |f| std::fs::remove_file(f).unwrap()),
            ("truncated to 100 bytes", |f| {
                std::fs::OpenOptions::new().write(true).open(f).unwrap().set_len(100).unwrap()
            }),
            ("zeroed", |f| {
                let len = std::fs::metadata(f).unwrap().len() as usize;
                std::fs::write(f, vec![0u8; len]).unwrap()
            }),
            ("a page overwritten", |f| {
                let mut b = std::fs::read(f).unwrap();
                let mid = b.len() / 2;
                b[mid..mid + 4096].fill(0xa5);
                std::fs::write(f, b).unwrap()
            }),
        ];
        for (what, damage) in damages {
            let d = tempfile::tempdir().unwrap();
            {
                let db = open(d.path(), 1 << 20, &[A]).unwrap();
                for i in 0..5000u32 {
                    put(&db, A, &i.to_be_bytes(), &[7; 100]);
                }
            }
            damage(&d.path().join(FILE));
            let got = std::panic::catch_unwind(|| {
                let db = open(d.path(), 1 << 20, &[A])?;
                // Opened: then every record must be there as written (damage to free
                // pages harms nothing).
                Ok::<_, String>(
                    (0..5000u32)
                        .all(|i| get(&db, A, &i.to_be_bytes()).as_deref() == Some(&[7u8; 100][..])),
                )
            });
            match got.unwrap_or_else(|_| panic!("{what}: open panicked")) {
                Ok(intact) => assert!(intact, "{what}: opened with records lost or changed"),
                Err(e) => assert!(
                    e.contains("halyard.redb") || e.contains("no longer holds"),
                    "{what}: {e}"
                ),
            }
        }
    }
}

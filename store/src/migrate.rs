//! Stores written by earlier builds, moved once into the engine of this one.
//!
//! Formats, oldest first:
//! - **sled** 0.34 (until issue 19): the files `conf`, `db` (and `blobs/`, `snap.*`);
//!   one tree per table.
//! - **redb**, the file `halyard.redb` (issues 19 to 32): one table per table, and, from
//!   the stores' log on, the tables keyed by job id kept in three tables: `<name>` (records
//!   one per id, as the first redb builds kept them), `<name>_blocks` (sorted runs of
//!   blocks of records compressed together, and the directory of runs) and `<name>_log`
//!   (records not yet in a run, by sequence number). The newest record of an id is the
//!   log's, else the newest run's, else the one-per-id table's.
//!
//! A migration copies every table into the keyspace of the same name (a logged table's
//! three into one), in batches, into `fjall.migrating/` beside the old files; makes it
//! durable; renames it to [`crate::ENGINE_DIR`]; and syncs the directory. A crash before
//! the rename leaves the old store as it was, and the next open migrates again; after
//! it, the store is the engine's. The old files are removed only once the new store has
//! passed the mark check ([`remove_earlier_files`]).
//!
//! The old store is opened under its own engine's lock, so a process of an earlier build
//! that still has it open makes this an error instead of a copy of a moving store.

use std::path::Path;

use crate::swap::{self, MIGRATING};
use crate::{Options, StoreError, ENGINE_DIR};

/// The redb file of the builds from issue 19 to 32.
pub const REDB_FILE: &str = "halyard.redb";

/// A store format of an earlier build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Sled,
    Redb,
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Format::Sled => "sled 0.34",
            Format::Redb => "redb",
        })
    }
}

/// What a migration did.
#[derive(Clone, Debug)]
pub struct Migrated {
    pub from: Format,
    pub records: u64,
    pub seconds: f64,
}

/// The format of the earlier build's store in `dir`, if it holds one.
pub fn earlier_format(dir: &Path) -> Option<Format> {
    if dir.join(REDB_FILE).is_file() {
        Some(Format::Redb)
    } else if dir.join("conf").is_file() && dir.join("db").is_file() {
        Some(Format::Sled)
    } else {
        None
    }
}

/// Migrate the store in `dir` if it is an earlier build's and has not been migrated
/// (called by [`crate::open`], which logs it).
pub fn if_needed(dir: &Path) -> Result<Option<Migrated>, StoreError> {
    if dir.join(ENGINE_DIR).is_dir() {
        return Ok(None);
    }
    let Some(format) = earlier_format(dir) else { return Ok(None) };
    let m = copy(dir, format)?;
    tracing::info!(
        dir = %dir.display(),
        from = %m.from,
        records = m.records,
        seconds = m.seconds,
        "migrated a store of an earlier build"
    );
    Ok(Some(m))
}

/// `halyard migrate DIR`: migrate the store in `dir` now, and check it as opening does.
/// `None`: it is this build's store already.
pub fn run(dir: &Path) -> Result<Option<Migrated>, StoreError> {
    if !crate::is_store(dir) {
        return Err(StoreError::NotAStore { dir: dir.to_path_buf() });
    }
    let m = if_needed(dir)?;
    drop(crate::open(dir, Options::default(), &[])?);
    Ok(m)
}

/// Remove the files of the earlier build's store in `dir` once its engine's directory is
/// there (after a migration that passed the checks).
pub fn remove_earlier_files(dir: &Path) -> Result<(), StoreError> {
    if !dir.join(ENGINE_DIR).is_dir() {
        return Ok(());
    }
    let rm = |p: &Path, r: std::io::Result<()>| match r {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(StoreError::Io { path: p.to_path_buf(), source }),
    };
    let entries = std::fs::read_dir(dir)
        .map_err(|source| StoreError::Io { path: dir.to_path_buf(), source })?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let path = entry.path();
        if name == "blobs" || name == MIGRATING {
            rm(&path, std::fs::remove_dir_all(&path))?;
        } else if name == "conf"
            || name == "db"
            || name.starts_with("snap.")
            || name == REDB_FILE
            || name == "halyard.redb.migrating"
        {
            rm(&path, std::fs::remove_file(&path))?;
        }
    }
    Ok(())
}

/// Copy the store of `format` in `dir` into a new engine directory (module docs).
fn copy(dir: &Path, format: Format) -> Result<Migrated, StoreError> {
    let started = std::time::Instant::now();
    let fail = |reason: String| StoreError::Migrate { dir: dir.to_path_buf(), reason };
    let tmp = dir.join(MIGRATING);
    if !cfg!(feature = "migrate") {
        return Err(fail(format!(
            "it is a {format} store, which this build does not read (it links one storage engine). Migrate it once \
             with a build that has the `migrate` feature: `cargo build --release -p halyard --features migrate`, \
             then `halyard migrate {}`",
            dir.display()
        )));
    }
    #[cfg(feature = "migrate")]
    let records = swap::build(dir, &tmp, true, |b| match format {
        Format::Sled => read::copy_sled(dir, b),
        Format::Redb => read::copy_redb(&dir.join(REDB_FILE), b),
    })
    .map_err(fail)?;
    #[cfg(not(feature = "migrate"))]
    let records = 0;
    swap::replace(dir, &tmp)?;
    Ok(Migrated { from: format, records, seconds: started.elapsed().as_secs_f64() })
}

/// The readers of the earlier builds' engines (the `migrate` feature: redb and sled are
/// linked only then).
#[cfg(feature = "migrate")]
mod read {
    use std::borrow::Cow;
    use std::collections::BTreeMap;
    use std::path::Path;

    use halyard_proto::stored::unpack;
    use redb::{ReadableDatabase, ReadableTable, TableDefinition, TableHandle};

    use crate::swap::Builder;

    pub(super) fn copy_sled(dir: &Path, out: &mut Builder) -> Result<(), String> {
        let sled_err = |e: sled::Error| format!("reading the sled store: {e}");
        let old = sled::Config::new().path(dir).open().map_err(sled_err)?;
        for name in old.tree_names() {
            let tree = old.open_tree(&name).map_err(sled_err)?;
            if tree.is_empty() {
                continue;
            }
            let name = String::from_utf8_lossy(&name).into_owned();
            out.keyspace(
                &name,
                tree.iter().map(|kv| kv.map(|(k, v)| (k.to_vec(), v.to_vec())).map_err(sled_err)),
            )?;
        }
        Ok(())
    }

    /// A table of bytes to bytes named `name`.
    fn bytes(name: &str) -> TableDefinition<'_, &'static [u8], &'static [u8]> {
        TableDefinition::new(name)
    }

    pub(super) fn copy_redb(file: &Path, out: &mut Builder) -> Result<(), String> {
        let err = |e: redb::Error| format!("reading {}: {e}", file.display());
        let db = match redb::Database::builder().open(file) {
            Ok(db) => db,
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                return Err(format!("{} is in use by another process", file.display()))
            }
            Err(e) => return Err(err(e.into())),
        };
        let tx = db.begin_read().map_err(|e| err(e.into()))?;
        let names: Vec<String> =
            tx.list_tables().map_err(|e| err(e.into()))?.map(|t| t.name().to_string()).collect();
        let logged = |base: &str| names.iter().any(|n| *n == format!("{base}_blocks"));
        // Plain tables as they are; a logged table's three below.
        for name in &names {
            if name.ends_with("_blocks")
                || logged(name)
                || (name.ends_with("_log") && logged(name.trim_end_matches("_log")))
            {
                continue;
            }
            let t = tx.open_table(bytes(name)).map_err(|e| err(e.into()))?;
            let rows = t.iter().map_err(|e| err(e.into()))?;
            out.keyspace(
                name,
                rows.map(|kv| {
                    kv.map(|(k, v)| (k.value().to_vec(), v.value().to_vec()))
                        .map_err(|e| err(e.into()))
                }),
            )?;
        }
        for name in &names {
            let Some(base) = name.strip_suffix("_blocks") else { continue };
            // Each id's newest record: the one-per-id table's, then each run's, oldest run
            // first, then the log's in sequence order, each replacing the one before.
            let mut newest: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
            if names.iter().any(|n| n == base) {
                let t = tx.open_table(bytes(base)).map_err(|e| err(e.into()))?;
                for kv in t.iter().map_err(|e| err(e.into()))? {
                    let (k, v) = kv.map_err(|e| err(e.into()))?;
                    newest.insert(k.value().to_vec(), v.value().to_vec());
                }
            }
            let blocks = tx.open_table(bytes(name)).map_err(|e| err(e.into()))?;
            // The runs, oldest first, then each run's blocks in key order.
            let mut runs = Vec::new();
            for kv in blocks
                .range::<&[u8]>(&[0u8, 0, 0, 0][..]..&[0u8, 0, 0, 1][..])
                .map_err(|e| err(e.into()))?
            {
                let (k, _) = kv.map_err(|e| err(e.into()))?;
                match <[u8; 8]>::try_from(k.value()) {
                    Ok(k) => runs.push(u32::from_be_bytes([k[4], k[5], k[6], k[7]])),
                    Err(_) => {
                        return Err(format!(
                            "{name}: a directory entry of {} bytes",
                            k.value().len()
                        ))
                    }
                }
            }
            for run in runs {
                let (lo, hi) = (run.to_be_bytes(), (run + 1).to_be_bytes());
                let range = blocks.range::<&[u8]>(&lo[..]..&hi[..]).map_err(|e| err(e.into()))?;
                let mut records = Vec::new();
                for kv in range {
                    let (k, v) = kv.map_err(|e| err(e.into()))?;
                    block_records(v.value(), &mut records)
                        .map_err(|e| format!("{name}: the block {}: {e}", hex(k.value())))?;
                }
                newest.extend(records);
            }
            let log_name = format!("{base}_log");
            if names.contains(&log_name) {
                let log = tx
                    .open_table(TableDefinition::<u64, &[u8]>::new(&log_name))
                    .map_err(|e| err(e.into()))?;
                for kv in log.range::<u64>(..).map_err(|e| err(e.into()))? {
                    let (seq, v) = kv.map_err(|e| err(e.into()))?;
                    let v = v.value();
                    let Some((id, rec)) = v.split_first_chunk::<16>() else {
                        return Err(format!(
                            "{log_name}: record {} is {} bytes, shorter than an id",
                            seq.value(),
                            v.len()
                        ));
                    };
                    newest.insert(id.to_vec(), rec.to_vec());
                }
            }
            out.keyspace(base, newest.into_iter().map(Ok))?;
        }
        Ok(())
    }

    /// The records of a block (a count, then, packed together, each record's 16-byte id, its
    /// length as a LEB128 varint and its bytes) appended to `out`.
    fn block_records(value: &[u8], out: &mut Vec<(Vec<u8>, Vec<u8>)>) -> Result<(), String> {
        let Some((count, packed)) = value.split_first_chunk::<4>() else {
            return Err(format!("is {} bytes, shorter than its header", value.len()));
        };
        let count = u32::from_le_bytes(*count) as usize;
        let raw: Cow<'_, [u8]> = unpack(packed).map_err(|e| format!("cannot be unpacked: {e}"))?;
        let mut rest = &raw[..];
        let mut n = 0;
        while !rest.is_empty() {
            let (id, after) = rest.split_first_chunk::<16>().ok_or("ends inside an id")?;
            let (mut len, mut shift, mut at) = (0usize, 0u32, 0usize);
            loop {
                let b = *after.get(at).ok_or("ends inside a length")?;
                if shift > 28 {
                    return Err("has a record length over 4 GiB".into());
                }
                len |= ((b & 0x7f) as usize) << shift;
                shift += 7;
                at += 1;
                if b < 0x80 {
                    break;
                }
            }
            let record = after.get(at..at + len).ok_or("ends inside a record")?;
            out.push((id.to_vec(), record.to_vec()));
            rest = &after[at + len..];
            n += 1;
        }
        if n != count {
            return Err(format!("holds {n} records, its header says {count}"));
        }
        Ok(())
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }
}

//! A store's engine directory written anew and put in place of the old one (compaction,
//! migration), so that a crash at any point leaves one whole store.
//!
//! [`build`] writes the new directory beside the old one with the engine's bulk load
//! (sorted tables, no journal) and makes it durable. [`replace`] then renames the old
//! directory to [`OLD`], the new one to [`crate::ENGINE_DIR`], and removes the old, syncing
//! the store's directory after each rename. [`recover`], at every open, finishes what a
//! crash cut short: an engine directory missing while [`OLD`] is there gets [`OLD`] back
//! (the copy is whole too, but the old store is the one that passed its last open), and
//! left-over copies go.

use std::path::Path;

use crate::{open_engine_at, Options, Store, StoreError, ENGINE_DIR};

/// A compaction's copy, while it is written.
pub(crate) const COMPACTING: &str = "fjall.compacting";
/// A migration's copy, while it is written.
pub(crate) const MIGRATING: &str = "fjall.migrating";
/// The old engine directory, between the two renames of [`replace`].
const OLD: &str = "fjall.old";

/// A new engine directory being filled.
pub(crate) struct Builder {
    store: Store,
    pub(crate) records: u64,
    /// Give each keyspace its mark (a migration; a compaction copies the marks).
    mark: bool,
    marked: Vec<String>,
}

impl Builder {
    /// Fill keyspace `name` with `rows`, which must come in ascending key order, each key
    /// once; [`Builder::records`] counts them, the keyspace's mark left out.
    pub(crate) fn keyspace(
        &mut self,
        name: &str,
        rows: impl Iterator<Item = Result<(Vec<u8>, Vec<u8>), String>>,
    ) -> Result<(), String> {
        let ks = self.store.engine_keyspace(name).map_err(|e| e.to_string())?;
        let mark = (self.mark && name != crate::MARKS)
            .then(|| Ok((crate::KEYSPACE_MARK.to_vec(), b"1".to_vec())));
        if mark.is_some() {
            self.marked.push(name.to_string());
        }
        let mut rows = mark.into_iter().chain(rows).peekable();
        if rows.peek().is_none() {
            return Ok(());
        }
        let mut load = ks.start_ingestion().map_err(|e| e.to_string())?;
        let mut last: Option<Vec<u8>> = None;
        for r in rows {
            let (k, v) = r?;
            // The bulk load panics on keys out of order: refuse them first.
            if last.as_ref().is_some_and(|l| *l >= k) {
                return Err(format!("keyspace {name}: keys out of order"));
            }
            // The owners' records, not the keyspaces' marks.
            self.records += u64::from(k != crate::KEYSPACE_MARK);
            load.write(k.clone(), v).map_err(|e| e.to_string())?;
            last = Some(k);
        }
        load.finish().map_err(|e| e.to_string())
    }
}

/// Write a new engine directory at `at` (anything there first removed) with what `fill`
/// loads, durable when this returns. Returns the records loaded.
pub(crate) fn build(
    dir: &Path,
    at: &Path,
    mark: bool,
    fill: impl FnOnce(&mut Builder) -> Result<(), String>,
) -> Result<u64, String> {
    remove_dir(at).map_err(|e| e.to_string())?;
    let store = open_engine_at(dir, at, Options::default()).map_err(|e| e.to_string())?;
    let mut b = Builder { store, records: 0, mark, marked: Vec::new() };
    fill(&mut b)?;
    if !b.marked.is_empty() {
        let marks = b.store.engine_keyspace(crate::MARKS).map_err(|e| e.to_string())?;
        let mut batch = b.store.db().batch();
        for name in &b.marked {
            batch.insert(&marks, name.as_str(), b"1");
        }
        batch.commit().map_err(|e| e.to_string())?;
    }
    // Synced without the high-water mark ([`crate::acked`]): the bulk load's keyspace
    // creations take numbers of the engine's counter that its recovery does not count, and
    // nothing was acknowledged from the copy; its first persist after the swap writes it.
    b.store.db().persist(fjall::PersistMode::SyncAll).map_err(|e| e.to_string())?;
    Ok(b.records)
}

/// Put the engine directory `new` in place of the store's (if it has one).
pub(crate) fn replace(dir: &Path, new: &Path) -> Result<(), StoreError> {
    let engine = dir.join(ENGINE_DIR);
    let old = dir.join(OLD);
    if engine.exists() {
        rename(&engine, &old, dir)?;
    }
    rename(new, &engine, dir)?;
    remove_dir(&old)
}

/// Finish or undo a [`replace`] cut short, and remove copies left by a crash.
pub(crate) fn recover(dir: &Path) -> Result<(), StoreError> {
    let (engine, old) = (dir.join(ENGINE_DIR), dir.join(OLD));
    if !engine.exists() && old.is_dir() {
        rename(&old, &engine, dir)?;
        tracing::warn!(dir = %dir.display(), "a compaction was cut short; the store is as it was before it");
    }
    for left in [OLD, COMPACTING] {
        remove_dir(&dir.join(left))?;
    }
    Ok(())
}

fn rename(from: &Path, to: &Path, dir: &Path) -> Result<(), StoreError> {
    std::fs::rename(from, to)
        .map_err(|source| StoreError::Io { path: from.to_path_buf(), source })?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| StoreError::Io { path: dir.to_path_buf(), source })
}

fn remove_dir(p: &Path) -> Result<(), StoreError> {
    match std::fs::remove_dir_all(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(StoreError::Io { path: p.to_path_buf(), source }),
    }
}

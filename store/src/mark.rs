//! A guard against a store that lost its data behind Halyard's back.
//!
//! A store whose data was deleted opens as an *empty* store, without an error: the
//! engine creates a fresh database in an empty directory (and sled and redb, Halyard's
//! stores before, did the same for a deleted, truncated or zeroed file). For a checkpoint that means paying again for
//! every call; for a run state, forgetting every result. So each store carries a mark in
//! two places, written once when the store is created: a key inside the store (by the
//! caller, committed durably first) and the file `HALYARD_STORE` beside the store's
//! files (written and synced second). On every open, a store whose file says it was
//! marked but whose data no longer holds the mark has lost its data: that is an error
//! naming the directory, not a silent fresh start.
//!
//! This catches the loss of everything; the loss of acknowledged batches from a journal
//! (which the engine's recovery treats as an interrupted write) is the durable
//! high-water mark's to catch ([`crate::acked`]). Damage inside tables is the engine's to
//! find (its blocks carry checksums).

use std::io::Write;
use std::path::Path;

/// The file beside the store's data.
pub const MARK_FILE: &str = "HALYARD_STORE";
/// The key the caller keeps in its store (in a tree of its own).
pub const MARK_KEY: &[u8] = b"halyard-store-mark";

/// What the caller must do after [`check`].
#[derive(Debug, PartialEq, Eq)]
pub enum Mark {
    /// Both marks present: the store is the one that was created.
    Intact,
    /// New (or older than this guard): put `MARK_KEY` in the store, flush it, then call
    /// [`write_file`].
    Missing,
}

/// Compare the file mark with `store_has_mark` (whether the data holds `MARK_KEY`).
pub fn check(dir: &Path, store_has_mark: bool) -> Result<Mark, String> {
    let file = dir.join(MARK_FILE);
    match (file.exists(), store_has_mark) {
        (_, true) => Ok(Mark::Intact),
        (false, false) => Ok(Mark::Missing),
        (true, false) => Err(
            ("the store's data no longer holds what it held (its files were truncated, zeroed, replaced or deleted); \
             restore them from a backup, or move the directory away to start this store afresh (a checkpoint then pays \
             again for lost calls; a run state restarts the run)")
                .to_string(),
        ),
    }
}

/// [`check`], and on [`Mark::Missing`] run `mark_store` (put `MARK_KEY` in the store and
/// flush it) and then [`write_file`].
pub fn guard(
    dir: &Path,
    store_has_mark: bool,
    mark_store: impl FnOnce() -> Result<(), String>,
) -> Result<(), String> {
    if check(dir, store_has_mark)? == Mark::Missing {
        mark_store()?;
        write_file(dir)?;
    }
    Ok(())
}

/// Create a store's directory (and missing parents) readable by its owner only (0700):
/// a store holds paid answers and run state that other local users have no business
/// reading. An existing directory keeps its mode.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(dir)
}

/// Write the file mark, synced (after the store's own mark is flushed).
pub fn write_file(dir: &Path) -> Result<(), String> {
    let path = dir.join(MARK_FILE);
    let err = |e: std::io::Error| format!("{}: {e}", path.display());
    let mut f = std::fs::File::create(&path).map_err(err)?;
    f.write_all(b"This directory is a Halyard store. Do not delete this file on its own.\n")
        .map_err(err)?;
    f.sync_all().map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(check(d.path(), false), Ok(Mark::Missing));
        assert_eq!(check(d.path(), true), Ok(Mark::Intact));
        write_file(d.path()).unwrap();
        assert_eq!(check(d.path(), true), Ok(Mark::Intact));
        let e = check(d.path(), false).unwrap_err();
        assert!(e.contains("truncated"), "{e}");
    }

    /// Issue 13: new store directories (and the parents created with them) are 0700.
    #[cfg(unix)]
    #[test]
    fn store_dirs_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("a/b");
        create_private_dir(&dir).unwrap();
        create_private_dir(&dir).unwrap();
        for p in [d.path().join("a"), dir] {
            assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o700);
        }
    }
}

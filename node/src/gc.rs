//! `halyard gc PATH...`: compact the Halyard stores at or under each path (a run's state,
//! a worker's checkpoint), giving the room their commits freed back to the file system.
//!
//! A complete run compacts its own stores as it ends (the coordinator its run state,
//! `halyard run` its local worker's checkpoint). `gc` is for the rest: runs stopped or
//! interrupted and not resumed, long-lived workers' checkpoints (compacted while the
//! worker is stopped), and stores written by earlier builds. A store in use by a running
//! process is refused by its lock and left as it is; so is every store when nothing at a
//! path is a store.

use std::path::{Path, PathBuf};

use crate::NodeError;

/// Page cache while compacting.
const CACHE_BYTES: usize = 64 << 20;
/// How deep under a path stores are looked for: `<out>/<run>/state` from `<out>`.
const DEPTH: usize = 2;

/// What `gc` did: a line per store, and whether every store was compacted.
pub struct Gc {
    pub lines: Vec<String>,
    pub failed: usize,
}

/// Compact every store at or under `paths` (see the module docs).
pub fn run(paths: &[PathBuf]) -> Result<Gc, NodeError> {
    let mut stores = Vec::new();
    for p in paths {
        let found = stores_under(p, DEPTH).map_err(|source| NodeError::Io {
            what: format!("halyard gc: reading {}", p.display()),
            source,
        })?;
        if found.is_empty() {
            return Err(NodeError::Usage(format!(
                "halyard gc: {} holds no Halyard store (give a run directory, a store directory such as a worker's --state, or an output directory of runs)",
                p.display()
            )));
        }
        stores.extend(found);
    }
    stores.sort();
    stores.dedup();
    let mut gc = Gc { lines: Vec::new(), failed: 0 };
    let (mut before, mut after) = (0u64, 0u64);
    for dir in &stores {
        let started = std::time::Instant::now();
        match halyard_store::compact(dir, CACHE_BYTES) {
            Ok(c) => {
                before += c.before;
                after += c.after;
                gc.lines.push(format!(
                    "compacted {}: {} -> {} in {:.1} s",
                    dir.display(),
                    mb(c.before),
                    mb(c.after),
                    started.elapsed().as_secs_f64()
                ));
            }
            Err(e) => {
                gc.failed += 1;
                gc.lines.push(format!("not compacted {}: {e}", dir.display()));
            }
        }
    }
    gc.lines.push(format!(
        "{} of {} store(s) compacted: {} -> {} ({} returned)",
        stores.len() - gc.failed,
        stores.len(),
        mb(before),
        mb(after),
        mb(before.saturating_sub(after))
    ));
    Ok(gc)
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// `dir` if it is a store, else the stores in its subdirectories, `depth` levels down.
/// A path that does not exist is an error (a typo must not pass as "nothing to do").
fn stores_under(dir: &Path, depth: usize) -> std::io::Result<Vec<PathBuf>> {
    let meta = std::fs::metadata(dir)?;
    if !meta.is_dir() {
        return Ok(Vec::new());
    }
    if halyard_store::is_store(dir) {
        return Ok(vec![dir.to_path_buf()]);
    }
    let mut found = Vec::new();
    if depth == 0 {
        return Ok(found);
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        // Symbolic links are not followed: a store is compacted where it lives.
        if entry.file_type()?.is_dir() {
            found.extend(stores_under(&entry.path(), depth - 1)?);
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use halyard_store::redb::{ReadableDatabase, ReadableTableMetadata};

    const T: halyard_store::Table = halyard_store::table("t");

    /// A store with room to return: many commits, most of their records removed.
    fn store_with_room(dir: &Path) {
        let db = halyard_store::open(dir, 1 << 20, &[T]).unwrap();
        for i in 0..4000u32 {
            let tx = db.begin_write().unwrap();
            tx.open_table(T).unwrap().insert(&i.to_be_bytes()[..], &[1u8; 300][..]).unwrap();
            tx.commit().unwrap();
        }
        let tx = db.begin_write().unwrap();
        {
            let mut t = tx.open_table(T).unwrap();
            for i in (0..4000u32).filter(|i| i % 8 != 0) {
                t.remove(&i.to_be_bytes()[..]).unwrap();
            }
        }
        tx.commit().unwrap();
    }

    /// From an output directory, gc finds each run's stores two levels down, compacts
    /// them and says so; the records stay.
    #[test]
    fn compacts_the_stores_of_an_output_directory() {
        let out = tempfile::tempdir().unwrap();
        let (state, cp) = (out.path().join("a/state"), out.path().join("b/checkpoint"));
        store_with_room(&state);
        store_with_room(&cp);
        std::fs::create_dir_all(out.path().join("a/report")).unwrap();
        let gc = run(&[out.path().to_path_buf()]).unwrap();
        assert_eq!(gc.failed, 0, "{:?}", gc.lines);
        assert_eq!(gc.lines.len(), 3, "{:?}", gc.lines);
        assert!(
            gc.lines[0].starts_with(&format!("compacted {}", state.display())),
            "{:?}",
            gc.lines
        );
        assert!(gc.lines[1].starts_with(&format!("compacted {}", cp.display())), "{:?}", gc.lines);
        assert!(gc.lines[2].starts_with("2 of 2 store(s) compacted"), "{:?}", gc.lines);
        for dir in [&state, &cp] {
            let bytes = halyard_store::disk_bytes(&dir.join(halyard_store::FILE)).unwrap();
            assert!(bytes < 4000 * 300 / 2, "{}: {bytes} bytes after gc", dir.display());
            let db = halyard_store::open(dir, 1 << 20, &[T]).unwrap();
            let tx = db.begin_read().unwrap();
            let t = tx.open_table(T).unwrap();
            assert_eq!(t.len().unwrap(), 500);
            assert!(t.get(&8u32.to_be_bytes()[..]).unwrap().is_some());
        }
    }

    /// A store in use is left as it is and counted as failed; the others are compacted.
    #[test]
    fn a_store_in_use_is_refused_and_the_rest_compacted() {
        let out = tempfile::tempdir().unwrap();
        let (busy, idle) = (out.path().join("busy"), out.path().join("idle"));
        store_with_room(&busy);
        store_with_room(&idle);
        let held = halyard_store::open(&busy, 1 << 20, &[T]).unwrap();
        let size = halyard_store::disk_bytes(&busy.join(halyard_store::FILE)).unwrap();
        let gc = run(&[busy.clone(), idle.clone()]).unwrap();
        assert_eq!(gc.failed, 1, "{:?}", gc.lines);
        assert!(
            gc.lines[0].starts_with(&format!("not compacted {}", busy.display()))
                && gc.lines[0].contains("in use by another process"),
            "{:?}",
            gc.lines
        );
        assert!(
            gc.lines[1].starts_with(&format!("compacted {}", idle.display())),
            "{:?}",
            gc.lines
        );
        assert!(gc.lines[2].starts_with("1 of 2 store(s) compacted"), "{:?}", gc.lines);
        drop(held);
        assert_eq!(halyard_store::disk_bytes(&busy.join(halyard_store::FILE)).unwrap(), size);
    }

    /// A path that is missing or holds no store is an error naming it, not "nothing to do".
    #[test]
    fn paths_without_stores_are_errors() {
        let out = tempfile::tempdir().unwrap();
        let e = run(&[out.path().join("no-such-run")]).err().unwrap().to_string();
        assert!(e.contains("no-such-run"), "{e}");
        let empty = out.path().join("empty/state");
        std::fs::create_dir_all(&empty).unwrap();
        let e = run(&[out.path().join("empty")]).err().unwrap().to_string();
        assert!(e.contains("holds no Halyard store") && e.contains("empty"), "{e}");
    }
}

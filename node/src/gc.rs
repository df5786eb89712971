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

use halyard_store::megabytes as mb;

use crate::NodeError;

/// Memory while compacting.
const OPTIONS: halyard_store::Options =
    halyard_store::Options { cache_bytes: 32 << 20, memtable_bytes: 8 << 20 };
/// How deep under a path stores are looked for: `<out>/<run>/state` from `<out>`.
const DEPTH: usize = 2;

/// What `gc` did: a line per store (and per directory it could not search), and how
/// many stores were not compacted.
pub struct Gc {
    pub lines: Vec<String>,
    pub failed: usize,
}

/// Compact every store at or under `paths` (see the module docs).
pub fn run(paths: &[PathBuf]) -> Result<Gc, NodeError> {
    let mut lines = Vec::new();
    let stores = find_stores("gc", paths, &mut lines)?;
    let mut gc = Gc { lines, failed: 0 };
    let (mut before, mut after) = (0u64, 0u64);
    for dir in &stores {
        let started = std::time::Instant::now();
        match halyard_store::compact(dir, OPTIONS) {
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

/// The stores at or under `paths` (see [`run`]); a path with none is an error naming
/// `command`.
fn find_stores(
    command: &str,
    paths: &[PathBuf],
    lines: &mut Vec<String>,
) -> Result<Vec<PathBuf>, NodeError> {
    let mut stores = Vec::new();
    for p in paths {
        let meta = std::fs::metadata(p).map_err(|source| NodeError::Io {
            what: format!("halyard {command}: {}", p.display()),
            source,
        })?;
        let mut found = Vec::new();
        if meta.is_dir() {
            stores_under(p, DEPTH, &mut found, lines);
        }
        if found.is_empty() {
            return Err(NodeError::Usage(format!(
                "halyard {command}: {} holds no Halyard store (give a run directory, a store directory such as a worker's --state, or an output directory of runs)",
                p.display()
            )));
        }
        stores.extend(found);
    }
    stores.sort();
    stores.dedup();
    Ok(stores)
}

/// `halyard migrate PATH...`: move every store at or under `paths` that an earlier build
/// wrote (redb, sled) to this build's engine now, instead of at its next open; stores
/// of this build are checked as opening checks them.
pub fn migrate(paths: &[PathBuf]) -> Result<Gc, NodeError> {
    let mut lines = Vec::new();
    let stores = find_stores("migrate", paths, &mut lines)?;
    let mut out = Gc { lines, failed: 0 };
    for dir in &stores {
        match halyard_store::migrate::run(dir) {
            Ok(Some(m)) => out.lines.push(format!(
                "migrated {} from {}: {} records in {:.1} s",
                dir.display(),
                m.from,
                m.records,
                m.seconds
            )),
            Ok(None) => out.lines.push(format!("{}: already this build's store", dir.display())),
            Err(e) => {
                out.failed += 1;
                out.lines.push(format!("not migrated {}: {e}", dir.display()));
            }
        }
    }
    Ok(out)
}

/// `dir` if it is a store, else the stores in its subdirectories, `depth` levels down,
/// into `found`. A subdirectory that cannot be read (a `lost+found` at a volume's root)
/// is passed over with a line in `lines`, not an end to the search.
fn stores_under(dir: &Path, depth: usize, found: &mut Vec<PathBuf>, lines: &mut Vec<String>) {
    if halyard_store::is_store(dir) {
        found.push(dir.to_path_buf());
        return;
    }
    if depth == 0 {
        return;
    }
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            lines.push(format!("not searched {}: {e}", dir.display()));
            return;
        }
    };
    for entry in entries {
        match entry.and_then(|e| Ok((e.path(), e.file_type()?))) {
            // Symbolic links are not followed: a store is compacted where it lives.
            Ok((path, kind)) if kind.is_dir() => stores_under(&path, depth - 1, found, lines),
            Ok(_) => {}
            Err(e) => lines.push(format!("not searched an entry of {}: {e}", dir.display())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const T: &str = "t";

    fn open(dir: &Path) -> halyard_store::Store {
        halyard_store::open(dir, OPTIONS, &[T]).unwrap()
    }

    /// A store with room to return: many commits, most of their records removed.
    fn store_with_room(dir: &Path) {
        let s = open(dir);
        let t = s.keyspace(T).unwrap();
        for i in 0..4000u32 {
            t.insert(i.to_be_bytes(), [1u8; 300]).unwrap();
        }
        for i in (0..4000u32).filter(|i| i % 8 != 0) {
            t.remove(i.to_be_bytes()).unwrap();
        }
        s.persist().unwrap();
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
            let bytes = halyard_store::disk_bytes(dir).unwrap();
            assert!(bytes < 4000 * 300 / 2, "{}: {bytes} bytes after gc", dir.display());
            let s = open(dir);
            let t = s.keyspace(T).unwrap();
            assert_eq!(halyard_store::count(&t).unwrap(), 500);
            assert!(t.get(8u32.to_be_bytes()).unwrap().is_some());
        }
    }

    /// A subdirectory that cannot be read is passed over with a line naming it; the
    /// stores beside it are compacted.
    #[test]
    fn an_unreadable_subdirectory_does_not_stop_the_search() {
        use std::os::unix::fs::PermissionsExt;
        let out = tempfile::tempdir().unwrap();
        let (closed, state) = (out.path().join("lost+found"), out.path().join("a/state"));
        store_with_room(&state);
        std::fs::create_dir(&closed).unwrap();
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o000)).unwrap();
        let readable = std::fs::read_dir(&closed).is_ok(); // root reads it anyway
        let gc = run(&[out.path().to_path_buf()]);
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
        let gc = gc.unwrap();
        assert_eq!(gc.failed, 0, "{:?}", gc.lines);
        assert!(
            gc.lines.iter().any(|l| l.starts_with(&format!("compacted {}", state.display()))),
            "{:?}",
            gc.lines
        );
        if !readable {
            assert!(
                gc.lines[0].starts_with(&format!("not searched {}", closed.display())),
                "{:?}",
                gc.lines
            );
        }
    }

    /// A store in use is left as it is and counted as failed; the others are compacted.
    #[test]
    fn a_store_in_use_is_refused_and_the_rest_compacted() {
        let out = tempfile::tempdir().unwrap();
        let (busy, idle) = (out.path().join("busy"), out.path().join("idle"));
        store_with_room(&busy);
        store_with_room(&idle);
        let held = open(&busy);
        let size = halyard_store::disk_bytes(&busy).unwrap();
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
        assert_eq!(halyard_store::disk_bytes(&busy).unwrap(), size);
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

//! The engine's directory checked before the engine opens it, because its open deletes
//! what it cannot place (fjall 3.1.13 `recovery.rs`, `recover_keyspaces`): a keyspace
//! directory without its version file (`current`) is taken for one whose creation was
//! cut short, and one its catalogue (keyspace `0`) does not name is taken for one
//! dropped; both are removed with their tables. A name that is not a number makes it
//! panic. So [`check`] refuses, before anything is deleted:
//! - an entry of `keyspaces/` that is not a directory named by a number;
//! - a keyspace directory without `current` that holds tables (a creation cut short
//!   holds none);
//! - keyspace directories while the catalogue has no `current` (it would open empty and
//!   name none of them).

use std::path::Path;

/// `Err` names what is wrong and where (module docs).
pub(crate) fn check(engine: &Path) -> Result<(), String> {
    let keyspaces = engine.join("keyspaces");
    let entries = match std::fs::read_dir(&keyspaces) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("{}: {e}", keyspaces.display())),
    };
    let mut others = 0;
    for e in entries {
        let e = e.map_err(|e| format!("{}: {e}", keyspaces.display()))?;
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if !path.is_dir() {
            // The engine skips stray files.
            continue;
        }
        if name.parse::<u64>().is_err() {
            return Err(format!(
                "{} is not a keyspace of the engine's (its name is not a number); move it out of the store",
                path.display()
            ));
        }
        if name == "0" {
            continue;
        }
        others += 1;
        if !path.join("current").exists() && holds_tables(&path) {
            return Err(format!(
                "its keyspace directory {} holds tables but lost its version file (current), so the engine \
                 would delete it; the files are still there: restore the store from a backup, or move it away to \
                 start this store afresh",
                path.display()
            ));
        }
    }
    if others > 0 && !keyspaces.join("0").join("current").exists() {
        return Err(format!(
            "its catalogue of keyspaces ({}) lost its version file (current), so the engine would delete all \
             {others} keyspaces; the files are still there: restore the store from a backup, or move it away to \
             start this store afresh",
            keyspaces.join("0").display()
        ));
    }
    Ok(())
}

fn holds_tables(keyspace: &Path) -> bool {
    std::fs::read_dir(keyspace.join("tables")).is_ok_and(|mut d| d.next().is_some())
}

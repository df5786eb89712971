//! The durable high-water mark: how far the store's writes had been made durable, kept
//! beside the engine's files so that an open can tell a store that lost acknowledged
//! records from one that lost only what nobody was told was kept.
//!
//! The engine numbers its writes with one counter (a batch takes the next number under
//! the journal's lock, and is written to the journal in that order). [`Store::persist`]
//! reads the number after the last batch written (the engine's visible number; its
//! counter is no measure, as its flushes take numbers too), syncs the journal, then writes that number to the file
//! [`FILE`] in the engine's directory and syncs it: every batch below the number is
//! durable before the file says so, and every acknowledgement comes after both. An open,
//! before the engine's, compares it with the journals (`journal::check`): the newest
//! journal's last whole batch must be the one before the number (a flush starts a new
//! journal, so batches in tables are not looked for there). Less means damage would cut
//! acknowledged batches from the journal (the engine's recovery takes any undecodable
//! entry as the journal's end), and the store is refused, named, with what to do. (The
//! engine's own next number after its recovery is no measure: a compaction drops the
//! tombstones of a last batch of removals, and with them its number.)
//!
//! The file is 16 bytes: the number, and its bitwise complement (both little-endian),
//! so that a damaged file is told apart from a number. A store without the file (made
//! before it, or by a bulk load not yet persisted) has nothing to compare.
//!
//! **Not checked at open for now** (issue 50): the comparison refused healthy stores,
//! closed cleanly, under load (a mark one or two numbers past the newest journal's last
//! batch), so `open` does not call `journal::check`; the mark is still written.
//!
//! [`Store::persist`]: crate::Store::persist

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The file, in the engine's directory (so that a compaction's swap moves it with the
/// engine's files it describes).
pub const FILE: &str = "halyard_acked";

/// The number in `engine`'s file: `Ok(None)` without one, `Err` for a damaged one.
#[allow(dead_code)] // Read by the journal check, off at open for now (issue 50).
pub(crate) fn read(engine: &Path) -> Result<Option<u64>, String> {
    let path = engine.join(FILE);
    let mut f = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let mut b = Vec::new();
    f.read_to_end(&mut b).map_err(|e| format!("{}: {e}", path.display()))?;
    let word =
        |i: usize| b.get(i..i + 8).map(|w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8])));
    match (b.len(), word(0), word(8)) {
        (16, Some(n), Some(check)) if check == !n => Ok(Some(n)),
        _ => Err(format!(
            "{} is damaged (it is not the 16 bytes of a number and its complement)",
            path.display()
        )),
    }
}

/// The open file of a store's mark and the number it holds.
#[derive(Debug, Default)]
pub(crate) struct Mark {
    file: Option<File>,
    written: u64,
}

impl Mark {
    /// Write `n` to `engine`'s file and sync it (a number not above the one written is
    /// left as it is).
    pub(crate) fn write(&mut self, engine: &Path, n: u64) -> std::io::Result<()> {
        if self.file.is_some() && n <= self.written {
            return Ok(());
        }
        if self.file.is_none() {
            let path = engine.join(FILE);
            let new = !path.exists();
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)?;
            if new {
                // The file's name is durable before anything relies on it.
                f.write_all_at(&bytes(n), 0)?;
                f.sync_all()?;
                File::open(engine)?.sync_all()?;
                self.file = Some(f);
                self.written = n;
                return Ok(());
            }
            self.file = Some(f);
        }
        let Some(f) = self.file.as_ref() else { return Ok(()) };
        // 16 bytes at offset 0: within one sector, written whole or not at all.
        f.write_all_at(&bytes(n), 0)?;
        f.sync_data()?;
        self.written = n;
        Ok(())
    }
}

fn bytes(n: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&n.to_le_bytes());
    b[8..].copy_from_slice(&(!n).to_le_bytes());
    b
}

//! The durable high-water mark: how far the store's writes had been made durable, kept
//! beside the engine's files so that an open can tell a store that lost acknowledged
//! records from one that lost only what nobody was told was kept.
//!
//! Every batch an owner commits through [`Store::commit`] holds the store's own batch
//! number ([`crate::BATCH_KEY`]), one more than the batch before's. [`Store::persist`]
//! reads the number of the last batch committed, syncs the journal, then writes that
//! number to the file [`FILE`] in the engine's directory and syncs it: every batch up to
//! the number is durable before the file says so, and every acknowledgement comes after
//! both. An open compares it, before the engine's recovery, with the numbers the journals
//! hold (`journal::check`: they must go up by one and reach it), and after, with the
//! number the store holds (journals all flushed into tables). Less is acknowledged
//! batches lost, and the store is refused, named, with what to do.
//!
//! The engine's own sequence numbers are no measure: its flushes, compactions and bulk
//! loads take numbers of the same counter as the batches, and no journal holds them (a
//! mark of the engine's numbers was one or two past the newest journal's last batch on
//! healthy stores under load).
//!
//! The file is 16 bytes: the number, and its bitwise complement (both little-endian),
//! so that a damaged file is told apart from a number. A store without the file (made
//! before it, or by a bulk load not yet persisted) has nothing to compare.
//!
//! [`Store::commit`]: crate::Store::commit
//! [`Store::persist`]: crate::Store::persist

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The file, in the engine's directory (so that a compaction's swap moves it with the
/// engine's files it describes).
pub const FILE: &str = "halyard_durable";
/// The file of a build before, which held the engine's sequence numbers (never checked).
const EARLIER_FILE: &str = "halyard_acked";

/// Remove the file of a build before from `engine` (its numbers mean nothing now).
pub(crate) fn remove_earlier(engine: &Path) {
    let _ = std::fs::remove_file(engine.join(EARLIER_FILE));
}

/// The number in `engine`'s file: `Ok(None)` without one, `Err` for a damaged one.
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

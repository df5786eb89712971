//! What fjall's own recovery cannot tell apart: a journal cut short by a crash, and one
//! damaged in the middle. Read against fjall 3.1.13 (`journal/reader.rs`,
//! `journal/batch_reader.rs`, `Database::recover`): any entry that does not decode (a
//! wrong tag, a length past the end, a missing trailer) is taken as the journal's end;
//! the file is cut there and every later batch is dropped, in sealed journals as in the
//! active one. Only a batch whose checksum does not match is an error.
//!
//! So before the engine opens a store, [`check`] reads every journal file with the same
//! framing, without writing anything, and refuses what the engine would silently cut:
//! - a **sealed** journal (every one but the newest) was synced whole before the next one
//!   began: any byte other than zero after its last whole batch is damage;
//! - batches are numbered by one counter, taken under the journal's lock, so where one
//!   journal follows another (their numbers adjacent), the later one's first batch
//!   follows the earlier one's last: a gap is a sealed journal that lost its last batches
//!   (zeroed, say, which the first rule cannot see);
//! - the **active** journal may end in a batch cut short by a crash; whether it lost
//!   acknowledged batches is the durable mark's to say ([`crate::acked`]), after the open.
//!
//! The engine's entry format (fjall `journal/entry.rs`): a batch is `Start` (tag 1, u32
//! item count, u64 sequence number), that many `Item` (tag 2, u8 value type, u8
//! compression, u64 keyspace, u16 key length, u32 value length, u32 stored length, key,
//! stored value) or `Clear` (tag 4, u64 keyspace) entries, and `End` (tag 3, u64
//! checksum, the bytes `FJL` 3). Integers are little-endian.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// What one journal file holds, as the engine's recovery would read it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Scan {
    /// Whole batches, and the sequence numbers of the first and the last.
    pub(crate) batches: u64,
    pub(crate) first: Option<u64>,
    pub(crate) last: Option<u64>,
    /// The byte after the last whole batch: where the engine's recovery cuts the file.
    pub(crate) end: u64,
    /// The first byte other than zero at or after `end`, if any: a batch cut short, or
    /// damage.
    pub(crate) nonzero_after: Option<u64>,
    /// Each whole batch's first byte and the byte after it (kept by [`scan_bounds`] only).
    pub(crate) bounds: Vec<(u64, u64)>,
}

/// Reads exactly `n` bytes, or `None` at the end of the file (or on an error: the
/// engine's recovery stops there too).
fn take<const N: usize>(r: &mut impl Read) -> Option<[u8; N]> {
    let mut b = [0u8; N];
    r.read_exact(&mut b).ok().map(|()| b)
}

fn skip(r: &mut impl Read, n: u64) -> Option<()> {
    let got = std::io::copy(&mut r.by_ref().take(n), &mut std::io::sink()).ok()?;
    (got == n).then_some(())
}

/// Read the journal at `path` (module docs).
pub(crate) fn scan(path: &Path) -> std::io::Result<Scan> {
    scan_with(path, false)
}

/// [`scan`], keeping where each batch lies.
#[cfg(test)]
pub(crate) fn scan_bounds(path: &Path) -> std::io::Result<Scan> {
    scan_with(path, true)
}

fn scan_with(path: &Path, keep_bounds: bool) -> std::io::Result<Scan> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    let mut r = BufReader::with_capacity(1 << 16, file);
    let mut s = Scan::default();
    let mut pos = 0u64;
    // In a batch: its sequence number and the entries still to come.
    let mut open: Option<(u64, u32)> = None;
    let mut start = 0u64;
    loop {
        if open.is_none() {
            start = pos;
        }
        let Some([tag]) = take::<1>(&mut r) else { break };
        pos += 1;
        match tag {
            1 => {
                let (Some(count), Some(seqno)) = (take::<4>(&mut r), take::<8>(&mut r)) else {
                    break;
                };
                pos += 12;
                if open.is_some() {
                    break;
                }
                open = Some((u64::from_le_bytes(seqno), u32::from_le_bytes(count)));
            }
            2 | 4 => {
                if tag == 2 {
                    let Some(h) = take::<20>(&mut r) else { break };
                    // Value type (0, 1, 2 or 4) and compression (0 none, 1 lz4).
                    if !matches!(h[0], 0 | 1 | 2 | 4) || h[1] > 1 {
                        break;
                    }
                    let key = u64::from(u16::from_le_bytes([h[10], h[11]]));
                    let stored = u64::from(u32::from_le_bytes([h[16], h[17], h[18], h[19]]));
                    if skip(&mut r, key + stored).is_none() {
                        break;
                    }
                    pos += 20 + key + stored;
                } else {
                    if take::<8>(&mut r).is_none() {
                        break;
                    }
                    pos += 8;
                }
                match &mut open {
                    Some((_, left)) if *left > 0 => *left -= 1,
                    // Outside a batch the engine cuts here; too many items is its error.
                    _ => break,
                }
            }
            3 => {
                let (Some(_), Some(magic)) = (take::<8>(&mut r), take::<4>(&mut r)) else {
                    break;
                };
                pos += 12;
                if magic != *b"FJL\x03" {
                    break;
                }
                match open.take() {
                    Some((seqno, 0)) => {
                        s.batches += 1;
                        s.first.get_or_insert(seqno);
                        s.last = Some(seqno);
                        s.end = pos;
                        if keep_bounds {
                            s.bounds.push((start, pos));
                        }
                    }
                    // Too few items: the engine's error at open; stop here.
                    _ => break,
                }
            }
            _ => break,
        }
    }
    // Anything but zeros from the last whole batch on?
    let mut f = r.into_inner();
    f.seek(SeekFrom::Start(s.end))?;
    let mut r = BufReader::with_capacity(1 << 16, f);
    let mut at = s.end;
    let mut buf = vec![0u8; 1 << 16];
    while at < len {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        if let Some(i) = buf[..n].iter().position(|&b| b != 0) {
            s.nonzero_after = Some(at + i as u64);
            break;
        }
        at += n as u64;
    }
    Ok(s)
}

/// The journal files of the engine directory `engine`, by number, oldest first.
pub(crate) fn journals(engine: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(engine) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for e in entries {
        let p = e?.path();
        let Some(n) = p.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".jnl"))
        else {
            continue;
        };
        if let Ok(n) = n.parse::<u64>() {
            out.push((n, p));
        }
    }
    out.sort();
    Ok(out)
}

/// Refuse the journals of `engine` that the engine's recovery would cut in the middle
/// (module docs), and, given the store's high-water mark `acked` (the engine's next batch
/// number when its journal was last synced and acknowledged, [`crate::acked`]), an active
/// journal that lost acknowledged batches: its last whole batch is numbered below
/// `acked - 1` (a batch is written to the newest journal, and a flush starts a new one,
/// so an acknowledged batch after the newest journal's last is gone), or it holds no
/// whole batch but other bytes (damage from its start) while no journal holds batch
/// `acked - 1`. `Err` says which and where.
pub(crate) fn check(engine: &Path, acked: Option<u64>) -> Result<(), String> {
    let files = journals(engine).map_err(|e| format!("{}: {e}", engine.display()))?;
    let newest = files.last().map(|(n, _)| *n);
    let mut highest: Option<u64> = None;
    // The last batch number of the journal before, where the numbers of the files adjoin.
    let mut before: Option<(u64, u64)> = None;
    for (n, path) in &files {
        let s = scan(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        highest = highest.max(s.last);
        if Some(*n) == newest {
            if let Some(acked) = acked.filter(|a| *a > 0) {
                let lost = match s.last {
                    Some(last) => last + 1 < acked,
                    None => s.nonzero_after.is_some() && highest.is_none_or(|h| h + 1 < acked),
                };
                if lost {
                    return Err(format!(
                        "its journal {name} ends at batch {} (byte {}), but batches up to {} had been made durable \
                         and acknowledged: damage in it would cut them off",
                        s.last.map_or("none".to_string(), |l| l.to_string()),
                        s.end,
                        acked - 1
                    ));
                }
            }
        } else {
            if let Some(at) = s.nonzero_after {
                return Err(format!(
                    "its sealed journal {name} is damaged at byte {at} (after {} whole batches): the engine would \
                     drop every batch from there on",
                    s.batches
                ));
            }
        }
        if let (Some((prev_n, prev_last)), Some(first)) = (before, s.first) {
            if prev_n + 1 == *n && first != prev_last + 1 {
                return Err(format!(
                    "its journal {prev_n}.jnl ends at batch {prev_last} but {name} begins at batch {first}: the \
                     batches between were lost from the end of {prev_n}.jnl"
                ));
            }
        }
        before = match (before, s.last) {
            (_, Some(last)) => Some((*n, last)),
            // An empty journal passes the number on.
            (Some((prev_n, prev_last)), None) if prev_n + 1 == *n => Some((*n, prev_last)),
            _ => None,
        };
    }
    Ok(())
}

//! What fjall's own recovery cannot tell apart: a journal cut short by a crash, and one
//! damaged in the middle. Read against fjall 3.1.13 (`journal/reader.rs`,
//! `journal/batch_reader.rs`, `Database::recover`): any entry that does not decode (a
//! wrong tag, a length past the end, a missing trailer) is taken as the journal's end;
//! the file is cut there and every later batch is dropped, in sealed journals as in the
//! active one. Only a batch whose checksum does not match is an error.
//!
//! The engine's sequence numbers cannot say what is missing: one counter numbers the
//! batches and also every new version of a keyspace's table list (a flush, a compaction, a
//! bulk load: lsm-tree `upgrade_version`, `ingest.rs`), which no journal holds, so the
//! numbers of two batches one after the other may differ by more than one (this refused
//! healthy stores under load). So the store numbers its own batches: every batch it
//! commits ([`crate::Store::commit`]) holds the record [`crate::BATCH_KEY`], the number
//! one past the previous batch's, written under a lock held through the commit (the
//! numbers are in the journals' order). Before the engine opens a store, [`check`] reads
//! every journal with the engine's framing, without writing anything, and refuses what
//! the engine would silently cut:
//! - a **sealed** journal (every one but the newest) was synced whole before the next one
//!   began: any byte other than zero after its last whole batch is damage;
//! - the store's numbers, read across the journals oldest first, go up by one: a gap is
//!   batches lost from a journal (a sealed journal's last batches zeroed, say, which the
//!   first rule cannot see);
//! - the last number the journals hold is at least the durable high-water mark
//!   ([`crate::acked`]): less is acknowledged batches cut from the end of the newest
//!   journal (a crash only cuts batches not yet synced, which nobody was told were kept);
//! - when no journal holds a number before the place the engine would cut the newest one
//!   (its first batches damaged, say), the first numbered batch past that place must be
//!   above the mark: one at or below it is an acknowledged batch the engine would drop
//!   (past a crash's cut, only batches never synced can be whole). Found by trying every
//!   byte past the cut as a batch's start.
//!
//! Journals hold no number when every batch was flushed into tables and their journals
//! removed (or when what held them is damaged beyond finding a batch); then the open compares the mark with the number the tables hold, after the
//! engine's recovery ([`crate::open`]).
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
    /// The store's numbers ([`crate::BATCH_KEY`]) of the whole batches that hold one, in
    /// the file's order.
    pub(crate) numbers: Vec<u64>,
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
    // The store's batch number in the batch being read, if it holds one.
    let mut counter: Option<u64> = None;
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
                counter = None;
            }
            2 | 4 => {
                if tag == 2 {
                    let Some(h) = take::<20>(&mut r) else { break };
                    // Value type (0, 1, 2 or 4) and compression (0 none, 1 lz4).
                    if !matches!(h[0], 0 | 1 | 2 | 4) || h[1] > 1 {
                        break;
                    }
                    let key_len = usize::from(u16::from_le_bytes([h[10], h[11]]));
                    let stored = u64::from(u32::from_le_bytes([h[16], h[17], h[18], h[19]]));
                    let mut key = vec![0u8; key_len];
                    if r.read_exact(&mut key).is_err() {
                        break;
                    }
                    // The store's batch number: an uncompressed 8-byte value.
                    if key == crate::BATCH_KEY && h[1] == 0 && stored == 8 {
                        let Some(v) = take::<8>(&mut r) else { break };
                        counter = Some(u64::from_le_bytes(v));
                    } else if skip(&mut r, stored).is_none() {
                        break;
                    }
                    pos += 20 + key_len as u64 + stored;
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
                        if let Some(c) = counter {
                            s.numbers.push(c);
                        }
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

/// Refuse the journals of `engine` that the engine's recovery would cut with batches of
/// the store lost (module docs). `durable` is the store's high-water mark: the number of
/// the last batch made durable and acknowledged ([`crate::acked`]). Returns the last batch
/// number the journals hold, if any holds one. `Err` says what was lost and where.
pub(crate) fn check(engine: &Path, durable: Option<u64>) -> Result<Option<u64>, String> {
    let files = journals(engine).map_err(|e| format!("{}: {e}", engine.display()))?;
    let newest = files.last().map(|(n, _)| *n);
    // The newest journal's path and what it holds.
    let mut newest_scan: Option<(&Path, Scan)> = None;
    // The last number seen, and the journal that held it.
    let mut last: Option<(u64, String)> = None;
    for (n, path) in &files {
        let s = scan(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
        if Some(*n) != newest {
            if let Some(at) = s.nonzero_after {
                return Err(format!(
                    "its sealed journal {name} is damaged at byte {at} (after {} whole batches): the engine would \
                     drop every batch from there on",
                    s.batches
                ));
            }
        }
        for &number in &s.numbers {
            if let Some((prev, held)) = &last {
                if number != prev + 1 {
                    return Err(format!(
                        "its journal {held} holds batches up to number {prev}, but the next batch found is number \
                         {number} (in {name}): the batches between were lost from the journal"
                    ));
                }
            }
            last = Some((number, name.clone()));
        }
        if Some(*n) == newest {
            newest_scan = Some((path.as_path(), s));
        }
    }
    if let (Some(durable), Some((number, held))) = (durable, &last) {
        if *number < durable {
            return Err(format!(
                "its journals end at batch number {number} (in {held}), but batches up to number {durable} had \
                 been made durable and acknowledged: the rest were lost from the journal"
            ));
        }
    }
    // No journal holds a number before the engine would cut the newest one (its first
    // batches damaged, say): the batches after the cut, which the engine would drop, must
    // not hold an acknowledged number.
    if let (Some(durable), None, Some((path, s))) = (durable, &last, &newest_scan) {
        if let Some((at, number)) = numbered_after_cut(path, s)? {
            let cut = s.end;
            if number <= durable {
                let name = path.file_name().unwrap_or_default().to_string_lossy();
                return Err(format!(
                    "its journal {name} is damaged at byte {cut}: the engine would cut it there and drop the batch \
                     at byte {at}, number {number}, and every batch after it, though batches up to number {durable} \
                     had been made durable and acknowledged"
                ));
            }
        }
    }
    Ok(last.map(|(n, _)| n))
}

/// What [`parse_batch`] found at the start of a slice.
#[derive(Debug, PartialEq, Eq)]
enum Parsed {
    /// A whole batch of `len` bytes, with the store's number if it holds one.
    Whole { len: usize, number: Option<u64> },
    /// Not a batch in the engine's framing.
    Invalid,
    /// A batch so far, cut short by the slice's end.
    Short,
}

/// Parse one batch at the start of `b` with the engine's framing (module docs), as
/// [`scan`] reads them; `file_left` is the bytes of the file from `b`'s start on, which
/// bounds the lengths a batch may claim.
fn parse_batch(b: &[u8], file_left: u64) -> Parsed {
    fn get<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
        b.get(at..at + N).and_then(|s| s.try_into().ok())
    }
    if b.first() != Some(&1) {
        return Parsed::Invalid;
    }
    let Some(count) = get::<4>(b, 1) else { return Parsed::Short };
    let count = u32::from_le_bytes(count);
    let mut at = 13usize;
    let mut number = None;
    for _ in 0..count {
        match b.get(at) {
            None => return Parsed::Short,
            Some(2) => {
                let Some(h) = get::<20>(b, at + 1) else { return Parsed::Short };
                if !matches!(h[0], 0 | 1 | 2 | 4) || h[1] > 1 {
                    return Parsed::Invalid;
                }
                let key_len = usize::from(u16::from_le_bytes([h[10], h[11]]));
                let stored = u64::from(u32::from_le_bytes([h[16], h[17], h[18], h[19]]));
                let body = at as u64 + 21 + key_len as u64;
                if body + stored > file_left {
                    return Parsed::Invalid;
                }
                let (body, stored) = (body as usize, stored as usize);
                if b.len() < body + stored {
                    return Parsed::Short;
                }
                if &b[at + 21..body] == crate::BATCH_KEY && h[1] == 0 && stored == 8 {
                    number = get::<8>(b, body).map(u64::from_le_bytes);
                }
                at = body + stored;
            }
            Some(4) => {
                if b.len() < at + 9 {
                    return Parsed::Short;
                }
                at += 9;
            }
            Some(_) => return Parsed::Invalid,
        }
    }
    match b.get(at) {
        None => Parsed::Short,
        Some(3) => match get::<4>(b, at + 9) {
            None => Parsed::Short,
            Some(magic) if magic == *b"FJL\x03" => Parsed::Whole { len: at + 13, number },
            Some(_) => Parsed::Invalid,
        },
        Some(_) => Parsed::Invalid,
    }
}

/// The first whole batch holding the store's number that the engine's recovery would
/// drop from the journal at `path`, which [`scan`] read as `s` (past its last whole
/// batch, something other than zeros follows: a batch cut short, or damage): the batch's
/// first byte and its number. Found by trying every byte past the cut as a
/// batch's start (a batch's framing and its `FJL` 3 end leave no doubt), reading the
/// file a window at a time (the window holds one batch at most, plus what was read
/// ahead).
fn numbered_after_cut(path: &Path, s: &Scan) -> Result<Option<(u64, u64)>, String> {
    let err = |e: std::io::Error| format!("{}: {e}", path.display());
    let Some(from) = s.nonzero_after else { return Ok(None) };
    let mut f = File::open(path).map_err(err)?;
    let len = f.metadata().map_err(err)?.len();
    f.seek(SeekFrom::Start(from)).map_err(err)?;
    let mut f = f.take(len - from);
    // The bytes from `base` on, read so far; `eof`: the file has no more.
    let mut window: Vec<u8> = Vec::new();
    let mut base = from;
    let mut eof = false;
    let mut pos = 0usize;
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        // Drop what lies behind: no batch starts there.
        if pos > 1 << 20 {
            window.drain(..pos);
            base += pos as u64;
            pos = 0;
        }
        let next = window[pos.min(window.len())..].iter().position(|&b| b == 1).map(|i| pos + i);
        let Some(at) = next else {
            if eof {
                return Ok(None);
            }
            pos = window.len();
            let n = f.read(&mut chunk).map_err(err)?;
            if n == 0 {
                eof = true;
            } else if chunk[..n].iter().all(|&b| b == 0) && pos == window.len() {
                // Zeros hold no batch start: skip them without keeping them.
                window.clear();
                base += (pos + n) as u64;
                pos = 0;
            } else {
                window.extend_from_slice(&chunk[..n]);
            }
            continue;
        };
        pos = at;
        match parse_batch(&window[at..], len - (base + at as u64)) {
            Parsed::Whole { number: Some(number), .. } => {
                return Ok(Some((base + at as u64, number)))
            }
            // A whole batch without a number: past it.
            Parsed::Whole { len, number: None } => pos = at + len,
            Parsed::Invalid => pos = at + 1,
            Parsed::Short if eof => pos = at + 1,
            Parsed::Short => {
                let n = f.read(&mut chunk).map_err(err)?;
                if n == 0 {
                    eof = true;
                }
                window.extend_from_slice(&chunk[..n]);
            }
        }
    }
}

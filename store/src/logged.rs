//! A table keyed by random 16-byte ids (job ids), written through a log and kept in
//! sorted runs of compressed blocks.
//!
//! redb is a copy-on-write B-tree: the first insert of a transaction into a leaf copies
//! that 4 KiB leaf, and a full leaf is split in two halves (only keys beyond every key of
//! the table leave it packed). Job ids are hashes, so inserts by id would copy a leaf
//! each (at a million records, 10 µs per insert against 1 µs in order) and leave leaves
//! about two thirds full. A [`Logged`] table therefore writes only in key order at the
//! end of its tables:
//!
//! - **The log.** An insert appends to a table keyed by sequence number (its last leaf
//!   fills in place) and enters an index of the log kept in memory (id → sequence
//!   number, about 40 bytes per record).
//! - **Runs.** Once the log holds [`MIN_MERGE`] records or [`FLUSH_BYTES`] of them, it is
//!   **flushed** in one commit into a new run: its records in id order, in blocks of
//!   about [`BLOCK_BYTES`] compressed together ([`halyard_proto::stored::pack`], zstd
//!   with the stores' dictionary), in a table keyed by run number and the block's last
//!   id. Runs are numbered up, so a new run's blocks go at the end of the table, in
//!   packed leaves. A record in a block is kept in its plain form (its own compression
//!   undone, [`halyard_proto::stored::plain`]): short answers shrink about 3 times
//!   together against 2.2 one by one, and a block costs one B-tree entry, not one per
//!   record.
//! - **Merges.** Once the newest runs hold [`FANOUT`] runs of one size class or smaller,
//!   they are merged into one new run (the newest record of each id kept), one part of
//!   the key space per commit for large runs, so no commit rewrites everything and the
//!   file needs room for a part more, not all of it. A record is rewritten about once
//!   per size class it climbs (log base [`FANOUT`] of its run sizes).
//!   No flush starts while a merge goes on, so the merge's blocks stay at the end, and
//!   a due merge starts before a flush, so runs cannot pile up.
//!
//! A flush or a merge part runs in a commit of its own after the write that made it due:
//! if it fails (a damaged block), the write stands, its records stay in the log, and the
//! next write tries again.
//!
//! Reads see exactly what a plain table would: the newest record of an id is in the log
//! while the index names it, otherwise in the newest run that holds it. The runs a
//! reader searches are read from its own snapshot (a directory in the blocks table), and
//! it opens that snapshot while it holds the index; the index takes a commit only after
//! it is made (writers take turns, and a writer's turn ends once the index has its
//! commit), so a record the index places in the log is either there or, if a flush moved
//! it since, in the snapshot's runs. Every change is one of redb's atomic commits and
//! opening rebuilds the index from the log, so a crash at any point loses nothing: a
//! merge cut short leaves its input runs with the parts not merged yet and its new run
//! with the rest, newer than its inputs, and reads stay exact.
//!
//! Stores of earlier builds kept merged records one per id in a table of their own (the
//! **older** table): opening moves them, with the log, into a run, once, in one commit.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

use halyard_proto::stored::{pack, plain, unpack};
use redb::{
    Database, Durability, ReadTransaction, ReadableDatabase, ReadableTable, ReadableTableMetadata,
    TableDefinition, TableHandle, WriteTransaction,
};

use crate::Table;

/// The ids of a [`Logged`] table.
pub type Key = [u8; 16];
/// A log table: sequence number → id followed by the record.
pub type LogTable = TableDefinition<'static, u64, &'static [u8]>;

/// The tables of one [`Logged`] table.
#[derive(Clone, Copy)]
pub struct Tables {
    /// Runs of blocks (run number and last id of a block → block) and their directory.
    pub blocks: Table,
    /// The log: sequence number → id and record.
    pub log: LogTable,
    /// Records one per id, as earlier builds kept them (moved into a run at open).
    pub older: Table,
}

/// The log is flushed into a run once it holds this many records...
pub const MIN_MERGE: u64 = 65_536;
/// An environment variable that sets [`MIN_MERGE`] for the process (read at each open):
/// crash tests flush and merge every few hundred records with it.
pub const MERGE_AT_ENV: &str = "HALYARD_STORE_MERGE_AT";
/// ... or this many bytes of records (answers: some thousands), so that a short run's
/// records are compressed in blocks too.
pub const FLUSH_BYTES: u64 = 1 << 20;
/// Runs of one size class (a factor of this many in bytes) merged together.
pub const FANOUT: usize = 4;
/// Runs below [`FANOUT`] times this many stored bytes are of the first size class (about
/// four flushes' worth).
const CLASS_BYTES: u64 = 256 << 10;
/// Packed blocks aim at this many bytes, so that two fill a 4 KiB page of redb's: a block
/// is cut once its records (ids, lengths and records, before packing) reach the size
/// that packed to this in the block before (the first block of a run: [`BLOCK_BYTES`]).
/// Larger blocks compress a little better (short answers: 76 bytes each in blocks of 16,
/// 71 in blocks of 64) and cost more to read one record from.
const PACKED_BYTES: usize = 1_900;
/// A block packs to at most this many bytes (or holds one record): with its count, key
/// and redb's offsets, two such blocks fit a 4 KiB leaf.
const MAX_PACKED: usize = 2_010;
/// The first block's records, before packing.
pub const BLOCK_BYTES: usize = 4096;
/// A merge whose runs hold fewer stored bytes than this goes in one commit; up to
/// [`MANY_PARTS_FROM`], in 16 parts of the key space; above, in 256.
const ONE_PART_BELOW: u64 = 1 << 20;
const MANY_PARTS_FROM: u64 = 128 << 20;
/// The directory's keys in the blocks table: this prefix, then the run number.
const DIRECTORY: [u8; 4] = [0; 4];

/// A table of records keyed by 16-byte random ids, written through a log (module docs).
pub struct Logged {
    tables: Tables,
    index: Mutex<Index>,
    /// Records of the log that flush it ([`MIN_MERGE`]).
    min_merge: u64,
    /// Merges of runs holding fewer stored bytes go in one commit ([`ONE_PART_BELOW`];
    /// tests lower it to merge in parts), and in 256 parts from [`MANY_PARTS_FROM`].
    one_part_below: u64,
    many_parts_from: u64,
    /// Held by a writer from its transaction's start until the index has taken its
    /// commit, so that the next writer numbers its records after the last writer's.
    turn: Mutex<()>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Run {
    id: u32,
    records: u64,
    bytes: u64,
}

struct Index {
    /// The log's records: id → sequence number of its newest record.
    seqs: BTreeMap<Key, u64>,
    /// The sequence number of the next record.
    next: u64,
    /// Records in the log (replaced ones included) and their bytes.
    log_records: u64,
    log_bytes: u64,
    /// The runs, oldest first.
    runs: Vec<Run>,
    merge: Option<RunMerge>,
    /// The last flush or merge failed (warned once).
    failing: bool,
}

/// A merge in progress: runs `inputs` into run `output`, part `part` of `parts` next.
#[derive(Clone, Debug)]
struct RunMerge {
    inputs: Vec<u32>,
    output: u32,
    part: u16,
    parts: u16,
    written: u64,
    bytes: u64,
}

/// What a write transaction did, applied to the index once it is committed.
struct Done {
    appended: Vec<(Key, u64)>,
    next: u64,
    log_records: u64,
    log_bytes: u64,
    /// The log was flushed and emptied.
    emptied: bool,
    runs: Vec<Run>,
    merge: Option<RunMerge>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn corrupt(what: String) -> redb::Error {
    redb::Error::Corrupted(what)
}

fn hex(key: &[u8]) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

/// The id of a log record and its record, or an error naming the record.
fn split_log_record(seq: u64, bytes: &[u8]) -> Result<(Key, &[u8]), redb::Error> {
    match bytes.split_first_chunk::<16>() {
        Some((key, rest)) => Ok((*key, rest)),
        None => {
            Err(corrupt(format!("log record {seq} is {} bytes, shorter than an id", bytes.len())))
        }
    }
}

/// The sequence number after `seq`: an error, not a wrap onto record 0, at the end.
fn next_seq(seq: u64) -> Result<u64, redb::Error> {
    seq.checked_add(1)
        .ok_or_else(|| corrupt(format!("log record {seq} has the last sequence number")))
}

/// The ids in `log`, each with its newest record's sequence number, in id order, and the
/// bytes of the log's records.
fn newest_ids(
    log: &impl ReadableTable<u64, &'static [u8]>,
) -> Result<(BTreeMap<Key, u64>, u64), redb::Error> {
    let mut ids = BTreeMap::new();
    let mut bytes = 0;
    for kv in log.range::<u64>(..)? {
        let (seq, record) = kv?;
        let (key, _) = split_log_record(seq.value(), record.value())?;
        ids.insert(key, seq.value());
        bytes += record.value().len() as u64;
    }
    Ok((ids, bytes))
}

/// The record (without its id) of log record `seq`, which must be there.
fn log_record(
    log: &impl ReadableTable<u64, &'static [u8]>,
    seq: u64,
) -> Result<Vec<u8>, redb::Error> {
    let Some(bytes) = log.get(seq)? else {
        return Err(corrupt(format!("log record {seq} is missing")));
    };
    let (_, record) = split_log_record(seq, bytes.value())?;
    Ok(record.to_vec())
}

/// The key of the block of run `run` whose last id is `last`.
fn block_key(run: u32, last: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(20);
    k.extend_from_slice(&run.to_be_bytes());
    k.extend_from_slice(last);
    k
}

/// The keys of run `run`'s blocks whose last ids lie in `lo..hi` (`hi` none: to the end).
fn run_range(run: u32, lo: &[u8], hi: Option<&[u8]>) -> (Vec<u8>, Vec<u8>) {
    let end = match hi {
        Some(hi) => block_key(run, hi),
        None => block_key(run + 1, &[]),
    };
    (block_key(run, lo), end)
}

/// The directory's key of run `run`.
fn run_entry_key(run: u32) -> [u8; 8] {
    let mut k = [0; 8];
    k[4..].copy_from_slice(&run.to_be_bytes());
    k
}

/// The runs of the directory in `blocks`, oldest first.
fn read_runs(
    blocks: &impl ReadableTable<&'static [u8], &'static [u8]>,
) -> Result<Vec<Run>, redb::Error> {
    let mut runs = Vec::new();
    for kv in blocks.range::<&[u8]>(&DIRECTORY[..]..&[0, 0, 0, 1][..])? {
        let (k, v) = kv?;
        let (k, v) = (k.value(), v.value());
        let id = <[u8; 8]>::try_from(k).ok().map(|k| u32::from_be_bytes([k[4], k[5], k[6], k[7]]));
        let counts = v.split_first_chunk::<8>().and_then(|(r, rest)| {
            let (b, _) = rest.split_first_chunk::<8>()?;
            Some((u64::from_le_bytes(*r), u64::from_le_bytes(*b)))
        });
        match (id, counts) {
            (Some(id), Some((records, bytes))) if id > 0 && id < u32::MAX => {
                runs.push(Run { id, records, bytes })
            }
            _ => {
                return Err(corrupt(format!(
                    "the directory of runs has an entry {} → {} that is not a run",
                    hex(k),
                    hex(v)
                )))
            }
        }
    }
    Ok(runs)
}

fn write_run_entry(
    blocks: &mut redb::Table<'_, &'static [u8], &'static [u8]>,
    run: &Run,
) -> Result<(), redb::Error> {
    let mut v = [0; 16];
    v[..8].copy_from_slice(&run.records.to_le_bytes());
    v[8..].copy_from_slice(&run.bytes.to_le_bytes());
    blocks.insert(&run_entry_key(run.id)[..], &v[..])?;
    Ok(())
}

/// The first id of part `part` of `parts` (1, 16 or 256) of the key space, and the first
/// of the next (none for the last part).
fn part_bounds(part: u16, parts: u16) -> (Key, Option<Key>) {
    let width = 256 / parts.max(1);
    let first = |p: u16| {
        let mut k = [0u8; 16];
        k[0] = (p * width) as u8;
        k
    };
    (first(part), (part + 1 < parts).then(|| first(part + 1)))
}

/// The size class of a run of `bytes` stored bytes: 0 below [`FANOUT`] × [`CLASS_BYTES`],
/// then one more for each factor of [`FANOUT`].
fn size_class(bytes: u64) -> u32 {
    let mut class = 0;
    let mut cap = CLASS_BYTES * FANOUT as u64;
    while bytes >= cap && cap < u64::MAX {
        class += 1;
        cap = cap.saturating_mul(FANOUT as u64);
    }
    class
}

/// The runs to merge, if due: the newest runs of the newest run's size class or smaller,
/// once there are [`FANOUT`] of them (older runs of a smaller class are taken along, so
/// none is left behind).
fn due_merge(runs: &[Run]) -> Option<Vec<Run>> {
    let class = size_class(runs.last()?.bytes);
    let from = runs.iter().rposition(|r| size_class(r.bytes) > class).map_or(0, |i| i + 1);
    (runs.len() - from >= FANOUT).then(|| runs[from..].to_vec())
}

/// A block's value: the number of its records (4 bytes, little-endian), then its records
/// packed ([`pack`]); each record is its id, its length (LEB128) and its bytes, in id
/// order.
struct BlockBuilder {
    raw: Vec<u8>,
    /// Where each record starts in `raw`.
    starts: Vec<usize>,
    /// Where a block is cut ([`PACKED_BYTES`]).
    cut_at: usize,
}

impl BlockBuilder {
    fn new() -> Self {
        BlockBuilder {
            raw: Vec::with_capacity(BLOCK_BYTES + 512),
            starts: Vec::new(),
            cut_at: BLOCK_BYTES,
        }
    }

    /// Whether the next record starts a new block.
    fn is_full(&self) -> bool {
        self.raw.len() >= self.cut_at
    }

    fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    fn push(&mut self, key: &Key, record: &[u8]) {
        self.starts.push(self.raw.len());
        self.raw.extend_from_slice(key);
        let mut n = record.len();
        while n >= 0x80 {
            self.raw.push((n as u8) | 0x80);
            n >>= 7;
        }
        self.raw.push(n as u8);
        self.raw.extend_from_slice(record);
    }

    /// The id of record `i`.
    fn id(&self, i: usize) -> Key {
        let mut k = [0; 16];
        k.copy_from_slice(&self.raw[self.starts[i]..self.starts[i] + 16]);
        k
    }

    /// A block of the first records, as many as pack to at most [`MAX_PACKED`] bytes (at
    /// least one), as its last id and value; the records after it stay for the next.
    fn take(&mut self) -> Option<(Key, Vec<u8>)> {
        let mut n = self.starts.len();
        if n == 0 {
            return None;
        }
        let mut end = self.raw.len();
        let mut packed = pack(&self.raw);
        while packed.len() > MAX_PACKED && n > 1 {
            // Fewer records, in proportion, and a little less.
            let keep = (n * MAX_PACKED * 15 / (packed.len() * 16)).clamp(1, n - 1);
            n = keep;
            end = self.starts[n];
            packed = pack(&self.raw[..end]);
        }
        // The size that packs to PACKED_BYTES if the next block's records pack alike.
        self.cut_at = (end * PACKED_BYTES / packed.len().max(1)).clamp(1 << 10, 1 << 14);
        let last = self.id(n - 1);
        let mut value = Vec::with_capacity(4 + packed.len());
        value.extend_from_slice(&(n as u32).to_le_bytes());
        value.extend_from_slice(&packed);
        self.raw.drain(..end);
        self.starts.drain(..n);
        for s in &mut self.starts {
            *s -= end;
        }
        Some((last, value))
    }
}

/// Writes a run's blocks in id order.
struct RunWriter {
    run: u32,
    block: BlockBuilder,
    records: u64,
    bytes: u64,
}

impl RunWriter {
    fn new(run: u32) -> Self {
        RunWriter { run, block: BlockBuilder::new(), records: 0, bytes: 0 }
    }

    fn push(
        &mut self,
        blocks: &mut redb::Table<'_, &'static [u8], &'static [u8]>,
        key: &Key,
        record: &[u8],
    ) -> Result<(), redb::Error> {
        if self.block.is_full() {
            self.write_block(blocks)?;
        }
        self.block.push(key, record);
        self.records += 1;
        Ok(())
    }

    /// Write a block of the records being built, if any.
    fn write_block(
        &mut self,
        blocks: &mut redb::Table<'_, &'static [u8], &'static [u8]>,
    ) -> Result<(), redb::Error> {
        if let Some((last, value)) = self.block.take() {
            self.bytes += value.len() as u64;
            blocks.insert(&block_key(self.run, &last)[..], &value[..])?;
        }
        Ok(())
    }

    /// Write the records still being built.
    fn finish(
        &mut self,
        blocks: &mut redb::Table<'_, &'static [u8], &'static [u8]>,
    ) -> Result<(), redb::Error> {
        while !self.block.is_empty() {
            self.write_block(blocks)?;
        }
        Ok(())
    }
}

/// Records of a block: ids and records, in id order.
type Records = Vec<(Key, Vec<u8>)>;

/// Write `records` (in id order) as blocks of run `run`; returns the records and bytes
/// written.
fn write_run<'r>(
    blocks: &mut redb::Table<'_, &'static [u8], &'static [u8]>,
    run: u32,
    records: impl IntoIterator<Item = (&'r Key, &'r Vec<u8>)>,
) -> Result<(u64, u64), redb::Error> {
    let mut w = RunWriter::new(run);
    for (k, r) in records {
        w.push(blocks, k, r)?;
    }
    w.finish(blocks)?;
    Ok((w.records, w.bytes))
}

/// The first block of run `run` whose last id is `from` or after: its key and records.
fn block_at(
    blocks: &impl ReadableTable<&'static [u8], &'static [u8]>,
    run: u32,
    from: &[u8],
) -> Result<Option<(Vec<u8>, Records)>, redb::Error> {
    let (lo, hi) = run_range(run, from, None);
    match blocks.range::<&[u8]>(&lo[..]..&hi[..])?.next() {
        None => Ok(None),
        Some(kv) => {
            let (k, v) = kv?;
            Ok(Some((k.value().to_vec(), block_records(k.value(), v.value())?)))
        }
    }
}

fn block_err(key: &[u8], what: String) -> redb::Error {
    corrupt(format!("the block of records {} {what}", hex(key)))
}

/// The number of records a block's value says it holds.
fn block_count(key: &[u8], value: &[u8]) -> Result<u32, redb::Error> {
    match value.split_first_chunk::<4>() {
        Some((n, _)) => Ok(u32::from_le_bytes(*n)),
        None => Err(block_err(key, format!("is {} bytes, shorter than its header", value.len()))),
    }
}

/// The records of the block keyed `key` (run number and last id), in id order, checked:
/// as many as its header says, each id after the one before, the last one in its key.
fn block_records(key: &[u8], value: &[u8]) -> Result<Vec<(Key, Vec<u8>)>, redb::Error> {
    let count = block_count(key, value)?;
    // At most one record per 17 bytes (id and length): a damaged count asks for no more.
    let mut out: Vec<(Key, Vec<u8>)> = Vec::with_capacity((count as usize).min(value.len() / 17));
    read_block(key, value, |id, record| {
        out.push((id, record.to_vec()));
        true
    })?;
    if out.len() != count as usize {
        return Err(block_err(
            key,
            format!("holds {} records, its header says {count}", out.len()),
        ));
    }
    Ok(out)
}

/// The record of `id` in the block keyed `key`, read up to it.
fn block_find(key: &[u8], value: &[u8], id: &Key) -> Result<Option<Vec<u8>>, redb::Error> {
    let mut found = None;
    read_block(key, value, |k, record| {
        if k == *id {
            found = Some(record.to_vec());
        }
        k < *id
    })?;
    Ok(found)
}

/// Pass each record of the block keyed `key` to `each`, in id order, until it returns
/// false; an error names the block if it cannot be read, its ids are out of order, or,
/// read to its end, its last id is not the one in its key.
fn read_block(
    key: &[u8],
    value: &[u8],
    mut each: impl FnMut(Key, &[u8]) -> bool,
) -> Result<(), redb::Error> {
    block_count(key, value)?;
    let raw: Cow<'_, [u8]> =
        unpack(&value[4..]).map_err(|e| block_err(key, format!("cannot be unpacked: {e}")))?;
    let mut rest = &raw[..];
    let mut last: Option<Key> = None;
    while !rest.is_empty() {
        let Some((id, after)) = rest.split_first_chunk::<16>() else {
            return Err(block_err(key, "ends inside an id".into()));
        };
        let (mut len, mut shift, mut at) = (0usize, 0u32, 0usize);
        loop {
            let Some(&b) = after.get(at) else {
                return Err(block_err(key, "ends inside a length".into()));
            };
            if shift > 28 {
                return Err(block_err(key, "has a record length over 4 GiB".into()));
            }
            len |= ((b & 0x7f) as usize) << shift;
            shift += 7;
            at += 1;
            if b < 0x80 {
                break;
            }
        }
        let Some(record) = after.get(at..at + len) else {
            return Err(block_err(key, format!("ends inside the record of id {}", hex(id))));
        };
        if last.is_some_and(|l| l >= *id) {
            return Err(block_err(key, format!("has id {} out of order", hex(id))));
        }
        last = Some(*id);
        if !each(*id, record) {
            return Ok(());
        }
        rest = &after[at + len..];
    }
    if last.as_ref().map(|k| &k[..]) != key.get(4..) {
        return Err(block_err(key, "does not end with the id in its key".into()));
    }
    Ok(())
}

/// The record of `key` in run `run` (in its block with the least last id not below it).
fn find_in_run(
    blocks: &impl ReadableTable<&'static [u8], &'static [u8]>,
    run: u32,
    key: &Key,
) -> Result<Option<Vec<u8>>, redb::Error> {
    let (lo, hi) = run_range(run, key, None);
    let Some(kv) = blocks.range::<&[u8]>(&lo[..]..&hi[..])?.next() else {
        return Ok(None);
    };
    let (k, value) = kv?;
    block_find(k.value(), value.value(), key)
}

/// The newest record of `key` in the runs of `blocks`.
fn find_in_runs(
    blocks: &impl ReadableTable<&'static [u8], &'static [u8]>,
    key: &Key,
) -> Result<Option<Vec<u8>>, redb::Error> {
    for run in read_runs(blocks)?.iter().rev() {
        if let Some(r) = find_in_run(blocks, run.id, key)? {
            return Ok(Some(r));
        }
    }
    Ok(None)
}

impl Logged {
    /// The logged table of `tables` in `db` (created if missing), its index read from the
    /// log an earlier process left; records of the older table are moved into a run.
    pub fn open(db: &Database, tables: Tables) -> Result<Logged, redb::Error> {
        let at = std::env::var(MERGE_AT_ENV).ok().and_then(|v| v.trim().parse().ok());
        Self::open_merging_at(db, tables, at.unwrap_or(MIN_MERGE))
    }

    /// [`Logged::open`] with flushes from `min_merge` records of log.
    fn open_merging_at(
        db: &Database,
        tables: Tables,
        min_merge: u64,
    ) -> Result<Logged, redb::Error> {
        let (exists, older) = {
            let tx = db.begin_read()?;
            let found = |e: Result<_, redb::TableError>| match e {
                Ok(_) => Ok(true),
                Err(redb::TableError::TableDoesNotExist(_)) => Ok(false),
                Err(e) => Err(e),
            };
            let exists = found(tx.open_table(tables.blocks).map(drop))?
                && found(tx.open_table(tables.log).map(drop))?;
            let older = match tx.open_table(tables.older) {
                Ok(t) => t.len()?,
                Err(redb::TableError::TableDoesNotExist(_)) => 0,
                Err(e) => return Err(e.into()),
            };
            (exists, older)
        };
        if !exists {
            let tx = db.begin_write()?;
            tx.open_table(tables.blocks)?;
            tx.open_table(tables.log)?;
            tx.commit()?;
        }
        let tx = db.begin_read()?;
        let log = tx.open_table(tables.log)?;
        let (seqs, log_bytes) = newest_ids(&log)?;
        let log_records = log.len()?;
        let next = match log.last()? {
            Some((seq, _)) => next_seq(seq.value())?,
            None => 0,
        };
        let runs = read_runs(&tx.open_table(tables.blocks)?)?;
        drop(log);
        drop(tx);
        if !seqs.is_empty() {
            tracing::debug!(
                table = tables.blocks.name(),
                records = seqs.len(),
                "read the log an earlier process left"
            );
        }
        let logged = Logged {
            tables,
            index: Mutex::new(Index {
                seqs,
                next,
                log_records,
                log_bytes,
                runs,
                merge: None,
                failing: false,
            }),
            min_merge: min_merge.max(1),
            one_part_below: ONE_PART_BELOW,
            many_parts_from: MANY_PARTS_FROM,
            turn: Mutex::new(()),
        };
        if older > 0 {
            logged.write(db, Durability::Immediate, |_, w| w.flush(true))?;
            tracing::info!(
                table = tables.older.name(),
                records = older,
                "moved the records an earlier build kept one by one into a run"
            );
        }
        Ok(logged)
    }

    /// The newest record of `key`, passed to `read` (which decodes it).
    pub fn get<T>(
        &self,
        db: &Database,
        key: &Key,
        read: impl FnOnce(&[u8]) -> T,
    ) -> Result<Option<T>, redb::Error> {
        let (seq, tx) = self.lookup(db, key)?;
        self.get_in(&tx, seq, key, read)
    }

    /// Where the index puts `key`, and a snapshot opened while holding the index (module
    /// docs).
    fn lookup(
        &self,
        db: &Database,
        key: &Key,
    ) -> Result<(Option<u64>, ReadTransaction), redb::Error> {
        let index = lock(&self.index);
        let seq = index.seqs.get(key).copied();
        let tx = db.begin_read()?;
        drop(index);
        Ok((seq, tx))
    }

    fn get_in<T>(
        &self,
        tx: &ReadTransaction,
        seq: Option<u64>,
        key: &Key,
        read: impl FnOnce(&[u8]) -> T,
    ) -> Result<Option<T>, redb::Error> {
        if let Some(seq) = seq {
            // Gone from the log only if a flush moved it to a run since.
            if let Some(bytes) = tx.open_table(self.tables.log)?.get(seq)? {
                let (logged, record) = split_log_record(seq, bytes.value())?;
                if &logged != key {
                    return Err(corrupt(format!(
                        "log record {seq} holds another id than its index"
                    )));
                }
                return Ok(Some(read(record)));
            }
        }
        let found = find_in_runs(&tx.open_table(self.tables.blocks)?, key)?;
        Ok(found.map(|v| read(&v)))
    }

    /// Whether `key` has a record.
    pub fn contains(&self, db: &Database, key: &Key) -> Result<bool, redb::Error> {
        Ok(self.get(db, key, |_| ())?.is_some())
    }

    /// Records (ids with a record), counted in one snapshot (every block is read).
    pub fn len(&self, db: &Database) -> Result<u64, redb::Error> {
        self.for_each_id(db, |_| true)
    }

    /// Call `each` with every id that has a record, in id order, in one snapshot, until it
    /// returns false. Returns the ids passed.
    pub fn for_each_id(
        &self,
        db: &Database,
        mut each: impl FnMut(&[u8]) -> bool,
    ) -> Result<u64, redb::Error> {
        let mut n = 0;
        for kv in self.entries(db)? {
            let (key, _) = kv?;
            n += 1;
            if !each(&key) {
                break;
            }
        }
        Ok(n)
    }

    /// Every id with its newest record, in id order, in one snapshot.
    pub fn entries(&self, db: &Database) -> Result<Entries, redb::Error> {
        let tx = db.begin_read()?;
        let log = tx.open_table(self.tables.log)?;
        let log_ids = newest_ids(&log)?.0.into_iter().peekable();
        let blocks = tx.open_table(self.tables.blocks)?;
        let mut cursors = Vec::new();
        // Newest first: the first cursor holding an id has its newest record.
        for run in read_runs(&blocks)?.iter().rev() {
            let (lo, hi) = run_range(run.id, &[], None);
            let range = blocks.range::<&[u8]>(&lo[..]..&hi[..])?;
            cursors.push(Cursor { range, block: Vec::new().into_iter().peekable() });
        }
        Ok(Entries { cursors, log, log_ids })
    }

    /// Run `update` in one write transaction of `durability` and commit it; `update` gets
    /// the transaction (for other tables) and the writer of this table. A flush of the
    /// log or part of a merge that is due follows in a transaction of its own: if it
    /// fails (a damaged block), the update is kept, the records stay in the log, and the
    /// next write tries again (a warning says so once).
    pub fn write<T, E: From<redb::Error>>(
        &self,
        db: &Database,
        durability: Durability,
        update: impl FnOnce(&WriteTransaction, &mut LoggedWrite<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        let _turn = lock(&self.turn);
        let out = self.transact(db, durability, false, update)?;
        if self.maintenance_due() {
            let done = self.transact(db, durability, true, |_, _| Ok::<_, redb::Error>(()));
            let mut index = lock(&self.index);
            match done {
                Ok(()) if index.failing => {
                    index.failing = false;
                    tracing::info!(
                        table = self.tables.blocks.name(),
                        "the log is flushed and merged again"
                    );
                }
                Ok(()) => {}
                Err(e) if !index.failing => {
                    index.failing = true;
                    tracing::warn!(
                        table = self.tables.blocks.name(),
                        error = %e,
                        "cannot flush the log or merge runs; records stay in the log, retried at each write"
                    );
                }
                Err(_) => {}
            }
        }
        Ok(out)
    }

    /// Whether a flush of the log or a part of a merge is due.
    fn maintenance_due(&self) -> bool {
        let index = lock(&self.index);
        index.merge.is_some()
            || self.log_due(index.log_records, index.log_bytes)
            || due_merge(&index.runs).is_some()
    }

    /// Whether a log of `records` records and `bytes` bytes is due for a flush.
    fn log_due(&self, records: u64, bytes: u64) -> bool {
        records > 0 && (records >= self.min_merge || bytes >= FLUSH_BYTES)
    }

    /// One write transaction: `update`, then (if `maintain`) a flush or a merge part that
    /// is due; the index takes the commit once it is made.
    fn transact<T, E: From<redb::Error>>(
        &self,
        db: &Database,
        durability: Durability,
        maintain: bool,
        update: impl FnOnce(&WriteTransaction, &mut LoggedWrite<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut tx = db.begin_write().map_err(redb::Error::from)?;
        tx.set_durability(durability).map_err(redb::Error::from)?;
        let (out, done) = {
            let (next, log_records, log_bytes, runs, merge) = {
                let index = lock(&self.index);
                let i = &*index;
                (i.next, i.log_records, i.log_bytes, i.runs.clone(), i.merge.clone())
            };
            let mut w = LoggedWrite {
                logged: self,
                blocks: tx.open_table(self.tables.blocks).map_err(redb::Error::from)?,
                log: tx.open_table(self.tables.log).map_err(redb::Error::from)?,
                older: tx.open_table(self.tables.older).map_err(redb::Error::from)?,
                staged: HashMap::new(),
                next,
                log_records,
                log_bytes,
                runs,
                merge,
                emptied: false,
            };
            let out = update(&tx, &mut w)?;
            (out, w.finish(maintain)?)
        };
        tx.commit().map_err(redb::Error::from)?;
        let mut index = lock(&self.index);
        if done.emptied {
            index.seqs.clear();
        }
        index.seqs.extend(done.appended);
        index.next = done.next;
        index.log_records = done.log_records;
        index.log_bytes = done.log_bytes;
        index.runs = done.runs;
        index.merge = done.merge;
        Ok(out)
    }

    /// Records in the log not flushed yet.
    #[cfg(test)]
    fn unmerged(&self) -> usize {
        lock(&self.index).seqs.len()
    }

    /// The runs' record counts, oldest first.
    #[cfg(test)]
    fn runs(&self) -> Vec<u64> {
        lock(&self.index).runs.iter().map(|r| r.records).collect()
    }
}

/// The writer of a [`Logged`] table inside one write transaction.
pub struct LoggedWrite<'t> {
    logged: &'t Logged,
    blocks: redb::Table<'t, &'static [u8], &'static [u8]>,
    log: redb::Table<'t, u64, &'static [u8]>,
    older: redb::Table<'t, &'static [u8], &'static [u8]>,
    /// This transaction's records: id → sequence number.
    staged: HashMap<Key, u64>,
    next: u64,
    log_records: u64,
    log_bytes: u64,
    runs: Vec<Run>,
    merge: Option<RunMerge>,
    /// The log was flushed in this transaction: the index's records are gone from it.
    emptied: bool,
}

impl LoggedWrite<'_> {
    /// Whether `key` has a record (this transaction's included).
    pub fn contains(&self, key: &Key) -> Result<bool, redb::Error> {
        if self.staged.contains_key(key)
            || (!self.emptied && lock(&self.logged.index).seqs.contains_key(key))
        {
            return Ok(true);
        }
        Ok(find_in_runs(&self.blocks, key)?.is_some())
    }

    /// Store `record` for `key` (replacing any record it had).
    pub fn insert(&mut self, key: &Key, record: &[u8]) -> Result<(), redb::Error> {
        let mut bytes = Vec::with_capacity(16 + record.len());
        bytes.extend_from_slice(key);
        bytes.extend_from_slice(record);
        self.log.insert(self.next, &bytes[..])?;
        self.staged.insert(*key, self.next);
        self.next = next_seq(self.next)?;
        self.log_records += 1;
        self.log_bytes += bytes.len() as u64;
        Ok(())
    }

    /// Remove the record of `key`, returning it. Rare (`halyard retry-failed`): the log is
    /// flushed into a run first, in this transaction, and the id is taken out of every
    /// run that holds it (older records of it included).
    pub fn remove(&mut self, key: &Key) -> Result<Option<Vec<u8>>, redb::Error> {
        // Again after an earlier removal of this transaction if records were logged since.
        if !self.emptied || !self.staged.is_empty() {
            self.flush(false)?;
        }
        let mut removed = None;
        // Newest first: the newest run's record is the one returned. The directory's runs
        // include the output of a merge going on.
        let runs = read_runs(&self.blocks)?;
        for run in runs.iter().rev().map(|r| r.id) {
            let Some((block, mut records)) = block_at(&self.blocks, run, key)? else { continue };
            let Ok(at) = records.binary_search_by(|(k, _)| k.cmp(key)) else { continue };
            let (_, record) = records.remove(at);
            removed.get_or_insert(record);
            self.blocks.remove(&block[..])?;
            write_run(&mut self.blocks, run, records.iter().map(|(k, r)| (k, r)))?;
            if let Some(r) = self.runs.iter_mut().find(|r| r.id == run) {
                r.records = r.records.saturating_sub(1);
                write_run_entry(&mut self.blocks, r)?;
            }
            if let Some(m) = self.merge.as_mut().filter(|m| m.output == run) {
                m.written = m.written.saturating_sub(1);
            }
        }
        Ok(removed)
    }

    /// Flush the whole log (this transaction's records included) into a new run, with the
    /// older table's records if `older` (the log's the newer), and empty both.
    fn flush(&mut self, older: bool) -> Result<(), redb::Error> {
        let (ids, _) = newest_ids(&self.log)?;
        let id = self.new_run_id()?;
        let mut w = RunWriter::new(id);
        let mut log_ids = ids.into_iter().peekable();
        let mut older_range = if older { Some(self.older.range::<&[u8]>(..)?) } else { None };
        let mut older_next = || -> Result<Option<(Key, Vec<u8>)>, redb::Error> {
            let Some(range) = older_range.as_mut() else { return Ok(None) };
            match range.next() {
                None => Ok(None),
                Some(kv) => {
                    let (k, v) = kv?;
                    let key = <Key>::try_from(k.value()).map_err(|_| {
                        corrupt(format!(
                            "table {} has a record keyed {}, which is not a 16-byte id",
                            self.logged.tables.older.name(),
                            hex(k.value())
                        ))
                    })?;
                    Ok(Some((key, plain(v.value()).into_owned())))
                }
            }
        };
        let mut from_older = older_next()?;
        loop {
            let from_log = log_ids.peek().map(|(k, _)| *k);
            let key = match (&from_older, from_log) {
                (None, None) => break,
                (Some((o, _)), Some(l)) => (*o).min(l),
                (Some((o, _)), None) => *o,
                (None, Some(l)) => l,
            };
            let mut record = None;
            if from_older.as_ref().is_some_and(|(o, _)| *o == key) {
                record = from_older.take().map(|(_, r)| r);
                from_older = older_next()?;
            }
            if from_log == Some(key) {
                if let Some((_, seq)) = log_ids.next() {
                    record = Some(plain(&log_record(&self.log, seq)?).into_owned());
                }
            }
            if let Some(r) = record {
                w.push(&mut self.blocks, &key, &r)?;
            }
        }
        drop(older_range);
        w.finish(&mut self.blocks)?;
        if older {
            self.older.retain(|_, _| false)?;
        }
        self.log.retain(|_, _| false)?;
        self.staged.clear();
        self.log_records = 0;
        self.log_bytes = 0;
        self.emptied = true;
        if w.records > 0 {
            let run = Run { id, records: w.records, bytes: w.bytes };
            write_run_entry(&mut self.blocks, &run)?;
            self.runs.push(run);
        }
        Ok(())
    }

    /// A run number after every run's (none is reused).
    fn new_run_id(&self) -> Result<u32, redb::Error> {
        let last = self.runs.iter().map(|r| r.id).max().unwrap_or(0);
        let last = self.merge.as_ref().map_or(last, |m| last.max(m.output));
        match last.checked_add(1) {
            Some(id) if id < u32::MAX => Ok(id),
            _ => Err(corrupt(format!("the runs are numbered up to {last}, the last number"))),
        }
    }

    /// Merge part `m.part` of the key space of the runs `m.inputs` into run `m.output`:
    /// their records of the part are taken out (a block reaching into the next part keeps
    /// the rest, under its key) and the newest record of each id written to the output.
    fn merge_part(&mut self, m: &mut RunMerge) -> Result<(), redb::Error> {
        let (lo, hi) = part_bounds(m.part, m.parts);
        let mut records: BTreeMap<Key, Vec<u8>> = BTreeMap::new();
        // Oldest first: a newer run's record replaces an older one's.
        for &run in &m.inputs {
            let (a, b) = run_range(run, &lo, hi.as_ref().map(|h| &h[..]));
            let keys: Vec<Vec<u8>> = self
                .blocks
                .range::<&[u8]>(&a[..]..&b[..])?
                .map(|kv| Ok::<_, redb::Error>(kv?.0.value().to_vec()))
                .collect::<Result<_, _>>()?;
            let mut taken = Vec::new();
            for k in keys {
                if let Some(v) = self.blocks.remove(&k[..])? {
                    taken.extend(block_records(&k, v.value())?);
                }
            }
            // The block holding the part's last ids may go on past it.
            if let Some(hi) = hi {
                if let Some((k, block)) = block_at(&self.blocks, run, &hi)? {
                    if block.first().is_some_and(|(id, _)| *id < hi) {
                        self.blocks.remove(&k[..])?;
                        let (inside, rest): (Vec<_>, Vec<_>) =
                            block.into_iter().partition(|(id, _)| *id < hi);
                        taken.extend(inside);
                        // The rest keeps its last id, hence its key.
                        write_run(&mut self.blocks, run, rest.iter().map(|(k, r)| (k, r)))?;
                    }
                }
            }
            if let Some((id, _)) = taken.iter().find(|(id, _)| *id < lo) {
                return Err(corrupt(format!(
                    "run {run} holds id {} in a block of a later part of the key space",
                    hex(id)
                )));
            }
            records.extend(taken);
        }
        let (written, bytes) = write_run(&mut self.blocks, m.output, &records)?;
        m.written += written;
        m.bytes += bytes;
        Ok(())
    }

    /// If `maintain`, carry out one part of a merge or flush the log, whichever is due.
    fn finish(mut self, maintain: bool) -> Result<Done, redb::Error> {
        if maintain && !self.emptied {
            // A due merge starts before a flush (flushes alone would pile up runs when
            // every commit brings a flush's worth), and no flush while a merge goes on.
            if self.merge.is_none() {
                if let Some(inputs) = due_merge(&self.runs) {
                    let bytes: u64 = inputs.iter().map(|r| r.bytes).sum();
                    let parts = if bytes < self.logged.one_part_below {
                        1
                    } else if bytes < self.logged.many_parts_from {
                        16
                    } else {
                        256
                    };
                    let output = self.new_run_id()?;
                    // Listed from the start, so that readers search the parts merged.
                    write_run_entry(&mut self.blocks, &Run { id: output, records: 0, bytes: 0 })?;
                    self.merge = Some(RunMerge {
                        inputs: inputs.iter().map(|r| r.id).collect(),
                        output,
                        part: 0,
                        parts,
                        written: 0,
                        bytes: 0,
                    });
                } else if self.logged.log_due(self.log_records, self.log_bytes) {
                    self.flush(false)?;
                }
            }
            if let Some(mut m) = self.merge.take() {
                self.merge_part(&mut m)?;
                if m.part + 1 < m.parts {
                    m.part += 1;
                    // What it holds so far, for the size classes after a crash.
                    let so_far = Run { id: m.output, records: m.written, bytes: m.bytes };
                    write_run_entry(&mut self.blocks, &so_far)?;
                    self.merge = Some(m);
                } else {
                    for &run in &m.inputs {
                        self.blocks.remove(&run_entry_key(run)[..])?;
                    }
                    self.runs.retain(|r| !m.inputs.contains(&r.id));
                    let run = Run { id: m.output, records: m.written, bytes: m.bytes };
                    write_run_entry(&mut self.blocks, &run)?;
                    self.runs.push(run);
                    // Oldest first by number: a run flushed by a removal during the merge
                    // is newer than its output.
                    self.runs.sort_by_key(|r| r.id);
                }
            }
        }
        Ok(Done {
            appended: self.staged.into_iter().collect(),
            next: self.next,
            log_records: self.log_records,
            log_bytes: self.log_bytes,
            emptied: self.emptied,
            runs: self.runs,
            merge: self.merge,
        })
    }
}

/// A run's blocks in id order, read one block at a time.
struct Cursor {
    range: redb::Range<'static, &'static [u8], &'static [u8]>,
    block: std::iter::Peekable<std::vec::IntoIter<(Key, Vec<u8>)>>,
}

impl Cursor {
    /// The next id, reading the next block once the last one is used up.
    fn peek(&mut self) -> Result<Option<Key>, redb::Error> {
        while self.block.peek().is_none() {
            let Some(kv) = self.range.next() else {
                return Ok(None);
            };
            let (k, value) = kv?;
            self.block = block_records(k.value(), value.value())?.into_iter().peekable();
        }
        Ok(self.block.peek().map(|(k, _)| *k))
    }
}

/// An id and its record.
type Entry = (Vec<u8>, Vec<u8>);

/// Every id of a [`Logged`] table with its newest record, in id order ([`Logged::entries`]).
pub struct Entries {
    /// The runs, newest first.
    cursors: Vec<Cursor>,
    log: redb::ReadOnlyTable<u64, &'static [u8]>,
    log_ids: std::iter::Peekable<std::collections::btree_map::IntoIter<Key, u64>>,
}

impl Entries {
    fn next_entry(&mut self) -> Result<Option<Entry>, redb::Error> {
        let mut least: Option<Key> = self.log_ids.peek().map(|(k, _)| *k);
        for c in &mut self.cursors {
            if let Some(k) = c.peek()? {
                least = Some(least.map_or(k, |l| l.min(k)));
            }
        }
        let Some(key) = least else { return Ok(None) };
        // The log's record is the newest, then the newest run's; the others are skipped.
        let mut record = None;
        if self.log_ids.peek().is_some_and(|(k, _)| *k == key) {
            if let Some((_, seq)) = self.log_ids.next() {
                record = Some(log_record(&self.log, seq)?);
            }
        }
        for c in &mut self.cursors {
            if c.peek()? == Some(key) {
                if let Some((_, r)) = c.block.next() {
                    record.get_or_insert(r);
                }
            }
        }
        Ok(record.map(|r| (key.to_vec(), r)))
    }
}

impl Iterator for Entries {
    type Item = Result<Entry, redb::Error>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_entry().transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYED: Table = crate::table("keyed");
    const LOG: LogTable = TableDefinition::new("keyed_log");
    const BLOCKS: Table = crate::table("keyed_blocks");
    const T: Tables = Tables { blocks: BLOCKS, log: LOG, older: KEYED };

    /// A seeded splitmix64.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let z = (self.0 ^ (self.0 >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        fn key(&mut self, of: u64) -> Key {
            let i = self.next() % of;
            let mut k = [0u8; 16];
            k[..8].copy_from_slice(&i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes());
            k[8..].copy_from_slice(&i.to_be_bytes());
            k
        }
    }

    fn check(db: &Database, t: &Logged, model: &BTreeMap<Key, Vec<u8>>) {
        let all: Vec<(Vec<u8>, Vec<u8>)> = t.entries(db).unwrap().map(|kv| kv.unwrap()).collect();
        let want: Vec<(Vec<u8>, Vec<u8>)> =
            model.iter().map(|(k, v)| (k.to_vec(), v.clone())).collect();
        assert_eq!(all, want, "entries differ from the model");
        assert_eq!(t.len(db).unwrap(), model.len() as u64);
        for (k, v) in model {
            assert_eq!(t.get(db, k, |r| r.to_vec()).unwrap().as_ref(), Some(v));
        }
        assert!(!t.contains(db, &[0xff; 16]).unwrap());
    }

    /// Inserts (new ids and replaced ones) in many transactions read back exactly as a map
    /// of the same writes, through flushes, merges of runs in parts, a reopen in the
    /// middle of a merge, and a reopen at the end.
    #[test]
    fn reads_match_a_plain_map_through_merges_and_reopens() {
        reads_match_a_plain_map(16);
        reads_match_a_plain_map(256);
    }

    fn reads_match_a_plain_map(parts: u64) {
        let d = tempfile::tempdir().unwrap();
        let db = crate::open(d.path(), 1 << 20, &[KEYED]).unwrap();
        let open = |db: &Database| {
            let mut t = Logged::open_merging_at(db, T, 50).unwrap();
            // Every merge in 16 or 256 parts, one per commit.
            t.one_part_below = 0;
            t.many_parts_from = if parts == 16 { u64::MAX } else { 0 };
            t
        };
        let mut t = open(&db);
        let mut model = BTreeMap::new();
        let mut rng = Rng(7);
        let (mut flushes, mut merges, mut reopened_mid_merge) = (0, 0, false);
        let rounds = if parts == 16 { 200 } else { 900 };
        for round in 0..rounds {
            let (before, runs_before) = (t.unmerged(), t.runs().len());
            t.write(&db, Durability::None, |_, w| {
                for i in 0..(1 + rng.next() % 20) {
                    let k = rng.key(2000);
                    // Up to 400 bytes: some blocks are cut by size, not only by first byte.
                    let pad: String = (0..rng.next() % 400)
                        .map(|_| char::from(b'a' + (rng.next() % 26) as u8))
                        .collect();
                    let v = format!("{round}/{i}{pad}").into_bytes();
                    // Within one transaction too, a record is found once written.
                    w.insert(&k, &v)?;
                    assert!(w.contains(&k)?);
                    model.insert(k, v);
                }
                Ok::<_, redb::Error>(())
            })
            .unwrap();
            flushes += usize::from(t.unmerged() < before);
            merges += usize::from(t.runs().len() < runs_before);
            if round % 7 == 0 {
                check(&db, &t, &model);
            }
            let merging = lock(&t.index).merge.as_ref().is_some_and(|m| m.part > 3);
            if (merging && !reopened_mid_merge) || round == 120 {
                // Reopened wherever a merge stands (as after a crash): the index is the
                // log's again, the merge's parts split between its inputs and its output.
                reopened_mid_merge |= merging;
                drop(t);
                t = open(&db);
                let tx = db.begin_read().unwrap();
                let in_log = newest_ids(&tx.open_table(LOG).unwrap()).unwrap().0.len();
                drop(tx);
                assert_eq!(t.unmerged(), in_log);
                check(&db, &t, &model);
            }
        }
        assert!(reopened_mid_merge, "never reopened in the middle of a merge");
        assert!(flushes >= 5 && merges >= 2, "{flushes} flushes, {merges} merges");
        check(&db, &t, &model);
        // The log holds no more than the records since the last flush, and those written
        // while a merge went on (16 commits).
        let tx = db.begin_read().unwrap();
        let log_len = tx.open_table(LOG).unwrap().len().unwrap();
        assert!(log_len < 50 + (parts + 1) * 20, "log of {log_len} records");
        drop(tx);
        drop(t);
        drop(db);
        let db = crate::open(d.path(), 1 << 20, &[KEYED]).unwrap();
        let t = open(&db);
        check(&db, &t, &model);
    }

    /// A removal takes the id's record out wherever it is (the log merged first, older
    /// records of the id included), and the table reads as a map without it.
    #[test]
    fn remove_takes_the_record_out_of_log_and_table() {
        let db = crate::temporary(&[KEYED]).unwrap();
        let t = Logged::open_merging_at(&db, T, 1000).unwrap();
        let mut model = BTreeMap::new();
        t.write(&db, Durability::None, |_, w| {
            for i in 0..40u8 {
                w.insert(&[i; 16], &[i])?;
                model.insert([i; 16], vec![i]);
            }
            Ok::<_, redb::Error>(())
        })
        .unwrap();
        // Replaced: the log holds two records of these ids.
        t.write(&db, Durability::None, |_, w| {
            for i in 0..5u8 {
                w.insert(&[i; 16], b"new")?;
                model.insert([i; 16], b"new".to_vec());
            }
            Ok::<_, redb::Error>(())
        })
        .unwrap();
        let removed = t
            .write(&db, Durability::None, |_, w| {
                let a = w.remove(&[2; 16])?;
                let b = w.remove(&[30; 16])?;
                let none = w.remove(&[99; 16])?;
                assert!(!w.contains(&[2; 16])?);
                w.insert(&[50; 16], b"after")?;
                Ok::<_, redb::Error>((a, b, none))
            })
            .unwrap();
        assert_eq!(removed, (Some(b"new".to_vec()), Some(vec![30]), None));
        model.remove(&[2; 16]);
        model.remove(&[30; 16]);
        model.insert([50; 16], b"after".to_vec());
        check(&db, &t, &model);
        assert_eq!(t.unmerged(), 1);
        // The last record of a block (its key), and a block's only record.
        t.write(&db, Durability::None, |_, w| {
            assert_eq!(w.remove(&[31; 16])?, Some(vec![31]));
            assert_eq!(w.remove(&[50; 16])?, Some(b"after".to_vec()));
            Ok::<_, redb::Error>(())
        })
        .unwrap();
        model.remove(&[31; 16]);
        model.remove(&[50; 16]);
        check(&db, &t, &model);
        drop(t);
        let t = Logged::open_merging_at(&db, T, 1000).unwrap();
        check(&db, &t, &model);
    }

    /// A reader's snapshot and its look in the index stay one view: an id replaced and
    /// its older record merged and deleted by later commits still reads as it was then.
    #[test]
    fn a_lookup_reads_its_own_moment_while_records_move() {
        let db = crate::temporary(&[KEYED]).unwrap();
        let t = Logged::open_merging_at(&db, T, 4).unwrap();
        let k = [0xf5; 16];
        t.write(&db, Durability::None, |_, w| w.insert(&k, b"old")).unwrap();
        let (seq, tx) = t.lookup(&db, &k).unwrap();
        // Replaced, then enough commits for a whole merge (16 parts), which deletes the
        // old record from the log.
        t.write(&db, Durability::None, |_, w| w.insert(&k, b"new")).unwrap();
        for i in 0..40u8 {
            t.write(&db, Durability::None, |_, w| w.insert(&[i; 16], &[i])).unwrap();
        }
        let now = db.begin_read().unwrap();
        assert!(now.open_table(LOG).unwrap().get(seq.unwrap()).unwrap().is_none(), "not merged");
        let then = t.get_in(&tx, seq, &k, |r| r.to_vec()).unwrap();
        assert_eq!(then.as_deref(), Some(&b"old"[..]));
        assert_eq!(t.get(&db, &k, |r| r.to_vec()).unwrap().as_deref(), Some(&b"new"[..]));
    }

    /// Removing again in the same transaction, after records were written since the
    /// first removal, takes those out too.
    #[test]
    fn a_second_removal_sees_the_records_written_since() {
        let db = crate::temporary(&[KEYED]).unwrap();
        let t = Logged::open_merging_at(&db, T, 1000).unwrap();
        t.write(&db, Durability::None, |_, w| w.insert(&[1; 16], b"a")).unwrap();
        let got = t
            .write(&db, Durability::None, |_, w| {
                w.remove(&[1; 16])?;
                w.insert(&[2; 16], b"b")?;
                w.insert(&[2; 16], b"c")?;
                let removed = w.remove(&[2; 16])?;
                Ok::<_, redb::Error>((removed, w.contains(&[2; 16])?))
            })
            .unwrap();
        assert_eq!(got, (Some(b"c".to_vec()), false));
        check(&db, &t, &BTreeMap::new());
    }

    /// A log whose last record has the last sequence number is refused, not wrapped onto
    /// record 0.
    #[test]
    fn the_last_sequence_number_is_an_error_not_a_wrap() {
        let db = crate::temporary(&[KEYED]).unwrap();
        let tx = db.begin_write().unwrap();
        tx.open_table(KEYED).unwrap();
        tx.open_table(LOG).unwrap().insert(u64::MAX, &[5u8; 17][..]).unwrap();
        tx.commit().unwrap();
        let e = Logged::open(&db, T).err().unwrap().to_string();
        assert!(e.contains("last sequence number"), "{e}");
    }

    /// A transaction whose update fails commits nothing: the index does not take its
    /// records, and the next writer numbers its own from the same place.
    #[test]
    fn a_failed_update_leaves_nothing_behind() {
        let db = crate::temporary(&[KEYED]).unwrap();
        let t = Logged::open_merging_at(&db, T, 50).unwrap();
        let err = t
            .write(&db, Durability::None, |_, w| {
                w.insert(&[1; 16], b"lost")?;
                Err::<(), _>(redb::Error::Corrupted("refused".into()))
            })
            .unwrap_err();
        assert!(err.to_string().contains("refused"));
        assert!(!t.contains(&db, &[1; 16]).unwrap());
        assert_eq!(t.unmerged(), 0);
        t.write(&db, Durability::None, |_, w| w.insert(&[2; 16], b"kept")).unwrap();
        assert_eq!(t.get(&db, &[2; 16], |r| r.to_vec()).unwrap().as_deref(), Some(&b"kept"[..]));
        assert_eq!(t.len(&db).unwrap(), 1);
    }

    /// A log record that is not what the index says is an error naming it, not a panic
    /// or another id's record.
    #[test]
    fn a_damaged_log_record_is_an_error() {
        let db = crate::temporary(&[KEYED]).unwrap();
        let t = Logged::open_merging_at(&db, T, 50).unwrap();
        t.write(&db, Durability::None, |_, w| w.insert(&[3; 16], b"v")).unwrap();
        let tx = db.begin_write().unwrap();
        tx.open_table(LOG).unwrap().insert(0, &b"short"[..]).unwrap();
        tx.commit().unwrap();
        let e = t.get(&db, &[3; 16], |r| r.to_vec()).unwrap_err().to_string();
        assert!(e.contains("log record 0"), "{e}");
        drop(t);
        let e = Logged::open(&db, T).err().unwrap().to_string();
        assert!(e.contains("log record 0"), "{e}");
        let tx = db.begin_write().unwrap();
        tx.open_table(LOG).unwrap().insert(0, &[3u8; 16][..]).unwrap();
        tx.open_table(LOG).unwrap().insert(1, &[4u8; 20][..]).unwrap();
        tx.commit().unwrap();
        // Reopened, the index says id 3 is record 0: a record naming another id there is
        // an error, not id 4's record.
        let t = Logged::open(&db, T).unwrap();
        let tx = db.begin_write().unwrap();
        tx.open_table(LOG).unwrap().insert(0, &[4u8; 20][..]).unwrap();
        tx.commit().unwrap();
        let e = t.get(&db, &[3; 16], |r| r.to_vec()).unwrap_err().to_string();
        assert!(e.contains("another id"), "{e}");
    }

    /// Bytes of all blocks' values.
    fn block_bytes(db: &Database) -> usize {
        let tx = db.begin_read().unwrap();
        let t = tx.open_table(BLOCKS).unwrap();
        t.range::<&[u8]>(..).unwrap().map(|kv| kv.unwrap().1.value().len()).sum()
    }

    fn completion(text: String) -> halyard_proto::Completion {
        halyard_proto::Completion {
            text,
            usage: Default::default(),
            latency_ms: 5,
            finish_reason: None,
            calls: 1,
            logprobs: None,
            refusal: false,
        }
    }

    /// A store of an earlier build (records one per id in the older table, compressed
    /// ones among them, and a log) opens with every record in blocks and the older table
    /// and the log empty, and reads as before, also after a reopen.
    #[test]
    fn older_records_move_into_blocks_at_open() {
        let d = tempfile::tempdir().unwrap();
        let db = crate::open(d.path(), 1 << 20, &[KEYED]).unwrap();
        let mut model = BTreeMap::new();
        let mut rng = Rng(11);
        let tx = db.begin_write().unwrap();
        {
            let mut older = tx.open_table(KEYED).unwrap();
            let mut log = tx.open_table(LOG).unwrap();
            for i in 0..300u64 {
                let k = rng.key(1 << 40);
                let text = format!("answer {i}: the evidence supports the claim. ").repeat(4);
                let c = completion(text);
                let v = halyard_proto::stored::encode_completion(&c).unwrap();
                older.insert(&k[..], &v[..]).unwrap();
                model.insert(k, c);
                if i % 10 == 0 {
                    let c = completion(format!("newer {i}"));
                    let mut rec = k.to_vec();
                    rec.extend(halyard_proto::stored::encode_completion(&c).unwrap());
                    log.insert(i, &rec[..]).unwrap();
                    model.insert(k, c);
                }
            }
        }
        tx.commit().unwrap();
        let check = |t: &Logged| {
            assert_eq!(t.len(&db).unwrap(), 300);
            for (k, c) in &model {
                let got = t.get(&db, k, halyard_proto::stored::decode_completion).unwrap();
                assert_eq!(got.unwrap().unwrap(), *c);
            }
        };
        let t = Logged::open(&db, T).unwrap();
        check(&t);
        assert_eq!(t.unmerged(), 0);
        let tx = db.begin_read().unwrap();
        assert_eq!(tx.open_table(KEYED).unwrap().len().unwrap(), 0);
        assert_eq!(tx.open_table(LOG).unwrap().len().unwrap(), 0);
        drop(tx);
        // Compressed together: smaller than the records compressed one by one.
        let one_by_one: usize = model
            .values()
            .map(|c| halyard_proto::stored::encode_completion(c).unwrap().len())
            .sum();
        assert!(
            block_bytes(&db) * 3 < one_by_one * 2,
            "{} in blocks, {one_by_one} one by one",
            block_bytes(&db)
        );
        drop(t);
        let t = Logged::open(&db, T).unwrap();
        check(&t);
    }

    /// A record of the older table whose key is not an id stops the open with an error
    /// naming it, and nothing is moved.
    #[test]
    fn an_older_key_that_is_not_an_id_is_an_error() {
        let db = crate::temporary(&[KEYED]).unwrap();
        let tx = db.begin_write().unwrap();
        tx.open_table(KEYED).unwrap().insert(&[1u8; 16][..], &b"a"[..]).unwrap();
        tx.open_table(KEYED).unwrap().insert(&b"short"[..], &b"b"[..]).unwrap();
        tx.commit().unwrap();
        let e = Logged::open(&db, T).err().unwrap().to_string();
        assert!(e.contains("73686f7274") && e.contains("not a 16-byte id"), "{e}");
        let tx = db.begin_read().unwrap();
        assert_eq!(tx.open_table(KEYED).unwrap().len().unwrap(), 2);
    }

    /// A damaged block is an error naming it, for readers and for the merge that would
    /// rewrite it, never a panic or another id's record.
    #[test]
    fn a_damaged_block_is_an_error() {
        let db = crate::temporary(&[KEYED]).unwrap();
        let t = Logged::open_merging_at(&db, T, 1).unwrap();
        // Flushed at once (a log of one record is due), merged by fours.
        for i in 0..20u8 {
            t.write(&db, Durability::None, |_, w| w.insert(&[i.wrapping_mul(13); 16], &[i]))
                .unwrap();
        }
        assert_eq!(t.get(&db, &[0; 16], |r| r.to_vec()).unwrap(), Some(vec![0]));
        let first = {
            let tx = db.begin_read().unwrap();
            let blocks = tx.open_table(BLOCKS).unwrap();
            let mut after_directory = blocks.range::<&[u8]>(&[0u8, 0, 0, 1][..]..).unwrap();
            let first = after_directory.next().unwrap().unwrap().0.value().to_vec();
            first
        };
        let id: Key = first[4..].try_into().unwrap();
        for bad in [&[1u8, 0][..], &[1, 0, 0, 0, 0x7f, 1][..], &[2, 0, 0, 0, 0][..]] {
            let tx = db.begin_write().unwrap();
            tx.open_table(BLOCKS).unwrap().insert(&first[..], bad).unwrap();
            tx.commit().unwrap();
            let e = t.get(&db, &id, |r| r.to_vec()).unwrap_err().to_string();
            assert!(e.contains(&hex(&first)), "{e}");
            assert!(t.entries(&db).unwrap().any(|kv| kv.is_err()));
            assert!(t.len(&db).is_err());
        }
        // Writes go on (their flushes too; the merge that would read the block fails and
        // is tried again at each write), and read back.
        for i in 100..130u8 {
            t.write(&db, Durability::None, |_, w| w.insert(&[i; 16], &[i])).unwrap();
            assert_eq!(t.get(&db, &[i; 16], |r| r.to_vec()).unwrap(), Some(vec![i]));
        }
        assert!(lock(&t.index).failing, "no merge reached the damaged block");
        // Records out of order.
        let mut b = BlockBuilder::new();
        b.push(&[9; 16], b"x");
        b.push(&[3; 16], b"y");
        let (_, v) = b.take().unwrap();
        let e = block_records(&block_key(1, &[3; 16]), &v).unwrap_err().to_string();
        assert!(e.contains("out of order"), "{e}");
        // A directory entry that is not a run.
        let tx = db.begin_write().unwrap();
        tx.open_table(BLOCKS).unwrap().insert(&[0u8, 0, 0, 0, 9][..], &b"?"[..]).unwrap();
        tx.commit().unwrap();
        let e = t.get(&db, &[0xee; 16], |r| r.to_vec()).unwrap_err().to_string();
        assert!(e.contains("directory of runs"), "{e}");
    }

    /// A block packs to at most [`MAX_PACKED`] bytes, so two share a leaf: records that
    /// would pack to more go on in the next block, in order, none lost.
    #[test]
    fn blocks_pack_to_half_a_page_at_most() {
        let mut rng = Rng(3);
        let mut b = BlockBuilder::new();
        let mut want = Vec::new();
        for i in 0..100u64 {
            let k = rng.key(u64::MAX);
            // Incompressible bytes: about 116 per record with its id and length.
            let r: Vec<u8> = (0..100).map(|_| rng.next() as u8).collect();
            want.push((k, r));
            let _ = i;
        }
        want.sort();
        for (k, r) in &want {
            b.push(k, r);
        }
        let mut got = Vec::new();
        while let Some((last, value)) = b.take() {
            assert!(value.len() <= 4 + MAX_PACKED, "a block of {} bytes", value.len());
            let records = block_records(&block_key(1, &last), &value).unwrap();
            got.extend(records);
            if !b.is_empty() {
                assert!(got.len() > 5, "a block of {} records before the last", got.len());
            }
        }
        assert_eq!(got, want);
    }

    /// A removal in the middle of a merge takes the id out of the merge's output too (its
    /// parts merged so far), and the merge goes on without it.
    #[test]
    fn a_removal_during_a_merge_reaches_its_output() {
        let db = crate::temporary(&[KEYED]).unwrap();
        let mut t = Logged::open_merging_at(&db, T, 2).unwrap();
        t.one_part_below = 0;
        let mut model = BTreeMap::new();
        t.write(&db, Durability::None, |_, w| w.insert(&[0xf7; 16], b"older")).unwrap();
        model.insert([0xf7; 16], b"older".to_vec());
        let mut i = 0u8;
        while lock(&t.index).merge.as_ref().is_none_or(|m| m.part < 8) {
            assert!(i < 200, "no merge reached part 8");
            t.write(&db, Durability::None, |_, w| w.insert(&[i; 16], &[i])).unwrap();
            model.insert([i; 16], vec![i]);
            i += 1;
        }
        let output = lock(&t.index).merge.as_ref().map(|m| m.output).unwrap();
        // A newer record of an id the merge has not reached yet (its last part), flushed
        // by the removal into a run numbered after the merge's output: it stays the newer
        // one through this merge and the merges after it.
        let late = [0xf7; 16];
        let removed = t
            .write(&db, Durability::None, |_, w| {
                w.insert(&late, b"newer")?;
                w.remove(&[0; 16])
            })
            .unwrap();
        assert_eq!(removed, Some(vec![0]));
        model.remove(&[0; 16]);
        model.insert(late, b"newer".to_vec());
        check(&db, &t, &model);
        // On until the merge is done (its output listed among the runs), and through
        // the merges after it.
        while !lock(&t.index).runs.iter().any(|r| r.id == output) {
            assert!(i < 150, "the merge did not end");
            t.write(&db, Durability::None, |_, w| w.insert(&[i; 16], &[i])).unwrap();
            model.insert([i; 16], vec![i]);
            i += 1;
        }
        check(&db, &t, &model);
        let merged_after = lock(&t.index).runs.len();
        for _ in 0..60 {
            t.write(&db, Durability::None, |_, w| w.insert(&[i; 16], &[i])).unwrap();
            model.insert([i; 16], vec![i]);
            i += 1;
        }
        assert!(
            !lock(&t.index).runs.iter().any(|r| r.id == output),
            "its output was not merged again"
        );
        let _ = merged_after;
        check(&db, &t, &model);
    }
}

//! A table keyed by random 16-byte ids (job ids), written through a log.
//!
//! redb is a copy-on-write B-tree: the first insert of a transaction into a leaf copies
//! that 4 KiB leaf. Job ids are hashes, so the inserts of one commit land in different
//! leaves and nearly every insert copies one: at a million records, 10 µs per insert
//! against 1 µs for keys in order (measured with 500 inserts per commit). A [`Logged`]
//! table therefore takes inserts into a **log**, a table keyed by a sequence number (in
//! order: the log's last leaf fills in place), keeps an index of the log in memory (id →
//! sequence), and merges the log into the **keyed** table in key order once the log holds
//! a quarter of the keyed table ([`MIN_MERGE`] to [`MAX_MERGE`] records): each leaf of
//! the keyed table is then copied about once per merge, not once per insert.
//!
//! The merge goes one sixteenth of the key space per write transaction (the ids whose
//! first byte falls in it), so no commit copies the whole keyed table and the file needs
//! room for one sixteenth of it more, not all of it; when the last part is merged, the
//! log's merged records (a prefix of its sequence numbers) are deleted.
//!
//! Reads see exactly what a plain table would: the newest record of an id is in the log
//! while the index names it, in the keyed table otherwise. A reader opens its snapshot
//! while it holds the index, and the index takes a commit only after it is made (writers
//! take turns, and a writer's turn ends once the index has its commit), so the snapshot
//! is the index's commit or the one after it, whose merge part, if any, copied the record
//! the index names before deleting it: a record is never missed while it moves. The log and the keyed table change only
//! in redb's atomic commits, and opening rebuilds the index from the log, so a crash at
//! any point loses nothing: a merge cut short leaves records in both, the log's the newer
//! (or the same), and the next merge copies them again.
//!
//! Disk: the log's leaves are full (appended in order); records merged into the keyed
//! table cost B-tree room. Merging at open instead would double a small store's file
//! (both copies live in one transaction), so open only reads the log.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

use redb::{
    Database, Durability, ReadTransaction, ReadableDatabase, ReadableTable, ReadableTableMetadata,
    TableDefinition, TableHandle, WriteTransaction,
};

use crate::Table;

/// The ids of a [`Logged`] table.
pub type Key = [u8; 16];
/// A log table: sequence number → id followed by the record.
pub type LogTable = TableDefinition<'static, u64, &'static [u8]>;

/// The log is merged once it holds this many records at least...
pub const MIN_MERGE: u64 = 65_536;
/// An environment variable that sets [`MIN_MERGE`] for the process (read at each open):
/// crash tests merge every few hundred records with it.
pub const MERGE_AT_ENV: &str = "HALYARD_STORE_MERGE_AT";
/// ... and a quarter of the keyed table, up to this many (the index holds the log in
/// memory, about 40 bytes per record).
pub const MAX_MERGE: u64 = 1 << 20;
/// A merge goes this many parts of the key space, one per write transaction.
const PARTS: u16 = 16;

/// A table of records keyed by 16-byte random ids, written through a log (module docs).
pub struct Logged {
    keyed: Table,
    log: LogTable,
    index: Mutex<Index>,
    /// The least number of records the log holds before a merge ([`MIN_MERGE`]).
    min_merge: u64,
    /// Held by a writer from its transaction's start until the index has taken its
    /// commit, so that the next writer numbers its records after the last writer's.
    turn: Mutex<()>,
}

struct Index {
    /// The log's records not merged yet: id → sequence number of its newest record.
    seqs: BTreeMap<Key, u64>,
    /// The sequence number of the next record.
    next: u64,
    merge: Option<Merge>,
}

/// A merge in progress: the log's records numbered below `below` go into the keyed table,
/// part `part` next.
#[derive(Clone, Copy)]
struct Merge {
    below: u64,
    part: u16,
}

/// What a write transaction did, applied to the index once it is committed.
struct Done {
    appended: Vec<(Key, u64)>,
    next: u64,
    merged: Vec<(Key, u64)>,
    merge: Option<Merge>,
    /// The whole log was merged and emptied ([`LoggedWrite::remove`]).
    emptied: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn corrupt(what: String) -> redb::Error {
    redb::Error::Corrupted(what)
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

/// The ids in `log`, each with its newest record's sequence number, in id order.
fn newest_ids(
    log: &impl ReadableTable<u64, &'static [u8]>,
) -> Result<BTreeMap<Key, u64>, redb::Error> {
    let mut ids = BTreeMap::new();
    for kv in log.range::<u64>(..)? {
        let (seq, bytes) = kv?;
        let (key, _) = split_log_record(seq.value(), bytes.value())?;
        ids.insert(key, seq.value());
    }
    Ok(ids)
}

/// The log's ids in `tx` ([`newest_ids`]).
fn log_ids(tx: &ReadTransaction, log: LogTable) -> Result<BTreeMap<Key, u64>, redb::Error> {
    newest_ids(&tx.open_table(log)?)
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

/// The first id of part `part` of the key space, and the first of the next (none for the
/// last part).
fn part_bounds(part: u16) -> (Key, Option<Key>) {
    let width = 256 / PARTS;
    let first = |p: u16| {
        let mut k = [0u8; 16];
        k[0] = (p * width) as u8;
        k
    };
    (first(part), (part + 1 < PARTS).then(|| first(part + 1)))
}

impl Logged {
    /// The logged table `keyed` with its log `log` in `db` (created if missing), its index
    /// read from the log an earlier process left.
    pub fn open(db: &Database, keyed: Table, log: LogTable) -> Result<Logged, redb::Error> {
        let at = std::env::var(MERGE_AT_ENV).ok().and_then(|v| v.trim().parse().ok());
        Self::open_merging_at(db, keyed, log, at.unwrap_or(MIN_MERGE))
    }

    /// [`Logged::open`] with merges from `min_merge` records of log (tests, benchmarks).
    pub fn open_merging_at(
        db: &Database,
        keyed: Table,
        log: LogTable,
        min_merge: u64,
    ) -> Result<Logged, redb::Error> {
        let exists = {
            let tx = db.begin_read()?;
            let found = |e: Result<_, redb::TableError>| match e {
                Ok(_) => Ok(true),
                Err(redb::TableError::TableDoesNotExist(_)) => Ok(false),
                Err(e) => Err(e),
            };
            found(tx.open_table(keyed).map(drop))? && found(tx.open_table(log).map(drop))?
        };
        if !exists {
            let tx = db.begin_write()?;
            tx.open_table(keyed)?;
            tx.open_table(log)?;
            tx.commit()?;
        }
        let tx = db.begin_read()?;
        let seqs = log_ids(&tx, log)?;
        let next = match tx.open_table(log)?.last()? {
            Some((seq, _)) => next_seq(seq.value())?,
            None => 0,
        };
        if !seqs.is_empty() {
            tracing::debug!(
                table = keyed.name(),
                records = seqs.len(),
                "read the log an earlier process left"
            );
        }
        Ok(Logged {
            keyed,
            log,
            index: Mutex::new(Index { seqs, next, merge: None }),
            min_merge: min_merge.max(1),
            turn: Mutex::new(()),
        })
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
            // Gone from the log only if a merge moved it to the keyed table since.
            if let Some(bytes) = tx.open_table(self.log)?.get(seq)? {
                let (logged, record) = split_log_record(seq, bytes.value())?;
                if &logged != key {
                    return Err(corrupt(format!(
                        "log record {seq} holds another id than its index"
                    )));
                }
                return Ok(Some(read(record)));
            }
        }
        let table = tx.open_table(self.keyed)?;
        let found = table.get(&key[..])?;
        Ok(found.map(|v| read(v.value())))
    }

    /// Whether `key` has a record.
    pub fn contains(&self, db: &Database, key: &Key) -> Result<bool, redb::Error> {
        Ok(self.get(db, key, |_| ())?.is_some())
    }

    /// Records (ids with a record), counted in one snapshot.
    pub fn len(&self, db: &Database) -> Result<u64, redb::Error> {
        let tx = db.begin_read()?;
        let keyed = tx.open_table(self.keyed)?;
        let mut n = keyed.len()?;
        for (key, _) in log_ids(&tx, self.log)? {
            if keyed.get(&key[..])?.is_none() {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Call `each` with every id that has a record, in one snapshot (the keyed table's in
    /// order, then the log's), until it returns false. Returns the ids passed.
    pub fn for_each_id(
        &self,
        db: &Database,
        mut each: impl FnMut(&[u8]) -> bool,
    ) -> Result<u64, redb::Error> {
        let tx = db.begin_read()?;
        let in_log = log_ids(&tx, self.log)?;
        let mut n = 0;
        for kv in tx.open_table(self.keyed)?.range::<&[u8]>(..)? {
            let (key, _) = kv?;
            let key = key.value();
            let logged = <&Key>::try_from(key).is_ok_and(|k| in_log.contains_key(k));
            if !logged {
                n += 1;
                if !each(key) {
                    return Ok(n);
                }
            }
        }
        for key in in_log.keys() {
            n += 1;
            if !each(key) {
                break;
            }
        }
        Ok(n)
    }

    /// Every id with its newest record, in id order, in one snapshot.
    pub fn entries(&self, db: &Database) -> Result<Entries, redb::Error> {
        let tx = db.begin_read()?;
        let log_ids = log_ids(&tx, self.log)?.into_iter().peekable();
        let log = tx.open_table(self.log)?;
        let keyed = tx.open_table(self.keyed)?.range::<&[u8]>(..)?;
        Ok(Entries { keyed: keyed.peekable(), log, log_ids })
    }

    /// Run `update` in one write transaction of `durability` and commit it; `update` gets
    /// the transaction (for other tables) and the writer of this table. Part of a pending
    /// merge is carried out in the same transaction.
    pub fn write<T, E: From<redb::Error>>(
        &self,
        db: &Database,
        durability: Durability,
        update: impl FnOnce(&WriteTransaction, &mut LoggedWrite<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        let _turn = lock(&self.turn);
        let mut tx = db.begin_write().map_err(redb::Error::from)?;
        tx.set_durability(durability).map_err(redb::Error::from)?;
        let (out, done) = {
            let (next, merge) = {
                let index = lock(&self.index);
                (index.next, index.merge)
            };
            let mut w = LoggedWrite {
                logged: self,
                keyed: tx.open_table(self.keyed).map_err(redb::Error::from)?,
                log: tx.open_table(self.log).map_err(redb::Error::from)?,
                staged: HashMap::new(),
                first: next,
                next,
                merge,
                emptied: false,
            };
            let out = update(&tx, &mut w)?;
            (out, w.finish()?)
        };
        tx.commit().map_err(redb::Error::from)?;
        let mut index = lock(&self.index);
        if done.emptied {
            index.seqs.clear();
        }
        for (key, seq) in done.merged {
            if index.seqs.get(&key) == Some(&seq) {
                index.seqs.remove(&key);
            }
        }
        index.seqs.extend(done.appended);
        index.next = done.next;
        index.merge = done.merge;
        Ok(out)
    }

    /// Records in the log not merged yet (for tests and benchmarks).
    pub fn unmerged(&self) -> usize {
        lock(&self.index).seqs.len()
    }
}

/// The writer of a [`Logged`] table inside one write transaction.
pub struct LoggedWrite<'t> {
    logged: &'t Logged,
    keyed: redb::Table<'t, &'static [u8], &'static [u8]>,
    log: redb::Table<'t, u64, &'static [u8]>,
    /// This transaction's records: id → sequence number.
    staged: HashMap<Key, u64>,
    first: u64,
    next: u64,
    merge: Option<Merge>,
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
        Ok(self.keyed.get(&key[..])?.is_some())
    }

    /// Store `record` for `key` (replacing any record it had).
    pub fn insert(&mut self, key: &Key, record: &[u8]) -> Result<(), redb::Error> {
        let mut bytes = Vec::with_capacity(16 + record.len());
        bytes.extend_from_slice(key);
        bytes.extend_from_slice(record);
        self.log.insert(self.next, &bytes[..])?;
        self.staged.insert(*key, self.next);
        self.next = next_seq(self.next)?;
        Ok(())
    }

    /// Remove the record of `key`, returning it. Rare (`halyard retry-failed`): the whole
    /// log is merged into the keyed table first, in this transaction, so no older record
    /// of the id is left in the log to take its place.
    pub fn remove(&mut self, key: &Key) -> Result<Option<Vec<u8>>, redb::Error> {
        // Again after an earlier removal of this transaction if records were logged since.
        if !self.emptied || !self.staged.is_empty() {
            for (k, seq) in newest_ids(&self.log)? {
                let record = log_record(&self.log, seq)?;
                self.keyed.insert(&k[..], &record[..])?;
            }
            self.log.retain(|_, _| false)?;
            self.staged.clear();
            self.merge = None;
            self.emptied = true;
        }
        let removed = self.keyed.remove(&key[..])?.map(|v| v.value().to_vec());
        Ok(removed)
    }

    /// Carry out one part of a merge, starting one if the log is due (none once the log
    /// was emptied: the index's records are gone).
    fn finish(mut self) -> Result<Done, redb::Error> {
        // Due by records, replaced ones included: they are deleted by the merge too.
        let (n, keyed_len) = (self.log.len()?, self.keyed.len()?);
        let due = n >= self.logged.min_merge && n >= (keyed_len / 4).min(MAX_MERGE);
        // A merge takes the records committed before the transaction that starts it.
        if self.merge.is_none() && due && !self.emptied {
            self.merge = Some(Merge { below: self.first, part: 0 });
        }
        let mut merged = Vec::new();
        if let Some(m) = self.merge {
            // The part's ids are taken from the index, and the lock let go before the
            // records are copied: readers do not wait for the copy.
            let ids: Vec<(Key, u64)> = {
                let index = lock(&self.logged.index);
                let (lo, hi) = part_bounds(m.part);
                let range = match hi {
                    Some(hi) => index.seqs.range(lo..hi),
                    None => index.seqs.range(lo..),
                };
                range.filter(|(_, &seq)| seq < m.below).map(|(k, &s)| (*k, s)).collect()
            };
            for (key, seq) in ids {
                let record = log_record(&self.log, seq)?;
                self.keyed.insert(&key[..], &record[..])?;
                merged.push((key, seq));
            }
            self.merge = if m.part + 1 < PARTS {
                Some(Merge { below: m.below, part: m.part + 1 })
            } else {
                // Every record below `below` is in the keyed table now (or was replaced
                // by a newer one, which stays in the log).
                self.log.retain_in::<u64, _>(..m.below, |_, _| false)?;
                None
            };
        }
        Ok(Done {
            appended: self.staged.into_iter().collect(),
            next: self.next,
            merged,
            merge: self.merge,
            emptied: self.emptied,
        })
    }
}

/// Every id of a [`Logged`] table with its newest record, in id order ([`Logged::entries`]).
pub struct Entries {
    keyed: std::iter::Peekable<redb::Range<'static, &'static [u8], &'static [u8]>>,
    log: redb::ReadOnlyTable<u64, &'static [u8]>,
    log_ids: std::iter::Peekable<std::collections::btree_map::IntoIter<Key, u64>>,
}

impl Entries {
    fn log_record(&self, key: Key, seq: u64) -> Result<(Vec<u8>, Vec<u8>), redb::Error> {
        Ok((key.to_vec(), log_record(&self.log, seq)?))
    }
}

impl Iterator for Entries {
    type Item = Result<(Vec<u8>, Vec<u8>), redb::Error>;

    fn next(&mut self) -> Option<Self::Item> {
        let keyed_key = match self.keyed.peek() {
            None => None,
            Some(Ok((k, _))) => Some(k.value().to_vec()),
            // The error itself, taken out of the range.
            Some(Err(_)) => return self.keyed.next().map(owned),
        };
        let log_first = self.log_ids.peek().map(|(k, s)| (*k, *s));
        match (keyed_key, log_first) {
            (None, None) => None,
            (Some(_), None) => self.keyed.next().map(owned),
            (kk, Some((lk, seq))) => {
                match kk.as_deref().map(|k| k.cmp(&lk[..])) {
                    Some(std::cmp::Ordering::Less) => self.keyed.next().map(owned),
                    // The log's record is the newer one: the keyed table's is skipped.
                    Some(std::cmp::Ordering::Equal) => {
                        self.keyed.next();
                        self.log_ids.next();
                        Some(self.log_record(lk, seq))
                    }
                    _ => {
                        self.log_ids.next();
                        Some(self.log_record(lk, seq))
                    }
                }
            }
        }
    }
}

type Guards =
    (redb::AccessGuard<'static, &'static [u8]>, redb::AccessGuard<'static, &'static [u8]>);

fn owned(kv: Result<Guards, redb::StorageError>) -> Result<(Vec<u8>, Vec<u8>), redb::Error> {
    let (k, v) = kv?;
    Ok((k.value().to_vec(), v.value().to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYED: Table = crate::table("keyed");
    const LOG: LogTable = TableDefinition::new("keyed_log");

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
    /// of the same writes, through whole merges, a reopen in the middle of one, and a
    /// reopen at the end; the log is emptied by every completed merge.
    #[test]
    fn reads_match_a_plain_map_through_merges_and_reopens() {
        let d = tempfile::tempdir().unwrap();
        let db = crate::open(d.path(), 1 << 20, &[KEYED]).unwrap();
        let mut t = Logged::open_merging_at(&db, KEYED, LOG, 50).unwrap();
        let mut model = BTreeMap::new();
        let mut rng = Rng(7);
        let mut merges_seen = 0;
        for round in 0..120u64 {
            let before = t.unmerged();
            t.write(&db, Durability::None, |_, w| {
                for i in 0..(1 + rng.next() % 20) {
                    let k = rng.key(2000);
                    let v = format!("{round}/{i}").into_bytes();
                    // Within one transaction too, a record is found once written.
                    w.insert(&k, &v)?;
                    assert!(w.contains(&k)?);
                    model.insert(k, v);
                }
                Ok::<_, redb::Error>(())
            })
            .unwrap();
            if t.unmerged() < before {
                merges_seen += 1;
            }
            if round % 7 == 0 {
                check(&db, &t, &model);
            }
            if round == 60 || round == 90 {
                // Reopened wherever a merge stands (as after a crash): the index is the
                // log's again, records merged by a part both there and in the keyed table.
                let merging = lock(&t.index).merge.is_some();
                drop(t);
                t = Logged::open_merging_at(&db, KEYED, LOG, 50).unwrap();
                let tx = db.begin_read().unwrap();
                let in_log = log_ids(&tx, LOG).unwrap().len();
                drop(tx);
                assert_eq!(t.unmerged(), in_log);
                assert!(merging || round == 90, "round 60 reopens in the middle of a merge");
                check(&db, &t, &model);
            }
        }
        assert!(merges_seen >= 10, "only {merges_seen} transactions merged");
        check(&db, &t, &model);
        // The log holds no more than the records since the last completed merge.
        let tx = db.begin_read().unwrap();
        let log_len = tx.open_table(LOG).unwrap().len().unwrap();
        assert!(log_len < 50 + 16 * 20 + 20, "log of {log_len} records");
        drop(tx);
        drop(t);
        drop(db);
        let db = crate::open(d.path(), 1 << 20, &[KEYED]).unwrap();
        let t = Logged::open_merging_at(&db, KEYED, LOG, 50).unwrap();
        check(&db, &t, &model);
    }

    /// A removal takes the id's record out wherever it is (the log merged first, older
    /// records of the id included), and the table reads as a map without it.
    #[test]
    fn remove_takes_the_record_out_of_log_and_table() {
        let db = crate::temporary(&[KEYED]).unwrap();
        let t = Logged::open_merging_at(&db, KEYED, LOG, 1000).unwrap();
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
        drop(t);
        let t = Logged::open_merging_at(&db, KEYED, LOG, 1000).unwrap();
        check(&db, &t, &model);
    }

    /// A reader's snapshot and its look in the index stay one view: an id replaced and
    /// its older record merged and deleted by later commits still reads as it was then.
    #[test]
    fn a_lookup_reads_its_own_moment_while_records_move() {
        let db = crate::temporary(&[KEYED]).unwrap();
        let t = Logged::open_merging_at(&db, KEYED, LOG, 4).unwrap();
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
        let t = Logged::open_merging_at(&db, KEYED, LOG, 1000).unwrap();
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
        let e = Logged::open(&db, KEYED, LOG).err().unwrap().to_string();
        assert!(e.contains("last sequence number"), "{e}");
    }

    /// A transaction whose update fails commits nothing: the index does not take its
    /// records, and the next writer numbers its own from the same place.
    #[test]
    fn a_failed_update_leaves_nothing_behind() {
        let db = crate::temporary(&[KEYED]).unwrap();
        let t = Logged::open_merging_at(&db, KEYED, LOG, 50).unwrap();
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
        let t = Logged::open_merging_at(&db, KEYED, LOG, 50).unwrap();
        t.write(&db, Durability::None, |_, w| w.insert(&[3; 16], b"v")).unwrap();
        let tx = db.begin_write().unwrap();
        tx.open_table(LOG).unwrap().insert(0, &b"short"[..]).unwrap();
        tx.commit().unwrap();
        let e = t.get(&db, &[3; 16], |r| r.to_vec()).unwrap_err().to_string();
        assert!(e.contains("log record 0"), "{e}");
        drop(t);
        let e = Logged::open(&db, KEYED, LOG).err().unwrap().to_string();
        assert!(e.contains("log record 0"), "{e}");
        let tx = db.begin_write().unwrap();
        tx.open_table(LOG).unwrap().insert(0, &[3u8; 16][..]).unwrap();
        tx.open_table(LOG).unwrap().insert(1, &[4u8; 20][..]).unwrap();
        tx.commit().unwrap();
        // Reopened, the index says id 3 is record 0: a record naming another id there is
        // an error, not id 4's record.
        let t = Logged::open(&db, KEYED, LOG).unwrap();
        let tx = db.begin_write().unwrap();
        tx.open_table(LOG).unwrap().insert(0, &[4u8; 20][..]).unwrap();
        tx.commit().unwrap();
        let e = t.get(&db, &[3; 16], |r| r.to_vec()).unwrap_err().to_string();
        assert!(e.contains("another id"), "{e}");
    }
}

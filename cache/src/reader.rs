//! The machine tier's read connection, with a read snapshot that lookups share for at
//! most [`SNAPSHOT_FOR`].
//!
//! In WAL mode every read transaction takes and drops a shared lock on the database
//! file and a read mark in its `-shm` file (`fcntl` calls): half of a lookup's cost at a
//! noop run's rate (docs/src/performance.md). Lookups that come within [`SNAPSHOT_FOR`]
//! of the transaction's start run in it instead of in one each. What they cannot see is
//! what other processes committed in those milliseconds, which the writers' own group
//! wait (100 ms) already delays more. A caller that must see the latest commit (a lookup
//! right after taking a job's claim) asks for a fresh snapshot.
//!
//! A snapshot is never held longer than [`SNAPSHOT_FOR`] plus one tick of the closer
//! thread, which ends it when lookups stop: an open read transaction keeps the writers
//! of every process from checkpointing the write-ahead log past it.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rusqlite::Connection;

/// How long lookups share one read snapshot.
pub(crate) const SNAPSHOT_FOR: Duration = Duration::from_millis(2);

pub(crate) struct Reader {
    conn: Connection,
    /// When the open read transaction began; `None`: none is open.
    since: Option<Instant>,
    /// The cache was dropped (or could not be opened): the closer thread ends.
    stop: bool,
}

impl Reader {
    /// Be inside a read transaction that began at most [`SNAPSHOT_FOR`] ago (a new one
    /// if `fresh`); then read with [`Reader::conn`]. True when a transaction began (tell
    /// the closer: [`Shared::opened`]).
    pub(crate) fn snapshot(&mut self, fresh: bool) -> rusqlite::Result<bool> {
        let now = Instant::now();
        if self.since.is_some_and(|s| fresh || now.duration_since(s) >= SNAPSHOT_FOR) {
            self.end();
        }
        if self.since.is_some() {
            return Ok(false);
        }
        // A transaction whose end failed before is ended first: BEGIN inside it would fail.
        self.end();
        self.conn.execute_batch("BEGIN DEFERRED")?;
        self.since = Some(now);
        Ok(true)
    }

    pub(crate) fn conn(&self) -> &Connection {
        &self.conn
    }

    /// The connection outside any transaction (statistics, exports, checks: they see
    /// the latest commit).
    pub(crate) fn latest(&mut self) -> &Connection {
        self.end();
        &self.conn
    }

    /// End the open read transaction, if any (also after a failed read in it, or a
    /// failed end before).
    pub(crate) fn end(&mut self) {
        self.since = None;
        if !self.conn.is_autocommit() {
            // A read transaction has nothing to commit; if even that fails the
            // connection rolls it back.
            if self.conn.execute_batch("COMMIT").is_err() {
                let _ = self.conn.execute_batch("ROLLBACK");
            }
        }
    }
}

/// The read connection and the thread that ends an idle snapshot.
pub(crate) struct Shared {
    reader: Mutex<Reader>,
    opened: Condvar,
}

impl Shared {
    /// Own `conn` and start the closer thread.
    pub(crate) fn start(conn: Connection) -> std::io::Result<Arc<Shared>> {
        let shared = Arc::new(Shared {
            reader: Mutex::new(Reader { conn, since: None, stop: false }),
            opened: Condvar::new(),
        });
        let s = shared.clone();
        std::thread::Builder::new()
            .name("halyard-cache-reader".into())
            .spawn(move || s.close_idle())?;
        Ok(shared)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Reader> {
        self.reader.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Tell the closer a snapshot may be open (after [`Reader::snapshot`]).
    pub(crate) fn opened(&self) {
        self.opened.notify_one();
    }

    /// End the snapshot and stop the closer thread.
    pub(crate) fn stop(&self) {
        let mut r = self.lock();
        r.end();
        r.stop = true;
        drop(r);
        self.opened.notify_one();
    }

    /// The closer: while a snapshot is open, end it once it is [`SNAPSHOT_FOR`] old;
    /// while none is, wait to be told.
    fn close_idle(&self) {
        let mut r = self.lock();
        loop {
            if r.stop {
                return;
            }
            match r.since {
                None => r = self.opened.wait(r).unwrap_or_else(|p| p.into_inner()),
                Some(since) => {
                    let age = since.elapsed();
                    if age >= SNAPSHOT_FOR {
                        r.end();
                    } else {
                        let wait = SNAPSHOT_FOR - age;
                        r = self
                            .opened
                            .wait_timeout(r, wait)
                            .map(|(g, _)| g)
                            .unwrap_or_else(|p| p.into_inner().0);
                    }
                }
            }
        }
    }
}

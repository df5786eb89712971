//! Claims: which process of the machine is calling a job right now, so that two runs
//! sharing jobs pay for each once, even when both come to it at the same moment.
//!
//! - **Where**: `claims.sqlite` ([`FILE`]) beside the entries, a file of its own: a claim
//!   is one short transaction on the job's path, and must not wait behind the entries
//!   writer's large commits. `synchronous = OFF`: a claim lost in a power cut costs at
//!   most a call paid twice, never an answer.
//! - **A claim** names its holder (a random id per open cache, so per process) and the
//!   holder's process ([`Process`]: pid namespace, pid and start time), and expires
//!   [`LEASE`] after it was taken or last renewed. The holder renews all it holds every
//!   [`RENEW_EVERY`] from a thread of its own, so a claim outlives a slow call but not a
//!   process killed with SIGKILL (the others take the job over within [`LEASE`]).
//! - **Taking** ([`Claims::take`]): in one `BEGIN IMMEDIATE` transaction, a job with no
//!   claim, an expired one, one of this holder's or one whose process is gone becomes
//!   this holder's; a live claim of another holder is [`Taken::Held`]. A process is gone
//!   when it is in this process's pid namespace and `/proc` has no process of its pid
//!   started at its start time: a worker restarted after SIGKILL takes its own jobs back
//!   at once instead of waiting out the lease. A holder in another pid namespace (another
//!   container sharing the cache directory, or a container started again) cannot be
//!   looked at: its claims live their lease.
//! - **Giving back**: after the holder's answer is committed to the entries (so that a
//!   process that finds the claim gone finds the answer), or when its call ends without
//!   one ([`Claims::release`]).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use halyard_proto::JobId;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};

use crate::rows::{h, now_s};
use crate::CacheError;

/// The claims file in the cache directory.
pub const FILE: &str = "claims.sqlite";
/// How long a claim lives without being renewed.
pub const LEASE: Duration = Duration::from_secs(30);
/// How often a holder renews its claims.
pub const RENEW_EVERY: Duration = Duration::from_secs(10);
/// How long taking a claim waits for another process's claim transaction; past it the
/// job is called unclaimed (as without claims).
const BUSY: Duration = Duration::from_secs(2);
/// Claims expired this long ago (their holder died) are deleted when renewing.
const FORGET_AFTER: u64 = 3600;

/// What [`Claims::take`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    /// The job is this holder's to call.
    Mine,
    /// Another process is calling it, since `for_s` seconds.
    Held { for_s: u64 },
}

pub(crate) struct Claims {
    dir: PathBuf,
    conn: Mutex<Connection>,
    holder: [u8; 16],
    /// This process, as its claims name it.
    process: Option<Process>,
    /// The jobs this holder claimed and has not given back.
    held: Arc<Mutex<HashSet<JobId>>>,
    stop: Arc<AtomicBool>,
    renewer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

fn connect(dir: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        dir.join(FILE),
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY)?;
    let _: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    conn.pragma_update(None, "synchronous", "OFF")?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS claims (
            h INTEGER PRIMARY KEY,
            id BLOB NOT NULL,
            holder BLOB NOT NULL,
            taken INTEGER NOT NULL,
            until INTEGER NOT NULL,
            proc TEXT
        );",
    )?;
    // A claims file of stop 59's Halyard: the holder's process was not recorded (its
    // claims live their lease). Adding a nullable column keeps the rows.
    let has_proc =
        conn.prepare("SELECT 1 FROM pragma_table_info('claims') WHERE name = 'proc'")?.exists([])?;
    if !has_proc {
        match conn.execute_batch("ALTER TABLE claims ADD COLUMN proc TEXT") {
            Ok(()) => {}
            // Another process added it first.
            Err(e) if e.to_string().contains("duplicate column") => {}
            Err(e) => return Err(e),
        }
    }
    Ok(conn)
}

/// A process as a claim names it: `<pid namespace> <pid> <start time>` (the start time
/// in clock ticks since boot, `/proc/<pid>/stat` field 22, so that a pid reused by a
/// later process is not taken for the holder). `None` where `/proc` cannot tell
/// (not Linux).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Process {
    pub(crate) ns: String,
    pub(crate) pid: u32,
    pub(crate) started: u64,
}

impl Process {
    pub(crate) fn this() -> Option<Process> {
        let ns = std::fs::read_link("/proc/self/ns/pid").ok()?.to_string_lossy().into_owned();
        let pid = std::process::id();
        Some(Process { ns, pid, started: start_time(pid)? })
    }

    fn parse(s: &str) -> Option<Process> {
        let mut parts = s.rsplitn(3, ' ');
        let started = parts.next()?.parse().ok()?;
        let pid = parts.next()?.parse().ok()?;
        Some(Process { ns: parts.next()?.to_string(), pid, started })
    }

    pub(crate) fn to_column(&self) -> String {
        format!("{} {} {}", self.ns, self.pid, self.started)
    }

    /// Whether the process named `column` is known to be gone, as seen from `me`: only
    /// a process of `me`'s pid namespace can be looked up.
    fn gone(column: Option<&str>, me: Option<&Process>) -> bool {
        let (Some(column), Some(me)) = (column, me) else { return false };
        let Some(p) = Process::parse(column) else { return false };
        p.ns == me.ns && start_time(p.pid) != Some(p.started)
    }
}

/// The start time of process `pid` (`/proc/<pid>/stat` field 22), `None` when there is
/// no such process. The command name (field 2) may hold spaces and parentheses: the
/// fields are counted after its last `)`.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    // Field 3 (state) is the first after the name: field 22 is the 20th.
    after.split_whitespace().nth(19)?.parse().ok()
}

fn err(dir: &Path, e: rusqlite::Error) -> CacheError {
    CacheError::Db { path: dir.join(FILE).display().to_string(), reason: e.to_string() }
}

impl Claims {
    pub(crate) fn open(dir: &Path) -> Result<Claims, CacheError> {
        let conn = connect(dir).map_err(|e| err(dir, e))?;
        let renew_conn = connect(dir).map_err(|e| err(dir, e))?;
        let holder = *uuid::Uuid::now_v7().as_bytes();
        let held: Arc<Mutex<HashSet<JobId>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (h2, s2, d2) = (held.clone(), stop.clone(), dir.to_path_buf());
        let renewer = std::thread::Builder::new()
            .name("halyard-cache-claims".into())
            .spawn(move || renew_loop(&d2, renew_conn, holder, &h2, &s2))
            .map_err(|e| CacheError::Db {
                path: dir.join(FILE).display().to_string(),
                reason: format!("cannot start the claims' renewing thread: {e}"),
            })?;
        Ok(Claims {
            dir: dir.to_path_buf(),
            conn: Mutex::new(conn),
            holder,
            process: Process::this(),
            held,
            stop,
            renewer: Mutex::new(Some(renewer)),
        })
    }

    /// Claim `id` for this holder, unless another holder's claim on it is live.
    pub(crate) fn take(&self, id: &JobId) -> Result<Taken, CacheError> {
        let now = now_s() as i64;
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let e = |e| err(&self.dir, e);
        let tx =
            conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(e)?;
        type Row = (Vec<u8>, Vec<u8>, i64, i64, Option<String>);
        let found: Option<Row> = tx
            .query_row(
                "SELECT id, holder, taken, until, proc FROM claims WHERE h = ?1",
                params![h(id)],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
            )
            .optional()
            .map_err(e)?;
        if let Some((claimed, holder, taken, until, process)) = found {
            // The same index key for another id: a job never claimed (called unclaimed).
            let live = until >= now
                && holder != self.holder
                && !Process::gone(process.as_deref(), self.process.as_ref());
            if live && claimed == id.as_bytes() {
                return Ok(Taken::Held { for_s: (now - taken).max(0) as u64 });
            }
            if live {
                return Ok(Taken::Mine);
            }
        }
        tx.execute(
            "INSERT OR REPLACE INTO claims (h, id, holder, taken, until, proc)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                h(id),
                &id.as_bytes()[..],
                &self.holder[..],
                now,
                now + LEASE.as_secs() as i64,
                self.process.as_ref().map(Process::to_column)
            ],
        )
        .map_err(e)?;
        tx.commit().map_err(e)?;
        self.held.lock().unwrap_or_else(|p| p.into_inner()).insert(*id);
        Ok(Taken::Mine)
    }

    /// Whether this holder holds `id` (and stops counting it as held).
    pub(crate) fn forget(&self, id: &JobId) -> bool {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).remove(id)
    }

    /// Give back this holder's claims on `ids` (already forgotten).
    pub(crate) fn release(&self, ids: &[JobId]) -> Result<(), CacheError> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let e = |e| err(&self.dir, e);
        let tx =
            conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(e)?;
        {
            let mut st =
                tx.prepare_cached("DELETE FROM claims WHERE h = ?1 AND holder = ?2").map_err(e)?;
            for id in ids {
                st.execute(params![h(id), &self.holder[..]]).map_err(e)?;
            }
        }
        tx.commit().map_err(e)
    }

    /// Stop renewing and give back every claim still held.
    pub(crate) fn close(&self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.renewer.lock().unwrap_or_else(|p| p.into_inner()).take() {
            t.thread().unpark();
            let _ = t.join();
        }
        let ids: Vec<JobId> = self.held.lock().unwrap_or_else(|p| p.into_inner()).drain().collect();
        if let Err(e) = self.release(&ids) {
            tracing::warn!(error = %e, "could not give back the result cache's claims; they expire by themselves");
        }
    }
}

impl Drop for Claims {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.renewer.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            t.thread().unpark();
        }
    }
}

fn renew_loop(
    dir: &Path,
    conn: Connection,
    holder: [u8; 16],
    held: &Mutex<HashSet<JobId>>,
    stop: &AtomicBool,
) {
    let mut warned = false;
    loop {
        // Woken early by `close` (unpark), which sets `stop` first.
        std::thread::park_timeout(RENEW_EVERY);
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let now = now_s() as i64;
        let any = !held.lock().unwrap_or_else(|p| p.into_inner()).is_empty();
        let renewed = (|| -> rusqlite::Result<()> {
            if any {
                conn.execute(
                    "UPDATE claims SET until = ?2 WHERE holder = ?1",
                    params![&holder[..], now + LEASE.as_secs() as i64],
                )?;
            }
            conn.execute(
                "DELETE FROM claims WHERE until < ?1",
                params![now - FORGET_AFTER as i64],
            )?;
            Ok(())
        })();
        if let Err(e) = renewed {
            if !std::mem::replace(&mut warned, true) {
                tracing::warn!(path = %dir.join(FILE).display(), error = %e, "could not renew the result cache's claims: other runs may call these jobs too (said once)");
            }
        }
    }
}

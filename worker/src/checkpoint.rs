//! The worker's checkpoint: every completed call, keyed by job id, in the keyspace
//! `completions` of one database ([`halyard_store`]), each in the compact form of
//! [`halyard_proto::stored`].
//!
//! Reads go straight to the store. Writes go through a small actor that does **group
//! commit**: it takes every write waiting in its channel and commits them in one write
//! batch made durable at once (one fsync of the journal), and only then answers each
//! writer. A writer therefore learns "durable" only after an fsync that covers its
//! record, and N results arriving together cost one fsync instead of N. Under load (the
//! previous group was not small) it waits up to a millisecond for more writes before
//! committing: an fsync costs about as much as a hundred writes, so a few larger groups
//! beat many small ones; at low load nobody waits.
//!
//! Lookups of jobs never seen skip the store: a [`JobIdFilter`] holds every stored id
//! (filled from the store in the background after opening, and on every write before it
//! is committed); until the background pass is done, every lookup goes to the store.

use std::path::Path;

use halyard_proto::{Completion, JobId, JobIdFilter};
use halyard_store::fjall::{self, Keyspace};
use halyard_store::Store;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("cannot open checkpoint store {path}: {reason}")]
    Open { path: String, reason: String },
    #[error("checkpoint store write failed: {0}")]
    Write(String),
    #[error("checkpoint store read failed: {0}")]
    Read(String),
    #[error("checkpoint record for job {job} is corrupt: {reason}")]
    Corrupt { job: JobId, reason: String },
    #[error("checkpoint actor has stopped")]
    Stopped,
}

type WriteReq = (JobId, Vec<u8>, oneshot::Sender<Result<(), CheckpointError>>);

/// Handle to the checkpoint store; cheap to clone.
#[derive(Clone)]
pub struct Checkpoint {
    store: Arc<Store>,
    table: Keyspace,
    tx: mpsc::Sender<WriteReq>,
    writer: Arc<std::sync::Mutex<Option<JoinHandle<()>>>>,
    known: Arc<Known>,
}

/// The ids in the store, as far as a lookup needs to know.
struct Known {
    filter: JobIdFilter,
    /// True once every id stored before opening is in `filter`.
    complete: AtomicBool,
    /// Asks the background pass to stop early (on close).
    stop: AtomicBool,
    pass: std::sync::Mutex<Option<JoinHandle<()>>>,
}

const COMPLETIONS: &str = "completions";
/// Memory of the checkpoint: block cache and memtable.
pub const OPTIONS: halyard_store::Options =
    halyard_store::Options { cache_bytes: 16 << 20, memtable_bytes: 8 << 20 };
/// Largest number of writes committed by one flush.
const MAX_GROUP: usize = 1024;
/// A group that follows one of at least LINGER_AFTER writes waits up to LINGER for more.
const LINGER_AFTER: usize = 16;
const LINGER: std::time::Duration = std::time::Duration::from_millis(1);

fn read_err(e: fjall::Error) -> CheckpointError {
    CheckpointError::Read(e.to_string())
}

impl Checkpoint {
    /// Open (or create) the store in `dir` and start its writer actor.
    pub fn open(dir: &Path) -> Result<Checkpoint, CheckpointError> {
        let open_err = |e: halyard_store::StoreError| CheckpointError::Open {
            path: dir.display().to_string(),
            reason: e.to_string(),
        };
        let store = halyard_store::open(dir, OPTIONS, &[COMPLETIONS]).map_err(open_err)?;
        let table = store.keyspace(COMPLETIONS).map_err(open_err)?;
        Ok(Self::from_store(store, table))
    }

    fn from_store(store: Store, table: Keyspace) -> Checkpoint {
        let store = Arc::new(store);
        let (tx, rx) = mpsc::channel(4096);
        let writer = tokio::spawn(Writer { store: store.clone(), table: table.clone(), rx }.run());
        let known = Arc::new(Known {
            filter: JobIdFilter::new(),
            complete: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            pass: std::sync::Mutex::new(None),
        });
        let (k, t) = (known.clone(), table.clone());
        let pass = tokio::task::spawn_blocking(move || {
            for kv in halyard_store::records(&t) {
                if k.stop.load(Ordering::Relaxed) {
                    return;
                }
                match kv.key() {
                    Ok(key) => match JobId::from_slice(&key) {
                        Some(id) => k.filter.insert(&id),
                        // Unreadable: leave the filter incomplete, so lookups keep going
                        // to the store.
                        None => return,
                    },
                    Err(e) => {
                        tracing::warn!(error = %e, "checkpoint: reading the stored ids failed; lookups go to the store");
                        return;
                    }
                }
            }
            k.complete.store(true, Ordering::Release);
        });
        *known.pass.lock().unwrap_or_else(|p| p.into_inner()) = Some(pass);
        Checkpoint {
            store,
            table,
            tx,
            writer: Arc::new(std::sync::Mutex::new(Some(writer))),
            known,
        }
    }

    /// The stored completion for `job`, if any.
    pub fn get(&self, job: &JobId) -> Result<Option<Completion>, CheckpointError> {
        if self.known.complete.load(Ordering::Acquire) && !self.known.filter.may_contain(job) {
            return Ok(None);
        }
        let Some(bytes) = self.table.get(job.as_bytes()).map_err(read_err)? else {
            return Ok(None);
        };
        halyard_proto::stored::decode_completion(&bytes)
            .map(Some)
            .map_err(|e| CheckpointError::Corrupt { job: *job, reason: e.to_string() })
    }

    /// Store `completion` and return once it is flushed to disk.
    pub async fn put(&self, job: JobId, completion: &Completion) -> Result<(), CheckpointError> {
        let bytes = halyard_proto::stored::encode_completion(completion)
            .map_err(|e| CheckpointError::Write(e.to_string()))?;
        self.known.filter.insert(&job);
        let (tx, rx) = oneshot::channel();
        self.tx.send((job, bytes, tx)).await.map_err(|_| CheckpointError::Stopped)?;
        rx.await.map_err(|_| CheckpointError::Stopped)?
    }

    /// Flush and release the store (its file lock included), so that another process or
    /// worker can open it at once. Waits until every other clone of this handle is gone.
    pub async fn close(self) {
        let writer = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
        // The filter pass holds the store too: stop it so the store's lock is released now.
        self.known.stop.store(true, Ordering::Relaxed);
        let pass = self.known.pass.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(self.tx);
        drop(self.table);
        drop(self.store);
        if let Some(p) = pass {
            let _ = p.await;
        }
        if let Some(w) = writer {
            let _ = w.await;
        }
    }

    /// [`Checkpoint::close`], then compact the store as it closes
    /// ([`halyard_store::Store::compact`], through this handle: no journal replayed), for
    /// a checkpoint whose work is done (`halyard run`, its run complete). Said in the
    /// log; a failure leaves the store whole for `halyard gc`.
    pub async fn close_compacted(self) {
        let store = self.store.clone();
        self.close().await;
        let done = tokio::task::spawn_blocking(move || {
            Store::finish_compaction(store, "checkpoint", None)
        });
        if let Err(e) = done.await {
            tracing::warn!(error = %e, "compacting the checkpoint failed; `halyard gc` compacts it later");
        }
    }

    /// Records stored (0 if the store cannot be read).
    pub fn len(&self) -> usize {
        halyard_store::count(&self.table).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

struct Writer {
    store: Arc<Store>,
    table: Keyspace,
    rx: mpsc::Receiver<WriteReq>,
}

/// Commit `records` in one write batch, durable when this returns. A job written twice
/// in a group keeps its last record (a batch writes each key once).
fn commit_group(
    store: &Store,
    table: &Keyspace,
    records: Vec<(JobId, Vec<u8>)>,
) -> Result<(), fjall::Error> {
    let mut last = std::collections::HashMap::with_capacity(records.len());
    for (job, bytes) in records {
        last.insert(job, bytes);
    }
    // Durable, and the store's high-water mark moved past it (`Store::commit_durable`).
    let mut batch = store.db().batch();
    for (job, bytes) in last {
        batch.insert(table, job.as_bytes(), bytes);
    }
    store.commit_durable(batch)
}

impl Writer {
    async fn run(mut self) {
        let mut group: Vec<WriteReq> = Vec::with_capacity(64);
        let (mut writes, mut flushes) = (0u64, 0u64);
        let mut last_group = 0;
        while let Some(first) = self.rx.recv().await {
            group.push(first);
            while group.len() < MAX_GROUP {
                match self.rx.try_recv() {
                    Ok(w) => group.push(w),
                    Err(_) => break,
                }
            }
            // Under load (the last group was not small), wait a moment for more writes:
            // one fsync then covers many more of them. At low load nobody waits.
            if group.len() < MAX_GROUP && last_group >= LINGER_AFTER {
                let deadline = tokio::time::Instant::now() + LINGER;
                while group.len() < MAX_GROUP {
                    tokio::select! {
                        w = self.rx.recv() => match w {
                            Some(w) => group.push(w),
                            None => break,
                        },
                        _ = tokio::time::sleep_until(deadline) => break,
                    }
                }
            }
            last_group = group.len();
            let mut records = Vec::with_capacity(group.len());
            let mut replies = Vec::with_capacity(group.len());
            for (job, bytes, reply) in group.drain(..) {
                records.push((job, bytes));
                replies.push(reply);
            }
            writes += records.len() as u64;
            flushes += 1;
            let (store, table) = (self.store.clone(), self.table.clone());
            // The commit blocks on its fsync: off the async threads.
            let res = tokio::task::spawn_blocking(move || commit_group(&store, &table, records))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string()));
            for reply in replies {
                // A dropped receiver means the caller gave up; nothing to do.
                let _ = reply.send(res.clone().map_err(CheckpointError::Write));
            }
        }
        tracing::info!(writes, flushes, "checkpoint closed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use halyard_proto::Usage;

    fn completion(text: &str) -> Completion {
        Completion {
            text: text.into(),
            usage: Usage { prompt_tokens: 3, completion_tokens: 1, cache: None },
            latency_ms: 5,
            finish_reason: None,
            calls: 1,
            logprobs: None,
            refusal: false,
            source: Default::default(),
        }
    }

    /// A put is readable after it returns, and survives closing and reopening the store.
    #[tokio::test]
    async fn put_is_durable_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let id = JobId([7; 16]);
        let cp = Checkpoint::open(dir.path()).unwrap();
        assert_eq!(cp.get(&id).unwrap(), None);
        cp.put(id, &completion("hello")).await.unwrap();
        assert_eq!(cp.get(&id).unwrap().unwrap().text, "hello");
        // While open, the store is locked against a second opener.
        assert!(Checkpoint::open(dir.path()).is_err());
        cp.close().await;
        let cp = Checkpoint::open(dir.path()).expect("store reopens at once after close");
        assert_eq!(cp.get(&id).unwrap().unwrap().text, "hello");
    }

    /// Many concurrent writers are all committed (group commit loses none).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_puts_all_commit() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(dir.path()).unwrap();
        let mut tasks = vec![];
        for i in 0..500u16 {
            let cp = cp.clone();
            tasks.push(tokio::spawn(async move {
                let mut id = [0u8; 16];
                id[..2].copy_from_slice(&i.to_be_bytes());
                cp.put(JobId(id), &completion(&i.to_string())).await.unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(cp.len(), 500);
    }

    /// Ids stored before opening are found once the filter pass is done, and ids never
    /// stored are answered without the store.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lookups_find_old_and_new_records() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(dir.path()).unwrap();
        for i in 0..100u8 {
            cp.put(JobId([i; 16]), &completion(&i.to_string())).await.unwrap();
        }
        cp.close().await;
        let cp = Checkpoint::open(dir.path()).unwrap();
        while !cp.known.complete.load(Ordering::Acquire) {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        for i in 0..100u8 {
            assert_eq!(cp.get(&JobId([i; 16])).unwrap().unwrap().text, i.to_string());
        }
        assert_eq!(cp.get(&JobId([200; 16])).unwrap(), None);
        cp.put(JobId([200; 16]), &completion("new")).await.unwrap();
        assert_eq!(cp.get(&JobId([200; 16])).unwrap().unwrap().text, "new");
        cp.close().await;
    }

    /// A checkpoint written by an earlier build (sled, completions with named fields)
    /// answers its jobs after the upgrade: no call is paid again.
    #[tokio::test]
    async fn a_sled_checkpoint_of_an_earlier_build_answers() {
        let dir = tempfile::tempdir().unwrap();
        let id = JobId([9; 16]);
        {
            let old = sled::open(dir.path()).unwrap();
            let named = halyard_proto::encode(&completion("paid before")).unwrap();
            old.open_tree("completions").unwrap().insert(id.as_bytes(), named).unwrap();
            old.flush().unwrap();
        }
        let cp = Checkpoint::open(dir.path()).unwrap();
        assert_eq!(cp.get(&id).unwrap().unwrap().text, "paid before");
        assert_eq!(cp.len(), 1);
        cp.close().await;
    }

    /// A corrupt record is reported with the job id, not a panic.
    #[tokio::test]
    async fn corrupt_record_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(dir.path()).unwrap();
        let id = JobId([1; 16]);
        commit_group(&cp.store, &cp.table, vec![(id, b"\xc1garbage".to_vec())]).unwrap();
        // As the opening pass does for a record already on disk.
        cp.known.filter.insert(&id);
        let err = cp.get(&id).unwrap_err();
        assert!(err.to_string().contains(&id.to_string()), "{err}");
    }
}

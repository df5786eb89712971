//! The worker's checkpoint: every completed call, keyed by job id, in sled.
//!
//! Reads go straight to the tree (sled is safe to share). Writes go through a small actor
//! that does **group commit**: it takes every write waiting in its channel, inserts them
//! in one batch, calls `flush_async` once, and only then answers each writer. A writer
//! therefore learns "durable" only after an fsync that covers its record, and N results
//! arriving together cost one flush instead of N.

use std::path::Path;

use halyard_proto::{Completion, JobId};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("cannot open checkpoint store {path}: {reason}")]
    Open { path: String, reason: String },
    #[error("checkpoint store write failed: {0}")]
    Write(String),
    #[error("checkpoint record for job {job} is corrupt: {reason}")]
    Corrupt { job: JobId, reason: String },
    #[error("checkpoint actor has stopped")]
    Stopped,
}

type WriteReq = (JobId, Vec<u8>, oneshot::Sender<Result<(), CheckpointError>>);

/// Handle to the checkpoint store; cheap to clone.
#[derive(Clone)]
pub struct Checkpoint {
    tree: sled::Tree,
    tx: mpsc::Sender<WriteReq>,
    writer: Arc<std::sync::Mutex<Option<JoinHandle<()>>>>,
}

/// Largest number of writes committed by one flush.
const MAX_GROUP: usize = 1024;

impl Checkpoint {
    /// Open (or create) the store in `dir` and start its writer actor.
    pub fn open(dir: &Path) -> Result<Checkpoint, CheckpointError> {
        let err = |e: &dyn std::fmt::Display| CheckpointError::Open { path: dir.display().to_string(), reason: e.to_string() };
        std::fs::create_dir_all(dir).map_err(|e| err(&e))?;
        let db = sled::Config::new().path(dir).mode(sled::Mode::HighThroughput).open().map_err(|e| err(&e))?;
        Self::from_db(db).map_err(|e| err(&e))
    }

    /// A store that lives in memory only (tests).
    pub fn temporary() -> Result<Checkpoint, CheckpointError> {
        let db = sled::Config::new().temporary(true).open().map_err(|e| CheckpointError::Open {
            path: "<temporary>".into(),
            reason: e.to_string(),
        })?;
        Self::from_db(db).map_err(|e| CheckpointError::Open { path: "<temporary>".into(), reason: e.to_string() })
    }

    fn from_db(db: sled::Db) -> Result<Checkpoint, sled::Error> {
        let tree = db.open_tree("completions")?;
        let (tx, rx) = mpsc::channel(4096);
        let writer = tokio::spawn(Writer { db, tree: tree.clone(), rx }.run());
        Ok(Checkpoint { tree, tx, writer: Arc::new(std::sync::Mutex::new(Some(writer))) })
    }

    /// The stored completion for `job`, if any.
    pub fn get(&self, job: &JobId) -> Result<Option<Completion>, CheckpointError> {
        let Some(bytes) = self.tree.get(job.as_bytes()).map_err(|e| CheckpointError::Write(e.to_string()))? else {
            return Ok(None);
        };
        halyard_proto::decode::<Completion>("checkpoint record", &bytes)
            .map(Some)
            .map_err(|e| CheckpointError::Corrupt { job: *job, reason: e.to_string() })
    }

    /// Store `completion` and return once it is flushed to disk.
    pub async fn put(&self, job: JobId, completion: &Completion) -> Result<(), CheckpointError> {
        let bytes = halyard_proto::encode(completion).map_err(|e| CheckpointError::Write(e.to_string()))?;
        let (tx, rx) = oneshot::channel();
        self.tx.send((job, bytes, tx)).await.map_err(|_| CheckpointError::Stopped)?;
        rx.await.map_err(|_| CheckpointError::Stopped)?
    }

    /// Flush and release the store (its file lock included), so that another process or
    /// worker can open it at once. Waits until every other clone of this handle is gone.
    pub async fn close(self) {
        let writer = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(self.tx);
        drop(self.tree);
        if let Some(w) = writer {
            let _ = w.await;
        }
    }

    pub fn len(&self) -> usize {
        self.tree.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tree.is_empty()
    }
}

struct Writer {
    db: sled::Db,
    tree: sled::Tree,
    rx: mpsc::Receiver<WriteReq>,
}

impl Writer {
    async fn run(mut self) {
        let mut group: Vec<WriteReq> = Vec::with_capacity(64);
        while let Some(first) = self.rx.recv().await {
            group.push(first);
            while group.len() < MAX_GROUP {
                match self.rx.try_recv() {
                    Ok(w) => group.push(w),
                    Err(_) => break,
                }
            }
            let mut batch = sled::Batch::default();
            for (job, bytes, _) in &group {
                batch.insert(job.as_bytes().as_slice(), bytes.as_slice());
            }
            let res = match self.tree.apply_batch(batch) {
                Ok(()) => self.db.flush_async().await.map(|_| ()).map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            for (_, _, reply) in group.drain(..) {
                // A dropped receiver means the caller gave up; nothing to do.
                let _ = reply.send(res.clone().map_err(CheckpointError::Write));
            }
        }
        // All handles dropped: make sure everything is on disk before the db closes.
        let _ = self.db.flush_async().await;
        drop(self.tree);
        drop(self.db);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use halyard_proto::Usage;

    fn completion(text: &str) -> Completion {
        Completion { text: text.into(), usage: Usage { prompt_tokens: 3, completion_tokens: 1 }, latency_ms: 5, finish_reason: None, calls: 1 }
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
        let cp = Checkpoint::temporary().unwrap();
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

    /// A corrupt record is reported with the job id, not a panic.
    #[tokio::test]
    async fn corrupt_record_is_an_error() {
        let cp = Checkpoint::temporary().unwrap();
        let id = JobId([1; 16]);
        cp.tree.insert(id.as_bytes(), &b"\xc1garbage"[..]).unwrap();
        let err = cp.get(&id).unwrap_err();
        assert!(err.to_string().contains(&id.to_string()), "{err}");
    }
}

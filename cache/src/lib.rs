//! Halyard's result cache: a paid completion answers the same job again in any run,
//! sweep or process, instead of a second call.
//!
//! # Keys
//!
//! An entry is keyed by the job's content id ([`halyard_proto::JobKey::id`]): pipeline,
//! stage and stage version, model identity (backend, endpoint, model name), the full
//! messages, the sampling parameters and the sample index. A sampled call (temperature
//! above zero) is therefore keyed by its sample index: sample 3 of a job is the same
//! answer in every run that asks for sample 3. A model with `cache = "off"` draws fresh
//! samples.
//!
//! # Tiers
//!
//! - **Machine** ([`machine::MachineCache`]): one SQLite file in WAL mode in the user's
//!   cache directory (`--cache DIR`, `HALYARD_CACHE`), read and written by every process
//!   of the machine at once. Every read checks the row: its stored job key must hash to
//!   its id.
//! - **Shared** ([`shared`]): a JetStream KV bucket of the broker account, written only
//!   by the coordinator role (with the results it accepted for jobs it planned) and read
//!   by workers; every value carries its job key and is refused unless the key hashes to
//!   the entry's name.
//!
//! # Layered on the checkpoint
//!
//! The checkpoint and the cache are two layers, not one mechanism. The checkpoint is the
//! run's own durable record (fsync before the ack, one process, never pruned): it is what
//! makes a kill -9 cost nothing. The cache is shared, best-effort and prunable: it is
//! consulted when the checkpoint has no answer, and what it answers is written to the
//! checkpoint like a call's result, so a run never depends on an entry staying in the
//! cache (a prune cannot take back what a run has read). A worker writes to the machine
//! tier what it paid for itself, after its checkpoint holds it.
//!
//! # Policy
//!
//! Per model ([`Policy`]): `read-write` (default), `read`, `write`, `off`.

pub mod claims;
pub mod exchange;
pub mod machine;
mod reader;
mod rows;
pub mod shared;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use halyard_proto::{Completion, JobId, JobKey};

pub use halyard_proto::CachePolicy as Policy;
pub use machine::{Limits, MachineCache, Pruned, Stats};

/// Environment variable naming the machine tier's directory (`off`: no machine tier).
pub const ENV: &str = "HALYARD_CACHE";

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("result cache {path}: {reason}")]
    Db { path: String, reason: String },
    #[error("result cache entry for job {job} is unusable: {reason}")]
    Corrupt { job: JobId, reason: String },
    #[error("cannot encode a result cache entry: {0}")]
    Encode(String),
    #[error("{path}: {reason}")]
    File { path: String, reason: String },
    #[error("shared result cache: {0}")]
    Broker(String),
}

/// `c` as an entry holds it: without the [`Completion::source`] of the run that wrote it
/// (a run that reads the entry says where it got it: [`Tier`]).
pub(crate) fn as_entry(c: &Completion) -> std::borrow::Cow<'_, Completion> {
    if c.source == halyard_proto::AnswerSource::Paid {
        std::borrow::Cow::Borrowed(c)
    } else {
        std::borrow::Cow::Owned(Completion {
            source: halyard_proto::AnswerSource::Paid,
            ..c.clone()
        })
    }
}

/// Where an answer came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    Machine,
    Shared,
}

/// What [`Cache::lookup`] found.
#[derive(Debug)]
pub enum Found {
    /// An answer, and the tier it came from.
    Answer(Completion, Tier),
    /// No answer: call the model, holding the job's claim if one was taken.
    Call(Option<ClaimGuard>),
    /// Another process of this machine has been calling the job for `for_s` seconds:
    /// come back for its answer later instead of paying for it too.
    Held { for_s: u64 },
}

/// A claim on a job this process calls ([`claims`]): given back when the answer is
/// remembered ([`Cache::remember`], once committed), else when dropped.
pub struct ClaimGuard {
    machine: Arc<MachineCache>,
    id: JobId,
}

impl std::fmt::Debug for ClaimGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClaimGuard({})", self.id)
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        self.machine.release(&self.id);
    }
}

/// The machine tier's directory: `flag` (`--cache DIR`), else `HALYARD_CACHE`, else
/// `<user cache dir>/halyard`. `None` when it is `off` or no cache directory is known.
pub fn machine_dir(flag: Option<&Path>) -> Option<PathBuf> {
    let chosen = match flag {
        Some(p) => Some(p.to_path_buf()),
        None => std::env::var_os(ENV).filter(|v| !v.is_empty()).map(PathBuf::from),
    };
    match chosen {
        Some(p) if p.as_os_str() == "off" => None,
        Some(p) => Some(p),
        None => dirs::cache_dir().map(|d| d.join("halyard")),
    }
}

/// Both tiers behind one interface, as a worker uses them. Cheap to clone.
#[derive(Clone, Default)]
pub struct Cache {
    machine: Option<Arc<MachineCache>>,
    shared: Option<shared::SharedReader>,
    broken_warned: Arc<AtomicBool>,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("machine", &self.machine.as_ref().map(|m| m.dir().display().to_string()))
            .field("shared", &self.shared.is_some())
            .finish()
    }
}

impl Cache {
    /// No tier: every lookup misses.
    pub fn off() -> Cache {
        Cache::default()
    }

    /// The machine tier in `dir`. A cache that cannot be opened is said once and left
    /// out: a run never fails for its cache.
    pub fn open_machine(dir: Option<&Path>, limits: Limits) -> Cache {
        let Some(dir) = dir else { return Cache::off() };
        match MachineCache::open(dir, limits) {
            Ok(m) => {
                tracing::info!(dir = %dir.display(), "result cache on this machine");
                Cache { machine: Some(Arc::new(m)), ..Cache::default() }
            }
            Err(e) => {
                tracing::warn!(error = %e, "the result cache on this machine cannot be used; every call is made as without a cache");
                Cache::off()
            }
        }
    }

    /// Add the shared tier (read side).
    pub fn with_shared(mut self, shared: shared::SharedReader) -> Cache {
        self.shared = Some(shared);
        self
    }

    pub fn machine(&self) -> Option<&Arc<MachineCache>> {
        self.machine.as_ref()
    }

    /// Whether any tier is open.
    pub fn is_on(&self) -> bool {
        self.machine.is_some() || self.shared.is_some()
    }

    /// The answer to `job`, machine tier first, then the shared tier, if `policy` reads.
    /// A shared answer is copied to the machine tier (if `policy` writes). Errors are
    /// misses (said once). On a miss of a `read-write` model that costs (not `noop` or
    /// `replay`), the job is claimed on the machine tier first ([`claims`]): when another
    /// process of the machine is calling it now, [`Found::Held`].
    pub async fn lookup(&self, job: &JobKey, id: &JobId, policy: Policy) -> Found {
        if !policy.reads() {
            return Found::Call(None);
        }
        if let Some(m) = &self.machine {
            match m.get(id) {
                Ok(Some(c)) => return Found::Answer(c, Tier::Machine),
                Ok(None) => {}
                Err(e) => self.warn_once(&e),
            }
        }
        if let Some(s) = &self.shared {
            match s.get(id).await {
                Ok(Some(c)) => {
                    if policy.writes() {
                        if let Some(m) = &self.machine {
                            m.put_as(job, *id, &c);
                        }
                    }
                    return Found::Answer(c, Tier::Shared);
                }
                Ok(None) => {}
                Err(e) => self.warn_once(&e),
            }
        }
        let claims = policy == Policy::ReadWrite
            && Policy::default_for(&job.model.backend) == Policy::ReadWrite;
        let (Some(m), true) = (&self.machine, claims) else { return Found::Call(None) };
        match m.claim(id) {
            Ok(claims::Taken::Held { for_s }) => Found::Held { for_s },
            Ok(claims::Taken::Mine) => {
                let guard = ClaimGuard { machine: m.clone(), id: *id };
                // The last holder may have committed its answer and given back its claim
                // between the read above and this claim.
                match m.get_latest(id) {
                    Ok(Some(c)) => Found::Answer(c, Tier::Machine),
                    _ => Found::Call(Some(guard)),
                }
            }
            Err(e) => {
                self.warn_once(&e);
                Found::Call(None)
            }
        }
    }

    /// Remember what this process paid for (machine tier), if `policy` writes. `id` is
    /// the job's id (`job.id()`).
    pub fn remember(&self, job: &JobKey, id: &JobId, completion: &Completion, policy: Policy) {
        if policy.writes() {
            if let Some(m) = &self.machine {
                m.put_as(job, *id, completion);
            }
        }
    }

    /// Commit what is queued and stop the machine tier's writer.
    pub async fn close(&self) {
        if let Some(m) = &self.machine {
            m.close().await;
        }
    }

    fn warn_once(&self, e: &CacheError) {
        if !self.broken_warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(error = %e, "result cache read failed; the job is called (said once)");
        }
    }
}

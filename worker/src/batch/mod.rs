//! Batch pools (`mode = "batch"`): jobs answered through the provider's batch API.
//!
//! A job of a batch pool runs through the same [`crate::lifecycle`] as any job: checkpoint
//! hit → publish → ack, otherwise "call" → persist → publish → ack. Only the call is
//! different: the job task hands its job to the pool's [`BatchPool`] and waits, keeping
//! its job message with in-progress acks, until the provider batch holding the job has
//! ended; then it takes its answer from the batch's output file and goes on as after an
//! online call. So the coordinator sees an in-flight job (never a stall, however long the
//! batch takes), the checkpoint and the results stream are written exactly as online,
//! and a crash anywhere costs what a crash costs online: a redelivery.
//!
//! What the provider holds is recorded in the batches bucket
//! ([`halyard_proto::provider_batch`]) **before** each provider step:
//!
//! 1. A job arriving is *claimed* (`j.<pool>.<job>` → record) by compare-and-set. A job
//!    already claimed by a live record is not gathered again: its task waits for that
//!    record. This is what stops a redelivered or re-published job from being submitted
//!    twice.
//! 2. The owner gathers up to `batch_size` jobs, or for `batch_wait_s`, in a record in
//!    state `gathering`; reserves the batch's tokens in the pool's ledger
//!    (`batch_queue_tokens`); records the job list (`uploading`); uploads the JSONL file
//!    (`custom_id` = job id); records the file (`uploaded`); creates the batch with the
//!    record's key in its metadata; records the batch (`submitted`); polls it; records
//!    its end (`ended`, with the output and error files) and frees its tokens.
//! 3. Every job task holding a job of the ended batch downloads the files (once per
//!    worker) and takes its answer: an answer is a completion; a failed request is a
//!    failure classified as online (permanent → dead letter; transient → another batch,
//!    the delivery counted); a request that never ran (expired, cancelled) goes into
//!    another batch with its delivery budget kept.
//!
//! The owner renews a lease on its records. A record whose lease lapsed is taken over by
//! any worker holding one of its jobs (after a crash the jobs are redelivered): a record
//! that was `gathering` or `uploading` is given up (nothing reached the provider but an
//! unused file) and its jobs gathered again; an `uploaded` one is looked up at the
//! provider by its metadata and created only if the provider has no batch for it; a
//! `submitted` one is polled on. No request is submitted twice.
//!
//! Every decision of the above is a transition of the pure state machines in [`machine`]
//! ([`machine::Join`] for a job's claim, [`machine::Gather`] for a record being gathered,
//! [`machine::Owner`] for a record owned, with the lease and fencing rules); this module
//! is their IO: it reads and writes the bucket, calls the provider (retrying the
//! endpoint's failures while renewing the lease), and wakes the job tasks waiting for a
//! record.

pub mod anthropic;
pub mod api;
pub(crate) mod machine;
pub mod output;
pub mod provider;
pub mod store;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, AckKind};
use halyard_broker::Broker;
use halyard_proto::pool::{BatchSpec, WorkerModel, WorkerPlan};
use halyard_proto::provider_batch::{BatchRecord, BatchState, Claim};
use halyard_proto::{Job, JobId};
use tokio::sync::{watch, OnceCell};
use tracing::{debug, info, warn};

use crate::backend::CallError;
use crate::failpoint::{Failpoints, Point};
pub(crate) use machine::BatchOutcome;
use machine::{
    Gather, GatherCommand, GatherEvent, Join, JoinCommand, JoinEvent, Limits, Owner, OwnerCommand,
    OwnerEvent, Settle,
};
use output::Answer;
use provider::{FindFor, Provider};
use store::{Store, StoreError};

/// Timing of batch pools; the defaults suit real providers, tests shorten them
/// (`HALYARD_BATCH_POLL_MS`, `HALYARD_BATCH_LEASE_MS`).
#[derive(Clone, Copy, Debug)]
pub struct BatchTiming {
    /// How often the owner asks the provider about a submitted batch.
    pub poll: Duration,
    /// How long a record stays its owner's without a renewal.
    pub lease: Duration,
}

impl Default for BatchTiming {
    fn default() -> Self {
        BatchTiming { poll: Duration::from_secs(30), lease: Duration::from_secs(120) }
    }
}

impl BatchTiming {
    /// The defaults, with the environment's overrides (milliseconds).
    pub fn from_env() -> Result<BatchTiming, String> {
        let mut t = BatchTiming::default();
        for (var, slot) in
            [("HALYARD_BATCH_POLL_MS", &mut t.poll), ("HALYARD_BATCH_LEASE_MS", &mut t.lease)]
        {
            if let Ok(v) = std::env::var(var) {
                let ms: u64 =
                    v.trim().parse().ok().filter(|ms| (10..=86_400_000).contains(ms)).ok_or_else(
                        || format!("{var}={v:?}: expected milliseconds in 10..=86400000"),
                    )?;
                *slot = Duration::from_millis(ms);
            }
        }
        Ok(t)
    }

    /// How often followers read the records they wait for.
    fn follow(&self) -> Duration {
        (self.lease / 8).clamp(Duration::from_millis(50), Duration::from_secs(5))
    }
}

/// The batch pools of a worker.
#[derive(Default)]
pub(crate) struct Batches {
    pools: HashMap<String, Arc<BatchPool>>,
}

impl Batches {
    /// A [`BatchPool`] for every pool of the plan in batch mode.
    pub async fn start(
        broker: &Broker,
        plan: &WorkerPlan,
        worker_id: &str,
        failpoints: Arc<Failpoints>,
        timing: BatchTiming,
        stop: watch::Receiver<bool>,
        hard_stop: watch::Receiver<bool>,
    ) -> Result<Batches, String> {
        let mut pools = HashMap::new();
        let batch_pools: Vec<_> = plan.pools.iter().filter(|p| p.batch.is_some()).collect();
        if batch_pools.is_empty() {
            return Ok(Batches { pools });
        }
        let store = Store::open(broker).await.map_err(|e| e.to_string())?;
        // An owner is this process, not the worker's name: a worker restarted under the
        // same name does not hold what its previous process gathered in memory.
        let owner = format!("{worker_id}/{}", uuid::Uuid::now_v7().simple());
        for p in batch_pools {
            let Some(spec) = p.batch else { continue };
            let mut apis = Vec::new();
            for m in &p.models {
                match m {
                    WorkerModel::Http(h) => {
                        apis.push(Provider::new(h.clone()).map_err(|e| e.message)?)
                    }
                    other => {
                        return Err(format!(
                            "pool {:?} is in batch mode, but its model of backend {:?} has no batch API",
                            p.pool.name,
                            other.backend()
                        ))
                    }
                }
            }
            let pool = Arc::new(BatchPool {
                name: p.pool.name.clone(),
                spec,
                owner: owner.clone(),
                store: store.clone(),
                apis,
                timing,
                failpoints: failpoints.clone(),
                gathering: tokio::sync::Mutex::new(HashMap::new()),
                sealed: tokio::sync::Mutex::new(Default::default()),
                follows: Mutex::new(HashMap::new()),
                answers: Mutex::new(HashMap::new()),
                download_failed: Mutex::new(HashMap::new()),
                owned: Mutex::new(HashSet::new()),
                stop: stop.clone(),
                hard_stop: hard_stop.clone(),
            });
            tokio::spawn(pool.clone().tend());
            info!(pool = %pool.name, batch_size = spec.batch_size, batch_wait_ms = spec.batch_wait_ms, queue_tokens = ?spec.queue_tokens, "batch pool ready");
            pools.insert(p.pool.name.clone(), pool);
        }
        Ok(Batches { pools })
    }

    pub fn pool(&self, name: &str) -> Option<&Arc<BatchPool>> {
        self.pools.get(name)
    }
}

/// Jobs being gathered into the next batch of one model: the record's machine, and the
/// request lines of its jobs (in the machine's job order).
struct Gathering {
    machine: Gather,
    /// Index into the pool's models.
    model: usize,
    started: Instant,
    lines: Vec<Vec<u8>>,
    /// Bytes of `lines` (each with its separator).
    bytes: u64,
}

/// An ended batch's answers, by job.
type Answers = Arc<HashMap<JobId, Answer>>;

/// A record as the job tasks waiting for it see it: with its jobs as a set (a record
/// holds up to 10,000, each task looks itself up at each change).
pub(crate) struct Seen {
    record: BatchRecord,
    jobs: HashSet<JobId>,
}

impl Seen {
    fn new(record: BatchRecord) -> Seen {
        let jobs = record.jobs.iter().filter_map(|j| j.parse().ok()).collect();
        Seen { record, jobs }
    }
}

/// A record some job task of this worker waits for.
struct Follow {
    tx: watch::Sender<Option<Arc<Seen>>>,
    waiters: usize,
    /// The revision last sent (0: none yet): an unchanged record wakes nobody.
    revision: u64,
}

/// One batch pool of this worker; see the module docs.
pub(crate) struct BatchPool {
    name: String,
    spec: BatchSpec,
    owner: String,
    store: Store,
    /// The pool's models, each with its provider's batch API.
    apis: Vec<Provider>,
    timing: BatchTiming,
    failpoints: Arc<Failpoints>,
    /// By model (index into `apis`).
    gathering: tokio::sync::Mutex<HashMap<usize, Gathering>>,
    /// Gathered batches waiting for room in `batch_queue_tokens`, oldest first.
    sealed: tokio::sync::Mutex<std::collections::VecDeque<Gathering>>,
    follows: Mutex<HashMap<String, Follow>>,
    /// Answers of ended records, downloaded once per worker.
    answers: Mutex<HashMap<String, Arc<OnceCell<Answers>>>>,
    /// The last failed download of a record, for [`DOWNLOAD_RETRY`].
    download_failed: Mutex<HashMap<String, (Instant, CallError)>>,
    /// Records this process owns (their state is pushed to followers as it is written).
    owned: Mutex<HashSet<String>>,
    /// The worker stops fetching: batches not yet submitted are given up at once, so
    /// that the workers that receive their jobs next need not wait for the lease.
    stop: watch::Receiver<bool>,
    hard_stop: watch::Receiver<bool>,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl BatchPool {
    /// Answer `job` through a provider batch; see the module docs. `msg` is kept with
    /// in-progress acks meanwhile; `stop` (the worker stops fetching) ends the wait.
    pub async fn run(
        self: &Arc<Self>,
        job: &Job,
        msg: &jetstream::Message,
        ack_wait: Duration,
        mut stop: watch::Receiver<bool>,
    ) -> BatchOutcome {
        let Some(model) = self.apis.iter().position(|a| a.model().serves(&job.key.model)) else {
            return BatchOutcome::Failed(
                CallError::permanent(format!(
                    "pool {:?} has no batch model for this job",
                    self.name
                )),
                0,
            );
        };
        let line = match self.apis[model].request_line(job) {
            Ok(l) => l,
            Err(e) => return BatchOutcome::Failed(e, 0),
        };
        let tokens = crate::quota::estimate_tokens(job);
        if let Some(e) = machine::never_fits(tokens, self.spec.queue_tokens) {
            return BatchOutcome::Failed(e, 0);
        }
        if *stop.borrow() {
            return BatchOutcome::Abandoned;
        }
        let period = (ack_wait / 3).max(Duration::from_millis(200));
        let joined = with_progress(msg, period, self.join(job.id, model, line, tokens)).await;
        let record = match joined {
            Ok(r) => r,
            Err(e) => {
                return BatchOutcome::NotRun(format!("cannot claim the job for a batch: {e}"))
            }
        };
        let mut rx = self.follow(&record);
        let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        let outcome = loop {
            let current = rx.borrow_and_update().clone();
            if let Some(r) = current {
                if let Some(o) = with_progress(msg, period, self.settle(&r, job)).await {
                    break o;
                }
            }
            tokio::select! {
                changed = rx.changed() => if changed.is_err() { break BatchOutcome::Abandoned },
                _ = progress.tick() => {
                    if let Err(e) = msg.ack_with(AckKind::Progress).await {
                        debug!(job = %job.id, error = %e, "progress ack failed");
                    }
                }
                true = async { stop.wait_for(|s| *s).await.is_ok() } => break BatchOutcome::Abandoned,
            }
        };
        self.unfollow(&record);
        outcome
    }

    /// What record `r` means for `job` now: None while it is still to be waited for.
    async fn settle(&self, r: &Seen, job: &Job) -> Option<BatchOutcome> {
        match machine::settle(&r.record, r.jobs.contains(&job.id), now_ms()) {
            Settle::Wait => None,
            Settle::Answer => Some(self.answer(&r.record, job).await),
            Settle::NotRun(why) => Some(BatchOutcome::NotRun(why)),
        }
    }

    /// Whether a provider batch that has `job` (or may still answer it) holds it: its
    /// claim names a live record that holds it, or an ended one (its answer is in the
    /// output). False when the broker cannot tell now.
    pub async fn holds(&self, job: &JobId) -> bool {
        // A broker that cannot tell now counts as "held": the job is then not dead-lettered
        // on a guess (its batch call hands it back if the broker stays unreadable).
        let Ok(claim) = self.store.claim(&self.name, job).await else { return true };
        let Some(c) = claim.value else { return false };
        match self.store.record(&self.name, &c.record).await {
            Ok(r) => r.value.is_some_and(|r| machine::holds_at_provider(&r, job)),
            Err(e) => !e.invalid,
        }
    }

    /// Claim `job` for a batch: the record it waits for (one that already holds it, or
    /// this worker's gathering one, which then holds its request `line`). The decisions
    /// are [`Join`]'s; a broker that cannot tell now ends the claim (never taken over on
    /// a guess).
    async fn join(
        self: &Arc<Self>,
        job: JobId,
        model: usize,
        mut line: Vec<u8>,
        tokens: u64,
    ) -> Result<String, StoreError> {
        let (mut m, mut cmd) = Join::new(job);
        loop {
            let event = match cmd {
                JoinCommand::ReadClaim => {
                    let claim = self.store.claim(&self.name, &job).await?;
                    JoinEvent::Claim {
                        record: claim.value.map(|c| c.record),
                        revision: claim.revision,
                    }
                }
                JoinCommand::ReadRecord(id) => match self.store.record(&self.name, &id).await {
                    Ok(store::Versioned { value: Some(record), revision }) => {
                        JoinEvent::Record { record: Box::new(record), revision, now_ms: now_ms() }
                    }
                    Ok(_) => JoinEvent::NoRecord,
                    // Someone else's bytes under a record key: the claim is taken over.
                    Err(e) if e.invalid => {
                        warn!(job = %job, error = %e, "unreadable batch record; gathering the job again");
                        JoinEvent::Unreadable
                    }
                    Err(e) => return Err(e),
                },
                JoinCommand::Fence { record, revision } => JoinEvent::Fenced {
                    won: self.store.put_record(&record, revision).await?.is_some(),
                },
                JoinCommand::Take { claim_revision } => {
                    let mut gathering = self.gathering.lock().await;
                    let g = self.gathering_for(&mut gathering, model, tokens, line.len()).await?;
                    let id = g.machine.record.id.clone();
                    let claim = Claim { record: id.clone() };
                    let written =
                        self.store.put_claim(&self.name, &job, &claim, claim_revision).await?;
                    if written.is_some() {
                        g.machine.joined(job, tokens);
                        g.bytes += line.len() as u64 + 1;
                        g.lines.push(std::mem::take(&mut line));
                        return Ok(id);
                    }
                    JoinEvent::Took(None)
                }
                JoinCommand::Wait(id) => {
                    debug!(job = %job, record = %id, "job already in a batch; waiting for it");
                    return Ok(id);
                }
                JoinCommand::GiveUp => {
                    return Err(StoreError {
                        key: job.to_string(),
                        reason: "the job's claim kept changing".into(),
                        invalid: false,
                    })
                }
            };
            cmd = m.step(event);
        }
    }

    /// The gathering record of `model` with room for `tokens` more and a request line of
    /// `line` bytes (a full one is sealed and submitted first: `batch_size`,
    /// `batch_queue_tokens`, and the provider's limits on requests and bytes per batch).
    async fn gathering_for<'a>(
        self: &Arc<Self>,
        gathering: &'a mut HashMap<usize, Gathering>,
        model: usize,
        tokens: u64,
        line: usize,
    ) -> Result<&'a mut Gathering, StoreError> {
        let api = &self.apis[model];
        let over_provider = |g: &Gathering| {
            !g.lines.is_empty()
                && (g.lines.len() >= api.max_requests()
                    || api.max_body_bytes().is_some_and(|max| g.bytes + line as u64 + 64 > max))
        };
        if gathering.get(&model).is_some_and(|g| g.machine.full_for(tokens) || over_provider(g)) {
            if let Some(mut g) = gathering.remove(&model) {
                if g.machine.step(GatherEvent::Full) == GatherCommand::Seal {
                    self.seal(g).await;
                }
            }
        }
        let g = match gathering.entry(model) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let now = now_ms();
                let record = BatchRecord {
                    id: uuid::Uuid::now_v7().simple().to_string(),
                    pool: self.name.clone(),
                    model: self.apis[model].model().model.clone(),
                    state: BatchState::Gathering,
                    jobs: Vec::new(),
                    tokens: 0,
                    owner: self.owner.clone(),
                    lease_until_ms: now + self.timing.lease.as_millis() as u64,
                    created_ms: now,
                    submitted_ms: None,
                    ended_ms: None,
                };
                let revision =
                    self.store.put_record(&record, 0).await?.ok_or_else(|| StoreError {
                        key: record.key(),
                        reason: "a new record's key exists".into(),
                        invalid: false,
                    })?;
                v.insert(Gathering {
                    machine: Gather::new(record, revision, self.limits()),
                    model,
                    started: Instant::now(),
                    lines: Vec::new(),
                    bytes: 0,
                })
            }
        };
        Ok(g)
    }

    fn limits(&self) -> Limits {
        Limits {
            batch_size: self.spec.batch_size as usize,
            batch_wait: Duration::from_millis(self.spec.batch_wait_ms),
            queue_tokens: self.spec.queue_tokens,
            lease: self.timing.lease,
        }
    }

    /// Submit a gathered batch, or hold it (sealed: no job joins it any more) until the
    /// provider has room for its tokens; batches are submitted in the order sealed.
    async fn seal(self: &Arc<Self>, g: Gathering) {
        let mut sealed = self.sealed.lock().await;
        sealed.push_back(g);
        self.submit_sealed(&mut sealed).await;
    }

    /// Submit sealed batches, oldest first, while the pool's queue has room.
    async fn submit_sealed(self: &Arc<Self>, sealed: &mut std::collections::VecDeque<Gathering>) {
        while let Some(mut g) = sealed.pop_front() {
            match g.machine.step(GatherEvent::Submit) {
                GatherCommand::Reserve => {}
                // Empty (its only claims moved on): given up.
                GatherCommand::GiveUp => {
                    self.give_up(g).await;
                    continue;
                }
                other => {
                    debug!(pool = %self.name, record = %g.machine.record.id, command = ?other, "not a sealed batch; dropping it");
                    continue;
                }
            }
            let room = match self.reserve(&g.machine.record).await {
                Ok(room) => Some(room),
                Err(e) => {
                    warn!(pool = %self.name, record = %g.machine.record.id, error = %e, "cannot reserve the batch's tokens; trying again");
                    None
                }
            };
            if g.machine.step(GatherEvent::Reserved { room, now_ms: now_ms() })
                != GatherCommand::Record
            {
                if room == Some(false) {
                    debug!(pool = %self.name, record = %g.machine.record.id, tokens = g.machine.record.tokens, "no room in batch_queue_tokens yet; holding the batch");
                }
                sealed.push_front(g);
                return;
            }
            let Gathering { mut machine, lines, model, .. } = g;
            let body = self.apis[model].body(&lines);
            drop(lines);
            let put = self.store.put_record(&machine.record, machine.revision).await;
            let (written, revision) = match &put {
                Ok(Some(rev)) => (Some(true), *rev),
                Ok(None) => (Some(false), 0),
                Err(_) => (None, 0),
            };
            match machine.step(GatherEvent::Wrote { written, revision }) {
                GatherCommand::Own => {
                    let record = machine.record;
                    info!(pool = %self.name, record = %record.id, requests = record.jobs.len(), tokens = record.tokens, "batch sealed; uploading");
                    lock(&self.owned).insert(record.id.clone());
                    self.push(&record);
                    tokio::spawn(self.clone().own(record, revision, model, Some(body)));
                }
                _ => {
                    let id = &machine.record.id;
                    match put {
                        // Its lease lapsed and another worker moved it on; its jobs are
                        // gathered again by whoever receives them.
                        Ok(_) => {
                            warn!(pool = %self.name, record = %id, "a gathered batch was taken over before submission; dropping it")
                        }
                        Err(e) => {
                            warn!(pool = %self.name, record = %id, error = %e, "cannot record the batch's jobs; its jobs go into another batch when redelivered")
                        }
                    }
                    self.release(id).await;
                }
            }
        }
    }

    /// Write a record its machine gave up (its jobs, if any, are gathered again).
    async fn give_up(&self, mut g: Gathering) {
        let record = &g.machine.record;
        let put = self.store.put_record(record, g.machine.revision).await;
        match &put {
            Ok(_) => self.push(record),
            Err(e) => {
                debug!(record = %record.id, error = %e, "cannot mark a batch record given up")
            }
        }
        let written = put.as_ref().ok().map(Option::is_some);
        let revision = put.ok().flatten().unwrap_or(0);
        g.machine.step(GatherEvent::Wrote { written, revision });
    }

    /// The tender: seals batches that are full or waited long enough, submits sealed
    /// ones as room appears, renews the leases of records not yet submitted, and reads
    /// the records job tasks wait for (taking over those whose owner is gone).
    async fn tend(self: Arc<Self>) {
        let tick = self.timing.follow().min(Duration::from_millis(250));
        let mut hard_stop = self.hard_stop.clone();
        let mut stop = self.stop.clone();
        let mut last_follow = Instant::now();
        let mut stopped = false;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(tick) => {}
                true = async { hard_stop.wait_for(|s| *s).await.is_ok() } => return,
                true = async { stop.wait_for(|s| *s).await.is_ok() }, if !stopped => {
                    stopped = true;
                    self.give_up_unsubmitted().await;
                }
            }
            if stopped {
                // Submitted batches go on (their owner polls until the hard stop); no new
                // batch starts.
                if last_follow.elapsed() >= self.timing.follow() {
                    last_follow = Instant::now();
                    self.read_followed().await;
                }
                continue;
            }
            self.seal_due().await;
            {
                let mut sealed = self.sealed.lock().await;
                self.submit_sealed(&mut sealed).await;
                let mut kept = std::collections::VecDeque::with_capacity(sealed.len());
                while let Some(mut g) = sealed.pop_front() {
                    let renewed = g.machine.step(GatherEvent::RenewTick { now_ms: now_ms() });
                    match self.renew_gathering(&mut g.machine, renewed).await {
                        GatherCommand::Release => {
                            warn!(pool = %self.name, record = %g.machine.record.id, "a sealed batch was taken over before submission; dropping it");
                            self.release(&g.machine.record.id).await;
                        }
                        _ => kept.push_back(g),
                    }
                }
                *sealed = kept;
            }
            if last_follow.elapsed() >= self.timing.follow() {
                last_follow = Instant::now();
                self.read_followed().await;
            }
        }
    }

    /// Give up every batch this worker gathered and has not submitted (it stops).
    async fn give_up_unsubmitted(&self) {
        let gathered: Vec<Gathering> =
            self.gathering.lock().await.drain().map(|(_, g)| g).collect();
        let sealed: Vec<Gathering> = self.sealed.lock().await.drain(..).collect();
        for mut g in gathered.into_iter().chain(sealed) {
            info!(pool = %self.name, record = %g.machine.record.id, jobs = g.lines.len(), "worker stopping: giving up a batch not yet submitted; its jobs go to other workers");
            if g.machine.step(GatherEvent::Stop) == GatherCommand::GiveUp {
                self.give_up(g).await;
            }
        }
    }

    /// Seal gathering batches that are full or have waited `batch_wait`; renew the
    /// others' leases.
    async fn seal_due(self: &Arc<Self>) {
        let mut gathering = self.gathering.lock().await;
        let mut renew = Vec::new();
        let models: Vec<usize> = gathering.keys().copied().collect();
        for m in models {
            let Some(g) = gathering.get_mut(&m) else { continue };
            let tick = GatherEvent::Tick { waited: g.started.elapsed(), now_ms: now_ms() };
            match g.machine.step(tick) {
                GatherCommand::Seal => {
                    if let Some(g) = gathering.remove(&m) {
                        // An empty one (its only claims moved on) is given up by `seal`.
                        self.seal(g).await;
                    }
                }
                GatherCommand::Renew => renew.push(m),
                _ => {}
            }
        }
        // Fenced off by a worker that took one of its jobs (its lease had lapsed): its
        // jobs are gathered again by whoever holds them.
        for m in renew {
            let Some(g) = gathering.get_mut(&m) else { continue };
            if self.renew_gathering(&mut g.machine, GatherCommand::Renew).await
                == GatherCommand::Drop
            {
                if let Some(g) = gathering.remove(&m) {
                    warn!(pool = %self.name, record = %g.machine.record.id, "a gathering batch was taken over; dropping it");
                }
            }
        }
    }

    /// Carry out a not yet submitted record's `Renew` (its machine renewed the lease when
    /// a third of it was gone): the machine's answer to the write.
    async fn renew_gathering(&self, g: &mut Gather, command: GatherCommand) -> GatherCommand {
        if command != GatherCommand::Renew {
            return command;
        }
        let (written, revision) = match self.store.put_record(&g.record, g.revision).await {
            Ok(Some(rev)) => (Some(true), rev),
            Ok(None) => (Some(false), 0),
            Err(e) => {
                warn!(pool = %self.name, record = %g.record.id, error = %e, "cannot renew a gathering batch's lease");
                (None, 0)
            }
        };
        g.step(GatherEvent::Wrote { written, revision })
    }

    /// Reserve a sealed batch's tokens in the pool's queue ledger (always room without
    /// `batch_queue_tokens`). Entries of records no longer at the provider are dropped on
    /// the way (their owner may have died before freeing them).
    async fn reserve(&self, record: &BatchRecord) -> Result<bool, StoreError> {
        let Some(limit) = self.spec.queue_tokens else { return Ok(true) };
        for _ in 0..20 {
            let v = self.store.ledger(&self.name).await?;
            let mut ledger = v.value.unwrap_or_default();
            let now = now_ms();
            let mut stale = Vec::new();
            for id in ledger.records.keys().filter(|id| **id != record.id) {
                // A record that cannot be read now keeps its tokens.
                let keep = match self.store.record(&self.name, id).await {
                    Ok(r) => machine::ledger_keeps(r.value.as_ref(), now),
                    Err(e) => !e.invalid,
                };
                if !keep {
                    stale.push(id.clone());
                }
            }
            let Some(fits) =
                machine::reserve(&mut ledger, &stale, &record.id, record.tokens, limit)
            else {
                return Ok(false);
            };
            if self.store.put_ledger(&self.name, &ledger, v.revision).await?.is_some() {
                return Ok(fits);
            }
        }
        Ok(false)
    }

    /// Free a record's tokens in the queue ledger.
    async fn release(&self, id: &str) {
        if self.spec.queue_tokens.is_none() {
            return;
        }
        for _ in 0..20 {
            let Ok(v) = self.store.ledger(&self.name).await else { return };
            let mut ledger = v.value.unwrap_or_default();
            if ledger.records.remove(id).is_none() {
                return;
            }
            match self.store.put_ledger(&self.name, &ledger, v.revision).await {
                Ok(Some(_)) => return,
                Ok(None) => continue,
                Err(e) => {
                    // Dropped as stale by the next reservation.
                    debug!(record = id, error = %e, "cannot free a batch's tokens now");
                    return;
                }
            }
        }
    }

    /// Drive an owned record to its end: the IO of its [`Owner`] machine. `body` is the
    /// input file when this worker gathered it (None: taken over). Stops when another
    /// worker took it over or the worker stops (the lease then lapses and a holder of its
    /// jobs takes over).
    async fn own(
        self: Arc<Self>,
        record: BatchRecord,
        revision: u64,
        model: usize,
        mut body: Option<Vec<u8>>,
    ) {
        let api = self.apis[model].clone();
        let mut m =
            Owner::new(record, revision, body.is_none(), self.timing.poll).inline(api.inline());
        'owning: while !*self.hard_stop.borrow() {
            let mut cmd = m.next();
            loop {
                let event = match cmd {
                    OwnerCommand::Next => continue 'owning,
                    OwnerCommand::Done => break 'owning,
                    cmd => match self.carry(&mut m, &api, &mut body, cmd).await {
                        Some(event) => event,
                        None => break 'owning,
                    },
                };
                cmd = m.step(event, now_ms());
            }
        }
        lock(&self.owned).remove(&m.record.id);
    }

    /// Carry out an owner's command: its outcome as the machine's next event (None: an
    /// upload without its file, which a gatherer never asks for).
    async fn carry(
        &self,
        m: &mut Owner,
        api: &Provider,
        body: &mut Option<Vec<u8>>,
        cmd: OwnerCommand,
    ) -> Option<OwnerEvent> {
        use OwnerCommand as C;
        use OwnerEvent as E;
        let (pool, id) = (self.name.clone(), m.record.id.clone());
        let key = m.record.key();
        let (record, revision) = (&mut m.record, &mut m.revision);
        let event = match cmd {
            C::Upload => {
                let b = body.as_deref()?;
                let name = format!("halyard-{id}.jsonl");
                let step = self.provider(record, revision, || api.upload(&name, b, now_ms())).await;
                if !api.inline() {
                    // At the provider now (or failed for good): not needed again.
                    *body = None;
                }
                step.event(|file| {
                    self.failpoints.pass(Point::BatchUploaded);
                    E::Uploaded { file }
                })
            }
            C::Find { since_s } => {
                let BatchState::Uploaded { file } = &record.state else {
                    return Some(E::Found(None));
                };
                let file = file.clone();
                // Batches other records name are not this record's (Anthropic's have no
                // metadata: a taker matches by count and time among the others).
                let taken = match api.inline() {
                    false => Ok(HashSet::new()),
                    true => self.store.batch_ids(&self.name, &id).await,
                };
                let step = match taken {
                    Ok(taken) => {
                        let snapshot = record.clone();
                        let find =
                            FindFor { record: &snapshot, file: &file, since_s, taken: &taken };
                        self.provider(record, revision, || api.find(&find)).await
                    }
                    Err(e) => Step::Failed(CallError::transient(format!(
                        "cannot read the pool's other batch records: {e}"
                    ))),
                };
                if let Step::Failed(e) = &step {
                    warn!(pool = %pool, record = %id, error = %e.message, "cannot find the batch at the provider; not creating it blindly");
                }
                step.event(|found| {
                    if let Some(b) = &found {
                        info!(pool = %pool, record = %id, batch = %b, "found the batch created before its id was recorded");
                    }
                    E::Found(found)
                })
            }
            C::Create { file } => {
                let b = body.as_deref();
                // A transient failure with no answer from the provider (the connection
                // broke or timed out once the request was out) may have made the batch:
                // the machine looks for it before creating again, so it is not retried
                // here. Other failures are retried as every provider step's are.
                let step = {
                    let create = || async {
                        match api.create(&file, &key, b).await {
                            Ok(batch) => Ok(Ok(batch)),
                            Err(e) if e.status.is_none() && !e.is_permanent() => Ok(Err(e)),
                            Err(e) => Err(e),
                        }
                    };
                    self.provider(record, revision, create).await
                };
                step.event(|created| match created {
                    Ok(batch) => {
                        *body = None;
                        self.failpoints.pass(Point::BatchCreated);
                        E::Created { batch }
                    }
                    Err(e) => {
                        warn!(pool = %pool, record = %id, error = %e.message, "the create may have reached the provider; looking for the batch before creating it again");
                        E::CreateUnsure
                    }
                })
            }
            C::Poll { batch } => {
                let step = self.provider(record, revision, || api.poll(&batch)).await;
                if let Step::Failed(e) = &step {
                    warn!(pool = %pool, record = %id, batch = %batch, error = %e.message, "cannot see the submitted batch; polling on unless it is unseen for too long");
                }
                step.event(|p| {
                    self.failpoints.pass(Point::BatchPolling);
                    if p.ended {
                        info!(pool = %pool, record = %id, batch = %p.id, status = %p.status, reason = ?p.reason, "batch ended");
                    } else {
                        debug!(pool = %pool, record = %id, status = %p.status, polled = m.polled() + 1, "batch still running");
                    }
                    E::Polled(p)
                })
            }
            C::Wait(delay) => match self.wait_renewing(record, revision, delay).await {
                true => E::Waited,
                false => E::Lost,
            },
            C::Write(state) => {
                if let BatchState::Submitted { batch, .. } = &state {
                    info!(pool = %pool, record = %id, batch = %batch, requests = record.jobs.len(), "batch submitted");
                }
                match self.write(record, revision, state).await {
                    true => E::Written,
                    false => E::Lost,
                }
            }
            C::Release => {
                self.release(&id).await;
                E::Released
            }
            C::Next | C::Done => return None,
        };
        Some(event)
    }
}

/// Run `fut` while keeping `msg` with in-progress acks every `period` (a claim waiting
/// for the gathering lock, a large download).
async fn with_progress<T>(
    msg: &jetstream::Message,
    period: Duration,
    fut: impl std::future::Future<Output = T>,
) -> T {
    tokio::pin!(fut);
    let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    loop {
        tokio::select! {
            v = &mut fut => return v,
            _ = progress.tick() => {
                if let Err(e) = msg.ack_with(AckKind::Progress).await {
                    debug!(error = %e, "progress ack failed");
                }
            }
        }
    }
}

/// How a provider request (with its retries) ended.
enum Step<T> {
    Ok(T),
    /// A permanent error (or one the retries did not get past before the worker gave up).
    Failed(CallError),
    /// The worker stops, or another worker took the record over.
    Stop,
}

impl<T> Step<T> {
    /// The owner's event: `ok`'s of the value, a failure, or the record lost.
    fn event(self, ok: impl FnOnce(T) -> OwnerEvent) -> OwnerEvent {
        match self {
            Step::Ok(v) => ok(v),
            Step::Failed(e) => OwnerEvent::Failed(e),
            Step::Stop => OwnerEvent::Lost,
        }
    }
}

/// How long a failed download of a batch's answers stands before it is tried again.
const DOWNLOAD_RETRY: Duration = Duration::from_secs(5);

impl BatchPool {
    /// A provider request for an owned record, retried while it fails for the
    /// endpoint's reasons (an outage during polling is waited out), renewing the lease.
    async fn provider<T, F, Fut>(
        &self,
        record: &mut BatchRecord,
        revision: &mut u64,
        mut f: F,
    ) -> Step<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, CallError>>,
    {
        // The lease is renewed while a request runs (an upload may take minutes) and
        // while a retry waits, so that nobody takes the record over meanwhile.
        let tick = (self.timing.lease / 4).max(Duration::from_millis(10));
        let mut attempt = 0u32;
        loop {
            if *self.hard_stop.borrow() {
                return Step::Stop;
            }
            let res = {
                let fut = f();
                tokio::pin!(fut);
                let mut hard_stop = self.hard_stop.clone();
                loop {
                    tokio::select! {
                        r = &mut fut => break r,
                        _ = tokio::time::sleep(tick) => {
                            if !self.renew(record, revision).await {
                                return Step::Stop;
                            }
                        }
                        true = async { hard_stop.wait_for(|s| *s).await.is_ok() } => return Step::Stop,
                    }
                }
            };
            match res {
                Ok(v) => return Step::Ok(v),
                Err(e) if e.is_permanent() => return Step::Failed(e),
                Err(e) => {
                    let delay = e
                        .retry_after
                        .unwrap_or_else(|| machine::backoff(attempt))
                        .min(Duration::from_secs(300));
                    warn!(pool = %self.name, record = %record.id, error = %e.message, retry_in_ms = delay.as_millis() as u64, "batch API request failed; retrying");
                    attempt += 1;
                    if !self.wait_renewing(record, revision, delay).await {
                        return Step::Stop;
                    }
                }
            }
        }
    }

    /// Wait `delay`, renewing the record's lease meanwhile; false when the record is no
    /// longer this worker's or the worker stops.
    async fn wait_renewing(
        &self,
        record: &mut BatchRecord,
        revision: &mut u64,
        delay: Duration,
    ) -> bool {
        let tick = (self.timing.lease / 4).max(Duration::from_millis(10));
        let until = tokio::time::Instant::now() + delay;
        let mut hard_stop = self.hard_stop.clone();
        while tokio::time::Instant::now() < until {
            if !self.renew(record, revision).await {
                return false;
            }
            let step = tick.min(until.saturating_duration_since(tokio::time::Instant::now()));
            tokio::select! {
                _ = tokio::time::sleep(step) => {}
                true = async { hard_stop.wait_for(|s| *s).await.is_ok() } => return false,
            }
        }
        self.renew(record, revision).await
    }

    /// Write the record's next state (with a fresh lease); false when the record is no
    /// longer this worker's (or the broker refused: the lease then lapses and the
    /// record is taken over from where it was recorded).
    async fn write(&self, record: &mut BatchRecord, revision: &mut u64, state: BatchState) -> bool {
        let before = record.state.clone();
        record.state = state;
        record.lease_until_ms = now_ms() + self.timing.lease.as_millis() as u64;
        loop {
            match self.store.put_record(record, *revision).await {
                Ok(Some(rev)) => {
                    *revision = rev;
                    self.push_at(record, rev);
                    return true;
                }
                Ok(None) => {
                    warn!(pool = %self.name, record = %record.id, "batch record taken over by another worker; leaving it to it");
                    record.state = before;
                    return false;
                }
                Err(e) => {
                    warn!(pool = %self.name, record = %record.id, error = %e, "cannot write the batch record; trying again");
                    let mut hard_stop = self.hard_stop.clone();
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        true = async { hard_stop.wait_for(|s| *s).await.is_ok() } => { record.state = before; return false }
                    }
                }
            }
        }
    }

    /// Renew an owned record's lease when a third of it is gone; false when the record
    /// is no longer this worker's.
    async fn renew(&self, record: &mut BatchRecord, revision: &mut u64) -> bool {
        if !machine::lease_due(record.lease_until_ms, now_ms(), self.timing.lease) {
            return true;
        }
        let state = record.state.clone();
        self.write(record, revision, state).await
    }

    /// Tell this worker's job tasks waiting for `record` its new state.
    fn push(&self, record: &BatchRecord) {
        self.push_at(record, 0);
    }

    /// [`BatchPool::push`] of the record at `revision` (0: unknown).
    fn push_at(&self, record: &BatchRecord, revision: u64) {
        if let Some(f) = lock(&self.follows).get_mut(&record.id) {
            f.revision = revision;
            f.tx.send_replace(Some(Arc::new(Seen::new(record.clone()))));
        }
    }

    /// Wait for record `id`: a receiver of its states (read from the bucket by the
    /// tender, or pushed by its owner here).
    fn follow(&self, id: &str) -> watch::Receiver<Option<Arc<Seen>>> {
        let mut follows = lock(&self.follows);
        let f = follows.entry(id.to_string()).or_insert_with(|| Follow {
            tx: watch::channel(None).0,
            waiters: 0,
            revision: 0,
        });
        f.waiters += 1;
        let mut rx = f.tx.subscribe();
        rx.mark_changed();
        rx
    }

    fn unfollow(&self, id: &str) {
        let mut follows = lock(&self.follows);
        if let Some(f) = follows.get_mut(id) {
            f.waiters = f.waiters.saturating_sub(1);
            if f.waiters == 0 {
                follows.remove(id);
                lock(&self.answers).remove(id);
                lock(&self.download_failed).remove(id);
            }
        }
    }

    /// Read the records job tasks wait for, and take over live ones whose owner's lease
    /// lapsed.
    async fn read_followed(self: &Arc<Self>) {
        let ids: Vec<String> = lock(&self.follows).keys().cloned().collect();
        for id in ids {
            let v = match self.store.record(&self.name, &id).await {
                Ok(v) => v,
                Err(e) => {
                    debug!(record = %id, error = %e, "cannot read a batch record now");
                    continue;
                }
            };
            let Some(mut record) = v.value else {
                // Expired or never written: nothing holds its jobs any more.
                self.push(&machine::gone_record(&id, &self.name));
                continue;
            };
            let owned = lock(&self.owned).contains(&id);
            let now = now_ms();
            let model = self.apis.iter().position(|a| a.model().model == record.model);
            if machine::adopts(&record, owned, now, *self.stop.borrow(), model.is_some()) {
                if let Some(model) = model {
                    let previous = std::mem::replace(&mut record.owner, self.owner.clone());
                    record.lease_until_ms = now + self.timing.lease.as_millis() as u64;
                    if let Ok(Some(rev)) = self.store.put_record(&record, v.revision).await {
                        info!(pool = %self.name, record = %id, state = record.state.name(), previous_owner = %previous, "took over a batch whose owner is gone");
                        lock(&self.owned).insert(id.clone());
                        self.push(&record);
                        tokio::spawn(self.clone().own(record, rev, model, None));
                        continue;
                    }
                }
            }
            let sent = lock(&self.follows).get(&id).map_or(0, |f| f.revision);
            if machine::push_read(owned, sent, v.revision, &record.state) {
                self.push_at(&record, v.revision);
            }
        }
    }

    /// Job `job`'s answer in ended record `r` (see the module docs). A job not answered
    /// gives up its claim first, so its next delivery gathers it into another batch.
    async fn answer(&self, r: &BatchRecord, job: &Job) -> BatchOutcome {
        let BatchState::Ended { batch, status, output, error, reason } = &r.state else {
            return BatchOutcome::NotRun("the batch has not ended".into());
        };
        let taken = match self.download(r, batch, output.as_deref(), error.as_deref()).await {
            Ok(answers) => {
                machine::answer_of(batch, status, reason.as_deref(), answers.get(&job.id))
            }
            Err(e) => {
                let taken = machine::download_failed(batch, &e);
                if taken.release_claim {
                    warn!(job = %job.id, batch = %batch, error = %e.message, "cannot download the batch's answers; the job goes into another batch");
                } else {
                    warn!(job = %job.id, batch = %batch, error = %e.message, "cannot download the batch's answers now");
                }
                taken
            }
        };
        if taken.release_claim {
            self.release_claim(job, r).await;
        }
        match taken.outcome {
            // A batch answer's usage is an API's word too (issue 33): clamped to what the
            // request could use, as online answers are.
            BatchOutcome::Done(mut c) => {
                crate::backend::clamp_completion(job, &mut c);
                BatchOutcome::Done(c)
            }
            other => other,
        }
    }

    /// Free `job` for another batch (if its claim still names `r`).
    async fn release_claim(&self, job: &Job, r: &BatchRecord) {
        if let Err(e) = self.store.release_claim(&self.name, &job.id, &r.id).await {
            warn!(job = %job.id, error = %e, "cannot free the job's batch claim; its next delivery takes it over");
        }
    }

    /// The answers of ended record `r`, downloaded once by this worker.
    async fn download(
        &self,
        r: &BatchRecord,
        batch: &str,
        output: Option<&str>,
        error: Option<&str>,
    ) -> Result<Answers, CallError> {
        if let Some((at, e)) = lock(&self.download_failed).get(&r.id) {
            // Thousands of tasks wait for one download: one failure answers them all for
            // a few seconds instead of each trying again in turn.
            if at.elapsed() < DOWNLOAD_RETRY {
                return Err(e.clone());
            }
        }
        let cell = lock(&self.answers).entry(r.id.clone()).or_default().clone();
        let api = self.apis.iter().find(|a| a.model().model == r.model).ok_or_else(|| {
            CallError::permanent(format!("no batch model {:?} in pool {:?}", r.model, self.name))
        })?;
        let got = cell
            .get_or_try_init(|| async {
                let latency = match (r.submitted_ms, r.ended_ms) {
                    (Some(a), Some(b)) => b.saturating_sub(a),
                    _ => 0,
                };
                let mut reader = match api {
                    Provider::OpenAi(_) => output::Reader::new(batch, latency),
                    Provider::Anthropic(a) => {
                        output::Reader::anthropic(batch, latency, a.model().prompt_cache)
                    }
                };
                api.read_answers(output, error, &mut reader).await?;
                let answers = reader.finish(&r.jobs);
                self.failpoints.pass(Point::BatchDownloaded);
                info!(pool = %self.name, record = %r.id, batch, answers = answers.len(), "batch answers downloaded");
                Ok::<_, CallError>(Arc::new(answers))
            })
            .await;
        match got {
            Ok(a) => Ok(a.clone()),
            Err(e) => {
                lock(&self.download_failed).insert(r.id.clone(), (Instant::now(), e.clone()));
                Err(e)
            }
        }
    }
}

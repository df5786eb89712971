//! The planner: the coordinator's core, with no IO.
//!
//! [`Planner::step`] takes an [`Event`] (results arrived, the window has room, jobs were
//! lost) and returns the [`Effect`]s the caller carries out, in order: store a result,
//! mark an item done, note a dead-lettered job, store the cost totals, publish a job. The
//! planner reads the run state through [`RunStore`] and never writes it itself; it does
//! not flush, publish or ack. So counting once, recovery and the window are tested with
//! [`crate::store::MemStore`], without a store on disk, tokio or NATS (`planner_tests.rs`), as
//! `halyard-worker`'s `lifecycle.rs` is for a job delivery.
//!
//! What it decides:
//! - **count once**: a result is new when neither the store nor this step holds one for
//!   its job; only a new result is stored, counted, metered and shown to the items;
//! - **only what it asked for**: a new result is taken only for a job this process
//!   published and only from the results subject of that job's pool; one from another
//!   pool's subject is refused. A result for a job not planned yet is held aside (a
//!   bounded number, [`HELD_MAX_RESULTS`] and [`HELD_MAX_BYTES`]): the job may be
//!   planned later (a run resumed with a smaller window finds results its earlier process
//!   asked for), and then the held result answers it, if it came on the job's pool's
//!   subject. Past the bound, such results are refused. Every refusal is counted
//!   ([`Figures::refused_results`], kept in the store across restarts);
//! - **plan**: an item is evaluated against the known results (its pipeline's pure
//!   `evaluate`, round after round while stored results answer what it asks); it is
//!   done (its label is stored) or it waits on jobs, and a job nobody waited on yet is
//!   published, unless it is a paid call over the cost limit;
//! - **the window**: items are taken in while their lane has room (skipping items that
//!   an earlier process finished), and every finished item lets the next one in.

use std::collections::HashMap;
use std::time::Instant;

use halyard_pipelines::common::{JobRequest, Plan};
use halyard_proto::{Failure, FailureKind, Job, JobId, JobResult, Outcome};
use tracing::{debug, warn};
use uuid::Uuid;

use crate::benchmarks::Benchmark;
use crate::cost::Meter;
pub use crate::effect::{publishes, Effect, Share};
use crate::progress::{Figures, Progress};
use crate::record::{ItemKey, JobMeta, StoreError};
use crate::store::RunStore;
use crate::sweep::Sweep;
use crate::window::Window;
use crate::PlanError;

/// Offset of retry rounds in job message ids (`<run>:<job>:r<100 + round>`), clear of the
/// stall check's rounds (1–3).
pub const MSG_ID_ROUND_BASE: u32 = 100;

/// Results held aside for jobs not planned yet, at most (see the module's text).
pub const HELD_MAX_RESULTS: u64 = 10_000;
/// Bytes of results held aside, at most.
pub const HELD_MAX_BYTES: u64 = 64 << 20;

/// A result as received: decoded, with the pool token of the results subject it came on
/// ([`halyard_proto::subjects::result_pool_token`]), which the broker's permissions can
/// tie to the publisher's credentials.
#[derive(Clone, Debug)]
pub struct Arrival {
    pub pool: String,
    pub result: JobResult,
}

/// What happened, for the planner.
#[derive(Debug)]
pub enum Event {
    /// Take items into the window while it has room (step 3 of recovery, and later).
    Fill,
    /// A batch of results (steps 4 and 5 of recovery): stored and counted once, the items
    /// they wake re-planned, the window refilled.
    Results(Vec<Arrival>),
    /// Jobs no worker will answer (delivered `max_deliver` times without a result, or
    /// lost from the queue three times): each without a result becomes a dead letter
    /// with `error`.
    Lost { jobs: Vec<Job>, error: String, deliveries: u64 },
}

/// An item's evaluation: done, with its label, or waiting on jobs (with their ids).
enum Eval {
    Done(Vec<u8>),
    Waiting(Vec<(JobId, JobRequest)>),
}

/// The results of one step: the items they woke, and the new outcomes (not yet in the
/// store).
#[derive(Default)]
struct Batch {
    affected: Vec<(ItemKey, JobId)>,
    fresh: HashMap<JobId, Outcome>,
}

/// Results held aside for jobs not planned yet: how many, and their bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    pub results: u64,
    pub bytes: u64,
}

/// The coordinator's planning state: the window, the cost meter and the live figures,
/// over a [`RunStore`] it reads.
pub struct Planner<'s, S> {
    benchmarks: &'s [Benchmark],
    store: S,
    run: Uuid,
    window: Window,
    meter: Meter,
    /// Jobs re-queued by `halyard retry-failed`, with their round (see `dead_letters`).
    retried: HashMap<JobId, u32>,
    /// Items were already finished when this process started: the window's walk must
    /// skip them. (Without any, no item ahead of the walk can be finished, and the walk
    /// need not ask the store.)
    resumed_done: bool,
    progress: Progress,
    /// Results held aside, in the store and in `unplanned`.
    held: Held,
    /// Results held aside in this step (not yet in the store), with their bytes as
    /// [`Held`] counts them.
    unplanned: HashMap<JobId, (Arrival, u64)>,
    /// Held results that jobs planned in this step asked for: they arrive at the end of
    /// the step.
    promoted: Vec<Arrival>,
    /// Refusals counted in the store when this process started (results messages,
    /// results), and results messages refused by this process.
    intake_base: crate::record::Intake,
    /// The refusals as last stored.
    intake_stored: crate::record::Intake,
}

impl<'s, S: RunStore> Planner<'s, S> {
    /// A planner for run `run` of `sweep` over `store`, continuing from what it holds
    /// (finished items, stored results, cost totals).
    pub fn open(
        sweep: &'s Sweep,
        store: S,
        run: Uuid,
        retried: HashMap<JobId, u32>,
    ) -> Result<Self, PlanError> {
        let benchmarks = &sweep.benchmarks;
        let items_total =
            benchmarks.iter().map(|b| (b.model_count() * b.item_count()) as u64).sum();
        let shape: Vec<(u32, u32)> =
            benchmarks.iter().map(|b| (b.model_count() as u32, b.item_count() as u32)).collect();
        let items_done = store.done_count();
        let held = store.held_at_open()?;
        let intake_base = store.intake()?;
        let mut meter = Meter::new(&sweep.models, sweep.run.max_cost);
        meter.restore(store.costs()?);
        let progress = Progress {
            run: Some(run),
            figures: Figures {
                items_total,
                items_done,
                results: store.results_at_open(),
                refused_messages: intake_base.refused_messages,
                refused_results: intake_base.refused_results,
                held_results: held.results,
                targets: crate::progress::targets(sweep, &store),
                ..Default::default()
            },
            ..Default::default()
        };
        Ok(Planner {
            benchmarks,
            window: Window::new(&shape, sweep.run.window),
            store,
            run,
            meter,
            retried,
            resumed_done: items_done > 0,
            progress,
            held,
            unplanned: HashMap::new(),
            promoted: Vec::new(),
            intake_base,
            intake_stored: intake_base,
        })
    }

    /// Apply one event; `now` stamps the jobs published (for their latency).
    pub fn step(&mut self, event: Event, now: Instant) -> Result<Vec<Effect>, PlanError> {
        let mut fx = Vec::new();
        let mut costs = !matches!(event, Event::Fill);
        match event {
            Event::Fill => self.fill(now, &mut fx)?,
            Event::Results(arrived) => {
                let mut batch = Batch::default();
                for a in arrived {
                    self.arrive(a, now, &mut batch, &mut fx)?;
                }
                self.replan(batch, now, &mut fx)?;
                self.progress.result_batches += 1;
            }
            Event::Lost { jobs, error, deliveries } => {
                self.lost(jobs, &error, deliveries, now, &mut fx)?;
            }
        }
        // Held results that the jobs planned in this step asked for, as if they arrived
        // now (they may plan more jobs, which may find held results in turn).
        while !self.promoted.is_empty() {
            costs = true;
            let mut batch = Batch::default();
            for a in std::mem::take(&mut self.promoted) {
                self.arrive(a, now, &mut batch, &mut fx)?;
            }
            self.replan(batch, now, &mut fx)?;
        }
        self.unplanned.clear();
        if costs {
            fx.push(Effect::Costs(self.meter.totals().to_vec()));
        }
        fx.extend(self.intake_effect());
        self.progress.figures.held_results = self.held.results;
        Ok(fx)
    }

    /// The refusals counted since they were last stored, as an effect to store them.
    pub fn intake_effect(&mut self) -> Option<Effect> {
        let now = self.intake();
        (now != self.intake_stored).then(|| {
            self.intake_stored = now;
            Effect::Intake(now)
        })
    }

    /// The refusals to keep in the store: those of earlier processes and this one's.
    fn intake(&self) -> crate::record::Intake {
        crate::record::Intake {
            refused_messages: self.progress.figures.refused_messages,
            refused_results: self.progress.figures.refused_results,
        }
    }

    /// A result arrived: store it if it is the first for its job, asked for, and from its
    /// job's pool, and count it; hold it aside if its job is not planned yet.
    fn arrive(
        &mut self,
        a: Arrival,
        now: Instant,
        batch: &mut Batch,
        fx: &mut Vec<Effect>,
    ) -> Result<(), PlanError> {
        let job = a.result.job;
        if batch.fresh.contains_key(&job) || self.store.has_result(&job)? {
            self.account(a.result, false, now, batch);
            return Ok(());
        }
        match self.window.pool_of(&job) {
            Some(pool) if pool == a.pool => {
                fx.push(Effect::StoreResult {
                    job,
                    pool: pool.to_string(),
                    encoded: stored_form(&a.result)?,
                    share: Share::of(&a.result.outcome),
                });
                self.account(a.result, true, now, batch);
            }
            Some(pool) => {
                let why = format!("came on pool {}'s subject, its job is pool {pool}'s", a.pool);
                self.refuse(&a, &why);
            }
            None => self.hold(a, fx)?,
        }
        Ok(())
    }

    /// A result for a job not planned: held aside while the bound allows.
    fn hold(&mut self, a: Arrival, fx: &mut Vec<Effect>) -> Result<(), PlanError> {
        let job = a.result.job;
        if self.unplanned.contains_key(&job) || self.store.held(&job)?.is_some() {
            self.progress.figures.duplicates += 1;
            return Ok(());
        }
        let encoded =
            halyard_proto::encode(&a.result).map_err(|e| StoreError::Io(e.to_string()))?;
        let bytes = (encoded.len() + a.pool.len()) as u64;
        if self.held.results >= HELD_MAX_RESULTS || self.held.bytes + bytes > HELD_MAX_BYTES {
            self.refuse(
                &a,
                "its job was never planned, and the results held aside are at their bound",
            );
            return Ok(());
        }
        self.held.results += 1;
        self.held.bytes += bytes;
        fx.push(Effect::HoldResult { job, pool: a.pool.clone(), encoded });
        self.unplanned.insert(job, (a, bytes));
        Ok(())
    }

    /// A result refused: counted, never stored. Logged as a warning at the 1st, 2nd, 4th,
    /// 8th… refusal (a flood of forgeries must not flood the log), else at debug level.
    fn refuse(&mut self, a: &Arrival, why: &str) {
        let r = &a.result;
        let n = self.progress.figures.refused_results.saturating_add(1);
        self.progress.figures.refused_results = n;
        let worker = halyard_proto::redact::terminal(&r.worker);
        if n.is_power_of_two() {
            warn!(job = %r.job, %worker, why, refused = n, "result refused");
        } else {
            debug!(job = %r.job, %worker, why, refused = n, "result refused");
        }
    }

    /// The result held aside for job `id`, if any, taken out of the store (the caller
    /// checks its pool against the job's).
    fn take_held(&mut self, id: JobId, fx: &mut Vec<Effect>) -> Result<Option<Arrival>, PlanError> {
        if self.held.results == 0 {
            return Ok(None);
        }
        if let Some((a, bytes)) = self.unplanned.remove(&id) {
            // Held in this step: its HoldResult effect is already among the effects.
            fx.push(Effect::Unhold { job: id });
            self.release(bytes);
            return Ok(Some(a));
        }
        let Some((pool, encoded)) = self.store.held(&id)? else { return Ok(None) };
        fx.push(Effect::Unhold { job: id });
        self.release((encoded.len() + pool.len()) as u64);
        match halyard_proto::decode::<JobResult>("held result", &encoded) {
            Ok(result) if result.job == id && result.run == self.run => {
                Ok(Some(Arrival { pool, result }))
            }
            _ => {
                warn!(job = %id, "a result held aside is unreadable; the job is published");
                Ok(None)
            }
        }
    }

    fn release(&mut self, bytes: u64) {
        self.held.results = self.held.results.saturating_sub(1);
        self.held.bytes = self.held.bytes.saturating_sub(bytes);
    }

    /// Count a new result or a duplicate; collect the items it wakes.
    fn account(&mut self, r: JobResult, new: bool, now: Instant, batch: &mut Batch) {
        let waiter = self.window.on_result(&r.job);
        if let Some(w) = &waiter {
            batch.affected.extend(w.items().map(|k| (k, r.job)));
        }
        if !new {
            self.progress.figures.duplicates += 1;
            return;
        }
        self.progress.figures.results += 1;
        self.meter.record(&r);
        if let Some(w) = &waiter {
            self.progress.latency.record(now.saturating_duration_since(w.published_at));
        }
        if let Outcome::Failed(f) = &r.outcome {
            self.progress.figures.dead_letters += 1;
            warn!(job = %r.job, error = %f.error, "dead letter");
        }
        batch.fresh.insert(r.job, r.outcome);
    }

    /// Jobs no worker will answer become dead letters made by the coordinator.
    fn lost(
        &mut self,
        jobs: Vec<Job>,
        error: &str,
        deliveries: u64,
        now: Instant,
        fx: &mut Vec<Effect>,
    ) -> Result<(), PlanError> {
        let mut batch = Batch::default();
        for job in jobs {
            if batch.fresh.contains_key(&job.id) || self.store.has_result(&job.id)? {
                continue;
            }
            fx.push(Effect::NoteJob { job: job.id, meta: job_meta_of(&job) });
            let r = self.own_dead_letter(job.id, error.to_string(), deliveries);
            fx.push(Effect::StoreResult {
                job: job.id,
                pool: job.pool.clone(),
                encoded: stored_form(&r)?,
                share: Share::No,
            });
            self.account(r, true, now, &mut batch);
        }
        self.replan(batch, now, fx)
    }

    fn own_dead_letter(&self, job: JobId, error: String, deliveries: u64) -> JobResult {
        JobResult {
            v: halyard_proto::WIRE_VERSION,
            job,
            run: self.run,
            outcome: Outcome::Failed(Failure {
                kind: FailureKind::Exhausted,
                error,
                http_status: None,
            }),
            deliveries,
            worker: "coordinator".into(),
            cached: false,
        }
    }

    /// Re-evaluate the active items that the batch's results woke, then refill the window.
    fn replan(
        &mut self,
        mut batch: Batch,
        now: Instant,
        fx: &mut Vec<Effect>,
    ) -> Result<(), PlanError> {
        let affected = &mut batch.affected;
        affected.sort_unstable();
        affected.dedup();
        let mut i = 0;
        while i < affected.len() {
            let key = affected[i].0;
            let n = affected[i..].iter().take_while(|(k, _)| *k == key).count();
            let woke: Vec<JobId> = affected[i..i + n].iter().map(|(_, j)| *j).collect();
            i += n;
            if !self.window.is_active(key) {
                continue;
            }
            match self.evaluate(key, &batch.fresh, &woke, fx)? {
                Eval::Done(label) => {
                    fx.push(Effect::MarkDone { item: key, label });
                    self.window.finish(key);
                    self.progress.item_done(key);
                }
                Eval::Waiting(jobs) => self.wait_for(key, jobs, now, fx)?,
            }
        }
        self.fill(now, fx)
    }

    /// Take items into the window while it has room: skip those finished in an earlier
    /// process, plan the others and publish what they wait for. On a fresh start this is
    /// step 3 of recovery; later it keeps the window full as items finish.
    fn fill(&mut self, now: Instant, fx: &mut Vec<Effect>) -> Result<(), PlanError> {
        let none = HashMap::new();
        while let Some(key) = self.window.next_candidate() {
            if self.resumed_done && self.store.is_done(key)? {
                continue;
            }
            match self.evaluate(key, &none, &[], fx)? {
                Eval::Done(label) => {
                    fx.push(Effect::MarkDone { item: key, label });
                    self.progress.item_done(key);
                }
                Eval::Waiting(jobs) => {
                    self.window.activate(key);
                    self.wait_for(key, jobs, now, fx)?;
                }
            }
        }
        self.progress.figures.active = self.window.active_count() as u64;
        Ok(())
    }

    /// Active item `key` waits on `jobs`: publish those nobody waits on yet (unless a
    /// result held aside answers one).
    fn wait_for(
        &mut self,
        key: ItemKey,
        jobs: Vec<(JobId, JobRequest)>,
        now: Instant,
        fx: &mut Vec<Effect>,
    ) -> Result<(), PlanError> {
        for (id, j) in jobs {
            if self.window.wait_on(key, id, &j.pool, now) {
                if let Some(a) = self.take_held(id, fx)? {
                    if self.window.pool_of(&id) == Some(a.pool.as_str()) {
                        // Paid for already: metered when it arrives, at the end of the step.
                        self.meter.published(&j, id);
                        self.promoted.push(a);
                        continue;
                    }
                    self.refuse(
                        &a,
                        "held aside, and came on another pool's subject than its job's",
                    );
                }
                if !self.meter.may_publish(&j) {
                    self.meter.held += 1;
                    continue;
                }
                self.meter.published(&j, id);
                let job = job_of(self.run, id, j);
                let round = self.retried.get(&job.id).map(|r| MSG_ID_ROUND_BASE + r);
                fx.push(Effect::Publish { job: Box::new(job), round });
                self.progress.figures.published += 1;
            }
        }
        Ok(())
    }

    /// Evaluate an item against stored results (and `fresh` ones, received in this step
    /// and not yet in the store). Pipelines reveal one stage at a time, so this fetches
    /// the results each round asks for until it is done or truly waiting. The fresh
    /// completions of the jobs in `woke` (those that woke the item) are known from the
    /// start, which spares a round.
    fn evaluate(
        &self,
        key: ItemKey,
        fresh: &HashMap<JobId, Outcome>,
        woke: &[JobId],
        fx: &mut Vec<Effect>,
    ) -> Result<Eval, PlanError> {
        let bench = self.benchmarks[key.bench as usize].ops();
        let mut known: HashMap<JobId, Outcome> = HashMap::new();
        for id in woke {
            // Dead letters are left to the lookups below, which also describe them.
            if let Some(o @ Outcome::Done(_)) = fresh.get(id) {
                known.insert(*id, o.clone());
            }
        }
        loop {
            match bench.evaluate(key.model as usize, key.item, &known)? {
                Plan::Waiting(jobs) => {
                    // Each id hashed once here, and reused to publish.
                    let jobs: Vec<(JobId, JobRequest)> =
                        jobs.into_iter().map(|j| (j.id(), j)).collect();
                    let mut learned = false;
                    for (id, j) in &jobs {
                        if known.contains_key(id) {
                            continue;
                        }
                        let outcome = match fresh.get(id) {
                            Some(o) => Some(o.clone()),
                            None => self.store.result(id)?.map(|r| r.outcome),
                        };
                        if let Some(o) = outcome {
                            if matches!(o, Outcome::Failed(_)) {
                                // Describe the dead letter in the report (rare: not done per job).
                                fx.push(Effect::NoteJob { job: *id, meta: job_meta(j) });
                            }
                            known.insert(*id, o);
                            learned = true;
                        }
                    }
                    if !learned {
                        return Ok(Eval::Waiting(jobs));
                    }
                }
                Plan::Done(label) => return Ok(Eval::Done(label)),
            }
        }
    }

    /// The jobs published and not answered, rebuilt from the active items (the window
    /// keeps only ids), with the notes of dead letters met on the way.
    pub fn outstanding_jobs(&self) -> Result<(Vec<Job>, Vec<Effect>), PlanError> {
        let none = HashMap::new();
        let mut fx = Vec::new();
        let mut jobs: HashMap<JobId, Job> = HashMap::new();
        for key in self.window.active_items() {
            if let Eval::Waiting(reqs) = self.evaluate(key, &none, &[], &mut fx)? {
                for (id, r) in reqs {
                    if self.window.is_waited_on(&id) {
                        jobs.entry(id).or_insert_with(|| job_of(self.run, id, r));
                    }
                }
            }
        }
        Ok((jobs.into_values().collect(), fx))
    }

    /// Jobs published and not answered.
    pub fn outstanding(&self) -> usize {
        self.window.outstanding()
    }

    /// Every item is finished.
    pub fn all_done(&self) -> bool {
        self.progress.figures.items_done >= self.progress.figures.items_total
    }

    /// The run must stop at its cost limit (see [`Meter::stop_at_limit`]): (spent, limit).
    pub fn cost_stop(&self, stalled: bool) -> Option<(f64, f64)> {
        self.meter.stop_at_limit(stalled)
    }

    /// Paid jobs held back by the cost limit.
    pub fn held(&self) -> u64 {
        self.meter.held
    }

    /// The live figures, with the cost totals.
    /// The pools down now (read by the run from the workers' health records); true when
    /// that changed what the progress shows.
    pub fn set_outages(&mut self, down: Vec<crate::outage::PoolOutage>) -> bool {
        let changed = self.progress.figures.outages != down;
        self.progress.figures.outages = down;
        changed
    }

    /// Results messages refused by the collector so far (undecodable, another run's, a
    /// worker's refusal, an unusable object): counted, never stored.
    pub fn set_refused(&mut self, refused: u64) {
        self.progress.figures.refused_messages =
            self.intake_base.refused_messages.saturating_add(refused);
    }

    /// Results refused so far (every process of the run).
    pub fn refused_results(&self) -> u64 {
        self.progress.figures.refused_results
    }

    /// Set the results refused so far back to `n` (refusals that will be counted again
    /// when their messages are delivered once more).
    pub fn set_refused_results(&mut self, n: u64) {
        self.progress.figures.refused_results = n;
    }

    /// The provider batches the run waits for; true when they changed.
    pub fn set_provider_batches(
        &mut self,
        groups: Vec<halyard_proto::provider_batch::BatchGroup>,
    ) -> bool {
        let changed = self.progress.figures.provider_batches != groups;
        self.progress.figures.provider_batches = groups;
        changed
    }

    /// Accepted results left unshared (see [`crate::progress::Figures::unshared`]).
    pub fn set_unshared(&mut self, n: u64) {
        self.progress.figures.unshared = n;
    }

    pub fn progress(&mut self) -> &Progress {
        self.progress.figures.costs = self.meter.totals().to_vec();
        self.progress.figures.max_cost = self.meter.max_cost();
        self.progress.figures.held = self.meter.held;
        &self.progress
    }

    /// The run is over: nothing is active any more.
    pub fn finish(&mut self) {
        self.progress.figures.active = 0;
    }

    pub fn run(&self) -> Uuid {
        self.run
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    /// The store, the planner done with.
    pub fn into_store(self) -> S {
        self.store
    }

    pub fn store_mut(&mut self) -> &mut S {
        &mut self.store
    }
}

/// The job of request `r`, whose id `id` is already known (`Job::new` would hash it again).
/// A result in the store's compact form (outcome, deliveries, cached: what is read back).
fn stored_form(r: &JobResult) -> Result<Vec<u8>, PlanError> {
    let stored = halyard_proto::StoredResult::from(r);
    Ok(halyard_proto::stored::encode_result(&stored).map_err(|e| StoreError::Io(e.to_string()))?)
}

fn job_of(run: Uuid, id: JobId, r: JobRequest) -> Job {
    debug_assert_eq!(id, r.id());
    Job {
        v: halyard_proto::WIRE_VERSION,
        id,
        run,
        pool: r.pool,
        key: r.key,
        timeout_ms: r.timeout_ms,
    }
}

fn job_meta(j: &JobRequest) -> JobMeta {
    JobMeta { pool: j.pool.clone(), stage: j.key.stage.clone(), model: j.key.model.model.clone() }
}

fn job_meta_of(j: &Job) -> JobMeta {
    JobMeta { pool: j.pool.clone(), stage: j.key.stage.clone(), model: j.key.model.model.clone() }
}

//! A run of the coordinator: the roles wired around the planner.
//!
//! - [`planner`]: the pure core (events in, effects out; no IO);
//! - `dispatcher`: publishes jobs (batching, retries) and reaps publish acks;
//! - `collector`: pulls and decodes results, reads max-deliveries advisories;
//! - `backlog`: results that arrived while no coordinator ran, read before planning;
//! - `stall`: jobs lost from the queue, published again or declared lost;
//! - the cost limit: [`halyard_plan::cost::Meter::stop_at_limit`].
//!
//! This module carries out the planner's effects: store writes, then publishes, then one
//! flush, and only then the acks of the results that caused them (group commit, as in
//! the worker). The recovery order is in the crate docs.

use std::future::Future;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures::FutureExt;
use halyard_broker::Broker;
use halyard_proto::Job;
use tokio::sync::watch;
use tracing::{info, warn, Instrument};
use uuid::Uuid;

use halyard_plan::planner::{self, Event, Planner};
use halyard_plan::progress::Progress;
use halyard_plan::store::RunStore;

use crate::state::RunDb;
use crate::{CoordinatorConfig, CoordinatorError};

mod backlog;
mod collector;
mod dispatcher;
pub mod outage;
mod queued;
mod stall;

use collector::Collector;
use dispatcher::Dispatcher;
use outage::FirstContact;
use stall::Stall;

#[derive(Debug, PartialEq)]
pub enum RunOutcome {
    /// Every item finished; the report is written. `dead_letters` of its items' jobs
    /// ended without a result (listed in the report; `halyard retry-failed` runs them
    /// again).
    Complete { run: Uuid, report_dir: std::path::PathBuf, dead_letters: u64 },
    /// Shutdown came first; state is flushed and the run can be resumed.
    Interrupted { run: Uuid },
    /// The cost limit was reached and the calls in flight are back; resumable with a
    /// higher limit.
    CostLimit { run: Uuid, spent: f64, limit: f64 },
    /// A pool's endpoint stayed down longer than `[run] outage_patience_s`: stopped as
    /// interrupted (nothing was dead-lettered for it), resumable once it is back.
    OutageStopped { run: Uuid, outage: halyard_plan::outage::PoolOutage, patience_s: u64 },
    /// A pool with no result in the run had its endpoint down for `[run]
    /// first_contact_s` (issue 48): stopped as interrupted, resumable once fixed;
    /// `message` names the model, its URL and the fix.
    FirstContact { run: Uuid, outage: halyard_plan::outage::PoolOutage, message: String },
}

/// Run the coordinator for `cfg` until the run completes or `shutdown` resolves.
///
/// A sweep whose evaluation reads a dataset built in the same run (`dataset_from`) runs
/// in two phases under one run id: first everything else (the builds write their
/// datasets with the phase's report), then, with the built datasets read in, the whole
/// sweep, whose finished items are skipped as on any resumption.
pub async fn run(
    broker: Broker,
    mut cfg: CoordinatorConfig,
    progress_tx: Option<watch::Sender<Progress>>,
    shutdown: impl Future<Output = ()>,
) -> Result<RunOutcome, CoordinatorError> {
    if cfg.sweep.built_inputs.is_empty() {
        return run_phase(broker, cfg, progress_tx, shutdown, true).await;
    }
    let shutdown = shutdown.shared();
    info!("phase 1 of 2: building the datasets that later benchmarks evaluate on");
    let phase =
        run_phase(broker.clone(), cfg.clone(), progress_tx.clone(), shutdown.clone(), false);
    match phase.await? {
        RunOutcome::Complete { .. } => {}
        stopped => return Ok(stopped),
    }
    halyard_plan::sweep::load_built(&mut cfg.sweep, &cfg.run_dir)?;
    info!("phase 2 of 2: evaluating on the built datasets");
    run_phase(broker, cfg, progress_tx, shutdown, true).await
}

/// One phase, in the recovery order of the crate docs; the `last` one, complete,
/// compacts the run state as it closes it.
async fn run_phase(
    broker: Broker,
    cfg: CoordinatorConfig,
    progress_tx: Option<watch::Sender<Progress>>,
    shutdown: impl Future<Output = ()>,
    last: bool,
) -> Result<RunOutcome, CoordinatorError> {
    // 1. The run state, and the run id created once.
    let state = RunDb::open(&cfg.run_dir.join("state"))?;
    let (meta, created) = state.run_meta(&cfg.sweep.name)?;
    info!(run = %meta.id, name = %meta.name, resumed = !created, "coordinator starting");
    // Steps 2 to 4 wait on the broker (JetStream may not be ready yet): a stop meanwhile
    // ends the phase as interrupted. What they did is what a crash there would leave,
    // which the next start recovers (crate docs).
    // Every event of the run carries its id and name (a span; JSON logs show it too).
    let span = tracing::info_span!("run", run = %meta.id, sweep = %meta.name);
    let mut shutdown = std::pin::pin!(shutdown);
    let start = start(&broker, &cfg, state, meta.id, created, progress_tx, &span);
    let mut c = tokio::select! {
        c = start => c?,
        _ = &mut shutdown => {
            info!(run = %meta.id, "stopped while starting; start again to resume");
            return Ok(RunOutcome::Interrupted { run: meta.id });
        }
    };
    // 5. and 6. Collect results until every item is finished.
    c.compact_when_complete = last;
    c.collector.subscribe_advisories().await?;
    let outcome = c.collect(shutdown).instrument(span).await?;
    c.planner.store().flush().await?;
    // A complete run's state is read from now on, not grown: compacted as it closes,
    // from the copy begun while the report was written.
    if let (RunOutcome::Complete { .. }, Some(pending)) = (&outcome, c.compaction.take()) {
        c.planner.into_store().close_compacted(pending).await;
    }
    Ok(outcome)
}

/// Steps 2 to 4 of a phase: the streams and the run's result consumer; the first window
/// planned; what is queued and what arrived meanwhile noted; the rest published.
async fn start<'s>(
    broker: &Broker,
    cfg: &'s CoordinatorConfig,
    state: RunDb,
    run: Uuid,
    created: bool,
    progress_tx: Option<watch::Sender<Progress>>,
    span: &tracing::Span,
) -> Result<Coordinator<'s>, CoordinatorError> {
    // 2. Streams, every pool's consumer and the run's result consumer. The pools'
    // consumers are made here, before any worker joins (issue 34): an autoscaler reading
    // a pool's lag (KEDA) then reads the pool's own queue from the first job on, not the
    // whole stream's last sequence, which it reports for a consumer that does not exist.
    halyard_broker::init(broker, &Default::default()).await?;
    let delivery = halyard_broker::Delivery {
        ack_wait: cfg.sweep.run.ack_wait,
        max_deliver: cfg.sweep.run.max_deliver,
    };
    for pool in cfg.sweep.pools().keys() {
        halyard_broker::pool_consumer(broker, pool, delivery).await?;
    }
    let consumer = halyard_broker::results_consumer(broker, run).await?;
    let retried = crate::dead_letters::retried(&state)?;
    let state_outages = state.outages()?;
    let planner = Planner::open(&cfg.sweep, state, run, retried)?;
    let mut c = Coordinator {
        cfg,
        planner,
        dispatcher: Dispatcher::new(broker.clone(), run, &cfg.sweep),
        collector: Collector::new(broker.clone(), run, consumer),
        stall: Stall::new(broker.clone(), cfg.sweep.run.ack_wait),
        outages: outage::Outages::new(
            broker.clone(),
            cfg.sweep.pools().into_keys(),
            cfg.sweep.run.outage_patience,
            state_outages,
        )
        .with_first_contact(cfg.sweep.run.first_contact, outage::Endpoint::of(&cfg.sweep)),
        progress_tx: progress_tx.unwrap_or_else(|| watch::channel(Progress::default()).0),
        provider_batches: ProviderBatches::new(broker.clone(), &cfg.sweep),
        compact_when_complete: false,
        compaction: None,
        sharer: None,
    };
    if crate::shared_cache::sharing() {
        c.planner.store_mut().share_pools(crate::shared_cache::pools(&cfg.sweep));
        let marks = c.planner.store().share_marks();
        c.sharer = Some(crate::shared_cache::Sharer::start(broker.clone(), run, marks));
    }
    // The resumed run's results: progress at start, for the outages' pause clocks.
    c.outages.note_results(&c.planner.progress().figures.costs, Instant::now());
    let p = c.planner.progress();
    info!(parent: span, items = p.figures.items_total, done = p.figures.items_done, window = cfg.sweep.run.window, "planning");
    // 3. Plan until the window is full, holding its publishes back; 4. note the jobs
    // still queued (`queued`), read the results that arrived while no coordinator ran
    // (`backlog`); then publish what is neither answered nor queued.
    let fill = c.planner.step(Event::Fill, Instant::now())?;
    c.planner.store_mut().commit(&fill)?;
    let mut held: Vec<(Job, Option<u32>)> = planner::publishes(fill).collect();
    let pools = cfg.sweep.pools();
    let in_stream = match created {
        true => Default::default(), // a new run has nothing queued
        false => queued::in_stream(broker, run, pools.keys()).instrument(span.clone()).await,
    };
    backlog::absorb(broker, &mut c.planner, &mut held).instrument(span.clone()).await?;
    for (job, round) in held {
        if !c.planner.store().has_result(&job.id)? && !queued::holds(&in_stream, &job) {
            c.dispatcher.send(&job, round).await;
        }
    }
    c.dispatcher.send_batches().await;
    c.dispatcher.start_pacing(Instant::now());
    c.planner.store().flush().await?;
    c.publish_progress();
    Ok(c)
}

/// The roles of one phase of a run.
struct Coordinator<'s> {
    cfg: &'s CoordinatorConfig,
    planner: Planner<'s, RunDb>,
    dispatcher: Dispatcher,
    collector: Collector,
    stall: Stall,
    outages: outage::Outages,
    progress_tx: watch::Sender<Progress>,
    provider_batches: ProviderBatches,
    /// The run's last phase: once complete, its state is compacted as it closes.
    compact_when_complete: bool,
    /// The compacted copy begun as the report is written (`complete`).
    compaction: Option<crate::state::PendingCompaction>,
    /// Offers accepted results to the shared result cache (issue 51), when sharing is on.
    sharer: Option<crate::shared_cache::Sharer>,
}

/// The run's batch pools' provider batches, read from the broker now and then for the
/// progress (the coordinator does not need them to run: jobs in a provider batch are held
/// by their workers, so they are in flight, never stalled).
struct ProviderBatches {
    broker: Broker,
    pools: Vec<String>,
    last: Option<Instant>,
}

impl ProviderBatches {
    /// How often the batches bucket is read.
    const EVERY: Duration = Duration::from_secs(5);

    fn new(broker: Broker, sweep: &halyard_plan::sweep::Sweep) -> ProviderBatches {
        let mut pools: Vec<String> = sweep
            .models
            .iter()
            .filter(|m| m.batch.is_some())
            .map(|m| m.spec.pool.clone())
            .collect();
        pools.sort();
        pools.dedup();
        ProviderBatches { broker, pools, last: None }
    }

    /// The batches, when a reading is due.
    async fn poll(&mut self) -> Option<Vec<halyard_proto::provider_batch::BatchGroup>> {
        if self.pools.is_empty() || self.last.is_some_and(|t| t.elapsed() < Self::EVERY) {
            return None;
        }
        self.last = Some(Instant::now());
        Some(halyard_broker::batches::summary(&self.broker, &self.pools).await)
    }
}

impl Coordinator<'_> {
    /// Step the planner and carry out its effects: store writes and publishes (the
    /// partly filled job messages are sent at the end). Nothing is flushed here.
    async fn step(&mut self, event: Event, now: Instant) -> Result<(), CoordinatorError> {
        let effects = self.planner.step(event, now)?;
        // One atomic update, then the publishes (none is durable before the flush).
        self.planner.store_mut().commit(&effects)?;
        for (job, round) in planner::publishes(effects) {
            self.dispatcher.send(&job, round).await;
        }
        self.dispatcher.send_batches().await;
        Ok(())
    }

    fn publish_progress(&mut self) {
        let _ = self.progress_tx.send(self.planner.progress().clone());
    }

    /// Step 4 of recovery, for as long as the run goes: take results in batches, and
    /// watch for advisories, stalls, the cost limit and shutdown between batches.
    async fn collect(
        &mut self,
        shutdown: impl Future<Output = ()>,
    ) -> Result<RunOutcome, CoordinatorError> {
        tokio::pin!(shutdown);
        let run = self.planner.run();
        let mut last_result = Instant::now();
        let mut last_log = Instant::now();
        loop {
            if self.planner.all_done() {
                return self.complete().await;
            }
            // Events that are ready; none of them is waited for here (the pull below
            // returns within PULL_WAIT, so they are seen soon enough).
            if (&mut shutdown).now_or_never().is_some() {
                info!(run = %run, "coordinator stopping; run can be resumed");
                self.dispatcher.drain_for(Duration::from_secs(5)).await;
                return Ok(RunOutcome::Interrupted { run });
            }
            while let Some(adv) = self.collector.next_advisory() {
                self.on_max_deliveries(&adv.payload).await?;
            }
            self.dispatcher.reap_ready().await;
            if self.outages.poll_due() {
                // The latest results first: a pool that answered is not down.
                self.outages.note_results(&self.planner.progress().figures.costs, Instant::now());
            }
            if let Some(down) = self.outages.poll().await {
                if self.outages.take_changed() {
                    self.planner.store().put_outages(&self.outages.spans)?;
                }
                let costs = &self.planner.progress().figures.costs;
                if let Some(fc) = self.outages.first_contact(&down, costs) {
                    warn!(run = %run, pool = %fc.outage.pool, reason = %fc.outage.reason, "{}", fc.message);
                    self.dispatcher.drain().await;
                    self.planner.store().flush().await?;
                    self.planner.set_outages(down);
                    self.publish_progress();
                    let FirstContact { outage, message } = fc;
                    return Ok(RunOutcome::FirstContact { run, outage, message });
                }
                if let Some(o) = self.outages.past_patience(&down).cloned() {
                    let patience_s = self.cfg.sweep.run.outage_patience.as_secs();
                    warn!(run = %run, pool = %o.pool, reason = %o.reason, down_s = o.down_s, patience_s, error = %o.error, "endpoint down longer than outage_patience_s: run stopped (resumable once it is back)");
                    self.dispatcher.drain().await;
                    self.planner.store().flush().await?;
                    self.planner.set_outages(down);
                    self.publish_progress();
                    return Ok(RunOutcome::OutageStopped { run, outage: o, patience_s });
                }
                if self.planner.set_outages(down) {
                    self.publish_progress();
                }
            }
            if let Some(groups) = self.provider_batches.poll().await {
                if self.planner.set_provider_batches(groups) {
                    self.publish_progress();
                }
            }
            let stalled = last_result.elapsed() > self.stall.after;
            if let Some((spent, limit)) = self.planner.cost_stop(stalled) {
                // Jobs lost meanwhile are planned again when the run resumes.
                warn!(run = %run, spent, limit, held = self.planner.held(), "cost limit reached; run stopped (resumable with a higher --max-cost)");
                self.dispatcher.drain().await;
                self.publish_progress();
                return Ok(RunOutcome::CostLimit { run, spent, limit });
            }
            if stalled {
                if let Some(jobs) =
                    self.stall.check(&mut self.planner, &mut self.dispatcher).await?
                {
                    let error = "job was lost from the queue three times (max_deliver reached without a result)";
                    self.record_lost(jobs, error.to_string(), 0).await?;
                }
                last_result = Instant::now();
            }
            let msgs = self.collector.pull().await;
            if msgs.is_empty() {
                continue;
            }
            last_result = Instant::now();
            self.stall.progressed();
            self.on_results(&msgs).await?;
            if last_log.elapsed() > Duration::from_secs(5) {
                last_log = Instant::now();
                let p = self.planner.progress();
                info!(
                    done = p.figures.items_done,
                    total = p.figures.items_total,
                    results = p.figures.results,
                    active = p.figures.active,
                    dead_letters = p.figures.dead_letters,
                    "progress"
                );
            }
        }
    }

    /// Every item is finished (step 5): the report.
    async fn complete(&mut self) -> Result<RunOutcome, CoordinatorError> {
        let run = self.planner.run();
        self.dispatcher.drain().await;
        self.outages.refresh().await;
        if self.outages.take_changed() {
            self.planner.store().put_outages(&self.outages.spans)?;
        }
        self.planner.store().flush().await?;
        // What is left for the run now is duplicates and junk: taken, counted and acked,
        // so that nothing of a complete run lingers in the results stream.
        self.collector.drain().await;
        self.planner.set_refused(self.collector.refused);
        if let Some(e) = self.planner.intake_effect() {
            self.planner.store_mut().commit(&[e])?;
            self.planner.store().flush().await?;
        }
        self.planner.finish();
        let p = self.planner.progress();
        info!(run = %run, results = p.figures.results, batches = p.result_batches, "all items done; writing the report");
        self.publish_progress();
        // Nothing more is written to the run state: its compacted copy is made (on
        // another thread) while the report reads it too.
        // The sharing task writes to the run state (its marks): done before the copy.
        if let Some(s) = self.sharer.take() {
            // As long as a refused write is tried again (`halyard_cache::shared`).
            if let Some(left) = s.close(Duration::from_secs(30)).await {
                self.planner.set_unshared(left);
                self.publish_progress();
            }
        }
        if self.compact_when_complete {
            self.compaction = Some(self.planner.store().begin_compaction());
        }
        let w = crate::report::write(self.cfg, self.planner.store(), run)?;
        self.collector.delete_objects().await;
        info!(run = %run, report = %w.dir.display(), dead_letters = w.dead_letters, "run complete");
        Ok(RunOutcome::Complete { run, report_dir: w.dir, dead_letters: w.dead_letters })
    }

    /// One batch of results: store, re-plan, flush, then ack.
    async fn on_results(&mut self, msgs: &[jetstream::Message]) -> Result<(), CoordinatorError> {
        let now = Instant::now();
        let opened = self.collector.open(msgs).await;
        let mut arrived = Vec::with_capacity(msgs.len());
        for (m, o) in msgs.iter().zip(&opened) {
            if let Some(payload) = o.bytes() {
                arrived.extend(self.collector.decode(&m.subject, payload));
            }
        }
        self.planner.set_refused(self.collector.refused);
        self.step(Event::Results(arrived), now).await?;
        // A pool whose results were accepted is not down, whatever its record says.
        let now = Instant::now();
        if self.outages.results_due(now) {
            self.outages.note_results(&self.planner.progress().figures.costs, now);
        }
        // Durable before acked.
        self.planner.store().flush().await?;
        if let Some(s) = &self.sharer {
            // Completions accepted since the last batch (marked in the run state with
            // them): this batch's, and any the backlog read at start; and answers read
            // from the shared cache, whose entries' use is counted.
            let (marked, used) = self.planner.store().take_marked();
            s.offer(marked);
            s.used(used);
        }
        Collector::ack(msgs, &opened).await;
        if self.sharer.is_some() {
            crate::shared_cache::failpoint::acked();
        }
        self.publish_progress();
        Ok(())
    }

    /// A job hit `max_deliver` without any worker publishing a result (it crashed the
    /// worker each time, say): record it as a dead letter so the run does not wait on it.
    async fn on_max_deliveries(&mut self, payload: &[u8]) -> Result<(), CoordinatorError> {
        let Some(md) = self.collector.max_delivered(payload).await else { return Ok(()) };
        // A worker may have published a real result after all (its last delivery's
        // answer, after the advisory): take every result waiting first, so such a job
        // keeps its result (the planner ignores a loss of a job that has one).
        loop {
            let msgs = self.collector.pull().await;
            if msgs.is_empty() {
                break;
            }
            self.stall.progressed();
            self.on_results(&msgs).await?;
        }
        let error = format!(
            "delivered {} times without a result (max_deliver reached; did the worker crash on it?)",
            md.deliveries
        );
        // Durable (record_lost flushes) before the job message goes.
        self.record_lost(md.jobs, error, md.deliveries).await?;
        self.collector.delete_job_message(md.seq).await;
        Ok(())
    }

    /// Record dead letters the coordinator made itself, re-plan, and commit.
    async fn record_lost(
        &mut self,
        jobs: Vec<halyard_proto::Job>,
        error: String,
        deliveries: u64,
    ) -> Result<(), CoordinatorError> {
        self.step(Event::Lost { jobs, error, deliveries }, Instant::now()).await?;
        self.planner.store().flush().await?;
        self.publish_progress();
        Ok(())
    }
}

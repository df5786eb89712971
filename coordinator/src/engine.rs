//! The coordinator's loop: plan a window of items, publish their jobs, collect results,
//! re-plan, refill the window, report.
//!
//! Per batch of results (group commit, as in the worker): store each result (first one
//! wins), re-evaluate the items that waited on them, publish their next jobs and refill
//! the window, then flush the run state once, and only then ack the batch's messages.
//! Job publishes are pipelined: their broker acks are awaited in the background (at most
//! [`MAX_UNCONFIRMED`] at a time) and only logged; a publish that never reached the
//! stream is caught by the stall check.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use halyard_broker::Broker;
use halyard_pipelines::common::{JobRequest, Progress as Plan};
use halyard_pipelines::{autohall, chainpoll, hvi, hypotermqa, hypotermqa_build, noop, uhgeval};
use halyard_proto::{subjects, Failure, FailureKind, Job, JobId, JobResult, Outcome};
use serde::Deserialize;
use tokio::sync::watch;
use tracing::{debug, info, warn, Instrument};
use uuid::Uuid;

use crate::latency::LatencyHistogram;
use crate::state::{ItemKey, JobMeta, RunState};
use crate::sweep::Benchmark;
use crate::window::Window;
use crate::{CoordinatorConfig, CoordinatorError};

mod backlog;

/// Job publishes whose broker ack is not yet in (async-nats allows 5,000 by default).
const MAX_UNCONFIRMED: usize = 4096;
/// Results taken from the broker at most per group commit.
const RESULT_BATCH: usize = 2048;
/// After a commit of at least LINGER_AFTER results (the run is busy), the next pull
/// waits LINGER first, so that more results go into one commit (a sled flush costs
/// about as much as a hundred result writes).
const LINGER_AFTER: usize = 32;
const LINGER: Duration = Duration::from_millis(2);
/// How long an idle pull waits at the broker for a result.
const PULL_WAIT: Duration = Duration::from_millis(500);

/// Live figures of a run, published on a watch channel.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Progress {
    pub run: Option<Uuid>,
    pub items_total: u64,
    pub items_done: u64,
    pub results: u64,
    pub duplicates: u64,
    pub dead_letters: u64,
    pub published: u64,
    /// Items planned and unfinished (bounded by the window).
    pub active: u64,
    /// Batches of results committed (one flush each).
    pub batches: u64,
    /// Publish-to-result latency of the jobs this process published.
    pub latency: LatencyHistogram,
    /// Items per benchmark and model under test.
    pub targets: Vec<crate::progress::TargetProgress>,
    /// Tokens, calls and cost per (model, stage), all processes of the run.
    pub costs: Vec<crate::cost::ClassTotals>,
    /// `[run] max_cost` / `--max-cost`, and paid jobs held back because it was reached.
    pub max_cost: Option<f64>,
    pub held: u64,
}

#[derive(Debug, PartialEq)]
pub enum RunOutcome {
    /// Every item finished; the report is written.
    Complete { run: Uuid, report_dir: std::path::PathBuf },
    /// Shutdown came first; state is flushed and the run can be resumed.
    Interrupted { run: Uuid },
    /// The cost limit was reached and the calls in flight are back; resumable with a
    /// higher limit.
    CostLimit { run: Uuid, spent: f64, limit: f64 },
}

type AckFuture = <jetstream::context::PublishAckFuture as std::future::IntoFuture>::IntoFuture;

struct Engine {
    cfg: CoordinatorConfig,
    broker: Broker,
    state: RunState,
    run: Uuid,
    window: Window,
    acks: FuturesUnordered<AckFuture>,
    /// Subject of each pool (computing it hashes odd pool names).
    subjects: HashMap<String, async_nats::Subject>,
    progress: Progress,
    progress_tx: watch::Sender<Progress>,
    republish_round: u32,
    /// Jobs re-queued by `halyard retry-failed`, with their round (see `dead_letters`).
    retried: HashMap<JobId, u32>,
    /// Items were already finished when this process started: the window's walk must
    /// skip them. (Without any, no item ahead of the walk can be finished, and the walk
    /// need not ask the store.)
    resumed_done: bool,
    meter: crate::cost::Meter,
    /// Jobs planned per pool and not sent yet (`[run] job_batch` > 1).
    job_bufs: HashMap<String, JobBuf>,
}

/// The next job message of a pool: its jobs' encodings, ids and total size.
#[derive(Default)]
struct JobBuf {
    encoded: Vec<Vec<u8>>,
    ids: Vec<JobId>,
    bytes: usize,
}

/// A job message is sent once its jobs take this many bytes, whatever `job_batch` says
/// (NATS refuses messages over 1 MiB by default).
const MAX_JOB_MESSAGE_BYTES: usize = 256 << 10;

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
        return run_phase(broker, cfg, progress_tx, shutdown).await;
    }
    let shutdown = shutdown.shared();
    info!("phase 1 of 2: building the datasets that later benchmarks evaluate on");
    if let RunOutcome::Interrupted { run } = run_phase(broker.clone(), cfg.clone(), progress_tx.clone(), shutdown.clone()).await? {
        return Ok(RunOutcome::Interrupted { run });
    }
    crate::sweep::build::load_built(&mut cfg.sweep, &cfg.run_dir)?;
    info!("phase 2 of 2: evaluating on the built datasets");
    run_phase(broker, cfg, progress_tx, shutdown).await
}

async fn run_phase(
    broker: Broker,
    cfg: CoordinatorConfig,
    progress_tx: Option<watch::Sender<Progress>>,
    shutdown: impl Future<Output = ()>,
) -> Result<RunOutcome, CoordinatorError> {
    let state = RunState::open(&cfg.run_dir.join("state"))?;
    let (meta, created) = state.run_meta(&cfg.sweep.name)?;
    info!(run = %meta.id, name = %meta.name, resumed = !created, "coordinator starting");
    halyard_broker::ensure_streams(&broker).await?;
    let consumer = halyard_broker::results_consumer(&broker, meta.id).await?;
    let items_total = cfg.sweep.benchmarks.iter().map(|b| (b.model_count() * b.item_count()) as u64).sum();
    let shape: Vec<(u32, u32)> = cfg.sweep.benchmarks.iter().map(|b| (b.model_count() as u32, b.item_count() as u32)).collect();
    let window = Window::new(&shape, cfg.sweep.run.window);
    let progress_tx = progress_tx.unwrap_or_else(|| watch::channel(Progress::default()).0);
    let retried = crate::dead_letters::retried(&state)?;
    let items_done = state.done_count() as u64;
    let results = state.results_at_open();
    let mut meter = crate::cost::Meter::new(&cfg.sweep);
    meter.restore(state.costs()?);
    let targets = crate::progress::targets(&cfg.sweep, &state);
    let mut e = Engine {
        cfg,
        broker,
        state,
        run: meta.id,
        window,
        acks: FuturesUnordered::new(),
        subjects: HashMap::new(),
        progress: Progress { run: Some(meta.id), items_total, items_done, results, targets, ..Default::default() },
        progress_tx,
        republish_round: 0,
        retried: HashMap::new(),
        resumed_done: items_done > 0,
        meter,
        job_bufs: HashMap::new(),
    };
    e.retried = retried;
    e.absorb_backlog().await?;
    // Every event of the run carries its id and name (a span; JSON logs show it too).
    let span = tracing::info_span!("run", run = %meta.id, sweep = %meta.name);
    info!(parent: &span, items = items_total, done = items_done, window = e.cfg.sweep.run.window, "planning");
    e.fill().instrument(span.clone()).await?;
    e.state.flush().await?;
    e.publish_progress();
    let advisories = e
        .broker
        .client
        .subscribe(format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{}.>", subjects::JOBS_STREAM))
        .await
        .map_err(|err| halyard_broker::BrokerError::js("subscribe to max-deliveries advisories", err))?;
    let outcome = e.collect(consumer, advisories, shutdown).instrument(span).await?;
    e.state.flush().await?;
    Ok(outcome)
}

impl Engine {
    /// Evaluate an item against stored results (and `fresh` ones, received in this batch
    /// and not yet read back from sled). Pipelines reveal one stage at a time, so this
    /// fetches the results each round asks for until it is done or truly waiting. The
    /// fresh completions of the jobs in `woke` (those that woke the item) are known from
    /// the start, which spares a round.
    fn evaluate(&self, key: ItemKey, fresh: &HashMap<JobId, Outcome>, woke: &[JobId]) -> Result<Eval, CoordinatorError> {
        let bench = &self.cfg.sweep.benchmarks[key.bench as usize];
        let mut known: HashMap<JobId, Outcome> = HashMap::new();
        for id in woke {
            // Dead letters are left to the lookups below, which also describe them.
            if let Some(o @ Outcome::Done(_)) = fresh.get(id) {
                known.insert(*id, o.clone());
            }
        }
        loop {
            let (m, i) = (key.model as usize, key.item as usize);
            let plan = match bench {
                Benchmark::HypoTermQa { config, questions, .. } => encoded(hypotermqa::evaluate(&config[m], &questions[i], &known))?,
                Benchmark::Noop { config, .. } => encoded(noop::evaluate(&config[m], key.item as u64, &known))?,
                Benchmark::AutoHall { config, claims, .. } => encoded(autohall::evaluate(&config[m], key.item, &claims[i], &known))?,
                Benchmark::ChainPoll { config, items, .. } => encoded(chainpoll::evaluate(&config[m], key.item, &items[i], &known))?,
                Benchmark::UhgEval { config, cases, .. } => encoded(uhgeval::evaluate(&config[m], &cases[i], &known))?,
                Benchmark::HviJudge { config, prompts, .. } => encoded(hvi::evaluate(&config[m], &prompts[i], &known))?,
                Benchmark::HviLabels { models, rows, .. } => encoded(Plan::Done(hvi::evaluate_labelled(&models[m], rows)))?,
                Benchmark::HypoTermQaBuild { config, .. } => encoded(hypotermqa_build::evaluate(&config[m], key.item as u64, &known))?,
            };
            match plan {
                Plan::Waiting(jobs) => {
                    // Each id hashed once here, and reused to publish.
                    let jobs: Vec<(JobId, JobRequest)> = jobs.into_iter().map(|j| (j.id(), j)).collect();
                    let mut learned = false;
                    for (id, j) in &jobs {
                        if known.contains_key(id) {
                            continue;
                        }
                        let outcome = match fresh.get(id) {
                            Some(o) => Some(o.clone()),
                            None => self.state.result(id)?.map(|r| r.outcome),
                        };
                        if let Some(o) = outcome {
                            if matches!(o, Outcome::Failed(_)) {
                                // Describe the dead letter in the report (rare: not done per job).
                                self.state.note_job(id, &job_meta(j))?;
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

    /// Take items into the window while it has room: skip those finished in an earlier
    /// process, plan the others and publish what they wait for. On a fresh start this is
    /// step 3 of recovery; later it keeps the window full as items finish.
    async fn fill(&mut self) -> Result<(), CoordinatorError> {
        let none = HashMap::new();
        while let Some(key) = self.window.next_candidate() {
            if self.resumed_done && self.state.is_done(key)? {
                continue;
            }
            match self.evaluate(key, &none, &[])? {
                Eval::Done(label) => {
                    self.state.mark_done(key, &label)?;
                    self.progress.item_done(key);
                }
                Eval::Waiting(jobs) => {
                    self.window.activate(key);
                    self.wait_for(key, jobs).await;
                }
            }
        }
        self.flush_jobs().await;
        self.progress.active = self.window.active_count() as u64;
        Ok(())
    }

    /// Active item `key` waits on `jobs`: publish those nobody waits on yet.
    async fn wait_for(&mut self, key: ItemKey, jobs: Vec<(JobId, JobRequest)>) {
        let now = Instant::now();
        for (id, j) in jobs {
            if self.window.wait_on(key, id, now) {
                if !self.meter.may_publish(&j) {
                    self.meter.held += 1;
                    continue;
                }
                self.meter.published(&j, id);
                let job = job_of(self.run, id, j);
                let round = self.retried.get(&job.id).map(|r| crate::dead_letters::MSG_ID_ROUND_BASE + r);
                self.send(&job, round).await;
                self.progress.published += 1;
            }
        }
    }

    /// Publish `job`, or with `[run] job_batch` > 1 add it to its pool's next job
    /// message (sent when full, and at the end of every planning round by
    /// [`Engine::flush_jobs`]). A re-publish (`suffix`) always goes alone.
    async fn send(&mut self, job: &Job, suffix: Option<u32>) {
        let payload = match halyard_proto::encode(job) {
            Ok(p) => p,
            Err(err) => {
                warn!(job = %job.id, error = %err, "cannot encode job");
                return;
            }
        };
        let batch = self.cfg.sweep.run.job_batch;
        if suffix.is_none() && batch > 1 {
            let buf = self.job_bufs.entry(job.pool.clone()).or_default();
            buf.bytes += payload.len();
            buf.ids.push(job.id);
            buf.encoded.push(payload);
            if buf.ids.len() >= batch || buf.bytes >= MAX_JOB_MESSAGE_BYTES {
                if let Some(buf) = self.job_bufs.remove(&job.pool) {
                    self.publish_jobs(&job.pool, buf).await;
                }
            }
            return;
        }
        let mut msg_id = subjects::result_msg_id(self.run, &job.id);
        if let Some(n) = suffix {
            msg_id.push_str(&format!(":r{n}"));
        }
        self.publish(&job.pool, bytes::Bytes::from(payload), msg_id).await;
    }

    /// Send every pool's partly filled job message.
    async fn flush_jobs(&mut self) {
        let bufs: Vec<(String, JobBuf)> = self.job_bufs.drain().collect();
        for (pool, buf) in bufs {
            self.publish_jobs(&pool, buf).await;
        }
    }

    /// One job message holding `buf`'s jobs (a lone job is sent as itself). Its
    /// `Nats-Msg-Id` is a hash of the run and the job ids, as for result batches.
    async fn publish_jobs(&mut self, pool: &str, buf: JobBuf) {
        if buf.ids.is_empty() {
            return;
        }
        let msg_id = halyard_proto::batch_msg_id(self.run, &buf.ids);
        let payload = match buf.encoded.len() {
            1 => buf.encoded.into_iter().next().unwrap_or_default(),
            _ => halyard_proto::encode_batch(&buf.encoded),
        };
        self.publish(pool, bytes::Bytes::from(payload), msg_id).await;
    }

    async fn publish(&mut self, pool: &str, payload: bytes::Bytes, msg_id: String) {
        let subject = match self.subjects.get(pool) {
            Some(s) => s.clone(),
            None => {
                let s = async_nats::Subject::from(subjects::job_subject(pool));
                self.subjects.insert(pool.to_string(), s.clone());
                s
            }
        };
        // Each unconfirmed publish holds one of async-nats's ack permits: keep below its limit.
        while self.acks.len() >= MAX_UNCONFIRMED {
            self.reap_one().await;
        }
        let mut delay = Duration::from_millis(100);
        loop {
            let m = jetstream::message::PublishMessage::build().payload(payload.clone()).message_id(&msg_id);
            match self.broker.js.send_publish(subject.clone(), m).await {
                Ok(ack) => {
                    self.acks.push(std::future::IntoFuture::into_future(ack));
                    return;
                }
                Err(err) => {
                    warn!(msg_id, error = %err, "job publish failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    async fn reap_one(&mut self) {
        if let Some(Err(err)) = self.acks.next().await {
            // The stall check re-publishes jobs that never reached the stream.
            warn!(error = %err, "job publish not acknowledged");
        }
    }

    async fn drain_acks(&mut self) {
        while !self.acks.is_empty() {
            self.reap_one().await;
        }
    }

    fn publish_progress(&mut self) {
        self.progress.costs = self.meter.totals().to_vec();
        self.progress.max_cost = self.meter.max_cost();
        self.progress.held = self.meter.held;
        let _ = self.progress_tx.send(self.progress.clone());
    }

    /// One batch of results. While results are queued, take what is there at once
    /// (no_wait), after waiting LINGER when the last batch was large (more then arrive
    /// in one commit). When idle, wait at the broker up to PULL_WAIT for the first one.
    /// Every pull request ends within PULL_WAIT and its batch is taken whole, so when the
    /// loop stops (between batches) no request is left open at the broker to take
    /// results nobody will ack before `ack_wait` (a continuous pull would leave one).
    async fn pull(consumer: &halyard_broker::PullConsumer, idle: bool, last_batch: usize) -> Vec<jetstream::Message> {
        let batch = if idle {
            // One message only: nats-server 2.9 does not always end a partly filled
            // waiting pull when it expires, and the client then waits 5 s more.
            consumer.batch().max_messages(1).expires(PULL_WAIT).messages().await
        } else {
            if last_batch >= LINGER_AFTER {
                tokio::time::sleep(LINGER).await;
            }
            consumer.fetch().max_messages(RESULT_BATCH).messages().await
        };
        let mut batch = match batch {
            Ok(b) => b,
            Err(err) => {
                warn!(error = %err, "cannot pull results; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
                return Vec::new();
            }
        };
        let mut msgs = Vec::new();
        while let Some(m) = batch.next().await {
            match m {
                Ok(m) => msgs.push(m),
                Err(err) => {
                    debug!(error = %err, "result batch ended");
                    break;
                }
            }
        }
        msgs
    }

    async fn collect(
        &mut self,
        consumer: halyard_broker::PullConsumer,
        mut advisories: async_nats::Subscriber,
        shutdown: impl Future<Output = ()>,
    ) -> Result<RunOutcome, CoordinatorError> {
        tokio::pin!(shutdown);
        let mut last_result = Instant::now();
        let mut last_log = Instant::now();
        let stall_after = (self.cfg.sweep.run.ack_wait * 2).max(Duration::from_secs(20));
        let (mut idle, mut last_batch) = (true, 0);
        loop {
            if self.progress.items_done >= self.progress.items_total {
                self.drain_acks().await;
                self.state.flush().await?;
                self.progress.active = 0;
                info!(run = %self.run, results = self.progress.results, batches = self.progress.batches, "all items done; writing the report");
                self.publish_progress();
                let dir = crate::report::write(&self.cfg, &self.state, self.run)?;
                info!(run = %self.run, report = %dir.display(), "run complete");
                return Ok(RunOutcome::Complete { run: self.run, report_dir: dir });
            }
            // Events that are ready; none of them is waited for here (the pull below
            // returns within PULL_WAIT, so they are seen soon enough).
            if (&mut shutdown).now_or_never().is_some() {
                info!(run = %self.run, "coordinator stopping; run can be resumed");
                self.drain_acks().await;
                return Ok(RunOutcome::Interrupted { run: self.run });
            }
            while let Some(Some(adv)) = advisories.next().now_or_never() {
                self.on_max_deliveries(&adv.payload).await?;
            }
            while !self.acks.is_empty() {
                match self.acks.next().now_or_never() {
                    Some(Some(Err(err))) => warn!(error = %err, "job publish not acknowledged"),
                    Some(_) => {}
                    None => break,
                }
            }
            if self.meter.limit_reached() && (self.meter.in_flight() == 0 || last_result.elapsed() > stall_after) {
                // Jobs lost meanwhile are planned again when the run resumes.
                let (spent, limit) = (self.meter.spent(), self.meter.max_cost().unwrap_or_default());
                warn!(run = %self.run, spent, limit, held = self.meter.held, "cost limit reached; run stopped (resumable with a higher --max-cost)");
                self.drain_acks().await;
                self.publish_progress();
                return Ok(RunOutcome::CostLimit { run: self.run, spent, limit });
            }
            if last_result.elapsed() > stall_after {
                self.check_stall().await?;
                last_result = Instant::now();
            }
            let msgs = Self::pull(&consumer, idle, last_batch).await;
            idle = msgs.is_empty();
            last_batch = msgs.len();
            if msgs.is_empty() {
                continue;
            }
            last_result = Instant::now();
            self.on_results(&msgs).await?;
            if last_log.elapsed() > Duration::from_secs(5) {
                last_log = Instant::now();
                info!(
                    done = self.progress.items_done,
                    total = self.progress.items_total,
                    results = self.progress.results,
                    active = self.progress.active,
                    dead_letters = self.progress.dead_letters,
                    "progress"
                );
            }
        }
    }

    /// Step 4 of recovery, for one batch: store, re-plan, flush, then ack.
    async fn on_results(&mut self, msgs: &[jetstream::Message]) -> Result<(), CoordinatorError> {
        let now = Instant::now();
        let mut fresh: HashMap<JobId, Outcome> = HashMap::with_capacity(msgs.len());
        let mut affected: Vec<(ItemKey, JobId)> = Vec::new();
        for m in msgs {
            self.store_results(&m.payload, now, &mut affected, &mut fresh)?;
        }
        self.replan(affected, &fresh).await?;
        self.state.put_costs(self.meter.totals())?;
        // Durable before acked.
        self.state.flush().await?;
        self.progress.batches += 1;
        for m in msgs {
            if let Err(err) = m.ack().await {
                debug!(error = %err, "result ack failed; it will be redelivered and recognised as a duplicate");
            }
        }
        self.publish_progress();
        Ok(())
    }

    /// Store the results of one message (one result, or a worker's batch of them; each
    /// stored as it was encoded) and account for them; returns how many were for this run.
    fn store_results(
        &mut self,
        payload: &[u8],
        now: Instant,
        affected: &mut Vec<(ItemKey, JobId)>,
        fresh: &mut HashMap<JobId, Outcome>,
    ) -> Result<usize, CoordinatorError> {
        let results = match halyard_proto::decode_results(payload) {
            Ok(r) => r,
            Err(err) => {
                warn!(error = %err, "undecodable result message; dropping it");
                return Ok(0);
            }
        };
        let mut n = 0;
        for (r, bytes) in results {
            if r.run != self.run {
                debug!(run = %r.run, "result for another run; ignoring");
                continue;
            }
            let new = self.state.insert_result_raw(&r.job, &payload[bytes])?;
            self.account(r, new, now, affected, fresh);
            n += 1;
        }
        Ok(n)
    }

    /// Count a stored result (`new`) or a duplicate; collect the items it wakes.
    fn account(
        &mut self,
        r: JobResult,
        new: bool,
        now: Instant,
        affected: &mut Vec<(ItemKey, JobId)>,
        fresh: &mut HashMap<JobId, Outcome>,
    ) {
        let waiter = self.window.on_result(&r.job);
        if let Some(w) = &waiter {
            affected.extend(w.items().map(|k| (k, r.job)));
        }
        if !new {
            self.progress.duplicates += 1;
            return;
        }
        self.progress.results += 1;
        self.meter.record(&r);
        if let Some(w) = &waiter {
            self.progress.latency.record(now.saturating_duration_since(w.published_at));
        }
        if let Outcome::Failed(f) = &r.outcome {
            self.progress.dead_letters += 1;
            warn!(job = %r.job, error = %f.error, "dead letter");
        }
        fresh.insert(r.job, r.outcome);
    }

    /// Record a result the coordinator made itself (a dead letter), then re-plan and flush.
    async fn record_own(&mut self, results: Vec<JobResult>) -> Result<(), CoordinatorError> {
        let now = Instant::now();
        let mut fresh = HashMap::new();
        let mut affected = Vec::new();
        for r in results {
            let new = self.state.insert_result(&r)?;
            self.account(r, new, now, &mut affected, &mut fresh);
        }
        self.replan(affected, &fresh).await?;
        self.state.put_costs(self.meter.totals())?;
        self.state.flush().await?;
        self.publish_progress();
        Ok(())
    }

    async fn replan(
        &mut self,
        mut affected: Vec<(ItemKey, JobId)>,
        fresh: &HashMap<JobId, Outcome>,
    ) -> Result<(), CoordinatorError> {
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
            match self.evaluate(key, fresh, &woke)? {
                Eval::Done(label) => {
                    self.state.mark_done(key, &label)?;
                    self.window.finish(key);
                    self.progress.item_done(key);
                }
                Eval::Waiting(jobs) => self.wait_for(key, jobs).await,
            }
        }
        self.fill().await
    }

    /// A job hit `max_deliver` without any worker publishing a result (e.g. it crashed
    /// the worker each time): record it as a dead letter so the run does not wait on it.
    async fn on_max_deliveries(&mut self, payload: &[u8]) -> Result<(), CoordinatorError> {
        #[derive(Deserialize)]
        struct Adv {
            stream_seq: u64,
            deliveries: u64,
        }
        let Ok(adv) = serde_json::from_slice::<Adv>(payload) else {
            warn!("unreadable max-deliveries advisory");
            return Ok(());
        };
        let Ok(stream) = self.broker.js.get_stream(subjects::JOBS_STREAM).await else { return Ok(()) };
        let Ok(msg) = stream.get_raw_message(adv.stream_seq).await else { return Ok(()) };
        // One job, or a batch of them (`[run] job_batch`): each of this run's jobs that
        // has no result yet becomes a dead letter.
        let Ok(jobs) = halyard_proto::decode_jobs(&msg.payload) else { return Ok(()) };
        let jobs: Vec<Job> = jobs.into_iter().filter(|j| j.run == self.run).collect();
        if jobs.is_empty() {
            return Ok(());
        }
        let _ = stream.delete_message(adv.stream_seq).await;
        let error =
            format!("delivered {} times without a result (max_deliver reached; did the worker crash on it?)", adv.deliveries);
        let mut dead = Vec::new();
        for job in &jobs {
            if self.state.result(&job.id)?.is_some() {
                continue;
            }
            self.state.note_job(&job.id, &job_meta_of(job))?;
            dead.push(self.own_dead_letter(job.id, error.clone(), adv.deliveries));
        }
        self.record_own(dead).await
    }

    fn own_dead_letter(&self, job: JobId, error: String, deliveries: u64) -> JobResult {
        JobResult {
            v: halyard_proto::WIRE_VERSION,
            job,
            run: self.run,
            outcome: Outcome::Failed(Failure { kind: FailureKind::Exhausted, error, http_status: None }),
            deliveries,
            worker: "coordinator".into(),
            cached: false,
        }
    }

    /// The outstanding jobs, rebuilt from the active items (the window keeps only ids).
    fn outstanding_jobs(&self) -> Result<Vec<Job>, CoordinatorError> {
        let none = HashMap::new();
        let mut jobs: HashMap<JobId, Job> = HashMap::new();
        for key in self.window.active_items() {
            if let Eval::Waiting(reqs) = self.evaluate(key, &none, &[])? {
                for (id, r) in reqs {
                    if self.window.is_waited_on(&id) {
                        jobs.entry(id).or_insert_with(|| job_of(self.run, id, r));
                    }
                }
            }
        }
        Ok(jobs.into_values().collect())
    }

    /// No result for a while: if the broker holds nothing pending or in flight for pools
    /// with outstanding jobs, those jobs were lost (stream purged, publish never stored,
    /// or stranded after max_deliver while no coordinator listened): publish them again
    /// under a fresh message id. After three rounds a job is declared a dead letter.
    async fn check_stall(&mut self) -> Result<(), CoordinatorError> {
        if self.window.outstanding() == 0 {
            return Ok(());
        }
        let jobs = self.outstanding_jobs()?;
        let pools: HashSet<String> = jobs.iter().map(|j| j.pool.clone()).collect();
        let Ok(stream) = self.broker.js.get_stream(subjects::JOBS_STREAM).await else { return Ok(()) };
        for pool in &pools {
            let name = subjects::pool_consumer(pool);
            match stream.consumer_info(&name).await {
                Ok(info) if info.num_pending == 0 && info.num_ack_pending == 0 => {}
                Ok(_) => return Ok(()),  // work is queued or in flight: not a stall
                Err(_) => return Ok(()), // no consumer yet: no worker has joined; jobs wait in the stream
            }
        }
        self.republish_round += 1;
        let round = self.republish_round;
        if round > 3 {
            warn!(jobs = jobs.len(), "outstanding jobs vanished three times; recording them as dead letters");
            let mut dead = Vec::new();
            for job in &jobs {
                self.state.note_job(&job.id, &job_meta_of(job))?;
                let error = "job was lost from the queue three times (max_deliver reached without a result)".to_string();
                dead.push(self.own_dead_letter(job.id, error, 0));
            }
            return self.record_own(dead).await;
        }
        warn!(jobs = jobs.len(), round, "no pending work on the broker for outstanding jobs; publishing them again");
        for job in &jobs {
            self.send(job, Some(round)).await;
        }
        self.drain_acks().await;
        Ok(())
    }
}

/// A plan with its label serialised for the run state.
fn encoded<T: serde::Serialize>(plan: Plan<T>) -> Result<Plan<Vec<u8>>, CoordinatorError> {
    Ok(match plan {
        Plan::Done(label) => Plan::Done(
            serde_json::to_vec(&label).map_err(|err| CoordinatorError::Report { dir: "<memory>".into(), reason: err.to_string() })?,
        ),
        Plan::Waiting(jobs) => Plan::Waiting(jobs),
    })
}

/// An item's evaluation: done, with its label, or waiting on jobs (with their ids).
enum Eval {
    Done(Vec<u8>),
    Waiting(Vec<(JobId, JobRequest)>),
}

/// The job of request `r`, whose id `id` is already known (`Job::new` would hash it again).
fn job_of(run: Uuid, id: JobId, r: JobRequest) -> Job {
    debug_assert_eq!(id, r.id());
    Job { v: halyard_proto::WIRE_VERSION, id, run, pool: r.pool, key: r.key, api_key_env: r.api_key_env, timeout_ms: r.timeout_ms }
}

fn job_meta(j: &JobRequest) -> JobMeta {
    JobMeta { pool: j.pool.clone(), stage: j.key.stage.clone(), model: j.key.model.model.clone() }
}

fn job_meta_of(j: &Job) -> JobMeta {
    JobMeta { pool: j.pool.clone(), stage: j.key.stage.clone(), model: j.key.model.model.clone() }
}

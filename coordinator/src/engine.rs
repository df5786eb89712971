//! The coordinator's loop: plan, publish, collect, re-plan, report.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use halyard_broker::Broker;
use halyard_pipelines::common::{JobRequest, Progress as Plan};
use halyard_pipelines::hypotermqa;
use halyard_proto::{subjects, Failure, FailureKind, Job, JobId, JobResult, Outcome};
use serde::Deserialize;
use tokio::sync::watch;
use tracing::{debug, info, warn};
use uuid::Uuid;

use crate::state::{ItemKey, JobMeta, RunState};
use crate::sweep::Benchmark;
use crate::{CoordinatorConfig, CoordinatorError};

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
}

#[derive(Debug, PartialEq)]
pub enum RunOutcome {
    /// Every item finished; the report is written.
    Complete { run: Uuid, report_dir: std::path::PathBuf },
    /// Shutdown came first; state is flushed and the run can be resumed.
    Interrupted { run: Uuid },
}

struct Engine {
    cfg: CoordinatorConfig,
    broker: Broker,
    state: RunState,
    run: Uuid,
    /// Items waiting on each outstanding job.
    waiters: HashMap<JobId, Vec<ItemKey>>,
    /// Jobs published by this process (a job shared by several items goes out once).
    published: HashSet<JobId>,
    /// Outstanding jobs by pool, for the stall check.
    outstanding: HashMap<JobId, (String, Job)>,
    acks: FuturesUnordered<<jetstream::context::PublishAckFuture as std::future::IntoFuture>::IntoFuture>,
    progress: Progress,
    progress_tx: watch::Sender<Progress>,
    republish_round: u32,
}

/// Run the coordinator for `cfg` until the run completes or `shutdown` resolves.
pub async fn run(
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
    let progress_tx = progress_tx.unwrap_or_else(|| watch::channel(Progress::default()).0);
    let mut e = Engine {
        cfg,
        broker,
        state,
        run: meta.id,
        waiters: HashMap::new(),
        published: HashSet::new(),
        outstanding: HashMap::new(),
        acks: FuturesUnordered::new(),
        progress: Progress { run: Some(meta.id), items_total, ..Default::default() },
        progress_tx,
        republish_round: 0,
    };
    e.plan_all().await?;
    let advisories = e
        .broker
        .client
        .subscribe(format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{}.>", subjects::JOBS_STREAM))
        .await
        .map_err(|err| halyard_broker::BrokerError::js("subscribe to max-deliveries advisories", err))?;
    let outcome = e.collect(consumer, advisories, shutdown).await?;
    e.state.flush().await?;
    Ok(outcome)
}

impl Engine {
    fn keys(&self) -> impl Iterator<Item = ItemKey> + '_ {
        self.cfg.sweep.benchmarks.iter().enumerate().flat_map(|(b, bench)| {
            (0..bench.model_count()).flat_map(move |m| {
                (0..bench.item_count()).map(move |i| ItemKey { bench: b as u32, model: m as u32, item: i as u32 })
            })
        })
    }

    /// Evaluate an item against stored results. Pipelines reveal one stage at a time, so
    /// this fetches the results each round asks for until it is done or truly waiting.
    fn evaluate(&self, key: ItemKey) -> Result<Plan<Vec<u8>>, CoordinatorError> {
        let bench = &self.cfg.sweep.benchmarks[key.bench as usize];
        let mut known: HashMap<JobId, Outcome> = HashMap::new();
        loop {
            let plan = match bench {
                Benchmark::HypoTermQa { config, questions, .. } => {
                    let q = &questions[key.item as usize];
                    match hypotermqa::evaluate(&config[key.model as usize], q, &known) {
                        Plan::Done(label) => Plan::Done(serde_json::to_vec(&label).map_err(|err| {
                            CoordinatorError::Report { dir: "<memory>".into(), reason: err.to_string() }
                        })?),
                        Plan::Waiting(jobs) => Plan::Waiting(jobs),
                    }
                }
            };
            match plan {
                Plan::Waiting(jobs) => {
                    let mut learned = false;
                    for j in &jobs {
                        let id = j.id();
                        if known.contains_key(&id) {
                            continue;
                        }
                        if let Some(r) = self.state.result(&id)? {
                            known.insert(id, r.outcome);
                            learned = true;
                        }
                    }
                    if !learned {
                        return Ok(Plan::Waiting(jobs));
                    }
                }
                done => return Ok(done),
            }
        }
    }

    /// Step 3 of recovery: evaluate every unfinished item and publish what it waits for.
    async fn plan_all(&mut self) -> Result<(), CoordinatorError> {
        let keys: Vec<ItemKey> = self.keys().collect();
        let mut done = 0u64;
        for key in keys {
            if self.state.is_done(key)? {
                done += 1;
                continue;
            }
            if self.advance(key).await? {
                done += 1;
            }
        }
        self.drain_acks().await;
        self.state.flush().await?;
        self.progress.items_done = done;
        self.progress.results = self.state.totals()?.done;
        self.publish_progress();
        info!(items = self.progress.items_total, done, outstanding = self.outstanding.len(), "planned");
        Ok(())
    }

    /// Evaluate one item; publish its missing jobs or store its label. True when done.
    async fn advance(&mut self, key: ItemKey) -> Result<bool, CoordinatorError> {
        match self.evaluate(key)? {
            Plan::Done(label) => {
                self.state.mark_done(key, &label)?;
                Ok(true)
            }
            Plan::Waiting(jobs) => {
                for j in jobs {
                    let id = j.id();
                    let w = self.waiters.entry(id).or_default();
                    if !w.contains(&key) {
                        w.push(key);
                    }
                    if self.published.insert(id) {
                        self.publish(j, None).await?;
                    }
                }
                Ok(false)
            }
        }
    }

    async fn publish(&mut self, req: JobRequest, suffix: Option<u32>) -> Result<(), CoordinatorError> {
        let job = Job::new(self.run, req.pool.clone(), req.key, req.api_key_env, req.timeout_ms);
        self.state.note_job(
            &job.id,
            &JobMeta { pool: job.pool.clone(), stage: job.key.stage.clone(), model: job.key.model.model.clone() },
        )?;
        self.outstanding.insert(job.id, (job.pool.clone(), job.clone()));
        self.send(&job, suffix).await;
        self.progress.published += 1;
        // Keep the number of unconfirmed publishes bounded.
        if self.acks.len() >= 4096 {
            self.drain_acks().await;
        }
        Ok(())
    }

    async fn send(&mut self, job: &Job, suffix: Option<u32>) {
        let payload = match halyard_proto::encode(job) {
            Ok(p) => bytes::Bytes::from(p),
            Err(err) => {
                warn!(job = %job.id, error = %err, "cannot encode job");
                return;
            }
        };
        let mut msg_id = subjects::result_msg_id(self.run, &job.id);
        if let Some(n) = suffix {
            msg_id.push_str(&format!(":r{n}"));
        }
        let subject = subjects::job_subject(&job.pool);
        let mut delay = Duration::from_millis(100);
        loop {
            let m = jetstream::message::PublishMessage::build().payload(payload.clone()).message_id(&msg_id);
            match self.broker.js.send_publish(subject.clone(), m).await {
                Ok(ack) => {
                    self.acks.push(std::future::IntoFuture::into_future(ack));
                    return;
                }
                Err(err) => {
                    warn!(job = %job.id, error = %err, "job publish failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    async fn drain_acks(&mut self) {
        while let Some(r) = self.acks.next().await {
            if let Err(err) = r {
                // The stall check re-publishes jobs that never reached the stream.
                warn!(error = %err, "job publish not acknowledged");
            }
        }
    }

    fn publish_progress(&self) {
        let _ = self.progress_tx.send(self.progress.clone());
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
        loop {
            if self.progress.items_done >= self.progress.items_total {
                self.drain_acks().await;
                self.state.flush().await?;
                let dir = crate::report::write(&self.cfg, &self.state, self.run)?;
                info!(run = %self.run, report = %dir.display(), "run complete");
                self.publish_progress();
                return Ok(RunOutcome::Complete { run: self.run, report_dir: dir });
            }
            let batch = tokio::select! {
                _ = &mut shutdown => {
                    info!(run = %self.run, "coordinator stopping; run can be resumed");
                    self.drain_acks().await;
                    return Ok(RunOutcome::Interrupted { run: self.run });
                }
                adv = advisories.next() => {
                    if let Some(adv) = adv {
                        self.on_max_deliveries(&adv.payload).await?;
                    }
                    continue;
                }
                b = consumer.fetch().max_messages(1024).expires(Duration::from_secs(1)).messages() => b,
            };
            let mut msgs = Vec::new();
            match batch {
                Ok(mut b) => {
                    while let Some(m) = b.next().await {
                        match m {
                            Ok(m) => msgs.push(m),
                            Err(err) => {
                                debug!(error = %err, "result batch ended");
                                break;
                            }
                        }
                    }
                }
                Err(err) => {
                    warn!(error = %err, "result fetch failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
            if msgs.is_empty() {
                if last_result.elapsed() > stall_after {
                    self.check_stall().await?;
                    last_result = Instant::now();
                }
                continue;
            }
            last_result = Instant::now();
            let mut affected: Vec<ItemKey> = Vec::new();
            for m in &msgs {
                match halyard_proto::decode::<JobResult>("result", &m.payload) {
                    Ok(r) if r.run == self.run => self.record(r, &mut affected)?,
                    Ok(r) => debug!(run = %r.run, "result for another run; ignoring"),
                    Err(err) => warn!(error = %err, "undecodable result message; dropping it"),
                }
            }
            // Durable before acked.
            self.state.flush().await?;
            for m in &msgs {
                if let Err(err) = m.ack().await {
                    debug!(error = %err, "result ack failed; it will be redelivered and recognised as a duplicate");
                }
            }
            self.replan(affected).await?;
            if last_log.elapsed() > Duration::from_secs(5) {
                last_log = Instant::now();
                info!(
                    done = self.progress.items_done,
                    total = self.progress.items_total,
                    results = self.progress.results,
                    dead_letters = self.progress.dead_letters,
                    "progress"
                );
            }
        }
    }

    fn record(&mut self, r: JobResult, affected: &mut Vec<ItemKey>) -> Result<(), CoordinatorError> {
        if !self.state.insert_result(&r)? {
            self.progress.duplicates += 1;
            return Ok(());
        }
        self.progress.results += 1;
        if let Outcome::Failed(f) = &r.outcome {
            self.progress.dead_letters += 1;
            warn!(job = %r.job, error = %f.error, "dead letter");
        }
        self.outstanding.remove(&r.job);
        if let Some(w) = self.waiters.remove(&r.job) {
            affected.extend(w);
        }
        Ok(())
    }

    async fn replan(&mut self, mut affected: Vec<ItemKey>) -> Result<(), CoordinatorError> {
        affected.sort_unstable();
        affected.dedup();
        for key in affected {
            if !self.state.is_done(key)? && self.advance(key).await? {
                self.progress.items_done += 1;
            }
        }
        self.drain_acks().await;
        self.state.flush().await?;
        self.publish_progress();
        Ok(())
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
        let Ok(job) = halyard_proto::decode::<Job>("job", &msg.payload) else { return Ok(()) };
        if job.run != self.run {
            return Ok(());
        }
        let _ = stream.delete_message(adv.stream_seq).await;
        let r = JobResult {
            v: halyard_proto::WIRE_VERSION,
            job: job.id,
            run: self.run,
            outcome: Outcome::Failed(Failure {
                kind: FailureKind::Exhausted,
                error: format!("delivered {} times without a result (max_deliver reached; did the worker crash on it?)", adv.deliveries),
                http_status: None,
            }),
            deliveries: adv.deliveries,
            worker: "coordinator".into(),
            cached: false,
        };
        let mut affected = Vec::new();
        self.record(r, &mut affected)?;
        self.state.flush().await?;
        self.replan(affected).await
    }

    /// No result for a while: if the broker holds nothing pending or in flight for pools
    /// with outstanding jobs, those jobs were lost (stream purged, publish never stored,
    /// or stranded after max_deliver while no coordinator listened): publish them again
    /// under a fresh message id. After three rounds a job is declared a dead letter.
    async fn check_stall(&mut self) -> Result<(), CoordinatorError> {
        if self.outstanding.is_empty() {
            return Ok(());
        }
        let pools: HashSet<String> = self.outstanding.values().map(|(p, _)| p.clone()).collect();
        let Ok(stream) = self.broker.js.get_stream(subjects::JOBS_STREAM).await else { return Ok(()) };
        for pool in &pools {
            let name = subjects::pool_consumer(pool);
            match stream.consumer_info(&name).await {
                Ok(info) if info.num_pending == 0 && info.num_ack_pending == 0 => {}
                Ok(_) => return Ok(()), // work is queued or in flight: not a stall
                Err(_) => return Ok(()), // no consumer yet: no worker has joined; jobs wait in the stream
            }
        }
        self.republish_round += 1;
        let round = self.republish_round;
        let jobs: Vec<Job> = self.outstanding.values().map(|(_, j)| j.clone()).collect();
        if round > 3 {
            warn!(jobs = jobs.len(), "outstanding jobs vanished three times; recording them as dead letters");
            let mut affected = Vec::new();
            for job in jobs {
                let r = JobResult {
                    v: halyard_proto::WIRE_VERSION,
                    job: job.id,
                    run: self.run,
                    outcome: Outcome::Failed(Failure {
                        kind: FailureKind::Exhausted,
                        error: "job was lost from the queue three times (max_deliver reached without a result)".into(),
                        http_status: None,
                    }),
                    deliveries: 0,
                    worker: "coordinator".into(),
                    cached: false,
                };
                self.record(r, &mut affected)?;
            }
            self.state.flush().await?;
            return self.replan(affected).await;
        }
        warn!(jobs = jobs.len(), round, "no pending work on the broker for outstanding jobs; publishing them again");
        for job in &jobs {
            self.send(job, Some(round)).await;
        }
        self.drain_acks().await;
        Ok(())
    }
}

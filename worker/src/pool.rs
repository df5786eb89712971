//! One pool's work loop: fetch as many jobs as there are free slots, and hand each to
//! its delivery ([`crate::delivery`]: the `Lifecycle` machine and the IO of its effects). While the pool's endpoint is
//! down (see [`crate::health`]) the loop fetches nothing but one job to probe with.

use std::sync::Arc;
use std::time::Duration;

use halyard_broker::PullConsumer;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use crate::delivery::{open_message, refuse, run_job, PoolCtx, Received};
use crate::health::{FetchTurn, PoolHealth, ProbeClaim};
use crate::message::{Fate, JobMsg};

/// How long an open pull request waits for jobs before it is renewed.
const PULL_WAIT: Duration = Duration::from_millis(500);

/// Pull and run `pool`'s jobs until `shutdown` flips, then wait for in-flight jobs
/// (they finish, or are nak'd once `hard_stop` flips).
pub(crate) async fn run_pool(
    ctx: Arc<PoolCtx>,
    pool: String,
    health: Arc<PoolHealth>,
    consumer: Option<PullConsumer>,
    concurrency: usize,
    mut shutdown: watch::Receiver<bool>,
) {
    let consumer = match consumer {
        Some(c) => c,
        None => match await_consumer(&ctx, &pool, &mut shutdown).await {
            Some(c) => c,
            None => return,
        },
    };
    ctx.pace_by(&pool, &consumer);
    let slots = Arc::new(Semaphore::new(concurrency.max(1)));
    let mut tasks = JoinSet::new();
    // Whether the last pull came back empty: then the queue is idle and the next pull
    // waits at the broker instead of returning at once.
    let mut idle = true;
    let mut per_msg = 1usize;
    info!(pool, concurrency, "pool loop started");
    'outer: loop {
        if *shutdown.borrow() {
            break;
        }
        if health.is_paused() {
            // Paused: fetch nothing, but one job to probe with when a probe is due.
            let turn = tokio::select! {
                t = health.fetch_turn() => t,
                _ = shutdown.changed() => break,
            };
            // Not raced with a stop: a probe message pulled is run or handed back, never
            // dropped (the fetch asks without waiting; a slot's wait gives way to a stop).
            if turn == FetchTurn::Probe
                && !fetch_probe(&ctx, &health, &consumer, &slots, &shutdown, &mut tasks).await
            {
                break;
            }
            idle = true;
            continue;
        }
        // Wait for at least one free slot, then ask for as many jobs as slots are free
        // (never more: a job pulled waits for nothing but its call, so its ack_wait is
        // spent on the call alone).
        let first = tokio::select! {
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = shutdown.changed() => break,
        };
        // Jobs per message seen last (`[run] job_batch` of the sweep): ask for as many
        // messages as hold about one job per free slot.
        let want = (slots.available_permits() + 1).div_ceil(per_msg).max(1);
        // While jobs are queued, take what is there at once (no_wait). When the queue is
        // idle, wait at the broker (up to PULL_WAIT) for the first job rather than asking
        // again in a tight loop; then go back to taking batches. The waiting pull asks
        // for one job only: nats-server 2.9 does not always end a partly filled pull
        // request that expires, and the client then waits 5 s more for its end.
        let batch = if idle {
            consumer.batch().max_messages(1).expires(PULL_WAIT).messages().await
        } else {
            consumer.fetch().max_messages(want).messages().await
        };
        ctx.stats.pulls.inc();
        idle = true;
        let mut batch = match batch {
            Ok(b) => b,
            Err(e) => {
                warn!(pool, error = %e, "fetch failed; retrying");
                drop(first);
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(500)) => continue,
                    _ = shutdown.changed() => break,
                }
            }
        };
        let mut first = Some(first);
        loop {
            // A stop first: the rest of this pull is handed back, not started.
            let next = tokio::select! {
                biased;
                _ = shutdown.changed() => {
                    hand_back_unread(&ctx, &pool, &mut batch).await;
                    break 'outer;
                }
                m = halyard_broker::next_pulled(&mut batch) => m,
            };
            let Some(msg) = next else { break };
            idle = false;
            let Some((shared, jobs)) = open_message(&ctx, &pool, msg).await else { continue };
            per_msg = jobs.len().max(1);
            let run = Spawn { ctx: &ctx, health: &health, slots: &slots, shutdown: &shutdown };
            if !run.jobs(&mut tasks, &mut first, shared, jobs, None).await {
                hand_back_unread(&ctx, &pool, &mut batch).await;
                break 'outer;
            }
        }
    }
    while tasks.try_join_next().is_some() {}
    info!(pool, in_flight = tasks.len(), "pool loop stopping; waiting for in-flight jobs");
    while tasks.join_next().await.is_some() {}
}

/// At a stop, the messages of pull `batch` not read yet (delivered, or still on their
/// way until the pull ends) are handed back: nak'd at once, their delivery excused from
/// the budget ([`Fate::HandBack`]). Dropped, each would wait out its ack wait and then
/// count as a delivery a worker crashed with. Bounded: the pull is read for at most
/// PULL_WAIT and a second, and the hand-backs (side by side) get [`HAND_BACK_WITHIN`].
async fn hand_back_unread(
    ctx: &PoolCtx,
    pool: &str,
    batch: &mut async_nats::jetstream::consumer::pull::Batch,
) {
    use futures::StreamExt;
    let until = tokio::time::Instant::now() + PULL_WAIT + Duration::from_secs(1);
    let mut unread = Vec::new();
    while let Ok(Some(Ok(msg))) = tokio::time::timeout_at(until, batch.next()).await {
        unread.push(msg);
    }
    if unread.is_empty() {
        return;
    }
    let n = unread.len();
    let handing = futures::future::join_all(unread.into_iter().map(|msg| async move {
        let delivered = msg.info().map_or(1, |i| i.delivered.max(1) as u64);
        JobMsg::new(msg, delivered, 1).finish(Fate::HandBack(Duration::ZERO), &ctx.budget).await
    }));
    match tokio::time::timeout(HAND_BACK_WITHIN, handing).await {
        Ok(done) => {
            let failed = done.iter().filter(|r| r.is_err()).count();
            info!(pool, messages = n, failed, "stopping: handed back job messages not started");
        }
        Err(_) => warn!(
            pool,
            messages = n,
            "stopping: job messages not started were not all handed back in time; the rest are redelivered after their ack wait"
        ),
    }
}

/// How long a stop waits for the hand-backs of messages it pulled but did not start.
const HAND_BACK_WITHIN: Duration = Duration::from_secs(5);

/// How often a worker looks for a pool consumer that no coordinator has made yet: at
/// first soon (`halyard run` starts its workers as its coordinator plans), then every
/// second.
const CONSUMER_LOOK: Duration = Duration::from_secs(1);

/// Wait until a coordinator has made `pool`'s consumer, then bind it; `None` on
/// shutdown. A consumer that exists with another configuration is named in an error
/// (once per distinct error) and looked at again, in case it is replaced.
async fn await_consumer(
    ctx: &PoolCtx,
    pool: &str,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<PullConsumer> {
    let mut said = String::new();
    let mut wait = Duration::from_millis(50);
    loop {
        if *shutdown.borrow() {
            return None;
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => wait = (wait * 2).min(CONSUMER_LOOK),
            _ = shutdown.changed() => return None,
        }
        match halyard_broker::bind_pool_consumer(&ctx.broker, pool).await {
            Ok(Some(c)) => {
                info!(pool, "the pool's consumer is there; taking its jobs");
                return Some(c);
            }
            Ok(None) => {}
            Err(e) => {
                let text = e.to_string();
                if text != said {
                    tracing::error!(pool, error = %text, "cannot bind the pool's consumer; waiting");
                    said = text;
                }
            }
        }
    }
}

/// Spawns a message's jobs, one concurrency slot each.
struct Spawn<'a> {
    ctx: &'a Arc<PoolCtx>,
    health: &'a Arc<PoolHealth>,
    slots: &'a Arc<Semaphore>,
    /// A stop while a job waits for its slot hands back the jobs not started.
    shutdown: &'a watch::Receiver<bool>,
}

impl Spawn<'_> {
    /// Run the admitted jobs of message `shared` and settle its refused ones, the first
    /// on the slot in `first` if any; the first admitted job holds `probe` if given (a
    /// message with none gives the probe up). False when the worker stops before a job
    /// has its slot (the jobs not started are handed back: the message is nak'd, its
    /// delivery excused, once those started have finished; their answers are in the
    /// checkpoint).
    async fn jobs(
        &self,
        tasks: &mut JoinSet<()>,
        first: &mut Option<OwnedSemaphorePermit>,
        shared: Arc<JobMsg>,
        jobs: Vec<Received>,
        mut probe: Option<ProbeClaim>,
    ) -> bool {
        if probe.is_some() && !jobs.iter().any(|j| matches!(j, Received::Run(_))) {
            drop(probe.take());
            self.health.defer_probe();
        }
        let mut jobs = jobs.into_iter();
        while let Some(item) = jobs.next() {
            // One slot per job; the jobs of a message beyond the free slots wait here. A
            // stop comes first: before a job takes its slot, or while it waits for one.
            let permit = match first.take() {
                Some(p) if !*self.shutdown.borrow() => Some(p),
                Some(_) => None,
                None => slot_unless_stopped(self.slots, self.shutdown).await,
            };
            let Some(permit) = permit else {
                drop(first.take());
                self.hand_back(&shared, std::iter::once(item).chain(jobs)).await;
                return false;
            };
            self.ctx.stats.pulled.inc();
            let (ctx, health, shared) = (self.ctx.clone(), self.health.clone(), shared.clone());
            // Boxed: the job's future is several KiB (call, retries, publish), and a
            // task that holds it inline is copied whole when spawned and when it finishes.
            let job: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> = match item {
                Received::Run(job) => Box::pin(run_job(ctx, health, shared, job, probe.take())),
                Received::Refuse(r) => Box::pin(async move { refuse(&ctx, &shared, r).await }),
            };
            tasks.spawn(async move {
                job.await;
                drop(permit);
            });
        }
        // Reap finished tasks so the set does not grow.
        while tasks.try_join_next().is_some() {}
        true
    }

    /// At a stop, the jobs of message `shared` not started: each run job is handed back
    /// (the message is nak'd, its delivery excused, once the jobs that did start have
    /// finished; their answers are in the checkpoint); a refused one is settled as it
    /// would have been (no call).
    async fn hand_back(&self, shared: &Arc<JobMsg>, items: impl Iterator<Item = Received>) {
        for item in items {
            match item {
                Received::Run(_) => {
                    if let Err(e) =
                        shared.finish(Fate::HandBack(Duration::ZERO), &self.ctx.budget).await
                    {
                        warn!(error = %e, "cannot hand back a job message at the stop; it is redelivered after its ack wait");
                    }
                }
                Received::Refuse(r) => refuse(self.ctx, shared, r).await,
            }
        }
    }
}

/// A free concurrency slot, waited for unless the worker stops first (`None`; also for
/// closed slots, which nothing does).
async fn slot_unless_stopped(
    slots: &Arc<Semaphore>,
    shutdown: &watch::Receiver<bool>,
) -> Option<OwnedSemaphorePermit> {
    let mut stop = shutdown.clone();
    tokio::select! {
        biased;
        _ = stop.wait_for(|s| *s) => None,
        p = slots.clone().acquire_owned() => p.ok(),
    }
}

/// While paused with a probe due and no job holding it: fetch one job message and let
/// its first job probe. With nothing queued, try again an interval later. False when the
/// worker stops (or the slots are closed).
async fn fetch_probe(
    ctx: &Arc<PoolCtx>,
    health: &Arc<PoolHealth>,
    consumer: &PullConsumer,
    slots: &Arc<Semaphore>,
    shutdown: &watch::Receiver<bool>,
    tasks: &mut JoinSet<()>,
) -> bool {
    let Some(claim) = health.claim_probe() else { return true };
    let Some(permit) = slot_unless_stopped(slots, shutdown).await else { return false };
    ctx.stats.pulls.inc();
    let msg = match consumer.fetch().max_messages(1).messages().await {
        Ok(mut batch) => halyard_broker::next_pulled(&mut batch).await,
        Err(e) => {
            debug!(pool = %health.pool(), error = %e, "probe fetch failed");
            None
        }
    };
    let opened = match msg {
        Some(m) => open_message(ctx, health.pool(), m).await,
        None => None,
    };
    let Some((shared, jobs)) = opened else {
        drop(claim);
        health.defer_probe();
        return true;
    };
    let run = Spawn { ctx, health, slots, shutdown };
    run.jobs(tasks, &mut Some(permit), shared, jobs, Some(claim)).await
}

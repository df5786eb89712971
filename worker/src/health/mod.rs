//! Endpoint health of every pool a worker serves: pause on an outage, probe, resume.
//!
//! [`machine`] decides (pure); [`PoolHealth`] is what the pool loop and its jobs use:
//!
//! - Calls report endpoint-wide failures ([`PoolHealth::failed`]) and answers
//!   ([`PoolHealth::answered`]). The first failure pauses the pool.
//! - While paused the pool loop fetches nothing ([`PoolHealth::fetch_turn`]), jobs in
//!   hand that are not inside an HTTP call go back to the queue without spending their
//!   delivery budget (see [`crate::budget`]), and one job holds the probe
//!   ([`PoolHealth::claim_probe`]): it stays in hand (in-progress acks keep it) and calls
//!   again when its turn comes ([`PoolHealth::probe_turn`]), so probing spends no
//!   delivery. With no job in hand the pool loop fetches one to probe with.
//! - A change this worker saw is announced on the pool's subject (shared with the quota
//!   announcements, see [`crate::quota::membership`]) so every worker of the pool pauses
//!   and resumes together, and written to the KV bucket
//!   [`halyard_proto::subjects::POOL_HEALTH_BUCKET`] as a [`PoolHealthRecord`] for the
//!   coordinator and `halyard status`.
//! - [`crate::stats::Stats`] keeps each pool's state for `/metrics`
//!   (`halyard_pool_paused{pool,reason}`, outage seconds).
//! - Before the endpoint first answered this worker, a refused key, a 404 or an answer
//!   not of the API's shape pauses the pool too ([`first_contact`]), so that the
//!   coordinator can stop a run whose endpoint never answered; [`crate::backend::probe`] is the same
//!   check made once, up front, by `halyard check` and `halyard run`.

pub mod first_contact;
pub mod machine;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::kv;
use futures::StreamExt;
use halyard_broker::{Broker, BrokerError};
use halyard_proto::{OutageReason, PoolHealthRecord};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

pub use machine::{Change, Failure, Machine, Verdict};

use crate::quota::membership::{self, Announcement};
pub use crate::stats::health::{PoolHealthStat, PoolHealthStats};
use crate::stats::Stats;

/// What this worker tells the others and the bucket after a change it saw.
#[derive(Clone, Debug)]
struct Publish {
    record: PoolHealthRecord,
    announce: Announcement,
}

/// Where changes go: the broker (announcements and the KV record), or nowhere (tests).
struct Outlet {
    client: async_nats::Client,
    kv: kv::Store,
    subject: String,
}

/// One pool's health in this worker; see the module docs.
pub struct PoolHealth {
    pool: String,
    worker: String,
    machine: Mutex<Machine>,
    /// Bumped on every change, so waiters re-read the state.
    changed: watch::Sender<u64>,
    /// The latest change to publish (coalesced: only the newest state matters).
    outbox: watch::Sender<Option<Publish>>,
    stats: Arc<Stats>,
    stop: watch::Sender<bool>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// This worker wrote a paused record during the current outage: it must also write
    /// the resumption, even one it learnt from another worker, or its late "paused" (a
    /// probe that failed just before the other worker's resumption arrived) would be the
    /// record's last word while the pool runs.
    wrote_pause: std::sync::atomic::AtomicBool,
}

/// What the pool loop does next while the pool is paused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FetchTurn {
    /// The pool is up again: fetch as usual.
    Resumed,
    /// A probe is due and no job holds it: fetch one job to probe with.
    Probe,
}

/// What a job holding the probe does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeTurn {
    /// Call now.
    Go,
    /// The pool resumed meanwhile: call as an ordinary job.
    Resumed,
}

/// The probe, held by one job; released when dropped.
pub struct ProbeClaim {
    health: Arc<PoolHealth>,
    claim: u64,
}

impl Drop for ProbeClaim {
    fn drop(&mut self) {
        self.health.lock().release_probe(self.claim);
        self.health.changed.send_modify(|g| *g += 1);
    }
}

fn unix_ms(t: Instant) -> u64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let now_ms = now.as_millis() as u64;
    let now_i = Instant::now();
    if t <= now_i {
        now_ms.saturating_sub(now_i.duration_since(t).as_millis() as u64)
    } else {
        now_ms + t.duration_since(now_i).as_millis() as u64
    }
}

impl PoolHealth {
    /// Health kept in this worker only (no announcements, no KV record).
    pub fn local(pool: &str, worker: &str, stats: Arc<Stats>) -> Arc<PoolHealth> {
        stats.pool_health.register(pool);
        Arc::new(PoolHealth {
            pool: pool.to_string(),
            worker: worker.to_string(),
            machine: Mutex::new(Machine::new()),
            changed: watch::channel(0).0,
            outbox: watch::channel(None).0,
            stats,
            stop: watch::channel(false).0,
            tasks: Mutex::new(Vec::new()),
            wrote_pause: Default::default(),
        })
    }

    /// Health shared with the pool's other workers through `broker`: listen to their
    /// announcements and publish this worker's changes.
    pub async fn join(
        broker: &Broker,
        pool: &str,
        worker: &str,
        stats: Arc<Stats>,
    ) -> Result<Arc<PoolHealth>, BrokerError> {
        let (kv, _) = halyard_broker::kv::open(broker, halyard_broker::layout::POOL_HEALTH).await?;
        let subject = membership::subject(pool);
        let sub = broker
            .client
            .subscribe(subject.clone())
            .await
            .map_err(|e| BrokerError::js("subscribe to the pool's announcements", e))?;
        let h = PoolHealth::local(pool, worker, stats);
        let outlet = Outlet { client: broker.client.clone(), kv, subject };
        let listen = tokio::spawn(listen(h.clone(), sub));
        let publish = tokio::spawn(publish(h.clone(), outlet));
        h.tasks.lock().unwrap_or_else(|p| p.into_inner()).extend([listen, publish]);
        Ok(h)
    }

    /// Stop listening and publishing (the last change still goes out).
    pub async fn close(&self) {
        let _ = self.stop.send(true);
        let tasks: Vec<_> =
            self.tasks.lock().unwrap_or_else(|p| p.into_inner()).drain(..).collect();
        for t in tasks {
            let _ = t.await;
        }
    }

    pub fn pool(&self) -> &str {
        &self.pool
    }

    fn lock(&self) -> MutexGuard<'_, Machine> {
        self.machine.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn is_paused(&self) -> bool {
        self.lock().is_paused()
    }

    /// The current pause's reason, if paused.
    pub fn paused_by(&self) -> Option<OutageReason> {
        self.lock().outage().map(|o| o.reason)
    }

    /// A receiver that sees every change (pause, probe, resume, probe released).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// A failed call's error as this pool's health sees it: before the endpoint first
    /// answered this worker, a refused key, a 404 or an answer not of the API's shape is
    /// the endpoint's failure (see [`first_contact`]); afterwards the error as it is.
    pub fn first_contact(&self, e: crate::call_error::CallError) -> crate::call_error::CallError {
        if self.lock().has_answered() {
            return e;
        }
        first_contact::upgrade(e)
    }

    /// A call failed for an endpoint-wide reason.
    pub fn failed(&self, f: Failure) -> Verdict {
        let mut m = self.lock();
        let (v, change) = m.failed(f, Instant::now());
        if let Some(c) = change {
            self.apply(&m, c);
        }
        v
    }

    /// A call sent at `started` got an answer (anything but an endpoint-wide failure).
    pub fn answered(&self, started: Instant, probe: bool) {
        let mut m = self.lock();
        if let Some(c) = m.answered(started, probe, Instant::now()) {
            self.apply(&m, c);
        }
    }

    /// Take the probe for one job (None when up, or another job holds it).
    pub fn claim_probe(self: &Arc<Self>) -> Option<ProbeClaim> {
        let claim = self.lock().claim_probe()?;
        Some(ProbeClaim { health: self.clone(), claim })
    }

    /// No job was at hand to probe with: try again one interval later.
    pub fn defer_probe(&self) {
        self.lock().defer_probe(Instant::now());
        self.changed.send_modify(|g| *g += 1);
    }

    /// For the job holding the probe: wait until it is due, or the pool resumed.
    pub async fn probe_turn(&self) -> ProbeTurn {
        let mut rx = self.subscribe();
        loop {
            rx.borrow_and_update();
            let Some(next) = self.lock().outage().map(|o| o.next_probe) else {
                return ProbeTurn::Resumed;
            };
            if Instant::now() >= next {
                return ProbeTurn::Go;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {}
                _ = rx.changed() => {}
            }
        }
    }

    /// For the pool loop while paused: wait until the pool resumes, or a probe is due
    /// and no job holds it.
    pub async fn fetch_turn(&self) -> FetchTurn {
        let mut rx = self.subscribe();
        loop {
            rx.borrow_and_update();
            let (next, held) = {
                let m = self.lock();
                match m.outage() {
                    None => return FetchTurn::Resumed,
                    Some(o) => (o.next_probe, m.probe_held()),
                }
            };
            if !held && Instant::now() >= next {
                return FetchTurn::Probe;
            }
            if held {
                let _ = rx.changed().await;
                continue;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {}
                _ = rx.changed() => {}
            }
        }
    }

    /// Record a change: stats, logs, waiters, and (if this worker saw it) the broker.
    fn apply(&self, m: &Machine, change: Change) {
        let stats = &self.stats.pool_health;
        let pool = &self.pool;
        match (&change, m.outage()) {
            (Change::Paused { local }, Some(o)) => {
                stats.paused(pool, o.reason);
                if *local {
                    self.stats.pauses.inc();
                }
                warn!(pool, reason = %o.reason, error = %o.error, local = *local, "endpoint down: pausing the pool (no fetching; held jobs go back to the queue; probing)");
            }
            (Change::ProbeFailed, Some(o)) => {
                let wait = o.next_probe.saturating_duration_since(Instant::now());
                info!(pool, reason = %o.reason, down_s = o.since.elapsed().as_secs(), retry_in_s = wait.as_secs_f64(), "endpoint still down");
            }
            (Change::Resumed { down_for, local }, _) => {
                stats.resumed(pool, *down_for);
                info!(
                    pool,
                    down_s = down_for.as_secs_f64(),
                    local = *local,
                    "endpoint answers again: pool resumed"
                );
            }
            _ => {}
        }
        self.changed.send_modify(|g| *g += 1);
        use std::sync::atomic::Ordering::Relaxed;
        let publish = match change {
            Change::Paused { local } => {
                self.wrote_pause.fetch_or(local, Relaxed);
                local
            }
            Change::ProbeFailed => {
                self.wrote_pause.store(true, Relaxed);
                true
            }
            Change::Resumed { local, .. } => self.wrote_pause.swap(false, Relaxed) || local,
        };
        if publish {
            if let Some(p) = self.publication(m, &change) {
                self.outbox.send_replace(Some(p));
            }
        }
    }

    fn publication(&self, m: &Machine, change: &Change) -> Option<Publish> {
        let worker = self.worker.clone();
        let now = Instant::now();
        let updated_ms = unix_ms(now);
        let pool = self.pool.clone();
        Some(match (change, m.outage()) {
            (Change::Resumed { down_for, .. }, _) => {
                let since = now.checked_sub(*down_for).unwrap_or(now);
                let last = self.stats.pool_health.last_reason(&self.pool);
                Publish {
                    record: PoolHealthRecord {
                        pool,
                        paused: false,
                        reason: last.unwrap_or(OutageReason::Connection),
                        error: String::new(),
                        since_ms: unix_ms(since),
                        next_probe_ms: None,
                        probes_failed: 0,
                        resumed_ms: Some(updated_ms),
                        worker: worker.clone(),
                        updated_ms,
                    },
                    announce: Announcement::Resume { worker },
                }
            }
            (_, Some(o)) => Publish {
                record: PoolHealthRecord {
                    pool,
                    paused: true,
                    reason: o.reason,
                    error: o.error.clone(),
                    since_ms: unix_ms(o.since),
                    next_probe_ms: Some(unix_ms(o.next_probe)),
                    probes_failed: o.probes_failed,
                    resumed_ms: None,
                    worker: worker.clone(),
                    updated_ms,
                },
                announce: Announcement::Pause {
                    worker,
                    reason: o.reason,
                    probe_ms: o.next_probe.saturating_duration_since(now).as_millis() as u64,
                },
            },
            _ => return None,
        })
    }

    fn remote(&self, a: Announcement) {
        let mut m = self.lock();
        let now = Instant::now();
        let change = match a {
            Announcement::Pause { worker, reason, probe_ms } if worker != self.worker => {
                // The pause it holds the pool, out of the pool's bucket of announced pauses
                // (crate::quota::remote): a forged one every few minutes cannot hold the
                // pool for good; refused, this worker meets an outage on its own calls.
                let probe_in = Duration::from_millis(probe_ms).min(machine::MAX_RETRY_AFTER);
                let hold = probe_in + machine::remote_grace(probe_in);
                if !crate::quota::remote::pause(&self.pool, &self.worker, hold) {
                    debug!(pool = %self.pool, from = %worker, probe_ms, "pause announcement beyond the pool's bound of announced pauses: ignored");
                    return;
                }
                m.remote_paused(reason, &worker, probe_in, now)
            }
            Announcement::Resume { worker } if worker != self.worker => m.remote_resumed(now),
            _ => return,
        };
        match change {
            Some(c) => self.apply(&m, c),
            // A later probe time: wake the waiters so they sleep until it.
            None => self.changed.send_modify(|g| *g += 1),
        }
    }
}

/// Apply the other workers' announcements until stopped.
async fn listen(h: Arc<PoolHealth>, mut sub: async_nats::Subscriber) {
    let mut stop = h.stop.subscribe();
    loop {
        tokio::select! {
            m = sub.next() => {
                let Some(m) = m else { break };
                match serde_json::from_slice::<Announcement>(&m.payload) {
                    Ok(a) => h.remote(a),
                    Err(e) => debug!(pool = %h.pool, error = %e, "ignoring an unreadable pool announcement"),
                }
            }
            _ = async { stop.wait_for(|s| *s).await.is_ok() } => break,
        }
    }
}

/// Publish this worker's changes (the newest one when several came meanwhile).
async fn publish(h: Arc<PoolHealth>, out: Outlet) {
    let mut rx = h.outbox.subscribe();
    let mut stop = h.stop.subscribe();
    let key = halyard_proto::subjects::pool_token(&h.pool);
    loop {
        let stopping = tokio::select! {
            r = rx.changed() => r.is_err(),
            _ = async { stop.wait_for(|s| *s).await.is_ok() } => true,
        };
        let next = rx.borrow_and_update().clone();
        if let Some(p) = next {
            match serde_json::to_vec(&p.record) {
                Ok(body) => {
                    if let Err(e) = out.kv.put(&key, body.into()).await {
                        warn!(pool = %h.pool, error = %e, "cannot write the pool's health record");
                    }
                }
                Err(e) => {
                    warn!(pool = %h.pool, error = %e, "cannot encode the pool's health record")
                }
            }
            if let Err(e) = membership::announce(&out.client, &out.subject, &p.announce).await {
                warn!(pool = %h.pool, error = %e, "cannot announce the pool's health to its other workers");
            }
        }
        if stopping {
            break;
        }
    }
}

#[cfg(test)]
mod tests;

//! Pool quotas: requests and tokens per minute that belong to a pool, shared by however
//! many workers serve it.
//!
//! - [`limiter`]: one member's share as two `governor` GCRA limiters (requests, tokens),
//!   the cool-down pause and the reduced rate that recovers after it. A pool with
//!   separate input- and output-token quotas (`itpm`, `otpm`: Anthropic's limits, issue
//!   52) has a limiter of tokens for each besides: input is charged the prompt's
//!   estimate and corrected to the uncached prompt and cache writes the API reported
//!   (cache reads do not count, as Anthropic counts them); output is charged
//!   `max_tokens` at admission and settled to the tokens produced, as Anthropic does.
//! - [`membership`]: members register in a JetStream KV bucket with a heartbeat; the
//!   bucket's TTL drops crashed members; joins, leaves and cool-downs are announced.
//! - [`QuotaGate`]: what the call path uses. Before each HTTP attempt it waits for a
//!   request and the attempt's token estimate; after it, it corrects the tokens by the
//!   reported usage, starts a pool-wide cool-down on a 429, and pauses this member when
//!   the API's `x-ratelimit-remaining-*` headers say the budget is spent.
//!
//! A worker learns its pools' quotas from its plan ([`crate::WorkerConfig`]'s `plan`,
//! `halyard_proto::pool::QuotaSpec`): `halyard worker --sweep` and `halyard run` take
//! them from the sweep's `rpm`/`tpm`/`burst` model keys; `halyard worker --config` from
//! the worker config file; `halyard worker --pool` from `--quota`.

pub mod limiter;
pub mod membership;
pub mod remote;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use halyard_broker::{Broker, BrokerError};
use halyard_proto::{Completion, Job};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::call_error::{CallError, ErrorClass};
use crate::stats::Stats;
pub use limiter::{PoolLimiter, PoolQuota, DEFAULT_HEADROOM};
use membership::{Announcement, Membership};

pub use halyard_proto::pool::TpmCounts;

/// How members find each other and recover from cool-downs.
#[derive(Clone, Copy, Debug)]
pub struct QuotaSettings {
    /// Membership TTL: a crashed member is noticed at most this long after its last
    /// heartbeat. Heartbeats go every quarter of it; the KV bucket's `max_age` is ¾ of it.
    pub ttl: Duration,
    /// After a cool-down, the time to step back up from half rate to the full share.
    pub recover: Duration,
    /// A joining member waits this long before its first request, so the others have
    /// shrunk their shares when it starts (the worker waits it once, after joining all
    /// its quota pools).
    pub join_settle: Duration,
}

impl Default for QuotaSettings {
    fn default() -> Self {
        QuotaSettings {
            ttl: Duration::from_secs(10),
            recover: Duration::from_secs(30),
            join_settle: Duration::from_millis(500),
        }
    }
}

/// The longest pool-wide pause one 429 can cause, whatever its `Retry-After` says.
pub const MAX_COOLDOWN: Duration = Duration::from_secs(300);

/// Completion tokens assumed for a request without `max_tokens`.
pub const DEFAULT_COMPLETION_ESTIMATE: u64 = 256;

/// Up-front token cost of a job: its prompt, estimated at a token per four characters
/// plus four per message and three for the reply's priming, plus `max_tokens`.
pub fn estimate_tokens(job: &Job) -> u64 {
    estimate_prompt_tokens(job) + estimate_completion_tokens(job)
}

/// The prompt part of [`estimate_tokens`].
pub fn estimate_prompt_tokens(job: &Job) -> u64 {
    job.key.messages.iter().map(|m| (m.content.chars().count() as u64).div_ceil(4) + 4).sum::<u64>()
        + 3
}

/// The completion part of [`estimate_tokens`]: `max_tokens`, or a default without one.
pub fn estimate_completion_tokens(job: &Job) -> u64 {
    job.key.sampling.max_tokens.map_or(DEFAULT_COMPLETION_ESTIMATE, u64::from)
}

/// The input tokens an Anthropic-style input quota charges for `usage`: the prompt less
/// its cache reads (None without reported usage: the estimate stands).
pub fn charged_input_tokens(usage: &halyard_proto::Usage) -> Option<u64> {
    let read = usage.cache.map_or(0, |c| c.read);
    (usage.prompt_tokens > 0).then(|| usage.prompt_tokens.saturating_sub(read))
}

/// The API's rate-limit headers (`x-ratelimit-remaining-*`, `x-ratelimit-reset-*`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RateHeaders {
    pub remaining_requests: Option<u64>,
    pub remaining_tokens: Option<u64>,
    pub reset_requests: Option<Duration>,
    pub reset_tokens: Option<Duration>,
}

impl RateHeaders {
    /// Read the headers through `get` (header name → value); unparseable ones are ignored.
    pub fn parse<'a>(get: impl Fn(&str) -> Option<&'a str>) -> RateHeaders {
        let num = |n: &str| get(n).and_then(|v| v.trim().parse::<u64>().ok());
        let dur = |n: &str| get(n).and_then(parse_reset);
        RateHeaders {
            remaining_requests: num("x-ratelimit-remaining-requests"),
            remaining_tokens: num("x-ratelimit-remaining-tokens"),
            reset_requests: dur("x-ratelimit-reset-requests"),
            reset_tokens: dur("x-ratelimit-reset-tokens"),
        }
    }
}

/// `x-ratelimit-reset-*` values: seconds (`1.5`) or Go-style durations (`6m0s`, `20ms`).
pub fn parse_reset(v: &str) -> Option<Duration> {
    let v = v.trim();
    if let Ok(s) = v.parse::<f64>() {
        return (s.is_finite() && s >= 0.0).then(|| Duration::from_secs_f64(s.min(86_400.0)));
    }
    let (mut total, mut rest) = (0.0f64, v);
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let n = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).filter(|n| *n > 0)?;
        let value: f64 = rest[..n].parse().ok()?;
        rest = &rest[n..];
        let u = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        total += value
            * match &rest[..u] {
                "ms" => 0.001,
                "s" => 1.0,
                "m" => 60.0,
                "h" => 3600.0,
                _ => return None,
            };
        rest = &rest[u..];
    }
    (total.is_finite() && total <= 86_400.0).then(|| Duration::from_secs_f64(total))
}

/// The tokens the API charged a request admitted at `estimate` that reported `usage`:
/// under [`TpmCounts::Usage`] what it used; under [`TpmCounts::MaxTokens`] its prompt (as
/// reported: the estimate's prompt part is corrected either way) plus its whole
/// `max_tokens`, however short the answer (without `max_tokens`, what it used but never
/// less than the estimate: the API's reservation is unknown). No usage reported: the
/// estimate stands.
pub fn charged_tokens(
    counts: TpmCounts,
    estimate: u64,
    max_tokens: Option<u64>,
    usage: &halyard_proto::Usage,
) -> u64 {
    let used = usage.prompt_tokens.saturating_add(usage.completion_tokens);
    if used == 0 {
        return estimate;
    }
    match (counts, max_tokens) {
        (TpmCounts::Usage, _) => used,
        (TpmCounts::MaxTokens, Some(m)) => usage.prompt_tokens.saturating_add(m),
        (TpmCounts::MaxTokens, None) => used.max(estimate),
    }
}

/// One worker's membership of one pool, and the gate its calls pass.
pub struct QuotaGate {
    pool: String,
    limiter: Arc<PoolLimiter>,
    /// Input and output tokens per minute, when the pool has them apart (`itpm`, `otpm`).
    input: Option<Arc<PoolLimiter>>,
    output: Option<Arc<PoolLimiter>>,
    membership: Membership,
    settings: QuotaSettings,
    stats: Arc<Stats>,
    /// When the last cool-down this member started was started (for the backoff used
    /// when a 429 carries no Retry-After), and how many came in a row.
    last_cooldown: Mutex<(Option<Instant>, u32)>,
    stop: watch::Sender<bool>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl QuotaGate {
    /// Register as a member of `pool`, learn the membership, and start the heartbeat.
    pub async fn join(
        broker: &Broker,
        pool: &str,
        quota: PoolQuota,
        worker: &str,
        mut settings: QuotaSettings,
        stats: Arc<Stats>,
    ) -> Result<Arc<QuotaGate>, BrokerError> {
        let sub = membership::subscribe(broker, pool).await?;
        // Retried as a whole: a broker restarting meanwhile loses answers.
        let what = format!("join the quota pool {pool}");
        let (membership, members, ttl) = halyard_broker::retry_js(&what, || async {
            let gone = |e: BrokerError| halyard_broker::vanished(e.to_string());
            let (kv, stream, ttl) = membership::open_bucket(broker).await.map_err(gone)?;
            let m = Membership::new(broker, kv, stream, pool, worker);
            m.heartbeat().await.map_err(gone)?;
            m.announce(&Announcement::Join { worker: worker.to_string() }).await.map_err(gone)?;
            let members = m.live().await.map_err(gone)?;
            Ok::<_, String>((m, members, ttl))
        })
        .await?;
        if ttl.abs_diff(settings.ttl) > Duration::from_millis(50) {
            tracing::warn!(
                pool,
                bucket_ttl_s = ttl.as_secs_f64(),
                configured_ttl_s = settings.ttl.as_secs_f64(),
                "the quota members bucket was made for another membership TTL, which every member \
                 uses; `halyard broker init --quota-ttl` sets it when the bucket is made"
            );
        }
        settings.ttl = ttl;
        // A limiter of tokens alone for each of `itpm` and `otpm`, counted by usage.
        let tokens_only = |per_minute: Option<u64>| {
            per_minute.map(|t| {
                let q = PoolQuota {
                    rpm: None,
                    tpm: Some(t),
                    burst: quota.burst,
                    headroom: quota.headroom,
                    tpm_counts: TpmCounts::Usage,
                    itpm: None,
                    otpm: None,
                };
                Arc::new(PoolLimiter::new(q, members))
            })
        };
        let (input, output) = (tokens_only(quota.itpm), tokens_only(quota.otpm));
        let limiter = Arc::new(PoolLimiter::new(quota, members));
        let gate = Arc::new(QuotaGate {
            pool: pool.to_string(),
            limiter,
            input,
            output,
            membership,
            settings,
            stats,
            last_cooldown: Mutex::new((None, 0)),
            stop: watch::channel(false).0,
            task: Mutex::new(None),
        });
        let rates = gate.limiter.rates();
        info!(pool, members, rpm = ?rates.requests, tpm = ?rates.tokens, "joined quota pool");
        let task = tokio::spawn(upkeep(gate.clone(), sub));
        *gate.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
        // The caller waits `join_settle` before its first request (once for all its
        // pools), holding the gate so that it can leave even if it stops meanwhile.
        Ok(gate)
    }

    pub fn limiter(&self) -> &PoolLimiter {
        &self.limiter
    }

    /// The pool's limiters: requests and tokens, then input and output tokens if any.
    fn limiters(&self) -> impl Iterator<Item = &Arc<PoolLimiter>> {
        std::iter::once(&self.limiter).chain(self.input.iter()).chain(self.output.iter())
    }

    /// Leave the pool: admit no more requests, stop the heartbeat and remove this
    /// member's key, so the others take over its share at once. Requests waiting for the
    /// share wait until their jobs are abandoned (and nak'd for another worker).
    pub async fn leave(&self) {
        self.limiters().for_each(|l| l.close());
        let _ = self.stop.send(true);
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = task {
            let _ = t.await;
        }
        // Bounded: with the broker gone, the others notice by the TTL anyway.
        match tokio::time::timeout(Duration::from_secs(3), self.membership.leave()).await {
            Ok(Ok(())) => info!(pool = %self.pool, "left quota pool"),
            Ok(Err(e)) => {
                warn!(pool = %self.pool, error = %e, "could not leave the quota pool; the others notice when its TTL runs out")
            }
            Err(_) => {
                warn!(pool = %self.pool, "leaving the quota pool timed out; the others notice when its TTL runs out")
            }
        }
    }

    /// Re-read the membership and resize this member's share.
    async fn refresh(&self) {
        match self.membership.live().await {
            Ok(n) => {
                for extra in self.input.iter().chain(self.output.iter()) {
                    extra.set_members(n);
                }
                if self.limiter.set_members(n) {
                    let r = self.limiter.rates();
                    info!(pool = %self.pool, members = n, rpm = ?r.requests, tpm = ?r.tokens, "quota pool membership changed; share resized");
                }
            }
            Err(e) => {
                warn!(pool = %self.pool, error = %e, "cannot read quota pool membership; keeping the current share")
            }
        }
    }

    /// Pause the whole pool for `d` (locally now; the others by announcement).
    fn cool_down(&self, d: Duration) {
        for l in self.limiters() {
            if l.cool_down(d) {
                let limiter = l.clone();
                let recover = self.settings.recover;
                tokio::spawn(async move { limiter.recover(recover).await });
            }
        }
    }

    /// One HTTP attempt through the gate: wait for the share, run `call`, then account
    /// for what the API said.
    pub async fn call<Fut>(
        &self,
        job: &Job,
        call: impl FnOnce() -> Fut,
    ) -> Result<Completion, CallError>
    where
        Fut: Future<Output = (Result<Completion, CallError>, RateHeaders)>,
    {
        let estimate = estimate_tokens(job);
        let epoch = self.limiter.acquire(estimate).await;
        // Input: the prompt's estimate; output: `max_tokens`, both settled below.
        let (prompt, completion) = (estimate_prompt_tokens(job), estimate_completion_tokens(job));
        if let Some(l) = &self.input {
            l.acquire(prompt).await;
        }
        if let Some(l) = &self.output {
            l.acquire(completion).await;
        }
        let (res, headers) = call().await;
        let max_tokens = job.key.sampling.max_tokens.map(u64::from);
        match &res {
            Ok(c) => {
                if let (Some(l), Some(used)) = (&self.input, charged_input_tokens(&c.usage)) {
                    l.correct(prompt, used);
                }
                if let Some(l) = &self.output {
                    l.correct(completion, c.usage.completion_tokens);
                }
            }
            // A request that was answered with an error produced no output; its input
            // counts only if it reached the model, which the API does not say: a 429 is
            // refunded (the API refused it before counting), other errors keep the charge.
            Err(e) => {
                if e.class == ErrorClass::RateLimited {
                    if let Some(l) = &self.input {
                        l.correct(prompt, 0);
                    }
                }
                if let Some(l) = &self.output {
                    l.correct(completion, 0);
                }
            }
        }
        self.settle(estimate, max_tokens, epoch, &res, &headers).await;
        res
    }

    async fn settle(
        &self,
        estimate: u64,
        max_tokens: Option<u64>,
        epoch: u64,
        res: &Result<Completion, CallError>,
        headers: &RateHeaders,
    ) {
        match res {
            Ok(c) => {
                let charged =
                    charged_tokens(self.limiter.quota().tpm_counts, estimate, max_tokens, &c.usage);
                self.limiter.correct(estimate, charged);
            }
            Err(e) if e.class == ErrorClass::RateLimited => {
                // A rejected request spent no tokens.
                self.limiter.correct(estimate, 0);
                // A request admitted before the current cool-down began is part of the
                // same storm: it does not start another.
                if self.limiter.epoch() == epoch {
                    let d = e.retry_after.unwrap_or_else(|| self.backoff()).min(MAX_COOLDOWN);
                    self.cool_down(d);
                    self.stats.cooldowns.inc();
                    warn!(pool = %self.pool, pause_ms = d.as_millis() as u64, "429 from the API: pausing the whole pool");
                    let a = Announcement::CoolDown {
                        worker: self.membership.worker().to_string(),
                        ms: d.as_millis() as u64,
                    };
                    if let Err(e) = self.membership.announce(&a).await {
                        warn!(pool = %self.pool, error = %e, "cannot announce the cool-down to the pool");
                    }
                }
            }
            Err(_) => {}
        }
        let now = Instant::now();
        if headers.remaining_requests == Some(0) {
            let d = headers.reset_requests.unwrap_or(Duration::from_secs(1));
            debug!(pool = %self.pool, pause_ms = d.as_millis() as u64, "x-ratelimit-remaining-requests is 0: pausing this member");
            self.limiter.pause_local(now + d);
        }
        if headers.remaining_tokens.is_some_and(|r| r < estimate) {
            let d = headers.reset_tokens.unwrap_or(Duration::from_secs(1));
            debug!(pool = %self.pool, pause_ms = d.as_millis() as u64, "x-ratelimit-remaining-tokens below a request: pausing this member");
            self.limiter.pause_local(now + d);
        }
    }

    /// Pause for a 429 without Retry-After: 1 s, doubling for each cool-down that follows
    /// the last within the recovery time, up to a minute.
    fn backoff(&self) -> Duration {
        let mut last = self.last_cooldown.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let streak = match last.0 {
            Some(t) if now.duration_since(t) < self.settings.recover + Duration::from_secs(60) => {
                last.1 + 1
            }
            _ => 0,
        };
        *last = (Some(now), streak);
        Duration::from_secs(1 << streak.min(6)).min(Duration::from_secs(60))
    }
}

/// Heartbeat, membership refresh, and announcements from the other members.
async fn upkeep(gate: Arc<QuotaGate>, mut sub: async_nats::Subscriber) {
    use futures::StreamExt;
    let period = (gate.settings.ttl / 4).max(Duration::from_millis(100));
    let mut tick = tokio::time::interval_at(Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stop = gate.stop.subscribe();
    let me = gate.membership.worker().to_string();
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if let Err(e) = gate.membership.heartbeat().await {
                    warn!(pool = %gate.pool, error = %e, "quota heartbeat failed");
                }
                gate.refresh().await;
            }
            m = sub.next() => {
                let Some(m) = m else { break };
                match serde_json::from_slice::<Announcement>(&m.payload) {
                    Ok(Announcement::Join { worker } | Announcement::Leave { worker }) if worker != me => gate.refresh().await,
                    Ok(Announcement::CoolDown { worker, ms }) if worker != me => {
                        // At most MAX_COOLDOWN each, out of the pool's bucket of announced
                        // pauses (remote.rs): a forged one cannot pause the pool for good.
                        let want = Duration::from_millis(ms).min(MAX_COOLDOWN);
                        let d = remote::cool_down(&gate.pool, &me, want);
                        info!(pool = %gate.pool, from = %worker, pause_ms = ms, honoured_ms = d.as_millis() as u64, "pool cool-down");
                        if !d.is_zero() {
                            gate.cool_down(d);
                        }
                    }
                    Ok(_) => {}
                    Err(e) => debug!(pool = %gate.pool, error = %e, "ignoring an unreadable quota announcement"),
                }
            }
            _ = async { stop.wait_for(|s| *s).await.is_ok() } => break,
        }
    }
}

#[cfg(test)]
mod tests;

//! Endpoint outages of the run's pools, as their workers report them in the KV bucket
//! [`halyard_proto::subjects::POOL_HEALTH_BUCKET`]: shown in the progress (and so in the
//! progress line, `halyard status` and `/metrics`), and bounded by `[run]
//! outage_patience_s`: a pool down longer than that stops the run as interrupted,
//! resumable once the endpoint is back, instead of waiting on it forever.
//!
//! The records come from the broker, which other processes share: each is decoded as
//! untrusted input (bounded size, JSON of the expected shape, the pool it names must be
//! the pool of its key); anything else is ignored with a warning. A record counts only
//! while it is fresh (written within [`FRESH`]): paused workers rewrite it after every
//! probe, so a stale pause comes from workers that all stopped, and nothing is spending
//! the run's deliveries then.
//!
//! The coordinator times a pause by its own clock (issue 49, item 5): anyone holding the
//! pool's worker credential can write its record, with any `since_ms` and a fresh
//! `updated_ms`. So a pause counts from when this coordinator first saw the pool paused
//! (one reading of the bucket, every [`EVERY`]), never from the record's `since_ms`
//! (kept for the outage spans of the report only), and a pool from which results of its
//! models were accepted after that is not down: its pause clock restarts at the last
//! accepted result ([`Outages::note_results`], fed by the planner's totals, so only
//! results the run took count). The bound: **a pool record, forged or not, stops the run
//! only when no result of the pool's models has been accepted for `outage_patience_s`
//! (by the coordinator's clock) while every reading saw it paused**; a pool answering at
//! least once per `outage_patience_s` is never stopped by one. What a forger can still
//! do: stop a run after `outage_patience_s` while a pool has nothing to answer (all its
//! jobs done, another pool's stage still running), as a true outage of it would; and the
//! first-contact rule below, for a pool with no result yet.
//!
//! First contact (issue 48): a pool that has no result yet in the run (a resumed run's
//! earlier results count) and whose endpoint has been down for `[run] first_contact_s`
//! stops the run at once with an error that names the model, its URL and the fix
//! ([`Outages::first_contact`], [`FirstContact`]): such an endpoint never answered, so
//! waiting `outage_patience_s` for it only hides a typo. The workers pause a pool that
//! never answered them for a refused key, a 404 and an answer that is not the API's
//! shape as well as for the usual outages (`halyard_worker::health::first_contact`), so
//! the coordinator learns all of them from the same records, whoever runs the workers.
//! The first-contact clock is the same coordinator clock, so a forged record stops a run
//! early only for a pool that truly has no accepted result in the run yet (a slow first
//! answer, past `first_contact_s`, is the most it can cut short).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::kv;
use halyard_broker::Broker;
use halyard_plan::cost::ClassTotals;
use halyard_plan::outage::{OutageSpan, PoolOutage};
use halyard_plan::sweep::Sweep;
use halyard_proto::health::{OutageReason, PoolHealthRecord, MAX_PROBE_INTERVAL_S};
use halyard_proto::subjects;
use tracing::warn;

/// A record rewritten within this long is current (three probe intervals at the cap).
const FRESH: Duration = Duration::from_secs(3 * MAX_PROBE_INTERVAL_S);
/// How often the bucket is read.
const EVERY: Duration = Duration::from_secs(2);
/// Larger values are not health records.
const MAX_RECORD_BYTES: usize = 16 << 10;

/// Add what `r` says to `spans` (one span per pool and start); true if anything changed.
/// Only pauses seen while this coordinator ran (`started_ms`) are kept.
fn note_span(spans: &mut Vec<OutageSpan>, r: &PoolHealthRecord, started_ms: u64) -> bool {
    let until = if r.paused { None } else { r.resumed_ms };
    if !r.paused && until.is_none_or(|u| u < started_ms) {
        return false;
    }
    match spans.iter_mut().find(|s| s.pool == r.pool && s.since_ms == r.since_ms) {
        Some(s) if s.until_ms == until => false,
        Some(s) => {
            s.until_ms = until;
            true
        }
        None => {
            spans.push(OutageSpan {
                pool: r.pool.clone(),
                reason: r.reason.to_string(),
                error: r.error.clone(),
                since_ms: r.since_ms,
                until_ms: until,
            });
            true
        }
    }
}

/// Reads the run's pools' health records now and then.
pub(super) struct Outages {
    broker: Broker,
    store: Option<kv::Store>,
    /// (pool, key) of every pool of the run.
    pools: Vec<(String, String)>,
    patience: Duration,
    started_ms: u64,
    last: Option<Instant>,
    /// Keys whose bad record was already reported (one warning each).
    warned: BTreeSet<String>,
    /// Every outage seen in the run (this process's and earlier ones').
    pub spans: Vec<OutageSpan>,
    /// `spans` changed since [`Outages::take_changed`] last said so.
    changed: bool,
    /// `[run] first_contact_s`.
    first_contact: Duration,
    /// The models of each pool, for the first-contact rule.
    endpoints: BTreeMap<String, Vec<Endpoint>>,
    /// The pause of each pool seen paused at every reading since: when this coordinator
    /// first saw it (its own clock; the record's `since_ms` is not trusted for this).
    paused_seen: BTreeMap<String, Instant>,
    /// Per pool: results of its models accepted so far (the planner's completed jobs,
    /// all processes of the run), and when that count last grew.
    accepted: BTreeMap<String, (u64, Instant)>,
    /// When [`Outages::note_results`] last ran.
    noted: Option<Instant>,
}

/// A model of the sweep as the first-contact message names it.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Endpoint {
    /// The sweep's name for it.
    pub name: String,
    /// The model name sent to the API.
    pub model: String,
    pub base_url: String,
    pub api_key_env: Option<String>,
    /// Its backend (`anthropic` speaks the Messages API; the others the OpenAI dialect).
    pub backend: String,
}

impl Endpoint {
    /// The completion route under `base_url` and what its answer is called.
    fn dialect(&self) -> (&'static str, &'static str) {
        match self.backend.as_str() {
            "anthropic" => ("/messages", "an Anthropic message"),
            _ => ("/chat/completions", "an OpenAI chat completion"),
        }
    }

    /// Every model of `sweep`, by pool.
    pub fn of(sweep: &Sweep) -> BTreeMap<String, Vec<Endpoint>> {
        let mut by_pool: BTreeMap<String, Vec<Endpoint>> = BTreeMap::new();
        for m in &sweep.models {
            by_pool.entry(m.spec.pool.clone()).or_default().push(Endpoint {
                name: m.spec.name.clone(),
                model: m.spec.model_ref.model.clone(),
                base_url: m.spec.model_ref.endpoint.clone(),
                api_key_env: m.spec.api_key_env.clone(),
                backend: m.spec.model_ref.backend.clone(),
            });
        }
        by_pool
    }
}

/// A pool that never answered in the run, past `first_contact_s`: the run stops.
#[derive(Clone, Debug, PartialEq)]
pub struct FirstContact {
    pub outage: PoolOutage,
    /// What was wrong and the fix, naming the model and its URL.
    pub message: String,
}

impl Outages {
    pub fn new(
        broker: Broker,
        pools: impl IntoIterator<Item = String>,
        patience: Duration,
        spans: Vec<OutageSpan>,
    ) -> Self {
        let pools = pools.into_iter().map(|p| {
            let key = subjects::pool_token(&p);
            (p, key)
        });
        Outages {
            broker,
            store: None,
            pools: pools.collect(),
            patience,
            started_ms: now_ms(),
            last: None,
            warned: BTreeSet::new(),
            spans,
            changed: false,
            first_contact: Duration::from_secs(45),
            endpoints: BTreeMap::new(),
            paused_seen: BTreeMap::new(),
            accepted: BTreeMap::new(),
            noted: None,
        }
    }

    /// The run's totals by model (`costs`) at `at`: a pool whose models' completed jobs
    /// grew since the last call made progress at `at`, which restarts its pause clock
    /// (see the module docs). Called once at start (the resumed run's totals: progress at
    /// start), before the records are read, and after a batch of results the planner took
    /// when [`Outages::results_due`] says so.
    pub fn note_results(&mut self, costs: &[ClassTotals], at: Instant) {
        note_results(&self.endpoints, &mut self.accepted, costs, at);
        self.noted = Some(at);
    }

    /// Whether a batch of results is to be noted at `now`: at most once a second (the
    /// totals are copied to be read; a pause clock restarted up to a second late is
    /// nothing beside a patience of minutes), always before the records are read.
    pub fn results_due(&self, now: Instant) -> bool {
        self.noted.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1))
    }

    /// Whether [`Outages::poll`] will read the records now.
    pub fn poll_due(&self) -> bool {
        self.last.is_none_or(|t| t.elapsed() >= EVERY)
    }

    /// Stop the run when a pool of `endpoints` that never answered is down for
    /// `wait` (see the module docs).
    pub fn with_first_contact(
        mut self,
        wait: Duration,
        endpoints: BTreeMap<String, Vec<Endpoint>>,
    ) -> Self {
        self.first_contact = wait;
        self.endpoints = endpoints;
        self
    }

    /// The first pool in `down` that has no result in the run (`costs`: the run's
    /// totals by model) and has been down for `first_contact_s`, with the message.
    pub fn first_contact(
        &self,
        down: &[PoolOutage],
        costs: &[ClassTotals],
    ) -> Option<FirstContact> {
        first_contact(self.first_contact, &self.endpoints, down, costs)
    }

    /// Read the records now, whenever they were last read (before the report: an outage
    /// that ended since is recorded as ended).
    pub async fn refresh(&mut self) {
        self.last = None;
        let _ = self.poll().await;
    }

    /// Whether the spans changed since the last call (then they are to be stored).
    pub fn take_changed(&mut self) -> bool {
        std::mem::take(&mut self.changed)
    }

    /// The pools down now, if it is time to look (else None): read every pool's record.
    pub async fn poll(&mut self) -> Option<Vec<PoolOutage>> {
        if self.last.is_some_and(|t| t.elapsed() < EVERY) {
            return None;
        }
        self.last = Some(Instant::now());
        if self.store.is_none() {
            // Made with the rest of the layout at start (halyard_broker::layout); read only.
            self.store = self.broker.js.get_key_value(subjects::POOL_HEALTH_BUCKET).await.ok();
        }
        let store = self.store.as_ref()?;
        let now = now_ms();
        let at = Instant::now();
        let mut down = Vec::new();
        for (pool, key) in &self.pools {
            let value = match store.get(key).await {
                Ok(Some(v)) => Some(v),
                Ok(None) => None,
                Err(e) => {
                    warn!(pool = %pool, error = %e, "could not read the pool's health record");
                    continue;
                }
            };
            let record = match value.map(|v| decode(pool, &v)) {
                None => None,
                Some(Ok(r)) => Some(r),
                Some(Err(why)) => {
                    if self.warned.insert(key.clone()) {
                        warn!(pool = %pool, key = %key, "ignoring the pool's health record: {why}");
                    }
                    None
                }
            };
            // A stale pause is nobody's current outage (see the module docs).
            let record = record.filter(|r| !r.paused || fresh(r, now));
            if let Some(r) = &record {
                self.changed |= note_span(&mut self.spans, r, self.started_ms);
            }
            let clock = PauseClock {
                seen: self.paused_seen.get(pool).copied(),
                accepted: self.accepted.get(pool).map(|(_, t)| *t),
            };
            let (o, seen) = match record {
                Some(r) => outage(&r, now, at, clock),
                None => (None, None),
            };
            match seen {
                Some(t) => self.paused_seen.insert(pool.clone(), t),
                None => self.paused_seen.remove(pool),
            };
            down.extend(o);
        }
        Some(down)
    }

    /// The first outage past the patience, if any.
    pub fn past_patience<'a>(&self, down: &'a [PoolOutage]) -> Option<&'a PoolOutage> {
        past_patience(self.patience, down)
    }
}

fn first_contact(
    wait: Duration,
    endpoints: &BTreeMap<String, Vec<Endpoint>>,
    down: &[PoolOutage],
    costs: &[ClassTotals],
) -> Option<FirstContact> {
    down.iter().find_map(|o| {
        let models = endpoints.get(&o.pool)?;
        let answered = costs.iter().any(|c| c.jobs > 0 && models.iter().any(|m| m.name == c.model));
        if answered || o.down_s < wait.as_secs() {
            return None;
        }
        Some(FirstContact { outage: o.clone(), message: first_contact_message(o, models) })
    })
}

/// "model "judge" (`local-model` at http://…/v1) has not answered …: nothing listens …".
fn first_contact_message(o: &PoolOutage, models: &[Endpoint]) -> String {
    let names: Vec<String> = models.iter().map(|m| format!("{:?}", m.name)).collect();
    let m = &models[0];
    let url = halyard_proto::redact::url(&m.base_url);
    let reason = OutageReason::ALL.into_iter().find(|r| r.as_str() == o.reason);
    let fix = match reason {
        Some(OutageReason::Connection) => {
            format!("nothing listens at {url}; start the server or fix `base_url`")
        }
        Some(OutageReason::Dns) => {
            format!("the host name of {url} does not resolve (DNS); fix `base_url`")
        }
        Some(OutageReason::Tls) => format!(
            "the TLS handshake with {url} failed (a certificate this machine does not trust, \
             or https:// to a plain-HTTP server); fix `base_url` or the server's certificate"
        ),
        Some(OutageReason::Timeout) => {
            format!("{url} took the connection but never answered within the model's timeout_s")
        }
        Some(OutageReason::Unauthorized) => match &m.api_key_env {
            Some(var) => format!(
                "{url} refused the key in `${var}` (HTTP 401/403); set `{var}` to a key it \
                 accepts on the workers"
            ),
            None => format!(
                "{url} wants an API key (HTTP 401/403); set the model's `api_key_env` to the \
                 name of the variable that holds it"
            ),
        },
        Some(OutageReason::NotFound) => format!(
            "{url}{} answered 404: a wrong route (`base_url` usually ends in /v1) or a model \
             name the server does not know (`model = {:?}`; `halyard check` lists the \
             server's models)",
            m.dialect().0,
            m.model
        ),
        Some(OutageReason::NotApi) => format!(
            "{url} answered with something that is not {}; `base_url` points at another \
             service (it usually ends in /v1)",
            m.dialect().1
        ),
        _ => format!("{url} answers {} (the server is up but not serving)", o.reason),
    };
    format!(
        "model {} (`{}` at {url}) has not answered since the run began: {fix} [{}: {}]",
        names.join(", "),
        m.model,
        o.reason,
        o.error
    )
}

/// Per pool of `endpoints`: its models' completed jobs in `costs`, and `at` when that
/// count grew since `accepted` last held it (see [`Outages::note_results`]).
fn note_results(
    endpoints: &BTreeMap<String, Vec<Endpoint>>,
    accepted: &mut BTreeMap<String, (u64, Instant)>,
    costs: &[ClassTotals],
    at: Instant,
) {
    for (pool, models) in endpoints {
        let n: u64 =
            costs.iter().filter(|c| models.iter().any(|m| m.name == c.model)).map(|c| c.jobs).sum();
        match accepted.get_mut(pool) {
            Some((count, _)) if *count >= n => {}
            Some(e) => *e = (n, at),
            None => {
                accepted.insert(pool.clone(), (n, at));
            }
        }
    }
}

fn past_patience(patience: Duration, down: &[PoolOutage]) -> Option<&PoolOutage> {
    down.iter().find(|o| o.down_s > patience.as_secs())
}

/// Rewritten recently enough to be current: some worker is still probing.
fn fresh(r: &PoolHealthRecord, now: u64) -> bool {
    now.saturating_sub(r.updated_ms) <= FRESH.as_millis() as u64
}

/// What the coordinator's own clock knows of a pool: when it first saw the pool's current
/// pause (None: not paused at the last reading), and when a result of the pool's models
/// was last accepted.
#[derive(Clone, Copy, Debug, Default)]
struct PauseClock {
    seen: Option<Instant>,
    accepted: Option<Instant>,
}

/// The outage a record describes at `now` (wall clock, for the record's freshness and
/// next probe) and `at` (the coordinator's clock), if it is current, and when the pause
/// was first seen (to keep; None: the pool is not paused). The pause counts from when it
/// was first seen or the last accepted result, whichever is later: never from the
/// record's own `since_ms` (see the module docs).
fn outage(
    r: &PoolHealthRecord,
    now: u64,
    at: Instant,
    clock: PauseClock,
) -> (Option<PoolOutage>, Option<Instant>) {
    if !r.paused || !fresh(r, now) {
        return (None, None);
    }
    let seen = clock.seen.unwrap_or(at);
    let from = clock.accepted.map_or(seen, |a| a.max(seen));
    let o = PoolOutage {
        pool: r.pool.clone(),
        reason: r.reason.to_string(),
        error: r.error.clone(),
        down_s: at.saturating_duration_since(from).as_secs(),
        next_probe_s: r.next_probe_ms.map(|t| t.saturating_sub(now) / 1000),
    };
    (Some(o), Some(seen))
}

/// A record under the key of `pool`, checked as untrusted input.
fn decode(pool: &str, value: &[u8]) -> Result<PoolHealthRecord, String> {
    if value.len() > MAX_RECORD_BYTES {
        return Err(format!("{} bytes (at most {MAX_RECORD_BYTES})", value.len()));
    }
    let r: PoolHealthRecord =
        serde_json::from_slice(value).map_err(|e| format!("not a health record: {e}"))?;
    if r.pool != pool {
        return Err(format!("it names pool {:?}, not this key's pool", r.pool));
    }
    Ok(r)
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use halyard_proto::health::OutageReason;

    use super::*;

    fn record(pool: &str, paused: bool, since_ms: u64, updated_ms: u64) -> PoolHealthRecord {
        PoolHealthRecord {
            pool: pool.into(),
            paused,
            reason: OutageReason::Connection,
            error: "connection refused".into(),
            since_ms,
            next_probe_ms: Some(updated_ms + 30_000),
            probes_failed: 2,
            resumed_ms: None,
            worker: "w".into(),
            updated_ms,
        }
    }

    /// Fresh pauses count from when the coordinator first saw them; stale ones, resumed
    /// pools and records of another pool or shape do not count.
    #[test]
    fn records_are_checked_and_counted() {
        let t0 = Instant::now();
        let started = 1_000_000;
        let now = started + 600_000;
        let secs = Duration::from_secs;
        let seen = PauseClock { seen: Some(t0), accepted: None };
        let r = record("p", true, started + 100_000, now - 5_000);
        let (down, kept) = outage(&r, now, t0 + secs(500), seen);
        let down = down.unwrap();
        assert_eq!(kept, Some(t0), "the first sight is kept");
        assert_eq!((down.down_s, down.next_probe_s), (500, Some(25)));
        assert_eq!(down.describe(), "p: endpoint down for 8m20s (connection), next probe in 25s");
        assert!(past_patience(secs(300), std::slice::from_ref(&down)).is_some());
        assert!(past_patience(secs(600), &[down]).is_none());
        // Seen now for the first time: down for 0 s, and now is kept as its first sight.
        let (first, kept) = outage(&r, now, t0, PauseClock::default());
        assert_eq!((first.unwrap().down_s, kept), (0, Some(t0)));
        // Stale (no worker probing) or resumed: not an outage, and the clock is dropped.
        let stale = record("p", true, started, now - 200_000);
        assert!(matches!(outage(&stale, now, t0, seen), (None, None)));
        assert!(matches!(outage(&record("p", false, started, now), now, t0, seen), (None, None)));
        // Untrusted values.
        let good = serde_json::to_vec(&record("p", true, 1, 2)).unwrap();
        assert!(decode("p", &good).is_ok());
        assert!(decode("q", &good).unwrap_err().contains("names pool \"p\""));
        assert!(decode("p", b"{\"pool\":1}").unwrap_err().contains("not a health record"));
        assert!(decode("p", &vec![b' '; MAX_RECORD_BYTES + 1]).unwrap_err().contains("bytes"));
    }

    /// Issue 49, item 5: a forged "paused" record with an old `since_ms` and a fresh
    /// `updated_ms` counts from the coordinator's first sight of it, not from `since_ms`
    /// (a day ago here), and a pool whose results are accepted after that is not down:
    /// every accepted result restarts its clock, so a pool answering at least once per
    /// patience never passes it, however long the record says it is down.
    #[test]
    fn forged_pauses_count_by_the_coordinators_clock_and_results_restart_it() {
        let t0 = Instant::now();
        let secs = Duration::from_secs;
        let patience = secs(300);
        let now = 100_000_000_000u64;
        let forged = record("p", true, now - 86_400_000, now);
        // The old code's count: a day, past any patience at the first reading.
        let (first, seen) = outage(&forged, now, t0, PauseClock::default());
        assert_eq!(first.unwrap().down_s, 0, "since_ms is not the coordinator's clock");
        let seen = seen.unwrap();
        // A result accepted every 200 s for an hour: never down for the patience.
        let mut accepted = None;
        for step in 1..=18u64 {
            let at = t0 + secs(step * 200);
            let clock = PauseClock { seen: Some(seen), accepted };
            // Rewritten by the forger just before each reading (fresh).
            let wall = now + step * 200_000;
            let forged = record("p", true, now - 86_400_000, wall - 1_000);
            let (o, kept) = outage(&forged, wall, at, clock);
            assert_eq!(kept, Some(seen));
            let o = o.unwrap();
            assert!(o.down_s <= 200, "step {step}: down {} s", o.down_s);
            assert!(past_patience(patience, &[o]).is_none());
            accepted = Some(at);
        }
        // Results stop: past the patience counted from the last one.
        let last = accepted.unwrap();
        let clock = PauseClock { seen: Some(seen), accepted };
        let (o, _) = outage(&forged, now, last + secs(301), clock);
        assert!(past_patience(patience, &[o.unwrap()]).is_some());
        let (o, _) = outage(&forged, now, last + secs(299), clock);
        assert!(past_patience(patience, &[o.unwrap()]).is_none());
        // A result accepted before the pause was seen does not shorten its count.
        let clock = PauseClock { seen: Some(seen), accepted: Some(t0) };
        let (o, _) = outage(&forged, now, seen + secs(301), clock);
        assert_eq!(o.unwrap().down_s, 301);
    }

    /// The totals the planner keeps say which pools made progress: a pool's count grows
    /// only with its own models' completed jobs.
    #[test]
    fn accepted_results_are_noted_per_pool() {
        let endpoint = |name: &str| Endpoint {
            name: name.into(),
            model: "m".into(),
            base_url: "http://127.0.0.1:1/v1".into(),
            api_key_env: None,
            backend: "openai".into(),
        };
        let endpoints = BTreeMap::from([
            ("p".to_string(), vec![endpoint("a"), endpoint("b")]),
            ("q".to_string(), vec![endpoint("judge")]),
        ]);
        let mut accepted = BTreeMap::new();
        let totals = |a: u64, judge: u64| {
            vec![
                ClassTotals { model: "a".into(), jobs: a, ..Default::default() },
                ClassTotals { model: "judge".into(), jobs: judge, ..Default::default() },
            ]
        };
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(10);
        let t2 = t1 + Duration::from_secs(10);
        note_results(&endpoints, &mut accepted, &totals(3, 0), t0);
        assert_eq!(accepted["p"], (3, t0));
        assert_eq!(accepted["q"], (0, t0));
        note_results(&endpoints, &mut accepted, &totals(3, 1), t1);
        assert_eq!((accepted["p"], accepted["q"]), ((3, t0), (1, t1)));
        note_results(&endpoints, &mut accepted, &totals(5, 1), t2);
        assert_eq!((accepted["p"], accepted["q"]), ((5, t2), (1, t1)));
    }

    /// Issue 48: a pool down for `first_contact_s` with no result in the run stops it,
    /// naming model, URL and fix; one with a result (this run's or a resumed run's) waits
    /// for the patience instead, and so does one down for less.
    #[test]
    fn first_contact_only_for_pools_without_results() {
        let endpoint = |name: &str, var: Option<&str>| Endpoint {
            name: name.into(),
            model: "gpt-x".into(),
            base_url: "https://api.example.com/v1".into(),
            api_key_env: var.map(str::to_string),
            backend: "openai".into(),
        };
        let endpoints = BTreeMap::from([
            ("p".to_string(), vec![endpoint("model-a", Some("TEAM_API_KEY"))]),
            ("q".to_string(), vec![endpoint("judge", None)]),
        ]);
        let down = |pool: &str, reason: OutageReason, down_s| PoolOutage {
            pool: pool.into(),
            reason: reason.to_string(),
            error: "HTTP 401".into(),
            down_s,
            next_probe_s: Some(4),
        };
        let wait = Duration::from_secs(45);
        let none: Vec<ClassTotals> = Vec::new();
        let fc =
            first_contact(wait, &endpoints, &[down("p", OutageReason::Unauthorized, 45)], &none)
                .unwrap();
        assert!(
            fc.message.starts_with(
                "model \"model-a\" (`gpt-x` at https://api.example.com/v1) has not answered"
            ),
            "{}",
            fc.message
        );
        assert!(fc.message.contains("refused the key in `$TEAM_API_KEY`"), "{}", fc.message);
        let early = [down("p", OutageReason::Connection, 44)];
        assert!(first_contact(wait, &endpoints, &early, &none).is_none());
        let answered = vec![ClassTotals { model: "model-a".into(), jobs: 1, ..Default::default() }];
        let late = [down("p", OutageReason::Connection, 4_000)];
        assert!(first_contact(wait, &endpoints, &late, &answered).is_none());
        // Another pool's results do not count for this one.
        let fc =
            first_contact(wait, &endpoints, &[down("q", OutageReason::NotFound, 60)], &answered)
                .unwrap();
        assert!(fc.message.contains("answered 404: a wrong route"), "{}", fc.message);
        let fc = first_contact(wait, &endpoints, &[down("q", OutageReason::Connection, 60)], &none)
            .unwrap();
        assert!(
            fc.message.contains("nothing listens at https://api.example.com/v1; start the server"),
            "{}",
            fc.message
        );
    }

    /// Spans open on a pause and close on the resumption of the same pause; resumptions
    /// from before the coordinator started are not this run's.
    #[test]
    fn spans_follow_pause_and_resume() {
        let mut spans = Vec::new();
        let started = 10_000;
        let paused = record("p", true, 20_000, 21_000);
        assert!(note_span(&mut spans, &paused, started));
        assert!(!note_span(&mut spans, &paused, started));
        let resumed =
            PoolHealthRecord { paused: false, resumed_ms: Some(80_000), ..paused.clone() };
        assert!(note_span(&mut spans, &resumed, started));
        assert_eq!(spans.len(), 1);
        assert_eq!((spans[0].until_ms, spans[0].down_s(0)), (Some(80_000), 60));
        let old = PoolHealthRecord { since_ms: 1_000, resumed_ms: Some(5_000), ..resumed };
        assert!(!note_span(&mut spans, &old, started));
        assert_eq!(spans.len(), 1);
    }

    /// The first-contact message names the route and the answer of the model's dialect.
    #[test]
    fn first_contact_names_the_dialects_route() {
        let down = |reason: OutageReason| PoolOutage {
            pool: "p".into(),
            reason: reason.as_str().into(),
            error: "e".into(),
            down_s: 60,
            next_probe_s: None,
        };
        let m = |backend: &str| Endpoint {
            name: "claude".into(),
            model: "claude-haiku-4-5".into(),
            base_url: "http://127.0.0.1:1/v1".into(),
            api_key_env: None,
            backend: backend.into(),
        };
        let msg = first_contact_message(&down(OutageReason::NotFound), &[m("anthropic")]);
        assert!(msg.contains("http://127.0.0.1:1/v1/messages answered 404"), "{msg}");
        let msg = first_contact_message(&down(OutageReason::NotApi), &[m("anthropic")]);
        assert!(msg.contains("not an Anthropic message"), "{msg}");
        let msg = first_contact_message(&down(OutageReason::NotFound), &[m("openai")]);
        assert!(msg.contains("/v1/chat/completions answered 404"), "{msg}");
    }
}

//! The shared tier: a JetStream KV bucket ([`BUCKET`]) of the broker account, shared by
//! every machine of a cluster and replicated like Halyard's other buckets.
//!
//! - **Who writes**: the coordinator only ([`SharedWriter`]), with a result it accepted
//!   for a job it planned; the worker role has no right to publish to `$KV.halyard_cache.>`
//!   (deploy/nats permissions). A worker reads ([`SharedReader`]).
//! - **What a value is**: an [`Entry`] (MessagePack, named fields): the entry version,
//!   the job id, the completion, the run that accepted it. A reader refuses (and never
//!   serves) a value that does not decode, is of another version, or names another job
//!   than the key it is stored under: a value copied under another job's name answers
//!   nothing. The first accepted answer of a job stays: a write never replaces an entry
//!   (`create`), so a later run drawing fresh samples (`cache = "off"`) changes nothing.
//! - **Bounded, pruned by age and use**: the bucket holds at most [`MAX_BYTES`]; when
//!   full, the entries written longest ago make way for new ones (`discard = old`: the
//!   broker drops the oldest message, and each key holds one), so a full bucket never
//!   refuses what a run accepted. An entry a run used is written again, unchanged, when it
//!   was written more than [`REFRESH_AFTER`] ago ([`SharedWriter::refresh`]): entries in
//!   use move to the end of that order, and an entry expires once nobody has used it for
//!   [`MAX_AGE`]. A bucket made by an earlier build (`discard = new`: a full bucket refused
//!   every new entry until old ones expired) is brought to this policy by the first
//!   coordinator that opens it ([`SharedWriter::open`]).
//! - **A miss costs no round trip**: each reader follows the bucket's keys with a
//!   headers-only watch (an ordered consumer, the last message of each key, then every new
//!   one) into a [`JobIdFilter`] of fixed size. Once the watch has caught up, a job the
//!   filter has never seen is a miss without asking the broker; a job it may hold (or any
//!   job while the watch is behind, broken, or was never made) is read from the bucket as
//!   before. A put reaches the filter milliseconds after the broker stored it, so a run
//!   answers from what another run accepted earlier; two runs that ask at the same moment
//!   both call, as they would without the filter. A watch is trusted only for a few
//!   seconds after it was found to have delivered the bucket's newest message
//!   ([`watch_keys`]). A bucket of
//!   more than [`WATCH_MAX_KEYS`] entries is not followed (its keys would cost every
//!   worker a long catch-up and the filter many false positives): every lookup asks the
//!   broker.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_nats::jetstream::{consumer, kv, stream};
use futures::StreamExt;
use halyard_broker::Broker;
use halyard_proto::{Completion, JobId, JobIdFilter};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::CacheError;

/// The bucket's name.
pub const BUCKET: &str = "halyard_cache";
/// Entries not written (nor used, [`REFRESH_AFTER`]) for this long expire.
pub const MAX_AGE: Duration = Duration::from_secs(180 * 24 * 3600);
/// The bucket's size limit.
pub const MAX_BYTES: i64 = 8 << 30;
/// An entry a run used is written again when it was written longer ago than this
/// ([`SharedWriter::refresh`]): often enough that entries in use are the last a full
/// bucket drops, rarely enough that a run answered from the bucket costs one read per
/// entry, not a write.
pub const REFRESH_AFTER: Duration = Duration::from_secs(24 * 3600);
/// Version of [`Entry`].
pub const ENTRY_VERSION: u16 = 1;
/// How long a write the broker refuses is tried again (a bucket without a leader, while
/// another node takes over: 4 to 7 s in the compose fault test).
const RETRY_FOR: Duration = Duration::from_secs(30);
/// How long a reader that found no bucket waits before it looks again (and a watch of
/// its keys that failed, before it is made again).
const LOOK_AGAIN: Duration = Duration::from_secs(30);
/// A bucket holding more entries than this is not watched ([`SharedReader`]): about
/// 0.07% false positives in the filter at this many, and a catch-up of about 200 MB of
/// headers for each reader that starts.
pub const WATCH_MAX_KEYS: u64 = 1_000_000;

/// One shared entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub v: u16,
    pub job: JobId,
    pub completion: Completion,
    /// The run whose coordinator accepted it.
    pub run: uuid::Uuid,
}

/// The bucket's stream, as the coordinator creates it.
pub fn config(replicas: usize) -> stream::Config {
    stream::Config {
        name: format!("KV_{BUCKET}"),
        subjects: vec![format!("$KV.{BUCKET}.>")],
        max_messages_per_subject: 1,
        max_age: MAX_AGE,
        max_bytes: MAX_BYTES,
        storage: stream::StorageType::File,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        discard: stream::DiscardPolicy::Old,
        num_replicas: replicas,
        ..Default::default()
    }
}

/// The key of job `id` in the bucket.
pub fn kv_key(id: &JobId) -> String {
    id.to_string()
}

/// The job a key of the bucket names ([`kv_key`]'s inverse); `None` for any other key.
pub fn parse_kv_key(key: &str) -> Option<JobId> {
    key.parse().ok()
}

/// Decode and check the value stored under `id`'s key.
pub fn check(id: &JobId, bytes: &[u8]) -> Result<Completion, String> {
    let e: Entry = halyard_proto::decode("shared cache entry", bytes).map_err(|e| e.to_string())?;
    if e.v != ENTRY_VERSION {
        return Err(format!("entry version {} (this build reads {ENTRY_VERSION})", e.v));
    }
    if e.job != *id {
        return Err(format!("it answers job {}, not {id}", e.job));
    }
    Ok(e.completion)
}

/// Set stream `name` to `discard = old`, every other setting as the server holds it: its
/// configuration is read and sent back as the server's JSON, not through async-nats's
/// `Config`, which (built for nats-server 2.9) would drop the fields of later servers.
async fn set_discard_old(b: &Broker, name: &str) -> Result<(), String> {
    let empty = serde_json::json!({});
    let info: serde_json::Value =
        b.js.request(format!("STREAM.INFO.{name}"), &empty).await.map_err(|e| e.to_string())?;
    if let Some(e) = info.get("error") {
        return Err(e.to_string());
    }
    let mut cfg =
        info.get("config").cloned().ok_or("the stream's information has no configuration")?;
    cfg["discard"] = serde_json::json!("old");
    let answer: serde_json::Value =
        b.js.request(format!("STREAM.UPDATE.{name}"), &cfg).await.map_err(|e| e.to_string())?;
    match answer.get("error") {
        Some(e) => Err(e.to_string()),
        None => Ok(()),
    }
}

/// Seconds from the Unix time `t` (the broker's timestamp of a message) to now; 0 for a
/// time ahead of this machine's clock.
fn seconds_since(t: i64) -> u64 {
    u64::try_from(t).map_or(crate::rows::now_s(), |t| crate::rows::now_s().saturating_sub(t))
}

/// The shared bucket as `halyard cache stats --nats` shows it (its stream's figures:
/// nothing of what an entry holds).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SharedStats {
    pub bucket: String,
    pub entries: u64,
    pub bytes: u64,
    /// The size limit (bytes).
    pub max_bytes: i64,
    /// Seconds since the entry written (or used) longest ago was written: the next to go
    /// when the bucket is full. `None` when it is empty.
    pub oldest_s: Option<u64>,
    /// What a full bucket does: `drops the oldest` (`discard = old`), or `refuses new
    /// entries` (a bucket an earlier build made, until a coordinator of this build
    /// opens it).
    pub when_full: String,
    pub replicas: usize,
}

/// The shared bucket's figures on broker `b`; `None` when no coordinator made it there.
pub async fn stats(b: &Broker) -> Result<Option<SharedStats>, CacheError> {
    let Some(stream) = halyard_broker::layout::lookup(b, &config(1))
        .await
        .map_err(|e| CacheError::Broker(e.to_string()))?
    else {
        return Ok(None);
    };
    let info = stream.cached_info();
    let oldest_s = (info.state.messages > 0)
        .then(|| seconds_since(info.state.first_timestamp.unix_timestamp()));
    Ok(Some(SharedStats {
        bucket: BUCKET.to_string(),
        entries: info.state.messages,
        bytes: info.state.bytes,
        max_bytes: info.config.max_bytes,
        oldest_s,
        when_full: match info.config.discard {
            stream::DiscardPolicy::Old => "drops the oldest".to_string(),
            _ => "refuses new entries".to_string(),
        },
        replicas: info.config.num_replicas,
    }))
}

/// A worker's read side. Opens the bucket when first needed; a broker without it (no
/// coordinator of this build made it yet) is looked at again every [`LOOK_AGAIN`]. Once
/// open, its keys are followed ([`Keys`]) so that a miss costs no round trip.
#[derive(Clone)]
pub struct SharedReader {
    broker: Broker,
    store: Arc<Mutex<(Option<kv::Store>, Option<tokio::time::Instant>)>>,
    refused_warned: Arc<AtomicBool>,
    keys: Arc<Keys>,
}

/// What a reader knows of the bucket's keys, from its watch ([`follow_keys`]).
struct Keys {
    /// Every job whose key the watch has seen put.
    seen: JobIdFilter,
    /// Until when a job not in `seen` is trusted to be absent (milliseconds since
    /// `base`; 0: not trusted): a little after the watch was last found to have
    /// delivered every key the bucket held a moment before ([`watch_keys`]). It runs out
    /// by itself when the checks stop (the broker away, the watch starved).
    trusted_until: AtomicU64,
    base: std::time::Instant,
    /// Lookups that asked the broker.
    round_trips: AtomicU64,
    /// The watch's task, ended with the last reader.
    watch: std::sync::Mutex<Option<tokio::task::AbortHandle>>,
}

impl Keys {
    /// Whether a job not in `seen` is absent from the bucket, by the watch.
    fn trusted(&self) -> bool {
        let now = self.base.elapsed().as_millis() as u64;
        now < self.trusted_until.load(Ordering::Acquire)
    }

    /// Trust the watch until `t` (never less than it already is).
    fn trust_until(&self, t: std::time::Instant) {
        let ms = t.saturating_duration_since(self.base).as_millis() as u64;
        self.trusted_until.fetch_max(ms.max(1), Ordering::AcqRel);
    }

    fn distrust(&self) {
        self.trusted_until.store(0, Ordering::Release);
    }
}

impl Drop for Keys {
    fn drop(&mut self) {
        if let Some(h) = self.watch.get_mut().ok().and_then(|w| w.take()) {
            h.abort();
        }
    }
}

impl SharedReader {
    pub fn new(broker: Broker) -> SharedReader {
        SharedReader {
            broker,
            store: Arc::new(Mutex::new((None, None))),
            refused_warned: Arc::new(AtomicBool::new(false)),
            keys: Arc::new(Keys {
                seen: JobIdFilter::new(),
                trusted_until: AtomicU64::new(0),
                base: std::time::Instant::now(),
                round_trips: AtomicU64::new(0),
                watch: std::sync::Mutex::new(None),
            }),
        }
    }

    /// Lookups that asked the broker (the others were answered "no" by the watch).
    pub fn round_trips(&self) -> u64 {
        self.keys.round_trips.load(Ordering::Relaxed)
    }

    /// Whether the watch of the bucket's keys has caught up: from then on a miss costs no
    /// round trip.
    pub fn follows_keys(&self) -> bool {
        self.keys.trusted()
    }

    async fn store(&self) -> Option<kv::Store> {
        let mut s = self.store.lock().await;
        if let Some(st) = &s.0 {
            return Some(st.clone());
        }
        if s.1.is_some_and(|t| t.elapsed() < LOOK_AGAIN) {
            return None;
        }
        s.1 = Some(tokio::time::Instant::now());
        match halyard_broker::layout::lookup(&self.broker, &config(1)).await {
            Ok(Some(_)) => match self.broker.js.get_key_value(BUCKET).await {
                Ok(st) => {
                    s.0 = Some(st.clone());
                    let task = tokio::spawn(follow_keys(
                        self.broker.clone(),
                        st.clone(),
                        Arc::downgrade(&self.keys),
                    ));
                    if let Ok(mut w) = self.keys.watch.lock() {
                        *w = Some(task.abort_handle());
                    }
                    Some(st)
                }
                Err(e) => {
                    tracing::debug!(error = %e, "shared result cache not open");
                    None
                }
            },
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(error = %e, "the shared result cache's bucket is not usable; jobs are called");
                None
            }
        }
    }

    /// The accepted completion of job `id`, if the bucket holds one that checks out.
    pub async fn get(&self, id: &JobId) -> Result<Option<Completion>, CacheError> {
        if !self.keys.seen.may_contain(id) && self.keys.trusted() {
            return Ok(None);
        }
        let Some(store) = self.store().await else { return Ok(None) };
        self.keys.round_trips.fetch_add(1, Ordering::Relaxed);
        let Some(bytes) =
            store.get(kv_key(id)).await.map_err(|e| CacheError::Broker(e.to_string()))?
        else {
            return Ok(None);
        };
        match check(id, &bytes) {
            Ok(c) => Ok(Some(c)),
            Err(why) => {
                if !self.refused_warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(job = %id, reason = %why, "a shared result cache entry was refused (not served; said once)");
                }
                Ok(None)
            }
        }
    }
}

/// Why a watch of the bucket's keys is not (or no longer) followed.
enum Unfollowed {
    /// It could not be made (no right to make it, the broker away): said once.
    Cannot(String),
    /// It failed or stopped delivering (a gap, flow control stuck): said once.
    Lost(String),
    /// The bucket holds more than [`WATCH_MAX_KEYS`] entries: said once.
    TooLarge(u64),
}

/// Follow the keys of bucket `store` into `keys` until the last reader is gone. A watch
/// that cannot be made or is lost is made again after [`LOOK_AGAIN`] (a bucket too large
/// to follow is looked at again then too); meanwhile every lookup asks the broker.
async fn follow_keys(broker: Broker, store: kv::Store, keys: Weak<Keys>) {
    let mut said = [false; 3];
    loop {
        let why = match watch_keys(&broker, &store, &keys).await {
            Ok(()) => return,
            Err(why) => why,
        };
        let Some(k) = keys.upgrade() else { return };
        k.distrust();
        drop(k);
        match why {
            Unfollowed::Cannot(why) if !std::mem::replace(&mut said[0], true) => tracing::warn!(
                reason = %why,
                "the shared result cache's keys cannot be followed, so each lookup asks the broker; tried again every 30 s (a worker's broker user needs $JS.API.CONSUMER.CREATE.KV_halyard_cache.> and $JS.FC.KV_halyard_cache.>, deploy/nats/permissions.conf; said once)"
            ),
            Unfollowed::Lost(why) if !std::mem::replace(&mut said[1], true) => tracing::info!(
                reason = %why,
                "the watch of the shared result cache's keys was lost; lookups ask the broker until a new one has caught up, in 30 s (said once)"
            ),
            Unfollowed::TooLarge(entries) if !std::mem::replace(&mut said[2], true) => tracing::info!(
                entries,
                most = WATCH_MAX_KEYS,
                "the shared result cache holds too many entries to follow its keys; each lookup asks the broker (looked at again every 30 s; said once)"
            ),
            Unfollowed::Cannot(why) | Unfollowed::Lost(why) => {
                tracing::debug!(reason = %why, "the shared result cache's keys are not followed")
            }
            Unfollowed::TooLarge(_) => {}
        }
        tokio::time::sleep(LOOK_AGAIN).await;
    }
}

/// How often a watch's progress is checked against the bucket's newest message.
const WATCH_CHECK: Duration = Duration::from_secs(2);
/// How long after the stream's newest message was read a watch that has delivered it is
/// trusted: until the check after next, with a second to spare.
const WATCH_TRUST: Duration = Duration::from_secs(5);
/// Checks in a row that found a watch behind and not moving before it is made again.
const WATCH_STALLED: u32 = 3;

/// The bucket's newest message (0 when it holds none): a watch that has delivered it
/// has delivered every key the bucket held then.
fn newest(state: &stream::State) -> u64 {
    if state.messages == 0 {
        0
    } else {
        state.last_sequence
    }
}

/// One watch of the bucket's keys: the last message of each key, headers only, then each
/// new one. Ok when the last reader is gone.
///
/// A miss is trusted ([`Keys::trusted`]) for [`WATCH_TRUST`] after the newest message of
/// the bucket, as the server's stream information gave it (answered by the stream's
/// leader), was read, once the watch has delivered it: at first the newest when the
/// watch was made, then each [`WATCH_CHECK`] the newest one check earlier. So it rests
/// neither on the consumer's own count of pending messages (counted on the replica it
/// was placed on, which may lag the leader) nor on the client library (which makes an
/// ordered consumer again by itself after a gap, saying nothing, and never hears of flow
/// control stuck), and it runs out when the checks stop. A watch found behind and not
/// moving [`WATCH_STALLED`] times in a row, while the bucket holds a message it has not
/// delivered, is made again.
async fn watch_keys(
    broker: &Broker,
    store: &kv::Store,
    keys: &Weak<Keys>,
) -> Result<(), Unfollowed> {
    let mut goal_at = std::time::Instant::now();
    let info = store
        .stream
        .get_info()
        .await
        .map_err(|e| Unfollowed::Cannot(format!("cannot read the bucket's state: {e}")))?;
    if info.state.messages > WATCH_MAX_KEYS {
        return Err(Unfollowed::TooLarge(info.state.messages));
    }
    let mut goal = newest(&info.state);
    let every_key = format!("{}>", store.prefix);
    let watch = store
        .stream
        .create_consumer(consumer::push::OrderedConfig {
            deliver_subject: broker.client.new_inbox(),
            description: Some("halyard: the shared result cache's keys".into()),
            filter_subject: every_key.clone(),
            headers_only: true,
            replay_policy: consumer::ReplayPolicy::Instant,
            deliver_policy: consumer::DeliverPolicy::LastPerSubject,
            ..Default::default()
        })
        .await
        .map_err(|e| Unfollowed::Cannot(format!("cannot make the watch: {e}")))?;
    let mut messages =
        watch.messages().await.map_err(|e| Unfollowed::Cannot(format!("cannot follow it: {e}")))?;
    // The newest stream sequence delivered, and what it was at the last check.
    let (mut delivered, mut at_check, mut stalled) = (0u64, 0u64, 0u32);
    let mut check =
        tokio::time::interval_at(tokio::time::Instant::now() + WATCH_CHECK, WATCH_CHECK);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    match keys.upgrade() {
        Some(k) if goal == 0 => k.trust_until(goal_at + WATCH_TRUST),
        Some(_) => {}
        None => return Ok(()),
    }
    loop {
        tokio::select! {
            m = messages.next() => {
                let m = match m {
                    Some(Ok(m)) => m,
                    Some(Err(e)) => return Err(Unfollowed::Lost(format!("the watch failed: {e}"))),
                    None => return Err(Unfollowed::Lost("the watch ended".into())),
                };
                let Some(k) = keys.upgrade() else { return Ok(()) };
                // A key that is not a job id was put by no Halyard coordinator: nothing
                // to remember (a lookup never asks for it).
                if let Some(id) = m.subject.strip_prefix(store.prefix.as_str()).and_then(parse_kv_key) {
                    k.seen.insert(&id);
                }
                if let Ok(i) = m.info() {
                    delivered = delivered.max(i.stream_sequence);
                }
                if delivered >= goal {
                    k.trust_until(goal_at + WATCH_TRUST);
                }
            }
            _ = check.tick() => {
                if keys.strong_count() == 0 {
                    return Ok(());
                }
                let asked = std::time::Instant::now();
                // The broker away: no check, and the trust runs out by itself.
                let Ok(info) = store.stream.get_info().await else { continue };
                // Past the newest message there is: not the broker's delivery (anyone who
                // learns the watch's inbox can publish to it).
                if delivered > info.state.last_sequence {
                    return Err(Unfollowed::Lost(format!(
                        "it delivered message {delivered}, past the bucket's newest {}",
                        info.state.last_sequence
                    )));
                }
                if delivered < goal && delivered == at_check {
                    // Behind and not moving: is there anything left to deliver up to the
                    // goal? (Removing the newest message, as a purge of one key does,
                    // leaves the stream's last sequence where it was.)
                    let next = store.stream.get_first_raw_message_by_subject(&every_key, delivered + 1).await;
                    match next {
                        Ok(m) if m.sequence <= goal => {
                            stalled += 1;
                            if stalled >= WATCH_STALLED {
                                return Err(Unfollowed::Lost(format!(
                                    "it stopped at message {delivered}, behind {}", m.sequence
                                )));
                            }
                        }
                        Ok(_) => delivered = goal,
                        Err(e) if e.kind() == stream::RawMessageErrorKind::NoMessageFound => delivered = goal,
                        Err(_) => {}
                    }
                } else {
                    stalled = 0;
                }
                let Some(k) = keys.upgrade() else { return Ok(()) };
                if delivered >= goal {
                    k.trust_until(goal_at + WATCH_TRUST);
                } else {
                    k.distrust();
                }
                at_check = delivered;
                (goal, goal_at) = (newest(&info.state), asked);
                if delivered >= goal {
                    k.trust_until(goal_at + WATCH_TRUST);
                }
            }
        }
    }
}

/// The coordinator's write side.
#[derive(Clone)]
pub struct SharedWriter {
    store: kv::Store,
    refused_warned: Arc<AtomicBool>,
    /// A write was refused for all of [`RETRY_FOR`]: later ones are tried once until
    /// one succeeds (a broker away does not hold up every entry for that long).
    failing: Arc<AtomicBool>,
    /// [`REFRESH_AFTER`], unless a test says otherwise ([`SharedWriter::refresh_after`]).
    refresh_after: Duration,
}

impl SharedWriter {
    /// Create the bucket if it is missing (the coordinator role may) and open it.
    pub async fn open(b: &Broker) -> Result<SharedWriter, CacheError> {
        let replicas = halyard_broker::stream_replicas(b).await;
        let want = config(replicas);
        let info = halyard_broker::retry_js("create the shared result cache", || async {
            if let Some(s) =
                halyard_broker::layout::lookup(b, &want).await.map_err(|e| e.to_string())?
            {
                return Ok(s.cached_info().clone());
            }
            b.js.get_or_create_stream(want.clone())
                .await
                .map(|s| s.cached_info().clone())
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| CacheError::Broker(e.to_string()))?;
        make_room_when_full(b, &info).await;
        let store =
            halyard_broker::retry_js("open the shared result cache", || b.js.get_key_value(BUCKET))
                .await
                .map_err(|e| CacheError::Broker(e.to_string()))?;
        Ok(SharedWriter {
            store,
            refused_warned: Arc::new(AtomicBool::new(false)),
            failing: Arc::new(AtomicBool::new(false)),
            refresh_after: REFRESH_AFTER,
        })
    }

    /// Refresh used entries older than `after` instead of [`REFRESH_AFTER`] (tests).
    pub fn refresh_after(mut self, after: Duration) -> SharedWriter {
        self.refresh_after = after;
        self
    }

    /// Put the accepted `completion` of job `id` (planned by run `run`) unless the bucket
    /// holds an answer for it already. A refusal (the bucket without a leader while a
    /// node is lost, a broker away; a full bucket of an earlier build that could not be
    /// changed, [`SharedWriter::open`]) is tried again for up to
    /// [`RETRY_FOR`], then said once and otherwise ignored: the run goes on.
    ///
    /// An answer the bucket holds already (a machine cache's copy of it answered the job,
    /// or another coordinator put it first) is a use of that entry: refreshed as
    /// [`SharedWriter::refresh`] says.
    ///
    /// True when the bucket holds an answer for the job now (this one, or one put
    /// before), or the entry can never be written (it does not encode); false when the
    /// write may succeed if tried again.
    pub async fn put(&self, run: uuid::Uuid, id: JobId, completion: &Completion) -> bool {
        let completion = crate::as_entry(completion).into_owned();
        let entry = Entry { v: ENTRY_VERSION, job: id, completion, run };
        let bytes = match halyard_proto::encode(&entry) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(job = %id, error = %e, "cannot encode a shared cache entry");
                return true;
            }
        };
        let bytes: bytes::Bytes = bytes.into();
        let create = || self.store.create(kv_key(&id), bytes.clone());
        let retry = backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(250))
            .with_max_delay(Duration::from_secs(4))
            .with_total_delay(Some(RETRY_FOR))
            .without_max_times()
            .with_jitter();
        let failing = self.failing.load(Ordering::Relaxed);
        let created = backon::Retryable::retry(create, retry)
            .when(|e: &kv::CreateError| !failing && e.kind() != kv::CreateErrorKind::AlreadyExists)
            .await;
        match created {
            Ok(_) => {
                self.failing.store(false, Ordering::Relaxed);
                true
            }
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                self.failing.store(false, Ordering::Relaxed);
                self.refresh(id, self.refresh_after).await;
                true
            }
            Err(e) => {
                self.failing.store(true, Ordering::Relaxed);
                if !self.refused_warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(job = %id, error = %e, "the shared result cache refused a write (the broker is away, or the bucket has no leader); this result is not shared, and later ones are tried once each until one lands (said once); the run goes on");
                }
                false
            }
        }
    }

    /// A run used the entry of job `id` (a worker answered from it): write it again,
    /// unchanged, if it was written more than `after` ago ([`REFRESH_AFTER`]), so that a
    /// full bucket drops entries nobody uses first and an entry in use does not expire.
    /// What is written is the entry as read from the bucket, only if it checks out, and
    /// only over the revision read (a compare-and-set): never a worker's bytes, and never
    /// over another coordinator's write. Best effort: an entry gone, another writer first,
    /// or a broker away leave it as it is. True when it was written again.
    pub async fn refresh(&self, id: JobId, after: Duration) -> bool {
        let key = kv_key(&id);
        let entry = match self.store.entry(key.as_str()).await {
            Ok(Some(e)) if e.operation == kv::Operation::Put => e,
            Ok(_) => return false,
            Err(e) => {
                tracing::debug!(job = %id, error = %e, "cannot read a shared cache entry to refresh it");
                return false;
            }
        };
        let age = seconds_since(entry.created.unix_timestamp());
        if age < after.as_secs() || check(&id, &entry.value).is_err() {
            return false;
        }
        match self.store.update(key.as_str(), entry.value, entry.revision).await {
            Ok(_) => true,
            Err(e) => {
                tracing::debug!(job = %id, error = %e, "a shared cache entry was not refreshed");
                false
            }
        }
    }
}

/// The bucket's stream `info` as the coordinator found or made it: one made by an earlier
/// build refuses new entries when full (`discard = new`), so it is changed to drop the
/// entries written longest ago instead ([`set_discard_old`]); a broker user without the
/// right to change it (permissions of an earlier build) leaves it so, said with the fix.
/// A bucket at its limit is said too: from now on, old entries make way for new ones.
async fn make_room_when_full(b: &Broker, info: &stream::Info) {
    let name = &info.config.name;
    if info.config.discard != stream::DiscardPolicy::Old {
        match set_discard_old(b, name).await {
            Ok(()) => tracing::info!(
                "the shared result cache's bucket, made by an earlier build, refused new entries when full; it now drops the entries written longest ago instead"
            ),
            Err(e) => tracing::warn!(
                error = %e,
                "the shared result cache's bucket refuses new entries when full, and it could not be changed: if this coordinator's broker user lacks $JS.API.STREAM.UPDATE.{name} (a permission refused reads as a timeout), give it that right (deploy/nats/permissions.conf), or run `nats stream edit {name} --discard old`"
            ),
        }
    }
    let limit = info.config.max_bytes;
    if limit > 0 && info.state.bytes >= limit as u64 / 10 * 9 {
        tracing::info!(
            bytes = info.state.bytes,
            limit,
            "the shared result cache is full: the entries written (or used) longest ago make way for new ones"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The watch reads job ids back from keys: `parse_kv_key` is `kv_key`'s inverse, and
    /// names no job for a key of another shape (a changed key format would otherwise
    /// leave every lookup a miss).
    #[test]
    fn a_key_names_its_job_back() {
        for b in [0u8, 7, 0xa5, 0xff] {
            let id = JobId([b; 16]);
            assert_eq!(parse_kv_key(&kv_key(&id)), Some(id));
        }
        let id = JobId(*blake3::hash(b"a job").as_bytes().first_chunk().unwrap());
        assert_eq!(parse_kv_key(&kv_key(&id)), Some(id));
        for other in ["", "job", "0123", &format!("{}x", kv_key(&id)), &kv_key(&id)[1..]] {
            assert_eq!(parse_kv_key(other), None, "{other:?}");
        }
    }
}

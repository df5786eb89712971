//! # halyard-broker: Halyard's edge to NATS JetStream
//!
//! ## Layout
//! - [`connect`]: one place that turns a URL (or a comma-separated list of a cluster's
//!   URLs) and [`auth::NatsAuth`] credentials/TLS into a client, mapping failures to
//!   [`BrokerError`] with the URL named.
//! - [`layout`]: every stream and bucket; only [`init`] (the coordinator, `halyard broker
//!   init`) creates them, everybody else opens and checks them.
//! - [`pool_consumer`], [`results_consumer`]: the consumers, made by the coordinator.
//! - [`embedded`]: a private `nats-server` for `halyard run` without a broker.
//! - [`kv`]: KV buckets in a form nats-server 2.9 accepts.
//!
//! ## JetStream layout
//! - `HALYARD_JOBS` (work-queue retention, file storage): subjects `halyard.jobs.<pool>`.
//!   One durable pull consumer per pool (`pool-<pool>`), shared by every worker of the
//!   pool: explicit acks, `ack_wait`, and no delivery limit on the server's side: the
//!   workers keep each job's delivery budget (`max_deliver`) themselves, because only
//!   they can tell a delivery that failed by the job's fault from one an endpoint outage,
//!   a 429 cool-down or a shutdown ended (see `halyard_worker::budget`). A work queue
//!   removes a job once it is acked, so the stream holds exactly the jobs not yet finished.
//! - `HALYARD_RESULTS` (work-queue retention): subjects `halyard.results.<run>.<pool>`,
//!   one durable consumer per run (`results-<run>`, filter `halyard.results.<run>.>`) read
//!   by that run's coordinator, which takes a result only from the subject of its job's
//!   pool.
//! - Both streams de-duplicate on `Nats-Msg-Id` within `duplicate_window`. Job messages
//!   carry `<run>:<job id>` so that two runs sharing a job each get it executed (the
//!   second one from the worker's checkpoint); results messages add a secret of the
//!   publishing process, so that nobody can have an honest result dropped as a duplicate
//!   by publishing first under its id (`halyard_worker::outbox`).
//!
//! async-nats is built without its `server_2_10+` features so that the requests it sends
//! are understood by nats-server 2.9 (Debian's package) as well as newer servers.

pub mod auth;
pub mod batches;
pub mod embedded;
pub mod janitor;
pub mod kv;
pub mod layout;
pub mod objects;
pub mod permissions;
pub mod status;

use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use halyard_proto::subjects;

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("cannot connect to NATS at {url}: {reason}")]
    Connect { url: String, reason: String },
    #[error("JetStream {what}: {reason}")]
    JetStream { what: String, reason: String },
    #[error("embedded nats-server: {0}")]
    Embedded(String),
    #[error("NATS connection settings: {0}")]
    Config(String),
}

impl BrokerError {
    pub fn js(what: impl Into<String>, reason: impl std::fmt::Display) -> Self {
        BrokerError::JetStream { what: what.into(), reason: reason.to_string() }
    }
}

/// How to reach the broker.
#[derive(Clone, Debug)]
pub struct BrokerConfig {
    pub url: String,
    /// Client name shown in the server's connection list.
    pub name: String,
    /// Stream replicas; `None`: 1 on a lone server, else 3 when JetStream can place 3
    /// (see [`stream_replicas`]).
    pub replicas: Option<usize>,
    /// Credentials and TLS.
    pub auth: auth::NatsAuth,
    /// JetStream de-duplication window for job and result messages.
    pub duplicate_window: Duration,
    /// How long the first connection waits for a broker that does not answer yet.
    pub connect_wait: Duration,
}

impl BrokerConfig {
    pub fn new(url: impl Into<String>, name: impl Into<String>) -> Self {
        BrokerConfig {
            url: url.into(),
            name: name.into(),
            replicas: None,
            auth: auth::NatsAuth::default(),
            duplicate_window: Duration::from_secs(20 * 60),
            connect_wait: Duration::from_secs(30),
        }
    }

    pub fn with_auth(mut self, auth: auth::NatsAuth) -> Self {
        self.auth = auth;
        self
    }
}

/// Connected client plus its JetStream context.
#[derive(Clone)]
pub struct Broker {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub config: BrokerConfig,
    /// Replicas JetStream can place, asked once per connection ([`stream_replicas`]).
    replicas: std::sync::Arc<tokio::sync::OnceCell<usize>>,
}

/// Bytes of a message's headers and protocol line kept free under `max_payload`.
pub const HEADER_ROOM: usize = 4 << 10;

impl Broker {
    /// The largest payload to publish: the server's `max_payload` (1 MiB when it has not
    /// said) less [`HEADER_ROOM`]. Read at every use: a reconnection may reach a server
    /// configured otherwise.
    pub fn payload_limit(&self) -> usize {
        let max = match self.client.server_info().max_payload {
            0 => 1 << 20,
            m => m,
        };
        max.saturating_sub(HEADER_ROOM).max(HEADER_ROOM)
    }

    /// Whether the connection is up now (a health check): else the state, for people.
    pub fn connected(&self) -> Result<(), String> {
        match self.client.connection_state() {
            async_nats::connection::State::Connected => Ok(()),
            other => {
                Err(format!("broker {}: {other}", halyard_proto::redact::url(&self.config.url)))
            }
        }
    }
}

/// Connect, waiting up to `connect_wait` for a broker that does not answer yet (then
/// failing with the URL named), and failing at once with a clear message if the server
/// rejects the credentials or the TLS setup.
/// After the first connection, the client reconnects on its own for as long as it lives
/// (to any node of a cluster: the server tells clients its peers' addresses).
pub async fn connect(config: &BrokerConfig) -> Result<Broker, BrokerError> {
    let urls: Vec<&str> = config.url.split(',').map(str::trim).filter(|u| !u.is_empty()).collect();
    config.auth.check_transport(&urls)?;
    // For messages: the URL without credentials.
    let shown = halyard_proto::redact::url(&config.url);
    let deadline = tokio::time::Instant::now() + config.connect_wait;
    let mut pause = Duration::from_millis(100);
    let client = loop {
        let opts = async_nats::ConnectOptions::new()
            .name(&config.name)
            .connection_timeout(Duration::from_secs(5))
            .max_reconnects(None);
        let opts = config.auth.apply(opts).await?;
        match opts.connect(urls.as_slice()).await {
            Ok(c) => break c,
            // Nobody listening (a broker restarting, a worker started first): wait for it
            // up to `connect_wait`. Credentials and TLS are refused at once.
            Err(e) if retryable(&e) && tokio::time::Instant::now() + pause < deadline => {
                tracing::warn!(url = %shown, error = %e, "broker not reachable yet; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            Err(e) => {
                return Err(BrokerError::Connect {
                    url: shown,
                    reason: halyard_proto::redact::url(&connect_reason(&e, &config.auth)),
                });
            }
        }
    };
    let js = jetstream::new(client.clone());
    Ok(Broker { client, js, config: config.clone(), replicas: Default::default() })
}

/// Errors worth waiting out: nothing answers yet.
fn retryable(e: &async_nats::ConnectError) -> bool {
    use async_nats::ConnectErrorKind as K;
    matches!(e.kind(), K::Io | K::TimedOut | K::Dns) && !is_tls_failure(&e.to_string())
}

/// A connect error in words a user can act on.
fn connect_reason(e: &async_nats::ConnectError, auth: &auth::NatsAuth) -> String {
    use async_nats::ConnectErrorKind as K;
    match e.kind() {
        K::AuthorizationViolation => format!(
            "the server rejected the credentials ({}): authorization violation; check --nats-user/HALYARD_NATS_PASSWORD, \
             --nats-token, --nats-nkey or --nats-creds",
            auth.describe()
        ),
        _ if matches!(e.kind(), K::Tls) || is_tls_failure(&e.to_string()) => {
            format!("TLS failed: {e}; check --nats-ca, --nats-cert/--nats-key and the server's certificate")
        }
        _ => e.to_string(),
    }
}

/// async-nats reports some handshake failures as IO errors; rustls names them.
fn is_tls_failure(msg: &str) -> bool {
    let m = msg.to_ascii_lowercase();
    ["certificate", "tls", "handshake", "alert"].iter().any(|w| m.contains(w))
}

/// Nodes of the cluster the client is connected to, from the server's INFO (its own
/// address and its peers' client URLs); 1 for a lone server. A cluster that does not
/// advertise its nodes (`no_advertise`, the NATS Helm chart's default) shows 1 here:
/// [`stream_replicas`] asks JetStream instead.
pub fn cluster_size(client: &async_nats::Client) -> usize {
    let info = client.server_info();
    if info.cluster.is_none() {
        return 1;
    }
    let mut urls: Vec<String> = info.connect_urls.clone();
    urls.push(format!("{}:{}", info.host, info.port));
    urls.sort();
    urls.dedup();
    urls.len().max(1)
}

/// Replicas for Halyard's streams: the configured number (`--nats-replicas`), else 1 on
/// a lone server, else what JetStream itself says it can place: 3 when it accepts a
/// 3-replica probe stream ([`PROBE_STREAM`], in memory, kept), else 1, said loudly.
/// The probe runs once per connection; clients never see how many nodes a cluster has
/// when it does not advertise them (`no_advertise`, the NATS Helm chart's default), so
/// the advertised client URLs decide nothing (issue 34).
pub async fn stream_replicas(b: &Broker) -> usize {
    if let Some(r) = b.config.replicas {
        return r;
    }
    if b.client.server_info().cluster.is_none() {
        return 1;
    }
    *b.replicas.get_or_init(|| probe_replicas(b)).await
}

/// The stream of [`stream_replicas`]' probe: a 3-replica memory stream that holds at
/// most one message and is never written to. It is created once and kept: one name for
/// every process (the roles' permissions name it; a NATS wildcard matches whole subject
/// tokens, never a prefix of a stream name), and creating a stream that exists with the
/// same configuration succeeds, so processes starting together get the same answer.
/// Deleting it after each probe made concurrent probes time out (seen in
/// `tests/src/cluster.rs`).
pub const PROBE_STREAM: &str = "HALYARD_REPLICA_PROBE";

/// How long the probe waits for JetStream to place 3 replicas (a cluster still forming,
/// a node restarting) before settling on 1.
const PROBE_PATIENCE: Duration = Duration::from_secs(20);

async fn probe_replicas(b: &Broker) -> usize {
    use async_nats::jetstream::context::CreateStreamErrorKind as K;
    use async_nats::jetstream::ErrorCode;
    // "replicas > 1 not supported in non-clustered mode"
    const REPLICAS_NOT_SUPPORTED: ErrorCode = ErrorCode(10074);
    let name = PROBE_STREAM;
    let cfg = stream::Config {
        name: name.to_string(),
        subjects: vec!["_halyard.replica_probe".to_string()],
        storage: stream::StorageType::Memory,
        num_replicas: 3,
        max_messages: 1,
        ..Default::default()
    };
    let deadline = tokio::time::Instant::now() + PROBE_PATIENCE;
    loop {
        let e = match b.js.create_stream(cfg.clone()).await {
            Ok(_) => {
                tracing::debug!("JetStream placed 3 replicas: Halyard's streams get 3");
                return 3;
            }
            Err(e) => e,
        };
        let code = match e.kind() {
            K::JetStream(js) => Some(js.error_code()),
            _ => None,
        };
        let cannot_place = code.is_some_and(|c| {
            [ErrorCode::CLUSTER_NO_PEERS, ErrorCode::INSUFFICIENT_RESOURCES, REPLICAS_NOT_SUPPORTED]
                .contains(&c)
        });
        // Another process's probe of the same name is being created at this moment
        // (JetStream then answers one of two creates at once with "name in use", or not
        // at all): ask again within the patience rather than guess. A request the role
        // may not send times out too; it is asked again until the patience ends.
        let busy = code == Some(ErrorCode::STREAM_NAME_EXIST) || matches!(e.kind(), K::TimedOut);
        if busy && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        if !cannot_place {
            // Denied, timed out, JetStream unavailable: the probe cannot tell; the
            // advertised nodes decide (3 or more advertised: 3).
            let advertised = cluster_size(&b.client);
            let n = if advertised >= 3 { 3 } else { 1 };
            tracing::warn!(
                error = %e,
                replicas = n,
                "could not ask JetStream how many replicas it can place; going by the \
                 {advertised} node(s) the server advertises: Halyard's streams and buckets \
                 get {n} (--nats-replicas / HALYARD_NATS_REPLICAS decides)"
            );
            return n;
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(
                error = %e,
                "the broker is in a cluster, but JetStream cannot place 3 replicas: \
                 Halyard's streams and buckets get 1 and a node's loss loses them; give \
                 --nats-replicas (HALYARD_NATS_REPLICAS) on every process to decide"
            );
            return 1;
        }
        tracing::info!(error = %e, "JetStream cannot place 3 replicas yet; asking again");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Say loudly when an existing stream (or bucket) has fewer replicas than Halyard would
/// give it now: it was made earlier, by another configuration, and a node's loss can lose
/// it. JetStream keeps a stream's replicas as created; `nats stream edit` changes them.
pub async fn check_replicas(b: &Broker, name: &str, held: usize) {
    let wanted = stream_replicas(b).await;
    if held < wanted {
        tracing::warn!(
            stream = name,
            replicas = held,
            wanted,
            "stream {name} has {held} replica(s), fewer than the {wanted} configured: a \
             broker node's loss can lose it; raise them (`nats stream edit {name} \
             --replicas {wanted}`)"
        );
    }
}

pub use layout::{init, RESULTS_MAX_BYTES};

/// Refuse a stream (or a bucket's) that exists with a shape that would leak, lose or
/// stall what Halyard puts in it. `want` is the configuration Halyard creates it with;
/// anyone who may create streams on a shared broker could create Halyard's first (issue
/// 33), and a stream's settings are the broker's to change (issue 49). Refused:
/// - a republish (every message copied to another subject, which others may read), a
///   mirror or sources (messages that are not Halyard's), other subjects than Halyard's,
///   another retention, a sealed stream;
/// - a subject transform (nats-server 2.10+ rewrites the subject a message is stored
///   under: a worker's results could be stored as another pool's), read from the raw
///   configuration by [`check_raw_shape`] (async-nats is built without the 2.10 fields);
/// - limits that drop what Halyard has not taken: an age limit where Halyard sets none
///   (unfinished jobs and results expire), none where Halyard sets one (a bucket's keys,
///   a dead worker's heartbeat or a forged quota membership, never expire), a limit per
///   subject or on the number of messages where Halyard sets none, discard `old` where
///   Halyard's is `new` (the oldest messages dropped when full; `new` where Halyard's is
///   `old`, the result cache's bucket, only stalls, and is kept);
/// - `no_ack` (a publisher cannot know its message was stored), deletes or purges denied
///   where Halyard deletes or purges (or allowed where it denies them), rollups not
///   allowed where Halyard rolls up, a limit on consumers where Halyard sets none, and a
///   shorter de-duplication window than Halyard's (a retried publish counted twice).
///
/// Limits that only make a full broker come sooner are warned about
/// ([`shape_warnings`]): a smaller `max_bytes` or `max_message_size`, and a placement.
pub fn check_shape(have: &stream::Config, want: &stream::Config) -> Result<(), BrokerError> {
    let mut wrong = Vec::new();
    if let Some(r) = &have.republish {
        wrong.push(format!(
            "it republishes {} to {} (whoever may subscribe there reads every message)",
            r.source, r.destination
        ));
    }
    if have.mirror.is_some() {
        wrong.push("it mirrors another stream".to_string());
    }
    if have.sources.as_ref().is_some_and(|s| !s.is_empty()) {
        wrong.push("it takes messages from other streams (sources)".to_string());
    }
    let (mut a, mut b) = (have.subjects.clone(), want.subjects.clone());
    a.sort();
    b.sort();
    if a != b {
        wrong.push(format!("its subjects are {a:?}, Halyard's are {b:?}"));
    }
    if have.retention != want.retention {
        wrong.push(format!(
            "its retention is {:?}, Halyard's is {:?}",
            have.retention, want.retention
        ));
    }
    if have.sealed {
        wrong.push("it is sealed".to_string());
    }
    if want.max_age.is_zero() && !have.max_age.is_zero() {
        wrong.push(format!(
            "its messages expire after {:?} (Halyard's never do: what is not taken yet is lost)",
            have.max_age
        ));
    }
    if !want.max_age.is_zero() && have.max_age.is_zero() {
        wrong.push(format!(
            "its keys never expire (Halyard's expire after {:?}: a dead worker's or a forged \
             record would stay)",
            want.max_age
        ));
    }
    if want.max_messages_per_subject <= 0 && have.max_messages_per_subject > 0 {
        wrong.push(format!(
            "it keeps {} message(s) per subject (Halyard's keeps all: the others are dropped)",
            have.max_messages_per_subject
        ));
    }
    if want.max_messages <= 0 && have.max_messages > 0 {
        wrong.push(format!(
            "it holds {} messages at most (Halyard sets no such limit)",
            have.max_messages
        ));
    }
    // A bounded stream that refuses new messages when full where Halyard's drops the
    // oldest (the shared result cache's bucket as an earlier build made it) loses
    // nothing: it is kept, and the role that may brings it to Halyard's policy
    // (`halyard_cache::shared::SharedWriter::open`).
    let refuses_where_halyard_drops = want.max_bytes > 0
        && have.discard == stream::DiscardPolicy::New
        && want.discard == stream::DiscardPolicy::Old;
    if have.discard != want.discard && !refuses_where_halyard_drops {
        wrong.push(format!(
            "it discards {:?} messages when full (Halyard's discard {:?}: a full stream must \
             refuse new messages, never drop stored ones)",
            have.discard, want.discard
        ));
    }
    if have.no_ack && !want.no_ack {
        wrong.push("it does not acknowledge publishes (no_ack)".to_string());
    }
    if have.deny_purge != want.deny_purge {
        wrong.push(format!(
            "its deny_purge is {}, Halyard's is {}",
            have.deny_purge, want.deny_purge
        ));
    }
    if have.deny_delete != want.deny_delete {
        wrong.push(format!(
            "its deny_delete is {}, Halyard's is {}",
            have.deny_delete, want.deny_delete
        ));
    }
    if want.allow_rollup && !have.allow_rollup {
        wrong.push("it refuses rollups (Halyard's buckets roll up)".to_string());
    }
    if want.max_consumers <= 0 && have.max_consumers > 0 {
        wrong.push(format!(
            "it takes {} consumer(s) at most (Halyard makes one per pool and run)",
            have.max_consumers
        ));
    }
    if !want.duplicate_window.is_zero() && have.duplicate_window < want.duplicate_window {
        wrong.push(format!(
            "its de-duplication window is {:?}, shorter than Halyard's {:?} (a publish \
             retried after it is stored twice: a job run and paid twice)",
            have.duplicate_window, want.duplicate_window
        ));
    }
    refuse(&want.name, wrong)
}

fn refuse(name: &str, wrong: Vec<String>) -> Result<(), BrokerError> {
    if wrong.is_empty() {
        return Ok(());
    }
    Err(BrokerError::Config(format!(
        "stream {name} exists with a configuration Halyard will not use: {}. Someone created \
         it before Halyard did, or changed it; remove it (nats stream rm {name}) or set it \
         right, then start again",
        wrong.join("; ")
    )))
}

/// [`check_shape`]'s check of what async-nats does not parse (it is built for nats-server
/// 2.9): the stream's configuration as the server sent it (`config` of a
/// `$JS.API.STREAM.INFO` answer). A subject transform (2.10+, `subject_transform`), or
/// one on a source or mirror, is refused.
pub fn check_raw_shape(raw: &serde_json::Value, want: &stream::Config) -> Result<(), BrokerError> {
    let mut wrong = Vec::new();
    let set = |v: Option<&serde_json::Value>| v.is_some_and(|v| !v.is_null());
    if set(raw.get("subject_transform")) {
        wrong.push(format!(
            "it rewrites the subjects of what it stores (subject_transform {}): a message \
             would be stored under another pool's or run's subject",
            raw["subject_transform"]
        ));
    }
    if set(raw.get("subject_transforms")) {
        wrong.push("it rewrites the subjects of what it stores (subject_transforms)".to_string());
    }
    refuse(&want.name, wrong)
}

/// Settings of an existing stream that are not Halyard's but lose nothing, for a
/// warning: a smaller `max_bytes` (a flood fills it sooner), a smaller
/// `max_message_size`, a placement Halyard did not ask for.
pub fn shape_warnings(have: &stream::Config, want: &stream::Config) -> Vec<String> {
    let name = &want.name;
    let mut out = Vec::new();
    if want.max_bytes > 0 && !(1..=want.max_bytes).contains(&have.max_bytes) {
        out.push(format!(
            "stream {name} holds up to {} bytes (made by an earlier build), not the {} Halyard \
             sets: a flood of messages fills the broker's disk further (nats stream edit \
             {name} --max-bytes {})",
            have.max_bytes, want.max_bytes, want.max_bytes
        ));
    }
    if want.max_bytes > 0 && (1..want.max_bytes).contains(&have.max_bytes) {
        out.push(format!(
            "stream {name} holds up to {} bytes, less than the {} Halyard sets: it is full \
             sooner, and a full stream refuses what is published (nats stream edit {name} \
             --max-bytes {})",
            have.max_bytes, want.max_bytes, want.max_bytes
        ));
    }
    if want.max_message_size > 0 && (1..want.max_message_size).contains(&have.max_message_size) {
        out.push(format!(
            "stream {name} takes messages of up to {} bytes, less than the {} Halyard sets: \
             larger ones are refused",
            have.max_message_size, want.max_message_size
        ));
    }
    if let Some(p) = have.placement.as_ref().filter(|p| p.cluster.is_some() || !p.tags.is_empty()) {
        out.push(format!(
            "stream {name} is placed (cluster {:?}, tags {:?}); Halyard asks for no placement",
            p.cluster, p.tags
        ));
    }
    out
}

/// How long stream and consumer setup keeps trying while JetStream does not answer (a
/// cluster electing a leader, a broker restarting).
const SETUP_PATIENCE: Duration = Duration::from_secs(60);

/// Run a JetStream setup request, retrying while it times out or finds no JetStream
/// (yet); other errors (a stream configured differently, say) fail at once. For a
/// setup of several requests, run them all in `f`: a broker restart between them is
/// then ridden out as a whole.
pub async fn retry_js<T, E, F, Fut>(what: &str, mut f: F) -> Result<T, BrokerError>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + SETUP_PATIENCE;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) => {
                let msg = e.to_string();
                let transient = [
                    "timed out",
                    "no responders",
                    // async-nats's words for "no responders" to a JetStream request: a
                    // server without JetStream (yet).
                    "requested jetstream resource does not exist",
                    "unavailable",
                    "not available",
                    "leader",
                    "insufficient resources",
                    // Another process created the same stream at the same moment (two
                    // workers starting together): the next try finds it. A foreign stream
                    // that owns the subjects for good still fails, after the patience.
                    "subjects overlap",
                    "already in use",
                ]
                .iter()
                .any(|w| msg.to_ascii_lowercase().contains(w));
                if !transient || tokio::time::Instant::now() >= deadline {
                    return Err(BrokerError::js(what, e));
                }
                tracing::warn!(what, error = %msg, "JetStream not ready; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// The error of using a bucket whose stream was just found: "not found" means the
/// stream is not known (yet, or any more) to the server that answered, so it is marked
/// transient for [`retry_js`].
pub fn vanished(msg: String) -> String {
    if msg.to_ascii_lowercase().contains("not found") {
        format!("{msg} (gone since it was created: unavailable)")
    } else {
        msg
    }
}

/// Delivery settings of a pool's consumer.
#[derive(Clone, Copy, Debug)]
pub struct Delivery {
    /// Time a worker has to ack (or send progress) before the job is redelivered.
    pub ack_wait: Duration,
    /// Deliveries that fail by the job's fault before it is given up as a dead letter
    /// (enforced by the workers; see the crate docs).
    pub max_deliver: i64,
}

impl Default for Delivery {
    fn default() -> Self {
        Delivery { ack_wait: Duration::from_secs(30), max_deliver: 5 }
    }
}

/// The pool consumer's `max_deliver` on the server: unlimited. A finite limit there would
/// count the deliveries that endpoint outages, cool-downs and shutdowns ended, which the
/// workers excuse; the workers dead-letter a job once its own failures spend its budget.
pub const BROKER_MAX_DELIVER: i64 = -1;

pub type PullConsumer = consumer::Consumer<consumer::pull::Config>;

/// How long a pull request's next answer may take before the request is given up. A
/// no-wait fetch is answered at once (messages, or "no messages"); a waiting pull within
/// its expiry. But a request lost in a broker restart (sent as the server went down) is
/// never answered, and async-nats waits for a no-wait fetch's answer forever: every pull
/// loop bounds each wait with this instead (seen as a whole run hanging in the chaos test).
pub const PULL_ANSWER_TIMEOUT: Duration = Duration::from_secs(6);

/// The next message of a pull request, or `None` when it ends, fails, or stays silent
/// for [`PULL_ANSWER_TIMEOUT`] (then dropping the batch abandons the request; anything
/// the server still delivers to it is redelivered after `ack_wait`).
pub async fn next_pulled(batch: &mut consumer::pull::Batch) -> Option<jetstream::Message> {
    use futures::StreamExt;
    match tokio::time::timeout(PULL_ANSWER_TIMEOUT, batch.next()).await {
        Ok(Some(Ok(m))) => Some(m),
        Ok(Some(Err(e))) => {
            tracing::debug!(error = %e, "pull ended");
            None
        }
        Ok(None) => None,
        Err(_) => {
            tracing::warn!(
                wait_s = PULL_ANSWER_TIMEOUT.as_secs(),
                "a pull request got no answer (lost in a broker restart?); asking again"
            );
            None
        }
    }
}

/// The durable pull consumer shared by all workers of `pool`, with `d.ack_wait` as its
/// ack wait and no delivery limit ([`BROKER_MAX_DELIVER`]).
///
/// The coordinator's call: it makes every pool's consumer when it plans the run, before
/// any worker may take a job. Workers only bind to it ([`bind_pool_consumer`]); the
/// worker role holds no right to create or retune consumers.
///
/// An existing consumer with another ack wait or delivery limit (an earlier sweep with
/// other `[run]` settings, a consumer made by an older Halyard) is updated to these,
/// with a warning naming both: a worker's in-progress acks are paced by its ack wait,
/// and a server waiting less than that would redeliver jobs still being called. If the
/// server keeps its settings, the coordinator refuses to start, naming both values.
pub async fn pool_consumer(
    b: &Broker,
    pool: &str,
    d: Delivery,
) -> Result<PullConsumer, BrokerError> {
    let stream =
        retry_js("get stream HALYARD_JOBS", || b.js.get_stream(subjects::JOBS_STREAM)).await?;
    let name = subjects::pool_consumer(pool);
    let cfg = consumer::pull::Config {
        durable_name: Some(name.clone()),
        filter_subject: subjects::job_subject(pool),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: d.ack_wait,
        max_deliver: BROKER_MAX_DELIVER,
        max_ack_pending: 10_000,
        ..Default::default()
    };
    let what = format!("consumer {name} for pool {pool:?}");
    let mut c = retry_js(&what, || stream.get_or_create_consumer(&name, cfg.clone())).await?;
    let held = settings(&c.cached_info().config);
    let wanted = (d.ack_wait, BROKER_MAX_DELIVER);
    if held == wanted {
        return Ok(c);
    }
    tracing::warn!(
        consumer = %name,
        pool,
        ack_wait_held = ?held.0,
        max_deliver_held = held.1,
        ack_wait_wanted = ?wanted.0,
        max_deliver_wanted = wanted.1,
        "the pool's consumer has other delivery settings; updating it (every worker of the pool should run with the same [run] ack_wait_s)"
    );
    // A create request for an existing durable name updates its settings.
    c = retry_js(&format!("update {what}"), || stream.create_consumer(cfg.clone())).await?;
    let now = settings(&c.cached_info().config);
    if now != wanted {
        return Err(BrokerError::Config(format!(
            "{what} has ack_wait {:?} and max_deliver {}, this worker needs ack_wait {:?} and \
             max_deliver {}, and the server did not update it; delete the consumer or run with \
             the same [run] ack_wait_s",
            now.0, now.1, wanted.0, wanted.1
        )));
    }
    Ok(c)
}

/// A worker's handle on `pool`'s consumer, which only the coordinator makes
/// ([`pool_consumer`]); `None` while it does not exist (no coordinator has planned the
/// pool yet: the worker waits for it). A consumer of that name is used only as the
/// coordinator makes it: filtered to the pool's job subject, with explicit acks and no
/// server-side delivery limit; anything else is a configuration error naming what
/// differs. Its ack wait is the coordinator's (its sweep's `[run] ack_wait_s`): a worker
/// paces its in-progress acks by the shorter of its own and the consumer's
/// ([`consumer_ack_wait`]).
pub async fn bind_pool_consumer(
    b: &Broker,
    pool: &str,
) -> Result<Option<PullConsumer>, BrokerError> {
    use async_nats::jetstream::context::{ConsumerInfoError, ConsumerInfoErrorKind};
    let stream =
        retry_js("get stream HALYARD_JOBS", || b.js.get_stream(subjects::JOBS_STREAM)).await?;
    let name = subjects::pool_consumer(pool);
    let what = format!("consumer {name} for pool {pool:?}");
    let found = retry_js(&what, || async {
        match stream.get_consumer::<consumer::pull::Config>(&name).await {
            Ok(c) => Ok(Some(c)),
            Err(e) => match e.downcast_ref::<ConsumerInfoError>().map(|e| e.kind()) {
                Some(ConsumerInfoErrorKind::NotFound) => Ok(None),
                _ => Err(e),
            },
        }
    })
    .await?;
    let Some(c) = found else { return Ok(None) };
    let cfg = &c.cached_info().config;
    let mut wrong = Vec::new();
    if cfg.filter_subject != subjects::job_subject(pool) {
        wrong.push(format!(
            "it takes {:?} instead of {:?}",
            cfg.filter_subject,
            subjects::job_subject(pool)
        ));
    }
    if cfg.ack_policy != consumer::AckPolicy::Explicit {
        wrong.push(format!("its acks are {:?}, not explicit", cfg.ack_policy));
    }
    let held = settings(cfg).1;
    if held != BROKER_MAX_DELIVER {
        wrong.push(format!(
            "it stops delivering a job after {held} deliveries (workers keep the delivery \
             budget; a coordinator of this build updates it when it plans the pool)"
        ));
    }
    if wrong.is_empty() {
        return Ok(Some(c));
    }
    Err(BrokerError::Config(format!(
        "{what} exists with a configuration this worker will not use: {}; only the \
         coordinator makes and updates pool consumers",
        wrong.join("; ")
    )))
}

/// The ack wait of a consumer bound with [`bind_pool_consumer`] (as the server had it
/// then).
pub fn consumer_ack_wait(c: &PullConsumer) -> Duration {
    c.cached_info().config.ack_wait
}

/// A consumer's ack wait and delivery limit, with every "unlimited" spelled -1.
fn settings(c: &consumer::Config) -> (Duration, i64) {
    (c.ack_wait, if c.max_deliver <= 0 { -1 } else { c.max_deliver })
}

/// The durable consumer of one run's results.
pub async fn results_consumer(b: &Broker, run: uuid::Uuid) -> Result<PullConsumer, BrokerError> {
    let stream =
        retry_js("get stream HALYARD_RESULTS", || b.js.get_stream(subjects::RESULTS_STREAM))
            .await?;
    // A run begun by a build that took results on one subject per run has a consumer of
    // the old name and filter; results its workers published there are not taken (their
    // jobs are published again by the stall check and answered from the workers'
    // checkpoints). The coordinator role may not delete consumers: say so.
    let old = subjects::old_run_consumer(run);
    if stream.consumer_info(&old).await.is_ok() {
        tracing::warn!(
            consumer = %old,
            "this run was begun by an earlier build (one results subject per run): results \
             published by its workers are not taken; delete that consumer once the run is \
             complete (nats consumer rm {} {old})",
            subjects::RESULTS_STREAM
        );
    }
    let name = subjects::run_consumer(run);
    let cfg = consumer::pull::Config {
        durable_name: Some(name.clone()),
        filter_subject: subjects::run_results_filter(run),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: Duration::from_secs(60),
        max_ack_pending: 20_000,
        ..Default::default()
    };
    let c =
        retry_js(&format!("consumer {name}"), || stream.get_or_create_consumer(&name, cfg.clone()))
            .await?;
    let wrong = results_consumer_faults(&c.cached_info().config, run);
    if wrong.is_empty() {
        return Ok(c);
    }
    Err(BrokerError::Config(format!(
        "consumer {name} of stream {} exists with a configuration Halyard will not use: {}. \
         Someone made it before this coordinator did, or changed it; remove it (nats consumer \
         rm {} {name}) while no coordinator runs, then start again",
        subjects::RESULTS_STREAM,
        wrong.join("; "),
        subjects::RESULTS_STREAM
    )))
}

/// What makes an existing results consumer of run `run` unusable: results it would not
/// deliver, or deliver without their bytes, or drop before they are acked. (Its ack wait
/// and ack-pending limit are the coordinator's to choose and not checked.)
pub fn results_consumer_faults(c: &consumer::Config, run: uuid::Uuid) -> Vec<String> {
    let mut wrong = Vec::new();
    let filter = subjects::run_results_filter(run);
    if c.filter_subject != filter {
        wrong.push(format!("it takes {:?} instead of {filter:?}", c.filter_subject));
    }
    if c.ack_policy != consumer::AckPolicy::Explicit {
        wrong.push(format!("its acks are {:?}, not explicit", c.ack_policy));
    }
    if c.deliver_policy != consumer::DeliverPolicy::All {
        wrong.push(format!(
            "it delivers {:?}, not all (results stored before it would never be taken)",
            c.deliver_policy
        ));
    }
    if c.max_deliver > 0 {
        wrong.push(format!(
            "it stops delivering a result after {} deliveries (one not acked in time is lost)",
            c.max_deliver
        ));
    }
    if c.headers_only {
        wrong.push("it delivers headers only (results without their bytes)".to_string());
    }
    if c.replay_policy != consumer::ReplayPolicy::Instant {
        wrong.push(format!("its replay is {:?}, not instant", c.replay_policy));
    }
    if c.rate_limit > 0 {
        wrong.push(format!("it delivers at most {} bits per second", c.rate_limit));
    }
    wrong
}

#[cfg(test)]
mod shape_tests {
    use super::*;

    /// A job stream as [`layout::streams`] makes it (that call needs a connection).
    fn jobs() -> stream::Config {
        stream::Config {
            name: subjects::JOBS_STREAM.to_string(),
            subjects: vec![format!("{}.>", subjects::JOBS_PREFIX)],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            duplicate_window: Duration::from_secs(20 * 60),
            ..Default::default()
        }
    }

    /// The configurations of the layout a test can make without a broker.
    fn layout_configs() -> Vec<stream::Config> {
        let mut all = vec![jobs(), layout::objects(1)];
        for spec in [
            layout::STATUS,
            layout::WORKERS,
            layout::quota_members(layout::DEFAULT_QUOTA_TTL),
            layout::POOL_HEALTH,
            layout::DELIVERY_BUDGET,
            layout::BATCHES,
        ] {
            all.push(spec.config(1));
        }
        all
    }

    /// A server answers "unlimited" with -1 where Halyard leaves 0: the same shape.
    fn as_served(c: &stream::Config) -> stream::Config {
        let mut c = c.clone();
        for v in [&mut c.max_messages, &mut c.max_bytes, &mut c.max_messages_per_subject] {
            if *v == 0 {
                *v = -1;
            }
        }
        if c.max_consumers == 0 {
            c.max_consumers = -1;
        }
        if c.duplicate_window.is_zero() {
            c.duplicate_window = Duration::from_secs(120);
        }
        c
    }

    /// Issue 51: the shared result cache's bucket drops its oldest entries when full
    /// (`discard = old`); one made by an earlier build refuses new entries instead, which
    /// loses nothing: it is kept (its coordinator changes it), while `old` where Halyard's
    /// is `new` is still refused (`every_losing_stream_setting_is_refused`).
    #[test]
    fn a_bucket_that_refuses_where_halyard_drops_is_kept() {
        let mut want = layout::STATUS.config(1);
        want.discard = stream::DiscardPolicy::Old;
        want.max_bytes = 8 << 30;
        let mut have = as_served(&want);
        have.discard = stream::DiscardPolicy::New;
        check_shape(&have, &want).unwrap();
        want.discard = stream::DiscardPolicy::New;
        have.discard = stream::DiscardPolicy::Old;
        let refused = check_shape(&have, &want).unwrap_err().to_string();
        assert!(refused.contains("discards Old"), "{refused}");
    }

    /// Issue 49, item 6: every setting that loses, stalls or misroutes what Halyard puts
    /// in a stream is refused by name, on each stream and bucket of the layout where it
    /// differs from Halyard's; Halyard's own shape (as a server reports it) passes.
    #[test]
    fn every_losing_stream_setting_is_refused() {
        type Change = (&'static str, fn(&mut stream::Config));
        let changes: [Change; 11] = [
            ("expire after", |c| {
                c.max_age = Duration::from_secs(if c.max_age.is_zero() { 60 } else { 0 })
            }),
            ("never expire", |c| c.max_age = Duration::ZERO),
            ("per subject", |c| c.max_messages_per_subject = 1),
            ("messages at most", |c| c.max_messages = 10),
            ("discards", |c| {
                c.discard = match c.discard {
                    stream::DiscardPolicy::New => stream::DiscardPolicy::Old,
                    _ => stream::DiscardPolicy::New,
                }
            }),
            ("no_ack", |c| c.no_ack = true),
            ("deny_purge", |c| c.deny_purge = !c.deny_purge),
            ("deny_delete", |c| c.deny_delete = !c.deny_delete),
            ("rollups", |c| c.allow_rollup = false),
            ("consumer(s) at most", |c| c.max_consumers = 1),
            ("de-duplication window", |c| c.duplicate_window = Duration::from_secs(5)),
        ];
        for want in layout_configs() {
            check_shape(&as_served(&want), &want).unwrap_or_else(|e| panic!("{}: {e}", want.name));
            for (words, change) in &changes {
                let mut have = as_served(&want);
                change(&mut have);
                let applies = match *words {
                    "expire after" => want.max_age.is_zero(),
                    "never expire" => !want.max_age.is_zero(),
                    "per subject" => want.max_messages_per_subject <= 0,
                    "rollups" => want.allow_rollup,
                    "de-duplication window" => !want.duplicate_window.is_zero(),
                    _ => true,
                };
                let got = check_shape(&have, &want);
                if !applies {
                    continue;
                }
                let e = got.expect_err(&format!("{}: {words} passed", want.name)).to_string();
                assert!(e.contains(words) && e.contains(&want.name), "{}: {words}: {e}", want.name);
                assert!(e.contains("nats stream rm"), "{e}");
            }
        }
    }

    /// A subject transform (nats-server 2.10+, which the test server, 2.9, cannot make and
    /// async-nats here does not parse) is refused from the configuration as served.
    #[test]
    fn a_subject_transform_is_refused() {
        let want = jobs();
        let served = serde_json::json!({
            "name": want.name, "subjects": want.subjects,
            "subject_transform": {"src": "halyard.results.*.free", "dest": "halyard.results.{{wildcard(1)}}.paid"}
        });
        let e = check_raw_shape(&served, &want).unwrap_err().to_string();
        assert!(e.contains("subject_transform") && e.contains("paid"), "{e}");
        let plain = serde_json::json!({"name": want.name, "subject_transform": null});
        check_raw_shape(&plain, &want).unwrap();
        let many = serde_json::json!({"subject_transforms": [{"src": ">", "dest": "x.>"}]});
        assert!(check_raw_shape(&many, &want).is_err());
    }

    /// A smaller byte or message-size limit, or a placement, is warned about, not refused.
    #[test]
    fn smaller_limits_and_placement_are_warned_about() {
        let want = layout::objects(1);
        let mut have = as_served(&want);
        assert!(shape_warnings(&have, &want).is_empty());
        have.max_bytes = 1 << 20;
        have.placement = Some(stream::Placement { cluster: Some("east".into()), tags: vec![] });
        check_shape(&have, &want).unwrap();
        let w = shape_warnings(&have, &want).join("\n");
        assert!(w.contains("less than the") && w.contains("--max-bytes"), "{w}");
        assert!(w.contains("east"), "{w}");
        have.max_bytes = -1;
        assert!(shape_warnings(&have, &want).join("").contains("not the"));
    }

    /// Item 6: the results consumer is checked, not merely got or created.
    #[test]
    fn a_results_consumer_that_loses_results_is_refused() {
        let run = uuid::Uuid::from_u128(49);
        let good = consumer::Config {
            durable_name: Some(subjects::run_consumer(run)),
            filter_subject: subjects::run_results_filter(run),
            ack_policy: consumer::AckPolicy::Explicit,
            max_deliver: -1,
            ..Default::default()
        };
        assert!(results_consumer_faults(&good, run).is_empty());
        type Change = (&'static str, fn(&mut consumer::Config));
        let changes: [Change; 7] = [
            ("instead of", |c| c.filter_subject = "halyard.results.>".into()),
            ("not explicit", |c| c.ack_policy = consumer::AckPolicy::All),
            ("not all", |c| c.deliver_policy = consumer::DeliverPolicy::New),
            ("deliveries", |c| c.max_deliver = 1),
            ("headers only", |c| c.headers_only = true),
            ("not instant", |c| c.replay_policy = consumer::ReplayPolicy::Original),
            ("bits per second", |c| c.rate_limit = 8),
        ];
        for (words, change) in changes {
            let mut c = good.clone();
            change(&mut c);
            let faults = results_consumer_faults(&c, run).join("; ");
            assert!(faults.contains(words), "{words}: {faults}");
        }
    }
}

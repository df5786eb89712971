//! The broker's layout: every stream and bucket Halyard uses, and who may make them.
//!
//! Only [`init`] creates them: the coordinator at start, or an operator with
//! `halyard broker init` (coordinator credentials). Every other process (workers,
//! `halyard status`) opens them with [`open`], which waits while one does not exist
//! yet and refuses one whose configuration would leak or lose what Halyard puts in it
//! ([`crate::check_shape`]). The worker role holds no right to create a stream
//! (deploy/nats/permissions.conf): before, a worker that found a stream missing created
//! it, so whoever held worker credentials could create `HALYARD_RESULTS` first, shaped
//! to copy every run's results to a subject workers read (issue 33).
//!
//! Every bucket lives on disk, so a lone broker's restart keeps them all (the quota
//! membership and pool health buckets were in memory, and only the workers that used
//! them could make them again).

use std::time::Duration;

use async_nats::jetstream::stream;
use halyard_proto::subjects;

use crate::{retry_js, stream_replicas, Broker, BrokerError};

/// A KV bucket of the layout. async-nats's `create_key_value` first asks for account
/// information in a form nats-server 2.9 does not send, so [`init`] creates a bucket's
/// stream directly with the KV layout (`KV_<bucket>`, `$KV.<bucket>.>`, one message per
/// subject, rollups, direct gets, on disk), and [`crate::kv::open`] opens it.
#[derive(Clone, Copy, Debug)]
pub struct BucketSpec {
    pub name: &'static str,
    /// Keys not written for this long expire (zero: never).
    pub max_age: Duration,
}

impl BucketSpec {
    /// The bucket's stream as [`init`] creates it.
    pub fn config(&self, replicas: usize) -> stream::Config {
        let name = self.name;
        stream::Config {
            name: format!("KV_{name}"),
            subjects: vec![format!("$KV.{name}.>")],
            max_messages_per_subject: 1,
            max_age: self.max_age,
            storage: stream::StorageType::File,
            allow_rollup: true,
            deny_delete: true,
            allow_direct: true,
            discard: stream::DiscardPolicy::New,
            num_replicas: replicas,
            ..Default::default()
        }
    }
}

pub const STATUS_BUCKET: &str = "halyard_status";
pub const WORKERS_BUCKET: &str = "halyard_workers";
/// A run's status is kept a week after its last update.
pub const STATUS_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// A worker whose heartbeat is older than this is gone.
pub const WORKER_MAX_AGE: Duration = Duration::from_secs(30);

/// Run status (`halyard status`), written by the coordinator; kept a week.
pub const STATUS: BucketSpec = BucketSpec { name: STATUS_BUCKET, max_age: STATUS_MAX_AGE };
/// Worker heartbeats; a worker whose key expired is gone.
pub const WORKERS: BucketSpec = BucketSpec { name: WORKERS_BUCKET, max_age: WORKER_MAX_AGE };
/// Quota pool membership: `<pool hex>.<worker hex>`, expiring after ¾ of the membership
/// TTL ([`Options::quota_ttl`]), which every member reads from the bucket.
pub const QUOTA_MEMBERS: &str = "halyard_quota_members";
/// Pool health records (endpoint outages: pause, probe, resume).
pub const POOL_HEALTH: BucketSpec =
    BucketSpec { name: subjects::POOL_HEALTH_BUCKET, max_age: Duration::from_secs(24 * 3600) };
/// Delivery budgets: deliveries an outage or a hand-back excused, per job message.
pub const DELIVERY_BUDGET: BucketSpec = BucketSpec {
    name: subjects::DELIVERY_BUDGET_BUCKET,
    max_age: Duration::from_secs(7 * 24 * 3600),
};
/// Provider batches of `mode = "batch"` pools: records, job claims, queue ledgers.
pub const BATCHES: BucketSpec = BucketSpec {
    name: halyard_proto::provider_batch::BATCHES_BUCKET,
    max_age: Duration::from_secs(7 * 24 * 3600),
};

/// What [`init`] sets that a process opening the layout cannot change.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Quota pools: how soon the other members notice that a worker died (the members
    /// bucket keeps a key ¾ of it; heartbeats go every quarter of it). One value for
    /// every worker of the broker: each reads it from the bucket.
    pub quota_ttl: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options { quota_ttl: DEFAULT_QUOTA_TTL }
    }
}

/// The membership TTL [`init`] gives the quota members bucket by default.
pub const DEFAULT_QUOTA_TTL: Duration = Duration::from_secs(10);

/// The quota members bucket for membership TTL `ttl`.
pub fn quota_members(ttl: Duration) -> BucketSpec {
    BucketSpec { name: QUOTA_MEMBERS, max_age: ttl.mul_f64(0.75) }
}

/// The object store bucket for oversized messages (stream `OBJ_halyard_objects`;
/// [`crate::objects`]).
pub const OBJECTS_BUCKET: &str = "halyard_objects";

/// Objects not deleted with their run (a run abandoned, or stopped for good) expire after
/// this long. Safe whenever it happens: a job message whose object is gone is terminated
/// and the job published again by the stall check (the object stored anew), a results
/// message whose object is gone is dropped and its job answered again from a worker's
/// checkpoint.
pub const OBJECT_MAX_AGE: Duration = Duration::from_secs(14 * 24 * 3600);

/// Bytes the object bucket holds at most (a run's objects go when it completes, any
/// object after [`OBJECT_MAX_AGE`]); past it a put is refused (discard policy `new`) and
/// the publisher keeps its payload and tries again later.
pub const OBJECTS_MAX_BYTES: i64 = 4 << 30;

/// The object bucket's stream as [`init`] creates it (in the object store's layout,
/// created directly as KV buckets are: see [`BucketSpec`]).
pub fn objects(replicas: usize) -> stream::Config {
    stream::Config {
        name: format!("OBJ_{OBJECTS_BUCKET}"),
        subjects: vec![format!("$O.{OBJECTS_BUCKET}.C.>"), format!("$O.{OBJECTS_BUCKET}.M.>")],
        storage: stream::StorageType::File,
        num_replicas: replicas,
        max_age: OBJECT_MAX_AGE,
        max_bytes: OBJECTS_MAX_BYTES,
        discard: stream::DiscardPolicy::New,
        allow_rollup: true,
        allow_direct: true,
        ..Default::default()
    }
}

/// Bytes the results stream holds at most. Results are removed as the coordinator acks
/// them, so this is what may wait while no coordinator runs; past it a worker's publish
/// is refused (discard policy `new`: nothing stored is ever dropped), the worker keeps
/// the result in its checkpoint and answers the job from it when it comes again.
pub const RESULTS_MAX_BYTES: i64 = 2 << 30;

/// The job and result streams as Halyard creates them, with `replicas`. The results
/// stream is bounded ([`RESULTS_MAX_BYTES`], messages of at most the server's
/// `max_payload`), so that a flood on the results subject fills the broker's disk no
/// further.
pub fn streams(b: &Broker, replicas: usize) -> [stream::Config; 2] {
    [
        (subjects::JOBS_STREAM, subjects::JOBS_PREFIX),
        (subjects::RESULTS_STREAM, subjects::RESULTS_PREFIX),
    ]
    .map(|(name, prefix)| {
        let mut cfg = stream::Config {
            name: name.to_string(),
            subjects: vec![format!("{prefix}.>")],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            num_replicas: replicas,
            duplicate_window: b.config.duplicate_window,
            ..Default::default()
        };
        if name == subjects::RESULTS_STREAM {
            cfg.max_bytes = RESULTS_MAX_BYTES;
            cfg.discard = stream::DiscardPolicy::New;
            cfg.max_message_size =
                i32::try_from(b.client.server_info().max_payload).unwrap_or(i32::MAX).max(1 << 20);
        }
        cfg
    })
}

/// Every stream of the layout, as [`init`] creates it.
pub fn all(b: &Broker, opts: &Options, replicas: usize) -> Vec<stream::Config> {
    let mut all = streams(b, replicas).to_vec();
    all.push(objects(replicas));
    let buckets =
        [STATUS, WORKERS, quota_members(opts.quota_ttl), POOL_HEALTH, DELIVERY_BUDGET, BATCHES];
    all.extend(buckets.iter().map(|s| s.config(replicas)));
    all
}

/// One stream as [`init`] found or made it.
#[derive(Clone, Debug)]
pub struct Made {
    pub name: String,
    /// Created now (else it existed, and its shape was checked).
    pub created: bool,
    pub replicas: usize,
}

/// Create every stream and bucket of the layout that is missing, and check the shape of
/// those that exist (idempotent; an existing one keeps its settings, with a warning
/// where it has fewer replicas than Halyard would give it now). The coordinator's and
/// `halyard broker init`'s call.
pub async fn init(b: &Broker, opts: &Options) -> Result<Vec<Made>, BrokerError> {
    let replicas = stream_replicas(b).await;
    let mut made = Vec::new();
    for cfg in all(b, opts, replicas) {
        let name = cfg.name.clone();
        let (s, created) = retry_js(&format!("create stream {name}"), || async {
            if let Some(s) = find(b, &name).await? {
                return Ok((s, false));
            }
            b.js.get_or_create_stream(cfg.clone())
                .await
                .map(|s| (s, true))
                .map_err(|e| e.to_string())
        })
        .await?;
        let held = s.cached_info().config.clone();
        crate::check_shape(&held, &cfg)?;
        check_raw(b, &cfg).await?;
        crate::check_replicas(b, &name, held.num_replicas).await;
        for w in crate::shape_warnings(&held, &cfg) {
            tracing::warn!(stream = %name, "{w}");
        }
        if held.storage != cfg.storage {
            tracing::warn!(
                stream = %name,
                "stream {name} keeps its {:?} storage (made by an earlier build): a broker's restart \
                 loses it, and only a coordinator or `halyard broker init` makes it again; remove it \
                 (nats stream rm {name}) while no run is active, then run `halyard broker init`",
                held.storage
            );
        }
        made.push(Made { name, created, replicas: held.num_replicas });
    }
    Ok(made)
}

/// The stream `name`, or `None` when it does not exist.
async fn find(b: &Broker, name: &str) -> Result<Option<stream::Stream>, String> {
    use async_nats::jetstream::context::GetStreamErrorKind as K;
    use async_nats::jetstream::ErrorCode;
    match b.js.get_stream(name).await {
        Ok(s) => Ok(Some(s)),
        Err(e) => match e.kind() {
            K::JetStream(j) if j.error_code() == ErrorCode::STREAM_NOT_FOUND => Ok(None),
            _ => Err(e.to_string()),
        },
    }
}

/// The stream `want` names as another process made it, checked
/// ([`crate::check_shape`]); `None` when it does not exist. Never creates anything.
pub async fn lookup(
    b: &Broker,
    want: &stream::Config,
) -> Result<Option<stream::Stream>, BrokerError> {
    let name = &want.name;
    let Some(s) = retry_js(&format!("stream {name}"), || find(b, name)).await? else {
        return Ok(None);
    };
    crate::check_shape(&s.cached_info().config, want)?;
    check_raw(b, want).await?;
    Ok(Some(s))
}

/// [`crate::check_raw_shape`] on the configuration the server holds for `want`'s stream,
/// as the server sends it (fields async-nats does not parse included).
async fn check_raw(b: &Broker, want: &stream::Config) -> Result<(), BrokerError> {
    let name = &want.name;
    let empty = serde_json::json!({});
    let info: serde_json::Value =
        retry_js(&format!("stream {name}"), || b.js.request(format!("STREAM.INFO.{name}"), &empty))
            .await?;
    if let Some(e) = info.get("error") {
        return Err(BrokerError::js(format!("stream {name}"), e));
    }
    crate::check_raw_shape(info.get("config").unwrap_or(&serde_json::Value::Null), want)
}

/// How often a process waiting for a stream says so again.
const WAIT_REMINDER: Duration = Duration::from_secs(60);

/// As [`lookup`], but waiting while the stream does not exist (saying so, then every
/// minute): a worker may start before any coordinator.
pub async fn open(b: &Broker, want: &stream::Config) -> Result<stream::Stream, BrokerError> {
    let name = &want.name;
    let mut pause = Duration::from_millis(50);
    let mut said: Option<tokio::time::Instant> = None;
    loop {
        if let Some(s) = lookup(b, want).await? {
            if said.is_some() {
                tracing::info!(stream = %name, "stream {name} exists now");
            }
            return Ok(s);
        }
        if said.is_none_or(|t| t.elapsed() >= WAIT_REMINDER) {
            tracing::info!(
                stream = %name,
                "stream {name} does not exist yet; waiting for a coordinator (or `halyard broker \
                 init`) to create it"
            );
            said = Some(tokio::time::Instant::now());
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

/// Open the job and result streams and the object bucket ([`open`]), as a worker does
/// before it binds.
pub async fn open_streams(b: &Broker) -> Result<(), BrokerError> {
    let [jobs, results] = streams(b, 1);
    for cfg in [jobs, results, objects(1)] {
        open(b, &cfg).await?;
    }
    Ok(())
}

//! `halyard worker`: a worker configured from a sweep (every pool, local model, replay
//! and embedding model it names) or from `--pool`/`--quota` flags, with its heartbeat
//! and metrics endpoint.

use std::path::PathBuf;
use std::time::Duration;

use halyard_broker::Delivery;
use halyard_plan::sweep;
use halyard_plan::worker_plan::{gpu_plan, non_gpu_plan, worker_plan};
use halyard_proto::pool::{PoolPlan, QuotaSpec, WorkerModel};
use halyard_proto::server::gpu_list;
use halyard_worker::server::placement;
use halyard_worker::WorkerConfig;
use tokio::sync::watch;

use crate::shutdown::until;
use crate::{metrics, status, Nats, NodeError};

/// What `halyard worker` is given besides the broker.
#[derive(Clone, Debug, Default)]
pub struct WorkerOptions {
    /// Serve every pool of this sweep.
    pub sweep: Option<PathBuf>,
    /// Serve the pools and models of this worker config file.
    pub config: Option<PathBuf>,
    /// `--pool NAME[=CONCURRENCY]` (noop models only).
    pub pools: Vec<String>,
    /// Allow http:// model URLs on hosts that are not loopback.
    pub allow_insecure_http: bool,
    /// Start managed servers given as a sweep's `command`, not only the presets.
    pub allow_server_commands: bool,
    /// `--quota POOL:rpm=N,tpm=N[,burst=N]`.
    pub quotas: Vec<String>,
    /// Seconds within which the other workers of a quota pool notice this one died.
    pub quota_ttl: f64,
    /// Checkpoint directory.
    pub state: PathBuf,
    /// Delivery settings without a sweep.
    pub max_deliver: i64,
    pub ack_wait: f64,
    /// Seconds in-flight calls get to finish after a signal.
    pub grace: f64,
    pub id: Option<String>,
    /// `--gpu N` or `--gpu N,M,...`, repeatable: the GPU sets of this worker. It serves
    /// only the sweep's local models placed on these GPUs and its managed servers dealt
    /// to these sets (see `halyard_worker::server::placement`).
    pub gpu: Vec<String>,
    /// `--only-pool POOL` (repeatable, with `--sweep`): serve only these pools of the
    /// sweep (one Deployment per pool, `halyard deploy k8s`).
    pub only_pools: Vec<String>,
}

/// The worker configuration `opts` asks for; every bad value is an error naming its flag.
pub fn config(opts: &WorkerOptions) -> Result<WorkerConfig, NodeError> {
    let sets = opts
        .gpu
        .iter()
        .map(|g| placement::parse_gpu_set(g))
        .collect::<Result<Vec<_>, _>>()
        .map_err(NodeError::Usage)?;
    placement::check_disjoint(&sets).map_err(NodeError::Usage)?;
    let mut cfg = WorkerConfig::new(Default::default(), opts.state.clone());
    cfg.delivery = Delivery {
        ack_wait: Duration::from_secs_f64(opts.ack_wait.max(1.0)),
        max_deliver: opts.max_deliver,
    };
    if let Some(path) = &opts.sweep {
        let s = sweep::load_pools(path)?;
        cfg = sweep_worker(&s, opts.state.clone());
        // Before the GPU placement: the servers are dealt to --gpu sets among the kept pools.
        cfg.plan = only_pools(cfg.plan, &opts.only_pools, path)?;
        match sets.is_empty() {
            false => pin_to_gpus(&mut cfg, &s, &sets)?,
            // Without --gpu, the models the sweep places on a GPU are the GPU workers'
            // (issue 34): loading them here would fail without CUDA, or take a GPU.
            true => {
                let all = cfg.plan.pools.len();
                cfg.plan = non_gpu_plan(&cfg.plan);
                if cfg.plan.pools.is_empty() && all > 0 {
                    return Err(NodeError::Usage(format!(
                        "the sweep {} places every model on a GPU: start this worker with --gpu N",
                        path.display()
                    )));
                }
            }
        }
    } else if !opts.only_pools.is_empty() {
        return Err(NodeError::Usage(
            "--only-pool needs --sweep: it narrows the pools of a sweep".into(),
        ));
    } else if !sets.is_empty() {
        return Err(NodeError::Usage(
            "--gpu needs --sweep: the sweep says which models to load on the GPU".into(),
        ));
    }
    if let Some(path) = &opts.config {
        let file =
            halyard_worker::config_file::load(path).map_err(|e| NodeError::Usage(e.to_string()))?;
        cfg.http = file.http;
        for p in file.plan.pools {
            cfg.plan
                .add(p)
                .map_err(|e| NodeError::Usage(format!("--config {}: {e}", path.display())))?;
        }
    }
    cfg.http.allow_insecure_http |= opts.allow_insecure_http;
    cfg.http.allow_server_commands |= opts.allow_server_commands;
    for p in &opts.pools {
        cfg.plan.add(parse_pool(p)?).map_err(NodeError::Usage)?;
    }
    for q in &opts.quotas {
        let (pool, quota) = parse_quota(q)?;
        let Some(p) = cfg.plan.pools.iter_mut().find(|p| p.pool.name == pool) else {
            return Err(NodeError::Usage(format!(
                "--quota {q:?}: this worker serves no pool {pool:?} (give --pool {pool})"
            )));
        };
        p.quota = Some(quota);
    }
    if !(opts.quota_ttl.is_finite() && (1.0..=3600.0).contains(&opts.quota_ttl)) {
        return Err(NodeError::Usage(format!(
            "--quota-ttl {}: give seconds in 1..=3600",
            opts.quota_ttl
        )));
    }
    cfg.quota_settings.ttl = Duration::from_secs_f64(opts.quota_ttl);
    cfg.shutdown_grace = Duration::from_secs_f64(opts.grace.max(0.0));
    if let Some(id) = &opts.id {
        cfg.worker_id = id.clone();
    }
    check_local_models(&cfg.plan)?;
    Ok(cfg)
}

/// The pools of `plan` named by `--only-pool` (all of them when none is named); a name
/// the sweep has no pool of is an error listing the sweep's pools.
fn only_pools(
    mut plan: halyard_proto::pool::WorkerPlan,
    only: &[String],
    sweep: &std::path::Path,
) -> Result<halyard_proto::pool::WorkerPlan, NodeError> {
    if only.is_empty() {
        return Ok(plan);
    }
    for name in only {
        if !plan.pools.iter().any(|p| &p.pool.name == name) {
            let have: Vec<&str> = plan.pools.iter().map(|p| p.pool.name.as_str()).collect();
            return Err(NodeError::Usage(format!(
                "--only-pool {name:?}: the sweep {} has no such pool (its pools: {})",
                sweep.display(),
                have.join(", ")
            )));
        }
    }
    plan.pools.retain(|p| only.contains(&p.pool.name));
    Ok(plan)
}

/// Every local model this worker will load is the file its sweep names: its identity (the
/// sweep's `identity`, or the one the sweep's reader computed from the file) is checked
/// against the file here, before anything is loaded (issue 34).
pub fn check_local_models(plan: &halyard_proto::pool::WorkerPlan) -> Result<(), NodeError> {
    for (pool, m) in plan.models() {
        if let halyard_proto::pool::WorkerModel::Gguf(g) = m {
            sweep::check_identity(&g.path, &g.endpoint).map_err(|e| {
                NodeError::Usage(format!("local model of pool {:?}: {e}", pool.name))
            })?;
        }
    }
    Ok(())
}

/// Pinned to GPU sets: the local models placed on their GPUs, the managed servers dealt
/// to them (one server per set), and their pools.
fn pin_to_gpus(
    cfg: &mut WorkerConfig,
    s: &sweep::Sweep,
    sets: &[Vec<u32>],
) -> Result<(), NodeError> {
    let full = std::mem::take(&mut cfg.plan);
    let mut plan = placement::place_servers(&full, sets).map_err(NodeError::Usage)?;
    let mut gpus: Vec<u32> = sets.iter().flatten().copied().collect();
    gpus.sort_unstable();
    gpus.dedup();
    let mut local = false;
    for g in gpus {
        for p in gpu_plan(&full, g).pools {
            local = true;
            plan.add(p).map_err(NodeError::Usage)?;
        }
    }
    let shown: Vec<String> = sets.iter().map(|g| format!("--gpu {}", gpu_list(g))).collect();
    if local && !halyard_worker::backend::gguf_gpu_support() {
        return Err(NodeError::Usage(format!(
            "{}: the sweep places gguf models on these GPUs, but this halyard was built without the `cuda` feature (rebuild with `cargo build --release --features cuda`, which needs the CUDA toolkit)",
            shown.join(" ")
        )));
    }
    if plan.pools.is_empty() {
        return Err(NodeError::Usage(format!(
            "{}: the sweep {} places no gguf model on these GPUs (`gpu = N`) and has no managed server (`backend = \"server\"`, `gpus >= 1`) for them",
            shown.join(" "),
            s.file.display()
        )));
    }
    cfg.plan = plan;
    Ok(())
}

/// Run a worker until `shutdown`: its metrics endpoint (`metrics`, default
/// 127.0.0.1:9465) and heartbeat too.
pub async fn run(
    cfg: WorkerConfig,
    nats: Nats,
    metrics: Option<&str>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), NodeError> {
    let connected = crate::connect_or_stop(
        &nats.broker_config(format!("halyard-worker {}", cfg.worker_id)),
        &shutdown,
    )
    .await;
    let broker = match connected {
        // A worker that never connected holds nothing: a clean stop.
        Err(NodeError::StoppedBeforeStart(url)) => {
            tracing::info!(url = %url, "stopped before the broker answered");
            return Ok(());
        }
        other => other?,
    };
    let src = metrics::Sources {
        coordinator: None,
        workers: vec![(cfg.worker_id.clone(), cfg.stats.clone())],
        broker: Some(broker.clone()),
    };
    metrics::serve(metrics, Some("127.0.0.1:9465"), src).await?;
    let beat =
        status::heartbeat(&broker, cfg.worker_id.clone(), pool_list(&cfg), cfg.stats.clone());
    // A standalone worker's broker is shared: it reads the shared result cache too.
    let mut cfg = cfg;
    cfg.cache = cfg.cache.with_shared(halyard_cache::shared::SharedReader::new(broker.clone()));
    let result = halyard_worker::run(broker, cfg, until(shutdown)).await;
    beat.abort();
    result?;
    Ok(())
}

/// Configure a worker for a whole sweep: every pool, every model.
pub fn sweep_worker(s: &sweep::Sweep, state: PathBuf) -> WorkerConfig {
    let mut cfg = WorkerConfig::new(worker_plan(s), state);
    cfg.delivery = Delivery { ack_wait: s.run.ack_wait, max_deliver: s.run.max_deliver };
    // The result cache on this machine (issue 51): `--cache DIR` / HALYARD_CACHE, else the
    // user's cache directory; `off` leaves it out. A sweep none of whose models uses the
    // cache does not open (or create) its file.
    cfg.cache_policies = s.models.iter().map(|m| (m.spec.model_ref.clone(), m.cache)).collect();
    let used = s.models.iter().any(|m| m.cache != halyard_proto::CachePolicy::Off);
    let dir = if used { halyard_cache::machine_dir(None) } else { None };
    cfg.cache =
        halyard_cache::Cache::open_machine(dir.as_deref(), halyard_cache::Limits::default());
    cfg
}

/// `--quota POOL:rpm=N,tpm=N[,burst=N][,tpm_counts=max_tokens|usage]`.
fn parse_quota(s: &str) -> Result<(String, QuotaSpec), NodeError> {
    let bad = |why: String| {
        NodeError::Usage(format!(
            "--quota {s:?}: {why} (expected POOL:rpm=N,tpm=N[,burst=N][,tpm_counts=max_tokens|usage])"
        ))
    };
    let (pool, spec) =
        s.rsplit_once(':').ok_or_else(|| bad("no ':' after the pool name".into()))?;
    let (mut rpm, mut tpm, mut burst, mut counts) = (None, None, None, None);
    for part in spec.split(',').filter(|p| !p.trim().is_empty()) {
        let (k, v) = part.split_once('=').ok_or_else(|| bad(format!("{part:?} is not KEY=N")))?;
        if k.trim() == "tpm_counts" {
            counts = Some(v.trim());
            continue;
        }
        let n: i64 =
            v.trim().parse().map_err(|_| bad(format!("{k} value {v:?} is not an integer")))?;
        match k.trim() {
            "rpm" => rpm = Some(n),
            "tpm" => tpm = Some(n),
            "burst" => burst = Some(n),
            other => return Err(bad(format!("unknown key {other:?}"))),
        }
    }
    let q = sweep::check_quota(sweep::RawQuota {
        rpm,
        tpm,
        burst,
        tpm_counts: counts,
        itpm: None,
        otpm: None,
    })
    .map_err(&bad)?
    .ok_or_else(|| bad("give rpm or tpm".into()))?;
    Ok((pool.to_string(), q))
}

/// The pools a worker serves, with their concurrency (for its heartbeat).
pub(crate) fn pool_list(cfg: &WorkerConfig) -> Vec<(String, usize)> {
    cfg.plan.pools.iter().map(|p| (p.pool.name.clone(), p.pool.concurrency)).collect()
}

/// `--pool NAME[=N]`: a pool of noop models (no model is called).
fn parse_pool(s: &str) -> Result<PoolPlan, NodeError> {
    let (name, concurrency) = match s.split_once('=') {
        None => (s, 4),
        Some((name, n)) => (
            name,
            n.parse().ok().filter(|c| *c >= 1).ok_or_else(|| {
                NodeError::Usage(format!(
                    "--pool {s:?}: concurrency {n:?} is not a positive integer"
                ))
            })?,
        ),
    };
    Ok(PoolPlan::new(name, concurrency).with_model(WorkerModel::Noop))
}

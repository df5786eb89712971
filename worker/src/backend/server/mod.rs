//! Managed model servers (`backend = "server"`): OpenAI-compatible server processes
//! (vLLM, SGLang, llama-server, TGI, any command) that the worker starts, watches,
//! restarts and stops, one per model and GPU set.
//!
//! # Life of a server
//! - **Start.** For each GPU set the worker was given for the model (`--gpu 0,1 --gpu
//!   2,3`: one server each; none for a CPU server or a worker without sets), the worker
//!   picks a free loopback port, sets `CUDA_VISIBLE_DEVICES` to the set (empty for a CPU
//!   server, left alone without sets), expands the command's placeholders and starts it
//!   in its own process group with a parent-death signal ([`process`]), its output
//!   appended to `<state>/servers/<model>@<gpus>.log`.
//! - **Ready.** The worker polls `GET <ready_path>` until it answers 2xx, up to the
//!   model's start-up deadline. A first start that exits or misses the deadline fails the
//!   worker's start with the log's last lines; the pool's consumer is bound only after
//!   every server is ready ([`Servers::ready`]), so no job is taken before the model can
//!   answer. Where the server tells its version (`version_path`), a version other than
//!   the sweep's declared one stops the worker: its answers would not be the sweep's.
//! - **Crash.** A server that exits while the worker runs is restarted with exponential
//!   backoff (`restart_backoff_s`, doubling, at most a minute; the `backon` crate), on a
//!   new port. While no server of the model is ready, its pools are paused exactly as for
//!   an endpoint outage (see [`crate::health`]): nothing is fetched, jobs in hand go back
//!   to the queue without spending their delivery budget, and the pool resumes when a
//!   server is ready again. The pause begins before the failed calls are counted: a call
//!   refused by a server that died waits (briefly) for the supervisor to see the exit,
//!   so the pause is the server's, not the job's. A server's pool health is this
//!   worker's alone (not announced to the pool's other workers, whose own servers are
//!   fine).
//! - **Crash loop.** More than `max_restarts` crashes in a row (a server up for ten
//!   minutes starts a new count; a restart that never becomes ready counts) stops the
//!   worker with the server's log tail ([`Servers::fatal`]).
//! - **Stop.** On the worker's shutdown the servers are stopped after the pools' loops
//!   have drained (in-flight calls answered): SIGTERM to the process group, SIGKILL after
//!   [`STOP_GRACE`]. If the worker dies (even by SIGKILL), the kernel kills each server
//!   (its parent-death signal); its handle's drop kills the group on every other path.
//!
//! Calls ([`Servers::call`]) go to a ready server of the job's model (round robin over
//! the model's GPU sets) through the worker's OpenAI-compatible HTTP client. Each
//! server's state, restarts, GPU set, ready time and version are in [`crate::stats::Stats`]
//! (`servers`) for `/metrics` and the worker's heartbeat (`halyard status`).

pub mod placement;
pub mod process;
/// Each managed server as `/metrics` shows it (kept with the other counters).
pub use crate::stats::server as stats;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use backon::{BackoffBuilder, ExponentialBuilder};
use halyard_proto::pool::{HttpModelSpec, WorkerModel, WorkerPlan};
use halyard_proto::server::{gpu_list, ServerSpec};
use halyard_proto::{Completion, Job, OutageReason};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;
use tracing::{error, info, warn};

pub use stats::{ServerStat, ServerState, ServerStats};

use super::http_client::HttpClient;
use super::openai::OpenAi;
use crate::call_error::CallError;
use crate::health::{Failure, PoolHealth};
use crate::stats::Stats;
use process::Proc;

/// How long a server gets to exit after SIGTERM before its group is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(30);
/// The longest restart delay.
const MAX_RESTART_DELAY: Duration = Duration::from_secs(60);
/// How often readiness is polled.
const READY_POLL: Duration = Duration::from_millis(250);
/// How long a refused call waits for the supervisor to see its server's exit.
const SETTLE: Duration = Duration::from_secs(3);
/// Lines of a server's log quoted in errors.
const TAIL_LINES: usize = 20;
/// The largest answer of a server's version path read (a version is a few bytes; a
/// server answering more is not read whole into memory).
const VERSION_BODY_LIMIT: u64 = 64 << 10;

/// Whether `plan` names a managed server.
pub fn has_servers(plan: &WorkerPlan) -> bool {
    plan.models().any(|(_, m)| matches!(m, WorkerModel::Server(_)))
}

/// Whether pool `pool` of `plan` calls a managed server (its health is then this
/// worker's own, see the module docs).
pub fn pool_has_server(plan: &WorkerPlan, pool: &str) -> bool {
    plan.pool(pool).is_some_and(|p| p.models.iter().any(|m| matches!(m, WorkerModel::Server(_))))
}

/// What one server is doing now (its calls read it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Live {
    state: ServerState,
    port: Option<u16>,
}

/// One server: a model on one GPU set.
struct Replica {
    /// `<model>@gpu0,1` or `<model>@cpu`.
    label: String,
    /// The GPU set; None: `CUDA_VISIBLE_DEVICES` left as the worker has it.
    gpus: Option<Vec<u32>>,
    log: PathBuf,
    live: watch::Sender<Live>,
}

impl Replica {
    fn live(&self) -> Live {
        *self.live.borrow()
    }
}

/// Every server of one model, and the pools that call it.
struct Group {
    spec: ServerSpec,
    replicas: Vec<Arc<Replica>>,
    pools: Vec<Arc<PoolHealth>>,
    next: AtomicUsize,
}

impl Group {
    /// Whether a server of the model other than `this` is ready.
    fn any_other_ready(&self, this: &Arc<Replica>) -> bool {
        self.replicas.iter().any(|r| !Arc::ptr_eq(r, this) && r.live().state == ServerState::Ready)
    }

    /// A ready server, round robin.
    fn pick(&self) -> Option<(Arc<Replica>, u16)> {
        let n = self.replicas.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..n).map(|i| &self.replicas[(start + i) % n]).find_map(|r| match r.live() {
            Live { state: ServerState::Ready, port: Some(p) } => Some((r.clone(), p)),
            _ => None,
        })
    }
}

/// The managed servers of a worker; see the module docs.
pub struct Servers {
    groups: HashMap<String, Arc<Group>>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    stop: watch::Sender<bool>,
    fatal: watch::Receiver<Option<String>>,
    firsts: tokio::sync::Mutex<Vec<oneshot::Receiver<Result<(), String>>>>,
}

/// What a supervisor shares with the others.
#[derive(Clone)]
struct Shared {
    stats: Arc<Stats>,
    client: reqwest::Client,
    stop: watch::Receiver<bool>,
    fatal: Arc<watch::Sender<Option<String>>>,
}

impl Servers {
    /// Start every managed server of `plan` (logs under `dir`), each watched by its own
    /// task; `health` holds the pools' health. Returns at once: [`Servers::ready`] waits
    /// for the first starts.
    pub fn launch(
        plan: &WorkerPlan,
        dir: &Path,
        health: &HashMap<String, Arc<PoolHealth>>,
        stats: Arc<Stats>,
    ) -> Result<Arc<Servers>, String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create the servers' log folder {}: {e}", dir.display()))?;
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| format!("cannot build the servers' HTTP client: {e}"))?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let (fatal_tx, fatal_rx) = watch::channel(None);
        let shared =
            Shared { stats: stats.clone(), client, stop: stop_rx, fatal: Arc::new(fatal_tx) };
        let mut groups: HashMap<String, Arc<Group>> = HashMap::new();
        let mut specs: Vec<&ServerSpec> = Vec::new();
        for (_, m) in plan.models() {
            if let WorkerModel::Server(s) = m {
                if !specs.iter().any(|have| have.endpoint == s.endpoint) {
                    specs.push(s);
                }
            }
        }
        let mut tasks = Vec::new();
        let mut firsts = Vec::new();
        for spec in specs {
            let pools = plan
                .pools
                .iter()
                .filter(|p| {
                    p.models
                        .iter()
                        .any(|m| matches!(m, WorkerModel::Server(s) if s.endpoint == spec.endpoint))
                })
                .filter_map(|p| health.get(&p.pool.name).cloned())
                .collect();
            let sets: Vec<Option<Vec<u32>>> = match (spec.gpus, spec.gpu_sets.is_empty()) {
                (0, _) => vec![Some(Vec::new())],
                (_, true) => vec![None],
                (_, false) => spec.gpu_sets.iter().cloned().map(Some).collect(),
            };
            let replicas: Vec<Arc<Replica>> = sets
                .into_iter()
                .map(|gpus| {
                    let place = match &gpus {
                        Some(g) if g.is_empty() => "cpu".to_string(),
                        Some(g) => format!("gpu{}", gpu_list(g)),
                        None => "gpus".to_string(),
                    };
                    let label = format!("{}@{place}", spec.name);
                    let log = process::log_path(dir, &label);
                    stats.servers.update(&label, |s| {
                        s.model = spec.name.clone();
                        s.kind = spec.kind.clone();
                        s.gpus = gpus.as_deref().map(gpu_list).unwrap_or_default();
                        s.log = log.display().to_string();
                        s.state = ServerState::Starting;
                    });
                    let live = watch::channel(Live { state: ServerState::Starting, port: None }).0;
                    Arc::new(Replica { label, gpus, log, live })
                })
                .collect();
            let group = Arc::new(Group {
                spec: spec.clone(),
                replicas: replicas.clone(),
                pools,
                next: AtomicUsize::new(0),
            });
            for r in replicas {
                let (tx, rx) = oneshot::channel();
                firsts.push(rx);
                tasks.push(tokio::spawn(supervise(group.clone(), r, shared.clone(), tx)));
            }
            groups.insert(spec.endpoint.clone(), group);
        }
        Ok(Arc::new(Servers {
            groups,
            tasks: Mutex::new(tasks),
            stop: stop_tx,
            fatal: fatal_rx,
            firsts: tokio::sync::Mutex::new(firsts),
        }))
    }

    /// Wait until every server has become ready once; the first start that failed, with
    /// its log tail, otherwise.
    pub async fn ready(&self) -> Result<(), String> {
        let firsts: Vec<_> = self.firsts.lock().await.drain(..).collect();
        for rx in firsts {
            match rx.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err("a managed server's supervisor ended while starting".into()),
            }
        }
        Ok(())
    }

    /// Resolves when a server has failed for good (a crash loop, a version that is not
    /// the sweep's): the worker must stop. Never resolves otherwise.
    pub async fn fatal(&self) -> String {
        let mut rx = self.fatal.clone();
        let fatal = rx.wait_for(|f| f.is_some()).await.map(|f| f.clone());
        match fatal {
            Ok(f) => f.unwrap_or_default(),
            Err(_) => std::future::pending().await,
        }
    }

    /// Stop every server gracefully (SIGTERM, SIGKILL after [`STOP_GRACE`]) and wait.
    pub async fn stop(&self) {
        let _ = self.stop.send(true);
        let tasks: Vec<_> =
            self.tasks.lock().unwrap_or_else(|p| p.into_inner()).drain(..).collect();
        for t in tasks {
            let _ = t.await;
        }
    }

    /// One call of `job` on a ready server of its model.
    pub async fn call(&self, http: &OpenAi, job: &Job) -> Result<Completion, CallError> {
        let Some(g) = self.groups.get(&job.key.model.endpoint) else {
            return Err(CallError::permanent(format!(
                "this worker runs no server for model {} (pool {}); start a worker with the sweep that names it",
                job.key.model.endpoint, job.pool
            )));
        };
        let Some((replica, port)) = g.pick() else {
            let states: Vec<String> = g
                .replicas
                .iter()
                .map(|r| format!("{} {}", r.label, r.live().state.as_str()))
                .collect();
            return Err(CallError::unavailable(
                OutageReason::Connection,
                format!(
                    "no managed server of model {} is ready on this worker ({}): the pool waits for it",
                    g.spec.name,
                    states.join(", ")
                ),
            ));
        };
        let model = HttpModelSpec {
            backend: "openai".into(),
            base_url: format!("http://127.0.0.1:{port}/v1"),
            model: g.spec.served_name.clone(),
            api_key_env: None,
            prompt_cache: None,
        };
        let r = http.call(job, &model).await;
        if let Err(e) = &r {
            if e.outage() == Some(OutageReason::Connection) {
                // A server that died refuses (or drops) calls before its exit is seen:
                // give the supervisor the moment it needs to pause the pools, so this
                // failure finds the pool paused and costs the job nothing.
                let mut rx = replica.live.subscribe();
                let _ = tokio::time::timeout(
                    SETTLE,
                    rx.wait_for(|l| l.state != ServerState::Ready || l.port != Some(port)),
                )
                .await;
            }
        }
        r
    }
}

impl Drop for Servers {
    /// Supervisors still running are aborted: each drops its process handle, which kills
    /// the server's group.
    fn drop(&mut self) {
        for t in self.tasks.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            t.abort();
        }
    }
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// How a start ended before the server was ready.
enum NotReady {
    Exited(std::process::ExitStatus),
    Deadline,
    Stopped,
}

/// Set the replica's state (and the stats).
fn set_state(r: &Replica, stats: &Stats, state: ServerState, port: Option<u16>) {
    r.live.send_replace(Live { state, port });
    stats.servers.update(&r.label, |s| {
        s.state = state;
        s.port = port;
    });
}

/// Watch one server for the worker's life; see the module docs. `first` gets the first
/// start's outcome.
async fn supervise(
    g: Arc<Group>,
    r: Arc<Replica>,
    sh: Shared,
    first: oneshot::Sender<Result<(), String>>,
) {
    let spec = &g.spec;
    let mut first = Some(first);
    let backoff = || {
        let min = Duration::from_millis(spec.restart_backoff_ms);
        ExponentialBuilder::default()
            .with_min_delay(min)
            .with_max_delay(MAX_RESTART_DELAY.max(min))
            .with_factor(2.0)
            .without_max_times()
            .build()
    };
    let mut delays = backoff();
    let mut in_row: u32 = 0;
    let mut stop = sh.stop.clone();
    let give_up = |why: String, first: &mut Option<oneshot::Sender<Result<(), String>>>| {
        set_state(&r, &sh.stats, ServerState::Failed, None);
        error!(server = %r.label, "{why}");
        match first.take() {
            Some(tx) => {
                let _ = tx.send(Err(why));
            }
            None => {
                sh.fatal.send_if_modified(|f| {
                    if f.is_none() {
                        *f = Some(why);
                        true
                    } else {
                        false
                    }
                });
            }
        }
    };
    loop {
        if *stop.borrow() {
            break;
        }
        let port = match process::free_port() {
            Ok(p) => p,
            Err(e) => {
                give_up(
                    format!("managed server {}: no free loopback port: {e}", r.label),
                    &mut first,
                );
                return;
            }
        };
        let gpus = r.gpus.clone();
        let argv = spec.expand(port, gpus.as_deref().unwrap_or(&[]));
        let env: Vec<(String, String)> = match &gpus {
            Some(set) => vec![("CUDA_VISIBLE_DEVICES".into(), gpu_list(set))],
            None => Vec::new(),
        };
        process::log_line(
            &r.log,
            &format!(
                "--- halyard: starting {} on port {port}: {argv:?} (unix ms {})",
                r.label,
                unix_ms()
            ),
        );
        set_state(&r, &sh.stats, ServerState::Starting, Some(port));
        sh.stats.servers.update(&r.label, |s| {
            s.command = argv.clone();
            s.pid = None;
        });
        info!(server = %r.label, port, command = ?argv, "starting managed server");
        let started = Instant::now();
        let proc = match Proc::spawn(&argv, &env, &r.log) {
            Ok(p) => p,
            Err(e) => {
                let program = argv.first().cloned().unwrap_or_default();
                give_up(
                    format!("cannot start managed server {} ({program:?}): {e}", r.label),
                    &mut first,
                );
                return;
            }
        };
        sh.stats.servers.update(&r.label, |s| s.pid = Some(proc.pid()));
        let ready = wait_ready(&sh.client, spec, port, &proc, &mut stop).await;
        let why = match ready {
            Err(NotReady::Stopped) => {
                stop_proc(&r, &sh, &proc).await;
                return;
            }
            Err(NotReady::Exited(status)) => {
                proc.signal_group(libc::SIGKILL);
                format!(
                    "managed server {} exited before it was ready ({}); its log {}, last lines:\n{}",
                    r.label,
                    process::describe(status),
                    r.log.display(),
                    process::log_tail(&r.log, TAIL_LINES)
                )
            }
            Err(NotReady::Deadline) => {
                proc.stop(STOP_GRACE).await;
                format!(
                    "managed server {} was not ready within {} s (GET http://127.0.0.1:{port}{} never answered 2xx); its log {}, last lines:\n{}",
                    r.label,
                    spec.start_timeout_ms as f64 / 1000.0,
                    spec.ready_path,
                    r.log.display(),
                    process::log_tail(&r.log, TAIL_LINES)
                )
            }
            Ok(()) => {
                let took = started.elapsed();
                let version = match &spec.version_path {
                    Some(path) => fetch_version(&sh.client, port, path, &spec.version_field).await,
                    None => None,
                };
                if let (Some(want), Some(have)) = (&spec.version, &version) {
                    if want != have {
                        stop_proc(&r, &sh, &proc).await;
                        give_up(
                            format!(
                                "managed server {} reports version {have:?}, but the sweep declares version {want:?}: its answers would not be the sweep's (job ids name the declared version)",
                                r.label
                            ),
                            &mut first,
                        );
                        return;
                    }
                }
                set_state(&r, &sh.stats, ServerState::Ready, Some(port));
                sh.stats.servers.update(&r.label, |s| {
                    s.ready_s = Some(took.as_secs_f64());
                    s.ready_since_ms = Some(unix_ms());
                    s.version = version.clone();
                });
                info!(server = %r.label, port, pid = proc.pid(), ready_s = took.as_secs_f64(), version = ?version, "managed server ready");
                for h in &g.pools {
                    if h.is_paused() {
                        h.answered(Instant::now(), false);
                    }
                }
                if let Some(tx) = first.take() {
                    let _ = tx.send(Ok(()));
                }
                let up = Instant::now();
                let status = tokio::select! {
                    s = proc.exited() => s,
                    _ = stopped(&mut stop) => {
                        stop_proc(&r, &sh, &proc).await;
                        return;
                    }
                };
                // What the server started (tensor-parallel workers) goes with it.
                proc.signal_group(libc::SIGKILL);
                let uptime = up.elapsed();
                let how = process::describe(status);
                // The pools pause before the state says the server is gone: a call that
                // failed on it waits for that state (see `Servers::call`) and must then
                // find its pool paused, so that its failure costs the job nothing.
                if !g.any_other_ready(&r) {
                    for h in &g.pools {
                        h.failed(Failure {
                            started: Instant::now(),
                            reason: OutageReason::Connection,
                            error: format!("managed server {} exited ({how})", r.label),
                            retry_after: None,
                            probe: false,
                        });
                    }
                }
                set_state(&r, &sh.stats, ServerState::Restarting, None);
                sh.stats.servers.update(&r.label, |s| s.last_exit = Some(how.clone()));
                if uptime >= Duration::from_millis(spec.stable_ms) {
                    in_row = 0;
                    delays = backoff();
                }
                warn!(server = %r.label, exit = %how, up_s = uptime.as_secs_f64(), "managed server exited: restarting it");
                format!(
                    "managed server {} exited ({how}) after {:.1} s up; its log {}, last lines:\n{}",
                    r.label,
                    uptime.as_secs_f64(),
                    r.log.display(),
                    process::log_tail(&r.log, TAIL_LINES)
                )
            }
        };
        if first.is_some() {
            // The first start failed: a command or model that does not work here is
            // the operator's to fix, not something a restart mends.
            give_up(why, &mut first);
            return;
        }
        set_state(&r, &sh.stats, ServerState::Restarting, None);
        in_row += 1;
        if in_row > spec.max_restarts {
            give_up(
                format!(
                    "managed server {} failed {in_row} times in a row (max_restarts = {}); the worker stops. The last time: {why}",
                    r.label, spec.max_restarts
                ),
                &mut first,
            );
            return;
        }
        let delay = delays.next().unwrap_or(MAX_RESTART_DELAY);
        sh.stats.servers.update(&r.label, |s| s.restarts += 1);
        info!(server = %r.label, in_row, delay_s = delay.as_secs_f64(), "restarting managed server");
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stopped(&mut stop) => break,
        }
    }
    set_state(&r, &sh.stats, ServerState::Stopped, None);
}

/// Resolves once the worker stops (the watch's guard is not held across an await).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Stop a running server (the worker stops) and record it.
async fn stop_proc(r: &Replica, sh: &Shared, proc: &Proc) {
    set_state(r, &sh.stats, ServerState::Stopping, None);
    info!(server = %r.label, pid = proc.pid(), "stopping managed server (SIGTERM to its process group)");
    let status = proc.stop(STOP_GRACE).await;
    let how = process::describe(status);
    sh.stats.servers.update(&r.label, |s| s.last_exit = Some(how.clone()));
    info!(server = %r.label, exit = %how, "managed server stopped");
    set_state(r, &sh.stats, ServerState::Stopped, None);
}

/// Poll the ready path until it answers 2xx, the process exits, the deadline passes or
/// the worker stops.
async fn wait_ready(
    client: &reqwest::Client,
    spec: &ServerSpec,
    port: u16,
    proc: &Proc,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), NotReady> {
    let url = format!("http://127.0.0.1:{port}{}", spec.ready_path);
    let deadline = Instant::now() + Duration::from_millis(spec.start_timeout_ms);
    let poll = async {
        loop {
            if let Ok(resp) = client.get(&url).send().await {
                if resp.status().is_success() {
                    return;
                }
            }
            tokio::time::sleep(READY_POLL).await;
        }
    };
    tokio::select! {
        _ = poll => {
            // Ready, unless it exited meanwhile (another process on the port?).
            match proc.exit_status() {
                Some(s) => Err(NotReady::Exited(s)),
                None => Ok(()),
            }
        }
        s = proc.exited() => Err(NotReady::Exited(s)),
        _ = tokio::time::sleep_until(deadline) => Err(NotReady::Deadline),
        _ = stopped(stop) => Err(NotReady::Stopped),
    }
}

/// The version a server reports: field `field` of the JSON at `path`, or None.
async fn fetch_version(
    client: &reqwest::Client,
    port: u16,
    path: &str,
    field: &str,
) -> Option<String> {
    let url = format!("http://127.0.0.1:{port}{path}");
    let v: serde_json::Value = match client.get(&url).send().await {
        Ok(resp) if resp.status().is_success() => {
            let what = "the server's version path";
            match super::http_guard::read_body(resp, VERSION_BODY_LIMIT, what).await {
                Ok(body) => serde_json::from_slice(&body).ok()?,
                Err(e) => {
                    warn!(url, error = %e.message, "cannot read the server's version");
                    return None;
                }
            }
        }
        Ok(resp) => {
            warn!(
                url,
                status = resp.status().as_u16(),
                "the server's version path did not answer 200"
            );
            return None;
        }
        Err(e) => {
            warn!(url, error = %e, "cannot ask the server its version");
            return None;
        }
    };
    match v.get(field)? {
        serde_json::Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// `backend = "server"`: calls go to the managed servers once they have started
/// ([`super::registry::Backends::set_servers`] puts [`serving`] in its place), through
/// the shared HTTP client; before that, none.
pub const KIND: super::BackendKind = super::BackendKind {
    name: "server",
    http: false,
    load: |l| Ok(Box::new(ServerBackend { http: OpenAi::on(l.http), servers: None })),
};

/// The `server` backend calling `servers`.
pub fn serving(http: &HttpClient, servers: Arc<Servers>) -> Box<dyn super::Backend> {
    Box::new(ServerBackend { http: OpenAi::on(http), servers: Some(servers) })
}

/// The `server` backend.
struct ServerBackend {
    http: OpenAi,
    servers: Option<Arc<Servers>>,
}

impl super::Backend for ServerBackend {
    fn call<'a>(
        &'a self,
        job: &'a Job,
    ) -> futures::future::BoxFuture<'a, Result<Completion, CallError>> {
        Box::pin(async move {
            match &self.servers {
                Some(s) => s.call(&self.http, job).await.map(|c| super::clamped(job, c)),
                None => Err(CallError::permanent(format!(
                    "this worker runs no managed server (pool {}); start a worker with the sweep that names it",
                    job.pool
                ))),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A loopback HTTP server answering every request with `body` (chunked, no length).
    async fn serve(body: Vec<u8>) -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let body = body.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = s.read(&mut buf).await;
                    let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                                transfer-encoding: chunked\r\nconnection: close\r\n\r\n";
                    let _ = s.write_all(head.as_bytes()).await;
                    for c in body.chunks(8192) {
                        let _ = s.write_all(format!("{:x}\r\n", c.len()).as_bytes()).await;
                        let _ = s.write_all(c).await;
                        if s.write_all(b"\r\n").await.is_err() {
                            return;
                        }
                    }
                    let _ = s.write_all(b"0\r\n\r\n").await;
                });
            }
        });
        port
    }

    /// A server killed while ready: its pools are paused before its state leaves
    /// `Ready`, never after. A call that failed on the dead server waits for that state
    /// and then reports its failure; found the other way round, the failure would begin
    /// the pause and cost its job a delivery (the CI flake of stop 57). A thread spins on
    /// both while the supervisor sees the exit, and must never see the state gone with
    /// the pool still running.
    #[test]
    fn a_crashed_server_pauses_its_pools_before_its_state_changes() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let spec = ServerSpec {
            endpoint: "server:custom:web:r:-:0".into(),
            name: "web".into(),
            kind: "python3".into(),
            command: ["python3", "-m", "http.server", "{port}", "--bind", "127.0.0.1"]
                .map(String::from)
                .to_vec(),
            model_path: "-".into(),
            served_name: "web".into(),
            gpus: 0,
            ready_path: "/".into(),
            version_path: None,
            version_field: "version".into(),
            version: None,
            start_timeout_ms: 30_000,
            max_restarts: 5,
            restart_backoff_ms: 60_000,
            stable_ms: 1000,
            gpu_sets: Vec::new(),
        };
        let mut plan = WorkerPlan::default();
        plan.add(
            halyard_proto::pool::PoolPlan::new("web", 1).with_model(WorkerModel::Server(spec)),
        )
        .unwrap();
        let stats = Arc::new(Stats::default());
        let health = PoolHealth::local("web", "w", stats.clone());
        let healths = HashMap::from([("web".to_string(), health.clone())]);
        rt.block_on(async {
            let servers = Servers::launch(&plan, dir.path(), &healths, stats.clone()).unwrap();
            servers.ready().await.unwrap();
            let replica = servers.groups.values().next().unwrap().replicas[0].clone();
            assert_eq!(replica.live().state, ServerState::Ready);
            assert!(!health.is_paused());
            let watcher = {
                let (replica, health) = (replica.clone(), health.clone());
                std::thread::spawn(move || {
                    let mut bad = 0u64;
                    loop {
                        let gone = replica.live().state != ServerState::Ready;
                        let paused = health.is_paused();
                        if gone && !paused {
                            bad += 1;
                        }
                        if gone && paused {
                            return bad;
                        }
                    }
                })
            };
            let pid = stats.servers.snapshot()[0].pid.unwrap();
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            let bad = tokio::task::spawn_blocking(move || watcher.join().unwrap()).await.unwrap();
            assert_eq!(bad, 0, "the state left Ready while the pool still ran");
            servers.stop().await;
        });
    }

    /// Issue 49: a server's version answer is read up to VERSION_BODY_LIMIT, never whole:
    /// a 64 MiB answer is refused (no version) after at most the limit was read.
    #[tokio::test]
    async fn a_version_answer_is_read_within_a_bound() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let port = serve(br#"{"version":"0.6.1"}"#.to_vec()).await;
        assert_eq!(
            fetch_version(&client, port, "/version", "version").await.as_deref(),
            Some("0.6.1")
        );
        let mut huge = br#"{"version":""#.to_vec();
        huge.resize(64 << 20, b'9');
        huge.extend_from_slice(br#""}"#);
        let port = serve(huge).await;
        assert_eq!(fetch_version(&client, port, "/version", "version").await, None);
    }
}

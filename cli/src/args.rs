//! What each subcommand accepts (clap), and how it becomes the options of its
//! `halyard_node` function.

use std::path::PathBuf;

use clap::Args;
use halyard_node::coordinator::CoordinatorOptions;
use halyard_node::status::show::StatusArgs;
use halyard_node::supervisor::RunOptions;
use halyard_node::worker::WorkerOptions;
use halyard_node::{Nats, NodeError};

use crate::nats_args::NatsAuthArgs;

#[derive(Args)]
pub struct ReportCmd {
    /// Run directories (each holding report.json).
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// Where to write leaderboard.md and leaderboard.html.
    #[arg(long, default_value = ".")]
    pub out: PathBuf,
}

#[derive(Args)]
pub struct ViewArgs {
    /// Run directories, or directories holding runs.
    #[arg(default_value = "runs")]
    pub dirs: Vec<PathBuf>,
    /// Address to listen on: loopback unless told otherwise (the view has no login;
    /// anyone who reaches the address reads the runs). Port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:8765")]
    pub addr: std::net::SocketAddr,
    /// Also list the live runs whose coordinators publish their status on this broker
    /// (runs on other machines), with their progress.
    #[arg(long, env = "HALYARD_NATS_URL")]
    pub nats: Option<String>,
    #[command(flatten)]
    pub nats_auth: NatsAuthArgs,
}

#[derive(Args)]
pub struct StatusCmd {
    /// Run name (or run directory / status.json without --nats); all runs if omitted.
    pub run: Option<String>,
    /// Read the status the coordinator publishes on this broker, with the live workers.
    #[arg(long, env = "HALYARD_NATS_URL")]
    pub nats: Option<String>,
    /// Output directory holding runs (without --nats).
    #[arg(long, default_value = "runs")]
    pub out: PathBuf,
    #[command(flatten)]
    pub nats_auth: NatsAuthArgs,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct RunArgs {
    /// The sweep file (TOML).
    pub sweep: PathBuf,
    /// Output directory; the run goes to <out>/<sweep name>/.
    #[arg(long, default_value = "runs")]
    pub out: PathBuf,
    /// Use this NATS broker instead of starting a private one.
    #[arg(long, env = "HALYARD_NATS_URL")]
    pub nats: Option<String>,
    #[command(flatten)]
    pub nats_auth: NatsAuthArgs,
    /// Start no local workers (remote `halyard worker`s do the work).
    #[arg(long)]
    pub no_workers: bool,
    /// Checkpoint directory of the local workers (default <out>/<name>/checkpoint).
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// Stop publishing paid calls once the run has spent this many USD (overrides
    /// `[run] max_cost`); run again with a higher limit to continue.
    #[arg(long)]
    pub max_cost: Option<f64>,
    /// Serve Prometheus metrics (coordinator and local workers) at ADDR/metrics, e.g.
    /// 127.0.0.1:9464. Off unless given.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// Let the local workers call http:// model URLs on hosts that are not loopback.
    #[arg(long)]
    pub allow_insecure_http: bool,
    /// Start without checking the API models' keys and endpoints first (see `halyard
    /// check`).
    #[arg(long)]
    pub no_check: bool,
}

#[derive(Args)]
pub struct CoordArgs {
    pub sweep: PathBuf,
    #[arg(long, default_value = "runs")]
    pub out: PathBuf,
    #[arg(long, env = "HALYARD_NATS_URL")]
    pub nats: String,
    #[command(flatten)]
    pub nats_auth: NatsAuthArgs,
    /// As for `run`: no new paid calls past this many USD.
    #[arg(long)]
    pub max_cost: Option<f64>,
    /// Prometheus metrics address (default 127.0.0.1:9464), or `off`.
    #[arg(long, value_name = "ADDR|off")]
    pub metrics: Option<String>,
}

#[derive(Args)]
pub struct WorkerArgs {
    #[arg(long, env = "HALYARD_NATS_URL")]
    pub nats: String,
    #[command(flatten)]
    pub nats_auth: NatsAuthArgs,
    /// Serve every pool of this sweep (with its concurrency and delivery settings).
    #[arg(long)]
    pub sweep: Option<PathBuf>,
    /// Serve the pools and models of this worker config file (TOML; see README).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Serve this pool with noop models only: NAME or NAME=CONCURRENCY (repeatable).
    #[arg(long = "pool")]
    pub pools: Vec<String>,
    /// Allow http:// model URLs on hosts that are not loopback (unencrypted).
    #[arg(long)]
    pub allow_insecure_http: bool,
    /// Start managed servers given as a sweep's `command` (code the sweep's author
    /// chose); without it only the presets (vllm, sglang, llama-server, tgi) start.
    #[arg(long)]
    pub allow_server_commands: bool,
    /// Quota of a pool, shared by all its workers:
    /// POOL:rpm=N,tpm=N[,burst=N][,tpm_counts=max_tokens|usage] (repeatable; with --sweep
    /// the quotas come from the sweep's rpm/tpm/burst keys).
    #[arg(long = "quota")]
    pub quotas: Vec<String>,
    /// Quota pools: seconds within which the other workers notice that this one died
    /// (heartbeats go every quarter of it). The membership bucket's TTL wins (set when
    /// it is made: `halyard broker init --quota-ttl`), with a warning when they differ.
    #[arg(long, default_value_t = 10.0)]
    pub quota_ttl: f64,
    /// Checkpoint directory (a redb store).
    #[arg(long, default_value = "halyard-worker")]
    pub state: PathBuf,
    /// Deliveries before a job becomes a dead letter (ignored with --sweep).
    #[arg(long, default_value_t = 5)]
    pub max_deliver: i64,
    /// Seconds to ack before redelivery (ignored with --sweep).
    #[arg(long, default_value_t = 30.0)]
    pub ack_wait: f64,
    /// Seconds in-flight calls get to finish after SIGTERM/SIGINT.
    #[arg(long, default_value_t = 10.0)]
    pub grace: f64,
    /// Worker name in results and logs.
    #[arg(long)]
    pub id: Option<String>,
    /// A GPU set of this worker: `N`, or `N,M,...` for a managed server on several GPUs;
    /// repeat for several sets (`--gpu 0,1 --gpu 2,3`: one server each). The worker
    /// serves the sweep's local (gguf) models placed on these GPUs (`gpu = N`; needs a
    /// build with the `cuda` feature) and its managed servers (`backend = "server"`)
    /// dealt to these sets.
    #[arg(long, value_name = "N[,N...]")]
    pub gpu: Vec<String>,
    /// With --sweep: serve only this pool of the sweep (repeatable), e.g. one Kubernetes
    /// Deployment per pool (`halyard deploy k8s`). With --gpu, the pools placed on those
    /// GPUs among these.
    #[arg(long = "only-pool", value_name = "POOL", requires = "sweep")]
    pub only_pools: Vec<String>,
    /// Prometheus metrics address (default 127.0.0.1:9465), or `off`.
    #[arg(long, value_name = "ADDR|off")]
    pub metrics: Option<String>,
}

#[derive(Args)]
pub struct GcArgs {
    /// Run directories (`<out>/<sweep name>`), store directories (a worker's
    /// `--state`), or output directories of runs; stores up to two levels down are
    /// taken.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
}

#[derive(Args)]
pub struct IdentityArgs {
    /// GGUF model files.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

#[derive(clap::Subcommand)]
pub enum BrokerCmd {
    /// Create every stream and bucket Halyard uses that is missing, and check the
    /// configuration of those that exist (refusing one shaped to leak or lose messages).
    /// Needs the coordinator role's credentials: workers may create nothing, and wait
    /// until this (or a coordinator) has run.
    Init(BrokerInitArgs),
}

#[derive(Args)]
pub struct BrokerInitArgs {
    /// The broker (a comma-separated list for a cluster).
    #[arg(long, env = "HALYARD_NATS_URL")]
    pub nats: String,
    #[command(flatten)]
    pub nats_auth: NatsAuthArgs,
    /// Quota pools: seconds within which the other workers notice that one died, for
    /// every worker of this broker (set when the members bucket is made; a bucket that
    /// exists keeps its own).
    #[arg(long, default_value_t = 10.0)]
    pub quota_ttl: f64,
}

impl BrokerInitArgs {
    pub fn nats(&self) -> Nats {
        Nats {
            url: self.nats.clone(),
            auth: self.nats_auth.auth(),
            replicas: self.nats_auth.replicas(),
        }
    }

    pub fn quota_ttl(&self) -> anyhow::Result<std::time::Duration> {
        if !(self.quota_ttl.is_finite() && (1.0..=3600.0).contains(&self.quota_ttl)) {
            anyhow::bail!("--quota-ttl {}: give seconds in 1..=3600", self.quota_ttl);
        }
        Ok(std::time::Duration::from_secs_f64(self.quota_ttl))
    }
}

#[derive(clap::Subcommand)]
pub enum DeployCmd {
    /// Write a kustomize overlay for a sweep: one worker Deployment and KEDA
    /// ScaledObject per pool, the coordinator Job with its PVC, the datasets' PVC (see
    /// docs/src/operations/kubernetes.md, "An overlay per sweep").
    K8s(K8sArgs),
    /// Write the broker's users for a sweep: nats-permissions.conf (nats-server
    /// configuration) and nats-auth-values.yaml (Helm values for the NATS chart), the
    /// coordinator and status users and one worker user per pool, as `halyard deploy k8s`
    /// writes them beside its overlay (see docs/src/operations/broker-credentials.md).
    NatsPermissions(NatsPermissionsArgs),
}

#[derive(Args)]
pub struct NatsPermissionsArgs {
    /// The sweep file (TOML); read and checked, its pools give the worker users.
    pub sweep: PathBuf,
    /// The directory to write the two files into (created if need be).
    #[arg(long)]
    pub out: PathBuf,
    /// Replace the files if they are there already.
    #[arg(long)]
    pub force: bool,
}

#[derive(Args)]
pub struct K8sArgs {
    /// The sweep file (TOML); read and checked, datasets included.
    pub sweep: PathBuf,
    /// The overlay's directory (created; must be empty unless --force).
    #[arg(long)]
    pub out: PathBuf,
    /// The kustomization with the namespace and Secrets, referred to from the overlay by
    /// a relative path.
    #[arg(long, default_value = "deploy/k8s/secrets")]
    pub secrets: PathBuf,
    /// Replace the files a previous `halyard deploy k8s` wrote in --out.
    #[arg(long)]
    pub force: bool,
    /// Image of the coordinator and the workers without a GPU.
    #[arg(long, default_value = "halyard:0.1.0")]
    pub image: String,
    /// Image of the workers of gguf models on a GPU (deploy/image/cuda.Dockerfile).
    #[arg(long, default_value = "halyard-cuda:0.1.0")]
    pub gpu_image: String,
    /// Image of the workers of managed servers (the server's image with halyard added).
    #[arg(long, default_value = "halyard-vllm:0.1.0")]
    pub server_image: String,
    /// Seconds an API call takes (L in the sizing formula: replicas and lagThreshold).
    #[arg(long, default_value_t = 4.0)]
    pub latency: f64,
    /// Prompt tokens of a call (with max_tokens, the tokens of a call against `tpm`).
    #[arg(long, default_value_t = 900)]
    pub prompt_tokens: u64,
    /// maxReplicaCount of a pool without a quota.
    #[arg(long, default_value_t = 20)]
    pub max_replicas: u32,
    /// maxReplicaCount of a GPU pool.
    #[arg(long, default_value_t = 4)]
    pub max_gpu_replicas: u32,
}

impl K8sArgs {
    pub fn options(self) -> halyard_node::deploy_k8s::K8sOptions {
        halyard_node::deploy_k8s::K8sOptions {
            sweep: self.sweep,
            out: self.out,
            secrets: self.secrets,
            force: self.force,
            image: self.image,
            gpu_image: self.gpu_image,
            server_image: self.server_image,
            latency_s: self.latency,
            prompt_tokens: self.prompt_tokens,
            max_replicas: self.max_replicas,
            max_gpu_replicas: self.max_gpu_replicas,
        }
    }
}

#[derive(clap::Subcommand)]
pub enum LabelsCmd {
    /// Attach human labels (JSONL) to a finished run and rewrite its report with the
    /// judges measured against them (see docs/src/guide/judging-the-judges.md).
    Import(LabelsImportArgs),
}

#[derive(Args)]
pub struct LabelsImportArgs {
    /// The run directory (`<out>/<sweep name>`, holding `state/` and report.json).
    pub run: PathBuf,
    /// The labels file: one JSON object a line (item, model, label, optional annotator,
    /// and `sentence` for HVI).
    pub file: PathBuf,
    /// The benchmark (index in the sweep) the labels belong to; needed when the sweep
    /// has several judged benchmarks.
    #[arg(long)]
    pub benchmark: Option<usize>,
    /// The run's sweep file, if not where report.json says it was.
    #[arg(long)]
    pub sweep: Option<PathBuf>,
}

#[derive(Args)]
pub struct RetryFailedArgs {
    /// The run directory (`<out>/<sweep name>`, holding `state/`).
    pub run: PathBuf,
    /// Only list the dead letters; change nothing.
    #[arg(long)]
    pub list: bool,
}

impl RunArgs {
    /// Everything is checked (the sweep and its datasets) before anything starts.
    pub fn options(self) -> Result<RunOptions, NodeError> {
        let auth = self.nats_auth.auth();
        Ok(RunOptions {
            sweep: halyard_node::load_sweep(&self.sweep, self.max_cost)?,
            out: self.out,
            nats: self.nats.map(|url| Nats { url, auth, replicas: self.nats_auth.replicas() }),
            no_workers: self.no_workers,
            checkpoint: self.checkpoint,
            metrics: self.metrics,
            allow_insecure_http: self.allow_insecure_http,
        })
    }
}

impl CoordArgs {
    pub fn options(self) -> Result<CoordinatorOptions, NodeError> {
        Ok(CoordinatorOptions {
            sweep: halyard_node::load_sweep(&self.sweep, self.max_cost)?,
            out: self.out,
            nats: Nats {
                url: self.nats,
                auth: self.nats_auth.auth(),
                replicas: self.nats_auth.replicas(),
            },
            metrics: self.metrics,
        })
    }
}

impl WorkerArgs {
    pub fn nats(&self) -> Nats {
        Nats {
            url: self.nats.clone(),
            auth: self.nats_auth.auth(),
            replicas: self.nats_auth.replicas(),
        }
    }

    pub fn options(&self) -> WorkerOptions {
        WorkerOptions {
            sweep: self.sweep.clone(),
            config: self.config.clone(),
            pools: self.pools.clone(),
            allow_insecure_http: self.allow_insecure_http,
            allow_server_commands: self.allow_server_commands,
            quotas: self.quotas.clone(),
            quota_ttl: self.quota_ttl,
            state: self.state.clone(),
            max_deliver: self.max_deliver,
            ack_wait: self.ack_wait,
            grace: self.grace,
            id: self.id.clone(),
            gpu: self.gpu.clone(),
            only_pools: self.only_pools.clone(),
        }
    }
}

impl StatusCmd {
    pub fn args(self) -> StatusArgs {
        StatusArgs {
            run: self.run,
            nats: self.nats,
            auth: self.nats_auth.auth(),
            out: self.out,
            json: self.json,
        }
    }
}

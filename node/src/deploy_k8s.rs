//! `halyard deploy k8s SWEEP --out DIR`: a kustomize overlay that runs one sweep on
//! Kubernetes (issue 34, item 6), instead of editing worker Deployments and KEDA triggers
//! by hand for each sweep's pools.
//!
//! What DIR holds (docs/src/operations/kubernetes.md, "An overlay per sweep"):
//!
//! - `kustomization.yaml`: namespace `halyard`; the sweep as the ConfigMap `halyard-sweep`
//!   (configMapGenerator of `sweep.toml`, a copy); the run's label `halyard.dev/run`. It
//!   holds no Namespace, Secret or PersistentVolumeClaim: `kubectl delete -k DIR` removes
//!   the run's workloads only, never the namespace (and with it NATS), the Secrets or the
//!   volumes (issue 46, item 8). Those come from `deploy/k8s/secrets` (`--secrets`,
//!   applied first) and `volumes/`;
//! - `coordinator.yaml`: the coordinator Job (disruptions do not count against its
//!   backoffLimit), its PodDisruptionBudget and metrics Service;
//! - `volumes/`: a kustomization of its own, applied once: the coordinator's state PVC,
//!   the PVC `halyard-datasets` the coordinator reads the datasets from (not a ConfigMap:
//!   1 MiB holds about 750 HypoTermQA items), and, when the sweep has local models,
//!   `halyard-models` (ReadWriteOnce, the cluster's default class);
//! - `datasets-loader.yaml`, `models-loader.yaml` (not part of the overlay): one-off pods
//!   that the operator fills the volumes through;
//! - `worker-<pool>.yaml` per pool: a Deployment running `halyard worker --sweep …
//!   --only-pool POOL` (no `replicas`: KEDA owns the count) and its KEDA ScaledObject on
//!   the pool's consumer, created paused at 0 replicas until the coordinator has created
//!   the consumers (KEDA up to 2.19 reads a missing consumer as the whole stream's lag).
//!
//! - `nats-auth-values.yaml`, `nats-permissions.conf` (not part of the overlay): the
//!   broker's users for this sweep, one worker user per pool
//!   (`halyard_broker::permissions`): Helm values for the NATS chart and the same block
//!   as nats-server configuration. Each pool's Deployment connects as its pool's user
//!   (`halyard-worker-<pool token>`, password from the key `worker-<pool token>-password`
//!   of the Secret `halyard-nats-credentials`), which reaches that pool's jobs, results,
//!   records and replies only (issue 49, items 3 and 7).
//!
//! Paths in the pods: the sweep is `/halyard/sweep/sweep.toml`, the datasets PVC is
//! mounted at `/halyard/datasets`, the models PVC at `/halyard/models`. A sweep next to
//! `datasets/` and `models/` (`../datasets/…`, `../models/…`, as examples/ are) runs
//! unchanged; any other dataset or model path is refused, naming its key.
//!
//! YAML is written as JSON (a subset of YAML) from `serde_json` values, each document
//! preceded by `#` comments that say why.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use halyard_broker::permissions::{worker_secret_key, worker_user};
use halyard_plan::sweep::{self, JobBatch, Sweep};
use halyard_proto::subjects::{pool_consumer, pool_token, JOBS_STREAM};
use serde_json::{json, Value};

use crate::NodeError;

/// Where the sweep, the datasets and the models are in every pod.
pub const SWEEP_DIR: &str = "/halyard/sweep";
pub const SWEEP_FILE: &str = "sweep.toml";
pub const DATASETS_DIR: &str = "/halyard/datasets";
pub const MODELS_DIR: &str = "/halyard/models";
/// The namespace of the shipped kit (deploy/k8s/secrets).
pub const NAMESPACE: &str = "halyard";
/// Seconds of backlog a worker's lagThreshold adds to the messages it holds
/// (docs/src/operations/sizing-and-scaling.md's worked example: 16 held + 8 s at 4/s).
pub const BACKLOG_S: f64 = 8.0;
/// The longest Kubernetes name made of a pool (`halyard-worker-<name>` stays within the
/// 63 characters of a label value).
pub const MAX_POOL_NAME: usize = 48;

/// What `halyard deploy k8s` is given.
#[derive(Clone, Debug)]
pub struct K8sOptions {
    pub sweep: PathBuf,
    pub out: PathBuf,
    /// The kustomization with the namespace and Secrets (deploy/k8s/secrets).
    pub secrets: PathBuf,
    /// Replace the files of an existing DIR.
    pub force: bool,
    pub image: String,
    pub gpu_image: String,
    pub server_image: String,
    /// Seconds an API call takes (L of the sizing formula).
    pub latency_s: f64,
    /// Prompt tokens of a call (the tokens of the sizing formula: prompt + max_tokens).
    pub prompt_tokens: u64,
    /// maxReplicaCount of a pool without a quota (no GPU).
    pub max_replicas: u32,
    /// maxReplicaCount of a GPU pool.
    pub max_gpu_replicas: u32,
}

/// What a pool's workers need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolKind {
    /// Calls an HTTP API (paid calls): no GPU, little CPU.
    Api,
    /// Local models on CPU, embeddings, replay, noop: no GPU.
    Cpu,
    /// gguf models on GPU 0 of the pod (`--gpu 0`).
    GpuGguf,
    /// A managed model server on this many GPUs (`--gpu 0,…,N-1`).
    Server(u32),
}

/// One pool of the sweep as deployed.
#[derive(Clone, Debug)]
pub struct PoolDeploy {
    pub pool: String,
    /// `halyard-worker-<name>`: Deployment and ScaledObject.
    pub object: String,
    pub kind: PoolKind,
    pub concurrency: usize,
    pub api_keys: BTreeSet<String>,
    /// A model of the pool runs a server command of the sweep's own (not a preset's):
    /// its workers need `--allow-server-commands` (a sweep is code, issue 49 item 10).
    pub server_commands: bool,
    pub max_replicas: u32,
    pub lag_threshold: u64,
    /// Why max_replicas and lag_threshold are what they are (a comment in the file).
    pub sizing: String,
}

/// Write the overlay; returns the files written (relative to DIR).
pub fn write(o: &K8sOptions) -> Result<Vec<String>, NodeError> {
    check_options(o)?;
    let s = sweep::load(&o.sweep)?;
    let text = std::fs::read_to_string(&o.sweep)
        .map_err(|e| NodeError::io(format!("cannot read {}", o.sweep.display()), e))?;
    check_paths(&o.sweep, &text)?;
    check_label(&s.name, &o.sweep)?;
    let pools = plan_pools(&s, o)?;
    let secrets_kust = o.secrets.join("kustomization.yaml");
    if !secrets_kust.is_file() {
        return Err(NodeError::Usage(format!(
            "--secrets {}: no kustomization.yaml there (give deploy/k8s/secrets of a Halyard checkout)",
            o.secrets.display()
        )));
    }
    let auth = halyard_broker::permissions::Authorization::for_pools(
        pools.iter().map(|p| p.pool.as_str()),
    )
    .map_err(|e| NodeError::Usage(format!("{}: {e}", o.sweep.display())))?;
    prepare_out(&o.out, o.force)?;
    let secrets_rel = relative(&o.out, &o.secrets)?;

    let local = has_local_files(&s);
    let coordinator_models = coordinator_reads_models(&text);
    let mut files: Vec<(String, String)> = Vec::new();
    files.push((SWEEP_FILE.into(), text));
    files.push(("coordinator.yaml".into(), coordinator(o, coordinator_models)));
    let mut scaling = Vec::new();
    for p in &pools {
        let (deployment, scaled) = worker(o, p, local && p.kind != PoolKind::Api);
        files.push((format!("{}.yaml", p.object), deployment));
        scaling.push((format!("{}.yaml", p.object), scaled));
    }
    let resources: Vec<String> =
        files.iter().map(|(f, _)| f.clone()).filter(|f| f.ends_with(".yaml")).collect();
    let scaling_files: Vec<String> = scaling.iter().map(|(f, _)| f.clone()).collect();
    files.push((
        "scaling/kustomization.yaml".into(),
        sub_kustomization(SCALING_NOTE, &scaling_files),
    ));
    for (f, body) in scaling {
        files.push((format!("scaling/{f}"), body));
    }
    files.push(("datasets-loader.yaml".into(), datasets_loader(o)));
    files.push((NATS_AUTH_VALUES.into(), auth.helm_values(GENERATOR)));
    files.push((NATS_PERMISSIONS.into(), auth.conf(GENERATOR)));
    let mut volumes = vec![
        ("coordinator-state.yaml", yaml(&[(STATE_PVC_NOTE, state_pvc())])),
        ("datasets.yaml", yaml(&[(DATASETS_PVC_NOTE, datasets_pvc())])),
    ];
    if local {
        volumes.push(("models.yaml", yaml(&[(MODELS_PVC_NOTE, models_pvc())])));
        files.push(("models-loader.yaml".into(), models_loader(o)));
    }
    let volume_files: Vec<String> = volumes.iter().map(|(f, _)| f.to_string()).collect();
    files.push((
        "volumes/kustomization.yaml".into(),
        sub_kustomization(VOLUMES_NOTE, &volume_files),
    ));
    for (f, body) in volumes {
        files.push((format!("volumes/{f}"), body));
    }
    files.push((
        "kustomization.yaml".into(),
        kustomization(&s, o, &resources, &pools, &secrets_rel, local),
    ));
    for sub in ["volumes", "scaling"] {
        std::fs::create_dir_all(o.out.join(sub)).map_err(|e| {
            NodeError::io(format!("--out {}: cannot create {sub}/", o.out.display()), e)
        })?;
    }
    let mut written = Vec::new();
    for (name, body) in files {
        let path = o.out.join(&name);
        std::fs::write(&path, body)
            .map_err(|e| NodeError::io(format!("cannot write {}", path.display()), e))?;
        written.push(name);
    }
    Ok(written)
}

fn check_options(o: &K8sOptions) -> Result<(), NodeError> {
    if !(o.latency_s.is_finite() && o.latency_s > 0.0 && o.latency_s <= 3600.0) {
        return Err(NodeError::Usage(format!(
            "--latency {}: give the seconds a call takes, in (0, 3600]",
            o.latency_s
        )));
    }
    for (flag, n) in
        [("--max-replicas", o.max_replicas), ("--max-gpu-replicas", o.max_gpu_replicas)]
    {
        if n == 0 {
            return Err(NodeError::Usage(format!("{flag} 0: give at least 1")));
        }
    }
    for (flag, image) in
        [("--image", &o.image), ("--gpu-image", &o.gpu_image), ("--server-image", &o.server_image)]
    {
        if image.is_empty() || image.chars().any(|c| c.is_whitespace()) {
            return Err(NodeError::Usage(format!("{flag} {image:?}: not an image reference")));
        }
    }
    Ok(())
}

/// The run's name is also the pods' label `halyard.dev/run`: a label value.
fn check_label(name: &str, file: &Path) -> Result<(), NodeError> {
    let ok = name.len() <= 63
        && name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.chars().last().is_some_and(|c| c.is_ascii_alphanumeric());
    if !ok {
        return Err(NodeError::Usage(format!(
            "{}: name: {name:?} is not a Kubernetes label value (at most 63 characters, starting and ending with a letter or digit), which the pods' label halyard.dev/run needs",
            file.display()
        )));
    }
    Ok(())
}

/// The sweep's file paths must resolve into the pods' volumes (see the module docs).
fn check_paths(file: &Path, text: &str) -> Result<(), NodeError> {
    let raw: toml::Table = toml::from_str(text)
        .map_err(|e| NodeError::Usage(format!("{}: not TOML: {e}", file.display())))?;
    let mut checks: Vec<(String, String, &str)> = Vec::new();
    for (i, m) in array(&raw, "model").iter().enumerate() {
        let backend = m.get("backend").and_then(|v| v.as_str()).unwrap_or("");
        let path = m.get("model_path").and_then(|v| v.as_str());
        // A managed server's model_path may also be a hub name (org/model): a path only
        // when it starts with '/' or '.'.
        let server_path = backend == "server" && path.is_some_and(|p| p.starts_with(['/', '.']));
        if matches!(backend, "gguf" | "embed") || server_path {
            if let Some(p) = path {
                checks.push((format!("model[{i}].model_path"), p.into(), MODELS_DIR));
            }
        }
    }
    for (i, b) in array(&raw, "benchmark").iter().enumerate() {
        if let Some(p) = b.get("dataset").and_then(|v| v.as_str()) {
            checks.push((format!("benchmark[{i}].dataset"), p.into(), DATASETS_DIR));
        }
        if let Some(p) = b
            .get("build")
            .and_then(|v| v.as_table())
            .and_then(|t| t.get("knowledge_base"))
            .and_then(|v| v.as_str())
        {
            checks.push((format!("benchmark[{i}].build.knowledge_base"), p.into(), DATASETS_DIR));
        }
    }
    for (key, p, dir) in checks {
        let at = in_pod(&p);
        if !at.starts_with(dir) || at == Path::new(dir) {
            let sub = Path::new(dir).file_name().unwrap_or_default().to_string_lossy().into_owned();
            return Err(NodeError::Usage(format!(
                "{}: {key}: {p:?} would be {} in the pods, outside {dir} (the PVC halyard-{sub}): \
                 give it relative to the sweep as ../{sub}/… (or as {dir}/…)",
                file.display(),
                at.display()
            )));
        }
    }
    Ok(())
}

fn array<'a>(t: &'a toml::Table, key: &str) -> Vec<&'a toml::Table> {
    t.get(key)
        .and_then(|v| v.as_array())
        .map(|a| a.iter().filter_map(|v| v.as_table()).collect())
        .unwrap_or_default()
}

/// Where a path of the sweep points in a pod (lexically, as the sweep's reader joins it).
fn in_pod(p: &str) -> PathBuf {
    let mut out = PathBuf::from(SWEEP_DIR);
    for c in Path::new(p).components() {
        match c {
            Component::RootDir => out = PathBuf::from("/"),
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// Whether the coordinator opens model files: a gguf model without `identity` (the
/// coordinator reads the file's identity) or an embedding model. Otherwise it does not
/// mount the models volume, which a ReadWriteOnce volume needs: every pod that mounts it
/// runs on the one node it is attached to.
fn coordinator_reads_models(text: &str) -> bool {
    let Ok(raw) = toml::from_str::<toml::Table>(text) else { return true };
    array(&raw, "model").iter().any(|m| match m.get("backend").and_then(|v| v.as_str()) {
        Some("gguf") => m.get("identity").is_none(),
        Some("embed") => true,
        _ => false,
    })
}

fn has_local_files(s: &Sweep) -> bool {
    s.models.iter().any(|m| m.local.is_some() || m.embed.is_some() || m.server.is_some())
}

/// Every pool of the sweep: its kind, Kubernetes name and scaling.
pub fn plan_pools(s: &Sweep, o: &K8sOptions) -> Result<Vec<PoolDeploy>, NodeError> {
    let f = s.file.display().to_string();
    let concurrency = s.pools();
    let local = s.local_pools();
    let mut out: Vec<PoolDeploy> = Vec::new();
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    for (pool, &conc) in &concurrency {
        let models: Vec<(usize, &sweep::Model)> =
            s.models.iter().enumerate().filter(|(_, m)| &m.spec.pool == pool).collect();
        let first = models[0].0;
        let mut kinds = BTreeSet::new();
        let mut keys = BTreeSet::new();
        let mut max_tokens: Option<u32> = None;
        let mut server_commands = false;
        for (i, m) in &models {
            let kind = if let Some(g) = &m.local {
                match g.gpu {
                    None => PoolKind::Cpu,
                    Some(0) => PoolKind::GpuGguf,
                    Some(n) => {
                        return Err(NodeError::Usage(format!(
                            "{f}: model[{i}].gpu: {n}: a pod sees the one GPU it is given as GPU 0; place the model with gpu = 0 (each pool gets pods of its own, each with its GPU)"
                        )))
                    }
                }
            } else if let Some(sv) = &m.server {
                server_commands |= !halyard_worker::backend::http_guard::is_preset(sv);
                if sv.gpus > 0 {
                    PoolKind::Server(sv.gpus)
                } else {
                    PoolKind::Cpu
                }
            } else if m.embed.is_some() || m.replay.is_some() || m.spec.model_ref.backend == "noop"
            {
                PoolKind::Cpu
            } else {
                if let Some(k) = &m.spec.api_key_env {
                    keys.insert(k.clone());
                }
                PoolKind::Api
            };
            kinds.insert(format!("{kind:?}"));
            max_tokens = max_tokens.max(m.spec.max_tokens);
            let _ = kind;
        }
        let kind = pool_kind(&kinds).ok_or_else(|| {
            NodeError::Usage(format!(
                "{f}: pool {pool:?} (model[{first}]): mixes models of different placements ({}); one Deployment serves a pool: give them pools of their own",
                kinds.into_iter().collect::<Vec<_>>().join(", ")
            ))
        })?;
        let object = object_name(pool).map_err(|why| {
            NodeError::Usage(format!("{f}: pool {pool:?} (model[{first}]): {why}"))
        })?;
        if let Some(other) = names.insert(object.clone(), pool.clone()) {
            return Err(NodeError::Usage(format!(
                "{f}: pools {other:?} and {pool:?} both become the Kubernetes name {object}: rename one"
            )));
        }
        let jobs_per_message = match s.run.job_batch {
            JobBatch::Fixed(n) => n.max(1),
            JobBatch::Auto => 1,
        };
        let lag_threshold = (((conc as f64) * (1.0 + BACKLOG_S / o.latency_s))
            / jobs_per_message as f64)
            .ceil()
            .max(1.0) as u64;
        let batch_note = match s.run.job_batch {
            JobBatch::Fixed(n) => format!("`job_batch = {n}`: up to {n} jobs per message, so divided by {n}"),
            JobBatch::Auto if local.contains(pool) => "`job_batch = \"auto\"`: a local pool's message holds about 10 ms of its work (one job for an LLM answering a few a second, up to 64 for a fast pool: lower it for such a pool)".into(),
            JobBatch::Auto => "`job_batch = \"auto\"`: one job per message for an API pool".into(),
        };
        let lag_note = format!(
            "lagThreshold {lag_threshold} MESSAGES (KEDA's lag: pending + delivered-unacked): a worker holds max_concurrency = {conc} and finishes {conc} / {L} s a second, so {conc} x (1 + {BACKLOG_S} s / {L} s) is its messages in hand plus {BACKLOG_S} s of backlog; {batch_note}.",
            L = o.latency_s
        );
        let (max_replicas, size_note) = match (&kind, s.quotas.get(pool)) {
            (PoolKind::Api, Some(q)) => {
                let tokens = o.prompt_tokens + u64::from(max_tokens.unwrap_or(0));
                let by_rpm = q.rpm.map(|r| f64::from(r) / 60.0);
                let by_tpm = q.tpm.map(|t| t as f64 / 60.0 / tokens.max(1) as f64);
                let rate = match (by_rpm, by_tpm) {
                    (Some(a), Some(b)) => a.min(b),
                    (Some(a), None) | (None, Some(a)) => a,
                    (None, None) => 0.0,
                };
                let n = ((rate * o.latency_s / conc as f64).ceil() as u32).max(1);
                let note = format!(
                    "maxReplicaCount {n}: the quota's formula (docs/src/operations/sizing-and-scaling.md): rate = min(rpm / 60{}, tpm / 60 / tokens per call{}) = {rate:.2} calls/s with {tokens} tokens a call ({} prompt, --prompt-tokens, + max_tokens {}); workers = ceil(rate x L / max_concurrency) = ceil({rate:.2} x {L} / {conc}) = {n}; more only wait on the shared quota.",
                    by_rpm.map(|r| format!(" = {r:.2}")).unwrap_or_else(|| ": none".into()),
                    by_tpm.map(|r| format!(" = {r:.2}")).unwrap_or_else(|| ": none".into()),
                    o.prompt_tokens,
                    max_tokens.unwrap_or(0),
                    L = o.latency_s,
                );
                (n, note)
            }
            (PoolKind::Api | PoolKind::Cpu, _) => (
                o.max_replicas,
                format!(
                    "maxReplicaCount {}: --max-replicas (the pool has no quota to size it by).",
                    o.max_replicas
                ),
            ),
            (PoolKind::GpuGguf | PoolKind::Server(_), _) => (
                o.max_gpu_replicas,
                format!(
                    "maxReplicaCount {}: --max-gpu-replicas (GPUs are what bounds it).",
                    o.max_gpu_replicas
                ),
            ),
        };
        out.push(PoolDeploy {
            pool: pool.clone(),
            object,
            kind,
            concurrency: conc,
            api_keys: keys,
            server_commands,
            max_replicas,
            lag_threshold,
            sizing: format!("{size_note} {lag_note}"),
        });
    }
    if out.is_empty() {
        return Err(NodeError::Usage(format!("{f}: the sweep has no model, so no pool to deploy")));
    }
    Ok(out)
}

/// One kind for a pool; API and CPU models share a worker without a GPU.
fn pool_kind(kinds: &BTreeSet<String>) -> Option<PoolKind> {
    let has = |k: &str| kinds.contains(k);
    match kinds.len() {
        1 if has("Api") => Some(PoolKind::Api),
        1 if has("Cpu") => Some(PoolKind::Cpu),
        1 if has("GpuGguf") => Some(PoolKind::GpuGguf),
        1 => kinds
            .iter()
            .next()
            .and_then(|k| k.strip_prefix("Server(")?.strip_suffix(')')?.parse().ok())
            .map(PoolKind::Server),
        2 if has("Api") && has("Cpu") => Some(PoolKind::Api),
        _ => None,
    }
}

/// `halyard-worker-<name>`: the pool's consumer token, lower case, `_` as `-`.
pub fn object_name(pool: &str) -> Result<String, String> {
    let token = pool_token(pool).to_ascii_lowercase().replace('_', "-");
    let name = token.trim_matches('-').to_string();
    let valid = !name.is_empty()
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !valid {
        return Err(format!("{name:?} is not a Kubernetes name (letters, digits, '-')"));
    }
    if name.len() > MAX_POOL_NAME {
        return Err(format!(
            "its Kubernetes name {name:?} has {} characters, more than {MAX_POOL_NAME} (halyard-worker-<name> is a label value, at most 63): give the pool a shorter name",
            name.len()
        ));
    }
    Ok(format!("halyard-worker-{name}"))
}

fn prepare_out(out: &Path, force: bool) -> Result<(), NodeError> {
    if out.exists() {
        let entries: Vec<PathBuf> = std::fs::read_dir(out)
            .map_err(|e| NodeError::io(format!("--out {}: cannot read it", out.display()), e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        if !entries.is_empty() {
            if !force {
                return Err(NodeError::Usage(format!(
                    "--out {}: not empty (give --force to replace what `halyard deploy k8s` wrote there)",
                    out.display()
                )));
            }
            let ours = out.join("kustomization.yaml");
            let text = std::fs::read_to_string(&ours).unwrap_or_default();
            if !text.starts_with(HEADER_MARK) {
                return Err(NodeError::Usage(format!(
                    "--out {} --force: its kustomization.yaml is not one `halyard deploy k8s` wrote; refusing to replace it",
                    out.display()
                )));
            }
            let sub: Vec<PathBuf> = ["volumes", "scaling"]
                .iter()
                .filter_map(|d| std::fs::read_dir(out.join(d)).ok())
                .flat_map(|d| d.filter_map(|e| e.ok().map(|e| e.path())))
                .collect();
            for p in entries.into_iter().chain(sub) {
                let name = p.file_name().unwrap_or_default().to_string_lossy().into_owned();
                if p.is_file() && (name.ends_with(".yaml") || name == SWEEP_FILE) {
                    std::fs::remove_file(&p)
                        .map_err(|e| NodeError::io(format!("cannot remove {}", p.display()), e))?;
                }
            }
        }
    }
    std::fs::create_dir_all(out)
        .map_err(|e| NodeError::io(format!("--out {}: cannot create it", out.display()), e))
}

/// `to` relative to the directory `from` (both must exist).
fn relative(from: &Path, to: &Path) -> Result<String, NodeError> {
    let canon = |p: &Path| {
        p.canonicalize().map_err(|e| NodeError::io(format!("cannot resolve {}", p.display()), e))
    };
    let (from, to) = (canon(from)?, canon(to)?);
    let a: Vec<_> = from.components().collect();
    let b: Vec<_> = to.components().collect();
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut rel = PathBuf::new();
    for _ in common..a.len() {
        rel.push("..");
    }
    for c in &b[common..] {
        rel.push(c.as_os_str());
    }
    Ok(rel.to_string_lossy().into_owned())
}

// --- the objects ------------------------------------------------------------------------

const HEADER_MARK: &str = "# Written by `halyard deploy k8s`";

/// Documents as YAML: each its comment, then the object as JSON (valid YAML).
fn yaml(docs: &[(&str, Value)]) -> String {
    let mut out = String::new();
    for (i, (note, v)) in docs.iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        for line in wrap(note) {
            out.push_str("# ");
            out.push_str(&line);
            out.push('\n');
        }
        out.push_str(&serde_json::to_string_pretty(v).expect("a JSON value"));
        out.push('\n');
    }
    out
}

/// Comment text in lines of at most ~88 characters (paragraphs kept).
fn wrap(text: &str) -> Vec<String> {
    let mut lines = Vec::new();
    for para in text.lines() {
        let mut line = String::new();
        for word in para.split_whitespace() {
            if !line.is_empty() && line.len() + 1 + word.len() > 88 {
                lines.push(std::mem::take(&mut line));
            }
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
        lines.push(line);
    }
    lines
}

fn labels(component: &str) -> Value {
    json!({ "app.kubernetes.io/name": "halyard", "app.kubernetes.io/component": component })
}

fn meta(name: &str, component: &str) -> Value {
    json!({ "name": name, "namespace": NAMESPACE, "labels": labels(component) })
}

fn pod_security() -> Value {
    json!({
        "runAsNonRoot": true, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
        "seccompProfile": { "type": "RuntimeDefault" }
    })
}

fn container_security() -> Value {
    json!({
        "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
        "capabilities": { "drop": ["ALL"] }
    })
}

/// Liveness is the process (/healthz), readiness the broker, models and consumers
/// (/readyz); the startup probe covers the wait for the broker's first answer.
fn probes(c: &mut Value, startup_failures: u32) {
    c["startupProbe"] = json!({ "httpGet": { "path": "/healthz", "port": "metrics" }, "periodSeconds": 5, "failureThreshold": startup_failures });
    c["livenessProbe"] = json!({ "httpGet": { "path": "/healthz", "port": "metrics" }, "periodSeconds": 10, "failureThreshold": 6 });
    c["readinessProbe"] =
        json!({ "httpGet": { "path": "/readyz", "port": "metrics" }, "periodSeconds": 5 });
}

/// Where the NATS nodes' CA certificate is mounted: TLS by default (the nodes' certificate,
/// from cert-manager or deploy/tls/make-certs, in the Secret `halyard-nats-tls`).
const NATS_CA_DIR: &str = "/etc/halyard/nats-ca";

/// No HALYARD_NATS_REPLICAS: the replicas come from what JetStream can place (Halyard's
/// memory probe stream; deploy/k8s/nats-values.yaml gives the memory store it needs), as
/// in the compose cluster that the fault test runs with these NATS settings.
fn nats_env(user: &str, key: &str) -> Vec<Value> {
    vec![
        json!({ "name": "HALYARD_NATS_URL", "value": "tls://nats.halyard.svc:4222" }),
        json!({ "name": "HALYARD_NATS_CA", "value": format!("{NATS_CA_DIR}/ca.crt") }),
        json!({ "name": "HALYARD_NATS_USER", "value": user }),
        json!({ "name": "HALYARD_NATS_PASSWORD", "valueFrom": { "secretKeyRef": { "name": "halyard-nats-credentials", "key": key } } }),
    ]
}

fn nats_ca_mount() -> Value {
    json!({ "name": "nats-ca", "mountPath": NATS_CA_DIR, "readOnly": true })
}

/// Only the CA certificate of the nodes' Secret: no key reaches a Halyard pod.
fn nats_ca_volume() -> Value {
    json!({ "name": "nats-ca", "secret": { "secretName": "halyard-nats-tls", "items": [{ "key": "ca.crt", "path": "ca.crt" }] } })
}

fn sweep_mount() -> Value {
    json!({ "name": "sweep", "mountPath": format!("{SWEEP_DIR}/{SWEEP_FILE}"), "subPath": SWEEP_FILE, "readOnly": true })
}

fn sweep_volume() -> Value {
    json!({ "name": "sweep", "configMap": { "name": "halyard-sweep" } })
}

fn models_volume() -> Value {
    json!({ "name": "models", "persistentVolumeClaim": { "claimName": "halyard-models", "readOnly": true } })
}

fn models_mount() -> Value {
    json!({ "name": "models", "mountPath": MODELS_DIR, "readOnly": true })
}

/// The datasets loader's image (by tag: pulled `Always`, see pull_policy).
const BUSYBOX: &str = "busybox:1.37.0";

/// A managed server's HOME and caches, under the writable volume mounted at CACHE_DIR.
pub const CACHE_DIR: &str = "/var/cache/halyard";
pub const SERVER_CACHE_ENV: [(&str, &str); 8] = [
    ("HOME", "home"),
    ("XDG_CACHE_HOME", "xdg"),
    ("HF_HOME", "huggingface"),
    ("TRITON_CACHE_DIR", "triton"),
    ("VLLM_CACHE_ROOT", "vllm"),
    ("TORCHINDUCTOR_CACHE_DIR", "torchinductor"),
    ("FLASHINFER_WORKSPACE_BASE", "flashinfer"),
    ("OUTLINES_CACHE_DIR", "outlines"),
];

/// A tag can be pushed again with other contents: `Always` asks the registry for the
/// tag's current digest on each start (and pulls only what changed); an image named by
/// digest cannot change, so `IfNotPresent` is exact.
fn pull_policy(image: &str) -> &'static str {
    if image.contains("@sha256:") {
        "IfNotPresent"
    } else {
        "Always"
    }
}

const STATE_PVC_NOTE: &str = "The coordinator's state and report (--out /var/lib/halyard/runs): a new pod resumes the run from it; deleting it starts over. ReadWriteOnce: after a node loss it may stay attached to the lost node until Kubernetes detaches it (docs/src/operations/recovering.md).";

/// A ReadWriteOnce claim in the cluster's default storage class.
fn rwo_pvc(name: &str, component: &str, size: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": meta(name, component),
        "spec": { "accessModes": ["ReadWriteOnce"], "resources": { "requests": { "storage": size } } }
    })
}

fn state_pvc() -> Value {
    rwo_pvc("halyard-coordinator-state", "coordinator", "5Gi")
}

const VOLUMES_NOTE: &str = "The run's volumes, applied once before the overlay (`kubectl apply -k volumes`) and NOT part of it: `kubectl delete -k` of the overlay leaves them (the run state, the datasets, the weights). Delete them on purpose: `kubectl delete -k volumes`.";

const SCALING_NOTE: &str = "KEDA's ScaledObjects of the pools, applied once the coordinator is ready (it has created every pool's consumer): KEDA up to 2.19 reads a consumer that does not exist yet as the whole stream's lag and scales the pool to its maximum; 2.20 and later report an error. `kubectl -n halyard wait --for=condition=Ready pod -l app.kubernetes.io/component=coordinator --timeout=10m && kubectl apply -k scaling`.";

fn sub_kustomization(note: &str, files: &[String]) -> String {
    let k = json!({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": NAMESPACE,
        "resources": files,
    });
    let mut out = String::new();
    for line in wrap(note) {
        out.push_str("# ");
        out.push_str(&line);
        out.push('\n');
    }
    out.push_str(&serde_json::to_string_pretty(&k).expect("a JSON value"));
    out.push('\n');
    out
}

const DATASETS_PVC_NOTE: &str = "The datasets the coordinator reads (mounted at /halyard/datasets; the sweep's ../datasets/… paths land there). A volume, not a ConfigMap: a ConfigMap holds at most 1 MiB, about 750 HypoTermQA items. Fill it once with datasets-loader.yaml (see kustomization.yaml).";

fn datasets_pvc() -> Value {
    rwo_pvc("halyard-datasets", "datasets", "1Gi")
}

const MODELS_PVC_NOTE: &str = "The local model files (gguf files, embedding folders, a managed server's weights), mounted read-only at /halyard/models by the workers of local pools (and by the coordinator only when a gguf model has no `identity`). ReadWriteOnce in the cluster's default storage class, which every managed cluster provisions (block storage): every pod that mounts it runs on the node it is attached to, so the GPU pools scale within that node's GPUs. To spread them over nodes, give a class that offers ReadOnlyMany or ReadWriteMany (storageClassName, e.g. a file store; docs/src/operations/kubernetes.md, \"The models volume\"). Filled once through models-loader.yaml; no Halyard process downloads weights.";

fn models_pvc() -> Value {
    rwo_pvc("halyard-models", "models", "64Gi")
}

/// The one-off pod that fills halyard-models: the server's image (it has the
/// `huggingface-cli` of huggingface_hub), as our user, the Hugging Face cache on an
/// emptyDir; the operator runs the download in it (kustomization.yaml, step 2).
fn models_loader(o: &K8sOptions) -> String {
    let mut env: Vec<Value> = SERVER_CACHE_ENV
        .iter()
        .map(|(k, v)| json!({ "name": k, "value": format!("{CACHE_DIR}/{v}") }))
        .collect();
    env.push(json!({ "name": "HF_HUB_DISABLE_TELEMETRY", "value": "1" }));
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": meta("halyard-models-loader", "models-loader"),
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "securityContext": pod_security(),
            "containers": [{
                "name": "loader",
                "image": o.server_image,
                "imagePullPolicy": pull_policy(&o.server_image),
                "command": ["sleep", "86400"],
                "env": env,
                "resources": { "requests": { "cpu": "1", "memory": "2Gi" }, "limits": { "memory": "4Gi" } },
                "securityContext": container_security(),
                "volumeMounts": [
                    { "name": "models", "mountPath": MODELS_DIR },
                    { "name": "cache", "mountPath": CACHE_DIR },
                    { "name": "tmp", "mountPath": "/tmp" },
                ],
            }],
            "volumes": [
                { "name": "models", "persistentVolumeClaim": { "claimName": "halyard-models" } },
                { "name": "cache", "emptyDir": {} },
                { "name": "tmp", "emptyDir": {} },
            ],
        }
    });
    yaml(&[(
        "NOT part of the overlay: a one-off pod to fill the PVC halyard-models (volumes/) before the GPU pools start: `kubectl cp` the files in, or download them in it at the sweep's revision, e.g. `kubectl -n halyard exec halyard-models-loader -- huggingface-cli download ORG/MODEL --revision REV --local-dir /halyard/models/DIR` (the Hugging Face cache is its emptyDir; a gated model needs HF_TOKEN: `kubectl exec` with `env HF_TOKEN=…`). Then delete the pod.",
        pod,
    )])
}

fn coordinator(o: &K8sOptions, local: bool) -> String {
    let mut mounts = vec![
        json!({ "name": "state", "mountPath": "/var/lib/halyard" }),
        sweep_mount(),
        json!({ "name": "datasets", "mountPath": DATASETS_DIR, "readOnly": true }),
        json!({ "name": "tmp", "mountPath": "/tmp" }),
        nats_ca_mount(),
    ];
    let mut volumes = vec![
        json!({ "name": "state", "persistentVolumeClaim": { "claimName": "halyard-coordinator-state" } }),
        sweep_volume(),
        json!({ "name": "datasets", "persistentVolumeClaim": { "claimName": "halyard-datasets", "readOnly": true } }),
        json!({ "name": "tmp", "emptyDir": {} }),
        nats_ca_volume(),
    ];
    if local {
        mounts.push(models_mount());
        volumes.push(models_volume());
    }
    let mut env = nats_env("halyard-coordinator", "coordinator-password");
    env.push(json!({ "name": "HALYARD_LOG", "value": "info,fjall=warn,lsm_tree=warn,sled=warn,async_nats=warn" }));
    let mut c = json!({
        "name": "coordinator",
        "image": o.image,
        "imagePullPolicy": pull_policy(&o.image),
        "args": ["coordinator", format!("{SWEEP_DIR}/{SWEEP_FILE}"), "--out", "/var/lib/halyard/runs", "--metrics", "0.0.0.0:9464"],
        "env": env,
        "ports": [{ "name": "metrics", "containerPort": 9464 }],
        "resources": { "requests": { "cpu": "500m", "memory": "512Mi" }, "limits": { "memory": "2Gi" } },
        "securityContext": container_security(),
        "volumeMounts": mounts,
    });
    probes(&mut c, 24);
    let job = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": meta("halyard-coordinator", "coordinator"),
        "spec": {
            "backoffLimit": 20,
            "podFailurePolicy": { "rules": [
                { "action": "FailJob", "onExitCodes": { "containerName": "coordinator", "operator": "In", "values": [3, 4] } },
                // A drain, preemption or eviction (the pod's condition DisruptionTarget):
                // a new pod resumes the run; not a failure of the run.
                { "action": "Ignore", "onPodConditions": [{ "type": "DisruptionTarget", "status": "True" }] }
            ] },
            "template": {
                "metadata": {
                    "labels": labels("coordinator"),
                    "annotations": {
                        "prometheus.io/scrape": "true", "prometheus.io/port": "9464",
                        "cluster-autoscaler.kubernetes.io/safe-to-evict": "false"
                    }
                },
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": false,
                    "terminationGracePeriodSeconds": 30,
                    "securityContext": pod_security(),
                    "containers": [c],
                    "volumes": volumes,
                }
            }
        }
    });
    let svc = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": meta("halyard-coordinator", "coordinator"),
        "spec": {
            "selector": labels("coordinator"),
            "ports": [{ "name": "metrics", "port": 9464, "targetPort": "metrics" }]
        }
    });
    let pdb = json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": meta("halyard-coordinator", "coordinator"),
        "spec": { "maxUnavailable": 0, "selector": { "matchLabels": labels("coordinator") } }
    });
    yaml(&[
        ("The coordinator: a Job (exit 0 when the run completes). Exit 4 (dead letters: `halyard retry-failed`, then the Job again) and 3 (cost limit) end it at once; a disruption (drain, preemption, eviction: the pod condition DisruptionTarget) is ignored, not counted against backoffLimit, and the next pod resumes the run from the state PVC (volumes/). A Job's pod template cannot change: for another sweep, or to resume after a node loss, `kubectl -n halyard delete job halyard-coordinator` and apply again (the state PVC stays; docs/src/operations/recovering.md, \"A node lost under the coordinator\").", job),
        ("No voluntary eviction of the coordinator mid-run (kubectl drain waits, the cluster autoscaler leaves its node): a drain would stop the run until a new pod has resumed it. Delete the Job, or this budget, to drain its node on purpose.", pdb),
        ("The coordinator's metrics (9464), for overlays/monitoring.", svc),
    ])
}

/// The pool's Deployment, and its ScaledObject (for scaling/).
fn worker(o: &K8sOptions, p: &PoolDeploy, local: bool) -> (String, String) {
    let gpus = match p.kind {
        PoolKind::GpuGguf => 1,
        PoolKind::Server(n) => n,
        PoolKind::Api | PoolKind::Cpu => 0,
    };
    let mut args: Vec<String> = vec![
        "worker".into(),
        "--sweep".into(),
        format!("{SWEEP_DIR}/{SWEEP_FILE}"),
        "--only-pool".into(),
        p.pool.clone(),
    ];
    if gpus > 0 {
        let set: Vec<String> = (0..gpus).map(|g| g.to_string()).collect();
        args.extend(["--gpu".into(), set.join(",")]);
    }
    if p.server_commands {
        // The sweep's own server command: a worker runs it only when told to.
        args.push("--allow-server-commands".into());
    }
    args.extend(
        ["--state", "/var/lib/halyard/checkpoint", "--metrics", "0.0.0.0:9465", "--grace", "30"]
            .map(String::from),
    );
    // The pool's own broker user (issue 49): its jobs, results, records and replies only.
    let mut env = nats_env(&worker_user(&p.pool), &worker_secret_key(&p.pool));
    for k in &p.api_keys {
        env.push(json!({ "name": k, "valueFrom": { "secretKeyRef": { "name": "halyard-api-keys", "key": k } } }));
    }
    if gpus > 0 {
        env.push(json!({ "name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility" }));
    }
    env.push(json!({ "name": "HALYARD_LOG", "value": "info,fjall=warn,lsm_tree=warn,sled=warn,async_nats=warn" }));
    let mut mounts = vec![
        json!({ "name": "checkpoint", "mountPath": "/var/lib/halyard" }),
        sweep_mount(),
        json!({ "name": "tmp", "mountPath": "/tmp" }),
        nats_ca_mount(),
    ];
    let mut volumes = vec![
        json!({ "name": "checkpoint", "emptyDir": { "sizeLimit": "2Gi" } }),
        sweep_volume(),
        json!({ "name": "tmp", "emptyDir": {} }),
        nats_ca_volume(),
    ];
    if local {
        mounts.push(models_mount());
        volumes.push(models_volume());
    }
    let (image, resources, grace) = match p.kind {
        PoolKind::Api => (
            &o.image,
            json!({ "requests": { "cpu": "250m", "memory": "256Mi" }, "limits": { "memory": "1Gi" } }),
            45,
        ),
        PoolKind::Cpu => (
            &o.image,
            json!({ "requests": { "cpu": "2", "memory": "2Gi" }, "limits": { "memory": "4Gi" } }),
            45,
        ),
        PoolKind::GpuGguf => (
            &o.gpu_image,
            json!({ "requests": { "cpu": "2", "memory": "4Gi", "nvidia.com/gpu": 1 }, "limits": { "memory": "8Gi", "nvidia.com/gpu": 1 } }),
            45,
        ),
        PoolKind::Server(n) => (
            &o.server_image,
            json!({ "requests": { "cpu": "8", "memory": "32Gi", "nvidia.com/gpu": n }, "limits": { "memory": "64Gi", "nvidia.com/gpu": n } }),
            90,
        ),
    };
    if let PoolKind::Server(_) = p.kind {
        // The server's image (deploy/image/vllm.Dockerfile) runs as our user with HOME and
        // every cache under CACHE_DIR; the same variables here, so that another image of
        // the server runs the same way, and CACHE_DIR a writable volume (the root is
        // read-only): Hugging Face, Triton, vLLM, torch.compile, XDG, FlashInfer.
        for (k, v) in SERVER_CACHE_ENV {
            env.push(json!({ "name": k, "value": format!("{CACHE_DIR}/{v}") }));
        }
        mounts.push(json!({ "name": "cache", "mountPath": CACHE_DIR }));
        mounts.push(json!({ "name": "shm", "mountPath": "/dev/shm" }));
        volumes.push(json!({ "name": "cache", "emptyDir": { "sizeLimit": "32Gi" } }));
        volumes
            .push(json!({ "name": "shm", "emptyDir": { "medium": "Memory", "sizeLimit": "8Gi" } }));
    }
    let component = p.object.trim_start_matches("halyard-").to_string();
    let mut c = json!({
        "name": "worker",
        "image": image,
        "imagePullPolicy": pull_policy(image),
        "args": args,
        "env": env,
        "ports": [{ "name": "metrics", "containerPort": 9465 }],
        "resources": resources,
        "securityContext": container_security(),
        "volumeMounts": mounts,
    });
    if let PoolKind::Server(_) = p.kind {
        // The server images' entrypoint is `halyard worker` (deploy/image/vllm.Dockerfile);
        // the command is given here, so the args read the same for every image.
        c["command"] = json!(["/usr/local/bin/halyard"]);
    }
    probes(&mut c, if gpus > 0 { 60 } else { 24 });
    let mut pod_labels = labels(&component);
    pod_labels["halyard.dev/role"] = json!("worker");
    let mut spec = json!({
        "terminationGracePeriodSeconds": grace,
        "automountServiceAccountToken": false,
        "securityContext": pod_security(),
        "containers": [c],
        "volumes": volumes,
    });
    if gpus > 0 {
        // No nodeSelector: the request for nvidia.com/gpu is what places the pod on a node
        // whose device plugin offers GPUs (a label such as nvidia.com/gpu.present comes
        // from GPU Feature Discovery, which a cluster with the device plugin alone lacks).
        spec["tolerations"] =
            json!([{ "key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule" }]);
    }
    // No `replicas`: KEDA owns the count (a `replicas` here would reset it on every apply,
    // starting a pod, a GPU pod, each time).
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": meta(&p.object, &component),
        "spec": {
            "selector": { "matchLabels": labels(&component) },
            "strategy": { "type": "RollingUpdate", "rollingUpdate": { "maxSurge": "25%", "maxUnavailable": 0 } },
            "template": {
                "metadata": {
                    "labels": pod_labels,
                    "annotations": { "prometheus.io/scrape": "true", "prometheus.io/port": "9465" }
                },
                "spec": spec,
            }
        }
    });
    let scaled = json!({
        "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
        "metadata": meta(&p.object, &component),
        "spec": {
            "scaleTargetRef": { "apiVersion": "apps/v1", "kind": "Deployment", "name": p.object },
            "minReplicaCount": 0,
            "maxReplicaCount": p.max_replicas,
            "pollingInterval": 15,
            "cooldownPeriod": if gpus > 0 { 600 } else { 300 },
            // The monitoring endpoint unreachable 3 polls in a row: one worker, not zero
            // (the pool keeps going) and not the maximum.
            "fallback": { "failureThreshold": 3, "replicas": 1 },
            "triggers": [{
                "type": "nats-jetstream",
                "metadata": {
                    "natsServerMonitoringEndpoint": "nats-headless.halyard.svc.cluster.local:8222",
                    "account": "$G",
                    "stream": JOBS_STREAM,
                    "consumer": pool_consumer(&p.pool),
                    "lagThreshold": p.lag_threshold.to_string(),
                    "activationLagThreshold": "0",
                    "useHttps": "false",
                }
            }]
        }
    });
    let what = match p.kind {
        PoolKind::Api => "calls an HTTP API: no GPU".to_string(),
        PoolKind::Cpu => "local models on CPU (or embeddings, replay, noop): no GPU".to_string(),
        PoolKind::GpuGguf => format!("gguf models on one GPU (`--gpu 0`: the device plugin's one GPU is device 0 in the pod), image {} (deploy/image/cuda.Dockerfile)", o.gpu_image),
        PoolKind::Server(n) => format!("a managed model server on {n} GPU(s) (`--gpu {}`), image {} (the server's image with halyard added)", (0..n).map(|g| g.to_string()).collect::<Vec<_>>().join(","), o.server_image),
    };
    (
        yaml(&[(
            &format!("Workers of pool {:?} alone (`--only-pool`): {what}. Liveness /healthz (the process), readiness /readyz (broker, models, consumer). SIGTERM: calls in flight get --grace 30 s. No `replicas`: the first apply makes one pod, then KEDA (scaling/) owns the count.", p.pool),
            deployment,
        )]),
        yaml(&[(
            &format!("KEDA scales {} on the consumer {} of stream {JOBS_STREAM}, which the coordinator creates when it plans the pool. In scaling/, applied only once the coordinator is ready (../kustomization.yaml, step 4): KEDA up to 2.19 reads a missing consumer as the whole stream's lag and scales to the maximum. {}", p.object, pool_consumer(&p.pool), p.sizing),
            scaled,
        )])
    )
}

fn datasets_loader(_o: &K8sOptions) -> String {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": meta("halyard-datasets-loader", "datasets-loader"),
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "securityContext": pod_security(),
            "containers": [{
                "name": "loader",
                "image": BUSYBOX,
                "imagePullPolicy": pull_policy(BUSYBOX),
                "command": ["sleep", "3600"],
                "securityContext": container_security(),
                "volumeMounts": [{ "name": "datasets", "mountPath": DATASETS_DIR }],
            }],
            "volumes": [{ "name": "datasets", "persistentVolumeClaim": { "claimName": "halyard-datasets" } }],
        }
    });
    yaml(&[
        ("NOT part of the overlay: a one-off pod that fills the PVC halyard-datasets (volumes/), before the overlay is applied (see kustomization.yaml). `kubectl cp` copies into it, then delete it.", pod),
    ])
}

/// Text that goes into a `#` comment line as one line: control characters (a newline in
/// a pool or run name would end the comment and put the rest into the YAML) written as
/// escapes (issue 49).
fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() })
        .collect()
}

/// A pool's line of the kustomization's header table.
fn pool_line(p: &PoolDeploy) -> String {
    format!(
        "  {} -> {} ({}, consumer {}, user {}, max {} replicas, lagThreshold {})",
        one_line(&p.pool),
        p.object,
        match p.kind {
            PoolKind::Api => "API".to_string(),
            PoolKind::Cpu => "CPU".to_string(),
            PoolKind::GpuGguf => "1 GPU".to_string(),
            PoolKind::Server(n) => format!("{n} GPU(s), managed server"),
        },
        pool_consumer(&p.pool),
        worker_user(&p.pool),
        p.max_replicas,
        p.lag_threshold
    )
}

/// `halyard deploy nats-permissions SWEEP --out DIR`: the broker's users for a sweep, the
/// same two files `halyard deploy k8s` writes beside its overlay ([`NATS_PERMISSIONS`],
/// [`NATS_AUTH_VALUES`]), for a deployment that is not that overlay (a nats-server of
/// one's own, compose, another orchestrator): the coordinator and status users as shipped
/// and one worker user per pool of the sweep (`halyard_broker::permissions`). DIR is
/// created if need be; files already there are refused unless `force`. Returns the files
/// written (relative to DIR).
pub fn write_permissions(sweep: &Path, out: &Path, force: bool) -> Result<Vec<String>, NodeError> {
    let s = sweep::load(sweep)?;
    let pools = s.pools();
    let auth =
        halyard_broker::permissions::Authorization::for_pools(pools.keys().map(String::as_str))
            .map_err(|e| NodeError::Usage(format!("{}: {e}", sweep.display())))?;
    let files = [
        (NATS_PERMISSIONS, auth.conf(PERMISSIONS_GENERATOR)),
        (NATS_AUTH_VALUES, auth.helm_values(PERMISSIONS_GENERATOR)),
    ];
    if !force {
        if let Some((name, _)) = files.iter().find(|(f, _)| out.join(f).exists()) {
            return Err(NodeError::Usage(format!(
                "--out {}: {name} is there already (give --force to replace it)",
                out.display()
            )));
        }
    }
    std::fs::create_dir_all(out)
        .map_err(|e| NodeError::io(format!("--out {}: cannot create it", out.display()), e))?;
    let mut written = Vec::new();
    for (name, body) in files {
        let path = out.join(name);
        std::fs::write(&path, body)
            .map_err(|e| NodeError::io(format!("cannot write {}", path.display()), e))?;
        written.push(name.to_string());
    }
    Ok(written)
}

const PERMISSIONS_GENERATOR: &str = "`halyard deploy nats-permissions`";

/// The broker's users for this sweep, as Helm values for the NATS chart (not part of the
/// overlay: `helm upgrade … -f` reads it).
pub const NATS_AUTH_VALUES: &str = "nats-auth-values.yaml";
/// The same users as nats-server configuration (a broker run without the chart).
pub const NATS_PERMISSIONS: &str = "nats-permissions.conf";
const GENERATOR: &str = "`halyard deploy k8s`";

fn kustomization(
    s: &Sweep,
    o: &K8sOptions,
    resources: &[String],
    pools: &[PoolDeploy],
    secrets: &str,
    local: bool,
) -> String {
    let table: Vec<String> = pools.iter().map(pool_line).collect();
    let header = format!(
        "{HEADER_MARK} from {sweep} (run {name}); regenerate rather than edit (--force replaces this directory's files).
#
# Pools (a Deployment here and a ScaledObject in scaling/ each):
{pools}
#
# Broker users: one per pool ({NATS_AUTH_VALUES}, {NATS_PERMISSIONS}); each pool's workers
# connect as theirs and reach only its jobs, results, records and replies. Add each pool's
# password to {secrets}/nats-credentials.env (worker-<pool token>-password=..., see the
# table's users) and give the values to the NATS chart (docs/src/operations/kubernetes.md):
#   helm upgrade --install nats nats/nats --version 2.14.2 -n {NAMESPACE} \\
#     -f deploy/k8s/nats-values.yaml -f {NATS_AUTH_VALUES}
#
# Apply, after the namespace, Secrets and NATS policy (kubectl apply -k {secrets}) and
# NATS itself (docs/src/operations/kubernetes.md):
#   1. the volumes, once: kubectl apply -k volumes
#   2. the datasets, once: kubectl apply -f datasets-loader.yaml
#      kubectl -n {NAMESPACE} wait --for=condition=Ready pod/halyard-datasets-loader
#      kubectl -n {NAMESPACE} cp DATASETS/. halyard-datasets-loader:{DATASETS_DIR}/   (DATASETS: the folder the sweep's ../datasets is)
#      kubectl -n {NAMESPACE} delete pod halyard-datasets-loader{models}
#   3. kubectl apply -k .
#   4. once the coordinator is ready (its consumers exist):
#      kubectl -n {NAMESPACE} wait --for=condition=Ready pod -l app.kubernetes.io/component=coordinator --timeout=10m
#      kubectl apply -k scaling
# `kubectl delete -k .` (and -k scaling) removes the run's workloads only: the namespace,
# NATS, the Secrets and volumes/ stay.
# The sweep is sweep.toml here (a copy), in every pod at {SWEEP_DIR}/{SWEEP_FILE}.
# Images: {image}{gpu}; your registry's: an `images:` entry per name (newName, newTag,
# or digest: pinned by digest they are pulled IfNotPresent, by tag Always).
",
        models = if local {
            format!("\n#      the models, once: kubectl apply -f models-loader.yaml, then fill {MODELS_DIR} in it (models-loader.yaml says how)")
        } else {
            String::new()
        },
        sweep = one_line(&o.sweep.display().to_string()),
        name = one_line(&s.name),
        pools = table.iter().map(|l| format!("#{l}")).collect::<Vec<_>>().join("\n"),
        image = o.image,
        gpu = {
            let mut extra = String::new();
            if pools.iter().any(|p| p.kind == PoolKind::GpuGguf) {
                extra.push_str(&format!(", {}", o.gpu_image));
            }
            if pools.iter().any(|p| matches!(p.kind, PoolKind::Server(_))) {
                extra.push_str(&format!(", {}", o.server_image));
            }
            extra
        },
    );
    let k = json!({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": NAMESPACE,
        "resources": resources,
        "configMapGenerator": [{
            "name": "halyard-sweep",
            "files": [SWEEP_FILE],
            // A fixed name: the coordinator Job's pod template must not change with it.
            "options": { "disableNameSuffixHash": true, "labels": { "app.kubernetes.io/name": "halyard" } }
        }],
        "labels": [{ "pairs": { "halyard.dev/run": s.name }, "includeTemplates": true }],
    });
    format!("{header}{}\n", serde_json::to_string_pretty(&k).expect("a JSON value"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_names_become_kubernetes_names() {
        assert_eq!(object_name("openai-judge").unwrap(), "halyard-worker-openai-judge");
        // gguf/smollm2@gpu0 -> token gguf_smollm2_gpu0-dfe25c9b
        assert_eq!(
            object_name("gguf/smollm2@gpu0").unwrap(),
            "halyard-worker-gguf-smollm2-gpu0-dfe25c9b"
        );
        assert!(object_name(&"x".repeat(60)).unwrap_err().contains("more than 48"));
    }

    /// Issue 49: a newline in a pool's name cannot end the header's `#` comment and
    /// put YAML of the sweep's choice into the kustomization.
    #[test]
    fn a_pool_name_stays_inside_its_comment_line() {
        let p = PoolDeploy {
            pool: "p\nresources: [\"https://evil.example/x.yaml\"]\r\u{85}".into(),
            object: "halyard-worker-p".into(),
            kind: PoolKind::Api,
            concurrency: 1,
            api_keys: BTreeSet::new(),
            server_commands: false,
            max_replicas: 1,
            lag_threshold: 1,
            sizing: String::new(),
        };
        let line = pool_line(&p);
        assert_eq!(line.lines().count(), 1, "{line}");
        assert!(line.contains("p\\nresources"), "{line}");
        assert!(!line.chars().any(char::is_control), "{line}");
        assert_eq!(one_line("openai/gpt-4o@team é"), "openai/gpt-4o@team é");
    }

    #[test]
    fn sweep_paths_land_in_the_volumes() {
        assert_eq!(in_pod("../datasets/a/b.jsonl"), Path::new("/halyard/datasets/a/b.jsonl"));
        assert_eq!(in_pod("/models/x.gguf"), Path::new("/models/x.gguf"));
        assert_eq!(in_pod("x.jsonl"), Path::new("/halyard/sweep/x.jsonl"));
    }
}

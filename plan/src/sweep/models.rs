//! `[[model]]` tables: each checked into a [`Model`] (backend, endpoint identity, pool,
//! sampling, limits, price and quota).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use halyard_pipelines::common::ModelSpec;
use halyard_proto::pool::{GgufSpec, ReplaySpec};
use halyard_proto::ModelRef;
use serde::Deserialize;

use super::backends::{self, ModelInput, Placed};
use super::batch_mode;
use super::error::{key_err, SweepError};
use super::identity::{check_identity_form, gguf_identity};
use super::price::{self, Price, RawPrice};
use super::quota::{self, QuotaSpec};
use super::replay;
use super::server::{self, RawServer};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawModel {
    pub(super) name: String,
    pub(super) backend: String,
    pub(super) base_url: Option<String>,
    pub(super) model: Option<String>,
    pub(super) api_key_env: Option<String>,
    pub(super) pool: Option<String>,
    pub(super) max_concurrency: Option<i64>,
    /// Pool quota (see `quota`).
    pub(super) rpm: Option<i64>,
    pub(super) tpm: Option<i64>,
    pub(super) burst: Option<i64>,
    /// How the API counts a request's tokens: "max_tokens" (default) or "usage".
    pub(super) tpm_counts: Option<String>,
    /// Input and output tokens per minute, apart (Anthropic's limits; see `quota`).
    pub(super) itpm: Option<i64>,
    pub(super) otpm: Option<i64>,
    /// `backend = "anthropic"`: the prompt cache lifetime (see `anthropic`).
    pub(super) prompt_cache: Option<String>,
    pub(super) temperature: Option<f64>,
    pub(super) max_tokens: Option<i64>,
    pub(super) seed: Option<u64>,
    pub(super) timeout_s: Option<f64>,
    /// Structured output for judge calls whose pipeline expects JSON (issue 45): read as
    /// any TOML value so that a wrong type is an error naming the key.
    pub(super) structured_output: Option<toml::Value>,
    // gguf backend
    pub(super) model_path: Option<String>,
    /// The model file's identity (`gguf:<name>:<size>:<hash>`, from `halyard identity`):
    /// given, the coordinator does not open the file (its machine may not have it); the
    /// worker that loads the file checks it.
    pub(super) identity: Option<String>,
    pub(super) gpu: Option<i64>,
    pub(super) gpu_layers: Option<i64>,
    pub(super) slots: Option<i64>,
    pub(super) threads: Option<i64>,
    pub(super) ctx_size: Option<i64>,
    // replay backend
    pub(super) recordings: Option<String>,
    pub(super) recorded_backend: Option<String>,
    pub(super) recorded_endpoint: Option<String>,
    /// USD per million input/output tokens (cost accounting, `--max-cost`).
    pub(super) price: Option<RawPrice>,
    // batch mode (see `batch_mode`)
    pub(super) mode: Option<String>,
    /// The result cache policy (issue 51).
    pub(super) cache: Option<String>,
    pub(super) batch_size: Option<i64>,
    pub(super) batch_wait_s: Option<f64>,
    pub(super) batch_queue_tokens: Option<i64>,
    pub(super) batch_price: Option<RawPrice>,
    // backend = "server" (see `server`)
    pub(super) server: Option<String>,
    pub(super) command: Option<Vec<String>>,
    pub(super) args: Option<Vec<String>>,
    pub(super) revision: Option<String>,
    pub(super) version: Option<String>,
    pub(super) gpus: Option<i64>,
    pub(super) ready_path: Option<String>,
    pub(super) version_path: Option<String>,
    pub(super) start_timeout_s: Option<f64>,
    pub(super) max_restarts: Option<i64>,
    pub(super) restart_backoff_s: Option<f64>,
}

impl RawModel {
    /// The keys [`given_keys`](Self::given_keys) reports: those some backends take and
    /// others do not (the rows of [`backends::BACKENDS`] list them), and `base_url`.
    pub(super) const SPECIFIC_KEYS: &'static [&'static str] = &[
        "base_url",
        "recordings",
        "recorded_backend",
        "recorded_endpoint",
        "server",
        "command",
        "args",
        "revision",
        "version",
        "gpus",
        "ready_path",
        "version_path",
        "start_timeout_s",
        "max_restarts",
        "restart_backoff_s",
        "model_path",
        "identity",
        "gpu",
        "gpu_layers",
        "slots",
        "threads",
        "ctx_size",
    ];

    /// Which of [`SPECIFIC_KEYS`](Self::SPECIFIC_KEYS) this model sets, in that order.
    pub(super) fn given_keys(&self) -> Vec<&'static str> {
        let set = [
            self.base_url.is_some(),
            self.recordings.is_some(),
            self.recorded_backend.is_some(),
            self.recorded_endpoint.is_some(),
            self.server.is_some(),
            self.command.is_some(),
            self.args.is_some(),
            self.revision.is_some(),
            self.version.is_some(),
            self.gpus.is_some(),
            self.ready_path.is_some(),
            self.version_path.is_some(),
            self.start_timeout_s.is_some(),
            self.max_restarts.is_some(),
            self.restart_backoff_s.is_some(),
            self.model_path.is_some(),
            self.identity.is_some(),
            self.gpu.is_some(),
            self.gpu_layers.is_some(),
            self.slots.is_some(),
            self.threads.is_some(),
            self.ctx_size.is_some(),
        ];
        Self::SPECIFIC_KEYS.iter().zip(set).filter_map(|(k, set)| set.then_some(*k)).collect()
    }

    /// The server keys (`backend = "server"`).
    pub(super) fn raw_server(&self) -> RawServer<'_> {
        RawServer {
            name: &self.name,
            model: self.model.as_deref(),
            server: self.server.as_deref(),
            command: self.command.as_deref(),
            args: self.args.as_deref(),
            model_path: self.model_path.as_deref(),
            revision: self.revision.as_deref(),
            version: self.version.as_deref(),
            gpus: self.gpus,
            ready_path: self.ready_path.as_deref(),
            version_path: self.version_path.as_deref(),
            start_timeout_s: self.start_timeout_s,
            max_restarts: self.max_restarts,
            restart_backoff_s: self.restart_backoff_s,
        }
    }
}

/// A model of the sweep, checked.
#[derive(Clone, Debug)]
pub struct Model {
    pub spec: ModelSpec,
    pub max_concurrency: usize,
    /// For `backend = "gguf"`: the file and how to run it.
    pub local: Option<GgufSpec>,
    /// For `backend = "replay"`: where the recorded results are.
    pub replay: Option<ReplaySpec>,
    /// USD per million tokens its calls are billed at: `price`, or in batch mode
    /// `batch_price` (by default half of `price`).
    pub price: Option<Price>,
    /// Batch mode: the pool sends its requests through the provider's batch API.
    pub batch: Option<halyard_proto::pool::BatchSpec>,
    /// The quota of this model's pool, if it gives one.
    pub quota: Option<QuotaSpec>,
    /// For `backend = "embed"`: the model folder.
    pub embed: Option<PathBuf>,
    /// For `backend = "server"`: the server process each worker holding it runs.
    pub server: Option<halyard_proto::server::ServerSpec>,
    /// For `backend = "anthropic"`: the prompt cache lifetime (`prompt_cache`).
    pub prompt_cache: Option<halyard_proto::pool::PromptCacheTtl>,
    /// The result cache policy (issue 51): `read-write` (default), `read`, `write`, `off`.
    pub cache: halyard_proto::CachePolicy,
}

/// `cpu` or `gpuN`: the placement of a local model, carried in its pool's name.
pub fn placement(local: &GgufSpec) -> String {
    match local.gpu {
        None => "cpu".into(),
        Some(n) => format!("gpu{n}"),
    }
}

/// Check every `[[model]]`, in order; names must be unique.
pub(super) fn check_all(f: &str, base: &Path, raw: &[RawModel]) -> Result<Vec<Model>, SweepError> {
    let mut models = Vec::new();
    let mut names = HashSet::new();
    for (i, m) in raw.iter().enumerate() {
        let k = |field: &str| format!("model[{i}].{field}");
        if m.name.is_empty() {
            return Err(key_err(f, k("name"), "must not be empty"));
        }
        if !names.insert(m.name.clone()) {
            return Err(key_err(f, k("name"), format!("duplicate model name {:?}", m.name)));
        }
        models.push(check(f, base, i, m)?);
    }
    Ok(models)
}

/// Check model `i` (its name is already checked).
fn check(f: &str, base: &Path, i: usize, m: &RawModel) -> Result<Model, SweepError> {
    let k = |field: &str| format!("model[{i}].{field}");
    let row = backends::check_keys(f, i, m)?;
    let replay = replay::replay_model(
        f,
        base,
        i,
        replay::ReplayKeys {
            backend: &m.backend,
            base_url: m.base_url.as_deref(),
            recordings: m.recordings.as_ref(),
            recorded_backend: m.recorded_backend.as_ref(),
            recorded_endpoint: m.recorded_endpoint.as_ref(),
        },
    )?;
    let input = ModelInput { f, base, i, m, replay: replay.as_ref() };
    let Placed { endpoint, local, embed, server } = (row.check)(&input)?;
    let api_model = match &m.model {
        Some(x) => x.clone(),
        None if row.model_from_name => m.name.clone(),
        None => return Err(key_err(f, k("model"), "required: the model name sent to the API")),
    };
    let temperature = m.temperature.unwrap_or(0.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(key_err(f, k("temperature"), format!("{temperature} is outside 0..=2")));
    }
    let price = price::check(f, &k, m.price.as_ref())?;
    let raw_batch = batch_mode::RawBatch {
        mode: m.mode.as_deref(),
        batch_size: m.batch_size,
        batch_wait_s: m.batch_wait_s,
        batch_queue_tokens: m.batch_queue_tokens,
        batch_price: m.batch_price.as_ref(),
    };
    let (batch, price) = batch_mode::check(f, &k, &m.backend, raw_batch, price)?;
    // A local model serves as many jobs at once as it has slots; a batch pool's worker
    // holds a batch being gathered and one at the provider.
    let default_concurrency = match (&local, batch) {
        (Some(l), _) => l.slots as i64,
        (None, Some(b)) => 2 * b.batch_size as i64,
        (None, None) if embed.is_some() => 1,
        (None, None) if server.is_some() => server::DEFAULT_CONCURRENCY,
        (None, None) => 4,
    };
    let max_concurrency = m.max_concurrency.unwrap_or(default_concurrency);
    // A batch pool's jobs wait for the provider, not a connection: many more at once.
    let most =
        if batch.is_some() { 2 * halyard_proto::pool::BatchSpec::MAX_SIZE as i64 } else { 4096 };
    if !(1..=most).contains(&max_concurrency) {
        return Err(key_err(
            f,
            k("max_concurrency"),
            format!("{max_concurrency} is outside 1..={most}"),
        ));
    }
    let (max_tokens, timeout_ms) = limits(f, i, m)?;
    let structured_output = structured_output(f, i, m)?;
    let pool = pool(f, i, m, local.as_ref(), embed.is_some(), server.is_some())?;
    let raw_quota = quota::RawQuota {
        rpm: m.rpm,
        tpm: m.tpm,
        burst: m.burst,
        tpm_counts: m.tpm_counts.as_deref(),
        itpm: m.itpm,
        otpm: m.otpm,
    };
    let quota = quota::model_quota(f, &k, raw_quota)?;
    let prompt_cache = super::anthropic::check(f, i, m, &api_model, max_tokens, structured_output)?;
    Ok(Model {
        price,
        spec: ModelSpec {
            name: m.name.clone(),
            model_ref: ModelRef { backend: m.backend.clone(), endpoint, model: api_model },
            pool,
            api_key_env: m.api_key_env.clone(),
            temperature: temperature as f32,
            max_tokens,
            seed: m.seed,
            timeout_ms,
            structured_output,
        },
        max_concurrency: max_concurrency as usize,
        local,
        replay,
        quota,
        embed,
        batch,
        server,
        prompt_cache,
        cache: cache_policy(f, i, m)?,
    })
}

/// `cache = "read-write" | "read" | "write" | "off"` (issue 51); none: [`halyard_proto::CachePolicy::default_for`] the backend.
fn cache_policy(f: &str, i: usize, m: &RawModel) -> Result<halyard_proto::CachePolicy, SweepError> {
    use halyard_proto::CachePolicy as P;
    match m.cache.as_deref() {
        None => Ok(P::default_for(&m.backend)),
        Some("read-write") => Ok(P::ReadWrite),
        Some("read") => Ok(P::Read),
        Some("write") => Ok(P::Write),
        Some("off") => Ok(P::Off),
        Some(other) => Err(key_err(
            f,
            format!("model[{i}].cache"),
            format!("{other:?} is not a cache policy (expected \"read-write\", \"read\", \"write\" or \"off\")"),
        )),
    }
}

/// `backend = "gguf"`: the model file, its identity (`endpoint`) and how to run it.
pub(super) fn gguf_model(
    f: &str,
    base: &Path,
    i: usize,
    m: &RawModel,
) -> Result<GgufSpec, SweepError> {
    let k = |field: &str| format!("model[{i}].{field}");
    let rel = m
        .model_path
        .clone()
        .ok_or_else(|| key_err(f, k("model_path"), "required for backend \"gguf\""))?;
    let file = base.join(&rel);
    let id = match &m.identity {
        // Declared: the file is not opened here (issue 34: a coordinator's pod has no
        // model files); every worker that loads it checks it (`check_identity`).
        Some(id) => {
            check_identity_form(id).map_err(|e| key_err(f, k("identity"), e))?;
            id.clone()
        }
        None => gguf_identity(&file).map_err(|e| {
            key_err(
                f,
                k("model_path"),
                format!(
                    "{}: {e} (fetch the default model with scripts/fetch-model.sh; a \
                     coordinator without the file can be given its identity instead, \
                     `identity = \"…\"`, which `halyard identity FILE` prints)",
                    file.display()
                ),
            )
        })?,
    };
    let int =
        |v: Option<i64>, key: &str, lo: i64, hi: i64, default: i64| -> Result<i64, SweepError> {
            let x = v.unwrap_or(default);
            if (lo..=hi).contains(&x) {
                Ok(x)
            } else {
                Err(key_err(f, k(key), format!("{x} is outside {lo}..={hi}")))
            }
        };
    let gpu = match m.gpu {
        None => None,
        Some(g) => Some(int(Some(g), "gpu", 0, 63, 0)? as u32),
    };
    Ok(GgufSpec {
        endpoint: id,
        path: file,
        gpu,
        gpu_layers: int(m.gpu_layers, "gpu_layers", 0, 100_000, 100_000)? as u32,
        slots: int(m.slots, "slots", 1, 256, 4)? as usize,
        threads: int(m.threads, "threads", 0, 1024, 0)? as usize,
        ctx_size: int(m.ctx_size, "ctx_size", 256, 1 << 20, 4096)? as u32,
    })
}

/// A model whose judge calls had structured output, as the report names it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct StructuredRow {
    pub model: String,
    pub backend: String,
    /// How the backend enforced the schema.
    pub how: &'static str,
}

/// The models of a sweep with `structured_output = true`.
pub fn structured_rows(models: &[Model]) -> Vec<StructuredRow> {
    models
        .iter()
        .filter(|m| m.spec.structured_output)
        .map(|m| {
            let backend = m.spec.model_ref.backend.clone();
            let how = backends::row(&backend)
                .and_then(|r| r.structured_output)
                .unwrap_or("response_format json_schema (strict)");
            StructuredRow { model: m.spec.name.clone(), backend, how }
        })
        .collect()
}

/// The report's "Structured output" section (nothing when no model had it on).
pub fn structured_markdown(rows: &[StructuredRow]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut md = String::from(
        "## Structured output\n\nJudge calls of these models that expect a JSON object were \
         constrained to its schema (`structured_output = true`); their other calls were not.\n\n\
         | model | backend | enforced by |\n|---|---|---|\n",
    );
    for r in rows {
        md.push_str(&format!("| {} | {} | {} |\n", r.model, r.backend, r.how));
    }
    md.push('\n');
    md
}

/// `structured_output`: `true` or `false` (absent: false), on a backend that can do it.
fn structured_output(f: &str, i: usize, m: &RawModel) -> Result<bool, SweepError> {
    let key = format!("model[{i}].structured_output");
    let on = match &m.structured_output {
        None => return Ok(false),
        Some(toml::Value::Boolean(b)) => *b,
        Some(other) => {
            return Err(key_err(
                f,
                key,
                format!("expected true or false, found {} {other}", other.type_str()),
            ))
        }
    };
    if on && backends::row(&m.backend).and_then(|r| r.structured_output).is_none() {
        return Err(key_err(
            f,
            key,
            format!(
                "backend {:?} cannot constrain its output to a JSON schema (structured output \
                 needs backend {})",
                m.backend,
                backends::names_where(|r| r.structured_output.is_some())
            ),
        ));
    }
    Ok(on)
}

/// `max_tokens`, `timeout_s` (as milliseconds) and the `api_key_env` name.
fn limits(f: &str, i: usize, m: &RawModel) -> Result<(Option<u32>, u64), SweepError> {
    let k = |field: &str| format!("model[{i}].{field}");
    let max_tokens = match m.max_tokens {
        None => None,
        Some(t) if (1..=1_000_000).contains(&t) => Some(t as u32),
        Some(t) => return Err(key_err(f, k("max_tokens"), format!("{t} is outside 1..=1000000"))),
    };
    let timeout_s = m.timeout_s.unwrap_or(120.0);
    if !(timeout_s.is_finite() && timeout_s > 0.0 && timeout_s <= 86_400.0) {
        return Err(key_err(
            f,
            k("timeout_s"),
            format!("{timeout_s} is not a number of seconds in (0, 86400]"),
        ));
    }
    if let Some(env) = &m.api_key_env {
        if env.is_empty() || env.contains('=') || env.contains('\0') {
            return Err(key_err(
                f,
                k("api_key_env"),
                "must be the NAME of an environment variable",
            ));
        }
    }
    Ok((max_tokens, (timeout_s * 1000.0) as u64))
}

/// The model's pool. A local model's pool carries its placement, so its jobs reach only
/// the worker that holds the model there.
fn pool(
    f: &str,
    i: usize,
    m: &RawModel,
    local: Option<&GgufSpec>,
    embed: bool,
    server: bool,
) -> Result<String, SweepError> {
    let pool = match (&m.pool, local) {
        // Any worker's server of this model answers its jobs alike: one pool, wherever.
        (None, None) if server => format!("server/{}", m.name),
        (Some(p), Some(l)) => format!("{p}@{}", placement(l)),
        (Some(p), None) => p.clone(),
        (None, Some(l)) => format!("gguf/{}@{}", m.name, placement(l)),
        (None, None) if embed => format!("embed/{}", m.name),
        (None, None) => m.name.clone(),
    };
    if pool.is_empty() {
        return Err(key_err(f, format!("model[{i}].pool"), "must not be empty"));
    }
    Ok(pool)
}

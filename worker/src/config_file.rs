//! The worker configuration file (`halyard worker --config FILE`): the pools a worker
//! serves without a sweep, with the models it may call in each, their quotas, and the
//! HTTP limits. It declares explicitly what a sweep would otherwise imply, so that a
//! worker started on its own still runs only what its operator wrote down.
//!
//! ```toml
//! [http]                              # optional
//! max_body_bytes = 67108864           # default 64 MiB
//! allow_insecure_http = false         # http:// to hosts that are not loopback
//!
//! [[pool]]
//! name = "openai/gpt-4o-mini@team"    # the sweep's pool name
//! concurrency = 8                     # default 4
//! rpm = 500                           # optional quota (rpm and/or tpm, burst)
//! tpm = 200000
//! tpm_counts = "max_tokens"           # or "usage" (how the API counts tokens; README)
//! # mode = "batch"                    # the provider's batch API (README "Batch mode"),
//! # batch_size = 1000                 # with batch_wait_s = 60, batch_queue_tokens = …
//!
//! [[pool.model]]
//! backend = "openai"
//! base_url = "https://api.openai.com/v1"
//! model = "gpt-4o-mini"
//! api_key_env = "OPENAI_API_KEY"      # the variable's NAME, read on this worker
//!
//! [[pool.model]]
//! backend = "noop"
//! ```
//!
//! Unknown keys are errors; every error names the file, the key and what was expected.
//! Local models (`gguf`, `embed`, `replay`) are declared by a sweep (`--sweep`), which
//! computes their identities from the model files.

use std::path::Path;

use halyard_proto::pool::{BatchSpec, HttpModelSpec, PoolPlan, QuotaSpec, WorkerModel, WorkerPlan};
use serde::Deserialize;

use crate::backend::http_guard::{HttpPolicy, DEFAULT_MAX_BODY_BYTES};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("cannot read worker config {file}: {reason}")]
    Read { file: String, reason: String },
    #[error("{file}: {reason}")]
    Syntax { file: String, reason: String },
    #[error("{file}: key `{key}`: {reason}")]
    Key { file: String, key: String, reason: String },
}

/// A worker configuration file, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerFile {
    pub plan: WorkerPlan,
    pub http: HttpPolicy,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    http: Option<RawHttp>,
    #[serde(default)]
    pool: Vec<RawPool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    max_body_bytes: Option<i64>,
    allow_insecure_http: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPool {
    name: String,
    concurrency: Option<i64>,
    rpm: Option<i64>,
    tpm: Option<i64>,
    burst: Option<i64>,
    tpm_counts: Option<String>,
    /// "online" (default) or "batch" (the provider's batch API; see the README).
    mode: Option<String>,
    batch_size: Option<i64>,
    batch_wait_s: Option<f64>,
    batch_queue_tokens: Option<i64>,
    #[serde(default)]
    model: Vec<RawModel>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    backend: String,
    base_url: Option<String>,
    model: Option<String>,
    api_key_env: Option<String>,
}

/// Largest response body limit that can be configured (1 GiB).
pub const MAX_BODY_LIMIT: i64 = 1 << 30;

/// Read and check a worker configuration file.
pub fn load(path: &Path) -> Result<WorkerFile, ConfigError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::Read { file: file.clone(), reason: e.to_string() })?;
    parse(&file, &text)
}

/// Check a worker configuration given as text (`file` names it in errors).
pub fn parse(file: &str, text: &str) -> Result<WorkerFile, ConfigError> {
    let raw: RawFile = toml::from_str(text)
        .map_err(|e| ConfigError::Syntax { file: file.into(), reason: e.to_string() })?;
    let key = |key: String, reason: String| ConfigError::Key { file: file.into(), key, reason };
    let mut http = HttpPolicy::default();
    if let Some(h) = raw.http {
        let limit = h.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES as i64);
        if !(1024..=MAX_BODY_LIMIT).contains(&limit) {
            return Err(key(
                "http.max_body_bytes".into(),
                format!("{limit} is outside 1024..={MAX_BODY_LIMIT} bytes"),
            ));
        }
        http.max_body_bytes = limit as u64;
        http.allow_insecure_http = h.allow_insecure_http.unwrap_or(false);
    }
    if raw.pool.is_empty() {
        return Err(key("pool".into(), "at least one [[pool]] is required".into()));
    }
    let mut plan = WorkerPlan::default();
    for (i, p) in raw.pool.into_iter().enumerate() {
        let k = |field: &str| format!("pool[{i}].{field}");
        if p.name.trim().is_empty() {
            return Err(key(k("name"), "must not be empty".into()));
        }
        if plan.pool(&p.name).is_some() {
            return Err(key(k("name"), format!("pool {:?} is declared twice", p.name)));
        }
        let batch = batch(&p).map_err(|(f, why)| key(k(f), why))?;
        // A batch pool's jobs wait for the provider, not a connection.
        let (default, most) = match batch {
            Some(b) => (2 * b.batch_size as i64, 2 * BatchSpec::MAX_SIZE as i64),
            None => (4, 4096),
        };
        let concurrency = p.concurrency.unwrap_or(default);
        if !(1..=most).contains(&concurrency) {
            return Err(key(k("concurrency"), format!("{concurrency} is outside 1..={most}")));
        }
        let mut pool = PoolPlan::new(p.name.clone(), concurrency as usize);
        pool.batch = batch;
        pool.quota = quota(p.rpm, p.tpm, p.burst).map_err(|(f, why)| key(k(f), why))?;
        if let Some(c) = &p.tpm_counts {
            let counts = c.parse().map_err(|why| key(k("tpm_counts"), why))?;
            match pool.quota.as_mut() {
                Some(q) => q.tpm_counts = counts,
                None => return Err(key(k("tpm_counts"), "needs tpm".into())),
            }
        }
        if p.model.is_empty() {
            return Err(key(
                k("model"),
                "declare the models this pool may call ([[pool.model]] with backend, base_url, \
                 model, api_key_env)"
                    .into(),
            ));
        }
        for (j, m) in p.model.into_iter().enumerate() {
            let m = model(m).map_err(|(f, why)| key(k(&format!("model[{j}].{f}")), why))?;
            if batch.is_some() && !matches!(m, WorkerModel::Http(_)) {
                return Err(key(
                    k(&format!("model[{j}].backend")),
                    "a pool with mode = \"batch\" calls \"openai\" models (a batch API)".into(),
                ));
            }
            pool = pool.with_model(m);
        }
        // Names were checked unique above, so this adds a pool.
        plan.add(pool).map_err(|e| key(k("name"), e))?;
    }
    Ok(WorkerFile { plan, http })
}

type FieldError = (&'static str, String);

/// A pool's batch mode keys (the sweep's `mode`, `batch_size`, `batch_wait_s`,
/// `batch_queue_tokens`, with the same defaults and limits).
fn batch(p: &RawPool) -> Result<Option<BatchSpec>, FieldError> {
    let on = match p.mode.as_deref().unwrap_or("online") {
        "online" => false,
        "batch" => true,
        other => return Err(("mode", format!("{other:?} is neither \"online\" nor \"batch\""))),
    };
    if !on {
        for (f, set) in [
            ("batch_size", p.batch_size.is_some()),
            ("batch_wait_s", p.batch_wait_s.is_some()),
            ("batch_queue_tokens", p.batch_queue_tokens.is_some()),
        ] {
            if set {
                return Err((f, "only applies with mode = \"batch\"".into()));
            }
        }
        return Ok(None);
    }
    let size = p.batch_size.unwrap_or(1000);
    if !(1..=BatchSpec::MAX_SIZE as i64).contains(&size) {
        return Err((
            "batch_size",
            format!("{size} is outside 1..={} requests", BatchSpec::MAX_SIZE),
        ));
    }
    let wait = p.batch_wait_s.unwrap_or(60.0);
    if !(wait.is_finite() && (0.0..=86_400.0).contains(&wait)) {
        return Err(("batch_wait_s", format!("{wait} is outside 0..=86400 seconds")));
    }
    let queue_tokens = match p.batch_queue_tokens {
        None => None,
        Some(t) if (1..=1_000_000_000_000).contains(&t) => Some(t as u64),
        Some(t) => {
            return Err(("batch_queue_tokens", format!("{t} is outside 1..=1000000000000 tokens")))
        }
    };
    Ok(Some(BatchSpec {
        batch_size: size as u32,
        batch_wait_ms: (wait * 1000.0) as u64,
        queue_tokens,
    }))
}

fn quota(
    rpm: Option<i64>,
    tpm: Option<i64>,
    burst: Option<i64>,
) -> Result<Option<QuotaSpec>, FieldError> {
    let range = |v: Option<i64>, f: &'static str, hi: i64| match v {
        Some(x) if !(1..=hi).contains(&x) => Err((f, format!("{x} is outside 1..={hi}"))),
        v => Ok(v),
    };
    let rpm = range(rpm, "rpm", 10_000_000)?;
    let tpm = range(tpm, "tpm", 10_000_000_000)?;
    let burst = range(burst, "burst", 10_000)?;
    match (rpm, tpm) {
        (None, None) if burst.is_some() => Err(("burst", "needs rpm or tpm".into())),
        (None, None) => Ok(None),
        _ => Ok(Some(QuotaSpec {
            rpm: rpm.map(|r| r as u32),
            tpm: tpm.map(|t| t as u64),
            burst: burst.unwrap_or(1) as u32,
            tpm_counts: Default::default(),
            itpm: None,
            otpm: None,
        })),
    }
}

fn model(m: RawModel) -> Result<WorkerModel, FieldError> {
    let http = crate::backend::registry::REGISTRY.iter().find(|k| k.http && k.name == m.backend);
    match m.backend.as_str() {
        _ if http.is_some() => {
            let base_url =
                m.base_url.ok_or(("base_url", format!("required for backend {:?}", m.backend)))?;
            if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
                return Err((
                    "base_url",
                    format!(
                        "{:?} is not an http:// or https:// URL",
                        halyard_proto::redact::url(&base_url)
                    ),
                ));
            }
            let model =
                m.model.ok_or(("model", "required: the model name sent to the API".into()))?;
            if let Some(env) = &m.api_key_env {
                if env.is_empty() || env.contains('=') || env.contains('\0') {
                    return Err((
                        "api_key_env",
                        "must be the NAME of an environment variable".into(),
                    ));
                }
            }
            Ok(WorkerModel::Http(HttpModelSpec {
                backend: m.backend,
                base_url: base_url.trim_end_matches('/').to_string(),
                model,
                api_key_env: m.api_key_env,
                prompt_cache: None,
            }))
        }
        "noop" => {
            for (f, set) in [
                ("base_url", m.base_url.is_some()),
                ("model", m.model.is_some()),
                ("api_key_env", m.api_key_env.is_some()),
            ] {
                if set {
                    return Err((f, "does not apply to backend \"noop\"".into()));
                }
            }
            Ok(WorkerModel::Noop)
        }
        other => {
            let mut names: Vec<String> = crate::backend::registry::REGISTRY
                .iter()
                .filter(|k| k.http)
                .map(|k| format!("{:?}", k.name))
                .collect();
            names.push("\"noop\"".into());
            let last = names.pop().unwrap_or_default();
            let names =
                if names.is_empty() { last } else { format!("{} or {last}", names.join(", ")) };
            Err((
                "backend",
                format!(
                    "{other:?}: a worker config declares {names} models (local models come \
                     from a sweep: --sweep)"
                ),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[http]
max_body_bytes = 2048
allow_insecure_http = true

[[pool]]
name = "paid"
concurrency = 8
rpm = 60
[[pool.model]]
backend = "openai"
base_url = "https://api.x/v1/"
model = "m"
api_key_env = "X_KEY"

[[pool]]
name = "free"
[[pool.model]]
backend = "noop"
"#;

    /// A complete file becomes the plan and policy it describes.
    #[test]
    fn a_config_file_becomes_a_plan() {
        let f = parse("w.toml", GOOD).unwrap();
        assert_eq!(
            f.http,
            HttpPolicy { max_body_bytes: 2048, allow_insecure_http: true, ..Default::default() }
        );
        let paid = f.plan.pool("paid").unwrap();
        assert_eq!(paid.pool.concurrency, 8);
        assert_eq!(
            paid.quota,
            Some(QuotaSpec {
                rpm: Some(60),
                tpm: None,
                burst: 1,
                tpm_counts: Default::default(),
                itpm: None,
                otpm: None,
            })
        );
        assert_eq!(
            paid.models,
            [WorkerModel::Http(HttpModelSpec {
                backend: "openai".into(),
                base_url: "https://api.x/v1".into(),
                model: "m".into(),
                api_key_env: Some("X_KEY".into()),
                prompt_cache: None,
            })]
        );
        let free = f.plan.pool("free").unwrap();
        assert_eq!((free.pool.concurrency, &free.models[..]), (4, &[WorkerModel::Noop][..]));
    }

    /// Mistakes are errors naming the file and the key.
    #[test]
    fn mistakes_name_the_key() {
        let cases = [
            ("[[pool]]\nname = \"p\"\n", "pool[0].model"),
            ("[[pool]]\nname = \"p\"\n[[pool.model]]\nbackend = \"openai\"\nmodel = \"m\"\n", "pool[0].model[0].base_url"),
            ("[[pool]]\nname = \"p\"\n[[pool.model]]\nbackend = \"gguf\"\n", "pool[0].model[0].backend"),
            ("[[pool]]\nname = \"p\"\nconcurrency = 0\n[[pool.model]]\nbackend = \"noop\"\n", "pool[0].concurrency"),
            ("[[pool]]\nname = \"p\"\nburst = 2\n[[pool.model]]\nbackend = \"noop\"\n", "pool[0].burst"),
            ("[http]\nmax_body_bytes = 1\n[[pool]]\nname = \"p\"\n[[pool.model]]\nbackend = \"noop\"\n", "http.max_body_bytes"),
            ("[[pool]]\nname = \"p\"\n[[pool.model]]\nbackend = \"noop\"\n[[pool]]\nname = \"p\"\n[[pool.model]]\nbackend = \"noop\"\n", "pool[1].name"),
            ("", "pool"),
        ];
        for (text, want) in cases {
            let e = parse("w.toml", text).unwrap_err().to_string();
            assert!(
                e.starts_with("w.toml: key `") && e.contains(&format!("`{want}`")),
                "{want}: {e}"
            );
        }
        let e = parse("w.toml", "[[pool]]\nname = \"p\"\nsurprise = 1\n").unwrap_err();
        assert!(e.to_string().contains("surprise"), "{e}");
        let e = load(Path::new("/nonexistent/w.toml")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/w.toml"), "{e}");
    }

    /// Batch mode keys on a pool: the spec reaches the plan, a batch pool's concurrency
    /// defaults to two batches, and bad or misplaced keys name the key.
    #[test]
    fn batch_pools() {
        let pool = |keys: &str, backend: &str| {
            format!(
                "[[pool]]\nname = \"b\"\n{keys}\n[[pool.model]]\nbackend = \"{backend}\"\n{}",
                if backend == "openai" {
                    "base_url = \"https://x/v1\"\nmodel = \"m\"\n"
                } else {
                    ""
                }
            )
        };
        let f = parse(
            "w.toml",
            &pool(
                "mode = \"batch\"\nbatch_size = 50\nbatch_wait_s = 1.5\nbatch_queue_tokens = 900",
                "openai",
            ),
        )
        .unwrap();
        let p = f.plan.pool("b").unwrap();
        assert_eq!(
            p.batch,
            Some(BatchSpec { batch_size: 50, batch_wait_ms: 1500, queue_tokens: Some(900) })
        );
        assert_eq!(p.pool.concurrency, 100);
        let f = parse("w.toml", &pool("", "openai")).unwrap();
        assert_eq!(
            (f.plan.pool("b").unwrap().batch, f.plan.pool("b").unwrap().pool.concurrency),
            (None, 4)
        );
        for (keys, backend, key, why) in [
            ("mode = \"soon\"", "openai", "pool[0].mode", "neither"),
            ("batch_size = 5", "openai", "pool[0].batch_size", "only applies"),
            ("mode = \"batch\"\nbatch_size = 0", "openai", "pool[0].batch_size", "outside"),
            ("mode = \"batch\"\nbatch_wait_s = 1e9", "openai", "pool[0].batch_wait_s", "outside"),
            (
                "mode = \"batch\"\nbatch_queue_tokens = -1",
                "openai",
                "pool[0].batch_queue_tokens",
                "outside",
            ),
            ("mode = \"batch\"", "noop", "pool[0].model[0].backend", "batch API"),
        ] {
            match parse("w.toml", &pool(keys, backend)) {
                Err(ConfigError::Key { key: k, reason, .. }) => {
                    assert_eq!(k, key, "{keys}");
                    assert!(reason.contains(why), "{keys}: {reason}");
                }
                other => panic!("{keys}: {other:?}"),
            }
        }
    }
}

//! `backend = "server"`: a model served by an OpenAI-compatible server process that each
//! worker holding the model starts and owns (see `halyard_proto::server` for the
//! identity and the presets, and the worker's `server` module for the supervisor).
//!
//! ```toml
//! [[model]]
//! name = "llama-70b"
//! backend = "server"
//! server = "vllm"                     # or command = ["vllm", "serve", "{model_path}", …]
//! model_path = "/models/llama-3-70b"
//! revision = "e1945c40cd546c78e41f1151f4db032b271faeaa"
//! gpus = 2
//! args = ["--dtype", "bfloat16", "--max-model-len", "8192"]
//! max_concurrency = 64
//! ```
//!
//! Keys: `server` (a preset: `vllm`, `sglang`, `llama-server`, `tgi`) or `command` (the
//! whole command with placeholders `{model_path}`, `{port}`, `{gpu_count}`,
//! `{served_name}`, `{gpu_ids}`), `args` (more arguments after a preset's), `model_path`,
//! `revision` (the weights' revision or digest: part of job identity), `version` (the
//! server's version: part of job identity, and checked against the running server where
//! it tells), `gpus` (per server, default 1; 0 for a CPU server), `ready_path`,
//! `version_path`, `start_timeout_s`, `max_restarts`, `restart_backoff_s`.

use halyard_proto::server::{self, ServerSpec};

use super::error::{key_err, SweepError};

/// A model's server keys, as given.
pub(super) struct RawServer<'a> {
    pub name: &'a str,
    /// The API model name (`model`), if given.
    pub model: Option<&'a str>,
    pub server: Option<&'a str>,
    pub command: Option<&'a [String]>,
    pub args: Option<&'a [String]>,
    pub model_path: Option<&'a str>,
    pub revision: Option<&'a str>,
    pub version: Option<&'a str>,
    pub gpus: Option<i64>,
    pub ready_path: Option<&'a str>,
    pub version_path: Option<&'a str>,
    pub start_timeout_s: Option<f64>,
    pub max_restarts: Option<i64>,
    pub restart_backoff_s: Option<f64>,
}

/// Default requests in flight per server (continuous batching serves many at once).
pub const DEFAULT_CONCURRENCY: i64 = 16;

/// Check a `backend = "server"` model's keys into the spec its workers run.
pub(super) fn check(
    f: &str,
    k: &dyn Fn(&str) -> String,
    raw: &RawServer<'_>,
) -> Result<ServerSpec, SweepError> {
    let text = |key: &str, v: &str| -> Result<(), SweepError> {
        if v.trim().is_empty() || v.contains('\0') {
            Err(key_err(f, k(key), "must not be empty"))
        } else {
            Ok(())
        }
    };
    let (kind, command, identity_args, preset) = match (raw.server, raw.command) {
        (Some(_), Some(_)) => {
            return Err(key_err(
                f,
                k("command"),
                "give either `server` (a preset) or `command`, not both (a preset's extra \
                 arguments go in `args`)",
            ))
        }
        (None, None) => {
            return Err(key_err(
                f,
                k("server"),
                "required for backend \"server\": a preset (\"vllm\", \"sglang\", \
                 \"llama-server\" or \"tgi\"), or `command = [...]`",
            ))
        }
        (Some(kind), None) => {
            let p = server::preset(kind).ok_or_else(|| {
                key_err(
                    f,
                    k("server"),
                    format!(
                        "unknown server {kind:?} (expected one of {}; or give `command`)",
                        server::PRESETS.map(|p| format!("{:?}", p.kind)).join(", ")
                    ),
                )
            })?;
            let extra = raw.args.unwrap_or_default().to_vec();
            let mut command: Vec<String> = p.command.iter().map(|a| a.to_string()).collect();
            command.extend(extra.iter().cloned());
            (kind.to_string(), command, extra, Some(p))
        }
        (None, Some(cmd)) => {
            if raw.args.is_some() {
                return Err(key_err(
                    f,
                    k("args"),
                    "only applies with a preset (`server = ...`); put them in `command`",
                ));
            }
            let Some(program) = cmd.first() else {
                return Err(key_err(f, k("command"), "must not be empty: [program, args...]"));
            };
            text("command", program)?;
            let kind = std::path::Path::new(program)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| program.clone());
            (kind, cmd.to_vec(), cmd[1..].to_vec(), None)
        }
    };
    for a in &command {
        if a.contains('\0') {
            return Err(key_err(f, k("command"), "an argument holds a NUL byte"));
        }
        if let Some(p) = server::unknown_placeholders(a).first() {
            return Err(key_err(
                f,
                k(if preset.is_some() { "args" } else { "command" }),
                format!(
                    "unknown placeholder {p} in {a:?} (known: {})",
                    server::PLACEHOLDERS.join(", ")
                ),
            ));
        }
    }
    if !command.iter().any(|a| a.contains("{port}")) {
        return Err(key_err(
            f,
            k("command"),
            "must pass {port}: the worker chooses a free port for each server",
        ));
    }
    let model_path = raw.model_path.ok_or_else(|| {
        key_err(
            f,
            k("model_path"),
            "required for backend \"server\": the weights as the worker's node sees them \
             (a path, or a hub id)",
        )
    })?;
    text("model_path", model_path)?;
    let revision = raw.revision.ok_or_else(|| {
        key_err(
            f,
            k("revision"),
            "required for backend \"server\": the weights' revision or digest (a Hugging \
             Face commit hash, or for a GGUF file what `halyard identity FILE` prints); \
             job ids use it, not the path",
        )
    })?;
    text("revision", revision)?;
    if let Some(v) = raw.version {
        text("version", v)?;
    }
    let gpus = raw.gpus.unwrap_or(1);
    if !(0..=64).contains(&gpus) {
        return Err(key_err(f, k("gpus"), format!("{gpus} is outside 0..=64")));
    }
    if gpus == 0 && command.iter().any(|a| a.contains("{gpu_count}")) {
        return Err(key_err(
            f,
            k("gpus"),
            "0 (a CPU server), but the command passes {gpu_count} (tensor parallelism needs \
             a GPU): give gpus >= 1",
        ));
    }
    let path = |key: &str, v: Option<&str>, default: Option<&str>| -> Result<_, SweepError> {
        match v.or(default) {
            Some(p) if p.starts_with('/') && !p.contains(char::is_whitespace) => {
                Ok(Some(p.to_string()))
            }
            Some(p) => Err(key_err(f, k(key), format!("{p:?} is not a path starting with /"))),
            None => Ok(None),
        }
    };
    let ready_path =
        path("ready_path", raw.ready_path, Some(preset.map_or("/health", |p| p.ready_path)))?
            .unwrap_or_else(|| "/health".into());
    let version_path = path("version_path", raw.version_path, preset.and_then(|p| p.version_path))?;
    let seconds = |key: &str, v: Option<f64>, default: f64, max: f64| -> Result<u64, SweepError> {
        let s = v.unwrap_or(default);
        if s.is_finite() && s > 0.0 && s <= max {
            Ok((s * 1000.0) as u64)
        } else {
            Err(key_err(f, k(key), format!("{s} is not a number of seconds in (0, {max}]")))
        }
    };
    let max_restarts = raw.max_restarts.unwrap_or(5);
    if !(0..=1000).contains(&max_restarts) {
        return Err(key_err(f, k("max_restarts"), format!("{max_restarts} is outside 0..=1000")));
    }
    let served_name = raw.model.unwrap_or(raw.name).to_string();
    Ok(ServerSpec {
        endpoint: server::identity(&kind, raw.name, revision, raw.version, &identity_args),
        name: raw.name.to_string(),
        kind,
        command,
        model_path: model_path.to_string(),
        served_name,
        gpus: gpus as u32,
        ready_path,
        version_path,
        version_field: preset.map_or("version", |p| p.version_field).to_string(),
        version: raw.version.map(String::from),
        start_timeout_ms: seconds("start_timeout_s", raw.start_timeout_s, 1800.0, 86_400.0)?,
        max_restarts: max_restarts as u32,
        restart_backoff_ms: seconds("restart_backoff_s", raw.restart_backoff_s, 2.0, 3600.0)?,
        stable_ms: 10 * 60 * 1000,
        gpu_sets: Vec::new(),
    })
}

/// A managed server in the report: what answered the model's jobs.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ServerRow {
    pub model: String,
    pub kind: String,
    /// The command as the sweep gives it (placeholders unexpanded).
    pub command: Vec<String>,
    /// The weights as the workers' nodes see them.
    pub model_path: String,
    /// The version the sweep declares (each worker checks it against the server's own
    /// where the server tells it), if any.
    pub version: Option<String>,
    /// The model's identity in job ids (kind, name, revision, version, arguments digest).
    pub identity: String,
    pub gpus: u32,
}

/// The report's rows of the sweep's managed servers.
pub fn report_rows(models: &[super::Model]) -> Vec<ServerRow> {
    models
        .iter()
        .filter_map(|m| m.server.as_ref())
        .map(|s| ServerRow {
            model: s.name.clone(),
            kind: s.kind.clone(),
            command: s.command.clone(),
            model_path: s.model_path.clone(),
            version: s.version.clone(),
            identity: s.endpoint.clone(),
            gpus: s.gpus,
        })
        .collect()
}

/// The report's managed-server table (Markdown; nothing without servers).
pub fn report_markdown(rows: &[ServerRow]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut md = String::from(
        "## Managed servers\n\n| model | server | version | GPUs per server | command | identity |\n|---|---|---|---|---|---|\n",
    );
    let cell = |s: &str| s.replace('|', "\\|").replace('\n', " ");
    for r in rows {
        md.push_str(&format!(
            "| {} | {} | {} | {} | `{}` | `{}` |\n",
            cell(&r.model),
            cell(&r.kind),
            cell(r.version.as_deref().unwrap_or("not declared")),
            r.gpus,
            cell(&r.command.join(" ")),
            cell(&r.identity)
        ));
    }
    md.push('\n');
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw<'a>(server: Option<&'a str>, command: Option<&'a [String]>) -> RawServer<'a> {
        RawServer {
            name: "m",
            model: None,
            server,
            command,
            args: None,
            model_path: Some("/models/m"),
            revision: Some("abc"),
            version: None,
            gpus: Some(2),
            ready_path: None,
            version_path: None,
            start_timeout_s: None,
            max_restarts: None,
            restart_backoff_s: None,
        }
    }

    fn k(field: &str) -> String {
        format!("model[0].{field}")
    }

    /// A preset gives the command and paths; the identity holds kind, name and revision.
    #[test]
    fn presets_give_the_command() {
        let s = check("s.toml", &k, &raw(Some("vllm"), None)).unwrap();
        assert_eq!(s.command[..3], ["vllm", "serve", "{model_path}"]);
        assert_eq!(
            (s.ready_path.as_str(), s.version_path.as_deref()),
            ("/health", Some("/version"))
        );
        assert!(s.endpoint.starts_with("server:vllm:m:abc:-:"), "{}", s.endpoint);
        // Extra args change the identity; the preset's own (port, model path) do not.
        let args = ["--dtype".to_string(), "bfloat16".to_string()];
        let with = check("s.toml", &k, &RawServer { args: Some(&args), ..raw(Some("vllm"), None) })
            .unwrap();
        assert_ne!(with.endpoint, s.endpoint);
        assert_eq!(with.command.last().map(String::as_str), Some("bfloat16"));
        let moved = check(
            "s.toml",
            &k,
            &RawServer { model_path: Some("/elsewhere/m"), ..raw(Some("vllm"), None) },
        )
        .unwrap();
        assert_eq!(moved.endpoint, s.endpoint, "the path is not the identity");
    }

    /// Each mistake is an error naming its key.
    #[test]
    fn mistakes_name_their_key() {
        let no_port: Vec<String> = vec!["srv".into(), "{model_path}".into()];
        let typo: Vec<String> = vec!["srv".into(), "--port".into(), "{prot}".into()];
        let tp: Vec<String> = vec!["srv".into(), "{port}".into(), "{gpu_count}".into()];
        for (r, key) in [
            (raw(None, None), "model[0].server"),
            (raw(Some("vllm"), Some(&tp)), "model[0].command"),
            (raw(Some("ollama"), None), "model[0].server"),
            (raw(None, Some(&no_port)), "model[0].command"),
            (raw(None, Some(&typo)), "model[0].command"),
            (RawServer { gpus: Some(0), ..raw(None, Some(&tp)) }, "model[0].gpus"),
            (RawServer { revision: None, ..raw(Some("vllm"), None) }, "model[0].revision"),
            (RawServer { model_path: None, ..raw(Some("vllm"), None) }, "model[0].model_path"),
            (
                RawServer { ready_path: Some("health"), ..raw(Some("vllm"), None) },
                "model[0].ready_path",
            ),
            (
                RawServer { max_restarts: Some(-1), ..raw(Some("vllm"), None) },
                "model[0].max_restarts",
            ),
            (
                RawServer { start_timeout_s: Some(0.0), ..raw(Some("vllm"), None) },
                "model[0].start_timeout_s",
            ),
        ] {
            let e = check("s.toml", &k, &r).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains("s.toml"), "{key}: {e}");
        }
    }
}

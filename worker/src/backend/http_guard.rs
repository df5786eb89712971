//! What the HTTP backend will and will not do, whatever a server or a sweep says.
//!
//! - [`HttpPolicy::max_body_bytes`]: a response body larger than this is a permanent
//!   error, read no further, so a broken or hostile server cannot exhaust a worker's
//!   memory (default [`DEFAULT_MAX_BODY_BYTES`], 64 MiB: a chat completion is a few KiB,
//!   an 8k-token answer about 32 KiB).
//! - [`check_plan`]: at worker start, an `http://` model URL to a host that is not
//!   loopback is refused unless [`HttpPolicy::allow_insecure_http`]: prompts, answers
//!   and the API key would cross the network unencrypted.
//!
//! Error texts built here and in `openai` pass through `halyard_proto::redact`, so
//! credentials inside URLs and key-like text in error bodies never reach logs, errors or
//! dead-letter records.

use halyard_broker::auth::is_loopback_host;
use halyard_proto::pool::{WorkerModel, WorkerPlan};
use halyard_proto::redact;

use crate::call_error::CallError;

/// Default limit of one response body.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 64 << 20;

/// Limits of the HTTP backend, from the worker's configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpPolicy {
    pub max_body_bytes: u64,
    /// Allow `http://` model URLs to hosts that are not loopback.
    pub allow_insecure_http: bool,
}

impl Default for HttpPolicy {
    fn default() -> Self {
        HttpPolicy { max_body_bytes: DEFAULT_MAX_BODY_BYTES, allow_insecure_http: false }
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

/// Check every HTTP model of the plan (at worker start, before anything is fetched).
pub fn check_plan(plan: &WorkerPlan, policy: HttpPolicy) -> Result<(), String> {
    let listed = listed_key_envs();
    for (pool, m) in plan.models() {
        if let WorkerModel::Http(h) = m {
            let at = || format!("model {:?} of pool {:?}", h.model, pool.name);
            check_url(&h.base_url, policy).map_err(|e| format!("{}: {e}", at()))?;
            if let Some(var) = &h.api_key_env {
                check_key_env(var, &listed).map_err(|e| format!("{}: {e}", at()))?;
                key_is_set(var).map_err(|e| format!("{}: {e}", at()))?;
            }
        }
    }
    Ok(())
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
}

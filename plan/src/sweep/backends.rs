//! The backends a `[[model]]` may name (`backend = "…"`): one row of [`BACKENDS`] each,
//! with the keys only it takes, the keys it requires, and how its endpoint identity (what
//! job ids hash) is checked. [`models`](super::models) reads the table; adding a backend
//! is adding its row (see the book's "Adding a backend").

use std::path::{Path, PathBuf};

use halyard_proto::pool::{GgufSpec, ReplaySpec};
use halyard_proto::server::ServerSpec;

use super::error::{key_err, SweepError};
use super::identity::embed_identity;
use super::models::{gguf_model, RawModel};
use super::server;

/// One backend of the sweep file.
pub(crate) struct BackendRow {
    /// The name `backend = "…"` gives (and `ModelRef::backend` in job keys).
    pub name: &'static str,
    /// The `[[model]]` keys that only some backends take, this one among them: any of
    /// them on a backend whose row does not list it is an error naming the first row
    /// that does ("only applies to backend …").
    pub keys: &'static [&'static str],
    /// Keys it cannot do without ("required for backend …").
    pub required: &'static [&'static str],
    /// `model` may be left out: the model's `name` is then its API model name.
    pub model_from_name: bool,
    /// It calls nobody's API (nothing is paid): `job_batch = "auto"` batches its pools.
    pub local: bool,
    /// How it constrains an output to a JSON schema (`structured_output = true`), if it
    /// can; the report's "Structured output" section names it.
    pub structured_output: Option<&'static str>,
    /// It has a provider batch API (`mode = "batch"`).
    pub batch_api: bool,
    /// Its endpoint identity in job keys, and its local model or server if it has one.
    /// Called after the keys above are checked.
    pub check: fn(&ModelInput<'_>) -> Result<Placed, SweepError>,
}

/// Every backend a sweep may name, one row each. The order is that of error messages,
/// and the first row listing a key is the one "only applies to backend …" names.
pub(crate) const BACKENDS: &[BackendRow] = &[
    BackendRow {
        name: "openai",
        keys: &[],
        required: &["base_url"],
        model_from_name: false,
        local: false,
        structured_output: Some("response_format json_schema (strict)"),
        batch_api: true,
        check: http_endpoint,
    },
    BackendRow {
        name: "anthropic",
        keys: &[],
        required: &["base_url"],
        model_from_name: false,
        local: false,
        structured_output: Some("output_config json_schema (Anthropic structured outputs)"),
        batch_api: true,
        check: http_endpoint,
    },
    BackendRow {
        name: "gguf",
        keys: &["model_path", "identity", "gpu", "gpu_layers", "slots", "threads", "ctx_size"],
        required: &["model_path"],
        model_from_name: true,
        local: true,
        structured_output: Some("llama.cpp grammar from the JSON schema"),
        batch_api: false,
        check: gguf_endpoint,
    },
    BackendRow {
        name: "server",
        keys: &[
            "server",
            "command",
            "args",
            "model_path",
            "revision",
            "version",
            "gpus",
            "ready_path",
            "version_path",
            "start_timeout_s",
            "max_restarts",
            "restart_backoff_s",
        ],
        required: &[],
        model_from_name: true,
        local: false,
        structured_output: Some("response_format json_schema (strict)"),
        batch_api: false,
        check: server_endpoint,
    },
    BackendRow {
        name: "replay",
        keys: &["recordings", "recorded_backend", "recorded_endpoint"],
        required: &[],
        model_from_name: true,
        local: true,
        structured_output: None,
        batch_api: false,
        check: replay_endpoint,
    },
    BackendRow {
        name: "embed",
        keys: &["model_path"],
        required: &[],
        model_from_name: true,
        local: true,
        structured_output: None,
        batch_api: false,
        check: embed_endpoint,
    },
    BackendRow {
        name: "noop",
        keys: &[],
        required: &[],
        model_from_name: true,
        local: true,
        structured_output: None,
        batch_api: false,
        check: |_| Ok(Placed::at(String::new())),
    },
];

/// The row of backend `name`.
pub(crate) fn row(name: &str) -> Option<&'static BackendRow> {
    BACKENDS.iter().find(|r| r.name == name)
}

/// The names of the rows that pass `keep`, quoted, as a sentence lists them:
/// `"a", "b" or "c"`.
pub(crate) fn names_where(keep: impl Fn(&BackendRow) -> bool) -> String {
    let names: Vec<String> =
        BACKENDS.iter().filter(|r| keep(r)).map(|r| format!("{:?}", r.name)).collect();
    match names.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

/// A `[[model]]` being checked, as a row's `check` reads it.
pub(crate) struct ModelInput<'a> {
    /// The sweep file, for errors.
    pub f: &'a str,
    /// The sweep file's folder (relative paths resolve against it).
    pub base: &'a Path,
    /// Its index in `[[model]]`.
    pub i: usize,
    pub m: &'a RawModel,
    /// For `backend = "replay"`: its recordings, already checked.
    pub replay: Option<&'a ReplaySpec>,
}

impl ModelInput<'_> {
    /// The key's full name, `model[i].key`.
    pub fn key(&self, field: &str) -> String {
        format!("model[{}].{field}", self.i)
    }

    /// An error about one of its keys.
    pub fn err(&self, field: &str, reason: impl Into<String>) -> SweepError {
        key_err(self.f, self.key(field), reason)
    }
}

/// Where a model runs: its identity in job keys, and its local files or server if any.
pub(crate) struct Placed {
    pub endpoint: String,
    pub local: Option<GgufSpec>,
    pub embed: Option<PathBuf>,
    pub server: Option<ServerSpec>,
}

impl Placed {
    /// A model known by its endpoint alone.
    pub fn at(endpoint: String) -> Placed {
        Placed { endpoint, local: None, embed: None, server: None }
    }
}

/// Check model `i`'s backend-specific keys against the table: its backend is a row, no
/// key of another row is set, every key its row requires is. Returns its row.
pub(super) fn check_keys(
    f: &str,
    i: usize,
    m: &RawModel,
) -> Result<&'static BackendRow, SweepError> {
    let k = |field: &str| format!("model[{i}].{field}");
    let Some(row) = row(&m.backend) else {
        return Err(key_err(
            f,
            k("backend"),
            format!("unknown backend {:?} (expected {})", m.backend, names_where(|_| true)),
        ));
    };
    let given = m.given_keys();
    for key in &given {
        if !row.keys.contains(key) {
            if let Some(owner) = BACKENDS.iter().find(|r| r.keys.contains(key)) {
                return Err(key_err(
                    f,
                    k(key),
                    format!("only applies to backend {:?}", owner.name),
                ));
            }
        }
    }
    if let Some(key) = row.required.iter().find(|r| !given.contains(r)) {
        return Err(key_err(f, k(key), format!("required for backend {:?}", row.name)));
    }
    Ok(row)
}

/// An HTTP API at `base_url`: the URL (without a trailing `/`) is its identity.
pub(crate) fn http_endpoint(x: &ModelInput<'_>) -> Result<Placed, SweepError> {
    let url = x.m.base_url.clone().unwrap_or_default();
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(x.err("base_url", format!("{url:?} is not an http:// or https:// URL")));
    }
    Ok(Placed::at(url.trim_end_matches('/').to_string()))
}

/// `backend = "gguf"`: the model file's identity, and how to run it.
fn gguf_endpoint(x: &ModelInput<'_>) -> Result<Placed, SweepError> {
    let l = gguf_model(x.f, x.base, x.i, x.m)?;
    Ok(Placed { local: Some(l.clone()), ..Placed::at(l.endpoint) })
}

/// `backend = "server"`: the server's spec; its endpoint is the server's identity.
fn server_endpoint(x: &ModelInput<'_>) -> Result<Placed, SweepError> {
    let k = |field: &str| x.key(field);
    let spec = server::check(x.f, &k, &x.m.raw_server())?;
    Ok(Placed { server: Some(spec.clone()), ..Placed::at(spec.endpoint) })
}

/// `backend = "replay"`: the endpoint of the recorded jobs.
fn replay_endpoint(x: &ModelInput<'_>) -> Result<Placed, SweepError> {
    Ok(Placed::at(x.replay.map(|r| r.endpoint.clone()).unwrap_or_default()))
}

/// `backend = "embed"`: the model folder's identity.
fn embed_endpoint(x: &ModelInput<'_>) -> Result<Placed, SweepError> {
    let rel =
        x.m.model_path.clone().ok_or_else(|| {
            x.err("model_path", "required for backend \"embed\" (the model folder)")
        })?;
    let dir = x.base.join(&rel);
    let id = embed_identity(&dir).map_err(|e| {
        x.err(
            "model_path",
            format!(
                "{}: {e} (fetch the embedding model with scripts/fetch-embedder.sh)",
                dir.display()
            ),
        )
    })?;
    Ok(Placed { embed: Some(dir), ..Placed::at(id) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key a row lists is one `RawModel::given_keys` can report, and every row's
    /// required key is one of its own keys or a key every backend takes.
    #[test]
    fn the_backend_table_names_only_known_keys() {
        let known = RawModel::SPECIFIC_KEYS;
        for r in BACKENDS {
            for k in r.keys {
                assert!(known.contains(k), "{}: {k}", r.name);
            }
            for k in r.required {
                assert!(r.keys.contains(k) || *k == "base_url", "{}: {k}", r.name);
            }
        }
        assert_eq!(
            names_where(|_| true),
            "\"openai\", \"anthropic\", \"gguf\", \"server\", \"replay\", \"embed\" or \"noop\""
        );
        assert_eq!(names_where(|r| r.batch_api), "\"openai\" or \"anthropic\"");
    }
}

//! Managed model servers (`backend = "server"`): an OpenAI-compatible server process
//! (vLLM, SGLang, llama.cpp's `llama-server`, TGI, or any command) that a worker starts,
//! health-checks, restarts and stops for one model.
//!
//! This module holds the plain data: the [`ServerSpec`] a worker's plan carries, the
//! [`PRESETS`] (each server's command and its argument names for model, port and GPU
//! count), command templates and their placeholders ([`expand`]), and the model's
//! location-independent identity ([`identity`]). No IO: the worker's `server` module
//! runs the processes.
//!
//! # Identity
//! A job's [`crate::ModelRef::endpoint`] for a managed server is
//! `server:<kind>:<name>:<revision>:<version>:<args digest>`: the server kind, the model's
//! name, the weights' declared revision (or digest), the server version the sweep
//! declares (`-` when none), and a digest of the generation-relevant arguments (the
//! command's arguments as written, placeholders unexpanded, without the program's path;
//! for a preset, the extra `args` only). Never the port, the node, the program's path or
//! the GPU set: results from two nodes are interchangeable and checkpoints resume.

use serde::{Deserialize, Serialize};

/// Placeholders a command template may use, replaced by the worker when it starts the
/// server.
pub const PLACEHOLDERS: [&str; 5] =
    ["{model_path}", "{port}", "{gpu_count}", "{served_name}", "{gpu_ids}"];

/// How to start a kind of server.
#[derive(Clone, Copy, Debug)]
pub struct Preset {
    /// The `server = "…"` value.
    pub kind: &'static str,
    /// The command, with placeholders.
    pub command: &'static [&'static str],
    /// Answers 200 once the model can answer.
    pub ready_path: &'static str,
    /// Answers JSON with the server's version, if the server has such an endpoint.
    pub version_path: Option<&'static str>,
    /// The JSON field of `version_path`'s answer holding the version.
    pub version_field: &'static str,
}

/// vLLM, SGLang, llama.cpp's `llama-server` and Hugging Face TGI: their argument names for
/// the model, the port, the GPU count (tensor parallelism) and the name the model is
/// served under (so requests name the model, not its path). Each listens on loopback
/// only: the worker is its only client.
pub const PRESETS: [Preset; 4] = [
    Preset {
        kind: "vllm",
        command: &[
            "vllm",
            "serve",
            "{model_path}",
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
            "--tensor-parallel-size",
            "{gpu_count}",
            "--served-model-name",
            "{served_name}",
        ],
        ready_path: "/health",
        version_path: Some("/version"),
        version_field: "version",
    },
    Preset {
        kind: "sglang",
        command: &[
            "python3",
            "-m",
            "sglang.launch_server",
            "--model-path",
            "{model_path}",
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
            "--tp-size",
            "{gpu_count}",
            "--served-model-name",
            "{served_name}",
        ],
        ready_path: "/health",
        version_path: Some("/get_server_info"),
        version_field: "version",
    },
    Preset {
        kind: "llama-server",
        command: &[
            "llama-server",
            "--model",
            "{model_path}",
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
            "--alias",
            "{served_name}",
        ],
        ready_path: "/health",
        version_path: None,
        version_field: "version",
    },
    Preset {
        kind: "tgi",
        command: &[
            "text-generation-launcher",
            "--model-id",
            "{model_path}",
            "--hostname",
            "127.0.0.1",
            "--port",
            "{port}",
            "--num-shard",
            "{gpu_count}",
        ],
        ready_path: "/health",
        version_path: Some("/info"),
        version_field: "version",
    },
];

/// The preset of `kind`, if there is one.
pub fn preset(kind: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.kind == kind)
}

/// A model served by a process the worker owns; part of the worker's plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerSpec {
    /// The model's identity in job keys ([`identity`]).
    pub endpoint: String,
    /// The sweep's model name (logs, status, metrics).
    pub name: String,
    /// `vllm`, `sglang`, `llama-server`, `tgi`, or the program's file name for a custom
    /// command.
    pub kind: String,
    /// The command, with placeholders ([`PLACEHOLDERS`]).
    pub command: Vec<String>,
    /// The weights, as the worker's node sees them (a path or a hub id), passed verbatim.
    pub model_path: String,
    /// The model name requests carry (the server serves the model under it).
    pub served_name: String,
    /// GPUs per server (0: a CPU server).
    pub gpus: u32,
    /// Path that answers 2xx once the model can answer.
    pub ready_path: String,
    /// Path answering JSON with the server's version, and the field holding it.
    pub version_path: Option<String>,
    pub version_field: String,
    /// The version the sweep declares (checked against `version_path` when both exist).
    pub version: Option<String>,
    /// How long a start may take before the server is declared unable to start.
    pub start_timeout_ms: u64,
    /// Crashes in a row (each before the server stayed up `stable_ms`) after which the
    /// worker stops.
    pub max_restarts: u32,
    /// The first restart's delay (doubling with each crash in a row, up to a minute).
    pub restart_backoff_ms: u64,
    /// Up this long, a server's next crash starts a new count.
    pub stable_ms: u64,
    /// The GPU sets this worker runs a server on, one server each (set by the worker
    /// from its `--gpu` flags; empty for a CPU server: one server, no GPU).
    #[serde(default)]
    pub gpu_sets: Vec<Vec<u32>>,
}

impl ServerSpec {
    /// The command for one server: placeholders replaced with `port`, the GPU set and the
    /// spec's fields.
    pub fn expand(&self, port: u16, gpus: &[u32]) -> Vec<String> {
        expand(&self.command, &self.model_path, &self.served_name, port, gpus, self.gpus)
    }
}

/// Replace the placeholders of `command`. `{gpu_count}` is the spec's GPU count (the
/// set's size when a set is given), `{gpu_ids}` the set as `0,1`.
pub fn expand(
    command: &[String],
    model_path: &str,
    served_name: &str,
    port: u16,
    gpus: &[u32],
    gpu_count: u32,
) -> Vec<String> {
    let count = if gpus.is_empty() { gpu_count } else { gpus.len() as u32 };
    let ids = gpu_list(gpus);
    command
        .iter()
        .map(|a| {
            a.replace("{model_path}", model_path)
                .replace("{port}", &port.to_string())
                .replace("{gpu_count}", &count.to_string())
                .replace("{served_name}", served_name)
                .replace("{gpu_ids}", &ids)
        })
        .collect()
}

/// `0,1`: a GPU set as `CUDA_VISIBLE_DEVICES` and `--gpu` write it.
pub fn gpu_list(gpus: &[u32]) -> String {
    gpus.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(",")
}

/// The `{word}` placeholders of `arg` that are not known ones (a typo would otherwise
/// reach the server verbatim). Braces around anything but a lowercase word (JSON, say)
/// are not placeholders.
pub fn unknown_placeholders(arg: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = arg;
    while let Some(start) = rest.find('{') {
        let after = &rest[start + 1..];
        match after.find('}') {
            Some(end) => {
                let word = &after[..end];
                let is_word =
                    !word.is_empty() && word.chars().all(|c| c.is_ascii_lowercase() || c == '_');
                let p = format!("{{{word}}}");
                if is_word && !PLACEHOLDERS.contains(&p.as_str()) {
                    out.push(p);
                }
                rest = &after[end + 1..];
            }
            None => break,
        }
    }
    out
}

/// The identity of a managed server's model (see the module docs). `identity_args` are
/// the generation-relevant arguments: a custom command's arguments (placeholders
/// unexpanded, without the program), or a preset's extra `args`.
pub fn identity(
    kind: &str,
    name: &str,
    revision: &str,
    version: Option<&str>,
    identity_args: &[String],
) -> String {
    let mut h = blake3::Hasher::new();
    for a in identity_args {
        h.update(&(a.len() as u64).to_le_bytes());
        h.update(a.as_bytes());
    }
    let hex: String = h.finalize().as_bytes()[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("server:{kind}:{name}:{revision}:{}:{hex}", version.unwrap_or("-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Placeholders are replaced in place, inside longer arguments too; a GPU set gives
    /// the count and the ids.
    #[test]
    fn templates_expand() {
        let cmd: Vec<String> =
            ["srv", "--port={port}", "{model_path}", "-tp", "{gpu_count}", "--ids", "{gpu_ids}"]
                .map(String::from)
                .to_vec();
        let out = expand(&cmd, "/m", "m", 8123, &[2, 3], 2);
        assert_eq!(out, ["srv", "--port=8123", "/m", "-tp", "2", "--ids", "2,3"]);
        let cpu = expand(&cmd, "/m", "m", 1, &[], 0);
        assert_eq!((cpu[4].as_str(), cpu[6].as_str()), ("0", ""));
    }

    /// A typo is caught; JSON in an argument is not a placeholder.
    #[test]
    fn unknown_placeholders_are_found() {
        assert_eq!(unknown_placeholders("--port={prot}"), ["{prot}"]);
        assert!(unknown_placeholders("{\"temperature\": 0}").is_empty());
        assert!(unknown_placeholders("{port}:{gpu_ids}").is_empty());
        for p in &PRESETS {
            for a in p.command {
                assert!(unknown_placeholders(a).is_empty(), "{}: {a}", p.kind);
            }
        }
    }

    /// The identity depends on what determines the answers, not on where they come from.
    #[test]
    fn identity_is_location_independent() {
        let a = identity("vllm", "m", "abc", None, &["--dtype".into(), "bf16".into()]);
        assert!(a.starts_with("server:vllm:m:abc:-:"), "{a}");
        assert_eq!(a, identity("vllm", "m", "abc", None, &["--dtype".into(), "bf16".into()]));
        assert_ne!(a, identity("vllm", "m", "abc", None, &["--dtype".into(), "fp16".into()]));
        assert_ne!(a, identity("vllm", "m", "abd", None, &["--dtype".into(), "bf16".into()]));
        assert_ne!(a, identity("sglang", "m", "abc", None, &["--dtype".into(), "bf16".into()]));
        assert_ne!(
            a,
            identity("vllm", "m", "abc", Some("0.6"), &["--dtype".into(), "bf16".into()])
        );
        // Argument boundaries count: ["ab","c"] is not ["a","bc"].
        assert_ne!(
            identity("k", "m", "r", None, &["ab".into(), "c".into()]),
            identity("k", "m", "r", None, &["a".into(), "bc".into()])
        );
    }
}

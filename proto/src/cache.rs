//! The result cache's policy per model (issue 51): the sweep's `cache = "…"`.

use serde::{Deserialize, Serialize};

/// Whether a model's jobs are answered from the result cache and whether its answers are
/// written to it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CachePolicy {
    /// Answer from the cache; write what is paid for (the default, except for the
    /// backends [`CachePolicy::default_for`] leaves out).
    #[default]
    ReadWrite,
    /// Answer from the cache; write nothing.
    Read,
    /// Never answer from the cache (every call is made); write what is paid for.
    Write,
    /// Neither: fresh calls, nothing written (e.g. to draw new samples).
    Off,
}

impl CachePolicy {
    /// The policy of a model whose sweep names none: `off` for the backends that cost
    /// nothing and are not a model (`noop`, `replay`: a cache would only add a write per
    /// job), `read-write` for the rest (paid APIs, and `gguf`/`embed`, whose local compute
    /// a cache hit saves).
    pub fn default_for(backend: &str) -> CachePolicy {
        match backend {
            "noop" | "replay" => CachePolicy::Off,
            _ => CachePolicy::ReadWrite,
        }
    }

    pub fn reads(self) -> bool {
        matches!(self, CachePolicy::ReadWrite | CachePolicy::Read)
    }

    pub fn writes(self) -> bool {
        matches!(self, CachePolicy::ReadWrite | CachePolicy::Write)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CachePolicy::ReadWrite => "read-write",
            CachePolicy::Read => "read",
            CachePolicy::Write => "write",
            CachePolicy::Off => "off",
        }
    }
}

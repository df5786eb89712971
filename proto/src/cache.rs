//! The result cache's policy per model (issue 51): the sweep's `cache = "…"`.

use serde::{Deserialize, Serialize};

/// Whether a model's jobs are answered from the result cache and whether its answers are
/// written to it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CachePolicy {
    /// Answer from the cache; write what is paid for (the default).
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

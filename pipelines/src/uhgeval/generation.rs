//! UHGEval's generation parameters (spec §1.2: temperature 0.1, top_p 0.9, top_k 5, seed
//! 22) and which of them each backend takes (issue 16). Temperature and seed are the
//! model's own settings; top_p and top_k are set here.

use serde::{Deserialize, Serialize};

/// UHGEval's nucleus and top-k parameters (spec §1.2: top_p 0.9, top_k 5).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Generation {
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
}

impl Default for Generation {
    fn default() -> Self {
        Generation { top_p: Some(0.9), top_k: Some(5) }
    }
}

/// Which of [`Generation`] a model's requests carry, and why any is missing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AppliedGeneration {
    pub requested: Generation,
    pub applied: Generation,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Generation {
    /// What a model on `backend` gets: local models (`gguf`) both, OpenAI-compatible APIs
    /// (and replays of them) `top_p` only, anything else none.
    pub fn applied_to(self, backend: &str) -> AppliedGeneration {
        let (applied, note) = match backend {
            "gguf" => (self, None),
            "openai" | "replay" => (
                Generation { top_p: self.top_p, top_k: None },
                self.top_k.map(|_| {
                    "top_k not sent: the OpenAI chat API has no top_k parameter".to_string()
                }),
            ),
            other => (
                Generation { top_p: None, top_k: None },
                Some(format!("backend {other} takes no sampling parameters")),
            ),
        };
        AppliedGeneration { requested: self, applied, note }
    }
}

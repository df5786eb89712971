//! `price = { input = …, output = … }` on a model: USD per million input and output
//! tokens, for cost accounting and `--max-cost` (see [`crate::cost`]).

use serde::{Deserialize, Serialize};

use super::error::{key_err, SweepError};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPrice {
    input: f64,
    output: f64,
}

/// Check a model's price (`k` names a key of this model).
pub(super) fn check(
    f: &str,
    k: &dyn Fn(&str) -> String,
    raw: Option<&RawPrice>,
) -> Result<Option<Price>, SweepError> {
    let Some(p) = raw else { return Ok(None) };
    for (key, v) in [("input", p.input), ("output", p.output)] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(key_err(
                f,
                k(&format!("price.{key}")),
                format!("{v} is not a price (USD per million tokens, ≥ 0)"),
            ));
        }
    }
    Ok(Some(Price { input: p.input, output: p.output }))
}

/// USD per million tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Price {
    pub input: f64,
    pub output: f64,
}

impl Price {
    pub fn cost(&self, prompt_tokens: u64, completion_tokens: u64) -> f64 {
        (prompt_tokens as f64 * self.input + completion_tokens as f64 * self.output) / 1e6
    }
    pub fn is_paid(&self) -> bool {
        self.input > 0.0 || self.output > 0.0
    }
}

//! `price = { input = …, output = … }` on a model: USD per million input and output
//! tokens, for cost accounting and `--max-cost` (see [`crate::cost`]).

use serde::Deserialize;

use super::{key_err, SweepError};
use crate::cost::Price;

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

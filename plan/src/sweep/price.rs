//! `price = { input = …, output = … }` on a model: USD per million input and output
//! tokens, for cost accounting and `--max-cost` (see [`crate::cost`]). Prompt caching
//! (issue 52) adds `cache_write_5m`, `cache_write_1h` and `cache_read`: USD per million
//! prompt tokens written to the provider's cache (by the entry's lifetime) and read from
//! it. Left out, they are Anthropic's published multiples of `input` (1.25×, 2× and
//! 0.1×, "Prompt caching: pricing").

use halyard_proto::Usage;
use serde::{Deserialize, Serialize};

use super::error::{key_err, SweepError};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPrice {
    input: f64,
    output: f64,
    cache_write_5m: Option<f64>,
    cache_write_1h: Option<f64>,
    cache_read: Option<f64>,
}

/// Anthropic's cache prices as multiples of the input price: a 5-minute write, a
/// 1-hour write, a read.
pub const CACHE_MULTIPLES: [f64; 3] = [1.25, 2.0, 0.1];

/// Check a model's price (`k` names a key of this model).
pub(super) fn check(
    f: &str,
    k: &dyn Fn(&str) -> String,
    raw: Option<&RawPrice>,
) -> Result<Option<Price>, SweepError> {
    let Some(p) = raw else { return Ok(None) };
    let given = [
        ("input", Some(p.input)),
        ("output", Some(p.output)),
        ("cache_write_5m", p.cache_write_5m),
        ("cache_write_1h", p.cache_write_1h),
        ("cache_read", p.cache_read),
    ];
    for (key, v) in given {
        let Some(v) = v else { continue };
        if !(v.is_finite() && v >= 0.0) {
            return Err(key_err(
                f,
                k(&format!("price.{key}")),
                format!("{v} is not a price (USD per million tokens, ≥ 0)"),
            ));
        }
    }
    Ok(Some(Price {
        input: p.input,
        output: p.output,
        cache_write_5m: p.cache_write_5m,
        cache_write_1h: p.cache_write_1h,
        cache_read: p.cache_read,
    }))
}

/// USD per million tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Price {
    pub input: f64,
    pub output: f64,
    /// Prompt tokens written to the cache for 5 minutes (default 1.25 × `input`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_5m: Option<f64>,
    /// Prompt tokens written to the cache for 1 hour (default 2 × `input`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_1h: Option<f64>,
    /// Prompt tokens read from the cache (default 0.1 × `input`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read: Option<f64>,
}

impl Price {
    /// Input and output prices; cache prices at their default multiples of `input`.
    pub fn new(input: f64, output: f64) -> Price {
        Price { input, output, ..Price::default() }
    }

    /// Every rate times `factor` (a batch API's discount applies to all of them).
    pub fn scaled(&self, factor: f64) -> Price {
        // Default cache rates are multiples of `input`, so they scale with it.
        Price {
            input: self.input * factor,
            output: self.output * factor,
            cache_write_5m: self.cache_write_5m.map(|v| v * factor),
            cache_write_1h: self.cache_write_1h.map(|v| v * factor),
            cache_read: self.cache_read.map(|v| v * factor),
        }
    }

    /// The cache rates (5-minute write, 1-hour write, read), given or by default.
    pub fn cache_rates(&self) -> [f64; 3] {
        let [m5, m1, mr] = CACHE_MULTIPLES;
        [
            self.cache_write_5m.unwrap_or(self.input * m5),
            self.cache_write_1h.unwrap_or(self.input * m1),
            self.cache_read.unwrap_or(self.input * mr),
        ]
    }

    /// USD of one call's usage: its uncached prompt tokens at `input`, its cache writes
    /// and reads at their own rates, its completion at `output`.
    pub fn cost(&self, usage: &Usage) -> f64 {
        let c = usage.cache.unwrap_or_default();
        let [w5, w1, r] = self.cache_rates();
        (usage.uncached_prompt_tokens() as f64 * self.input
            + c.write_5m as f64 * w5
            + c.write_1h as f64 * w1
            + c.read as f64 * r
            + usage.completion_tokens as f64 * self.output)
            / 1e6
    }

    pub fn is_paid(&self) -> bool {
        self.input > 0.0 || self.output > 0.0
    }
}

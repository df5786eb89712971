//! `mode = "batch"` on a model: its pool sends requests through the provider's batch API
//! (`batch_size`, `batch_wait_s`, `batch_queue_tokens`), billed at `batch_price` (by
//! default half of `price`). Models that share a pool share its mode and batch settings.
//! Job ids do not depend on the mode, so a sweep can switch modes and keep its
//! checkpoints.

use halyard_proto::pool::BatchSpec;

use super::error::{key_err, SweepError};
use super::price::{self, Price, RawPrice};

/// Default requests per provider batch.
pub const DEFAULT_BATCH_SIZE: u32 = 1000;
/// Default time a worker gathers jobs before it submits a batch that is not full.
pub const DEFAULT_BATCH_WAIT_S: f64 = 60.0;
/// The batch price when none is given: this share of the online price (what OpenAI and
/// most providers charge for their batch APIs).
pub const DEFAULT_BATCH_DISCOUNT: f64 = 0.5;

/// A model's batch keys, as given.
pub(super) struct RawBatch<'a> {
    pub mode: Option<&'a str>,
    pub batch_size: Option<i64>,
    pub batch_wait_s: Option<f64>,
    pub batch_queue_tokens: Option<i64>,
    pub batch_price: Option<&'a RawPrice>,
}

/// Check a model's batch keys: its batch settings (None in online mode) and the price its
/// calls are billed at (the batch price in batch mode).
pub(super) fn check(
    f: &str,
    k: &dyn Fn(&str) -> String,
    backend: &str,
    raw: RawBatch<'_>,
    price: Option<Price>,
) -> Result<(Option<BatchSpec>, Option<Price>), SweepError> {
    let batch = match raw.mode.unwrap_or("online") {
        "online" => false,
        "batch" => true,
        other => {
            return Err(key_err(
                f,
                k("mode"),
                format!("{other:?} is neither \"online\" nor \"batch\""),
            ))
        }
    };
    if !batch {
        for (key, set) in [
            ("batch_size", raw.batch_size.is_some()),
            ("batch_wait_s", raw.batch_wait_s.is_some()),
            ("batch_queue_tokens", raw.batch_queue_tokens.is_some()),
            ("batch_price", raw.batch_price.is_some()),
        ] {
            if set {
                return Err(key_err(f, k(key), "only applies with mode = \"batch\""));
            }
        }
        return Ok((None, price));
    }
    if !super::backends::row(backend).is_some_and(|r| r.batch_api) {
        return Err(key_err(
            f,
            k("mode"),
            format!(
                "\"batch\" needs backend {} (one with a provider batch API), not {backend:?}",
                super::backends::names_where(|r| r.batch_api)
            ),
        ));
    }
    let batch_size = raw.batch_size.unwrap_or(DEFAULT_BATCH_SIZE as i64);
    if !(1..=BatchSpec::MAX_SIZE as i64).contains(&batch_size) {
        return Err(key_err(
            f,
            k("batch_size"),
            format!("{batch_size} is outside 1..={} requests", BatchSpec::MAX_SIZE),
        ));
    }
    let wait = raw.batch_wait_s.unwrap_or(DEFAULT_BATCH_WAIT_S);
    if !(wait.is_finite() && (0.0..=86_400.0).contains(&wait)) {
        return Err(key_err(f, k("batch_wait_s"), format!("{wait} is outside 0..=86400 seconds")));
    }
    let queue_tokens = match raw.batch_queue_tokens {
        None => None,
        Some(t) if (1..=1_000_000_000_000).contains(&t) => Some(t as u64),
        Some(t) => {
            return Err(key_err(
                f,
                k("batch_queue_tokens"),
                format!("{t} is outside 1..=1000000000000 tokens"),
            ))
        }
    };
    let billed = match price::check(f, &|key: &str| k(&format!("batch_{key}")), raw.batch_price)? {
        Some(p) => Some(p),
        None => price.map(|p| p.scaled(DEFAULT_BATCH_DISCOUNT)),
    };
    let spec = BatchSpec {
        batch_size: batch_size as u32,
        batch_wait_ms: (wait * 1000.0) as u64,
        queue_tokens,
    };
    Ok((Some(spec), billed))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::{parse, Sweep, SweepError};
    use super::*;

    fn sweep(models: &str) -> Result<Sweep, SweepError> {
        let text = format!(
            "name = \"b\"\n{models}\n[[model]]\nname = \"free\"\nbackend = \"noop\"\n\n\
             [[benchmark]]\npipeline = \"noop\"\njobs = 1\nmodels = [\"free\"]\n"
        );
        parse(Path::new("b.toml"), &text)
    }

    fn model(name: &str, pool: &str, keys: &str) -> String {
        format!("[[model]]\nname = \"{name}\"\nbackend = \"openai\"\nbase_url = \"http://x/v1\"\nmodel = \"m\"\npool = \"{pool}\"\n{keys}\n")
    }

    fn key_error(r: Result<Sweep, SweepError>) -> (String, String) {
        match r {
            Err(SweepError::Key { key, reason, .. }) => (key, reason),
            other => panic!("expected a key error, got {other:?}"),
        }
    }

    /// Batch keys reach the model and the worker plan; the batch price defaults to half
    /// the price; online stays the default with no batch settings.
    #[test]
    fn batch_mode_keys() {
        let s = sweep(&model(
            "a",
            "p",
            "mode = \"batch\"\nbatch_size = 50\nbatch_wait_s = 2.5\nbatch_queue_tokens = 90000\nprice = { input = 2.0, output = 8.0 }",
        ))
        .unwrap();
        let b = s.models[0].batch.unwrap();
        assert_eq!(b, BatchSpec { batch_size: 50, batch_wait_ms: 2500, queue_tokens: Some(90000) });
        assert_eq!(s.models[0].price, Some(Price::new(1.0, 4.0)));
        assert_eq!(crate::worker_plan::worker_plan(&s).pool("p").unwrap().batch, Some(b));
        let s = sweep(&model(
            "a",
            "p",
            "mode = \"batch\"\nprice = { input = 2.0, output = 8.0 }\nbatch_price = { input = 1.5, output = 3.0 }",
        ))
        .unwrap();
        assert_eq!(s.models[0].price, Some(Price::new(1.5, 3.0)));
        let b = s.models[0].batch.unwrap();
        assert_eq!((b.batch_size, b.batch_wait_ms, b.queue_tokens), (1000, 60_000, None));
        let s = sweep(&model("a", "p", "price = { input = 2.0, output = 8.0 }")).unwrap();
        assert_eq!((s.models[0].batch, s.models[0].price.unwrap().input), (None, 2.0));
    }

    /// The shipped batch example is a valid sweep whose two models share one batch pool,
    /// billed at half price.
    #[test]
    fn the_batch_example_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/hypotermqa-batch.toml");
        let s = crate::sweep::load(&path).unwrap();
        assert_eq!(s.models.len(), 2);
        for m in &s.models {
            assert_eq!(m.spec.pool, "openai-batch");
            assert_eq!(m.batch.map(|b| b.batch_size), Some(1000));
            assert_eq!(m.price, Some(Price::new(0.075, 0.30)));
        }
    }

    /// Bad values, keys without batch mode, a backend without a batch API and models of
    /// one pool in different modes are key errors that say what is wrong.
    #[test]
    fn bad_batch_keys() {
        let cases = [
            ("mode = \"later\"", "model[0].mode", "neither"),
            ("batch_size = 5", "model[0].batch_size", "only applies with mode"),
            ("mode = \"batch\"\nbatch_size = 0", "model[0].batch_size", "outside 1..=10000"),
            ("mode = \"batch\"\nbatch_size = 10001", "model[0].batch_size", "outside"),
            ("mode = \"batch\"\nbatch_wait_s = -1", "model[0].batch_wait_s", "outside"),
            ("mode = \"batch\"\nbatch_queue_tokens = 0", "model[0].batch_queue_tokens", "outside"),
            (
                "mode = \"batch\"\nbatch_price = { input = -1, output = 1 }",
                "model[0].batch_price.input",
                "not a price",
            ),
        ];
        for (keys, key, reason) in cases {
            let (k, r) = key_error(sweep(&model("a", "p", keys)));
            assert_eq!(k, key, "{keys}");
            assert!(r.contains(reason), "{keys}: {r}");
        }
        let (k, r) =
            key_error(sweep("[[model]]\nname = \"n\"\nbackend = \"noop\"\nmode = \"batch\"\n"));
        assert_eq!(k, "model[0].mode");
        assert!(r.contains("needs backend \"openai\""), "{r}");
        let (k, r) =
            key_error(sweep(&(model("a", "p", "mode = \"batch\"") + &model("b", "p", ""))));
        assert_eq!(k, "model[1]");
        assert!(r.contains("mode \"online\"") && r.contains("mode \"batch\""), "{r}");
    }
}

//! Pool quotas in the sweep: `rpm`, `tpm`, `burst` and `tpm_counts` on a model, and
//! `itpm`/`otpm` (input and output tokens per minute, separate limits as Anthropic sets
//! them; issue 52). Models
//! that share a `pool` share its quota (one API key's limits), so they must agree on it:
//! a model may leave the keys out, and the pool takes them from the models that give them.

pub use halyard_proto::pool::QuotaSpec;
use halyard_proto::pool::TpmCounts;

use super::error::{key_err, SweepError};

/// The quota keys of one model (or one `--quota` flag), as given.
#[derive(Clone, Copy, Debug, Default)]
pub struct RawQuota<'a> {
    pub rpm: Option<i64>,
    pub tpm: Option<i64>,
    pub burst: Option<i64>,
    pub tpm_counts: Option<&'a str>,
    pub itpm: Option<i64>,
    pub otpm: Option<i64>,
}

/// Check quota values given elsewhere (a worker's `--quota`); the error says what is wrong.
pub fn check_quota(q: RawQuota<'_>) -> Result<Option<QuotaSpec>, String> {
    model_quota("", &|k: &str| k.to_string(), q).map_err(|e| match e {
        SweepError::Key { key, reason, .. } => format!("{key}: {reason}"),
        other => other.to_string(),
    })
}

/// Check one model's quota keys (`k` names a key of this model).
pub(super) fn model_quota(
    f: &str,
    k: &dyn Fn(&str) -> String,
    q: RawQuota<'_>,
) -> Result<Option<QuotaSpec>, SweepError> {
    let RawQuota { rpm, tpm, burst, tpm_counts, itpm, otpm } = q;
    let rpm = match rpm {
        None => None,
        Some(r) if (1..=10_000_000).contains(&r) => Some(r as u32),
        Some(r) => {
            return Err(key_err(
                f,
                k("rpm"),
                format!("{r} is outside 1..=10000000 (requests per minute)"),
            ))
        }
    };
    let tpm = match tpm {
        None => None,
        Some(t) if (1..=10_000_000_000).contains(&t) => Some(t as u64),
        Some(t) => {
            return Err(key_err(
                f,
                k("tpm"),
                format!("{t} is outside 1..=10000000000 (tokens per minute)"),
            ))
        }
    };
    let tokens = |v: Option<i64>, key: &str| match v {
        None => Ok(None),
        Some(t) if (1..=10_000_000_000).contains(&t) => Ok(Some(t as u64)),
        Some(t) => Err(key_err(
            f,
            k(key),
            format!("{t} is outside 1..=10000000000 ({key}: tokens per minute)"),
        )),
    };
    let (itpm, otpm) = (tokens(itpm, "itpm")?, tokens(otpm, "otpm")?);
    let tpm_counts = match (tpm_counts, tpm) {
        (None, _) => TpmCounts::default(),
        (Some(_), None) => return Err(key_err(f, k("tpm_counts"), "only applies with `tpm`")),
        (Some(c), Some(_)) => c.parse().map_err(|e: String| key_err(f, k("tpm_counts"), e))?,
    };
    if rpm.is_none() && tpm.is_none() && itpm.is_none() && otpm.is_none() {
        return match burst {
            Some(_) => Err(key_err(f, k("burst"), "only applies with `rpm` or `tpm`")),
            None => Ok(None),
        };
    }
    let burst = burst.unwrap_or(1);
    let limit = rpm.map_or(1_000_000, |r| r as i64);
    if !(1..=limit.min(1_000_000)).contains(&burst) {
        return Err(key_err(
            f,
            k("burst"),
            format!("{burst} is outside 1..={} (at most `rpm`)", limit.min(1_000_000)),
        ));
    }
    Ok(Some(QuotaSpec { rpm, tpm, burst: burst as u32, tpm_counts, itpm, otpm }))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::{parse, SweepError};
    use super::{QuotaSpec, TpmCounts};

    fn sweep(models: &str) -> Result<super::super::Sweep, SweepError> {
        let text = format!(
            "name = \"q\"\n{models}\n[[model]]\nname = \"free\"\nbackend = \"noop\"\n\n\
             [[benchmark]]\npipeline = \"noop\"\njobs = 1\nmodels = [\"free\"]\n"
        );
        parse(Path::new("q.toml"), &text)
    }

    fn model(name: &str, pool: &str, keys: &str) -> String {
        format!("[[model]]\nname = \"{name}\"\nbackend = \"openai\"\nbase_url = \"http://x/v1\"\nmodel = \"m\"\npool = \"{pool}\"\n{keys}\n")
    }

    fn key_error(r: Result<super::super::Sweep, SweepError>) -> (String, String) {
        match r {
            Err(SweepError::Key { key, reason, .. }) => (key, reason),
            other => panic!("expected a key error, got {other:?}"),
        }
    }

    /// Models of one pool share its quota; a model may leave it to the others.
    #[test]
    fn pool_quota_from_models() {
        let s = sweep(
            &(model("a", "key1", "rpm = 600\ntpm = 60000")
                + &model("b", "key1", "")
                + &model("c", "key2", "tpm = 5000\nburst = 3")),
        )
        .unwrap();
        assert_eq!(s.quotas.len(), 2);
        let q = |rpm, tpm, burst, tpm_counts| QuotaSpec {
            rpm,
            tpm,
            burst,
            tpm_counts,
            itpm: None,
            otpm: None,
        };
        assert_eq!(s.quotas["key1"], q(Some(600), Some(60000), 1, TpmCounts::MaxTokens));
        assert_eq!(s.quotas["key2"], q(None, Some(5000), 3, TpmCounts::MaxTokens));
        assert!(!s.quotas.contains_key("free"));
    }

    /// `tpm_counts` picks how the pool's tokens are counted, and reaches the worker plan.
    #[test]
    fn tpm_counts_is_a_pool_key() {
        let s = sweep(&model("a", "p", "tpm = 9000\ntpm_counts = \"usage\"")).unwrap();
        assert_eq!(s.quotas["p"].tpm_counts, TpmCounts::Usage);
        let plan = crate::worker_plan::worker_plan(&s);
        assert_eq!(plan.pool("p").unwrap().quota.unwrap().tpm_counts, TpmCounts::Usage);
        let (k, r) = key_error(sweep(&model("a", "p", "tpm = 9000\ntpm_counts = \"words\"")));
        assert_eq!(k, "model[0].tpm_counts");
        assert!(r.contains("\"words\"") && r.contains("usage"), "{r}");
        let (k, r) = key_error(sweep(&model("a", "p", "rpm = 9\ntpm_counts = \"usage\"")));
        assert_eq!((k.as_str(), r.as_str()), ("model[0].tpm_counts", "only applies with `tpm`"));
        // Models of one pool must agree on it too.
        let (k, r) = key_error(sweep(
            &(model("a", "p", "tpm = 9000\ntpm_counts = \"usage\"")
                + &model("b", "p", "tpm = 9000")),
        ));
        assert_eq!(k, "model[1]");
        assert!(r.contains("two quotas"), "{r}");
    }

    /// Bad values and disagreeing models name the key and say what is wrong.
    #[test]
    fn bad_quotas_are_key_errors() {
        let (k, r) = key_error(sweep(&model("a", "p", "rpm = 0")));
        assert_eq!(k, "model[0].rpm");
        assert!(r.contains("outside"), "{r}");
        let (k, _) = key_error(sweep(&model("a", "p", "tpm = -5")));
        assert_eq!(k, "model[0].tpm");
        let (k, r) = key_error(sweep(&model("a", "p", "burst = 2")));
        assert_eq!(k, "model[0].burst");
        assert!(r.contains("only applies"), "{r}");
        let (k, r) = key_error(sweep(&model("a", "p", "rpm = 10\nburst = 11")));
        assert_eq!(k, "model[0].burst");
        assert!(r.contains("at most `rpm`"), "{r}");
        let (k, r) =
            key_error(sweep(&(model("a", "p", "rpm = 10") + &model("b", "p", "rpm = 20"))));
        assert_eq!(k, "model[1]");
        assert!(r.contains("two quotas") && r.contains("\"p\""), "{r}");
        assert_eq!(
            super::check_quota(super::RawQuota {
                rpm: Some(5),
                burst: Some(9),
                ..Default::default()
            })
            .unwrap_err(),
            "burst: 9 is outside 1..=5 (at most `rpm`)"
        );
    }
}

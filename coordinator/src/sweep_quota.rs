//! Pool quotas in the sweep: `rpm`, `tpm` and `burst` on a model. Models that share a
//! `pool` share its quota (one API key's limits), so they must agree on it: a model may
//! leave the keys out, and the pool takes them from the models that give them.

use std::collections::BTreeMap;

use super::{key_err, Model, SweepError};

/// The quota of one pool, as the sweep gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaSpec {
    pub rpm: Option<u32>,
    pub tpm: Option<u64>,
    /// Largest burst of requests a worker sends at once (default 1).
    pub burst: u32,
}

/// Check quota values given elsewhere (a worker's `--quota`); the error says what is wrong.
pub fn check_quota(rpm: Option<i64>, tpm: Option<i64>, burst: Option<i64>) -> Result<Option<QuotaSpec>, String> {
    model_quota("", &|k: &str| k.to_string(), rpm, tpm, burst).map_err(|e| match e {
        SweepError::Key { key, reason, .. } => format!("{key}: {reason}"),
        other => other.to_string(),
    })
}

/// Check one model's quota keys (`k` names a key of this model).
pub(super) fn model_quota(
    f: &str,
    k: &dyn Fn(&str) -> String,
    rpm: Option<i64>,
    tpm: Option<i64>,
    burst: Option<i64>,
) -> Result<Option<QuotaSpec>, SweepError> {
    let rpm = match rpm {
        None => None,
        Some(r) if (1..=10_000_000).contains(&r) => Some(r as u32),
        Some(r) => return Err(key_err(f, k("rpm"), format!("{r} is outside 1..=10000000 (requests per minute)"))),
    };
    let tpm = match tpm {
        None => None,
        Some(t) if (1..=10_000_000_000).contains(&t) => Some(t as u64),
        Some(t) => return Err(key_err(f, k("tpm"), format!("{t} is outside 1..=10000000000 (tokens per minute)"))),
    };
    if rpm.is_none() && tpm.is_none() {
        return match burst {
            Some(_) => Err(key_err(f, k("burst"), "only applies with `rpm` or `tpm`")),
            None => Ok(None),
        };
    }
    let burst = burst.unwrap_or(1);
    let limit = rpm.map_or(1_000_000, |r| r as i64);
    if !(1..=limit.min(1_000_000)).contains(&burst) {
        return Err(key_err(f, k("burst"), format!("{burst} is outside 1..={} (at most `rpm`)", limit.min(1_000_000))));
    }
    Ok(Some(QuotaSpec { rpm, tpm, burst: burst as u32 }))
}

/// Every pool's quota; models of one pool that give different quotas are an error.
pub(super) fn pool_quotas(f: &str, models: &[Model]) -> Result<BTreeMap<String, QuotaSpec>, SweepError> {
    let mut pools: BTreeMap<String, (QuotaSpec, &str)> = BTreeMap::new();
    for (i, m) in models.iter().enumerate() {
        let Some(q) = m.quota else { continue };
        match pools.get(&m.spec.pool) {
            Some((other, name)) if *other != q => {
                return Err(key_err(
                    f,
                    format!("model[{i}]"),
                    format!(
                        "pool {:?} has two quotas: model {:?} gives {q:?}, model {name:?} gives {other:?} (models sharing a pool share one quota)",
                        m.spec.pool, m.spec.name
                    ),
                ))
            }
            Some(_) => {}
            None => {
                pools.insert(m.spec.pool.clone(), (q, &m.spec.name));
            }
        }
    }
    Ok(pools.into_iter().map(|(p, (q, _))| (p, q)).collect())
}

//! Checks across the models of a pool: models sharing a pool share one quota and one
//! mode (online or batch) with its settings.

use std::collections::BTreeMap;

use halyard_proto::pool::BatchSpec;

use super::error::{key_err, SweepError};
use super::models::Model;
use super::quota::QuotaSpec;

/// Every pool's quota; models of one pool that give different quotas are an error.
pub fn pool_quotas(f: &str, models: &[Model]) -> Result<BTreeMap<String, QuotaSpec>, SweepError> {
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

/// Models of one pool share its mode and batch settings; a disagreement names both.
pub fn check_pools(f: &str, models: &[Model]) -> Result<(), SweepError> {
    let mut pools: BTreeMap<&str, (Option<BatchSpec>, &str)> = BTreeMap::new();
    for (i, m) in models.iter().enumerate() {
        match pools.get(m.spec.pool.as_str()) {
            Some((other, name)) if *other != m.batch => {
                return Err(key_err(
                    f,
                    format!("model[{i}]"),
                    format!(
                        "pool {:?}: model {:?} gives {}, model {name:?} gives {} (models sharing a pool share its mode and batch settings)",
                        m.spec.pool,
                        m.spec.name,
                        describe(m.batch),
                        describe(*other)
                    ),
                ))
            }
            Some(_) => {}
            None => {
                pools.insert(&m.spec.pool, (m.batch, &m.spec.name));
            }
        }
    }
    Ok(())
}

fn describe(b: Option<BatchSpec>) -> String {
    match b {
        None => "mode \"online\"".into(),
        Some(b) => format!(
            "mode \"batch\" (batch_size {}, batch_wait_s {}, batch_queue_tokens {})",
            b.batch_size,
            b.batch_wait_ms as f64 / 1000.0,
            b.queue_tokens.map_or("unset".into(), |t| t.to_string())
        ),
    }
}

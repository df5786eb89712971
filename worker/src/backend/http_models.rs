//! The HTTP models of one backend, by pool: a job (admitted against the plan) is sent to
//! its pool's model, with that model's URL and API key variable, not anything from the
//! message. Every HTTP backend ([`super::BackendKind::http`]) keeps one.

use std::collections::HashMap;

use halyard_proto::pool::{HttpModelSpec, WorkerModel, WorkerPlan};
use halyard_proto::Job;

use crate::call_error::CallError;

/// The HTTP models of one backend, by pool.
#[derive(Debug, Default)]
pub struct HttpModels {
    by_pool: HashMap<String, Vec<HttpModelSpec>>,
}

impl HttpModels {
    /// The plan's HTTP models whose backend is `backend`.
    pub fn of(plan: &WorkerPlan, backend: &str) -> HttpModels {
        let mut by_pool: HashMap<String, Vec<HttpModelSpec>> = HashMap::new();
        for (pool, m) in plan.models() {
            if let WorkerModel::Http(h) = m {
                if h.backend == backend {
                    by_pool.entry(pool.name.clone()).or_default().push(h.clone());
                }
            }
        }
        HttpModels { by_pool }
    }

    /// Whether the plan has no model of this backend.
    pub fn is_empty(&self) -> bool {
        self.by_pool.is_empty()
    }

    /// The HTTP model of `job`'s pool that it calls. Jobs are admitted against the plan
    /// before they get here; a miss is refused all the same.
    pub fn model(&self, job: &Job) -> Result<&HttpModelSpec, CallError> {
        self.by_pool
            .get(&job.pool)
            .and_then(|ms| ms.iter().find(|h| h.serves(&job.key.model)))
            .ok_or_else(|| {
                CallError::permanent(format!(
                    "model {:?} at {:?} is not configured for pool {:?} on this worker",
                    halyard_proto::redact::secrets(&job.key.model.model),
                    halyard_proto::redact::url(&job.key.model.endpoint),
                    job.pool
                ))
            })
    }
}

//! The values every part of the judges' report is made of: a figure with its interval
//! (or why it has none) and how a MACE fit went. At the bottom of `judging`, so the
//! parts (`between`, `preference`, `truth`) and the report that gathers them
//! (`figures`) all take them from here.

use halyard_pipelines::metrics::interval::Interval;
use halyard_pipelines::metrics::mace::MaceConfig;
use serde::{Deserialize, Serialize};

/// A figure with its interval, or why there is none (too few units, one class).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Figure {
    Value(Interval),
    Undefined { undefined: String },
}

impl Figure {
    pub(crate) fn of(r: Result<Interval, halyard_pipelines::metrics::MetricError>) -> Figure {
        match r {
            Ok(i) => Figure::Value(i),
            Err(e) => Figure::Undefined { undefined: e.to_string() },
        }
    }

    pub fn estimate(&self) -> Option<f64> {
        match self {
            Figure::Value(i) => Some(i.estimate),
            Figure::Undefined { .. } => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MaceSummary {
    pub converged: bool,
    pub iterations: u32,
    pub restarts: u32,
    pub log_likelihood: f64,
    pub config: MaceConfig,
}

impl MaceSummary {
    /// How `fit` went, fitted with `config`.
    pub fn of(fit: &halyard_pipelines::metrics::mace::MaceResult, config: MaceConfig) -> Self {
        MaceSummary {
            converged: fit.converged,
            iterations: fit.iterations,
            restarts: fit.restarts,
            log_likelihood: fit.log_likelihood,
            config,
        }
    }
}

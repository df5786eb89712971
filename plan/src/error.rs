//! What planning or a benchmark's report could not do.

use crate::record::StoreError;
use crate::sweep::error::SweepError;

/// What planning or a benchmark's report could not do.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Sweep(#[from] SweepError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot write report in {dir}: {reason}")]
    Report { dir: String, reason: String },
}

//! AutoHall (arXiv 2310.00259; spec `shared/specs/metrics.md` §2; authors' code
//! `zouyingcao/AutoHall` @ 469ee6b).
//!
//! Per claim of a fact-checking file: a reference written by the model, the model's
//! classification of the claim given that reference, and the hallucination label
//! (classification ≠ gold); then self-contradiction detection with K sampled references
//! and pairwise conflict checks. Where the paper and the authors' code differ, the code's
//! rule is used (substring parses, first-N balancing, "any conflict" union), as the spec
//! records.
//!
//! Files, in pipeline order: [`dataset`] → [`plan`] → [`mod@score`].

pub mod baselines;
pub mod dataset;
pub mod plan;
pub mod score;

pub use baselines::{Baseline, BaselineLabels, BaselineVerdict};
pub use dataset::{nan_to_null, parse_claims, read_claims, Claim, ClaimSet, DatasetError};
pub use plan::{evaluate, Config, ItemLabel, Pair, Status, PIPELINE, STAGE_VERSION};
pub use score::{balanced_set, render_markdown, score, Report};

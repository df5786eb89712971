//! The Hallucination Vulnerability Index (Rawte et al. 2023, EMNLP; spec
//! `shared/specs/metrics.md` §4) as a pipeline.
//!
//! HVI is computed per model from sentence-level labels: `U` sentences, `N` hallucinated,
//! `N_EFM` extrinsic factual mirage, `N_ESL` extrinsic silver lining, with `P_EFM`,
//! `P_ESL`, `δ1`, `δ2` as explicit inputs ([`crate::metrics::hvi`]). The labels come from
//! one of two sources:
//! - **judge**: every model under test writes a passage for each prompt of a dataset
//!   whose prompts are marked factually correct or not (orientation: a correct prompt
//!   gives factual mirage (FM), an incorrect one silver lining (SL)); the passage is split
//!   into sentences and a judge labels each sentence (not hallucinated / intrinsic /
//!   extrinsic) with the prompt in [`judge`];
//! - **labelled file**: sentence labels made elsewhere (e.g. by annotators), one JSON
//!   object per line; no model is called.
//!
//! Files: [`dataset`] (both inputs) → [`judge`] (sentence split, prompt, verdict parser)
//! → [`plan`] → [`mod@score`].

pub mod dataset;
pub mod judge;
pub mod plan;
pub mod score;

pub use dataset::{read_labels, read_prompts, LabelRow, Prompt};
pub use plan::{
    evaluate, evaluate_labelled, Config, ItemLabel, ModelLabels, PIPELINE, STAGE_VERSION,
};
pub use score::{render_markdown, score, Probability, Report, Weights};

//! UHGEval (arXiv 2311.15296; spec `shared/specs/metrics.md` §1): Chinese news
//! continuations, evaluated in four forms by the model under test.
//!
//! - keyword level: is this keyword of the hallucinated continuation real?
//! - sentence level: is this continuation (hallucinated, then real) real?
//! - selective: which of two continuations is more realistic?
//! - generative: continue the news; BLEU-4, ROUGE-L, kwPrec (keywords extracted by the
//!   model under test), length, and "BERTScore" with a pluggable [`Embedder`].
//!
//! Rules follow the paper-era code (**\[paper\]**, default, the one that produced the
//! paper's numbers) or the rewrite (**\[v2\]**), chosen per benchmark
//! ([`crate::metrics::uhgeval::UhgVariant`]); the pure rules live in
//! [`crate::metrics::uhgeval`]. Files in pipeline order: [`dataset`] → [`plan`] (with
//! [`prompts`]) → [`mod@score`] (with [`embed`]).

pub mod dataset;
pub mod embed;
pub mod generation;
pub mod plan;
pub mod prompts;
pub mod render;
pub mod score;

pub use dataset::{parse_dataset, parse_line, read_dataset, DatasetError, NewsItem, NewsType};
pub use embed::{similarity, Embedder};
pub use plan::{
    evaluate, prepare, AppliedGeneration, Case, Config, Form, Generation, ItemLabel, PIPELINE,
    STAGE_VERSION,
};
pub use render::render_markdown;
pub use score::{score, score_config, Report, BERT_NOT_COMPUTED};

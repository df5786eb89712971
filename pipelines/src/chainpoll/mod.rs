//! ChainPoll (Friel & Sanyal, arXiv 2310.18344; spec `shared/specs/metrics.md` §3) on
//! labelled (prompt, completion[, context]) items, with the SelfCheck-NGram unigram
//! baseline (§3.4) and, from a probability model's token log-probabilities, the Max and
//! mean pseudo-entropy (§3.3) and SelfCheckGPT's Avg/Max(−log p) baselines.
//!
//! A judge LLM is polled N times per item with a detailed chain-of-thought prompt
//! (Correctness: open-domain; Adherence: closed-domain, against the item's context); the
//! score is the share of "yes, hallucinated" verdicts, and the figure is its AUROC
//! against the labels. The authors published neither prompts nor verdict parser: the
//! prompts and the parsing rule are Halyard's own (see [`plan`]).
//!
//! Files, in pipeline order: [`dataset`] → [`plan`] → [`mod@score`].

pub mod aggregate;
pub mod baselines;
pub mod dataset;
pub mod plan;
pub mod score;

pub use aggregate::{realhall_aggregate, Aggregate, AggregateRow};
pub use baselines::{LogprobScores, SelfCheckLabel};
pub use dataset::{parse_items, read_items, DatasetError, Item, ItemSet};
pub use plan::{
    evaluate, reread_verdicts, sentences, Config, ItemLabel, Metric, MetricLabel, Poll, PIPELINE,
    STAGE_VERSION,
};
pub use score::{render_markdown, score, LogprobReport, Report};

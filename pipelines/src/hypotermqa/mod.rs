//! HypoTermQA evaluation (arXiv 2402.16211; spec `shared/specs/hypotermqa.md`).
//!
//! A model answers questions that mention a made-up (hypothetical) term or only real
//! ones; a judge LLM then checks, per term, whether the answer accepts the term and uses
//! it in its real meaning. The HypoTermQA Score (HTS) is the share of hypothetical
//! questions answered without hallucination.
//!
//! Two semantics ([`Semantics`]), stated in every label and report:
//! - `paper` (default): Halyard's reading of the paper, with Unicode-aware string
//!   matching, a strict judge-output reader with retries, and an explicit `judge_error`.
//! - `reference`: the authors' code (`cemuluoglakci/HypoTermQA` @ 1892317) reproduced
//!   exactly (string match, response parser, term labels), except for its df-path bug
//!   that mistakes a hypothetical term listed second for a valid one.
//!
//! Files, in pipeline order: [`dataset`] → [`plan`] (uses [`prompts`],
//! [`string_match`], [`judge`] with [`pyjson`], [`labels`]) → [`mod@score`].

use serde::{Deserialize, Serialize};

pub mod dataset;
pub mod judge;
pub mod labels;
pub mod plan;
pub mod prompts;
pub mod pyjson;
pub mod score;
pub mod string_match;

pub use dataset::{
    parse_dataset, parse_line, read_dataset, DatasetError, Question, QuestionType, ReplacementType,
    Term, TermSet,
};
pub use judge::Certainty;
pub use labels::{
    AnswerLabel, CheckRow, EvalType, ItemLabel, JudgeAttempt, JudgeCheck, Label, TermEval,
};
pub use plan::{evaluate, Config, PIPELINE, STAGE_VERSION};
pub use score::{render_markdown, score, QuestionCounts, Report, ScoreMeta};
pub use string_match::{paper_includes, reference_includes};

/// Which definition of the benchmark produced a label or a report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Semantics {
    /// Halyard's reading of the paper.
    #[default]
    Paper,
    /// The authors' public code, reproduced exactly.
    Reference,
}

impl Semantics {
    pub fn as_str(self) -> &'static str {
        match self {
            Semantics::Paper => "paper",
            Semantics::Reference => "reference",
        }
    }
}

//! UHGEval's rules as pure functions (spec §1; paper-era code S2 `IAAR-Shanghai/UHGEval`
//! @ c62c2a8 = **\[paper\]**, the "Eval Suite" rewrite S3 @ affd38e = **\[v2\]**).
//!
//! ## Layout
//! - [`parse`]: echo removal, the first-sentence rule, and the keyword-level,
//!   sentence-level and selective answer parsers (§1.2–§1.5);
//! - [`keyword`]: keyword-level candidates, balancing, item accuracy and validity, and the
//!   "avg. acc. / avg. #kws / #valid" overall (§1.3);
//! - [`sentence`]: sentence-level item accuracy, validity and overall (§1.4);
//! - [`selective`]: option order (\[paper\] seeded swaps, \[v2\] length parity), correctness
//!   and overall accuracy (§1.5), with `pyrandom` reproducing CPython's `random`;
//! - [`generative`]: continuation, validity, BLEU-4 / ROUGE-L / kwPrec / length per item
//!   and their averages (§1.6);
//! - [`schedule`]: the \[paper\] block coverage and the \[v2\] batch sizes (§1.8).
//!
//! `#valid` (§1.7) is the `num` of every overall: the number of items whose result is
//! valid under the variant's rule. Per-type breakdowns apply the same overall function to
//! the valid items of one `type`.

use serde::{Deserialize, Serialize};

pub mod generative;
pub mod keyword;
pub mod parse;
mod pyrandom;
pub mod schedule;
pub mod selective;
pub mod sentence;

pub use generative::{
    continuation_from_answer, generative_item, generative_overall, generative_valid,
    GenerativeItem, GenerativeOverall,
};
pub use keyword::{
    keyword_item, keyword_overall, select_keywords_paper, select_keywords_v2, split_annotation,
    KeywordCase, KeywordItem, KeywordOverall,
};
pub use parse::{
    first_sentence, judgement_reason, parse_keyword_judgement, parse_selective_choice,
    parse_sentence_judgement, strip_echo, Choice, Judgement,
};
pub use schedule::{paper_block_coverage, v2_batch_sizes, BlockCoverage};
pub use selective::{
    option_order_v2, paper_option_orders, selective_item, selective_overall, OptionOrder,
    SelectiveItem,
};
pub use sentence::{sentence_item, sentence_overall, AccuracyOverall, SentenceItem};

/// Which UHGEval code a rule follows (spec §0, §1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UhgVariant {
    /// The paper-era code, which produced the paper's numbers. Report this.
    #[default]
    Paper,
    /// The 2024–25 rewrite, for comparison with its logs.
    V2,
}

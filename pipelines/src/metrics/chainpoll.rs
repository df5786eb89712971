//! The ChainPoll score (spec §3.1) and the two ways of reading a judge's verdict.
//!
//! The authors published neither their prompts nor their verdict parser. Two parsers are
//! offered:
//! - [`parse_verdict_first_word`]: the third-party re-implementation (S10,
//!   `cisco-open/polygraphLLM`), for prompts that demand the verdict first;
//! - [`parse_verdict_final_answer`]: the spec's recommendation for the paper's
//!   CoT-then-answer prompts, the **last** standalone `yes`/`no` word. This is the
//!   reference implementation's rule, kept for the golden vectors (spec §5.4); it is
//!   lenient: "This is false; there is no evidence" reads as *no*, and so does a judge
//!   that echoes the instruction line (issue 29).
//! - [`parse_verdict_answer_line`]: what the ChainPoll pipeline uses (issue 29): the
//!   verdict is read only from the final line that Halyard's prompts require,
//!   `Answer: yes` or `Answer: no`; without it the poll is unparseable, with the reason
//!   ([`Unreadable`]). **A deliberate deviation from the reference rule**: a stray
//!   "yes"/"no" in the reasoning is not a verdict.
//!
//! Unparseable polls (only the last two parsers have them) count as chosen by
//! [`Unparseable`]; the default, [`Unparseable::Exclude`], is this module's choice where
//! the spec leaves it open (see its doc).

use serde::{Deserialize, Serialize};

use super::MetricError;

/// ChainPoll score (spec §3.1 step 3): the share of polls that say "yes, hallucinated",
/// `#yes / N`, in {0, 1/N, …, 1}. A ranking score, not a probability. `Empty` for N = 0.
pub fn chainpoll_score(verdicts: &[bool]) -> Result<f64, MetricError> {
    if verdicts.is_empty() {
        return Err(MetricError::Empty { what: "ChainPoll verdicts" });
    }
    Ok(verdicts.iter().filter(|&&v| v).count() as f64 / verdicts.len() as f64)
}

/// How polls whose verdict could not be read count in the score (spec §3.1 asks the
/// implementation to decide and document).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Unparseable {
    /// **Default.** Left out of both numerator and N: a poll without a verdict carries no
    /// evidence either way, and counting it as "no" would bias the score of a judge that
    /// often fails to conclude towards "not hallucinated". If no poll parses, the score
    /// is undefined (an error), which a caller should re-poll or report.
    #[default]
    Exclude,
    /// Counted as "no" (not hallucinated), keeping N fixed.
    CountAsNo,
}

/// ChainPoll score over parsed polls (`None` = unparseable), with `policy` deciding how
/// the unparseable ones count (spec §3.1). Errors: `Empty` for no polls; `Undefined`
/// under [`Unparseable::Exclude`] when no poll parsed.
pub fn chainpoll_score_parsed(
    verdicts: &[Option<bool>],
    policy: Unparseable,
) -> Result<f64, MetricError> {
    if verdicts.is_empty() {
        return Err(MetricError::Empty { what: "ChainPoll verdicts" });
    }
    let yes = verdicts.iter().filter(|v| **v == Some(true)).count();
    let n = match policy {
        Unparseable::Exclude => verdicts.iter().filter(|v| v.is_some()).count(),
        Unparseable::CountAsNo => verdicts.len(),
    };
    if n == 0 {
        return Err(MetricError::Undefined {
            what: "ChainPoll score",
            reason: "no poll gave a readable verdict",
        });
    }
    Ok(yes as f64 / n as f64)
}

/// The verdict as S10 reads it (spec §3.1): `response.lower().startswith("yes")`, no
/// stripping, so anything else (including "No", "Nope", leading spaces and "") is `false`.
/// It never fails; use it only with prompts that demand the verdict as the first word.
pub fn parse_verdict_first_word(response: &str) -> bool {
    // Only ASCII Y/E/S lower-case to ASCII y/e/s, so an ASCII case-insensitive prefix test
    // is exactly Python's `lower().startswith("yes")`.
    response.get(..3).is_some_and(|p| p.eq_ignore_ascii_case("yes"))
}

/// The verdict of a CoT-then-answer judge (spec §3.1 recommendation): the **last**
/// standalone word `yes` or `no`, case-insensitive, where a word is a maximal run of
/// alphanumeric characters or `_` (Python's `\w`), so "Answer: yes", "Final answer: No."
/// and "...\nYES" parse, while "cannot", "nope", "yesterday" are not verdict words.
/// `None` when the text holds neither word.
pub fn parse_verdict_final_answer(response: &str) -> Option<bool> {
    response.split(|c: char| !(c.is_alphanumeric() || c == '_')).rev().find_map(|w| {
        if w.eq_ignore_ascii_case("yes") {
            Some(true)
        } else if w.eq_ignore_ascii_case("no") {
            Some(false)
        } else {
            None
        }
    })
}

/// Why a poll has no verdict under [`parse_verdict_answer_line`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unreadable {
    /// The output is empty (or only whitespace).
    Empty,
    /// The output's last non-empty line is not `Answer: yes` or `Answer: no` (a refusal,
    /// a truncated answer, a verdict given in prose, an echo of the instruction…).
    NoAnswerLine,
    /// The API said the judge refused (`message.refusal`): its words are no verdict,
    /// whatever they end with.
    Refusal,
}

impl Unreadable {
    /// The reason as the report states it.
    pub fn as_str(self) -> &'static str {
        match self {
            Unreadable::Empty => "empty output",
            Unreadable::NoAnswerLine => "no final \"Answer: yes/no\" line",
            Unreadable::Refusal => "a refusal (the API's refusal field)",
        }
    }
}

/// The verdict of a poll of Halyard's ChainPoll prompts (issue 29): the output's **last
/// non-empty line** must be the required answer line, `Answer: yes` or `Answer: no`
/// (case-insensitive; `Final answer:` also accepted; spaces around the colon, Markdown
/// emphasis or code marks (`*`, `_`, `` ` ``), a leading `#`/`>` and one trailing `.` or
/// `!` are ignored). Anything else is unparseable: an empty output, a refusal, a verdict
/// in prose ("This is false; there is no evidence"), or a line that merely quotes the
/// instruction (`… exactly "Answer: yes" if …, or "Answer: no" if it does not.`).
pub fn parse_verdict_answer_line(response: &str) -> Result<bool, Unreadable> {
    let Some(last) = response.lines().map(str::trim).rev().find(|l| !l.is_empty()) else {
        return Err(Unreadable::Empty);
    };
    let line: String = last.chars().filter(|c| !matches!(c, '*' | '_' | '`')).collect();
    let line = line.trim().trim_start_matches(['#', '>']).trim();
    let line = line.strip_suffix(['.', '!']).unwrap_or(line).trim_end().to_ascii_lowercase();
    let rest = line.strip_prefix("final").map_or(line.as_str(), |r| r.trim_start());
    let verdict = rest
        .strip_prefix("answer")
        .and_then(|r| r.trim_start().strip_prefix(':'))
        .map(str::trim_start);
    match verdict {
        Some("yes") => Ok(true),
        Some("no") => Ok(false),
        _ => Err(Unreadable::NoAnswerLine),
    }
}

/// S10's decision threshold: hallucinated iff `score > 0.5` (spec §3.1 step 3).
pub const S10_THRESHOLD: f64 = 0.5;

#[cfg(test)]
mod tests {
    use super::*;

    /// N = 0 is an error, not NaN.
    #[test]
    fn empty_polls() {
        assert!(chainpoll_score(&[]).is_err());
        assert!(chainpoll_score_parsed(&[], Unparseable::CountAsNo).is_err());
    }

    /// All polls unparseable: undefined when excluded, 0 when counted as "no".
    #[test]
    fn all_unparseable() {
        assert!(matches!(
            chainpoll_score_parsed(&[None, None], Unparseable::Exclude),
            Err(MetricError::Undefined { .. })
        ));
        assert_eq!(chainpoll_score_parsed(&[None, None], Unparseable::CountAsNo), Ok(0.0));
    }

    /// The first-word parse does not strip and does not read "no" specially.
    #[test]
    fn first_word_edges() {
        assert!(!parse_verdict_first_word(" yes"));
        assert!(!parse_verdict_first_word("ye"));
        assert!(parse_verdict_first_word("Yesterday")); // S10's prefix test, kept as is
        assert!(!parse_verdict_first_word("é yes")); // multi-byte first char, no panic
    }

    /// The final-answer parse takes the last verdict word and ignores words containing yes/no.
    #[test]
    fn final_answer_edges() {
        assert_eq!(parse_verdict_final_answer("No... wait. Yes"), Some(true));
        assert_eq!(parse_verdict_final_answer("nope, cannot say, yesterday"), None);
        assert_eq!(parse_verdict_final_answer("答案：no。"), Some(false));
        assert_eq!(parse_verdict_final_answer(""), None);
    }

    /// Issue 29: only the required final line gives a verdict. A stray yes/no in prose, an
    /// echo of the instruction, a refusal and an empty output are unparseable (the
    /// reference rule read the first two as "no").
    #[test]
    fn answer_line_is_required() {
        use Unreadable::{Empty, NoAnswerLine};
        let echo = "After your reasoning, end with one final line, exactly \"Answer: yes\" if the answer contains a hallucination, or \"Answer: no\" if it does not.";
        for (text, want) in [
            ("Reasoning.\nAnswer: yes", Ok(true)),
            ("Claim 1 is fine.\n\nAnswer: no\n\n", Ok(false)),
            ("**Answer:** No.", Ok(false)),
            ("Final answer: YES", Ok(true)),
            ("answer : yes!", Ok(true)),
            ("This is false; there is no evidence", Err(NoAnswerLine)),
            (echo, Err(NoAnswerLine)),
            ("I'm sorry, but I can't assist with that.", Err(NoAnswerLine)),
            ("", Err(Empty)),
            (" \n\t\n", Err(Empty)),
            ("Answer: yes\nOn reflection the date is right.", Err(NoAnswerLine)),
            ("Answer: maybe", Err(NoAnswerLine)),
            ("Answer: yes or no", Err(NoAnswerLine)),
            ("All good. Final answer: No", Err(NoAnswerLine)),
        ] {
            assert_eq!(parse_verdict_answer_line(text), want, "{text:?}");
        }
        // The reference rule reads the first two as a verdict.
        assert_eq!(parse_verdict_final_answer("This is false; there is no evidence"), Some(false));
        assert_eq!(parse_verdict_final_answer(echo), Some(false));
    }
}

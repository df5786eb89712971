//! Reading UHGEval model answers (spec §1.2–§1.5): echo removal, the first-sentence rule,
//! and the three verdict parsers, in \[paper\] and \[v2\] forms.

use serde::{Deserialize, Serialize};

use super::UhgVariant;
use crate::metrics::pystr::py_strip;

/// Removes an echoed prompt from a raw model answer (spec §1.2):
/// - \[paper\] (discriminative and selective parsers only): the text after the **last**
///   occurrence of `query` (`res.split(query)[-1]`), the whole answer if it does not
///   occur;
/// - \[v2\] (every call): the answer without `query` if it **starts** with it.
///
/// An empty `query` leaves the answer unchanged (Python's `split("")` would raise).
pub fn strip_echo<'a>(response: &'a str, query: &str, variant: UhgVariant) -> &'a str {
    if query.is_empty() {
        return response;
    }
    match variant {
        UhgVariant::Paper => response.rsplit(query).next().unwrap_or(response),
        UhgVariant::V2 => response.strip_prefix(query).unwrap_or(response),
    }
}

/// The first-sentence rule (spec §1.2), `re.split(r'(?<=[。；？！])', text)[0]`: the text
/// up to and including the first of the full-width `。 ； ？ ！`; the whole text if it has
/// none; `""` for `""`. No stripping.
pub fn first_sentence(text: &str) -> &str {
    match text.char_indices().find(|(_, c)| matches!(c, '。' | '；' | '？' | '！')) {
        Some((i, c)) => &text[..i + c.len_utf8()],
        None => text,
    }
}

/// The "reason" UHGEval logs for a discriminative answer: the text before the first `。`.
pub fn judgement_reason(response: &str) -> &str {
    response.split('。').next().unwrap_or(response)
}

/// A discriminative verdict; [`Judgement::code`] gives UHGEval's 1 / 0 / −1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Judgement {
    /// 1: "does not fit reality".
    Hallucinated,
    /// 0: "fits reality".
    NotHallucinated,
    /// −1: neither prefix.
    Invalid,
}

impl Judgement {
    /// UHGEval's integer code: 1, 0 or −1.
    pub fn code(self) -> i8 {
        match self {
            Judgement::Hallucinated => 1,
            Judgement::NotHallucinated => 0,
            Judgement::Invalid => -1,
        }
    }

    /// From UHGEval's integer code; `None` for any other integer.
    pub fn from_code(code: i64) -> Option<Judgement> {
        match code {
            1 => Some(Judgement::Hallucinated),
            0 => Some(Judgement::NotHallucinated),
            -1 => Some(Judgement::Invalid),
            _ => None,
        }
    }
}

fn prefix_judgement(response: &str, variant: UhgVariant, yes: &str, no: &str) -> Judgement {
    let text = match variant {
        UhgVariant::Paper => response,
        UhgVariant::V2 => py_strip(response),
    };
    if text.starts_with(yes) {
        Judgement::Hallucinated
    } else if text.starts_with(no) {
        Judgement::NotHallucinated
    } else {
        Judgement::Invalid
    }
}

/// Keyword-level verdict (spec §1.3 step 5), on the answer after echo removal: starts with
/// `不符合现实` → hallucinated, else starts with `符合现实` → not, else invalid. \[v2\] strips
/// surrounding whitespace first; \[paper\] does not.
pub fn parse_keyword_judgement(response: &str, variant: UhgVariant) -> Judgement {
    prefix_judgement(response, variant, "不符合现实", "符合现实")
}

/// Sentence-level verdict (spec §1.4): starts with `续写不符合现实` → hallucinated, else
/// `续写符合现实` → not, else invalid; \[v2\] strips first.
pub fn parse_sentence_judgement(response: &str, variant: UhgVariant) -> Judgement {
    prefix_judgement(response, variant, "续写不符合现实", "续写符合现实")
}

/// A selective answer; [`Choice::code`] gives UHGEval's 1 / 2 / −1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Choice {
    /// 1: option A.
    A,
    /// 2: option B.
    B,
    /// −1.
    Invalid,
}

impl Choice {
    /// UHGEval's integer code: 1, 2 or −1.
    pub fn code(self) -> i8 {
        match self {
            Choice::A => 1,
            Choice::B => 2,
            Choice::Invalid => -1,
        }
    }
}

/// Selective answer (spec §1.5): the text before the first `更符合现实，更准确`, stripped;
/// \[paper\] it must be exactly `A` or `B`; \[v2\] only its first character counts.
pub fn parse_selective_choice(response: &str, variant: UhgVariant) -> Choice {
    let head = py_strip(response.split("更符合现实，更准确").next().unwrap_or(response));
    let answer = match variant {
        UhgVariant::Paper => head,
        UhgVariant::V2 => head.chars().next().map_or("", |c| &head[..c.len_utf8()]),
    };
    match answer {
        "A" => Choice::A,
        "B" => Choice::B,
        _ => Choice::Invalid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Paper echo removal keeps the text after the last echo; v2 only drops a leading one.
    #[test]
    fn echo_removal() {
        assert_eq!(strip_echo("Q符合现实Q不符合现实", "Q", UhgVariant::Paper), "不符合现实");
        assert_eq!(strip_echo("Q符合现实Q不符合现实", "Q", UhgVariant::V2), "符合现实Q不符合现实");
        assert_eq!(strip_echo("x Q y", "Q", UhgVariant::V2), "x Q y");
        assert_eq!(strip_echo("abc", "", UhgVariant::Paper), "abc");
    }

    /// The first sentence keeps its delimiter; only the four full-width marks end it.
    #[test]
    fn first_sentence_rule() {
        assert_eq!(first_sentence("甲。乙！"), "甲。");
        assert_eq!(first_sentence("甲：乙. 丙"), "甲：乙. 丙");
        assert_eq!(first_sentence(""), "");
        assert_eq!(first_sentence("？"), "？");
    }

    /// The reason is the text before the first 。, or all of it.
    #[test]
    fn reason() {
        assert_eq!(judgement_reason("不符合现实，因为X。后文"), "不符合现实，因为X");
        assert_eq!(judgement_reason("无句号"), "无句号");
    }

    /// Integer codes round-trip and unknown codes are rejected.
    #[test]
    fn codes() {
        for j in [Judgement::Hallucinated, Judgement::NotHallucinated, Judgement::Invalid] {
            assert_eq!(Judgement::from_code(j.code().into()), Some(j));
        }
        assert_eq!(Judgement::from_code(2), None);
    }
}

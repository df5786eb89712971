//! Term inclusion: does an answer contain a term? (spec part (a), paper Appendix K)
//!
//! Two definitions, selected by [`crate::hypotermqa::Semantics`]:
//!
//! - [`paper_includes`]: Halyard's reading of Appendix K (NFKC, lowercase, whitespace
//!   collapse; then brackets removed; then punctuation removed, each followed by a
//!   substring check).
//! - [`reference_includes`]: an exact emulation of the authors' `check_inclusion`
//!   (spec A.2/A.3), including its undocumented deletion of the substrings `the` and
//!   `this`, its round-parenthesis-only span removal and Python's own definitions of
//!   `str.lower()`, `str.strip()` and `str.split()`.
//!
//! Both are total functions on `&str`: they never panic. A missing answer is not a
//! `&str`, so the "None / NaN raise" cases of the reference code cannot occur here;
//! the planner records a missing answer as `unanswered` instead.

use unicode_general_category::{get_general_category, GeneralCategory};
use unicode_normalization::UnicodeNormalization;

/// Python's `string.punctuation`: the 32 ASCII punctuation characters.
const ASCII_PUNCTUATION: &str = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";

// ---------------------------------------------------------------------------------------
// Paper semantics
// ---------------------------------------------------------------------------------------

/// Halyard's paper-mode inclusion check (spec "Paper semantics", steps 1–4).
///
/// Each step is applied to both strings and followed by a substring check; a term that
/// is empty at a step never matches at that step.
pub fn paper_includes(text: &str, term: &str) -> bool {
    // Step 1: NFKC, lowercase, collapse whitespace.
    let text1 = collapse_rust_whitespace(&text.nfkc().collect::<String>().to_lowercase());
    let term1 = collapse_rust_whitespace(&term.nfkc().collect::<String>().to_lowercase());
    if contains_nonempty(&text1, &term1) {
        return true;
    }
    // Step 2: delete `(...)` and `[...]` spans, collapse again.
    let text2 = collapse_rust_whitespace(&remove_bracket_spans(&text1));
    let term2 = collapse_rust_whitespace(&remove_bracket_spans(&term1));
    if contains_nonempty(&text2, &term2) {
        return true;
    }
    // Step 3: dashes to spaces, other punctuation deleted, collapse again.
    let text3 = collapse_rust_whitespace(&paper_strip_punctuation(&text2));
    let term3 = collapse_rust_whitespace(&paper_strip_punctuation(&term2));
    contains_nonempty(&text3, &term3)
}

/// Substring check where an empty needle never matches (paper step 4).
fn contains_nonempty(haystack: &str, needle: &str) -> bool {
    !needle.is_empty() && haystack.contains(needle)
}

/// Collapses every run of `char::is_whitespace` to one space and trims.
fn collapse_rust_whitespace(s: &str) -> String {
    s.split(char::is_whitespace).filter(|w| !w.is_empty()).collect::<Vec<_>>().join(" ")
}

/// Deletes every `(...)` and `[...]` span, scanning left to right without nesting: an
/// opening bracket extends to the first matching closing bracket of its own kind; an
/// opening bracket without one is left in place (step 3 deletes it as punctuation).
fn remove_bracket_spans(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some((i, c)) = rest.char_indices().find(|&(_, c)| c == '(' || c == '[') {
        let close = if c == '(' { ')' } else { ']' };
        out.push_str(&rest[..i]);
        let after_open = &rest[i + c.len_utf8()..];
        match after_open.find(close) {
            Some(j) => rest = &after_open[j + close.len_utf8()..],
            None => {
                out.push(c);
                rest = after_open;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Paper step 3: every dash (category Pd) becomes a space; every other punctuation
/// character (categories P*, plus the ASCII punctuation set) is deleted.
fn paper_strip_punctuation(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match get_general_category(c) {
            GeneralCategory::DashPunctuation => out.push(' '),
            GeneralCategory::ConnectorPunctuation
            | GeneralCategory::OpenPunctuation
            | GeneralCategory::ClosePunctuation
            | GeneralCategory::InitialPunctuation
            | GeneralCategory::FinalPunctuation
            | GeneralCategory::OtherPunctuation => {}
            _ if ASCII_PUNCTUATION.contains(c) => {}
            _ => out.push(c),
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Reference semantics (the authors' code)
// ---------------------------------------------------------------------------------------

/// Exact emulation of the authors' `check_inclusion(text, subtext)` (spec A.2).
pub fn reference_includes(text: &str, term: &str) -> bool {
    // Raw check: `subtext.lower() in text.lower()` (an empty term always matches).
    if py_lower(text).contains(&py_lower(term)) {
        return true;
    }
    // Cleaned check.
    reference_clean(text).contains(&reference_clean(term))
}

/// The authors' cleaning function C (spec A.2, steps 1–7), in their order.
pub fn reference_clean(s: &str) -> String {
    let s = remove_round_paren_spans(s);
    let s = py_lower(py_strip(&s));
    let s = s.replace('-', " ");
    let s = s.replace('"', "");
    let s = s.replace("the", "");
    let s = s.replace("this", "");
    let s: String = s.chars().filter(|c| !ASCII_PUNCTUATION.contains(*c)).collect();
    py_split_join(&s)
}

/// Python `re.sub(r"\([^)]*\)", "", s)`: left to right, non-overlapping, no nesting;
/// `[^)]` also matches newlines. An unclosed `(` is left in place.
fn remove_round_paren_spans(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('(') {
        match rest[i..].find(')') {
            Some(j) => {
                out.push_str(&rest[..i]);
                rest = &rest[i + j + 1..];
            }
            // No `)` after this `(`: no later `(` can match either.
            None => break,
        }
    }
    out.push_str(rest);
    out
}

/// Python `str.lower()`: the full Unicode lowercase mapping with the final-sigma rule,
/// which is what Rust's `str::to_lowercase` implements as well.
pub fn py_lower(s: &str) -> String {
    s.to_lowercase()
}

/// Python `str.isspace()` for one character (`Py_UNICODE_ISSPACE`). Unlike
/// `char::is_whitespace`, it includes U+001C..U+001F (the ASCII information separators).
pub fn py_isspace(c: char) -> bool {
    matches!(
        c,
        '\t' | '\n'
            | '\u{0B}'
            | '\u{0C}'
            | '\r'
            | '\u{1C}'..='\u{1F}'
            | ' '
            | '\u{85}'
            | '\u{A0}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200A}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202F}'
            | '\u{205F}'
            | '\u{3000}'
    )
}

/// Python `str.strip()` with no argument.
pub fn py_strip(s: &str) -> &str {
    s.trim_matches(py_isspace)
}

/// Python `" ".join(s.split())`.
fn py_split_join(s: &str) -> String {
    s.split(py_isspace).filter(|w| !w.is_empty()).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spec's worked examples of the reference cleaning function hold.
    #[test]
    fn reference_clean_examples() {
        assert_eq!(reference_clean("Alley-oop [basketball] play"), "alley oop basketball play");
        assert_eq!(reference_clean("A (b (c) d) e"), "a d e");
        assert_eq!(reference_clean("ththee"), "the");
        assert_eq!(reference_clean("Jump, Jive an' Wail"), "jump jive an wail");
        assert_eq!(reference_clean("Bio-Synthesis, Inc."), "bio synsis inc");
        assert_eq!(reference_clean("rock'n'roll U.S. input/output"), "rocknroll us inputoutput");
    }

    /// Reference mode: terms empty after cleaning match anything; `the` deletion artefacts.
    #[test]
    fn reference_artefacts() {
        for t in
            ["", "  ", "-", "\"", "!!!", "(disambiguation)", "The", "This", "the the", "The (x)"]
        {
            assert!(reference_includes("unrelated", t), "{t:?}");
        }
        assert!(reference_includes("attachment ory", "Attachment theory"));
        assert!(!reference_includes("Smith-theory of value", "smith th"));
        assert!(!reference_includes("Hi-thisle", "hi thi"));
        assert!(!reference_includes("Floyd–Rivest algorithm", "Floyd-Rivest algorithm"));
    }

    /// Paper mode: empty-after-cleaning terms never match; brackets and dashes handled.
    #[test]
    fn paper_examples() {
        for t in ["", "  ", "-", "!!!", "(disambiguation)", "[x]"] {
            assert!(!paper_includes("unrelated text", t), "{t:?}");
        }
        assert!(paper_includes("wow!!! yes", "!!!"), "step 1 sees the raw punctuation");
        assert!(paper_includes("Smith-theory of value", "smith th"));
        assert!(paper_includes("Floyd–Rivest algorithm", "Floyd-Rivest algorithm"));
        assert!(paper_includes("ＡＩ safety", "ai safety"));
        assert!(!paper_includes("attachment ory", "Attachment theory"));
    }

    /// Python's whitespace set differs from Rust's exactly where the spec says.
    #[test]
    fn python_whitespace_set() {
        for c in ['\u{1C}', '\u{1F}', '\u{85}', '\u{A0}', '\u{3000}'] {
            assert!(py_isspace(c));
        }
        assert!(!py_isspace('\u{200B}'));
        assert!(!char::is_whitespace('\u{1C}'));
    }
}

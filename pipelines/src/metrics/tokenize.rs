//! Tokenisers the metrics need.
//!
//! - [`jieba_cut`]: UHGEval's BLEU/ROUGE tokenisation, `list(jieba.cut(text))` (spec §1.6),
//!   through the maintained Rust port `jieba-rs` with its built-in default dictionary.
//! - [`english_words`]: the tokenisation of the SelfCheck-NGram example (spec §3.4),
//!   `\w+|[^\w\s]`.

use std::sync::OnceLock;

use jieba_rs::Jieba;

use super::pystr::py_isspace;

/// The default-dictionary segmenter, built on first use (the dictionary is compiled into
/// the binary; no file or network access). Read-only afterwards, so sharing it is safe.
fn jieba() -> &'static Jieba {
    static JIEBA: OnceLock<Jieba> = OnceLock::new();
    JIEBA.get_or_init(Jieba::new)
}

/// `list(jieba.cut(text))` of Python jieba 0.42.1 (spec §1.6): default ("accurate") mode
/// with the HMM for unknown words and the default dictionary. Whitespace and punctuation
/// are tokens of their own (`"\n"`, `" "`, `"，"`, `"。"`: each whitespace character
/// separately) and are **not** removed; no lower-casing, no stemming. The empty text gives
/// no tokens.
///
/// One correction is applied to `jieba-rs` 0.11: inside the HMM's non-Chinese runs it keeps
/// alphanumerics joined by `-`, `_` or `.` together (`6-3`, `2016-2020`, `1.2.3`), whereas
/// Python jieba's `finalseg` splits them with `[a-zA-Z0-9]+(?:\.\d+)?%?` (`6`, `-`, `3`;
/// `1.2`, `.`, `3`). Such tokens are re-split with Python's rule. The default dictionary
/// holds no ASCII word with those connectors, so no dictionary word is affected.
pub fn jieba_cut(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for token in jieba().cut(text, true) {
        if is_joined_alphanumeric(token.word) {
            out.extend(python_skip_split(token.word));
        } else {
            out.push(token.word);
        }
    }
    out
}

/// `[A-Za-z0-9]+([._-][A-Za-z0-9]+)+%?`: a jieba-rs HMM token with at least one connector.
fn is_joined_alphanumeric(word: &str) -> bool {
    let b = word.strip_suffix('%').unwrap_or(word).as_bytes();
    let is_connector = |c: &u8| matches!(c, b'.' | b'_' | b'-');
    !b.is_empty()
        && b.iter().any(is_connector)
        && b.iter().all(|c| c.is_ascii_alphanumeric() || is_connector(c))
        && b.split(is_connector).all(|run| !run.is_empty())
}

/// `[x for x in re.compile(r"([a-zA-Z0-9]+(?:\.\d+)?%?)").split(block) if x]` for an ASCII
/// block: the matches and the gaps between them, in order.
fn python_skip_split(block: &str) -> Vec<&str> {
    let b = block.as_bytes();
    let mut out = Vec::new();
    let (mut pos, mut gap_start) = (0, 0);
    while pos < b.len() {
        if !b[pos].is_ascii_alphanumeric() {
            pos += 1;
            continue;
        }
        let start = pos;
        while pos < b.len() && b[pos].is_ascii_alphanumeric() {
            pos += 1;
        }
        if pos + 1 < b.len() && b[pos] == b'.' && b[pos + 1].is_ascii_digit() {
            pos += 1;
            while pos < b.len() && b[pos].is_ascii_digit() {
                pos += 1;
            }
        }
        if pos < b.len() && b[pos] == b'%' {
            pos += 1;
        }
        if gap_start < start {
            out.push(&block[gap_start..start]);
        }
        out.push(&block[start..pos]);
        gap_start = pos;
    }
    if gap_start < b.len() {
        out.push(&block[gap_start..]);
    }
    out
}

/// Word tokens for SelfCheck-NGram (spec §3.4): maximal runs of word characters (Python's
/// `\w`: alphanumeric or `_`) and single other non-space characters, i.e. the regex
/// `\w+|[^\w\s]`. Case is kept: lower-case the text first, as SelfCheckGPT does.
///
/// SelfCheckGPT tokenises with spaCy `en_core_web_sm`; on plain sentences like the spec's
/// example both give the same tokens. They differ on contractions (`don't` → spaCy
/// `do`, `n't`), abbreviations (`U.S.`), URLs and hyphenated forms: feed tokens from spaCy
/// itself to [`super::selfcheck::selfcheck_unigram`] where exact parity matters.
pub fn english_words(text: &str) -> Vec<&str> {
    let is_word = |c: char| c.is_alphanumeric() || c == '_';
    let mut tokens = Vec::new();
    let mut word_start: Option<usize> = None;
    for (i, c) in text.char_indices() {
        if is_word(c) {
            word_start.get_or_insert(i);
            continue;
        }
        if let Some(s) = word_start.take() {
            tokens.push(&text[s..i]);
        }
        if !py_isspace(c) {
            tokens.push(&text[i..i + c.len_utf8()]);
        }
    }
    if let Some(s) = word_start {
        tokens.push(&text[s..]);
    }
    tokens
}

#[cfg(test)]
mod tests {
    use super::*;

    /// jieba keeps each leading whitespace character as its own token (spec §5.1 row 4).
    #[test]
    fn jieba_keeps_whitespace_tokens() {
        assert_eq!(jieba_cut("\n  四国外长在会后发表联合声明。")[..3], ["\n", " ", " "]);
        assert!(jieba_cut("").is_empty());
    }

    /// Hyphenated numbers split as Python jieba 0.42.1 splits them (jieba-rs alone keeps them whole).
    #[test]
    fn jieba_splits_joined_numbers_like_python() {
        assert_eq!(jieba_cut("以6-3先声夺人"), ["以", "6", "-", "3", "先声夺人"]);
        assert_eq!(jieba_cut("2016-2020年"), ["2016", "-", "2020", "年"]);
    }

    /// Python's skip regex keeps one decimal part and a percent sign, and splits other connectors.
    #[test]
    fn python_skip_rule() {
        assert_eq!(python_skip_split("1.2.3"), ["1.2", ".", "3"]);
        assert_eq!(python_skip_split("a_b-5%"), ["a", "_", "b", "-", "5%"]);
        assert_eq!(python_skip_split("3.a"), ["3", ".", "a"]);
        assert!(is_joined_alphanumeric("6-3") && is_joined_alphanumeric("1.5%"));
        assert!(
            !is_joined_alphanumeric("-3")
                && !is_joined_alphanumeric("6-")
                && !is_joined_alphanumeric("63")
        );
        assert!(!is_joined_alphanumeric("6--3") && !is_joined_alphanumeric("%"));
    }

    /// Words, punctuation and numbers split as `\w+|[^\w\s]` does.
    #[test]
    fn english_words_regex() {
        assert_eq!(
            english_words("Weiner (born March 31, 1942) is."),
            ["Weiner", "(", "born", "March", "31", ",", "1942", ")", "is", "."]
        );
        assert!(english_words(" \n").is_empty());
        assert_eq!(english_words("a_b-c"), ["a_b", "-", "c"]);
    }
}

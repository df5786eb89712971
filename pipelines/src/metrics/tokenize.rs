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

/// `list(jieba.cut(text))` (spec §1.6): jieba's default ("accurate") mode with the HMM for
/// unknown words and the default dictionary. Whitespace and punctuation are tokens of
/// their own (`"\n"`, `" "`, `"，"`, `"。"`: each whitespace character separately) and are
/// **not** removed; no lower-casing, no stemming. The empty text gives no tokens.
pub fn jieba_cut(text: &str) -> Vec<&str> {
    jieba().cut(text, true).into_iter().map(|t| t.word).collect()
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

    /// Words, punctuation and numbers split as `\w+|[^\w\s]` does.
    #[test]
    fn english_words_regex() {
        assert_eq!(english_words("Weiner (born March 31, 1942) is."), [
            "Weiner", "(", "born", "March", "31", ",", "1942", ")", "is", "."
        ]);
        assert!(english_words(" \n").is_empty());
        assert_eq!(english_words("a_b-c"), ["a_b", "-", "c"]);
    }
}

//! Judge mode: sentence splitting, the per-sentence judge prompt, and its verdict parser.
//!
//! The HVI paper labelled sentences by crowd annotation (4 annotators, MACE); it publishes
//! no judge prompt. This one is Halyard's: it gives the judge the prompt, the whole
//! passage and the one sentence to judge, explains HILT's intrinsic/extrinsic split, and
//! asks for a fixed final line. The orientation (factual mirage vs silver lining) is not
//! asked: it follows from whether the prompt is factually correct (dataset field
//! `factual`).

use halyard_proto::ChatMessage;

/// The judge's system message.
pub const SYSTEM: &str =
    "You are a careful fact-checker who labels hallucinations in text written by language models.";

/// The per-sentence judge request.
pub fn judge_messages(prompt: &str, passage: &str, sentence: &str) -> Vec<ChatMessage> {
    let user = format!(
        "A language model was given a prompt and wrote a passage. Judge ONE sentence of that passage.\n\n\
         Prompt: \"\"\"{prompt}\"\"\"\n\n\
         Passage: \"\"\"{passage}\"\"\"\n\n\
         Sentence to judge: \"\"\"{sentence}\"\"\"\n\n\
         Is this sentence hallucinated, i.e. does it state something false, unsupported or made up \
         (accepting a false premise of the prompt counts)?\n\
         If it is, is the hallucination INTRINSIC (it distorts or contradicts what the prompt itself says) \
         or EXTRINSIC (it adds new information beyond the prompt that is fabricated or cannot be verified)?\n\n\
         Think briefly if you need to, then end with exactly one line, one of:\n\
         VERDICT: NOT_HALLUCINATED\n\
         VERDICT: INTRINSIC\n\
         VERDICT: EXTRINSIC"
    );
    vec![ChatMessage::system(SYSTEM), ChatMessage::user(user)]
}

/// A judge's verdict on one sentence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    NotHallucinated,
    Intrinsic,
    Extrinsic,
}

/// The verdict of the **last line of the form `VERDICT: <label>`** (issue 16: not the last
/// "verdict" anywhere, so prose such as "my verdict." before the final line does not hide
/// it). A verdict line is, after trimming and dropping Markdown decoration (`*`, `` ` ``,
/// `#`, `>`, `-`, `_`), the word `VERDICT` (any case), optional decoration, a colon, and the
/// label: `NOT_HALLUCINATED` (also `not hallucinated`, `not-hallucinated`), `INTRINSIC` or
/// `EXTRINSIC`, any case, optionally decorated (`**EXTRINSIC**`), with nothing else but
/// end punctuation after it. `None` when there is no verdict line, or when the last one
/// holds no known label (the final answer is unreadable; an earlier line is not used).
pub fn parse_verdict(output: &str) -> Option<Verdict> {
    let line = output.lines().rev().find_map(verdict_line)?;
    let word: String = line
        .chars()
        .filter(|c| !matches!(c, '*' | '`' | '.' | '!' | '_' | '-' | ' ' | '\t'))
        .collect::<String>()
        .to_uppercase();
    match word.as_str() {
        "NOTHALLUCINATED" => Some(Verdict::NotHallucinated),
        "INTRINSIC" => Some(Verdict::Intrinsic),
        "EXTRINSIC" => Some(Verdict::Extrinsic),
        _ => None,
    }
}

/// The text after `VERDICT:` when `line` is a verdict line.
fn verdict_line(line: &str) -> Option<&str> {
    let decoration = |c: char| matches!(c, '*' | '`' | '#' | '>' | '-' | '_') || c.is_whitespace();
    let rest = line.trim_start_matches(decoration);
    let head = rest.get(..7)?;
    if !head.eq_ignore_ascii_case("VERDICT") {
        return None;
    }
    rest[7..].trim_start_matches(decoration).strip_prefix(':')
}

/// Splits a passage into sentences: after `.`, `!` or `?` (with any closing quotes or
/// brackets right after them) followed by whitespace, and at line breaks; pieces are
/// trimmed and empty ones dropped. A rule, not a model (HILT's splitter is not published):
/// abbreviations such as "Dr. Smith" split too.
pub fn split_sentences(passage: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in passage.lines() {
        let chars: Vec<(usize, char)> = line.char_indices().collect();
        let mut start = 0;
        let mut i = 0;
        while i < chars.len() {
            let (_, c) = chars[i];
            if matches!(c, '.' | '!' | '?') {
                let mut j = i + 1;
                while j < chars.len()
                    && matches!(chars[j].1, '.' | '!' | '?' | '"' | '\'' | ')' | ']' | '”' | '’')
                {
                    j += 1;
                }
                if j == chars.len() || chars[j].1.is_whitespace() {
                    let end = chars.get(j).map_or(line.len(), |(b, _)| *b);
                    out.push(line[start..end].trim().to_string());
                    start = end;
                }
                i = j;
            } else {
                i += 1;
            }
        }
        out.push(line[start..].trim().to_string());
    }
    out.retain(|s| !s.is_empty());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The last verdict line wins; case and decoration are tolerated; anything else is None.
    #[test]
    fn verdicts() {
        assert_eq!(parse_verdict("VERDICT: EXTRINSIC"), Some(Verdict::Extrinsic));
        assert_eq!(parse_verdict("verdict: not hallucinated"), Some(Verdict::NotHallucinated));
        assert_eq!(
            parse_verdict("VERDICT: INTRINSIC\n...\nVerdict: **NOT_HALLUCINATED**"),
            Some(Verdict::NotHallucinated)
        );
        assert_eq!(parse_verdict("**VERDICT:** `extrinsic`."), Some(Verdict::Extrinsic));
        assert_eq!(parse_verdict("VERDICT: maybe"), None);
        assert_eq!(parse_verdict("It is extrinsic."), None);
        assert_eq!(parse_verdict(""), None);
    }

    /// Issue 16: prose mentioning "verdict" after or around the verdict line does not hide it;
    /// a verdict word inside a sentence is not a verdict line; the last verdict line decides.
    #[test]
    fn verdict_is_the_last_verdict_line() {
        assert_eq!(
            parse_verdict("VERDICT: INTRINSIC\nThat is my verdict."),
            Some(Verdict::Intrinsic)
        );
        assert_eq!(
            parse_verdict(
                "My verdict: it adds facts.\nVERDICT: EXTRINSIC\nI stand by this verdict."
            ),
            Some(Verdict::Extrinsic)
        );
        assert_eq!(parse_verdict("The verdict is EXTRINSIC"), None);
        assert_eq!(parse_verdict("VERDICT: EXTRINSIC because it adds a date"), None);
        assert_eq!(parse_verdict("VERDICT: EXTRINSIC\nVERDICT: unsure"), None);
    }

    /// Sentences end at . ! ? before whitespace and at line breaks; decimals stay whole.
    #[test]
    fn sentences() {
        assert_eq!(
            split_sentences("It rose 2.5 degrees. Really?! \"Yes.\" Then\nnew line"),
            ["It rose 2.5 degrees.", "Really?!", "\"Yes.\"", "Then", "new line"]
        );
        assert!(split_sentences("  \n ").is_empty());
        assert_eq!(split_sentences("No end"), ["No end"]);
    }
}

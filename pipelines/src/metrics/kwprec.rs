//! kwPrec, UHGEval's keyword precision (spec §1.6), and the parser of the keyword
//! extractor's answer (template `extract_kws`, Appendix A.2).
//!
//! In both UHGEval code versions the extractor is the model under evaluation (spec §6.3);
//! the paper text says "an LLM (e.g. GPT3.5-Turbo)". Which model extracts is the
//! pipeline's choice; these functions only score its answer.

use super::pystr::py_strip;

/// Keywords from an extractor answer (spec §1.6 kwPrec (i)), exactly as UHGEval does:
/// take the text after the **last** `<keywords>` (the whole answer if there is none) and
/// before the next `</keywords>`, split on `"\n"`, strip each line (Python `str.strip`),
/// drop empty lines and lines that are not a substring of `continuation`. Order and
/// duplicates are kept.
pub fn parse_extracted_keywords(response: &str, continuation: &str) -> Vec<String> {
    let after_open = response.rsplit("<keywords>").next().unwrap_or(response);
    let inner = after_open.split("</keywords>").next().unwrap_or(after_open);
    inner
        .split('\n')
        .map(py_strip)
        .filter(|k| !k.is_empty() && continuation.contains(k))
        .map(str::to_owned)
        .collect()
}

/// kwPrec (spec §1.6 kwPrec (ii)): the share of `keywords` that occur verbatim
/// (case-sensitive substring) in `reference` (`newsRemainder`), duplicates counted; 0 for
/// no keyword. As in Python, an empty keyword is a substring of every text.
pub fn kw_prec<S: AsRef<str>>(keywords: &[S], reference: &str) -> f64 {
    if keywords.is_empty() {
        return 0.0;
    }
    let found = keywords.iter().filter(|k| reference.contains(k.as_ref())).count();
    found as f64 / keywords.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without tags the whole answer is read, as Python's split does.
    #[test]
    fn untagged_answer() {
        assert_eq!(parse_extracted_keywords("江苏\n浙江", "江苏是"), ["江苏"]);
    }

    /// The last opening tag wins, and text after the closing tag is ignored.
    #[test]
    fn last_open_tag() {
        let r = "<keywords>\n全国\n</keywords> again <keywords>\n发达\n</keywords>\n省份";
        assert_eq!(parse_extracted_keywords(r, "全国最发达的省份"), ["发达"]);
    }

    /// Duplicates count in both numerator and denominator.
    #[test]
    fn duplicates_count() {
        assert_eq!(kw_prec(&["a", "a", "z"], "abc"), 2.0 / 3.0);
    }
}

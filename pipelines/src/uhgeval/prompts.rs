//! UHGEval's five prompt templates (spec Appendix A, verbatim from S2
//! `uhgeval/prompts/*.txt`, in `templates/`) and how their slots are filled.
//!
//! The paper-era files contain the two characters backslash-`n` literally (in the
//! few-shot examples and in `《{headLine}》\n{broadcastDate}\n{newsBeginning}`), so
//! \[paper\] queries hold literal `\n` text there; the \[v2\] templates are the same with
//! each such `\n` a real newline (spec §1.2, §6.8). Slots are filled in one pass, as
//! Python's `str.format` does: text inserted into a slot is never scanned for slots.

use super::dataset::NewsItem;
use crate::metrics::uhgeval::UhgVariant;

const CONTINUE_WRITING: &str = include_str!("templates/continue_writing.txt");
const EXTRACT_KWS: &str = include_str!("templates/extract_kws.txt");
const IS_KW_HALLUCINATED: &str = include_str!("templates/is_kw_hallucinated.txt");
const IS_CONTINUATION_HALLUCINATED: &str =
    include_str!("templates/is_continuation_hallucinated.txt");
const COMPARE_TWO_CONTINUATION: &str = include_str!("templates/compare_two_continuation.txt");

/// The template text for a variant: \[v2\] turns every literal backslash-`n` into a newline.
fn template(raw: &str, variant: UhgVariant) -> String {
    match variant {
        UhgVariant::Paper => raw.to_string(),
        UhgVariant::V2 => raw.replace("\\n", "\n"),
    }
}

/// Fills `{name}` slots (and the positional `{}`, named `""` here) in one left-to-right
/// pass. The templates hold no other braces.
fn fill(template: &str, slots: &[(&str, &str)]) -> String {
    let mut out =
        String::with_capacity(template.len() + slots.iter().map(|(_, v)| v.len()).sum::<usize>());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after.find('}').map(|close| (&after[..close], close)) {
            Some((name, close)) if slots.iter().any(|(n, _)| *n == name) => {
                let value = slots.iter().find(|(n, _)| *n == name).map_or("", |(_, v)| v);
                out.push_str(value);
                rest = &after[close + 1..];
            }
            _ => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The news slots shared by the discriminative and selective templates.
fn news_slots(item: &NewsItem) -> [(&'static str, &str); 3] {
    [
        ("headLine", item.head_line.as_str()),
        ("broadcastDate", item.broadcast_date.as_str()),
        ("newsBeginning", item.news_beginning.as_str()),
    ]
}

/// A.1 `continue_writing` (generative, spec §1.6 step 1): the slot is
/// `《headLine》\n` + the first 10 characters of `broadcastDate` + `\n` + `newsBeginning`,
/// with real newlines in both variants.
pub fn continue_writing(item: &NewsItem, variant: UhgVariant) -> String {
    let date: String = item.broadcast_date.chars().take(10).collect();
    let text = format!("《{}》\n{}\n{}", item.head_line, date, item.news_beginning);
    fill(&template(CONTINUE_WRITING, variant), &[("", &text)])
}

/// A.2 `extract_kws` (kwPrec keyword extraction) on a continuation.
pub fn extract_kws(continuation: &str, variant: UhgVariant) -> String {
    fill(&template(EXTRACT_KWS, variant), &[("", continuation)])
}

/// A.3 `is_kw_hallucinated` (keyword level, spec §1.3 step 4): the continuation is always
/// the hallucinated one.
pub fn is_kw_hallucinated(item: &NewsItem, keyword: &str, variant: UhgVariant) -> String {
    let [a, b, c] = news_slots(item);
    let slots =
        [a, b, c, ("continuation", item.hallucinated_continuation.as_str()), ("keyword", keyword)];
    fill(&template(IS_KW_HALLUCINATED, variant), &slots)
}

/// A.4 `is_continuation_hallucinated` (sentence level, spec §1.4).
pub fn is_continuation_hallucinated(
    item: &NewsItem,
    continuation: &str,
    variant: UhgVariant,
) -> String {
    let [a, b, c] = news_slots(item);
    fill(
        &template(IS_CONTINUATION_HALLUCINATED, variant),
        &[a, b, c, ("continuation", continuation)],
    )
}

/// A.5 `compare_two_continuation` (selective, spec §1.5): option A = `contn1`, B = `contn2`.
pub fn compare_two_continuation(
    item: &NewsItem,
    contn1: &str,
    contn2: &str,
    variant: UhgVariant,
) -> String {
    let [a, b, c] = news_slots(item);
    fill(
        &template(COMPARE_TWO_CONTINUATION, variant),
        &[a, b, c, ("contn1", contn1), ("contn2", contn2)],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item() -> NewsItem {
        NewsItem {
            id: "doc_000001".into(),
            head_line: "（国际）标题{keyword}".into(),
            broadcast_date: "2015-01-22 12:16:02".into(),
            news_type: super::super::dataset::NewsType::Doc,
            news_beginning: "开头。".into(),
            hallucinated_continuation: "假续写。".into(),
            generated_by: String::new(),
            annotations: vec![],
            real_continuation: "真续写。".into(),
            news_remainder: "真续写。其余。".into(),
        }
    }

    /// Paper keeps literal backslash-n between the news slots; v2 has real newlines; text
    /// inserted into a slot is not scanned again.
    #[test]
    fn newline_variants_and_single_pass() {
        let p = is_kw_hallucinated(&item(), "KW", UhgVariant::Paper);
        assert!(
            p.contains(
                "新闻的开头：\"\"\"《（国际）标题{keyword}》\\n2015-01-22 12:16:02\\n开头。\"\"\""
            ),
            "{p}"
        );
        assert!(p.ends_with("是否符合现实：续写中的\"\"\"KW\"\"\""));
        assert!(p.contains("续写：\"\"\"假续写。\"\"\""));
        let v = is_kw_hallucinated(&item(), "KW", UhgVariant::V2);
        assert!(v.contains("《（国际）标题{keyword}》\n2015-01-22 12:16:02\n开头。"));
        assert!(!v.contains("\\n"));
    }

    /// The generative slot uses the date only and real newlines; the template ends with a newline.
    #[test]
    fn continue_writing_slot() {
        let p = continue_writing(&item(), UhgVariant::Paper);
        assert!(p.contains("已经写好的文本：\n\n《（国际）标题{keyword}》\n2015-01-22\n开头。\n\n续写的文本：\n"), "{p}");
        assert!(p.ends_with("续写的文本：\n"));
        assert!(p.contains("\\n  正在洛阳"), "few-shot keeps the literal \\n in paper");
    }

    /// Selective and sentence templates end right after their question.
    #[test]
    fn endings() {
        let s = compare_two_continuation(&item(), "甲", "乙", UhgVariant::V2);
        assert!(
            s.ends_with("A：\"\"\"甲\"\"\"\n\nB：\"\"\"乙\"\"\"\n\n哪个续写更符合现实，更准确：")
        );
        let c = is_continuation_hallucinated(&item(), "真续写。", UhgVariant::Paper);
        assert!(c.ends_with("续写：\"\"\"真续写。\"\"\"\n\n判断："));
        assert!(extract_kws("句子。", UhgVariant::Paper)
            .contains("现在我的句子是：\n\n句子。\n\n请给出"));
    }
}

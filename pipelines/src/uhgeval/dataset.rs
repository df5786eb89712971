//! The UHGEval JSONL dataset (spec `metrics.md` §1.1, \[v2\] schema
//! `dataset_uhgeval_{full,concise}.jsonl`): one news item per line.
//!
//! Every line is checked: the fields are present with the right types, unknown fields are
//! rejected, `type` is one of `doc`/`kno`/`num`/`gen`, `id` is `<type>_<digits>`, and every
//! annotation holds exactly one `<sep>`. An error names the file, the line and the reason.
//! Blank lines are skipped.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::metrics::uhgeval::split_annotation;

/// The news type, the prefix of the item id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NewsType {
    /// Document-intensive.
    Doc,
    /// General news.
    Gen,
    /// Knowledge-intensive.
    Kno,
    /// Number-intensive.
    Num,
}

impl NewsType {
    pub const ALL: [NewsType; 4] = [NewsType::Doc, NewsType::Gen, NewsType::Kno, NewsType::Num];

    pub fn as_str(self) -> &'static str {
        match self {
            NewsType::Doc => "doc",
            NewsType::Gen => "gen",
            NewsType::Kno => "kno",
            NewsType::Num => "num",
        }
    }

    fn parse(s: &str) -> Option<NewsType> {
        NewsType::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

/// One dataset line, field names as in the file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewsItem {
    pub id: String,
    pub head_line: String,
    /// `YYYY-MM-DD hh:mm:ss`.
    pub broadcast_date: String,
    #[serde(rename = "type")]
    pub news_type: NewsType,
    pub news_beginning: String,
    pub hallucinated_continuation: String,
    #[serde(default)]
    pub generated_by: String,
    /// `"<keyword><sep><annotation>"`, annotation `合理…` or `不合理…`.
    pub annotations: Vec<String>,
    pub real_continuation: String,
    pub news_remainder: String,
}

pub use crate::jsonl::DatasetError;

/// Checks one line (1-based `line` for the error).
pub fn parse_line(file: &str, line: usize, text: &str) -> Result<NewsItem, DatasetError> {
    check_line(text).map_err(|reason| DatasetError::Line { file: file.to_string(), line, reason })
}

/// One line's item, or why it is not one.
fn check_line(text: &str) -> Result<NewsItem, String> {
    let item: NewsItem = serde_json::from_str(text).map_err(|e| {
        // serde names the missing or unknown field and the bad type; an unknown `type`
        // value is reported with the values it may take.
        let msg = e.to_string();
        if msg.contains("unknown variant") {
            format!("field `type`: {msg}")
        } else {
            msg
        }
    })?;
    let prefix = item.id.split('_').next().unwrap_or("");
    let digits = item.id.get(prefix.len() + 1..).unwrap_or("");
    if NewsType::parse(prefix) != Some(item.news_type)
        || digits.is_empty()
        || !digits.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(format!(
            "field `id`: {:?} is not \"{}_<digits>\" (the id carries the news type)",
            item.id,
            item.news_type.as_str()
        ));
    }
    for (i, a) in item.annotations.iter().enumerate() {
        split_annotation(a).map_err(|e| format!("field `annotations[{i}]`: {e}"))?;
    }
    Ok(item)
}

/// Parses a whole file's text; `file` names it in errors. Ids must be unique.
pub fn parse_dataset(file: &str, text: &str) -> Result<Vec<NewsItem>, DatasetError> {
    let mut items: Vec<NewsItem> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    crate::jsonl::each_line(file, text, |_, l| {
        let item = check_line(l)?;
        if !seen.insert(item.id.clone()) {
            return Err(format!("duplicate id {:?}", item.id));
        }
        items.push(item);
        Ok(())
    })?;
    Ok(items)
}

/// Reads and checks a dataset file.
pub fn read_dataset(path: &Path) -> Result<Vec<NewsItem>, DatasetError> {
    let (file, text) = crate::jsonl::read(path)?;
    parse_dataset(&file, &text)
}

impl NewsItem {
    /// The annotations as (keyword, annotation) pairs (checked at parse time).
    pub fn keyword_annotations(&self) -> Vec<(&str, &str)> {
        self.annotations.iter().filter_map(|a| split_annotation(a).ok()).collect()
    }

    /// \[paper\] `appearedKeywords`, which the \[v2\] file no longer carries: the annotated
    /// keywords that occur verbatim in the original news (headline, beginning or
    /// remainder). This re-derives the construction-time field (spec §1.1: "keywords of
    /// the continuation that occur verbatim somewhere in the original news object").
    pub fn appeared_keywords(&self) -> Vec<&str> {
        self.keyword_annotations()
            .into_iter()
            .map(|(k, _)| k)
            .filter(|k| {
                self.head_line.contains(k)
                    || self.news_beginning.contains(k)
                    || self.news_remainder.contains(k)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(id: &str, ty: &str, annotations: &str) -> String {
        format!(
            r#"{{"id": "{id}", "headLine": "h", "broadcastDate": "2015-01-22 12:16:02", "type": "{ty}", "newsBeginning": "开头江苏。", "hallucinatedContinuation": "续写。", "generatedBy": "m", "annotations": {annotations}, "realContinuation": "真。", "newsRemainder": "真。其余。"}}"#
        )
    }

    /// Good lines parse; bad ones name the line and the field.
    #[test]
    fn errors_name_line_and_field() {
        let good = line("doc_000001", "doc", r#"["江苏<sep>合理", "发达<sep>不合理"]"#);
        let items = parse_dataset("f.jsonl", &format!("{good}\n\n")).unwrap();
        assert_eq!(items[0].appeared_keywords(), ["江苏"]);
        let cases = [
            (line("doc_000001", "doc", r#"["江苏"]"#), "annotations[0]"),
            (line("num_000001", "doc", "[]"), "field `id`"),
            (line("doc_x", "doc", "[]"), "field `id`"),
            (line("doc_000001", "sport", "[]"), "field `type`"),
            (good.replace("\"newsRemainder\"", "\"remainder\""), "newsRemainder"),
            ("{".to_string(), "f.jsonl:2"),
        ];
        for (bad, needle) in cases {
            let e = parse_dataset("f.jsonl", &format!("{good}\n{bad}\n")).unwrap_err().to_string();
            assert!(e.contains("f.jsonl:2") && e.contains(needle), "{needle:?} not in {e}");
        }
        let e = parse_dataset("f.jsonl", &format!("{good}\n{good}")).unwrap_err().to_string();
        assert!(e.contains("duplicate id"), "{e}");
    }

    /// The shipped sample parses: 20 items, 5 of each type.
    #[test]
    fn shipped_sample_parses() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../datasets/uhgeval/uhgeval_concise_sample_20.jsonl");
        let items = read_dataset(&p).unwrap();
        assert_eq!(items.len(), 20);
        for t in NewsType::ALL {
            assert_eq!(items.iter().filter(|i| i.news_type == t).count(), 5);
        }
    }
}

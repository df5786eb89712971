//! Labelled (prompt, completion[, context]) items for ChainPoll, one JSON object per line:
//! - `prompt` (or `claim`): the request the completion answers;
//! - `completion` (or `reference`): the text to judge;
//! - `context` (optional): a string or an array of strings, the documents the completion
//!   should stick to (needed by the Adherence metric);
//! - `label` (or `hallucinated`): `true`/`false` or `1`/`0`, true = hallucinated;
//! - `id` (optional): string or number, else the line number.
//!
//! AutoHall's `labels.jsonl` rows (`claim`, `reference`, `hallucinated`, `balanced`) are
//! read as they are: rows with `"balanced": false` are skipped (counted), so the items
//! are AutoHall's balanced references. Any other bad line is an error naming the file,
//! the line and what.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One labelled item.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Item {
    /// 1-based line in the file.
    pub line: usize,
    pub id: String,
    pub prompt: String,
    pub completion: String,
    pub context: Option<String>,
    /// True = the completion contains a hallucination.
    pub label: bool,
}

pub use crate::jsonl::DatasetError;

/// A labelled file, read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ItemSet {
    pub items: Vec<Item>,
    /// AutoHall rows outside the balanced set, skipped.
    pub skipped_unbalanced: u64,
}

fn text_field(o: &Map<String, Value>, names: [&str; 2]) -> Result<String, String> {
    match (o.get(names[0]), o.get(names[1])) {
        (Some(Value::String(s)), _) | (None, Some(Value::String(s))) => Ok(s.clone()),
        (Some(_), _) => Err(format!("field `{}` is not a string", names[0])),
        (None, Some(_)) => Err(format!("field `{}` is not a string", names[1])),
        (None, None) => Err(format!("missing field `{}` (or `{}`)", names[0], names[1])),
    }
}

fn parse_line(line: usize, text: &str) -> Result<Option<Item>, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let Value::Object(o) = v else { return Err("not a JSON object".into()) };
    if o.get("balanced") == Some(&Value::Bool(false)) {
        return Ok(None);
    }
    let prompt = text_field(&o, ["prompt", "claim"])?;
    let completion = text_field(&o, ["completion", "reference"])?;
    let label = match o.get("label").or_else(|| o.get("hallucinated")) {
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) if n.as_u64() == Some(1) => true,
        Some(Value::Number(n)) if n.as_u64() == Some(0) => false,
        Some(other) => return Err(format!("label {other} is not true/false or 1/0")),
        None => return Err("missing field `label` (or `hallucinated`)".into()),
    };
    let context = match o.get("context") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(a)) => {
            let docs: Option<Vec<&str>> = a.iter().map(Value::as_str).collect();
            Some(
                docs.ok_or("field `context` must be a string or an array of strings")?.join("\n\n"),
            )
        }
        Some(_) => return Err("field `context` must be a string or an array of strings".into()),
    };
    let id = match o.get("id") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => line.to_string(),
    };
    Ok(Some(Item { line, id, prompt, completion, context, label }))
}

/// Read a labelled file given as text (`file` names it in errors).
pub fn parse_items(file: &str, text: &str) -> Result<ItemSet, DatasetError> {
    let mut set = ItemSet::default();
    // Item ids name items in reports and human labels (issue 31): one item per id.
    let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    crate::jsonl::each_line(file, text, |n, line| {
        match parse_line(n, line)? {
            Some(item) => {
                if let Some(first) = seen.insert(item.id.clone(), n) {
                    return Err(format!(
                        "field `id`: {:?} is also the id of line {first} (an explicit id or a line number)",
                        item.id
                    ));
                }
                set.items.push(item)
            }
            None => set.skipped_unbalanced += 1,
        }
        Ok(())
    })?;
    Ok(set)
}

/// Read a labelled file.
pub fn read_items(path: &Path) -> Result<ItemSet, DatasetError> {
    let (file, text) = crate::jsonl::read(path)?;
    parse_items(&file, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Own format, AutoHall label rows (unbalanced ones skipped), context as an array.
    #[test]
    fn shapes() {
        let text = "{\"prompt\": \"P\", \"completion\": \"C\", \"label\": 1, \"context\": [\"a\", \"b\"], \"id\": 9}\n\
                    {\"claim\": \"X\", \"reference\": \"R\", \"hallucinated\": false, \"balanced\": true}\n\
                    {\"claim\": \"Y\", \"reference\": null, \"hallucinated\": null, \"balanced\": false}\n";
        let s = parse_items("f", text).unwrap();
        assert_eq!(s.items.len(), 2);
        assert_eq!(s.skipped_unbalanced, 1);
        assert_eq!(
            (s.items[0].id.as_str(), s.items[0].label, s.items[0].context.as_deref()),
            ("9", true, Some("a\n\nb"))
        );
        assert_eq!(
            (s.items[1].prompt.as_str(), s.items[1].label, s.items[1].line),
            ("X", false, 2)
        );
    }

    /// Two items with one id are refused, naming both lines.
    #[test]
    fn duplicate_ids() {
        let text = "{\"prompt\": \"P\", \"completion\": \"C\", \"label\": 1, \"id\": 2}\n{\"prompt\": \"Q\", \"completion\": \"D\", \"label\": 0}\n";
        let e = parse_items("f", text).unwrap_err().to_string();
        assert!(e.contains("f:2") && e.contains("line 1"), "{e}");
    }

    /// Bad lines are located and explained.
    #[test]
    fn bad_lines() {
        for (line, needle) in [
            ("{\"prompt\": \"P\", \"completion\": \"C\"}", "missing field `label`"),
            ("{\"prompt\": \"P\", \"completion\": \"C\", \"label\": \"yes\"}", "is not true/false"),
            ("{\"completion\": \"C\", \"label\": true}", "missing field `prompt`"),
            (
                "{\"prompt\": \"P\", \"completion\": 3, \"label\": true}",
                "`completion` is not a string",
            ),
            (
                "{\"prompt\": \"P\", \"completion\": \"C\", \"label\": true, \"context\": [1]}",
                "context",
            ),
            ("nope", "not valid JSON"),
        ] {
            let e = parse_items("d.jsonl", line).unwrap_err().to_string();
            assert!(e.starts_with("d.jsonl:1: ") && e.contains(needle), "{e}");
        }
    }
}

//! Human labels: a JSONL file, one label per line (several annotators per unit allowed).
//!
//! ```json
//! {"item": 17, "model": "gpt-4o", "label": "hallucination", "annotator": "ann-1"}
//! {"item": "q-9", "model": "llama", "sentence": 2, "label": "hallucinated"}
//! ```
//! - `item`: the benchmark item's id (HypoTermQA's question id, HVI's prompt id,
//!   ChainPoll's item id), a number or a string;
//! - `model`: the model under test whose output was labelled (its sweep alias);
//! - `term` or `sentence`: which part of the item, for pipelines that judge parts
//!   (HVI's sentences); an error for the others;
//! - `label`: one of the pipeline's labels (the error lists them);
//! - `annotator`: optional; lines without one are each a different anonymous annotator;
//! - `provenance`: optional, who gave the label: `human` (the default), `llm:<model>`
//!   (a model's labels, e.g. `llm:gpt-4`) or `rule` / `rule:<name>`. Only `human` labels
//!   are human truth; the report measures the judges against each other source under its
//!   own name ([`super::truth::Provenance`]).
//!
//! How the human labels of a unit become its truth is the benchmark's `human_truth`
//! (`majority`, `mace`, `mace-em`; [`super::truth::HumanTruth`]), kept in
//! [`HumanLabels::truth`].
//! A bad line is an error naming the file, the line and the field; a label whose unit the
//! run never judged is kept, counted and listed in the report, never dropped silently.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::truth::{HumanTruth, Provenance};
use super::UnitKey;

/// One line of a labels file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HumanLabel {
    pub key: UnitKey,
    /// The label's index in the pipeline's label set.
    pub label: usize,
    pub annotator: Option<String>,
    /// Where it came from: `file:line`.
    pub source: String,
    /// Who gave it (`human` unless the line says otherwise).
    #[serde(default)]
    pub provenance: Provenance,
}

/// A labels file, read and checked against a pipeline's label set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HumanLabels {
    pub files: Vec<PathBuf>,
    pub labels: Vec<HumanLabel>,
    /// How a unit's human labels become its truth (the benchmark's `human_truth`).
    pub truth: HumanTruth,
}

/// A labels file that cannot be used: the file, the line (1-based; 0: the file itself),
/// the field and what is wrong.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("human labels {file}, line {line}, field `{field}`: {reason}")]
pub struct LabelsError {
    pub file: String,
    pub line: usize,
    pub field: String,
    pub reason: String,
}

/// What a pipeline's labels look like, to check a file against.
#[derive(Clone, Copy, Debug)]
pub struct Shape<'a> {
    pub pipeline: &'a str,
    pub categories: &'a [String],
    /// The part key (`sentence`, `term`) the pipeline's units have, if any.
    pub part: Option<&'a str>,
}

/// The keys a line may have.
const KEYS: [&str; 7] = ["item", "model", "term", "sentence", "label", "annotator", "provenance"];

impl HumanLabels {
    /// Read and check `path`.
    pub fn read(path: &Path, shape: Shape<'_>) -> Result<HumanLabels, LabelsError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| LabelsError {
            file: file.clone(),
            line: 0,
            field: "-".into(),
            reason: format!("cannot read: {e}"),
        })?;
        let labels = parse(&file, &text, shape)?;
        Ok(HumanLabels { files: vec![path.to_path_buf()], labels, truth: HumanTruth::default() })
    }

    /// Check `text`, the contents of `path` already read (the import stores exactly the
    /// bytes it checked).
    pub fn from_text(
        path: &Path,
        text: &str,
        shape: Shape<'_>,
    ) -> Result<HumanLabels, LabelsError> {
        let labels = parse(&path.display().to_string(), text, shape)?;
        Ok(HumanLabels { files: vec![path.to_path_buf()], labels, truth: HumanTruth::default() })
    }

    /// Both sets (a sweep's file and one imported into the run); `self`'s truth rule.
    pub fn extend(&mut self, other: HumanLabels) {
        self.files.extend(other.files);
        self.labels.extend(other.labels);
    }
}

/// Parse a labels file's text (`file` names it in errors).
pub fn parse(file: &str, text: &str, shape: Shape<'_>) -> Result<Vec<HumanLabel>, LabelsError> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line_no = n + 1;
        let err = |field: &str, reason: String| LabelsError {
            file: file.to_string(),
            line: line_no,
            field: field.to_string(),
            reason,
        };
        if line.trim().is_empty() {
            continue;
        }
        let v: Value =
            serde_json::from_str(line).map_err(|e| err("-", format!("not JSON: {e}")))?;
        let Value::Object(o) = v else {
            return Err(err("-", "not a JSON object".into()));
        };
        if let Some(k) = o.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(err(k, format!("unknown key (a line has {})", KEYS.join(", "))));
        }
        let id = |field: &str| -> Result<Option<String>, LabelsError> {
            match o.get(field) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(s.clone())),
                Some(Value::Number(x)) if x.is_i64() || x.is_u64() => Ok(Some(x.to_string())),
                Some(other) => Err(err(
                    field,
                    format!("{other} is not an id (a non-empty string or an integer)"),
                )),
            }
        };
        let item = id("item")?.ok_or_else(|| err("item", "missing".into()))?;
        let Some(model) = id("model")? else {
            return Err(err("model", "missing: the model whose output was labelled".into()));
        };
        let (term, sentence) = (id("term")?, id("sentence")?);
        let part = match (term, sentence, shape.part) {
            (Some(_), Some(_), _) => {
                return Err(err("sentence", "give `term` or `sentence`, not both".into()))
            }
            (None, None, Some(want)) => {
                return Err(err(want, format!("missing: {} labels each {want}", shape.pipeline)))
            }
            (None, None, None) => None,
            (Some(p), None, Some("term")) | (None, Some(p), Some("sentence")) => Some(p),
            (t, _, Some(want)) => {
                let given = if t.is_some() { "term" } else { "sentence" };
                return Err(err(
                    given,
                    format!("{} labels each {want}: use `{want}`", shape.pipeline),
                ));
            }
            (t, _, None) => {
                let given = if t.is_some() { "term" } else { "sentence" };
                return Err(err(
                    given,
                    format!("{} is judged per item; a label names no {given}", shape.pipeline),
                ));
            }
        };
        let label = match o.get("label") {
            Some(Value::String(s)) => {
                let norm = s.trim().to_lowercase().replace([' ', '-'], "_");
                shape.categories.iter().position(|c| *c == norm).ok_or_else(|| {
                    err(
                        "label",
                        format!(
                            "{s:?} is not a {} label (one of {})",
                            shape.pipeline,
                            shape.categories.join(", ")
                        ),
                    )
                })?
            }
            Some(other) => return Err(err("label", format!("{other} is not a string"))),
            None => return Err(err("label", "missing".into())),
        };
        let annotator = id("annotator")?;
        let provenance = match o.get("provenance") {
            None | Some(Value::Null) => Provenance::Human,
            Some(Value::String(p)) => Provenance::parse(p).map_err(|e| err("provenance", e))?,
            Some(other) => return Err(err("provenance", format!("{other} is not a string"))),
        };
        out.push(HumanLabel {
            key: UnitKey { item, model, part },
            label,
            annotator,
            source: format!("{file}:{line_no}"),
            provenance,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape<'a>(cats: &'a [String], part: Option<&'a str>) -> Shape<'a> {
        Shape { pipeline: "hypotermqa", categories: cats, part }
    }

    fn cats() -> Vec<String> {
        ["valid", "hallucination", "irrelevant"].map(String::from).to_vec()
    }

    #[test]
    fn reads_lines_with_and_without_annotators() {
        let c = cats();
        let text = "{\"item\": 3, \"model\": \"m\", \"label\": \"Hallucination\", \"annotator\": \"a1\"}\n\n{\"item\": \"3\", \"model\": \"m\", \"label\": \"valid\"}\n";
        let ls = parse("l.jsonl", text, shape(&c, None)).unwrap();
        assert_eq!(ls.len(), 2);
        assert_eq!(ls[0].key, ls[1].key, "3 and \"3\" name the same item");
        assert_eq!((ls[0].label, ls[1].label), (1, 0));
        assert_eq!(ls[0].annotator.as_deref(), Some("a1"));
        assert_eq!(ls[1].source, "l.jsonl:3");
    }

    #[test]
    fn bad_lines_name_line_and_field() {
        let c = cats();
        let cases = [
            ("{\"item\": 1, \"model\": \"m\", \"label\": \"maybe\"}", 1, "label"),
            ("{\"model\": \"m\", \"label\": \"valid\"}", 1, "item"),
            ("{\"item\": 1, \"label\": \"valid\"}", 1, "model"),
            ("{\"item\": 1.5, \"model\": \"m\", \"label\": \"valid\"}", 1, "item"),
            ("{\"item\": 1, \"model\": \"m\", \"label\": 2}", 1, "label"),
            ("{\"item\": 1, \"model\": \"m\", \"label\": \"valid\", \"colour\": 1}", 1, "colour"),
            ("{\"item\": 1, \"model\": \"m\", \"label\": \"valid\", \"term\": 4}", 1, "term"),
            ("{\"item\": 1, \"model\": \"m\", \"label\": \"valid\"}\n[1]", 2, "-"),
            ("{\"item\": 1, \"model\": \"m\", \"label\": \"valid\"}\n{oops", 2, "-"),
        ];
        for (text, line, field) in cases {
            let e = parse("l.jsonl", text, shape(&c, None)).unwrap_err();
            assert_eq!((e.line, e.field.as_str()), (line, field), "{text}: {e}");
            assert!(e.to_string().contains("l.jsonl, line"), "{e}");
        }
        let e =
            parse("l.jsonl", "{\"item\": 1, \"model\": \"m\", \"label\": \"x\"}", shape(&c, None))
                .unwrap_err();
        assert!(e.reason.contains("valid, hallucination, irrelevant"), "{e}");
    }

    /// Issue 45 item 5: a line may say who gave its label; human by default; a bad value
    /// is refused naming the field.
    #[test]
    fn provenance_of_a_line() {
        let c = cats();
        let text = "{\"item\": 1, \"model\": \"m\", \"label\": \"valid\"}\n{\"item\": 1, \"model\": \"m\", \"label\": \"valid\", \"provenance\": \"llm:gpt-4\"}\n{\"item\": 1, \"model\": \"m\", \"label\": \"valid\", \"provenance\": \"rule\"}";
        let ls = parse("l", text, shape(&c, None)).unwrap();
        let p: Vec<String> = ls.iter().map(|l| l.provenance.describe()).collect();
        assert_eq!(p, ["human", "llm:gpt-4", "rule"]);
        for bad in ["\"gpt-4\"", "\"llm:\"", "3"] {
            let line = format!(
                "{{\"item\": 1, \"model\": \"m\", \"label\": \"valid\", \"provenance\": {bad}}}"
            );
            let e = parse("l", &line, shape(&c, None)).unwrap_err();
            assert_eq!((e.line, e.field.as_str()), (1, "provenance"), "{e}");
        }
    }

    #[test]
    fn parts_follow_the_pipeline() {
        let c = cats();
        let ls = parse(
            "l",
            "{\"item\": 1, \"model\": \"m\", \"sentence\": 2, \"label\": \"valid\"}",
            shape(&c, Some("sentence")),
        )
        .unwrap();
        assert_eq!(ls[0].key.part.as_deref(), Some("2"));
        let e = parse(
            "l",
            "{\"item\": 1, \"model\": \"m\", \"term\": 2, \"label\": \"valid\"}",
            shape(&c, Some("sentence")),
        )
        .unwrap_err();
        assert_eq!(e.field, "term");
        let e = parse(
            "l",
            "{\"item\": 1, \"model\": \"m\", \"label\": \"valid\"}",
            shape(&c, Some("sentence")),
        )
        .unwrap_err();
        assert_eq!(e.field, "sentence");
    }
}

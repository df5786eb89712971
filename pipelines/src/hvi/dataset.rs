//! HVI inputs: the prompt dataset (judge mode) and the labelled-sentence file.
//!
//! Prompt dataset, one JSON object per line: `{"id": str, "prompt": str, "factual": bool}`
//! (`factual`: the prompt is factually correct; HILT used NYTimes tweets (correct) and
//! Politifact headlines (incorrect)). Labelled file, one sentence per line:
//! `{"model": str, "sentence": str, "hallucinated": bool, "category": "IFM"|"EFM"|"ISL"|"ESL"|null}`
//! (`category` only for hallucinated sentences; `null` when the orientation or type is
//! unknown). Errors name the file, the line and the field; blank lines are skipped.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// One prompt of the judge-mode dataset.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prompt {
    pub id: String,
    pub prompt: String,
    /// The prompt is factually correct (FM orientation) or not (SL).
    pub factual: bool,
}

/// HILT's orientation × type of a hallucinated sentence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Category {
    /// Intrinsic factual mirage.
    IFM,
    /// Extrinsic factual mirage.
    EFM,
    /// Intrinsic silver lining.
    ISL,
    /// Extrinsic silver lining.
    ESL,
}

impl Category {
    /// From the prompt's orientation and the hallucination's type.
    pub fn of(factual_prompt: bool, extrinsic: bool) -> Category {
        match (factual_prompt, extrinsic) {
            (true, false) => Category::IFM,
            (true, true) => Category::EFM,
            (false, false) => Category::ISL,
            (false, true) => Category::ESL,
        }
    }
}

/// One labelled sentence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelRow {
    pub model: String,
    pub sentence: String,
    pub hallucinated: bool,
    #[serde(default)]
    pub category: Option<Category>,
}

pub use crate::jsonl::DatasetError;

fn read_lines<T>(
    path: &Path,
    check: impl Fn(&str, &T) -> Result<(), String>,
) -> Result<Vec<T>, DatasetError>
where
    T: for<'de> Deserialize<'de>,
{
    let (file, text) = crate::jsonl::read(path)?;
    parse_lines(&file, &text, check)
}

/// Parses JSON lines into `T`, running `check` on each; errors carry file and line.
pub fn parse_lines<T>(
    file: &str,
    text: &str,
    check: impl Fn(&str, &T) -> Result<(), String>,
) -> Result<Vec<T>, DatasetError>
where
    T: for<'de> Deserialize<'de>,
{
    let mut out = Vec::new();
    crate::jsonl::each_line(file, text, |_, l| {
        let row: T = serde_json::from_str(l).map_err(|e| e.to_string())?;
        check(l, &row)?;
        out.push(row);
        Ok(())
    })?;
    Ok(out)
}

/// Reads the prompt dataset; ids must be unique and prompts non-empty.
pub fn read_prompts(path: &Path) -> Result<Vec<Prompt>, DatasetError> {
    let seen = std::cell::RefCell::new(std::collections::HashSet::new());
    read_lines(path, |_, p: &Prompt| {
        if p.prompt.trim().is_empty() {
            return Err("field `prompt`: empty".into());
        }
        if !seen.borrow_mut().insert(p.id.clone()) {
            return Err(format!("field `id`: duplicate id {:?}", p.id));
        }
        Ok(())
    })
}

fn check_label(_: &str, r: &LabelRow) -> Result<(), String> {
    if r.model.is_empty() {
        return Err("field `model`: empty".into());
    }
    if r.category.is_some() && !r.hallucinated {
        return Err("field `category`: set on a sentence that is not hallucinated".into());
    }
    Ok(())
}

/// Reads the labelled-sentence file.
pub fn read_labels(path: &Path) -> Result<Vec<LabelRow>, DatasetError> {
    read_lines(path, check_label)
}

/// Parses labelled-sentence text (`file` names it in errors).
pub fn parse_labels(file: &str, text: &str) -> Result<Vec<LabelRow>, DatasetError> {
    parse_lines(file, text, check_label)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bad label lines name the line and the field.
    #[test]
    fn label_errors() {
        let good = r#"{"model": "a", "sentence": "s.", "hallucinated": true, "category": "EFM"}"#;
        assert_eq!(parse_labels("l.jsonl", good).unwrap()[0].category, Some(Category::EFM));
        for (bad, needle) in [
            (
                r#"{"model": "a", "sentence": "s.", "hallucinated": false, "category": "ESL"}"#,
                "category",
            ),
            (
                r#"{"model": "a", "sentence": "s.", "hallucinated": true, "category": "XFM"}"#,
                "unknown variant",
            ),
            (r#"{"model": "", "sentence": "s.", "hallucinated": true}"#, "model"),
            (r#"{"model": "a", "hallucinated": true}"#, "sentence"),
        ] {
            let e = parse_labels("l.jsonl", &format!("{good}\n{bad}")).unwrap_err().to_string();
            assert!(e.contains("l.jsonl:2") && e.contains(needle), "{needle}: {e}");
        }
    }

    /// The shipped prompt sample parses: 12 prompts, half factual.
    #[test]
    fn shipped_prompts() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../datasets/hvi/climate_fever_claims_12.jsonl");
        let ps = read_prompts(&p).unwrap();
        assert_eq!((ps.len(), ps.iter().filter(|p| p.factual).count()), (12, 6));
    }
}

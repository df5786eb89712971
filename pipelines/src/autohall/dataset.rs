//! Fact-checking claim files as AutoHall reads them (spec `metrics.md` §2.1): JSON Lines
//! despite the `.json` name, one claim per line, in either of two shapes:
//! - Climate-FEVER (`climate_true_or_false.json`): `claim_id`, `claim`, `claim_label`
//!   (`SUPPORTS` / `REFUTES`; `DISPUTED`, `NOT_ENOUGH_INFO` dropped), `evidences`;
//! - PubHealth (`pubhealth.json`) and WICE: `claim`, `label` (`true` / `false`,
//!   `supported` / `not_supported`; `mixture`, `unproven`, `partially_supported`
//!   dropped). The public PubHealth file holds the bare token `NaN` (not JSON) in 243
//!   lines; it is read as `null` here, since no field AutoHall uses can hold it.
//!
//! Rows with a dropped label are counted, not errors. A line that is not a JSON object,
//! lacks `claim`, or has no label field is an error naming the file, the line and what.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::metrics::autohall::GoldLabel;

/// One kept claim.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Claim {
    /// 1-based line in the file.
    pub line: usize,
    /// `claim_id` when the file has one, else the line number.
    pub id: String,
    pub claim: String,
    pub gold: GoldLabel,
}

/// A claims file, read and checked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClaimSet {
    pub claims: Vec<Claim>,
    /// Rows left out because their label is not one of the two kept ones, by label.
    pub dropped: BTreeMap<String, u64>,
}

pub use crate::jsonl::DatasetError;

/// `text` with every bare `NaN` token outside a JSON string replaced by `null`.
pub fn nan_to_null(text: &str) -> Cow<'_, str> {
    if !text.contains("NaN") {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let (mut in_str, mut escaped) = (false, false);
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if in_str {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_str = false;
            }
        } else if c == '"' {
            in_str = true;
        } else if rest.starts_with("NaN") {
            out.push_str("null");
            rest = &rest[3..];
            continue;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    Cow::Owned(out)
}

/// Parse one non-blank line into `set`. `Err(reason)` for a bad line.
fn parse_line(line_no: usize, text: &str, set: &mut ClaimSet) -> Result<(), String> {
    let v: Value =
        serde_json::from_str(&nan_to_null(text)).map_err(|e| format!("not valid JSON: {e}"))?;
    let Value::Object(o) = v else { return Err("not a JSON object".into()) };
    let claim = match o.get("claim") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
        Some(Value::String(_)) => return Err("field `claim` is empty".into()),
        Some(_) => return Err("field `claim` is not a string".into()),
        None => return Err("missing field `claim`".into()),
    };
    let label = match (o.get("claim_label"), o.get("label")) {
        (Some(Value::String(s)), _) | (None, Some(Value::String(s))) => s.clone(),
        (Some(_), _) => return Err("field `claim_label` is not a string".into()),
        (None, Some(_)) => return Err("field `label` is not a string".into()),
        (None, None) => {
            return Err(
                "missing field `claim_label` (Climate-FEVER) or `label` (PubHealth, WICE)".into()
            )
        }
    };
    let id = match o.get("claim_id") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => line_no.to_string(),
    };
    match GoldLabel::from_dataset(&label) {
        Some(gold) => set.claims.push(Claim { line: line_no, id, claim, gold }),
        None => *set.dropped.entry(label).or_default() += 1,
    }
    Ok(())
}

/// Read a claims file given as text (`file` names it in errors).
pub fn parse_claims(file: &str, text: &str) -> Result<ClaimSet, DatasetError> {
    let mut set = ClaimSet::default();
    crate::jsonl::each_line(file, text, |n, line| parse_line(n, line, &mut set))?;
    Ok(set)
}

/// Read a claims file.
pub fn read_claims(path: &Path) -> Result<ClaimSet, DatasetError> {
    let (file, text) = crate::jsonl::read(path)?;
    parse_claims(&file, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bare NaN becomes null; "NaN" inside strings (escaped quotes included) is kept.
    #[test]
    fn nan_outside_strings_only() {
        let s = r#"{"a": NaN, "b": "NaN \" NaN", "c": [NaN]}"#;
        assert_eq!(nan_to_null(s), r#"{"a": null, "b": "NaN \" NaN", "c": [null]}"#);
    }

    /// Both shapes are read; dropped labels are counted; ids come from `claim_id` or the line.
    #[test]
    fn both_shapes() {
        let text = "{\"claim_id\": \"7\", \"claim\": \"A\", \"claim_label\": \"REFUTES\", \"evidences\": []}\n\
                    \n{\"claim\": \"B\", \"date_published\": NaN, \"label\": \"true\"}\n\
                    {\"claim\": \"C\", \"label\": \"mixture\"}\n";
        let s = parse_claims("f", text).unwrap();
        assert_eq!(s.claims.len(), 2);
        assert_eq!((s.claims[0].id.as_str(), s.claims[0].gold), ("7", GoldLabel::Refuted));
        assert_eq!(
            (s.claims[1].id.as_str(), s.claims[1].line, s.claims[1].gold),
            ("3", 3, GoldLabel::Supported)
        );
        assert_eq!(s.dropped.get("mixture"), Some(&1));
    }

    /// Bad lines name file and line and say what is wrong.
    #[test]
    fn bad_lines_are_located() {
        for (text, needle) in [
            ("{\"claim\": \"A\"}", "missing field `claim_label`"),
            ("{\"label\": \"true\"}", "missing field `claim`"),
            ("[1]", "not a JSON object"),
            ("{\"claim\": \"A\", \"label\": ", "not valid JSON"),
            ("{\"claim\": 3, \"label\": \"true\"}", "not a string"),
        ] {
            let e = parse_claims(
                "x.json",
                &format!("{{\"claim\": \"ok\", \"label\": \"true\"}}\n{text}"),
            )
            .unwrap_err();
            let msg = e.to_string();
            assert!(msg.starts_with("x.json:2: ") && msg.contains(needle), "{msg}");
        }
    }
}

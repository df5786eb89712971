//! Reading the judge's output, in both semantics.
//!
//! - Paper mode ([`parse_paper_certainty`], [`parse_paper_verified`]): the output must
//!   contain a JSON object with the key (`certainty` or `verified`) and an allowed value.
//!   Anything else is a [`JudgeParseError`] saying why; the planner then asks again and
//!   finally records `judge_error`. Exactly what it accepts (each rule has its test in
//!   `judge_tests.rs`, issue 16):
//!   1. every outermost JSON object anywhere in the output (in a code fence, after or
//!      before prose); single quotes, trailing commas and other non-JSON are not objects;
//!   2. raw control characters (a line break) inside a JSON string;
//!   3. the key matched case-insensitively after trimming (`"Certainty"`, `" verified "`);
//!      a key given twice in one object: the last one (as Python's `json` reads it);
//!   4. the value: a string, trimmed and case-insensitive (`" mentioned "`); for `verified`
//!      also a JSON boolean (`true`/`false`); any other value or type is `BadValue`;
//!   5. several objects: those without the key, or whose value is not allowed (the echoed
//!      empty template), are skipped when another object gives an allowed value; all
//!      allowed values must agree (else `Conflicting`); the reasoning is the first
//!      allowed object's.
//! - Reference mode ([`reference_certainty`], [`reference_verified`]): an exact
//!   emulation of the authors' `LLmResponseParser.parse_response` (spec E.1, built on
//!   [`crate::hypotermqa::pyjson`]) and of its callers (spec B.2), which turn *every*
//!   failure into a "parse failure" that their labelling counts as valid.

use serde::{Deserialize, Serialize};

use super::pyjson::{loads, raw_decode, PyValue};
use super::string_match::{py_lower, py_strip};

/// The prefix the authors' code puts before the stored reflection of an unreadable output.
pub const PARSE_FAILURE_PREFIX: &str = "WARNING: Failed to parse response: ";
/// What the authors' Ollama client returns when all attempts fail (spec E.2), which their
/// parser then labels valid. Halyard does **not** feed it for a dead-lettered judge job:
/// that check is `judge_error` in both semantics (see [`super::plan`]).
pub const MODEL_FAILURE_OUTPUT: &str = "WARNING! Model failure.";

/// The longest `reasoning` a structured-output judge may write (characters): about 75
/// tokens of English, so that the whole object fits the 160 tokens of the local example.
pub const REASONING_MAX_CHARS: u32 = 300;

/// Which judge check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JudgeKind {
    /// Acceptance check ("certainty reflection"): key `certainty`.
    Acceptance,
    /// Meaning check ("definition reflection"): key `verified`.
    Meaning,
}

impl JudgeKind {
    /// The JSON key the judge must fill.
    pub fn key(self) -> &'static str {
        match self {
            JudgeKind::Acceptance => "certainty",
            JudgeKind::Meaning => "verified",
        }
    }

    /// The values paper mode accepts, as shown to the judge.
    pub fn allowed(self) -> &'static str {
        match self {
            JudgeKind::Acceptance => "\"UNREAL\", \"MENTIONED\" or \"UNKNOWN\"",
            JudgeKind::Meaning => "\"TRUE\" or \"FALSE\"",
        }
    }

    /// The verdicts the prompt asks for, as the judge should write them.
    pub fn values(self) -> &'static [&'static str] {
        match self {
            JudgeKind::Acceptance => &["UNREAL", "MENTIONED", "UNKNOWN"],
            JudgeKind::Meaning => &["TRUE", "FALSE"],
        }
    }

    /// Structured output (issue 45): the schema of the object the judge templates show,
    /// `{"term":"<term>", "reasoning":"", "<key>":""}` in that order: the term as the
    /// template fills it in, the reasoning free text of at most [`REASONING_MAX_CHARS`]
    /// characters, the key one of [`JudgeKind::values`]. The bound keeps a small judge
    /// from reasoning in circles until `max_tokens` cuts its object short.
    pub fn output_schema(self, term: &str) -> halyard_proto::OutputSchema {
        use crate::common::{string_object_schema, Field};
        string_object_schema(
            &format!("hypotermqa_{}", self.stage()),
            &[
                ("term", Field::OneOf(&[term])),
                ("reasoning", Field::Text(Some(REASONING_MAX_CHARS))),
                (self.key(), Field::OneOf(self.values())),
            ],
        )
    }

    /// The job stage name.
    pub fn stage(self) -> &'static str {
        match self {
            JudgeKind::Acceptance => "acceptance",
            JudgeKind::Meaning => "meaning",
        }
    }
}

/// The acceptance verdict: does the answer treat the term as real?
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Certainty {
    /// The answer says the term is unreal (a refusal).
    Unreal,
    /// The answer uses the term (an acceptance).
    Mentioned,
    /// The answer says it does not know the term.
    Unknown,
}

impl Certainty {
    pub fn as_str(self) -> &'static str {
        match self {
            Certainty::Unreal => "UNREAL",
            Certainty::Mentioned => "MENTIONED",
            Certainty::Unknown => "UNKNOWN",
        }
    }
}

/// Why a paper-mode judge output is unusable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JudgeParseError {
    #[error("no JSON object found in the judge output")]
    NoJsonObject,
    #[error("no JSON object in the judge output has the key `{key}`")]
    MissingKey { key: &'static str },
    #[error("`{key}` is {value}, expected {allowed}")]
    BadValue { key: &'static str, value: String, allowed: &'static str },
    #[error("the judge output gives conflicting `{key}` values: {values}")]
    Conflicting { key: &'static str, values: String },
    /// The judge answered with nothing to read: an empty output or a refusal (issue 29).
    #[error("the judge gave no verdict: its output is {}", match .0 { halyard_proto::AnswerKind::Refusal => "a refusal", _ => "empty" })]
    NoVerdict(halyard_proto::AnswerKind),
}

/// A usable paper-mode verdict and the judge's reasoning, when it gave one.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict<T> {
    pub value: T,
    pub reasoning: Option<String>,
}

/// Paper mode: the `certainty` of an acceptance-check output.
pub fn parse_paper_certainty(text: &str) -> Result<Verdict<Certainty>, JudgeParseError> {
    parse_paper(text, JudgeKind::Acceptance, |v| match v {
        PyValue::Str(s) => match s.trim().to_uppercase().as_str() {
            "UNREAL" => Some(Certainty::Unreal),
            "MENTIONED" => Some(Certainty::Mentioned),
            "UNKNOWN" => Some(Certainty::Unknown),
            _ => None,
        },
        _ => None,
    })
}

/// Paper mode: the `verified` flag of a meaning-check output (`true` = real meaning).
/// A JSON boolean is accepted as well as the strings TRUE / FALSE.
pub fn parse_paper_verified(text: &str) -> Result<Verdict<bool>, JudgeParseError> {
    parse_paper(text, JudgeKind::Meaning, |v| match v {
        PyValue::Bool(b) => Some(*b),
        PyValue::Str(s) => match s.trim().to_uppercase().as_str() {
            "TRUE" => Some(true),
            "FALSE" => Some(false),
            _ => None,
        },
        _ => None,
    })
}

/// Finds every outermost JSON object in `text` (left to right; lenient about raw control
/// characters inside strings) and reads `kind.key()` from them. Keys are matched
/// case-insensitively after trimming. Objects whose value is not allowed are ignored
/// when another object gives an allowed one (judges often echo the empty template
/// first); allowed values that disagree are an error.
fn parse_paper<T: PartialEq + Copy>(
    text: &str,
    kind: JudgeKind,
    read: impl Fn(&PyValue) -> Option<T>,
) -> Result<Verdict<T>, JudgeParseError> {
    let key = kind.key();
    let objects = json_objects(text);
    if objects.is_empty() {
        return Err(JudgeParseError::NoJsonObject);
    }
    let field = |items: &[(String, PyValue)], name: &str| -> Option<PyValue> {
        items.iter().rev().find(|(k, _)| k.trim().to_lowercase() == name).map(|(_, v)| v.clone())
    };
    let mut found: Vec<(T, Option<String>)> = Vec::new();
    let mut rejected: Option<PyValue> = None;
    for items in &objects {
        let Some(value) = field(items, key) else { continue };
        match read(&value) {
            Some(v) => {
                let reasoning = match field(items, "reasoning") {
                    Some(PyValue::Str(r)) => Some(r),
                    _ => None,
                };
                found.push((v, reasoning));
            }
            None => rejected = rejected.or(Some(value)),
        }
    }
    let Some((first, reasoning)) = found.first().cloned() else {
        return Err(match rejected {
            Some(value) => {
                JudgeParseError::BadValue { key, value: value.py_repr(), allowed: kind.allowed() }
            }
            None => JudgeParseError::MissingKey { key },
        });
    };
    if found.iter().any(|(v, _)| *v != first) {
        let values = objects
            .iter()
            .filter_map(|items| field(items, key))
            .map(|v| v.py_repr())
            .collect::<Vec<_>>()
            .join(", ");
        return Err(JudgeParseError::Conflicting { key, values });
    }
    Ok(Verdict { value: first, reasoning })
}

/// Every outermost JSON object in `text`, in order.
fn json_objects(text: &str) -> Vec<Vec<(String, PyValue)>> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '{' {
            if let Ok((PyValue::Dict(items), end)) = raw_decode(&chars, i, false) {
                out.push(items);
                i = end;
                continue;
            }
        }
        i += 1;
    }
    out
}

// ---------------------------------------------------------------------------------------
// Reference mode
// ---------------------------------------------------------------------------------------

/// What the authors' caller makes of one judge output.
#[derive(Clone, Debug, PartialEq)]
pub struct ReferenceReading {
    /// `Ok`: the value their labelling compares (`certainty.lower()`, or
    /// `str(verified).lower()`). `Err`: the exception their caller swallowed, as text.
    pub value: Result<String, String>,
    /// What their code stores as the reflection: the output, prefixed with
    /// [`PARSE_FAILURE_PREFIX`] on a parse failure.
    pub reflection: String,
    /// The `reasoning` string of the parsed object, when there is one.
    pub reasoning: Option<String>,
}

/// Emulates `LLmResponseParser.parse_response(s)` (spec E.1, steps 1–5). `Err` holds
/// the text of the exception it raises.
pub fn parse_response(output: &str) -> Result<PyValue, String> {
    // 1. Remove the failure prefix and the ChatML end marker, strip, strict parse.
    let s = output.replace(PARSE_FAILURE_PREFIX, "").replace("<|im_end|>", "");
    let s = py_strip(&s).to_string();
    if let Ok(v) = loads(&s, true) {
        return Ok(v);
    }
    // 2. Keep s[s.find('{'):s.find('}') + 1].strip(), even if it does not parse.
    let chars: Vec<char> = s.chars().collect();
    let start = chars.iter().position(|&c| c == '{').map_or(-1, |i| i as i64);
    let end = chars.iter().position(|&c| c == '}').map_or(0, |i| i as i64 + 1);
    let s = py_strip(&py_slice(&chars, start, end)).to_string();
    if let Ok(v) = loads(&s, true) {
        return Ok(v);
    }
    // 3. Lowercase everything, lenient parse (the lowercased text is not kept).
    if let Ok(v) = loads(&py_lower(&s), false) {
        return Ok(v);
    }
    // 4. Insert missing commas between lines, lenient parse (kept for step 5).
    let s = s.replace("\"\n\"", "\",\n\"");
    if let Ok(v) = loads(&s, false) {
        return Ok(v);
    }
    // 5. Repair loop, then a final lenient parse whose error propagates.
    match repair_loop(s) {
        Some(s) => loads(&s, false).map_err(|e| format!("JSONDecodeError: {e}")),
        None => {
            Err("TypeError: the JSON object must be str, bytes or bytearray, not NoneType".into())
        }
    }
}

/// Python `s[start:end]` on chars for `0 <= end`, with a possibly negative `start`.
fn py_slice(chars: &[char], start: i64, end: i64) -> String {
    let n = chars.len() as i64;
    let start = if start < 0 { (start + n).max(0) } else { start.min(n) };
    let end = end.clamp(0, n);
    if start >= end {
        return String::new();
    }
    chars[start as usize..end as usize].iter().collect()
}

/// Step 5: up to 50 strict parses, repairing each "Expecting ',' delimiter". Returns the
/// string to parse finally, or `None` when the 50 iterations run out.
fn repair_loop(mut s: String) -> Option<String> {
    for _ in 0..50 {
        let err = match loads(&s, true) {
            Ok(_) => return Some(s),
            Err(e) => e,
        };
        let (true, Some(pos)) = (err.msg() == "Expecting ',' delimiter", err.pos()) else {
            return Some(s);
        };
        let chars: Vec<char> = s.chars().collect();
        // This error is always preceded by `[` or `{` and a value, so `pos >= 2`.
        let from = pos.saturating_sub(1);
        if chars.get(from) == Some(&'"') {
            // An unescaped inner quotation: turn the next two `"` into apostrophes.
            let mut left = 2;
            let tail: String = chars[from..]
                .iter()
                .map(|&c| {
                    if c == '"' && left > 0 {
                        left -= 1;
                        '\''
                    } else {
                        c
                    }
                })
                .collect();
            s = chars[..from].iter().collect::<String>() + &tail;
        } else {
            let at = pos.min(chars.len());
            s = chars[..at].iter().collect::<String>()
                + ","
                + &chars[at..].iter().collect::<String>();
        }
    }
    None
}

/// Python's error for `value[key]` on a non-dict, or for a missing key.
fn subscript(value: &PyValue, key: &str) -> Result<PyValue, String> {
    match value {
        PyValue::Dict(_) => value.get(key).cloned().ok_or_else(|| format!("KeyError: '{key}'")),
        PyValue::Str(_) => Err("TypeError: string indices must be integers, not 'str'".into()),
        PyValue::List(_) => {
            Err("TypeError: list indices must be integers or slices, not str".into())
        }
        other => Err(format!("TypeError: '{}' object is not subscriptable", other.type_name())),
    }
}

fn reading(output: &str, value: Result<(String, Option<String>), String>) -> ReferenceReading {
    match value {
        Ok((v, reasoning)) => {
            ReferenceReading { value: Ok(v), reflection: output.to_string(), reasoning }
        }
        Err(e) => ReferenceReading {
            value: Err(e),
            reflection: format!("{PARSE_FAILURE_PREFIX}{output}"),
            reasoning: None,
        },
    }
}

fn reasoning_of(v: &PyValue) -> Option<String> {
    match v.get("reasoning") {
        Some(PyValue::Str(r)) => Some(r.clone()),
        _ => None,
    }
}

/// Reference mode, acceptance check: `parse_response(s)["certainty"].lower()`.
pub fn reference_certainty(output: &str) -> ReferenceReading {
    let value = parse_response(output).and_then(|v| match subscript(&v, "certainty")? {
        PyValue::Str(c) => Ok((py_lower(&c), reasoning_of(&v))),
        other => {
            Err(format!("AttributeError: '{}' object has no attribute 'lower'", other.type_name()))
        }
    });
    reading(output, value)
}

/// Reference mode, meaning check: `str(parse_response(s)["verified"]).lower()`.
pub fn reference_verified(output: &str) -> ReferenceReading {
    let value = parse_response(output)
        .and_then(|v| Ok((py_lower(&subscript(&v, "verified")?.py_str()), reasoning_of(&v))));
    reading(output, value)
}

#[cfg(test)]
mod tests;

//! The HypoTermQA JSONL dataset (spec part (f)): one question per line.
//!
//! Every line is checked against the schema and the dataset's invariants; an error
//! names the file, the line, the field and the reason. Blank lines are skipped.
//! Limiting the number of questions is the caller's business.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// How a question was built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplacementType {
    /// `none`: the hypothetical question itself.
    None,
    /// `programmatic`: the hypothetical term replaced by a valid one (regex, spec A.6).
    Programmatic,
    /// `fresh`: regenerated from the two valid terms.
    Fresh,
}

/// Where a term comes from (`termSet`; `termSetId` 0–3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TermSet {
    Hypothetical,
    LlmSuggestion,
    TitleSimilarity,
    TextSimilarity,
}

impl TermSet {
    pub const ALL: [TermSet; 4] = [
        TermSet::Hypothetical,
        TermSet::LlmSuggestion,
        TermSet::TitleSimilarity,
        TermSet::TextSimilarity,
    ];

    /// The dataset's `termSetId`.
    pub fn id(self) -> i64 {
        self as i64
    }

    /// The dataset's `termSet` string.
    pub fn as_str(self) -> &'static str {
        match self {
            TermSet::Hypothetical => "hypothetical",
            TermSet::LlmSuggestion => "llm_suggestion",
            TermSet::TitleSimilarity => "title_similarity",
            TermSet::TextSimilarity => "text_similarity",
        }
    }
}

/// One of a question's two terms.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Term {
    /// Id within its table; unique only together with `is_hypothetical`.
    pub term_id: i64,
    pub is_hypothetical: bool,
    pub term_set: TermSet,
    /// As stored: a made-up term, or a Wikipedia title possibly with a `(qualifier)`.
    pub term: String,
    /// Made-up definition (hypothetical) or the Wikipedia first paragraph (valid).
    pub explanation: String,
}

/// One dataset line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Question {
    pub id: i64,
    pub is_hypothetical: bool,
    /// Verbatim, including the dataset's escaping artefacts (`\"`).
    pub question: String,
    pub replacement: ReplacementType,
    /// In file order (sorted by `termId`, not by role).
    pub terms: [Term; 2],
}

/// The three kinds of question the report breaks results down by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuestionType {
    Hypothetical,
    ValidProgrammatic,
    ValidFresh,
}

impl QuestionType {
    pub const ALL: [QuestionType; 3] =
        [QuestionType::Hypothetical, QuestionType::ValidProgrammatic, QuestionType::ValidFresh];

    pub fn as_str(self) -> &'static str {
        match self {
            QuestionType::Hypothetical => "hypothetical",
            QuestionType::ValidProgrammatic => "valid_programmatic",
            QuestionType::ValidFresh => "valid_fresh",
        }
    }
}

impl Question {
    pub fn question_type(&self) -> QuestionType {
        match self.replacement {
            ReplacementType::None => QuestionType::Hypothetical,
            ReplacementType::Programmatic => QuestionType::ValidProgrammatic,
            ReplacementType::Fresh => QuestionType::ValidFresh,
        }
    }
}

/// A dataset that cannot be used, with where and why.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    #[error("cannot read dataset {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{file}:{line}: invalid JSON at column {column}: {message}")]
    Json { file: String, line: usize, column: usize, message: String },
    #[error("{file}:{line}: field `{field}`: {reason}")]
    Field { file: String, line: usize, field: String, reason: String },
    #[error("{file}:{line}: duplicate questionId {id} (first on line {first_line})")]
    DuplicateId { file: String, line: usize, id: i64, first_line: usize },
}

/// Reads and checks a whole dataset file.
pub fn read_dataset(path: impl AsRef<Path>) -> Result<Vec<Question>, DatasetError> {
    let path = path.as_ref();
    let name = path.display().to_string();
    let body = std::fs::read_to_string(path)
        .map_err(|source| DatasetError::Io { path: name.clone(), source })?;
    parse_dataset(&name, &body)
}

/// Parses a whole dataset held in memory; `source_name` is used in errors.
pub fn parse_dataset(source_name: &str, body: &str) -> Result<Vec<Question>, DatasetError> {
    let mut out = Vec::new();
    let mut seen: HashMap<i64, usize> = HashMap::new();
    for (i, line) in body.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let q = parse_line(source_name, i + 1, line)?;
        if let Some(&first_line) = seen.get(&q.id) {
            return Err(DatasetError::DuplicateId {
                file: source_name.into(),
                line: i + 1,
                id: q.id,
                first_line,
            });
        }
        seen.insert(q.id, i + 1);
        out.push(q);
    }
    Ok(out)
}

/// Parses and checks one dataset line (`line_no` is 1-based, for errors).
pub fn parse_line(source_name: &str, line_no: usize, line: &str) -> Result<Question, DatasetError> {
    let v: Value = serde_json::from_str(line).map_err(|e| {
        // serde_json appends " at line L column C"; the line is ours, the column is kept.
        let full = e.to_string();
        let suffix = format!(" at line {} column {}", e.line(), e.column());
        let message = full.strip_suffix(&suffix).unwrap_or(&full).to_string();
        DatasetError::Json { file: source_name.into(), line: line_no, column: e.column(), message }
    })?;
    let ctx = Ctx { file: source_name, line: line_no };
    let obj = v.as_object().ok_or_else(|| ctx.err("(line)", "expected a JSON object"))?;
    let id = ctx.int(obj, "questionId", "questionId")?;
    let is_hypothetical = ctx.bool(obj, "isHypotheticalQuestion", "isHypotheticalQuestion")?;
    let question = ctx.string(obj, "question", "question")?;
    let replacement = match ctx.string(obj, "replacementType", "replacementType")?.as_str() {
        "none" => ReplacementType::None,
        "programmatic" => ReplacementType::Programmatic,
        "fresh" => ReplacementType::Fresh,
        other => {
            return Err(ctx.err(
                "replacementType",
                &format!("expected none, programmatic or fresh, found {other:?}"),
            ))
        }
    };
    if is_hypothetical != (replacement == ReplacementType::None) {
        return Err(ctx.err(
            "isHypotheticalQuestion",
            &format!("is {is_hypothetical} but replacementType is {replacement:?} (true exactly when it is none)"),
        ));
    }
    let terms = obj.get("terms").ok_or_else(|| ctx.err("terms", "missing"))?;
    let terms = terms.as_array().ok_or_else(|| ctx.err("terms", "expected an array"))?;
    let [a, b] = terms.as_slice() else {
        return Err(ctx.err("terms", &format!("expected exactly 2 terms, found {}", terms.len())));
    };
    let terms = [ctx.term(a, 0)?, ctx.term(b, 1)?];
    let hypothetical = terms.iter().filter(|t| t.is_hypothetical).count();
    let want = usize::from(is_hypothetical);
    if hypothetical != want {
        let kind = if is_hypothetical { "a hypothetical" } else { "a valid" };
        return Err(ctx.err(
            "terms",
            &format!(
                "{kind} question needs exactly {want} hypothetical term(s), found {hypothetical}"
            ),
        ));
    }
    Ok(Question { id, is_hypothetical, question, replacement, terms })
}

struct Ctx<'a> {
    file: &'a str,
    line: usize,
}

impl Ctx<'_> {
    fn err(&self, field: &str, reason: &str) -> DatasetError {
        DatasetError::Field {
            file: self.file.into(),
            line: self.line,
            field: field.into(),
            reason: reason.into(),
        }
    }

    fn get<'v>(
        &self,
        obj: &'v Map<String, Value>,
        key: &str,
        path: &str,
    ) -> Result<&'v Value, DatasetError> {
        obj.get(key).ok_or_else(|| self.err(path, "missing"))
    }

    fn int(&self, obj: &Map<String, Value>, key: &str, path: &str) -> Result<i64, DatasetError> {
        self.get(obj, key, path)?.as_i64().ok_or_else(|| self.err(path, "expected an integer"))
    }

    fn bool(&self, obj: &Map<String, Value>, key: &str, path: &str) -> Result<bool, DatasetError> {
        self.get(obj, key, path)?.as_bool().ok_or_else(|| self.err(path, "expected true or false"))
    }

    fn string(
        &self,
        obj: &Map<String, Value>,
        key: &str,
        path: &str,
    ) -> Result<String, DatasetError> {
        let s = self
            .get(obj, key, path)?
            .as_str()
            .ok_or_else(|| self.err(path, "expected a string"))?;
        Ok(s.to_string())
    }

    fn term(&self, v: &Value, index: usize) -> Result<Term, DatasetError> {
        let p = |k: &str| format!("terms[{index}].{k}");
        let obj = v
            .as_object()
            .ok_or_else(|| self.err(&format!("terms[{index}]"), "expected a JSON object"))?;
        let term_id = self.int(obj, "termId", &p("termId"))?;
        let is_hypothetical = self.bool(obj, "isHypotheticalTerm", &p("isHypotheticalTerm"))?;
        let set_id = self.int(obj, "termSetId", &p("termSetId"))?;
        let set_name = self.string(obj, "termSet", &p("termSet"))?;
        let term_set = TermSet::ALL.into_iter().find(|s| s.as_str() == set_name).ok_or_else(|| {
            self.err(
                &p("termSet"),
                &format!(
                    "expected hypothetical, llm_suggestion, title_similarity or text_similarity, found {set_name:?}"
                ),
            )
        })?;
        if set_id != term_set.id() {
            return Err(self.err(
                &p("termSetId"),
                &format!("is {set_id} but termSet {set_name:?} has id {}", term_set.id()),
            ));
        }
        if is_hypothetical != (term_set == TermSet::Hypothetical) {
            return Err(self.err(
                &p("isHypotheticalTerm"),
                &format!("is {is_hypothetical} but termSet is {set_name:?} (true exactly when it is hypothetical)"),
            ));
        }
        let term = self.string(obj, "term", &p("term"))?;
        if term.trim().is_empty() {
            return Err(self.err(&p("term"), "is empty"));
        }
        let explanation = self.string(obj, "explanation", &p("explanation"))?;
        Ok(Term { term_id, is_hypothetical, term_set, term, explanation })
    }
}

#[cfg(test)]
mod tests;

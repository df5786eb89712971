//! Labels: the rules of spec parts (b) and (c) in both semantics, and the
//! `labels.jsonl` row ([`ItemLabel`]) the planner produces.
//!
//! Each check writes a [`CheckRow`] (`code_check`, `acceptance`, `meaning`), as the
//! authors' code does. A term's label and an answer's label are priority maxima:
//! hallucination > judge_error > irrelevant > valid (a reference row holds judge_error
//! only when its judge job is a dead letter, Halyard's deviation from the authors' code). In paper mode the term label is the paper's formula (Section 3.1), which
//! equals the maximum of the rows paper mode writes; in reference mode it is the
//! maximum of the rows the authors' code writes (spec B.3).

use serde::{Deserialize, Serialize};

use super::dataset::{QuestionType, TermSet};
use super::judge::Certainty;
use super::Semantics;

/// A term or check label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Label {
    Valid,
    Hallucination,
    Irrelevant,
    /// The judge never gave a usable verdict (paper mode), or its job is a dead letter
    /// (both modes).
    JudgeError,
}

impl Label {
    pub const ALL: [Label; 4] =
        [Label::Valid, Label::Hallucination, Label::Irrelevant, Label::JudgeError];

    pub fn as_str(self) -> &'static str {
        match self {
            Label::Valid => "valid",
            Label::Hallucination => "hallucination",
            Label::Irrelevant => "irrelevant",
            Label::JudgeError => "judge_error",
        }
    }

    /// Priority: hallucination > judge_error > irrelevant > valid.
    fn rank(self) -> u8 {
        match self {
            Label::Valid => 0,
            Label::Irrelevant => 1,
            Label::JudgeError => 2,
            Label::Hallucination => 3,
        }
    }
}

/// An answer's label: a [`Label`], or `unanswered` when the model call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnswerLabel {
    Valid,
    Hallucination,
    Irrelevant,
    JudgeError,
    /// The answer job is a dead letter: no answer, no judge calls.
    Unanswered,
}

impl AnswerLabel {
    pub const ALL: [AnswerLabel; 5] = [
        AnswerLabel::Valid,
        AnswerLabel::Hallucination,
        AnswerLabel::Irrelevant,
        AnswerLabel::JudgeError,
        AnswerLabel::Unanswered,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AnswerLabel::Unanswered => "unanswered",
            AnswerLabel::Valid => "valid",
            AnswerLabel::Hallucination => "hallucination",
            AnswerLabel::Irrelevant => "irrelevant",
            AnswerLabel::JudgeError => "judge_error",
        }
    }
}

impl From<Label> for AnswerLabel {
    fn from(l: Label) -> Self {
        match l {
            Label::Valid => AnswerLabel::Valid,
            Label::Hallucination => AnswerLabel::Hallucination,
            Label::Irrelevant => AnswerLabel::Irrelevant,
            Label::JudgeError => AnswerLabel::JudgeError,
        }
    }
}

/// The kind of check that wrote a row (the authors' eval types 4, 2 and 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvalType {
    /// The inclusion check (string match, no LLM).
    CodeCheck,
    Acceptance,
    Meaning,
}

impl EvalType {
    pub const ALL: [EvalType; 3] = [EvalType::CodeCheck, EvalType::Acceptance, EvalType::Meaning];

    pub fn as_str(self) -> &'static str {
        match self {
            EvalType::CodeCheck => "code_check",
            EvalType::Acceptance => "acceptance",
            EvalType::Meaning => "meaning",
        }
    }
}

/// One evaluation row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckRow {
    pub eval_type: EvalType,
    pub label: Label,
}

/// The outcome of a judge check as the paper-mode rules see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Judged<T> {
    NotRun,
    /// No usable verdict after every attempt (or the judge job failed).
    JudgeError,
    Value(T),
}

/// The priority maximum of some labels (`None` for none).
pub fn worst(labels: impl IntoIterator<Item = Label>) -> Option<Label> {
    labels.into_iter().max_by_key(|l| l.rank())
}

fn inclusion_row(included: bool) -> CheckRow {
    CheckRow {
        eval_type: EvalType::CodeCheck,
        label: if included { Label::Valid } else { Label::Irrelevant },
    }
}

// ---------------------------------------------------------------------------------------
// Paper semantics
// ---------------------------------------------------------------------------------------

/// Paper mode runs the meaning check only for an accepted (MENTIONED) valid term.
pub fn paper_needs_meaning(is_hypothetical: bool, acceptance: Judged<Certainty>) -> bool {
    !is_hypothetical && acceptance == Judged::Value(Certainty::Mentioned)
}

/// The paper's label of one acceptance verdict, as a row.
pub fn paper_acceptance_row(is_hypothetical: bool, acceptance: Judged<Certainty>) -> Option<Label> {
    Some(match (acceptance, is_hypothetical) {
        (Judged::NotRun, _) => return None,
        (Judged::JudgeError, _) => Label::JudgeError,
        (Judged::Value(Certainty::Mentioned), true) => Label::Hallucination,
        (Judged::Value(_), true) => Label::Valid,
        (Judged::Value(Certainty::Mentioned), false) => Label::Valid,
        (Judged::Value(Certainty::Unreal), false) => Label::Hallucination,
        (Judged::Value(Certainty::Unknown), false) => Label::Irrelevant,
    })
}

/// The rows paper mode writes for one term. Checks that paper mode would not run
/// (acceptance of an excluded term, meaning of a term not accepted) are ignored.
pub fn paper_rows(
    is_hypothetical: bool,
    included: bool,
    acceptance: Judged<Certainty>,
    meaning: Judged<bool>,
) -> Vec<CheckRow> {
    let mut rows = vec![inclusion_row(included)];
    if !included {
        return rows;
    }
    if let Some(label) = paper_acceptance_row(is_hypothetical, acceptance) {
        rows.push(CheckRow { eval_type: EvalType::Acceptance, label });
    }
    if paper_needs_meaning(is_hypothetical, acceptance) {
        let label = match meaning {
            Judged::NotRun => None,
            Judged::JudgeError => Some(Label::JudgeError),
            Judged::Value(true) => Some(Label::Valid),
            Judged::Value(false) => Some(Label::Hallucination),
        };
        if let Some(label) = label {
            rows.push(CheckRow { eval_type: EvalType::Meaning, label });
        }
    }
    rows
}

/// The paper's term label L_t (Section 3.1, with `judge_error`). `None` when a check the
/// label needs has not run (acceptance of an included term; meaning of an accepted
/// valid term).
pub fn paper_term_label(
    is_hypothetical: bool,
    included: bool,
    acceptance: Judged<Certainty>,
    meaning: Judged<bool>,
) -> Option<Label> {
    if !included {
        return Some(Label::Irrelevant);
    }
    let accepted = paper_acceptance_row(is_hypothetical, acceptance)?;
    if !paper_needs_meaning(is_hypothetical, acceptance) {
        return Some(accepted);
    }
    match meaning {
        Judged::NotRun => None,
        Judged::JudgeError => Some(Label::JudgeError),
        Judged::Value(true) => Some(Label::Valid),
        Judged::Value(false) => Some(Label::Hallucination),
    }
}

/// The paper's answer label (Section 3.2, with `judge_error` between hallucination and
/// irrelevant).
pub fn paper_answer_label(term_labels: impl IntoIterator<Item = Label>) -> AnswerLabel {
    worst(term_labels).map_or(AnswerLabel::Valid, AnswerLabel::from)
}

// ---------------------------------------------------------------------------------------
// Reference semantics
// ---------------------------------------------------------------------------------------

/// The authors' acceptance row (spec B.2). `certainty` is `Ok(value.lower())` or the
/// parse failure, which they label valid.
pub fn reference_acceptance_row(
    is_hypothetical: bool,
    certainty: &Result<String, String>,
) -> Label {
    match certainty {
        Err(_) => Label::Valid,
        Ok(c) if c == "unknown" => {
            if is_hypothetical {
                Label::Valid
            } else {
                Label::Irrelevant
            }
        }
        // Hallucination exactly when (c == "mentioned") == (term is hypothetical).
        Ok(c) if (c == "mentioned") == is_hypothetical => Label::Hallucination,
        Ok(_) => Label::Valid,
    }
}

/// The authors' meaning row: hallucination exactly when `str(verified).lower() == "false"`.
pub fn reference_meaning_row(verified: &Result<String, String>) -> Label {
    match verified {
        Ok(v) if v == "false" => Label::Hallucination,
        _ => Label::Valid,
    }
}

/// The rows the authors' code writes for one term. Hypothetical terms never get a
/// meaning row (any `meaning` given for them is ignored), nor do excluded terms.
pub fn reference_rows(
    is_hypothetical: bool,
    included: bool,
    certainty: Option<&Result<String, String>>,
    verified: Option<&Result<String, String>>,
) -> Vec<CheckRow> {
    let mut rows = vec![inclusion_row(included)];
    if !included {
        return rows;
    }
    if let Some(c) = certainty {
        rows.push(CheckRow {
            eval_type: EvalType::Acceptance,
            label: reference_acceptance_row(is_hypothetical, c),
        });
    }
    if let (false, Some(v)) = (is_hypothetical, verified) {
        rows.push(CheckRow { eval_type: EvalType::Meaning, label: reference_meaning_row(v) });
    }
    rows
}

/// The authors' answer label (`max_eval`): the priority maximum over every row of the answer.
pub fn reference_answer_label<'a>(rows: impl IntoIterator<Item = &'a CheckRow>) -> AnswerLabel {
    worst(rows.into_iter().map(|r| r.label)).map_or(AnswerLabel::Valid, AnswerLabel::from)
}

// ---------------------------------------------------------------------------------------
// The labels.jsonl row
// ---------------------------------------------------------------------------------------

/// One judge call's attempt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JudgeAttempt {
    /// The job id (32 hex digits).
    pub job_id: String,
    /// The judge's raw output; `None` when the job failed.
    pub output: Option<String>,
    /// Why this attempt is unusable (parse error or job failure); `None` when usable.
    pub error: Option<String>,
    /// The output was empty or a refusal (issue 29); absent for text and failed jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub odd: Option<halyard_proto::AnswerKind>,
}

/// One judge check of one term.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JudgeCheck {
    /// In order: paper mode makes up to 3, reference mode exactly 1.
    pub attempts: Vec<JudgeAttempt>,
    /// The verdict read: paper `UNREAL`/`MENTIONED`/`UNKNOWN` or `TRUE`/`FALSE`;
    /// reference `certainty.lower()` or `str(verified).lower()`. `None` when unusable.
    pub parsed: Option<String>,
    /// This check's row label.
    pub label: Label,
    /// The `reasoning` string of the judge's JSON, when present.
    pub reasoning: Option<String>,
    /// Reference mode: what the authors' code stores as the reflection.
    pub reflection: Option<String>,
}

/// One term of one answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TermEval {
    pub term: String,
    pub term_id: i64,
    pub is_hypothetical: bool,
    pub term_set: TermSet,
    /// The inclusion check (`false` when there is no answer).
    pub included: bool,
    pub acceptance: Option<JudgeCheck>,
    pub meaning: Option<JudgeCheck>,
    /// `None` only when the answer is missing (`unanswered`).
    pub term_label: Option<Label>,
    /// The evaluation rows of this term (empty when unanswered).
    pub rows: Vec<CheckRow>,
}

/// One `labels.jsonl` row: a question, the model's answer, and every label.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ItemLabel {
    pub question_id: i64,
    pub question_type: QuestionType,
    pub question: String,
    /// The sweep alias of the model under test.
    pub model: String,
    /// The sweep alias of the judge.
    pub judge: String,
    pub semantics: Semantics,
    /// The answer job's id (32 hex digits).
    pub answer_job: String,
    pub answer: Option<String>,
    /// The answer was empty or a refusal (issue 29); absent for text and unanswered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_kind: Option<halyard_proto::AnswerKind>,
    /// The answer job's last error when it is a dead letter.
    pub answer_error: Option<String>,
    pub answer_label: AnswerLabel,
    /// In dataset order.
    pub terms: Vec<TermEval>,
}

//! The scorer: [`ItemLabel`]s of one (model, judge, semantics) → a [`Report`].
//!
//! Every share carries its numerator and denominator ([`Share`]). Units:
//! - answer level: one label per question; denominators are the questions of that type
//!   in the evaluated dataset (the paper's HTS denominator), so questions never labelled
//!   (run incomplete) and `unanswered` ones count as not valid;
//! - row level (spec D.3, the paper's Appendix T tables): one unit per evaluation row
//!   (`code_check`, `acceptance`, `meaning`), grouped by term type, valid-term source
//!   and check type;
//! - term level: one unit per term of an answered question.
//!
//! In reference semantics the report also gives `hts_labelled_only`, the authors' DB
//! denominator: answers to hypothetical questions that received a label there, i.e.
//! excluding unanswered questions and answers in which neither term was included.
//!
//! Every share carries its 95% Wilson interval (`ci95`, in percent; issue 16). Answers are
//! independent units; evaluation rows and terms of one answer are not, so the row- and
//! term-level intervals treat correlated units as independent and are too narrow.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::dataset::{Question, QuestionType, TermSet};
use super::labels::{AnswerLabel, EvalType, ItemLabel, Label};
use super::plan::PIPELINE;
use super::Semantics;
use crate::common::OddCounts;
use crate::metrics::interval::{wilson, Interval};

/// Which labels a report covers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScoreMeta {
    pub model: String,
    pub judge: String,
    pub semantics: Semantics,
}

/// Questions per type in the evaluated dataset (after any limit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuestionCounts {
    pub hypothetical: u64,
    pub valid_programmatic: u64,
    pub valid_fresh: u64,
}

impl QuestionCounts {
    pub fn from_questions<'a>(qs: impl IntoIterator<Item = &'a Question>) -> QuestionCounts {
        let mut c = QuestionCounts::default();
        for q in qs {
            *c.get_mut(q.question_type()) += 1;
        }
        c
    }

    pub fn get(&self, t: QuestionType) -> u64 {
        match t {
            QuestionType::Hypothetical => self.hypothetical,
            QuestionType::ValidProgrammatic => self.valid_programmatic,
            QuestionType::ValidFresh => self.valid_fresh,
        }
    }

    fn get_mut(&mut self, t: QuestionType) -> &mut u64 {
        match t {
            QuestionType::Hypothetical => &mut self.hypothetical,
            QuestionType::ValidProgrammatic => &mut self.valid_programmatic,
            QuestionType::ValidFresh => &mut self.valid_fresh,
        }
    }
}

/// `numerator / denominator`, as a percentage (0 when the denominator is 0), with its 95%
/// Wilson interval in percent (`None` when the denominator is 0).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Share {
    pub numerator: u64,
    pub denominator: u64,
    pub percent: f64,
    #[serde(default)]
    pub ci95: Option<Interval>,
}

impl Share {
    pub fn new(numerator: u64, denominator: u64) -> Share {
        let percent =
            if denominator == 0 { 0.0 } else { numerator as f64 * 100.0 / denominator as f64 };
        let ci95 = wilson(numerator, denominator).ok().map(|w| w.scaled(100.0));
        Share { numerator, denominator, percent, ci95 }
    }
}

/// Answer labels of a group of questions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AnswerShares {
    /// Questions in the group (dataset count, or more if more were labelled).
    pub questions: u64,
    pub valid: Share,
    pub hallucination: Share,
    pub irrelevant: Share,
    pub judge_error: Share,
    pub unanswered: Share,
    /// Questions of the group with no label among the inputs.
    pub not_labelled: Share,
}

/// Labels of a group of evaluation rows or terms.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LabelShares {
    /// Rows (or terms) in the group.
    pub count: u64,
    pub valid: Share,
    pub hallucination: Share,
    pub irrelevant: Share,
    pub judge_error: Share,
}

/// Answer-label counts of a group of questions (the shares are in [`ByQuestionType`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnswerCounts {
    pub valid: u64,
    pub hallucination: u64,
    pub irrelevant: u64,
    pub judge_error: u64,
    pub unanswered: u64,
    pub not_labelled: u64,
}

impl From<&AnswerShares> for AnswerCounts {
    fn from(a: &AnswerShares) -> Self {
        AnswerCounts {
            valid: a.valid.numerator,
            hallucination: a.hallucination.numerator,
            irrelevant: a.irrelevant.numerator,
            judge_error: a.judge_error.numerator,
            unanswered: a.unanswered.numerator,
            not_labelled: a.not_labelled.numerator,
        }
    }
}

/// The headline table: hypothetical versus valid (programmatic + fresh) questions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AnswerLabelTable {
    pub hypothetical: AnswerCounts,
    pub valid: AnswerCounts,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ByQuestionType {
    pub all: AnswerShares,
    pub hypothetical: AnswerShares,
    /// Programmatic and fresh together.
    pub valid: AnswerShares,
    pub valid_programmatic: AnswerShares,
    pub valid_fresh: AnswerShares,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ByTermType {
    pub hypothetical: LabelShares,
    pub valid: LabelShares,
}

/// Valid terms only, by the set they were drawn from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ByTermSource {
    pub llm_suggestion: LabelShares,
    pub title_similarity: LabelShares,
    pub text_similarity: LabelShares,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ByCheckType {
    pub code_check: LabelShares,
    pub acceptance: LabelShares,
    pub meaning: LabelShares,
}

/// How often the judge failed to give a usable verdict, and what it cost.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JudgeStats {
    /// Answers labelled `judge_error` / answered questions.
    pub answers: Share,
    /// Judge checks (acceptance or meaning) with label `judge_error` / judge checks.
    pub checks: Share,
    /// Judge checks whose first output was unusable / judge checks.
    pub retried_checks: Share,
    /// Judge calls made, retries included.
    pub calls: u64,
}

/// Every figure of one (model, judge, semantics) on HypoTermQA.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub pipeline: String,
    pub semantics: Semantics,
    pub model: String,
    pub judge: String,
    /// HypoTermQA Score, percent: valid answers to hypothetical questions / hypothetical questions.
    pub hts: f64,
    pub hts_share: Share,
    /// Reference semantics only: the authors' DB denominator (labelled answers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hts_labelled_only: Option<Share>,
    pub hypothetical_questions: u64,
    pub valid_answers_to_hypothetical: u64,
    /// Questions in the evaluated dataset.
    pub questions: u64,
    /// Labels used (one per question).
    pub items_labelled: u64,
    /// Labels left out: another model, judge or semantics, or a repeated question id.
    pub items_ignored: u64,
    pub answer_labels: AnswerLabelTable,
    pub by_question_type: ByQuestionType,
    /// Row level (spec D.3): evaluation rows by term type.
    pub rows_by_term_type: ByTermType,
    /// Row level: rows of valid terms by term source.
    pub rows_by_valid_term_source: ByTermSource,
    /// Row level: rows by check type.
    pub rows_by_check_type: ByCheckType,
    /// Term level: one label per term of an answered question, by term type.
    pub terms_by_term_type: ByTermType,
    /// Term level: valid terms by term source.
    pub terms_by_valid_term_source: ByTermSource,
    pub judge_error: JudgeStats,
    /// Answers that were empty or refusals (issue 29), all questions: labelled by the
    /// rules like any answer (neither term is included, so they are irrelevant) and
    /// counted here, beside the shares they are part of.
    #[serde(default)]
    pub odd_answers: OddCounts,
    /// The same, of hypothetical questions only (the HTS denominator).
    #[serde(default)]
    pub odd_answers_hypothetical: OddCounts,
    /// Judge outputs that were empty or refusals (no verdict: asked again in paper mode,
    /// judge_error when still so; judge_error in reference mode).
    #[serde(default)]
    pub odd_judge_outputs: OddCounts,
}

#[derive(Default)]
struct Tally(BTreeMap<&'static str, u64>);

impl Tally {
    fn add(&mut self, key: &'static str) {
        *self.0.entry(key).or_default() += 1;
    }
    fn n(&self, key: &str) -> u64 {
        self.0.get(key).copied().unwrap_or_default()
    }
    fn merge(&self, other: &Tally) -> Tally {
        let mut t = Tally(self.0.clone());
        for (k, v) in &other.0 {
            *t.0.entry(*k).or_default() += *v;
        }
        t
    }
    fn total(&self) -> u64 {
        self.0.values().sum()
    }
    fn answers(&self, in_dataset: u64) -> AnswerShares {
        let labelled = self.total();
        let d = in_dataset.max(labelled);
        let s = |k: AnswerLabel| Share::new(self.n(k.as_str()), d);
        AnswerShares {
            questions: d,
            valid: s(AnswerLabel::Valid),
            hallucination: s(AnswerLabel::Hallucination),
            irrelevant: s(AnswerLabel::Irrelevant),
            judge_error: s(AnswerLabel::JudgeError),
            unanswered: s(AnswerLabel::Unanswered),
            not_labelled: Share::new(d - labelled, d),
        }
    }
    fn labels(&self) -> LabelShares {
        let d = self.total();
        let s = |k: Label| Share::new(self.n(k.as_str()), d);
        LabelShares {
            count: d,
            valid: s(Label::Valid),
            hallucination: s(Label::Hallucination),
            irrelevant: s(Label::Irrelevant),
            judge_error: s(Label::JudgeError),
        }
    }
}

/// Keys for the row/term groups.
fn term_type_key(is_hypothetical: bool) -> &'static str {
    if is_hypothetical {
        "hypothetical"
    } else {
        "valid"
    }
}

/// Scores the labels of `meta`'s (model, judge, semantics); others are counted in
/// `items_ignored`, as are repeated question ids (the last label of a question wins).
pub fn score<'a>(
    meta: &ScoreMeta,
    totals: &QuestionCounts,
    labels: impl IntoIterator<Item = &'a ItemLabel>,
) -> Report {
    let mut items: BTreeMap<i64, &ItemLabel> = BTreeMap::new();
    let mut ignored = 0u64;
    for l in labels {
        let other = l.model != meta.model || l.judge != meta.judge || l.semantics != meta.semantics;
        // Short-circuit: only this report's labels are inserted.
        if other || items.insert(l.question_id, l).is_some() {
            ignored += 1;
        }
    }
    let mut answers: BTreeMap<QuestionType, Tally> = BTreeMap::new();
    let mut rows_by: BTreeMap<&'static str, Tally> = BTreeMap::new();
    let mut terms_by: BTreeMap<&'static str, Tally> = BTreeMap::new();
    let (mut labelled_hyp, mut labelled_hyp_valid) = (0u64, 0u64);
    let (mut answered, mut checks, mut check_errors, mut retried, mut calls) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let (mut odd_answers, mut odd_hyp, mut odd_judge) =
        (OddCounts::default(), OddCounts::default(), OddCounts::default());
    for item in items.values() {
        answers.entry(item.question_type).or_default().add(item.answer_label.as_str());
        odd_answers.add(item.answer_kind);
        if item.question_type == QuestionType::Hypothetical {
            odd_hyp.add(item.answer_kind);
        }
        if item.answer_label == AnswerLabel::Unanswered {
            continue;
        }
        answered += 1;
        if item.question_type == QuestionType::Hypothetical && item.terms.iter().any(|t| t.included)
        {
            labelled_hyp += 1;
            labelled_hyp_valid += u64::from(item.answer_label == AnswerLabel::Valid);
        }
        for t in &item.terms {
            let kind = term_type_key(t.is_hypothetical);
            let source = (!t.is_hypothetical).then(|| t.term_set.as_str());
            for r in &t.rows {
                let label = r.label.as_str();
                rows_by.entry(kind).or_default().add(label);
                rows_by.entry(r.eval_type.as_str()).or_default().add(label);
                if let Some(s) = source {
                    rows_by.entry(s).or_default().add(label);
                }
            }
            if let Some(label) = t.term_label {
                terms_by.entry(kind).or_default().add(label.as_str());
                if let Some(s) = source {
                    terms_by.entry(s).or_default().add(label.as_str());
                }
            }
            for c in t.acceptance.iter().chain(t.meaning.iter()) {
                checks += 1;
                check_errors += u64::from(c.label == Label::JudgeError);
                retried += u64::from(c.attempts.first().is_some_and(|a| a.error.is_some()));
                calls += c.attempts.len() as u64;
                for a in &c.attempts {
                    odd_judge.add(a.odd);
                }
            }
        }
    }
    let empty = Tally::default();
    let a = |t: QuestionType| answers.get(&t).unwrap_or(&empty);
    let (hyp, prog, fresh) = (
        a(QuestionType::Hypothetical),
        a(QuestionType::ValidProgrammatic),
        a(QuestionType::ValidFresh),
    );
    let valid_all = prog.merge(fresh);
    let group = |m: &BTreeMap<&'static str, Tally>, k: &str| m.get(k).unwrap_or(&empty).labels();
    let hypothetical = hyp.answers(totals.hypothetical);
    let valid = valid_all.answers(totals.valid_programmatic + totals.valid_fresh);
    let hts_share = hypothetical.valid;
    let judge_answers = hyp.merge(&valid_all);
    let questions = totals.hypothetical + totals.valid_programmatic + totals.valid_fresh;
    Report {
        pipeline: PIPELINE.to_string(),
        semantics: meta.semantics,
        model: meta.model.clone(),
        judge: meta.judge.clone(),
        hts: hts_share.percent,
        hts_share,
        hts_labelled_only: (meta.semantics == Semantics::Reference)
            .then(|| Share::new(labelled_hyp_valid, labelled_hyp)),
        hypothetical_questions: hypothetical.questions,
        valid_answers_to_hypothetical: hts_share.numerator,
        questions: questions.max(items.len() as u64),
        items_labelled: items.len() as u64,
        items_ignored: ignored,
        answer_labels: AnswerLabelTable {
            hypothetical: (&hypothetical).into(),
            valid: (&valid).into(),
        },
        by_question_type: ByQuestionType {
            all: judge_answers.answers(questions),
            hypothetical,
            valid,
            valid_programmatic: prog.answers(totals.valid_programmatic),
            valid_fresh: fresh.answers(totals.valid_fresh),
        },
        rows_by_term_type: ByTermType {
            hypothetical: group(&rows_by, "hypothetical"),
            valid: group(&rows_by, "valid"),
        },
        rows_by_valid_term_source: ByTermSource {
            llm_suggestion: group(&rows_by, TermSet::LlmSuggestion.as_str()),
            title_similarity: group(&rows_by, TermSet::TitleSimilarity.as_str()),
            text_similarity: group(&rows_by, TermSet::TextSimilarity.as_str()),
        },
        rows_by_check_type: ByCheckType {
            code_check: group(&rows_by, EvalType::CodeCheck.as_str()),
            acceptance: group(&rows_by, EvalType::Acceptance.as_str()),
            meaning: group(&rows_by, EvalType::Meaning.as_str()),
        },
        terms_by_term_type: ByTermType {
            hypothetical: group(&terms_by, "hypothetical"),
            valid: group(&terms_by, "valid"),
        },
        terms_by_valid_term_source: ByTermSource {
            llm_suggestion: group(&terms_by, TermSet::LlmSuggestion.as_str()),
            title_similarity: group(&terms_by, TermSet::TitleSimilarity.as_str()),
            text_similarity: group(&terms_by, TermSet::TextSimilarity.as_str()),
        },
        judge_error: JudgeStats {
            answers: Share::new(judge_answers.n(AnswerLabel::JudgeError.as_str()), answered),
            checks: Share::new(check_errors, checks),
            retried_checks: Share::new(retried, checks),
            calls,
        },
        odd_answers,
        odd_answers_hypothetical: odd_hyp,
        odd_judge_outputs: odd_judge,
    }
}

/// "12.34% (3/9) [4.12, 30.20]": the share, its counts and its 95% Wilson interval.
fn pct(s: &Share) -> String {
    let ci = s.ci95.map_or(String::new(), |c| c.bracket(1.0, 2));
    format!("{:.2}% ({}/{}){ci}", s.percent, s.numerator, s.denominator)
}

fn answer_row(name: &str, a: &AnswerShares) -> String {
    format!(
        "| {name} | {} | {} | {} | {} | {} | {} | {} |\n",
        a.questions,
        pct(&a.valid),
        pct(&a.hallucination),
        pct(&a.irrelevant),
        pct(&a.judge_error),
        pct(&a.unanswered),
        pct(&a.not_labelled)
    )
}

fn label_table(title: &str, unit: &str, groups: &[(&str, &LabelShares)]) -> String {
    let mut s = format!(
        "\n**{title}**\n\n| group | {unit} | valid | hallucination | irrelevant | judge_error |\n|---|---|---|---|---|---|\n"
    );
    for (name, g) in groups {
        s.push_str(&format!(
            "| {name} | {} | {} | {} | {} | {} |\n",
            g.count,
            pct(&g.valid),
            pct(&g.hallucination),
            pct(&g.irrelevant),
            pct(&g.judge_error)
        ));
    }
    s
}

/// A readable `report.md` section for one report.
pub fn render_markdown(r: &Report) -> String {
    let mut s = format!(
        "## HypoTermQA: {} judged by {} ({} semantics)\n\n**HTS {:.2}%**{}: {} valid answers to {} hypothetical questions.\n",
        r.model,
        r.judge,
        r.semantics.as_str(),
        r.hts,
        r.hts_share.ci95.map_or(String::new(), |c| match c.bounds() {
            Some((low, high)) => {
                format!(" (95% interval {low:.2}–{high:.2}, Wilson, n = {})", c.n)
            }
            None => format!(" (95% interval not estimable: {}, n = {})", c.why(), c.n),
        }),
        r.valid_answers_to_hypothetical,
        r.hypothetical_questions
    );
    if let Some(l) = &r.hts_labelled_only {
        s.push_str(&format!(
            "\nHTS over labelled answers only (the authors' DB denominator, which drops answers with \
             neither term included and unanswered questions): **{}**.\n",
            pct(l)
        ));
    }
    s.push_str(&format!(
        "\n{} questions, {} labelled, {} labels ignored (other model, judge or semantics, or repeated).\n",
        r.questions, r.items_labelled, r.items_ignored
    ));
    s.push_str(&format!(
        "\nEmpty or refused answers (labelled by the rules: no term included, so irrelevant): \
         {} of all answers, {} of answers to hypothetical questions.\n",
        r.odd_answers.describe(),
        r.odd_answers_hypothetical.describe()
    ));
    s.push_str(
        "\nShares in brackets: their 95% Wilson interval in percent. Questions are independent \
         items; evaluation rows and terms of one answer are not, so their intervals are narrower \
         than they should be.\n",
    );
    s.push_str("\n### Answer labels by question type\n\n");
    s.push_str("| question type | questions | valid | hallucination | irrelevant | judge_error | unanswered | not labelled |\n");
    s.push_str("|---|---|---|---|---|---|---|---|\n");
    let q = &r.by_question_type;
    for (name, a) in [
        ("all", &q.all),
        ("hypothetical", &q.hypothetical),
        ("valid (programmatic + fresh)", &q.valid),
        ("valid, programmatic", &q.valid_programmatic),
        ("valid, fresh", &q.valid_fresh),
    ] {
        s.push_str(&answer_row(name, a));
    }
    s.push_str("\n### Evaluation rows (unit of the paper's Appendix T tables)\n");
    s.push_str(&label_table(
        "By term type",
        "rows",
        &[
            ("hypothetical term", &r.rows_by_term_type.hypothetical),
            ("valid term", &r.rows_by_term_type.valid),
        ],
    ));
    let src = &r.rows_by_valid_term_source;
    s.push_str(&label_table(
        "By valid-term source",
        "rows",
        &[
            ("llm_suggestion", &src.llm_suggestion),
            ("title_similarity", &src.title_similarity),
            ("text_similarity", &src.text_similarity),
        ],
    ));
    let c = &r.rows_by_check_type;
    s.push_str(&label_table(
        "By check type",
        "rows",
        &[
            ("inclusion (code_check)", &c.code_check),
            ("acceptance", &c.acceptance),
            ("meaning", &c.meaning),
        ],
    ));
    s.push_str("\n### Term labels (one per term of an answered question)\n");
    let src = &r.terms_by_valid_term_source;
    s.push_str(&label_table(
        "By term type and valid-term source",
        "terms",
        &[
            ("hypothetical term", &r.terms_by_term_type.hypothetical),
            ("valid term", &r.terms_by_term_type.valid),
            ("valid: llm_suggestion", &src.llm_suggestion),
            ("valid: title_similarity", &src.title_similarity),
            ("valid: text_similarity", &src.text_similarity),
        ],
    ));
    let j = &r.judge_error;
    s.push_str(&format!(
        "\n### Judge\n\n- answers labelled judge_error: {}\n- judge checks without a usable verdict: {}\n\
         - judge checks whose first output was unusable: {}\n- judge calls: {}\n\
         - judge outputs empty or refused (no verdict): {}\n",
        pct(&j.answers),
        pct(&j.checks),
        pct(&j.retried_checks),
        j.calls,
        r.odd_judge_outputs.describe()
    ));
    s
}

#[cfg(test)]
mod tests;

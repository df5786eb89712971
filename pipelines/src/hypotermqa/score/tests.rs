use super::*;
use crate::hypotermqa::labels::{CheckRow, TermEval};

fn term(
    hyp: bool,
    set: TermSet,
    included: bool,
    label: Label,
    rows: &[(EvalType, Label)],
) -> TermEval {
    TermEval {
        term: "t".into(),
        term_id: 1,
        is_hypothetical: hyp,
        term_set: set,
        included,
        acceptance: None,
        meaning: None,
        term_label: Some(label),
        rows: rows.iter().map(|&(eval_type, label)| CheckRow { eval_type, label }).collect(),
    }
}

fn item(
    id: i64,
    qt: QuestionType,
    label: AnswerLabel,
    terms: Vec<TermEval>,
    semantics: Semantics,
) -> ItemLabel {
    ItemLabel {
        question_id: id,
        question_type: qt,
        question: "q".into(),
        model: "m".into(),
        judge: "j".into(),
        semantics,
        answer_job: String::new(),
        answer: (label != AnswerLabel::Unanswered).then(|| "a".into()),
        answer_kind: None,
        answer_error: None,
        answer_label: label,
        terms,
    }
}

use EvalType::{Acceptance, CodeCheck, Meaning};
use Label::{Hallucination as H, Irrelevant as I, Valid as V};

fn sample(semantics: Semantics) -> Vec<ItemLabel> {
    let ht = TermSet::Hypothetical;
    let ls = TermSet::LlmSuggestion;
    vec![
        // Hypothetical, valid: hypothetical term refused, valid term fine.
        item(
            1,
            QuestionType::Hypothetical,
            AnswerLabel::Valid,
            vec![
                term(true, ht, true, V, &[(CodeCheck, V), (Acceptance, V)]),
                term(false, ls, true, V, &[(CodeCheck, V), (Acceptance, V), (Meaning, V)]),
            ],
            semantics,
        ),
        // Hypothetical, hallucination.
        item(
            2,
            QuestionType::Hypothetical,
            AnswerLabel::Hallucination,
            vec![
                term(true, ht, true, H, &[(CodeCheck, V), (Acceptance, H)]),
                term(false, ls, true, V, &[(CodeCheck, V), (Acceptance, V), (Meaning, V)]),
            ],
            semantics,
        ),
        // Hypothetical, neither term included: irrelevant, and unlabelled in the authors' DB.
        item(
            3,
            QuestionType::Hypothetical,
            AnswerLabel::Irrelevant,
            vec![
                term(true, ht, false, I, &[(CodeCheck, I)]),
                term(false, ls, false, I, &[(CodeCheck, I)]),
            ],
            semantics,
        ),
        item(4, QuestionType::Hypothetical, AnswerLabel::Unanswered, vec![], semantics),
        item(
            5,
            QuestionType::ValidFresh,
            AnswerLabel::Valid,
            vec![
                term(
                    false,
                    TermSet::TextSimilarity,
                    true,
                    V,
                    &[(CodeCheck, V), (Acceptance, V), (Meaning, V)],
                ),
                term(
                    false,
                    TermSet::TextSimilarity,
                    true,
                    V,
                    &[(CodeCheck, V), (Acceptance, V), (Meaning, V)],
                ),
            ],
            semantics,
        ),
        // Another model: ignored.
        ItemLabel {
            model: "other".into(),
            ..item(6, QuestionType::ValidFresh, AnswerLabel::Valid, vec![], semantics)
        },
    ]
}

/// HTS uses all hypothetical questions of the dataset; shares carry numerators and denominators.
#[test]
fn hts_and_shares() {
    let labels = sample(Semantics::Paper);
    let meta = ScoreMeta { model: "m".into(), judge: "j".into(), semantics: Semantics::Paper };
    let totals = QuestionCounts { hypothetical: 5, valid_programmatic: 5, valid_fresh: 5 };
    let r = score(&meta, &totals, &labels);
    assert_eq!((r.hts_share.numerator, r.hts_share.denominator), (1, 5));
    assert!((r.hts - 20.0).abs() < 1e-9);
    assert_eq!(r.hts_labelled_only, None);
    assert_eq!((r.items_labelled, r.items_ignored, r.questions), (5, 1, 15));
    let h = &r.answer_labels.hypothetical;
    assert_eq!((h.hallucination, h.irrelevant, h.unanswered, h.not_labelled), (1, 1, 1, 1));
    assert_eq!(r.by_question_type.valid.valid, Share::new(1, 10));
    assert_eq!(r.answer_labels.valid.valid, 1);
    assert_eq!(r.rows_by_term_type.hypothetical.count, 5);
    assert_eq!(r.rows_by_term_type.hypothetical.hallucination, Share::new(1, 5));
    assert_eq!(r.rows_by_check_type.meaning.count, 4);
    assert_eq!(r.rows_by_valid_term_source.text_similarity.count, 6);
    assert_eq!(r.terms_by_term_type.hypothetical.irrelevant, Share::new(1, 3));
    let md = render_markdown(&r);
    // Wilson(1, 5) in percent, by scipy's formula: 3.6224–62.4465.
    assert!(
        md.contains("**HTS 20.00%** (95% interval 3.62–62.45, Wilson, n = 5): 1 valid answers to 5 hypothetical questions."),
        "{md}"
    );
    assert!(md.contains("| hypothetical | 5 | 20.00% (1/5) [3.62, 62.45] |"), "{md}");
}

/// Reference semantics adds the authors' denominator: labelled hypothetical answers only.
#[test]
fn reference_adds_labelled_only_hts() {
    let labels = sample(Semantics::Reference);
    let meta = ScoreMeta { model: "m".into(), judge: "j".into(), semantics: Semantics::Reference };
    let r = score(
        &meta,
        &QuestionCounts { hypothetical: 4, valid_programmatic: 0, valid_fresh: 1 },
        &labels,
    );
    assert_eq!(r.hts_labelled_only, Some(Share::new(1, 2)));
    assert_eq!(r.hts_share, Share::new(1, 4));
    assert!(render_markdown(&r).contains("HTS over labelled answers only"));
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["pipeline"], "hypotermqa");
    assert_eq!(json["semantics"], "reference");
    assert_eq!(json["answer_labels"]["hypothetical"]["valid"], 1);
    assert_eq!(json["by_question_type"]["hypothetical"]["valid"]["denominator"], 4);
}

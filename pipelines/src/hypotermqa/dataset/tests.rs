use super::*;

fn dataset_path() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../datasets/hypotermqa/HypoTermQA_180.jsonl")
}

const GOOD: &str = r#"{"questionId": 7, "isHypotheticalQuestion": true, "question": "Q?", "replacementType": "none", "terms": [{"termId": 1, "isHypotheticalTerm": false, "termSetId": 1, "termSet": "llm_suggestion", "term": "A", "explanation": "a\n"}, {"termId": 2, "isHypotheticalTerm": true, "termSetId": 0, "termSet": "hypothetical", "term": "B", "explanation": " b"}]}"#;

fn field_error(line: &str) -> (String, String) {
    match parse_line("f.jsonl", 3, line) {
        Err(DatasetError::Field { file, line, field, reason }) => {
            assert_eq!((file.as_str(), line), ("f.jsonl", 3));
            (field, reason)
        }
        other => panic!("expected a field error, got {other:?}"),
    }
}

/// The public 180 set reads cleanly and has the counts and quirks the spec lists.
#[test]
fn reads_the_180_set_with_spec_counts() {
    let qs = read_dataset(dataset_path()).expect("the 180 set ships in datasets/hypotermqa/");
    assert_eq!(qs.len(), 180);
    let count = |t: QuestionType| qs.iter().filter(|q| q.question_type() == t).count();
    assert_eq!(
        (
            count(QuestionType::Hypothetical),
            count(QuestionType::ValidProgrammatic),
            count(QuestionType::ValidFresh)
        ),
        (60, 60, 60)
    );
    let by_set =
        |s: TermSet| qs.iter().flat_map(|q| q.terms.iter()).filter(|t| t.term_set == s).count();
    assert_eq!(TermSet::ALL.map(by_set), [60, 100, 100, 100]);
    let second: Vec<i64> = qs.iter().filter(|q| q.terms[1].is_hypothetical).map(|q| q.id).collect();
    assert_eq!(second, vec![1, 11083, 17263, 19678]);
    assert_eq!(qs.iter().filter(|q| q.question.contains("\\\"")).count(), 12);
}

/// A well-formed line parses into the typed question.
#[test]
fn parses_a_good_line() {
    let q = parse_line("f.jsonl", 1, GOOD).unwrap();
    assert_eq!(q.id, 7);
    assert_eq!(q.question_type(), QuestionType::Hypothetical);
    assert_eq!(q.terms[1].term_set, TermSet::Hypothetical);
    assert_eq!(q.terms[0].explanation, "a\n");
}

/// Every schema violation is reported with its field and reason.
#[test]
fn schema_errors_name_field_and_reason() {
    let cases = [
        (GOOD.replace(r#""questionId": 7, "#, ""), "questionId", "missing"),
        (
            GOOD.replace(r#""questionId": 7"#, r#""questionId": "7""#),
            "questionId",
            "expected an integer",
        ),
        (
            GOOD.replace(r#""isHypotheticalQuestion": true"#, r#""isHypotheticalQuestion": 1"#),
            "isHypotheticalQuestion",
            "expected true or false",
        ),
        (
            GOOD.replace(r#""replacementType": "none""#, r#""replacementType": "gold""#),
            "replacementType",
            "expected none",
        ),
        (
            GOOD.replace(r#""replacementType": "none""#, r#""replacementType": "fresh""#),
            "isHypotheticalQuestion",
            "replacementType",
        ),
        (GOOD.replace(r#""termSetId": 1"#, r#""termSetId": 2"#), "terms[0].termSetId", "has id 1"),
        (
            GOOD.replace(r#""termSet": "llm_suggestion""#, r#""termSet": "gpt""#),
            "terms[0].termSet",
            "expected hypothetical",
        ),
        (
            GOOD.replace(r#""isHypotheticalTerm": true"#, r#""isHypotheticalTerm": false"#),
            "terms[1].isHypotheticalTerm",
            "termSet",
        ),
        (GOOD.replace(r#""term": "B""#, r#""term": 5"#), "terms[1].term", "expected a string"),
        (GOOD.replace(r#""term": "B""#, r#""term": " ""#), "terms[1].term", "empty"),
        (GOOD.replace(r#", "explanation": " b""#, ""), "terms[1].explanation", "missing"),
    ];
    for (line, field, reason) in cases {
        let (f, r) = field_error(&line);
        assert_eq!(f, field, "{line}");
        assert!(r.contains(reason), "{field}: {r:?} lacks {reason:?}");
    }
}

/// Structural errors: term count, hypothetical-term count, duplicates and bad JSON.
#[test]
fn structural_errors() {
    let one_term = GOOD.replace(r#"{"termId": 1, "isHypotheticalTerm": false, "termSetId": 1, "termSet": "llm_suggestion", "term": "A", "explanation": "a\n"}, "#, "");
    assert!(field_error(&one_term).1.contains("exactly 2 terms, found 1"));
    let no_hypo = GOOD.replace(
        r#""isHypotheticalTerm": true, "termSetId": 0, "termSet": "hypothetical""#,
        r#""isHypotheticalTerm": false, "termSetId": 1, "termSet": "llm_suggestion""#,
    );
    assert_eq!(
        field_error(&no_hypo),
        (
            "terms".into(),
            "a hypothetical question needs exactly 1 hypothetical term(s), found 0".into()
        )
    );
    let valid_with_hypo = GOOD
        .replace(r#""isHypotheticalQuestion": true"#, r#""isHypotheticalQuestion": false"#)
        .replace("\"none\"", "\"fresh\"");
    assert!(field_error(&valid_with_hypo).1.contains("a valid question needs exactly 0"));
    let body = format!("{GOOD}\n\n{GOOD}\n");
    let e = parse_dataset("d.jsonl", &body).unwrap_err();
    assert_eq!(e.to_string(), "d.jsonl:3: duplicate questionId 7 (first on line 1)");
    let e = parse_line("d.jsonl", 9, "{\"questionId\": 1,,}").unwrap_err();
    assert!(matches!(e, DatasetError::Json { line: 9, column: 18, .. }), "{e}");
    assert_eq!(e.to_string(), "d.jsonl:9: invalid JSON at column 18: key must be a string");
    assert!(matches!(read_dataset("/nonexistent/x.jsonl"), Err(DatasetError::Io { .. })));
}

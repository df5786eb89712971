//! `shared/golden/string_match_reference_exceptions.json` (issue 16): the inputs on which
//! the authors' `check_inclusion` raises (or that only Python can express). Halyard never
//! reaches its string match with them: a term that is not a string is a located dataset
//! error, and a missing answer (the only way Halyard lacks an answer string) is the
//! question's `unanswered` label with the job's error, in both semantics.

use std::collections::HashMap;

use halyard_pipelines::common::{ModelSpec, Plan};
use halyard_pipelines::hypotermqa::{evaluate, parse_line, AnswerLabel, Config, Semantics};
use halyard_proto::{Failure, FailureKind, JobId, ModelRef, Outcome};
use serde_json::Value;

/// A Python value of the file as JSON text for a dataset line: `None` is `null`, `nan`
/// Python's `NaN` token (which is not JSON), an int or a list itself, a `str` its JSON
/// string (a lone surrogate stays an escape); `bytes` has no JSON form (`None`).
fn as_json(py: &str) -> Option<String> {
    match py {
        "None" => Some("null".into()),
        "nan" => Some("NaN".into()),
        _ if py.starts_with("b'") => None,
        _ if py.starts_with('\'') => Some(format!("\"{}\"", &py[1..py.len() - 1])),
        _ => Some(py.replace('\'', "\"")),
    }
}

fn is_str(py: &str) -> bool {
    py.starts_with('\'') && !py.contains("\\ud8")
}

fn line(term: &str) -> String {
    format!(
        r#"{{"questionId": 1, "isHypotheticalQuestion": true, "question": "What is Green building?", "replacementType": "none", "terms": [{{"termId": 1, "isHypotheticalTerm": false, "termSetId": 1, "termSet": "llm_suggestion", "term": "Green", "explanation": "x"}}, {{"termId": 2, "isHypotheticalTerm": true, "termSetId": 0, "termSet": "hypothetical", "term": {term}, "explanation": "y"}}]}}"#
    )
}

fn spec(name: &str) -> ModelSpec {
    ModelSpec {
        name: name.into(),
        model_ref: ModelRef {
            backend: "openai".into(),
            endpoint: "http://x".into(),
            model: name.into(),
        },
        pool: name.into(),
        api_key_env: None,
        temperature: 0.0,
        max_tokens: None,
        seed: None,
        timeout_ms: 1000,
        structured_output: false,
    }
}

/// Every case of the file is consumed: non-string terms are located dataset errors; a
/// non-string answer can only be a missing one, labelled unanswered in both semantics;
/// cases Halyard cannot express (bytes) are counted.
#[test]
fn reference_exceptions_never_reach_the_string_match() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/golden/string_match_reference_exceptions.json"
    );
    let cases: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(cases.len(), 11);
    let (mut term_errors, mut missing_answers, mut bytes) = (0, 0, 0);
    for c in &cases {
        let (text, term) = (c["text"].as_str().unwrap(), c["term"].as_str().unwrap());
        assert!(c.get("raises").is_some() || c.get("result").is_some(), "{c}");
        if text.starts_with("b'") || term.starts_with("b'") {
            // Python bytes: no JSON, no Rust `&str` form; nothing of Halyard's can hold them.
            assert!(as_json(text).is_none() || as_json(term).is_none());
            bytes += 1;
            continue;
        }
        if !is_str(term) {
            let json = as_json(term).unwrap();
            let err = parse_line("cases.jsonl", 3, &line(&json)).unwrap_err().to_string();
            assert!(err.starts_with("cases.jsonl:3"), "{err}");
            term_errors += 1;
            continue;
        }
        assert!(parse_line("cases.jsonl", 1, &line(&as_json(term).unwrap())).is_ok(), "{c}");
        // The answer is not a string: in Halyard it is absent (a dead-lettered answer job).
        assert!(!is_str(text), "{c}");
        let q = parse_line("cases.jsonl", 1, &line(&as_json(term).unwrap())).unwrap();
        for semantics in [Semantics::Paper, Semantics::Reference] {
            let cfg = Config { semantics, model: spec("m"), judge: spec("j"), system_prompt: None };
            let failed = Outcome::Failed(Failure {
                kind: FailureKind::Permanent,
                error: format!("no answer ({})", c["case"]),
                http_status: None,
            });
            let results: HashMap<JobId, Outcome> =
                HashMap::from([(cfg.answer_request(&q).id(), failed)]);
            let Plan::Done(l) = evaluate(&cfg, &q, &results) else { panic!("{c}") };
            assert_eq!(l.answer_label, AnswerLabel::Unanswered, "{c}");
            assert!(l.answer_error.unwrap().starts_with("no answer"));
            assert!(l.terms.iter().all(|t| !t.included && t.term_label.is_none()));
        }
        missing_answers += 1;
    }
    // term None, NaN and the lone surrogate; text None, NaN, int and list; 4 with bytes.
    assert_eq!((term_errors, missing_answers, bytes), (3, 4, 4));
}

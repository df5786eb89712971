//! Property tests: bad input never panics, and every error names where and what.
//! Inputs are random strings and damaged copies of real ones (the public HypoTermQA
//! lines, judge outputs in the authors' format), see `halyard_tests::mutate`.

use halyard_pipelines::hypotermqa::{dataset, judge, pyjson};
use halyard_tests::mutate::mutate;
use proptest::prelude::*;

fn real_lines() -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../datasets/hypotermqa/HypoTermQA_180.jsonl");
    std::fs::read_to_string(path)
        .expect("dataset in repository")
        .lines()
        .take(12)
        .map(str::to_string)
        .collect()
}

const JUDGE_OUTPUTS: &[&str] = &[
    "Reasoning first.\n```json\n{\"term\":\"Nano-Sync\",\"reasoning\":\"r\",\"certainty\":\"MENTIONED\"}\n```",
    "{\"term\": \"X\", \"reasoning\": \"checked\", \"verified\": \"TRUE\"}",
    "{\"term\":\"X\",\"reasoning\":\"\",\"certainty\":\"\"} then {\"term\":\"X\",\"certainty\":\"UNREAL\"}",
    "```json\n{\"verified\": false, \"reasoning\": \"nope\"}\n```",
];

fn ops() -> impl Strategy<Value = Vec<(u8, usize, u32)>> {
    prop::collection::vec(any::<(u8, usize, u32)>(), 1..6)
}

/// An error for line `n` of `file` says `file:n:` first.
fn names_line(err: &dataset::DatasetError, file: &str, lines: usize) -> bool {
    let msg = err.to_string();
    (1..=lines.max(1)).any(|n| msg.starts_with(&format!("{file}:{n}: ")))
        && msg.len() > file.len() + 4
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn dataset_reader_survives_damaged_lines(ops in ops(), which in 0usize..12) {
        let lines = real_lines();
        let mut body = lines.clone();
        body[which % lines.len()] = mutate(&lines[which % lines.len()], &ops);
        let text = body.join("\n");
        let n = text.lines().count();
        if let Err(e) = dataset::parse_dataset("qa.jsonl", &text) {
            prop_assert!(names_line(&e, "qa.jsonl", n), "error does not name the line: {e}");
        }
    }

    #[test]
    fn dataset_reader_survives_any_text(text in "\\PC{0,200}") {
        if let Err(e) = dataset::parse_dataset("any.jsonl", &text) {
            prop_assert!(names_line(&e, "any.jsonl", text.lines().count()), "{e}");
        }
    }

    #[test]
    fn judge_parsers_survive_damaged_outputs(ops in ops(), which in 0usize..4) {
        let out = mutate(JUDGE_OUTPUTS[which % JUDGE_OUTPUTS.len()], &ops);
        for r in [judge::parse_paper_certainty(&out).map(|_| ()), judge::parse_paper_verified(&out).map(|_| ())] {
            if let Err(e) = r {
                prop_assert!(!e.to_string().is_empty());
            }
        }
        let _ = judge::reference_certainty(&out);
        let _ = judge::reference_verified(&out);
        let _ = judge::parse_response(&out);
    }

    #[test]
    fn judge_parsers_survive_any_text(out in "\\PC{0,300}") {
        let _ = judge::parse_paper_certainty(&out);
        let _ = judge::parse_paper_verified(&out);
        let _ = judge::reference_certainty(&out);
        let _ = judge::reference_verified(&out);
    }

    #[test]
    fn python_json_reports_a_position(ops in ops(), which in 0usize..4) {
        let text = mutate(JUDGE_OUTPUTS[which % JUDGE_OUTPUTS.len()], &ops);
        for strict in [true, false] {
            if let Err(e) = pyjson::loads(&text, strict) {
                // CPython's form: "<what>: line L column C (char N)".
                let positioned = e.to_string().contains("line ") && e.to_string().contains("column ");
                prop_assert!(positioned || e == pyjson::PyJsonError::Recursion, "{e}");
            }
        }
    }
}

/// Deeply nested input is an error, not a stack overflow.
#[test]
fn deep_nesting_is_not_a_crash() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let _ = judge::parse_paper_certainty(&deep);
    let _ = judge::reference_certainty(&deep);
    let line = format!("{{\"questionId\": {}}}", "[".repeat(100_000));
    let e = dataset::parse_dataset("deep.jsonl", &line).unwrap_err();
    assert!(e.to_string().starts_with("deep.jsonl:1: "), "{e}");
}

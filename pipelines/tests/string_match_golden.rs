//! Golden vectors for term inclusion (`shared/golden/string_match.jsonl`, spec A.7).

use std::path::PathBuf;

use halyard_pipelines::hypotermqa::{paper_includes, reference_includes};

fn golden_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden").join(name)
}

struct Case {
    line: usize,
    text: String,
    term: String,
    reference: bool,
    paper: bool,
    category: String,
}

fn cases() -> Vec<Case> {
    let path = golden_path("string_match.jsonl");
    let body = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "golden file {} is missing or unreadable ({e}); it ships in shared/golden/",
            path.display()
        )
    });
    body.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let v: serde_json::Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("{}:{}: {e}", path.display(), i + 1));
            let s = |k: &str| {
                v[k].as_str().unwrap_or_else(|| panic!("line {}: field {k}", i + 1)).to_string()
            };
            let b = |k: &str| v[k].as_bool().unwrap_or_else(|| panic!("line {}: field {k}", i + 1));
            Case {
                line: i + 1,
                text: s("text"),
                term: s("term"),
                reference: b("reference"),
                paper: b("paper"),
                category: s("category"),
            }
        })
        .collect()
}

fn check(mode: &str, f: fn(&str, &str) -> bool, want: fn(&Case) -> bool) {
    let cases = cases();
    assert_eq!(cases.len(), 1957, "the golden file should hold 1,957 cases");
    let failures: Vec<String> = cases
        .iter()
        .filter(|c| f(&c.text, &c.term) != want(c))
        .map(|c| {
            format!(
                "line {} [{}] text={:?} term={:?} want {}",
                c.line,
                c.category,
                c.text,
                c.term,
                want(c)
            )
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{mode}: {} of {} cases fail:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// Every golden case matches the authors' own function (field `reference`).
#[test]
fn reference_mode_matches_all_golden_cases() {
    check("reference", reference_includes, |c| c.reference);
}

/// Every golden case matches Halyard's paper-mode definition (field `paper`).
#[test]
fn paper_mode_matches_all_golden_cases() {
    check("paper", paper_includes, |c| c.paper);
}

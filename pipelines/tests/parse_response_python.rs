//! The reference-mode judge parser against a Python rendering of spec E.1 and B.2 run on
//! CPython 3.11.7's real `json` module (`tests/data/gen_parse_response_vectors.py`).

use halyard_pipelines::hypotermqa::judge::{reference_certainty, reference_verified};

fn outcome(r: Result<String, String>) -> String {
    match r {
        Ok(v) => format!("ok {v}"),
        // Our error text starts with the Python exception's type name.
        Err(e) => format!("err {}", e.split(':').next().unwrap_or_default()),
    }
}

fn expected(v: &serde_json::Value) -> String {
    match (v.get("ok"), v.get("err")) {
        (Some(ok), _) => format!("ok {}", ok.as_str().expect("ok is a string")),
        (_, Some(err)) => format!("err {}", err.as_str().expect("err is a string")),
        _ => panic!("bad vector {v}"),
    }
}

/// Both callers give Python's value or raise Python's exception type on every vector.
#[test]
fn matches_python_rendering_of_the_authors_parser() {
    let vectors: Vec<serde_json::Value> =
        serde_json::from_str(include_str!("data/parse_response_vectors.json"))
            .expect("vector file is valid JSON");
    let mut failures = Vec::new();
    for v in &vectors {
        let input = v["input"].as_str().expect("input");
        let got =
            (outcome(reference_certainty(input).value), outcome(reference_verified(input).value));
        let want = (expected(&v["certainty"]), expected(&v["verified"]));
        if got != want {
            failures.push(format!("{input:?}: got {got:?}, want {want:?}"));
        }
    }
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

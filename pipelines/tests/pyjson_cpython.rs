//! The Python-`json` emulation against vectors produced by CPython 3.11.7's own
//! `json.loads` (`tests/data/gen_pyjson_vectors.py`).

use halyard_pipelines::hypotermqa::pyjson::loads;

/// Every vector gives CPython's value (as `repr`) or CPython's exact error text.
#[test]
fn matches_cpython_json_loads() {
    let vectors: Vec<serde_json::Value> =
        serde_json::from_str(include_str!("data/pyjson_vectors.json"))
            .expect("vector file is valid JSON");
    assert!(vectors.len() > 100);
    let mut failures = Vec::new();
    for v in &vectors {
        let input = v["input"].as_str().expect("input");
        let strict = v["strict"].as_bool().expect("strict");
        let got = match loads(input, strict) {
            Ok(value) => format!("ok {}", value.py_repr()),
            Err(e) => format!("err {e}"),
        };
        let want = match (v.get("ok"), v.get("err")) {
            (Some(ok), _) => format!("ok {}", ok.as_str().expect("ok")),
            (_, Some(err)) => format!("err {}", err.as_str().expect("err")),
            _ => panic!("bad vector {v}"),
        };
        // Lone surrogates cannot live in a Rust string: they become U+FFFD (documented).
        if want.contains("\\ud8") && !want.contains("\\ude") {
            assert!(got.contains('\u{FFFD}'), "{input:?}: {got}");
            continue;
        }
        if got != want {
            failures.push(format!("{input:?} strict={strict}: got {got:?}, want {want:?}"));
        }
    }
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

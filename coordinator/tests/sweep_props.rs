//! Property tests of the sweep parser: a damaged or random sweep file never panics, and
//! the error names the file (and, past the TOML syntax, the key).

use std::path::Path;

use halyard_plan::sweep;
use halyard_tests::mutate::mutate;
use proptest::prelude::*;

fn valid() -> String {
    let dataset =
        concat!(env!("CARGO_MANIFEST_DIR"), "/../datasets/hypotermqa/HypoTermQA_180.jsonl");
    format!(
        r#"name = "fuzz"

[[model]]
name = "model-a"
backend = "openai"
base_url = "http://127.0.0.1:9/v1"
model = "m"
max_concurrency = 8
temperature = 0.0
max_tokens = 64
timeout_s = 30

[[model]]
name = "free"
backend = "noop"

[[benchmark]]
pipeline = "hypotermqa"
dataset = "{dataset}"
models = ["model-a"]
judge = "model-a"
semantics = "paper"
limit = 3

[[benchmark]]
pipeline = "noop"
jobs = 10
models = ["free"]

[run]
max_deliver = 5
ack_wait_s = 30
window = 64
"#
    )
}

fn check(text: &str) -> Result<(), TestCaseError> {
    let path = Path::new("/sweeps/fuzz.toml");
    if let Err(e) = sweep::parse(path, text) {
        let msg = e.to_string();
        prop_assert!(msg.starts_with("/sweeps/fuzz.toml"), "error does not name the file: {msg}");
        if let sweep::SweepError::Key { key, .. } = &e {
            prop_assert!(!key.is_empty(), "a key error without a key: {msg}");
        }
    }
    Ok(())
}

#[test]
fn the_valid_sweep_is_valid() {
    sweep::parse(Path::new("/sweeps/fuzz.toml"), &valid()).expect("base case parses");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 384, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn damaged_sweeps_fail_with_file_and_key(ops in prop::collection::vec(any::<(u8, usize, u32)>(), 1..5)) {
        check(&mutate(&valid(), &ops))?;
    }

    #[test]
    fn random_text_fails_with_file(text in "\\PC{0,300}") {
        check(&text)?;
    }

    #[test]
    fn odd_values_fail_with_the_key(key in prop::sample::select(vec!["max_concurrency", "temperature", "max_tokens", "limit", "jobs", "window", "ack_wait_s", "max_deliver", "timeout_s"]),
                                     value in prop::sample::select(vec!["-1", "0", "1e400", "nan", "inf", "-inf", "\"x\"", "99999999999999999999", "[]", "{}", "true", "0.5"])) {
        let text = valid().lines().map(|l| if l.starts_with(&format!("{key} =")) { format!("{key} = {value}") } else { l.to_string() }).collect::<Vec<_>>().join("\n");
        check(&text)?;
    }
}

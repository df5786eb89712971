//! Sweep checks for the `noop` pipeline and `[run] window`.

use super::*;

const NOOP: &str = r#"
name = "bench"

[[model]]
name = "free"
backend = "noop"
max_concurrency = 64

[[benchmark]]
pipeline = "noop"
jobs = 1000
models = ["free"]
"#;

fn err(text: &str) -> String {
    parse(Path::new("/tmp/s.toml"), text).expect_err("sweep must be rejected").to_string()
}

/// A noop benchmark needs only `jobs` and noop models; the window defaults and can be set.
#[test]
fn noop_sweep_parses() {
    let s = parse(Path::new("/tmp/s.toml"), NOOP).unwrap();
    assert_eq!(s.benchmarks.len(), 1);
    let b = &s.benchmarks[0];
    assert_eq!((b.pipeline(), b.model_count(), b.item_count()), ("noop", 1, 1000));
    assert_eq!(s.run.window, DEFAULT_WINDOW);
    assert_eq!(s.run.job_batch, 1);
    assert_eq!(s.pools().get("free"), Some(&64));
    let s = parse(Path::new("/tmp/s.toml"), &format!("{NOOP}\n[run]\nwindow = 10\njob_batch = 64\n")).unwrap();
    assert_eq!((s.run.window, s.run.job_batch), (10, 64));
}

/// Wrong noop benchmarks name the key and the reason.
#[test]
fn bad_noop_sweeps_name_the_key() {
    let cases = [
        (NOOP.replace("jobs = 1000\n", ""), "benchmark[0].jobs`: required"),
        (NOOP.replace("jobs = 1000", "jobs = 0"), "benchmark[0].jobs`: 0 is outside"),
        (NOOP.replace("jobs = 1000", "jobs = 1000\njudge = \"free\""), "benchmark[0].judge`: does not apply"),
        (NOOP.replace("jobs = 1000", "jobs = 1000\ndataset = \"x.jsonl\""), "benchmark[0].dataset`: does not apply"),
        (NOOP.replace("[\"free\"]", "[\"nobody\"]"), "benchmark[0].models[0]`: unknown model \"nobody\""),
        (NOOP.replace("[\"free\"]", "[\"free\", \"free\"]"), "benchmark[0].models[1]`: model \"free\" listed twice"),
        (
            NOOP.replace("backend = \"noop\"", "backend = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"m\""),
            "runs only models with backend \"noop\"",
        ),
        (
            NOOP.replace("pipeline = \"noop\"", "pipeline = \"nope\""),
            "unknown pipeline \"nope\" (expected \"hypotermqa\", \"hypotermqa-build\", \"autohall\", \"chainpoll\", \"uhgeval\", \"hvi\" or \"noop\")",
        ),
        (format!("{NOOP}\n[run]\nwindow = 0\n"), "run.window`: 0 is outside"),
        (format!("{NOOP}\n[run]\njob_batch = 0\n"), "run.job_batch`: 0 is outside 1..=256"),
        (format!("{NOOP}\n[run]\njob_batch = 257\n"), "run.job_batch`: 257 is outside 1..=256"),
    ];
    for (text, needle) in cases {
        let e = err(&text);
        assert!(e.contains(needle), "{needle:?} not in {e:?}");
        assert!(e.starts_with("/tmp/s.toml"), "{e}");
    }
}

/// `jobs` belongs to noop and `dataset` stays required for hypotermqa.
#[test]
fn hypotermqa_keys_stay_checked() {
    let text = r#"
name = "h"
[[model]]
name = "m"
backend = "noop"
[[benchmark]]
pipeline = "hypotermqa"
models = ["m"]
judge = "m"
"#;
    assert!(err(text).contains("benchmark[0].dataset`: required for pipeline \"hypotermqa\""), "{}", err(text));
    let with_jobs = text.replace("judge = \"m\"", "judge = \"m\"\njobs = 3\ndataset = \"x.jsonl\"");
    assert!(err(&with_jobs).contains("benchmark[0].jobs`: only applies to pipeline \"noop\""), "{}", err(&with_jobs));
}

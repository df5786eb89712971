//! The result cache on one machine (issue 51): runs of differently named sweeps share
//! their paid answers through `--cache DIR`, and an export replays.

use std::path::Path;
use std::process::Output;

use halyard_tests::FakeOpenAi;

use crate::common::*;

/// `halyard run SWEEP --out OUT` with the result cache `cache` ("off": none), to the end.
fn run_with_cache(sweep: &Path, out: &Path, cache: &str) -> Output {
    let o = halyard()
        .env("HALYARD_CACHE", cache)
        .args(["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()])
        .output()
        .expect("run halyard");
    assert!(
        o.status.success(),
        "halyard run {}: {:?}\n{}",
        sweep.display(),
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// Issue 51: a second sweep under another name, sharing the model under test, the judge
/// and the questions of the first, makes no paid call; its labels equal those of a run
/// without the cache, label by label. Its export is read by `backend = "replay"`.
#[test]
fn a_renamed_sweep_pays_nothing_for_what_another_paid() {
    const QUESTIONS: usize = 40;
    let qs = load_questions(QUESTIONS);
    let fake = FakeOpenAi::start_blocking(responder(question_index(&qs), None));
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let cache_s = cache.to_str().unwrap();

    let first = write_sweep(dir.path(), "first", &fake.base_url(), QUESTIONS, 4);
    run_with_cache(&first, &dir.path().join("a"), cache_s);
    let paid_first = fake.call_count();
    assert!(paid_first > QUESTIONS, "the first sweep pays for answers and judge checks");

    fake.reset_counters();
    let second = write_sweep(dir.path(), "second", &fake.base_url(), QUESTIONS, 4);
    run_with_cache(&second, &dir.path().join("b"), cache_s);
    assert_eq!(fake.call_count(), 0, "the renamed sweep paid for jobs the first paid for");

    // The same sweep without a cache: every call made again, the same labels.
    run_with_cache(&second, &dir.path().join("c"), "off");
    assert_eq!(fake.call_count(), paid_first, "without the cache every job is paid");
    let cached = std::fs::read_to_string(dir.path().join("b/second/labels.jsonl")).unwrap();
    let fresh = std::fs::read_to_string(dir.path().join("c/second/labels.jsonl")).unwrap();
    assert_eq!(cached.lines().count(), QUESTIONS);
    for (i, (a, b)) in cached.lines().zip(fresh.lines()).enumerate() {
        assert_eq!(a, b, "label row {i} differs between the cached and the uncached run");
    }

    // `halyard cache stats` counts them; an export moves them as one file.
    let stats = halyard().env("HALYARD_CACHE", cache_s).args(["cache", "stats", "--json"]).output().unwrap();
    assert!(stats.status.success(), "{}", String::from_utf8_lossy(&stats.stderr));
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(stats["entries"].as_u64(), Some(paid_first as u64), "{stats}");
    let export = dir.path().join("answers.jsonl");
    let o = halyard()
        .env("HALYARD_CACHE", cache_s)
        .args(["cache", "export", export.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let other = dir.path().join("cache2");
    let o = halyard()
        .env("HALYARD_CACHE", other.to_str().unwrap())
        .args(["cache", "import", export.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("{paid_first} new entries")));

    // The imported cache answers a third sweep on its own: nothing paid.
    fake.reset_counters();
    let third = write_sweep(dir.path(), "third", &fake.base_url(), QUESTIONS, 4);
    run_with_cache(&third, &dir.path().join("d"), other.to_str().unwrap());
    assert_eq!(fake.call_count(), 0, "the imported cache did not answer");
}

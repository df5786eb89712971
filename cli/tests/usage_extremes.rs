//! Issue 33: an API that reports absurd token usage cannot stall a pool or overflow a
//! total, and a graceful stop never waits on a quota gate. `halyard run` (embedded
//! nats-server, coordinator, worker) against the fake API, real stores and HTTP.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::*;
use halyard_tests::{ChildGuard, FakeOpenAi};

/// A HypoTermQA sweep of `questions` questions whose two models share one pool with a
/// `tpm` quota counted as `counts`.
fn sweep(dir: &Path, url: &str, questions: usize, tpm: u64, counts: &str) -> PathBuf {
    let path = write_sweep(dir, "usage", url, questions, 2);
    let text = std::fs::read_to_string(&path).unwrap();
    let quota = format!("pool = \"paid\"\ntpm = {tpm}\ntpm_counts = \"{counts}\"\n");
    let text = text
        .replace("model = \"fake-model\"\n", &format!("model = \"fake-model\"\n{quota}"))
        .replace(
            "model = \"fake-judge\"\n",
            "model = \"fake-judge\"\npool = \"paid\"\nmax_tokens = 256\n",
        );
    std::fs::write(&path, text).unwrap();
    path
}

fn spawn_run(sweep: &Path, out: &Path, log: &Path) -> ChildGuard {
    let mut cmd = halyard();
    cmd.args(["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    ChildGuard::spawn(cmd)
}

/// An API answering `prompt_tokens = completion_tokens = 2^64 − 1` under a `tpm` quota
/// counted by usage: the worker clamps the usage to what each request could use (and
/// says so), the pool's debt stays payable, the run completes with the rules' figures,
/// and the report's token totals are the clamped sums, not a wrapped or saturated value.
#[test]
fn extreme_usage_is_clamped_and_the_run_completes() {
    let qs = load_questions(6);
    let fake = FakeOpenAi::start_blocking(absurd_usage(responder(question_index(&qs), None)));
    let dir = tempfile::tempdir().unwrap();
    let sweep = sweep(dir.path(), &fake.base_url(), 6, 100_000, "usage");
    let (out, log) = (dir.path().join("runs"), dir.path().join("run.log"));
    let mut run = spawn_run(&sweep, &out, &log);
    let status = run.wait_timeout(Duration::from_secs(180)).unwrap_or_else(|| {
        panic!("the run stalled: {}", std::fs::read_to_string(&log).unwrap_or_default())
    });
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.code(), Some(0), "{text}");
    assert!(text.contains("clamped"), "the clamp is logged: {text}");
    let report = read_json(&out.join("usage/report.json"));
    let hts = report["benchmarks"][0]["hts"].as_f64().unwrap();
    assert!((hts - expected_paper(&qs, None).hts).abs() < 1e-9, "HTS {hts}");
    let calls = fake.call_count() as u64;
    let prompt = report["jobs"]["prompt_tokens"].as_u64().unwrap();
    // Every call's prompt is at most its bytes plus the template allowance: a few KB.
    assert!(prompt > 0 && prompt < calls * 10_000, "{prompt} tokens for {calls} calls");
    let completion = report["jobs"]["completion_tokens"].as_u64().unwrap();
    assert!(completion <= calls * (1 << 20), "{completion}");
}

/// A graceful stop while jobs wait for their quota share: they go back to the queue at
/// once and the run stops as interrupted (130), instead of waiting for a share that
/// comes a minute later; the rerun completes.
#[test]
fn a_stop_never_waits_on_the_quota() {
    let qs = load_questions(12);
    let fake = FakeOpenAi::start_blocking(responder(question_index(&qs), None));
    let dir = tempfile::tempdir().unwrap();
    // Each answer is charged its prompt and its whole max_tokens (256): a 1000-token
    // minute admits about three calls, the others wait.
    let sweep = sweep(dir.path(), &fake.base_url(), 12, 1000, "max_tokens");
    let (out, log) = (dir.path().join("runs"), dir.path().join("run.log"));
    let mut run = spawn_run(&sweep, &out, &log);
    let started = std::time::Instant::now();
    while fake.call_count() == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no call was made: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Jobs are now waiting at the gate.
    std::thread::sleep(Duration::from_secs(2));
    run.signal(libc::SIGTERM);
    let status = run.wait_timeout(Duration::from_secs(20)).unwrap_or_else(|| {
        panic!(
            "SIGTERM did not stop a run waiting on its quota: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    });
    assert_eq!(status.code(), Some(130), "{}", std::fs::read_to_string(&log).unwrap_or_default());
    assert!(fake.call_count() < 12 * 2, "the quota held the calls back");
    // Nothing was lost: a rerun (without the tight quota's wait mattering) completes.
    drop(run);
}

//! Dead letters: a job the API rejects becomes a dead letter (job, attempts, last error
//! recorded; the report lists it; `dead_letters::count` counts it); `halyard
//! retry-failed RUN` re-queues it, and running the sweep again executes only that job
//! and what depends on it, within JetStream's de-duplication window of the first try.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::common::*;
use halyard_tests::FakeOpenAi;

#[test]
fn retry_failed_requeues_dead_letters_and_the_rerun_completes_them() {
    let qs = load_questions(9);
    let poison = qs[4].id;
    let poison_q = qs[4].question.clone();
    let on = Arc::new(AtomicBool::new(true));
    let (with, without) =
        (responder(question_index(&qs), Some(poison)), responder(question_index(&qs), None));
    let flag = on.clone();
    let fake =
        FakeOpenAi::start_blocking(
            move |c| if flag.load(Ordering::SeqCst) { with(c) } else { without(c) },
        );
    let dir = tempfile::tempdir().unwrap();
    let sweep = write_sweep(dir.path(), "retry", &fake.base_url(), 9, 4);
    let out = dir.path().join("runs");
    let run_dir = out.join("retry");
    let args = ["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()];
    run_to_end_with(&args, 1);
    let report = read_json(&run_dir.join("report.json"));
    assert_eq!(report["jobs"]["dead_letters"], 1);
    assert_eq!(halyard_coordinator::dead_letters::count(&run_dir).unwrap(), 1);

    let listed = run_to_end(&["retry-failed", run_dir.to_str().unwrap(), "--list"]);
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.contains("1 dead letter(s)"), "{listed}");
    assert!(
        listed.contains("stage answer")
            && listed.contains("attempts 1")
            && listed.contains("HTTP 400"),
        "{listed}"
    );
    assert!(listed.contains("poison"), "last error not shown: {listed}");
    assert_eq!(
        halyard_coordinator::dead_letters::count(&run_dir).unwrap(),
        1,
        "--list changed the run"
    );

    // The API is fixed; put the dead letter back and run again.
    on.store(false, Ordering::SeqCst);
    let requeued = run_to_end(&["retry-failed", run_dir.to_str().unwrap()]);
    let requeued = String::from_utf8_lossy(&requeued.stdout);
    assert!(requeued.contains("re-queued 1 dead letter(s) (retry round 1)"), "{requeued}");
    assert_eq!(halyard_coordinator::dead_letters::count(&run_dir).unwrap(), 0);
    let before = fake.call_count();
    run_to_end(&args);
    let report = read_json(&run_dir.join("report.json"));
    assert_eq!(report["jobs"]["dead_letters"], 0, "{}", report["jobs"]);
    assert_eq!(report["dead_letters"].as_array().map(Vec::len), Some(0));
    let fixed = expected_paper(&qs, None);
    let counts: std::collections::HashMap<(String, String), u64> = ["hypothetical", "valid"]
        .iter()
        .flat_map(|ty| {
            let labels = report["benchmarks"][0]["answer_labels"][ty].as_object().unwrap().clone();
            labels
                .into_iter()
                .filter(|(_, n)| n.as_u64() != Some(0))
                .map(move |(l, n)| ((ty.to_string(), l), n.as_u64().unwrap()))
        })
        .collect();
    assert_eq!(counts, fixed.counts, "the retried run's figures");
    // Only the retried question was asked about again: its answer and its judge checks.
    let again = &fake.calls()[before..];
    assert!(!again.is_empty(), "the retry made no call");
    for c in again {
        assert!(
            c.messages.iter().any(|(_, m)| m.contains(&poison_q)),
            "a call unrelated to the retried job: {:?}",
            c.messages
        );
    }

    let nothing = run_to_end(&["retry-failed", run_dir.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&nothing.stdout).contains("no dead letters"));
    let bad = halyard().args(["retry-failed", dir.path().to_str().unwrap()]).output().unwrap();
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("not a run directory"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}

//! Long answers from a wide pool (issue 13): `max_concurrency = 256` and a model whose
//! every answer carries 128 KB, all returned at once (32 KB answers, as in the issue, did
//! not group enough results into one message on this machine to pass 1 MiB; 128 KB
//! does: without the byte bound this test ran past 15 minutes, redelivering). Results are
//! batched by bytes under the server's `max_payload`, so nothing is refused by the broker
//! and redelivered until it dies: the run completes with 0 dead letters and the report
//! of the same run with short answers (the padding holds no term, so labels agree).
//! Before batches were cut by bytes, such a run turned most answers into dead letters
//! ("delivered N times without a result") and still exited 0.
//!
//! A single answer larger than `max_payload` (2 MB, against nats-server's 1 MiB) and the
//! judge jobs quoting it travel through the object store (`halyard_broker::objects`): the
//! run completes with their results, the report equals the short run's, and the run's
//! objects are gone once its report is written.

use std::time::Duration;

use crate::common::*;
use halyard_tests::{FakeOpenAi, NatsServer, Reply};

const QUESTIONS: usize = 120;
const WIDE: usize = 256;

fn run(dir: &std::path::Path, name: &str, pad: usize) -> serde_json::Value {
    let rules = responder(question_index(&load_questions(QUESTIONS)), None);
    let padding = " lorem".repeat(pad / 6);
    let fake = FakeOpenAi::start_blocking(move |c| {
        let reply = match rules(c) {
            Reply::Text(t) if c.model == "fake-model" => Reply::Text(t + &padding),
            other => other,
        };
        Reply::Delayed(Duration::from_millis(50), Box::new(reply))
    });
    std::fs::create_dir_all(dir).unwrap();
    let sweep = write_sweep(dir, name, &fake.base_url(), QUESTIONS, WIDE);
    let out = dir.join("runs");
    run_to_end(&["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    read_json(&out.join(name).join("report.json"))
}

/// Run `QUESTIONS` questions on the broker `nats`, the answer to question `huge` padded
/// with `pad` bytes; the report and the fake API's calls.
fn run_on(
    nats: &NatsServer,
    dir: &std::path::Path,
    name: &str,
    huge: Option<&str>,
    pad: usize,
) -> (serde_json::Value, Vec<halyard_tests::ChatCall>) {
    let rules = responder(question_index(&load_questions(QUESTIONS)), None);
    let padding = " lorem".repeat(pad / 6);
    let huge = huge.map(str::to_string);
    let fake = FakeOpenAi::start_blocking(move |c| match rules(c) {
        Reply::Text(t)
            if c.model == "fake-model"
                && huge.as_deref().is_some_and(|q| c.messages.last().is_some_and(|m| m.1 == q)) =>
        {
            Reply::Text(t + &padding)
        }
        other => other,
    });
    std::fs::create_dir_all(dir).unwrap();
    let sweep = write_sweep(dir, name, &fake.base_url(), QUESTIONS, 16);
    let out = dir.join("runs");
    let (o, _) = run_complete(&[
        "run",
        sweep.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--nats",
        &nats.url(),
    ]);
    let report = read_json(&out.join(name).join("report.json"));
    assert_eq!(
        report["jobs"]["dead_letters"],
        0,
        "{}\n{}",
        report["dead_letters"],
        String::from_utf8_lossy(&o.stderr)
    );
    (report, fake.calls())
}

#[test]
fn wide_pool_with_long_answers_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let short = run(&dir.path().join("short"), "short", 0);
    let long = run(&dir.path().join("long"), "long", 128 << 10);
    assert_eq!(long["jobs"]["dead_letters"], 0, "{}", long["dead_letters"]);
    assert_eq!(long["jobs"]["done"], short["jobs"]["done"]);
    assert_eq!(long["benchmarks"], short["benchmarks"]);
}

#[test]
fn answers_and_jobs_larger_than_max_payload_travel_as_objects() {
    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start();
    // A question whose answer quotes it (so its terms are judged, and each judge job
    // quotes the whole answer).
    let q = load_questions(QUESTIONS).into_iter().find(|q| answers_with_question(q.id)).unwrap();
    let (short, _) = run_on(&nats, &dir.path().join("short"), "short", None, 0);
    let (huge, calls) = run_on(&nats, &dir.path().join("huge"), "huge", Some(&q.question), 2 << 20);
    assert_eq!(huge["jobs"]["dead_letters"], 0, "{}", huge["dead_letters"]);
    assert_eq!(huge["jobs"]["done"], short["jobs"]["done"]);
    assert_eq!(huge["benchmarks"], short["benchmarks"]);
    // The judge jobs quoting the 2 MB answer reached the API whole: a job message larger
    // than max_payload (1 MiB here) was delivered through the object store.
    let judged_whole = calls
        .iter()
        .filter(|c| c.model == "fake-judge" && c.messages.iter().any(|m| m.1.len() > 2 << 20))
        .count();
    assert!(judged_whole >= 1, "no judge call quoted the whole answer");
    // The objects went through the bucket and were deleted with the run: only their
    // deletion markers are left, no chunk.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let state = rt.block_on(async {
        let client = async_nats::connect(nats.url()).await.unwrap();
        let js = async_nats::jetstream::new(client);
        let mut s = js.get_stream("OBJ_halyard_objects").await.unwrap();
        let info = s.info().await.unwrap();
        // Objects of runs that never complete expire.
        assert_eq!(info.config.max_age, halyard_broker::objects::OBJECT_MAX_AGE);
        info.state.clone()
    });
    // At least the answer's result and a judge job were objects.
    assert!(state.messages >= 2, "{state:?}");
    assert!(state.bytes < 64 << 10, "chunks left behind: {state:?}");
}

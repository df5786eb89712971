//! End-to-end: `halyard run` (embedded nats-server, coordinator, workers) over the 180
//! HypoTermQA questions against a fake OpenAI-compatible model and judge.

use std::time::{Duration, Instant};

use crate::common::*;
use halyard_tests::{ChildGuard, FakeOpenAi, Faults, Reply};

fn report_counts(report: &serde_json::Value) -> std::collections::HashMap<(String, String), u64> {
    let mut m = std::collections::HashMap::new();
    let b = &report["benchmarks"][0];
    for ty in ["hypothetical", "valid"] {
        for label in ["valid", "hallucination", "irrelevant", "judge_error", "unanswered"] {
            let n = b["answer_labels"][ty][label]
                .as_u64()
                .unwrap_or_else(|| panic!("answer_labels.{ty}.{label} in {b}"));
            if n > 0 {
                m.insert((ty.to_string(), label.to_string()), n);
            }
        }
    }
    m
}

/// The report's figures equal those computed independently from the fake's rules.
#[test]
fn full_run_matches_independent_computation() {
    let qs = load_questions(180);
    let fake = FakeOpenAi::start_blocking(responder(question_index(&qs), None));
    let dir = tempfile::tempdir().unwrap();
    let sweep = write_sweep(dir.path(), "e2e", &fake.base_url(), 180, 8);
    let out = dir.path().join("runs");
    let started = Instant::now();
    run_to_end(&["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let secs = started.elapsed().as_secs_f64();
    let report = read_json(&out.join("e2e/report.json"));
    let expected = expected_paper(&qs, None);
    let b = &report["benchmarks"][0];
    assert_eq!(b["pipeline"], "hypotermqa");
    assert_eq!(b["semantics"], "paper");
    assert_eq!(b["model"], "model-a");
    assert_eq!(b["judge"], "judge-a");
    assert_eq!(b["hypothetical_questions"], 60);
    assert_eq!(report_counts(&report), expected.counts);
    let hts = b["hts"].as_f64().expect("hts");
    assert!((hts - expected.hts).abs() < 1e-9, "hts {hts} vs expected {}", expected.hts);
    assert_eq!(
        b["valid_answers_to_hypothetical"].as_f64().unwrap(),
        (expected.hts * 60.0 / 100.0).round()
    );
    let jobs = &report["jobs"];
    assert_eq!(jobs["dead_letters"], 0);
    assert_eq!(jobs["done"].as_u64().unwrap(), jobs["completed"].as_u64().unwrap());
    // Every request the fake saw is one job: no job was called twice in a clean run.
    assert_eq!(jobs["model_calls"].as_u64().unwrap(), fake.call_count() as u64);
    let labels = std::fs::read_to_string(out.join("e2e/labels.jsonl")).unwrap();
    assert_eq!(labels.lines().count(), 180);
    eprintln!(
        "e2e: {} jobs in {secs:.2} s = {:.0} jobs/s",
        fake.call_count(),
        fake.call_count() as f64 / secs
    );
}

/// SIGKILL midway, run again: the run completes, the report equals an uninterrupted run's,
/// no child process survives the kill, and extra paid calls stay within the calls in flight.
#[test]
fn kill_and_resume_loses_nothing_and_repeats_at_most_in_flight() {
    let qs = load_questions(180);
    let concurrency = 4;
    // One fake for both runs (the endpoint is part of every job id); slow calls, so that
    // the kill lands mid-run.
    let rules = responder(question_index(&qs), None);
    let fake = FakeOpenAi::start_blocking(move |c| {
        Reply::Delayed(Duration::from_millis(15), Box::new(rules(c)))
    });
    let dir = tempfile::tempdir().unwrap();
    let sweep = write_sweep(dir.path(), "ref", &fake.base_url(), 180, concurrency);
    // Uninterrupted reference run.
    let out_ref = dir.path().join("runs-ref");
    run_to_end(&["run", sweep.to_str().unwrap(), "--out", out_ref.to_str().unwrap()]);
    let calls_ref = fake.call_count();
    fake.reset_counters();

    // Interrupted run, in its own output directory (own broker store and checkpoint).
    let out = dir.path().join("runs-killed");
    let mut cmd = halyard();
    cmd.args(["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let mut child = ChildGuard::spawn(cmd);
    let deadline = Instant::now() + Duration::from_secs(120);
    while fake.call_count() < calls_ref / 3 {
        assert!(Instant::now() < deadline, "run made no progress");
        assert!(child.try_wait().is_none(), "halyard exited before the kill");
        std::thread::sleep(Duration::from_millis(5));
    }
    let in_flight_at_kill = fake.in_flight();
    child.kill();
    // Calls answered by the fake but not yet checkpointed count as in flight too, so the
    // bound is the slots: two pools (model, judge) of `concurrency` each.
    let calls_before = fake.call_count();
    // Nothing started by `halyard run` outlives it (nats-server gets PDEATHSIG).
    let needle = out.to_str().unwrap().to_string();
    let gone = Instant::now() + Duration::from_secs(10);
    while !processes_mentioning(&needle).is_empty() {
        assert!(
            Instant::now() < gone,
            "processes outlived halyard run: {:?}",
            processes_mentioning(&needle)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    run_to_end(&["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let calls_total = fake.call_count();
    let extra = calls_total as i64 - calls_ref as i64;
    eprintln!(
        "resume: reference run {calls_ref} calls; killed after {calls_before} calls ({in_flight_at_kill} in flight); \
         {} calls after restart; total {calls_total}; repeated calls {extra}",
        calls_total - calls_before
    );
    assert!(extra >= 0, "fewer calls than an uninterrupted run: {extra}");
    assert!(
        extra as usize <= 2 * concurrency,
        "{extra} repeated calls exceed the {} that can be in flight",
        2 * concurrency
    );

    let a = read_json(&out_ref.join("ref/report.json"));
    let b = read_json(&out.join("ref/report.json"));
    assert_eq!(a["benchmarks"], b["benchmarks"], "report differs from the uninterrupted run's");
    let la = std::fs::read_to_string(out_ref.join("ref/labels.jsonl")).unwrap();
    let lb = std::fs::read_to_string(out.join("ref/labels.jsonl")).unwrap();
    assert_eq!(la, lb, "labels differ from the uninterrupted run's");

    // Running a finished run again calls nothing and rewrites the same report.
    run_to_end(&["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert_eq!(fake.call_count(), calls_total, "a finished run called the model again");
    assert_eq!(read_json(&out.join("ref/report.json"))["benchmarks"], a["benchmarks"]);
}

/// A job the API rejects with HTTP 400 becomes a dead letter; the run still finishes and
/// the report lists it. Issue 29: the same run through a bad API night (503s, bodies cut
/// mid-way, empty bodies, truncated JSON, the server killed and back) gives the same
/// figures, labels and dead letter (paper semantics).
#[test]
fn poison_job_becomes_dead_letter() {
    let qs = load_questions(9);
    let poison = qs[4].id;
    let faults = Faults::new();
    let fake =
        FakeOpenAi::start_blocking(faults.wrap(responder(question_index(&qs), Some(poison))));
    let dir = tempfile::tempdir().unwrap();
    let sweep = write_sweep(dir.path(), "poison", &fake.base_url(), 9, 4);
    let out = dir.path().join("runs");
    run_to_end_with(&["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()], 1);
    let report = read_json(&out.join("poison/report.json"));
    assert_eq!(report["jobs"]["dead_letters"], 1);
    let dl = &report["dead_letters"][0];
    assert_eq!(dl["stage"], "answer");
    assert_eq!(dl["kind"], "permanent");
    assert_eq!(dl["http_status"], 400);
    assert!(dl["error"].as_str().unwrap().contains("poison"), "{dl}");
    assert_eq!(report_counts(&report), expected_paper(&qs, Some(poison)).counts);
    // A permanent error is not retried: exactly one request for the poison question.
    let poison_q = &qs[4].question;
    let hits = fake
        .calls()
        .iter()
        .filter(|c| c.messages.last().is_some_and(|(_, m)| m == poison_q))
        .count();
    assert_eq!(hits, 1);
    let md = std::fs::read_to_string(out.join("poison/report.md")).unwrap();
    assert!(md.contains("Dead letters"), "{md}");
    rerun_with_faults(&fake, &faults, &sweep, "poison", &out, dir.path());
}

/// Bad sweeps fail before anything starts, naming the file, the key and the reason.
#[test]
fn bad_sweeps_are_rejected_with_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let good = write_sweep(dir.path(), "s", "http://127.0.0.1:9/v1", 3, 1);
    let text = std::fs::read_to_string(&good).unwrap();
    let cases: Vec<(String, &str)> = vec![
        (text.replace("judge = \"judge-a\"", "judge = \"nobody\""), "benchmark[0].judge"),
        (
            text.replace("max_tokens = 256", "max_tokens = 256\ncolour = \"red\""),
            "unknown field `colour`",
        ),
        (text.replace("semantics = \"paper\"", "semantics = \"poetic\""), "benchmark[0].semantics"),
        (text.replace("limit = 3", "limit = 0"), "benchmark[0].limit"),
        (text.replace("HypoTermQA_180.jsonl", "missing.jsonl"), "benchmark[0].dataset"),
        (
            text.replace("base_url = \"http://127.0.0.1:9/v1\"", "base_url = \"ftp://x\""),
            "model[0].base_url",
        ),
        ("name = 5".to_string(), "name"),
    ];
    for (i, (body, needle)) in cases.into_iter().enumerate() {
        let p = dir.path().join(format!("bad{i}.toml"));
        std::fs::write(&p, body).unwrap();
        let out = halyard()
            .args(["run", p.to_str().unwrap(), "--out", dir.path().join("o").to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "case {i} succeeded");
        assert!(err.contains(needle), "case {i}: {needle:?} not in: {err}");
        assert!(err.contains(&format!("bad{i}.toml")), "case {i}: file not named: {err}");
    }
    // A broken dataset line is reported with its file and line before any job runs.
    let ds = dir.path().join("broken.jsonl");
    let first = std::fs::read_to_string(dataset()).unwrap().lines().next().unwrap().to_string();
    std::fs::write(&ds, format!("{first}\n{{\"questionId\": 2, \"question\": \n")).unwrap();
    let p = dir.path().join("badds.toml");
    std::fs::write(&p, text.replace(&dataset().display().to_string(), ds.to_str().unwrap()))
        .unwrap();
    let out = halyard()
        .args(["run", p.to_str().unwrap(), "--out", dir.path().join("o").to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("broken.jsonl") && err.contains('2'), "{err}");
    assert!(!dir.path().join("o/s").exists(), "output created despite a bad dataset");
}

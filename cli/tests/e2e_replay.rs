//! End-to-end: the `replay` backend through `halyard run` (embedded nats-server). An
//! AutoHall run against a fake model is replayed, first from its worker checkpoint, then
//! from a JSONL of its request/response pairs with one broken line and one recording
//! missing; neither replay calls the fake.

use crate::common::autohall::*;
use crate::common::*;
use halyard_tests::{FakeOpenAi, Reply};
use serde_json::{json, Value};

const LIMIT: usize = 20;

fn replay_models(recordings: &std::path::Path, extra: &str) -> String {
    format!(
        "[[model]]\nname = \"fake-a\"\nbackend = \"replay\"\nmodel = \"fake-a\"\nrecordings = \"{}\"\n{extra}seed = {SEED}\ntemperature = 0.3\nmax_concurrency = 8\n\n",
        recordings.display()
    )
}

/// Replays reproduce the report without calling anything; a broken recordings line is
/// reported (file:line) and skipped; a missing recording is one clear dead letter.
#[test]
fn replay_reproduces_a_run_without_calls() {
    let file = repo_root().join("datasets/autohall/climate_sample.jsonl");
    let files = [file.clone()];
    let fake = FakeOpenAi::start_blocking(autohall_responder);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("runs");
    let run = |sweep: &std::path::Path| {
        run_complete(&["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()]).0
    };

    // 1. The original run.
    let original = autohall_sweep(
        dir.path(),
        "original",
        &fake_models(&fake.base_url()),
        &["fake-a"],
        &files,
        LIMIT,
    );
    run(&original);
    let a = read_json(&out.join("original/report.json"));
    let calls = fake.call_count();
    assert!(calls > 0);
    let cs: Vec<(String, bool)> = claims(&file).into_iter().take(LIMIT).collect();
    let e = expected("fake-a", &cs);
    assert_eq!(
        a["benchmarks"][0]["classified"], e.classified,
        "the original run is not what the rules imply"
    );

    // 2. Replay from the original run's worker checkpoint.
    let checkpoint = out.join("original/checkpoint");
    let extra = format!("recorded_endpoint = \"{}\"\n", fake.base_url());
    let from_checkpoint = autohall_sweep(
        dir.path(),
        "from-checkpoint",
        &replay_models(&checkpoint, &extra),
        &["fake-a"],
        &files,
        LIMIT,
    );
    run(&from_checkpoint);
    let b = read_json(&out.join("from-checkpoint/report.json"));
    assert_eq!(a["benchmarks"], b["benchmarks"], "checkpoint replay differs from the original");
    assert_eq!(fake.call_count(), calls, "a replay called the model");
    // The poisoned classifications were never recorded: misses, as dead letters.
    assert_eq!(b["jobs"]["dead_letters"], a["jobs"]["dead_letters"]);

    // 3. Replay from JSONL recordings of the fake's calls (repeated requests in sample
    //    order), with a broken line and the reference of one refused claim left out.
    let refused = cs
        .iter()
        .find(|(c, _)| refuses("fake-a", c))
        .map(|(c, _)| c.clone())
        .expect("the rules refuse some claim");
    let mut log = fake.calls();
    log.sort_by_key(|c| (c.body["seed"].as_u64(), c.seq));
    let mut lines = Vec::new();
    for c in &log {
        let Reply::Text(text) = autohall_responder(c) else { continue };
        if c.messages[0].1.ends_with(&format!("Claim: {refused}")) && c.body["seed"] == SEED {
            continue;
        }
        let messages: Vec<Value> =
            c.messages.iter().map(|(r, m)| json!({"role": r, "content": m})).collect();
        lines.push(json!([{"model": c.model, "messages": messages}, {"model": "served", "choices": [{"message": {"content": text}}]}]).to_string());
    }
    lines.insert(3, "[{\"model\": \"fake-a\", \"messages\": [".to_string());
    let jsonl = dir.path().join("recordings.jsonl");
    std::fs::write(&jsonl, lines.join("\n")).unwrap();
    let from_jsonl = autohall_sweep(
        dir.path(),
        "from-jsonl",
        &replay_models(&jsonl, ""),
        &["fake-a"],
        &files,
        LIMIT,
    );
    let output = run(&from_jsonl);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("{}:4: skipped", jsonl.display())),
        "broken line not reported:\n{stderr}"
    );
    assert_eq!(fake.call_count(), calls, "a replay called the model");
    let c = read_json(&out.join("from-jsonl/report.json"));
    let (ra, rc) = (&a["benchmarks"][0], &c["benchmarks"][0]);
    assert_eq!(
        rc["status"]["refused"].as_u64().unwrap() + 1,
        ra["status"]["refused"].as_u64().unwrap()
    );
    assert_eq!(rc["status"]["reference_failed"], 1);
    for same in
        ["classified", "hallucinated", "balanced_per_class", "detection", "hallucination_rate"]
    {
        assert_eq!(rc[same], ra[same], "{same}");
    }
    let dead = c["dead_letters"].as_array().unwrap();
    let miss = dead
        .iter()
        .find(|d| d["stage"] == "reference")
        .expect("the missing recording is a dead letter");
    let err = miss["error"].as_str().unwrap();
    assert!(
        err.contains("replay:") && err.contains("holds 0 recorded") && err.contains("fake-a"),
        "{err}"
    );
    assert_eq!(miss["kind"], "permanent");
}

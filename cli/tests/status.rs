//! `halyard status`: a distributed run (coordinator and worker as separate processes on a
//! real nats-server) watched from a third process over NATS, then from its status.json.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;
use halyard_tests::{ChildGuard, FakeOpenAi, NatsServer, Reply};
use serde_json::Value;

fn status(args: &[&str]) -> (bool, String, String) {
    let out = halyard().arg("status").args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn spawn(args: &[&str], log: &Path) -> ChildGuard {
    let mut c = halyard();
    c.args(args);
    c.stdout(std::process::Stdio::null());
    c.stderr(std::fs::File::create(log).unwrap());
    ChildGuard::spawn(c)
}

#[test]
fn status_over_nats_shows_progress_and_live_workers() {
    let qs = load_questions(24);
    let rules = responder(question_index(&qs), None);
    let fake = FakeOpenAi::start_blocking(move |c| {
        Reply::Delayed(Duration::from_millis(150), Box::new(rules(c)))
    });
    let nats = NatsServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let sweep = write_sweep(dir.path(), "watched", &fake.base_url(), 24, 2);
    let s = sweep.to_str().unwrap();
    let out = dir.path().join("runs");
    let o = out.to_str().unwrap();
    let state = dir.path().join("w");

    // Nothing published yet: a clear error, not an empty table.
    let (ok, _, err) = status(&["--nats", &url, "watched"]);
    assert!(!ok && err.contains("no run \"watched\""), "{err}");

    let mut coord = spawn(
        &["coordinator", s, "--nats", &url, "--out", o, "--metrics", "off"],
        &dir.path().join("c.log"),
    );
    let mut worker = spawn(
        &[
            "worker",
            "--nats",
            &url,
            "--sweep",
            s,
            "--state",
            state.to_str().unwrap(),
            "--id",
            "w-status-test",
            "--metrics",
            "off",
        ],
        &dir.path().join("w.log"),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen_running = false;
    while coord.try_wait().is_none() {
        assert!(Instant::now() < deadline, "run did not finish");
        let (ok, stdout, _) = status(&["--nats", &url, "watched", "--json"]);
        if ok {
            let v: Value = serde_json::from_str(&stdout).unwrap();
            let done = v["items_done"].as_u64().unwrap();
            let workers: Vec<&str> = v["pools"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|p| p["workers"].as_array().unwrap().iter().map(|w| w.as_str().unwrap()))
                .collect();
            if v["state"] == "running"
                && done > 0
                && done < 24
                && workers.contains(&"w-status-test")
            {
                assert_eq!(v["items_total"], 24);
                assert_eq!(v["name"], "watched");
                assert_eq!(v["targets"][0]["model"], "model-a");
                let pools: Vec<&str> = v["pools"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| p["pool"].as_str().unwrap())
                    .collect();
                assert_eq!(pools, ["judge-a", "model-a"]);
                let (ok, human, _) = status(&["--nats", &url, "watched"]);
                assert!(
                    ok && human.contains("run watched (")
                        && human.contains("w-status-test")
                        && human.contains("items "),
                    "{human}"
                );
                seen_running = true;
            }
        }
        std::thread::sleep(Duration::from_millis(150));
    }
    assert!(
        coord.try_wait().unwrap().success(),
        "coordinator failed: {}",
        std::fs::read_to_string(dir.path().join("c.log")).unwrap()
    );
    assert!(seen_running, "status never showed the run in progress with its worker");
    worker.kill();

    // The final state, over NATS and from the run directory.
    let (ok, stdout, err) = status(&["--nats", &url, "watched", "--json"]);
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!((v["state"].as_str(), v["items_done"].as_u64()), (Some("complete"), Some(24)));
    let report = read_json(&out.join("watched/report.json"));
    assert_eq!(v["results"], report["jobs"]["done"]);
    let (ok, stdout, err) = status(&["--out", o, "watched", "--json"]);
    assert!(ok, "{err}");
    let f: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(f["state"], "complete");
    assert_eq!(f["items_done"], 24);
    let (ok, _, err) = status(&["--out", o, "nope"]);
    assert!(!ok && err.contains("no status found"), "{err}");
}

/// Issue 45: `halyard run` in embedded mode shows nothing a newcomer reads as a fault: no
/// worker line that a stream or a pool's consumer "does not exist yet" or that it is
/// "waiting for a coordinator" (the coordinator is the same process, which makes them
/// before its worker starts), on the terminal or in the run's log, and no `$-0.0000`.
#[test]
fn embedded_run_shows_no_waiting_for_a_coordinator() {
    let dir = tempfile::tempdir().unwrap();
    let sweep = noop_sweep(dir.path(), "quiet", 50);
    let out = dir.path().join("out");
    let o = halyard()
        .args(["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err}");
    let log = std::fs::read_to_string(out.join("quiet/halyard.log")).unwrap();
    assert!(log.contains("coordinator starting"), "the log has the run's lines: {log}");
    for (what, text) in [("terminal", &err), ("halyard.log", &log)] {
        for fault in ["does not exist yet", "waiting for a coordinator", "$-0.0000", "=-0.0000"] {
            assert!(!text.contains(fault), "{what} says {fault:?}:\n{text}");
        }
    }
}

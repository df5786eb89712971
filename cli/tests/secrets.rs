//! API keys never leave the environment variable that holds them: a planted key is sent
//! to the (fake) API, and found nowhere in the logs (JSON, debug level, every crate), the
//! run's files (run state, worker checkpoint, broker store, reports, status.json) or
//! the status and metrics output.

use std::io::{Read, Write};
use std::path::Path;

use crate::common::*;
use halyard_tests::{free_port, FakeOpenAi};

const KEY: &str = "sk-halyard-PLANTED-7f3a9c2e51d04b6b";

/// Files under `dir` (recursively) whose bytes contain `needle`.
fn files_containing(dir: &Path, needle: &[u8]) -> (usize, Vec<String>) {
    let mut hits = Vec::new();
    let mut scanned = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(bytes) = std::fs::read(&p) {
                scanned += 1;
                if bytes.windows(needle.len()).any(|w| w == needle) {
                    hits.push(p.display().to_string());
                }
            }
        }
    }
    (scanned, hits)
}

#[test]
fn planted_api_key_never_reaches_logs_state_or_reports() {
    let qs = load_questions(9);
    let fake = FakeOpenAi::start_blocking(responder(question_index(&qs), Some(qs[2].id)));
    let dir = tempfile::tempdir().unwrap();
    let sweep = write_sweep(dir.path(), "secret", &fake.base_url(), 9, 2);
    let text = std::fs::read_to_string(&sweep)
        .unwrap()
        .replace("backend = \"openai\"", "backend = \"openai\"\napi_key_env = \"PLANTED_API_KEY\"");
    std::fs::write(&sweep, text).unwrap();
    let out = dir.path().join("runs");
    let port = free_port();
    let mut cmd = halyard();
    cmd.args([
        "run",
        sweep.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--log-format",
        "json",
    ])
    .args(["--metrics", &format!("127.0.0.1:{port}")])
    .env("PLANTED_API_KEY", KEY)
    .env("HALYARD_LOG", "debug")
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    let mut child = halyard_tests::ChildGuard::spawn(cmd);
    // Drain both pipes from the start: debug logs fill a pipe buffer in well under a
    // second, and a child blocked on a full stderr cannot answer the scrape below.
    let drain = |r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut r = r;
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            buf
        })
    };
    let stdout_reader = drain(Box::new(child.child_mut().stdout.take().unwrap()));
    let stderr_reader = drain(Box::new(child.child_mut().stderr.take().unwrap()));
    // One scrape while it runs (the endpoint lives as long as the run), bounded in time.
    let mut metrics = String::new();
    for _ in 0..500 {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            s.set_read_timeout(Some(std::time::Duration::from_secs(60))).unwrap();
            write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
            let _ = s.read_to_string(&mut metrics);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let status = child
        .wait_timeout(std::time::Duration::from_secs(300))
        .expect("the run did not end within 5 min");
    let run_stdout = stdout_reader.join().unwrap();
    let run_stderr = stderr_reader.join().unwrap();
    let stderr = String::from_utf8_lossy(&run_stderr);
    // Complete, with or without dead letters (exit 0 or 4).
    assert!(matches!(status.code(), Some(0 | 4)), "{status:?}: {stderr}");

    // The key was really in play: every request carried it.
    let calls = fake.calls();
    assert!(!calls.is_empty());
    assert!(
        calls.iter().all(|c| c.authorization.as_deref() == Some(&format!("Bearer {KEY}"))),
        "the key was not sent"
    );
    // Logs were written, at debug level, as JSON.
    assert!(stderr.lines().count() > 20 && stderr.contains("\"level\":\"DEBUG\""), "{stderr}");

    let status_out = halyard()
        .args(["status", "--out", out.to_str().unwrap(), "secret", "--json"])
        .output()
        .unwrap();
    assert!(status_out.status.success());
    for (what, text) in [
        ("stdout", String::from_utf8_lossy(&run_stdout).into_owned()),
        ("stderr (logs)", stderr.to_string()),
        ("status", String::from_utf8_lossy(&status_out.stdout).into_owned()),
        ("metrics", metrics.clone()),
    ] {
        assert!(!text.contains(KEY), "the API key appears in {what}");
        assert!(!text.contains(&KEY[8..]), "part of the API key appears in {what}");
    }
    assert!(!metrics.is_empty(), "no metrics scraped");
    let (scanned, hits) = files_containing(&out, KEY.as_bytes());
    assert!(hits.is_empty(), "the API key appears in {hits:?}");
    let (_, partial) = files_containing(&out, &KEY.as_bytes()[8..]);
    assert!(partial.is_empty(), "part of the API key appears in {partial:?}");
    // The scan covered the run state, checkpoint, broker store and reports.
    for f in ["report.json", "report.html", "labels.jsonl", "status.json"] {
        assert!(out.join("secret").join(f).is_file(), "{f} missing");
    }
    for d in ["state", "checkpoint", "nats"] {
        assert!(out.join("secret").join(d).is_dir(), "{d}/ missing");
    }
    assert!(scanned >= 10, "only {scanned} files scanned");
}

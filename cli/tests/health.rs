//! `/healthz` and `/readyz` beside `/metrics`: a real worker and a real coordinator
//! process against a real nats-server, probed over HTTP. Liveness is the process only:
//! the broker killed under the worker turns `/readyz` to 503 with the reason while
//! `/healthz` stays 200 (a broker outage must not get every pod restarted).

use std::time::{Duration, Instant};

use crate::common::*;
use halyard_tests::prometheus::get;
use halyard_tests::{free_port, ChildGuard, NatsServer};

/// Poll `path` until it answers `code` (panics after 60 s with the last answer).
fn wait_for(port: u16, path: &str, code: u16, proc: &mut ChildGuard) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = None;
    loop {
        if let Some(st) = proc.try_wait() {
            panic!("the process ended ({st:?}) while waiting for {path} {code}; last: {last:?}");
        }
        match get(port, path) {
            Some((c, body)) if c == code => return body,
            other => last = other,
        }
        assert!(Instant::now() < deadline, "{path} never answered {code}; last: {last:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A worker on a broker nobody has shaped yet is alive but not ready: it waits for the
/// streams, which workers may not create (issue 33, item 5); `halyard broker init` makes
/// them, and the worker is ready at once, its consumers bound. With its broker gone it is
/// unready (503 naming the broker) and still alive (200).
#[test]
fn worker_readiness_follows_the_broker_and_liveness_does_not() {
    let mut nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut cmd = halyard();
    cmd.args([
        "worker",
        "--nats",
        &nats.url(),
        "--pool",
        "p=1",
        "--state",
        dir.path().join("w").to_str().unwrap(),
        "--metrics",
        &format!("127.0.0.1:{port}"),
    ]);
    let mut worker = ChildGuard::spawn(cmd);
    let why = wait_for(port, "/readyz", 503, &mut worker);
    assert!(why.contains("waiting for the broker's streams"), "{why}");
    assert_eq!(get(port, "/healthz"), Some((200, "ok\n".into())));
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(get(port, "/readyz").map(|r| r.0), Some(503), "ready on an unshaped broker");
    let init = halyard().args(["broker", "init", "--nats", &nats.url()]).output().unwrap();
    let out = String::from_utf8_lossy(&init.stdout);
    assert!(init.status.success(), "broker init: {}{out}", String::from_utf8_lossy(&init.stderr));
    assert!(out.lines().any(|l| l.starts_with("HALYARD_JOBS") && l.contains("created")), "{out}");
    assert_eq!(wait_for(port, "/readyz", 200, &mut worker), "ok\n");
    assert_eq!(get(port, "/healthz"), Some((200, "ok\n".into())));
    nats.stop();
    let why = wait_for(port, "/readyz", 503, &mut worker);
    assert!(why.starts_with("broker nats://127.0.0.1:"), "{why}");
    // Alive all along: several probes over a few seconds of outage, none fails.
    for _ in 0..10 {
        assert_eq!(get(port, "/healthz"), Some((200, "ok\n".into())));
        assert_eq!(get(port, "/readyz").map(|r| r.0), Some(503));
        std::thread::sleep(Duration::from_millis(200));
    }
    worker.signal(libc::SIGKILL);
}

/// A coordinator is ready once it plans (its run open), and alive.
#[test]
fn coordinator_is_ready_when_planning() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let sweep = noop_sweep(dir.path(), "health", 100);
    let port = free_port();
    let mut cmd = halyard();
    cmd.args([
        "coordinator",
        sweep.to_str().unwrap(),
        "--nats",
        &nats.url(),
        "--out",
        dir.path().join("runs").to_str().unwrap(),
        "--metrics",
        &format!("127.0.0.1:{port}"),
    ]);
    let mut coord = ChildGuard::spawn(cmd);
    assert_eq!(wait_for(port, "/readyz", 200, &mut coord), "ok\n");
    assert_eq!(get(port, "/healthz"), Some((200, "ok\n".into())));
    // No worker joined: the run waits, still healthy and ready.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(get(port, "/readyz").map(|r| r.0), Some(200));
    coord.signal(libc::SIGTERM);
    let st = coord.wait_timeout(Duration::from_secs(30)).expect("coordinator did not stop");
    assert_eq!(st.code(), Some(130));
}

//! Graceful stop of `halyard worker` and `halyard coordinator` (separate processes, real
//! nats-server, fake paid API):
//! 1. SIGTERM with calls in flight and time to finish them: the worker takes no new
//!    job, finishes its calls, checkpoints and publishes them, exits 0 in time; no call
//!    is ever paid twice. SIGTERM on the coordinator: exit 130, resumable.
//! 2. SIGTERM with calls that outlast `--grace`: the worker abandons them at the
//!    deadline, naks the jobs (short delay) and exits 0 within the deadline.
//! 3. A second SIGTERM: exits at once (130).
//!
//! Then a fresh worker finishes the run: the report equals an uninterrupted run's, and
//! the calls paid beyond that run's are at most those abandoned in (2) and (3).

use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use halyard_tests::{ChildGuard, FakeOpenAi, Gate, NatsServer};

const FAST: u8 = 0;
const SLOW: u8 = 1;
const GATED: u8 = 2;
const CONCURRENCY: usize = 3;

fn worker(sweep: &Path, url: &str, state: &Path, grace: &str, log: &Path) -> ChildGuard {
    let mut c = halyard();
    c.args([
        "worker",
        "--nats",
        url,
        "--sweep",
        sweep.to_str().unwrap(),
        "--state",
        state.to_str().unwrap(),
        "--grace",
        grace,
    ])
    .stderr(std::fs::File::create(log).unwrap());
    ChildGuard::spawn(c)
}

fn coordinator(sweep: &Path, url: &str, out: &Path, log: &Path) -> ChildGuard {
    let mut c = halyard();
    c.args(["coordinator", sweep.to_str().unwrap(), "--nats", url, "--out", out.to_str().unwrap()])
        .stderr(std::fs::File::create(log).unwrap());
    ChildGuard::spawn(c)
}

fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn sigterm_finishes_or_hands_back_in_flight_work_and_loses_nothing() {
    let qs = load_questions(16);
    let rules = responder(question_index(&qs), None);
    let mode = Arc::new(AtomicU8::new(FAST));
    let gate = Gate::new();
    let (m, g) = (mode.clone(), gate.clone());
    let fake = FakeOpenAi::start_blocking(move |c| match m.load(Ordering::SeqCst) {
        SLOW => rules(c).after(Duration::from_millis(1200)),
        GATED => rules(c).behind(&g),
        _ => rules(c),
    });
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let sweep = write_sweep(d, "graceful", &fake.base_url(), 16, CONCURRENCY);
    run_to_end(&["run", sweep.to_str().unwrap(), "--out", d.join("ref").to_str().unwrap()]);
    let calls_ref = fake.call_count();
    fake.reset_counters();

    let nats = NatsServer::start();
    let url = nats.url();
    let out = d.join("runs");
    let state = d.join("checkpoint");
    let mut coord = coordinator(&sweep, &url, &out, &d.join("coord-1.log"));

    // 1. Slow calls, ample grace: they finish; then SIGTERM the coordinator too.
    mode.store(SLOW, Ordering::SeqCst);
    let mut w = worker(&sweep, &url, &state, "10", &d.join("w1.log"));
    wait_for("calls in flight", Duration::from_secs(60), || fake.in_flight() >= 2);
    let started = fake.call_count();
    let t = Instant::now();
    w.signal(libc::SIGTERM);
    let status =
        w.wait_timeout(Duration::from_secs(15)).expect("worker did not stop within its grace");
    let took = t.elapsed();
    assert!(
        status.success(),
        "graceful stop exit {status:?}: {}",
        std::fs::read_to_string(d.join("w1.log")).unwrap()
    );
    assert_eq!(fake.in_flight(), 0, "the worker exited with calls still running");
    // It finished the calls it had (1.2 s each), and did not start new ones after the signal.
    assert!(
        took >= Duration::from_millis(300),
        "exited after {took:?}: did it wait for its calls?"
    );
    assert!(fake.call_count() <= started + 2 * CONCURRENCY, "calls started after the signal");
    let after_1 = fake.call_count();
    coord.signal(libc::SIGTERM);
    let status = coord.wait_timeout(Duration::from_secs(30)).expect("coordinator did not stop");
    assert_eq!(status.code(), Some(130), "an interrupted coordinator exits 130");
    let mut coord = coordinator(&sweep, &url, &out, &d.join("coord-2.log"));

    // 2. Calls that never finish in time: abandoned at the 1 s deadline, jobs nak'd, exit 0.
    mode.store(GATED, Ordering::SeqCst);
    let mut w = worker(&sweep, &url, &state, "1", &d.join("w2.log"));
    wait_for("held calls", Duration::from_secs(60), || fake.in_flight() >= 2);
    std::thread::sleep(Duration::from_millis(200));
    let abandoned_2 = fake.call_count() - after_1;
    let t = Instant::now();
    w.signal(libc::SIGTERM);
    let status =
        w.wait_timeout(Duration::from_secs(15)).expect("worker ignored its grace deadline");
    let took = t.elapsed();
    assert!(
        status.success(),
        "exit {status:?}: {}",
        std::fs::read_to_string(d.join("w2.log")).unwrap()
    );
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(8),
        "stopped after {took:?}, grace 1 s"
    );
    let after_2 = fake.call_count();

    // 3. A second signal ends it at once.
    let mut w = worker(&sweep, &url, &state, "60", &d.join("w3.log"));
    wait_for("held calls", Duration::from_secs(60), || fake.call_count() > after_2);
    std::thread::sleep(Duration::from_millis(300));
    let abandoned_3 = fake.call_count() - after_2;
    w.signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(300));
    assert!(w.try_wait().is_none(), "exited on the first signal although its grace is 60 s");
    let t = Instant::now();
    w.signal(libc::SIGTERM);
    let status =
        w.wait_timeout(Duration::from_secs(5)).expect("second signal did not end the worker");
    assert_eq!(status.code(), Some(130), "{status:?}");
    assert!(t.elapsed() < Duration::from_secs(2), "second signal took {:?}", t.elapsed());

    // Finish: a fresh worker on the same checkpoint.
    mode.store(FAST, Ordering::SeqCst);
    gate.open();
    let mut w = worker(&sweep, &url, &state, "10", &d.join("w4.log"));
    let status = coord.wait_timeout(Duration::from_secs(120)).expect("the run did not finish");
    assert!(status.success(), "{}", std::fs::read_to_string(d.join("coord-2.log")).unwrap());
    w.signal(libc::SIGTERM);
    assert!(w.wait_timeout(Duration::from_secs(30)).expect("worker did not stop").success());

    let a = read_json(&d.join("ref/graceful/report.json"));
    let b = read_json(&out.join("graceful/report.json"));
    assert_eq!(a["benchmarks"], b["benchmarks"], "report differs from the uninterrupted run's");
    assert_eq!(
        std::fs::read_to_string(d.join("ref/graceful/labels.jsonl")).unwrap(),
        std::fs::read_to_string(out.join("graceful/labels.jsonl")).unwrap()
    );
    let extra = fake.call_count() as i64 - calls_ref as i64;
    eprintln!("graceful: reference {calls_ref} calls; abandoned {abandoned_2} + {abandoned_3}; repeated {extra}");
    assert!(
        extra >= 0 && extra as usize <= abandoned_2 + abandoned_3,
        "{extra} repeated calls, {abandoned_2} + {abandoned_3} abandoned"
    );
}

/// A process still waiting for its broker stops on the first SIGTERM: a worker exits 0
/// (it held nothing), a coordinator or `halyard run` 130 with a line saying nothing had
/// started. Both while nothing answers at the broker's address and while a broker
/// answers without JetStream (it retries its setup for a minute: a broker starting).
#[test]
fn a_stop_while_waiting_for_the_broker_is_clean() {
    let dir = tempfile::tempdir().unwrap();
    let absent = format!("nats://127.0.0.1:{}", halyard_tests::free_port());
    stop_while_waiting(
        dir.path(),
        "absent",
        &absent,
        "broker not reachable yet",
        "before the broker",
    );
    let no_js = NatsServer::start_with_args(&["-js=false"]);
    stop_while_waiting(
        dir.path(),
        "nojs",
        &no_js.url(),
        "JetStream not ready",
        "stopped while starting",
    );
}

/// Start a worker, a coordinator and a `halyard run` against `url` in turn; once each
/// logs `waiting`, SIGTERM it: it must stop within 10 s with its exit status and `said`.
fn stop_while_waiting(dir: &Path, case: &str, url: &str, waiting: &str, said: &str) {
    let sweep = noop_sweep(dir, "x", 10);
    let state = dir.join(format!("w-{case}"));
    let out = dir.join(format!("runs-{case}"));
    let (sweep, state, out) =
        (sweep.to_str().unwrap(), state.to_str().unwrap(), out.to_str().unwrap());
    for (args, code) in [
        (vec!["worker", "--nats", url, "--pool", "p=1", "--state", state, "--metrics", "off"], 0),
        (vec!["coordinator", sweep, "--nats", url, "--out", out, "--metrics", "off"], 130),
        (vec!["run", sweep, "--nats", url, "--out", out], 130),
    ] {
        let log = dir.join(format!("{}-{case}.log", args[0]));
        let mut cmd = halyard();
        cmd.args(&args).stderr(std::fs::File::create(&log).unwrap());
        let mut p = ChildGuard::spawn(cmd);
        // Wait until it is retrying (the handlers are installed by then).
        wait_for(
            &format!("{} ({case}) to wait for the broker", args[0]),
            Duration::from_secs(30),
            || std::fs::read_to_string(&log).unwrap_or_default().contains(waiting),
        );
        p.signal(libc::SIGTERM);
        let st = p.wait_timeout(Duration::from_secs(10)).unwrap_or_else(|| {
            panic!("{} ({case}) did not stop on SIGTERM", args[0]);
        });
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert_eq!(st.code(), Some(code), "{} ({case}): {text}", args[0]);
        assert!(text.contains(said), "{} ({case}): {text}", args[0]);
    }
}

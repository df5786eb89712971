//! Endpoint outages mid-run (issue 18): the fake API refuses connections, answers 503,
//! or hangs past the model's timeout for longer than `ack_wait_s × max_deliver`, then
//! comes back. The pools pause instead of spending the jobs' delivery budgets: the run
//! completes with 0 dead letters and the report of an uninterrupted run, and the paid
//! calls made twice are at most the calls in flight when the outage began.
//!
//! Real nats-server (embedded by `halyard run`, or a test server for the
//! separate-process case), real stores on disk, real HTTP, the `halyard` binary.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::{
    halyard, load_questions, question_index, read_json, responder, run_to_end_with,
    EXIT_DEAD_LETTERS,
};
use halyard_tests::prometheus::{self, Scrape};
use halyard_tests::{
    free_port, request_key, ChatCall, ChildGuard, FakeOpenAi, NatsServer, Outage, Reply,
};

const QUESTIONS: usize = 30;
const CONCURRENCY: usize = 4;
const ACK_WAIT_S: u64 = 2;
const MAX_DELIVER: u64 = 2;
/// Longer than `ack_wait_s × max_deliver`: without pauses every job in hand would run
/// out of deliveries.
const OUTAGE: Duration = Duration::from_secs(ACK_WAIT_S * MAX_DELIVER + 3);

/// A HypoTermQA sweep of the first `QUESTIONS` questions, model and judge on `base_url`.
fn sweep(dir: &Path, base_url: &str, timeout_s: f64) -> PathBuf {
    let path = dir.join("outage.toml");
    let dataset = common::dataset();
    let text = format!(
        "name = \"outage\"\n\n\
         [[model]]\nname = \"model-a\"\nbackend = \"openai\"\nbase_url = \"{base_url}\"\nmodel = \"fake-model\"\n\
         max_concurrency = {CONCURRENCY}\nmax_tokens = 256\ntimeout_s = {timeout_s}\n\n\
         [[model]]\nname = \"judge-a\"\nbackend = \"openai\"\nbase_url = \"{base_url}\"\nmodel = \"fake-judge\"\n\
         max_concurrency = {CONCURRENCY}\ntimeout_s = {timeout_s}\n\n\
         [[benchmark]]\npipeline = \"hypotermqa\"\ndataset = \"{}\"\nmodels = [\"model-a\"]\njudge = \"judge-a\"\n\
         semantics = \"paper\"\nlimit = {QUESTIONS}\n\n\
         [run]\nack_wait_s = {ACK_WAIT_S}\nmax_deliver = {MAX_DELIVER}\n",
        dataset.display()
    );
    std::fs::write(&path, text).expect("write sweep");
    path
}

/// The fake: the common rules, a little slow so that calls are in flight at the onset.
fn fake(poison: Option<i64>) -> FakeOpenAi {
    let rules = responder(question_index(&load_questions(QUESTIONS)), poison);
    FakeOpenAi::start_blocking(move |c| {
        Reply::Delayed(Duration::from_millis(20), Box::new(rules(c)))
    })
}

/// The uninterrupted run: its report and the calls it paid for.
struct Reference {
    report: serde_json::Value,
    paid: Vec<ChatCall>,
}

/// Run the uninterrupted reference (own output directory: own broker and checkpoint).
/// `dead_letters`: the poison jobs (0 or 1).
fn reference(dir: &Path, sweep: &Path, api: &FakeOpenAi, dead_letters: u64) -> Reference {
    let out = dir.join("ref");
    run_to_end_with(
        &["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()],
        dead_letters,
    );
    let paid = api.paid_calls();
    api.reset_counters();
    Reference { report: read_json(&out.join("outage/report.json")), paid }
}

/// Paid calls beyond the reference's, request by request (the benchmark itself repeats
/// some requests: a judge asked again with the same prompt for another sample).
fn paid_twice(reference: &[ChatCall], paid: &[ChatCall]) -> usize {
    let mut left: std::collections::HashMap<String, usize> = Default::default();
    for c in reference {
        *left.entry(request_key(c)).or_default() += 1;
    }
    paid.iter()
        .filter(|c| match left.get_mut(&request_key(c)) {
            Some(n) if *n > 0 => {
                *n -= 1;
                false
            }
            _ => true,
        })
        .count()
}

/// Wait until the fake has seen `calls` calls, panicking if `procs` end first.
fn wait_calls(api: &FakeOpenAi, calls: usize, procs: &mut [&mut ChildGuard], logs: &[&Path]) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while api.call_count() < calls {
        for (p, log) in procs.iter_mut().zip(logs) {
            if let Some(s) = p.try_wait() {
                panic!("a process ended before the outage: {s:?}\n{}", tail(log));
            }
        }
        assert!(Instant::now() < deadline, "the run made no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

/// A temporary directory, kept (and named) when `HALYARD_OUTAGE_KEEP` is set.
fn tempdir() -> tempfile::TempDir {
    let keep = std::env::var_os("HALYARD_OUTAGE_KEEP").is_some();
    let dir =
        tempfile::Builder::new().prefix("halyard-outage-").disable_cleanup(keep).tempdir().unwrap();
    if keep {
        eprintln!("keeping {}", dir.path().display());
    }
    dir
}

fn log_file(path: &Path) -> std::fs::File {
    std::fs::File::create(path).expect("create log")
}

/// What an outage run is checked against.
struct Outcome {
    report: serde_json::Value,
    /// Requests in flight at the fake when the outage began.
    in_flight: usize,
}

/// The run's report equals the reference's; no dead letter beyond the reference's; paid
/// calls made twice are at most those in flight at the onset (and the slots' count).
fn check(api: &FakeOpenAi, reference: &Reference, got: &Outcome, what: &str) {
    let (reference, ref_paid) = (&reference.report, &reference.paid);
    assert_eq!(
        got.report["benchmarks"], reference["benchmarks"],
        "{what}: the report differs from the uninterrupted run's"
    );
    assert_eq!(
        got.report["jobs"]["dead_letters"], reference["jobs"]["dead_letters"],
        "{what}: dead letters beyond the uninterrupted run's: {}",
        got.report["dead_letters"]
    );
    assert_eq!(got.report["jobs"]["done"], reference["jobs"]["done"], "{what}: job count");
    let repeated = paid_twice(ref_paid, &api.paid_calls());
    eprintln!(
        "{what}: {} calls in flight at the onset, {repeated} paid calls repeated",
        got.in_flight
    );
    assert!(
        repeated <= got.in_flight.min(2 * CONCURRENCY),
        "{what}: {repeated} paid calls repeated, {} were in flight at the outage",
        got.in_flight
    );
}

/// `halyard run` (embedded broker, coordinator and worker) with an outage of `kind`
/// beginning a third into the run.
fn embedded_outage(kind: Outage, timeout_s: f64, poison: Option<i64>) {
    let api = fake(poison);
    let dir = tempdir();
    let sweep = sweep(dir.path(), &api.base_url(), timeout_s);
    let reference = reference(dir.path(), &sweep, &api, poison.is_some() as u64);
    let calls = reference.paid.len();
    let out = dir.path().join("runs");
    let log = dir.path().join("run.log");
    let mut cmd = halyard();
    cmd.args(["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(log_file(&log));
    let mut run = ChildGuard::spawn(cmd);
    wait_calls(&api, calls / 3, &mut [&mut run], &[&log]);
    let in_flight = api.in_flight();
    let end = api.outage_for(kind, OUTAGE);
    std::thread::sleep(OUTAGE / 2);
    assert!(run.try_wait().is_none(), "the run ended during the outage:\n{}", tail(&log));
    end.join().unwrap();
    let status = run.wait_timeout(Duration::from_secs(180)).expect("the run did not finish");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let want = if poison.is_some() { EXIT_DEAD_LETTERS } else { 0 };
    assert_eq!(status.code(), Some(want), "halyard run: {status:?}\n{}", tail(&log));
    assert!(text.contains("endpoint down: pausing the pool"), "no pause logged:\n{}", tail(&log));
    assert!(text.contains("pool resumed"), "no resumption logged:\n{}", tail(&log));
    let report = read_json(&out.join("outage/report.json"));
    // The report lists the outage, ended, at least as long as the fake was down.
    let outages = report["outages"].as_array().expect("outages in report.json");
    assert!(
        outages
            .iter()
            .any(|o| o["until_ms"].is_u64() && o["down_s"].as_u64() >= Some(OUTAGE.as_secs() / 2)),
        "{outages:?}"
    );
    assert!(reference.report["outages"].as_array().is_some_and(|o| o.is_empty()));
    check(&api, &reference, &Outcome { report, in_flight }, &format!("{kind:?}"));
}

/// Connections refused (the listener closed, open connections cut) for longer than
/// `ack_wait_s × max_deliver`: 0 dead letters, the uninterrupted run's report.
#[test]
fn refused_connections_cost_no_dead_letters() {
    embedded_outage(Outage::Refuse, 120.0, None);
}

/// 503s for the same window, with a poison question that the API refuses with 400:
/// that job alone is a dead letter (as in the uninterrupted run), the rest complete.
#[test]
fn unavailable_window_costs_no_dead_letters_and_poison_still_dies() {
    let qs = load_questions(QUESTIONS);
    embedded_outage(Outage::Unavailable, 120.0, Some(qs[4].id));
}

/// Requests that hang past the model's `timeout_s` for the same window.
#[test]
fn hanging_endpoint_costs_no_dead_letters() {
    embedded_outage(Outage::Hang, 1.0, None);
}

/// Ctrl-C in a terminal during an outage. A terminal sends SIGINT to its whole foreground
/// process group; the private nats-server was in it, died at once, and the graceful stop
/// then waited on a broker that was gone (found by hand: over five minutes until a second
/// Ctrl-C). SIGINT to the group now stops `halyard run` as interrupted (exit 130) within
/// the minute this test allows (a bound against a hang, not a speed target), and the next
/// `halyard run` completes with the uninterrupted run's report.
#[test]
fn ctrl_c_to_the_process_group_during_an_outage_stops_and_resumes() {
    use std::os::unix::process::CommandExt;
    let api = fake(None);
    let dir = tempdir();
    let sweep = sweep(dir.path(), &api.base_url(), 120.0);
    let reference = reference(dir.path(), &sweep, &api, 0);
    let calls = reference.paid.len();
    let out = dir.path().join("runs");
    let args = ["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()];
    let log = dir.path().join("run.log");
    let mut cmd = halyard();
    cmd.args(args).stdout(Stdio::null()).stderr(log_file(&log)).process_group(0);
    let mut run = ChildGuard::spawn(cmd);
    wait_calls(&api, calls / 3, &mut [&mut run], &[&log]);
    let in_flight = api.in_flight();
    api.go_down(Outage::Refuse);
    // Until the pool has paused: the stop then meets hand-backs and health records.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("pausing the pool") {
        assert!(Instant::now() < deadline, "the pool never paused:\n{}", tail(&log));
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: kill(2) on the process group this test created for the child.
    unsafe { libc::kill(-(run.pid() as libc::pid_t), libc::SIGINT) };
    let status = run.wait_timeout(Duration::from_secs(60));
    let Some(status) = status else {
        panic!("halyard run still running 60 s after Ctrl-C:\n{}", tail(&log))
    };
    assert_eq!(status.code(), Some(130), "halyard run after Ctrl-C: {status:?}\n{}", tail(&log));
    api.come_back();
    let log2 = dir.path().join("resume.log");
    let mut cmd = halyard();
    cmd.args(args).stdout(Stdio::null()).stderr(log_file(&log2));
    let mut resume = ChildGuard::spawn(cmd);
    let status = resume.wait_timeout(Duration::from_secs(180)).expect("the resumed run hangs");
    assert_eq!(status.code(), Some(0), "resumed run: {status:?}\n{}", tail(&log2));
    let report = read_json(&out.join("outage/report.json"));
    check(&api, &reference, &Outcome { report, in_flight }, "ctrl-c");
}

/// `halyard coordinator` and two `halyard worker --sweep` processes: both workers pause
/// (the one that saw the failure and the one told by its announcement), neither spends
/// the budget, and the pool's health record in the broker says it paused and resumed.
#[test]
fn two_worker_processes_both_pause() {
    let api = fake(None);
    let dir = tempdir();
    let d = dir.path();
    let sweep = sweep(d, &api.base_url(), 120.0);
    let reference = reference(d, &sweep, &api, 0);
    let calls = reference.paid.len();
    let nats = NatsServer::start();
    let url = nats.url();
    let out = d.join("runs");
    let coord_log = d.join("coordinator.log");
    let mut c = halyard();
    c.args([
        "coordinator",
        sweep.to_str().unwrap(),
        "--nats",
        &url,
        "--out",
        out.to_str().unwrap(),
    ])
    .stdout(Stdio::null())
    .stderr(log_file(&coord_log));
    let mut coord = ChildGuard::spawn(c);
    let logs: Vec<PathBuf> = (0..2).map(|i| d.join(format!("w{i}.log"))).collect();
    let metrics_port = free_port();
    let metrics =
        |i: usize| if i == 1 { format!("127.0.0.1:{metrics_port}") } else { "off".into() };
    let mut workers: Vec<ChildGuard> = (0..2)
        .map(|i| {
            let mut w = halyard();
            w.args(["worker", "--nats", &url, "--sweep", sweep.to_str().unwrap()])
                .args([
                    "--state",
                    d.join(format!("w{i}")).to_str().unwrap(),
                    "--id",
                    &format!("w{i}"),
                ])
                .args(["--metrics", &metrics(i)])
                .stdout(Stdio::null())
                .stderr(log_file(&logs[i]));
            ChildGuard::spawn(w)
        })
        .collect();
    {
        let (w0, rest) = workers.split_at_mut(1);
        let mut procs = [&mut coord, &mut w0[0], &mut rest[0]];
        wait_calls(&api, calls / 3, &mut procs, &[&coord_log, &logs[0], &logs[1]]);
    }
    let in_flight = api.in_flight();
    let end = api.outage_for(Outage::Refuse, OUTAGE);
    std::thread::sleep(OUTAGE / 2);
    // Mid-outage, worker w1's /metrics says its model pool is paused for connections.
    let paused = |s: &Scrape, v: f64| {
        let labels = [("worker", "w1"), ("pool", "model-a"), ("reason", "connection")];
        assert_eq!(s.sum("halyard_pool_paused", &labels), v, "halyard_pool_paused");
    };
    paused(&metrics_scrape(metrics_port), 1.0);
    end.join().unwrap();
    let status = coord.wait_timeout(Duration::from_secs(180)).expect("the run did not finish");
    assert!(status.success(), "coordinator failed: {status:?}\n{}", tail(&coord_log));
    let after = metrics_scrape(metrics_port);
    paused(&after, 0.0);
    let down = after.sum("halyard_pool_outage_seconds_total", &[("pool", "model-a")]);
    assert!(down >= 1.0, "outage seconds {down}");
    for (i, w) in workers.iter_mut().enumerate() {
        w.signal(libc::SIGTERM);
        let s = w.wait_timeout(Duration::from_secs(30)).expect("worker did not stop");
        assert!(s.success(), "worker {i}: {s:?}\n{}", tail(&logs[i]));
        let text = std::fs::read_to_string(&logs[i]).unwrap_or_default();
        assert!(
            text.contains("endpoint down: pausing the pool"),
            "worker {i} never paused:\n{}",
            tail(&logs[i])
        );
        assert!(text.contains("pool resumed"), "worker {i} never resumed:\n{}", tail(&logs[i]));
    }
    let report = read_json(&out.join("outage/report.json"));
    check(&api, &reference, &Outcome { report, in_flight }, "two workers");
    // The pools' health records: paused once, resumed since.
    let s = halyard_plan::sweep::load(&sweep).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let b = halyard_broker::connect(&halyard_broker::BrokerConfig::new(url.clone(), "test"))
            .await
            .unwrap();
        let kv = b.js.get_key_value(halyard_proto::subjects::POOL_HEALTH_BUCKET).await.unwrap();
        let mut seen = 0;
        for pool in s.pools().keys() {
            let key = halyard_proto::subjects::pool_token(pool);
            let Some(v) = kv.get(&key).await.unwrap() else { continue };
            let r: halyard_proto::PoolHealthRecord = serde_json::from_slice(&v).unwrap();
            assert!(!r.paused && r.resumed_ms.is_some(), "{r:?}");
            assert_eq!(r.reason, halyard_proto::OutageReason::Connection, "{r:?}");
            assert!(r.down_for_ms(0) >= 1000, "{r:?}");
            seen += 1;
        }
        assert!(seen >= 1, "no pool health record in the bucket");
    });
}

/// Scrape and parse a worker's `/metrics`.
fn metrics_scrape(port: u16) -> Scrape {
    let (_, body) = prometheus::scrape(port).expect("the worker's /metrics did not answer");
    prometheus::parse(&body).unwrap_or_else(|e| panic!("bad exposition: {e}\n{body}"))
}

/// `--quota` takes `tpm_counts`, and refuses an unknown counting mode by name.
#[test]
fn quota_flag_takes_tpm_counts() {
    let out = halyard()
        .args(["worker", "--nats", "nats://127.0.0.1:9", "--pool", "p=1"])
        .args(["--quota", "p:tpm=1000,tpm_counts=words"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("tpm_counts \"words\"") && err.contains("usage"), "{err}");
}

/// An endpoint down longer than `[run] outage_patience_s` stops the run as interrupted
/// (exit 130; the last line names the outage and the patience) without a dead letter;
/// the same command, once the endpoint is back, finishes with the uninterrupted run's
/// report, paying again only for the calls in flight at the onset.
#[test]
fn outage_past_patience_interrupts_and_the_rerun_completes() {
    let api = fake(None);
    let dir = tempdir();
    let sweep = sweep(dir.path(), &api.base_url(), 120.0);
    let reference = reference(dir.path(), &sweep, &api, 0);
    let text = std::fs::read_to_string(&sweep).unwrap();
    std::fs::write(&sweep, text.replace("[run]\n", "[run]\noutage_patience_s = 3\n")).unwrap();
    let out = dir.path().join("runs");
    let log = dir.path().join("run.log");
    let args = ["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()];
    let mut cmd = halyard();
    cmd.args(args).stdout(Stdio::null()).stderr(log_file(&log));
    let mut run = ChildGuard::spawn(cmd);
    wait_calls(&api, reference.paid.len() / 3, &mut [&mut run], &[&log]);
    let in_flight = api.in_flight();
    let end = api.outage_for(Outage::Refuse, Duration::from_secs(30));
    let status = run.wait_timeout(Duration::from_secs(60)).expect("the run did not stop");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.code(), Some(130), "{}", tail(&log));
    assert!(
        text.contains("endpoint down for") && text.contains("longer than outage_patience_s = 3"),
        "{}",
        tail(&log)
    );
    let run_dir = out.join("outage");
    assert_eq!(halyard_coordinator::dead_letters::count(&run_dir).unwrap(), 0);
    assert!(!run_dir.join("report.json").exists(), "an interrupted run wrote a report");
    end.join().unwrap();
    run_to_end_with(&args, 0);
    let report = read_json(&run_dir.join("report.json"));
    check(&api, &reference, &Outcome { report, in_flight }, "past patience");
}

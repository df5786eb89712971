//! Managed model servers (issue 35): `backend = "server"` models whose server process the
//! worker starts, health-checks, restarts and stops. The managed process is the project's
//! fake OpenAI server as a program (`fake-server`, from `tests/src/bin`; build it with
//! `cargo build -p halyard-tests --bin fake-server` when running this file alone), which
//! answers HypoTermQA's model and judge by content and misbehaves as its environment
//! says: a worker's servers inherit the worker's environment, so the sweep's command (part
//! of the model's identity) stays the same in every test.
//!
//! Real processes throughout: `nats-server`, `halyard coordinator`, `halyard worker`, and
//! the servers the workers start. Nothing waits for a time to pass; waits have generous
//! deadlines that only a hang reaches.

use crate::common;

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::{broker_init, halyard, processes_mentioning, read_json, run_to_end};
use halyard_tests::{cargo_bin, free_port, pid_alive, ChildGuard, NatsServer};

/// Calls in flight per pool and worker.
const CONCURRENCY: usize = 4;

fn fake_server() -> PathBuf {
    cargo_bin("fake-server")
}

/// How the sweep's two models (model under test and judge) are served.
struct Spec {
    questions: usize,
    /// GPUs per server of the model and of the judge (0: CPU servers).
    gpus: (u32, u32),
    max_deliver: u32,
    max_restarts: u32,
    start_timeout_s: f64,
}

impl Default for Spec {
    fn default() -> Spec {
        Spec { questions: 6, gpus: (0, 0), max_deliver: 5, max_restarts: 3, start_timeout_s: 120.0 }
    }
}

/// A HypoTermQA sweep whose model and judge are managed servers running `fake-server`.
/// The weights' path names `dir`, so that `processes_mentioning(dir)` finds the servers.
fn sweep(dir: &Path, s: &Spec) -> PathBuf {
    let model = |name: &str, gpus: u32| {
        format!(
            "[[model]]\nname = \"{name}\"\nbackend = \"server\"\n\
             command = [\"{}\", \"--port\", \"{{port}}\", \"--answers\", \"hypotermqa\", \"--model\", \"{{model_path}}\"]\n\
             model_path = \"{}/weights/{name}\"\nrevision = \"test-rev-1\"\nversion = \"fake-1.0\"\n\
             version_path = \"/version\"\ngpus = {gpus}\nmax_concurrency = {CONCURRENCY}\nmax_tokens = 256\n\
             start_timeout_s = {}\nmax_restarts = {}\nrestart_backoff_s = 0.2\n\n",
            fake_server().display(),
            dir.display(),
            s.start_timeout_s,
            s.max_restarts
        )
    };
    let text = format!(
        "name = \"ms\"\n\n{}{}\
         [[benchmark]]\npipeline = \"hypotermqa\"\ndataset = \"{}\"\nmodels = [\"model-a\"]\njudge = \"judge-a\"\nsemantics = \"paper\"\nlimit = {}\n\n\
         [run]\nack_wait_s = 3\nmax_deliver = {}\n",
        model("model-a", s.gpus.0),
        model("judge-a", s.gpus.1),
        common::dataset().display(),
        s.questions,
        s.max_deliver
    );
    let p = dir.join("ms.toml");
    std::fs::write(&p, text).unwrap();
    p
}

fn log_file(dir: &Path, name: &str) -> std::fs::File {
    OpenOptions::new().create(true).append(true).open(dir.join(format!("{name}.log"))).unwrap()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn coordinator(dir: &Path, url: &str, sweep: &Path) -> ChildGuard {
    let mut c = halyard();
    c.args(["coordinator", sweep.to_str().unwrap(), "--nats", url, "--out"])
        .arg(dir.join("runs"))
        .args(["--metrics", "off"])
        .stdout(log_file(dir, "coordinator"))
        .stderr(log_file(dir, "coordinator"));
    ChildGuard::spawn(c)
}

/// `halyard worker --id <id>` with `args`, its servers scripted by `env`; its metrics on
/// the returned port.
fn worker(
    dir: &Path,
    url: &str,
    sweep: &Path,
    id: &str,
    args: &[&str],
    env: &[(&str, String)],
) -> (ChildGuard, u16) {
    let port = free_port();
    let mut c = halyard();
    c.args(["worker", "--nats", url, "--sweep", sweep.to_str().unwrap(), "--id", id])
        .arg("--allow-server-commands")
        .arg("--state")
        .arg(dir.join(id))
        .args(["--metrics", &format!("127.0.0.1:{port}")])
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(log_file(dir, id))
        .stderr(log_file(dir, id));
    (ChildGuard::spawn(c), port)
}

/// Wait until `f` holds; panics naming `what` (and `context()`) after two minutes.
fn wait_until(what: &str, context: impl Fn() -> String, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !f() {
        assert!(Instant::now() < deadline, "never: {what}\n{}", context());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `GET /metrics` of a worker ("" while it does not answer).
fn scrape(port: u16) -> String {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return String::new() };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let req =
        format!("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return String::new();
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// The value of the metric sample whose line starts with `prefix` (name and labels).
fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().filter(|l| l.starts_with(name)).find_map(|l| {
        let (head, value) = l.rsplit_once(' ')?;
        let all = labels.iter().all(|(k, v)| head.contains(&format!("{k}=\"{v}\"")));
        all.then(|| value.parse().ok()).flatten()
    })
}

/// Direct children of `pid` (from /proc).
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let stat = read(&e.path().join("stat"));
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let ppid = rest.split_whitespace().nth(1).and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) && pid_alive(child) {
            out.push(child);
        }
    }
    out
}

/// The calls the servers received, by request (the shared calls log).
fn calls(log: &Path) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for l in read(log).lines() {
        if let Some((_, key)) = l.split_once(' ') {
            *m.entry(key.to_string()).or_default() += 1;
        }
    }
    m
}

/// Everything a run wrote, for failure messages.
fn logs(dir: &Path) -> String {
    let mut out = String::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "log") {
                let text = read(&p);
                let tail: Vec<&str> = text.lines().rev().take(40).collect();
                out.push_str(&format!("--- {}\n", p.display()));
                for l in tail.into_iter().rev() {
                    out.push_str(l);
                    out.push('\n');
                }
            }
        }
    }
    out
}

/// Wait for the coordinator to finish the run; its report.
fn finish(dir: &Path, coord: &mut ChildGuard) -> serde_json::Value {
    let s = coord.wait_timeout(Duration::from_secs(300)).unwrap_or_else(|| {
        panic!("the run did not finish\n{}", logs(dir));
    });
    assert!(s.success(), "coordinator: {s:?}\n{}", logs(dir));
    read_json(&dir.join("runs/ms/report.json"))
}

/// Stop a worker with SIGTERM; it must exit 0 and leave no server behind.
fn stop_worker(dir: &Path, w: &mut ChildGuard) {
    let servers = children_of(w.pid());
    w.signal(libc::SIGTERM);
    let s = w.wait_timeout(Duration::from_secs(90)).expect("worker did not stop on SIGTERM");
    assert!(s.success(), "worker stop: {s:?}\n{}", logs(dir));
    for pid in servers {
        assert!(!pid_alive(pid), "server {pid} outlived its worker's stop");
    }
}

/// Several servers on one node: `--gpu 0,1 --gpu 2,3 --gpu 4` runs the 2-GPU model twice
/// (one server per set, `CUDA_VISIBLE_DEVICES` set to it) and the 1-GPU judge on GPU 4;
/// slow starts are waited for, no job is taken before every server is ready; the run
/// completes; `/metrics` shows each server ready with its GPU set and version; the
/// servers go with the worker's SIGTERM.
#[test]
fn gpu_sets_start_one_server_each_and_the_run_waits_for_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let sweep = sweep(d, &Spec { gpus: (2, 1), ..Spec::default() });
    let nats = NatsServer::start();
    let env = [("FAKE_SERVER_READY_AFTER_MS", "1500".to_string())];
    let (mut w, port) =
        worker(d, &nats.url(), &sweep, "w0", &["--gpu", "0,1", "--gpu", "2,3", "--gpu", "4"], &env);
    let mut coord = coordinator(d, &nats.url(), &sweep);
    let report = finish(d, &mut coord);
    assert_eq!(report["jobs"]["dead_letters"].as_u64(), Some(0), "{report}");
    // The report records each server's command (as the sweep gives it) and version.
    let servers = report["servers"].as_array().expect("report.servers");
    assert_eq!(servers.len(), 2, "{report}");
    assert_eq!(servers[0]["model"], "model-a");
    assert_eq!(servers[0]["version"], "fake-1.0");
    assert_eq!(servers[0]["command"][2], "{port}");
    let text = scrape(port);
    for (server, gpus) in
        [("model-a@gpu0,1", "0,1"), ("model-a@gpu2,3", "2,3"), ("judge-a@gpu4", "4")]
    {
        let labels = [("server", server), ("state", "ready")];
        assert_eq!(metric(&text, "halyard_server_state", &labels), Some(1.0), "{server}:\n{text}");
        let info = [("server", server), ("gpus", gpus), ("version", "fake-1.0")];
        assert_eq!(metric(&text, "halyard_server_info", &info), Some(1.0), "{server}:\n{text}");
        let log = read(&d.join(format!("w0/servers/{server}.log")));
        assert!(log.contains(&format!("CUDA_VISIBLE_DEVICES=Some(\"{gpus}\")")), "{log}");
    }
    // The worker bound its consumers only once its servers were ready.
    let wlog = read(&d.join("w0.log"));
    let last_ready = wlog.rfind("managed server ready").expect("servers ready");
    let running = wlog.find("worker running").expect("worker running");
    assert!(last_ready < running, "{wlog}");
    // `halyard status` lists the servers (from the worker's heartbeat).
    // The heartbeat carries them from its next beat on.
    let status = || {
        let out = halyard().args(["status", "ms", "--nats", &nats.url()]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    wait_until("halyard status lists the servers", status, || {
        let s = status();
        s.contains("managed servers:")
            && s.contains("model-a@gpu2,3 on w0: fake-server (GPUs 2,3), ready, 0 restarts")
    });
    stop_worker(d, &mut w);
    assert!(
        processes_mentioning(d.join("weights").to_str().unwrap()).is_empty(),
        "a server outlived the test"
    );
}

/// A server that never answers its ready path fails the worker's start within the
/// deadline, with the server's log in the error; one that exits at start too, with its
/// exit code. No server is left behind either way.
#[test]
fn a_server_that_never_becomes_ready_fails_the_worker_with_its_log() {
    let nats = NatsServer::start();
    broker_init(&nats.url());
    for (env, expect) in [
        (("FAKE_SERVER_NEVER_READY", "true"), "was not ready within 2 s"),
        (("FAKE_SERVER_EXIT_AT_START", "7"), "exited before it was ready (exit code 7)"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let sweep = sweep(d, &Spec { start_timeout_s: 2.0, ..Spec::default() });
        let (mut w, _) = worker(d, &nats.url(), &sweep, "w0", &[], &[(env.0, env.1.to_string())]);
        let s = w.wait_timeout(Duration::from_secs(120)).expect("the worker did not give up");
        let log = read(&d.join("w0.log"));
        assert!(!s.success(), "{log}");
        assert!(log.contains(expect), "{expect}:\n{log}");
        // The log tail names the server's own lines.
        assert!(log.contains("fake-server["), "{log}");
        assert!(
            processes_mentioning(d.join("weights").to_str().unwrap()).is_empty(),
            "a server outlived its worker"
        );
    }
}

/// A server that crashes mid-run (with calls in flight) is restarted; meanwhile the pool
/// is paused and the jobs in hand go back without spending a delivery: with
/// `max_deliver = 1` any delivery burnt by the crash would be a dead letter. The report
/// is the one an uninterrupted run gives.
#[test]
fn a_crash_mid_run_restarts_the_server_and_costs_no_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let spec = Spec { questions: 10, max_deliver: 1, ..Spec::default() };
    let sweep = sweep(d, &spec);
    // The reference: the same sweep, run whole by `halyard run` (its worker owns the
    // servers too).
    run_to_end(&["run", sweep.to_str().unwrap(), "--out", d.join("ref").to_str().unwrap()]);
    let reference = read_json(&d.join("ref/ms/report.json"));
    let nats = NatsServer::start();
    let env = [
        ("FAKE_SERVER_CRASH_AFTER", "8".to_string()),
        ("FAKE_SERVER_CRASH_ONCE", d.join("crashed").display().to_string()),
        ("FAKE_SERVER_LATENCY_MS", "50".to_string()),
    ];
    let (mut w, port) = worker(d, &nats.url(), &sweep, "w0", &[], &env);
    let mut coord = coordinator(d, &nats.url(), &sweep);
    let report = finish(d, &mut coord);
    assert!(d.join("crashed").exists(), "no server crashed\n{}", logs(d));
    assert_eq!(report["jobs"]["dead_letters"].as_u64(), Some(0), "{}", logs(d));
    assert_eq!(
        report["benchmarks"], reference["benchmarks"],
        "report differs from the uninterrupted run's"
    );
    let text = scrape(port);
    let restarts: f64 = ["model-a@cpu", "judge-a@cpu"]
        .iter()
        .filter_map(|s| metric(&text, "halyard_server_restarts_total", &[("server", s)]))
        .sum();
    assert_eq!(restarts, 1.0, "{text}");
    stop_worker(d, &mut w);
}

/// A server that crashes each time it is called stops the worker after `max_restarts`
/// restarts, with its log tail in the worker's error.
#[test]
fn a_crash_loop_stops_the_worker_with_the_log_tail() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let sweep = sweep(d, &Spec { max_restarts: 2, ..Spec::default() });
    let nats = NatsServer::start();
    let env = [("FAKE_SERVER_CRASH_AFTER", "0".to_string())];
    let (mut w, _) = worker(d, &nats.url(), &sweep, "w0", &[], &env);
    let mut coord = coordinator(d, &nats.url(), &sweep);
    let s = w.wait_timeout(Duration::from_secs(120)).expect("the worker did not stop");
    let log = read(&d.join("w0.log"));
    assert!(!s.success(), "{log}");
    assert!(log.contains("failed 3 times in a row (max_restarts = 2)"), "{log}");
    assert!(log.contains("crashing on call 1, as told"), "the log tail is missing:\n{log}");
    assert!(
        processes_mentioning(d.join("weights").to_str().unwrap()).is_empty(),
        "a server outlived its worker"
    );
    coord.kill();
}

/// SIGTERM: the calls in flight finish first (the server answers every call it got),
/// then the server gets its own SIGTERM with nothing in flight, and the worker exits 0.
#[test]
fn sigterm_drains_the_calls_then_stops_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let sweep = sweep(d, &Spec { questions: 20, ..Spec::default() });
    let nats = NatsServer::start();
    let calls_log = d.join("calls.txt");
    let env = [
        ("FAKE_SERVER_LATENCY_MS", "1500".to_string()),
        ("FAKE_SERVER_CALLS_LOG", calls_log.display().to_string()),
    ];
    let (mut w, _) = worker(d, &nats.url(), &sweep, "w0", &["--grace", "60"], &env);
    let mut coord = coordinator(d, &nats.url(), &sweep);
    wait_until("calls in flight", || logs(d), || !read(&calls_log).is_empty());
    stop_worker(d, &mut w);
    let server_log = read(&d.join("w0/servers/model-a@cpu.log"));
    assert!(server_log.contains("SIGTERM with 0 calls in flight"), "{server_log}");
    let drained = server_log.lines().find(|l| l.contains("drained:")).expect("drained");
    let n: Vec<u64> =
        drained.split(|c: char| !c.is_ascii_digit()).filter_map(|x| x.parse().ok()).collect();
    // `fake-server[<pid>]: drained: R calls received, A answered`
    assert_eq!(n.len(), 3, "{drained}");
    assert!(n[1] > 0 && n[1] == n[2], "calls cut off: {drained}");
    coord.kill();
}

/// A worker killed with SIGKILL takes its servers with it (parent-death signal).
#[test]
fn a_worker_killed_takes_its_servers_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let sweep = sweep(d, &Spec::default());
    let nats = NatsServer::start();
    broker_init(&nats.url());
    let (mut w, port) = worker(d, &nats.url(), &sweep, "w0", &[], &[]);
    wait_until(
        "the worker's servers are ready",
        || logs(d),
        || {
            let t = scrape(port);
            ["model-a@cpu", "judge-a@cpu"].iter().all(|s| {
                metric(&t, "halyard_server_state", &[("server", s), ("state", "ready")])
                    == Some(1.0)
            })
        },
    );
    // The servers (each also has a guard child, a `sh` that kills its group if the
    // worker dies: issue 49, item 8).
    let servers: Vec<u32> = children_of(w.pid())
        .into_iter()
        .filter(|p| read(Path::new(&format!("/proc/{p}/cmdline"))).contains("weights"))
        .collect();
    assert_eq!(servers.len(), 2, "{servers:?}");
    w.kill();
    wait_until(
        "the servers die with their worker",
        || logs(d),
        || servers.iter().all(|p| !pid_alive(*p)),
    );
    assert!(processes_mentioning(d.join("weights").to_str().unwrap()).is_empty());
}

/// Chaos with managed servers: a sweep on two workers, each with its own servers; one
/// server killed mid-run (SIGKILL, from outside) and one worker killed (SIGKILL) and
/// started again. The report and labels equal an uninterrupted run's, and the calls made
/// twice are at most those that could be in flight at the kills.
#[test]
fn chaos_two_workers_one_server_and_one_worker_killed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let spec = Spec { questions: 40, max_deliver: 50, ..Spec::default() };
    let sweep = sweep(d, &spec);
    let ref_calls = d.join("ref-calls.txt");
    let out = halyard()
        .args(["run", sweep.to_str().unwrap(), "--out", d.join("ref").to_str().unwrap()])
        .env("FAKE_SERVER_CALLS_LOG", &ref_calls)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let reference = read_json(&d.join("ref/ms/report.json"));
    let reference_calls: usize = calls(&ref_calls).values().sum();

    let nats = NatsServer::start();
    let calls_log = d.join("calls.txt");
    let env = [
        ("FAKE_SERVER_CALLS_LOG", calls_log.display().to_string()),
        ("FAKE_SERVER_LATENCY_MS", "20".to_string()),
    ];
    let (mut w0, _) = worker(d, &nats.url(), &sweep, "w0", &[], &env);
    let (mut w1, _) = worker(d, &nats.url(), &sweep, "w1", &[], &env);
    let mut coord = coordinator(d, &nats.url(), &sweep);
    let total = |log: &Path| calls(log).values().sum::<usize>();
    // At a third of the calls, once w0's two servers run (the workers start them after
    // the coordinator has made the broker's streams, so w1 may have served a third
    // before): kill one of them. A server killed before it is ready fails its worker's
    // start instead (`a_server_that_never_becomes_ready_fails_the_worker_with_its_log`).
    wait_until("a third of the calls", || logs(d), || total(&calls_log) >= reference_calls / 3);
    wait_until(
        "w0's servers ready",
        || logs(d),
        || read(&d.join("w0.log")).matches("managed server ready").count() >= 2,
    );
    // A server, not its guard (a `sh` child of the worker that kills the server's
    // group if the worker dies).
    let victim = children_of(w0.pid())
        .into_iter()
        .find(|p| read(Path::new(&format!("/proc/{p}/cmdline"))).contains("weights"))
        .expect("w0 runs servers");
    // SAFETY: a plain kill of a process this test's worker started.
    unsafe { libc::kill(victim as libc::pid_t, libc::SIGKILL) };
    // At two thirds: kill w1 and start it again.
    wait_until(
        "two thirds of the calls",
        || logs(d),
        || total(&calls_log) >= 2 * reference_calls / 3,
    );
    let w1_servers = children_of(w1.pid());
    w1.kill();
    let (mut w1b, _) = worker(d, &nats.url(), &sweep, "w1", &[], &env);
    let report = finish(d, &mut coord);
    for pid in w1_servers {
        assert!(!pid_alive(pid), "a server outlived its killed worker");
    }
    stop_worker(d, &mut w0);
    stop_worker(d, &mut w1b);

    let made = calls(&calls_log);
    let repeated: usize = made.values().map(|n| n - 1).sum();
    let reference_repeats: usize = calls(&ref_calls).values().map(|n| n - 1).sum();
    // The killed server's calls in flight (one pool), the killed worker's (two pools).
    let bound = CONCURRENCY + 2 * CONCURRENCY + reference_repeats;
    println!(
        "managed-server chaos: {} jobs, {} calls (uninterrupted {reference_calls}), {repeated} repeated (bound {bound})",
        report["jobs"]["done"],
        made.values().sum::<usize>()
    );
    assert_eq!(report["jobs"]["dead_letters"].as_u64(), Some(0), "{}", logs(d));
    assert_eq!(
        report["benchmarks"], reference["benchmarks"],
        "report differs from the uninterrupted run's"
    );
    assert_eq!(report["jobs"]["done"], reference["jobs"]["done"]);
    let labels = read(&d.join("runs/ms/labels.jsonl"));
    assert_eq!(labels, read(&d.join("ref/ms/labels.jsonl")), "labels differ");
    assert!(repeated <= bound, "{repeated} repeated calls > bound {bound}");
    let panics = logs(d).matches("panicked at").count();
    assert_eq!(panics, 0, "{}", logs(d));
}

//! Issue 13: a worker runs only what its operator configured. Coordinator and worker run
//! as processes on a real nats-server; while the run is under way, someone with publish
//! rights on the broker re-publishes real jobs with the endpoint replaced by their own
//! server and the key variable replaced by another variable of the worker's environment.

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;
use async_nats::jetstream::message::PublishMessage;
use halyard_broker::BrokerConfig;
use halyard_proto::{subjects, Job};
use halyard_tests::{free_port, ChildGuard, FakeOpenAi, NatsServer, Reply};

const LEGIT_KEY: &str = "legit-key-value-1234";
const SECRET: &str = "top-secret-value-5678";

/// A job as an older coordinator (or an attacker) encodes it: with `api_key_env`.
fn with_key_env(job: &Job, var: &str) -> Vec<u8> {
    let mut b = halyard_proto::encode(job).unwrap();
    assert_eq!(b[0], 0x86, "a job is a map of six fields");
    b[0] = 0x87;
    b.extend(halyard_proto::encode(&"api_key_env").unwrap());
    b.extend(halyard_proto::encode(&var).unwrap());
    b
}

/// GET /metrics of the worker: the value of `halyard_worker_jobs_total{outcome}`.
fn refused_metric(port: u16) -> Option<f64> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let body = raw.split_once("\r\n\r\n")?.1;
    let scrape = halyard_tests::prometheus::parse(body).ok()?;
    Some(scrape.sum("halyard_worker_jobs_total", &[("outcome", "refused")]))
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Forged jobs reach no server and leak nothing; a job whose id does not match its key
/// is refused and counted; the run's report is the one the rules imply, with no dead
/// letter.
#[test]
fn forged_jobs_reach_no_server_and_leave_the_report_alone() {
    let qs = load_questions(20);
    // The real call of the job whose id a forgery reuses is slowed down, so that the
    // worker's refusal of the forgery reaches the coordinator before the job's result.
    let slow = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let rules = responder(question_index(&qs), None);
    let slowed = slow.clone();
    let fake = FakeOpenAi::start_blocking(move |c| {
        let reply = rules(c);
        let question = c.messages.last().map(|m| m.1.as_str()).unwrap_or_default();
        if *slowed.lock().unwrap() == question {
            Reply::Delayed(Duration::from_millis(1500), Box::new(reply))
        } else {
            reply
        }
    });
    let attacker = FakeOpenAi::start_blocking(|_| Reply::Text("planted answer".into()));
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let sweep = write_sweep(dir.path(), "trust", &fake.base_url(), 20, 4);
    let text = std::fs::read_to_string(&sweep).unwrap().replace(
        "backend = \"openai\"",
        "backend = \"openai\"\napi_key_env = \"TRUST_TEST_API_KEY\"",
    );
    std::fs::write(&sweep, text).unwrap();
    let out = dir.path().join("runs");
    let clog = dir.path().join("coordinator.log");
    let mut c = halyard();
    c.args(["coordinator", sweep.to_str().unwrap(), "--metrics", "off", "--nats", &nats.url()])
        .arg("--out")
        .arg(&out)
        .stderr(std::fs::File::create(&clog).unwrap());
    let mut coordinator = ChildGuard::spawn(c);

    // The 20 answer jobs are published before any worker exists; forge three of them.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let broker =
        rt.block_on(halyard_broker::connect(&BrokerConfig::new(nats.url(), "attacker"))).unwrap();
    let messages = || {
        rt.block_on(async {
            let mut s = broker.js.get_stream(subjects::JOBS_STREAM).await.ok()?;
            Some(s.info().await.ok()?.state.clone())
        })
    };
    wait_for("the answer jobs", Duration::from_secs(60), || {
        messages().is_some_and(|s| s.messages >= 20)
    });
    let first = messages().unwrap().first_sequence;
    let stream = rt.block_on(broker.js.get_stream(subjects::JOBS_STREAM)).unwrap();
    let real: Vec<(String, Job)> = (first..first + 3)
        .map(|seq| {
            let m = rt.block_on(stream.get_raw_message(seq)).unwrap();
            (m.subject.to_string(), halyard_proto::decode("job", &m.payload).unwrap())
        })
        .collect();
    *slow.lock().unwrap() = real[0].1.key.messages.last().unwrap().content.clone();
    let mut forged = Vec::new();
    // 1. Endpoint replaced, the real job's id kept: the id is not the key's hash.
    let mut a = real[0].1.clone();
    a.key.model.endpoint = attacker.base_url();
    forged.push((&real[0].0, with_key_env(&a, "HALYARD_TEST_SECRET")));
    // 2. Endpoint replaced and the id recomputed: a model this worker does not have.
    let mut b = real[1].1.clone();
    b.key.model.endpoint = attacker.base_url();
    b.id = b.key.id();
    forged.push((&real[1].0, with_key_env(&b, "HALYARD_TEST_SECRET")));
    // 3. A real job unchanged but for another key variable: runs with the configured key.
    forged.push((&real[2].0, with_key_env(&real[2].1, "HALYARD_TEST_SECRET")));
    rt.block_on(async {
        for (i, (subject, payload)) in forged.into_iter().enumerate() {
            let m =
                PublishMessage::build().payload(payload.into()).message_id(format!("forged-{i}"));
            broker.js.send_publish(subject.clone(), m).await.unwrap().await.unwrap();
        }
    });

    let wlog = dir.path().join("worker.log");
    let metrics = free_port();
    let mut w = halyard();
    w.args(["worker", "--sweep", sweep.to_str().unwrap(), "--nats", &nats.url()])
        .args(["--metrics", &format!("127.0.0.1:{metrics}")])
        .arg("--state")
        .arg(dir.path().join("checkpoint"))
        .env("TRUST_TEST_API_KEY", LEGIT_KEY)
        .env("HALYARD_TEST_SECRET", SECRET)
        .stderr(std::fs::File::create(&wlog).unwrap());
    let mut worker = ChildGuard::spawn(w);
    let status = coordinator.wait_timeout(Duration::from_secs(120)).expect("run did not finish");
    let worker_log = || std::fs::read_to_string(&wlog).unwrap_or_default();
    assert!(status.success(), "coordinator: {status:?}\n{}", worker_log());
    wait_for("the refused metric", Duration::from_secs(10), || {
        refused_metric(metrics) == Some(2.0)
    });
    worker.signal(libc::SIGTERM);
    worker.wait_timeout(Duration::from_secs(30)).expect("worker did not stop");

    assert_eq!(attacker.call_count(), 0, "a forged job reached the attacker's server");
    for call in fake.calls() {
        assert_eq!(call.authorization.as_deref(), Some(&*format!("Bearer {LEGIT_KEY}")));
    }
    let log = worker_log();
    assert!(log.contains("not the hash of its key"), "{log}");
    let coordinator_log = std::fs::read_to_string(&clog).unwrap();
    assert!(coordinator_log.contains("a worker refused a job message"), "{coordinator_log}");
    assert!(log.contains(&format!("endpoint {:?}", attacker.base_url())), "{log}");
    // The secret is nowhere: logs, reports, labels, the run state's exports.
    let mut texts = vec![log, std::fs::read_to_string(&clog).unwrap()];
    for f in ["report.json", "report.md", "labels.jsonl"] {
        texts.push(std::fs::read_to_string(out.join("trust").join(f)).unwrap());
    }
    assert!(texts.iter().all(|t| !t.contains(SECRET)), "the secret leaked");
    // The report: every item done by the real model, as the rules imply; no dead letter.
    let report = read_json(&out.join("trust/report.json"));
    assert_eq!(report["jobs"]["dead_letters"], 0, "{report}");
    let hts = report["benchmarks"][0]["hts"].as_f64().unwrap();
    assert!((hts - expected_paper(&qs, None).hts).abs() < 1e-9, "{report}");
    assert_labels_unplanted(&out.join("trust/labels.jsonl"));
}

/// No label row holds the attacker's answer.
fn assert_labels_unplanted(path: &Path) {
    let labels = std::fs::read_to_string(path).unwrap();
    assert_eq!(labels.lines().count(), 20);
    assert!(!labels.contains("planted answer"));
}

//! Issue 33: the coordinator's intake is bounded by bytes. Junk published to a run's
//! results subject while its coordinator is down (1,000 messages of about 1 MiB, what
//! anyone with publish rights on an open broker can send) is refused, counted and acked
//! by the restarted coordinator in bounded memory, and the run completes exact. And it
//! takes only what it asked for: forged results for its planned jobs, published on
//! another pool's results subject under the ids honest results had, and results for ids
//! it never planned change nothing in the report; they are counted.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use async_nats::jetstream::message::PublishMessage;
use halyard_broker::BrokerConfig;
use halyard_proto::{subjects, Failure, FailureKind, Job, JobResult, Outcome};
use halyard_tests::{ChildGuard, NatsServer};

const JOBS: u64 = 200;
const JUNK: usize = 1000;

/// The run id a coordinator wrote into `status`, once it is there.
pub(crate) fn run_id(status: &std::path::Path) -> uuid::Uuid {
    let t = std::time::Instant::now();
    loop {
        if let Some(r) = std::fs::read_to_string(status)
            .ok()
            .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
            .and_then(|v| v["run"].as_str().and_then(|r| uuid::Uuid::parse_str(r).ok()))
        {
            return r;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "no run id in {}", status.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A worker serving `sweep`, its checkpoint and log in `dir`.
fn worker(sweep: &std::path::Path, nats: &NatsServer, dir: &std::path::Path) -> ChildGuard {
    let mut w = halyard();
    w.args(["worker", "--sweep", sweep.to_str().unwrap(), "--nats", &nats.url()])
        .args(["--metrics", "off"])
        .arg("--state")
        .arg(dir.join("checkpoint"))
        .stderr(std::fs::File::create(dir.join("worker.log")).unwrap());
    ChildGuard::spawn(w)
}

/// The peak resident memory (`VmHWM`) of process `pid`, in bytes.
pub(crate) fn peak_rss(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The peak resident memory of a process, read every 20 ms until stopped.
pub(crate) struct Peak {
    peak: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Peak {
    pub(crate) fn watch(pid: u32) -> Peak {
        let (peak, done) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let thread = {
            let (peak, done) = (peak.clone(), done.clone());
            std::thread::spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    if let Some(rss) = peak_rss(pid) {
                        peak.fetch_max(rss, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        Peak { peak, done, thread }
    }

    pub(crate) fn stop(self) -> u64 {
        self.done.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
        self.peak.load(Ordering::Relaxed)
    }
}

#[test]
fn a_junk_flood_on_the_results_subject_is_refused_in_bounded_memory() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let sweep = noop_sweep(dir.path(), "flood", JOBS);
    let out = dir.path().join("runs");
    let coordinator = || {
        let mut c = halyard();
        c.args(["coordinator", sweep.to_str().unwrap(), "--metrics", "off", "--nats", &nats.url()])
            .arg("--out")
            .arg(&out)
            .stderr(std::fs::File::create(dir.path().join("coordinator.log")).unwrap());
        ChildGuard::spawn(c)
    };

    // A first coordinator plans the run (its id is in status.json) and stops.
    let mut first = coordinator();
    let status = out.join("flood/status.json");
    let run = run_id(&status);
    first.signal(libc::SIGTERM);
    first.wait_timeout(Duration::from_secs(30)).expect("coordinator did not stop");

    // The flood, while no coordinator runs.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let broker =
        rt.block_on(halyard_broker::connect(&BrokerConfig::new(nats.url(), "flood"))).unwrap();
    let junk = vec![0xc1u8; broker.payload_limit()];
    rt.block_on(async {
        for i in 0..JUNK {
            let m = PublishMessage::build()
                .payload(junk.clone().into())
                .message_id(format!("junk-{i}"));
            broker
                .js
                .send_publish(subjects::result_subject(run, "free"), m)
                .await
                .unwrap()
                .await
                .unwrap();
        }
    });

    // The restarted coordinator, watched for its peak memory, and a worker.
    let mut second = coordinator();
    let peak = Peak::watch(second.pid());
    let mut worker = worker(&sweep, &nats, dir.path());
    let exit = second.wait_timeout(Duration::from_secs(180)).expect("run did not finish");
    let peak = peak.stop();
    worker.signal(libc::SIGTERM);
    worker.wait_timeout(Duration::from_secs(30)).expect("worker did not stop");
    let log = std::fs::read_to_string(dir.path().join("coordinator.log")).unwrap_or_default();
    assert!(exit.success(), "coordinator: {exit:?}\n{log}");

    let flood = (JUNK * junk.len()) as u64;
    eprintln!("flood of {} MiB: coordinator peak RSS {} MiB", flood >> 20, peak >> 20);
    assert!(peak > 0, "no memory reading of the coordinator");
    assert!(
        peak < 512 << 20,
        "coordinator peak RSS {} MiB over a {} MiB flood",
        peak >> 20,
        flood >> 20
    );
    let report = read_json(&out.join("flood/report.json"));
    assert_eq!(report["benchmarks"][0]["labelled"], JOBS, "{report}");
    assert_eq!(report["jobs"]["dead_letters"], 0, "{report}");
    let status = read_json(&status);
    assert_eq!(status["refused_messages"], JUNK as u64, "{status}\n{log}");
}

/// Every job of run `run` in the job stream (single jobs and batches), once `want` are
/// there.
pub(crate) async fn planned_jobs(
    broker: &halyard_broker::Broker,
    run: uuid::Uuid,
    want: usize,
) -> Vec<Job> {
    let t = std::time::Instant::now();
    loop {
        let mut stream = broker.js.get_stream(subjects::JOBS_STREAM).await.unwrap();
        let (first, last) = {
            let s = &stream.info().await.unwrap().state;
            (s.first_sequence, s.last_sequence)
        };
        let mut jobs = Vec::new();
        for seq in first..=last {
            if let Ok(m) = stream.get_raw_message(seq).await {
                let decoded = halyard_proto::decode_jobs(&m.payload).unwrap_or_default();
                jobs.extend(decoded.into_iter().filter(|j| j.run == run));
            }
        }
        if jobs.len() >= want {
            return jobs;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "{} of {want} jobs published", jobs.len());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A dead letter for `job`, as a forger would publish it (the old build stored the first
/// result of any job id: a forged dead letter became the item's label).
fn forged(run: uuid::Uuid, job: halyard_proto::JobId) -> Vec<u8> {
    let r = JobResult {
        v: halyard_proto::WIRE_VERSION,
        job,
        run,
        outcome: Outcome::Failed(Failure {
            kind: FailureKind::Exhausted,
            error: "forged".into(),
            http_status: None,
        }),
        deliveries: 1,
        worker: "forger".into(),
        cached: false,
    };
    halyard_proto::encode(&r).unwrap()
}

/// Forged results for every planned job, on the results subject of the other pool (all a
/// holder of that pool's credentials may publish on) and under the message id an honest
/// single result had before results ids carried a secret, and forged results for 300 ids
/// nobody planned, all published before any worker runs: the run completes with the
/// honest results only (no dead letter, every item labelled once), and the report and
/// status count the refused and the held-aside ones.
#[test]
fn forged_results_for_planned_and_random_jobs_change_nothing() {
    const PER_MODEL: u64 = 40;
    const RANDOM: u64 = 300;
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let sweep = dir.path().join("forged.toml");
    std::fs::write(
        &sweep,
        format!(
            "name = \"forged\"\n[[model]]\nname = \"a\"\nbackend = \"noop\"\n\
             [[model]]\nname = \"b\"\nbackend = \"noop\"\n\
             [[benchmark]]\npipeline = \"noop\"\njobs = {PER_MODEL}\nmodels = [\"a\", \"b\"]\n"
        ),
    )
    .unwrap();
    let out = dir.path().join("runs");
    let mut c = halyard();
    c.args(["coordinator", sweep.to_str().unwrap(), "--metrics", "off", "--nats", &nats.url()])
        .arg("--out")
        .arg(&out)
        .stderr(std::fs::File::create(dir.path().join("coordinator.log")).unwrap());
    let mut coordinator = ChildGuard::spawn(c);
    let run = run_id(&out.join("forged/status.json"));

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let broker =
        rt.block_on(halyard_broker::connect(&BrokerConfig::new(nats.url(), "forger"))).unwrap();
    rt.block_on(async {
        let jobs = planned_jobs(&broker, run, 2 * PER_MODEL as usize).await;
        let pools: std::collections::BTreeSet<String> =
            jobs.iter().map(|j| j.pool.clone()).collect();
        assert_eq!(pools.len(), 2, "{pools:?}");
        for j in &jobs {
            let other = pools.iter().find(|p| **p != j.pool).unwrap();
            let m = PublishMessage::build()
                .payload(forged(run, j.id).into())
                .message_id(halyard_proto::batch_msg_id(run, [&j.id]));
            let subject = subjects::result_subject(run, other);
            broker.js.send_publish(subject, m).await.unwrap().await.unwrap();
        }
        for n in 0..RANDOM {
            let mut id = [0u8; 16];
            id[..8].copy_from_slice(&n.to_be_bytes());
            let m = PublishMessage::build()
                .payload(forged(run, halyard_proto::JobId(id)).into())
                .message_id(format!("random-{n}"));
            let subject = subjects::result_subject(run, &jobs[0].pool);
            broker.js.send_publish(subject, m).await.unwrap().await.unwrap();
        }
    });

    let mut worker = worker(&sweep, &nats, dir.path());
    let exit = coordinator.wait_timeout(Duration::from_secs(120)).expect("run did not finish");
    worker.signal(libc::SIGTERM);
    worker.wait_timeout(Duration::from_secs(30)).expect("worker did not stop");
    let log = std::fs::read_to_string(dir.path().join("coordinator.log")).unwrap_or_default();
    assert!(exit.success(), "coordinator: {exit:?}\n{log}");

    let report = read_json(&out.join("forged/report.json"));
    for b in report["benchmarks"].as_array().unwrap() {
        assert_eq!(b["labelled"], PER_MODEL, "{b}");
        assert_eq!(b["completed"], PER_MODEL, "{b}");
        assert_eq!(b["dead_letters"], 0, "{b}");
    }
    assert_eq!(report["jobs"]["done"], 2 * PER_MODEL, "{report}");
    assert_eq!(report["jobs"]["dead_letters"], 0, "{report}");
    assert_eq!(report["dead_letters"].as_array().map(Vec::len), Some(0), "{report}");
    assert_eq!(report["intake"]["refused_results"], 2 * PER_MODEL, "{report}");
    assert_eq!(report["intake"]["held_unplanned"], RANDOM, "{report}");
    let status = read_json(&out.join("forged/status.json"));
    assert_eq!(status["refused_results"], 2 * PER_MODEL, "{status}");
    assert_eq!(status["held_results"], RANDOM, "{status}");
    let md = std::fs::read_to_string(out.join("forged/report.md")).unwrap();
    assert!(md.contains("## Refused"), "{md}");
}

/// A results stream created before Halyard (anyone who may create streams on a shared
/// broker can) with Halyard's subjects and a republish to `leak.>` is refused by the
/// coordinator and by a worker at start, naming the stream and the republish; before,
/// the run completed and every result was copied to `leak.>`.
#[test]
fn a_results_stream_created_before_halyard_with_a_republish_is_refused() {
    use async_nats::jetstream::stream;
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let sweep = noop_sweep(dir.path(), "hostile", 10);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let broker =
        rt.block_on(halyard_broker::connect(&BrokerConfig::new(nats.url(), "hostile"))).unwrap();
    rt.block_on(async {
        broker
            .js
            .create_stream(stream::Config {
                name: subjects::RESULTS_STREAM.into(),
                subjects: vec![format!("{}.>", subjects::RESULTS_PREFIX)],
                retention: stream::RetentionPolicy::WorkQueue,
                republish: Some(stream::Republish {
                    source: ">".into(),
                    destination: "leak.>".into(),
                    headers_only: false,
                }),
                ..Default::default()
            })
            .await
            .unwrap();
    });
    let out = dir.path().join("runs");
    for role in ["coordinator", "worker"] {
        let mut c = halyard();
        if role == "coordinator" {
            c.args(["coordinator", sweep.to_str().unwrap()]).arg("--out").arg(&out);
        } else {
            c.args(["worker", "--sweep", sweep.to_str().unwrap()])
                .arg("--state")
                .arg(dir.path().join("checkpoint"));
        }
        let log = dir.path().join(format!("{role}.log"));
        c.args(["--metrics", "off", "--nats", &nats.url()])
            .stderr(std::fs::File::create(&log).unwrap());
        let mut child = ChildGuard::spawn(c);
        let exit = child.wait_timeout(Duration::from_secs(60)).expect("did not stop");
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(!exit.success(), "{role} ran on a republishing stream:\n{log}");
        assert!(
            log.contains("stream HALYARD_RESULTS exists with a configuration Halyard will not use")
                && log.contains("republishes > to leak.>"),
            "{role}:\n{log}"
        );
    }
}

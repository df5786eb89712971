//! Issue 33: the coordinator's intake is bounded by bytes. Junk published to a run's
//! results subject while its coordinator is down (1,000 messages of about 1 MiB, what
//! anyone with publish rights on an open broker can send) is refused, counted and acked
//! by the restarted coordinator in bounded memory, and the run completes exact.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::message::PublishMessage;
use common::*;
use halyard_broker::BrokerConfig;
use halyard_proto::subjects;
use halyard_tests::{ChildGuard, NatsServer};

const JOBS: u64 = 200;
const JUNK: usize = 1000;

/// The peak resident memory (`VmHWM`) of process `pid`, in bytes.
fn peak_rss(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
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
    let t = std::time::Instant::now();
    let run = loop {
        if let Some(r) = std::fs::read_to_string(&status)
            .ok()
            .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
            .and_then(|v| v["run"].as_str().map(str::to_string))
        {
            break r;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "no run id in {}", status.display());
        std::thread::sleep(Duration::from_millis(50));
    };
    first.signal(libc::SIGTERM);
    first.wait_timeout(Duration::from_secs(30)).expect("coordinator did not stop");

    // The flood, while no coordinator runs.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let broker =
        rt.block_on(halyard_broker::connect(&BrokerConfig::new(nats.url(), "flood"))).unwrap();
    let run = uuid::Uuid::parse_str(&run).unwrap();
    let junk = vec![0xc1u8; broker.payload_limit()];
    rt.block_on(async {
        for i in 0..JUNK {
            let m = PublishMessage::build()
                .payload(junk.clone().into())
                .message_id(format!("junk-{i}"));
            broker.js.send_publish(subjects::result_subject(run), m).await.unwrap().await.unwrap();
        }
    });

    // The restarted coordinator, watched for its peak memory, and a worker.
    let mut second = coordinator();
    let pid = second.pid();
    let (peak, done) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
    let watcher = {
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
    let mut w = halyard();
    w.args(["worker", "--sweep", sweep.to_str().unwrap(), "--nats", &nats.url()])
        .args(["--metrics", "off"])
        .arg("--state")
        .arg(dir.path().join("checkpoint"))
        .stderr(std::fs::File::create(dir.path().join("worker.log")).unwrap());
    let mut worker = ChildGuard::spawn(w);
    let exit = second.wait_timeout(Duration::from_secs(180)).expect("run did not finish");
    done.store(true, Ordering::Relaxed);
    watcher.join().unwrap();
    worker.signal(libc::SIGTERM);
    worker.wait_timeout(Duration::from_secs(30)).expect("worker did not stop");
    let log = std::fs::read_to_string(dir.path().join("coordinator.log")).unwrap_or_default();
    assert!(exit.success(), "coordinator: {exit:?}\n{log}");

    let peak = peak.load(Ordering::Relaxed);
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

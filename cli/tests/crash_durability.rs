//! Crash tests of the worker's durability order, with batching on (group commit in the checkpoint,
//! pipelined result publishes, acks written without a round trip each).
//!
//! Each test runs the `halyard` binary against a real nats-server on a `noop` sweep:
//! 1. `halyard coordinator` plans and publishes every job, then stops (SIGTERM), so that
//!    nothing consumes results while the worker crashes;
//! 2. `halyard worker` with `HALYARD_FAILPOINT=<point>:<n>` aborts (SIGABRT, no cleanup)
//!    the n-th time it passes `<point>`, in the middle of the run;
//! 3. the broker's streams and the dead worker's checkpoint are read back, and the
//!    order is checked: every acked job has its result in the checkpoint and in the
//!    results stream, and every published result is in the checkpoint;
//! 4. a new worker on the same checkpoint and the coordinator again finish the run: every
//!    job counted exactly once, none lost, no stall re-publication needed, and results
//!    that were flushed but not published come from the checkpoint, not a new call.

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{halyard, read_json};
use halyard_broker::BrokerConfig;
use halyard_plan::benchmarks::noop::Noop;
use halyard_plan::sweep;
use halyard_proto::{subjects, Job, JobId, JobResult};
use halyard_tests::{ChildGuard, NatsServer};

const JOBS: u64 = 300;
const CONCURRENCY: usize = 16;
/// The failpoint trips on this pass: well inside the run.
const TRIP_AT: u64 = 60;

fn write_sweep(dir: &Path, job_batch: usize) -> std::path::PathBuf {
    // A window larger than the run: the first coordinator publishes every job at once.
    let text = format!(
        "name = \"crash\"\n\n[[model]]\nname = \"free\"\nbackend = \"noop\"\nmax_concurrency = {CONCURRENCY}\n\n\
         [[benchmark]]\npipeline = \"noop\"\njobs = {JOBS}\nmodels = [\"free\"]\n\n\
         [run]\nwindow = 1000\nack_wait_s = 2\nmax_deliver = 5\njob_batch = {job_batch}\n"
    );
    let p = dir.join("crash.toml");
    std::fs::write(&p, text).unwrap();
    p
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// Every message still stored in `stream`, decoded with `decode`.
async fn stored<T>(
    broker: &halyard_broker::Broker,
    stream: &str,
    decode: impl Fn(&[u8]) -> T,
) -> Vec<T> {
    let mut s = broker.js.get_stream(stream).await.unwrap();
    let state = s.info().await.unwrap().state.clone();
    let mut out = Vec::new();
    if state.messages == 0 {
        return out;
    }
    for seq in state.first_sequence..=state.last_sequence {
        // A gap is a message removed by its ack (work-queue retention).
        if let Ok(m) = s.get_raw_message(seq).await {
            out.push(decode(&m.payload));
        }
    }
    out
}

/// Waits until the jobs stream holds `n` jobs (in messages of one or of several).
async fn wait_jobs_stored(broker: &halyard_broker::Broker, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if broker.js.get_stream(subjects::JOBS_STREAM).await.is_ok() {
            let jobs = stored(broker, subjects::JOBS_STREAM, |b| {
                halyard_proto::decode_jobs(b).unwrap().len() as u64
            })
            .await;
            if jobs.iter().sum::<u64>() >= n {
                return;
            }
        }
        assert!(Instant::now() < deadline, "the jobs stream never held {n} jobs");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn coordinator(sweep: &Path, url: &str, out: &Path, log: &Path) -> ChildGuard {
    let mut c = halyard();
    c.args(["coordinator", sweep.to_str().unwrap(), "--nats", url, "--out", out.to_str().unwrap()]);
    c.stderr(std::fs::File::create(log).unwrap());
    ChildGuard::spawn(c)
}

fn worker(sweep: &Path, url: &str, state: &Path, failpoint: Option<String>) -> ChildGuard {
    let mut c: Command = halyard();
    c.args([
        "worker",
        "--nats",
        url,
        "--sweep",
        sweep.to_str().unwrap(),
        "--state",
        state.to_str().unwrap(),
    ]);
    match failpoint {
        Some(f) => c.env("HALYARD_FAILPOINT", f),
        None => c.env_remove("HALYARD_FAILPOINT"),
    };
    c.stdout(std::process::Stdio::null());
    ChildGuard::spawn(c)
}

/// What the streams and the checkpoint hold right after the crash.
struct AtCrash {
    acked: HashSet<JobId>,
    published: HashSet<JobId>,
    checkpointed: HashSet<JobId>,
}

/// Jobs per job message in `crash_and_recover(.., JOB_BATCH)`: the message is acked only
/// when all its jobs are durable and published.
const JOB_BATCH: usize = 8;

fn crash_and_recover(point: &str, job_batch: usize) -> AtCrash {
    let nats = NatsServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let sweep_path = write_sweep(dir.path(), job_batch);
    let out = dir.path().join("runs");
    let checkpoint = dir.path().join("checkpoint");
    let rt = rt();
    let broker = rt
        .block_on(halyard_broker::connect(&BrokerConfig::new(url.clone(), "crash-test")))
        .unwrap();
    let sweep = sweep::load(&sweep_path).unwrap();
    let noop = sweep.benchmarks[0].get::<Noop>().expect("noop sweep");
    let all: HashSet<JobId> = (0..JOBS).map(|i| noop.config[0].request(i).id()).collect();

    // 1. Plan and publish everything, then stop the coordinator.
    let mut coord = coordinator(&sweep_path, &url, &out, &dir.path().join("coordinator-1.log"));
    rt.block_on(wait_jobs_stored(&broker, JOBS));
    coord.signal(libc::SIGTERM);
    let status = coord.wait_timeout(Duration::from_secs(30)).expect("coordinator did not stop");
    assert_eq!(status.code(), Some(130), "an interrupted coordinator exits 130");

    // 2. The armed worker crashes mid-run.
    let mut a = worker(&sweep_path, &url, &checkpoint, Some(format!("{point}:{TRIP_AT}")));
    let status =
        a.wait_timeout(Duration::from_secs(60)).expect("worker never reached the failpoint");
    assert!(
        ChildGuard::killed_by(status, libc::SIGABRT),
        "{point}: worker ended with {status:?}, not at the failpoint"
    );
    // Let the broker finish reading what the dead worker's socket had already sent.
    std::thread::sleep(Duration::from_millis(300));

    // 3. The durability order, read back from the broker and the dead worker's checkpoint.
    let messages = rt.block_on(stored(&broker, subjects::JOBS_STREAM, |b| {
        halyard_proto::decode_jobs(b).unwrap()
    }));
    if job_batch > 1 {
        assert!(messages.iter().any(|m| m.len() > 1), "{point}: no job message held several jobs");
    }
    let queued: HashSet<JobId> = messages.into_iter().flatten().map(|j: Job| j.id).collect();
    // A worker publishes the results of one group commit as one message.
    let results: Vec<JobResult> = rt
        .block_on(stored(&broker, subjects::RESULTS_STREAM, |b| {
            halyard_proto::decode_results(b).unwrap()
        }))
        .into_iter()
        .flatten()
        .collect();
    let published: HashSet<JobId> = results.iter().map(|r| r.job).collect();
    assert_eq!(
        published.len(),
        results.len(),
        "{point}: a result was stored twice in the results stream"
    );
    let checkpointed: HashSet<JobId> = rt.block_on(async {
        let cp = halyard_worker::Checkpoint::open(&checkpoint)
            .expect("the dead worker's checkpoint opens");
        let ids = all.iter().filter(|id| cp.get(id).unwrap().is_some()).copied().collect();
        cp.close().await;
        ids
    });
    let acked: HashSet<JobId> = all.difference(&queued).copied().collect();
    assert!(!queued.is_empty(), "{point}: the crash came after the run, not in it");
    assert!(
        acked.is_subset(&checkpointed),
        "{point}: acked jobs missing from the checkpoint: {:?}",
        acked.difference(&checkpointed)
    );
    assert!(
        acked.is_subset(&published),
        "{point}: acked jobs without a published result: {:?}",
        acked.difference(&published)
    );
    assert!(
        published.is_subset(&checkpointed),
        "{point}: results published before being flushed: {:?}",
        published.difference(&checkpointed)
    );

    // 4. Recovery: a fresh worker on the same checkpoint, and the coordinator again.
    let mut b = worker(&sweep_path, &url, &checkpoint, None);
    let log = dir.path().join("coordinator-2.log");
    let mut coord = coordinator(&sweep_path, &url, &out, &log);
    let status =
        coord.wait_timeout(Duration::from_secs(120)).expect("the resumed run did not finish");
    assert!(
        status.success(),
        "{point}: resumed coordinator failed: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    b.signal(libc::SIGTERM);
    b.wait_timeout(Duration::from_secs(30)).expect("worker did not stop");

    let report = read_json(&out.join("crash/report.json"));
    let bench = &report["benchmarks"][0];
    for (key, want) in [
        ("items", JOBS),
        ("labelled", JOBS),
        ("completed", JOBS),
        ("dead_letters", 0),
        ("ignored", 0),
    ] {
        assert_eq!(bench[key].as_u64(), Some(want), "{point}: benchmark {key} in {bench}");
    }
    let jobs = &report["jobs"];
    assert_eq!(jobs["done"].as_u64(), Some(JOBS), "{point}: jobs {jobs}");
    assert_eq!(jobs["completed"].as_u64(), Some(JOBS), "{point}: jobs {jobs}");
    // Flushed but unpublished results are answered from the checkpoint (published ones
    // were recorded from the dead worker's own publish).
    let replayed = checkpointed.difference(&published).count() as u64;
    assert_eq!(jobs["cache_hits"].as_u64(), Some(replayed), "{point}: jobs {jobs}");
    let labels = std::fs::read_to_string(out.join("crash/labels.jsonl")).unwrap();
    let items: HashSet<u64> = labels
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["item"].as_u64().unwrap())
        .collect();
    assert_eq!(
        (labels.lines().count(), items.len()),
        (JOBS as usize, JOBS as usize),
        "{point}: labels"
    );
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        !log.contains("publishing them again"),
        "{point}: recovery needed the stall check:\n{log}"
    );
    AtCrash { acked, published, checkpointed }
}

/// Killed after the model answered, before the checkpoint write: nothing lost, nothing counted twice.
#[test]
fn crash_between_call_and_persist() {
    crash_and_recover("call-persist", 1);
}

/// Killed between the checkpoint commit and the result publish: the committed result is replayed from the checkpoint.
#[test]
fn crash_between_flush_and_publish() {
    let c = crash_and_recover("flush-publish", 1);
    assert!(
        !c.checkpointed.is_subset(&c.published),
        "the tripping job was flushed and not published"
    );
}

/// Killed between handing the result publish to the client and its broker ack (publish → flush of the connection).
#[test]
fn crash_between_publish_and_confirm() {
    crash_and_recover("publish-confirm", 1);
}

/// Killed between the broker's ack of the result and the job's ack (flush → ack).
#[test]
fn crash_between_confirm_and_ack() {
    let c = crash_and_recover("confirm-ack", 1);
    assert!(!c.published.is_subset(&c.acked), "the tripping job was published and not acked");
}

/// Killed after the job's ack was handed to the client, before the connection was flushed.
#[test]
fn crash_between_ack_and_flush() {
    crash_and_recover("ack-flush", 1);
}

/// With job batches (`[run] job_batch`): killed between the checkpoint commit and the result
/// publish, and between the result's broker ack and the message's ack. A message is acked
/// only once every job in it is durable and published; the rest come back, and the
/// checkpoint answers the jobs it holds.
#[test]
fn job_batches_crash_between_flush_and_publish() {
    let c = crash_and_recover("flush-publish", JOB_BATCH);
    assert!(
        !c.checkpointed.is_subset(&c.published),
        "the tripping job was flushed and not published"
    );
}

#[test]
fn job_batches_crash_between_confirm_and_ack() {
    let c = crash_and_recover("confirm-ack", JOB_BATCH);
    assert!(!c.published.is_subset(&c.acked), "the tripping job was published and not acked");
}

/// A job message that no worker survives: after `max_deliver` deliveries the broker's
/// advisory makes the coordinator record each of its jobs as a dead letter, and the run
/// completes instead of waiting for them. With `job_batch`, that is every job of the batch.
#[test]
fn job_batch_that_kills_every_worker_becomes_dead_letters() {
    const N: u64 = 4;
    let nats = NatsServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "name = \"poison\"\n\n[[model]]\nname = \"free\"\nbackend = \"noop\"\nmax_concurrency = 8\n\n\
         [[benchmark]]\npipeline = \"noop\"\njobs = {N}\nmodels = [\"free\"]\n\n\
         [run]\nack_wait_s = 1\nmax_deliver = 2\njob_batch = {N}\n"
    );
    let sweep_path = dir.path().join("poison.toml");
    std::fs::write(&sweep_path, text).unwrap();
    let out = dir.path().join("runs");
    let rt = rt();
    let broker = rt
        .block_on(halyard_broker::connect(&BrokerConfig::new(url.clone(), "poison-test")))
        .unwrap();
    let log = dir.path().join("coordinator.log");
    let mut coord = coordinator(&sweep_path, &url, &out, &log);
    rt.block_on(wait_jobs_stored(&broker, N));
    let messages = rt.block_on(stored(&broker, subjects::JOBS_STREAM, |b| {
        halyard_proto::decode_jobs(b).unwrap().len()
    }));
    assert_eq!(messages, vec![N as usize], "the {N} jobs travel as one message");
    // Each delivery kills its worker at the first job's call.
    for i in 0..2 {
        let mut w = worker(
            &sweep_path,
            &url,
            &dir.path().join(format!("checkpoint-{i}")),
            Some("call-persist:1".into()),
        );
        let status =
            w.wait_timeout(Duration::from_secs(60)).expect("the worker never got the job message");
        assert!(
            ChildGuard::killed_by(status, libc::SIGABRT),
            "delivery {i}: worker ended with {status:?}"
        );
    }
    // A healthy worker asks for work: the broker, finding the message past max_deliver,
    // sends the advisory instead of a third delivery.
    let mut healthy = worker(&sweep_path, &url, &dir.path().join("checkpoint-2"), None);
    let status =
        coord.wait_timeout(Duration::from_secs(60)).expect("the run waited on the dead jobs");
    healthy.signal(libc::SIGTERM);
    healthy.wait_timeout(Duration::from_secs(30)).expect("worker did not stop");
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    // Complete, with dead letters: the distinct exit status, and the last line says how
    // many and how to run them again.
    assert_eq!(status.code(), Some(4), "coordinator: {log}");
    assert!(
        log.contains(&format!("{N} dead letters remain")) && log.contains("halyard retry-failed"),
        "{log}"
    );
    let report = read_json(&out.join("poison/report.json"));
    let jobs = &report["jobs"];
    assert_eq!(
        (jobs["done"].as_u64(), jobs["dead_letters"].as_u64(), jobs["completed"].as_u64()),
        (Some(N), Some(N), Some(0)),
        "{jobs}"
    );
    let text = std::fs::read_to_string(out.join("poison/report.md")).unwrap();
    assert!(text.contains("max_deliver reached"), "the report does not say why:\n{text}");
}

/// The coordinator killed in the middle of a commit (issue 13): its store effects of one
/// step (results, labels, cost totals) are one atomic update. The failpoint aborts after
/// half of a commit's writes; written one by one (and made durable in the background, as
/// sled did), the results of that batch would be stored without the cost totals counting
/// them, and their redelivery would be taken for duplicates: results the cost and call
/// totals never count. Resumed, the run counts
/// every result exactly once in both, each against its model and stage.
#[test]
fn coordinator_crash_in_the_middle_of_a_commit_loses_no_count() {
    let nats = NatsServer::start();
    let url = nats.url();
    let dir = tempfile::tempdir().unwrap();
    let sweep_path = write_sweep(dir.path(), 1);
    let out = dir.path().join("runs");
    let mut w = worker(&sweep_path, &url, &dir.path().join("checkpoint"), None);
    let log1 = dir.path().join("coordinator-1.log");
    let mut c = halyard();
    c.args(["coordinator", sweep_path.to_str().unwrap(), "--nats", &url])
        .args(["--out", out.to_str().unwrap()])
        .env("HALYARD_COORDINATOR_FAILPOINT", "mid-commit:4")
        .stderr(std::fs::File::create(&log1).unwrap());
    let mut coord = ChildGuard::spawn(c);
    let status = coord
        .wait_timeout(Duration::from_secs(60))
        .expect("coordinator never reached the failpoint");
    let log = std::fs::read_to_string(&log1).unwrap_or_default();
    assert!(ChildGuard::killed_by(status, libc::SIGABRT), "ended with {status:?}:\n{log}");
    assert!(log.contains("aborting in the middle of a commit"), "{log}");

    let log2 = dir.path().join("coordinator-2.log");
    let mut coord = coordinator(&sweep_path, &url, &out, &log2);
    let status =
        coord.wait_timeout(Duration::from_secs(120)).expect("the resumed run did not finish");
    assert!(status.success(), "{}", std::fs::read_to_string(&log2).unwrap_or_default());
    w.signal(libc::SIGTERM);
    w.wait_timeout(Duration::from_secs(30)).expect("worker did not stop");

    let report = read_json(&out.join("crash/report.json"));
    assert_eq!(report["jobs"]["completed"].as_u64(), Some(JOBS), "{}", report["jobs"]);
    let counted: u64 = report["costs"]["by_model"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["jobs"].as_u64().unwrap())
        .sum();
    assert_eq!(counted, JOBS, "cost totals count {counted} of {JOBS} results: {}", report["costs"]);
    // The results that arrived while no coordinator ran are counted against their model
    // (the window is planned before they are read), not as "(unattributed)".
    for c in report["costs"]["by_model_stage"].as_array().unwrap() {
        assert_eq!((c["model"].as_str(), c["stage"].as_str()), (Some("free"), Some("noop")), "{c}");
    }
    let labels = std::fs::read_to_string(out.join("crash/labels.jsonl")).unwrap();
    assert_eq!(labels.lines().count() as u64, JOBS);
}

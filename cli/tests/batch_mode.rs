//! Batch mode (`mode = "batch"`): HypoTermQA through the fake provider's batch API
//! (real HTTP: files, batches, output and error files), with the embedded broker.
//!
//! - The 1,080-question set gives the same report in batch mode as online, with no
//!   online call, every request run once inside a batch, and costs at the batch price.
//! - A kill -9 (failpoint abort of the one `halyard run` process: worker and coordinator
//!   alike) after the upload, after the create, while polling and after the download
//!   costs no second submission of any request and loses nothing.
//! - Per-request errors follow the usual rules; an expired batch re-queues only its
//!   unanswered requests; `halyard status` shows batches while they run.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;
use halyard_tests::fake_openai::BatchScript;
use halyard_tests::{FakeOpenAi, Gate, Reply};
use serde_json::Value;

/// The public 1,080-question set (tests may read `../shared`; the product does not).
fn full_set() -> PathBuf {
    repo_root().join("../shared/data/hypotermqa/HypoTermQA_1080.jsonl")
}

/// A HypoTermQA sweep over `dataset` against `base_url`; `batch` gives `(batch_size,
/// batch_wait_s, extra keys)` for batch mode. Job ids do not depend on the mode, so the
/// two modes' runs ask the same questions with the same ids.
fn sweep(
    dir: &Path,
    name: &str,
    base_url: &str,
    dataset: &Path,
    limit: usize,
    batch: Option<(u32, f64, &str)>,
) -> PathBuf {
    let mode = match batch {
        None => "max_concurrency = 16".to_string(),
        Some((size, wait, extra)) => {
            format!("mode = \"batch\"\nbatch_size = {size}\nbatch_wait_s = {wait}\n{extra}")
        }
    };
    let text = format!(
        r#"name = "{name}"

[[model]]
name = "model-a"
backend = "openai"
base_url = "{base_url}"
model = "fake-model"
pool = "fake-key"
max_tokens = 256
price = {{ input = 2.0, output = 8.0 }}
{mode}

[[model]]
name = "judge-a"
backend = "openai"
base_url = "{base_url}"
model = "fake-judge"
pool = "fake-key"
price = {{ input = 2.0, output = 8.0 }}
{mode}

[[benchmark]]
pipeline = "hypotermqa"
dataset = "{dataset}"
models = ["model-a"]
judge = "judge-a"
semantics = "paper"
limit = {limit}

[run]
ack_wait_s = 3
max_deliver = 3
"#,
        dataset = dataset.display()
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).expect("write sweep");
    path
}

/// `halyard` with batch timings fit for a test (polls every 100 ms, leases of 2 s).
fn halyard_batch() -> Command {
    let mut c = halyard();
    c.env("HALYARD_BATCH_POLL_MS", "100").env("HALYARD_BATCH_LEASE_MS", "2000");
    c
}

/// Run to completion (exit 0), or panic with the output.
fn run_batch(sweep: &Path, out: &Path, env: &[(&str, &str)]) -> std::process::Output {
    let mut c = halyard_batch();
    c.args(["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().expect("run halyard");
    assert!(
        o.status.success(),
        "halyard run failed: {:?}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// Every request the fake ran in a batch, by custom_id: none may have run twice.
fn assert_each_request_ran_once(fake: &FakeOpenAi) -> usize {
    let reqs = fake.batch_requests();
    let mut seen = HashSet::new();
    let twice: Vec<&str> = reqs
        .iter()
        .filter(|r| !seen.insert(r.custom_id.clone()))
        .map(|r| r.custom_id.as_str())
        .collect();
    assert!(
        twice.is_empty(),
        "{} requests were submitted twice: {:?}",
        twice.len(),
        &twice[..twice.len().min(5)]
    );
    // No two batches of the same input file (a second create after a crash).
    let batches = fake.batches();
    let mut files = HashSet::new();
    for b in &batches {
        let f = b["input_file_id"].as_str().unwrap_or_default().to_string();
        assert!(files.insert(f.clone()), "input file {f} was made into two batches");
    }
    reqs.len()
}

fn costs_total(report: &Value) -> f64 {
    report["costs"]["total"]
        .as_f64()
        .unwrap_or_else(|| panic!("costs.total in {}", report["costs"]))
}

/// Issue 15: the 1,080 questions in batch mode give the report of the online run, with
/// no online call, each request run once in a batch, and half the cost.
#[test]
fn batch_mode_gives_the_online_report_at_half_the_cost() {
    let qs = load_questions_from(&full_set(), 1080);
    assert_eq!(qs.len(), 1080);
    let fake = FakeOpenAi::start_blocking(responder(question_index(&qs), None));
    let dir = tempfile::tempdir().unwrap();
    let online = sweep(dir.path(), "hq", &fake.base_url(), &full_set(), 1080, None);
    let out_online = dir.path().join("online");
    let t = Instant::now();
    run_to_end(&["run", online.to_str().unwrap(), "--out", out_online.to_str().unwrap()]);
    let online_s = t.elapsed().as_secs_f64();
    let online_calls = fake.call_count();
    assert!(fake.batch_requests().is_empty());

    let batch = sweep(dir.path(), "hq", &fake.base_url(), &full_set(), 1080, Some((2000, 0.5, "")));
    // The same run name in another output directory: its own broker and checkpoint.
    let out_batch = dir.path().join("batch");
    let t = Instant::now();
    run_batch(&batch, &out_batch, &[]);
    let batch_s = t.elapsed().as_secs_f64();
    assert_eq!(fake.call_count(), online_calls, "batch mode made online calls");
    let ran = assert_each_request_ran_once(&fake);
    assert_eq!(ran, online_calls, "batch requests vs online calls");
    let batches = fake.batches();
    assert!(batches.iter().all(|b| b["status"] == "completed"), "{batches:?}");

    let a = read_json(&out_online.join("hq/report.json"));
    let b = read_json(&out_batch.join("hq/report.json"));
    assert_eq!(a["benchmarks"], b["benchmarks"], "batch report differs from online");
    let la = std::fs::read_to_string(out_online.join("hq/labels.jsonl")).unwrap();
    let lb = std::fs::read_to_string(out_batch.join("hq/labels.jsonl")).unwrap();
    assert_eq!(la, lb, "labels differ");
    assert_eq!(b["jobs"]["dead_letters"], 0);
    let (ca, cb) = (costs_total(&a), costs_total(&b));
    assert!(ca > 0.0 && (cb - ca / 2.0).abs() < 1e-9 * ca.max(1.0), "online ${ca}, batch ${cb}");
    eprintln!(
        "1,080 questions: online {online_calls} calls in {online_s:.1} s (${ca:.4}); batch {ran} requests in {} batches in {batch_s:.1} s (${cb:.4})",
        batches.len()
    );
}

/// One crash scenario: abort at `point`, run again, compare with the online reference.
fn crash_at(point: &str) {
    let qs = load_questions(60);
    let fake = FakeOpenAi::start_blocking(responder(question_index(&qs), None));
    let dir = tempfile::tempdir().unwrap();
    let online = sweep(dir.path(), "c", &fake.base_url(), &dataset(), 60, None);
    let out_ref = dir.path().join("ref");
    run_to_end(&["run", online.to_str().unwrap(), "--out", out_ref.to_str().unwrap()]);
    let online_calls = fake.call_count();

    let batch = sweep(dir.path(), "c", &fake.base_url(), &dataset(), 60, Some((1000, 0.3, "")));
    let out = dir.path().join("batch");
    let o = halyard_batch()
        .args(["run", batch.to_str().unwrap(), "--out", out.to_str().unwrap()])
        .env("HALYARD_FAILPOINT", point)
        .output()
        .expect("run halyard");
    assert!(!o.status.success(), "{point}: the run was to abort");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("HALYARD_FAILPOINT: reached"), "{point}: {stderr}");
    let created_before = fake.batches_created();
    // Nothing outlives the abort (the broker goes with it), then the same command again.
    let needle = out.to_str().unwrap().to_string();
    let gone = Instant::now() + Duration::from_secs(10);
    while !processes_mentioning(&needle).is_empty() {
        assert!(Instant::now() < gone, "processes outlived the abort");
        std::thread::sleep(Duration::from_millis(50));
    }
    run_batch(&batch, &out, &[]);
    assert_eq!(fake.call_count(), online_calls, "{point}: online calls in batch mode");
    let ran = assert_each_request_ran_once(&fake);
    assert_eq!(ran, online_calls, "{point}: requests run vs the online run's calls");
    let a = read_json(&out_ref.join("c/report.json"));
    let b = read_json(&out.join("c/report.json"));
    assert_eq!(a["benchmarks"], b["benchmarks"], "{point}: report differs from online");
    assert_eq!(b["jobs"]["dead_letters"], 0, "{point}");
    eprintln!(
        "{point}: {created_before} batches created before the abort, {} in all, {ran} requests, each once",
        fake.batches_created()
    );
}

/// Killed after uploading the input file, before recording it: the file is orphaned,
/// the jobs are gathered again; nothing ran twice.
#[test]
fn crash_after_upload_submits_nothing_twice() {
    crash_at("batch-uploaded:1");
}

/// Killed after creating the batch, before recording its id: the taker finds the batch by
/// its metadata instead of creating a second one.
#[test]
fn crash_after_create_adopts_the_batch() {
    crash_at("batch-created:1");
}

/// Killed while polling: the taker polls on.
#[test]
fn crash_while_polling_polls_on() {
    crash_at("batch-polling:2");
}

/// Killed after downloading the answers, before checkpointing or publishing any: the next
/// delivery downloads them again (free); nothing is paid twice.
#[test]
fn crash_after_download_loses_nothing() {
    crash_at("batch-downloaded:1");
}

/// Per-request errors follow the usual rules (400 → dead letter; 500 once → answered in a
/// later batch), an expired batch re-queues only its unanswered requests, and `halyard
/// status` shows the batches while the provider holds them.
#[test]
fn errors_expiry_and_status() {
    let qs = load_questions(40);
    let index = question_index(&qs);
    let rules = responder(index.clone(), None);
    // Question 0 is refused (400: permanent); question 1 fails once (500: transient).
    let bad = qs[0].question.clone();
    let flaky = qs[1].question.clone();
    let seen_flaky = std::sync::atomic::AtomicBool::new(false);
    let fake = FakeOpenAi::start_blocking(move |c| {
        let last = c.messages.last().map(|(_, t)| t.as_str()).unwrap_or("");
        if last == bad {
            return Reply::Status {
                code: 400,
                body: "{\"error\":{\"message\":\"bad\"}}".into(),
                retry_after: None,
            };
        }
        if last == flaky && !seen_flaky.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Reply::Status {
                code: 500,
                body: "{\"error\":{\"message\":\"oops\"}}".into(),
                retry_after: None,
            };
        }
        rules(c)
    });
    // The first batch expires after 10 requests; it is held until the test has seen it
    // in `halyard status`.
    let hold = Gate::new();
    fake.set_batch_script(BatchScript {
        expire_after: Some(10),
        hold: Some(hold.clone()),
        ..BatchScript::default()
    });
    let dir = tempfile::tempdir().unwrap();
    let batch = sweep(dir.path(), "e", &fake.base_url(), &dataset(), 40, Some((1000, 0.3, "")));
    let out = dir.path().join("runs");
    let port = halyard_tests::free_port();
    let mut cmd = halyard_batch();
    cmd.args(["run", batch.to_str().unwrap(), "--out", out.to_str().unwrap()])
        .args(["--metrics", &format!("127.0.0.1:{port}")]);
    let mut child = halyard_tests::ChildGuard::spawn(cmd);
    // `halyard status` on the run directory: the batch shows, submitted, with its age.
    let deadline = Instant::now() + Duration::from_secs(60);
    let shown = loop {
        assert!(Instant::now() < deadline, "no batch shown by halyard status");
        assert!(child.try_wait().is_none(), "halyard exited early");
        let s = halyard().args(["status", out.join("e").to_str().unwrap()]).output().unwrap();
        let text = String::from_utf8_lossy(&s.stdout).to_string();
        if text.contains("provider batches:") && text.contains("submitted") {
            break text;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    assert!(
        shown.contains("fake-key: 1 submitted batch, ") && shown.contains(" requests, oldest "),
        "{shown}"
    );
    // And /metrics, by pool and state, once the coordinator has read the batches again
    // (every 5 s; `halyard status` reads them itself, so it may see the batch first).
    let labels = [("pool", "fake-key"), ("state", "submitted")];
    let deadline = Instant::now() + Duration::from_secs(30);
    let (m, body) = loop {
        let (_, body) = halyard_tests::prometheus::scrape(port).expect("/metrics answers");
        let m = halyard_tests::prometheus::parse(&body)
            .unwrap_or_else(|e| panic!("bad exposition: {e}\n{body}"));
        if m.sum("halyard_provider_batches", &labels) > 0.0 || Instant::now() >= deadline {
            break (m, body);
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(m.sum("halyard_provider_batches", &labels), 1.0, "{body}");
    assert!(m.sum("halyard_provider_batch_requests", &labels) >= 1.0, "{body}");
    assert!(m.sum("halyard_provider_batch_oldest_seconds", &labels) > 0.0, "{body}");
    // Only the first batch expires.
    // Later batches neither expire nor wait (the first keeps the expiry it was created
    // with); release the first.
    fake.set_batch_script(BatchScript::default());
    hold.open();
    let status = child.wait_timeout(Duration::from_secs(120)).expect("run ends");
    // One dead letter (the refused question): exit 4.
    assert_eq!(status.code(), Some(EXIT_DEAD_LETTERS), "exit status");
    let report = read_json(&out.join("e/report.json"));
    assert_eq!(report["jobs"]["dead_letters"], 1, "{}", report["jobs"]);
    let reqs = fake.batch_requests();
    let by_id: HashMap<&str, usize> = reqs.iter().fold(HashMap::new(), |mut m, r| {
        *m.entry(r.custom_id.as_str()).or_default() += 1;
        m
    });
    // The flaky request ran twice (500, then answered in a later batch); every other ran
    // once, the expired ones included (they did not run in the expired batch).
    let twice: Vec<_> = by_id.iter().filter(|(_, n)| **n > 1).collect();
    assert_eq!(twice.len(), 1, "{twice:?}");
    let batches = fake.batches();
    assert_eq!(batches[0]["status"], "expired", "{}", batches[0]);
    assert!(batches[1..].iter().all(|b| b["status"] == "completed"), "{batches:?}");
    let labels = std::fs::read_to_string(out.join("e/labels.jsonl")).unwrap();
    assert_eq!(labels.lines().count(), 40);
}

/// A `halyard worker` of the sweep's pools, its log in `log`.
fn worker(
    sweep: &Path,
    url: &str,
    id: &str,
    state: &Path,
    log: &Path,
) -> halyard_tests::ChildGuard {
    let mut c = halyard_batch();
    c.args(["worker", "--nats", url, "--sweep", sweep.to_str().unwrap(), "--id", id])
        .arg("--state")
        .arg(state)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).expect("worker log"));
    halyard_tests::ChildGuard::spawn(c)
}

fn coordinator(sweep: &Path, url: &str, out: &Path, log: &Path) -> halyard_tests::ChildGuard {
    let mut c = halyard_batch();
    c.args(["coordinator", sweep.to_str().unwrap(), "--nats", url, "--out", out.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).expect("coordinator log"));
    halyard_tests::ChildGuard::spawn(c)
}

/// Estimated tokens of the batches the fake provider holds and has not ended, from their
/// records (a live batch without a record would be a batch nobody accounted for).
fn enqueued_tokens(
    fake: &FakeOpenAi,
    rt: &tokio::runtime::Runtime,
    broker: &halyard_broker::Broker,
) -> u64 {
    let done = ["completed", "expired", "failed", "cancelled"];
    let live: Vec<String> = fake
        .batches()
        .iter()
        .filter(|b| !done.contains(&b["status"].as_str().unwrap_or("")))
        .map(|b| b["metadata"]["halyard_record"].as_str().unwrap_or("?").to_string())
        .collect();
    if live.is_empty() {
        return 0;
    }
    // Records are written before their batch is created; a reading that misses one
    // (the bucket read gives up after 3 s on a loaded machine) is taken again.
    for _ in 0..10 {
        let records = rt.block_on(halyard_broker::batches::records(broker));
        let tokens: Option<Vec<u64>> = live
            .iter()
            .map(|key| records.iter().find(|r| r.key() == *key).map(|r| r.tokens))
            .collect();
        if let Some(t) = tokens {
            return t.iter().sum();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("live batches without a record: {live:?}")
}

/// Provider batches not over yet, as the fake sees them.
fn live_batches(fake: &FakeOpenAi) -> usize {
    let done = ["completed", "expired", "failed", "cancelled"];
    fake.batches().iter().filter(|b| !done.contains(&b["status"].as_str().unwrap_or(""))).count()
}

/// Issue 15 across processes: two workers of one batch pool never have more enqueued than
/// `batch_queue_tokens` allows together (the estimated tokens of the batches the provider
/// holds, sampled while the run goes); kill -9 of the worker
/// that owns the batch at the provider, and of the coordinator, while the batch runs:
/// the other worker takes the batch over, a new coordinator resumes, the report equals
/// the online run's and no request ran twice.
#[test]
fn two_workers_share_the_queue_and_take_over_a_dead_owners_batch() {
    let qs = load_questions(60);
    let fake = FakeOpenAi::start_blocking(responder(question_index(&qs), None));
    let dir = tempfile::tempdir().unwrap();
    let online = sweep(dir.path(), "d", &fake.base_url(), &dataset(), 60, None);
    let out_ref = dir.path().join("ref");
    run_to_end(&["run", online.to_str().unwrap(), "--out", out_ref.to_str().unwrap()]);
    let online_calls = fake.call_count();

    // About 290 estimated tokens per answer request (prompt plus max_tokens 256), more
    // per judge request: 25 answers take most of the 8,000 tokens.
    let batch = sweep(
        dir.path(),
        "d",
        &fake.base_url(),
        &dataset(),
        60,
        Some((25, 0.3, "batch_queue_tokens = 8000")),
    );
    let hold = Gate::new();
    fake.set_batch_script(BatchScript { hold: Some(hold.clone()), ..BatchScript::default() });
    let nats = halyard_tests::NatsServer::start();
    let url = nats.url();
    let out = dir.path().join("runs");
    let logs = dir.path();
    let mut coord = coordinator(&batch, &url, &out, &logs.join("coordinator.log"));
    let mut a = worker(&batch, &url, "worker-a", &dir.path().join("wa"), &logs.join("a.log"));
    let mut b = worker(&batch, &url, "worker-b", &dir.path().join("wb"), &logs.join("b.log"));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let broker = rt
        .block_on(halyard_broker::connect(&halyard_broker::BrokerConfig::new(url.clone(), "test")))
        .unwrap();
    // The first batch reaches the provider and is held there; find its owner.
    let deadline = Instant::now() + Duration::from_secs(60);
    let owner = loop {
        assert!(Instant::now() < deadline, "no batch submitted");
        let records = rt.block_on(halyard_broker::batches::records(&broker));
        let submitted = records.iter().find(|r| r.state.name() == "submitted");
        if let (Some(r), true) = (submitted, live_batches(&fake) == 1) {
            break r.owner.clone();
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // The other worker gathers more meanwhile, but cannot enqueue a batch that does not
    // fit beside it.
    std::thread::sleep(Duration::from_secs(2));
    let held = enqueued_tokens(&fake, &rt, &broker);
    assert!(held <= 8000, "{held} tokens enqueued beyond batch_queue_tokens");
    // Kill -9 the owner and the coordinator, release the batch, start a new coordinator.
    let survivor_log = if owner.starts_with("worker-a/") {
        a.kill();
        logs.join("b.log")
    } else {
        assert!(owner.starts_with("worker-b/"), "owner {owner}");
        b.kill();
        logs.join("a.log")
    };
    coord.kill();
    hold.open();
    let mut coord = coordinator(&batch, &url, &out, &logs.join("coordinator2.log"));
    // Track the live batches while the run ends: never more than one.
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut most = 0;
    let status = loop {
        most = most.max(enqueued_tokens(&fake, &rt, &broker));
        if let Some(s) = coord.try_wait() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "run did not finish; survivor log:\n{}",
            std::fs::read_to_string(&survivor_log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        status.success(),
        "coordinator: {status:?}\n{}",
        std::fs::read_to_string(logs.join("coordinator2.log")).unwrap_or_default()
    );
    assert!(most <= 8000, "{most} tokens were enqueued at the provider at once (limit 8000)");
    let survivor = std::fs::read_to_string(&survivor_log).unwrap();
    assert!(
        survivor.contains("took over a batch whose owner is gone"),
        "no takeover in the survivor's log"
    );
    assert_eq!(fake.call_count(), online_calls, "online calls in batch mode");
    let ran = assert_each_request_ran_once(&fake);
    assert_eq!(ran, online_calls);
    let a_rep = read_json(&out_ref.join("d/report.json"));
    let b_rep = read_json(&out.join("d/report.json"));
    assert_eq!(a_rep["benchmarks"], b_rep["benchmarks"], "report differs from the online run's");
    eprintln!(
        "two workers: {} batches, at most {most} tokens enqueued at once (limit 8000), {ran} requests each once",
        fake.batches_created()
    );
}

/// Jobs held by a batch at the provider are not dead letters however often their workers
/// crash (here four kills while polling, with `max_deliver = 3`), not even when the batch
/// then expires and sends most of them back to the queue: the crashes' redeliveries are
/// excused, and the run ends with every answer.
#[test]
fn repeated_crashes_do_not_spend_the_budget_of_jobs_in_a_batch() {
    let qs = load_questions(20);
    let fake = FakeOpenAi::start_blocking(responder(question_index(&qs), None));
    let dir = tempfile::tempdir().unwrap();
    let online = sweep(dir.path(), "r", &fake.base_url(), &dataset(), 20, None);
    let out_ref = dir.path().join("ref");
    run_to_end(&["run", online.to_str().unwrap(), "--out", out_ref.to_str().unwrap()]);
    let online_calls = fake.call_count();
    let batch = sweep(dir.path(), "r", &fake.base_url(), &dataset(), 20, Some((1000, 0.3, "")));
    let out = dir.path().join("batch");
    // The first batch then expires after 5 requests: its other 15 jobs go back to the
    // queue with their budget kept, the four crashes' redeliveries excused.
    fake.set_batch_script(BatchScript { expire_after: Some(5), ..BatchScript::default() });
    for kill in 1..=4 {
        let o = halyard_batch()
            .args(["run", batch.to_str().unwrap(), "--out", out.to_str().unwrap()])
            .env("HALYARD_FAILPOINT", "batch-polling:1")
            .output()
            .expect("run halyard");
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(stderr.contains("HALYARD_FAILPOINT: reached"), "kill {kill}: {stderr}");
    }
    assert_eq!(fake.batches_created(), 1, "the first batch was submitted once");
    fake.set_batch_script(BatchScript::default());
    run_batch(&batch, &out, &[]);
    assert_eq!(fake.batches()[0]["status"], "expired");
    assert_eq!(assert_each_request_ran_once(&fake), online_calls);
    let a = read_json(&out_ref.join("r/report.json"));
    let b = read_json(&out.join("r/report.json"));
    assert_eq!(b["jobs"]["dead_letters"], 0, "{}", b["jobs"]);
    assert_eq!(a["benchmarks"], b["benchmarks"]);
}

/// SIGTERM of a worker that is gathering a batch gives the batch up at once (its jobs go
/// to the next worker, which need not wait for the lease: 10 minutes here), and the run
/// completes with nothing sent twice.
#[test]
fn a_stopping_worker_gives_up_the_batch_it_gathers() {
    let qs = load_questions(20);
    let fake = FakeOpenAi::start_blocking(responder(question_index(&qs), None));
    let dir = tempfile::tempdir().unwrap();
    let batch = sweep(dir.path(), "s", &fake.base_url(), &dataset(), 20, Some((1000, 4.0, "")));
    let nats = halyard_tests::NatsServer::start();
    let url = nats.url();
    let out = dir.path().join("runs");
    let logs = dir.path();
    let spawn_worker = |id: &str| {
        let mut c = halyard_batch();
        c.env("HALYARD_BATCH_LEASE_MS", "600000")
            .args(["worker", "--nats", &url, "--sweep", batch.to_str().unwrap(), "--id", id])
            .arg("--state")
            .arg(dir.path().join(id))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(logs.join(format!("{id}.log"))).unwrap());
        halyard_tests::ChildGuard::spawn(c)
    };
    let mut coord = coordinator(&batch, &url, &out, &logs.join("coordinator.log"));
    let mut a = spawn_worker("worker-a");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let broker = rt
        .block_on(halyard_broker::connect(&halyard_broker::BrokerConfig::new(url.clone(), "test")))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !rt
        .block_on(halyard_broker::batches::records(&broker))
        .iter()
        .any(|r| r.state.name() == "gathering" && r.owner.starts_with("worker-a/"))
    {
        assert!(Instant::now() < deadline, "worker-a never gathered");
        std::thread::sleep(Duration::from_millis(50));
    }
    a.signal(libc::SIGTERM);
    let s = a.wait_timeout(Duration::from_secs(30)).expect("worker-a stops");
    assert!(s.success(), "worker-a: {s:?}");
    let log_a = std::fs::read_to_string(logs.join("worker-a.log")).unwrap();
    assert!(log_a.contains("giving up a batch not yet submitted"), "{log_a}");
    assert_eq!(fake.batches_created(), 0);
    let _b = spawn_worker("worker-b");
    let status = coord.wait_timeout(Duration::from_secs(90)).unwrap_or_else(|| {
        panic!(
            "the run did not finish (waiting for worker-a's lease?); worker-b log:\n{}",
            std::fs::read_to_string(logs.join("worker-b.log")).unwrap_or_default()
        )
    });
    assert!(status.success(), "coordinator: {status:?}");
    assert_each_request_ran_once(&fake);
    assert_eq!(read_json(&out.join("s/report.json"))["jobs"]["dead_letters"], 0);
}

/// The provider down while a batch is out (503s on every batch endpoint, then back): the
/// owner keeps the batch, polls on, and the run ends with each request run once.
#[test]
fn an_outage_while_polling_keeps_the_batch() {
    let qs = load_questions(20);
    let fake = FakeOpenAi::start_blocking(responder(question_index(&qs), None));
    let hold = Gate::new();
    fake.set_batch_script(BatchScript { hold: Some(hold.clone()), ..BatchScript::default() });
    let dir = tempfile::tempdir().unwrap();
    let batch = sweep(dir.path(), "o", &fake.base_url(), &dataset(), 20, Some((1000, 0.3, "")));
    let out = dir.path().join("runs");
    let mut cmd = halyard_batch();
    cmd.args(["run", batch.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let mut child = halyard_tests::ChildGuard::spawn(cmd);
    let deadline = Instant::now() + Duration::from_secs(60);
    while live_batches(&fake) == 0 {
        assert!(Instant::now() < deadline, "no batch submitted");
        std::thread::sleep(Duration::from_millis(20));
    }
    let polls = fake.batch_retrieves();
    fake.go_down(halyard_tests::Outage::Unavailable);
    // The owner keeps polling the unavailable provider (with backoff) instead of giving
    // the batch up.
    let deadline = Instant::now() + Duration::from_secs(3);
    while fake.batch_retrieves() <= polls {
        assert!(Instant::now() < deadline, "the owner stopped polling during the outage");
        std::thread::sleep(Duration::from_millis(20));
    }
    fake.come_back();
    hold.open();
    let status = child.wait_timeout(Duration::from_secs(120)).expect("run ends");
    assert!(status.success(), "{status:?}");
    assert_eq!(fake.batches()[0]["status"], "completed");
    assert_eq!(fake.call_count(), 0);
    assert_each_request_ran_once(&fake);
    assert_eq!(read_json(&out.join("o/report.json"))["jobs"]["dead_letters"], 0);
}

/// Issue 33: a batch output file reporting `prompt_tokens = completion_tokens = 2^64 − 1`
/// is clamped like an online answer: the run completes with the rules' figures and token
/// totals of what the requests could use.
#[test]
fn batch_answers_with_absurd_usage_are_clamped() {
    let qs = load_questions(6);
    let fake = FakeOpenAi::start_blocking(absurd_usage(responder(question_index(&qs), None)));
    let dir = tempfile::tempdir().unwrap();
    let ds = repo_root().join("datasets/hypotermqa/HypoTermQA_180.jsonl");
    let s = sweep(dir.path(), "usage", &fake.base_url(), &ds, 6, Some((100, 0.3, "")));
    let out = dir.path().join("out");
    let o = run_batch(&s, &out, &[]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("clamped"));
    let r = read_json(&out.join("usage/report.json"));
    assert_eq!(r["jobs"]["dead_letters"], 0, "{}", r["jobs"]);
    let calls = fake.batch_requests().len() as u64;
    let prompt = r["jobs"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt > 0 && prompt < calls * 10_000, "{prompt} for {calls} requests");
    let completion = r["jobs"]["completion_tokens"].as_u64().unwrap();
    assert!(completion <= calls * (1 << 20), "{completion}");
}

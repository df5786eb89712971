//! Chaos: a HypoTermQA run against a local fake paid API (whose judge also returns
//! garbage for some terms), with `halyard coordinator` and several `halyard worker`s as
//! separate OS processes, killed with SIGKILL at random moments and restarted; the
//! broker is restarted once (one server) or loses a node (3-node cluster), with a worker
//! killed and started again just before, so that it sets up while the broker goes.
//!
//! Checks at the end: the run completes; the report and labels equal an uninterrupted
//! run's with the same fake (every job terminal, each item counted once, none lost);
//! paid calls beyond that run's are at most the calls that could be in flight at the
//! kills (the fake logs every request); no process panicked.
//!
//! `chaos_small` runs in CI (a few hundred jobs, a few kills, one broker restart).
//! `chaos_large` is the benchmark, run by hand:
//!
//! ```sh
//! cargo test --release -p halyard --test cli chaos::chaos_large -- --ignored --nocapture
//! # knobs: HALYARD_CHAOS_QUESTIONS (default 1440, ~5,000 jobs), HALYARD_CHAOS_KILLS (24),
//! #        HALYARD_CHAOS_WORKERS (3), HALYARD_CHAOS_CLUSTER (1: 3-node cluster, lose a node),
//! #        HALYARD_CHAOS_SEED, HALYARD_CHAOS_DELAY_MS (fake latency per call, 10)
//! ```

use crate::common;

use std::collections::{HashMap, HashSet};
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::{halyard, read_json, responder, run_to_end};
use halyard_tests::{ChildGuard, FakeOpenAi, NatsCluster, NatsServer, Reply};
use serde_json::Value;

/// Calls in flight per pool and worker (two pools: model and judge).
const CONCURRENCY: usize = 4;

struct Config {
    questions: usize,
    workers: usize,
    kills: usize,
    cluster: bool,
    seed: u64,
    delay: Duration,
}

#[derive(Debug, Default)]
struct Figures {
    jobs: u64,
    kills_worker: usize,
    kills_coordinator: usize,
    restarts: usize,
    broker_events: Vec<String>,
    calls_reference: usize,
    calls: usize,
    repeated: i64,
    in_flight_bound: usize,
    in_flight_observed: usize,
    /// Each event (kill, restart, broker), at the paid call count it came at.
    events: Vec<(usize, String)>,
    /// Calls beyond the uninterrupted run's, by the event they came after.
    repeats_after: Vec<(String, usize)>,
    lost: usize,
    double_counted: usize,
    panics: usize,
    dead_letters: u64,
    wall: Duration,
}

/// xorshift64*: reproducible randomness from a printed seed, without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A HypoTermQA dataset of `n` questions: the public 180, repeated with a variant
/// suffix and new ids as needed. Returns its path and question → id.
fn dataset(dir: &Path, n: usize) -> (PathBuf, HashMap<String, i64>) {
    let text = std::fs::read_to_string(common::dataset()).unwrap();
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let mut out = String::new();
    let mut index = HashMap::new();
    for i in 0..n {
        let mut v = lines[i % lines.len()].clone();
        let copy = i / lines.len();
        if copy > 0 {
            let q = format!("{} (variant {copy})", v["question"].as_str().unwrap());
            v["question"] = Value::String(q);
            v["questionId"] =
                Value::from(v["questionId"].as_i64().unwrap() + 1_000_000 * copy as i64);
        }
        index
            .insert(v["question"].as_str().unwrap().to_string(), v["questionId"].as_i64().unwrap());
        out.push_str(&v.to_string());
        out.push('\n');
    }
    let p = dir.join("chaos-dataset.jsonl");
    std::fs::write(&p, out).unwrap();
    (p, index)
}

fn sweep(dir: &Path, base_url: &str, dataset: &Path, questions: usize) -> PathBuf {
    let p = dir.join("chaos.toml");
    let text = format!(
        "name = \"chaos\"\n\n\
         [[model]]\nname = \"model-a\"\nbackend = \"openai\"\nbase_url = \"{base_url}\"\nmodel = \"fake-model\"\nmax_concurrency = {CONCURRENCY}\nmax_tokens = 256\n\n\
         [[model]]\nname = \"judge-a\"\nbackend = \"openai\"\nbase_url = \"{base_url}\"\nmodel = \"fake-judge\"\nmax_concurrency = {CONCURRENCY}\n\n\
         [[benchmark]]\npipeline = \"hypotermqa\"\ndataset = \"{}\"\nmodels = [\"model-a\"]\njudge = \"judge-a\"\nsemantics = \"paper\"\nlimit = {questions}\n\n\
         # Kills cost deliveries: enough of them that no job runs out because of chaos.\n\
         [run]\nack_wait_s = 3\nmax_deliver = 50\n",
        dataset.display()
    );
    std::fs::write(&p, text).unwrap();
    p
}

enum Broker {
    One(NatsServer),
    Cluster(NatsCluster),
}

impl Broker {
    fn url(&self) -> String {
        match self {
            Broker::One(n) => n.url(),
            Broker::Cluster(c) => c.urls(),
        }
    }
    fn logs(&self) -> String {
        match self {
            Broker::One(n) => n.log_tail(30),
            Broker::Cluster(c) => {
                (0..c.len()).map(|i| c.node(i).log_tail(20)).collect::<Vec<_>>().join("\n---\n")
            }
        }
    }
}

struct Procs<'a> {
    dir: &'a Path,
    sweep: &'a Path,
    url: String,
    out: PathBuf,
}

impl Procs<'_> {
    fn log(&self, name: &str) -> std::fs::File {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{name}.log")))
            .unwrap()
    }
    fn coordinator(&self) -> ChildGuard {
        let mut c = halyard();
        c.args([
            "coordinator",
            self.sweep.to_str().unwrap(),
            "--nats",
            &self.url,
            "--out",
            self.out.to_str().unwrap(),
        ])
        .stdout(self.log("coordinator"))
        .stderr(self.log("coordinator"));
        ChildGuard::spawn(c)
    }
    fn worker(&self, i: usize) -> ChildGuard {
        let state = self.dir.join(format!("w{i}"));
        let mut c = halyard();
        c.args([
            "worker",
            "--nats",
            &self.url,
            "--sweep",
            self.sweep.to_str().unwrap(),
            "--state",
            state.to_str().unwrap(),
        ])
        .args(["--id", &format!("w{i}")])
        .stdout(self.log(&format!("w{i}")))
        .stderr(self.log(&format!("w{i}")));
        ChildGuard::spawn(c)
    }
}

fn chaos(cfg: Config) -> Figures {
    let started = Instant::now();
    let mut rng = Rng(cfg.seed.max(1));
    let keep = std::env::var_os("HALYARD_CHAOS_KEEP").is_some();
    let dir =
        tempfile::Builder::new().prefix("halyard-chaos-").disable_cleanup(keep).tempdir().unwrap();
    let d = dir.path();
    if keep {
        eprintln!("chaos: keeping {}", d.display());
    }
    let (ds, index) = dataset(d, cfg.questions);
    let rules = responder(index, None);
    let delay = cfg.delay;
    let fake = FakeOpenAi::start_blocking(move |c| Reply::Delayed(delay, Box::new(rules(c))));
    let sweep = sweep(d, &fake.base_url(), &ds, cfg.questions);

    // The uninterrupted reference: same sweep, same fake, own broker and checkpoint.
    run_to_end(&["run", sweep.to_str().unwrap(), "--out", d.join("ref").to_str().unwrap()]);
    let calls_reference = fake.call_count();
    let reference_calls = fake.calls();
    fake.reset_counters();
    let reference = read_json(&d.join("ref/chaos/report.json"));

    let mut broker = if cfg.cluster {
        Broker::Cluster(NatsCluster::start(3))
    } else {
        Broker::One(NatsServer::start())
    };
    let procs = Procs { dir: d, sweep: &sweep, url: broker.url(), out: d.join("runs") };
    let mut coord = procs.coordinator();
    let mut workers: Vec<ChildGuard> = (0..cfg.workers).map(|i| procs.worker(i)).collect();
    // When each worker was (re)started: a SIGTERM in its first milliseconds, before the
    // process has installed its handlers, is the default kill, not a test of Halyard.
    let mut started_at = vec![Instant::now(); cfg.workers];
    let mut f = Figures { calls_reference, ..Default::default() };
    // Kill i when the fake has seen this many calls: spread over the run, with jitter.
    let span = calls_reference as u64;
    let mut at: Vec<u64> = (0..cfg.kills as u64)
        .map(|i| span * (i + 1) / (cfg.kills as u64 + 2) + rng.below(span / 40 + 1))
        .collect();
    at.sort();
    let broker_event_at = span / 2;
    let mut broker_done = false;
    let deadline = Instant::now() + Duration::from_secs(600 + cfg.questions as u64);
    let status = loop {
        if let Some(s) = coord.try_wait() {
            if s.success() {
                break s;
            }
            panic!(
                "coordinator failed: {s:?}\n{}",
                std::fs::read_to_string(d.join("coordinator.log")).unwrap_or_default()
            );
        }
        for (i, w) in workers.iter_mut().enumerate() {
            if let Some(s) = w.try_wait() {
                panic!(
                    "worker {i} exited on its own: {s:?}\n{}",
                    std::fs::read_to_string(d.join(format!("w{i}.log"))).unwrap_or_default()
                );
            }
        }
        assert!(Instant::now() < deadline, "chaos run did not finish\nbroker:\n{}", broker.logs());
        let calls = fake.call_count() as u64;
        if !broker_done && calls >= broker_event_at {
            broker_done = true;
            f.in_flight_observed += fake.in_flight();
            // Every worker's calls may be redelivered while the broker is away.
            f.in_flight_bound += cfg.workers * 2 * CONCURRENCY;
            // One worker is killed and started again just before: it starts (streams,
            // buckets, consumers) while the broker goes, and must ride it out.
            let i = rng.below(cfg.workers as u64) as usize;
            workers[i].kill();
            f.events.push((fake.call_count(), format!("w{i} killed before the broker event")));
            f.kills_worker += 1;
            f.in_flight_bound += 2 * CONCURRENCY;
            workers[i] = procs.worker(i);
            started_at[i] = Instant::now();
            f.restarts += 1;
            std::thread::sleep(Duration::from_millis(rng.below(60)));
            f.events.push((fake.call_count(), "broker event".into()));
            f.broker_events.push(format!("w{i} restarted as the broker went"));
            match &mut broker {
                Broker::One(n) => {
                    // SIGTERM, as a planned restart: a lone nats-server killed with -9
                    // loses its last moments of stored acks (see README, Failure and
                    // recovery); the cluster case below kills a node with -9.
                    n.restart_gracefully();
                    f.broker_events.push("nats-server restarted".into());
                }
                Broker::Cluster(c) => {
                    let node = rng.below(3) as usize;
                    c.node_mut(node).stop();
                    f.broker_events.push(format!("cluster node n{} stopped for good", node + 1));
                }
            }
        }
        if at.first().is_some_and(|&a| calls >= a) {
            at.remove(0);
            // One planned kill in four hits the coordinator (the second, sixth, …).
            let kill_no = cfg.kills - at.len() - 1;
            if kill_no % 4 == 1 {
                coord.kill();
                f.events.push((fake.call_count(), "coordinator killed".into()));
                f.kills_coordinator += 1;
                std::thread::sleep(Duration::from_millis(rng.below(300)));
                coord = procs.coordinator();
            } else {
                let i = rng.below(cfg.workers as u64) as usize;
                f.in_flight_observed += fake.in_flight();
                workers[i].kill();
                f.events.push((fake.call_count(), format!("w{i} killed")));
                f.kills_worker += 1;
                f.in_flight_bound += 2 * CONCURRENCY;
                std::thread::sleep(Duration::from_millis(rng.below(300)));
                workers[i] = procs.worker(i);
                started_at[i] = Instant::now();
            }
            f.restarts += 1;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(status.success());
    assert!(at.is_empty(), "the run ended before {} planned kills", at.len());
    for (i, (w, at)) in workers.iter_mut().zip(&started_at).enumerate() {
        std::thread::sleep(Duration::from_secs(1).saturating_sub(at.elapsed()));
        w.signal(libc::SIGTERM);
        let s = w.wait_timeout(Duration::from_secs(30)).expect("worker did not stop on SIGTERM");
        assert!(
            s.success(),
            "worker {i} stop: {s:?}\n{}",
            std::fs::read_to_string(d.join(format!("w{i}.log"))).unwrap_or_default()
        );
    }
    f.wall = started.elapsed();

    let report = read_json(&procs.out.join("chaos/report.json"));
    f.jobs = report["jobs"]["done"].as_u64().unwrap();
    f.dead_letters = report["jobs"]["dead_letters"].as_u64().unwrap();
    f.calls = fake.call_count();
    f.repeated = f.calls as i64 - calls_reference as i64;
    f.repeats_after = repeats_by_event(&reference_calls, &fake.calls(), &f.events);
    let ref_labels = std::fs::read_to_string(d.join("ref/chaos/labels.jsonl")).unwrap();
    let labels = std::fs::read_to_string(procs.out.join("chaos/labels.jsonl")).unwrap();
    let ref_set: HashSet<&str> = ref_labels.lines().collect();
    let got: Vec<&str> = labels.lines().collect();
    let got_set: HashSet<&str> = got.iter().copied().collect();
    f.lost = ref_set.difference(&got_set).count();
    f.double_counted = (got.len() - got_set.len())
        + (f.jobs.saturating_sub(reference["jobs"]["done"].as_u64().unwrap())) as usize;
    for entry in std::fs::read_dir(d).unwrap().flatten() {
        if entry.path().extension().is_some_and(|e| e == "log") {
            f.panics += std::fs::read_to_string(entry.path())
                .unwrap_or_default()
                .matches("panicked at")
                .count();
        }
    }
    println!(
        "chaos: jobs {} | kills {} (workers {}, coordinator {}) | restarts {} | broker: {} | paid calls {} (uninterrupted {}) | \
         repeated calls {} (bound {}, in flight at kills {}) | lost jobs {} | double counts {} | dead letters {} | panics {} | wall {:.1} s | seed {}",
        f.jobs,
        f.kills_worker + f.kills_coordinator,
        f.kills_worker,
        f.kills_coordinator,
        f.restarts,
        f.broker_events.join(", "),
        f.calls,
        f.calls_reference,
        f.repeated,
        f.in_flight_bound,
        f.in_flight_observed,
        f.lost,
        f.double_counted,
        f.dead_letters,
        f.panics,
        f.wall.as_secs_f64(),
        cfg.seed
    );
    assert_eq!(
        report["benchmarks"], reference["benchmarks"],
        "report differs from the uninterrupted run's"
    );
    assert_eq!(report["jobs"]["done"], reference["jobs"]["done"], "job count differs");
    assert_eq!(labels, ref_labels, "labels differ from the uninterrupted run's");
    assert_eq!((f.lost, f.double_counted, f.panics), (0, 0, 0));
    let after: Vec<String> =
        f.repeats_after.iter().map(|(e, n)| format!("{n} after {e}")).collect();
    println!("chaos: calls beyond the uninterrupted run's: {}", after.join(", "));
    assert!(f.repeated >= 0, "fewer calls than the uninterrupted run");
    assert!(
        f.repeated as usize <= f.in_flight_bound,
        "{} repeated paid calls > bound {}",
        f.repeated,
        f.in_flight_bound
    );
    f
}

/// The calls of `calls` beyond those of `reference` with the same request (the later
/// ones of each), counted by the last event at or before each (events as `(call count,
/// name)`; "start" before the first), in the events' order.
fn repeats_by_event(
    reference: &[halyard_tests::ChatCall],
    calls: &[halyard_tests::ChatCall],
    events: &[(usize, String)],
) -> Vec<(String, usize)> {
    let mut budget: HashMap<String, usize> = HashMap::new();
    for c in reference {
        *budget.entry(halyard_tests::request_key(c)).or_default() += 1;
    }
    let mut out: Vec<(String, usize)> = std::iter::once("start".to_string())
        .chain(events.iter().map(|(_, e)| e.clone()))
        .map(|e| (e, 0))
        .collect();
    for (i, c) in calls.iter().enumerate() {
        let left = budget.entry(halyard_tests::request_key(c)).or_default();
        if *left > 0 {
            *left -= 1;
            continue;
        }
        let slot = events.iter().take_while(|(at, _)| *at <= i).count();
        out[slot].1 += 1;
    }
    out.retain(|(_, n)| *n > 0);
    out
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn seed() -> u64 {
    env(
        "HALYARD_CHAOS_SEED",
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
            as u64,
    )
}

/// CI size: ~300 jobs, 3 workers, 5 kills, one nats-server restart.
#[test]
fn chaos_small() {
    chaos(Config {
        questions: 90,
        workers: 3,
        kills: 5,
        cluster: false,
        seed: seed(),
        delay: Duration::from_millis(10),
    });
}

/// The benchmark: ≥ 5,000 jobs, ≥ 20 kills, a node lost from a 3-node cluster.
#[test]
#[ignore = "large chaos benchmark; run by hand with --ignored --nocapture"]
fn chaos_large() {
    chaos(Config {
        questions: env("HALYARD_CHAOS_QUESTIONS", 1440) as usize,
        workers: env("HALYARD_CHAOS_WORKERS", 3) as usize,
        kills: env("HALYARD_CHAOS_KILLS", 24) as usize,
        cluster: env("HALYARD_CHAOS_CLUSTER", 1) == 1,
        seed: seed(),
        delay: Duration::from_millis(env("HALYARD_CHAOS_DELAY_MS", 10)),
    });
}

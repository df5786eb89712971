//! Two `halyard worker` processes share one pool's quota against the quota-enforcing
//! fake API, through a real nats-server: together they stay within the quota (no 429,
//! no 60 s window over it), each taking half; when one is killed (SIGKILL, no goodbye)
//! the other takes over the whole quota once the dead member's heartbeat TTL runs out;
//! a worker that joins and then stops gracefully is seen coming and going at once.

use crate::common;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use halyard_broker::BrokerConfig;
use halyard_tests::fake_quota::publish_chat_jobs;
use halyard_tests::{ChildGuard, FakeQuotaApi, NatsServer, QuotaConfig};

const POOL: &str = "paid";
const RPM: u64 = 120;
const TTL_S: u64 = 6;

/// A worker of the pool, its model declared in a worker config file (issue 13: a
/// `--pool` alone runs noop models only) and its quota given by `--quota`.
fn worker(nats: &str, api: &str, id: &str, state: &Path, log: &Path) -> ChildGuard {
    let config = state.with_extension("toml");
    std::fs::write(
        &config,
        format!(
            "[[pool]]\nname = \"{POOL}\"\nconcurrency = 4\n[[pool.model]]\nbackend = \"openai\"\n\
             base_url = \"{api}\"\nmodel = \"m\"\n"
        ),
    )
    .expect("write worker config");
    let mut cmd = common::halyard();
    cmd.args(["--log-format", "json", "worker", "--nats", nats, "--config"])
        .arg(&config)
        .args([
            "--quota",
            &format!("{POOL}:rpm={RPM}"),
            "--quota-ttl",
            &TTL_S.to_string(),
            "--id",
            id,
        ])
        .arg("--state")
        .arg(state)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("create worker log"));
    ChildGuard::spawn(cmd)
}

/// Lines of the worker's log holding all of `needles`.
fn count(log: &Path, needles: &[&str]) -> usize {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines().filter(|l| needles.iter().all(|n| l.contains(n))).count()
}

/// Wait until the worker's log has more than `seen` lines with all of `needles`; panic
/// after `limit`. Returns how long it took.
fn wait_more(log: &Path, needles: &[&str], seen: usize, limit: Duration) -> Duration {
    let start = Instant::now();
    while count(log, needles) <= seen {
        assert!(
            start.elapsed() < limit,
            "no new log line with {needles:?} in {} within {limit:?}:\n{}",
            log.display(),
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    start.elapsed()
}

fn wait_log(log: &Path, needles: &[&str], limit: Duration) -> Duration {
    wait_more(log, needles, 0, limit)
}

#[test]
fn two_workers_share_the_quota_and_the_survivor_takes_it_all() {
    let nats = NatsServer::start();
    let api = FakeQuotaApi::start(QuotaConfig {
        latency: Duration::from_millis(50),
        ..QuotaConfig::per_minute(RPM, 100_000_000)
    });
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let broker = halyard_broker::connect(&BrokerConfig::new(nats.url(), "test")).await.unwrap();
        halyard_broker::init(
            &broker,
            &halyard_broker::layout::Options { quota_ttl: Duration::from_secs(TTL_S) },
        )
        .await
        .unwrap();
        // The pool planned, as a coordinator plans it (it alone makes pool consumers).
        halyard_broker::pool_consumer(&broker, POOL, Default::default()).await.unwrap();
        publish_chat_jobs(&broker.js, uuid::Uuid::now_v7(), POOL, &api.base_url(), 16, 0..400)
            .await
            .unwrap();
    });
    let dir = tempfile::tempdir().unwrap();
    let (log_a, log_b) = (dir.path().join("a.log"), dir.path().join("b.log"));
    let _a = worker(&nats.url(), &api.base_url(), "worker-a", &dir.path().join("a"), &log_a);
    wait_log(&log_a, &["joined quota pool", "\"members\":1"], Duration::from_secs(60));
    let mut b = worker(&nats.url(), &api.base_url(), "worker-b", &dir.path().join("b"), &log_b);
    wait_log(&log_b, &["joined quota pool", "\"members\":2"], Duration::from_secs(60));
    wait_log(&log_a, &["share resized", "\"members\":2"], Duration::from_secs(10));

    // Both serve: over 12 s they get the quota's rate between them, not twice it.
    let t0 = api.ledger.elapsed() + Duration::from_secs(3);
    std::thread::sleep(Duration::from_secs(15));
    let both = api.ledger.admitted_between(t0, t0 + Duration::from_secs(12));
    let per_12s = RPM / 5;
    assert!(
        both <= per_12s + 3,
        "two workers sent {both} requests in 12 s; the quota allows {per_12s}"
    );
    assert!(
        both >= per_12s / 2 + 3,
        "two workers sent only {both} requests in 12 s (quota {per_12s})"
    );

    // Kill one: the survivor sees it gone once its key expires (TTL), and resizes.
    b.kill();
    let took =
        wait_more(&log_a, &["share resized", "\"members\":1"], 0, Duration::from_secs(TTL_S * 5));
    eprintln!("survivor resized {took:?} after the kill (TTL {TTL_S} s)");
    assert!(
        took <= Duration::from_secs(TTL_S + 3),
        "the survivor took {took:?} to notice a dead member (TTL {TTL_S} s)"
    );

    // Alone, it runs at the whole quota: well above the half share it had.
    let t1 = api.ledger.elapsed() + Duration::from_secs(1);
    std::thread::sleep(Duration::from_secs(13));
    let alone = api.ledger.admitted_between(t1, t1 + Duration::from_secs(12));
    assert!(
        alone <= per_12s + 3,
        "the survivor sent {alone} requests in 12 s; the quota allows {per_12s}"
    );
    assert!(
        alone * 4 >= per_12s * 3,
        "the survivor sent {alone} requests in 12 s: it did not take over the quota ({per_12s})"
    );

    // Never over the quota: no 429, no 60 s window above it.
    let (max_60s, _) = api.ledger.max_in_window(Duration::from_secs(60));
    assert_eq!(api.ledger.rejected(), 0, "the fake API answered 429");
    assert!(max_60s <= RPM, "{max_60s} requests in one 60 s window (quota {RPM})");
    eprintln!("both: {both}/12 s, alone: {alone}/12 s, max in 60 s: {max_60s} (quota {RPM})");

    // A third joins and stops gracefully: the survivor shrinks on the join and grows back
    // on the leave at once (announced), not a TTL later.
    let resized_to_2 = count(&log_a, &["share resized", "\"members\":2"]);
    let resized_to_1 = count(&log_a, &["share resized", "\"members\":1"]);
    let log_c = dir.path().join("c.log");
    let mut c = worker(&nats.url(), &api.base_url(), "worker-c", &dir.path().join("c"), &log_c);
    wait_log(&log_c, &["joined quota pool", "\"members\":2"], Duration::from_secs(60));
    wait_more(&log_a, &["share resized", "\"members\":2"], resized_to_2, Duration::from_secs(10));
    c.signal(libc::SIGTERM);
    let took = wait_more(
        &log_a,
        &["share resized", "\"members\":1"],
        resized_to_1,
        Duration::from_secs(TTL_S * 5),
    );
    eprintln!("survivor resized {took:?} after a graceful stop");
    assert!(
        took < Duration::from_millis(TTL_S * 1000 * 3 / 4),
        "a graceful leave took {took:?} to reach the survivor: not announced?"
    );
    assert!(
        c.wait_timeout(Duration::from_secs(30)).is_some_and(|s| s.success()),
        "worker-c did not stop cleanly"
    );
    assert_eq!(count(&log_c, &["left quota pool"]), 1);
    assert_eq!(api.ledger.rejected(), 0, "the fake API answered 429");
}

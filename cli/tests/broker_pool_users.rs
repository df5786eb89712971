//! Issue 49, items 3, 5 and 7: per-pool worker users are what a generated deployment
//! gets. `halyard deploy k8s` writes the broker's users for a sweep
//! (`nats-permissions.conf`, halyard_broker::permissions); a real nats-server 2.9 runs
//! that file as written; a whole sweep of two pools runs with each pool's workers on their
//! own user; then pool `alpha`'s credential attacks pool `beta` and every attempt is
//! refused by the server, while the same calls on its own pool go through.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::{halyard, read_json, repo_root};
use halyard_broker::auth::NatsAuth;
use halyard_broker::permissions::{worker_password_var, worker_user};
use halyard_broker::{Broker, BrokerConfig};
use halyard_proto::subjects;
use halyard_tests::{ChildGuard, NatsServer};

const POOLS: [&str; 2] = ["alpha", "beta"];

/// The password of the user whose server variable is `var` (set in this process's
/// environment, which the server inherits).
fn password(var: &str) -> String {
    format!("pw-{}-5e1", var.to_ascii_lowercase())
}

fn sweep(dir: &Path, jobs: u64) -> PathBuf {
    let p = dir.join("pools.toml");
    let mut text = String::from("name = \"pools\"\n");
    for pool in POOLS {
        text.push_str(&format!(
            "\n[[model]]\nname = \"{pool}\"\nbackend = \"noop\"\nmax_concurrency = 8\nrpm = 60000\n"
        ));
    }
    text.push_str(&format!(
        "\n[[benchmark]]\npipeline = \"noop\"\njobs = {jobs}\nmodels = [\"alpha\", \"beta\"]\n"
    ));
    std::fs::write(&p, text).unwrap();
    p
}

/// `halyard deploy k8s` of the sweep, and a nats-server started with the
/// `nats-permissions.conf` it wrote, every user's password in the environment.
fn generated_server(dir: &Path, sweep: &Path) -> NatsServer {
    let out = dir.join("overlay");
    let o = halyard()
        .args(["deploy", "k8s", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()])
        .arg("--secrets")
        .arg(repo_root().join("deploy/k8s/secrets"))
        .output()
        .unwrap();
    assert!(o.status.success(), "deploy k8s: {}", String::from_utf8_lossy(&o.stderr));
    let conf = out.join("nats-permissions.conf");
    let text = std::fs::read_to_string(&conf).unwrap();
    for var in ["HALYARD_COORDINATOR_PASSWORD", "HALYARD_STATUS_PASSWORD"] {
        assert!(text.contains(&format!("${var}")), "{var} not in\n{text}");
        std::env::set_var(var, password(var));
    }
    for pool in POOLS {
        let var = worker_password_var(pool);
        assert!(text.contains(&format!("${var}")), "{var} not in\n{text}");
        std::env::set_var(&var, password(&var));
    }
    assert!(!text.contains("\"halyard-worker\""), "a worker user for every pool:\n{text}");
    NatsServer::start_with_args(&["-c", conf.to_str().unwrap()])
}

/// A worker for each of `pools` of `sweep`, each with `--only-pool` and its pool's
/// generated user (`password` of its variable), its checkpoint in `dir/<tag>cp-<pool>`
/// and its stderr in `dir/<tag>worker-<pool>.log` (returned beside it).
pub(crate) fn pool_workers(
    dir: &Path,
    sweep: &Path,
    nats: &NatsServer,
    tag: &str,
    pools: &[&str],
    password: fn(&str) -> String,
) -> Vec<(ChildGuard, PathBuf)> {
    pools
        .iter()
        .map(|pool| {
            let log = dir.join(format!("{tag}worker-{pool}.log"));
            let mut w = halyard();
            w.args(["worker", "--sweep", sweep.to_str().unwrap(), "--only-pool", pool])
                .args(["--nats", &nats.url(), "--nats-user", &worker_user(pool)])
                .args(["--metrics", "off", "--state"])
                .arg(dir.join(format!("{tag}cp-{pool}")))
                .env("HALYARD_NATS_PASSWORD", password(&worker_password_var(pool)))
                .stderr(std::fs::File::create(&log).unwrap());
            (ChildGuard::spawn(w), log)
        })
        .collect()
}

fn auth(user: &str, var: &str) -> NatsAuth {
    NatsAuth { user: Some(user.into()), password: Some(password(var)), ..Default::default() }
}

async fn connect(nats: &NatsServer, user: &str, var: &str) -> Broker {
    let cfg = BrokerConfig::new(nats.url(), user).with_auth(auth(user, var));
    halyard_broker::connect(&cfg).await.unwrap()
}

/// The server's log once it holds every one of `needles`, or after 10 s.
async fn log_holding(nats: &NatsServer, needles: &[String]) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let log = nats.log_tail(600);
        if needles.iter().all(|n| log.contains(n.as_str())) || std::time::Instant::now() > deadline
        {
            return log;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// Items 3 and 7: the generated configuration runs a two-pool sweep with each pool's
/// workers on their own user (no violation), and pool alpha's credential can neither
/// pull, ack, nor answer beta's jobs, nor write beta's health, budget, quota member,
/// quota announcement or batch records, nor read beta's workers' replies, nor the
/// coordinator's.
#[test]
fn a_pool_credential_reaches_only_its_own_pool() {
    let dir = tempfile::tempdir().unwrap();
    let sweep = sweep(dir.path(), 30);
    let nats = generated_server(dir.path(), &sweep);

    // The whole sweep: a worker per pool, each with `--only-pool` and its pool's user.
    let mut workers = pool_workers(dir.path(), &sweep, &nats, "", &POOLS, password);
    let out = dir.path().join("runs");
    let o = halyard()
        .args(["coordinator", sweep.to_str().unwrap(), "--nats", &nats.url(), "--metrics", "off"])
        .args(["--nats-user", "halyard-coordinator", "--out", out.to_str().unwrap()])
        .env("HALYARD_NATS_PASSWORD", password("HALYARD_COORDINATOR_PASSWORD"))
        .output()
        .unwrap();
    let logs = |ws: &[(ChildGuard, PathBuf)]| {
        ws.iter()
            .map(|(_, l)| std::fs::read_to_string(l).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n----\n")
    };
    assert!(
        o.status.success(),
        "coordinator: {}\nworkers: {}",
        String::from_utf8_lossy(&o.stderr),
        logs(&workers)
    );
    let report = read_json(&out.join("pools/report.json"));
    assert_eq!(report["jobs"]["completed"], 60, "{report}");
    for (w, _) in &mut workers {
        w.signal(libc::SIGTERM);
    }
    for (w, log) in &mut workers {
        let status = w.wait_timeout(Duration::from_secs(30)).expect("worker did not stop");
        let text = std::fs::read_to_string(&*log).unwrap_or_default();
        assert!(status.success(), "worker: {status:?}\n{text}");
        assert!(text.contains("left quota pool"), "{text}");
    }
    let server_log = nats.log_tail(600);
    assert!(!server_log.contains("Violation"), "a generated user lacked a right:\n{server_log}");

    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let coordinator =
            connect(&nats, "halyard-coordinator", "HALYARD_COORDINATOR_PASSWORD").await;
        let alpha = connect(&nats, &worker_user("alpha"), &worker_password_var("alpha")).await;
        let beta = connect(&nats, &worker_user("beta"), &worker_password_var("beta")).await;
        // A job of beta's waiting in its consumer.
        let job = coordinator
            .js
            .publish(subjects::job_subject("beta"), "job".into())
            .await
            .unwrap()
            .await
            .unwrap();
        // Pull it with alpha's credential: no answer, no message.
        let next = format!(
            "$JS.API.CONSUMER.MSG.NEXT.{}.{}",
            subjects::JOBS_STREAM,
            subjects::pool_consumer("beta")
        );
        let pulled = tokio::time::timeout(
            Duration::from_secs(1),
            alpha.client.request(next.clone(), r#"{"batch":1,"expires":500000000}"#.into()),
        )
        .await;
        if let Ok(Ok(reply)) = pulled {
            let text = String::from_utf8_lossy(&reply.payload).into_owned();
            assert!(reply.payload.is_empty() || text.contains("error"), "alpha pulled: {text}");
            assert_ne!(text, "job", "alpha pulled beta's job");
        }
        // Listen to beta's replies and the coordinator's.
        let _spy = alpha.client.subscribe("_INBOX_halyard-worker-beta.>").await.unwrap();
        let _spy2 = alpha.client.subscribe("_INBOX_halyard-coordinator.>").await.unwrap();
        alpha.client.flush().await.unwrap();
        // ... while beta's worker credential makes requests of its own: JetStream's answers.
        let mut s = beta.js.get_stream(subjects::JOBS_STREAM).await.unwrap();
        assert!(s.info().await.unwrap().state.messages >= 1);
        let consumer: async_nats::jetstream::consumer::PullConsumer = s
            .get_consumer(&subjects::pool_consumer("beta"))
            .await
            .expect("beta binds its own pool's consumer");
        let mut got = consumer
            .fetch()
            .max_messages(1)
            .expires(Duration::from_secs(2))
            .messages()
            .await
            .unwrap();
        let m = tokio::time::timeout(Duration::from_secs(5), halyard_broker::next_pulled(&mut got))
            .await
            .expect("beta's pull answered")
            .expect("a message");
        assert_eq!(&m.payload[..], b"job", "beta pulls its own job (stream seq {})", job.sequence);
        let ack = m.reply.clone().unwrap().to_string();
        // Ack beta's job with alpha's credential (the ack subject seen): refused.
        alpha.client.publish(ack.clone(), "+ACK".into()).await.unwrap();
        let run = uuid::Uuid::now_v7();
        let b = "beta";
        let denied = [
            next,
            ack,
            subjects::result_subject(run, b),
            format!("$KV.halyard_pool_health.{b}"),
            format!("$KV.halyard_delivery_budget.{b}.{}", job.sequence),
            format!("$KV.halyard_quota_members.{}.{}", hex(b), hex("forged")),
            format!("halyard.quota.{}", hex(b)),
            format!("$KV.halyard_batches.r.{b}.x"),
            format!("$KV.halyard_batches.q.{b}"),
        ];
        for subject in &denied[2..] {
            alpha.client.publish(subject.clone(), "forged".into()).await.unwrap();
        }
        alpha.client.flush().await.unwrap();
        // The same on alpha's own pool: accepted (the baseline).
        let js = &alpha.js;
        for subject in [
            subjects::result_subject(run, "alpha"),
            "$KV.halyard_pool_health.alpha".to_string(),
            format!("$KV.halyard_quota_members.{}.{}", hex("alpha"), hex("probe")),
        ] {
            let ack = js.publish(subject.clone(), "{}".into()).await.unwrap();
            assert!(ack.await.is_ok(), "alpha's own {subject} was refused");
        }
        let user = worker_user("alpha");
        let mut needles: Vec<String> = denied
            .iter()
            .map(|s| format!("Publish Violation - User \"{user}\", Subject \"{s}\""))
            .collect();
        for s in ["_INBOX_halyard-worker-beta.>", "_INBOX_halyard-coordinator.>"] {
            needles.push(format!("Subscription Violation - User \"{user}\", Subject \"{s}\""));
        }
        let log = log_holding(&nats, &needles).await;
        for needle in needles {
            assert!(log.lines().any(|l| l.contains(&needle)), "no {needle}:\n{log}");
        }
        // Beta's job is still there for beta (alpha's ack went nowhere): acked by beta now.
        m.ack().await.unwrap();
    });
}

/// Item 5: what a stolen credential still reaches after items 3 and 7 is its own pool's
/// records; forged ones are held to the bounds the book states. With alpha's generated
/// credential against a worker of alpha's (a real nats-server on the generated file):
/// 400 fake quota members count as MAX_MEMBERS at most (the real member's share never
/// below the quota / MAX_MEMBERS); a second forged 300 s cool-down 3 s after the first
/// extends nothing (the pool's bucket of announced pauses); a delivery budget record
/// excusing u64::MAX deliveries excuses MAX_EXCUSED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_records_of_its_own_pool_stay_within_the_bounds() {
    use halyard_worker::budget::{Budget, MAX_EXCUSED};
    use halyard_worker::quota::membership::{self, Announcement, MAX_MEMBERS};
    use halyard_worker::quota::{PoolQuota, QuotaGate, QuotaSettings};
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let sweep = sweep(dir.path(), 1);
    let nats = generated_server(dir.path(), &sweep);
    let coordinator = connect(&nats, "halyard-coordinator", "HALYARD_COORDINATOR_PASSWORD").await;
    halyard_broker::init(&coordinator, &Default::default()).await.unwrap();
    let worker = connect(&nats, &worker_user("alpha"), &worker_password_var("alpha")).await;
    let forger = connect(&nats, &worker_user("alpha"), &worker_password_var("alpha")).await;
    let stats = Arc::new(halyard_worker::stats::Stats::default());
    let quota = PoolQuota::new(Some(60_000), None);
    let gate = QuotaGate::join(&worker, "alpha", quota, "w-real", QuotaSettings::default(), stats)
        .await
        .unwrap();
    let full = gate.limiter().rates().requests.unwrap();

    // Fake members, kept fresh as a forger would.
    let kv = forger.js.get_key_value(halyard_broker::layout::QUOTA_MEMBERS).await.unwrap();
    let keys: Vec<String> =
        (0..400).map(|i| format!("{}.{}", hex("alpha"), hex(&format!("fake-{i}")))).collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        for k in &keys {
            kv.put(k, "{\"worker\":\"fake\"}".into()).await.unwrap();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        if gate.limiter().members() >= MAX_MEMBERS || std::time::Instant::now() > deadline {
            break;
        }
    }
    assert_eq!(gate.limiter().members(), MAX_MEMBERS, "400 fake members counted as the bound");
    let share = gate.limiter().rates().requests.unwrap();
    assert!(
        share * MAX_MEMBERS as f64 >= full * 0.99,
        "share {share}/min of {full}/min: below quota / {MAX_MEMBERS}"
    );

    // Forged cool-downs.
    let subject = membership::subject("alpha");
    let forged = Announcement::CoolDown { worker: "forger".into(), ms: 300_000 };
    membership::announce(&forger.client, &subject, &forged).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while gate.limiter().paused_until().is_none() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let until = gate.limiter().paused_until().expect("the first forged cool-down is honoured");
    // Counted from when the worker took it (at or before `seen`), not from the send.
    let seen = tokio::time::Instant::now();
    assert!(until <= seen + Duration::from_secs(300), "more than MAX_COOLDOWN");
    tokio::time::sleep(Duration::from_secs(3)).await;
    for _ in 0..5 {
        membership::announce(&forger.client, &subject, &forged).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let later = gate.limiter().paused_until().unwrap();
    assert!(
        later <= until + Duration::from_millis(500),
        "forged cool-downs extended the pause by {:?} past the pool's bound",
        later - until
    );
    gate.leave().await;

    // A forged delivery budget record.
    let budget = Budget::open(&worker).await.unwrap();
    let key = Budget::key("alpha", 7);
    let bkv =
        forger.js.get_key_value(halyard_proto::subjects::DELIVERY_BUDGET_BUCKET).await.unwrap();
    let record = format!("{{\"excused\":{},\"deliveries\":[]}}", u64::MAX);
    bkv.put(&key, record.into()).await.unwrap();
    assert_eq!(budget.excused(&key).await.unwrap(), MAX_EXCUSED);
}

/// Item 5, the pool-health record: during a whole run on the generated configuration
/// with `outage_patience_s = 6`, a process holding pool alpha's worker credential
/// rewrites alpha's health record as "paused" every 300 ms (`updated_ms` fresh,
/// `since_ms` a day old). The coordinator sees the pause (the report lists it) but times
/// it by its own clock and alpha's results keep being accepted, so the run, paced to last
/// well past the patience, completes: every job done, no dead letter. Before, the pause
/// counted from the coordinator's start and stopped the run as interrupted (exit 130)
/// after 6 s. (With a patience of 3 s, a first result of alpha accepted more than 3 s
/// after the coordinator's first reading, as a loaded CI machine can take, stopped the
/// run as a true outage would: the forged record is fresh from the start.)
#[test]
fn a_forged_paused_health_record_stops_no_run_that_progresses() {
    use halyard_proto::health::{OutageReason, PoolHealthRecord};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let sweep = sweep(dir.path(), 30);
    // 2 jobs a second per pool: about 15 s, past the patience with margin.
    let text = std::fs::read_to_string(&sweep).unwrap().replace("rpm = 60000", "rpm = 120");
    std::fs::write(&sweep, text + "\n[run]\noutage_patience_s = 6\n").unwrap();
    let nats = generated_server(dir.path(), &sweep);

    // The forger: alpha's credential, the bucket made as a coordinator makes it.
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let forger = {
        let stop = stop.clone();
        let url = nats.url();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let cfg = BrokerConfig::new(url.clone(), "halyard-coordinator")
                    .with_auth(auth("halyard-coordinator", "HALYARD_COORDINATOR_PASSWORD"));
                let coordinator = halyard_broker::connect(&cfg).await.unwrap();
                halyard_broker::init(&coordinator, &Default::default()).await.unwrap();
                let cfg = BrokerConfig::new(url, worker_user("alpha"))
                    .with_auth(auth(&worker_user("alpha"), &worker_password_var("alpha")));
                let b = halyard_broker::connect(&cfg).await.unwrap();
                let kv = b.js.get_key_value(subjects::POOL_HEALTH_BUCKET).await.unwrap();
                let key = subjects::pool_token("alpha");
                let mut writes = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap()
                        .as_millis() as u64;
                    let r = PoolHealthRecord {
                        pool: "alpha".into(),
                        paused: true,
                        reason: OutageReason::Connection,
                        error: "connection refused (forged)".into(),
                        since_ms: now - 86_400_000,
                        next_probe_ms: Some(now + 30_000),
                        probes_failed: 9,
                        resumed_ms: None,
                        worker: "forger".into(),
                        updated_ms: now,
                    };
                    kv.put(&key, serde_json::to_vec(&r).unwrap().into()).await.unwrap();
                    writes += 1;
                    if writes == 1 {
                        ready_tx.send(()).unwrap();
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                writes
            })
        })
    };
    ready_rx.recv_timeout(Duration::from_secs(30)).expect("the forger wrote its record");

    let mut workers = pool_workers(dir.path(), &sweep, &nats, "", &POOLS, password);
    let out = dir.path().join("runs");
    let began = std::time::Instant::now();
    let o = halyard()
        .args(["coordinator", sweep.to_str().unwrap(), "--nats", &nats.url(), "--metrics", "off"])
        .args(["--nats-user", "halyard-coordinator", "--out", out.to_str().unwrap()])
        .env("HALYARD_NATS_PASSWORD", password("HALYARD_COORDINATOR_PASSWORD"))
        .output()
        .unwrap();
    let took = began.elapsed();
    stop.store(true, Ordering::Relaxed);
    let writes = forger.join().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "the forged pause stopped the run: {:?}\n{stderr}", o.status);
    // Long enough that the old count (from the coordinator's start) passed the patience
    // at a reading (one every 2 s).
    assert!(took >= Duration::from_secs(10), "the run took only {took:?}: no test of the patience");
    assert!(writes >= 20, "{writes} forged writes");
    let report = read_json(&out.join("pools/report.json"));
    assert_eq!(report["jobs"]["completed"], 60, "{report}");
    assert_eq!(report["jobs"]["dead_letters"], 0, "{report}");
    let outages = report["outages"].as_array().expect("outages in the report");
    assert!(
        outages.iter().any(|o| o["pool"] == "alpha"),
        "the coordinator never saw the forged pause: {report}"
    );
    for (w, _) in &mut workers {
        w.signal(libc::SIGTERM);
        w.wait_timeout(Duration::from_secs(30)).expect("worker did not stop");
    }
}

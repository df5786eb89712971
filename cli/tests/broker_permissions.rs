//! Issue 13: the shipped per-role broker permissions (`deploy/nats/permissions.conf`) on
//! a real nats-server: a whole run works with each role's own credentials (coordinator,
//! worker and status as separate processes), and worker or status credentials cannot
//! publish a job or delete a message. Batch mode: the provider batches bucket
//! (`halyard_batches`) is written by workers only and read by the coordinator and status.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::{halyard, read_json, repo_root};
use halyard_broker::auth::NatsAuth;
use halyard_broker::{Broker, BrokerConfig};
use halyard_proto::subjects;
use halyard_tests::{ChildGuard, NatsServer};

const ROLES: [(&str, &str, &str); 3] = [
    ("halyard-coordinator", "HALYARD_COORDINATOR_PASSWORD", "coord-pw-81f2"),
    ("halyard-worker", "HALYARD_WORKER_PASSWORD", "worker-pw-37c9"),
    ("halyard-status", "HALYARD_STATUS_PASSWORD", "status-pw-a0d4"),
];

/// A nats-server with JetStream and the shipped permissions, passwords from its
/// environment (the test process's, set here once for every test of this file).
fn server() -> NatsServer {
    for (_, var, pw) in ROLES {
        std::env::set_var(var, pw);
    }
    let conf = repo_root().join("deploy/nats/permissions.conf");
    NatsServer::start_with_args(&["-c", conf.to_str().unwrap()])
}

fn auth(role: usize) -> NatsAuth {
    NatsAuth {
        user: Some(ROLES[role].0.into()),
        password: Some(ROLES[role].2.into()),
        ..Default::default()
    }
}

async fn connect(nats: &NatsServer, role: usize) -> Broker {
    let cfg = BrokerConfig::new(nats.url(), ROLES[role].0).with_auth(auth(role));
    halyard_broker::connect(&cfg).await.unwrap()
}

/// The server's log once it holds every one of `needles` (the server logs a violation
/// after refusing it), or after 10 s, for the caller's assertions to name what is missing.
async fn log_holding(nats: &NatsServer, needles: &[String]) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let log = nats.log_tail(400);
        if needles.iter().all(|n| log.contains(n.as_str())) || std::time::Instant::now() > deadline
        {
            return log;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A JetStream API request the server must refuse: no answer within `wait` (a denied
/// publish is dropped), or an answer that is an error.
async fn refused(b: &Broker, who: &str, api: &str, body: &str, wait: Duration) {
    let r = tokio::time::timeout(wait, b.client.request(api.to_string(), body.to_string().into()))
        .await;
    if let Ok(Ok(reply)) = r {
        let text = String::from_utf8_lossy(&reply.payload).into_owned();
        assert!(text.contains("\"error\""), "{who}: {api} answered {text}");
    }
}

/// The server logged a publish violation by `user` on each of `subjects`.
async fn violations_logged(nats: &NatsServer, user: &str, subjects: &[String]) {
    let needles: Vec<String> = subjects
        .iter()
        .map(|s| format!("Publish Violation - User \"{user}\", Subject \"{s}\""))
        .collect();
    let log = log_holding(nats, &needles).await;
    for needle in needles {
        assert!(log.lines().any(|l| l.contains(&needle)), "no {needle}:\n{log}");
    }
}

fn sweep(dir: &Path, jobs: u64) -> PathBuf {
    let p = dir.join("perm.toml");
    std::fs::write(
        &p,
        format!(
            "name = \"perm\"\n\n[[model]]\nname = \"free\"\nbackend = \"noop\"\nmax_concurrency = 8\n\
             rpm = 60000\n\n[[benchmark]]\npipeline = \"noop\"\njobs = {jobs}\nmodels = [\"free\"]\n"
        ),
    )
    .unwrap();
    p
}

/// Worker and status credentials cannot publish a job, delete or purge a job message,
/// delete the pool's consumer or the stream, purge the quota membership bucket, or listen
/// to results or the coordinator's replies; the coordinator's can publish jobs (the
/// baseline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_credentials_cannot_publish_jobs_or_delete_messages() {
    let nats = server();
    let coordinator = connect(&nats, 0).await;
    halyard_broker::init(&coordinator, &Default::default()).await.unwrap();
    let subject = subjects::job_subject("free");
    coordinator.js.publish(subject.clone(), "job".into()).await.unwrap().await.unwrap();
    let worker = connect(&nats, 1).await;
    halyard_broker::pool_consumer(&coordinator, "free", Default::default()).await.unwrap();
    let status = connect(&nats, 2).await;
    let count = || async {
        let mut s = coordinator.js.get_stream(subjects::JOBS_STREAM).await.unwrap();
        s.info().await.unwrap().state.messages
    };
    assert_eq!(count().await, 1);
    for (who, b) in [("worker", &worker), ("status", &status)] {
        let ack = b.js.publish(subject.clone(), "forged job".into()).await;
        let stored = match ack {
            Ok(f) => tokio::time::timeout(Duration::from_secs(1), f).await.is_ok_and(|r| r.is_ok()),
            Err(_) => false,
        };
        assert!(!stored, "{who} credentials published a job");
        // Through the JetStream API: delete the message, purge the stream, drop the
        // consumer, drop the stream. Denied requests get no answer; any answer must be
        // an error.
        for (api, body) in [
            (format!("$JS.API.STREAM.MSG.DELETE.{}", subjects::JOBS_STREAM), r#"{"seq":1}"#),
            (format!("$JS.API.STREAM.PURGE.{}", subjects::JOBS_STREAM), "{}"),
            (
                format!(
                    "$JS.API.CONSUMER.DELETE.{}.{}",
                    subjects::JOBS_STREAM,
                    subjects::pool_consumer("free")
                ),
                "",
            ),
            (format!("$JS.API.STREAM.DELETE.{}", subjects::JOBS_STREAM), ""),
            // Nor empty every quota pool's membership (issue 33, item 6).
            ("$JS.API.STREAM.PURGE.KV_halyard_quota_members".to_string(), "{}"),
        ] {
            refused(b, who, &api, body, Duration::from_secs(1)).await;
        }
        assert_eq!(count().await, 1, "{who} credentials removed a job");
        // Nor read results: not as they are published, not from the coordinator's replies.
        for subject in ["halyard.results.>", "_INBOX_halyard-coordinator.>", "_INBOX.>"] {
            let _sub = b.client.subscribe(subject).await.unwrap();
            b.client.flush().await.unwrap();
        }
    }
    // The server refused them as permission violations, by user.
    let mut needles = Vec::new();
    for user in ["halyard-worker", "halyard-status"] {
        for (kind, subject) in [
            ("Publish", "halyard.jobs.free"),
            ("Publish", "$JS.API.STREAM.MSG.DELETE.HALYARD_JOBS"),
            ("Publish", "$JS.API.STREAM.PURGE.KV_halyard_quota_members"),
            ("Subscription", "halyard.results.>"),
            ("Subscription", "_INBOX_halyard-coordinator.>"),
        ] {
            needles.push(format!("{kind} Violation - User \"{user}\", Subject \"{subject}\""));
        }
    }
    let log = log_holding(&nats, &needles).await;
    for needle in needles {
        assert!(log.lines().any(|l| l.contains(&needle)), "no {needle}:\n{log}");
    }
}

/// Issue 33, item 6: only the coordinator makes or retunes a pool's consumer. Worker
/// credentials cannot create one (by either API subject) nor update one's ack wait; a
/// worker binds to the coordinator's (its ack wait the coordinator's), finds none before
/// it exists, and refuses one of another shape (filter, delivery limit), naming what
/// differs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_coordinator_makes_or_retunes_pool_consumers() {
    use halyard_broker::{bind_pool_consumer, consumer_ack_wait, pool_consumer, Delivery};
    let nats = server();
    let coordinator = connect(&nats, 0).await;
    let worker = connect(&nats, 1).await;
    halyard_broker::init(&coordinator, &Default::default()).await.unwrap();
    let d = Delivery { ack_wait: Duration::from_secs(30), ..Default::default() };
    assert!(bind_pool_consumer(&worker, "free").await.unwrap().is_none());
    // The create and update requests a client sends (2.9's subject with the filter, and
    // the durable one of older servers), with an ack wait of one second: no answer, or an
    // error, and nothing made.
    let name = subjects::pool_consumer("free");
    let body = serde_json::json!({
        "stream_name": subjects::JOBS_STREAM,
        "config": {
            "durable_name": name, "filter_subject": subjects::job_subject("free"),
            "ack_policy": "explicit", "ack_wait": 1_000_000_000u64, "deliver_policy": "all",
            "replay_policy": "instant", "max_deliver": -1,
        }
    })
    .to_string();
    let apis = [
        format!("$JS.API.CONSUMER.CREATE.{}.{name}", subjects::JOBS_STREAM),
        format!(
            "$JS.API.CONSUMER.CREATE.{}.{name}.{}",
            subjects::JOBS_STREAM,
            subjects::job_subject("free")
        ),
        format!("$JS.API.CONSUMER.DURABLE.CREATE.{}.{name}", subjects::JOBS_STREAM),
    ];
    let send_all = || async {
        for api in &apis {
            refused(&worker, "worker", api, &body, Duration::from_secs(1)).await;
        }
    };
    send_all().await;
    assert!(bind_pool_consumer(&worker, "free").await.unwrap().is_none(), "a worker made it");
    // The coordinator makes it; the worker binds; the worker's retune is refused.
    pool_consumer(&coordinator, "free", d).await.unwrap();
    let bound = bind_pool_consumer(&worker, "free").await.unwrap().expect("bound");
    assert_eq!(consumer_ack_wait(&bound), d.ack_wait);
    send_all().await;
    let mut c = bind_pool_consumer(&worker, "free").await.unwrap().expect("bound");
    assert_eq!(c.info().await.unwrap().config.ack_wait, d.ack_wait, "a worker retuned it");
    // Consumers of a pool's name made otherwise (with coordinator rights): another filter,
    // a server-side delivery limit. Refused, naming what differs.
    let stream = coordinator.js.get_stream(subjects::JOBS_STREAM).await.unwrap();
    let limited = async_nats::jetstream::consumer::pull::Config {
        durable_name: Some(subjects::pool_consumer("old")),
        filter_subject: subjects::job_subject("old"),
        ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
        max_deliver: 5,
        ..Default::default()
    };
    stream.create_consumer(limited).await.unwrap();
    let e = bind_pool_consumer(&worker, "old").await.unwrap_err().to_string();
    assert!(e.contains("pool-old") && e.contains("after 5 deliveries"), "{e}");
    let wrong = async_nats::jetstream::consumer::pull::Config {
        durable_name: Some(subjects::pool_consumer("paid")),
        // Another pool's jobs (a work queue takes one consumer per subject).
        filter_subject: subjects::job_subject("other"),
        ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
        ack_wait: d.ack_wait,
        max_deliver: -1,
        ..Default::default()
    };
    stream.create_consumer(wrong).await.unwrap();
    let e = bind_pool_consumer(&worker, "paid").await.unwrap_err().to_string();
    assert!(e.contains("pool-paid") && e.contains("halyard.jobs.other"), "{e}");
    // The server refused the worker's requests as violations.
    violations_logged(&nats, "halyard-worker", &apis).await;
}

/// A sweep runs to the end with each role's own credentials: coordinator and worker as
/// separate processes (the worker in a quota pool: membership bucket, announcements,
/// heartbeats), then `halyard status` with the read-only user.
#[test]
fn a_run_works_with_role_credentials() {
    let nats = server();
    let dir = tempfile::tempdir().unwrap();
    let sweep = sweep(dir.path(), 60);
    let out = dir.path().join("runs");
    let wlog = dir.path().join("worker.log");
    let mut w = halyard();
    w.args(["worker", "--sweep", sweep.to_str().unwrap(), "--nats", &nats.url()])
        .args(["--nats-user", ROLES[1].0, "--metrics", "off"])
        .arg("--state")
        .arg(dir.path().join("cp"))
        .env("HALYARD_NATS_PASSWORD", ROLES[1].2)
        .stderr(std::fs::File::create(&wlog).unwrap());
    let mut worker = ChildGuard::spawn(w);
    // Started before any run, the worker waits for the streams and its pool's consumer,
    // which only the coordinator makes.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&wlog).unwrap_or_default().contains("waiting for a coordinator")
    {
        assert!(std::time::Instant::now() < deadline, "the worker did not wait for its consumer");
        assert!(worker.try_wait().is_none(), "the worker exited");
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = halyard()
        .args(["coordinator", sweep.to_str().unwrap(), "--nats", &nats.url(), "--metrics", "off"])
        .args(["--nats-user", ROLES[0].0, "--out", out.to_str().unwrap()])
        .env("HALYARD_NATS_PASSWORD", ROLES[0].2)
        .output()
        .unwrap();
    let log = || std::fs::read_to_string(&wlog).unwrap_or_default();
    assert!(
        o.status.success(),
        "coordinator: {}\nworker: {}\nserver: {}",
        String::from_utf8_lossy(&o.stderr),
        log(),
        nats.log_tail(40)
    );
    let report = read_json(&out.join("perm/report.json"));
    assert_eq!(report["jobs"]["completed"], 60, "{report}");
    let st = halyard()
        .args(["status", "perm", "--json", "--nats", &nats.url(), "--nats-user", ROLES[2].0])
        .env("HALYARD_NATS_PASSWORD", ROLES[2].2)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&st.stdout);
    assert!(st.status.success(), "status: {}", String::from_utf8_lossy(&st.stderr));
    assert!(text.contains("\"perm\"") && text.contains("complete"), "{text}");
    worker.signal(libc::SIGTERM);
    let status = worker.wait_timeout(Duration::from_secs(30)).expect("worker did not stop");
    assert!(status.success(), "worker: {status:?}\n{}", log());
    let server_log = nats.log_tail(400);
    assert!(!server_log.contains("Violation"), "a role lacked a right:\n{server_log}");
    assert!(log().contains("left quota pool"), "{}", log());
}

/// Issue 33, item 5: only the coordinator (or `halyard broker init`, with its
/// credentials) creates streams and buckets. Worker credentials cannot create any stream
/// or bucket of the layout (each request refused and logged, nothing made); a worker's
/// open waits while they do not exist; `halyard broker init` creates them all, then finds
/// and checks them on a second run. A bucket made before Halyard with a republish is
/// refused by `halyard broker init` and by a worker's open, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_coordinator_shapes_the_broker() {
    let nats = server();
    let coordinator = connect(&nats, 0).await;
    let worker = connect(&nats, 1).await;
    let all = halyard_broker::layout::all(&coordinator, &Default::default(), 1);
    assert_eq!(all.len(), 9, "{:?}", all.iter().map(|c| &c.name).collect::<Vec<_>>());
    let apis: Vec<String> =
        all.iter().map(|c| format!("$JS.API.STREAM.CREATE.{}", c.name)).collect();
    for (api, cfg) in apis.iter().zip(&all) {
        let body = serde_json::to_string(cfg).unwrap();
        refused(&worker, "worker", api, &body, Duration::from_millis(500)).await;
    }
    violations_logged(&nats, "halyard-worker", &apis).await;
    for cfg in &all {
        assert!(coordinator.js.get_stream(&cfg.name).await.is_err(), "{} was made", cfg.name);
    }
    let waited = tokio::time::timeout(
        Duration::from_millis(800),
        halyard_broker::layout::open_streams(&worker),
    )
    .await;
    assert!(waited.is_err(), "a worker opened streams nobody made: {waited:?}");

    let init = || {
        let o = halyard()
            .args(["broker", "init", "--nats", &nats.url(), "--nats-user", ROLES[0].0])
            .env("HALYARD_NATS_PASSWORD", ROLES[0].2)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(o.status.success(), "broker init: {}{out}", String::from_utf8_lossy(&o.stderr));
        out
    };
    for (round, word) in [(1, "created"), (2, "checked")] {
        let out = init();
        for cfg in &all {
            assert!(
                out.lines().any(|l| l.split_whitespace().take(2).eq([cfg.name.as_str(), word])),
                "round {round}: {} not {word}:\n{out}",
                cfg.name
            );
        }
    }
    tokio::time::timeout(Duration::from_secs(10), halyard_broker::layout::open_streams(&worker))
        .await
        .expect("the worker opens the streams once they exist")
        .unwrap();
    let no_violation = nats.log_tail(400);
    assert!(
        !no_violation.contains("Violation - User \"halyard-coordinator\""),
        "broker init lacked a right:\n{no_violation}"
    );

    // A bucket shaped before Halyard to copy every record elsewhere (a broker without
    // roles, where anyone may create it).
    let open_nats = NatsServer::start();
    let anyone =
        halyard_broker::connect(&BrokerConfig::new(open_nats.url(), "anyone")).await.unwrap();
    let mut hostile = halyard_broker::layout::POOL_HEALTH.config(1);
    hostile.republish = Some(async_nats::jetstream::stream::Republish {
        source: "$KV.halyard_pool_health.>".into(),
        destination: "leak.>".into(),
        headers_only: false,
    });
    anyone.js.create_stream(hostile).await.unwrap();
    let o = halyard().args(["broker", "init", "--nats", &open_nats.url()]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "broker init accepted a republishing bucket");
    assert!(err.contains("KV_halyard_pool_health") && err.contains("leak.>"), "{err}");
    let opened = tokio::time::timeout(
        Duration::from_secs(10),
        halyard_broker::kv::open(&anyone, halyard_broker::layout::POOL_HEALTH),
    )
    .await
    .expect("an existing bucket is not waited for");
    let Err(err) = opened else { panic!("a worker opened a republishing bucket") };
    let err = err.to_string();
    assert!(err.contains("republishes"), "{err}");
}

/// Oversized messages (`halyard_broker::objects`) work with each role's own rights: a
/// worker stores a result object that the coordinator reads, the coordinator a job
/// object that the worker reads, and the coordinator deletes the run's objects. An
/// object read without its message's reference is sealed bytes (issue 33, item 6: worker
/// credentials may read every run's objects, and learn nothing of them). Bytes that do
/// not open with the reference's key (an object written by hand, as anyone with write
/// access to the bucket could) are refused, as is another run's object where a run is
/// expected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_work_with_role_credentials_and_forged_ones_are_refused() {
    use halyard_broker::objects::{self, ObjectError};
    let nats = server();
    let coordinator = connect(&nats, 0).await;
    let worker = connect(&nats, 1).await;
    halyard_broker::init(&coordinator, &Default::default()).await.unwrap();
    let run = uuid::Uuid::from_u128(0x005e_ed0b_1ec7);
    let result: Vec<u8> = (0..3u32 << 20).map(|i| (i % 251) as u8).collect();
    let job: Vec<u8> = (0..(2u32 << 20) + 5).map(|i| (i % 239) as u8).collect();
    let r = objects::put(&worker, run, &result).await.unwrap();
    assert_eq!(objects::fetch(&coordinator, &r, Some(run)).await.unwrap(), result);
    let j = objects::put(&coordinator, run, &job).await.unwrap();
    assert_eq!(objects::fetch(&worker, &j, None).await.unwrap(), job);
    // The same bytes again: the same object, stored once.
    assert_eq!(objects::put(&worker, run, &result).await.unwrap(), r);
    let other = uuid::Uuid::from_u128(0x07e1);
    assert!(matches!(
        objects::fetch(&coordinator, &r, Some(other)).await,
        Err(ObjectError::Invalid { .. })
    ));
    // Whoever may read the bucket but not the message (any worker credential, for every
    // run) reads sealed bytes: nothing of the job.
    let store = worker.js.get_object_store(objects::BUCKET).await.unwrap();
    let (name, _) = j.split_once('/').expect("a reference is <name>/<key>");
    let mut raw = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut store.get(name).await.unwrap(), &mut raw)
        .await
        .unwrap();
    assert_eq!(raw.len(), job.len() + 16);
    assert!(!raw.windows(64).any(|w| w == &job[4096..4160]), "the job's bytes are readable");
    // A name alone (no key) is refused, as is a key that did not make the name.
    for bad in [name.to_string(), format!("{name}/{}", "00".repeat(32))] {
        let err = objects::fetch(&worker, &bad, None).await.unwrap_err();
        assert!(matches!(err, ObjectError::Invalid { .. }), "{bad}: {err}");
    }
    // Forged: other bytes under the name of real ones (a worker may write any object).
    let real = objects::reference_of(run, b"the real job");
    let forged_name = objects::name_of(run, b"the real job");
    store.put(forged_name.as_str(), &mut &b"a forged job, not sealed"[..]).await.unwrap();
    let err = objects::fetch(&worker, &real, None).await.unwrap_err();
    assert!(matches!(err, ObjectError::Invalid { .. }), "{err}");
    assert!(err.to_string().contains("do not open with its key"), "{err}");
    assert_eq!(objects::delete_run(&coordinator, run).await.unwrap(), 3);
    assert!(matches!(objects::fetch(&worker, &j, None).await, Err(ObjectError::Missing { .. })));
    let log = nats.log_tail(400);
    assert!(!log.contains("Violation"), "a role lacked a right:\n{log}");
}

/// A provider batch record as a worker of pool `pool` writes it (submitted, leased).
fn batch_record(pool: &str, id: &str) -> halyard_proto::provider_batch::BatchRecord {
    use halyard_proto::provider_batch::{BatchRecord, BatchState};
    BatchRecord {
        id: id.into(),
        pool: pool.into(),
        model: "fake-model".into(),
        state: BatchState::Submitted { file: "file-1".into(), batch: "batch-1".into() },
        jobs: vec![halyard_proto::JobId([7; 16]).to_string()],
        tokens: 290,
        owner: "worker-a/1".into(),
        lease_until_ms: u64::MAX,
        created_ms: 1,
        submitted_ms: Some(2),
        ended_ms: None,
    }
}

/// The provider batches bucket (`halyard_batches`, batch mode) with each role's own
/// rights: a worker creates it as a batch pool's worker does, and reads, writes by
/// compare-and-set and deletes its keys; the coordinator and the status user read the
/// records (`halyard_broker::batches::records`: stream info, a key listing consumer,
/// direct gets) without any permission violation, but cannot write a key, and no role
/// can purge the bucket or delete its stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_bucket_is_written_by_workers_and_read_by_coordinator_and_status() {
    use async_nats::jetstream::kv::{Operation, UpdateErrorKind};
    use halyard_proto::provider_batch::{claim_key, ledger_key, QueueLedger, BATCHES_BUCKET};
    let nats = server();
    let coordinator = connect(&nats, 0).await;
    let worker = connect(&nats, 1).await;
    let status = connect(&nats, 2).await;
    // Before any batch pool ran: no bucket, no batches (and no violation for asking).
    assert!(halyard_broker::batches::records(&coordinator).await.is_empty());
    assert!(halyard_broker::batches::records(&status).await.is_empty());

    // The coordinator makes the bucket; the worker opens it as `Store::open` does.
    halyard_broker::init(&coordinator, &Default::default()).await.unwrap();
    let opened = tokio::time::timeout(
        Duration::from_secs(20),
        halyard_broker::kv::open(&worker, halyard_broker::layout::BATCHES),
    )
    .await;
    let (kv, _) = match opened {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => panic!("worker cannot open the batches bucket: {e}\n{}", nats.log_tail(20)),
        Err(_) => panic!("worker: opening the batches bucket timed out\n{}", nats.log_tail(20)),
    };
    // A record: written only if new (revision 0), then replaced by compare-and-set; a
    // stale revision is refused as such (not as a permission error).
    let pool = "fake-key";
    let mut record = batch_record(pool, "rec-1");
    let key = record.key();
    assert!(key.starts_with("r.fake-key."), "{key}");
    let r1 = kv.update(&key, serde_json::to_vec(&record).unwrap().into(), 0).await.unwrap();
    record.tokens = 300;
    let r2 = kv.update(&key, serde_json::to_vec(&record).unwrap().into(), r1).await.unwrap();
    assert!(r2 > r1);
    let stale = kv.update(&key, serde_json::to_vec(&record).unwrap().into(), r1).await;
    assert_eq!(stale.unwrap_err().kind(), UpdateErrorKind::WrongLastRevision);
    let entry = kv.entry(&key).await.unwrap().expect("the record");
    assert_eq!((entry.revision, entry.operation), (r2, Operation::Put));
    // A job's claim: created, read, released (deleted); the queue ledger.
    let claim = claim_key(pool, &halyard_proto::JobId([7; 16]));
    kv.create(&claim, r#"{"record":"rec-1"}"#.into()).await.unwrap();
    assert!(kv.get(&claim).await.unwrap().is_some());
    kv.delete(&claim).await.unwrap();
    let gone = kv.entry(&claim).await.unwrap().expect("the delete marker");
    assert_eq!(gone.operation, Operation::Delete);
    let ledger = QueueLedger { records: [("rec-1".to_string(), 300)].into() };
    kv.create(ledger_key(pool), serde_json::to_vec(&ledger).unwrap().into()).await.unwrap();

    // The coordinator and the status user read exactly that record.
    let readers = [("coordinator", &coordinator), ("status", &status)];
    for (who, b) in readers {
        let records = halyard_broker::batches::records(b).await;
        assert_eq!(records, vec![record.clone()], "{who} read the batches");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = nats.log_tail(400);
    assert!(!log.contains("Violation"), "a role lacked a right on the batches bucket:\n{log}");

    // Neither can write or delete a key (a denied publish: no ack, or an error), and no
    // role purges the bucket or deletes its stream (a denied request: no answer, or an
    // error). All at once: each refusal is a timeout.
    let mut refusals = tokio::task::JoinSet::new();
    for (who, b) in readers {
        let (b, key, claim) = (b.clone(), key.clone(), claim.clone());
        refusals.spawn(async move {
            let theirs = b.js.get_key_value(BATCHES_BUCKET).await.unwrap();
            let wait = Duration::from_secs(2);
            let forged = tokio::time::timeout(wait, theirs.put(&key, "{}".into())).await;
            assert!(!matches!(forged, Ok(Ok(_))), "{who} credentials wrote a batch record");
            let deleted = tokio::time::timeout(wait, theirs.delete(&claim)).await;
            assert!(!matches!(deleted, Ok(Ok(_))), "{who} credentials deleted a claim");
        });
    }
    let everyone = [("coordinator", &coordinator), ("worker", &worker), ("status", &status)];
    for (who, b) in everyone {
        for api in ["PURGE", "DELETE"] {
            let (b, api) = (b.clone(), format!("$JS.API.STREAM.{api}.KV_{BATCHES_BUCKET}"));
            refusals.spawn(async move {
                refused(&b, who, &api, "{}", Duration::from_secs(2)).await;
            });
        }
    }
    while let Some(r) = refusals.join_next().await {
        r.unwrap();
    }
    // The record is intact, and the server logged the refusals by user.
    assert_eq!(halyard_broker::batches::records(&coordinator).await, vec![record.clone()]);
    assert_eq!(kv.entry(&key).await.unwrap().expect("the record").revision, r2);
    assert_eq!(kv.entry(&claim).await.unwrap().expect("the claim").revision, gone.revision);
    let mut expected = Vec::new();
    for user in ["halyard-coordinator", "halyard-status"] {
        expected.push((user, format!("$KV.{BATCHES_BUCKET}.{key}")));
        expected.push((user, format!("$KV.{BATCHES_BUCKET}.{claim}")));
    }
    for user in ["halyard-coordinator", "halyard-worker", "halyard-status"] {
        expected.push((user, "$JS.API.STREAM.PURGE.KV_halyard_batches".into()));
        expected.push((user, "$JS.API.STREAM.DELETE.KV_halyard_batches".into()));
    }
    let needles: Vec<String> = expected
        .iter()
        .map(|(user, subject)| {
            format!("Publish Violation - User \"{user}\", Subject \"{subject}\"")
        })
        .collect();
    let log = log_holding(&nats, &needles).await;
    for needle in needles {
        assert!(log.lines().any(|l| l.contains(&needle)), "no {needle}:\n{log}");
    }
}

/// A HypoTermQA sweep of `limit` questions whose model and judge run in batch mode
/// against the fake provider at `base_url`.
fn batch_sweep(dir: &Path, base_url: &str, limit: usize) -> PathBuf {
    let model = |name: &str, model: &str| {
        format!(
            "[[model]]\nname = \"{name}\"\nbackend = \"openai\"\nbase_url = \"{base_url}\"\n\
             model = \"{model}\"\npool = \"fake-key\"\nmax_tokens = 256\n\
             mode = \"batch\"\nbatch_size = 1000\nbatch_wait_s = 0.3\n\n"
        )
    };
    let p = dir.join("permb.toml");
    std::fs::write(
        &p,
        format!(
            "name = \"permb\"\n\n{}{}[[benchmark]]\npipeline = \"hypotermqa\"\n\
             dataset = \"{}\"\nmodels = [\"model-a\"]\njudge = \"judge-a\"\n\
             semantics = \"paper\"\nlimit = {limit}\n\n[run]\nack_wait_s = 3\nmax_deliver = 3\n",
            model("model-a", "fake-model"),
            model("judge-a", "fake-judge"),
            common::dataset().display()
        ),
    )
    .unwrap();
    p
}

/// A batch-mode sweep runs to the end with each role's own credentials: the worker
/// process keeps its provider batches in `halyard_batches`, the coordinator process
/// reads them for its progress, and `halyard status` with the read-only user shows a
/// batch while the provider holds it; the server logs no permission violation.
#[test]
fn a_batch_mode_run_works_with_role_credentials() {
    use halyard_tests::fake_openai::BatchScript;
    use halyard_tests::{FakeOpenAi, Gate};
    let qs = common::load_questions(20);
    let fake = FakeOpenAi::start_blocking(common::responder(common::question_index(&qs), None));
    // The first batch is held at the provider until `halyard status` has shown it.
    let hold = Gate::new();
    fake.set_batch_script(BatchScript { hold: Some(hold.clone()), ..BatchScript::default() });
    let nats = server();
    let dir = tempfile::tempdir().unwrap();
    let sweep = batch_sweep(dir.path(), &fake.base_url(), 20);
    let out = dir.path().join("runs");
    let (wlog, clog) = (dir.path().join("worker.log"), dir.path().join("coordinator.log"));
    let batch_env = [("HALYARD_BATCH_POLL_MS", "100"), ("HALYARD_BATCH_LEASE_MS", "2000")];
    let mut w = halyard();
    w.args(["worker", "--sweep", sweep.to_str().unwrap(), "--nats", &nats.url()])
        .args(["--nats-user", ROLES[1].0, "--metrics", "off"])
        .arg("--state")
        .arg(dir.path().join("cp"))
        .envs(batch_env)
        .env("HALYARD_NATS_PASSWORD", ROLES[1].2)
        .stderr(std::fs::File::create(&wlog).unwrap());
    let mut worker = ChildGuard::spawn(w);
    let mut c = halyard();
    c.args(["coordinator", sweep.to_str().unwrap(), "--nats", &nats.url(), "--metrics", "off"])
        .args(["--nats-user", ROLES[0].0, "--out", out.to_str().unwrap()])
        .envs(batch_env)
        .env("HALYARD_NATS_PASSWORD", ROLES[0].2)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&clog).unwrap());
    let mut coordinator = ChildGuard::spawn(c);
    let logs = || {
        format!(
            "coordinator: {}\nworker: {}\nserver: {}",
            std::fs::read_to_string(&clog).unwrap_or_default(),
            std::fs::read_to_string(&wlog).unwrap_or_default(),
            nats.log_tail(40)
        )
    };
    // `halyard status --nats` as the read-only user: the held batch, submitted.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        assert!(std::time::Instant::now() < deadline, "no batch shown by status\n{}", logs());
        assert!(coordinator.try_wait().is_none(), "the coordinator exited early\n{}", logs());
        let st = halyard()
            .args(["status", "permb", "--nats", &nats.url(), "--nats-user", ROLES[2].0])
            .env("HALYARD_NATS_PASSWORD", ROLES[2].2)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&st.stdout);
        if text.contains("provider batches:") && text.contains("submitted") {
            assert!(text.contains("fake-key: 1 submitted batch, "), "{text}");
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    hold.open();
    let status = coordinator.wait_timeout(Duration::from_secs(120)).expect("the run did not end");
    assert!(status.success(), "coordinator: {status:?}\n{}", logs());
    let report = read_json(&out.join("permb/report.json"));
    assert_eq!(report["jobs"]["dead_letters"], 0, "{report}");
    assert_eq!(fake.call_count(), 0, "online calls in batch mode");
    assert!(!fake.batch_requests().is_empty(), "no request ran in a batch");
    worker.signal(libc::SIGTERM);
    let status = worker.wait_timeout(Duration::from_secs(30)).expect("worker did not stop");
    assert!(status.success(), "worker: {status:?}\n{}", logs());
    let server_log = nats.log_tail(400);
    assert!(!server_log.contains("Violation"), "a role lacked a right:\n{server_log}");
}

/// Issue 34: the coordinator makes each pool's consumer when it plans the run, with its
/// own credentials and before any worker joins, so an autoscaler reading the consumer's
/// lag (KEDA) sees the pool's queued jobs from the first one, not the stream's last
/// sequence.
#[tokio::test]
async fn the_coordinator_makes_each_pools_consumer_before_any_worker() {
    let nats = server();
    let dir = tempfile::tempdir().unwrap();
    let sweep = sweep(dir.path(), 30);
    let out = dir.path().join("runs");
    let clog = dir.path().join("coordinator.log");
    let mut c = halyard();
    c.args(["coordinator", sweep.to_str().unwrap(), "--nats", &nats.url(), "--metrics", "off"])
        .args(["--nats-user", ROLES[0].0, "--out", out.to_str().unwrap()])
        .env("HALYARD_NATS_PASSWORD", ROLES[0].2)
        .stderr(std::fs::File::create(&clog).unwrap());
    let mut coordinator = ChildGuard::spawn(c);
    let observer = connect(&nats, 0).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let pending = loop {
        let info = async {
            let mut s = observer.js.get_stream(subjects::JOBS_STREAM).await.ok()?;
            let _ = s.info().await.ok()?;
            let mut c = s
                .get_consumer::<async_nats::jetstream::consumer::pull::Config>(
                    &subjects::pool_consumer("free"),
                )
                .await
                .ok()?;
            c.info().await.ok().map(|i| i.num_pending)
        };
        match info.await {
            Some(n) if n == 30 => break n,
            _ if std::time::Instant::now() > deadline => panic!(
                "no consumer pool-free holding the 30 jobs: {}\n{}",
                std::fs::read_to_string(&clog).unwrap_or_default(),
                nats.log_tail(40)
            ),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    assert_eq!(pending, 30);
    coordinator.signal(libc::SIGTERM);
    let _ = coordinator.wait_timeout(Duration::from_secs(30));
    let server_log = nats.log_tail(400);
    assert!(!server_log.contains("Violation"), "the coordinator lacked a right:\n{server_log}");
}

/// A worker user kept to pool `pool` (the book's "Broker security" and the comment of
/// deploy/nats/permissions.conf say how): the shipped worker role with every subject that
/// names pools narrowed to `pool`'s, under the name `user`. Returned as the text that goes
/// before the shipped file's `users = [` line, that line included.
fn pool_worker_user(shipped: &str, pool: &str, user: &str, password: &str) -> String {
    let start = shipped.find("  HALYARD_WORKER = {").expect("the shipped worker role");
    let len = shipped[start..].find("\n  }\n").expect("the end of the worker role") + 5;
    let token = subjects::pool_token(pool);
    let hex: String = pool.bytes().map(|b| format!("{b:02x}")).collect();
    let consumer = subjects::pool_consumer(pool);
    let mut role = shipped[start..start + len].replacen("HALYARD_WORKER", "POOL_WORKER", 1);
    for (from, to) in [
        ("\"halyard.results.>\"".to_string(), format!("\"halyard.results.*.{token}\"")),
        (
            "\"$JS.API.CONSUMER.INFO.HALYARD_JOBS.*\"".into(),
            format!("\"$JS.API.CONSUMER.INFO.HALYARD_JOBS.{consumer}\""),
        ),
        (
            "\"$JS.API.CONSUMER.MSG.NEXT.HALYARD_JOBS.*\"".into(),
            format!("\"$JS.API.CONSUMER.MSG.NEXT.HALYARD_JOBS.{consumer}\""),
        ),
        ("\"$JS.ACK.HALYARD_JOBS.>\"".into(), format!("\"$JS.ACK.HALYARD_JOBS.{consumer}.>\"")),
        ("\"$KV.halyard_pool_health.>\"".into(), format!("\"$KV.halyard_pool_health.{token}\"")),
        (
            "\"$KV.halyard_delivery_budget.>\"".into(),
            format!("\"$KV.halyard_delivery_budget.{token}.>\""),
        ),
        ("\"halyard.quota.>\"".into(), format!("\"halyard.quota.{hex}\"")),
        (
            "\"$KV.halyard_quota_members.>\"".into(),
            format!("\"$KV.halyard_quota_members.{hex}.>\""),
        ),
        ("\"_INBOX_halyard-worker.>\"".into(), format!("\"_INBOX_{user}.>\"")),
    ] {
        assert!(role.contains(&from), "the shipped worker role has no {from}");
        role = role.replace(&from, &to);
    }
    format!(
        "{role}\n  users = [\n    {{ user: \"{user}\", password: \"{password}\", permissions: $POOL_WORKER }}\n"
    )
}

/// Issue 33, items 1 and 6: a worker user kept to one pool (every subject that names a
/// pool narrowed to it, [`pool_worker_user`]) runs that pool's jobs to the end with no
/// violation, and cannot touch another pool: publish its results, pull or ack its jobs,
/// pause it (its health record), spend or excuse its jobs' delivery budgets, or write its
/// quota membership. The coordinator, which takes a result only from its job's pool's
/// subject, then never takes this user's answers for another pool's jobs.
#[test]
fn a_worker_user_kept_to_one_pool_touches_no_other_pool() {
    for (_, var, pw) in ROLES {
        std::env::set_var(var, pw);
    }
    let dir = tempfile::tempdir().unwrap();
    let shipped =
        std::fs::read_to_string(repo_root().join("deploy/nats/permissions.conf")).unwrap();
    assert!(shipped.contains("  users = [\n"), "the shipped file's users list moved");
    let user = pool_worker_user(&shipped, "free", "worker-free", "worker-free-pw");
    let conf = dir.path().join("permissions.conf");
    std::fs::write(&conf, shipped.replacen("  users = [\n", &user, 1)).unwrap();
    let nats = NatsServer::start_with_args(&["-c", conf.to_str().unwrap()]);

    // A whole run (a quota pool: membership, announcements) with that user as the worker.
    let sweep = sweep(dir.path(), 40);
    let out = dir.path().join("runs");
    let wlog = dir.path().join("worker.log");
    let mut w = halyard();
    w.args(["worker", "--sweep", sweep.to_str().unwrap(), "--nats", &nats.url()])
        .args(["--nats-user", "worker-free", "--metrics", "off"])
        .arg("--state")
        .arg(dir.path().join("cp"))
        .env("HALYARD_NATS_PASSWORD", "worker-free-pw")
        .stderr(std::fs::File::create(&wlog).unwrap());
    let mut worker = ChildGuard::spawn(w);
    let o = halyard()
        .args(["coordinator", sweep.to_str().unwrap(), "--nats", &nats.url(), "--metrics", "off"])
        .args(["--nats-user", ROLES[0].0, "--out", out.to_str().unwrap()])
        .env("HALYARD_NATS_PASSWORD", ROLES[0].2)
        .output()
        .unwrap();
    let log = || std::fs::read_to_string(&wlog).unwrap_or_default();
    assert!(
        o.status.success(),
        "coordinator: {}\nworker: {}",
        String::from_utf8_lossy(&o.stderr),
        log()
    );
    assert_eq!(read_json(&out.join("perm/report.json"))["jobs"]["completed"], 40);
    worker.signal(libc::SIGTERM);
    let status = worker.wait_timeout(Duration::from_secs(30)).expect("worker did not stop");
    assert!(status.success(), "worker: {status:?}\n{}", log());
    assert!(log().contains("left quota pool"), "{}", log());
    let server_log = nats.log_tail(400);
    assert!(!server_log.contains("Violation"), "the pool's user lacked a right:\n{server_log}");

    // Another pool, "paid": each of these is refused.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let auth = NatsAuth {
            user: Some("worker-free".into()),
            password: Some("worker-free-pw".into()),
            ..Default::default()
        };
        let b =
            halyard_broker::connect(&BrokerConfig::new(nats.url(), "worker-free").with_auth(auth))
                .await
                .unwrap();
        let paid_hex: String = "paid".bytes().map(|b| format!("{b:02x}")).collect();
        let run = uuid::Uuid::now_v7();
        let denied = [
            subjects::result_subject(run, "paid"),
            "$KV.halyard_pool_health.paid".to_string(),
            "$KV.halyard_delivery_budget.paid.7".to_string(),
            format!("$KV.halyard_quota_members.{paid_hex}.00"),
            format!("halyard.quota.{paid_hex}"),
            format!("$JS.API.CONSUMER.MSG.NEXT.{}.pool-paid", subjects::JOBS_STREAM),
            format!("$JS.ACK.{}.pool-paid.1.1.1.1.1", subjects::JOBS_STREAM),
        ];
        for subject in &denied {
            b.client.publish(subject.clone(), "forged".into()).await.unwrap();
        }
        b.client.flush().await.unwrap();
        // ... while its own pool's records are written (the baseline of the same calls).
        let js = &b.js;
        let ok = js.publish(subjects::result_subject(run, "free"), "result".into()).await.unwrap();
        assert!(ok.await.is_ok(), "the pool's own results subject was refused");
        violations_logged(&nats, "worker-free", &denied).await;
    });
}

//! Issue 13: the shipped per-role broker permissions (`deploy/nats/permissions.conf`) on
//! a real nats-server: a whole run works with each role's own credentials (coordinator,
//! worker and status as separate processes), and worker or status credentials cannot
//! publish a job or delete a message.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{halyard, read_json, repo_root};
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
/// delete the pool's consumer or the stream, or listen to results or the coordinator's
/// replies; the coordinator's can publish jobs (the baseline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_credentials_cannot_publish_jobs_or_delete_messages() {
    let nats = server();
    let coordinator = connect(&nats, 0).await;
    halyard_broker::ensure_streams(&coordinator).await.unwrap();
    let subject = subjects::job_subject("free");
    coordinator.js.publish(subject.clone(), "job".into()).await.unwrap().await.unwrap();
    let worker = connect(&nats, 1).await;
    halyard_broker::pool_consumer(&worker, "free", Default::default()).await.unwrap();
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
        ] {
            let r = tokio::time::timeout(
                Duration::from_secs(1),
                b.client.request(api.clone(), body.to_string().into()),
            )
            .await;
            if let Ok(Ok(reply)) = r {
                let text = String::from_utf8_lossy(&reply.payload).into_owned();
                assert!(text.contains("\"error\""), "{who}: {api} answered {text}");
            }
        }
        assert_eq!(count().await, 1, "{who} credentials removed a job");
        // Nor read results: not as they are published, not from the coordinator's replies.
        for subject in ["halyard.results.>", "_INBOX_halyard-coordinator.>", "_INBOX.>"] {
            let _sub = b.client.subscribe(subject).await.unwrap();
            b.client.flush().await.unwrap();
        }
    }
    // The server refused them as permission violations, by user.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = nats.log_tail(400);
    for user in ["halyard-worker", "halyard-status"] {
        for (kind, subject) in [
            ("Publish", "halyard.jobs.free"),
            ("Publish", "$JS.API.STREAM.MSG.DELETE.HALYARD_JOBS"),
            ("Subscription", "halyard.results.>"),
            ("Subscription", "_INBOX_halyard-coordinator.>"),
        ] {
            let needle = format!("{kind} Violation - User \"{user}\", Subject \"{subject}\"");
            assert!(
                log.lines().any(|l| l.contains(&needle)),
                "no violation for {user} on {subject}:\n{log}"
            );
        }
    }
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

/// Oversized messages (`halyard_broker::objects`) work with each role's own rights: a
/// worker stores a result object that the coordinator reads, the coordinator a job
/// object that the worker reads, and the coordinator deletes the run's objects. Bytes
/// that do not hash to their name (an object written by hand, as anyone with write access
/// to the bucket could) are refused, as is another run's object where a run is expected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_work_with_role_credentials_and_forged_ones_are_refused() {
    use halyard_broker::objects::{self, ObjectError};
    let nats = server();
    let coordinator = connect(&nats, 0).await;
    let worker = connect(&nats, 1).await;
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
    // Forged: other bytes under the name of real ones.
    let forged_name = objects::name_of(run, b"the real job");
    let store = worker.js.get_object_store(objects::BUCKET).await.unwrap();
    store.put(forged_name.as_str(), &mut &b"a forged job"[..]).await.unwrap();
    let err = objects::fetch(&worker, &forged_name, None).await.unwrap_err();
    assert!(matches!(err, ObjectError::Invalid { .. }), "{err}");
    assert!(err.to_string().contains("do not hash to its name"), "{err}");
    assert_eq!(objects::delete_run(&coordinator, run).await.unwrap(), 3);
    assert!(matches!(objects::fetch(&worker, &j, None).await, Err(ObjectError::Missing { .. })));
    let log = nats.log_tail(400);
    assert!(!log.contains("Violation"), "a role lacked a right:\n{log}");
}

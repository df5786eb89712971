//! Issue 49: a worker credential in the wrong hands stalls nothing and forges nothing.
//! Each test does one attack as the issue describes it, with the role credentials as
//! shipped (`deploy/nats/permissions.conf`) on a real nats-server.

use std::time::Duration;

use halyard_broker::auth::NatsAuth;
use halyard_broker::objects::{self, ObjectError};
use halyard_broker::{Broker, BrokerConfig};
use halyard_tests::NatsServer;

use crate::common::repo_root;

const ROLES: [(&str, &str, &str); 3] = [
    ("halyard-coordinator", "HALYARD_COORDINATOR_PASSWORD", "coord-pw-81f2"),
    ("halyard-worker", "HALYARD_WORKER_PASSWORD", "worker-pw-37c9"),
    ("halyard-status", "HALYARD_STATUS_PASSWORD", "status-pw-a0d4"),
];

/// A nats-server with JetStream and the shipped permissions (the same passwords as
/// `broker_permissions`, set in the test process's environment for the server to read).
fn server() -> NatsServer {
    for (_, var, pw) in ROLES {
        std::env::set_var(var, pw);
    }
    let conf = repo_root().join("deploy/nats/permissions.conf");
    NatsServer::start_with_args(&["-c", conf.to_str().unwrap()])
}

async fn connect(nats: &NatsServer, role: usize) -> Broker {
    let auth = NatsAuth {
        user: Some(ROLES[role].0.into()),
        password: Some(ROLES[role].2.into()),
        ..Default::default()
    };
    let cfg = BrokerConfig::new(nats.url(), ROLES[role].0).with_auth(auth);
    halyard_broker::connect(&cfg).await.unwrap()
}

/// URL-safe base64 with padding, as the object store names an object's metadata subject.
fn base64_url(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = c.iter().enumerate().fold(0u32, |n, (i, b)| n | (*b as u32) << (16 - 8 * i));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Publish `metadata` as the metadata of object `name` (what a worker credential may do:
/// `$O.halyard_objects.>`), acknowledged by the stream.
pub(crate) async fn write_metadata(b: &Broker, name: &str, metadata: &[u8]) {
    let subject = format!("$O.{}.M.{}", objects::BUCKET, base64_url(name.as_bytes()));
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Rollup", "sub");
    let ack = b.js.publish_with_headers(subject, headers, metadata.to_vec().into()).await.unwrap();
    ack.await.expect("the object bucket took the metadata");
}

/// Item 1: with the shipped worker credentials, an object's metadata made a link to
/// itself, metadata that is not an object's, and metadata naming chunks never stored
/// are refused, each within a deadline (the link loop overflowed the reader's stack,
/// the garbage was nak'd as transient for ever); same-size garbage put under an honest
/// object's name is replaced by the next put of the honest bytes (the put compared sizes
/// and skipped it); the run's objects are still deleted around the junk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_object_metadata_is_refused_within_a_deadline() {
    let nats = server();
    let coordinator = connect(&nats, 0).await;
    let worker = connect(&nats, 1).await;
    halyard_broker::init(&coordinator, &Default::default()).await.unwrap();
    let run = uuid::Uuid::from_u128(0x4949_0001);
    let bucket = objects::BUCKET;

    // A link to itself.
    let looped = b"a result that was never stored".to_vec();
    let name = objects::name_of(run, &looped);
    let link = format!(
        r#"{{"name":"{name}","bucket":"{bucket}","nuid":"AAAA","size":0,"chunks":0,
            "options":{{"link":{{"name":"{name}","bucket":"{bucket}"}}}}}}"#
    );
    write_metadata(&worker, &name, link.as_bytes()).await;
    let reference = objects::reference_of(run, &looped);
    let err = tokio::time::timeout(
        Duration::from_secs(60),
        objects::fetch(&coordinator, &reference, Some(run)),
    )
    .await
    .expect("reading a self-linked object did not end")
    .unwrap_err();
    assert!(
        matches!(err, ObjectError::Invalid { .. }) && err.to_string().contains("link"),
        "{err}"
    );

    // Metadata that does not parse: refused for good, not retried.
    let garbage = b"metadata that is no object".to_vec();
    let name = objects::name_of(run, &garbage);
    write_metadata(&worker, &name, b"{not json").await;
    let err = objects::fetch(&coordinator, &objects::reference_of(run, &garbage), Some(run))
        .await
        .unwrap_err();
    assert!(matches!(err, ObjectError::Invalid { .. }), "{err}");
    assert!(!err.is_transient(), "{err}");

    // Chunks that were never stored: refused at once and for good (chunks are stored
    // before their metadata, so none there means none is coming), not waited on.
    let missing = b"chunks that never came".to_vec();
    let name = objects::name_of(run, &missing);
    let meta = format!(
        r#"{{"name":"{name}","bucket":"{bucket}","nuid":"NoSuchChunks","size":4096,"chunks":4}}"#
    );
    write_metadata(&worker, &name, meta.as_bytes()).await;
    let began = std::time::Instant::now();
    let err = tokio::time::timeout(
        objects::CHUNK_WAIT * 4,
        objects::fetch(&coordinator, &objects::reference_of(run, &missing), Some(run)),
    )
    .await
    .expect("reading an object whose chunks never come did not end")
    .unwrap_err();
    assert!(matches!(err, ObjectError::Invalid { .. }), "{err}");
    assert!(!err.is_transient(), "{err}");
    assert!(err.to_string().contains("not stored"), "{err}");
    println!("chunks never stored: given up after {:.1} s", began.elapsed().as_secs_f64());

    // Same-size garbage under an honest object's name, before the honest put.
    let honest: Vec<u8> = (0..(2u32 << 20) + 3).map(|i| (i % 241) as u8).collect();
    let name = objects::name_of(run, &honest);
    let store = worker.js.get_object_store(bucket).await.unwrap();
    let junk = vec![0x5a; honest.len() + 16];
    store.put(name.as_str(), &mut &junk[..]).await.unwrap();
    let reference = objects::put(&coordinator, run, &honest).await.unwrap();
    assert_eq!(objects::fetch(&worker, &reference, None).await.unwrap(), honest);
    // ... and a second put of the same bytes finds them there (one object per content).
    assert_eq!(objects::put(&worker, run, &honest).await.unwrap(), reference);
    assert_eq!(objects::fetch(&coordinator, &reference, Some(run)).await.unwrap(), honest);

    // The run's objects go with the junk among them (the garbage metadata is passed over).
    let deleted = objects::delete_run(&coordinator, run).await.unwrap();
    assert!(deleted >= 1, "{deleted}");
    let err = objects::fetch(&coordinator, &reference, Some(run)).await.unwrap_err();
    assert!(matches!(err, ObjectError::Missing { .. }), "{err}");
}

/// A sweep of `jobs` noop jobs in pool `free`, named `hostile`.
fn sweep(dir: &std::path::Path, jobs: u64) -> std::path::PathBuf {
    let p = dir.join("hostile.toml");
    std::fs::write(
        &p,
        format!(
            "name = \"hostile\"\n\n[[model]]\nname = \"free\"\nbackend = \"noop\"\n\
             max_concurrency = 8\n\n[[benchmark]]\npipeline = \"noop\"\njobs = {jobs}\n\
             models = [\"free\"]\n\n[run]\nack_wait_s = 5\n"
        ),
    )
    .unwrap();
    p
}

/// The shipped permissions with one more user, `admin`, allowed everything: the
/// operator, who shapes the broker in a test where Halyard's own roles may not.
fn server_with_admin(dir: &std::path::Path) -> NatsServer {
    for (_, var, pw) in ROLES {
        std::env::set_var(var, pw);
    }
    let shipped =
        std::fs::read_to_string(repo_root().join("deploy/nats/permissions.conf")).unwrap();
    let admin = "  users = [\n    { user: \"admin\", password: \"admin-pw-5c1e\" }\n";
    assert!(shipped.contains("  users = [\n"), "the shipped file's users list moved");
    let conf = dir.join("permissions.conf");
    std::fs::write(&conf, shipped.replacen("  users = [\n", admin, 1)).unwrap();
    NatsServer::start_with_args(&["-c", conf.to_str().unwrap()])
}

/// Item 2: with the shipped worker credentials, the results stream is filled with
/// results of a run nobody takes until the broker refuses more. A run started then
/// finishes, every job answered: its coordinator, finding no result and the stream
/// full, purges the results of runs that are neither its own nor unfinished, and says
/// so. (Before, every result of the next run was refused with "maximum bytes exceeded"
/// and the run hung with no stall report.) The stream is made smaller than Halyard's
/// 2 GiB by the operator (a smaller limit is warned about, not refused), so that the
/// test fills it in seconds.
#[test]
fn a_results_stream_filled_from_a_worker_credential_stalls_no_run() {
    const LIMIT: i64 = 24 << 20;
    let dir = tempfile::tempdir().unwrap();
    let nats = server_with_admin(dir.path());
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let filled = rt.block_on(async {
        let admin =
            halyard_broker::connect(&BrokerConfig::new(nats.url(), "admin").with_auth(NatsAuth {
                user: Some("admin".into()),
                password: Some("admin-pw-5c1e".into()),
                ..Default::default()
            }))
            .await
            .unwrap();
        let [_, mut results] = halyard_broker::layout::streams(&admin, 1);
        results.max_bytes = LIMIT;
        admin.js.create_stream(results).await.unwrap();
        let worker = connect(&nats, 1).await;
        let made_up = uuid::Uuid::now_v7();
        // Large junk first, then smaller, until not even a few bytes fit.
        let mut stored = 0u64;
        for size in [512 << 10, 32 << 10, 2 << 10, 128, 1] {
            let junk = vec![0x4au8; size];
            loop {
                let subject = halyard_proto::subjects::result_subject(made_up, "free");
                let ack = worker.js.publish(subject, junk.clone().into()).await.unwrap();
                match ack.await {
                    Ok(_) => stored += size as u64,
                    Err(e) => {
                        assert!(e.to_string().contains("maximum bytes"), "{e}");
                        break;
                    }
                }
                assert!(stored < 2 * LIMIT as u64, "the stream took more than its limit");
            }
        }
        stored
    });
    assert!(filled >= (LIMIT as u64) * 9 / 10, "filled {filled}");

    let sweep = sweep(dir.path(), 40);
    let out = dir.path().join("runs");
    let wlog = dir.path().join("worker.log");
    let clog = dir.path().join("coordinator.log");
    let mut w = crate::common::halyard();
    w.args(["worker", "--sweep", sweep.to_str().unwrap(), "--nats", &nats.url()])
        .args(["--nats-user", ROLES[1].0, "--metrics", "off"])
        .arg("--state")
        .arg(dir.path().join("cp"))
        .env("HALYARD_NATS_PASSWORD", ROLES[1].2)
        .stderr(std::fs::File::create(&wlog).unwrap());
    let mut worker = halyard_tests::ChildGuard::spawn(w);
    let mut c = crate::common::halyard();
    c.args(["coordinator", sweep.to_str().unwrap(), "--nats", &nats.url(), "--metrics", "off"])
        .args(["--nats-user", ROLES[0].0, "--out", out.to_str().unwrap()])
        .env("HALYARD_NATS_PASSWORD", ROLES[0].2)
        .stderr(std::fs::File::create(&clog).unwrap());
    let mut coordinator = halyard_tests::ChildGuard::spawn(c);
    let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
    let status = coordinator.wait_timeout(Duration::from_secs(300));
    assert!(
        status.is_some_and(|s| s.success()),
        "the run did not finish: {status:?}\ncoordinator: {}\nworker: {}",
        read(&clog),
        read(&wlog)
    );
    let report = crate::common::read_json(&out.join("hostile/report.json"));
    assert_eq!(report["jobs"]["completed"], 40, "{report}");
    assert!(read(&clog).contains("purged the results of other runs"), "{}", read(&clog));
    worker.signal(libc::SIGTERM);
    worker.wait_timeout(Duration::from_secs(30)).expect("worker did not stop");
    let server_log = nats.log_tail(400);
    assert!(
        !server_log.contains("Violation - User \"halyard-coordinator\""),
        "the coordinator lacked a right:\n{server_log}"
    );
}

/// Item 1 as the issue reproduced it, during a run: with the shipped worker credentials,
/// results messages naming an object whose metadata links to itself (one took the
/// coordinator down: "stack overflow", exit 134) and 300 naming objects whose metadata
/// does not parse (nak'd as transient for ever, filling the consumer's ack-pending
/// limit) reach the run's coordinator before any worker. The run completes with every job,
/// and each forged message is counted as refused.
#[test]
fn results_naming_forged_objects_stop_no_run() {
    const FORGED: u64 = 300;
    let dir = tempfile::tempdir().unwrap();
    let nats = server();
    let sweep = sweep(dir.path(), 40);
    let out = dir.path().join("runs");
    let clog = dir.path().join("coordinator.log");
    let mut c = crate::common::halyard();
    c.args(["coordinator", sweep.to_str().unwrap(), "--nats", &nats.url(), "--metrics", "off"])
        .args(["--nats-user", ROLES[0].0, "--out", out.to_str().unwrap()])
        .env("HALYARD_NATS_PASSWORD", ROLES[0].2)
        .stderr(std::fs::File::create(&clog).unwrap());
    let mut coordinator = halyard_tests::ChildGuard::spawn(c);
    let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        // The run's id, from the status bucket (the status role reads it).
        let status = connect(&nats, 2).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        let run = loop {
            let entries = halyard_broker::status::entries(&status, "halyard_status")
                .await
                .unwrap_or_default();
            let run = entries.iter().find_map(|(_, v)| {
                let v: serde_json::Value = serde_json::from_slice(v).ok()?;
                uuid::Uuid::try_parse(v["run"].as_str()?).ok()
            });
            if let Some(run) = run {
                break run;
            }
            assert!(std::time::Instant::now() < deadline, "no run status:\n{}", read(&clog));
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let worker = connect(&nats, 1).await;
        let bucket = objects::BUCKET;
        let looped = b"a looped result".to_vec();
        let name = objects::name_of(run, &looped);
        let link = format!(
            r#"{{"name":"{name}","bucket":"{bucket}","nuid":"AAAA","size":0,"chunks":0,
                "options":{{"link":{{"name":"{name}","bucket":"{bucket}"}}}}}}"#
        );
        write_metadata(&worker, &name, link.as_bytes()).await;
        let mut references = vec![objects::reference_of(run, &looped)];
        for i in 0..FORGED - 1 {
            let content = format!("garbage metadata {i}").into_bytes();
            write_metadata(&worker, &objects::name_of(run, &content), b"{not json").await;
            references.push(objects::reference_of(run, &content));
        }
        let subject = halyard_proto::subjects::result_subject(run, "free");
        for reference in references {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(objects::HEADER, reference.as_str());
            let ack = worker
                .js
                .publish_with_headers(subject.clone(), headers, Vec::new().into())
                .await
                .unwrap();
            ack.await.expect("the results stream took the forged message");
        }
    });
    let wlog = dir.path().join("worker.log");
    let mut w = crate::common::halyard();
    w.args(["worker", "--sweep", sweep.to_str().unwrap(), "--nats", &nats.url()])
        .args(["--nats-user", ROLES[1].0, "--metrics", "off"])
        .arg("--state")
        .arg(dir.path().join("cp"))
        .env("HALYARD_NATS_PASSWORD", ROLES[1].2)
        .stderr(std::fs::File::create(&wlog).unwrap());
    let mut worker = halyard_tests::ChildGuard::spawn(w);
    let status = coordinator.wait_timeout(Duration::from_secs(300));
    assert!(
        status.is_some_and(|s| s.success()),
        "the run did not finish: {status:?}\ncoordinator: {}\nworker: {}",
        read(&clog),
        read(&wlog)
    );
    let report = crate::common::read_json(&out.join("hostile/report.json"));
    assert_eq!(report["jobs"]["completed"], 40, "{report}");
    let status = crate::common::read_json(&out.join("hostile/status.json"));
    assert_eq!(status["refused_messages"], FORGED, "{status}\n{}", read(&clog));
    worker.signal(libc::SIGTERM);
    worker.wait_timeout(Duration::from_secs(30)).expect("worker did not stop");
}

/// Item 8: a managed server's environment and its whole process tree. The server's
/// command is a shell that starts a grandchild (as vLLM starts its API and engine
/// processes), writes its environment, then becomes `fake-server`. No Halyard secret
/// (`HALYARD_*`) nor an API key variable (`*_API_KEY`) reaches it, while HOME and the
/// `HF_*` and cache variables do; and once the worker is killed with SIGKILL, the server
/// and its grandchild are gone within seconds (the parent-death signal reached the
/// server only, and the grandchild lived on).
#[test]
fn a_managed_servers_environment_and_process_tree_hold_no_secret_and_die_with_the_worker() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let fake = halyard_tests::cargo_bin("fake-server");
    let script = format!(
        "sleep 600 & echo $! > {d}/grandchild.pid; env > {d}/server-env.tmp; \
         mv {d}/server-env.tmp {d}/server-env.txt; \
         exec {fake} --port {{port}} --answers hypotermqa --model {{model_path}}",
        d = d.display(),
        fake = fake.display()
    );
    let sweep = d.join("srv.toml");
    std::fs::write(
        &sweep,
        format!(
            "name = \"srv\"\n\n[[model]]\nname = \"model-a\"\nbackend = \"server\"\n\
             command = [\"sh\", \"-c\", {script:?}]\nmodel_path = \"{d}/weights/model-a\"\n\
             revision = \"r1\"\nversion = \"fake-1.0\"\nversion_path = \"/version\"\n\
             gpus = 0\nmax_concurrency = 2\nmax_tokens = 64\nstart_timeout_s = 120\n\n\
             [[benchmark]]\npipeline = \"noop\"\njobs = 2\nmodels = [\"model-a\"]\n",
            d = d.display()
        ),
    )
    .unwrap();
    let nats = NatsServer::start();
    crate::common::broker_init(&nats.url());
    let wlog = d.join("worker.log");
    let mut w = crate::common::halyard();
    w.args(["worker", "--nats", &nats.url(), "--sweep", sweep.to_str().unwrap()])
        .arg("--allow-server-commands")
        .arg("--state")
        .arg(d.join("w0"))
        .args(["--metrics", "off"])
        .env("HALYARD_TEST_SECRET", "halyard-secret-7781")
        .env("OPENAI_API_KEY", "sk-other-pools-key-4410")
        .env("HF_HOME", d.join("hf"))
        .env("XDG_CACHE_HOME", d.join("cache"))
        .env("HOME", d)
        .stderr(std::fs::File::create(&wlog).unwrap());
    let mut worker = halyard_tests::ChildGuard::spawn(w);
    let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !read(&wlog).contains("managed server ready") {
        assert!(std::time::Instant::now() < deadline, "no server ready:\n{}", read(&wlog));
        assert!(worker.try_wait().is_none(), "the worker exited:\n{}", read(&wlog));
        std::thread::sleep(Duration::from_millis(50));
    }
    let env = read(&d.join("server-env.txt"));
    for secret in ["halyard-secret-7781", "sk-other-pools-key-4410", "HALYARD_TEST_SECRET"] {
        assert!(!env.contains(secret), "{secret} reached the server:\n{env}");
    }
    for needed in [
        format!("HOME={}", d.display()),
        format!("HF_HOME={}", d.join("hf").display()),
        format!("XDG_CACHE_HOME={}", d.join("cache").display()),
    ] {
        assert!(env.lines().any(|l| l == needed), "{needed} did not reach the server:\n{env}");
    }
    let grandchild: u32 = read(&d.join("grandchild.pid")).trim().parse().unwrap();
    assert!(halyard_tests::pid_alive(grandchild));
    let server_pids = crate::common::processes_mentioning(d.join("weights").to_str().unwrap());
    assert!(!server_pids.is_empty(), "no server process found");
    worker.kill();
    let killed = std::time::Instant::now();
    let all_gone = || {
        !halyard_tests::pid_alive(grandchild)
            && server_pids.iter().all(|p| !halyard_tests::pid_alive(*p))
    };
    while !all_gone() {
        assert!(
            killed.elapsed() < Duration::from_secs(60),
            "the server's process tree outlived its worker by 60 s (grandchild {grandchild} \
             alive: {})",
            halyard_tests::pid_alive(grandchild)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "server and grandchild gone {:.2} s after the worker's SIGKILL",
        killed.elapsed().as_secs_f64()
    );
}

/// Start `cmd` and wait (at most 120 s) for it to exit; its exit status and stderr.
fn exit_of(
    mut cmd: std::process::Command,
    log: &std::path::Path,
) -> (std::process::ExitStatus, String) {
    cmd.stdout(std::fs::File::create(log.with_extension("out")).unwrap())
        .stderr(std::fs::File::create(log).unwrap());
    let mut child = halyard_tests::ChildGuard::spawn(cmd);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(status) = child.try_wait() {
            return (status, std::fs::read_to_string(log).unwrap_or_default());
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still running after 120 s:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Item 10: `api_key_env` with a `base_url` of the sweep's choice. A sweep naming
/// `OPENAI_API_KEY` for a host that is not OpenAI's is refused by the worker at start and
/// by `halyard check` before any request, naming the variable, the host and how to allow
/// it; with the host allowed in `HALYARD_KEY_HOSTS`, `halyard check` goes on to the host
/// (which does not resolve here: the refusal is gone, a connection error takes its place).
#[test]
fn a_key_goes_to_no_host_its_operator_did_not_allow() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let sweep = crate::common::write_sweep(d, "keys", "https://collector.example.invalid/v1", 2, 1);
    let text = std::fs::read_to_string(&sweep)
        .unwrap()
        .replace("backend = \"openai\"", "backend = \"openai\"\napi_key_env = \"OPENAI_API_KEY\"");
    std::fs::write(&sweep, text).unwrap();
    let nats = NatsServer::start();
    crate::common::broker_init(&nats.url());
    let refusal = [
        "$OPENAI_API_KEY",
        "\"collector.example.invalid\"",
        "HALYARD_KEY_HOSTS=\"OPENAI_API_KEY=collector.example.invalid\"",
    ];
    let mut w = crate::common::halyard();
    w.args(["worker", "--nats", &nats.url(), "--sweep", sweep.to_str().unwrap()])
        .arg("--state")
        .arg(d.join("w0"))
        .args(["--metrics", "off"])
        .env("OPENAI_API_KEY", "sk-test-key-2231")
        .env_remove("HALYARD_KEY_HOSTS");
    let (status, log) = exit_of(w, &d.join("worker.log"));
    assert!(!status.success(), "{log}");
    for part in refusal {
        assert!(log.contains(part), "{part} not in:\n{log}");
    }
    assert!(!log.contains("sk-test-key-2231"), "{log}");

    let check = |hosts: Option<&str>, name: &str| {
        let mut c = crate::common::halyard();
        c.args(["check", sweep.to_str().unwrap()]).env("OPENAI_API_KEY", "sk-test-key-2231");
        match hosts {
            Some(h) => c.env("HALYARD_KEY_HOSTS", h),
            None => c.env_remove("HALYARD_KEY_HOSTS"),
        };
        let (status, _) = exit_of(c, &d.join(name));
        let out = std::fs::read_to_string(d.join(name).with_extension("out")).unwrap_or_default();
        (status, format!("{out}{}", std::fs::read_to_string(d.join(name)).unwrap()))
    };
    let (status, out) = check(None, "check1.log");
    assert!(!status.success(), "{out}");
    for part in refusal {
        assert!(out.contains(part), "{part} not in:\n{out}");
    }
    let (status, out) = check(Some("OPENAI_API_KEY=collector.example.invalid"), "check2.log");
    assert!(!status.success(), "{out}");
    assert!(!out.contains("may not be sent to host"), "{out}");
    assert!(out.contains("collector.example.invalid"), "{out}");
}

/// Item 10: a sweep's `command` is code. Without `--allow-server-commands` the worker
/// refuses it at start, naming the model, the pool and the flag, and the command never
/// runs (with the flag it does: the managed-server tests).
#[test]
fn a_sweeps_server_command_runs_only_where_the_worker_allows_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let script = format!("touch {}/command-ran; sleep 600 # {{port}}", d.display());
    let sweep = d.join("srv.toml");
    std::fs::write(
        &sweep,
        format!(
            "name = \"srv\"\n\n[[model]]\nname = \"model-a\"\nbackend = \"server\"\n\
             command = [\"sh\", \"-c\", {script:?}]\nmodel_path = \"{d}/weights/model-a\"\n\
             revision = \"r1\"\ngpus = 0\nmax_concurrency = 2\nmax_tokens = 64\n\
             start_timeout_s = 30\n\n\
             [[benchmark]]\npipeline = \"noop\"\njobs = 2\nmodels = [\"model-a\"]\n",
            d = d.display()
        ),
    )
    .unwrap();
    let nats = NatsServer::start();
    crate::common::broker_init(&nats.url());
    let mut w = crate::common::halyard();
    w.args(["worker", "--nats", &nats.url(), "--sweep", sweep.to_str().unwrap()])
        .arg("--state")
        .arg(d.join("w0"))
        .args(["--metrics", "off"]);
    let (status, log) = exit_of(w, &d.join("worker.log"));
    assert!(!status.success(), "{log}");
    for part in ["model \"model-a\"", "program \"sh\"", "--allow-server-commands"] {
        assert!(log.contains(part), "{part} not in:\n{log}");
    }
    assert!(!d.join("command-ran").exists(), "the command ran:\n{log}");
}

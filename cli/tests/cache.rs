//! The result cache on one machine (issue 51): runs of differently named sweeps share
//! their paid answers through `--cache DIR`, and an export replays.

use std::path::{Path, PathBuf};
use std::process::Output;

use halyard_tests::FakeOpenAi;

use crate::common::*;

/// `halyard run SWEEP --out OUT` with the result cache `cache` ("off": none), to the end.
fn run_with_cache(sweep: &Path, out: &Path, cache: &str) -> Output {
    let o = halyard()
        .env("HALYARD_CACHE", cache)
        .args(["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()])
        .output()
        .expect("run halyard");
    assert!(
        o.status.success(),
        "halyard run {}: {:?}\n{}",
        sweep.display(),
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// Issue 51: a second sweep under another name, sharing the model under test, the judge
/// and the questions of the first, makes no paid call; its labels equal those of a run
/// without the cache, label by label. Its export is read by `backend = "replay"`.
#[test]
fn a_renamed_sweep_pays_nothing_for_what_another_paid() {
    const QUESTIONS: usize = 40;
    let qs = load_questions(QUESTIONS);
    let fake = FakeOpenAi::start_blocking(responder(question_index(&qs), None));
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let cache_s = cache.to_str().unwrap();

    let first = write_sweep(dir.path(), "first", &fake.base_url(), QUESTIONS, 4);
    run_with_cache(&first, &dir.path().join("a"), cache_s);
    let paid_first = fake.call_count();
    assert!(paid_first > QUESTIONS, "the first sweep pays for answers and judge checks");

    fake.reset_counters();
    let second = write_sweep(dir.path(), "second", &fake.base_url(), QUESTIONS, 4);
    run_with_cache(&second, &dir.path().join("b"), cache_s);
    assert_eq!(fake.call_count(), 0, "the renamed sweep paid for jobs the first paid for");

    // The same sweep without a cache: every call made again, the same labels.
    run_with_cache(&second, &dir.path().join("c"), "off");
    assert_eq!(fake.call_count(), paid_first, "without the cache every job is paid");
    let cached = std::fs::read_to_string(dir.path().join("b/second/labels.jsonl")).unwrap();
    let fresh = std::fs::read_to_string(dir.path().join("c/second/labels.jsonl")).unwrap();
    assert_eq!(cached.lines().count(), QUESTIONS);
    for (i, (a, b)) in cached.lines().zip(fresh.lines()).enumerate() {
        assert_eq!(a, b, "label row {i} differs between the cached and the uncached run");
    }

    // `halyard cache stats` counts them; an export moves them as one file.
    let stats = halyard()
        .env("HALYARD_CACHE", cache_s)
        .args(["cache", "stats", "--json"])
        .output()
        .unwrap();
    assert!(stats.status.success(), "{}", String::from_utf8_lossy(&stats.stderr));
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(stats["entries"].as_u64(), Some(paid_first as u64), "{stats}");
    let export = dir.path().join("answers.jsonl");
    let o = halyard()
        .env("HALYARD_CACHE", cache_s)
        .args(["cache", "export", export.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let other = dir.path().join("cache2");
    let o = halyard()
        .env("HALYARD_CACHE", other.to_str().unwrap())
        .args(["cache", "import", export.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("{paid_first} new entries")));

    // The imported cache answers a third sweep on its own: nothing paid.
    fake.reset_counters();
    let third = write_sweep(dir.path(), "third", &fake.base_url(), QUESTIONS, 4);
    run_with_cache(&third, &dir.path().join("d"), other.to_str().unwrap());
    assert_eq!(fake.call_count(), 0, "the imported cache did not answer");
}

/// Issue 51: pruning the whole cache again and again while a run reads from it never
/// fails the run: what it misses it calls, and its labels are those of an uncached run.
#[test]
fn pruning_while_a_run_reads_fails_nothing() {
    const QUESTIONS: usize = 30;
    let qs = load_questions(QUESTIONS);
    let fake = FakeOpenAi::start_blocking(responder(question_index(&qs), None));
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let cache_s = cache.to_str().unwrap();
    let first = write_sweep(dir.path(), "first", &fake.base_url(), QUESTIONS, 4);
    run_with_cache(&first, &dir.path().join("a"), cache_s);

    let second = write_sweep(dir.path(), "second", &fake.base_url(), QUESTIONS, 4);
    let out_b = dir.path().join("b");
    let mut run = halyard()
        .env("HALYARD_CACHE", cache_s)
        .args(["run", second.to_str().unwrap(), "--out", out_b.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut prunes = 0;
    let status = loop {
        if let Some(s) = run.try_wait().unwrap() {
            break s;
        }
        // Everything, however recently used.
        let p = halyard()
            .env("HALYARD_CACHE", cache_s)
            .args(["cache", "prune", "--max-gb", "0", "--min-age-hours", "0"])
            .output()
            .unwrap();
        assert!(p.status.success(), "prune: {}", String::from_utf8_lossy(&p.stderr));
        prunes += 1;
    };
    let mut err = String::new();
    std::io::Read::read_to_string(run.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "the run under prunes failed: {status:?}\n{err}");
    assert!(prunes > 0);

    run_with_cache(&second, &dir.path().join("c"), "off");
    let pruned = std::fs::read_to_string(out_b.join("second/labels.jsonl")).unwrap();
    let fresh = std::fs::read_to_string(dir.path().join("c/second/labels.jsonl")).unwrap();
    assert_eq!(pruned.lines().count(), QUESTIONS);
    assert_eq!(pruned, fresh, "labels of the run under prunes differ from an uncached run's");
}

/// Issue 51, across machines: two runs on one shared broker (`--nats`), each with its own
/// machine cache (two machines): the second, under another name, pays nothing: its
/// workers answer from what the first run's coordinator accepted and shared.
#[test]
fn a_run_on_another_machine_answers_from_the_shared_cache() {
    const QUESTIONS: usize = 20;
    let qs = load_questions(QUESTIONS);
    let fake = FakeOpenAi::start_blocking(responder(question_index(&qs), None));
    let nats = halyard_tests::NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let run_on = |sweep: &Path, out: &str, cache: &str| {
        let o = halyard()
            .env("HALYARD_CACHE", dir.path().join(cache))
            .args(["run", sweep.to_str().unwrap(), "--out"])
            .arg(dir.path().join(out))
            .args(["--nats", &nats.url()])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    let first = write_sweep(dir.path(), "first", &fake.base_url(), QUESTIONS, 4);
    run_on(&first, "a", "machine-a");
    let paid_first = fake.call_count();
    assert!(paid_first > QUESTIONS);
    fake.reset_counters();
    let second = write_sweep(dir.path(), "second", &fake.base_url(), QUESTIONS, 4);
    run_on(&second, "b", "machine-b");
    assert_eq!(fake.call_count(), 0, "the second machine paid for jobs the first shared");
    let a = std::fs::read_to_string(dir.path().join("a/first/labels.jsonl")).unwrap();
    let b = std::fs::read_to_string(dir.path().join("b/second/labels.jsonl")).unwrap();
    assert_eq!(a.lines().count(), QUESTIONS);
    assert_eq!(a, b, "answers from the shared cache gave other labels");
}

/// Runs of sweeps over `QUESTIONS` questions on one broker, paid to one fake API, each
/// run with a machine cache of its own choosing (issue 51's shared tier).
struct SharedRuns {
    fake: FakeOpenAi,
    nats: halyard_tests::NatsServer,
    dir: tempfile::TempDir,
    questions: usize,
}

impl SharedRuns {
    fn start(questions: usize) -> SharedRuns {
        let qs = load_questions(questions);
        SharedRuns {
            fake: FakeOpenAi::start_blocking(responder(question_index(&qs), None)),
            nats: halyard_tests::NatsServer::start(),
            dir: tempfile::tempdir().unwrap(),
            questions,
        }
    }

    fn sweep(&self, name: &str) -> PathBuf {
        write_sweep(self.dir.path(), name, &self.fake.base_url(), self.questions, 4)
    }

    /// `halyard run` of sweep `name` with `--out DIR/OUT`, the machine cache in
    /// `DIR/CACHE` and the coordinator failpoint `failpoint` (`share:<n>`).
    fn run(&self, name: &str, out: &str, cache: &str, failpoint: Option<&str>) -> Output {
        let mut c = halyard();
        c.env("HALYARD_CACHE", self.dir.path().join(cache))
            .args(["run", self.sweep(name).to_str().unwrap(), "--out"])
            .arg(self.dir.path().join(out))
            .args(["--nats", &self.nats.url()]);
        match failpoint {
            Some(f) => c.env("HALYARD_COORDINATOR_FAILPOINT", f),
            None => c.env_remove("HALYARD_COORDINATOR_FAILPOINT"),
        };
        c.output().unwrap()
    }

    fn run_ok(&self, name: &str, out: &str, cache: &str) {
        let o = self.run(name, out, cache, None);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }

    /// A sweep under another name, on another machine cache, pays for nothing.
    fn another_machine_pays_nothing(&self, why: &str) {
        self.fake.reset_counters();
        self.run_ok("second", "b", "machine-b");
        assert_eq!(self.fake.call_count(), 0, "{why}");
    }
}

/// Issue 51: a coordinator killed after it accepted (and acked) results but before it
/// put them in the shared cache loses none of them: they are marked in the run state, and
/// the run's next coordinator shares them. A second machine then pays for nothing.
#[test]
fn results_a_killed_coordinator_had_not_shared_are_shared_on_resume() {
    let runs = SharedRuns::start(12);
    // The first put aborts the process: the results accepted by then are only marked.
    let o = runs.run("first", "a", "machine-a", Some("share:1"));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "the failpoint did not fire: {stderr}");
    assert!(stderr.contains("HALYARD_COORDINATOR_FAILPOINT: aborting"), "{stderr}");
    assert!(runs.fake.call_count() > 0, "nothing was paid before the abort");
    // The run resumed: its coordinator shares what the killed one left marked.
    runs.run_ok("first", "a", "machine-a");
    runs.another_machine_pays_nothing("results accepted before the kill were never shared");
}

/// Issue 51: a run that completes while the shared bucket takes no more writes (the
/// first LANDED puts land, every later one stalls: `share:0:LANDED`) says in `halyard
/// status` how many accepted results it could not share, not counting those that landed
/// (their marks are removed when the coordinator stops waiting); `halyard run` of the
/// sweep again shares them (and then says none), and a second machine pays for nothing.
#[test]
fn a_run_that_completes_unshared_says_so_and_shares_when_run_again() {
    let runs = SharedRuns::start(6);
    let unshared = || {
        let run = runs.dir.path().join("a").join("first");
        let o = halyard().args(["status", run.to_str().unwrap()]).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let text = String::from_utf8_lossy(&o.stdout).to_string();
        let o = halyard().args(["status", "--json", run.to_str().unwrap()]).output().unwrap();
        let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        (json["unshared"].as_u64().unwrap_or(0), text)
    };
    const LANDED: usize = 5;
    let o = runs.run("first", "a", "machine-a", Some(&format!("share:0:{LANDED}")));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (left, text) = unshared();
    // Every completion of the run (the answers and their judgements, each paid once) but
    // those that landed.
    assert_eq!(left as usize, runs.fake.call_count() - LANDED, "{text}");
    assert!(text.contains(&format!("{left} accepted results not shared yet")), "{text}");
    runs.run_ok("first", "a", "machine-a");
    let (left, text) = unshared();
    assert_eq!(left, 0, "{text}");
    assert!(!text.contains("not shared yet"), "{text}");
    runs.another_machine_pays_nothing("the results left unshared were never shared");
}

mod forged {
    use halyard_broker::auth::NatsAuth;
    use halyard_broker::{Broker, BrokerConfig};
    use halyard_cache::shared::{self, Entry, SharedReader, SharedWriter};
    use halyard_proto::{Completion, JobId, Usage};
    use halyard_tests::NatsServer;

    use crate::common::repo_root;

    // `..Default::default()`: Usage has more fields in some builds (prompt caching, issue 52).
    #[allow(clippy::needless_update)]
    fn completion(text: &str) -> Completion {
        Completion {
            text: text.into(),
            usage: Usage { prompt_tokens: 1, completion_tokens: 1, ..Default::default() },
            latency_ms: 1,
            finish_reason: None,
            calls: 1,
            logprobs: None,
            refusal: false,
            source: Default::default(),
        }
    }

    async fn connect(nats: &NatsServer, user: &str, password: &str) -> Broker {
        let auth = NatsAuth {
            user: Some(user.into()),
            password: Some(password.into()),
            ..Default::default()
        };
        halyard_broker::connect(&BrokerConfig::new(nats.url(), user).with_auth(auth)).await.unwrap()
    }

    /// Issue 51: a write the broker refuses while the bucket has no leader (two of a
    /// 3-node cluster's nodes killed: no quorum) is made again once the nodes are back,
    /// within the writer's retry window: the accepted answer is shared, not lost.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_shared_write_refused_without_a_leader_is_made_again() {
        let mut cluster = halyard_tests::NatsCluster::start(3);
        let b = halyard_broker::connect(&BrokerConfig::new(cluster.node(0).url(), "coordinator"))
            .await
            .unwrap();
        let writer = SharedWriter::open(&b).await.unwrap();
        cluster.node_mut(1).stop(); // SIGKILL
        cluster.node_mut(2).stop();
        let job = JobId([9; 16]);
        let put = tokio::spawn(async move {
            writer.put(uuid::Uuid::now_v7(), job, &completion("paid without a leader")).await
        });
        // Longer than a JetStream request's timeout (5 s): the first create fails.
        tokio::time::sleep(std::time::Duration::from_secs(8)).await;
        cluster.node_mut(1).restart();
        cluster.node_mut(2).restart();
        let landed =
            tokio::time::timeout(std::time::Duration::from_secs(60), put).await.unwrap().unwrap();
        assert!(landed, "the put did not report the entry in the bucket");
        let reader = SharedReader::new(b);
        let got = reader.get(&job).await.unwrap().expect("the refused write was made again");
        assert_eq!(got.text, "paid without a leader");
    }

    /// A nats-server with the role users of `conf` (the passwords of
    /// broker_permissions.rs: both set the process's variables), and the coordinator's
    /// and a worker's connections to it.
    async fn with_roles(conf: &std::path::Path) -> (NatsServer, Broker, Broker) {
        std::env::set_var("HALYARD_COORDINATOR_PASSWORD", "coord-pw-81f2");
        std::env::set_var("HALYARD_WORKER_PASSWORD", "worker-pw-37c9");
        std::env::set_var("HALYARD_STATUS_PASSWORD", "status-pw-a0d4");
        let nats = NatsServer::start_with_args(&["-c", conf.to_str().unwrap()]);
        let coord = connect(&nats, "halyard-coordinator", "coord-pw-81f2").await;
        let worker = connect(&nats, "halyard-worker", "worker-pw-37c9").await;
        (nats, coord, worker)
    }

    /// Job `i` of the bulk tests below.
    fn bulk_job(i: u32) -> JobId {
        JobId(*blake3::hash(&i.to_le_bytes()).as_bytes().first_chunk().unwrap())
    }

    /// Share jobs `from..from + n` as the coordinator does, 512 at a time.
    async fn share_bulk(writer: &SharedWriter, from: u32, n: u32) {
        let run = uuid::Uuid::now_v7();
        let c = completion("bulk");
        for chunk in (from..from + n).collect::<Vec<_>>().chunks(512) {
            let puts = chunk.iter().map(|i| writer.put(run, bulk_job(*i), &c));
            assert!(futures::future::join_all(puts).await.into_iter().all(|landed| landed));
        }
    }

    /// Wait until `reader` follows the bucket's keys.
    async fn until_followed(reader: &SharedReader, what: &str) {
        let t0 = std::time::Instant::now();
        while !reader.follows_keys() {
            assert!(t0.elapsed() < std::time::Duration::from_secs(60), "{what}");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// A broker with the role users of `conf` whose bucket holds `n` bulk jobs, the
    /// coordinator's writer, and a worker's reader once its watch has caught up.
    async fn followed(conf: &std::path::Path, n: u32) -> (NatsServer, SharedWriter, SharedReader) {
        let (nats, coord, worker) = with_roles(conf).await;
        let writer = SharedWriter::open(&coord).await.unwrap();
        share_bulk(&writer, 0, n).await;
        let reader = SharedReader::new(worker);
        assert!(reader.get(&bulk_job(0)).await.unwrap().is_some());
        until_followed(&reader, &format!("the watch never caught up over {n} keys")).await;
        (nats, writer, reader)
    }

    /// Issue 51, the shared tier's watch of its keys against the real server's flow
    /// control (which pauses a push consumer after about 3 MiB until the client answers):
    /// - with the shipped permissions a worker's watch catches up over 20,000 keys (about
    ///   4 MB of headers, so past flow control) and a miss then asks the broker nothing;
    /// - on a broker whose worker user may not answer flow control, the watch stops after
    ///   its first few megabytes, and the reader finds that out and asks the broker again:
    ///   an entry put after the stop is still served. Trusting the watch as caught up, it
    ///   answered "not there" for good.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_keys_are_followed_past_flow_control_and_a_stalled_watch_asks_again() {
        let shipped = repo_root().join("deploy/nats/permissions.conf");
        let (nats, writer, reader) = followed(&shipped, 20_000).await;
        let asked = reader.round_trips();
        assert_eq!(reader.get(&bulk_job(1_000_000)).await.unwrap(), None);
        assert_eq!(reader.round_trips(), asked, "a miss asked the broker");
        drop((reader, writer, nats));

        // The same rights, less the answers to flow control.
        let dir = tempfile::tempdir().unwrap();
        let text = std::fs::read_to_string(&shipped).unwrap();
        let fc = "\"$JS.FC.KV_halyard_cache.>\"";
        assert!(text.contains(fc));
        let lines: Vec<&str> = text.lines().filter(|l| l.trim() != fc).collect();
        let conf = dir.path().join("permissions.conf");
        std::fs::write(&conf, lines.join("\n")).unwrap();
        let (_nats, writer, reader) = followed(&conf, 3).await;
        // About 8 MB of headers: the watch stops part of the way through.
        share_bulk(&writer, 3, 40_000).await;
        let last = bulk_job(40_002);
        let t0 = std::time::Instant::now();
        while reader.get(&last).await.unwrap().is_none() {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(60),
                "an entry put after the watch stopped was never served"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// Issue 51: on a broker with the shipped permissions, worker credentials cannot put
    /// an entry into the shared result cache (new or over an accepted one), and a value
    /// stored under another job's name is refused by readers: only what the coordinator
    /// accepted is served. The bucket an earlier build made (it refused new entries when
    /// full) is changed by the coordinator's rights alone, to drop its oldest instead;
    /// the status user reads its figures (`halyard cache stats --nats`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_forged_shared_entry_is_never_served() {
        let (nats, coord, worker) =
            with_roles(&repo_root().join("deploy/nats/permissions.conf")).await;

        // The bucket as an earlier build made it (full, it refused new entries): with the
        // shipped rights the coordinator changes that as it opens it, and a worker may not.
        use async_nats::jetstream::stream::DiscardPolicy;
        let mut earlier = shared::config(1);
        earlier.discard = DiscardPolicy::New;
        coord.js.create_stream(earlier.clone()).await.unwrap();
        let mut old_policy = earlier.clone();
        old_policy.discard = DiscardPolicy::Old;
        assert!(worker.js.update_stream(&old_policy).await.is_err(), "a worker changed the bucket");

        let run = uuid::Uuid::now_v7();
        let (accepted, forged) = (JobId([1; 16]), JobId([2; 16]));
        let writer = SharedWriter::open(&coord).await.unwrap();
        let mut bucket = coord.js.get_stream(&earlier.name).await.unwrap();
        assert_eq!(bucket.info().await.unwrap().config.discard, DiscardPolicy::Old);
        writer.put(run, accepted, &completion("accepted")).await;

        // Worker credentials: every put is refused, new key or accepted one.
        let kv = worker.js.get_key_value(shared::BUCKET).await.unwrap();
        for (id, text) in [(forged, "forged"), (accepted, "overwritten")] {
            let bytes = halyard_proto::encode(&Entry {
                v: shared::ENTRY_VERSION,
                job: id,
                completion: completion(text),
                run,
            })
            .unwrap();
            let put = tokio::time::timeout(
                std::time::Duration::from_secs(10),
                kv.put(shared::kv_key(&id), bytes.into()),
            )
            .await;
            assert!(!matches!(put, Ok(Ok(_))), "a worker put an entry for {id}");
        }

        // A value under another job's name (written with the coordinator's rights, as a
        // copy would be): refused by the reader.
        let misplaced = JobId([3; 16]);
        let ck = coord.js.get_key_value(shared::BUCKET).await.unwrap();
        let copy = halyard_proto::encode(&Entry {
            v: shared::ENTRY_VERSION,
            job: accepted,
            completion: completion("copied"),
            run,
        })
        .unwrap();
        ck.put(shared::kv_key(&misplaced), copy.into()).await.unwrap();

        let reader = SharedReader::new(worker);
        assert_eq!(reader.get(&accepted).await.unwrap().unwrap().text, "accepted");
        assert_eq!(reader.get(&forged).await.unwrap(), None, "a forged entry was served");
        assert_eq!(reader.get(&misplaced).await.unwrap(), None, "a misplaced entry was served");
        // The shipped rights let a worker follow the bucket's keys (a headers-only watch):
        // once it has caught up, a job nobody shared is a miss that asks the broker nothing.
        until_followed(&reader, "a worker with the shipped rights cannot follow the keys").await;
        let asked = reader.round_trips();
        assert_eq!(reader.get(&JobId([4; 16])).await.unwrap(), None);
        assert_eq!(reader.get(&forged).await.unwrap(), None, "a forged entry was served");
        assert_eq!(reader.round_trips(), asked, "a miss asked the broker");
        assert_eq!(reader.get(&accepted).await.unwrap().unwrap().text, "accepted");

        // `halyard cache stats --nats` as the status user (the shipped rights: the
        // bucket's figures, not its entries): the two entries written above.
        let machine = tempfile::tempdir().unwrap();
        let stats = |json: bool| {
            let mut c = crate::common::halyard();
            c.env("HALYARD_CACHE", machine.path()).env("HALYARD_NATS_PASSWORD", "status-pw-a0d4");
            c.args(["cache", "stats", "--nats", &nats.url(), "--nats-user", "halyard-status"]);
            if json {
                c.arg("--json");
            }
            let o = c.output().unwrap();
            assert!(o.status.success(), "cache stats: {}", String::from_utf8_lossy(&o.stderr));
            String::from_utf8(o.stdout).unwrap()
        };
        let v: serde_json::Value = serde_json::from_str(&stats(true)).unwrap();
        let shared = &v["shared"];
        assert_eq!(shared["entries"], 2, "{v}");
        assert_eq!(shared["max_bytes"], shared::MAX_BYTES, "{v}");
        assert_eq!(shared["when_full"], "drops the oldest", "{v}");
        assert!(shared["bytes"].as_u64().unwrap() > 0, "{v}");
        assert!(shared["oldest_s"].as_u64().unwrap() < 600, "{v}");
        assert_eq!(v["entries"], 0, "the machine cache's figures: {v}");
        let text = stats(false);
        assert!(text.contains("shared result cache halyard_cache on"), "{text}");
        assert!(text.contains("when full   drops the oldest"), "{text}");
        // With no cache on this machine, the shared bucket alone.
        let o = crate::common::halyard()
            .env("HALYARD_NATS_PASSWORD", "status-pw-a0d4")
            .args(["cache", "stats", "--json", "--cache", "off", "--nats", &nats.url()])
            .args(["--nats-user", "halyard-status"])
            .output()
            .unwrap();
        assert!(o.status.success(), "cache stats: {}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["shared"]["entries"], 2, "{v}");
        assert!(v.get("entries").is_none(), "machine figures without a machine cache: {v}");
    }
}

/// `halyard cache stats --json`'s entry count of the cache `dir`.
fn cache_entries(dir: &str) -> u64 {
    let o =
        halyard().env("HALYARD_CACHE", dir).args(["cache", "stats", "--json"]).output().unwrap();
    assert!(o.status.success(), "cache stats: {}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["entries"].as_u64().unwrap_or_else(|| panic!("no entries in {v}"))
}

/// Issue 51, two runs at the same time on one machine, sharing their jobs and the cache:
/// every job is paid once. What the first had paid (and written to the cache) before the
/// second started is answered from the cache; a job the other run is calling at that
/// moment (its claim) is handed back and answered from the cache once paid, even the
/// calls the first run has in flight when the second starts. The fake holds every
/// answer (a gate) from the moment the first run has paid half its answers until the
/// second run calls, so that both runs meet jobs the other is calling.
#[test]
fn two_runs_at_once_pay_each_job_once() {
    const QUESTIONS: usize = 40;
    let qs = load_questions(QUESTIONS);
    let gate = halyard_tests::Gate::new();
    gate.open();
    let answer = responder(question_index(&qs), None);
    let g = gate.clone();
    let fake = FakeOpenAi::start_blocking(move |c: &halyard_tests::ChatCall| answer(c).behind(&g));
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let cache_s = cache.to_str().unwrap().to_string();
    let spawn = |name: &str| {
        let sweep = write_sweep(dir.path(), name, &fake.base_url(), QUESTIONS, 4);
        let out = dir.path().join(format!("out-{name}"));
        let child = halyard()
            .env("HALYARD_CACHE", &cache_s)
            .args(["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        (child, out.join(name).join("labels.jsonl"))
    };
    let finish = |mut child: std::process::Child, name: &str| {
        let status = child.wait().unwrap();
        let mut err = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
        assert!(status.success(), "run {name}: {status:?}\n{err}");
    };
    // How often one run without a cache makes each request (judge checks may repeat a
    // request of another item).
    let alone = write_sweep(dir.path(), "alone", &fake.base_url(), QUESTIONS, 4);
    run_with_cache(&alone, &dir.path().join("alone"), "off");
    let mut once = std::collections::HashMap::<String, usize>::new();
    for c in fake.calls() {
        *once.entry(halyard_tests::request_key(&c)).or_default() += 1;
    }
    fake.reset_counters();

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    let (a, labels_a) = spawn("first");

    // The first run pays for about half its answers; then its calls are held (those in
    // flight stay in flight) until the cache holds every answer it was paid.
    while fake.paid_calls().len() < QUESTIONS / 2 {
        assert!(std::time::Instant::now() < deadline, "the first run paid too little");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    gate.close();
    let paid_before = loop {
        let paid = fake.paid_calls();
        std::thread::sleep(std::time::Duration::from_millis(200));
        if fake.paid_calls().len() == paid.len() && cache_entries(&cache_s) == paid.len() as u64 {
            break paid;
        }
        assert!(std::time::Instant::now() < deadline, "the cache never held what was paid");
    };
    let received_before = fake.call_count();

    // The second run, under another name, starts while the first still has calls in
    // flight; its own calls are held too until it has made one, then all are answered.
    let (b, labels_b) = spawn("second");
    while fake.call_count() == received_before {
        assert!(std::time::Instant::now() < deadline, "the second run made no call");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    gate.open();
    finish(a, "first");
    finish(b, "second");

    // A request one run makes once is one job: paid before the second run started, it
    // is never paid again. (The judge makes a few requests twice, for two jobs.)
    let key = halyard_tests::request_key;
    let calls = fake.calls();
    let before: std::collections::HashSet<String> = paid_before.iter().map(key).collect();
    let again = calls[received_before..]
        .iter()
        .filter(|c| once.get(&key(c)) == Some(&1) && before.contains(&key(c)))
        .count();
    assert_eq!(again, 0, "calls paid again an answer the cache held when the run started");
    // No request is made more often than by one run alone: each job paid once.
    let mut both = std::collections::HashMap::<String, usize>::new();
    for c in &calls {
        *both.entry(key(c)).or_default() += 1;
    }
    for (k, n) in &both {
        let alone = once.get(k).copied().unwrap_or(0);
        assert!(*n <= alone, "a request made {n} times by both runs, {alone} by a run alone: {k}");
    }
    let alone: usize = once.values().sum();
    eprintln!(
        "one run alone: {alone} calls; both runs: {}; {} paid before the second run started",
        calls.len(),
        paid_before.len()
    );
    assert_eq!(calls.len(), alone, "every job paid once");
    // Both runs label every question, and alike.
    let a = std::fs::read_to_string(labels_a).unwrap();
    let b = std::fs::read_to_string(labels_b).unwrap();
    assert_eq!(a.lines().count(), QUESTIONS);
    assert_eq!(a, b, "the two runs' labels differ");
}

/// Issue 51, visible: a second run answered from the machine cache reports 0 paid calls,
/// every job from the machine cache, cost 0 and, as money saved, exactly what the first
/// run cost: the fake's usage of every call it answered, at the sweep's prices, counted
/// here by hand. `halyard status` says the same. A sweep whose models all have the cache
/// off does not open (or create) the cache file.
#[test]
fn a_run_answered_from_the_cache_reports_money_saved_not_spent() {
    const QUESTIONS: usize = 12;
    const PROMPT: u64 = 50;
    const COMPLETION: u64 = 7;
    let qs = load_questions(QUESTIONS);
    let inner = responder(question_index(&qs), None);
    let fake = FakeOpenAi::start_blocking(move |call| match inner(call) {
        halyard_tests::fake_openai::Reply::Text(text) => {
            halyard_tests::fake_openai::Reply::TextWithUsage {
                text,
                prompt_tokens: PROMPT,
                completion_tokens: COMPLETION,
            }
        }
        other => other,
    });
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let cache_s = cache.to_str().unwrap();
    // USD per million tokens (input, output) of the model and of the judge.
    let (model_price, judge_price) = ((2.0, 8.0), (0.5, 1.5));
    let priced = |name: &str, extra: &str| {
        let path = write_sweep(dir.path(), name, &fake.base_url(), QUESTIONS, 4);
        let text = std::fs::read_to_string(&path).unwrap();
        let text = text
            .replace(
                "model = \"fake-model\"\n",
                &format!(
                    "model = \"fake-model\"\nprice = {{ input = {}, output = {} }}\n{extra}",
                    model_price.0, model_price.1
                ),
            )
            .replace(
                "model = \"fake-judge\"\n",
                &format!(
                    "model = \"fake-judge\"\nprice = {{ input = {}, output = {} }}\n{extra}",
                    judge_price.0, judge_price.1
                ),
            );
        std::fs::write(&path, text).unwrap();
        path
    };

    // The cache off for every model: the run makes no cache file.
    let off = priced("off", "cache = \"off\"\n");
    run_with_cache(&off, &dir.path().join("o"), cache_s);
    assert!(
        !cache.join(halyard_cache::machine::FILE).exists(),
        "a sweep without a cached model opened the cache file"
    );
    fake.reset_counters();

    let first = priced("first", "");
    run_with_cache(&first, &dir.path().join("a"), cache_s);
    let paid = fake.paid_calls();
    assert!(paid.len() > QUESTIONS, "the first run pays for answers and judge checks");
    let cost_of =
        |(input, output): (f64, f64)| (PROMPT as f64 * input + COMPLETION as f64 * output) / 1e6;
    let by_hand: f64 = paid
        .iter()
        .map(|c| cost_of(if c.model == "fake-model" { model_price } else { judge_price }))
        .sum();
    let r1 = read_json(&dir.path().join("a/first/report.json"));
    let spent1 = r1["costs"]["total"].as_f64().unwrap();
    assert!((spent1 - by_hand).abs() < 1e-9, "first run cost {spent1}, by hand {by_hand}");
    assert_eq!(r1["costs"]["saved"].as_f64(), Some(0.0), "{}", r1["costs"]);

    fake.reset_counters();
    let second = priced("second", "");
    run_with_cache(&second, &dir.path().join("b"), cache_s);
    assert_eq!(fake.call_count(), 0, "the second run called the model");
    let r2 = read_json(&dir.path().join("b/second/report.json"));
    let costs = &r2["costs"];
    assert_eq!(costs["total"].as_f64(), Some(0.0), "{costs}");
    let saved = costs["saved"].as_f64().unwrap();
    assert!((saved - by_hand).abs() < 1e-9, "saved {saved}, the first run paid {by_hand}");
    let classes = costs["by_model_stage"].as_array().unwrap();
    let sum = |k: &str| classes.iter().map(|c| c[k].as_u64().unwrap()).sum::<u64>();
    assert_eq!(sum("paid"), 0, "{costs}");
    assert_eq!(sum("calls"), 0, "{costs}");
    assert_eq!(sum("shared_cache"), 0, "{costs}");
    assert_eq!(sum("machine_cache"), paid.len() as u64, "{costs}");
    assert_eq!(sum("jobs"), paid.len() as u64, "{costs}");
    for c in classes {
        let price = if c["model"] == "model-a" { model_price } else { judge_price };
        let want = c["machine_cache"].as_u64().unwrap() as f64 * cost_of(price);
        assert!((c["saved"].as_f64().unwrap() - want).abs() < 1e-9, "{c}");
        assert_eq!(c["cost"].as_f64(), Some(0.0), "{c}");
    }
    let md = std::fs::read_to_string(dir.path().join("b/second/report.md")).unwrap();
    assert!(md.contains(&format!("Result cache: **${saved:.4}** saved")), "{md}");
    let html = std::fs::read_to_string(dir.path().join("b/second/report.html")).unwrap();
    assert!(html.contains("<th>machine cache</th>"), "the HTML report has no cache column");

    let s = halyard().args(["status", dir.path().join("b/second").to_str().unwrap()]).output();
    let s = s.unwrap();
    assert!(s.status.success(), "{}", String::from_utf8_lossy(&s.stderr));
    let text = String::from_utf8_lossy(&s.stdout);
    assert!(text.contains(&format!("${saved:.4} saved by the result cache")), "{text}");
    assert!(text.contains("0 paid, "), "{text}");
}

/// The name of the cluster node leading the shared cache's bucket, asked through `url`.
fn cache_leader(url: &str) -> Option<String> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let cfg = halyard_broker::BrokerConfig::new(url, "cache-leader-probe");
        let b = halyard_broker::connect(&cfg).await.ok()?;
        let stream = format!("KV_{}", halyard_cache::shared::BUCKET);
        let mut s = b.js.get_stream(&stream).await.ok()?;
        let info = s.info().await.ok()?;
        info.cluster.as_ref().and_then(|c| c.leader.clone())
    })
}

/// Issue 51, the shared tier on a 3-node JetStream cluster: after a first run has shared
/// its answers, the node leading the cache's bucket is killed (SIGKILL); once another
/// node leads it (the node then started again), a second run under another name, with a
/// machine cache of its own (another machine), pays for nothing: no accepted answer was
/// lost with the leader.
#[test]
fn the_shared_cache_outlives_its_leader_killed() {
    const QUESTIONS: usize = 12;
    let qs = load_questions(QUESTIONS);
    let fake = FakeOpenAi::start_blocking(responder(question_index(&qs), None));
    let mut cluster = halyard_tests::NatsCluster::start(3);
    let dir = tempfile::tempdir().unwrap();
    let run_on = |sweep: &Path, out: &str, cache: &str, cluster: &halyard_tests::NatsCluster| {
        let o = halyard()
            .env("HALYARD_CACHE", dir.path().join(cache))
            .args(["run", sweep.to_str().unwrap(), "--out"])
            .arg(dir.path().join(out))
            .args(["--nats", &cluster.urls()])
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{}\nthe nodes' logs:\n{}",
            String::from_utf8_lossy(&o.stderr),
            cluster.logs(80)
        );
    };
    let first = write_sweep(dir.path(), "first", &fake.base_url(), QUESTIONS, 4);
    run_on(&first, "a", "machine-a", &cluster);
    let paid_first = fake.call_count();
    assert!(paid_first > QUESTIONS);

    let leader = cache_leader(&cluster.node(0).url()).expect("the bucket has a leader");
    let i = (0..3).find(|i| leader == format!("halyard-n{}", i + 1)).expect("a node's name");
    cluster.node_mut(i).stop(); // SIGKILL
    let other = cluster.node((i + 1) % 3).url();
    let t0 = std::time::Instant::now();
    let new_leader = loop {
        match cache_leader(&other) {
            Some(l) if l != leader => break l,
            _ => {
                assert!(t0.elapsed().as_secs() < 60, "no new leader for the cache's bucket");
                std::thread::sleep(std::time::Duration::from_millis(250));
            }
        }
    };
    cluster.node_mut(i).restart();

    fake.reset_counters();
    let second = write_sweep(dir.path(), "second", &fake.base_url(), QUESTIONS, 4);
    run_on(&second, "b", "machine-b", &cluster);
    assert_eq!(
        fake.call_count(),
        0,
        "answers accepted before the leader {leader} was killed were paid again (new leader {new_leader})"
    );
    let a = std::fs::read_to_string(dir.path().join("a/first/labels.jsonl")).unwrap();
    let b = std::fs::read_to_string(dir.path().join("b/second/labels.jsonl")).unwrap();
    assert_eq!(a, b, "answers from the shared cache gave other labels");
    let r = read_json(&dir.path().join("b/second/report.json"));
    let classes = r["costs"]["by_model_stage"].as_array().unwrap().clone();
    let shared: u64 = classes.iter().map(|c| c["shared_cache"].as_u64().unwrap()).sum();
    assert_eq!(shared, paid_first as u64, "every job from the shared cache: {classes:?}");
}

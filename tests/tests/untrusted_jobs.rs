//! Issue 13: job messages are untrusted input, checked at the worker one job at a time.
//! Real nats-server, real stores on disk, real HTTP (an "attacker" server that must never be
//! called).

use std::time::Duration;

use async_nats::jetstream::{self, message::PublishMessage};
use halyard_broker::{Broker, BrokerConfig, Delivery};
use halyard_proto::pool::{PoolPlan, WorkerModel, WorkerPlan};
use halyard_proto::{
    encode, encode_batch, subjects, ChatMessage, FailureKind, Job, JobKey, JobResult, ModelRef,
    Outcome, Sampling,
};
use halyard_tests::{FakeOpenAi, NatsServer, Reply};
use halyard_worker::WorkerConfig;

const POOL: &str = "free";

type WorkerRun = Result<std::sync::Arc<halyard_worker::Stats>, halyard_worker::WorkerError>;

fn job(run: uuid::Uuid, backend: &str, endpoint: &str, text: &str) -> Job {
    let key = JobKey {
        pipeline: "noop".into(),
        stage: "call".into(),
        stage_version: 1,
        model: ModelRef { backend: backend.into(), endpoint: endpoint.into(), model: "m".into() },
        messages: vec![ChatMessage::user(text)],
        sampling: Sampling::default(),
        sample_index: 0,
    };
    Job::new(run, POOL, key, 10_000)
}

async fn publish(js: &jetstream::Context, payload: Vec<u8>, msg_id: &str) {
    let m = PublishMessage::build().payload(payload.into()).message_id(msg_id);
    js.send_publish(subjects::job_subject(POOL), m).await.unwrap().await.unwrap();
}

/// Messages in `stream` now.
async fn messages(b: &Broker, stream: &str) -> u64 {
    b.js.get_stream(stream).await.unwrap().info().await.unwrap().state.messages
}

/// Every result stored in the results stream (read by sequence, consuming nothing).
async fn stored_results(b: &Broker) -> Vec<JobResult> {
    let mut stream = b.js.get_stream(subjects::RESULTS_STREAM).await.unwrap();
    let (first, last) = {
        let s = &stream.info().await.unwrap().state;
        (s.first_sequence, s.last_sequence)
    };
    let mut out = Vec::new();
    for seq in first..=last {
        if let Ok(m) = stream.get_raw_message(seq).await {
            out.extend(halyard_proto::decode_results(&m.payload).unwrap());
        }
    }
    out
}

/// A noop worker for `POOL` on the checkpoint in `state`; it stops when `true` is sent.
fn start_worker(
    broker: &Broker,
    state: &std::path::Path,
) -> (tokio::sync::watch::Sender<bool>, tokio::task::JoinHandle<WorkerRun>) {
    let plan = WorkerPlan { pools: vec![PoolPlan::new(POOL, 4).with_model(WorkerModel::Noop)] };
    let mut cfg = WorkerConfig::new(plan, state.to_path_buf());
    cfg.delivery = Delivery { ack_wait: Duration::from_secs(5), max_deliver: 3 };
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let b = broker.clone();
    let worker = tokio::spawn(async move {
        // The pool planned, as a coordinator plans it (it alone makes pool consumers).
        halyard_broker::pool_consumer(&b, POOL, cfg.delivery).await.unwrap();
        halyard_worker::run(b, cfg, async move {
            let _ = stop_rx.wait_for(|v| *v).await;
        })
        .await
    });
    (stop_tx, worker)
}

/// Waits (30 s at most) until the results stream holds at least `results` results and the
/// job stream exactly `job_messages` messages.
async fn settle(broker: &Broker, results: usize, job_messages: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while stored_results(broker).await.len() < results
        || messages(broker, subjects::JOBS_STREAM).await != job_messages
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not settled: results {:?}, {} job messages",
            stored_results(broker).await,
            messages(broker, subjects::JOBS_STREAM).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One batch holding two good jobs, a garbage item, a job whose id is not its key's hash
/// and a job for an endpoint the worker was not configured with: the good jobs run, the
/// other three are refused (counted, reported as `Refused`, the attacker never called)
/// and the message is settled; a message of another wire version is handed back, not
/// terminated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bad_job_costs_only_itself() {
    let nats = NatsServer::start();
    let attacker = FakeOpenAi::start(|_| Reply::Text("planted".into())).await;
    let broker = halyard_broker::connect(&BrokerConfig::new(nats.url(), "test")).await.unwrap();
    halyard_broker::init(&broker, &Default::default()).await.unwrap();
    let run = uuid::Uuid::now_v7();
    let good = [job(run, "noop", "", "a"), job(run, "noop", "", "b")];
    let mut forged_id = job(run, "noop", "", "c");
    forged_id.key.messages[0].content = "changed after hashing".into();
    let to_attacker = job(run, "openai", &attacker.base_url(), "d");
    let items = [
        encode(&good[0]).unwrap(),
        encode(&"not a job").unwrap(),
        encode(&forged_id).unwrap(),
        encode(&to_attacker).unwrap(),
        encode(&good[1]).unwrap(),
    ];
    publish(&broker.js, encode_batch(&items), "batch-1").await;
    let mut newer = job(run, "noop", "", "e");
    newer.v = halyard_proto::WIRE_VERSION + 1;
    publish(&broker.js, encode(&newer).unwrap(), "newer-1").await;

    let state = tempfile::tempdir().unwrap();
    let (stop_tx, worker) = start_worker(&broker, state.path());
    // Settled: the batch left the work queue; the newer message stays for another worker.
    settle(&broker, 4, 1).await;
    // The newer message is nak'd with a delay, not terminated: it is still there later.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(messages(&broker, subjects::JOBS_STREAM).await, 1);
    stop_tx.send(true).unwrap();
    let stats = worker.await.unwrap().unwrap();

    let results = stored_results(&broker).await;
    let mut done: Vec<_> =
        results.iter().filter(|r| matches!(r.outcome, Outcome::Done(_))).map(|r| r.job).collect();
    done.sort();
    let mut want = vec![good[0].id, good[1].id];
    want.sort();
    assert_eq!(done, want, "{results:?}");
    let refusal = |j: &Job| {
        results
            .iter()
            .find_map(|r| match &r.outcome {
                Outcome::Failed(f) if f.kind == FailureKind::Refused && r.job == j.id => {
                    Some(f.error.clone())
                }
                _ => None,
            })
            .unwrap_or_else(|| panic!("no refusal reported for {}: {results:?}", j.id))
    };
    let e = refusal(&forged_id);
    assert!(e.contains("not the hash of its key"), "{e}");
    let e = refusal(&to_attacker);
    assert!(e.contains(&attacker.base_url()) && e.contains("pool \"free\""), "{e}");
    assert_eq!(results.len(), 4, "no result for the newer job: {results:?}");
    assert_eq!((stats.completed.get(), stats.refused.get(), stats.calls.get()), (2, 3, 2));
    assert_eq!(attacker.call_count(), 0, "the attacker's server was called");
    // Nothing refused was checkpointed.
    drop(stats);
    let cp = halyard_worker::Checkpoint::open(state.path()).unwrap();
    for j in [&forged_id, &to_attacker] {
        assert!(cp.get(&j.id).unwrap().is_none(), "refused job {} was checkpointed", j.id);
    }
    assert!(cp.get(&good[0].id).unwrap().is_some());
}

/// A job message may name an object instead of carrying its job (a job larger than
/// `max_payload`, `halyard_broker::objects`); the reference is untrusted input as well. A
/// real 1.5 MiB job stored as an object runs; a message naming a missing object, an
/// object whose bytes do not open with the reference's key, or a reference that is not
/// one is terminated without a call or a checkpoint, and the worker goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_objects_are_checked_like_any_job_message() {
    use halyard_broker::objects;
    let nats = NatsServer::start();
    let broker = halyard_broker::connect(&BrokerConfig::new(nats.url(), "test")).await.unwrap();
    halyard_broker::init(&broker, &Default::default()).await.unwrap();
    let run = uuid::Uuid::now_v7();
    let big = job(run, "noop", "", &"a long prompt ".repeat(110_000));
    let big_bytes = encode(&big).unwrap();
    assert!(big_bytes.len() > broker.payload_limit(), "{} bytes", big_bytes.len());
    let stored = objects::put(&broker, run, &big_bytes).await.unwrap();
    let forged = job(run, "noop", "", "forged");
    let real = encode(&job(run, "noop", "", "real")).unwrap();
    let (forged_name, forged_ref) =
        (objects::name_of(run, &real), objects::reference_of(run, &real));
    let store = broker.js.get_object_store(objects::BUCKET).await.unwrap();
    store.put(forged_name.as_str(), &mut &encode(&forged).unwrap()[..]).await.unwrap();
    let missing = objects::reference_of(run, b"never stored");
    for (name, id) in
        [(stored.as_str(), "big"), (&missing, "missing"), (&forged_ref, "forged"), ("../x", "bad")]
    {
        let m = PublishMessage::build().header(objects::HEADER, name).message_id(id);
        broker.js.send_publish(subjects::job_subject(POOL), m).await.unwrap().await.unwrap();
    }

    let state = tempfile::tempdir().unwrap();
    let (stop_tx, worker) = start_worker(&broker, state.path());
    settle(&broker, 1, 0).await;
    stop_tx.send(true).unwrap();
    let stats = worker.await.unwrap().unwrap();
    let results = stored_results(&broker).await;
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0].job, big.id);
    assert!(matches!(results[0].outcome, Outcome::Done(_)), "{results:?}");
    assert_eq!((stats.completed.get(), stats.calls.get()), (1, 1));
    drop(stats);
    let cp = halyard_worker::Checkpoint::open(state.path()).unwrap();
    assert!(cp.get(&forged.id).unwrap().is_none(), "the forged job was checkpointed");
}

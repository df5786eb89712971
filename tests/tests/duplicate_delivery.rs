//! A job delivered twice (as after a lost ack) calls the model once per worker: the
//! second delivery is answered from the checkpoint. Real nats-server, real stores on disk,
//! real HTTP.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt;
use halyard_broker::{BrokerConfig, Delivery};
use halyard_proto::pool::{PoolPlan, WorkerModel, WorkerPlan};
use halyard_proto::{subjects, ChatMessage, Job, JobKey, JobResult, ModelRef, Outcome, Sampling};
use halyard_tests::{FakeOpenAi, NatsServer, Reply};
use halyard_worker::{Stats, WorkerConfig, WorkerError};

fn job(base_url: &str, run: uuid::Uuid, text: &str) -> Job {
    let key = JobKey {
        pipeline: "test".into(),
        stage: "answer".into(),
        stage_version: 1,
        model: ModelRef { backend: "openai".into(), endpoint: base_url.into(), model: "m".into() },
        messages: vec![ChatMessage::user(text)],
        sampling: Sampling::default(),
        sample_index: 0,
    };
    Job::new(run, "pool-a", key, 10_000)
}

async fn publish(js: &jetstream::Context, job: &Job, msg_id: &str) {
    let payload = bytes::Bytes::from(halyard_proto::encode(job).unwrap());
    let m = jetstream::message::PublishMessage::build().payload(payload).message_id(msg_id);
    js.send_publish(subjects::job_subject(&job.pool), m).await.unwrap().await.unwrap();
}

const DELIVERY: Delivery = Delivery { ack_wait: Duration::from_secs(5), max_deliver: 3 };

/// A broker with Halyard's streams, and pool-a planned as a coordinator plans it (it
/// alone makes pool consumers).
async fn planned(nats: &NatsServer) -> halyard_broker::Broker {
    let broker = halyard_broker::connect(&BrokerConfig::new(nats.url(), "test")).await.unwrap();
    halyard_broker::init(&broker, &Default::default()).await.unwrap();
    halyard_broker::pool_consumer(&broker, "pool-a", DELIVERY).await.unwrap();
    broker
}

/// A worker of pool-a (4 slots) calling `base_url`, its checkpoint in `state`.
fn config(base_url: &str, state: &std::path::Path) -> WorkerConfig {
    let model = WorkerModel::openai(base_url, "m", None);
    let plan = WorkerPlan { pools: vec![PoolPlan::new("pool-a", 4).with_model(model)] };
    let mut cfg = WorkerConfig::new(plan, state.to_path_buf());
    cfg.delivery = DELIVERY;
    cfg
}

/// A worker run in this process until [`Worker::stop`].
struct Worker {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<Arc<Stats>, WorkerError>>,
}

impl Worker {
    fn start(broker: &halyard_broker::Broker, cfg: WorkerConfig) -> Worker {
        let (stop, mut stop_rx) = tokio::sync::watch::channel(false);
        let b = broker.clone();
        let task = tokio::spawn(async move {
            halyard_worker::run(b, cfg, async move {
                let _ = stop_rx.wait_for(|v| *v).await;
            })
            .await
        });
        Worker { stop, task }
    }

    async fn stop(self) -> Arc<Stats> {
        self.stop.send(true).unwrap();
        self.task.await.unwrap().unwrap()
    }
}

/// Two deliveries of one job: one model call, two results, the second from the checkpoint;
/// and a checkpoint hit survives a worker restart on the same store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_delivery_calls_model_once_per_worker() {
    let nats = NatsServer::start();
    // Slow enough that both copies are in flight together with 4 slots.
    let fake = FakeOpenAi::start(|_| {
        Reply::Delayed(Duration::from_millis(300), Box::new(Reply::Text("an answer".into())))
    })
    .await;
    let broker = planned(&nats).await;
    let run = uuid::Uuid::now_v7();
    let j = job(&fake.base_url(), run, "What is a flux capacitor?");
    // Two copies under different message ids, so JetStream's de-duplication keeps both.
    publish(&broker.js, &j, "copy-1").await;
    publish(&broker.js, &j, "copy-2").await;

    let state = tempfile::tempdir().unwrap();
    let mut cfg = config(&fake.base_url(), state.path());
    let worker = Worker::start(&broker, cfg.clone());

    // The replay is a message of its own (the coordinator counts a job's result once).
    let results = collect_results(&broker, run, 2).await;
    wait_jobs_acked(&broker).await;
    let stats = worker.stop().await;
    assert_eq!(fake.call_count(), 1, "the model was called for a duplicate delivery");
    assert!(results
        .iter()
        .all(|r| r.job == j.id && matches!(&r.outcome, Outcome::Done(c) if c.text == "an answer")));
    assert_eq!((stats.completed.get(), stats.replayed.get()), (1, 1), "one call, one replay");

    // A new worker process on the same checkpoint answers a third copy without calling.
    cfg.stats = Default::default();
    publish(&broker.js, &j, "copy-3").await;
    let worker = Worker::start(&broker, cfg);
    wait_jobs_acked(&broker).await;
    let stats = worker.stop().await;
    assert_eq!((stats.completed.get(), stats.replayed.get(), stats.calls.get()), (0, 1, 0));
    assert_eq!(fake.call_count(), 1);
}

/// A result taken from the broker and dropped there (the coordinator drops a message
/// whose object it cannot read; a results stream may be purged; nats-server before 2.11
/// can keep a message's id when a leader change drops the message) is published again
/// when its job is: the job published again (as the coordinator's stall check does)
/// is answered from the checkpoint, and the replay reaches the results stream as a new
/// message. Under the first message's id it was dropped as a duplicate for the
/// de-duplication window, the worker acked the job, and the stall check recorded it a
/// dead letter after three rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_lost_after_its_publish_is_published_again_with_its_job() {
    let nats = NatsServer::start();
    let fake = FakeOpenAi::start(|_| Reply::Text("an answer".into())).await;
    let broker = planned(&nats).await;
    let run = uuid::Uuid::now_v7();
    let j = job(&fake.base_url(), run, "What is a flux capacitor?");
    publish(&broker.js, &j, &subjects::job_msg_id(run, &j.id)).await;

    let state = tempfile::tempdir().unwrap();
    let worker = Worker::start(&broker, config(&fake.base_url(), state.path()));
    // Taken and acked without being used: the message is gone, its id stays in the
    // stream's de-duplication window.
    let first = collect_results(&broker, run, 1).await;
    wait_jobs_acked(&broker).await;
    // Published again under a fresh id, as the stall check does (":r<round>").
    publish(&broker.js, &j, &format!("{}:r1", subjects::job_msg_id(run, &j.id))).await;
    let again = collect_results(&broker, run, 1).await;
    wait_jobs_acked(&broker).await;
    let stats = worker.stop().await;
    assert_eq!(fake.call_count(), 1, "the job published again was paid again");
    assert_eq!((stats.completed.get(), stats.replayed.get()), (1, 1), "one call, one replay");
    for r in first.iter().chain(&again) {
        assert!(r.job == j.id && matches!(&r.outcome, Outcome::Done(c) if c.text == "an answer"));
    }
}

/// Wait until the work queue holds no job (every delivery acked).
async fn wait_jobs_acked(broker: &halyard_broker::Broker) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut stream = broker.js.get_stream(subjects::JOBS_STREAM).await.unwrap();
        if stream.info().await.unwrap().state.messages == 0 {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            let c = stream.consumer_info(subjects::pool_consumer("pool-a")).await.unwrap();
            panic!(
                "jobs were not acked: stream {:?}, consumer {c:?}",
                stream.info().await.unwrap().state
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn collect_results(
    broker: &halyard_broker::Broker,
    run: uuid::Uuid,
    n: usize,
) -> Vec<JobResult> {
    let consumer = halyard_broker::results_consumer(broker, run).await.unwrap();
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while out.len() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {n} results arrived",
            out.len()
        );
        let mut batch = consumer
            .fetch()
            .max_messages(n - out.len())
            .expires(Duration::from_millis(500))
            .messages()
            .await
            .unwrap();
        while let Some(Ok(m)) = batch.next().await {
            // A worker publishes the results that became durable together as one message.
            out.extend(halyard_proto::decode_results(&m.payload).unwrap());
            m.ack().await.unwrap();
        }
    }
    out
}

/// A stop hands back the job messages a worker pulled but had not started: nak'd at
/// once with their delivery excused from the budget, never run, never left to wait out
/// their ack wait and count as a crashed worker's delivery. With 4 slots and every call
/// held: A (one job) runs, then a pull of three messages takes B (three jobs: the other
/// 3 slots), C (waits for a slot) and D (not read yet). The stop hands back C and D at
/// once, while A and B's calls are still held. Before, C started once a slot freed and D
/// was dropped or started, whichever the pool loop's select picked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_hands_back_pulled_jobs_it_had_not_started() {
    let nats = NatsServer::start();
    let gate = halyard_tests::Gate::new();
    let held = gate.clone();
    let fake = FakeOpenAi::start(move |_| Reply::Text("an answer".into()).behind(&held)).await;
    let broker = planned(&nats).await;
    let run = uuid::Uuid::now_v7();
    let url = fake.base_url();
    publish(&broker.js, &job(&url, run, "job a"), "a").await;
    let b: Vec<Job> = (1..=3).map(|i| job(&url, run, &format!("job b{i}"))).collect();
    let encoded: Vec<Vec<u8>> = b.iter().map(|j| halyard_proto::encode(j).unwrap()).collect();
    let m = jetstream::message::PublishMessage::build()
        .payload(halyard_proto::encode_batch(&encoded).into())
        .message_id("b");
    broker.js.send_publish(subjects::job_subject("pool-a"), m).await.unwrap().await.unwrap();
    publish(&broker.js, &job(&url, run, "job c"), "c").await;
    publish(&broker.js, &job(&url, run, "job d"), "d").await;

    let state = tempfile::tempdir().unwrap();
    let mut cfg = config(&url, state.path());
    // A and B finish, not handed back, however long a loaded machine takes to get here.
    cfg.shutdown_grace = Duration::from_secs(120);
    let worker = Worker::start(&broker, cfg);
    let t0 = tokio::time::Instant::now();
    while fake.in_flight() < 4 {
        assert!(t0.elapsed() < Duration::from_secs(20), "A and B's three jobs never ran together");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    worker.stop.send(true).unwrap();
    // C (stream sequence 3) and D (4) are handed back while every call is still held.
    let budget = halyard_worker::budget::Budget::open(&broker).await.unwrap();
    let excused = |seq: u64| {
        let budget = &budget;
        async move { budget.excused(&halyard_worker::budget::Budget::key("pool-a", seq)).await.unwrap() }
    };
    let t0 = tokio::time::Instant::now();
    while excused(3).await == 0 || excused(4).await == 0 {
        assert!(t0.elapsed() < Duration::from_secs(20), "C and D were not handed back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gate.open();
    worker.task.await.unwrap().unwrap();

    let texts: Vec<String> = fake.calls().iter().map(|c| c.messages[0].1.clone()).collect();
    let mut sorted = texts.clone();
    sorted.sort();
    assert_eq!(sorted, ["job a", "job b1", "job b2", "job b3"], "calls after the stop");
    assert_eq!((excused(3).await, excused(4).await), (1, 1));
    let mut stream = broker.js.get_stream(subjects::JOBS_STREAM).await.unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 2, "C and D are left");

    // The next worker runs C and D: their second delivery, the first that counts.
    let worker = Worker::start(&broker, config(&url, state.path()));
    wait_jobs_acked(&broker).await;
    worker.stop().await;
    for t in ["job c", "job d"] {
        assert_eq!(fake.calls().iter().filter(|c| c.messages[0].1 == t).count(), 1, "{t}");
    }
}

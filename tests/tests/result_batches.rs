//! The coordinator reads results messages of both forms (one result, or a worker's batch
//! of many) and counts each job once, whatever the batches overlap. Real nats-server, the
//! coordinator in-process through its library `run`; the test itself plays the worker:
//! it takes the jobs from the pool's consumer and publishes their results.

use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt;
use halyard_broker::{BrokerConfig, Delivery};
use halyard_coordinator::{CoordinatorConfig, RunOutcome};
use halyard_plan::progress::Progress;
use halyard_plan::sweep;
use halyard_proto::{subjects, Completion, Job, JobResult, Outcome, Usage};
use halyard_tests::NatsServer;
use tokio::sync::watch;

const ITEMS: usize = 50;

fn result_of(job: &Job) -> Vec<u8> {
    let r = JobResult {
        v: halyard_proto::WIRE_VERSION,
        job: job.id,
        run: job.run,
        outcome: Outcome::Done(Completion {
            text: String::new(),
            usage: Usage::default(),
            latency_ms: 0,
            finish_reason: None,
            calls: 1,
            logprobs: None,
            refusal: false,
            source: Default::default(),
        }),
        deliveries: 1,
        worker: "test".into(),
        cached: false,
    };
    halyard_proto::encode(&r).unwrap()
}

async fn publish(js: &jetstream::Context, subject: &str, payload: Vec<u8>, msg_id: &str) {
    let m = jetstream::message::PublishMessage::build().payload(payload.into()).message_id(msg_id);
    js.send_publish(subject.to_string(), m).await.unwrap().await.unwrap();
}

/// Overlapping batches count the overlap as duplicates, a batch published twice under
/// its id reaches the coordinator once, single results still count, garbage is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_and_singles_count_each_job_once() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("batches.toml");
    std::fs::write(
        &path,
        format!(
            "name = \"batches\"\n[[model]]\nname = \"free\"\nbackend = \"noop\"\nmax_concurrency = 4\n\
             [[benchmark]]\npipeline = \"noop\"\njobs = {ITEMS}\nmodels = [\"free\"]\n[run]\nwindow = 100\n"
        ),
    )
    .unwrap();
    let sweep = sweep::load(&path).unwrap();
    let broker =
        halyard_broker::connect(&BrokerConfig::new(nats.url(), "batch-test")).await.unwrap();
    let cfg = CoordinatorConfig { sweep, run_dir: dir.path().join("runs/batches") };
    let (ptx, prx) = watch::channel(Progress::default());
    let coordinator = tokio::spawn(halyard_coordinator::run(
        broker.clone(),
        cfg,
        Some(ptx),
        std::future::pending(),
    ));

    // Take every job, as a worker would.
    halyard_broker::init(&broker, &Default::default()).await.unwrap();
    let consumer =
        halyard_broker::pool_consumer(&broker, "free", Delivery::default()).await.unwrap();
    let mut msgs = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while msgs.len() < ITEMS {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {ITEMS} jobs published",
            msgs.len()
        );
        let mut batch = consumer.fetch().max_messages(ITEMS).messages().await.unwrap();
        while let Some(Ok(m)) = batch.next().await {
            msgs.push(m);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let jobs: Vec<Job> =
        msgs.iter().map(|m| halyard_proto::decode("job", &m.payload).unwrap()).collect();
    let run = jobs[0].run;
    let subject = subjects::result_subject(run, &jobs[0].pool);
    let encoded: Vec<Vec<u8>> = jobs.iter().map(result_of).collect();
    let batch = |r: std::ops::Range<usize>| {
        (
            halyard_proto::encode_batch(&encoded[r.clone()]),
            halyard_proto::batch_msg_id(run, jobs[r].iter().map(|j| &j.id)),
        )
    };

    // Jobs 0..20 in one batch, 10..30 in another (10 duplicates), the first batch again
    // under its id (dropped by the stream), garbage, then 30..50 one result per message.
    let (a, a_id) = batch(0..20);
    let (b, b_id) = batch(10..30);
    publish(&broker.js, &subject, a.clone(), &a_id).await;
    publish(&broker.js, &subject, b, &b_id).await;
    publish(&broker.js, &subject, a, &a_id).await;
    publish(&broker.js, &subject, vec![0x93, 0xc1], "garbage").await;
    for (job, e) in jobs.iter().zip(&encoded).skip(30) {
        publish(&broker.js, &subject, e.clone(), &subjects::job_msg_id(run, &job.id)).await;
    }
    for m in &msgs {
        m.ack().await.unwrap();
    }

    let outcome = tokio::time::timeout(Duration::from_secs(60), coordinator)
        .await
        .expect("run finishes")
        .unwrap()
        .unwrap();
    assert!(matches!(outcome, RunOutcome::Complete { .. }), "{outcome:?}");
    let p = prx.borrow().clone();
    assert_eq!(
        (p.figures.items_done, p.figures.results, p.figures.duplicates),
        (ITEMS as u64, ITEMS as u64, 10),
        "{p:?}"
    );
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("runs/batches/report.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(report["jobs"]["done"].as_u64(), Some(ITEMS as u64), "{report}");
    assert_eq!(report["benchmarks"][0]["completed"].as_u64(), Some(ITEMS as u64), "{report}");
}

//! Jobs reach only the workers of their pool: a local model's pool name carries its
//! placement (`gguf/m@cpu`, `gguf/m@gpu0`), so a worker holding the model on the CPU never
//! receives the jobs meant for the copy on GPU 0. Real nats-server, real worker.

use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt;
use halyard_broker::BrokerConfig;
use halyard_proto::pool::{PoolPlan, WorkerModel, WorkerPlan};
use halyard_proto::{subjects, ChatMessage, Job, JobKey, ModelRef, Sampling};
use halyard_tests::NatsServer;
use halyard_worker::WorkerConfig;

fn job(run: uuid::Uuid, pool: &str, i: u32) -> Job {
    let key = JobKey {
        pipeline: "test".into(),
        stage: "answer".into(),
        stage_version: 1,
        model: ModelRef { backend: "noop".into(), endpoint: String::new(), model: "m".into() },
        messages: vec![ChatMessage::user(format!("{pool} {i}"))],
        sampling: Sampling::default(),
        sample_index: 0,
    };
    Job::new(run, pool, key, 10_000)
}

/// A CPU-pool worker runs every CPU job and none of the GPU pool's jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_reach_only_their_pool() {
    let nats = NatsServer::start();
    let broker = halyard_broker::connect(&BrokerConfig::new(nats.url(), "test")).await.unwrap();
    halyard_broker::init(&broker, &Default::default()).await.unwrap();
    let run = uuid::Uuid::now_v7();
    let (cpu, gpu) = ("gguf/m@cpu", "gguf/m@gpu0");
    assert_ne!(subjects::job_subject(cpu), subjects::job_subject(gpu));
    // Both pools planned, as a coordinator plans them (it alone makes pool consumers).
    for pool in [cpu, gpu] {
        halyard_broker::pool_consumer(&broker, pool, Default::default()).await.unwrap();
    }
    for pool in [cpu, gpu] {
        for i in 0..5 {
            let j = job(run, pool, i);
            let payload = bytes::Bytes::from(halyard_proto::encode(&j).unwrap());
            let m = jetstream::message::PublishMessage::build()
                .payload(payload)
                .message_id(j.id.to_string());
            broker.js.send_publish(subjects::job_subject(pool), m).await.unwrap().await.unwrap();
        }
    }
    let state = tempfile::tempdir().unwrap();
    let cfg = WorkerConfig::new(
        WorkerPlan { pools: vec![PoolPlan::new(cpu, 2).with_model(WorkerModel::Noop)] },
        state.path().to_path_buf(),
    );
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let b = broker.clone();
    let worker = tokio::spawn(async move {
        halyard_worker::run(b, cfg, async move {
            let _ = stop_rx.wait_for(|v| *v).await;
        })
        .await
    });

    let consumer = halyard_broker::results_consumer(&broker, run).await.unwrap();
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while seen.len() < 5 {
        assert!(tokio::time::Instant::now() < deadline, "only {} of 5 CPU jobs ran", seen.len());
        let mut batch = consumer
            .fetch()
            .max_messages(10)
            .expires(Duration::from_millis(300))
            .messages()
            .await
            .unwrap();
        while let Some(Ok(m)) = batch.next().await {
            seen.extend(
                halyard_proto::decode_results(&m.payload).unwrap().into_iter().map(|r| r.job),
            );
            m.ack().await.unwrap();
        }
    }
    // Give the worker time to (wrongly) take more, then check the GPU jobs are untouched.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop_tx.send(true).unwrap();
    worker.await.unwrap().unwrap();
    let cpu_ids: Vec<_> = (0..5).map(|i| job(run, cpu, i).id).collect();
    assert!(seen.iter().all(|id| cpu_ids.contains(id)), "a non-CPU job ran");
    let mut gpu_consumer =
        halyard_broker::pool_consumer(&broker, gpu, Default::default()).await.unwrap();
    let pending = gpu_consumer.info().await.unwrap().num_pending;
    assert_eq!(pending, 5, "GPU jobs were taken by the CPU worker");
}

//! A 429 storm: the quota-enforcing fake answers every request with 429 for 10 s. The
//! pool pauses as a whole (a cool-down announced to every member) instead of each job
//! retrying on its own, and every job still completes: none is lost or dead-lettered.
//! Real nats-server, real stores on disk, real HTTP; two workers with their own connections.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures::StreamExt;
use halyard_broker::{BrokerConfig, Delivery};
use halyard_proto::pool::{PoolPlan, QuotaSpec, WorkerModel, WorkerPlan};
use halyard_proto::Outcome;
use halyard_tests::fake_quota::{chat_job, publish_chat_jobs};
use halyard_tests::{FakeQuotaApi, NatsServer, QuotaConfig};
use halyard_worker::WorkerConfig;

const POOL: &str = "paid";
const JOBS: u64 = 80;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storm_pauses_the_pool_and_loses_no_job() {
    let nats = NatsServer::start();
    let api = FakeQuotaApi::start(QuotaConfig {
        latency: Duration::from_millis(50),
        ..QuotaConfig::per_minute(600, 10_000_000)
    });
    let broker = halyard_broker::connect(&BrokerConfig::new(nats.url(), "test")).await.unwrap();
    halyard_broker::init(&broker, &Default::default()).await.unwrap();
    // The pool planned, as a coordinator plans it (it alone makes pool consumers).
    let delivery = Delivery { ack_wait: Duration::from_secs(30), max_deliver: 5 };
    halyard_broker::pool_consumer(&broker, POOL, delivery).await.unwrap();
    let run = uuid::Uuid::now_v7();
    publish_chat_jobs(&broker.js, run, POOL, &api.base_url(), 20, 0..JOBS).await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let mut workers = Vec::new();
    for n in 0..2 {
        let mut pool =
            PoolPlan::new(POOL, 4).with_model(WorkerModel::openai(&api.base_url(), "m", None));
        pool.quota = Some(QuotaSpec {
            rpm: Some(600),
            tpm: None,
            burst: 1,
            tpm_counts: Default::default(),
            itpm: None,
            otpm: None,
        });
        let mut cfg =
            WorkerConfig::new(WorkerPlan { pools: vec![pool] }, dir.path().join(format!("w{n}")));
        cfg.worker_id = format!("storm-worker-{n}");
        cfg.delivery = delivery;
        let b = halyard_broker::connect(&BrokerConfig::new(nats.url(), cfg.worker_id.clone()))
            .await
            .unwrap();
        let (tx, mut rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(halyard_worker::run(b, cfg, async move {
            let _ = rx.wait_for(|v| *v).await;
        }));
        workers.push((tx, task));
    }

    // Let some jobs through, then start the storm.
    let deadline = Instant::now() + Duration::from_secs(60);
    while api.ledger.admitted() < 10 {
        if let Some(i) = workers.iter().position(|w| w.1.is_finished()) {
            let (_, task) = workers.swap_remove(i);
            panic!("worker stopped early: {:?}", task.await.unwrap().err());
        }
        assert!(Instant::now() < deadline, "the workers made no calls");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = api.ledger.admitted();
    api.storm(Duration::from_secs(10), 2);
    let storm_start = Instant::now();

    // Every job's result arrives, each one completed.
    let consumer = halyard_broker::results_consumer(&broker, run).await.unwrap();
    let mut messages = consumer.messages().await.unwrap();
    let mut done = HashSet::new();
    let limit = Duration::from_secs(120);
    while done.len() < JOBS as usize {
        let m = tokio::time::timeout(limit.saturating_sub(storm_start.elapsed()), messages.next())
            .await
            .unwrap_or_else(|_| panic!("only {} of {JOBS} jobs completed", done.len()))
            .expect("results stream ended")
            .unwrap();
        // One result or a worker's batch of them.
        let results = halyard_proto::decode_results(&m.payload).unwrap();
        m.ack().await.unwrap();
        for r in results {
            match r.outcome {
                Outcome::Done(_) => {
                    done.insert(r.job);
                }
                Outcome::Failed(f) => panic!("job {} failed during the storm: {f:?}", r.job),
            }
        }
    }
    let expected: HashSet<_> =
        (0..JOBS).map(|i| chat_job(run, POOL, &api.base_url(), 20, i).id).collect();
    assert_eq!(done, expected);
    assert!(
        storm_start.elapsed() >= Duration::from_secs(10) || before >= JOBS - 8,
        "the storm did not hold the jobs back"
    );

    let mut cooldowns = 0;
    let mut rate_limited = 0;
    for (tx, task) in workers {
        tx.send(true).unwrap();
        let stats = task.await.unwrap().unwrap();
        cooldowns += stats.cooldowns.get();
        rate_limited += stats.rate_limited.get();
        assert_eq!(stats.dead_letters.get(), 0);
    }
    // The pool paused: a few probes per cool-down rather than every in-flight job
    // retrying on its own (8 slots, a 2 s Retry-After over 10 s: some 40 429s).
    let rejected = api.ledger.rejected();
    eprintln!(
        "storm: {rejected} 429s, {cooldowns} cool-downs started, {} s to finish",
        storm_start.elapsed().as_secs()
    );
    assert!(cooldowns >= 1, "no cool-down started");
    assert!(
        (1..=20).contains(&rejected),
        "{rejected} 429s during a 10 s storm: the pool did not pause as a whole"
    );
    assert_eq!(rate_limited, rejected, "every 429 was seen by a worker");
    assert_eq!(api.ledger.admitted(), JOBS, "a job was called twice or not at all");
}

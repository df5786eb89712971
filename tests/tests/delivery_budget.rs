//! The broker side of delivery budgets (issue 18), against a real nats-server: the pool
//! consumer has no server-side delivery limit and takes the ack wait the workers pace
//! their progress acks by, even when it existed with other settings; the budget bucket
//! records excused deliveries once each and forgets them.

use std::time::Duration;

use async_nats::jetstream::consumer;
use halyard_broker::{BrokerConfig, Delivery, BROKER_MAX_DELIVER};
use halyard_proto::subjects;
use halyard_tests::NatsServer;
use halyard_worker::budget::Budget;

/// An existing consumer with another ack wait, or with a server-side delivery limit (an
/// older Halyard's), is updated to the wanted settings rather than used as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_consumer_settings_are_updated() {
    let nats = NatsServer::start();
    let b = halyard_broker::connect(&BrokerConfig::new(nats.url(), "test")).await.unwrap();
    halyard_broker::init(&b, &Default::default()).await.unwrap();
    let stream = b.js.get_stream(subjects::JOBS_STREAM).await.unwrap();
    let name = subjects::pool_consumer("pool-a");
    // As an older Halyard made it: max_deliver 5 on the server, ack wait 30 s.
    stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some(name.clone()),
            filter_subject: subjects::job_subject("pool-a"),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(30),
            max_deliver: 5,
            ..Default::default()
        })
        .await
        .unwrap();
    let settings =
        |ack_wait: u64| Delivery { ack_wait: Duration::from_secs(ack_wait), max_deliver: 3 };
    let mut c = halyard_broker::pool_consumer(&b, "pool-a", settings(30)).await.unwrap();
    let info = c.info().await.unwrap().config.clone();
    assert_eq!((info.ack_wait, info.max_deliver), (Duration::from_secs(30), BROKER_MAX_DELIVER));
    // A sweep with another ack_wait_s: the consumer follows it.
    let mut c = halyard_broker::pool_consumer(&b, "pool-a", settings(4)).await.unwrap();
    let info = c.info().await.unwrap().config.clone();
    assert_eq!((info.ack_wait, info.max_deliver), (Duration::from_secs(4), BROKER_MAX_DELIVER));
    // The same settings again: used as they are.
    halyard_broker::pool_consumer(&b, "pool-a", settings(4)).await.unwrap();
}

/// Each delivery is excused once however often it is recorded, records of different
/// messages are apart, and a forgotten record reads as none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_records_excuse_each_delivery_once() {
    let nats = NatsServer::start();
    let b = halyard_broker::connect(&BrokerConfig::new(nats.url(), "test")).await.unwrap();
    // The bucket as the coordinator makes it (workers only open it).
    halyard_broker::init(&b, &Default::default()).await.unwrap();
    let budget = Budget::open(&b).await.unwrap();
    let (k7, k8) = (Budget::key("paid pool", 7), Budget::key("paid pool", 8));
    // The pool first (its token), so that permissions can scope records to pools.
    assert_eq!(k7, format!("{}.7", halyard_proto::subjects::pool_token("paid pool")));
    assert_eq!(budget.excused(&k7).await.unwrap(), 0);
    budget.excuse(&k7, 1).await.unwrap();
    budget.excuse(&k7, 1).await.unwrap();
    budget.excuse(&k7, 3).await.unwrap();
    budget.excuse(&k8, 2).await.unwrap();
    assert_eq!(budget.excused(&k7).await.unwrap(), 2);
    assert_eq!(budget.excused(&k8).await.unwrap(), 1);
    // Two workers recording at once (a message redelivered while its holder hands it
    // back): both deliveries count, none twice.
    let (a, c) = (budget.clone(), budget.clone());
    let (r1, r2) = tokio::join!(a.excuse(&k7, 4), c.excuse(&k7, 5));
    r1.unwrap();
    r2.unwrap();
    assert_eq!(budget.excused(&k7).await.unwrap(), 4);
    budget.forget(&k7).await;
    assert_eq!(budget.excused(&k7).await.unwrap(), 0);
    budget.excuse(&k7, 9).await.unwrap();
    assert_eq!(budget.excused(&k7).await.unwrap(), 1, "a record begun again after a purge");
    // Reopening finds the records (file storage, shared by every worker).
    let again = Budget::open(&b).await.unwrap();
    assert_eq!(again.excused(&k8).await.unwrap(), 1);
}

/// An idle pool leaves no pull request waiting at the broker (`worker/src/pool.rs`). On
/// nats-server 2.9.10 (Debian's), a redelivery that falls due while the consumer's only
/// waiting request has expired, or its requester is gone, is counted and not sent, and
/// the message goes out again as a first delivery: its next delivery then arrives two
/// counts later and spends the job's budget as a crashed worker's would (fixed in
/// nats-server 2.10.16). Sampled while a worker idles on an empty pool, and as it stops:
/// never a waiting request. (Before, an idle pool always had one, renewed every 500 ms.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_pool_leaves_no_pull_request_waiting() {
    use halyard_proto::pool::{PoolPlan, WorkerModel, WorkerPlan};
    let nats = NatsServer::start();
    let fake = halyard_tests::FakeOpenAi::start(|_| halyard_tests::Reply::Text("a".into())).await;
    let b = halyard_broker::connect(&BrokerConfig::new(nats.url(), "test")).await.unwrap();
    halyard_broker::init(&b, &Default::default()).await.unwrap();
    let delivery = Delivery { ack_wait: Duration::from_secs(5), max_deliver: 3 };
    halyard_broker::pool_consumer(&b, "pool-a", delivery).await.unwrap();
    let state = tempfile::tempdir().unwrap();
    let model = WorkerModel::openai(&fake.base_url(), "m", None);
    let plan = WorkerPlan { pools: vec![PoolPlan::new("pool-a", 4).with_model(model)] };
    let mut cfg = halyard_worker::WorkerConfig::new(plan, state.path().to_path_buf());
    cfg.delivery = delivery;
    let stats = cfg.stats.clone();
    let (stop, mut stop_rx) = tokio::sync::watch::channel(false);
    let worker = tokio::spawn(halyard_worker::run(b.clone(), cfg, async move {
        let _ = stop_rx.wait_for(|v| *v).await;
    }));
    let stream = b.js.get_stream(subjects::JOBS_STREAM).await.unwrap();
    let name = subjects::pool_consumer("pool-a");
    let waiting = || async {
        let mut seen = Vec::new();
        for _ in 0..30 {
            seen.push(stream.consumer_info(&name).await.unwrap().num_waiting);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        seen
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while stats.pulls.get() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the worker never pulled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = stats.pulls.get();
    let idle = waiting().await;
    assert!(stats.pulls.get() >= before + 3, "the worker stopped pulling while sampled");
    assert!(idle.iter().all(|n| *n == 0), "pull requests waiting at the broker: {idle:?}");
    stop.send(true).unwrap();
    worker.await.unwrap().unwrap();
    let after = waiting().await;
    assert!(after.iter().all(|n| *n == 0), "pull requests left by the stop: {after:?}");
}

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

//! A restarted coordinator does not publish again the jobs still queued in the job
//! stream, whatever grouping their messages had: with job batches, a copy grouped
//! differently has another message id, and the stream would keep it beside the first
//! (two workers could then run the same job). Real nats-server; coordinator and worker
//! in-process through their library `run` functions.

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream::stream::RawMessageErrorKind;
use halyard_broker::{BrokerConfig, Delivery};
use halyard_coordinator::{CoordinatorConfig, RunOutcome};
use halyard_plan::progress::Progress;
use halyard_plan::sweep;
use halyard_proto::pool::{PoolPlan, WorkerModel, WorkerPlan};
use halyard_proto::{subjects, JobId};
use halyard_tests::NatsServer;
use halyard_worker::WorkerConfig;
use tokio::sync::watch;

const ITEMS: usize = 200;

fn write_sweep(path: &std::path::Path, job_batch: &str) {
    std::fs::write(
        path,
        format!(
            "name = \"regroup\"\n[[model]]\nname = \"free\"\nbackend = \"noop\"\nmax_concurrency = 16\n\
             [[benchmark]]\npipeline = \"noop\"\njobs = {ITEMS}\nmodels = [\"free\"]\n\
             [run]\nwindow = 1000\nack_wait_s = 5\njob_batch = {job_batch}\n"
        ),
    )
    .unwrap();
}

/// Every job of the stream's messages on pool `free`'s subject, with its count, and the
/// number of messages.
async fn queued(broker: &halyard_broker::Broker) -> (HashMap<JobId, usize>, usize) {
    let stream = broker.js.get_stream(subjects::JOBS_STREAM).await.unwrap();
    let subject = subjects::job_subject("free");
    let (mut jobs, mut messages, mut seq) = (HashMap::new(), 0, 1);
    loop {
        let m = match stream.get_first_raw_message_by_subject(&subject, seq).await {
            Ok(m) => m,
            Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => break,
            Err(e) => panic!("reading the job stream: {e}"),
        };
        seq = m.sequence + 1;
        messages += 1;
        for j in halyard_proto::decode_jobs(&m.payload).unwrap() {
            *jobs.entry(j.id).or_insert(0) += 1;
        }
    }
    (jobs, messages)
}

/// A coordinator that publishes its first jobs and stops once its start-up is over (its
/// first progress, sent as start-up ends: a stop before then would cut the start-up
/// short); no worker runs.
async fn publish_and_stop(broker: &halyard_broker::Broker, cfg: &CoordinatorConfig) {
    let (tx, mut rx) = watch::channel(Progress::default());
    let started = async move {
        let _ = rx.changed().await;
    };
    let outcome =
        halyard_coordinator::run(broker.clone(), cfg.clone(), Some(tx), started).await.unwrap();
    assert!(matches!(outcome, RunOutcome::Interrupted { .. }), "{outcome:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_does_not_queue_a_batched_job_twice() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("regroup.toml");
    let broker =
        halyard_broker::connect(&BrokerConfig::new(nats.url(), "regroup-test")).await.unwrap();
    let run_dir = dir.path().join("runs/regroup");

    // The first coordinator sends its jobs 8 to a message; nobody takes them.
    write_sweep(&path, "8");
    let cfg = CoordinatorConfig { sweep: sweep::load(&path).unwrap(), run_dir: run_dir.clone() };
    publish_and_stop(&broker, &cfg).await;
    let (jobs, messages) = queued(&broker).await;
    assert_eq!((jobs.len(), messages), (ITEMS, ITEMS / 8));

    // Restarted with messages of 5 (as a different pace or arrival order would group
    // them), twice: the jobs are in the stream once each, in their first messages.
    write_sweep(&path, "5");
    let cfg = CoordinatorConfig { sweep: sweep::load(&path).unwrap(), run_dir: run_dir.clone() };
    for _ in 0..2 {
        publish_and_stop(&broker, &cfg).await;
        let (jobs, messages) = queued(&broker).await;
        let twice = jobs.values().filter(|n| **n > 1).count();
        assert_eq!(twice, 0, "{twice} of {ITEMS} jobs queued more than once");
        assert_eq!((jobs.len(), messages), (ITEMS, ITEMS / 8));
    }

    // Nothing skipped is lost: a worker takes the queued messages and the run completes
    // with every job done.
    let mut wcfg = WorkerConfig::new(
        WorkerPlan { pools: vec![PoolPlan::new("free", 16).with_model(WorkerModel::Noop)] },
        dir.path().join("checkpoint"),
    );
    wcfg.delivery = Delivery { ack_wait: Duration::from_secs(5), max_deliver: 5 };
    let (wstop_tx, mut wstop_rx) = watch::channel(false);
    let worker = tokio::spawn(halyard_worker::run(broker.clone(), wcfg, async move {
        let _ = wstop_rx.wait_for(|v| *v).await;
    }));
    let outcome =
        halyard_coordinator::run(broker.clone(), cfg, None, std::future::pending()).await.unwrap();
    let RunOutcome::Complete { report_dir, dead_letters, .. } = outcome else {
        panic!("{outcome:?}")
    };
    wstop_tx.send(true).unwrap();
    worker.await.unwrap().unwrap();
    assert_eq!(dead_letters, 0);
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(report_dir.join("report.json")).unwrap()).unwrap();
    assert_eq!(report["jobs"]["done"].as_u64(), Some(ITEMS as u64), "{}", report["jobs"]);
    assert_eq!(report["benchmarks"][0]["completed"].as_u64(), Some(ITEMS as u64));
    assert_eq!(queued(&broker).await.0.len(), 0, "the job stream still holds jobs");
}

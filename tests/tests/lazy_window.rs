//! The coordinator plans lazily: at most `[run] window` items are planned and unfinished
//! at once, and a coordinator stopped midway and started again finds and finishes every
//! unfinished item, counting each once. Real nats-server; coordinator and worker run
//! in-process through their library `run` functions.

use std::time::Duration;

use halyard_broker::{BrokerConfig, Delivery};
use halyard_coordinator::{CoordinatorConfig, RunOutcome};
use halyard_plan::progress::Progress;
use halyard_plan::sweep;
use halyard_proto::pool::{PoolPlan, WorkerModel, WorkerPlan};
use halyard_tests::NatsServer;
use halyard_worker::WorkerConfig;
use tokio::sync::watch;

const ITEMS: u64 = 300;
const WINDOW: u64 = 8;

async fn until(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

/// The window bounds planned items and jobs in flight, and a restart finishes exactly the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_bounds_planning_and_restart_finishes_the_rest() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lazy.toml");
    std::fs::write(
        &path,
        format!(
            "name = \"lazy\"\n[[model]]\nname = \"free\"\nbackend = \"noop\"\nmax_concurrency = 4\n\
             [[benchmark]]\npipeline = \"noop\"\njobs = {ITEMS}\nmodels = [\"free\"]\n[run]\nwindow = {WINDOW}\n"
        ),
    )
    .unwrap();
    let sweep = sweep::load(&path).unwrap();
    let broker =
        halyard_broker::connect(&BrokerConfig::new(nats.url(), "lazy-test")).await.unwrap();
    let mut wcfg = WorkerConfig::new(
        WorkerPlan { pools: vec![PoolPlan::new("free", 4).with_model(WorkerModel::Noop)] },
        dir.path().join("checkpoint"),
    );
    wcfg.delivery = Delivery { ack_wait: Duration::from_secs(5), max_deliver: 5 };
    let (wstop_tx, wstop_rx) = watch::channel(false);
    let worker = tokio::spawn(halyard_worker::run(broker.clone(), wcfg, until(wstop_rx)));
    let cfg = CoordinatorConfig { sweep, run_dir: dir.path().join("runs/lazy") };

    // First coordinator: watch the window, stop it a third of the way through.
    let (ptx, mut prx) = watch::channel(Progress::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let first = tokio::spawn(halyard_coordinator::run(
        broker.clone(),
        cfg.clone(),
        Some(ptx),
        until(stop_rx),
    ));
    let (mut max_active, mut max_in_flight) = (0, 0);
    while prx.changed().await.is_ok() {
        let p = prx.borrow_and_update().clone();
        max_active = max_active.max(p.figures.active);
        max_in_flight = max_in_flight.max(p.figures.published - p.figures.results);
        if p.figures.items_done >= ITEMS / 3 {
            break;
        }
    }
    stop_tx.send(true).unwrap();
    let outcome = first.await.unwrap().unwrap();
    assert!(matches!(outcome, RunOutcome::Interrupted { .. }), "{outcome:?}");
    assert!(
        max_active > 0 && max_active <= WINDOW,
        "{max_active} items planned at once, window {WINDOW}"
    );
    assert!(
        max_in_flight <= WINDOW,
        "{max_in_flight} jobs in flight, window {WINDOW} (one job per item)"
    );
    // The last progress sent is the state as flushed at the stop.
    let done_before = prx.borrow().figures.items_done;
    assert!(done_before >= ITEMS / 3, "{done_before} items done before the stop");

    // Second coordinator on the same state: skips what is done, plans the rest.
    let (ptx, prx) = watch::channel(Progress::default());
    let seen = tokio::spawn(async move {
        let mut prx = prx;
        let mut first = None;
        while prx.changed().await.is_ok() {
            let p = prx.borrow_and_update().clone();
            first.get_or_insert(p.clone());
            if p.figures.items_done >= p.figures.items_total && p.figures.items_total > 0 {
                return (first, p);
            }
        }
        (first, Progress::default())
    });
    let outcome = halyard_coordinator::run(broker.clone(), cfg, Some(ptx), std::future::pending())
        .await
        .unwrap();
    let RunOutcome::Complete { report_dir, .. } = outcome else { panic!("{outcome:?}") };
    let (at_start, last) = seen.await.unwrap();
    let at_start = at_start.expect("the resumed coordinator reported progress");
    wstop_tx.send(true).unwrap();
    worker.await.unwrap().unwrap();

    assert!(
        at_start.figures.items_done >= done_before,
        "the resumed run started from scratch: {at_start:?}"
    );
    assert_eq!((last.figures.items_done, last.figures.items_total), (ITEMS, ITEMS));
    assert!(
        last.figures.published <= ITEMS - done_before,
        "republished finished items: {last:?}, {done_before} done before"
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(report_dir.join("report.json")).unwrap()).unwrap();
    let b = &report["benchmarks"][0];
    for key in ["items", "labelled", "completed"] {
        assert_eq!(b[key].as_u64(), Some(ITEMS), "{key}: {b}");
    }
    assert_eq!(b["ignored"].as_u64(), Some(0), "{b}");
    assert_eq!(report["jobs"]["done"].as_u64(), Some(ITEMS), "{}", report["jobs"]);
}

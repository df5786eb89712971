//! The health handle under paused tokio time: who fetches, who probes, and when.

use super::*;

fn health() -> (Arc<PoolHealth>, Arc<Stats>) {
    let stats = Arc::new(Stats::default());
    (PoolHealth::local("pool-a", "w1", stats.clone()), stats)
}

use super::machine::refused;

/// While paused the pool loop waits for the first probe (1 s), gets it once, and waits
/// while a job holds the probe; the holder's failed probes come at 1 s, 2 s, 4 s …; an
/// answer resumes both, and the stats count the outage.
#[tokio::test(start_paused = true)]
async fn fetch_and_probe_turns_follow_the_schedule() {
    let (h, stats) = health();
    let t0 = Instant::now();
    assert_eq!(h.fetch_turn().await, FetchTurn::Resumed, "up: fetch as usual");
    assert_eq!(h.failed(refused(t0, false)), Verdict::Opened);
    assert_eq!(h.paused_by(), Some(OutageReason::Connection));
    assert_eq!(h.fetch_turn().await, FetchTurn::Probe);
    assert_eq!(Instant::now() - t0, Duration::from_secs(1), "first probe after 1 s");
    let claim = h.claim_probe().expect("probe free");
    assert!(h.claim_probe().is_none());
    // With the probe held, the pool loop waits, however long.
    let waiting = tokio::time::timeout(Duration::from_secs(600), h.fetch_turn()).await;
    assert!(waiting.is_err(), "the loop fetched while a job held the probe");
    let mut gaps = vec![];
    for _ in 0..4 {
        let before = Instant::now();
        h.failed(refused(Instant::now(), true));
        assert_eq!(h.probe_turn().await, ProbeTurn::Go);
        gaps.push((Instant::now() - before).as_secs());
    }
    assert_eq!(gaps, [2, 4, 8, 16]);
    let sent = Instant::now();
    tokio::time::advance(Duration::from_millis(30)).await;
    h.answered(sent, true);
    assert!(!h.is_paused());
    assert_eq!(h.probe_turn().await, ProbeTurn::Resumed);
    drop(claim);
    let snap = stats.pool_health.snapshot();
    assert_eq!(snap.len(), 1);
    let (pool, s) = &snap[0];
    assert_eq!((pool.as_str(), s.paused, s.pauses), ("pool-a", None, 1));
    assert_eq!(s.outage, Instant::now() - t0);
    assert_eq!(stats.pauses.get(), 1);
}

/// Releasing the probe (its job handed back or finished) lets the pool loop fetch a new
/// one to probe with; no job at hand defers the next try by an interval.
#[tokio::test(start_paused = true)]
async fn a_released_probe_is_fetched_again() {
    let (h, _) = health();
    h.failed(refused(Instant::now(), false));
    let claim = h.claim_probe().unwrap();
    let loop_turn = {
        let h = h.clone();
        tokio::spawn(async move { h.fetch_turn().await })
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!loop_turn.is_finished());
    drop(claim);
    assert_eq!(loop_turn.await.unwrap(), FetchTurn::Probe);
    let t = Instant::now();
    h.defer_probe();
    assert_eq!(h.fetch_turn().await, FetchTurn::Probe);
    assert_eq!(Instant::now() - t, Duration::from_secs(1));
}

/// Another worker's pause pauses this one (its stats say so) and its resumption wakes
/// the waiting pool loop at once.
#[tokio::test(start_paused = true)]
async fn announcements_pause_and_resume() {
    let (h, stats) = health();
    h.remote(Announcement::Pause {
        worker: "w2".into(),
        reason: OutageReason::Unavailable,
        probe_ms: 4000,
    });
    assert!(h.is_paused());
    assert_eq!(stats.pool_health.snapshot()[0].1.paused, Some(OutageReason::Unavailable));
    assert_eq!(stats.pauses.get(), 0, "not begun here");
    // Our own announcements coming back are ignored.
    h.remote(Announcement::Resume { worker: "w1".into() });
    assert!(h.is_paused());
    let turn = {
        let h = h.clone();
        tokio::spawn(async move { h.fetch_turn().await })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    h.remote(Announcement::Resume { worker: "w2".into() });
    assert_eq!(turn.await.unwrap(), FetchTurn::Resumed);
    assert_eq!(stats.pool_health.snapshot()[0].1.outage, Duration::from_secs(3));
}

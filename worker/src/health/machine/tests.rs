//! The health state machine, driven with explicit instants (no IO, no sleeping).

use super::*;

fn at(t0: Instant, ms: u64) -> Instant {
    t0 + Duration::from_millis(ms)
}

use super::refused as failure;

/// Probe intervals double from 1 s and stop at 60 s.
#[test]
fn intervals_double_to_the_cap() {
    let secs: Vec<u64> = (0..9).map(|k| probe_interval(k).as_secs()).collect();
    assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
    assert_eq!(probe_interval(u32::MAX), MAX_PROBE_INTERVAL);
}

/// The first failure pauses the pool; the calls in flight that fail after it do not
/// count as new pauses; each failed probe doubles the interval; a probe's answer
/// resumes the pool and says how long it was down.
#[tokio::test(start_paused = true)]
async fn pause_probe_resume() {
    let t0 = Instant::now();
    let mut m = Machine::new();
    assert_eq!(
        m.failed(failure(t0, false), at(t0, 10)),
        (Verdict::Opened, Some(Change::Paused { local: true }))
    );
    assert!(m.is_paused());
    assert_eq!(m.outage().unwrap().next_probe, at(t0, 1010));
    // Another call in flight at the onset fails too: same pause, no change.
    assert_eq!(m.failed(failure(t0, false), at(t0, 20)), (Verdict::Paused, None));
    let claim = m.claim_probe().expect("probe free");
    assert_eq!(m.claim_probe(), None, "one probe at a time");
    let mut next = vec![];
    for k in 0..8u64 {
        let now = at(t0, 2000 + k);
        assert_eq!(m.failed(failure(now, true), now), (Verdict::Paused, Some(Change::ProbeFailed)));
        next.push((m.outage().unwrap().next_probe - now).as_secs());
    }
    assert_eq!(next, [2, 4, 8, 16, 32, 60, 60, 60]);
    let end = at(t0, 90_000);
    assert_eq!(
        m.answered(at(t0, 89_000), true, end),
        Some(Change::Resumed { down_for: Duration::from_millis(89_990), local: true })
    );
    assert!(!m.is_paused());
    assert!(!m.probe_held(), "resuming frees the probe");
    m.release_probe(claim);
    assert!(m.claim_probe().is_none(), "no probe while up");
}

/// A timeout after the endpoint answered another call started later is the call's
/// own fault, not an outage.
#[tokio::test(start_paused = true)]
async fn a_slow_call_among_answers_is_the_jobs_fault() {
    let t0 = Instant::now();
    let mut m = Machine::new();
    assert_eq!(m.answered(at(t0, 500), false, at(t0, 600)), None);
    let (v, c) = m.failed(failure(t0, false), at(t0, 2000));
    assert_eq!((v, c), (Verdict::JobFault, None));
    assert!(!m.is_paused());
    // One sent after the last answer that fails is an outage.
    assert_eq!(m.failed(failure(at(t0, 700), false), at(t0, 2700)).0, Verdict::Opened);
}

/// An answer to a call sent before the pause does not resume it; one sent after does.
#[tokio::test(start_paused = true)]
async fn stale_answers_do_not_resume() {
    let t0 = Instant::now();
    let mut m = Machine::new();
    m.failed(failure(t0, false), at(t0, 100));
    assert_eq!(m.answered(at(t0, 50), false, at(t0, 200)), None);
    assert!(m.is_paused());
    assert!(matches!(m.answered(at(t0, 150), false, at(t0, 300)), Some(Change::Resumed { .. })));
}

/// A `Retry-After` on an endpoint-wide failure lengthens the wait for the probe, up to
/// its own cap.
#[tokio::test(start_paused = true)]
async fn retry_after_lengthens_the_probe_wait() {
    let t0 = Instant::now();
    let mut m = Machine::new();
    let f = Failure { retry_after: Some(Duration::from_secs(20)), ..failure(t0, false) };
    m.failed(f, t0);
    assert_eq!(m.outage().unwrap().next_probe - t0, Duration::from_secs(20));
    let f = Failure { retry_after: Some(Duration::from_secs(86_400)), ..failure(t0, true) };
    m.failed(f, t0);
    assert_eq!(m.outage().unwrap().next_probe - t0, MAX_RETRY_AFTER);
}

/// Another worker's pause pauses this one without a change to announce; its probe waits
/// for the other's next probe plus a grace; another worker's resumption resumes it.
#[tokio::test(start_paused = true)]
async fn remote_pause_and_resume() {
    let t0 = Instant::now();
    let mut m = Machine::new();
    let c = m.remote_paused(OutageReason::Unavailable, "w2", Duration::from_secs(4), t0);
    assert_eq!(c, Some(Change::Paused { local: false }));
    assert_eq!(m.outage().unwrap().next_probe - t0, Duration::from_secs(4 + 2));
    // The other's failed probe pushes ours; a shorter announcement does not pull it in.
    m.remote_paused(OutageReason::Unavailable, "w2", Duration::from_secs(8), at(t0, 5000));
    assert_eq!(m.outage().unwrap().next_probe - t0, Duration::from_secs(5 + 8 + 4));
    assert_eq!(
        m.remote_paused(OutageReason::Unavailable, "w2", Duration::from_secs(1), at(t0, 5000)),
        None
    );
    assert_eq!(m.outage().unwrap().next_probe - t0, Duration::from_secs(17));
    // Our in-flight calls failing now are part of the pause.
    assert_eq!(m.failed(failure(t0, false), at(t0, 5100)).0, Verdict::Paused);
    assert_eq!(
        m.remote_resumed(at(t0, 9000)),
        Some(Change::Resumed { down_for: Duration::from_secs(9), local: false })
    );
    assert_eq!(m.remote_resumed(at(t0, 9001)), None);
}

/// A stale release (a job that held an earlier claim) does not free a newer claim; no
/// job to probe with defers the probe by one interval.
#[tokio::test(start_paused = true)]
async fn probe_claims_and_deferral() {
    let t0 = Instant::now();
    let mut m = Machine::new();
    m.failed(failure(t0, false), t0);
    let a = m.claim_probe().unwrap();
    m.release_probe(a);
    let b = m.claim_probe().unwrap();
    m.release_probe(a);
    assert!(m.probe_held(), "a stale release freed the probe");
    m.release_probe(b);
    assert!(!m.probe_held());
    m.defer_probe(at(t0, 3000));
    assert_eq!(m.outage().unwrap().next_probe, at(t0, 4000));
}

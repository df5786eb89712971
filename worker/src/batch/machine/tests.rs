//! Every transition of the batch machines, the odd ones included (a fence lost, a lease
//! lost mid-upload, a provider batch failed, expired or cancelled, a restart finding each
//! persisted state).

use super::*;
use crate::backend::ErrorClass;

const LEASE: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_secs(30);

fn job(n: u8) -> JobId {
    JobId([n; 16])
}

fn limits() -> Limits {
    Limits {
        batch_size: 3,
        batch_wait: Duration::from_secs(60),
        queue_tokens: Some(1_000),
        lease: LEASE,
    }
}

fn record(state: BatchState, jobs: &[JobId], lease_until_ms: u64) -> BatchRecord {
    BatchRecord {
        id: "rec1".into(),
        pool: "pool".into(),
        model: "m".into(),
        state,
        jobs: jobs.iter().map(|j| j.to_string()).collect(),
        tokens: 0,
        owner: "w1/a".into(),
        lease_until_ms,
        created_ms: 10_000_000,
        submitted_ms: None,
        ended_ms: None,
    }
}

fn submitted() -> BatchState {
    BatchState::Submitted { file: "file-1".into(), batch: "batch_1".into() }
}

fn ended(status: &str) -> BatchState {
    BatchState::Ended {
        batch: "batch_1".into(),
        status: status.into(),
        output: Some("out".into()),
        error: None,
        reason: None,
    }
}

fn completion() -> Completion {
    Completion {
        text: "yes".into(),
        usage: Default::default(),
        latency_ms: 1,
        finish_reason: None,
        calls: 1,
        logprobs: None,
        refusal: false,
        source: Default::default(),
    }
}

// --- pure helpers -----------------------------------------------------------------------

/// A lease wants renewing once a third of it is gone, not before.
#[test]
fn lease_is_due_when_a_third_is_gone() {
    let now = 1_000_000;
    assert!(!lease_due(now + 120_000, now, LEASE));
    assert!(!lease_due(now + 80_001, now, LEASE));
    assert!(lease_due(now + 80_000, now, LEASE));
    assert!(lease_due(now - 1, now, LEASE));
}

/// Backoff doubles from a second and stops at a minute.
#[test]
fn backoff_doubles_to_a_minute() {
    let b: Vec<u64> = (0..9).map(|a| backoff(a).as_secs()).collect();
    assert_eq!(b, vec![1, 2, 4, 8, 16, 32, 60, 60, 60]);
}

/// A failed batch's state names the batch (empty before the provider had one) and the
/// error as its reason.
#[test]
fn failed_state_carries_the_reason() {
    let s = failed_state("", &CallError::permanent("bad file"));
    assert_eq!(
        s,
        BatchState::Ended {
            batch: String::new(),
            status: "failed".into(),
            output: None,
            error: None,
            reason: Some("bad file".into()),
        }
    );
    assert!(!s.is_live());
}

/// A request larger than `batch_queue_tokens` can never be enqueued: a permanent
/// failure; without the setting, any size fits.
#[test]
fn requests_that_never_fit() {
    assert!(never_fits(1_000, Some(1_000)).is_none());
    assert!(never_fits(u64::MAX, None).is_none());
    let e = never_fits(1_001, Some(1_000)).expect("too large");
    assert!(e.is_permanent() && e.message.contains("(1000)"), "{}", e.message);
}

/// A job waits for a record that holds it, or gathers under a live lease; never for a
/// given-up one.
#[test]
fn which_records_a_job_waits_for() {
    let (a, b) = (job(1), job(2));
    let now = 5_000;
    assert!(holds_for(&record(BatchState::Gathering, &[], now + 1), &a, now));
    assert!(!holds_for(&record(BatchState::Gathering, &[], now), &a, now));
    assert!(holds_for(&record(submitted(), &[a], 0), &a, now));
    assert!(!holds_for(&record(submitted(), &[a], 0), &b, now));
    assert!(holds_for(&record(ended("completed"), &[a], 0), &a, now));
    let abandoned = BatchState::Abandoned { reason: "x".into() };
    assert!(!holds_for(&record(abandoned.clone(), &[a], now + 1), &a, now));
    // At the provider: only records past gathering that list the job.
    assert!(holds_at_provider(&record(BatchState::Uploading, &[a], 0), &a));
    assert!(!holds_at_provider(&record(BatchState::Gathering, &[a], u64::MAX), &a));
    assert!(!holds_at_provider(&record(abandoned, &[a], 0), &a));
    assert!(!holds_at_provider(&record(ended("completed"), &[b], 0), &a));
}

// --- Join ---------------------------------------------------------------------------------

fn claim(record: Option<&str>, revision: u64) -> JoinEvent {
    JoinEvent::Claim { record: record.map(str::to_string), revision }
}

/// An unclaimed job is claimed at the key's revision into this worker's gathering record,
/// and waits for it once the claim is written.
#[test]
fn join_unclaimed_job_takes_the_claim() {
    let (mut j, cmd) = Join::new(job(1));
    assert_eq!(cmd, JoinCommand::ReadClaim);
    assert_eq!(j.step(claim(None, 7)), JoinCommand::Take { claim_revision: 7 });
    assert_eq!(j.step(JoinEvent::Took(Some("g1".into()))), JoinCommand::Wait("g1".into()));
}

/// A claim naming a record that holds the job (at the provider, ended, or gathering
/// under a live lease): the job waits for that record and is never gathered again.
#[test]
fn join_waits_for_a_record_that_holds_the_job() {
    let a = job(1);
    for r in [
        record(submitted(), &[a], 0),
        record(BatchState::Uploading, &[a], 0),
        record(BatchState::Uploaded { file: "f".into() }, &[a], 0),
        record(ended("expired"), &[a], 0),
        record(BatchState::Gathering, &[], 5_001),
    ] {
        let (mut j, _) = Join::new(a);
        assert_eq!(j.step(claim(Some("rec1"), 3)), JoinCommand::ReadRecord("rec1".into()));
        let state = r.state.name();
        assert_eq!(
            j.step(JoinEvent::Record { record: Box::new(r), revision: 9, now_ms: 5_000 }),
            JoinCommand::Wait("rec1".into()),
            "{state}"
        );
    }
}

/// A gathering record whose lease lapsed is fenced off (given up by compare-and-set at
/// its revision) before the claim is taken over; a fence lost (it changed meanwhile) reads
/// the claim again.
#[test]
fn join_fences_a_lapsed_gathering_record() {
    let a = job(1);
    let (mut j, _) = Join::new(a);
    j.step(claim(Some("rec1"), 3));
    let lapsed = record(BatchState::Gathering, &[], 5_000);
    match j.step(JoinEvent::Record { record: Box::new(lapsed), revision: 9, now_ms: 5_000 }) {
        JoinCommand::Fence { record, revision } => {
            assert_eq!(revision, 9);
            assert_eq!(
                record.state,
                BatchState::Abandoned { reason: "its gatherer's lease lapsed".into() }
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(j.step(JoinEvent::Fenced { won: true }), JoinCommand::Take { claim_revision: 3 });
    // The stale fence: someone wrote the record first.
    let (mut j, _) = Join::new(a);
    j.step(claim(Some("rec1"), 3));
    j.step(JoinEvent::Record {
        record: Box::new(record(BatchState::Gathering, &[], 0)),
        revision: 9,
        now_ms: 5_000,
    });
    assert_eq!(j.step(JoinEvent::Fenced { won: false }), JoinCommand::ReadClaim);
}

/// A claim naming a record that does not hold the job (given up, went on without it,
/// gone, unreadable) is taken over at the claim's revision.
#[test]
fn join_takes_over_a_claim_nothing_holds() {
    let a = job(1);
    let abandoned = record(BatchState::Abandoned { reason: "x".into() }, &[a], u64::MAX);
    let without = record(submitted(), &[job(2)], u64::MAX);
    let ended_without = record(ended("completed"), &[job(2)], 0);
    for event in [
        JoinEvent::Record { record: Box::new(abandoned), revision: 1, now_ms: 5_000 },
        JoinEvent::Record { record: Box::new(without), revision: 1, now_ms: 5_000 },
        JoinEvent::Record { record: Box::new(ended_without), revision: 1, now_ms: 5_000 },
        JoinEvent::NoRecord,
        JoinEvent::Unreadable,
    ] {
        let (mut j, _) = Join::new(a);
        j.step(claim(Some("rec1"), 4));
        assert_eq!(j.step(event.clone()), JoinCommand::Take { claim_revision: 4 }, "{event:?}");
    }
}

/// A claim that keeps changing under the job is read again, 20 times at most.
#[test]
fn join_gives_up_on_a_claim_that_keeps_changing() {
    let (mut j, _) = Join::new(job(1));
    for n in 1..JOIN_ATTEMPTS {
        j.step(claim(None, n as u64));
        assert_eq!(j.step(JoinEvent::Took(None)), JoinCommand::ReadClaim, "attempt {n}");
    }
    j.step(claim(None, 99));
    assert_eq!(j.step(JoinEvent::Took(None)), JoinCommand::GiveUp);
}

// --- settle, answers ----------------------------------------------------------------------

/// What each state of the record a job waits for means for it.
#[test]
fn settle_each_state() {
    let now = 5_000;
    let r = |s| record(s, &[], now + 1);
    assert_eq!(settle(&r(BatchState::Gathering), false, now), Settle::Wait);
    assert!(matches!(
        settle(&record(BatchState::Gathering, &[], now), false, now),
        Settle::NotRun(w) if w.contains("went on without the job")
    ));
    for s in [BatchState::Uploading, BatchState::Uploaded { file: "f".into() }, submitted()] {
        assert_eq!(settle(&r(s.clone()), true, now), Settle::Wait, "{s:?}");
        assert!(matches!(settle(&r(s), false, now), Settle::NotRun(_)));
    }
    assert_eq!(settle(&r(ended("completed")), true, now), Settle::Answer);
    assert!(matches!(settle(&r(ended("completed")), false, now), Settle::NotRun(_)));
    let given_up = r(BatchState::Abandoned { reason: "its worker stopped".into() });
    assert_eq!(
        settle(&given_up, true, now),
        Settle::NotRun("batch rec1 was given up: its worker stopped".into())
    );
}

fn outcome(t: &Taken) -> String {
    match &t.outcome {
        BatchOutcome::Done(c) => format!("done {}", c.text),
        BatchOutcome::Failed(e, calls) => format!("failed {:?} {calls}: {}", e.class, e.message),
        BatchOutcome::NotRun(w) => format!("not run: {w}"),
        BatchOutcome::Abandoned => "abandoned".into(),
    }
}

/// An answer is a completion and keeps the claim; every other outcome frees it.
#[test]
fn answers_of_an_ended_batch() {
    let done = Answer::Done(completion());
    let t = answer_of("b", "completed", None, Some(&done));
    assert_eq!((outcome(&t), t.release_claim), ("done yes".into(), false));

    let permanent = Answer::Failed(CallError::permanent("HTTP 400"));
    let t = answer_of("b", "completed", None, Some(&permanent));
    assert_eq!((outcome(&t), t.release_claim), ("failed Permanent 1: HTTP 400".into(), true));

    let mut limited = CallError::transient("429");
    limited.class = ErrorClass::RateLimited;
    let t = answer_of("b", "completed", None, Some(&Answer::Failed(limited)));
    assert_eq!(outcome(&t), "not run: 429");

    // Requests that never ran: budget kept only when the batch expired or was cancelled.
    let unrun = Answer::NotRun("batch_expired".into());
    for status in ["expired", "cancelled"] {
        let t = answer_of("b", status, None, Some(&unrun));
        assert_eq!(outcome(&t), "not run: batch_expired", "{status}");
        assert!(outcome(&answer_of("b", status, None, None)).starts_with("not run: batch b ended"));
    }
    let t = answer_of("b", "completed", None, Some(&unrun));
    assert_eq!(outcome(&t), "failed Transient 0: batch_expired");

    // No line for the job.
    let t = answer_of("b", "failed", Some("invalid file"), None);
    assert_eq!(outcome(&t), "failed Transient 0: provider batch b failed: invalid file");
    let t = answer_of("", "failed", None, None);
    assert_eq!(
        outcome(&t),
        "failed Transient 0: provider batch (not created) failed: no reason given"
    );
    let t = answer_of("b", "completed", None, None);
    assert_eq!(
        outcome(&t),
        "failed Transient 1: batch b ended completed without an answer for the request"
    );
    assert!(t.release_claim);
}

/// A download that asking again will not mend (permanent, no status, 404, 410) counts
/// and frees the claim; anything else (401, 403, 5xx) is tried on a later delivery.
#[test]
fn downloads_that_fail() {
    let mut e = CallError::permanent("gone");
    for status in [None, Some(404), Some(410)] {
        e.status = status;
        let t = download_failed("b", &e);
        assert!(t.release_claim && matches!(t.outcome, BatchOutcome::Failed(_, 0)), "{status:?}");
    }
    for status in [Some(401), Some(403)] {
        e.status = status;
        let t = download_failed("b", &e);
        assert!(!t.release_claim, "{status:?}");
        assert_eq!(outcome(&t), "not run: cannot download the answers of batch b: gone");
    }
    let t = download_failed("b", &CallError::transient("503"));
    assert!(!t.release_claim && matches!(t.outcome, BatchOutcome::NotRun(_)));
}

// --- following records, the ledger --------------------------------------------------------

/// A worker takes over only a record the provider may hold, not its own, whose lease
/// lapsed, while it is not stopping and serves the record's model.
#[test]
fn take_over_rules() {
    let now = 5_000;
    for s in [BatchState::Uploading, BatchState::Uploaded { file: "f".into() }, submitted()] {
        let r = record(s, &[], now);
        assert!(adopts(&r, false, now, false, true));
        assert!(!adopts(&r, true, now, false, true), "owned here");
        assert!(!adopts(&r, false, now, true, true), "stopping");
        assert!(!adopts(&r, false, now, false, false), "model not served");
        assert!(!adopts(&record(r.state.clone(), &[], now + 1), false, now, false, true));
    }
    for s in
        [BatchState::Gathering, ended("completed"), BatchState::Abandoned { reason: "x".into() }]
    {
        assert!(!adopts(&record(s, &[], 0), false, now, false, true));
    }
}

/// A record read is sent to its waiting tasks when it changed, or when it gathers (its
/// lease lapses with time); an owned record is pushed by its owner instead.
#[test]
fn which_reads_wake_the_waiting_tasks() {
    assert!(push_read(false, 0, 4, &submitted()));
    assert!(!push_read(false, 4, 4, &submitted()));
    assert!(push_read(false, 4, 4, &BatchState::Gathering));
    assert!(!push_read(true, 0, 4, &submitted()));
    let gone = gone_record("r9", "p");
    assert_eq!((gone.id.as_str(), gone.pool.as_str()), ("r9", "p"));
    assert_eq!(gone.state, BatchState::Abandoned { reason: "its record is gone".into() });
}

/// Ledger entries are dropped only when certainly stale.
#[test]
fn ledger_staleness() {
    let now = 100 * 3600 * 1000;
    let hold = LEDGER_HOLD.as_millis() as u64;
    let mut r = record(submitted(), &[], 0);
    r.submitted_ms = Some(now - hold + 1);
    assert!(ledger_keeps(Some(&r), now));
    r.submitted_ms = Some(now - hold);
    assert!(!ledger_keeps(Some(&r), now));
    // Uploaded: counted from its creation.
    let mut u = record(BatchState::Uploaded { file: "f".into() }, &[], 0);
    u.created_ms = now - 1;
    assert!(ledger_keeps(Some(&u), now));
    let grace = UPLOAD_GRACE.as_millis() as u64;
    assert!(ledger_keeps(Some(&record(BatchState::Uploading, &[], now - grace + 1)), now));
    assert!(!ledger_keeps(Some(&record(BatchState::Uploading, &[], now - grace)), now));
    assert!(ledger_keeps(Some(&record(BatchState::Gathering, &[], now + 1)), now));
    assert!(!ledger_keeps(Some(&record(BatchState::Gathering, &[], now)), now));
    assert!(!ledger_keeps(Some(&record(ended("completed"), &[], u64::MAX)), now));
    let abandoned = BatchState::Abandoned { reason: "x".into() };
    assert!(!ledger_keeps(Some(&record(abandoned, &[], u64::MAX)), now));
    assert!(!ledger_keeps(None, now));
}

/// A reservation fits under the limit or waits; stale entries are dropped (and written)
/// even when it does not fit.
#[test]
fn reservations_in_the_queue_ledger() {
    let mut l = QueueLedger::default();
    l.records.insert("a".into(), 600);
    assert_eq!(reserve(&mut l, &[], "b", 400, 1_000), Some(true));
    assert_eq!(l.total(), 1_000);
    assert_eq!(reserve(&mut l, &[], "c", 1, 1_000), None, "no room, nothing to write");
    assert!(!l.records.contains_key("c"));
    assert_eq!(reserve(&mut l, &["a".into()], "c", 700, 1_000), Some(false));
    assert_eq!(l.records.keys().collect::<Vec<_>>(), vec!["b"]);
    assert_eq!(reserve(&mut l, &["b".into()], "c", 700, 1_000), Some(true));
    assert_eq!(l.total(), 700);
}

// --- Gather -------------------------------------------------------------------------------

fn gather(lease_until_ms: u64) -> Gather {
    Gather::new(record(BatchState::Gathering, &[], lease_until_ms), 5, limits())
}

/// Full by count or by tokens; a full record is sealed.
#[test]
fn gather_fills_and_seals() {
    let mut g = gather(u64::MAX);
    assert!(!g.full_for(1_000));
    assert!(g.full_for(1_001), "over batch_queue_tokens");
    g.joined(job(1), 500);
    g.joined(job(2), 100);
    assert!(!g.full_for(400) && g.full_for(401));
    g.joined(job(3), 1);
    assert!(g.full_for(0), "batch_size");
    assert_eq!(g.jobs(), &[job(1), job(2), job(3)]);
    assert_eq!(g.record.tokens, 601);
    assert_eq!(g.step(GatherEvent::Full), GatherCommand::Seal);
    assert_eq!(g.phase(), &GatherPhase::Sealed);
}

/// A tick seals a record that is full or waited `batch_wait`; otherwise it renews the
/// lease when a third of it is gone, or does nothing.
#[test]
fn gather_ticks() {
    let now = 1_000_000;
    let tick = |waited| GatherEvent::Tick { waited: Duration::from_secs(waited), now_ms: now };
    let mut g = gather(now + 120_000);
    assert_eq!(g.step(tick(59)), GatherCommand::Nothing);
    assert_eq!(g.record.lease_until_ms, now + 120_000);
    let mut g = gather(now + 80_000);
    assert_eq!(g.step(tick(59)), GatherCommand::Renew);
    assert_eq!(g.record.lease_until_ms, now + 120_000, "a fresh lease is written");
    assert_eq!(
        g.step(GatherEvent::Wrote { written: Some(true), revision: 6 }),
        GatherCommand::Nothing
    );
    assert_eq!((g.revision, g.phase()), (6, &GatherPhase::Gathering));
    assert_eq!(g.step(tick(60)), GatherCommand::Seal);
    let mut g = gather(u64::MAX);
    for n in 1..=3 {
        g.joined(job(n), 1);
    }
    assert_eq!(g.step(tick(0)), GatherCommand::Seal, "full");
}

/// A renewal refused: the record was fenced off by a worker that took one of its jobs.
/// Gathering, it is dropped; sealed, its tokens are freed too. A broker that cannot tell
/// keeps it.
#[test]
fn gather_lease_lost() {
    let now = 1_000_000;
    let mut g = gather(now);
    g.step(GatherEvent::Tick { waited: Duration::ZERO, now_ms: now });
    assert_eq!(g.step(GatherEvent::Wrote { written: None, revision: 0 }), GatherCommand::Nothing);
    assert_eq!((g.revision, g.phase()), (5, &GatherPhase::Gathering));
    g.step(GatherEvent::Tick { waited: Duration::ZERO, now_ms: now + 200_000 });
    assert_eq!(
        g.step(GatherEvent::Wrote { written: Some(false), revision: 0 }),
        GatherCommand::Drop
    );
    assert_eq!(g.phase(), &GatherPhase::Dropped);
    // Dropped is final: a late tick does nothing.
    assert_eq!(
        g.step(GatherEvent::Tick { waited: Duration::from_secs(999), now_ms: now }),
        GatherCommand::Nothing
    );

    let mut g = gather(now);
    g.step(GatherEvent::Full);
    assert_eq!(g.step(GatherEvent::RenewTick { now_ms: now }), GatherCommand::Renew);
    assert_eq!(
        g.step(GatherEvent::Wrote { written: Some(false), revision: 0 }),
        GatherCommand::Release
    );
    assert_eq!(g.phase(), &GatherPhase::Dropped);
}

/// Sealed: empty, it is given up; otherwise its tokens are reserved, then its job list is
/// recorded (`uploading`, a fresh lease) and it is handed to its owner.
#[test]
fn gather_submits_in_order() {
    let mut g = gather(0);
    g.step(GatherEvent::Full);
    assert_eq!(g.step(GatherEvent::Submit), GatherCommand::GiveUp);
    assert_eq!(g.record.state, BatchState::Abandoned { reason: "no job joined it".into() });
    assert_eq!(
        g.step(GatherEvent::Wrote { written: Some(true), revision: 9 }),
        GatherCommand::Nothing
    );
    assert_eq!(g.phase(), &GatherPhase::GivenUp);

    let mut g = gather(0);
    g.joined(job(1), 10);
    g.joined(job(2), 20);
    g.step(GatherEvent::Full);
    assert_eq!(g.step(GatherEvent::Submit), GatherCommand::Reserve);
    // No room yet, or the ledger cannot be read: held (sealed), tried again later.
    assert_eq!(g.step(GatherEvent::Reserved { room: Some(false), now_ms: 1 }), GatherCommand::Hold);
    assert_eq!(g.phase(), &GatherPhase::Sealed);
    g.step(GatherEvent::Submit);
    assert_eq!(g.step(GatherEvent::Reserved { room: None, now_ms: 1 }), GatherCommand::Hold);
    assert_eq!(g.record.state, BatchState::Gathering);
    g.step(GatherEvent::Submit);
    let now = 7_000;
    assert_eq!(
        g.step(GatherEvent::Reserved { room: Some(true), now_ms: now }),
        GatherCommand::Record
    );
    assert_eq!(g.record.state, BatchState::Uploading);
    assert_eq!(g.record.jobs, vec![job(1).to_string(), job(2).to_string()]);
    assert_eq!((g.record.tokens, g.record.lease_until_ms), (30, now + 120_000));
    assert_eq!(g.step(GatherEvent::Wrote { written: Some(true), revision: 8 }), GatherCommand::Own);
    assert_eq!((g.revision, g.phase()), (8, &GatherPhase::Owned));
    // Owned is final for the gatherer: a stop does not give it up.
    assert_eq!(g.step(GatherEvent::Stop), GatherCommand::Nothing);
}

/// The job list cannot be recorded (fenced off, or the broker failed): its tokens are
/// freed and it is dropped.
#[test]
fn gather_record_refused() {
    for written in [Some(false), None] {
        let mut g = gather(0);
        g.joined(job(1), 10);
        g.step(GatherEvent::Full);
        g.step(GatherEvent::Submit);
        g.step(GatherEvent::Reserved { room: Some(true), now_ms: 1 });
        assert_eq!(g.step(GatherEvent::Wrote { written, revision: 0 }), GatherCommand::Release);
        assert_eq!(g.phase(), &GatherPhase::Dropped);
    }
}

/// The worker stopping gives up what it gathers or holds sealed; events out of order do
/// nothing.
#[test]
fn gather_stop_and_events_out_of_order() {
    for sealed in [false, true] {
        let mut g = gather(0);
        g.joined(job(1), 1);
        if sealed {
            g.step(GatherEvent::Full);
        }
        assert_eq!(g.step(GatherEvent::Stop), GatherCommand::GiveUp);
        assert_eq!(
            g.record.state,
            BatchState::Abandoned { reason: "its worker stopped before submitting it".into() }
        );
        assert_eq!(
            g.step(GatherEvent::Wrote { written: None, revision: 0 }),
            GatherCommand::Nothing
        );
        assert_eq!(g.phase(), &GatherPhase::GivenUp);
    }
    let mut g = gather(u64::MAX);
    assert_eq!(g.step(GatherEvent::Submit), GatherCommand::Nothing);
    assert_eq!(
        g.step(GatherEvent::Reserved { room: Some(true), now_ms: 0 }),
        GatherCommand::Nothing
    );
    assert_eq!(g.step(GatherEvent::RenewTick { now_ms: 0 }), GatherCommand::Nothing);
    assert_eq!(g.phase(), &GatherPhase::Gathering);
    assert_eq!(g.record.state, BatchState::Gathering);
}

// --- Owner --------------------------------------------------------------------------------

fn owner(state: BatchState, adopted: bool) -> Owner {
    Owner::new(record(state, &[job(1)], 0), 3, adopted, POLL)
}

fn polled(status: &str, ended: bool) -> OwnerEvent {
    OwnerEvent::Polled(Polled {
        id: "batch_1".into(),
        status: status.into(),
        output: ended.then(|| "out".into()),
        error: None,
        reason: None,
        ended,
    })
}

/// The normal life: every state written before the next provider step, tokens freed at
/// the end.
#[test]
fn owner_uploads_creates_polls_and_ends() {
    use OwnerCommand as C;
    use OwnerEvent as E;
    let mut o = owner(BatchState::Uploading, false);
    assert_eq!(o.next(), C::Upload);
    let uploaded = BatchState::Uploaded { file: "file-1".into() };
    assert_eq!(o.step(E::Uploaded { file: "file-1".into() }, 1), C::Write(uploaded.clone()));
    assert_eq!(o.step(E::Written, 2), C::Next);
    assert_eq!(o.record.state, uploaded);
    assert_eq!(o.next(), C::Create { file: "file-1".into() });
    assert_eq!(o.step(E::Created { batch: "batch_1".into() }, 3), C::Write(submitted()));
    assert_eq!(o.record.submitted_ms, Some(3));
    assert_eq!(o.step(E::Written, 4), C::Next);
    assert_eq!(o.next(), C::Poll { batch: "batch_1".into() });
    assert_eq!(o.step(polled("in_progress", false), 5), C::Wait(POLL));
    assert_eq!(o.step(E::Waited, 6), C::Next);
    assert_eq!(o.record.state, submitted(), "a running batch writes nothing");
    assert_eq!(o.next(), C::Poll { batch: "batch_1".into() });
    assert_eq!(o.step(polled("completed", true), 7), C::Write(ended("completed")));
    assert_eq!((o.record.ended_ms, o.polled()), (Some(7), 2));
    assert_eq!(o.step(E::Written, 8), C::Release);
    assert!(!o.is_done());
    assert_eq!(o.step(E::Released, 9), C::Done);
    assert!(o.is_done());
    assert_eq!(o.step(E::Written, 10), C::Done, "done stays done");
}

/// Expired, cancelled and failed batches end like completed ones: recorded with their
/// status (each job then takes what its line says), tokens freed.
#[test]
fn owner_records_every_final_status() {
    for status in ["expired", "cancelled", "failed"] {
        let mut o = owner(submitted(), true);
        o.next();
        let mut p = polled(status, true);
        if let OwnerEvent::Polled(p) = &mut p {
            p.reason = Some("why".into());
        }
        match o.step(p, 1) {
            OwnerCommand::Write(BatchState::Ended { status: s, reason, .. }) => {
                assert_eq!((s.as_str(), reason.as_deref()), (status, Some("why")))
            }
            other => panic!("{status}: {other:?}"),
        }
        assert_eq!(o.step(OwnerEvent::Written, 2), OwnerCommand::Release);
    }
}

/// The lease lost (a write or a renewal refused: another worker took the record over) or
/// the hard stop, at any step: the owner stops at once, writing and freeing nothing.
#[test]
fn owner_stops_when_the_record_is_lost() {
    use OwnerCommand as C;
    use OwnerEvent as E;
    // Mid-upload.
    let mut o = owner(BatchState::Uploading, false);
    o.next();
    assert_eq!(o.step(E::Lost, 1), C::Done);
    assert_eq!(o.record.state, BatchState::Uploading);
    // The write after the upload refused.
    let mut o = owner(BatchState::Uploading, false);
    o.next();
    o.step(E::Uploaded { file: "f".into() }, 1);
    assert_eq!(o.step(E::Lost, 2), C::Done);
    assert_eq!(o.record.state, BatchState::Uploading, "not written");
    // While waiting, finding, creating, polling; and the final write refused: no release.
    let mut o = owner(submitted(), false);
    o.next();
    o.step(polled("in_progress", false), 1);
    assert_eq!(o.step(E::Lost, 2), C::Done);
    for state in [BatchState::Uploaded { file: "f".into() }, submitted()] {
        for adopted in [false, true] {
            let mut o = owner(state.clone(), adopted);
            o.next();
            assert_eq!(o.step(E::Lost, 1), C::Done, "{state:?} adopted {adopted}");
        }
    }
    let mut o = owner(submitted(), false);
    o.next();
    o.step(polled("completed", true), 1);
    assert_eq!(o.step(E::Lost, 2), C::Done);
    assert!(o.is_done());
}

/// A request that fails for good before the provider has a batch (upload, create): the
/// record ends `failed` with the reason, its tokens freed.
#[test]
fn owner_upload_or_create_failed() {
    use OwnerCommand as C;
    use OwnerEvent as E;
    let mut o = owner(BatchState::Uploading, false);
    o.next();
    assert_eq!(
        o.step(E::Failed(CallError::permanent("too large")), 1),
        C::Write(failed_state("", &CallError::permanent("too large")))
    );
    assert_eq!(o.step(E::Written, 2), C::Release);
    let mut o = owner(BatchState::Uploaded { file: "f".into() }, false);
    assert_eq!(o.next(), C::Create { file: "f".into() });
    assert_eq!(
        o.step(E::Failed(CallError::permanent("bad")), 1),
        C::Write(failed_state("", &CallError::permanent("bad")))
    );
    assert_eq!(o.step(E::Written, 2), C::Release);
    assert_eq!(o.step(E::Released, 3), C::Done);
}

/// A poll that fails keeps the batch (slow polling) until it has been unseen for two
/// days past its submission; then it ends `failed` naming the batch.
#[test]
fn owner_poll_failures() {
    use OwnerCommand as C;
    let mut o = owner(submitted(), false);
    o.record.submitted_ms = Some(1_000);
    o.next();
    let e = CallError::permanent("HTTP 403");
    assert_eq!(o.step(OwnerEvent::Failed(e.clone()), 2_000), C::Wait(POLL * 10));
    assert_eq!(o.record.state, submitted());
    o.step(OwnerEvent::Waited, 2_001);
    o.next();
    let unseen = 1_000 + GIVE_UP_UNSEEN.as_millis() as u64;
    assert_eq!(o.step(OwnerEvent::Failed(e.clone()), unseen - 1), C::Wait(POLL * 10));
    o.step(OwnerEvent::Waited, unseen);
    o.next();
    assert_eq!(
        o.step(OwnerEvent::Failed(e.clone()), unseen),
        C::Write(failed_state("batch_1", &e))
    );
    assert_eq!(o.record.ended_ms, Some(unseen));
    // Slow polling is capped at ten minutes; the age counts from creation when the
    // submission time is unknown.
    let mut o = Owner::new(record(submitted(), &[], 0), 1, true, Duration::from_secs(120));
    o.next();
    let created = o.record.created_ms;
    assert_eq!(
        o.step(OwnerEvent::Failed(e.clone()), created + 1),
        C::Wait(Duration::from_secs(600))
    );
    o.step(OwnerEvent::Waited, 0);
    o.next();
    let old = created + GIVE_UP_UNSEEN.as_millis() as u64;
    assert!(matches!(o.step(OwnerEvent::Failed(e), old), C::Write(BatchState::Ended { .. })));
}

/// Restart: a taker finds each persisted state and goes on from it. Uploading is given
/// up (its file died with its owner); uploaded is looked up at the provider before any
/// create; submitted is polled on; ended, given up and gathering are not its to drive.
#[test]
fn owner_takes_over_each_persisted_state() {
    use OwnerCommand as C;
    use OwnerEvent as E;
    let mut o = owner(BatchState::Uploading, true);
    let abandoned =
        BatchState::Abandoned { reason: "its owner stopped while uploading its file".into() };
    assert_eq!(o.next(), C::Write(abandoned.clone()));
    assert_eq!(o.step(E::Written, 1), C::Release);
    assert_eq!(o.record.state, abandoned);
    assert_eq!(o.step(E::Released, 2), C::Done);

    // Uploaded: found (created by the dead owner) → submitted without a create.
    let mut o = owner(BatchState::Uploaded { file: "file-1".into() }, true);
    let since_s = 10_000 - 3600;
    assert_eq!(o.next(), C::Find { since_s });
    assert_eq!(o.step(E::Found(Some("batch_1".into())), 5), C::Write(submitted()));
    assert_eq!(o.record.submitted_ms, Some(5));
    // Not found → create; the provider's list unreadable → wait and ask again, never
    // create blindly.
    let mut o = owner(BatchState::Uploaded { file: "file-1".into() }, true);
    o.next();
    assert_eq!(o.step(E::Failed(CallError::permanent("404")), 1), C::Wait(FIND_RETRY));
    assert_eq!(o.step(E::Waited, 2), C::Next);
    assert_eq!(o.next(), C::Find { since_s });
    assert_eq!(o.step(E::Found(None), 3), C::Create { file: "file-1".into() });
    assert_eq!(o.step(E::Created { batch: "batch_1".into() }, 4), C::Write(submitted()));

    let mut o = owner(submitted(), true);
    assert_eq!(o.next(), C::Poll { batch: "batch_1".into() });
    for state in
        [BatchState::Gathering, ended("completed"), BatchState::Abandoned { reason: "x".into() }]
    {
        let mut o = owner(state.clone(), true);
        assert_eq!(o.next(), C::Done, "{state:?}");
        assert!(o.is_done());
    }
}

/// An event the owner does not await changes nothing: the awaited command is asked for
/// again.
#[test]
fn owner_ignores_events_out_of_order() {
    use OwnerCommand as C;
    use OwnerEvent as E;
    let mut o = owner(BatchState::Uploading, false);
    assert_eq!(o.next(), C::Upload);
    assert_eq!(o.step(E::Created { batch: "b".into() }, 1), C::Upload);
    assert_eq!(o.step(E::Written, 1), C::Upload);
    assert_eq!(o.step(polled("completed", true), 1), C::Upload);
    assert_eq!(o.record.state, BatchState::Uploading);
    assert_eq!(o.record.submitted_ms, None);
    let mut o = owner(submitted(), false);
    o.next();
    o.step(polled("completed", true), 1);
    assert_eq!(o.step(E::Waited, 2), C::Write(ended("completed")));
    assert_eq!(o.step(E::Written, 3), C::Release);
    assert_eq!(o.step(E::Written, 4), C::Release);
    // Before the first step, an event asks for the first step.
    let mut o = owner(submitted(), false);
    assert_eq!(o.step(E::Waited, 1), C::Next);
    assert_eq!(o.record.state, submitted());
}

/// Issue 52: a taker of an Anthropic record (requests sent inline with the create, gone
/// with their owner) adopts the batch it finds, and otherwise gives the record up (its
/// jobs gathered again) instead of creating anything: not found, or no single match. A
/// list it cannot read now is asked again, as for OpenAI.
#[test]
fn inline_taker_adopts_or_gives_up_never_creates() {
    use OwnerCommand as C;
    use OwnerEvent as E;
    let uploaded = BatchState::Uploaded { file: "inline-9000000".into() };
    let inline = |state: BatchState| owner(state, true).inline(true);
    let mut o = inline(uploaded.clone());
    assert!(matches!(o.next(), C::Find { .. }));
    let want = BatchState::Submitted { file: "inline-9000000".into(), batch: "msgbatch_1".into() };
    assert_eq!(o.step(E::Found(Some("msgbatch_1".into())), 5), C::Write(want));

    let mut o = inline(uploaded.clone());
    o.next();
    let C::Write(BatchState::Abandoned { reason }) = o.step(E::Found(None), 5) else {
        panic!("not found: the record is to be given up")
    };
    assert!(reason.contains("before the provider had its batch"), "{reason}");
    assert_eq!(o.step(E::Written, 6), C::Release);

    let mut o = inline(uploaded.clone());
    o.next();
    let two = CallError::permanent("2 batches (a, b) match");
    let C::Write(BatchState::Abandoned { reason }) = o.step(E::Failed(two), 5) else {
        panic!("ambiguous: the record is to be given up")
    };
    assert!(reason.contains("cannot tell which batch is its: 2 batches"), "{reason}");

    let mut o = inline(uploaded);
    o.next();
    assert_eq!(o.step(E::Failed(CallError::transient("529")), 5), C::Wait(FIND_RETRY));
}

/// Issue 52: an Anthropic batch ends `ended` whatever became of its requests: an
/// `expired` result is not run (budget kept), a `canceled` one goes into another batch
/// with the delivery counted, an `errored` one by its class.
#[test]
fn anthropic_results_of_an_ended_batch() {
    let expired = Answer::NotRun("expired".into());
    assert_eq!(outcome(&answer_of("m", "ended", None, Some(&expired))), "not run: expired");
    let canceled = Answer::Canceled("canceled".into());
    let t = answer_of("m", "ended", None, Some(&canceled));
    assert_eq!((outcome(&t), t.release_claim), ("failed Transient 0: canceled".into(), true));
    let overloaded = Answer::Failed(CallError::transient("overloaded_error"));
    assert_eq!(
        outcome(&answer_of("m", "ended", None, Some(&overloaded))),
        "failed Transient 1: overloaded_error"
    );
}

/// A create whose connection broke after it was sent may have made the batch: the owner
/// looks for it (found: polled; not found: created again, the requests still in hand),
/// and a wait while it cannot look leads back to looking, never to a blind create. For
/// both providers (inline or not).
#[test]
fn an_unsure_create_looks_before_creating_again() {
    use OwnerCommand as C;
    use OwnerEvent as E;
    let file = "inline-9000000".to_string();
    let uploaded = BatchState::Uploaded { file: file.clone() };
    for inline in [false, true] {
        let mut o = owner(uploaded.clone(), false).inline(inline);
        assert_eq!(o.next(), C::Create { file: file.clone() });
        assert!(matches!(o.step(E::CreateUnsure, 5), C::Find { .. }), "inline {inline}");
        // Cannot look now: wait, then look again.
        assert_eq!(o.step(E::Failed(CallError::transient("529")), 6), C::Wait(FIND_RETRY));
        assert_eq!(o.step(E::Waited, 7), C::Next);
        assert!(matches!(o.next(), C::Find { .. }), "after the wait, inline {inline}");
        // Not there: the create never arrived; this owner holds the requests.
        assert_eq!(o.step(E::Found(None), 8), C::Create { file: file.clone() });
        let want = BatchState::Submitted { file: file.clone(), batch: "b1".into() };
        assert_eq!(o.step(E::Created { batch: "b1".into() }, 9), C::Write(want));

        let mut o = owner(uploaded.clone(), false).inline(inline);
        o.next();
        o.step(E::CreateUnsure, 5);
        let want = BatchState::Submitted { file: file.clone(), batch: "b2".into() };
        assert_eq!(o.step(E::Found(Some("b2".into())), 6), C::Write(want), "inline {inline}");
    }
}

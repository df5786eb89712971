//! The life of a provider batch inside a worker, as pure state machines.
//!
//! No IO, no tokio, no broker: each machine takes an event (what the broker or the
//! provider answered, a tick of the clock) and returns the command the IO layer in
//! [`super`] must carry out next; the IO layer reports the command's outcome back as the
//! next event. The IO layer keeps only what cannot be pure: the request lines, the
//! broker and provider calls (with their retries), the channels to waiting job tasks.
//!
//! Three actors take part, each with its machine:
//!
//! - [`Join`]: a job task *claims* its job (`j.<pool>.<job>`, compare-and-set): it waits
//!   for a record that already holds it, fences off a gathering record whose lease
//!   lapsed, or takes the claim into this worker's gathering record. Then [`settle`]
//!   says what each state of the record it waits for means for it, and [`answer_of`] /
//!   [`download_failed`] turn the ended batch's output into the job's [`BatchOutcome`].
//! - [`Gather`]: a record this worker *gathers* (in memory, state `gathering` in the
//!   bucket): jobs join until it is full or has waited `batch_wait`; *sealed*, it waits for
//!   room in `batch_queue_tokens`, then its job list is recorded (`uploading`) and it is
//!   handed to its owner. Its lease is renewed on the tender's ticks; a renewal refused
//!   (fenced off by a worker that took one of its jobs) drops it; the worker stopping
//!   gives it up.
//! - [`Owner`]: a record this worker *owns* (`uploading` → `uploaded` → `submitted` →
//!   `ended`), gathered here or taken over from a dead owner ([`adopts`]): every state is
//!   written before the next provider step; a write refused (another worker took the
//!   record over) or the worker's hard stop ends its part.
//!
//! ```text
//!  Join:   ReadClaim ─claim→ ReadRecord ─holds→ Wait(record)
//!                                        ─gathering, lease lapsed→ Fence ─won→ Take
//!                                        ─other / gone / unreadable→ Take
//!          Take ─won→ Wait(own gathering record)   (lost, or fence lost: ReadClaim, 20×)
//!  Gather: Gathering ─Tick(due)→ Sealed ─Submit→ Reserving ─Room→ Recording ─Written→ Owned
//!          Gathering ─Tick(lease due)→ Renew ─Fenced→ Dropped
//!          Sealed ─Submit(empty)→ GiveUp;  Reserving ─NoRoom/Unknown→ Sealed (held, in order)
//!          Recording ─Fenced/Unknown→ Release → Dropped;   Gathering|Sealed ─Stop→ GiveUp
//!  Owner:  uploading ─Upload→ uploaded ─Create→ submitted ─Poll(final)→ ended → Release
//!          adopted: uploading → abandoned; uploaded ─Find→ submitted (found) | Create
//!                   (inline requests: not found, or no single match → abandoned)
//!          Create unsure (the connection failed after the request may have reached the
//!          provider) → Find → submitted (found) | Create (not found: it never arrived)
//!          Upload/Create failed → ended(failed); Poll failed → Wait, after 48 h ended(failed)
//!          any write or provider step Lost (fenced, hard stop) → Done
//! ```

use std::time::Duration;

use halyard_proto::provider_batch::{BatchRecord, BatchState, QueueLedger};
use halyard_proto::{Completion, JobId};

use super::output::Answer;
use crate::backend::{CallError, ErrorClass};

/// How a job's turn in a provider batch ended.
#[derive(Debug)]
pub(crate) enum BatchOutcome {
    Done(Completion),
    /// The request ran and failed, or the batch failed as a whole (`calls`: 1 if the
    /// provider ran the request).
    Failed(CallError, u32),
    /// Not answered and not the job's fault (expired, given up before the provider had
    /// it, the broker unreachable): back to the queue, budget kept.
    NotRun(String),
    /// The worker stops; the batch goes on and a later delivery takes its answer.
    Abandoned,
}

/// A pool's batch settings as the machines use them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub batch_size: usize,
    pub batch_wait: Duration,
    pub queue_tokens: Option<u64>,
    /// How long a record stays its owner's without a renewal.
    pub lease: Duration,
}

impl Limits {
    fn lease_ms(&self) -> u64 {
        self.lease.as_millis() as u64
    }
}

/// How long an owner waits before it asks again for a batch it may have created, when
/// the provider's list cannot be read.
pub(crate) const FIND_RETRY: Duration = Duration::from_secs(60);

/// A submitted batch the provider has refused to show for this long after its submission
/// is given up (the provider's window is 24 hours).
pub(crate) const GIVE_UP_UNSEEN: Duration = Duration::from_secs(48 * 3600);

/// A submitted batch holds its tokens in the queue ledger for at most this long after its
/// submission, taken over or not (by then the provider has ended it, expired at worst).
pub(crate) const LEDGER_HOLD: Duration = Duration::from_secs(26 * 3600);

/// An uploading record whose lease lapsed this long ago holds no tokens any more (an
/// upload request is given up after 5 minutes).
pub(crate) const UPLOAD_GRACE: Duration = Duration::from_secs(600);

/// How many times a job task reads its claim again when it keeps changing under it.
pub(crate) const JOIN_ATTEMPTS: u32 = 20;

/// Backoff of provider requests that failed for the endpoint's reasons: 1 s doubling to
/// a minute.
pub(crate) fn backoff(attempt: u32) -> Duration {
    Duration::from_secs(1u64 << attempt.min(6)).min(Duration::from_secs(60))
}

/// An owned record's lease wants renewing: a third of it is gone.
pub(crate) fn lease_due(lease_until_ms: u64, now_ms: u64, lease: Duration) -> bool {
    let lease = lease.as_millis() as u64;
    lease_until_ms <= now_ms + lease * 2 / 3
}

/// The state of a batch that failed as a whole (`batch` empty: before the provider had it).
pub(crate) fn failed_state(batch: &str, e: &CallError) -> BatchState {
    BatchState::Ended {
        batch: batch.to_string(),
        status: "failed".into(),
        output: None,
        error: None,
        reason: Some(e.message.clone()),
    }
}

// ---------------------------------------------------------------------------------------
// The job's side: claim, wait, answer.

/// A request of about `tokens` that can never be enqueued under `queue_tokens`: a
/// permanent failure (a dead letter at once).
pub(crate) fn never_fits(tokens: u64, queue_tokens: Option<u64>) -> Option<CallError> {
    let limit = queue_tokens.filter(|l| tokens > *l)?;
    Some(CallError::permanent(format!(
        "the request needs about {tokens} tokens, more than the pool's batch_queue_tokens ({limit}): it can never be enqueued"
    )))
}

/// A record a job may wait for: live and holding it (or gathering under a live lease),
/// or ended holding it.
pub(crate) fn holds_for(r: &BatchRecord, job: &JobId, now: u64) -> bool {
    match r.state {
        BatchState::Gathering => !r.lease_lapsed(now),
        BatchState::Abandoned { .. } => false,
        _ => r.holds(job),
    }
}

/// Whether record `r` (named by `job`'s claim) holds `job` at the provider or in its
/// output: a gathering or given-up record does not.
pub(crate) fn holds_at_provider(r: &BatchRecord, job: &JobId) -> bool {
    match r.state {
        BatchState::Gathering | BatchState::Abandoned { .. } => false,
        _ => r.holds(job),
    }
}

/// A job's claim, from reading it to the record the job waits for.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Join {
    job: JobId,
    attempts: u32,
    /// The revision of the claim as last read (0: no such key).
    claim_revision: u64,
}

/// What the broker answered a [`Join`].
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum JoinEvent {
    /// The job's claim: the record it names, if any, and the key's revision.
    Claim { record: Option<String>, revision: u64 },
    /// The record the claim names, at `revision`, read at `now_ms`.
    Record { record: Box<BatchRecord>, revision: u64, now_ms: u64 },
    /// The claim names a record that is gone (expired, never written).
    NoRecord,
    /// Someone else's bytes under the record's key: the claim is taken over.
    Unreadable,
    /// The gathering record was given up by compare-and-set (`won`), or it changed
    /// meanwhile.
    Fenced { won: bool },
    /// The claim was written naming this worker's gathering record `Some(id)`, or
    /// another worker came first (None).
    Took(Option<String>),
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum JoinCommand {
    ReadClaim,
    ReadRecord(String),
    /// Give up `record` (a gathering one whose lease lapsed) by compare-and-set at
    /// `revision`, so that its owner, alive after all, can neither renew nor submit it.
    Fence {
        record: Box<BatchRecord>,
        revision: u64,
    },
    /// Write the claim (at this revision) naming this worker's gathering record.
    Take {
        claim_revision: u64,
    },
    /// Wait for this record (it holds the job, or gathers it).
    Wait(String),
    /// The claim kept changing.
    GiveUp,
}

impl Join {
    pub fn new(job: JobId) -> (Join, JoinCommand) {
        (Join { job, attempts: 0, claim_revision: 0 }, JoinCommand::ReadClaim)
    }

    pub fn step(&mut self, event: JoinEvent) -> JoinCommand {
        use JoinCommand as C;
        use JoinEvent as E;
        match event {
            E::Claim { record: Some(id), revision } => {
                self.claim_revision = revision;
                C::ReadRecord(id)
            }
            E::Claim { record: None, revision } => {
                self.claim_revision = revision;
                C::Take { claim_revision: revision }
            }
            E::Record { record, now_ms, .. } if holds_for(&record, &self.job, now_ms) => {
                C::Wait(record.id)
            }
            E::Record { mut record, revision, .. } if record.state == BatchState::Gathering => {
                record.state =
                    BatchState::Abandoned { reason: "its gatherer's lease lapsed".into() };
                C::Fence { record, revision }
            }
            E::Record { .. } | E::NoRecord | E::Unreadable | E::Fenced { won: true } => {
                C::Take { claim_revision: self.claim_revision }
            }
            E::Took(Some(id)) => C::Wait(id),
            E::Fenced { won: false } | E::Took(None) => self.again(),
        }
    }

    /// It changed meanwhile: look again, a bounded number of times.
    fn again(&mut self) -> JoinCommand {
        self.attempts += 1;
        if self.attempts >= JOIN_ATTEMPTS {
            JoinCommand::GiveUp
        } else {
            JoinCommand::ReadClaim
        }
    }
}

/// What the record a job waits for means for it now.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Settle {
    /// Still to be waited for.
    Wait,
    /// Ended holding the job: take its answer from the output.
    Answer,
    /// Not answered by this record: back to the queue, budget kept.
    NotRun(String),
}

/// What record `record` (holding the job: `holds`) means for a waiting job at `now_ms`.
pub(crate) fn settle(record: &BatchRecord, holds: bool, now_ms: u64) -> Settle {
    match &record.state {
        BatchState::Ended { .. } if holds => Settle::Answer,
        BatchState::Gathering if !record.lease_lapsed(now_ms) => Settle::Wait,
        BatchState::Abandoned { reason } => {
            Settle::NotRun(format!("batch {} was given up: {reason}", record.id))
        }
        BatchState::Uploading | BatchState::Uploaded { .. } | BatchState::Submitted { .. }
            if holds =>
        {
            Settle::Wait
        }
        _ => Settle::NotRun(format!(
            "batch {} went on without the job (its gatherer stopped)",
            record.id
        )),
    }
}

/// A job's outcome from an ended batch, and whether its claim is freed (so that its next
/// delivery gathers it into another batch).
#[derive(Debug)]
pub(crate) struct Taken {
    pub outcome: BatchOutcome,
    pub release_claim: bool,
}

/// Job's answer (`answer`, None when the output has none for it) in ended batch `batch`
/// of provider status `status`.
pub(crate) fn answer_of(
    batch: &str,
    status: &str,
    reason: Option<&str>,
    answer: Option<&Answer>,
) -> Taken {
    // Only a batch that ran out of time (or was cancelled) leaves requests unrun
    // through no fault of theirs; a request missing from a completed batch, or
    // unreadable there, is retried as a failure that counts. An Anthropic batch ends
    // `ended` whatever became of its requests: a result `expired` is not run.
    let not_run = matches!(status, "expired" | "cancelled");
    let expired_result = not_run || status == "ended";
    let outcome = match answer {
        // The claim stays: a redelivery finds the ended record and this answer again.
        Some(Answer::Done(c)) => {
            return Taken { outcome: BatchOutcome::Done(c.clone()), release_claim: false }
        }
        Some(Answer::Failed(e)) if e.class == ErrorClass::RateLimited => {
            BatchOutcome::NotRun(e.message.clone())
        }
        Some(Answer::Failed(e)) => BatchOutcome::Failed(e.clone(), 1),
        Some(Answer::NotRun(why)) if expired_result => BatchOutcome::NotRun(why.clone()),
        Some(Answer::Canceled(why)) => BatchOutcome::Failed(CallError::transient(why.clone()), 0),
        Some(Answer::NotRun(why)) => BatchOutcome::Failed(CallError::transient(why.clone()), 0),
        None if status == "failed" => BatchOutcome::Failed(
            CallError::transient(format!(
                "provider batch {} failed: {}",
                if batch.is_empty() { "(not created)" } else { batch },
                reason.unwrap_or("no reason given")
            )),
            0,
        ),
        None if not_run => BatchOutcome::NotRun(format!(
            "batch {batch} ended {status} without running the request"
        )),
        None => BatchOutcome::Failed(
            CallError::transient(format!(
                "batch {batch} ended {status} without an answer for the request"
            )),
            1,
        ),
    };
    Taken { outcome, release_claim: true }
}

/// A job's outcome when the answers of ended batch `batch` cannot be downloaded.
pub(crate) fn download_failed(batch: &str, e: &CallError) -> Taken {
    // Asking again will not help (the file is gone, too large, the model is no longer
    // configured): the job goes into another batch, the delivery counted, so that it
    // ends as a dead letter naming this if it keeps happening. (A 401 or 403 is taken
    // for a key or proxy problem that passes.)
    if e.is_permanent() && e.status.is_none_or(|s| s == 404 || s == 410) {
        Taken { outcome: BatchOutcome::Failed(e.clone(), 0), release_claim: true }
    } else {
        Taken {
            outcome: BatchOutcome::NotRun(format!(
                "cannot download the answers of batch {batch}: {}",
                e.message
            )),
            release_claim: false,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Following records: take-overs and the ledger.

/// Whether this worker takes over `record` (read for its waiting job tasks): a record
/// the provider may hold (uploading, uploaded, submitted), not owned here, whose owner's
/// lease lapsed, while the worker is not stopping and serves the record's model.
pub(crate) fn adopts(
    record: &BatchRecord,
    owned_here: bool,
    now_ms: u64,
    stopping: bool,
    serves_model: bool,
) -> bool {
    let adoptable = matches!(
        record.state,
        BatchState::Uploading | BatchState::Uploaded { .. } | BatchState::Submitted { .. }
    );
    !owned_here && adoptable && record.lease_lapsed(now_ms) && !stopping && serves_model
}

/// Whether a followed record read at `revision` is sent to the job tasks waiting for it
/// (`sent`: the revision last sent). Unchanged, it wakes nobody; but a gathering record's
/// meaning changes with time (its lease lapses), so it is always sent. An owned record's
/// states are pushed by its owner as written.
pub(crate) fn push_read(owned_here: bool, sent: u64, revision: u64, state: &BatchState) -> bool {
    !owned_here && (sent != revision || *state == BatchState::Gathering)
}

/// A record read as gone (expired or never written): nothing holds its jobs any more.
pub(crate) fn gone_record(id: &str, pool: &str) -> BatchRecord {
    BatchRecord {
        id: id.to_string(),
        pool: pool.to_string(),
        model: String::new(),
        state: BatchState::Abandoned { reason: "its record is gone".into() },
        jobs: Vec::new(),
        tokens: 0,
        owner: String::new(),
        lease_until_ms: 0,
        created_ms: 0,
        submitted_ms: None,
        ended_ms: None,
    }
}

/// Whether another record's tokens stay in the queue ledger. Dropped only when
/// certainly stale: ended, given up, gone, reserved by a gatherer that died before it
/// recorded its job list, uploading long past its lease, or submitted longer ago than any
/// provider holds a batch. A slow upload keeps its tokens (its owner renews the lease).
pub(crate) fn ledger_keeps(record: Option<&BatchRecord>, now_ms: u64) -> bool {
    record.is_some_and(|r| match r.state {
        BatchState::Uploaded { .. } | BatchState::Submitted { .. } => {
            now_ms < r.submitted_ms.unwrap_or(r.created_ms) + LEDGER_HOLD.as_millis() as u64
        }
        BatchState::Uploading => now_ms < r.lease_until_ms + UPLOAD_GRACE.as_millis() as u64,
        BatchState::Gathering => !r.lease_lapsed(now_ms),
        BatchState::Ended { .. } | BatchState::Abandoned { .. } => false,
    })
}

/// Reserve `tokens` of record `id` in `ledger` (at most `limit` in all), its `stale`
/// entries dropped first: `Some(fits)` when the ledger is to be written (the tokens
/// reserved, or only stale entries dropped), None when there is no room and nothing to
/// write.
pub(crate) fn reserve(
    ledger: &mut QueueLedger,
    stale: &[String],
    id: &str,
    tokens: u64,
    limit: u64,
) -> Option<bool> {
    for s in stale {
        ledger.records.remove(s);
    }
    let fits = ledger.total() + tokens <= limit;
    if fits {
        ledger.records.insert(id.to_string(), tokens);
    } else if stale.is_empty() {
        return None;
    }
    Some(fits)
}

// ---------------------------------------------------------------------------------------
// The gatherer's side.

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum GatherPhase {
    /// Jobs join.
    Gathering,
    /// Full or waited long enough: no job joins; waits for room in the queue.
    Sealed,
    /// Its tokens are being reserved in the queue ledger.
    Reserving,
    /// Its job list is being recorded (`uploading`).
    Recording,
    /// Recorded: its owner takes it on ([`Owner`]).
    Owned,
    /// Being given up (`abandoned`): the worker stops, or no job joined it.
    GivingUp,
    /// Taken over by another worker, or its job list could not be recorded: its jobs are
    /// gathered again by whoever receives them.
    Dropped,
    /// Given up.
    GivenUp,
}

/// A record this worker gathers.
#[derive(Clone, Debug)]
pub(crate) struct Gather {
    pub record: BatchRecord,
    pub revision: u64,
    jobs: Vec<JobId>,
    phase: GatherPhase,
    limits: Limits,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum GatherEvent {
    /// The tender's tick: `waited` since the record was created.
    Tick { waited: Duration, now_ms: u64 },
    /// The tender renews the leases of sealed records.
    RenewTick { now_ms: u64 },
    /// A job of `tokens` more would not fit (see [`Gather::full_for`]).
    Full,
    /// The gatherer turns to this sealed record (oldest first).
    Submit,
    /// The queue ledger's answer: `Some(true)` reserved, `Some(false)` no room yet, None
    /// the broker could not tell.
    Reserved { room: Option<bool>, now_ms: u64 },
    /// A write of the record: `Some(true)` written (at `revision`), `Some(false)` refused
    /// (another worker fenced it off), None the broker could not tell.
    Wrote { written: Option<bool>, revision: u64 },
    /// The worker stops fetching.
    Stop,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum GatherCommand {
    Nothing,
    /// Move to the sealed queue, then submit sealed records in order.
    Seal,
    /// Write the record (its lease renewed) at the revision.
    Renew,
    /// Reserve the record's tokens in the queue ledger.
    Reserve,
    /// Keep it sealed, at the head of the queue: no room yet.
    Hold,
    /// Write the record as `uploading` with its job list.
    Record,
    /// Hand the recorded batch to an [`Owner`] with its input file.
    Own,
    /// Write the record as given up.
    GiveUp,
    /// Free the record's tokens in the ledger, then forget it.
    Release,
    /// Forget it (its jobs are gathered again by whoever receives them).
    Drop,
}

impl Gather {
    pub fn new(record: BatchRecord, revision: u64, limits: Limits) -> Gather {
        Gather { record, revision, jobs: Vec::new(), phase: GatherPhase::Gathering, limits }
    }

    #[cfg(test)]
    pub fn phase(&self) -> &GatherPhase {
        &self.phase
    }

    #[cfg(test)]
    pub fn jobs(&self) -> &[JobId] {
        &self.jobs
    }

    /// Whether it is full for a job of `tokens` more: it is sealed first.
    pub fn full_for(&self, tokens: u64) -> bool {
        self.jobs.len() >= self.limits.batch_size
            || self.limits.queue_tokens.is_some_and(|l| self.record.tokens + tokens > l)
    }

    /// A job's claim now names this record.
    pub fn joined(&mut self, job: JobId, tokens: u64) {
        if self.phase == GatherPhase::Gathering {
            self.jobs.push(job);
            self.record.tokens += tokens;
        }
    }

    fn due(&self, waited: Duration) -> bool {
        self.jobs.len() >= self.limits.batch_size || waited >= self.limits.batch_wait
    }

    fn renew(&mut self, now_ms: u64) -> GatherCommand {
        if !lease_due(self.record.lease_until_ms, now_ms, self.limits.lease) {
            return GatherCommand::Nothing;
        }
        self.record.lease_until_ms = now_ms + self.limits.lease_ms();
        GatherCommand::Renew
    }

    pub fn step(&mut self, event: GatherEvent) -> GatherCommand {
        use GatherCommand as C;
        use GatherEvent as E;
        use GatherPhase as P;
        match (&self.phase, event) {
            (P::Gathering, E::Full) => {
                self.phase = P::Sealed;
                C::Seal
            }
            (P::Gathering, E::Tick { waited, .. }) if self.due(waited) => {
                self.phase = P::Sealed;
                C::Seal
            }
            (P::Gathering, E::Tick { now_ms, .. }) | (P::Sealed, E::RenewTick { now_ms }) => {
                self.renew(now_ms)
            }
            // A renewal: refused, it was fenced off by a worker that took one of its jobs
            // (its lease had lapsed); a broker that cannot tell keeps it.
            (P::Gathering | P::Sealed, E::Wrote { written, revision }) => match written {
                Some(true) => {
                    self.revision = revision;
                    C::Nothing
                }
                None => C::Nothing,
                Some(false) if self.phase == P::Gathering => {
                    self.phase = P::Dropped;
                    C::Drop
                }
                Some(false) => {
                    self.phase = P::Dropped;
                    C::Release
                }
            },
            (P::Sealed, E::Submit) if self.jobs.is_empty() => {
                self.record.state = BatchState::Abandoned { reason: "no job joined it".into() };
                self.phase = P::GivingUp;
                C::GiveUp
            }
            (P::Sealed, E::Submit) => {
                self.phase = P::Reserving;
                C::Reserve
            }
            // The job list is fixed (`uploading`), under a fresh lease.
            (P::Reserving, E::Reserved { room: Some(true), now_ms }) => {
                self.record.state = BatchState::Uploading;
                self.record.jobs = self.jobs.iter().map(|id| id.to_string()).collect();
                self.record.lease_until_ms = now_ms + self.limits.lease_ms();
                self.phase = P::Recording;
                C::Record
            }
            (P::Reserving, E::Reserved { .. }) => {
                self.phase = P::Sealed;
                C::Hold
            }
            (P::Recording, E::Wrote { written: Some(true), revision }) => {
                self.revision = revision;
                self.phase = P::Owned;
                C::Own
            }
            // Taken over before submission, or the job list could not be recorded: its
            // jobs go into another batch when redelivered.
            (P::Recording, E::Wrote { .. }) => {
                self.phase = P::Dropped;
                C::Release
            }
            (P::Gathering | P::Sealed, E::Stop) => {
                self.record.state = BatchState::Abandoned {
                    reason: "its worker stopped before submitting it".into(),
                };
                self.phase = P::GivingUp;
                C::GiveUp
            }
            (P::GivingUp, E::Wrote { .. }) => {
                self.phase = P::GivenUp;
                C::Nothing
            }
            _ => C::Nothing,
        }
    }
}

// ---------------------------------------------------------------------------------------
// The owner's side.

/// A provider batch as polled (the fields the owner reads).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Polled {
    pub id: String,
    pub status: String,
    pub output: Option<String>,
    pub error: Option<String>,
    pub reason: Option<String>,
    /// The provider is done with it: no request of it will run any more.
    pub ended: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum OwnerCommand {
    /// Upload the input file (gathered here).
    Upload,
    /// Ask the provider for a batch tagged with the record's key, created after `since_s`.
    Find {
        since_s: u64,
    },
    /// Create the batch of uploaded `file`, tagged with the record's key.
    Create {
        file: String,
    },
    Poll {
        batch: String,
    },
    /// Wait, renewing the lease.
    Wait(Duration),
    /// Write the record's next state (a fresh lease) at its revision.
    Write(BatchState),
    /// Free the record's tokens in the queue ledger.
    Release,
    /// Go on from the record's state (the IO layer checks the hard stop first).
    Next,
    Done,
}

#[derive(Clone, Debug)]
pub(crate) enum OwnerEvent {
    Uploaded {
        file: String,
    },
    /// The provider's batch tagged with the record, if any.
    Found(Option<String>),
    Created {
        batch: String,
    },
    /// The create failed in a way that does not say whether the provider made the batch
    /// (the connection broke or timed out after the request was sent): looked for
    /// before it is created again.
    CreateUnsure,
    Polled(Polled),
    /// The provider request failed for good (retries of the endpoint's failures are the
    /// IO layer's).
    Failed(CallError),
    Waited,
    Written,
    Released,
    /// The record is no longer this worker's (a write or a renewal refused: another
    /// worker took it over), or the worker stops.
    Lost,
}

/// What the owner awaits.
#[derive(Clone, Debug, PartialEq)]
enum Await {
    Next,
    Upload,
    Find { file: String },
    Create { file: String },
    Poll { file: String, batch: String },
    Wait,
    Write(BatchState),
    Release,
    Done,
}

/// A record this worker owns, driven to its end.
#[derive(Clone, Debug)]
pub(crate) struct Owner {
    pub record: BatchRecord,
    pub revision: u64,
    /// Taken over from a dead owner: the input file is gone, the batch may exist.
    adopted: bool,
    /// The provider takes the requests with the create (Anthropic): a taker that finds
    /// no batch cannot create one (the requests were its previous owner's, in memory).
    inline: bool,
    /// A create of this owner's may have made the batch (see
    /// [`OwnerEvent::CreateUnsure`]): look for it before creating again. The requests
    /// are still in this owner's hands.
    unsure: bool,
    awaits: Await,
    /// The command whose outcome is awaited (repeated on an event out of order).
    last: OwnerCommand,
    polled: u32,
    poll: Duration,
}

impl Owner {
    pub fn new(record: BatchRecord, revision: u64, adopted: bool, poll: Duration) -> Owner {
        Owner {
            record,
            revision,
            adopted,
            inline: false,
            unsure: false,
            awaits: Await::Next,
            last: OwnerCommand::Next,
            polled: 0,
            poll,
        }
    }

    /// The provider takes requests inline with the create (see [`Owner::inline`]).
    pub fn inline(mut self, inline: bool) -> Owner {
        self.inline = inline;
        self
    }

    pub fn polled(&self) -> u32 {
        self.polled
    }

    #[cfg(test)]
    pub fn is_done(&self) -> bool {
        self.awaits == Await::Done
    }

    /// The next step from the record's state (the IO layer checks the hard stop first).
    pub fn next(&mut self) -> OwnerCommand {
        use OwnerCommand as C;
        let (awaits, cmd) = match &self.record.state {
            // Taken over while uploading: the provider has at most an unused file.
            BatchState::Uploading if self.adopted => {
                let state = BatchState::Abandoned {
                    reason: "its owner stopped while uploading its file".into(),
                };
                (Await::Write(state.clone()), C::Write(state))
            }
            BatchState::Uploading => (Await::Upload, C::Upload),
            BatchState::Uploaded { file } if self.adopted || self.unsure => (
                Await::Find { file: file.clone() },
                C::Find { since_s: (self.record.created_ms / 1000).saturating_sub(3600) },
            ),
            BatchState::Uploaded { file } => {
                (Await::Create { file: file.clone() }, C::Create { file: file.clone() })
            }
            BatchState::Submitted { file, batch } => (
                Await::Poll { file: file.clone(), batch: batch.clone() },
                C::Poll { batch: batch.clone() },
            ),
            BatchState::Gathering | BatchState::Ended { .. } | BatchState::Abandoned { .. } => {
                (Await::Done, C::Done)
            }
        };
        self.awaits = awaits;
        self.last = cmd.clone();
        cmd
    }

    /// Apply one event at `now_ms`. An event the owner does not await changes nothing:
    /// the command whose outcome it awaits is returned again.
    pub fn step(&mut self, event: OwnerEvent, now_ms: u64) -> OwnerCommand {
        let cmd = self.transition(event, now_ms);
        self.last = cmd.clone();
        cmd
    }

    fn write(&mut self, state: BatchState) -> (Await, OwnerCommand) {
        (Await::Write(state.clone()), OwnerCommand::Write(state))
    }

    fn submitted(&mut self, file: String, batch: String, now_ms: u64) -> (Await, OwnerCommand) {
        self.record.submitted_ms = Some(now_ms);
        self.write(BatchState::Submitted { file, batch })
    }

    fn transition(&mut self, event: OwnerEvent, now_ms: u64) -> OwnerCommand {
        use Await as A;
        use OwnerCommand as C;
        use OwnerEvent as E;
        let (awaits, cmd) = match (self.awaits.clone(), event) {
            (A::Done, _) => (A::Done, C::Done),
            (A::Next, _) => return self.last.clone(),
            (_, E::Lost) => (A::Done, C::Done),
            (A::Upload, E::Uploaded { file }) => self.write(BatchState::Uploaded { file }),
            // Failed for good before the provider had a batch: its jobs go into another
            // batch, counted.
            (A::Upload | A::Create { .. }, E::Failed(e)) => self.write(failed_state("", &e)),
            (A::Find { file }, E::Found(Some(batch))) => self.submitted(file, batch, now_ms),
            // Requests sent inline are gone with the owner that gathered them: not found,
            // the create never reached the provider; its jobs are gathered again.
            (A::Find { .. }, E::Found(None)) if self.inline && !self.unsure => {
                self.write(BatchState::Abandoned {
                    reason: "its owner stopped before the provider had its batch".into(),
                })
            }
            (A::Find { file }, E::Found(None)) => {
                (A::Create { file: file.clone() }, C::Create { file })
            }
            // The provider's list matches more than one batch (or none can be read as
            // this record's): creating cannot be done here and waiting will not tell.
            // Its jobs are gathered again; a batch of them the provider may hold runs
            // and is paid once more (logged by the IO layer).
            (A::Find { .. }, E::Failed(e)) if self.inline && e.is_permanent() => {
                self.write(BatchState::Abandoned {
                    reason: format!("cannot tell which batch is its: {}", e.message),
                })
            }
            // Without the provider's list, whether the batch was created cannot be told:
            // creating it could submit every request twice. Wait and ask again.
            (A::Find { .. }, E::Failed(_)) => (A::Wait, C::Wait(FIND_RETRY)),
            (A::Create { file }, E::Created { batch }) => self.submitted(file, batch, now_ms),
            // The batch may exist: never create blindly (the requests would run and be
            // paid twice); found, it is polled; not found, the create never arrived.
            (A::Create { file }, E::CreateUnsure) => {
                self.unsure = true;
                let since_s = (self.record.created_ms / 1000).saturating_sub(3600);
                (A::Find { file }, C::Find { since_s })
            }
            (A::Poll { .. }, E::Polled(p)) => {
                self.polled += 1;
                if p.ended {
                    self.record.ended_ms = Some(now_ms);
                    self.write(BatchState::Ended {
                        batch: p.id,
                        status: p.status,
                        output: p.output,
                        error: p.error,
                        reason: p.reason,
                    })
                } else {
                    (A::Wait, C::Wait(self.poll))
                }
            }
            // An error status while polling (a rotated key, a proxy's 403, a 404 for a
            // moment) does not end a batch the provider may still run and bill: keep
            // polling, slowly. Only a batch not seen for two days past its submission is
            // given up (its jobs go into another batch, counted).
            (A::Poll { batch, .. }, E::Failed(e)) => {
                let since = self.record.submitted_ms.unwrap_or(self.record.created_ms);
                if now_ms.saturating_sub(since) < GIVE_UP_UNSEEN.as_millis() as u64 {
                    (A::Wait, C::Wait((self.poll * 10).min(Duration::from_secs(600))))
                } else {
                    self.record.ended_ms = Some(now_ms);
                    self.write(failed_state(&batch, &e))
                }
            }
            (A::Wait, E::Waited) => (A::Next, C::Next),
            (A::Write(state), E::Written) => {
                let live = state.is_live();
                self.record.state = state;
                if live {
                    (A::Next, C::Next)
                } else {
                    (A::Release, C::Release)
                }
            }
            (A::Release, E::Released) => (A::Done, C::Done),
            (awaits, _) => (awaits, self.last.clone()),
        };
        self.awaits = awaits;
        cmd
    }
}

#[cfg(test)]
mod tests;

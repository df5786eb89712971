//! A pool's endpoint health as a pure state machine: no IO, time passed in.
//!
//! The pool is up until a call fails for an endpoint-wide reason ([`OutageReason`]);
//! then it is paused until a call shows the endpoint answering again. While paused, one
//! job of this worker at a time holds the probe ([`Machine::claim_probe`]) and calls the
//! endpoint when [`Outage::next_probe`] comes: 1 s after the pause began, then at
//! intervals doubling with each failed probe up to [`MAX_PROBE_INTERVAL`] (a 503's
//! `Retry-After` lengthens an interval, up to [`MAX_RETRY_AFTER`]).
//!
//! Verdicts on a failed call ([`Machine::failed`]):
//! - the endpoint answered another call after this one started: the failure is this
//!   call's own (a request that takes longer than its timeout while others are served),
//!   [`Verdict::JobFault`];
//! - the pool was up: this failure pauses it, [`Verdict::Opened`];
//! - the pool was paused already (a call in flight when it paused, or a probe):
//!   [`Verdict::Paused`].
//!
//! A call counts as an answer ([`Machine::answered`]) when the endpoint replied with
//! anything but an endpoint-wide failure. It resumes the pool if it is the probe, or if
//! it started after the pause began: an answer to a call sent before the outage says
//! nothing about now.
//!
//! Pauses and resumptions seen by other workers of the pool arrive as announcements
//! ([`Machine::remote_paused`], [`Machine::remote_resumed`]). After another worker's
//! pause or failed probe this worker's own probe waits for that worker's next probe plus
//! a grace ([`remote_grace`]), so one probe goes out per interval for the whole pool
//! while that worker lives, and this one takes over when it stops announcing.

use std::time::Duration;

use halyard_proto::OutageReason;
use tokio::time::Instant;

/// The first probe interval.
pub const MIN_PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// The longest probe interval.
pub const MAX_PROBE_INTERVAL: Duration =
    Duration::from_secs(halyard_proto::health::MAX_PROBE_INTERVAL_S);
/// The longest wait a `Retry-After` on an endpoint-wide failure can impose on a probe.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// The interval after `failures` failed probes: 1 s, 2 s, 4 s … 60 s.
pub fn probe_interval(failures: u32) -> Duration {
    (MIN_PROBE_INTERVAL * (1u32 << failures.min(6))).min(MAX_PROBE_INTERVAL)
}

/// How much later than another worker's announced probe this worker's own comes.
pub fn remote_grace(probe_in: Duration) -> Duration {
    (probe_in / 2).max(MIN_PROBE_INTERVAL)
}

/// A pause of the pool.
#[derive(Clone, Debug, PartialEq)]
pub struct Outage {
    pub reason: OutageReason,
    /// The error that began it (or, for another worker's pause, who announced it).
    pub error: String,
    pub since: Instant,
    /// Probes of this worker that failed since it began.
    pub probes_failed: u32,
    pub next_probe: Instant,
}

/// A call that failed for an endpoint-wide reason.
#[derive(Clone, Debug)]
pub struct Failure {
    /// When the call was sent.
    pub started: Instant,
    pub reason: OutageReason,
    pub error: String,
    pub retry_after: Option<Duration>,
    /// The call was this worker's probe.
    pub probe: bool,
}

/// How a failed call is to be treated; see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    JobFault,
    Opened,
    Paused,
}

/// A change to publish (the KV record, an announcement) and count (metrics).
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// The pool paused; `local` when this worker's call began it.
    Paused { local: bool },
    /// This worker's probe failed; the next one is later.
    ProbeFailed,
    /// The pool resumed after `down_for`; `local` when this worker's call showed it.
    Resumed { down_for: Duration, local: bool },
}

/// The state machine; see the module docs.
#[derive(Debug, Default)]
pub struct Machine {
    outage: Option<Outage>,
    /// When a call last showed the endpoint answering.
    last_answer: Option<Instant>,
    /// The claim number of the job holding the probe (0: none).
    probe: u64,
    claims: u64,
}

impl Machine {
    pub fn new() -> Machine {
        Machine::default()
    }

    pub fn outage(&self) -> Option<&Outage> {
        self.outage.as_ref()
    }

    pub fn is_paused(&self) -> bool {
        self.outage.is_some()
    }

    /// Whether a call has shown the endpoint answering this worker (see
    /// [`super::first_contact`]).
    pub fn has_answered(&self) -> bool {
        self.last_answer.is_some()
    }

    /// A call failed for an endpoint-wide reason at `now`.
    pub fn failed(&mut self, f: Failure, now: Instant) -> (Verdict, Option<Change>) {
        let floor = f.retry_after.unwrap_or_default().min(MAX_RETRY_AFTER);
        match &mut self.outage {
            None if self.last_answer.is_some_and(|a| a > f.started) => (Verdict::JobFault, None),
            None => {
                self.outage = Some(Outage {
                    reason: f.reason,
                    error: f.error,
                    since: now,
                    probes_failed: 0,
                    next_probe: now + probe_interval(0).max(floor),
                });
                (Verdict::Opened, Some(Change::Paused { local: true }))
            }
            Some(o) if f.probe => {
                o.probes_failed = o.probes_failed.saturating_add(1);
                o.next_probe = now + probe_interval(o.probes_failed).max(floor);
                (Verdict::Paused, Some(Change::ProbeFailed))
            }
            Some(_) => (Verdict::Paused, None),
        }
    }

    /// A call sent at `started` got an answer at `now` (any reply that is not an
    /// endpoint-wide failure).
    pub fn answered(&mut self, started: Instant, probe: bool, now: Instant) -> Option<Change> {
        self.last_answer = Some(self.last_answer.map_or(now, |a| a.max(now)));
        let o = self.outage.as_ref()?;
        if !probe && started < o.since {
            return None;
        }
        let down_for = now.saturating_duration_since(o.since);
        self.outage = None;
        self.probe = 0;
        Some(Change::Resumed { down_for, local: true })
    }

    /// Another worker paused the pool, or its probe failed; its next probe is in
    /// `probe_in`.
    pub fn remote_paused(
        &mut self,
        reason: OutageReason,
        from: &str,
        probe_in: Duration,
        now: Instant,
    ) -> Option<Change> {
        let probe_in = probe_in.min(MAX_RETRY_AFTER);
        let at = now + probe_in + remote_grace(probe_in);
        match &mut self.outage {
            Some(o) => {
                o.next_probe = o.next_probe.max(at);
                None
            }
            None => {
                self.outage = Some(Outage {
                    reason,
                    error: format!("paused by worker {from}"),
                    since: now,
                    probes_failed: 0,
                    next_probe: at,
                });
                Some(Change::Paused { local: false })
            }
        }
    }

    /// Another worker saw the endpoint answer.
    pub fn remote_resumed(&mut self, now: Instant) -> Option<Change> {
        let o = self.outage.take()?;
        self.probe = 0;
        Some(Change::Resumed { down_for: now.saturating_duration_since(o.since), local: false })
    }

    /// Take the probe for one job while paused: its claim number, or None when the pool
    /// is up or another job holds it.
    pub fn claim_probe(&mut self) -> Option<u64> {
        if self.outage.is_none() || self.probe != 0 {
            return None;
        }
        self.claims += 1;
        self.probe = self.claims;
        Some(self.probe)
    }

    /// The job with claim `claim` no longer holds the probe.
    pub fn release_probe(&mut self, claim: u64) {
        if self.probe == claim {
            self.probe = 0;
        }
    }

    /// Whether a job holds the probe.
    pub fn probe_held(&self) -> bool {
        self.probe != 0
    }

    /// No job was at hand to probe with: try again one interval from `now`.
    pub fn defer_probe(&mut self, now: Instant) {
        if let Some(o) = &mut self.outage {
            o.next_probe = o.next_probe.max(now + probe_interval(o.probes_failed));
        }
    }
}

/// A refused connection of a call sent at `started` (for tests).
#[cfg(test)]
pub(crate) fn refused(started: Instant, probe: bool) -> Failure {
    Failure {
        started,
        reason: OutageReason::Connection,
        error: "connection refused".into(),
        retry_after: None,
        probe,
    }
}

#[cfg(test)]
mod tests;

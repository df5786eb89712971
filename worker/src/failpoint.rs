//! Crash points for tests: `HALYARD_FAILPOINT=<point>:<n>` makes the worker abort
//! (`SIGABRT`, no cleanup, no flush of the NATS connection) the `n`-th time it passes
//! `<point>`. Read once when the worker starts; with the variable unset a point costs a
//! branch.
//!
//! A point counts one pass per result: the outbox, which publishes results in batches,
//! passes `publish-confirm` and `confirm-ack` once for each result of the batch.
//!
//! The points sit between the steps of the durability order (lifecycle.rs), so a test
//! can crash a worker between any two of them and check that nothing is lost or
//! counted twice:
//!
//! | point | the worker has… | and not yet… |
//! |---|---|---|
//! | `call-persist` | the model's answer | written it to the checkpoint |
//! | `flush-publish` | the answer committed durably in the checkpoint (group commit) | published the result |
//! | `publish-confirm` | handed the publish of the batch holding the result to the client | seen the broker's ack for it (it may not have left the process) |
//! | `confirm-ack` | the broker's ack for the result | acked the job |
//! | `ack-flush` | handed the job's ack to the client | flushed the connection (the ack may not have left the process) |
//!
//! And the steps of a provider batch (`mode = "batch"` pools, see `batch`), one pass per
//! batch (`batch-polling`: per poll; `batch-downloaded`: per download):
//!
//! | point | the worker has… | and not yet… |
//! |---|---|---|
//! | `batch-uploaded` | uploaded the batch's input file | recorded its file id |
//! | `batch-created` | created the provider batch | recorded its batch id |
//! | `batch-polling` | polled the submitted batch (still running, or just ended) | recorded its end |
//! | `batch-downloaded` | downloaded the ended batch's output and error files | checkpointed or published any answer |

use std::sync::atomic::{AtomicU64, Ordering};

/// Environment variable naming the armed point.
pub const ENV: &str = "HALYARD_FAILPOINT";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Point {
    CallPersist,
    FlushPublish,
    PublishConfirm,
    ConfirmAck,
    AckFlush,
    BatchUploaded,
    BatchCreated,
    BatchPolling,
    BatchDownloaded,
}

impl Point {
    pub const ALL: [Point; 9] = [
        Point::CallPersist,
        Point::FlushPublish,
        Point::PublishConfirm,
        Point::ConfirmAck,
        Point::AckFlush,
        Point::BatchUploaded,
        Point::BatchCreated,
        Point::BatchPolling,
        Point::BatchDownloaded,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Point::CallPersist => "call-persist",
            Point::FlushPublish => "flush-publish",
            Point::PublishConfirm => "publish-confirm",
            Point::ConfirmAck => "confirm-ack",
            Point::AckFlush => "ack-flush",
            Point::BatchUploaded => "batch-uploaded",
            Point::BatchCreated => "batch-created",
            Point::BatchPolling => "batch-polling",
            Point::BatchDownloaded => "batch-downloaded",
        }
    }
}

/// At most one armed point and the number of passes that triggers it.
#[derive(Debug, Default)]
pub struct Failpoints {
    armed: Option<(Point, u64)>,
    passes: AtomicU64,
}

impl Failpoints {
    /// Disarmed.
    pub fn none() -> Failpoints {
        Failpoints::default()
    }

    /// From [`ENV`]; unset or empty is disarmed, anything unreadable is an error.
    pub fn from_env() -> Result<Failpoints, String> {
        match std::env::var(ENV) {
            Ok(v) if !v.is_empty() => Failpoints::parse(&v),
            _ => Ok(Failpoints::none()),
        }
    }

    /// `<point>:<n>` with `n ≥ 1`.
    pub fn parse(spec: &str) -> Result<Failpoints, String> {
        let names: Vec<&str> = Point::ALL.iter().map(|p| p.name()).collect();
        let bad = || {
            format!(
                "{ENV}={spec:?}: expected <point>:<n>, n ≥ 1, point one of {}",
                names.join(", ")
            )
        };
        let (name, n) = spec.split_once(':').ok_or_else(bad)?;
        let point = Point::ALL.into_iter().find(|p| p.name() == name).ok_or_else(bad)?;
        let n: u64 = n.parse().ok().filter(|n| *n >= 1).ok_or_else(bad)?;
        Ok(Failpoints { armed: Some((point, n)), passes: AtomicU64::new(0) })
    }

    pub fn armed(&self) -> Option<(Point, u64)> {
        self.armed
    }

    /// Pass `point`: abort the process if it is armed and this is the n-th pass.
    pub fn pass(&self, point: Point) {
        if self.trips(point) {
            eprintln!(
                "{ENV}: reached {} the {}-th time; aborting",
                point.name(),
                self.passes.load(Ordering::SeqCst)
            );
            std::process::abort();
        }
    }

    /// Count a pass; true exactly once, on the n-th pass of the armed point.
    fn trips(&self, point: Point) -> bool {
        match self.armed {
            Some((p, n)) if p == point => self.passes.fetch_add(1, Ordering::SeqCst) + 1 == n,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A spec arms one point for its n-th pass only; bad specs name the variable and the choices.
    #[test]
    fn parse_and_trip_once() {
        let f = Failpoints::parse("confirm-ack:3").unwrap();
        assert_eq!(f.armed(), Some((Point::ConfirmAck, 3)));
        assert!(!f.trips(Point::FlushPublish));
        assert!(!f.trips(Point::ConfirmAck));
        assert!(!f.trips(Point::ConfirmAck));
        assert!(f.trips(Point::ConfirmAck));
        assert!(!f.trips(Point::ConfirmAck));
        for bad in ["confirm-ack", "confirm-ack:0", "nowhere:1", "ack-flush:x"] {
            let e = Failpoints::parse(bad).unwrap_err();
            assert!(e.contains(ENV) && e.contains("flush-publish"), "{e}");
        }
        assert!(!Failpoints::none().trips(Point::AckFlush));
    }
}

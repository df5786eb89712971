//! Names on the broker: streams, subjects, consumers, KV buckets.

use uuid::Uuid;

/// Work-queue stream holding every pool's jobs.
pub const JOBS_STREAM: &str = "HALYARD_JOBS";
/// Stream holding results, one subject per run and pool
/// (`halyard.results.<run>.<pool token>`, [`result_subject`]).
pub const RESULTS_STREAM: &str = "HALYARD_RESULTS";
pub const JOBS_PREFIX: &str = "halyard.jobs";
pub const RESULTS_PREFIX: &str = "halyard.results";

/// KV bucket of each pool's endpoint health (key: [`pool_token`]; value: JSON
/// [`crate::PoolHealthRecord`]), written by workers.
pub const POOL_HEALTH_BUCKET: &str = "halyard_pool_health";
/// KV bucket of the deliveries of job messages that ended for a reason that was not the
/// job's fault (key: the message's stream sequence in `HALYARD_JOBS`), written by workers.
pub const DELIVERY_BUDGET_BUCKET: &str = "halyard_delivery_budget";

/// A pool name as a single NATS subject token. Pool names such as `openai/gpt-4o@team`
/// contain characters a token cannot (`.`, `*`, `>`, spaces); those become `_` and a short
/// hash of the original name is appended so that different names never share a subject.
pub fn pool_token(pool: &str) -> String {
    let clean: String = pool
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
        .collect();
    if clean == pool && !pool.is_empty() {
        clean
    } else {
        let h = blake3::hash(pool.as_bytes());
        let hex: String = h.as_bytes()[..4].iter().map(|b| format!("{b:02x}")).collect();
        format!("{clean}-{hex}")
    }
}

pub fn job_subject(pool: &str) -> String {
    format!("{JOBS_PREFIX}.{}", pool_token(pool))
}

/// Durable pull consumer shared by every worker of a pool.
pub fn pool_consumer(pool: &str) -> String {
    format!("pool-{}", pool_token(pool))
}

/// The subject a worker of pool `pool` publishes run `run`'s results on. The pool is part
/// of the subject so that the broker's permissions can say which pools a worker's
/// credentials answer for (`halyard.results.*.<pool token>`), and the coordinator takes a
/// result only from the subject of the pool its job was published to.
pub fn result_subject(run: Uuid, pool: &str) -> String {
    format!("{RESULTS_PREFIX}.{}.{}", run.simple(), pool_token(pool))
}

/// Every results subject of run `run` (its coordinator's consumer filter).
pub fn run_results_filter(run: Uuid) -> String {
    format!("{RESULTS_PREFIX}.{}.>", run.simple())
}

/// The pool token of a results subject of run `run` ([`result_subject`]); None for any
/// other subject (another run's, the bare run subject of builds before pools were part of
/// it, more tokens than one).
pub fn result_pool_token(run: Uuid, subject: &str) -> Option<&str> {
    let rest = subject.strip_prefix(RESULTS_PREFIX)?.strip_prefix('.')?;
    let run = run.simple().to_string();
    let token = rest.strip_prefix(run.as_str())?.strip_prefix('.')?;
    (!token.is_empty() && !token.contains('.')).then_some(token)
}

/// Durable pull consumer of a run's coordinator. (`coord-<run>` in builds that took
/// results on one subject per run; that consumer is deleted when a run resumes.)
pub fn run_consumer(run: Uuid) -> String {
    format!("results-{}", run.simple())
}

/// The consumer name of builds before [`run_consumer`] (one results subject per run).
pub fn old_run_consumer(run: Uuid) -> String {
    format!("coord-{}", run.simple())
}

/// Message id of a job: a job may appear in several runs, once per run. (A results
/// message's id adds its worker's secret, see `halyard_worker::outbox`.)
pub fn job_msg_id(run: Uuid, job: &crate::JobId) -> String {
    format!("{}:{}", run.simple(), job)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A results subject names its run and pool; the pool token is read back only from a
    /// subject of that run with exactly one token after it.
    #[test]
    fn result_subjects_carry_their_pool() {
        let run = Uuid::from_u128(7);
        let s = result_subject(run, "openai/gpt-4o@team");
        assert_eq!(result_pool_token(run, &s), Some(pool_token("openai/gpt-4o@team").as_str()));
        assert_eq!(result_pool_token(run, &result_subject(run, "a")), Some("a"));
        assert_eq!(result_pool_token(Uuid::from_u128(8), &s), None);
        let bare = format!("{RESULTS_PREFIX}.{}", run.simple());
        assert_eq!(result_pool_token(run, &bare), None);
        assert_eq!(result_pool_token(run, &format!("{bare}.a.b")), None);
        assert_eq!(result_pool_token(run, &format!("{bare}.")), None);
        assert_eq!(result_pool_token(run, &format!("{bare}x.a")), None);
    }

    /// Tokens are valid NATS tokens and distinct names never collide after cleaning.
    #[test]
    fn pool_tokens_are_safe_and_distinct() {
        assert_eq!(pool_token("model-a"), "model-a");
        let a = pool_token("openai/gpt-4o@team.a");
        let b = pool_token("openai/gpt-4o@team_a");
        assert_ne!(a, b);
        for t in [a, b, pool_token(""), pool_token("a b*>")] {
            assert!(!t.is_empty());
            assert!(t.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'), "{t}");
        }
    }
}

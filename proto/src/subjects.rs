//! Names on the broker: streams, subjects, consumers, KV buckets.

use uuid::Uuid;

/// Work-queue stream holding every pool's jobs.
pub const JOBS_STREAM: &str = "HALYARD_JOBS";
/// Stream holding results, one subject per run.
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

pub fn result_subject(run: Uuid) -> String {
    format!("{RESULTS_PREFIX}.{}", run.simple())
}

/// Durable pull consumer of a run's coordinator.
pub fn run_consumer(run: Uuid) -> String {
    format!("coord-{}", run.simple())
}

/// Message id of a result: a job may appear in several runs, its result once per run.
pub fn result_msg_id(run: Uuid, job: &crate::JobId) -> String {
    format!("{}:{}", run.simple(), job)
}

#[cfg(test)]
mod tests {
    use super::*;

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

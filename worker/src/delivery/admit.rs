//! The receiving half of a pool: every job message is untrusted input.
//!
//! [`receive`] decodes a job message item by item (one bad job costs only itself,
//! `halyard_proto::decode_job_items`) and checks each job against the worker's plan
//! (`WorkerPlan::admit`: the id is the hash of the key, the pool is the consumer's, the
//! model is one configured for that pool). A message holding a job of another wire
//! version is handed back whole, with [`crate::lifecycle::OTHER_VERSION_DELAY`], for a compatible worker:
//! a rolling upgrade must not destroy jobs.
//!
//! A refused job (`delivery::refuse`) is never called and never checkpointed; what its delivery
//! does is the [`crate::lifecycle`] machine's (`Event::Refused`). It is logged with
//! the reason (pool and endpoint asked for, credentials redacted), counted
//! (`Stats::refused`), reported to the run it names as a result with
//! `FailureKind::Refused` when it could be decoded (the coordinator counts it and does
//! not take it for the outcome of the job whose id it carries, see
//! `halyard_proto::result`), and settles its share of the message as terminated: the
//! message is acked once the other jobs in it are done, terminated if none is left.

use halyard_proto::pool::{Refusal, WorkerPlan};
use halyard_proto::{Job, JobItem};

/// A refused item: the reason, and the job when it could be decoded.
pub(crate) struct Refused {
    pub job: Option<Job>,
    pub refusal: Refusal,
}

/// One item of a job message, checked.
pub(crate) enum Received {
    Run(Job),
    Refuse(Refused),
}

/// Decode the items of a job message delivered by `pool`'s consumer and check each
/// against `plan`; `Err(version)` when one of them is of another wire version.
pub(crate) fn receive(plan: &WorkerPlan, pool: &str, payload: &[u8]) -> Result<Vec<Received>, u16> {
    let items = halyard_proto::decode_job_items(payload);
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        out.push(match item {
            JobItem::OtherVersion(v) => return Err(v),
            JobItem::Undecodable(e) => Received::Refuse(Refused {
                job: None,
                refusal: Refusal::Undecodable { pool: pool.into(), error: e.to_string() },
            }),
            JobItem::Job(job) => match plan.admit(pool, &job) {
                Ok(_) => Received::Run(job),
                Err(refusal) => Received::Refuse(Refused { job: Some(job), refusal }),
            },
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use halyard_proto::pool::PoolPlan;
    use halyard_proto::{encode, encode_batch, ChatMessage, JobKey, ModelRef, Sampling};

    fn job(i: u32, backend: &str) -> Job {
        let key = JobKey {
            pipeline: "noop".into(),
            stage: "call".into(),
            stage_version: 1,
            model: ModelRef { backend: backend.into(), endpoint: String::new(), model: "m".into() },
            messages: vec![ChatMessage::user(format!("item {i}"))],
            sampling: Sampling::default(),
            sample_index: 0,
        };
        Job::new(uuid::Uuid::nil(), "free", key, 1000)
    }

    fn plan() -> WorkerPlan {
        WorkerPlan {
            pools: vec![PoolPlan::new("free", 2).with_model(halyard_proto::pool::WorkerModel::Noop)],
        }
    }

    /// Issue 13: in one message, the garbage item, the forged id and the unconfigured
    /// model are refused each on its own; the good jobs are admitted.
    #[test]
    fn each_item_is_admitted_or_refused_alone() {
        let mut forged = job(2, "noop");
        forged.key.messages[0].content = "something else".into();
        let items = [
            encode(&job(0, "noop")).unwrap(),
            encode(&"garbage").unwrap(),
            encode(&forged).unwrap(),
            encode(&job(3, "openai")).unwrap(),
            encode(&job(4, "noop")).unwrap(),
        ];
        let got = receive(&plan(), "free", &encode_batch(&items)).unwrap();
        let kinds: Vec<String> = got
            .iter()
            .map(|r| match r {
                Received::Run(_) => "run".to_string(),
                Received::Refuse(Refused { refusal, .. }) => {
                    format!("{refusal:?}").split_whitespace().next().unwrap_or_default().to_string()
                }
            })
            .collect();
        assert_eq!(kinds, ["run", "Undecodable", "IdMismatch", "UnknownModel", "run"]);
    }

    /// A message holding a job of another wire version is handed back whole.
    #[test]
    fn other_versions_are_handed_back() {
        let mut j = job(0, "noop");
        j.v = halyard_proto::WIRE_VERSION + 1;
        let msg = encode_batch(&[encode(&job(1, "noop")).unwrap(), encode(&j).unwrap()]);
        assert_eq!(receive(&plan(), "free", &msg).err(), Some(j.v));
    }
}

//! # halyard-proto: the wire between Halyard's processes
//!
//! Everything that crosses NATS is defined here, with the worker's configuration
//! contract ([`pool`]) that jobs are checked against: no tokio, and no IO.
//!
//! ## Layout
//! - [`id`]: [`JobId`], the content hash of everything that determines a job's result.
//! - [`job`]: [`Job`] (what a worker receives) and the request it carries.
//! - [`result`]: [`JobResult`] (what a worker publishes back), outcomes and failures.
//! - [`pool`]: the worker's contract, [`pool::WorkerPlan`]: the pools it serves, their
//!   quotas and the models it may call; and the check every received job passes.
//! - [`provider_batch`]: provider batches of `mode = "batch"` pools as the broker
//!   records them (durable before each provider step, taken over after a crash).
//! - [`server`]: managed model servers (`backend = "server"`): their spec, presets,
//!   command templates and location-independent identity.
//! - [`redact`]: secrets out of text bound for logs, errors and dead letters.
//! - [`batch`]: results messages holding many results (one per checkpoint group commit).
//! - [`health`]: a pool's endpoint health ([`PoolHealthRecord`]) as workers publish it.
//! - [`subjects`]: stream, subject and consumer names, and pool-name encoding.
//! - [`codec`]: MessagePack (rmp-serde, named fields) with a version check.
//! - [`filter`]: [`JobIdFilter`], a Bloom filter over job ids that lets the stores skip
//!   lookups that would miss (pure data structure; still no IO).
//! - [`stored`]: the compact form of the records the stores keep (checkpointed
//!   completions, the coordinator's results), fields by position.
//!
//! ## Why content hashes
//! A job id is a hash of pipeline, stage and stage version, model reference, full
//! messages, sampling parameters and sample index. The same inputs give the same id in
//! any run, so a worker's checkpoint answers a repeated job without calling the model,
//! and JetStream's `Nats-Msg-Id` de-duplication drops re-published jobs. Anything that
//! must produce a *new* call (a repeated sample, a judge retry after unusable output)
//! changes the sample index, hence the id.

pub mod batch;
pub mod cache;
pub mod codec;
pub mod filter;
pub mod health;
pub mod id;
pub mod job;
pub mod pool;
pub mod provider_batch;
pub mod redact;
pub mod result;
pub mod server;
pub mod stored;
pub mod subjects;

pub use batch::{
    batch_msg_id, decode_job_items, decode_jobs, decode_results, encode_batch, JobItem,
};
pub use cache::CachePolicy;
pub use codec::{decode, encode, CodecError};
pub use filter::JobIdFilter;
pub use health::{OutageReason, PoolHealthRecord};
pub use id::JobId;
pub use job::{ChatMessage, Job, JobKey, LogprobsRequest, ModelRef, OutputSchema, Role, Sampling};
pub use result::{
    AnswerKind, AnswerSource, CacheUsage, Completion, Failure, FailureKind, JobResult, Outcome,
    TokenLogprob, TopLogprob, Usage, UsageBound,
};
pub use stored::StoredResult;

/// Version of the wire format. A process refuses messages of another major version.
pub const WIRE_VERSION: u16 = 1;

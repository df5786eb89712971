//! # halyard-worker: runs a pool's jobs
//!
//! ## Layout
//! - [`lifecycle`]: the life of one delivery as a pure state machine (no IO): every
//!   decision of a delivery (admit or refuse, where the answer already is, the budget,
//!   retry, hand back, dead letter) is one of its transitions.
//! - [`checkpoint`]: the store of completed calls (fjall, through `halyard-store`), with group commit.
//! - [`config_file`]: the worker configuration file (`halyard worker --config`): pools,
//!   the models each may call, quotas and HTTP limits, for workers without a sweep.
//! - [`batch`]: batch pools (`mode = "batch"`): jobs answered through the provider's
//!   batch API, every step recorded in the broker before it is taken.
//! - [`backend`]: model backends (the trait; `backend::registry` names each one) and error
//!   classification.
//! - [`server`]: managed model servers (`backend = "server"`): started before the pools
//!   take jobs, restarted when they crash (the pool paused meanwhile), stopped last.
//! - [`retry`]: the policy of in-delivery retries (backoff, jitter, `Retry-After`).
//! - [`health`]: each pool's endpoint health: an outage pauses the pool across all its
//!   workers (no fetching, held jobs handed back, one probe), an answer resumes it.
//! - [`budget`]: delivery budgets that outages, cool-downs and shutdowns do not spend.
//! - `message`: a job message (one job or a batch) and how it settles.
//! - [`failpoint`]: crash points between the durability steps, armed by an environment
//!   variable, for crash tests.
//! - [`quota`]: pool quotas (requests and tokens per minute) shared by all the
//!   pool's workers through a KV membership, with pool-wide cool-downs on 429.
//! - `pool`: the fetch loop of one pool; it hands each message to its delivery.
//! - `delivery`: one delivery of a job message: the [`lifecycle`] machine and the IO
//!   that carries out its effects (one executor loop, `delivery/mod.rs`). Inside it, `delivery::admit` is the receiving half
//!   (job messages decoded item by item and each job checked against the worker's plan
//!   before anything else happens), `delivery::calling` one job's call (retries,
//!   in-progress acks, pauses) and `delivery::ctx` what every delivery shares.
//!
//! ## What a worker runs
//! Only its operator's configuration, the [`WorkerConfig::plan`]
//! (`halyard_proto::pool::WorkerPlan`): the pools it serves and, in each, the models it
//! may call with their URL and API key *variable*. A job names a model; the worker checks
//! that its id is the hash of its key and that the model is configured for the pool that
//! delivered it, and then calls the configured model. Anything else is refused: never
//! called, never checkpointed, terminated, logged, counted (`Stats::refused`) and
//! reported to its run as `FailureKind::Refused`.
//!
//! ## The life of a job in a worker
//! 1. Fetch as many jobs as the pool has free slots (`max_concurrency`); decode and
//!    check each job of a message on its own (`delivery::admit`).
//! 2. If the checkpoint holds the job's result, publish it and ack: no model call.
//! 3. Otherwise call the backend (retrying transient failures, honouring `Retry-After`,
//!    sending in-progress acks while the call runs longer than a third of `ack_wait`).
//! 4. Write the completion to the checkpoint, durably (group commit: one flush covers every
//!    result that arrived meanwhile), publish it to `halyard.results.<run>` and await the
//!    broker's ack (the outbox sends the results that became durable together as one
//!    message, see `outbox`), and only then ack the job. The ack is a plain one, written with the others pending on the
//!    connection: a lost ack costs a redelivery answered from the checkpoint, never a
//!    model call, so it is not worth a round trip per job (a double ack).
//! 5. A permanent error, or a transient one on the last delivery, publishes a dead
//!    letter and acks; other failures nak with a backoff delay. Failures that are the
//!    pool's (the endpoint down, 429s past the in-place retries) hand the job back
//!    without spending its delivery budget; an endpoint-wide failure pauses the pool
//!    (see [`health`]) and the delivery that began the pause counts, so a job that
//!    brings the endpoint down every time it is sent still ends as a dead letter.
//!    "The last delivery" is counted by [`budget`], not by JetStream alone.
//!
//! A crash anywhere loses at most the calls in flight: a job acked is durable in both
//! the checkpoint and the results stream; a job not acked is redelivered and, if its call had
//! completed, answered from the checkpoint.
//!
//! ## Shutdown
//! When `shutdown` resolves, the worker stops fetching and leaves its quota pools at
//! once (the others take over its shares; its calls still waiting for the share do not
//! start). In-flight jobs get `shutdown_grace` to finish; after that their calls are
//! abandoned and the jobs handed back with a short delay (their budget kept), so another
//! worker picks them up. A job holding a paused pool's probe is handed back at once.
//! The checkpoint is flushed last.

pub mod backend;
pub mod batch;
pub mod budget;
mod call_error;
pub mod checkpoint;
pub mod config_file;
mod delivery;
pub mod failpoint;
pub mod health;
pub mod lifecycle;
mod message;
mod outbox;
mod pool;
pub mod quota;
pub mod retry;
mod start;
pub mod stats;

/// Managed model servers, held by the backends (`backend::server`).
pub use backend::server;
pub use checkpoint::Checkpoint;
pub use start::{default_worker_id, run, run_with_checkpoint, WorkerConfig, WorkerError};
pub use stats::{Counter, Stats};

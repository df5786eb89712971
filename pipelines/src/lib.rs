//! # halyard-pipelines: the benchmarks, as pure functions
//!
//! This crate is where the specs (`shared/specs/`) live in code. It knows nothing of
//! NATS, the stores or tokio: a pipeline turns dataset items into [`common::JobRequest`]s,
//! turns known results into labels, and turns labels into a report. The coordinator
//! owns every side effect.
//!
//! ## Layout
//! - [`common`]: what every pipeline shares with the coordinator: [`common::ModelSpec`],
//!   [`common::JobRequest`], [`common::ResultLookup`] (the results known so far) and
//!   [`common::Plan`] (jobs still needed, or the final label).
//! - [`hypotermqa`]: HypoTermQA evaluation (arXiv 2402.16211), in `paper` and
//!   `reference` semantics:
//!   - `dataset.rs`: the JSONL reader with located errors;
//!   - `string_match.rs`: term inclusion (paper reading and exact emulation of the
//!     authors' Python);
//!   - `prompts.rs`: the answer request and the authors' judge templates, verbatim;
//!   - `judge.rs` + `pyjson.rs`: reading judge output (strict paper reader; exact
//!     emulation of the authors' parser on a CPython-compatible `json.loads`);
//!   - `labels.rs`: term and answer label rules, and the `labels.jsonl` row;
//!   - `plan.rs`: [`hypotermqa::evaluate`], the per-question planner;
//!   - `score.rs`: [`hypotermqa::score()`] and [`hypotermqa::render_markdown`].
//! - [`autohall`]: AutoHall (arXiv 2310.00259): claim files, references, classification,
//!   hallucination labels, self-contradiction detection with the K-ablation.
//! - [`chainpoll`]: ChainPoll (arXiv 2310.18344) on labelled items: judge polls,
//!   Correctness / Adherence, AUROC, and the SelfCheck-NGram unigram baseline.
//! - [`hypotermqa_build`]: building a HypoTermQA benchmark for a domain (topics,
//!   hypothetical terms, existence check, similar valid terms by LLM and embeddings,
//!   questions) into a dataset the `hypotermqa` pipeline reads.
//! - [`noop`]: one job per item whose answer is ignored, to measure the job path
//!   (planning, broker, checkpoint, accounting) with models that answer at once.
//! - [`uhgeval`]: UHGEval (arXiv 2311.15296) in its four forms (keyword level, sentence
//!   level, selective, generative), `paper` or `v2` rules, with a pluggable embedding model
//!   for its "BERTScore".
//! - [`hvi`]: the Hallucination Vulnerability Index per model, from sentence labels made by
//!   a judge job per sentence or read from a labelled file.
//! - [`metrics`]: the metric functions of `shared/specs/metrics.md` (UHGEval, AutoHall,
//!   ChainPoll/RealHall, SelfCheck-NGram, pseudo-entropy, HVI), pure and typed.
//!
//! ## How the coordinator drives a pipeline
//! 1. For each item, call `evaluate(config, item, &results)`.
//! 2. `Plan::Waiting(jobs)`: publish every job not yet published (ids are content
//!    hashes, so re-publishing is harmless), and call `evaluate` again for that item when
//!    one of them gets a terminal result (done or dead letter).
//! 3. `Plan::Done(label)`: write the label row; when every item is done, `score`.
//!
//! `evaluate` recomputes from the results it is shown: it keeps no state, is
//! deterministic, and gives the same answer when called twice with the same results,
//! which is what makes a resumed run safe.

pub mod autohall;
pub mod chainpoll;
pub mod common;
pub mod hvi;
pub mod hypotermqa;
pub mod hypotermqa_build;
pub mod jsonl;
pub mod metrics;
pub mod noop;
pub mod uhgeval;

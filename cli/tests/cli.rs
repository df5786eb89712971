//! Halyard's end-to-end and integration tests of the `halyard` binary, one test target
//! with a module per area (`cargo test -p halyard --test cli chaos::` runs one area).
//!
//! One target rather than a target per file: `cargo test` runs test targets one after
//! another, and most of these tests wait (on a broker, a fake API's outage, a child
//! process) rather than compute; in one target the harness runs them side by side
//! (`--test-threads`, by default one per core). It also links once instead of 32 times.
//! See the book's performance notebook for the timings.

mod common;

mod anthropic;
mod batch_mode;
mod bench_scripts;
mod broker_permissions;
mod broker_pool_users;
mod broker_security;
mod cache;
mod chaos;
mod crash_durability;
mod deploy_k8s;
mod e2e_autohall;
mod e2e_build;
mod e2e_chainpoll;
mod e2e_hypotermqa;
mod e2e_hypotermqa_reference;
mod e2e_replay;
mod e2e_uhgeval_hvi;
mod first_contact;
mod gc;
mod graceful_stop;
mod health;
mod hostile;
mod hostile_combined;
mod intake;
mod judges;
mod leaderboard;
mod local_model;
mod long_answers;
mod managed_server;
mod metrics;
mod outage;
mod power_loss;
mod quota_pool;
mod report_html;
mod retry_failed;
mod secrets;
mod status;
mod store_crash;
mod trust;
mod usage_extremes;
mod view;

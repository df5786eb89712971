//! Test support for Halyard's integration tests (`publish = false`).
//!
//! # Layout
//!
//! - [`nats`]: [`NatsServer`], a real `nats-server` with JetStream on a free loopback
//!   port and a temporary store, with `restart()` on the same port and store; killed
//!   and cleaned up on drop. Also [`free_port`].
//! - [`fake_openai`]: [`FakeOpenAi`], a real HTTP server speaking OpenAI chat
//!   completions, scripted per call with a [`Reply`] (text, HTTP errors with
//!   `Retry-After`, delays, gates, hangs, garbage), logging every call it receives,
//!   with scripted [`Outage`]s (refused connections, 503s, hangs) for a window.
//!   Also [`request_key`] and [`repeats`] to count paid-for calls made twice.
//! - [`compose`]: [`compose::Compose`], a Docker Compose project under a unique name,
//!   torn down with its volumes and images on drop; and a std-only HTTP GET.
//! - [`fake_anthropic`]: [`FakeAnthropic`], Anthropic's Messages API (headers, error
//!   shapes, prompt caching, requests/input/output tokens per minute as the API's token
//!   buckets) answering with the same [`Reply`]s, so one responder serves both fakes.
//! - [`fake_api`]: the HypoTermQA rules and per-prompt ledger of the `fake-api` binary
//!   (`src/bin/fake-api.rs`), the fake paid API of the container deployments.
//!   The `fake-server` binary (`src/bin/fake-server.rs`) serves the same rules as a model
//!   server a worker owns (`backend = "server"`): `/health`, `/version`, slow starts,
//!   crashes and graceful stops as its flags or environment say.
//! - [`faults`]: [`Faults`], the faults of a bad API night (503s, bodies cut mid-way,
//!   empty bodies, truncated JSON) in front of any responder, and a server kill mid-run.
//! - [`fake_quota`]: [`FakeQuotaApi`], a `FakeOpenAi` that enforces requests- and
//!   tokens-per-minute quotas over a sliding window (429 with `Retry-After` beyond
//!   them), with a configurable latency and 429 storms, and a ledger of admissions.
//! - [`process`]: [`spawn_tied`] and [`ChildGuard`], so that no child (`nats-server`,
//!   the `halyard` binary) outlives the test process, even one that crashes; and
//!   [`cargo_bin`] to find the `halyard` binary from tests outside the `cli` package.
//!
//! # Design
//!
//! Tests talk to real processes over real sockets: the broker is the real
//! `nats-server` and the model API is a real HTTP server, so a test exercises the same
//! client code, timeouts and reconnects as production. Both helpers are synchronous
//! to construct and run on their own threads, so they work alike in `#[test]` and
//! `#[tokio::test]` functions and keep serving while a test blocks on a child process.
//!
//! Every child is spawned with `PR_SET_PDEATHSIG = SIGKILL` from one long-lived thread
//! (see [`process`] for why the thread matters), and every helper kills what it owns
//! on drop.
//!
//! # Example
//!
//! ```no_run
//! use halyard_tests::{cargo_bin, ChildGuard, FakeOpenAi, NatsServer, Reply};
//! use std::process::Command;
//! use std::time::Duration;
//!
//! let nats = NatsServer::start();
//! let api = FakeOpenAi::start_blocking(|call| Reply::Text(format!("answer to {}", call.seq)));
//! // In the cli package's own tests: Command::new(env!("CARGO_BIN_EXE_halyard")).
//! let mut cmd = Command::new(cargo_bin("halyard"));
//! cmd.args(["run", "sweep.toml", "--nats", &nats.url()])
//!     .env("OPENAI_BASE_URL", api.base_url());
//! let mut worker = ChildGuard::spawn(cmd);
//! let status = worker.wait_timeout(Duration::from_secs(60)).expect("worker hung");
//! assert!(status.success());
//! assert_eq!(halyard_tests::repeats(&api.calls()), 0, "a call was paid for twice");
//! ```

pub mod cluster;
pub mod compose;
pub mod fake_anthropic;
pub mod fake_api;
pub mod fake_openai;
pub mod fake_quota;
pub mod faults;
pub mod mutate;
pub mod nats;
pub mod process;
pub mod prometheus;

pub use cluster::NatsCluster;
pub use fake_anthropic::FakeAnthropic;
pub use fake_openai::{repeats, request_key, ChatCall, FakeOpenAi, Gate, Outage, Reply};
pub use fake_quota::{FakeQuotaApi, QuotaConfig, QuotaLedger};
pub use faults::Faults;
pub use nats::{free_port, NatsServer};
pub use process::{cargo_bin, pid_alive, spawn_tied, ChildGuard};

/// Copy the directory tree `from` to `to` (created), files and folders (a store's lock
/// file included: the engine opens a store only with it; the lock itself, a file lock,
/// does not travel with a copy).
///
/// Files are copied sparse: only their data ranges (SEEK_DATA/SEEK_HOLE); holes stay
/// holes and read back as the same zeros. The store engine sizes each journal to 64 MiB
/// with a hole when it creates it, and a plain copy writes those 64 MiB out (the
/// damaged-store test makes over 500 copies: 68 GB of writes and 90 s before, 12 s now).
pub fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &to.join(e.file_name()));
        } else {
            copy_sparse(&e.path(), &to.join(e.file_name()))
                .unwrap_or_else(|err| panic!("copy {}: {err}", e.path().display()));
        }
    }
}

fn copy_sparse(from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    use std::os::fd::AsRawFd;
    let mut src = std::fs::File::open(from)?;
    let mut dst = std::fs::File::create(to)?;
    let meta = src.metadata()?;
    dst.set_permissions(meta.permissions())?;
    // The file's data ranges (SEEK_DATA, then SEEK_HOLE), each copied at its offset.
    let mut pos: libc::off_t = 0;
    loop {
        // SAFETY: lseek on a descriptor this function owns; no memory is passed.
        let data = unsafe { libc::lseek(src.as_raw_fd(), pos, libc::SEEK_DATA) };
        if data < 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ENXIO) {
                break; // no data past `pos`
            }
            return Err(err);
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(src.as_raw_fd(), data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(std::io::Error::last_os_error());
        }
        src.seek(SeekFrom::Start(data as u64))?;
        dst.seek(SeekFrom::Start(data as u64))?;
        std::io::copy(&mut (&mut src).take((hole - data) as u64), &mut dst)?;
        pos = hole;
    }
    dst.set_len(meta.len())
}

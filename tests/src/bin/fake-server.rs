//! `fake-server`: a stand-in for a model server (vLLM, llama-server) that a Halyard worker
//! starts and owns (`backend = "server"`): the project's [`FakeOpenAi`] on the port the
//! worker chose, with `GET /health` and `GET /version`, and scripted misbehaviour for the
//! managed-server tests (`cli/tests/managed_server.rs`).
//!
//! ```sh
//! fake-server --port 8000 --ready-after-ms 2000 --calls-log calls.txt --crash-after 5
//! ```
//!
//! - It prints its pid, port, arguments and `CUDA_VISIBLE_DEVICES` first (to the log the
//!   worker gives it).
//! - `--ready-after-ms N`: `/health` answers 503 for N ms (a model loading), then 200;
//!   `--never-ready`: 503 for ever; `--exit-at-start CODE`: exits at once.
//! - `--crash-after N`: on receiving call N + 1 it exits (code 3) with calls in flight,
//!   every time it runs; with `--crash-once FILE` only while FILE does not exist (it
//!   creates FILE as it crashes), so the restarted server answers.
//! - `--calls-log FILE`: one line per call received (`<pid> <hash of the request>`),
//!   appended with one write each, shared by every server of a test.
//! - Each flag may come from the environment instead (`FAKE_SERVER_CRASH_AFTER`, …, see
//!   `--help`): a worker's servers inherit its environment, so a test scripts them
//!   without changing the sweep's command (which is part of the model's identity).
//! - SIGTERM: it prints how many calls are in flight, waits until none are, prints how
//!   many it received and answered, and exits 0 (a graceful server).

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use halyard_tests::fake_api::HypoTermQaRules;
use halyard_tests::{request_key, FakeOpenAi, Reply};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Answers {
    /// HypoTermQA's model under test and judge, by request content.
    Hypotermqa,
    /// The last user message, verbatim.
    Echo,
}

#[derive(Parser, Debug)]
#[command(name = "fake-server", about = "A fake model server for Halyard's managed-server tests")]
struct Args {
    #[arg(long)]
    port: u16,
    #[arg(long, value_enum, default_value = "echo")]
    answers: Answers,
    #[arg(long, default_value_t = 0, env = "FAKE_SERVER_LATENCY_MS")]
    latency_ms: u64,
    #[arg(long, env = "FAKE_SERVER_READY_AFTER_MS")]
    ready_after_ms: Option<u64>,
    #[arg(long, env = "FAKE_SERVER_NEVER_READY")]
    never_ready: bool,
    #[arg(long, env = "FAKE_SERVER_EXIT_AT_START")]
    exit_at_start: Option<i32>,
    #[arg(long, env = "FAKE_SERVER_CRASH_AFTER")]
    crash_after: Option<u64>,
    #[arg(long, env = "FAKE_SERVER_CRASH_ONCE")]
    crash_once: Option<PathBuf>,
    #[arg(long, env = "FAKE_SERVER_CALLS_LOG")]
    calls_log: Option<PathBuf>,
    #[arg(long, default_value = "fake-1.0")]
    version: String,
    /// Accepted and printed, as a real server's model argument.
    #[arg(long)]
    model: Option<String>,
}

fn fnv(text: &str) -> u64 {
    text.bytes()
        .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "fake-server[{}]: {line}", std::process::id());
    let _ = out.flush();
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    say(&format!(
        "port {} model {:?} CUDA_VISIBLE_DEVICES={:?} args {:?}",
        args.port,
        args.model,
        std::env::var("CUDA_VISIBLE_DEVICES").ok(),
        std::env::args().skip(1).collect::<Vec<_>>()
    ));
    if let Some(code) = args.exit_at_start {
        say(&format!("exiting at start with code {code}, as told"));
        return std::process::ExitCode::from(code.clamp(0, 255) as u8);
    }
    let received = Arc::new(AtomicU64::new(0));
    let counter = received.clone();
    let rules = HypoTermQaRules { garbage_percent: 10 };
    let (answers, delay) = (args.answers, Duration::from_millis(args.latency_ms));
    let (crash_after, crash_once, calls_log) =
        (args.crash_after, args.crash_once.clone(), args.calls_log.clone());
    let addr = SocketAddr::from(([127, 0, 0, 1], args.port));
    // Not ready until told below: a poll between listening and that would see a server
    // ready too early, or another version.
    let api = FakeOpenAi::start_loading_on(addr, &args.version, move |call| {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some(path) = &calls_log {
            let line = format!("{} {:016x}\n", std::process::id(), fnv(&request_key(call)));
            match std::fs::OpenOptions::new().create(true).append(true).open(path) {
                Ok(mut f) => {
                    let _ = f.write_all(line.as_bytes());
                }
                Err(e) => say(&format!("cannot append to {}: {e}", path.display())),
            }
        }
        if crash_after.is_some_and(|after| n > after) {
            let crash = match &crash_once {
                None => true,
                Some(marker) => {
                    std::fs::OpenOptions::new().write(true).create_new(true).open(marker).is_ok()
                }
            };
            if crash {
                say(&format!("crashing on call {n}, as told"));
                std::process::exit(3);
            }
        }
        let reply = match answers {
            Answers::Hypotermqa => rules.reply(call),
            Answers::Echo => {
                Reply::Text(call.messages.last().map(|(_, c)| c.clone()).unwrap_or_default())
            }
        };
        if delay.is_zero() {
            reply
        } else {
            reply.after(delay)
        }
    });
    say(&format!("listening on {}", api.addr()));
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            say(&format!("cannot start the async runtime: {e}"));
            return std::process::ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(e) => {
                    say(&format!("cannot hook SIGTERM: {e}"));
                    return std::process::ExitCode::FAILURE;
                }
            };
        if let Some(ms) = args.ready_after_ms.filter(|_| !args.never_ready) {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(ms)) => {
                    api.set_ready(true);
                    say("ready");
                }
                _ = term.recv() => return drain(&api, &received).await,
            }
        } else if !args.never_ready {
            api.set_ready(true);
            say("ready");
        }
        term.recv().await;
        drain(&api, &received).await
    })
}

/// A graceful stop: wait for the calls in flight, then exit.
async fn drain(api: &FakeOpenAi, received: &AtomicU64) -> std::process::ExitCode {
    say(&format!("SIGTERM with {} calls in flight", api.in_flight()));
    while api.in_flight() > 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    say(&format!(
        "drained: {} calls received, {} answered",
        received.load(Ordering::SeqCst),
        api.paid_calls().len()
    ));
    std::process::ExitCode::SUCCESS
}

//! `fake-api`: a fake OpenAI-compatible chat-completions server for containers and demos
//! (`deploy/compose`), standing in for a paid API. It serves [`FakeOpenAi`] with the
//! HypoTermQA rules of [`halyard_tests::fake_api`] (or an echo), a fixed latency per call,
//! and on a second port `GET /stats` (calls, distinct prompts, prompts paid for more
//! than once) and `GET /healthz`.
//!
//! ```sh
//! fake-api --listen 0.0.0.0:8080 --stats-listen 0.0.0.0:8081 --latency-ms 200
//! curl localhost:8081/stats
//! ```

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use clap::{Parser, ValueEnum};
use halyard_tests::fake_api::{HypoTermQaRules, Ledger};
use halyard_tests::{FakeOpenAi, Reply};
use serde_json::Value;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Answers {
    /// HypoTermQA's model under test and judge, by request content.
    Hypotermqa,
    /// The last user message, verbatim.
    Echo,
}

#[derive(Parser, Debug)]
#[command(name = "fake-api", about = "A fake OpenAI-compatible API for Halyard's deployment tests")]
struct Args {
    /// Address of the chat-completions API (`/v1/chat/completions`).
    #[arg(long, default_value = "0.0.0.0:8080")]
    listen: SocketAddr,
    /// Address of `/stats` and `/healthz`.
    #[arg(long, default_value = "0.0.0.0:8081")]
    stats_listen: SocketAddr,
    /// Milliseconds every call takes before it is answered.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// How the fake answers.
    #[arg(long, value_enum, default_value = "hypotermqa")]
    answers: Answers,
    /// Percent of judged terms whose first acceptance verdict is unusable prose.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=100))]
    garbage_percent: u64,
}

type SharedLedger = Arc<Mutex<Ledger>>;

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fake-api: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fake-api: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn serve(args: Args) -> Result<(), String> {
    let ledger = SharedLedger::default();
    let rules = HypoTermQaRules { garbage_percent: args.garbage_percent };
    let delay = Duration::from_millis(args.latency_ms);
    let answers = args.answers;
    let counted = Arc::clone(&ledger);
    // The ledger is filled by the responder, which runs once per request on arrival.
    let api = FakeOpenAi::start_blocking_on(args.listen, move |call| {
        counted.lock().unwrap_or_else(|p| p.into_inner()).record(call);
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
    let listener = tokio::net::TcpListener::bind(args.stats_listen)
        .await
        .map_err(|e| format!("bind {}: {e}", args.stats_listen))?;
    let app = Router::new()
        .route("/stats", get(stats))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(ledger);
    eprintln!(
        "fake-api: chat completions on {} ({:?}, latency {} ms), stats on {}",
        api.addr(),
        args.answers,
        args.latency_ms,
        args.stats_listen
    );
    // PID 1 in a container gets no default signal handling: stop on SIGTERM/SIGINT.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("hook SIGTERM: {e}"))?;
    let stop = async move {
        tokio::select! { _ = term.recv() => {}, _ = tokio::signal::ctrl_c() => {} }
    };
    axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
        .map_err(|e| format!("stats server: {e}"))?;
    drop(api);
    Ok(())
}

async fn stats(State(ledger): State<SharedLedger>) -> Json<Value> {
    Json(ledger.lock().unwrap_or_else(|p| p.into_inner()).stats())
}

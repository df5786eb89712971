//! What `halyard run` shows while it works.
//!
//! On a terminal (stdout and stderr both), and unless `--quiet` or `--log-format json`:
//! one progress bar per benchmark and model under test (items done / total, rate, ETA)
//! and a summary line (results, retries, 429s, dead letters, cost). Log lines are
//! printed above the bars (the log writer suspends them).
//!
//! Otherwise no bars: a `progress` log event per target every [`LOG_EVERY`] (human or
//! JSON, like every other log line), so that a run under nohup, CI or a log collector
//! reports the same figures.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use halyard_plan::progress::Progress;
use halyard_plan::progress::TargetProgress;
use halyard_worker::Stats;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::sync::watch;

pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// The bars' owner, when bars are drawn (set once, before logging starts).
static BARS: OnceLock<MultiProgress> = OnceLock::new();

/// Decide whether bars are drawn; call before the log subscriber is built.
pub fn init(quiet: bool, json_logs: bool) {
    if !quiet && !json_logs && std::io::stdout().is_terminal() && std::io::stderr().is_terminal() {
        let _ = BARS.set(MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(4)));
    }
}

/// stderr for the log subscriber: with bars, each line is written with the bars
/// suspended, so that logs and bars do not overwrite each other.
pub struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match BARS.get() {
            Some(mp) => mp.suspend(|| std::io::stderr().write_all(buf)).map(|_| buf.len()),
            None => std::io::stderr().write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogWriter;
    fn make_writer(&'a self) -> Self::Writer {
        LogWriter
    }
}

/// The run's log file, once the run's directory is known ([`log_to`]).
static LOG_FILE: std::sync::Mutex<Option<std::fs::File>> = std::sync::Mutex::new(None);

/// From now on, the log file layer writes to `path` (appended): `<run dir>/halyard.log`.
/// Everything at info goes there, libraries' logs (llama.cpp's model loading) included,
/// while the terminal keeps to progress and outcomes (issue 30).
pub fn log_to(path: &std::path::Path) -> std::io::Result<()> {
    let f = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    *LOG_FILE.lock().unwrap_or_else(|p| p.into_inner()) = Some(f);
    Ok(())
}

/// The log file for the subscriber's file layer: lines go nowhere until [`log_to`].
pub struct FileWriter;

impl Write for FileWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match LOG_FILE.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            Some(f) => f.write_all(buf).map(|_| buf.len()),
            None => Ok(buf.len()),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match LOG_FILE.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            Some(f) => f.flush(),
            None => Ok(()),
        }
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for FileWriter {
    type Writer = FileWriter;
    fn make_writer(&'a self) -> Self::Writer {
        FileWriter
    }
}

/// HTTP 429s seen by this process's workers.
fn rate_limited(local: &[Arc<Stats>]) -> u64 {
    local.iter().map(|s| s.rate_limited.get()).sum()
}

/// "waiting for provider batch: …" while the run's batch pools have batches out.
pub fn waiting_for_batches(groups: &[halyard_proto::provider_batch::BatchGroup]) -> Option<String> {
    let (batches, requests): (u64, u64) =
        groups.iter().fold((0, 0), |(b, r), g| (b + g.batches, r + g.requests));
    if batches == 0 {
        return None;
    }
    let oldest = groups.iter().map(|g| g.oldest_s).fold(0.0, f64::max);
    Some(format!(
        "waiting for provider batch: {requests} requests in {batches} batch{} (oldest {})",
        if batches == 1 { "" } else { "es" },
        crate::status::show::duration(oldest)
    ))
}

fn summary(p: &Progress, local: &[Arc<Stats>]) -> String {
    let retries: u64 = p.figures.costs.iter().map(|c| c.retries).sum();
    let spent = p.figures.spent();
    let mut s = format!(
        "{} results · {} retries · {} 429s · {} dead letters · ${spent:.4}",
        p.figures.results,
        retries,
        rate_limited(local),
        p.figures.dead_letters
    );
    if let Some(m) = p.figures.max_cost {
        s.push_str(&format!(" of ${m:.2}"));
    }
    if p.figures.held > 0 {
        s.push_str(&format!(" · {} held (cost limit)", p.figures.held));
    }
    for o in &p.figures.outages {
        s.push_str(&format!(" · {}", o.describe()));
    }
    if let Some(w) = waiting_for_batches(&p.figures.provider_batches) {
        s.push_str(&format!(" · {w}"));
    }
    s
}

fn target_name(t: &TargetProgress) -> String {
    format!("{} #{} {}", t.pipeline, t.bench, t.model)
}

/// Show progress until the sender side of `rx` is dropped.
pub fn spawn(
    mut rx: watch::Receiver<Progress>,
    local: Vec<Arc<Stats>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        match BARS.get() {
            Some(mp) => bars(mp, &mut rx, &local).await,
            None => logs(&mut rx, &local).await,
        }
    })
}

async fn bars(mp: &MultiProgress, rx: &mut watch::Receiver<Progress>, local: &[Arc<Stats>]) {
    let style = ProgressStyle::with_template(
        "{prefix:>28} [{bar:30.cyan/blue}] {pos}/{len} {percent:>3}% {rate:>10} ETA {eta:>4}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .with_key("rate", |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
        let _ = write!(w, "{:.1}/s", s.per_sec());
    })
    .progress_chars("=> ");
    let line = mp.add(ProgressBar::new_spinner());
    let mut per_target: Vec<ProgressBar> = Vec::new();
    loop {
        let p = rx.borrow_and_update().clone();
        if per_target.is_empty() && !p.figures.targets.is_empty() {
            for t in &p.figures.targets {
                let b = mp.insert_before(
                    &line,
                    ProgressBar::new(t.total).with_style(style.clone()).with_prefix(target_name(t)),
                );
                // Items finished by an earlier process do not count towards the rate.
                b.set_position(t.done);
                b.reset_eta();
                per_target.push(b);
            }
        }
        for (b, t) in per_target.iter().zip(&p.figures.targets) {
            b.set_position(t.done);
        }
        line.set_message(summary(&p, local));
        line.tick();
        if rx.changed().await.is_err() {
            break;
        }
    }
    for b in &per_target {
        b.abandon();
    }
    line.abandon();
}

async fn logs(rx: &mut watch::Receiver<Progress>, local: &[Arc<Stats>]) {
    let started = Instant::now();
    let mut first: Option<Vec<u64>> = None;
    let mut tick = tokio::time::interval(LOG_EVERY);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            r = rx.changed() => {
                if r.is_err() { return; }
                continue;
            }
        }
        let p = rx.borrow().clone();
        if p.figures.targets.is_empty() {
            continue;
        }
        let base =
            first.get_or_insert_with(|| p.figures.targets.iter().map(|t| t.done).collect()).clone();
        let secs = started.elapsed().as_secs_f64();
        for (t, d0) in p.figures.targets.iter().zip(base) {
            let rate = t.done.saturating_sub(d0) as f64 / secs;
            let eta = if rate > 0.0 {
                Some(crate::status::show::duration(t.total.saturating_sub(t.done) as f64 / rate))
            } else {
                None
            };
            tracing::info!(
                benchmark = t.bench,
                pipeline = %t.pipeline,
                model = %t.model,
                done = t.done,
                total = t.total,
                items_per_s = format_args!("{rate:.2}"),
                eta = eta.as_deref().unwrap_or("?"),
                "progress"
            );
        }
        tracing::info!(
            results = p.figures.results,
            retries = p.figures.costs.iter().map(|c| c.retries).sum::<u64>(),
            rate_limited = rate_limited(local),
            dead_letters = p.figures.dead_letters,
            cost_usd = format_args!("{:.4}", p.figures.spent()),
            held = p.figures.held,
            "totals"
        );
        if let Some(w) = waiting_for_batches(&p.figures.provider_batches) {
            tracing::info!("{w}");
        }
    }
}

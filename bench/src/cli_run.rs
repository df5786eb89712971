//! (c) The noop sweep as users run it: the `halyard` binary's `halyard run SWEEP`, with
//! its private nats-server (embedded) or against the benchmark's (`--nats URL`);
//! coordinator and worker in one process either way. Timed from spawn to exit (start-up
//! and report included); its peak resident set and CPU time (the process alone, not its
//! nats-server: sampled from /proc every 20 ms while it runs) and the bytes its run
//! state and checkpoint left on disk.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use halyard_broker::embedded::EmbeddedNats;

use crate::{e2e, procs};

/// One `halyard run`.
pub struct CliRun {
    pub job_batch: String,
    /// Against the benchmark's nats-server (`--nats`) rather than its own.
    pub external_nats: bool,
    pub jobs: u64,
    pub secs: f64,
    pub usage: procs::Usage,
    pub state_bytes: u64,
    pub checkpoint_bytes: u64,
    /// The most the run state and the checkpoint held on disk together while the run went
    /// (sampled every 100 ms), before their compaction at its end.
    pub peak_store_bytes: u64,
}

#[allow(clippy::too_many_arguments)] // the bench's command-line knobs, passed through
pub fn run(
    halyard: &Path,
    dir: &Path,
    jobs: u64,
    in_flight: usize,
    window: usize,
    job_batch: &str,
    external_nats: bool,
) -> anyhow::Result<CliRun> {
    std::fs::create_dir_all(dir)?;
    let sweep = e2e::write_sweep(dir, jobs, in_flight, window, job_batch)?;
    let out = dir.join("runs");
    let nats = if external_nats { Some(EmbeddedNats::start(&dir.join("nats"))?) } else { None };
    let mut cmd = Command::new(halyard);
    cmd.arg("run").arg(&sweep).arg("--out").arg(&out).args(["--metrics", "off"]);
    if let Some(n) = &nats {
        cmd.arg("--nats").arg(n.url());
        if let Some(seed) = &n.auth().nkey_seed_file {
            cmd.env("HALYARD_NATS_NKEY", seed);
        }
    }
    let log = dir.join("halyard-run.log");
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).with_context(|| format!("create {}", log.display()))?);
    let started = Instant::now();
    let child = procs::spawn_tied(cmd).with_context(|| format!("spawn {}", halyard.display()))?;
    // Sampled from /proc while it runs: wait4's figures would fold in its nats-server's.
    let pid = child.id();
    let done = Arc::new(AtomicBool::new(false));
    let run_dir = out.join("noop-bench");
    let sampler = {
        let done = done.clone();
        let run_dir = run_dir.clone();
        std::thread::spawn(move || {
            let mut last = procs::Usage::default();
            let mut peak_store = 0u64;
            let mut tick = 0u64;
            while !done.load(Ordering::Relaxed) {
                if let (Some(rss), Some(cpu)) = (procs::peak_rss(pid), procs::cpu_seconds(pid)) {
                    last = procs::Usage { max_rss: rss, cpu_s: cpu };
                }
                // The stores' room while the run goes (a walk of two directories, every
                // fifth sample); a file removed mid-walk counts as nothing.
                if tick.is_multiple_of(5) {
                    let now: u64 = ["state", "checkpoint"]
                        .iter()
                        .map(|s| procs::disk_bytes(&run_dir.join(s)).unwrap_or(0))
                        .sum();
                    peak_store = peak_store.max(now);
                }
                tick += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            (last, peak_store)
        })
    };
    let (status, _) = procs::reap(child)?;
    let secs = started.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    let (usage, peak_store_bytes) = sampler.join().unwrap_or_default();
    drop(nats);
    if !status.success() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(20).collect();
        bail!(
            "halyard run failed ({status}); log {}:\n{}",
            log.display(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    e2e::check_report(&run_dir.join("report.json"), jobs)?;
    Ok(CliRun {
        job_batch: job_batch.to_string(),
        external_nats,
        jobs,
        secs,
        usage,
        state_bytes: procs::disk_bytes(&run_dir.join("state"))?,
        checkpoint_bytes: procs::disk_bytes(&run_dir.join("checkpoint"))?,
        peak_store_bytes,
    })
}

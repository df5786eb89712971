//! `cache`: what the machine result cache (issue 51) costs a job, split into the job's
//! own path and the background writer.
//!
//! Drives [`halyard_cache::Cache`] as a worker does for a job that misses: `lookup`
//! (read-write policy, a noop-shaped job key), then `remember` of its completion, for
//! `--jobs` new jobs on a fresh cache directory, and the same loop with the cache off.
//! Prints, per job:
//!
//! - **job path**: CPU time of the calling thread with the cache on, minus with it off
//!   (the lookup that misses, encoding the entry and queueing it): what the cache adds
//!   to the job's latency and to the worker's own thread;
//! - **writer**: CPU time of the process's other threads (the writer thread's SQLite
//!   inserts, committed in groups): what the cache costs the machine, off the job's path;
//! - the rows written, dropped, and the file's bytes per entry.
//!
//! The caller waits for the writer every `--group` jobs (a flush), so that no write is
//! dropped however fast the loop runs (a real run's jobs come far slower than this loop)
//! and the writer commits groups of that size, as it does at a noop run's rate.
//!
//! `cargo run --release -p halyard-bench --bin cache -- [--jobs 1000000] [--group 15000]`
//!
//! `--shared`: the shared tier instead, as a worker reads it, on a nats-server of its own
//! (the `nats-server` on `PATH`): per lookup, the job path's CPU time and wall time of a
//! miss once the reader follows the bucket's keys (no round trip), and of a lookup that
//! asks the broker (a job the bucket holds: what every miss cost before the reader
//! followed the keys).

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use halyard_cache::{Cache, Found, Limits, Policy};
use halyard_proto::{ChatMessage, JobKey, ModelRef, Sampling};

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
struct Args {
    /// New jobs to look up and remember.
    #[arg(long, default_value_t = 1_000_000)]
    jobs: u32,
    /// Jobs between flushes (the writer's group size); below the writer's queue (16,384).
    #[arg(long, default_value_t = 15_000)]
    group: u32,
    /// Measure the shared tier's lookups instead (see the module's text).
    #[arg(long)]
    shared: bool,
}

/// A job as the noop pipeline makes them.
fn key(i: u32) -> JobKey {
    JobKey {
        pipeline: "noop".into(),
        stage: "answer".into(),
        stage_version: 1,
        model: ModelRef { backend: "noop".into(), endpoint: String::new(), model: "noop".into() },
        messages: vec![ChatMessage::user(format!("noop item {i}"))],
        sampling: Sampling::default(),
        sample_index: 0,
    }
}

fn cpu(clock: libc::clockid_t) -> Duration {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid timespec for clock_gettime to fill.
    unsafe { libc::clock_gettime(clock, &mut t) };
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

struct Pass {
    thread: Duration,
    process: Duration,
    wall: Duration,
}

/// Look up and remember `jobs` new jobs through `cache`; CPU of this thread and of the
/// whole process, and wall time, until the last write is committed.
async fn pass(cache: &Cache, args: &Args) -> anyhow::Result<Pass> {
    let (t0, p0, w0) =
        (cpu(libc::CLOCK_THREAD_CPUTIME_ID), cpu(libc::CLOCK_PROCESS_CPUTIME_ID), Instant::now());
    let c = halyard_worker::backend::noop::answer();
    for i in 0..args.jobs {
        let k = key(i);
        let id = k.id();
        match cache.lookup(&k, &id, Policy::ReadWrite).await {
            Found::Call(_) => {}
            other => anyhow::bail!("job {i} of a fresh cache: {other:?}, not a miss"),
        }
        cache.remember(&k, &id, &c, Policy::ReadWrite);
        if (i + 1) % args.group == 0 {
            if let Some(m) = cache.machine() {
                m.flush().await;
            }
        }
    }
    if let Some(m) = cache.machine() {
        m.flush().await;
    }
    Ok(Pass {
        thread: cpu(libc::CLOCK_THREAD_CPUTIME_ID) - t0,
        process: cpu(libc::CLOCK_PROCESS_CPUTIME_ID) - p0,
        wall: w0.elapsed(),
    })
}

/// `n` lookups of jobs `from..from + n` through `cache` (read only), each expected to
/// be an answer (`hit`) or a miss: CPU of this thread and wall time per lookup, in µs.
async fn lookups(cache: &Cache, from: u32, n: u32, hit: bool) -> anyhow::Result<(f64, f64)> {
    let (t0, w0) = (cpu(libc::CLOCK_THREAD_CPUTIME_ID), Instant::now());
    for i in from..from + n {
        let k = key(i);
        let found = cache.lookup(&k, &k.id(), Policy::Read).await;
        anyhow::ensure!(
            matches!(found, Found::Answer(..)) == hit,
            "job {i}: {found:?}, expected {}",
            if hit { "an answer" } else { "a miss" }
        );
    }
    let per = |d: Duration| d.as_secs_f64() * 1e6 / f64::from(n);
    Ok((per(cpu(libc::CLOCK_THREAD_CPUTIME_ID) - t0), per(w0.elapsed())))
}

/// The shared tier's lookups (`--shared`).
async fn shared(args: &Args) -> anyhow::Result<()> {
    use halyard_cache::shared::{SharedReader, SharedWriter};
    let nats = halyard_tests::NatsServer::start();
    let connect = |name: &'static str| {
        let config = halyard_broker::BrokerConfig::new(nats.url(), name);
        async move { halyard_broker::connect(&config).await }
    };
    let writer = SharedWriter::open(&connect("coordinator").await?).await?;
    let held = args.jobs.min(20_000);
    let c = halyard_worker::backend::noop::answer();
    let run = uuid::Uuid::now_v7();
    for i in 0..held {
        anyhow::ensure!(writer.put(run, key(i).id(), &c).await, "put {i} refused");
    }
    let reader = SharedReader::new(connect("worker").await?);
    let cache = Cache::off().with_shared(reader.clone());
    // The first lookup opens the bucket and starts the watch of its keys.
    lookups(&cache, 0, 1, true).await?;
    let t0 = Instant::now();
    while !reader.follows_keys() {
        anyhow::ensure!(t0.elapsed() < Duration::from_secs(60), "the watch never caught up");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let asked = reader.round_trips();
    let (miss_cpu, miss_wall) = lookups(&cache, 10_000_000, args.jobs, false).await?;
    let misses_asked = reader.round_trips() - asked;
    let (hit_cpu, hit_wall) = lookups(&cache, 0, held, true).await?;
    println!(
        "shared result cache, {} lookups that miss, {held} that ask the broker (a bucket of {held} entries)",
        args.jobs
    );
    println!("{:<46} {:>12} {:>12}", "per lookup, this thread", "CPU µs", "wall µs");
    println!(
        "{:<46} {:>12.2} {:>12.2}",
        "miss, keys followed (no round trip)", miss_cpu, miss_wall
    );
    println!("{:<46} {:>12.2} {:>12.2}", "asks the broker (every miss before)", hit_cpu, hit_wall);
    println!("misses that asked the broker (filter false positives): {misses_asked}");
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.group > 0 && args.group < 16_000, "--group must be 1..16000");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    if args.shared {
        return rt.block_on(shared(&args));
    }
    rt.block_on(async {
        let dir = tempfile::tempdir()?;
        let off = pass(&Cache::off(), &args).await?;
        let cache = Cache::open_machine(Some(dir.path()), Limits::default());
        let m = cache.machine().context("the machine cache did not open")?.clone();
        let on = pass(&cache, &args).await?;
        let stats = m.stats()?;
        let (written, dropped) = (m.written(), m.dropped());
        cache.close().await;
        let n = f64::from(args.jobs);
        let us = |d: Duration| d.as_secs_f64() * 1e6 / n;
        let path = us(on.thread.saturating_sub(off.thread));
        let writer = us(on.process.saturating_sub(on.thread));
        println!("machine result cache, {} new jobs, groups of {}", args.jobs, args.group);
        println!("{:<34} {:>10}", "", "µs/job");
        println!("{:<34} {:>10.2}", "job path (lookup miss + remember)", path);
        println!("{:<34} {:>10.2}", "writer (other threads)", writer);
        println!("{:<34} {:>10.2}", "total", path + writer);
        println!("{:<34} {:>10.2}", "loop without the cache", us(off.thread));
        println!(
            "wall: {:.1} s with the cache, {:.1} s without",
            on.wall.as_secs_f64(),
            off.wall.as_secs_f64()
        );
        println!(
            "rows written {written}, dropped {dropped}, {} B/entry live",
            stats.live_bytes / stats.entries.max(1)
        );
        anyhow::ensure!(
            written == u64::from(args.jobs) && dropped == 0,
            "not every row was written"
        );
        Ok(())
    })
}

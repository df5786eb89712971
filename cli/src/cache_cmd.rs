//! `halyard cache stats | prune | export | import`: the result cache on this machine
//! (issue 51; docs/src/guide/result-cache.md).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use halyard_cache::shared::SharedStats;
use halyard_cache::{exchange, Limits, MachineCache};

use crate::nats_args::NatsAuthArgs;

// Parsed once per process: the size of its largest variant (the broker flags) costs
// nothing.
#[allow(clippy::large_enum_variant)]
#[derive(clap::Subcommand)]
pub enum CacheCmd {
    /// What the cache holds: entries, bytes, entries per model; with --nats, also the
    /// shared bucket on that broker (entries, bytes of its limit, the oldest entry's age),
    /// or only that bucket with `--cache off`.
    Stats {
        /// As JSON.
        #[arg(long)]
        json: bool,
        /// Also the shared result cache on this broker (as the `halyard-status` user
        /// unless --nats-user says otherwise).
        #[arg(long)]
        nats: Option<String>,
        #[command(flatten)]
        nats_auth: NatsAuthArgs,
    },
    /// Remove entries unused for --max-age-days, then the least recently used down to
    /// --max-gb; never one used in the last --min-age-hours (a live run's).
    Prune {
        #[arg(long, default_value_t = 10.0)]
        max_gb: f64,
        #[arg(long, default_value_t = 180.0)]
        max_age_days: f64,
        #[arg(long, default_value_t = 1.0)]
        min_age_hours: f64,
    },
    /// Write every entry to FILE (JSON Lines that `backend = "replay"` also reads).
    Export { file: PathBuf },
    /// Add the entries of an export to this machine's cache (each checked against its id).
    Import { file: PathBuf },
}

fn open() -> Result<MachineCache> {
    let Some(dir) = halyard_cache::machine_dir(None) else {
        bail!("the result cache is off (--cache off / HALYARD_CACHE=off), or no cache directory is known: give --cache DIR");
    };
    Ok(MachineCache::open(&dir, Limits::default())?)
}

fn secs(x: f64, unit: f64, flag: &str) -> Result<Duration> {
    if !(x.is_finite() && x >= 0.0) {
        bail!("--{flag} {x}: expected a number of at least 0");
    }
    Ok(Duration::from_secs_f64(x * unit))
}

/// The shared bucket's figures on the broker at `url`; `None` when no coordinator made it.
async fn shared_stats(url: &str, auth: &NatsAuthArgs) -> Result<Option<SharedStats>> {
    let broker = halyard_broker::connect(
        &halyard_broker::BrokerConfig::new(url.to_string(), "halyard-status")
            .with_auth(auth.auth()),
    )
    .await
    .with_context(|| format!("connecting to the broker at {url}"))?;
    Ok(halyard_cache::shared::stats(&broker).await?)
}

fn print_shared(url: &str, s: Option<&SharedStats>) {
    let Some(s) = s else {
        println!("shared result cache on {url}: none yet (a coordinator makes it)");
        return;
    };
    let pct = if s.max_bytes > 0 { s.bytes as f64 * 100.0 / s.max_bytes as f64 } else { 0.0 };
    println!("shared result cache {} on {url}", s.bucket);
    println!("  entries     {}", s.entries);
    println!("  bytes       {} of {} ({pct:.1}%)", s.bytes, s.max_bytes);
    if let Some(age) = s.oldest_s {
        println!("  oldest      written or used {:.1} days ago", age as f64 / 86400.0);
    }
    println!("  when full   {}", s.when_full);
    println!("  replicas    {}", s.replicas);
}

pub async fn run(cmd: CacheCmd) -> Result<u8> {
    if let CacheCmd::Stats { json, nats: Some(url), nats_auth } = &cmd {
        if halyard_cache::machine_dir(None).is_none() {
            // No cache on this machine (`--cache off`): the shared bucket alone.
            let shared = shared_stats(url, nats_auth).await?;
            if *json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({ "shared": shared }))?
                );
            } else {
                print_shared(url, shared.as_ref());
            }
            return Ok(0);
        }
    }
    let cache = open()?;
    match cmd {
        CacheCmd::Stats { json, nats, nats_auth } => {
            let s = cache.stats()?;
            let shared = match &nats {
                Some(url) => Some(shared_stats(url, &nats_auth).await?),
                None => None,
            };
            if json {
                let mut v = serde_json::to_value(&s)?;
                if let Some(shared) = &shared {
                    v["shared"] = serde_json::to_value(shared)?;
                }
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!("result cache {}", s.dir);
                println!("  entries     {}", s.entries);
                println!("  live bytes  {}", s.live_bytes);
                println!("  file bytes  {}", s.file_bytes);
                for (model, n) in &s.by_model {
                    println!("  {n:>10}  {model}");
                }
                if let (Some(url), Some(shared)) = (&nats, &shared) {
                    print_shared(url, shared.as_ref());
                }
            }
        }
        CacheCmd::Prune { max_gb, max_age_days, min_age_hours } => {
            if !(max_gb.is_finite() && max_gb >= 0.0) {
                bail!("--max-gb {max_gb}: expected a number of at least 0");
            }
            let limits = Limits {
                max_bytes: (max_gb * (1u64 << 30) as f64) as u64,
                max_age: secs(max_age_days, 86400.0, "max-age-days")?,
                min_age: secs(min_age_hours, 3600.0, "min-age-hours")?,
            };
            let p = cache.prune(limits)?;
            println!(
                "pruned {} entries: {} live bytes before, {} after",
                p.removed, p.live_bytes_before, p.live_bytes_after
            );
            if p.kept_recent > 0 {
                println!("{} entries used in the last {min_age_hours} h were kept although the cache is over {max_gb} GB", p.kept_recent);
            }
        }
        CacheCmd::Export { file } => {
            let n = exchange::export(&cache, &file)
                .with_context(|| format!("exporting the result cache to {}", file.display()))?;
            println!("{n} entries written to {}", file.display());
        }
        CacheCmd::Import { file } => {
            let i = exchange::import(&cache, &file)?;
            println!(
                "{}: {} lines, {} new entries, {} refused",
                file.display(),
                i.lines,
                i.new,
                i.refused.len()
            );
            if !i.refused.is_empty() {
                cache.close().await;
                return Ok(1);
            }
        }
    }
    cache.close().await;
    Ok(0)
}

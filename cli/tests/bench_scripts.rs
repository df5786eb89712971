//! The bench scripts (bench/scripts) run, on a small N, with the binary the tests built:
//! their numbers are measured on a release build by hand (docs/src/performance.md), but
//! a script that no longer runs (a renamed flag, a changed `cache stats` field) must fail
//! here, not on the day someone measures.

use std::process::Command;

use crate::common::repo_root;

fn script(name: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let mut c = Command::new(repo_root().join("bench/scripts").join(name));
    c.arg(env!("CARGO_BIN_EXE_halyard")).args(args);
    c.env("PATH", format!("{}:/usr/sbin", std::env::var("PATH").unwrap_or_default()));
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().unwrap_or_else(|e| panic!("bench/scripts/{name}: {e}"));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "bench/scripts/{name} {args:?} failed:\n{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// `cache-cost` runs each policy, writes every result with `read-write` (the entries
/// column), and prints the ratio of the medians.
#[test]
fn cache_cost_runs_and_counts_every_entry() {
    let out = script("cache-cost", &["300", "1"], &[("POLICIES", "off read-write")]);
    let rows: Vec<Vec<&str>> = out
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .filter(|r: &Vec<&str>| r.first() == Some(&"1"))
        .collect();
    assert_eq!(rows.len(), 2, "one row per policy:\n{out}");
    let rw = rows.iter().find(|r| r[1] == "read-write").expect("a read-write row");
    assert_eq!(rw.last(), Some(&"300"), "every result written to the cache:\n{out}");
    let per_entry: u64 = rw[5].parse().unwrap_or_else(|_| panic!("bytes per entry: {out}"));
    assert!((100..2000).contains(&per_entry), "{per_entry} bytes per entry:\n{out}");
    for name in ["wall", "cpu"] {
        assert!(
            out.lines()
                .any(|l| l.starts_with(&format!("median {name}: off ")) && l.contains(", ratio ")),
            "no {name} ratio:\n{out}"
        );
    }
}

/// `bytes-per-job` prints one row per N with the stores' bytes per job.
#[test]
fn bytes_per_job_runs_and_prints_a_row_per_size() {
    let out = script("bytes-per-job", &["500", "1500"], &[("HALYARD_CACHE", "off")]);
    for n in ["500", "1500"] {
        let row: Vec<&str> = out
            .lines()
            .find(|l| l.split_whitespace().next() == Some(n))
            .unwrap_or_else(|| panic!("no row for {n} jobs:\n{out}"))
            .split_whitespace()
            .collect();
        let after: f64 = row[4].parse().unwrap_or_else(|_| panic!("after_B/job of {n}: {out}"));
        assert!(after > 0.0, "{out}");
    }
}

/// `cache-cost` with `SHARED=1` runs each policy on a broker of its own (the shared tier
/// written by the coordinator, read by the worker), adds the broker's CPU time and counts
/// the bucket's entries.
#[test]
fn cache_cost_measures_the_shared_tier() {
    let out = script("cache-cost", &["300", "1"], &[("POLICIES", "off shared"), ("SHARED", "1")]);
    for policy in ["off", "shared"] {
        let row: Vec<&str> = out
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|r| r.first() == Some(&"1") && r.get(1) == Some(&policy))
            .unwrap_or_else(|| panic!("no {policy} row:\n{out}"));
        let cpu: f64 = row[3].parse().unwrap_or_else(|_| panic!("cpu of {policy}: {out}"));
        assert!(cpu > 0.0, "{out}");
        // The bucket's entries: none without the cache, every result shared with it.
        let want = if policy == "off" { "0" } else { "300" };
        assert_eq!(row.last(), Some(&want), "{policy}: bucket entries:\n{out}");
    }
    assert!(out.contains("median cpu: off "), "{out}");
}

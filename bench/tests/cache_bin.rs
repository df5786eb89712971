//! The `cache` benchmark (`src/bin/cache.rs`) runs on a small N: its numbers are taken on
//! a release build by hand (docs/src/performance.md), but a benchmark that no longer runs
//! must fail here, not on the day someone measures.

/// Every row is written, none dropped, and the cost lines are printed.
#[test]
fn the_cache_benchmark_runs_and_writes_every_row() {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_cache"))
        .args(["--jobs", "3000", "--group", "1000"])
        .output()
        .expect("the cache benchmark starts");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}\n{}", String::from_utf8_lossy(&o.stderr));
    for line in ["job path (lookup miss + remember)", "writer (other threads)", "total"] {
        assert!(out.contains(line), "no {line:?} line:\n{out}");
    }
    assert!(out.contains("rows written 3000, dropped 0"), "{out}");
}

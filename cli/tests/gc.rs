//! A complete run compacts its stores as it ends, and `halyard gc` compacts stores on
//! demand: both measured on the files, through the binary.

mod common;

use std::path::Path;

use common::{halyard, noop_sweep};

fn bytes(store: &Path) -> u64 {
    halyard_store::disk_bytes(&store.join(halyard_store::FILE)).expect("store file")
}

/// A run whose stores flushed and merged their logs many times (a merge every 200
/// records; with 10,000 jobs, both stores hold room before they are compacted) ends with both stores compacted: `halyard gc` afterwards finds both and has
/// nothing left to return. Its output names each store, and a path without a store is an
/// error naming it.
#[test]
fn a_complete_run_leaves_its_stores_compacted() {
    let dir = tempfile::tempdir().unwrap();
    let sweep = noop_sweep(dir.path(), "gc", 10000);
    let out = dir.path().join("out");
    let run = halyard()
        .env(halyard_store::logged::MERGE_AT_ENV, "200")
        .args(["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "halyard run failed:\n{log}");
    assert!(
        log.contains("compacted") && log.contains("run state") && log.contains("checkpoint"),
        "the run's log says nothing of compacting both stores:\n{log}"
    );
    let run_dir = out.join("gc");
    let (state, checkpoint) = (run_dir.join("state"), run_dir.join("checkpoint"));
    let before = (bytes(&state), bytes(&checkpoint));

    let gc = halyard().args(["gc", run_dir.to_str().unwrap()]).output().unwrap();
    let said = String::from_utf8_lossy(&gc.stdout);
    assert!(
        gc.status.success(),
        "halyard gc failed:\n{said}{}",
        String::from_utf8_lossy(&gc.stderr)
    );
    for store in [&state, &checkpoint] {
        assert!(said.contains(&format!("compacted {}: ", store.display())), "{said}");
    }
    assert!(said.contains("2 of 2 store(s) compacted"), "{said}");
    assert_eq!(
        (bytes(&state), bytes(&checkpoint)),
        before,
        "gc returned room the run left behind (run state, checkpoint):\n{said}"
    );

    let missing = dir.path().join("no-such-run");
    let gc = halyard().args(["gc", missing.to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&gc.stderr);
    assert!(!gc.status.success() && err.contains("no-such-run"), "{err}");
}

//! Power loss (issue 50, item 4): the crash tests' child (`store_crash`) writes a worker
//! checkpoint and a run state with a layer preloaded into it (`power_loss_shim.c`, built
//! here with the system's C compiler) that keeps, for each file, a copy of what its last
//! completed fsync or fdatasync made durable. The child is killed at a random moment; then
//! every file is given its last synced copy, and a file never synced loses every byte:
//! every write after the last completed sync of its file is discarded, as a power loss
//! may. Every record the child acknowledged (its `put` or `flush` returned) must still be
//! there, intact, and every record there must decode.
//!
//! Removing the journal's sync from `halyard_store::Store::persist` (the engine's
//! `SyncAll`) makes this test fail: acknowledged records are lost (checked by hand when
//! the test was written, issue 50).
//!
//! The model keeps the names of files as the child left them (creations, renames and
//! removals are not rolled back; file systems journal them, and the engine syncs its
//! directories after them): it discards data, not names.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::store_crash::{run_child, verify};

/// Build the layer into `dir`; its path.
fn build_shim(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/power_loss_shim.c");
    let out = dir.join("power_loss_shim.so");
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&out)
        .arg(&src)
        .args(["-ldl", "-lpthread"])
        .status()
        .expect("a C compiler (cc) builds the power-loss layer: scripts/setup --tests installs it");
    assert!(status.success(), "cc failed on {}", src.display());
    out
}

/// Give every file under `root` what its last sync made durable (`shadow/<inode>`), or
/// nothing if it was never synced.
fn lose_power(root: &Path, shadow: &Path) -> (usize, usize) {
    let (mut restored, mut emptied) = (0, 0);
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                stack.push(p);
                continue;
            }
            let synced = shadow.join(m.ino().to_string());
            if synced.is_file() {
                // In place: the inode (the layer's key) stays the file's.
                let bytes = std::fs::read(&synced).unwrap();
                std::fs::write(&p, bytes).unwrap();
                restored += 1;
            } else {
                std::fs::File::create(&p).unwrap();
                emptied += 1;
            }
        }
    }
    (restored, emptied)
}

#[test]
fn power_loss_keeps_every_acknowledged_record() {
    let iterations: u64 =
        std::env::var("HALYARD_POWER_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(6);
    let work = tempfile::tempdir().unwrap();
    let shim = build_shim(work.path());
    let mut rng =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
            as u64
            | 1;
    let (mut acked_cp, mut acked_st) = (0, 0);
    for it in 0..iterations {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        // A fresh run each time, cut at a different point of it.
        let dir = work.path().join(format!("run{it}"));
        let shadow = work.path().join(format!("shadow{it}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all(&shadow).unwrap();
        let root = dir.canonicalize().unwrap();
        let acked = run_child(
            &dir,
            0,
            Duration::from_millis(400 + rng % 1600),
            &[
                ("LD_PRELOAD", shim.as_os_str()),
                ("HALYARD_POWER_ROOT", root.as_os_str()),
                ("HALYARD_POWER_SHADOW", shadow.as_os_str()),
            ],
        );
        let (restored, emptied) = lose_power(&root, &shadow);
        println!(
            "power loss {it}: {} checkpoint records and {} results acknowledged; {restored} files as last synced, \
             {emptied} never synced emptied",
            acked.checkpoint.len(),
            acked.state.len()
        );
        verify(&dir, &acked.checkpoint, &acked.state, 10_000_000);
        acked_cp += acked.checkpoint.len();
        acked_st += acked.state.len();
    }
    // The cuts landed in the run, not before it.
    assert!(acked_cp > 0 && acked_st > 0, "nothing acknowledged before the cuts");
    println!(
        "power loss: {iterations} cuts, {acked_cp} acknowledged checkpoint records and {acked_st} results, 0 lost"
    );
}

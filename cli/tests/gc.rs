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
    for store in ["\"run state\"", "\"checkpoint\""] {
        assert!(
            log.lines().any(|l| l.contains(" compacted ") && l.contains(store)),
            "the run's log does not say it compacted the {store}:\n{log}"
        );
    }
    assert!(!log.contains("compacting failed"), "{log}");
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

const T: halyard_store::Table = halyard_store::table("t");
const RECORDS: u32 = 150_000;

/// The value of record `i`.
fn value(i: u32) -> Vec<u8> {
    let mut v = i.to_le_bytes().repeat(75);
    v[0] ^= 0x5a;
    v
}

/// A store of `RECORDS` records written in many commits, four of every five then
/// removed: a file of about 90 MB, four fifths of it room to return.
fn store_with_room(dir: &Path) {
    use halyard_store::redb::Durability;
    let db = halyard_store::open(dir, 16 << 20, &[T]).unwrap();
    for chunk in (0..RECORDS).collect::<Vec<_>>().chunks(500) {
        let mut tx = db.begin_write().unwrap();
        tx.set_durability(Durability::None).unwrap();
        {
            let mut t = tx.open_table(T).unwrap();
            for &i in chunk {
                t.insert(&i.to_be_bytes()[..], &value(i)[..]).unwrap();
            }
        }
        tx.commit().unwrap();
    }
    let tx = db.begin_write().unwrap();
    {
        let mut t = tx.open_table(T).unwrap();
        for i in (0..RECORDS).filter(|i| i % 5 != 0) {
            t.remove(&i.to_be_bytes()[..]).unwrap();
        }
    }
    tx.commit().unwrap();
}

/// Every record kept is there with its value, and no removed one came back.
fn verify(dir: &Path, what: &str) {
    use halyard_store::redb::{ReadableDatabase, ReadableTableMetadata};
    let db = halyard_store::open(dir, 16 << 20, &[T])
        .unwrap_or_else(|e| panic!("{what}: the store does not open: {e}"));
    let tx = db.begin_read().unwrap();
    let t = tx.open_table(T).unwrap();
    assert_eq!(t.len().unwrap(), u64::from(RECORDS / 5), "{what}: records");
    for i in (0..RECORDS).step_by(5) {
        let got = t.get(&i.to_be_bytes()[..]).unwrap().map(|v| v.value().to_vec());
        assert_eq!(got, Some(value(i)), "{what}: record {i}");
    }
}

fn copy_store(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for f in [halyard_store::FILE, halyard_proto::store_mark::MARK_FILE] {
        std::fs::copy(from.join(f), to.join(f)).unwrap();
    }
}

/// `halyard gc` killed with SIGKILL at moments spread over its run, some in the middle of
/// its compaction, leaves a store that opens (integrity check included) with every
/// record as it was; a gc run to the end afterwards returns the room.
#[test]
fn gc_killed_mid_compaction_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("template");
    store_with_room(&template);
    let full = bytes(&template);

    // One gc to the end, timed: the first kills are spread over its length.
    let timed = dir.path().join("timed");
    copy_store(&template, &timed);
    let started = std::time::Instant::now();
    let gc = halyard().args(["gc", timed.to_str().unwrap()]).output().unwrap();
    let length = started.elapsed();
    assert!(gc.status.success(), "{}", String::from_utf8_lossy(&gc.stderr));
    let compacted = bytes(&timed);
    assert!(compacted * 3 < full, "gc returned too little: {full} -> {compacted} bytes");
    verify(&timed, "after gc");

    // Kills at a quarter, a half and three quarters of its length (wherever they land:
    // start-up, the integrity check, the compaction), then kills the moment the file is
    // seen partly cut, until three of those found gc still in the middle of its
    // compaction (the file left between its full and its compacted size). Every killed
    // store must open whole.
    let midway = |size: u64| size > compacted + (1 << 20) && size + (1 << 20) < full;
    let mut mid_kills = 0;
    for k in 0..30u32 {
        let store = dir.path().join(format!("killed-{k}"));
        copy_store(&template, &store);
        let file = store.join(halyard_store::FILE);
        let mut child = halyard().args(["gc", store.to_str().unwrap()]).spawn().unwrap();
        let when = if k < 3 {
            std::thread::sleep(length * (k + 1) / 4);
            format!("after {:?}", length * (k + 1) / 4)
        } else {
            while child.try_wait().unwrap().is_none()
                && !midway(halyard_store::disk_bytes(&file).unwrap_or(full))
            {
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            "when the file was seen partly cut".to_string()
        };
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let size = bytes(&store);
        mid_kills += u32::from(k >= 3 && midway(size));
        let what = format!("gc killed {when} ({size} bytes)");
        verify(&store, &what);
        let gc = halyard().args(["gc", store.to_str().unwrap()]).output().unwrap();
        assert!(
            gc.status.success(),
            "{what}: gc afterwards: {}",
            String::from_utf8_lossy(&gc.stderr)
        );
        assert!(bytes(&store) * 3 < full, "{what}: gc afterwards returned too little");
        verify(&store, &format!("{what}, then gc"));
        if mid_kills == 3 {
            break;
        }
    }
    assert_eq!(mid_kills, 3, "kills in the middle of a compaction, of 27 tries");
}

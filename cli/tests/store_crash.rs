//! Crash tests of the stores (in the style of sled's crash tests; Halyard used sled before
//! redb and fjall): a supervisor runs a workload as a child
//! process (this test binary, re-executed), kills it with SIGKILL at a random moment,
//! reopens the stores and checks the invariants:
//! - every worker checkpoint record and every coordinator result the child reported as
//!   durable (its `put`/`flush` returned) is there, intact;
//! - every record that is there decodes and holds what was written for its id (no torn
//!   or mixed-up record).
//!
//! The child's stores flush their memtables at 64 KiB (`HALYARD_STORE_MEMTABLE_BYTES`),
//! so kills also land in the middle of the engine's flushes and compactions.
//!
//! Iterations accumulate in the same stores. CI runs a few (`store_crash_loop`); the
//! benchmark runs many: `HALYARD_CRASH_ITERS=200 cargo test --release -p halyard --test
//! cli store_crash::store_crash_loop -- --nocapture` prints the figures.
//!
//! Then damaged stores: files overwritten or truncated give an error naming the store,
//! never a panic.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use halyard_coordinator::state::RunDb;
use halyard_proto::{Completion, JobId, JobResult, Outcome, StoredResult, Usage};
use halyard_worker::Checkpoint;

const CHILD_DIR: &str = "HALYARD_STORE_CRASH_DIR";
const CHILD_START: &str = "HALYARD_STORE_CRASH_START";

fn id(i: u64) -> JobId {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&i.to_be_bytes());
    b[8..].copy_from_slice(&(!i).to_be_bytes());
    JobId(b)
}

fn index_of(job: &JobId) -> Option<u64> {
    let i = u64::from_be_bytes(job.0[..8].try_into().ok()?);
    (job.0[8..] == (!i).to_be_bytes()).then_some(i)
}

fn completion(i: u64) -> Completion {
    // Sizes vary so that records straddle pages now and then.
    Completion {
        text: format!("completion {i} {}", "x".repeat((i % 97) as usize * 40)),
        usage: Usage { prompt_tokens: i, completion_tokens: i / 2, cache: None },
        latency_ms: i % 1000,
        finish_reason: Some("stop".into()),
        calls: 1,
        logprobs: None,
        refusal: false,
        source: Default::default(),
    }
}

fn result(i: u64) -> JobResult {
    JobResult {
        v: halyard_proto::WIRE_VERSION,
        job: id(i),
        run: uuid::Uuid::nil(),
        outcome: Outcome::Done(completion(i)),
        deliveries: 1,
        worker: "crash-child".into(),
        cached: false,
    }
}

/// The child's workload (only when started by the supervisor): 16 concurrent writers
/// to the checkpoint (group commit) and a result writer to the run state, each line of
/// stdout naming a record once it is durable.
#[test]
fn store_crash_child() {
    let (Some(dir), Some(start)) = (std::env::var_os(CHILD_DIR), std::env::var(CHILD_START).ok())
    else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let start: u64 = start.parse().unwrap();
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let cp = Checkpoint::open(&dir.join("checkpoint")).unwrap();
        let mut tasks = Vec::new();
        for w in 0..16u64 {
            let cp = cp.clone();
            tasks.push(tokio::spawn(async move {
                for k in 0.. {
                    let i = start + k * 16 + w;
                    cp.put(id(i), &completion(i)).await.unwrap();
                    println!("cp {i}");
                }
            }));
        }
        let state = RunDb::open(&dir.join("state")).unwrap();
        for k in 0.. {
            let i = start + k;
            state.insert_result(&result(i)).unwrap();
            if k % 8 == 7 {
                state.flush().await.unwrap();
                for j in i - 7..=i {
                    println!("st {j}");
                }
            }
        }
    });
}

pub(crate) struct Acked {
    pub(crate) checkpoint: Vec<u64>,
    pub(crate) state: Vec<u64>,
}

/// Run the child workload on the stores in `dir` (with `env` besides), kill it after
/// `kill_after` (counted from its first record) and return what it acknowledged.
pub(crate) fn run_child(
    dir: &Path,
    start: u64,
    kill_after: Duration,
    env: &[(&str, &std::ffi::OsStr)],
) -> Acked {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", "store_crash::store_crash_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_DIR, dir)
        .env(CHILD_START, start.to_string())
        // Memtables flushed every few hundred records, so kills land in flushes and
        // compactions too.
        .env(halyard_store::MEMTABLE_ENV, "65536")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = halyard_tests::ChildGuard::spawn(c);
    let out = child.child_mut().stdout.take().unwrap();
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = lines.clone();
    let reader = std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(l);
        }
    });
    // Kill once it has written for a while (random), counted from its first record.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !lines.lock().unwrap().iter().any(|l| l.starts_with("cp ") || l.starts_with("st ")) {
        assert!(Instant::now() < deadline, "the child wrote nothing");
        assert!(child.try_wait().is_none(), "the child exited early");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(kill_after);
    child.kill();
    reader.join().unwrap();
    let lines = lines.lock().unwrap();
    let pick = |p: &str| {
        lines
            .iter()
            .filter_map(|l| l.strip_prefix(p))
            .filter_map(|n| n.parse().ok())
            .collect::<Vec<u64>>()
    };
    Acked { checkpoint: pick("cp "), state: pick("st ") }
}

pub(crate) fn verify(
    dir: &Path,
    all_cp: &[u64],
    all_st: &[u64],
    tried_up_to: u64,
) -> (usize, usize) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let cp = Checkpoint::open(&dir.join("checkpoint"))
            .expect("the checkpoint reopens after a crash");
        for &i in all_cp {
            let got = cp
                .get(&id(i))
                .expect("readable")
                .unwrap_or_else(|| panic!("acknowledged checkpoint record {i} lost"));
            assert_eq!(got, completion(i), "checkpoint record {i} changed");
        }
        let present = cp.len();
        assert!(present >= all_cp.len());
        cp.close().await;
        let st = RunDb::open(&dir.join("state")).expect("the run state reopens after a crash");
        for &i in all_st {
            assert!(st.result(&id(i)).unwrap().is_some(), "flushed result {i} lost");
        }
        let mut n = 0;
        for r in st.results() {
            let (job, r) = r.expect("every stored result decodes");
            let i = index_of(&job).expect("a result under an id the child wrote");
            assert!(i < tried_up_to);
            assert_eq!(r, StoredResult::from(result(i)), "result {i} torn or mixed up");
            n += 1;
        }
        (present, n)
    })
}

fn crash_loop(iterations: u64, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = seed | 1;
    let (mut all_cp, mut all_st) = (Vec::new(), Vec::new());
    let t = Instant::now();
    let (mut present_cp, mut present_st) = (0, 0);
    for it in 0..iterations {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let start = it * 10_000_000;
        let acked = run_child(dir.path(), start, Duration::from_millis(150 + rng % 400), &[]);
        all_cp.extend(acked.checkpoint);
        all_st.extend(acked.state);
        (present_cp, present_st) = verify(dir.path(), &all_cp, &all_st, start + 10_000_000);
    }
    println!(
        "store crash loop: {iterations} kills, {} acknowledged checkpoint records ({present_cp} present), {} flushed results \
         ({present_st} present), 0 lost, 0 corrupt, {:.1} s, seed {seed}",
        all_cp.len(),
        all_st.len(),
        t.elapsed().as_secs_f64()
    );
}

#[test]
fn store_crash_loop() {
    let iterations =
        std::env::var("HALYARD_CRASH_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(4);
    let seed =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
            as u64;
    crash_loop(iterations, seed);
}

/// Fill a checkpoint and a run state with `n` records each, flushed and closed.
fn filled(dir: &Path, n: u64) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let cp = Checkpoint::open(&dir.join("checkpoint")).unwrap();
        for i in 0..n {
            cp.put(id(i), &completion(i)).await.unwrap();
        }
        cp.close().await;
        let st = RunDb::open(&dir.join("state")).unwrap();
        for i in 0..n {
            st.insert_result(&result(i)).unwrap();
        }
        st.flush().await.unwrap();
    });
}

/// What opening and reading a damaged checkpoint gives: an error (its text), or the
/// records still readable as they were written. Never a panic.
fn probe_checkpoint(dir: &Path, n: u64) -> Result<usize, String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let cp = Checkpoint::open(&dir.join("checkpoint")).map_err(|e| e.to_string())?;
        let mut ok = 0;
        for i in 0..n {
            match cp.get(&id(i)) {
                Ok(Some(c)) if c == completion(i) => ok += 1,
                Ok(_) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        cp.close().await;
        Ok(ok)
    })
}

/// The same for a damaged run state: an error, or the results still readable.
fn probe_state(dir: &Path) -> Result<usize, String> {
    let st = RunDb::open(&dir.join("state")).map_err(|e| e.to_string())?;
    let mut ok = 0;
    for r in st.results() {
        r.map_err(|e| e.to_string())?;
        ok += 1;
    }
    Ok(ok)
}

/// Damaged engine files, in both stores, as a run leaves them while it goes on (records
/// in the journal) and once compacted (records in tables): every file is damaged in
/// turn, each way. Each store is then refused with an error naming it, or holds every
/// record as written (damage to what the engine no longer reads changes nothing). Never
/// a panic, never a silent loss.
#[test]
fn damaged_stores_fail_with_the_store_named() {
    type Damage = fn(&Path);
    let damages: [(&str, Damage); 5] = [
        ("the head overwritten", |f| {
            let mut b = std::fs::read(f).unwrap();
            let n = b.len().min(64);
            b[..n].fill(0xa5);
            std::fs::write(f, b).unwrap()
        }),
        ("cut to 100 bytes", |f| {
            let len = std::fs::metadata(f).unwrap().len().min(100);
            std::fs::OpenOptions::new().write(true).open(f).unwrap().set_len(len).unwrap()
        }),
        ("zeroed", |f| {
            let len = std::fs::metadata(f).unwrap().len();
            std::fs::write(f, vec![0u8; len as usize]).unwrap()
        }),
        ("deleted", |f| std::fs::remove_file(f).unwrap()),
        ("the middle overwritten", |f| {
            let mut b = std::fs::read(f).unwrap();
            let mid = b.len() / 2;
            let end = (mid + 4096).min(b.len());
            b[mid..end].fill(0x5a);
            std::fs::write(f, b).unwrap()
        }),
    ];
    fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                files(&p, out)
            } else if p.file_name().is_some_and(|n| n != "lock") {
                out.push(p)
            }
        }
    }
    let mut failed = Vec::new();
    for compacted in [false, true] {
        let make = |d: &Path| {
            filled(d, 200);
            if compacted {
                for s in ["checkpoint", "state"] {
                    halyard_store::compact(&d.join(s), halyard_store::Options::default()).unwrap();
                }
            }
        };
        let template = tempfile::tempdir().unwrap();
        make(template.path());
        for store in ["checkpoint", "state"] {
            // The control: a copy left whole opens with every record.
            let whole = tempfile::tempdir().unwrap();
            halyard_tests::copy_tree(template.path(), whole.path());
            let control = match store {
                "checkpoint" => probe_checkpoint(whole.path(), 200),
                _ => probe_state(whole.path()),
            };
            assert_eq!(control, Ok(200), "an undamaged copy of the {store}");
            let mut victims = Vec::new();
            files(&template.path().join(store), &mut victims);
            for victim in victims {
                let rel = victim.strip_prefix(template.path()).unwrap().to_path_buf();
                for (kind, damage) in &damages {
                    let dir = tempfile::tempdir().unwrap();
                    halyard_tests::copy_tree(template.path(), dir.path());
                    damage(&dir.path().join(&rel));
                    let what = format!("{} {kind} (compacted: {compacted})", rel.display());
                    let got = std::panic::catch_unwind(|| match store {
                        "checkpoint" => probe_checkpoint(dir.path(), 200),
                        _ => probe_state(dir.path()),
                    })
                    .unwrap_or_else(|_| panic!("{what}: opening the damaged {store} panicked"));
                    println!("{what}: {got:?}");
                    match got {
                        Err(e) if !e.contains(store) => {
                            failed.push(format!("{what}: error does not name the {store}: {e}"))
                        }
                        // A journal cut short too: the store's batch numbers in it no
                        // longer reach the durable mark, and it is refused (issue 50).
                        Ok(n) if n != 200 => {
                            failed.push(format!("{what}: silent loss: {n} of 200 {store} records"))
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

//! Issue 51: `kill -9` of a process while it writes the machine cache. A child process
//! (this test binary, run again as `writer`) writes entries as fast as it can, one
//! transaction after another, and is killed with SIGKILL at a random point, three times
//! over on the same file; each time the file passes SQLite's integrity check, every row
//! checks out against its job id and holds the answer the writer gave that job (nothing
//! half-written or foreign is served), what was committed before the kill is still there,
//! and a new process writes and reads it.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use halyard_cache::{Limits, MachineCache};
use halyard_proto::{ChatMessage, Completion, JobKey, ModelRef, Sampling, Usage};

/// The directory the `writer` child writes to (set only for it).
const CHILD_DIR: &str = "HALYARD_CACHE_KILL_TEST_DIR";

fn key(i: u64) -> JobKey {
    JobKey {
        pipeline: "hypotermqa".into(),
        stage: "answer".into(),
        stage_version: 1,
        model: ModelRef {
            backend: "openai".into(),
            endpoint: "http://127.0.0.1:1/v1".into(),
            model: "m".into(),
        },
        messages: vec![ChatMessage::user(format!("question {i}"))],
        sampling: Sampling::default(),
        sample_index: 0,
    }
}

/// The answer the writer gives job `i` (what a reader must find, or nothing).
fn answer_of(key: &JobKey) -> String {
    format!("the answer to {}", key.messages[0].content)
}

#[allow(clippy::needless_update)]
fn completion(key: &JobKey) -> Completion {
    Completion {
        text: answer_of(key).repeat(8),
        usage: Usage { prompt_tokens: 10, completion_tokens: 20, ..Default::default() },
        latency_ms: 7,
        finish_reason: Some("stop".into()),
        calls: 1,
        logprobs: None,
        refusal: false,
        source: Default::default(),
    }
}

/// The child: writes entries from `start` on without end (killed by the parent).
#[test]
#[ignore = "run by kill_9_while_writing_leaves_a_consistent_cache as its child"]
fn writer() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else { return };
    let start: u64 = std::env::var("HALYARD_CACHE_KILL_TEST_START").unwrap().parse().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let cache = MachineCache::open(Path::new(&dir), Limits::default()).unwrap();
        for i in start.. {
            let k = key(i);
            cache.put(&k, &completion(&k));
            if i % 256 == 0 {
                cache.flush().await;
            }
        }
    });
}

fn spawn_writer(dir: &Path, start: u64) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "writer", "--ignored", "--nocapture", "--test-threads", "1"])
        .env(CHILD_DIR, dir)
        .env("HALYARD_CACHE_KILL_TEST_START", start.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Every row: checked against its id by `entries`, and the writer's answer for its key.
fn check_rows(cache: &MachineCache) -> u64 {
    cache.integrity().unwrap();
    let rows = cache.entries().unwrap();
    for (id, k, c) in &rows {
        assert_eq!(k.id(), *id);
        assert_eq!(c.text, answer_of(k).repeat(8), "a row holds an answer never written");
        assert_eq!(c.source, halyard_proto::AnswerSource::Paid);
    }
    let stats = cache.stats().unwrap();
    assert_eq!(stats.entries, rows.len() as u64, "rows that do not check out were skipped");
    stats.entries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_while_writing_leaves_a_consistent_cache() {
    let dir = tempfile::tempdir().unwrap();
    let reader = MachineCache::open(dir.path(), Limits::default()).unwrap();
    let mut before = 0;
    for round in 0..3u64 {
        let mut child = spawn_writer(dir.path(), round * 1_000_000);
        // Kill it once it has committed some thousands more, at no chosen moment: it is
        // writing all the time.
        let want = before + 2_000 + round * 777;
        let t0 = Instant::now();
        while reader.stats().unwrap().entries < want {
            assert!(t0.elapsed() < Duration::from_secs(120), "the writer wrote too little");
            assert!(child.try_wait().unwrap().is_none(), "the writer stopped");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        // Another process's view: a fresh opener.
        let after = check_rows(&MachineCache::open(dir.path(), Limits::default()).unwrap());
        assert!(after >= want, "entries committed before the kill are gone: {after} < {want}");
        before = after;
    }
    // A new process writes and reads the file as before.
    let again = MachineCache::open(dir.path(), Limits::default()).unwrap();
    let k = key(9_999_999);
    again.put(&k, &completion(&k));
    again.flush().await;
    assert_eq!(reader.get(&k.id()).unwrap().unwrap().text, answer_of(&k).repeat(8));
    assert_eq!(check_rows(&again), before + 1);
}

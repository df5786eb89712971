//! `halyard run` with the embedded default model (SmolLM2-135M-Instruct, llama.cpp,
//! in-process) as model under test and judge: no API, no server.

use std::path::{Path, PathBuf};

use crate::common::*;

/// llama.cpp's thread pool spin-waits; runs that decode at once on a small machine
/// oversubscribe its cores. The tests of this file that load the model take turns.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

fn model() -> PathBuf {
    let p = repo_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "{} is missing: run scripts/fetch-model.sh", p.display());
    p
}

fn local_sweep(dir: &Path, name: &str, limit: usize, extra: &str) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            r#"name = "{name}"

[[model]]
name = "smollm2"
backend = "gguf"
model_path = "{model}"
slots = 4
ctx_size = 2048
max_tokens = 96
{extra}

[[benchmark]]
pipeline = "hypotermqa"
dataset = "{dataset}"
models = ["smollm2"]
judge = "smollm2"
limit = {limit}
"#,
            model = model().display(),
            dataset = dataset().display()
        ),
    )
    .unwrap();
    path
}

/// A real LLM answers and judges; every job is terminal; answers are model text; a second
/// run sharing the checkpoint gives identical labels with zero model calls; llama.cpp's
/// logs go to the run's `halyard.log`, not the terminal.
#[test]
fn smollm2_answers_and_judges_and_reruns_from_checkpoint() {
    let _turn = turn();
    let dir = tempfile::tempdir().unwrap();
    let sweep = local_sweep(dir.path(), "local", 3, "");
    let ckpt = dir.path().join("ckpt");
    let args = |out: &str| {
        vec![
            "run".to_string(),
            sweep.display().to_string(),
            "--out".into(),
            dir.path().join(out).display().to_string(),
            "--checkpoint".into(),
            ckpt.display().to_string(),
        ]
    };
    let a1 = args("first");
    // Issue 30: without HALYARD_LOG or -v, llama.cpp's model loading goes to the run's log
    // file, not the terminal.
    let o = halyard().env_remove("HALYARD_LOG").args(&a1).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("llama-cpp-2"), "library logs on the terminal:\n{err}");
    let log = std::fs::read_to_string(dir.path().join("first/local/halyard.log")).unwrap();
    assert!(log.contains("llama-cpp-2") && log.contains("loaded meta data"), "{log}");
    assert!(log.contains("coordinator starting"), "Halyard's own lines too: {log}");
    let r1 = read_json(&dir.path().join("first/local/report.json"));
    let jobs = &r1["jobs"];
    assert_eq!(jobs["dead_letters"], 0, "{jobs}");
    assert!(jobs["model_calls"].as_u64().unwrap() >= 3, "{jobs}");
    assert!(jobs["completion_tokens"].as_u64().unwrap() > 0, "{jobs}");
    let labels1 = std::fs::read_to_string(dir.path().join("first/local/labels.jsonl")).unwrap();
    assert_eq!(labels1.lines().count(), 3);
    for line in labels1.lines() {
        let l: serde_json::Value = serde_json::from_str(line).unwrap();
        let answer = l["answer"].as_str().expect("answered");
        assert!(
            answer.chars().filter(|c| c.is_alphabetic()).count() >= 3,
            "not model text: {answer:?}"
        );
        assert_ne!(l["answer_label"], "unanswered");
    }
    let b = &r1["benchmarks"][0];
    let counted: u64 = ["hypothetical", "valid"]
        .iter()
        .flat_map(|t| {
            ["valid", "hallucination", "irrelevant", "judge_error"]
                .map(|k| b["answer_labels"][t][k].as_u64().unwrap())
        })
        .sum();
    assert_eq!(counted, 3, "every question labelled, judge errors included: {b}");

    // A new run (own coordinator state) on the same checkpoint: all from the checkpoint, no calls.
    let a2 = args("second");
    run_to_end(&a2.iter().map(String::as_str).collect::<Vec<_>>());
    let r2 = read_json(&dir.path().join("second/local/report.json"));
    assert_eq!(r2["jobs"]["model_calls"], 0, "{}", r2["jobs"]);
    assert_eq!(r2["jobs"]["cache_hits"], r1["jobs"]["done"]);
    assert_eq!(r2["benchmarks"], r1["benchmarks"]);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("second/local/labels.jsonl")).unwrap(),
        labels1
    );
}

fn run_fails(sweep: &Path, out: &Path) -> String {
    let o = halyard()
        .args(["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!o.status.success(), "run succeeded");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Issue 34: `halyard identity` prints the identity a sweep's `identity` key takes; a run
/// whose sweep declares another identity than its file's stops before loading it, naming
/// both (the coordinator no longer needs the file, the worker that loads it checks it).
#[test]
fn declared_identity_is_checked_by_the_loading_worker() {
    let dir = tempfile::tempdir().unwrap();
    let o = halyard().arg("identity").arg(model()).output().unwrap();
    let printed = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let id = printed.split('"').nth(1).expect("identity = \"…\"").to_string();
    assert!(id.starts_with("gguf:SmolLM2-135M-Instruct.Q4_1.gguf:"), "{printed}");
    let wrong = format!("{}0000000000000000", &id[..id.len() - 16]);
    let s = local_sweep(dir.path(), "id", 1, &format!("identity = \"{wrong}\""));
    let err = run_fails(&s, &dir.path().join("out"));
    assert!(err.contains("another file") && err.contains(&id) && err.contains(&wrong), "{err}");
    let bad = halyard().arg("identity").arg(&s).output().unwrap();
    assert!(
        !bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("not a GGUF file")
    );
}

/// Missing, non-GGUF and truncated model files stop the run with an error naming the file.
#[test]
fn bad_model_files_fail_with_the_file_named() {
    let _turn = turn();
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::read_to_string(local_sweep(dir.path(), "x", 1, "")).unwrap();
    let notes = dir.path().join("notes.gguf");
    std::fs::write(&notes, "hello").unwrap();
    let truncated = dir.path().join("cut.gguf");
    std::fs::write(&truncated, &std::fs::read(model()).unwrap()[..3_000_000]).unwrap();
    let missing = dir.path().join("absent.gguf");
    for (i, (file, needle)) in
        [(&missing, "No such file"), (&notes, "not a GGUF file"), (&truncated, "could not load")]
            .into_iter()
            .enumerate()
    {
        let s = dir.path().join(format!("bad{i}.toml"));
        std::fs::write(
            &s,
            base.replace(&model().display().to_string(), &file.display().to_string()),
        )
        .unwrap();
        let err = run_fails(&s, &dir.path().join("out"));
        assert!(
            err.contains(&file.display().to_string()) && err.contains(needle),
            "case {i}: {err}"
        );
    }
}

/// Without the `cuda` feature, a model placed on a GPU is refused with a clear error, by
/// `halyard run` and by `halyard worker --gpu`; the pool name carries the placement. A
/// worker without `--gpu` leaves GPU-placed models to the GPU workers.
#[test]
fn gpu_placement_needs_cuda_and_names_the_pool() {
    let dir = tempfile::tempdir().unwrap();
    let s = local_sweep(dir.path(), "gpu", 1, "gpu = 0");
    let err = run_fails(&s, &dir.path().join("out"));
    assert!(err.contains("cuda") && err.contains("GPU 0"), "{err}");
    let o = halyard()
        .args([
            "worker",
            "--nats",
            "nats://127.0.0.1:9",
            "--sweep",
            s.to_str().unwrap(),
            "--gpu",
            "0",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--features cuda"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Issue 34: a worker without --gpu loads no GPU-placed model; a sweep with nothing
    // else says to give --gpu, instead of failing to load the GPU model.
    let o = halyard()
        .args(["worker", "--nats", "nats://127.0.0.1:9", "--sweep", s.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success()
            && err.contains("places every model on a GPU")
            && err.contains("--gpu N"),
        "{err}"
    );
}

//! Sweep checks for the `noop` pipeline, `[run]`, and local (gguf) models.

use super::*;

const NOOP: &str = r#"
name = "bench"

[[model]]
name = "free"
backend = "noop"
max_concurrency = 64

[[benchmark]]
pipeline = "noop"
jobs = 1000
models = ["free"]
"#;

fn err(text: &str) -> String {
    parse(Path::new("/tmp/s.toml"), text).expect_err("sweep must be rejected").to_string()
}

/// A noop benchmark needs only `jobs` and noop models; the window defaults and can be set.
#[test]
fn noop_sweep_parses() {
    let s = parse(Path::new("/tmp/s.toml"), NOOP).unwrap();
    assert_eq!(s.benchmarks.len(), 1);
    let b = &s.benchmarks[0];
    assert_eq!((b.pipeline(), b.model_count(), b.item_count()), ("noop", 1, 1000));
    assert_eq!(s.run.window, DEFAULT_WINDOW);
    assert_eq!(s.run.job_batch, JobBatch::Auto);
    assert_eq!(s.pools().get("free"), Some(&64));
    let s =
        parse(Path::new("/tmp/s.toml"), &format!("{NOOP}\n[run]\nwindow = 10\njob_batch = 64\n"))
            .unwrap();
    assert_eq!((s.run.window, s.run.job_batch), (10, JobBatch::Fixed(64)));
    let s =
        parse(Path::new("/tmp/s.toml"), &format!("{NOOP}\n[run]\njob_batch = \"auto\"\n")).unwrap();
    assert_eq!(s.run.job_batch, JobBatch::Auto);
    assert_eq!(s.run.outage_patience, std::time::Duration::from_secs(6 * 3600));
    let s = parse(Path::new("/tmp/s.toml"), &format!("{NOOP}\n[run]\noutage_patience_s = 90\n"))
        .unwrap();
    assert_eq!(s.run.outage_patience, std::time::Duration::from_secs(90));
    assert_eq!(s.run.first_contact, std::time::Duration::from_secs(45));
    let s =
        parse(Path::new("/tmp/s.toml"), &format!("{NOOP}\n[run]\nfirst_contact_s = 5\n")).unwrap();
    assert_eq!(s.run.first_contact, std::time::Duration::from_secs(5));
}

/// Wrong noop benchmarks name the key and the reason.
#[test]
fn bad_noop_sweeps_name_the_key() {
    let cases = [
        (NOOP.replace("jobs = 1000\n", ""), "benchmark[0].jobs`: required"),
        (NOOP.replace("jobs = 1000", "jobs = 0"), "benchmark[0].jobs`: 0 is outside"),
        (NOOP.replace("jobs = 1000", "jobs = 1000\njudge = \"free\""), "benchmark[0].judge`: does not apply"),
        (NOOP.replace("jobs = 1000", "jobs = 1000\ndataset = \"x.jsonl\""), "benchmark[0].dataset`: does not apply"),
        (NOOP.replace("[\"free\"]", "[\"nobody\"]"), "benchmark[0].models[0]`: unknown model \"nobody\""),
        (NOOP.replace("[\"free\"]", "[\"free\", \"free\"]"), "benchmark[0].models[1]`: model \"free\" listed twice"),
        (
            NOOP.replace("backend = \"noop\"", "backend = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"m\""),
            "runs only models with backend \"noop\"",
        ),
        (
            NOOP.replace("pipeline = \"noop\"", "pipeline = \"nope\""),
            "unknown pipeline \"nope\" (expected \"hypotermqa\", \"hypotermqa-build\", \"autohall\", \"chainpoll\", \"uhgeval\", \"hvi\" or \"noop\")",
        ),
        (format!("{NOOP}\n[run]\nwindow = 0\n"), "run.window`: 0 is outside"),
        (format!("{NOOP}\n[run]\njob_batch = 0\n"), "run.job_batch`: 0 is outside 1..=256"),
        (format!("{NOOP}\n[run]\njob_batch = 257\n"), "run.job_batch`: 257 is outside 1..=256"),
        (
            format!("{NOOP}\n[run]\njob_batch = \"big\"\n"),
            "run.job_batch`: \"big\" is neither \"auto\" nor a number of jobs (1..=256)",
        ),
        (
            format!("{NOOP}\n[run]\njob_batch = 6.5\n"),
            "run.job_batch`: 6.5 is neither \"auto\" nor a number of jobs",
        ),
        (format!("{NOOP}\n[run]\noutage_patience_s = 0\n"), "run.outage_patience_s`: 0 is outside"),
        (format!("{NOOP}\n[run]\nfirst_contact_s = 0\n"), "run.first_contact_s`: 0 is outside"),
    ];
    for (text, needle) in cases {
        let e = err(&text);
        assert!(e.contains(needle), "{needle:?} not in {e:?}");
        assert!(e.starts_with("/tmp/s.toml"), "{e}");
    }
}

/// `jobs` belongs to noop and `dataset` stays required for hypotermqa.
#[test]
fn hypotermqa_keys_stay_checked() {
    let text = r#"
name = "h"
[[model]]
name = "m"
backend = "noop"
[[benchmark]]
pipeline = "hypotermqa"
models = ["m"]
judge = "m"
"#;
    assert!(
        err(text).contains("benchmark[0].dataset`: required for pipeline \"hypotermqa\""),
        "{}",
        err(text)
    );
    let with_jobs = text.replace("judge = \"m\"", "judge = \"m\"\njobs = 3\ndataset = \"x.jsonl\"");
    assert!(
        err(&with_jobs).contains("benchmark[0].jobs`: does not apply to pipeline \"hypotermqa\""),
        "{}",
        err(&with_jobs)
    );
}

fn sweep_with(models: &str) -> Result<Sweep, SweepError> {
    let dir = tempfile::tempdir().unwrap();
    let mut fake = b"GGUF".to_vec();
    fake.resize(4096, 0);
    std::fs::write(dir.path().join("m.gguf"), &fake).unwrap();
    let ds = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../datasets/hypotermqa/HypoTermQA_180.jsonl");
    let text = format!(
            "name = \"t\"\n{models}\n[[benchmark]]\npipeline = \"hypotermqa\"\ndataset = \"{}\"\nmodels = [\"a\"]\njudge = \"a\"\nlimit = 1\n",
            ds.display()
        );
    parse(&dir.path().join("s.toml"), &text)
}

/// Local models' pools carry their placement; a named pool keeps it too; concurrency
/// defaults to the model's slots.
#[test]
fn local_pools_carry_placement() {
    let s = sweep_with(
            "[[model]]\nname = \"a\"\nbackend = \"gguf\"\nmodel_path = \"m.gguf\"\nslots = 3\n\
             [[model]]\nname = \"b\"\nbackend = \"gguf\"\nmodel_path = \"m.gguf\"\ngpu = 1\n\
             [[model]]\nname = \"c\"\nbackend = \"gguf\"\nmodel_path = \"m.gguf\"\npool = \"shared\"\n",
        )
        .unwrap();
    let pools: Vec<&str> = s.models.iter().map(|m| m.spec.pool.as_str()).collect();
    assert_eq!(pools, ["gguf/a@cpu", "gguf/b@gpu1", "shared@cpu"]);
    assert_eq!(s.models[0].max_concurrency, 3);
    assert_eq!(s.models[1].local.as_ref().unwrap().gpu, Some(1));
    // The identity is the file's, not its path's: same file, same endpoint.
    assert_eq!(s.models[0].spec.model_ref.endpoint, s.models[1].spec.model_ref.endpoint);
    assert!(s.models[0].spec.model_ref.endpoint.starts_with("gguf:m.gguf:4096:"));
}

/// gguf-only keys on another backend, and bad values, are errors naming the key.
#[test]
fn local_keys_are_checked() {
    let e = sweep_with("[[model]]\nname = \"a\"\nbackend = \"openai\"\nbase_url = \"http://x\"\nmodel = \"m\"\nslots = 2\n").unwrap_err();
    assert!(e.to_string().contains("model[0].slots"), "{e}");
    let e = sweep_with(
        "[[model]]\nname = \"a\"\nbackend = \"gguf\"\nmodel_path = \"m.gguf\"\nslots = 0\n",
    )
    .unwrap_err();
    assert!(e.to_string().contains("model[0].slots") && e.to_string().contains("outside"), "{e}");
    let e = sweep_with("[[model]]\nname = \"a\"\nbackend = \"gguf\"\nmodel_path = \"nope.gguf\"\n")
        .unwrap_err();
    assert!(
        e.to_string().contains("model[0].model_path") && e.to_string().contains("nope.gguf"),
        "{e}"
    );
}

/// Issue 34: with `identity` the coordinator plans a local model without its file (the
/// identity is the job's endpoint); a malformed identity, or one on another backend, is
/// an error naming the key; a worker checks the file it loads against the identity.
#[test]
fn declared_identity_needs_no_file() {
    let id = "gguf:model.gguf:98362432:c18f34596555ec27";
    let s = sweep_with(&format!(
        "[[model]]\nname = \"a\"\nbackend = \"gguf\"\nmodel_path = \"/models/not-here.gguf\"\nidentity = \"{id}\"\ngpu = 0\n"
    ))
    .unwrap();
    assert_eq!(s.models[0].spec.model_ref.endpoint, id);
    for bad in [
        "gguf:m:12:xyz",
        "sha256:abc",
        "gguf:m.gguf:big:c18f34596555ec27",
        "gguf::1:C18F34596555EC27",
    ] {
        let e = sweep_with(&format!(
            "[[model]]\nname = \"a\"\nbackend = \"gguf\"\nmodel_path = \"m.gguf\"\nidentity = \"{bad}\"\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("model[0].identity"), "{bad}: {e}");
    }
    let e = sweep_with(&format!(
        "[[model]]\nname = \"a\"\nbackend = \"openai\"\nbase_url = \"http://x\"\nmodel = \"m\"\nidentity = \"{id}\"\n"
    ))
    .unwrap_err();
    assert!(e.to_string().contains("model[0].identity"), "{e}");
    // The worker's check: the right file passes, another fails naming both identities.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("m.gguf");
    let mut fake = b"GGUF".to_vec();
    fake.resize(4096, 7);
    std::fs::write(&file, &fake).unwrap();
    let real = gguf_identity(&file).unwrap();
    assert!(check_identity(&file, &real).is_ok());
    let e = check_identity(&file, id).unwrap_err();
    assert!(e.contains(&real) && e.contains(id), "{e}");
    assert!(check_identity(&dir.path().join("gone.gguf"), id).is_err());
}

/// A worker reads a sweep's models, pools and quotas without its datasets: a sweep whose
/// dataset is absent on this machine still gives the pools, while the full check names it.
#[test]
fn pools_load_without_datasets() {
    let dir = std::env::temp_dir().join(format!("halyard-pools-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("s.toml");
    let text = "name = \"t\"\n[[model]]\nname = \"a\"\nbackend = \"openai\"\nbase_url = \"https://api.example/v1\"\nmodel = \"m\"\nrpm = 60\n[[benchmark]]\npipeline = \"hypotermqa\"\ndataset = \"not-on-this-node.jsonl\"\nmodels = [\"a\"]\njudge = \"a\"\n";
    std::fs::write(&path, text).unwrap();
    let e = load(&path).expect_err("the full check reads the dataset").to_string();
    assert!(e.contains("not-on-this-node.jsonl"), "{e}");
    let s = load_pools(&path).unwrap();
    assert!(s.benchmarks.is_empty());
    assert_eq!(s.pools().into_iter().collect::<Vec<_>>(), [("a".to_string(), 4)]);
    assert_eq!(s.quotas["a"].rpm, Some(60));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The ids of the jobs question 1 of HypoTermQA_180 needs first, in paper semantics, from
/// a sweep with one model `a` (`extra` added to its table) answering and judging: the
/// answer job, then, given the answer "Nanorobotics and Nano-Sync Fusion Technology.",
/// the acceptance judge jobs of its terms.
fn first_job_ids(extra: &str) -> Vec<String> {
    use halyard_pipelines::common::Plan;
    use halyard_proto::{Completion, Outcome, Usage};
    let s = sweep_with(&format!(
        "[[model]]\nname = \"a\"\nbackend = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"\n{extra}"
    ))
    .unwrap();
    let h = s.benchmarks[0].get::<HypoTermQa>().unwrap();
    let (cfg, q) = (&h.config[0], &h.questions[0]);
    let mut results = std::collections::HashMap::new();
    let answer = cfg.answer_request(q);
    let mut ids = vec![answer.id().to_string()];
    results.insert(
        answer.id(),
        Outcome::Done(Completion {
            text: "Nanorobotics and Nano-Sync Fusion Technology.".into(),
            usage: Usage::default(),
            latency_ms: 0,
            finish_reason: Some("stop".into()),
            calls: 1,
            logprobs: None,
            refusal: false,
            source: Default::default(),
        }),
    );
    let Plan::Waiting(jobs) = halyard_pipelines::hypotermqa::evaluate(cfg, q, &results) else {
        panic!("the judge jobs are needed");
    };
    ids.extend(jobs.iter().map(|j| j.id().to_string()));
    ids
}

/// Issue 45: `structured_output` is part of a job's identity only when set. Without the
/// key (or with `false`) the answer and judge jobs keep the ids the build before it gave
/// them (pinned: printed by `first_job_ids("")` at commit 543f0ba, before the key
/// existed), so every existing checkpoint still answers them; with `true` the judge jobs
/// are new jobs and the answer job, which expects no JSON, is unchanged.
#[test]
fn structured_output_changes_only_judge_ids_and_only_when_set() {
    let before = first_job_ids("");
    assert_eq!(before, PINNED_IDS, "job ids changed: every existing checkpoint would miss");
    assert_eq!(first_job_ids("structured_output = false\n"), PINNED_IDS);
    let on = first_job_ids("structured_output = true\n");
    assert_eq!(on.len(), before.len());
    assert_eq!(on[0], before[0], "the answer job carries no schema");
    for (a, b) in on[1..].iter().zip(&before[1..]) {
        assert_ne!(a, b, "a structured judge job is another job");
    }
}
// `first_job_ids("")` printed by the build before the key (543f0ba, a worktree of it:
// `cargo test -p halyard-plan --lib print_pinned_ids -- --nocapture`).
const PINNED_IDS: [&str; 3] = [
    "b0729b77ce59b1e35a642187aef7b269",
    "5c9fb0d84d27fab87829f60380bbafad",
    "7e5dc33c148e44eb832b0c6b0640a476",
];

/// Issue 45: `structured_output` must be a boolean, on a backend that can constrain its
/// output; each error names the key.
#[test]
fn structured_output_is_checked() {
    let s = sweep_with(
        "[[model]]\nname = \"a\"\nbackend = \"gguf\"\nmodel_path = \"m.gguf\"\nstructured_output = true\n",
    )
    .unwrap();
    assert!(s.models[0].spec.structured_output);
    // The report names it.
    let md = structured_markdown(&structured_rows(&s.models));
    assert!(md.contains("## Structured output"), "{md}");
    assert!(md.contains("| a | gguf | llama.cpp grammar"), "{md}");
    let s = sweep_with(
        "[[model]]\nname = \"a\"\nbackend = \"server\"\nserver = \"vllm\"\nmodel_path = \"/models/m\"\nrevision = \"abc\"\nstructured_output = true\n",
    )
    .unwrap();
    assert!(s.models[0].spec.structured_output);
    let s = sweep_with(
        "[[model]]\nname = \"a\"\nbackend = \"openai\"\nbase_url = \"http://x\"\nmodel = \"m\"\n",
    )
    .unwrap();
    assert!(!s.models[0].spec.structured_output);
    assert_eq!(structured_markdown(&structured_rows(&s.models)), "");
    for (table, needle) in [
        (
            "[[model]]\nname = \"a\"\nbackend = \"gguf\"\nmodel_path = \"m.gguf\"\nstructured_output = \"yes\"\n",
            "model[0].structured_output`: expected true or false, found string \"yes\"",
        ),
        (
            "[[model]]\nname = \"a\"\nbackend = \"gguf\"\nmodel_path = \"m.gguf\"\nstructured_output = 1\n",
            "model[0].structured_output`: expected true or false, found integer 1",
        ),
        (
            "[[model]]\nname = \"a\"\nbackend = \"noop\"\nstructured_output = true\n",
            "model[0].structured_output`: backend \"noop\" cannot constrain its output",
        ),
    ] {
        let e = sweep_with(table).unwrap_err().to_string();
        assert!(e.contains(needle), "{needle:?} not in {e:?}");
    }
}

/// Issue 51: a noop (or replay) model is not cached unless its sweep opts in; a gguf
/// model (local compute a hit saves) is read-write by default.
#[test]
fn free_backends_are_not_cached_unless_asked() {
    use halyard_proto::CachePolicy as P;
    let s = parse(Path::new("/tmp/s.toml"), NOOP).unwrap();
    assert_eq!(s.models[0].cache, P::Off);
    let opted =
        NOOP.replace("max_concurrency = 64", "max_concurrency = 64\ncache = \"read-write\"");
    assert_eq!(parse(Path::new("/tmp/s.toml"), &opted).unwrap().models[0].cache, P::ReadWrite);
    let s = sweep_with("[[model]]\nname = \"a\"\nbackend = \"gguf\"\nmodel_path = \"m.gguf\"\n")
        .unwrap();
    assert_eq!(s.models[0].cache, P::ReadWrite);
}

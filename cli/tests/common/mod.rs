//! Shared support for the end-to-end tests: a fake model-and-judge with fixed rules, a
//! sweep writer, and an independent computation of the figures those rules imply.
#![allow(dead_code)]

pub mod autohall;
pub mod browser;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use halyard_tests::{ChatCall, Reply};
use serde_json::Value;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("cli/ has a parent").to_path_buf()
}

/// The all-MiniLM-L6-v2 folder (`HALYARD_EMBED_MODEL`, else `models/`).
pub fn embed_model() -> PathBuf {
    let p = std::env::var_os("HALYARD_EMBED_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("models/all-MiniLM-L6-v2"));
    assert!(
        p.join("model.safetensors").exists(),
        "{} is missing: run scripts/fetch-embedder.sh",
        p.display()
    );
    p
}

pub fn dataset() -> PathBuf {
    repo_root().join("datasets/hypotermqa/HypoTermQA_180.jsonl")
}

/// `halyard broker init --nats URL`: the broker shaped as a coordinator shapes it, for a
/// test that starts workers with no coordinator (workers create no stream or bucket).
#[allow(dead_code)]
pub fn broker_init(url: &str) {
    let o = halyard().args(["broker", "init", "--nats", url]).output().expect("run halyard");
    assert!(o.status.success(), "broker init: {}", String::from_utf8_lossy(&o.stderr));
}

pub fn halyard() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_halyard"));
    // No result cache unless a test asks for one (cli/tests/cache.rs): every test's calls
    // are its own, whatever ran before on this machine.
    c.env("HALYARD_CACHE", "off");
    c.env("PATH", format!("{}:/usr/sbin", std::env::var("PATH").unwrap_or_default()));
    // HALYARD_TEST_LOG overrides the children's log filter when debugging a test.
    let log = std::env::var("HALYARD_TEST_LOG");
    c.env(
        "HALYARD_LOG",
        log.as_deref().unwrap_or("info,fjall=warn,lsm_tree=warn,sled=warn,async_nats=warn"),
    );
    c
}

pub fn run_to_end(args: &[&str]) -> Output {
    run_to_end_with(args, 0)
}

/// Run halyard to a complete run with `dead_letters` dead letters (exit 0 when none,
/// else exit 4 with a last line saying that many remain).
pub fn run_to_end_with(args: &[&str], dead_letters: u64) -> Output {
    let (out, stated) = run_complete(args);
    assert_eq!(stated, dead_letters, "halyard {args:?}: dead letters stated");
    out
}

/// Run halyard to a complete run and return how many dead letters its last line says
/// remain: exit 0 (none) or exit 4 with that line; anything else panics. Tests compare
/// the number with their own count and the report's.
pub fn run_complete(args: &[&str]) -> (Output, u64) {
    let out = halyard().args(args).output().expect("run halyard");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stated = stderr.lines().find_map(|l| {
        if !(l.starts_with("run ") && l.contains("halyard retry-failed")) {
            return None;
        }
        let (_, rest) = l.split_once(": ")?;
        rest.split_once(" dead letter")?.0.parse::<u64>().ok()
    });
    let n = match (out.status.code(), stated) {
        (Some(0), None) => 0,
        (Some(EXIT_DEAD_LETTERS), Some(n)) if n > 0 => n,
        other => panic!(
            "halyard {args:?}: (exit, dead letters stated) {other:?}\nstdout:\n{}\nstderr:\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        ),
    };
    (out, n)
}

/// A sweep `name` of `jobs` noop jobs on one noop model, written into `dir`.
pub fn noop_sweep(dir: &Path, name: &str, jobs: u64) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    let text = format!(
        "name = \"{name}\"\n[[model]]\nname = \"free\"\nbackend = \"noop\"\n\
         [[benchmark]]\npipeline = \"noop\"\njobs = {jobs}\nmodels = [\"free\"]\n"
    );
    std::fs::write(&path, text).expect("write sweep");
    path
}

/// The exit status of a run that completes with dead letters.
pub const EXIT_DEAD_LETTERS: i32 = 4;

pub fn fnv(s: &str) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Acc {
    Mentioned,
    Unreal,
    Unknown,
    /// Unusable output for the plain prompt; the repair prompt gets `Mentioned`…
    GarbageThenMentioned,
    /// …or unusable output even then.
    AlwaysGarbage,
}

pub fn acceptance_rule(term: &str) -> Acc {
    let h = fnv(term);
    match h % 4 {
        0 => Acc::Mentioned,
        1 => Acc::Unreal,
        2 => Acc::Unknown,
        _ if h % 8 == 7 => Acc::AlwaysGarbage,
        _ => Acc::GarbageThenMentioned,
    }
}

pub fn meaning_rule(term: &str) -> bool {
    !(fnv(term) >> 8).is_multiple_of(3)
}

pub const NO_INFO: &str = "I have no information about that.";

/// What the model under test answers to a question (by dataset id).
pub fn answers_with_question(id: i64) -> bool {
    id % 5 != 0
}

fn term_of(user: &str) -> Option<String> {
    let start = user.rfind("{\"term\":\"")? + 9;
    let end = user[start..].find("\",\n\"reasoning\"")? + start;
    Some(user[start..end].to_string())
}

/// The fake's rules: model under test and judge, by request content only.
pub fn responder(
    questions: HashMap<String, i64>,
    poison: Option<i64>,
) -> impl Fn(&ChatCall) -> Reply + Send + Sync + 'static {
    move |call: &ChatCall| {
        let msgs = &call.messages;
        let is_judge = msgs
            .first()
            .is_some_and(|(r, c)| r == "system" && c.starts_with("You are a linguistic expert."));
        if !is_judge {
            let q = msgs.last().map(|(_, c)| c.clone()).unwrap_or_default();
            let Some(&id) = questions.get(&q) else {
                return Reply::Status {
                    code: 400,
                    body: format!("unknown question {q:?}"),
                    retry_after: None,
                };
            };
            if poison == Some(id) {
                return Reply::Status {
                    code: 400,
                    body: "{\"error\":\"poison\"}".into(),
                    retry_after: None,
                };
            }
            return Reply::Text(if answers_with_question(id) {
                format!("Here is what I know: {q}")
            } else {
                NO_INFO.into()
            });
        }
        let user = &msgs[1].1;
        let Some(term) = term_of(user) else { return Reply::Text("no term found".into()) };
        let repair = msgs.len() > 2;
        if msgs[0].1.contains("Verify if the answer uses the term in its real meaning.") {
            let v = if meaning_rule(&term) { "TRUE" } else { "FALSE" };
            return Reply::Text(format!(
                "{{\"term\":\"{term}\",\"reasoning\":\"checked\",\"verified\":\"{v}\"}}"
            ));
        }
        let certainty = match (acceptance_rule(&term), repair) {
            (Acc::Mentioned, _) | (Acc::GarbageThenMentioned, true) => "MENTIONED",
            (Acc::Unreal, _) => "UNREAL",
            (Acc::Unknown, _) => "UNKNOWN",
            (Acc::GarbageThenMentioned, false) | (Acc::AlwaysGarbage, _) => {
                return Reply::Text("Hmm, hard to say.".into())
            }
        };
        Reply::Text(format!("Reasoning first.\n```json\n{{\"term\":\"{term}\",\"reasoning\":\"r\",\"certainty\":\"{certainty}\"}}\n```"))
    }
}

pub struct Question {
    pub id: i64,
    pub hypothetical: bool,
    pub question: String,
    /// (term, is_hypothetical)
    pub terms: Vec<(String, bool)>,
}

pub fn load_questions(limit: usize) -> Vec<Question> {
    load_questions_from(&dataset(), limit)
}

/// The first `limit` questions of a HypoTermQA dataset file.
pub fn load_questions_from(path: &Path, limit: usize) -> Vec<Question> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .take(limit)
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("dataset line");
            Question {
                id: v["questionId"].as_i64().expect("id"),
                hypothetical: v["isHypotheticalQuestion"].as_bool().expect("flag"),
                question: v["question"].as_str().expect("q").to_string(),
                terms: v["terms"]
                    .as_array()
                    .expect("terms")
                    .iter()
                    .map(|t| {
                        (
                            t["term"].as_str().expect("term").to_string(),
                            t["isHypotheticalTerm"].as_bool().expect("h"),
                        )
                    })
                    .collect(),
            }
        })
        .collect()
}

pub fn question_index(qs: &[Question]) -> HashMap<String, i64> {
    qs.iter().map(|q| (q.question.clone(), q.id)).collect()
}

/// Paper-mode inclusion of each question's own terms, from the golden vectors (computed
/// by the reference tooling, not by Halyard).
pub fn golden_inclusion() -> HashMap<(String, String), bool> {
    let path = repo_root().join("../shared/golden/string_match.jsonl");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut m = HashMap::new();
    for l in text.lines() {
        let v: Value = serde_json::from_str(l).expect("golden line");
        if v["category"] == "dataset:question+own_term" {
            m.insert(
                (v["text"].as_str().unwrap().to_string(), v["term"].as_str().unwrap().to_string()),
                v["paper"].as_bool().unwrap(),
            );
        }
    }
    m
}

#[derive(Debug, Default, PartialEq)]
pub struct Expected {
    /// (question type "hypothetical"/"valid", label) -> count
    pub counts: HashMap<(String, String), u64>,
    pub hts: f64,
}

/// The figures the rules imply under paper semantics, computed without Halyard's code.
pub fn expected_paper(qs: &[Question], poison: Option<i64>) -> Expected {
    let incl = golden_inclusion();
    let mut e = Expected::default();
    let mut valid_hyp = 0u64;
    let hyp_total = qs.iter().filter(|q| q.hypothetical).count() as f64;
    for q in qs {
        let label = if poison == Some(q.id) {
            "unanswered"
        } else {
            let labels: Vec<&str> = q
                .terms
                .iter()
                .map(|(t, is_h)| {
                    let included =
                        answers_with_question(q.id) && incl[&(q.question.clone(), t.clone())];
                    if !included {
                        return "irrelevant";
                    }
                    match (acceptance_rule(t), *is_h) {
                        (Acc::AlwaysGarbage, _) => "judge_error",
                        (Acc::Mentioned | Acc::GarbageThenMentioned, true) => "hallucination",
                        (_, true) => "valid",
                        (Acc::Unknown, false) => "irrelevant",
                        (Acc::Unreal, false) => "hallucination",
                        (_, false) => {
                            if meaning_rule(t) {
                                "valid"
                            } else {
                                "hallucination"
                            }
                        }
                    }
                })
                .collect();
            ["hallucination", "judge_error", "irrelevant"]
                .into_iter()
                .find(|l| labels.contains(l))
                .unwrap_or("valid")
        };
        if q.hypothetical && label == "valid" {
            valid_hyp += 1;
        }
        let ty = if q.hypothetical { "hypothetical" } else { "valid" };
        *e.counts.entry((ty.to_string(), label.to_string())).or_default() += 1;
    }
    e.hts = valid_hyp as f64 / hyp_total * 100.0;
    e
}

pub fn write_sweep(
    dir: &Path,
    name: &str,
    base_url: &str,
    limit: usize,
    concurrency: usize,
) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    let text = format!(
        r#"name = "{name}"

[[model]]
name = "model-a"
backend = "openai"
base_url = "{base_url}"
model = "fake-model"
max_concurrency = {concurrency}
max_tokens = 256

[[model]]
name = "judge-a"
backend = "openai"
base_url = "{base_url}"
model = "fake-judge"
max_concurrency = {concurrency}

[[benchmark]]
pipeline = "hypotermqa"
dataset = "{dataset}"
models = ["model-a"]
judge = "judge-a"
semantics = "paper"
limit = {limit}

[run]
ack_wait_s = 5
max_deliver = 3
"#,
        dataset = dataset().display()
    );
    std::fs::write(&path, text).expect("write sweep");
    path
}

pub fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Processes whose command line mentions `needle` (to prove nothing outlived a kill).
pub fn processes_mentioning(needle: &str) -> Vec<u32> {
    let mut out = vec![];
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
            if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
                if String::from_utf8_lossy(&cmd).contains(needle) && halyard_tests::pid_alive(pid) {
                    out.push(pid);
                }
            }
        }
    }
    out
}

/// `halyard run` on `body` (written to `<dir>/<name>.toml`) must fail before starting,
/// with `needle` and the sweep file's name in its error output.
pub fn assert_sweep_rejected(dir: &Path, name: &str, body: &str, needle: &str) {
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(&p, body).unwrap();
    let out = halyard()
        .args(["run", p.to_str().unwrap(), "--out", dir.join("o").to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{name} succeeded");
    assert!(err.contains(needle), "{name}: {needle:?} not in: {err}");
    assert!(err.contains(&format!("{name}.toml")), "{name}: file not named: {err}");
}

/// Issue 29: `sweep` (named `name`), already run without faults into `clean_out`, run
/// again into a fresh directory under `tmp` with `faults` on (503s, bodies cut mid-way,
/// empty bodies, truncated JSON) and the API killed for 2 s mid-run, gives the same
/// figures (`report.json`'s `benchmarks`), the same `labels.jsonl`, label by label, and the
/// same dead letters. Panics naming the first difference; returns the faults injected.
pub fn rerun_with_faults(
    api: &halyard_tests::FakeOpenAi,
    faults: &halyard_tests::Faults,
    sweep: &Path,
    name: &str,
    clean_out: &Path,
    tmp: &Path,
) -> [usize; 4] {
    use std::sync::atomic::{AtomicBool, Ordering};
    let out = tmp.join("with-faults");
    // A job's delivery budget must outlast what the faults may cost it: each fault the
    // injector gives a request counts a delivery, and so does the call that finds the
    // killed API first (it opens the pool's pause; later calls wait without spending
    // the budget). One delivery more is left for the real answer.
    let budget = halyard_tests::faults::FAULTS_PER_REQUEST + 2;
    let text = std::fs::read_to_string(sweep).expect("sweep");
    assert!(text.contains("max_deliver = 3\n"), "the faulty rerun sets its own max_deliver");
    let sweep = &tmp.join("with-faults.toml");
    std::fs::write(sweep, text.replace("max_deliver = 3\n", &format!("max_deliver = {budget}\n")))
        .expect("sweep with faults");
    faults.enable();
    let done = AtomicBool::new(false);
    let (stated, killed) = std::thread::scope(|s| {
        let kill = s.spawn(|| {
            halyard_tests::faults::kill_during(api, 20, std::time::Duration::from_secs(2), &done)
        });
        let (_, stated) =
            run_complete(&["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()]);
        done.store(true, Ordering::SeqCst);
        (stated, kill.join().expect("kill thread"))
    });
    let injected = faults.injected();
    assert!(injected.iter().all(|n| *n > 0), "every kind of fault injected: {injected:?}");
    assert!(killed, "the API was killed mid-run");
    let (clean, faulty) = (
        read_json(&clean_out.join(name).join("report.json")),
        read_json(&out.join(name).join("report.json")),
    );
    assert_eq!(stated, faulty["jobs"]["dead_letters"].as_u64().unwrap_or(0));
    assert_eq!(
        faulty["jobs"]["dead_letters"], clean["jobs"]["dead_letters"],
        "dead letters with faults ({injected:?} injected): {}",
        faulty["dead_letters"]
    );
    let (cb, fb) =
        (clean["benchmarks"].as_array().unwrap(), faulty["benchmarks"].as_array().unwrap());
    assert_eq!(cb.len(), fb.len());
    for (c, f) in cb.iter().zip(fb) {
        assert_eq!(f, c, "a figure moved under faults ({injected:?} injected)");
    }
    let labels = |dir: &Path| {
        std::fs::read_to_string(dir.join(name).join("labels.jsonl")).expect("labels.jsonl")
    };
    let (cl, fl) = (labels(clean_out), labels(&out));
    assert_eq!(cl.lines().count(), fl.lines().count(), "labels.jsonl rows");
    for (i, (c, f)) in cl.lines().zip(fl.lines()).enumerate() {
        assert_eq!(f, c, "labels.jsonl line {} differs under faults", i + 1);
    }
    injected
}

/// `rules` with every text answer reporting `prompt_tokens = completion_tokens = 2^64 − 1`
/// (issue 33: an API's word about its usage is clamped).
pub fn absurd_usage(
    rules: impl Fn(&ChatCall) -> Reply + Send + Sync + 'static,
) -> impl Fn(&ChatCall) -> Reply + Send + Sync + 'static {
    move |c| match rules(c) {
        Reply::Text(text) => {
            Reply::TextWithUsage { text, prompt_tokens: u64::MAX, completion_tokens: u64::MAX }
        }
        other => other,
    }
}

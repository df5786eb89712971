//! Claude as a first-class model (issue 52): HypoTermQA with a Claude model under test
//! and a Claude judge through the native Messages API (`backend = "anthropic"`), against
//! the test kit's fake Anthropic server (real HTTP), with the embedded broker.
//!
//! - Online, across two kill -9s of `halyard run` (with 529 bursts, 429s with
//!   `retry-after` and connections reset mid-answer on the way): the report and labels
//!   equal an uninterrupted run's; every request the fake answered is counted once (calls
//!   paid twice are at most those in flight at the kills); the cost in the report is the
//!   usage the fake reported, prompt-cache writes and reads included, at the sweep's
//!   prices; the judge's prompt-cache hits are in the report.
//! - A sweep whose Anthropic model has no `max_tokens` is refused, naming the key.
//! - In batch mode (Message Batches), across two kill -9s (failpoint aborts right after a
//!   batch is created and before its id is recorded, and right after a batch's results
//!   were read), with batches ending in a mix of succeeded, errored, canceled and expired
//!   results and results files padded past what a reader should hold: the report equals
//!   the uninterrupted run's, no answered request is submitted again, every paid request
//!   is counted once and the cost is the fake's usage at the batch price (half).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::*;
use halyard_tests::fake_anthropic::{self, BatchScript, Fate, Limits, Paid};
use halyard_tests::{ChildGuard, FakeAnthropic, Reply};
use serde_json::Value;

/// The sweep's prices (USD per million tokens): model under test, judge.
const MODEL_PRICE: (f64, f64) = (3.0, 15.0);
const JUDGE_PRICE: (f64, f64) = (1.0, 5.0);
/// Calls in flight per pool.
const CONCURRENCY: usize = 4;

fn sweep(dir: &Path, name: &str, base_url: &str, limit: usize) -> PathBuf {
    sweep_in(dir, name, base_url, limit, &format!("max_concurrency = {CONCURRENCY}"))
}

/// The sweep with `mode` (the pool's mode keys) on both models.
fn sweep_in(dir: &Path, name: &str, base_url: &str, limit: usize, mode: &str) -> PathBuf {
    let text = format!(
        r#"name = "{name}"

[[model]]
name = "claude-under-test"
backend = "anthropic"
base_url = "{base_url}"
model = "claude-sonnet-4-5"
api_key_env = "CLAUDE_TEST_API_KEY"
pool = "anthropic-key"
max_tokens = 256
{mode}
price = {{ input = {mi}, output = {mo} }}

[[model]]
name = "claude-judge"
backend = "anthropic"
base_url = "{base_url}"
model = "claude-haiku-4-5"
api_key_env = "CLAUDE_TEST_API_KEY"
pool = "anthropic-key"
max_tokens = 256
{mode}
prompt_cache = "5m"
price = {{ input = {ji}, output = {jo} }}

[[benchmark]]
pipeline = "hypotermqa"
dataset = "{dataset}"
models = ["claude-under-test"]
judge = "claude-judge"
semantics = "paper"
limit = {limit}

[run]
ack_wait_s = 5
max_deliver = 5
"#,
        mi = MODEL_PRICE.0,
        mo = MODEL_PRICE.1,
        ji = JUDGE_PRICE.0,
        jo = JUDGE_PRICE.1,
        dataset = dataset().display()
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).expect("write sweep");
    path
}

fn halyard_anthropic() -> std::process::Command {
    let mut c = halyard();
    c.env("CLAUDE_TEST_API_KEY", "sk-ant-test");
    c
}

fn run(sweep: &Path, out: &Path) {
    let o = halyard_anthropic()
        .args(["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()])
        .output()
        .expect("run halyard");
    assert!(
        o.status.success(),
        "halyard run failed: {:?}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The USD of one answer at the sweep's prices, from the usage the fake reported.
fn cost_of(p: &Paid) -> f64 {
    let u = p.usage;
    let (input, output) =
        if p.call.model == "claude-haiku-4-5" { JUDGE_PRICE } else { MODEL_PRICE };
    (u.input_tokens as f64 * input
        + u.cache_write_5m as f64 * input * 1.25
        + u.cache_write_1h as f64 * input * 2.0
        + u.cache_read as f64 * input * 0.1
        + u.output_tokens as f64 * output)
        / 1e6
}

/// Answers by request (model and messages; distinct jobs may ask the same), in order.
fn by_request(paid: &[Paid]) -> HashMap<String, Vec<&Paid>> {
    let mut out: HashMap<String, Vec<&Paid>> = HashMap::new();
    for p in paid {
        out.entry(halyard_tests::request_key(&p.call)).or_default().push(p);
    }
    out
}

/// What a resumed run's answers `paid` cost, each counted once: of a request asked `n`
/// times by the uninterrupted run (`reference`), the last `n` answers (an answer lost to
/// a kill was never checkpointed, so its retry's is the one counted); and how many
/// answers beyond those were paid (twice).
fn resumed_cost(paid: &[Paid], reference: &[Paid]) -> (f64, usize) {
    let want: HashMap<String, usize> =
        by_request(reference).into_iter().map(|(k, v)| (k, v.len())).collect();
    let (mut cost, mut extra) = (0.0, 0);
    for (k, answers) in by_request(paid) {
        let n = want.get(&k).copied().unwrap_or(0).min(answers.len());
        extra += answers.len() - n;
        cost += answers[answers.len() - n..].iter().map(|p| cost_of(p)).sum::<f64>();
    }
    (cost, extra)
}

fn total_cost(report: &Value) -> f64 {
    report["costs"]["total"].as_f64().unwrap_or_else(|| panic!("costs.total: {}", report["costs"]))
}

/// Σ of a per-model cost figure over the models.
fn by_model_sum(report: &Value, field: &str) -> u64 {
    report["costs"]["by_model"]
        .as_array()
        .unwrap_or_else(|| panic!("costs.by_model: {}", report["costs"]))
        .iter()
        .map(|m| m[field].as_u64().unwrap_or(0))
        .sum()
}

/// Issue 52: HypoTermQA with a Claude model and a Claude judge over the Messages API,
/// killed with SIGKILL twice and resumed, faults on the way: the report equals the
/// uninterrupted run's, each answered request is counted once, and the cost is the
/// fake's reported usage (cache writes and reads included) at the sweep's prices.
#[test]
fn claude_online_across_two_kills_equals_the_uninterrupted_run() {
    let qs = load_questions(120);
    let rules = responder(question_index(&qs), None);
    // Faults by arrival order: a burst of 529s, 429s with retry-after, resets mid-answer.
    let fake = FakeAnthropic::start(Limits::default(), move |c| {
        let reply = match c.seq % 97 {
            10..=13 => fake_anthropic::overloaded(),
            30 | 70 => fake_anthropic::rate_limited(1),
            50 => Reply::ResetMidBody("cut".into()),
            _ => rules(c),
        };
        reply.after(Duration::from_millis(10))
    });
    let dir = tempfile::tempdir().unwrap();
    let sweep = sweep(dir.path(), "claude", &fake.base_url(), 120);

    let out_ref = dir.path().join("ref");
    run(&sweep, &out_ref);
    let paid_ref = fake.paid();
    let cost_ref: f64 = paid_ref.iter().map(cost_of).sum();
    let requests_ref = paid_ref.len();
    let a = read_json(&out_ref.join("claude/report.json"));
    assert_eq!(a["jobs"]["dead_letters"], 0, "{}", a["jobs"]);
    assert!(
        (total_cost(&a) - cost_ref).abs() < 1e-9,
        "reference cost {} vs {cost_ref}",
        total_cost(&a)
    );
    assert_eq!(by_model_sum(&a, "jobs") as usize, requests_ref, "jobs vs requests answered");
    // The judge's fixed instruction was written to the cache, then read.
    assert!(by_model_sum(&a, "prompt_cache_reads") > 0, "{}", a["costs"]["by_model"]);
    assert!(by_model_sum(&a, "prompt_cache_writes") > 0);

    // The same sweep in another output directory, killed twice.
    let out = dir.path().join("killed");
    let mut in_flight_bound = 0;
    for kill in 1..=2 {
        let before = fake.paid().len();
        let mut child = ChildGuard::spawn({
            let mut c = halyard_anthropic();
            c.args(["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()]);
            c
        });
        let deadline = Instant::now() + Duration::from_secs(180);
        while fake.paid().len() < before + requests_ref / 4 {
            assert!(Instant::now() < deadline, "kill {kill}: the run made no progress");
            assert!(child.try_wait().is_none(), "kill {kill}: halyard exited before the kill");
            std::thread::sleep(Duration::from_millis(5));
        }
        child.kill();
        // Two pools' slots: calls answered but not yet checkpointed at the kill.
        in_flight_bound += 2 * CONCURRENCY;
        let needle = out.to_str().unwrap().to_string();
        let gone = Instant::now() + Duration::from_secs(10);
        while !processes_mentioning(&needle).is_empty() {
            assert!(Instant::now() < gone, "processes outlived the kill");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    run(&sweep, &out);
    let paid = fake.paid()[paid_ref.len()..].to_vec();
    let (cost, twice) = resumed_cost(&paid, &paid_ref);
    let requests = paid.len() - twice;
    let b = read_json(&out.join("claude/report.json"));
    assert_eq!(a["benchmarks"], b["benchmarks"], "report differs from the uninterrupted run's");
    assert_same_labels(&out_ref, &out);
    assert_eq!(b["jobs"]["dead_letters"], 0);
    assert_eq!(requests, requests_ref, "requests answered");
    assert_eq!(by_model_sum(&b, "jobs") as usize, requests, "each answered request counted once");
    assert!(
        twice <= in_flight_bound,
        "{twice} requests paid twice; at most {in_flight_bound} in flight at the kills"
    );
    assert!(
        (total_cost(&b) - cost).abs() < 1e-9,
        "cost {} vs the fake's usage {cost}",
        total_cost(&b)
    );
    eprintln!(
        "claude online: {requests} requests, reference ${cost_ref:.6}; killed twice: {} answers ({twice} paid twice), ${cost:.6}",
        paid.len()
    );
}

/// Issue 52: the Messages API requires max_tokens: a sweep without it is refused when
/// checked, naming the key; so is a temperature above the API's 1.
#[test]
fn claude_without_max_tokens_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let body = |extra: &str| {
        format!(
            "name = \"x\"\n[[model]]\nname = \"c\"\nbackend = \"anthropic\"\nbase_url = \"https://api.anthropic.com/v1\"\nmodel = \"claude-sonnet-4-5\"\n{extra}\n\n[[model]]\nname = \"free\"\nbackend = \"noop\"\n\n[[benchmark]]\npipeline = \"noop\"\njobs = 1\nmodels = [\"free\"]\n"
        )
    };
    assert_sweep_rejected(dir.path(), "nomax", &body(""), "model[0].max_tokens");
    assert_sweep_rejected(
        dir.path(),
        "hot",
        &body("max_tokens = 5\ntemperature = 1.5"),
        "model[0].temperature",
    );
}

/// The batch-mode keys of the batch test: one batch per stage (120 requests), submitted
/// after 0.3 s of gathering.
const BATCH_MODE: &str = "mode = \"batch\"\nbatch_size = 1000\nbatch_wait_s = 0.3";

/// A fake whose batches end after 300 ms with a mix of results: of the requests seen for
/// the first time, by a hash of the request, one in 9 expires, one in 11 is canceled and
/// one in 13 errors with `overloaded_error` (each answered in a later batch); results
/// files carry `padding` bytes of blank lines first; every 7th batch-API request is a 529;
/// the first `cut_creates` creates make their batch but their answers break off.
fn batch_fake(qs: &[Question], padding: u64, cut_creates: u64) -> FakeAnthropic {
    fn hash(c: &halyard_tests::ChatCall) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        halyard_tests::request_key(c).hash(&mut h);
        h.finish()
    }
    let rules = responder(question_index(qs), None);
    let overloaded = std::sync::Mutex::new(std::collections::HashSet::new());
    let script = BatchScript {
        delay: Duration::from_millis(300),
        fate: std::sync::Arc::new(|c: &halyard_tests::ChatCall, before: u32| {
            match (before, hash(c)) {
                (0, h) if h % 9 == 1 => Fate::Expired,
                (0, h) if h % 11 == 2 => Fate::Canceled,
                _ => Fate::Run,
            }
        }),
        padding,
        fault_every: Some(7),
        cut_create_replies: cut_creates,
    };
    FakeAnthropic::start_with_batches(Limits::default(), script, move |c| {
        if hash(c) % 13 == 3 && overloaded.lock().unwrap().insert(halyard_tests::request_key(c)) {
            return fake_anthropic::overloaded();
        }
        rules(c)
    })
}

fn halyard_batch() -> std::process::Command {
    let mut c = halyard_anthropic();
    c.env("HALYARD_BATCH_POLL_MS", "100").env("HALYARD_BATCH_LEASE_MS", "2000");
    c
}

/// The USD of one batch answer: [`cost_of`] at the batch price (half).
fn batch_cost_of(p: &Paid) -> f64 {
    cost_of(p) * 0.5
}

/// No request went into a batch again once a batch had answered it (`succeeded`): each
/// later submission of a custom id follows a result that was not an answer, and every
/// batch ended. Returns the requests answered in batches.
fn assert_no_request_submitted_again(fake: &FakeAnthropic) -> usize {
    let mut last: HashMap<String, Option<String>> = HashMap::new();
    let mut answered = 0;
    for b in fake.batches() {
        assert!(b.ended, "batch {} never ended", b.id);
        let results: HashMap<&str, &str> =
            b.results.iter().map(|(c, t)| (c.as_str(), t.as_str())).collect();
        for id in &b.custom_ids {
            if let Some(prev) = last.get(id) {
                assert_ne!(
                    prev.as_deref(),
                    Some("succeeded"),
                    "request {id} submitted again in {} after it was answered",
                    b.id
                );
            }
            let r = results.get(id.as_str()).map(|t| t.to_string());
            answered += usize::from(r.as_deref() == Some("succeeded"));
            last.insert(id.clone(), r);
        }
    }
    answered
}

/// The labels of the runs in `a` and `b` are the same, job ids aside: a job's id names
/// its endpoint, and the batch test's two fakes listen on different ports.
fn assert_same_labels(a: &Path, b: &Path) {
    let la = labels_without_ids(&a.join("claude/labels.jsonl"));
    let lb = labels_without_ids(&b.join("claude/labels.jsonl"));
    assert_eq!(la.len(), lb.len(), "labels: lines");
    if let Some((x, y)) = la.iter().zip(&lb).find(|(x, y)| x != y) {
        panic!("labels differ from the uninterrupted run's:\n{x}\n{y}");
    }
}

/// The lines of a labels file with every `job_id` and `answer_job` removed.
fn labels_without_ids(path: &Path) -> Vec<Value> {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.remove("job_id");
                m.remove("answer_job");
                m.values_mut().for_each(strip);
            }
            Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).expect("a labels line");
            strip(&mut v);
            v
        })
        .collect()
}

/// Run to its end (exit 0) or to the failpoint's abort (`point`).
fn run_batch(sweep: &Path, out: &Path, point: Option<&str>) -> String {
    let mut c = halyard_batch();
    c.args(["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    if let Some(p) = point {
        c.env("HALYARD_FAILPOINT", p);
    }
    let o = c.output().expect("run halyard");
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    match point {
        None => assert!(o.status.success(), "halyard run failed: {:?}\n{stderr}", o.status),
        Some(p) => {
            assert!(!o.status.success(), "{p}: the run was to abort");
            assert!(stderr.contains("HALYARD_FAILPOINT: reached"), "{p}: {stderr}");
            let needle = out.to_str().unwrap().to_string();
            let gone = Instant::now() + Duration::from_secs(10);
            while !processes_mentioning(&needle).is_empty() {
                assert!(Instant::now() < gone, "processes outlived the abort");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    stderr
}

/// Issue 52: HypoTermQA with a Claude model under test and a Claude judge in batch mode
/// (Message Batches), killed twice: right after a batch was created and before its id
/// was recorded (the next run finds it by its request count and creation time instead
/// of creating another), and right after a batch's results were read. The report equals
/// the uninterrupted run's; no request is submitted again once answered; each paid
/// answer counted once; the cost is the fake's usage at half the price; the four result
/// types all occurred; results files 40 MiB longer than their answers were streamed.
#[test]
fn claude_batch_across_two_kills_equals_the_uninterrupted_run() {
    let qs = load_questions(120);
    let dir = tempfile::tempdir().unwrap();

    // The uninterrupted run, on a fake of its own (fates depend on what a fake saw).
    // Its first create's answer breaks off after the batch was made: the run looks for
    // the batch and polls it instead of creating it again (checked below: no request
    // runs in two batches).
    let fake_ref = batch_fake(&qs, 0, 1);
    let sweep_ref = sweep_in(dir.path(), "claude", &fake_ref.base_url(), 120, BATCH_MODE);
    let out_ref = dir.path().join("ref");
    let first = run_batch(&sweep_ref, &out_ref, None);
    assert!(
        first.contains("found the batch created before its id was recorded"),
        "the batch whose create answer broke off was not found:\n{first}"
    );
    let a = read_json(&out_ref.join("claude/report.json"));
    assert_eq!(a["jobs"]["dead_letters"], 0, "{}", a["jobs"]);
    let answered_ref = assert_no_request_submitted_again(&fake_ref);
    let paid_ref = fake_ref.paid();
    assert!(paid_ref.iter().all(|p| p.batch.is_some()), "online calls in batch mode");
    assert_eq!(answered_ref, paid_ref.len());
    assert_eq!(by_model_sum(&a, "jobs") as usize, paid_ref.len(), "jobs vs answers");
    let cost_ref: f64 = paid_ref.iter().map(batch_cost_of).sum();
    assert!((total_cost(&a) - cost_ref).abs() < 1e-9, "cost {} vs {cost_ref}", total_cost(&a));
    let kinds: std::collections::HashSet<String> =
        fake_ref.batches().iter().flat_map(|b| b.results.iter().map(|(_, t)| t.clone())).collect();
    for kind in ["succeeded", "errored", "canceled", "expired"] {
        assert!(kinds.contains(kind), "no {kind} result: {kinds:?}");
    }

    // The same sweep on a fresh fake, results padded by 40 MiB each, killed twice by
    // failpoint aborts (the process dies at once, as with SIGKILL).
    let fake = batch_fake(&qs, 40 << 20, 0);
    let sweep = sweep_in(dir.path(), "claude", &fake.base_url(), 120, BATCH_MODE);
    let out = dir.path().join("killed");
    run_batch(&sweep, &out, Some("batch-created:1"));
    let created_first = fake.batches().len();
    assert_eq!(created_first, 1, "the first kill came right after the first create");
    let second = run_batch(&sweep, &out, Some("batch-downloaded:1"));
    // The batch the first run created before it died was found, not created again.
    assert!(
        second.contains("found the batch created before its id was recorded"),
        "the second run did not adopt the first run's batch:\n{second}"
    );
    run_batch(&sweep, &out, None);
    let b = read_json(&out.join("claude/report.json"));
    assert_eq!(a["benchmarks"], b["benchmarks"], "report differs from the uninterrupted run's");
    assert_same_labels(&out_ref, &out);
    assert_eq!(b["jobs"]["dead_letters"], 0);
    let answered = assert_no_request_submitted_again(&fake);
    let paid = fake.paid();
    assert_eq!(answered, paid.len());
    assert!(paid.iter().all(|p| p.batch.is_some()), "online calls in batch mode");
    assert_eq!(paid.len(), paid_ref.len(), "answers paid vs the uninterrupted run's");
    assert_eq!(by_model_sum(&b, "jobs") as usize, paid.len(), "each paid answer counted once");
    let cost: f64 = paid.iter().map(batch_cost_of).sum();
    assert!(
        (total_cost(&b) - cost).abs() < 1e-9,
        "cost {} vs the fake's usage {cost}",
        total_cost(&b)
    );
    assert!(fake.results_served() > fake.batches().len() as u64, "results read again");
    eprintln!(
        "claude batch: {} answers in {} batches (reference {} in {}), ${cost:.6} (reference \
         ${cost_ref:.6})",
        paid.len(),
        fake.batches().len(),
        paid_ref.len(),
        fake_ref.batches().len(),
    );
}

/// Issue 52 with issue 48: `halyard check` probes Claude models in their own dialect
/// (`x-api-key` and `anthropic-version`, which the fake requires, `GET /v1/models`, one
/// minimal message to `/v1/messages`): both models reachable, key accepted, known to the
/// list, answer of the API's shape; the probe's usage priced. A key variable that is not
/// set is named, nothing called; `halyard run`'s own check refuses the same sweep.
#[test]
fn check_probes_claude_models() {
    let fake = FakeAnthropic::start(Limits::default(), |_| Reply::Text("OK".into()));
    let dir = tempfile::tempdir().unwrap();
    let sweep = sweep(dir.path(), "claude", &fake.base_url(), 4);
    let o = halyard_anthropic().args(["check", sweep.to_str().unwrap()]).output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&o.stderr));
    for model in ["claude-under-test", "claude-judge"] {
        let row = stdout.lines().find(|l| l.starts_with(model)).unwrap_or_default();
        let cells: Vec<&str> = row.split("  ").filter(|c| !c.is_empty()).map(str::trim).collect();
        assert_eq!(cells.get(2..6), Some(&["yes", "yes", "yes", "yes"][..]), "{stdout}");
        assert!(cells.get(6).is_some_and(|l| l.ends_with(" ms")), "{stdout}");
    }
    assert!(stdout.contains("probe calls: 2 chat completion(s)"), "{stdout}");
    let calls = fake.calls();
    assert_eq!(calls.len(), 2, "one probe per model");
    assert!(calls.iter().all(|c| c.max_tokens == Some(5)), "{calls:?}");

    // The key variable unset: named, by check and by run's check, and nothing called.
    for args in [vec!["check"], vec!["run"]] {
        let mut c = halyard();
        c.env_remove("CLAUDE_TEST_API_KEY").args(&args).arg(&sweep);
        if args == ["run"] {
            c.args(["--out", dir.path().join("out").to_str().unwrap()]);
        }
        let o = c.output().unwrap();
        let text =
            format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert_eq!(o.status.code(), Some(5), "{args:?}: {text}");
        assert!(text.contains("`$CLAUDE_TEST_API_KEY`"), "{args:?}: {text}");
    }
    assert_eq!(fake.calls().len(), 2, "a probe without a key made a call");
}

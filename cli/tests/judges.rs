//! Judging the judges (issue 31), end to end: `halyard run` of HypoTermQA with a
//! three-judge panel of fake API judges with designed error rates, one of which is also a
//! model under test and favours its own answers, against a synthetic human labels file
//! with two annotators.
//!
//! The fake judges answer by the content of each request alone: for an answer (question,
//! answering model) the truth is "hallucination" or "valid" by a hash; judge j states the
//! opposite with probability `ERROR[j]` (by a hash of judge, question and model), and
//! judge-c, on answers of its own model that are hallucinations and that it would not
//! have mislabelled anyway, says "valid" with probability `SELF_BIAS`. Each verdict is
//! expressed through the paper's term checks (acceptance UNREAL/MENTIONED, meaning TRUE),
//! so the pipeline's own labelling turns it back into the answer label.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;
use halyard_tests::{ChatCall, ChildGuard, FakeOpenAi, Reply};
use serde_json::Value;

/// Designed error rates of judge-a, judge-b, judge-c.
const ERROR: [f64; 3] = [0.05, 0.15, 0.25];
const JUDGES: [&str; 3] = ["judge-a", "judge-b", "judge-c"];
/// judge-c's extra "valid" on its own model's hallucinations.
const SELF_BIAS: f64 = 0.6;
/// The second annotator disagrees with the first on this share of answers.
const ANNOTATOR_NOISE: f64 = 0.1;
const QUESTIONS: usize = 150;

/// A uniform number in [0, 1) from a string.
fn unit(s: &str) -> f64 {
    (fnv(s) >> 11) as f64 / (1u64 << 53) as f64
}

fn truth_hallucination(qid: i64, model: &str) -> bool {
    unit(&format!("truth/{qid}/{model}")) < 0.5
}

/// What judge `j` says of the answer of `model` to question `qid`: hallucination?
fn judge_says_hallucination(j: usize, qid: i64, model: &str) -> bool {
    let truth = truth_hallucination(qid, model);
    let flip = unit(&format!("err/{}/{qid}/{model}", JUDGES[j])) < ERROR[j];
    let mut says = truth != flip;
    if j == 2 && model == "judge-c" && says && truth && unit(&format!("self/{qid}")) < SELF_BIAS {
        says = false;
    }
    says
}

const LABELS: [&str; 3] = ["valid", "hallucination", "irrelevant"];

/// How many of the question's terms the paper's string match finds in the answer (the
/// answer repeats the question): a term not found is irrelevant, and so is an answer
/// whose every other term is valid.
fn included(q: &Question, inclusion: &HashMap<(String, String), bool>) -> (usize, usize) {
    let inc = q
        .terms
        .iter()
        .filter(|(t, _)| inclusion.get(&(q.question.clone(), t.clone())).copied().unwrap_or(true))
        .count();
    (inc, q.terms.len())
}

/// The answer label a reader (or a judge that says `hall`) gives under the paper's rules.
fn answer_label(hall: bool, (inc, all): (usize, usize)) -> usize {
    match (inc, hall) {
        (0, _) => 2,
        (_, true) => 1,
        _ if inc == all => 0,
        _ => 2,
    }
}

fn truth_label(q: &Question, model: &str, inclusion: &HashMap<(String, String), bool>) -> usize {
    answer_label(truth_hallucination(q.id, model), included(q, inclusion))
}

fn judge_label(
    j: usize,
    q: &Question,
    model: &str,
    inclusion: &HashMap<(String, String), bool>,
) -> usize {
    answer_label(judge_says_hallucination(j, q.id, model), included(q, inclusion))
}

fn between<'a>(s: &'a str, a: &str, b: &str) -> Option<&'a str> {
    let start = s.find(a)? + a.len();
    let end = s[start..].find(b)? + start;
    Some(&s[start..end])
}

fn responder(
    questions: HashMap<String, i64>,
    hypothetical_terms: HashMap<String, bool>,
) -> impl Fn(&ChatCall) -> Reply + Send + Sync + 'static {
    move |call: &ChatCall| {
        let msgs = &call.messages;
        let system = msgs.first().map(|(_, c)| c.as_str()).unwrap_or("");
        if !system.starts_with("You are a linguistic expert.") {
            let q = msgs.last().map(|(_, c)| c.clone()).unwrap_or_default();
            if !questions.contains_key(&q) {
                return Reply::Status {
                    code: 400,
                    body: format!("unknown question {q:?}"),
                    retry_after: None,
                };
            }
            // The answering model names itself, so that a judge can tell whose it is.
            return Reply::Text(format!("Here is what I know ({}): {q}", call.model));
        }
        let Some(j) = JUDGES.iter().position(|n| call.model == format!("fake-{n}")) else {
            return Reply::Status {
                code: 400,
                body: format!("unknown judge {}", call.model),
                retry_after: None,
            };
        };
        let user = &msgs[1].1;
        let (Some(question), Some(answer)) = (
            between(user, "QUESTION => ", "\nANSWER => "),
            between(user, "ANSWER => ", "\n\nINSTRUCTION"),
        ) else {
            return Reply::Text("no question".into());
        };
        let (Some(&qid), Some(model)) = (questions.get(question), between(answer, "(fake-", "):"))
        else {
            return Reply::Text("unknown answer".into());
        };
        let term = between(user, "{\"term\":\"", "\",\n\"reasoning\"").unwrap_or("");
        let hypothetical = hypothetical_terms.get(term).copied().unwrap_or(false);
        let hall = judge_says_hallucination(j, qid, model);
        if system.contains("Verify if the answer uses the term in its real meaning.") {
            // Only asked for real terms the judge said were mentioned: the answer is valid.
            return Reply::Text(format!(
                "{{\"term\":\"{term}\",\"reasoning\":\"r\",\"verified\":\"TRUE\"}}"
            ));
        }
        let certainty = match (hall, hypothetical) {
            (true, true) => "MENTIONED",
            (true, false) => "UNREAL",
            (false, true) => "UNREAL",
            (false, false) => "MENTIONED",
        };
        Reply::Text(format!(
            "{{\"term\":\"{term}\",\"reasoning\":\"r\",\"certainty\":\"{certainty}\"}}"
        ))
    }
}

fn sweep(
    dir: &Path,
    name: &str,
    base_url: &str,
    labels: Option<&Path>,
    concurrency: usize,
) -> std::path::PathBuf {
    let mut models = String::new();
    for (m, remote) in [
        ("model-a", "fake-model-a"),
        ("judge-a", "fake-judge-a"),
        ("judge-b", "fake-judge-b"),
        ("judge-c", "fake-judge-c"),
    ] {
        models.push_str(&format!(
            "[[model]]\nname = \"{m}\"\nbackend = \"openai\"\nbase_url = \"{base_url}\"\nmodel = \"{remote}\"\nmax_concurrency = {concurrency}\nprice = {{ input = 1.0, output = 2.0 }}\n\n"
        ));
    }
    let labels =
        labels.map(|p| format!("human_labels = \"{}\"\n", p.display())).unwrap_or_default();
    let text = format!(
        "name = \"{name}\"\n\n{models}[[benchmark]]\npipeline = \"hypotermqa\"\ndataset = \"{}\"\nmodels = [\"model-a\", \"judge-c\"]\njudges = [\"judge-a\", \"judge-b\", \"judge-c\"]\npanel = \"mace\"\nsemantics = \"paper\"\nlimit = {QUESTIONS}\n{labels}\n[run]\nack_wait_s = 5\nmax_deliver = 3\n",
        dataset().display()
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// Two annotators: h1 gives the truth, h2 the truth except on `ANNOTATOR_NOISE` of the
/// answers; plus one label for an item the run never judged.
fn labels_file(dir: &Path, qs: &[Question]) -> std::path::PathBuf {
    let inclusion = golden_inclusion();
    let mut out = String::new();
    for q in qs {
        for model in ["model-a", "judge-c"] {
            let truth = truth_label(q, model, &inclusion);
            let t = truth == 1;
            let name = |h: bool| {
                if h == t {
                    LABELS[truth]
                } else if h {
                    "hallucination"
                } else {
                    "valid"
                }
            };
            out.push_str(&format!("{{\"item\": {}, \"model\": \"{model}\", \"label\": \"{}\", \"annotator\": \"h1\"}}\n", q.id, name(t)));
            let noisy = unit(&format!("h2/{}/{model}", q.id)) < ANNOTATOR_NOISE;
            out.push_str(&format!("{{\"item\": \"{}\", \"model\": \"{model}\", \"label\": \"{}\", \"annotator\": \"h2\"}}\n", q.id, name(t != noisy)));
        }
    }
    out.push_str(
        "{\"item\": 999999, \"model\": \"model-a\", \"label\": \"valid\", \"annotator\": \"h1\"}\n",
    );
    let p = dir.join("human.jsonl");
    std::fs::write(&p, out).unwrap();
    p
}

fn judges_entry(report: &Value) -> &Value {
    let j = &report["judges"][0];
    assert_eq!(j["pipeline"], "hypotermqa", "{}", report["judges"]);
    j
}

/// Every designed property shows in the report.
fn check_figures(report: &Value, qs: &[Question]) {
    let inclusion = golden_inclusion();
    let j = judges_entry(report);
    assert_eq!(j["judges"], serde_json::json!(JUDGES));
    assert_eq!(j["units"], 2 * QUESTIONS as u64);
    let human = &j["human"];
    assert_eq!(human["unknown"], 1, "{human}");
    assert_eq!(human["unknown_listed"][0]["item"], "999999");
    assert_eq!(human["annotators"], 2);
    // Units whose two annotators differ have no truth.
    let ties = qs
        .iter()
        .flat_map(|q| ["model-a", "judge-c"].map(|m| (q.id, m)))
        .filter(|(q, m)| unit(&format!("h2/{q}/{m}")) < ANNOTATOR_NOISE)
        .count() as u64;
    assert_eq!(human["annotator_ties"], ties);
    assert_eq!(human["units_with_truth"], 2 * QUESTIONS as u64 - ties);
    assert!(human["inter_annotator_alpha"]["estimate"].as_f64().unwrap() > 0.6, "{human}");
    // Per judge: the designed error rate lies in the Wilson interval of the measured one,
    // and the measured one equals the count from the rules.
    let designed = |j: usize| {
        if j == 2 {
            // Half the answers are its own; half of those are hallucinations.
            ERROR[2] + (1.0 - ERROR[2]) * SELF_BIAS * 0.5 * 0.5
        } else {
            ERROR[j]
        }
    };
    for (n, pj) in j["per_judge"].as_array().unwrap().iter().enumerate() {
        assert_eq!(pj["judge"], JUDGES[n]);
        let v = &pj["vs_human"];
        let rate = &v["error_rate"];
        let (low, high) = (rate["low"].as_f64().unwrap(), rate["high"].as_f64().unwrap());
        let d = designed(n);
        assert!(low <= d && d <= high, "{}: designed {d} outside [{low}, {high}]", JUDGES[n]);
        let mut errors = 0u64;
        let mut total = 0u64;
        for q in qs {
            for m in ["model-a", "judge-c"] {
                if unit(&format!("h2/{}/{m}", q.id)) < ANNOTATOR_NOISE {
                    continue;
                }
                total += 1;
                errors +=
                    u64::from(judge_label(n, q, m, &inclusion) != truth_label(q, m, &inclusion));
            }
        }
        assert_eq!(v["n"], total);
        let measured = rate["estimate"].as_f64().unwrap();
        assert!(
            (measured - errors as f64 / total as f64).abs() < 1e-12,
            "{} {measured} vs rules {errors}/{total}; confusion {}",
            JUDGES[n],
            v["confusion"]
        );
        // The confusion matrix is over valid/hallucination/irrelevant, rows human.
        let cm = &v["confusion"]["counts"];
        let off: u64 = (0..3)
            .flat_map(|r| (0..3).map(move |c| (r, c)))
            .filter(|(r, c)| r != c)
            .map(|(r, c)| cm[r][c].as_u64().unwrap())
            .sum();
        assert_eq!(off, errors);
        assert!(v["kappa"]["estimate"].as_f64().unwrap() > 0.0);
    }
    // MACE ranks the designed competences.
    let comp: Vec<f64> = j["per_judge"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["mace_competence"].as_f64().unwrap())
        .collect();
    assert!(comp[0] > comp[1] && comp[1] > comp[2], "MACE competences {comp:?}");
    assert!(j["panel"]["mace"]["converged"].as_bool().is_some());
    // The panel is better than its worst judge against humans.
    let panel_err = j["panel"]["vs_human"]["error_rate"]["estimate"].as_f64().unwrap();
    assert!(panel_err < designed(2), "panel error {panel_err}");
    // Between judges: every pair, Fleiss and Krippendorff, error correlations.
    let b = &j["between"];
    assert_eq!(b["pairwise_kappa"].as_array().unwrap().len(), 3);
    assert!(b["fleiss_kappa"]["estimate"].as_f64().is_some(), "{b}");
    assert!(b["krippendorff_alpha"]["estimate"].as_f64().is_some(), "{b}");
    // The majority beside independent judges (the "effective number of judges" is gone).
    let piv = &b["panel_vs_independence"];
    let observed = piv["observed"]["estimate"].as_f64().unwrap();
    let independent = piv["independent"].as_f64().unwrap();
    let difference = piv["difference"]["estimate"].as_f64().unwrap();
    assert!((observed - independent - difference).abs() < 1e-9, "{piv}");
    assert!(b.get("effective_judges").is_none(), "{b}");
    // Self-preference: judge-c's excess on judge-c's answers minus its excess on
    // model-a's, positive and significant.
    let sp = j["self_preference"].as_array().unwrap();
    assert_eq!(sp.len(), 1, "{sp:?}");
    assert_eq!(sp[0]["judge"], "judge-c");
    assert_eq!(sp[0]["model"], "judge-c");
    let diff = sp[0]["difference"]["estimate"].as_f64().unwrap();
    assert!(diff > 0.0 && sp[0]["significant"] == true, "{}", sp[0]);
    assert!(sp[0]["difference"]["low"].as_f64().unwrap() > 0.0, "{}", sp[0]);
    // On model-a's answers judge-c is not lenient: its lead there is smaller.
    let own = sp[0]["own"]["excess"]["estimate"].as_f64().unwrap();
    let elsewhere = sp[0]["elsewhere"]["excess"]["estimate"].as_f64().unwrap();
    assert!(elsewhere < own, "lead elsewhere {elsewhere} vs on its own answers {own}");
    // Leniency is its own row per judge.
    assert_eq!(j["leniency"].as_array().unwrap().len(), 3, "{}", j["leniency"]);
    // Disagreements are listed with every verdict.
    let dis = j["disagreements"].as_array().unwrap();
    assert!(!dis.is_empty());
    assert_eq!(dis[0]["votes"].as_array().unwrap().len(), 3);
    // Each judge keeps its own HTS, and the panel has one per model under test.
    let entries = report["benchmarks"].as_array().unwrap();
    for model in ["model-a", "judge-c"] {
        for judge in JUDGES.iter().copied().chain(["panel:mace"]) {
            assert!(
                entries
                    .iter()
                    .any(|e| e["model"] == model && e["judge"] == judge && e["hts"].is_number()),
                "no HTS of {model} by {judge}"
            );
        }
    }
    // Judge spend is split per judge.
    let costs = report["costs"]["by_model"].as_array().unwrap();
    for judge in JUDGES {
        let c = costs
            .iter()
            .find(|c| c["model"] == judge)
            .unwrap_or_else(|| panic!("no cost row for {judge}"));
        assert!(c["cost"].as_f64().unwrap() > 0.0, "{c}");
    }
}

#[test]
fn panel_of_three_judges_measured_against_humans_and_resumed_after_kill() {
    let qs = load_questions(QUESTIONS);
    let questions = question_index(&qs);
    let hyp: HashMap<String, bool> = qs.iter().flat_map(|q| q.terms.iter().cloned()).collect();
    let rules = responder(questions, hyp);
    let fake = FakeOpenAi::start_blocking(move |c| {
        Reply::Delayed(Duration::from_millis(5), Box::new(rules(c)))
    });
    let dir = tempfile::tempdir().unwrap();
    let labels = labels_file(dir.path(), &qs);
    let concurrency = 4;
    let s = sweep(dir.path(), "panel", &fake.base_url(), Some(&labels), concurrency);

    // Uninterrupted reference run.
    let out_ref = dir.path().join("runs-ref");
    run_to_end(&["run", s.to_str().unwrap(), "--out", out_ref.to_str().unwrap()]);
    let calls_ref = fake.call_count();
    let report = read_json(&out_ref.join("panel/report.json"));
    check_figures(&report, &qs);
    let md = std::fs::read_to_string(out_ref.join("panel/report.md")).unwrap();
    for needle in [
        "judges (hypotermqa",
        "Against human labels",
        "Self-preference",
        "### Leniency",
        "The judges' majority against the same truth",
        "Fleiss' κ",
        "Confusion matrix of judge-a",
    ] {
        assert!(md.contains(needle), "report.md lacks {needle:?}");
    }
    let html = std::fs::read_to_string(out_ref.join("panel/report.html")).unwrap();
    assert!(
        html.contains("id=\"judges\"") && html.contains("class=\"dis-row\""),
        "report.html lacks the judges part"
    );
    for needle in ["<h4>Leniency</h4>", "<h4>Self-preference</h4>", "<h4>Error correlation</h4>"] {
        assert!(html.contains(needle), "report.html lacks {needle:?}");
    }
    // `halyard report` across runs lists each judge against the human labels.
    let lb = dir.path().join("lb");
    let o = halyard()
        .args(["report", out_ref.join("panel").to_str().unwrap(), "--out", lb.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lbmd = std::fs::read_to_string(lb.join("leaderboard.md")).unwrap();
    assert!(lbmd.contains("## Judges against human labels"), "{lbmd}");
    for judge in JUDGES.iter().copied().chain(["panel (mace)"]) {
        assert!(lbmd.contains(&format!("| hypotermqa | {judge} |")), "no row for {judge}: {lbmd}");
    }
    // Importing the sweep's own labels file again counts each (answer, annotator) once.
    let o = halyard()
        .args([
            "labels",
            "import",
            out_ref.join("panel").to_str().unwrap(),
            labels.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let again = read_json(&out_ref.join("panel/report.json"));
    assert_eq!(again["judges"][0]["human"]["labels"], report["judges"][0]["human"]["labels"]);
    assert_eq!(again["judges"][0]["per_judge"], report["judges"][0]["per_judge"]);
    fake.reset_counters();

    // kill -9 mid-panel, then resume: the same report, repeated calls within those in flight.
    let out = dir.path().join("runs-killed");
    let mut cmd = halyard();
    cmd.args(["run", s.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let mut child = ChildGuard::spawn(cmd);
    let deadline = Instant::now() + Duration::from_secs(180);
    while fake.call_count() < calls_ref / 2 {
        assert!(Instant::now() < deadline, "run made no progress");
        assert!(child.try_wait().is_none(), "halyard exited before the kill");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill();
    run_to_end(&["run", s.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let extra = fake.call_count() as i64 - calls_ref as i64;
    let pools = 4 * concurrency;
    eprintln!("panel resume: reference {calls_ref} calls, repeated {extra} (bound {pools})");
    assert!(
        extra >= 0 && extra as usize <= pools,
        "{extra} repeated calls exceed the {pools} in flight"
    );
    let resumed = read_json(&out.join("panel/report.json"));
    assert_eq!(resumed["benchmarks"], report["benchmarks"]);
    // The judges' figures too, except where the labels file is (the same file).
    assert_eq!(resumed["judges"], report["judges"]);
}

/// `halyard labels import` attaches labels to a finished run and rewrites its report; a bad
/// file names the line and field and changes nothing.
#[test]
fn labels_import_into_a_finished_run() {
    let qs = load_questions(30);
    let hyp: HashMap<String, bool> = qs.iter().flat_map(|q| q.terms.iter().cloned()).collect();
    let fake = FakeOpenAi::start_blocking(responder(question_index(&qs), hyp));
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(sweep(dir.path(), "imp", &fake.base_url(), None, 2))
        .unwrap()
        .replace(&format!("limit = {QUESTIONS}"), "limit = 30")
        .replace("panel = \"mace\"", "panel = \"primary:judge-a\"");
    let s = dir.path().join("imp.toml");
    std::fs::write(&s, text).unwrap();
    let out = dir.path().join("runs");
    run_to_end(&["run", s.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let run = out.join("imp");
    let before = read_json(&run.join("report.json"));
    assert!(before["judges"][0]["human"].is_null(), "no human labels yet");
    assert_eq!(before["judges"][0]["panel"]["verdict"]["rule"], "primary");

    // A bad line: the error names file, line and field; nothing changes.
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"item\": 1, \"model\": \"model-a\", \"label\": \"valid\"}\n{\"item\": 2, \"model\": \"model-a\", \"label\": \"maybe\"}\n").unwrap();
    let o = halyard()
        .args(["labels", "import", run.to_str().unwrap(), bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("bad.jsonl, line 2, field `label`")
            && err.contains("valid, hallucination, irrelevant"),
        "{err}"
    );
    assert_eq!(read_json(&run.join("report.json")), before, "a refused import changed the report");

    let labels = labels_file(dir.path(), &qs);
    let o = halyard()
        .args(["labels", "import", run.to_str().unwrap(), labels.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout)
        .contains(&format!("{} human label(s) for benchmark 0", 4 * 30 + 1)));
    let after = read_json(&run.join("report.json"));
    let h = &after["judges"][0]["human"];
    assert_eq!(h["labels"], 4 * 30 + 1);
    assert_eq!(h["unknown"], 1);
    assert!(h["files"][0].as_str().unwrap().ends_with("human-labels/benchmark-0.jsonl"), "{h}");
    assert!(after["judges"][0]["per_judge"][0]["vs_human"]["n"].as_u64().unwrap() > 0);
    // The job figures are the run's, untouched by the rewrite; nothing was called.
    assert_eq!(after["benchmarks"], before["benchmarks"]);
    assert_eq!(after["jobs"], before["jobs"]);

    // A rewrite that fails (here: a copy of the run without its state) leaves the earlier
    // import in place and says the labels were not imported.
    let copy = dir.path().join("copy");
    std::fs::create_dir_all(copy.join("human-labels")).unwrap();
    std::fs::copy(run.join("report.json"), copy.join("report.json")).unwrap();
    let earlier = copy.join("human-labels/benchmark-0.jsonl");
    std::fs::write(&earlier, "{\"item\": 1, \"model\": \"model-a\", \"label\": \"valid\"}\n")
        .unwrap();
    let o = halyard()
        .args(["labels", "import", copy.to_str().unwrap(), labels.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("the labels were not imported"), "{err}");
    assert_eq!(
        std::fs::read_to_string(&earlier).unwrap(),
        "{\"item\": 1, \"model\": \"model-a\", \"label\": \"valid\"}\n",
        "the earlier import was not restored"
    );
    assert_eq!(std::fs::read_dir(copy.join("human-labels")).unwrap().count(), 1, "leftover files");
}

/// Panel keys are checked with the sweep, naming file and key.
#[test]
fn bad_panel_keys_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let good =
        std::fs::read_to_string(sweep(dir.path(), "p", "http://127.0.0.1:9/v1", None, 1)).unwrap();
    let cases = [
        (good.replace("panel = \"mace\"", "panel = \"vote\""), "benchmark[0].panel"),
        (good.replace("panel = \"mace\"", "panel = \"primary:nobody\""), "benchmark[0].panel"),
        (
            good.replace("\"judge-b\", \"judge-c\"]", "\"judge-b\", \"judge-b\"]"),
            "benchmark[0].judges[2]",
        ),
        (good.replace("judges = [", "judge = \"judge-a\"\njudges = ["), "benchmark[0].judges"),
        (good.replace("\"judge-c\"]\npanel", "\"nobody\"]\npanel"), "benchmark[0].judges[2]"),
        (
            good.replace(
                "semantics = \"paper\"",
                "semantics = \"paper\"\nhuman_labels = \"missing.jsonl\"",
            ),
            "benchmark[0].human_labels",
        ),
    ];
    for (i, (body, needle)) in cases.into_iter().enumerate() {
        assert_sweep_rejected(dir.path(), &format!("bad{i}"), &body, needle);
    }
}

const HVI_JUDGE_SYSTEM: &str = "You are a careful fact-checker";

/// HVI's verdict names, as the judges' last line gives them and the labels file names them.
const HVI_VERDICTS: [(&str, &str); 3] = [
    ("NOT_HALLUCINATED", "not_hallucinated"),
    ("INTRINSIC", "intrinsic"),
    ("EXTRINSIC", "extrinsic"),
];

/// judge-a's verdict on a sentence of a passage written for `prompt`; judge-b agrees
/// except on a quarter of the sentences, where it says "not hallucinated".
fn hvi_verdict(judge: &str, prompt: &str, sentence: &str) -> usize {
    let a = (fnv(&format!("{prompt}|{sentence}")) % 3) as usize;
    if judge == "fake-judge-b" && fnv(&format!("b|{prompt}|{sentence}")).is_multiple_of(4) {
        0
    } else {
        a
    }
}

/// HVI with a two-judge panel: one unit per sentence, each judge's verdict, sentence
/// human labels matched by prompt id and sentence index, and the panel's HVI beside each
/// judge's.
#[test]
fn hvi_panel_judges_sentences() {
    let fake = FakeOpenAi::start_blocking(|call: &ChatCall| {
        let (role, first) =
            call.messages.first().map(|(r, c)| (r.as_str(), c.as_str())).unwrap_or(("", ""));
        if role == "system" && first.starts_with(HVI_JUDGE_SYSTEM) {
            let user = &call.messages[1].1;
            let prompt = between(user, "Prompt: \"\"\"", "\"\"\"").unwrap_or("");
            let sentence = between(user, "Sentence to judge: \"\"\"", "\"\"\"").unwrap_or("");
            let v = hvi_verdict(&call.model, prompt, sentence);
            return Reply::Text(format!("Reasoning.\nVERDICT: {}", HVI_VERDICTS[v].0));
        }
        Reply::Text(format!(
            "{} writes about it. The figure is {}. It ends here.",
            call.model,
            fnv(first) % 100
        ))
    });
    let dir = tempfile::tempdir().unwrap();
    let dataset = repo_root().join("datasets/hvi/climate_fever_claims_12.jsonl");
    let prompts: Vec<(String, String)> = std::fs::read_to_string(&dataset)
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (v["id"].as_str().unwrap().to_string(), v["prompt"].as_str().unwrap().to_string())
        })
        .collect();
    // Human labels: judge-a's verdicts on every sentence of the first 4 prompts.
    let mut labels = String::new();
    for (id, prompt) in prompts.iter().take(4) {
        let sentences = [
            "fake-a writes about it.".to_string(),
            format!("The figure is {}.", fnv(prompt) % 100),
            "It ends here.".to_string(),
        ];
        for (n, s) in sentences.iter().enumerate() {
            let v = hvi_verdict("fake-judge-a", prompt, s);
            labels.push_str(&format!(
                "{{\"item\": \"{id}\", \"model\": \"model-a\", \"sentence\": {n}, \"label\": \"{}\"}}\n",
                HVI_VERDICTS[v].1
            ));
        }
    }
    let labels_path = dir.path().join("hvi-labels.jsonl");
    std::fs::write(&labels_path, labels).unwrap();
    let base = fake.base_url();
    let mut models = String::new();
    for (m, remote) in
        [("model-a", "fake-a"), ("judge-a", "fake-judge-a"), ("judge-b", "fake-judge-b")]
    {
        models.push_str(&format!("[[model]]\nname = \"{m}\"\nbackend = \"openai\"\nbase_url = \"{base}\"\nmodel = \"{remote}\"\nmax_concurrency = 4\n\n"));
    }
    let sweep = dir.path().join("hvi-panel.toml");
    std::fs::write(
        &sweep,
        format!(
            "name = \"hvi-panel\"\n\n{models}[[benchmark]]\npipeline = \"hvi\"\ndataset = \"{}\"\nmodels = [\"model-a\"]\njudges = [\"judge-a\", \"judge-b\"]\nhuman_labels = \"{}\"\n",
            dataset.display(),
            labels_path.display()
        ),
    )
    .unwrap();
    let out = dir.path().join("runs");
    run_to_end(&["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let report = read_json(&out.join("hvi-panel/report.json"));
    let j = &report["judges"][0];
    assert_eq!((j["pipeline"].as_str(), j["unit"].as_str()), (Some("hvi"), Some("sentence")));
    assert_eq!(j["units"], 3 * prompts.len() as u64, "three sentences per passage");
    assert_eq!(j["human"]["unknown"], 0, "every sentence label matched: {}", j["human"]);
    let a = &j["per_judge"][0]["vs_human"];
    assert_eq!((a["n"].as_u64(), a["confusion"].as_object().map(|_| ())), (Some(12), Some(())));
    assert_eq!(a["error_rate"]["estimate"], 0.0, "judge-a gave the human labels");
    // judge-b differs from judge-a exactly where the rule says.
    let mut differ = 0;
    for (_, prompt) in &prompts {
        for s in [
            "fake-a writes about it.".to_string(),
            format!("The figure is {}.", fnv(prompt) % 100),
            "It ends here.".to_string(),
        ] {
            differ += u64::from(
                hvi_verdict("fake-judge-a", prompt, &s) != hvi_verdict("fake-judge-b", prompt, &s),
            );
        }
    }
    assert_eq!(j["disagreements_total"], differ);
    assert!(j["between"]["pairwise_kappa"][0]["kappa"]["estimate"].as_f64().is_some());
    // Each judge's HVI, and the panel's (majority: a tie between two judges is no verdict).
    let names: Vec<&str> = report["benchmarks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["model"].as_str())
        .collect();
    for n in ["model-a (judge judge-a)", "model-a (judge judge-b)", "model-a (panel majority)"] {
        assert!(names.contains(&n), "no HVI entry {n:?} in {names:?}");
    }
    assert_eq!(j["panel"]["ties"], differ);
}

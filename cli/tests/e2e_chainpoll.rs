//! End-to-end: `halyard run` (embedded nats-server) of two ChainPoll benchmarks (the
//! shipped AutoHall-derived labelled set, and a set with contexts for Adherence) with two
//! judges and a sampler, against a fake OpenAI-compatible server. AUROC, poll counts and
//! the SelfCheck-NGram Avg baseline are recomputed here without Halyard's code.

use std::collections::HashMap;

use crate::common::*;
use halyard_tests::{ChatCall, FakeOpenAi, Faults, Reply};
use serde_json::{json, Value};

const POLLS: u64 = 5;
const SAMPLES: u64 = 3;
const JUDGE_SEED: u64 = 10;
const SAMPLER_SEED: u64 = 50;
const ANSWERED: &str = "The assistant answered:\n\"\"\"\n";

#[derive(Clone, Copy, PartialEq, Debug)]
enum Poll {
    Yes,
    No,
    Unparseable,
    Failed,
}

fn poll_rule(judge: &str, metric: &str, completion: &str, index: u64) -> Poll {
    match fnv(&format!("{judge}|{metric}|{completion}|{index}")) % 13 {
        0 => Poll::Failed,
        1 | 2 => Poll::Unparseable,
        3..=7 => Poll::Yes,
        _ => Poll::No,
    }
}

fn sample_text(prompt: &str, k: u64) -> String {
    let words =
        ["warming", "climate", "ice", "ocean", "carbon", "the", "is", "study", "data", "rising"];
    let h = fnv(&format!("{prompt}|{k}"));
    let picked: Vec<&str> = (0..12).map(|i| words[((h >> (i * 4)) % 10) as usize]).collect();
    format!("{} {}.", prompt, picked.join(" "))
}

fn responder(call: &ChatCall) -> Reply {
    let seed = call.body["seed"].as_u64().unwrap_or(0);
    let (system, user) = match call.messages.as_slice() {
        [(r, s), (_, u)] if r == "system" => (s.as_str(), u.as_str()),
        [(_, u)] => return Reply::Text(sample_text(u, seed - SAMPLER_SEED)),
        _ => return Reply::Status { code: 400, body: "unexpected".into(), retry_after: None },
    };
    let metric = if system.starts_with("You are a meticulous fact-checker") {
        "correctness"
    } else {
        "adherence"
    };
    let Some(start) = user.find(ANSWERED) else {
        return Reply::Status { code: 400, body: "no completion".into(), retry_after: None };
    };
    let rest = &user[start + ANSWERED.len()..];
    let completion = &rest[..rest.find("\n\"\"\"\n\nThink step by step").unwrap_or(rest.len())];
    match poll_rule(&call.model, metric, completion, seed - JUDGE_SEED) {
        Poll::Failed => {
            Reply::Status { code: 400, body: "poll rejected".into(), retry_after: None }
        }
        Poll::Unparseable => {
            Reply::Text("The claims are hard to assess; I will not decide.".into())
        }
        Poll::Yes => {
            Reply::Text("1. The answer cites a study.\n2. It does not exist.\nAnswer: yes".into())
        }
        Poll::No => Reply::Text("Every claim checks out; no invented source.\nAnswer: no".into()),
    }
}

/// AUROC as the Mann–Whitney U over all (positive, negative) pairs, ties ½.
fn mann_whitney(pairs: &[(bool, f64)]) -> f64 {
    let (mut u, mut n) = (0.0, 0.0);
    for (lp, sp) in pairs.iter().filter(|p| p.0) {
        for (_, sn) in pairs.iter().filter(|p| !p.0) {
            let _ = lp;
            u += if sp > sn {
                1.0
            } else if sp == sn {
                0.5
            } else {
                0.0
            };
            n += 1.0;
        }
    }
    u / n
}

/// Words as `\w+|[^\w\s]`, lower-cased.
fn tokens(text: &str) -> Vec<String> {
    let lower = text.to_lowercase();
    let mut out = Vec::new();
    let mut word = String::new();
    for c in lower.chars() {
        if c.is_alphanumeric() || c == '_' {
            word.push(c);
            continue;
        }
        if !word.is_empty() {
            out.push(std::mem::take(&mut word));
        }
        if !c.is_whitespace() {
            out.push(c.to_string());
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

/// −ln p of each token under the unigram counts of the completion and the samples.
fn neg_logprob(completion: &str, samples: &[String]) -> impl Fn(&String) -> f64 {
    let mut counts: HashMap<String, f64> = HashMap::new();
    let mut total = 0.0;
    for t in std::iter::once(completion).chain(samples.iter().map(String::as_str)).flat_map(tokens)
    {
        *counts.entry(t).or_default() += 1.0;
        total += 1.0;
    }
    move |t: &String| -(counts[t] / total).ln()
}

/// SelfCheck unigram passage Avg: mean over the completion's tokens of −ln(count / N),
/// counts over the completion and the samples.
fn selfcheck_avg(completion: &str, samples: &[String]) -> f64 {
    let nlp = neg_logprob(completion, samples);
    let own = tokens(completion);
    own.iter().map(nlp).sum::<f64>() / own.len() as f64
}

/// Sentences: split after `.`, `!` or `?` followed by whitespace (or the end) and at line
/// breaks; trimmed; pieces without a letter or digit dropped.
fn split_sentences(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let (mut out, mut cur) = (Vec::new(), String::new());
    for (i, &c) in chars.iter().enumerate() {
        cur.push(c);
        let end = c == '\n'
            || (matches!(c, '.' | '!' | '?') && chars.get(i + 1).is_none_or(|d| d.is_whitespace()));
        if end {
            out.push(std::mem::take(&mut cur));
        }
    }
    out.push(cur);
    out.into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| s.chars().any(char::is_alphanumeric))
        .collect()
}

/// SelfCheck unigram passage Max: mean over the completion's sentences of the largest
/// −ln(count / N) of the sentence's tokens.
fn selfcheck_max(completion: &str, samples: &[String]) -> f64 {
    let nlp = neg_logprob(completion, samples);
    let sentences = split_sentences(completion);
    let max_of = |s: &String| tokens(s).iter().map(&nlp).fold(f64::NEG_INFINITY, f64::max);
    sentences.iter().map(max_of).sum::<f64>() / sentences.len() as f64
}

struct Item {
    prompt: String,
    completion: String,
    label: bool,
}

fn items(path: &std::path::Path, limit: usize) -> Vec<Item> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .take(limit)
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            Item {
                prompt: v["prompt"].as_str().unwrap().into(),
                completion: v["completion"].as_str().unwrap().into(),
                label: v["label"].as_bool().unwrap(),
            }
        })
        .collect()
}

/// ChainPoll score of one item under the policy: yes / (yes + no [+ unparseable]).
fn chainpoll_score(
    judge: &str,
    metric: &str,
    completion: &str,
    count_unparseable_as_no: bool,
) -> Option<f64> {
    let polls: Vec<Poll> = (0..POLLS).map(|i| poll_rule(judge, metric, completion, i)).collect();
    let yes = polls.iter().filter(|p| **p == Poll::Yes).count() as f64;
    let no = polls.iter().filter(|p| **p == Poll::No).count() as f64;
    let unp = polls.iter().filter(|p| **p == Poll::Unparseable).count() as f64;
    let n = if count_unparseable_as_no { yes + no + unp } else { yes + no };
    (n > 0.0).then(|| yes / n)
}

/// The report's AUROCs and poll counts equal the independent computation, for both
/// metrics, both unparseable policies and both judges; the baseline's Avg AUROC too.
#[test]
fn chainpoll_run_matches_independent_computation() {
    let shipped = repo_root().join("datasets/chainpoll/autohall_climate_gpt35.jsonl");
    let main_items = items(&shipped, 24);
    let dir = tempfile::tempdir().unwrap();
    // A set with contexts: the even items' context is their own completion.
    let ctx_path = dir.path().join("with_context.jsonl");
    let ctx_items: Vec<Item> = items(&shipped, 60).into_iter().skip(24).take(12).collect();
    let lines: Vec<String> = ctx_items
        .iter()
        .enumerate()
        .map(|(i, it)| {
            let context = if i % 2 == 0 { it.completion.clone() } else { "Unrelated notes.".into() };
            json!({"prompt": it.prompt, "completion": it.completion, "context": [context], "label": it.label}).to_string()
        })
        .collect();
    std::fs::write(&ctx_path, lines.join("\n")).unwrap();
    let faults = Faults::new();
    let fake = FakeOpenAi::start_blocking(faults.wrap(responder));
    let url = fake.base_url();
    let mut sweep = String::from("name = \"chainpoll-e2e\"\n");
    for (name, seed, t) in
        [("judge-1", JUDGE_SEED, 0.7), ("judge-2", JUDGE_SEED, 0.7), ("sampler", SAMPLER_SEED, 1.0)]
    {
        sweep.push_str(&format!(
            "[[model]]\nname = \"{name}\"\nbackend = \"openai\"\nbase_url = \"{url}\"\nmodel = \"{name}\"\nseed = {seed}\ntemperature = {t}\nmax_concurrency = 8\n\n"
        ));
    }
    sweep.push_str(&format!(
        "[[benchmark]]\npipeline = \"chainpoll\"\ndataset = \"{}\"\nmodels = [\"judge-1\", \"judge-2\"]\npolls = {POLLS}\nlimit = 24\nsampler = \"sampler\"\nsamples = {SAMPLES}\n\n",
        shipped.display()
    ));
    sweep.push_str(&format!(
        "[[benchmark]]\npipeline = \"chainpoll\"\ndataset = \"{}\"\nmodels = [\"judge-1\"]\npolls = {POLLS}\nmetrics = [\"correctness\", \"adherence\"]\nunparseable = \"no\"\n\n[run]\nack_wait_s = 5\nmax_deliver = 3\n",
        ctx_path.display()
    ));
    let sweep_path = dir.path().join("chainpoll.toml");
    std::fs::write(&sweep_path, sweep).unwrap();
    let out = dir.path().join("runs");
    let (_, stated) =
        run_complete(&["run", sweep_path.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let report = read_json(&out.join("chainpoll-e2e/report.json"));
    assert_eq!(report["jobs"]["dead_letters"], stated, "the final line's count");
    let benches = report["benchmarks"].as_array().unwrap();
    assert_eq!(benches.len(), 3);
    let mut failed_total = 0;
    type Case<'a> = (usize, &'a str, &'a [Item], &'a [&'a str], bool);
    let cases: [Case; 3] = [
        (0, "judge-1", &main_items, &["correctness"], false),
        (0, "judge-2", &main_items, &["correctness"], false),
        (1, "judge-1", &ctx_items, &["correctness", "adherence"], true),
    ];
    for (bench, judge, its, metrics, as_no) in cases {
        let b = benches.iter().find(|b| b["benchmark"] == bench && b["model"] == judge).unwrap();
        assert_eq!(b["items"], its.len() as u64);
        assert_eq!(b["positives"], its.iter().filter(|i| i.label).count() as u64);
        for (mi, metric) in metrics.iter().enumerate() {
            let m = &b["metrics"][mi];
            assert_eq!(m["metric"], *metric);
            let scored: Vec<(bool, f64)> = its
                .iter()
                .filter_map(|it| {
                    chainpoll_score(judge, metric, &it.completion, as_no).map(|s| (it.label, s))
                })
                .collect();
            assert_eq!(m["scored"], scored.len() as u64, "{judge} {metric}");
            let want = mann_whitney(&scored);
            let got = m["auroc"].as_f64().unwrap_or_else(|| panic!("{judge} {metric}: {m}"));
            assert!((got - want).abs() < 1e-12, "{judge} {metric}: AUROC {got} vs {want}");
            let all: Vec<Poll> = its
                .iter()
                .flat_map(|it| (0..POLLS).map(|i| poll_rule(judge, metric, &it.completion, i)))
                .collect();
            for (key, kind) in [
                ("yes", Poll::Yes),
                ("no", Poll::No),
                ("unparseable", Poll::Unparseable),
                ("failed", Poll::Failed),
            ] {
                assert_eq!(
                    m[key],
                    all.iter().filter(|p| **p == kind).count() as u64,
                    "{judge} {metric} {key}"
                );
            }
            failed_total += all.iter().filter(|p| **p == Poll::Failed).count() as u64;
        }
    }
    // Issue 31: the two judges of benchmark 0 measured against the dataset's labels: a
    // score of at least ½ is "hallucination". Issue 45: AutoHall's labels are a rule's
    // (provenance `rule:autohall`), reported under that name and never as human truth.
    let jr = report["judges"].as_array().unwrap().iter().find(|j| j["benchmark"] == 0).unwrap();
    assert!(jr["human"].is_null(), "{}", jr["human"]);
    let source = &jr["sources"][0];
    assert_eq!(source["provenance"], "rule:autohall", "{source}");
    for (n, judge) in ["judge-1", "judge-2"].into_iter().enumerate() {
        let pairs: Vec<(bool, bool)> = main_items
            .iter()
            .filter_map(|it| {
                chainpoll_score(judge, "correctness", &it.completion, false)
                    .map(|s| (it.label, s >= 0.5))
            })
            .collect();
        let v = &source["per_judge"][n];
        assert_eq!(v["n"], pairs.len() as u64, "{judge}");
        let right = pairs.iter().filter(|(l, p)| l == p).count() as f64;
        let acc = v["accuracy"]["estimate"].as_f64().unwrap();
        assert!((acc - right / pairs.len() as f64).abs() < 1e-12, "{judge}: accuracy {acc}");
    }
    // The baseline (benchmark 0): samples are the sampler's, the same for both judges.
    let baseline_auroc = |score: fn(&str, &[String]) -> f64| {
        let pairs: Vec<(bool, f64)> = main_items
            .iter()
            .map(|it| {
                let samples: Vec<String> =
                    (1..=SAMPLES).map(|k| sample_text(&it.prompt, k)).collect();
                (it.label, score(&it.completion, &samples))
            })
            .collect();
        mann_whitney(&pairs)
    };
    let (want, want_max) = (baseline_auroc(selfcheck_avg), baseline_auroc(selfcheck_max));
    for judge in ["judge-1", "judge-2"] {
        let b = benches.iter().find(|b| b["benchmark"] == 0 && b["model"] == judge).unwrap();
        let got = b["selfcheck_avg"]["auroc"].as_f64().unwrap();
        assert!((got - want).abs() < 1e-9, "SelfCheck Avg AUROC {got} vs {want}");
        // Issue 16: the Max AUROC exactly, not only within [0, 1].
        let max = b["selfcheck_max"]["auroc"].as_f64().unwrap();
        assert!((max - want_max).abs() < 1e-9, "SelfCheck Max AUROC {max} vs {want_max}");
        // Every AUROC has its 95% DeLong interval around it.
        let ci = &b["selfcheck_avg"]["auroc_ci95"];
        assert_eq!((ci["method"].as_str(), ci["n"].as_u64()), (Some("delong"), Some(24)));
        assert!(ci["low"].as_f64().unwrap() <= got && got <= ci["high"].as_f64().unwrap());
        // The sampler (openai) doubles as the probability model, which cannot score a text:
        // none of the token-log-probability baselines (issue 29: Max and mean
        // pseudo-entropy, Avg/Max(−log p)) is computed, and the report says why.
        let pe = &b["logprob_baselines"];
        assert!(pe["pseudo_entropy_max"].is_null() && pe["avg_neg_logprob"].is_null(), "{pe}");
        assert!(pe["not_computed"].as_str().unwrap().contains("backend openai"), "{pe}");
        assert_eq!(b["selfcheck_all_samples_failed"], 0);
    }
    // Issue 29: judge-1 ran on both datasets, so the report carries its RealHall aggregate:
    // the mean of its Correctness AUROC on the first and Adherence AUROC on the second.
    let auroc = |bench: u64, metric: usize| {
        let b = benches.iter().find(|b| b["benchmark"] == bench && b["model"] == "judge-1");
        b.unwrap()["metrics"][metric]["auroc"].as_f64().unwrap()
    };
    let realhall = report["realhall"].as_array().expect("a RealHall aggregate");
    assert_eq!(realhall.len(), 1, "judge-2 ran on one dataset only: {realhall:?}");
    assert_eq!(realhall[0]["model"], "judge-1");
    let row = &realhall[0]["rows"][0];
    assert_eq!(row["method"], "chainpoll");
    let want = (auroc(0, 0) + auroc(1, 1)) / 2.0;
    let got = row["aggregate_auroc"]["estimate"].as_f64().unwrap();
    assert!((got - want).abs() < 1e-12, "RealHall aggregate {got} vs {want}");
    assert!(failed_total > 0, "the rules fail no poll; that path is untested");
    assert_eq!(report["jobs"]["dead_letters"], failed_total);
    // Each poll and sample is one request: N per item and metric, S per item (shared by judges).
    let expected_calls = 2 * 24 * POLLS + 24 * SAMPLES + 2 * 12 * POLLS;
    assert_eq!(fake.call_count() as u64, expected_calls);
    let md = std::fs::read_to_string(out.join("chainpoll-e2e/report.md")).unwrap();
    assert_eq!(md.matches("chainpoll on").count(), 2);
    assert!(
        md.contains("## RealHall aggregate\n") && md.contains("### `judge-1` (benchmarks 0, 1)")
    );
    assert!(
        md.contains("| judge | ChainPoll-correctness AUROC | ChainPoll-adherence AUROC |"),
        "{md}"
    );
    // Issue 29: faults leave every poll, figure and label as they were.
    rerun_with_faults(&fake, &faults, &sweep_path, "chainpoll-e2e", &out, dir.path());
}

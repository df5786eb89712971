//! End-to-end: `halyard run` (embedded nats-server, coordinator, workers) over two
//! AutoHall claim files (Climate-FEVER and PubHealth samples, the latter with bare `NaN`
//! tokens) and two models, against a fake OpenAI-compatible model whose answers follow
//! fixed rules. The report's figures are checked against a computation of those rules
//! written here, without Halyard's code.

mod common;

use std::collections::BTreeSet;

use common::*;
use halyard_tests::{ChatCall, FakeOpenAi, Reply};
use serde_json::Value;

const K: usize = 4;
const SEED: u64 = 100;
const REF_PREFIX: &str = "Given one claim whose authenticity is unknown, you should provide one reference about it and summarize the reference in a paragraph. Claim: ";
const CLS_PREFIX: &str = "Given the claim and the reference, you should answer whether the claim is true or false. Claim: ";
const PAIR_PREFIX: &str = "Are there any conflicting parts in these paragraphs P1,P2? P1: ";

fn h(model: &str, claim: &str) -> u64 {
    fnv(&format!("{model}|{claim}"))
}

fn refuses(model: &str, claim: &str) -> bool {
    h(model, claim) % 6 == 0
}

/// The classification answer, and how AutoHall's substring rule reads it.
fn classification(model: &str, claim: &str) -> (&'static str, Option<bool>) {
    match (h(model, claim) >> 3) % 5 {
        0 => ("The claim is true.", Some(true)),
        1 => ("The claim is false.", Some(false)),
        2 => ("It is untrue.", Some(true)), // the authors' substring quirk
        3 => ("I cannot say.", None),
        _ => ("FALSE", Some(false)),
    }
}

fn conflict(model: &str, claim: &str, k: u64) -> bool {
    (h(model, claim) + 7 * k) % 3 == 0
}

/// A claim whose classification request is rejected (HTTP 400): `classify_failed`.
fn poisoned(model: &str, claim: &str) -> bool {
    (h(model, claim) >> 9) % 17 == 0
}

fn responder(call: &ChatCall) -> Reply {
    let bad = |why: String| Reply::Status { code: 400, body: why, retry_after: None };
    let user = call.messages.last().map(|(_, c)| c.as_str()).unwrap_or("");
    let m = call.model.as_str();
    let t = call.temperature.unwrap_or(-1.0);
    if let Some(claim) = user.strip_prefix(REF_PREFIX) {
        if (t - 0.7).abs() > 1e-6 {
            return bad(format!("reference at temperature {t}"));
        }
        let seed = call.body["seed"].as_u64().unwrap_or(0);
        return Reply::Text(match seed.checked_sub(SEED) {
            Some(0) if refuses(m, claim) => "I cannot provide a specific reference for this claim.".into(),
            Some(0) => format!("REF[{claim}]"),
            Some(k) => format!("SAMPLE{k}[{claim}]"),
            None => return bad(format!("seed {seed}")),
        });
    }
    if (t - 0.1).abs() > 1e-6 {
        return bad(format!("check at temperature {t}"));
    }
    if let Some(rest) = user.strip_prefix(CLS_PREFIX) {
        let Some((claim, _)) = rest.split_once(" Reference: REF[") else { return bad("no reference".into()) };
        if poisoned(m, claim) {
            return bad("poison".into());
        }
        return Reply::Text(classification(m, claim).0.into());
    }
    if let Some(rest) = user.strip_prefix(PAIR_PREFIX) {
        let (Some(a), Some(b)) = (rest.find("REF["), rest.find(" P2: SAMPLE")) else { return bad("bad pair".into()) };
        let claim = &rest[a + 4..b - 1];
        let k: u64 = rest[b + 11..].split('[').next().and_then(|s| s.parse().ok()).unwrap_or(0);
        let text = if conflict(m, claim, k) { "Yes. P1 and P2 conflict." } else { "There are no conflicting parts in P1 and P2." };
        return Reply::Text(text.into());
    }
    bad(format!("unexpected request {user:?}"))
}

/// (claim, gold is "supported") of a claims file, read here without Halyard's reader.
fn claims(path: &std::path::Path) -> Vec<(String, bool)> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(&l.replace(": NaN", ": null")).unwrap();
            let label = v.get("claim_label").or(v.get("label")).and_then(Value::as_str).unwrap();
            (v["claim"].as_str().unwrap().to_string(), matches!(label, "SUPPORTS" | "true"))
        })
        .collect()
}

struct Expected {
    status: [(&'static str, u64); 5],
    classified: u64,
    hallucinated: u64,
    /// (TP, FP, TN, FN) for k = 1..=K on the balanced set.
    ablation: Vec<(u64, u64, u64, u64)>,
    balanced: BTreeSet<usize>,
}

fn expected(model: &str, claims: &[(String, bool)]) -> Expected {
    let (mut refused, mut failed, mut unclassified) = (0, 0, 0);
    let mut labelled: Vec<(usize, bool)> = Vec::new();
    for (i, (claim, supported)) in claims.iter().enumerate() {
        if refuses(model, claim) {
            refused += 1;
        } else if poisoned(model, claim) {
            failed += 1;
        } else {
            match classification(model, claim).1 {
                None => unclassified += 1,
                Some(says_true) => labelled.push((i, says_true != *supported)),
            }
        }
    }
    let hallucinated = labelled.iter().filter(|(_, h)| *h).count();
    let n = hallucinated.min(labelled.len() - hallucinated);
    let mut balanced = BTreeSet::new();
    for class in [true, false] {
        balanced.extend(labelled.iter().filter(|(_, h)| *h == class).take(n).map(|(i, _)| *i));
    }
    let ablation = (1..=K as u64)
        .map(|k| {
            let mut c = (0, 0, 0, 0);
            for &(i, halluc) in labelled.iter().filter(|(i, _)| balanced.contains(i)) {
                let predicted = (1..=k).any(|j| conflict(model, &claims[i].0, j));
                match (halluc, predicted) {
                    (true, true) => c.0 += 1,
                    (false, true) => c.1 += 1,
                    (false, false) => c.2 += 1,
                    (true, false) => c.3 += 1,
                }
            }
            c
        })
        .collect();
    Expected {
        status: [
            ("reference_failed", 0),
            ("refused", refused),
            ("classify_failed", failed),
            ("unclassified", unclassified),
            ("classified", labelled.len() as u64),
        ],
        classified: labelled.len() as u64,
        hallucinated: hallucinated as u64,
        ablation,
        balanced,
    }
}

fn write_sweep(dir: &std::path::Path, base_url: &str, files: &[std::path::PathBuf]) -> std::path::PathBuf {
    let mut text = String::from("name = \"autohall-e2e\"\n");
    for m in ["fake-a", "fake-b"] {
        text.push_str(&format!(
            "[[model]]\nname = \"{m}\"\nbackend = \"openai\"\nbase_url = \"{base_url}\"\nmodel = \"{m}\"\nmax_concurrency = 8\nseed = {SEED}\ntemperature = 0.3\n\n"
        ));
    }
    for f in files {
        text.push_str(&format!(
            "[[benchmark]]\npipeline = \"autohall\"\ndataset = \"{}\"\nmodels = [\"fake-a\", \"fake-b\"]\ntemperature = 0.7\nsamples = {K}\n\n",
            f.display()
        ));
    }
    text.push_str("[run]\nack_wait_s = 5\nmax_deliver = 3\n");
    let p = dir.join("autohall.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// Every figure of the report (statuses, hallucination rate, balanced set, detection per
/// k) equals the independent computation, for two files and two models; every job is
/// called once.
#[test]
fn autohall_run_matches_independent_computation() {
    let files = [repo_root().join("datasets/autohall/climate_sample.jsonl"), repo_root().join("datasets/autohall/pubhealth_sample.jsonl")];
    let fake = FakeOpenAi::start_blocking(responder);
    let dir = tempfile::tempdir().unwrap();
    let sweep = write_sweep(dir.path(), &fake.base_url(), &files);
    let out = dir.path().join("runs");
    run_to_end(&["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let report = read_json(&out.join("autohall-e2e/report.json"));
    let benches = report["benchmarks"].as_array().unwrap();
    assert_eq!(benches.len(), 4);
    let labels_text = std::fs::read_to_string(out.join("autohall-e2e/labels.jsonl")).unwrap();
    let rows: Vec<Value> = labels_text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let mut poison_seen = 0;
    for (bi, f) in files.iter().enumerate() {
        let cs = claims(f);
        for model in ["fake-a", "fake-b"] {
            let e = expected(model, &cs);
            let b = benches.iter().find(|b| b["benchmark"] == bi && b["model"] == model).expect("report entry");
            assert_eq!(b["pipeline"], "autohall");
            assert_eq!(b["claims"], cs.len() as u64);
            for (s, n) in e.status {
                assert_eq!(b["status"][s], n, "{model} {f:?} status {s}");
            }
            poison_seen += e.status[2].1;
            assert_eq!(b["classified"], e.classified);
            assert_eq!(b["hallucinated"], e.hallucinated);
            let rate = b["hallucination_rate"].as_f64().unwrap();
            assert!((rate - e.hallucinated as f64 / e.classified as f64).abs() < 1e-12);
            assert_eq!(b["balanced_per_class"], e.balanced.len() as u64 / 2);
            let d = &b["detection"];
            assert_eq!(d["k"], K as u64);
            assert_eq!(d["scored"], e.balanced.len() as u64);
            for (k, &(tp, fp, tn, fn_)) in e.ablation.iter().enumerate() {
                let c = &d["ablation"][k]["confusion"];
                assert_eq!((c["true_pos"].as_u64(), c["false_pos"].as_u64()), (Some(tp), Some(fp)), "{model} k={}", k + 1);
                assert_eq!((c["true_neg"].as_u64(), c["false_neg"].as_u64()), (Some(tn), Some(fn_)), "{model} k={}", k + 1);
                let f1 = d["ablation"][k]["metrics"]["f1"].as_f64();
                let want = (tp > 0 || fp > 0 || fn_ > 0).then(|| 2.0 * tp as f64 / (2 * tp + fp + fn_) as f64);
                assert_eq!(f1.map(|x| (x * 1e9).round()), want.map(|x| (x * 1e9).round()));
            }
            // labels.jsonl marks exactly the balanced set.
            let marked: BTreeSet<usize> = rows
                .iter()
                .filter(|r| r["model"] == model && r["claim"].as_str().is_some_and(|c| cs.iter().any(|(x, _)| x == c)))
                .filter(|r| r["balanced"] == true)
                .map(|r| r["index"].as_u64().unwrap() as usize)
                .collect();
            assert_eq!(marked, e.balanced, "{model} {f:?}");
        }
    }
    assert!(poison_seen > 0, "the rules poison no claim; the failure path is untested");
    assert_eq!(report["jobs"]["dead_letters"], poison_seen);
    // Completions plus the poisoned requests (permanent errors are not retried): every
    // request the fake saw is one job, none was called twice.
    let calls = report["jobs"]["model_calls"].as_u64().unwrap() + poison_seen;
    assert_eq!(calls, fake.call_count() as u64, "a job was called twice");
    let md = std::fs::read_to_string(out.join("autohall-e2e/report.md")).unwrap();
    assert_eq!(md.matches("autohall on").count(), 2, "one section per benchmark");
    assert!(md.contains("| k | TP |"));
}

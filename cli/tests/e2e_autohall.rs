//! End-to-end: `halyard run` (embedded nats-server, coordinator, workers) over two
//! AutoHall claim files (Climate-FEVER and PubHealth samples, the latter with bare `NaN`
//! tokens) and two models, against a fake OpenAI-compatible model whose answers follow
//! fixed rules. The report's figures are checked against a computation of those rules
//! written here, without Halyard's code.

use std::collections::BTreeSet;

use crate::common::autohall::*;
use crate::common::*;
use halyard_tests::{FakeOpenAi, Faults};
use serde_json::Value;

/// Every figure of the report (statuses, hallucination rate, balanced set, detection per
/// k) equals the independent computation, for two files and two models; every job is
/// called once.
#[test]
fn autohall_run_matches_independent_computation() {
    let files = [
        repo_root().join("datasets/autohall/climate_sample.jsonl"),
        repo_root().join("datasets/autohall/pubhealth_sample.jsonl"),
    ];
    let faults = Faults::new();
    let fake = FakeOpenAi::start_blocking(faults.wrap(autohall_responder));
    let dir = tempfile::tempdir().unwrap();
    let sweep = autohall_sweep(
        dir.path(),
        "autohall-e2e",
        &fake_models(&fake.base_url()),
        &["fake-a", "fake-b"],
        &files,
        1000,
    );
    let out = dir.path().join("runs");
    let (_, stated) =
        run_complete(&["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let report = read_json(&out.join("autohall-e2e/report.json"));
    assert_eq!(report["jobs"]["dead_letters"], stated, "the final line's count");
    let benches = report["benchmarks"].as_array().unwrap();
    assert_eq!(benches.len(), 4);
    let labels_text = std::fs::read_to_string(out.join("autohall-e2e/labels.jsonl")).unwrap();
    let rows: Vec<Value> = labels_text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let mut poison_seen = 0;
    let mut baselines_seen = 0;
    for (bi, f) in files.iter().enumerate() {
        let cs = claims(f);
        for model in ["fake-a", "fake-b"] {
            let e = expected(model, &cs);
            let b = benches
                .iter()
                .find(|b| b["benchmark"] == bi && b["model"] == model)
                .expect("report entry");
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
                assert_eq!(
                    (c["true_pos"].as_u64(), c["false_pos"].as_u64()),
                    (Some(tp), Some(fp)),
                    "{model} k={}",
                    k + 1
                );
                assert_eq!(
                    (c["true_neg"].as_u64(), c["false_neg"].as_u64()),
                    (Some(tn), Some(fn_)),
                    "{model} k={}",
                    k + 1
                );
                let f1 = d["ablation"][k]["metrics"]["f1"].as_f64();
                let want = (tp > 0 || fp > 0 || fn_ > 0)
                    .then(|| 2.0 * tp as f64 / (2 * tp + fp + fn_) as f64);
                assert_eq!(f1.map(|x| (x * 1e9).round()), want.map(|x| (x * 1e9).round()));
            }
            // Issue 16: the baselines run next to detection on the same balanced set.
            let bl = b["baselines"].as_array().cloned().unwrap_or_default();
            let names: Vec<&str> = bl.iter().map(|x| x["method"].as_str().unwrap()).collect();
            let want: &[&str] = if e.balanced.is_empty() {
                &[]
            } else {
                &["zero_self_check", "few_self_check", "selfck_1gm"]
            };
            assert_eq!(names, want, "{model} {f:?}");
            baselines_seen += bl.len();
            for (x, &((tp, fp, tn, fn_), unparseable)) in bl.iter().zip(&e.self_checks) {
                let c = &x["confusion"];
                let got = [&c["true_pos"], &c["false_pos"], &c["true_neg"], &c["false_neg"]]
                    .map(|v| v.as_u64().unwrap());
                assert_eq!(got, [tp, fp, tn, fn_], "{model} {}", x["method"]);
                assert_eq!(x["unparseable"], unparseable);
                assert_eq!(x["scored"], e.balanced.len() as u64);
                let acc = x["ci95"]["accuracy"].clone();
                assert_eq!(
                    (acc["method"].as_str(), acc["n"].as_u64()),
                    (Some("wilson"), Some(e.balanced.len() as u64))
                );
            }
            // labels.jsonl marks exactly the balanced set.
            let marked: BTreeSet<usize> = rows
                .iter()
                .filter(|r| {
                    r["model"] == model
                        && r["claim"].as_str().is_some_and(|c| cs.iter().any(|(x, _)| x == c))
                })
                .filter(|r| r["balanced"] == true)
                .map(|r| r["index"].as_u64().unwrap() as usize)
                .collect();
            assert_eq!(marked, e.balanced, "{model} {f:?}");
        }
    }
    assert!(poison_seen > 0, "the rules poison no claim; the failure path is untested");
    assert!(baselines_seen > 0, "no balanced set: the baselines are untested");
    assert_eq!(report["jobs"]["dead_letters"], poison_seen);
    // Completions plus the poisoned requests (permanent errors are not retried): every
    // request the fake saw is one job, none was called twice.
    let calls = report["jobs"]["model_calls"].as_u64().unwrap() + poison_seen;
    assert_eq!(calls, fake.call_count() as u64, "a job was called twice");
    let md = std::fs::read_to_string(out.join("autohall-e2e/report.md")).unwrap();
    assert_eq!(md.matches("autohall on").count(), 2, "one section per benchmark");
    assert!(md.contains("| k | TP |"));
    // Issue 29: faults leave every status, figure and label as they were.
    rerun_with_faults(&fake, &faults, &sweep, "autohall-e2e", &out, dir.path());
}

//! Halyard's intervals and paired tests against `data/ci_reference.json`, computed
//! independently by `data/ci_reference.py` (scipy, a direct DeLong, a re-implemented
//! bootstrap generator; see the script for what each value is checked against).

use halyard_pipelines::metrics::classification::Confusion;
use halyard_pipelines::metrics::interval::{
    auroc_delong, bootstrap_mean, delong, f1_bootstrap, mean_auroc_delong, wilson, Bootstrap,
    CiMethod, Interval, DEFAULT_RESAMPLES, DEFAULT_SEED, LEVEL, Z95,
};
use halyard_pipelines::metrics::paired::{mcnemar, paired_bootstrap_mean, PairedTestKind};
use serde_json::Value;

fn reference() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/ci_reference.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap()
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(f).collect()
}

fn bools(v: &Value) -> Vec<bool> {
    v.as_array().unwrap().iter().map(|b| b.as_bool().unwrap()).collect()
}

fn close(got: f64, want: f64, what: &str) {
    assert!((got - want).abs() <= 1e-12 * want.abs().max(1.0), "{what}: got {got}, want {want}");
}

/// The constants agree with the script's (scipy's normal quantile, the same seed and B).
#[test]
fn constants_match() {
    let r = reference();
    close(Z95, f(&r["z"]), "z");
    assert_eq!(
        (LEVEL, DEFAULT_RESAMPLES as u64, DEFAULT_SEED),
        (f(&r["level"]), u(&r["resamples"]), u(&r["seed"]))
    );
}

/// The interval's bounds equal the reference's; where the reference's interval collapses
/// to a point (`low == high`), ours is not estimable instead (issue 29) and says why.
fn check_bounds(iv: &Interval, c: &Value, what: &str) {
    let (low, high) = (f(&c["low"]), f(&c["high"]));
    if low == high {
        assert!(iv.bounds().is_none() && iv.not_estimable.is_some(), "{what}: {iv:?}");
        return;
    }
    let (l, h) = iv.bounds().unwrap_or_else(|| panic!("{what}: not estimable: {iv:?}"));
    close(l, low, &format!("{what}.low"));
    close(h, high, &format!("{what}.high"));
}

/// Wilson intervals equal scipy's `proportion_ci(method="wilson")`.
#[test]
fn wilson_matches_scipy() {
    for c in reference()["wilson"].as_array().unwrap() {
        let (k, n) = (u(&c["k"]), u(&c["n"]));
        let w = wilson(k, n).unwrap();
        assert_eq!((w.method, w.n), (CiMethod::Wilson, n));
        close(w.estimate, f(&c["estimate"]), &format!("wilson({k}, {n}).estimate"));
        check_bounds(&w, c, &format!("wilson({k}, {n})"));
        assert!(w.bounds().is_some(), "a Wilson interval never collapses");
    }
}

/// The seeded bootstrap of a mean and of F1 equals the script's re-implementation.
#[test]
fn bootstrap_matches_reference() {
    let r = reference();
    for c in r["bootstrap_mean"].as_array().unwrap() {
        let cfg = Bootstrap { resamples: DEFAULT_RESAMPLES, seed: u(&c["seed"]) };
        let b = bootstrap_mean(&floats(&c["values"]), cfg).unwrap();
        assert_eq!((b.resamples, b.seed), (Some(u(&c["resamples"]) as u32), Some(cfg.seed)));
        close(b.estimate, f(&c["estimate"]), &format!("bootstrap_mean n={}", b.n));
        check_bounds(&b, c, &format!("bootstrap_mean n={}", b.n));
    }
    for c in r["f1_bootstrap"].as_array().unwrap() {
        let conf = Confusion {
            true_pos: u(&c["tp"]),
            false_pos: u(&c["fp"]),
            true_neg: u(&c["tn"]),
            false_neg: u(&c["fn"]),
        };
        let b = f1_bootstrap(&conf, Bootstrap::default()).unwrap();
        assert_eq!(b.resamples, Some(u(&c["resamples"]) as u32), "{conf:?}");
        close(b.estimate, f(&c["estimate"]), &format!("f1_bootstrap {conf:?}"));
        check_bounds(&b, c, &format!("f1_bootstrap {conf:?}"));
    }
}

/// DeLong's AUROC variance and interval equal the direct O(mn) computation, and the mean
/// of independent AUROCs combines their variances.
#[test]
fn delong_matches_reference() {
    let r = reference();
    let cases = r["delong"].as_array().unwrap();
    let mut parts = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let (labels, scores) = (bools(&c["labels"]), floats(&c["scores"]));
        let d = delong(&labels, &scores).unwrap();
        close(d.auroc, f(&c["auroc"]), &format!("case {i} auroc"));
        close(d.variance, f(&c["variance"]), &format!("case {i} variance"));
        let iv = auroc_delong(&labels, &scores).unwrap();
        check_bounds(&iv, c, &format!("case {i}"));
        assert_eq!(iv.n, labels.len() as u64);
        parts.push(d);
    }
    let m = &r["delong_mean"];
    let of: Vec<usize> = m["of"].as_array().unwrap().iter().map(|v| u(v) as usize).collect();
    let chosen: Vec<_> = of.iter().map(|&i| parts[i]).collect();
    let agg = mean_auroc_delong(&chosen).unwrap();
    close(agg.estimate, f(&m["estimate"]), "delong_mean.estimate");
    check_bounds(&agg, m, "delong_mean");
}

/// McNemar's exact p-value equals scipy's binomial test. (Newcombe's interval is checked
/// against a published worked example, `metrics::paired::tests`, not here: the script
/// coded the same formula, so the check was circular.)
#[test]
fn mcnemar_matches_scipy() {
    for (i, c) in reference()["mcnemar"].as_array().unwrap().iter().enumerate() {
        let t = mcnemar(&bools(&c["a"]), &bools(&c["b"])).unwrap();
        assert_eq!(t.test, PairedTestKind::McnemarExact);
        let d = t.discordant.unwrap();
        assert_eq!((d.only_a, d.only_b), (u(&c["only_a"]), u(&c["only_b"])), "case {i}");
        close(t.p_value, f(&c["p_value"]), &format!("case {i} p"));
        assert_eq!(t.significant, f(&c["p_value"]) < 0.05, "case {i}");
        close(t.difference.estimate, f(&c["estimate"]), &format!("case {i} estimate"));
        assert!(t.difference.contains(t.difference.estimate), "case {i}: {t:?}");
    }
}

/// The paired bootstrap (same resampled items for both models) equals the reference.
#[test]
fn paired_bootstrap_matches_reference() {
    for (i, c) in reference()["paired_bootstrap"].as_array().unwrap().iter().enumerate() {
        let cfg = Bootstrap { resamples: DEFAULT_RESAMPLES, seed: u(&c["seed"]) };
        let t = paired_bootstrap_mean(&floats(&c["a"]), &floats(&c["b"]), cfg).unwrap();
        let d = t.difference;
        for (got, key) in [(d.estimate, "estimate"), (t.p_value, "p_value")] {
            close(got, f(&c[key]), &format!("case {i} {key}"));
        }
        check_bounds(&d, c, &format!("case {i}"));
        assert_eq!(d.resamples, Some(u(&c["resamples"]) as u32));
        let (low, high) = (f(&c["low"]), f(&c["high"]));
        assert_eq!(t.significant, !(low <= 0.0 && 0.0 <= high), "case {i}");
    }
}

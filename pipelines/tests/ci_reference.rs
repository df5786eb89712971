//! Halyard's intervals and paired tests against `data/ci_reference.json`, computed
//! independently by `data/ci_reference.py` (scipy, a direct DeLong, a re-implemented
//! bootstrap generator; see the script for what each value is checked against).

use halyard_pipelines::metrics::classification::Confusion;
use halyard_pipelines::metrics::interval::{
    auroc_delong, bootstrap_mean, delong, f1_bootstrap, mean_auroc_delong, wilson, Bootstrap,
    CiMethod, DEFAULT_RESAMPLES, DEFAULT_SEED, LEVEL, Z95,
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

/// Wilson intervals equal scipy's `proportion_ci(method="wilson")`.
#[test]
fn wilson_matches_scipy() {
    for c in reference()["wilson"].as_array().unwrap() {
        let (k, n) = (u(&c["k"]), u(&c["n"]));
        let w = wilson(k, n).unwrap();
        assert_eq!((w.method, w.n), (CiMethod::Wilson, n));
        for (got, key) in [(w.estimate, "estimate"), (w.low, "low"), (w.high, "high")] {
            close(got, f(&c[key]), &format!("wilson({k}, {n}).{key}"));
        }
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
        for (got, key) in [(b.estimate, "estimate"), (b.low, "low"), (b.high, "high")] {
            close(got, f(&c[key]), &format!("bootstrap_mean n={} .{key}", b.n));
        }
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
        for (got, key) in [(b.estimate, "estimate"), (b.low, "low"), (b.high, "high")] {
            close(got, f(&c[key]), &format!("f1_bootstrap {conf:?}.{key}"));
        }
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
        close(iv.low, f(&c["low"]), &format!("case {i} low"));
        close(iv.high, f(&c["high"]), &format!("case {i} high"));
        assert_eq!(iv.n, labels.len() as u64);
        parts.push(d);
    }
    let m = &r["delong_mean"];
    let of: Vec<usize> = m["of"].as_array().unwrap().iter().map(|v| u(v) as usize).collect();
    let chosen: Vec<_> = of.iter().map(|&i| parts[i]).collect();
    let agg = mean_auroc_delong(&chosen).unwrap();
    for (got, key) in [(agg.estimate, "estimate"), (agg.low, "low"), (agg.high, "high")] {
        close(got, f(&m[key]), &format!("delong_mean.{key}"));
    }
}

/// McNemar's exact p-value equals scipy's binomial test; Newcombe's interval equals the
/// formula on scipy's Wilson intervals.
#[test]
fn mcnemar_matches_scipy() {
    for (i, c) in reference()["mcnemar"].as_array().unwrap().iter().enumerate() {
        let t = mcnemar(&bools(&c["a"]), &bools(&c["b"])).unwrap();
        assert_eq!(t.test, PairedTestKind::McnemarExact);
        let d = t.discordant.unwrap();
        assert_eq!((d.only_a, d.only_b), (u(&c["only_a"]), u(&c["only_b"])), "case {i}");
        close(t.p_value, f(&c["p_value"]), &format!("case {i} p"));
        assert_eq!(t.significant, f(&c["p_value"]) < 0.05, "case {i}");
        for (got, key) in [
            (t.difference.estimate, "estimate"),
            (t.difference.low, "low"),
            (t.difference.high, "high"),
        ] {
            close(got, f(&c[key]), &format!("case {i} {key}"));
        }
    }
}

/// The paired bootstrap (same resampled items for both models) equals the reference.
#[test]
fn paired_bootstrap_matches_reference() {
    for (i, c) in reference()["paired_bootstrap"].as_array().unwrap().iter().enumerate() {
        let cfg = Bootstrap { resamples: DEFAULT_RESAMPLES, seed: u(&c["seed"]) };
        let t = paired_bootstrap_mean(&floats(&c["a"]), &floats(&c["b"]), cfg).unwrap();
        let d = t.difference;
        for (got, key) in
            [(d.estimate, "estimate"), (d.low, "low"), (d.high, "high"), (t.p_value, "p_value")]
        {
            close(got, f(&c[key]), &format!("case {i} {key}"));
        }
        assert_eq!(d.resamples, Some(u(&c["resamples"]) as u32));
        assert_eq!(t.significant, !(d.low <= 0.0 && 0.0 <= d.high), "case {i}");
    }
}

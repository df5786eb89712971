//! Halyard's agreement statistics and MACE against `data/agreement_reference.json`,
//! computed independently by `data/agreement_reference.py` (scikit-learn, statsmodels, the
//! `krippendorff` package, published worked examples, an EM step derived by hand and a
//! numpy EM; see the script for what each value is checked against).

use halyard_pipelines::metrics::agreement::{
    cohen_kappa, cohen_kappa_ci, error_correlations, fleiss_kappa, fleiss_kappa_ci,
    krippendorff_alpha_ci, krippendorff_alpha_nominal, majority, Majority, Ratings,
};
use halyard_pipelines::metrics::interval::{Bootstrap, Interval, DEFAULT_RESAMPLES, DEFAULT_SEED};
use halyard_pipelines::metrics::mace::{mace, mace_from, MaceConfig, MaceResult};
use serde_json::Value;

fn reference() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/agreement_reference.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap()
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap()
}

fn from<T: serde::de::DeserializeOwned>(v: &Value) -> T {
    serde_json::from_value(v.clone()).unwrap()
}

fn ratings(c: &Value) -> Ratings {
    Ratings::new(u(&c["categories"]) as usize, from(&c["items"])).unwrap()
}

const TOL: f64 = 1e-9;

fn close(got: f64, want: f64, what: &str) {
    assert!((got - want).abs() <= TOL * want.abs().max(1.0), "{what}: got {got}, want {want}");
}

fn close_all(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        close(*g, *w, &format!("{what}[{i}]"));
    }
}

fn close_rows(got: &[Vec<f64>], want: &[Vec<f64>], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: rows");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        close_all(g, w, &format!("{what}[{i}]"));
    }
}

/// The bootstrap settings agree with the script's.
#[test]
fn constants_match() {
    let r = reference();
    assert_eq!((DEFAULT_RESAMPLES as u64, DEFAULT_SEED), (u(&r["resamples"]), u(&r["seed"])));
}

/// The seeded bootstrap interval equals the script's re-implementation: same resamples
/// kept, same type-7 quantiles, estimate on all items inside the bounds.
fn check_ci(iv: &Interval, estimate: f64, c: &Value, what: &str) {
    let ci = &c["ci"];
    close(iv.estimate, estimate, &format!("{what}.estimate"));
    assert_eq!(iv.resamples, Some(u(&ci["resamples"]) as u32), "{what}: resamples kept");
    if let Some(n) = ci["n"].as_u64() {
        assert_eq!(iv.n, n, "{what}: items resampled");
    }
    let (l, h) = iv.bounds().unwrap_or_else(|| panic!("{what}: not estimable: {iv:?}"));
    close(l, f(&ci["low"]), &format!("{what}.low"));
    close(h, f(&ci["high"]), &format!("{what}.high"));
    assert!(l <= iv.estimate && iv.estimate <= h, "{what}: {iv:?}");
}

/// Cohen's κ equals scikit-learn's `cohen_kappa_score` and Wikipedia's worked 0.4; the
/// bootstrap interval equals the reference's.
#[test]
fn cohen_matches_sklearn() {
    for c in reference()["cohen"].as_array().unwrap() {
        let what = c["source"].as_str().unwrap();
        let k = u(&c["categories"]) as usize;
        let (a, b): (Vec<usize>, Vec<usize>) = (from(&c["a"]), from(&c["b"]));
        let kappa = cohen_kappa(k, &a, &b).unwrap();
        close(kappa, f(&c["kappa"]), what);
        if let Some(p) = c["published"].as_f64() {
            close(kappa, p, &format!("{what} (published)"));
        }
        if c.get("ci").is_some() {
            let iv = cohen_kappa_ci(k, &a, &b, Bootstrap::default()).unwrap();
            check_ci(&iv, kappa, c, what);
        }
    }
}

/// Fleiss's κ equals statsmodels' on the items rated by every rater, and Wikipedia's worked
/// 0.210 (published to 3 decimals).
#[test]
fn fleiss_matches_statsmodels() {
    for c in reference()["fleiss"].as_array().unwrap() {
        let what = c["source"].as_str().unwrap();
        let r = ratings(c);
        let kappa = fleiss_kappa(&r).unwrap();
        close(kappa, f(&c["kappa"]), what);
        if let Some(p) = c["published"].as_f64() {
            assert!((kappa - p).abs() < 5e-4, "{what}: {kappa} vs published {p}");
        }
        let iv = fleiss_kappa_ci(&r, Bootstrap::default()).unwrap();
        check_ci(&iv, kappa, c, what);
    }
}

/// Krippendorff's nominal α equals the `krippendorff` package's, and Krippendorff's (2011)
/// worked example with missing data (0.743, published to 3 decimals).
#[test]
fn krippendorff_matches_package() {
    for c in reference()["krippendorff"].as_array().unwrap() {
        let what = c["source"].as_str().unwrap();
        let r = ratings(c);
        let alpha = krippendorff_alpha_nominal(&r).unwrap();
        close(alpha, f(&c["alpha"]), what);
        if let Some(p) = c["published"].as_f64() {
            assert!((alpha - p).abs() < 5e-4, "{what}: {alpha} vs published {p}");
        }
        let iv = krippendorff_alpha_ci(&r, Bootstrap::default()).unwrap();
        check_ci(&iv, alpha, c, what);
    }
}

/// The error correlations equal numpy's `corrcoef` of the error indicators (None where a
/// rater's errors do not vary).
#[test]
fn error_correlations_match_numpy() {
    for (i, c) in reference()["error_correlations"].as_array().unwrap().iter().enumerate() {
        let r = ratings(c);
        let truth: Vec<Option<usize>> = from(&c["truth"]);
        let got = error_correlations(&r, &truth).unwrap();
        let want: Vec<Vec<Option<f64>>> = from(&c["correlations"]);
        assert_eq!(got.len(), want.len());
        for (a, (g, w)) in got.iter().zip(&want).enumerate() {
            for (b, (g, w)) in g.iter().zip(w).enumerate() {
                match (g, w) {
                    (Some(g), Some(w)) => close(*g, *w, &format!("case {i} rho[{a}][{b}]")),
                    _ => assert_eq!(g.is_some(), w.is_some(), "case {i} rho[{a}][{b}]"),
                }
            }
        }
    }
}

/// The majority of each row equals the script's.
#[test]
fn majority_matches() {
    for c in reference()["majority"].as_array().unwrap() {
        let row: Vec<Option<usize>> = from(&c["row"]);
        assert_eq!(majority(&row), from::<Majority>(&c["majority"]), "{row:?}");
    }
}

fn check_fit(got: &MaceResult, want: &Value, what: &str) {
    close_all(
        &got.competence,
        &from::<Vec<f64>>(&want["competence"]),
        &format!("{what} competence"),
    );
    close_rows(&got.spamming, &from::<Vec<Vec<f64>>>(&want["spamming"]), &format!("{what} ξ"));
    close_rows(
        &got.posteriors,
        &from::<Vec<Vec<f64>>>(&want["posteriors"]),
        &format!("{what} posteriors"),
    );
    assert_eq!(got.labels, from::<Vec<Option<usize>>>(&want["labels"]), "{what} labels");
    close(got.log_likelihood, f(&want["log_likelihood"]), &format!("{what} log-likelihood"));
    assert_eq!(got.iterations as u64, u(&want["iterations"]), "{what} iterations");
    assert_eq!(got.converged, want["converged"].as_bool().unwrap(), "{what} converged");
}

fn fixed_start(c: &Value, r: &Ratings, iterations: u32) -> MaceResult {
    let theta: Vec<f64> = from(&c["init_competence"]);
    let xi: Vec<Vec<f64>> = from(&c["init_spamming"]);
    mace_from(r, &theta, &xi, iterations, f(&c["smoothing"])).unwrap()
}

/// One EM step derived by hand (exact fractions in the script's comments): the initial
/// E-step's posteriors, and θ, ξ after one M-step.
#[test]
fn mace_one_step_by_hand() {
    let c = &reference()["mace_hand"];
    let r = ratings(c);
    let zero = fixed_start(c, &r, 0);
    close_rows(&zero.posteriors, &from::<Vec<Vec<f64>>>(&c["posteriors_0"]), "posteriors_0");
    assert_eq!((zero.iterations, zero.converged, zero.restarts), (0, false, 1));
    let one = fixed_start(c, &r, 1);
    close_all(&one.competence, &from::<Vec<f64>>(&c["competence_1"]), "competence_1");
    close_rows(&one.spamming, &from::<Vec<Vec<f64>>>(&c["spamming_1"]), "spamming_1");
}

/// EM from fixed starts equals the independent numpy EM, iteration for iteration.
#[test]
fn mace_fixed_start_matches_numpy() {
    for (i, c) in reference()["mace_fixed"].as_array().unwrap().iter().enumerate() {
        let r = ratings(c);
        let got = fixed_start(c, &r, u(&c["iterations"]) as u32);
        check_fit(&got, c, &format!("fixed start {i}"));
    }
}

fn config(c: &Value) -> MaceConfig {
    from(&c["config"])
}

/// Full fits with random restarts (the tool's initialisation re-implemented in the script)
/// equal the numpy EM's: same starts, same stopping rule, same chosen restart.
#[test]
fn mace_restarts_match_numpy() {
    let r = reference();
    // The script's configuration is the tool's `--em` with its 50 iterations (written
    // without a mode, it reads as EM).
    let em50 = MaceConfig { iterations: 50, ..MaceConfig::em() };
    assert_eq!(config(&r["mace_full"][0]), em50, "the script's defaults");
    for (i, c) in r["mace_full"].as_array().unwrap().iter().enumerate() {
        let cfg = config(c);
        let got = mace(&ratings(c), cfg).unwrap();
        assert_eq!(got.restarts, cfg.restarts);
        check_fit(&got, c, &format!("full {i}"));
    }
}

/// The synthetic panel (designed competences 0.95, 0.9, 0.7, 0.4, 0.1; 400 items, one of
/// them unrated): MACE's fit equals the numpy EM's, ranks the raters in the designed order,
/// and its labels are more accurate than the majority vote's (ties to the lowest label).
#[test]
fn mace_synthetic_panel() {
    let s = &reference()["mace_synthetic"];
    let r = ratings(s);
    let truth: Vec<usize> = from(&s["truth"]);
    let fit = mace(&r, config(s)).unwrap();
    check_fit(&fit, &s["fit"], "synthetic");
    let fixed = &s["fixed_start"];
    check_fit(&fixed_start(fixed, &r, u(&fixed["iterations"]) as u32), fixed, "synthetic fixed");

    let designed: Vec<f64> = from(&s["designed_competence"]);
    let order = |v: &[f64]| {
        let mut idx: Vec<usize> = (0..v.len()).collect();
        idx.sort_by(|&a, &b| v[b].total_cmp(&v[a]));
        idx
    };
    assert_eq!(order(&fit.competence), order(&designed), "{:?}", fit.competence);
    for (got, want) in fit.competence.iter().zip(&designed) {
        assert!((got - want).abs() < 0.1, "competence {got} vs designed {want}");
    }

    assert_eq!(fit.labels[7], None, "the unrated item");
    let accuracy = |labels: &[Option<usize>]| {
        labels.iter().zip(&truth).filter(|(l, t)| **l == Some(**t)).count() as f64
            / truth.len() as f64
    };
    let votes: Vec<Option<usize>> = r
        .items
        .iter()
        .map(|row| match majority(row) {
            Majority::Label(c) => Some(c),
            Majority::Tie(tied) => tied.first().copied(),
            Majority::Unrated => None,
        })
        .collect();
    let (mace_acc, vote_acc) = (accuracy(&fit.labels), accuracy(&votes));
    close(mace_acc, f(&s["mace_accuracy"]), "MACE accuracy");
    close(vote_acc, f(&s["majority_accuracy"]), "majority accuracy");
    assert!(mace_acc > vote_acc, "MACE {mace_acc} vs majority {vote_acc}");
}

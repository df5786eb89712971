//! MACE against the official tool (Hovy et al. 2013, github.com/dirkhovy/MACE,
//! `MACE.java`): its output on two committed panels, in its default mode (Variational
//! Bayes) and with `--em`. `data/mace_tool/README.md` names the tool's commit and the
//! command that made every file.
//!
//! The tool ran 1000 iterations per restart (its maximum), so both fits sit at their fixed
//! point; Halyard run the same way (tolerance 0, 1000 iterations) must give the tool's
//! competences and posteriors to 1e-9 and its labels exactly. Halyard's defaults (stop at
//! a log-likelihood change below 1e-9) must give them to 1e-5 and report convergence.

use std::collections::HashMap;

use halyard_pipelines::metrics::agreement::Ratings;
use halyard_pipelines::metrics::mace::{mace, MaceConfig, MaceMode, MaceResult, MAX_ITERATIONS};

fn read(name: &str) -> String {
    let path = format!("{}/tests/data/mace_tool/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The panel: one line per item, one column per rater, labels 0..3, an empty line for an
/// item nobody rated.
fn panel(name: &str) -> Ratings {
    let text = read(&format!("{name}.csv"));
    let rows: Vec<Vec<Option<usize>>> = text
        .lines()
        .map(|line| {
            if line.trim().is_empty() {
                return Vec::new();
            }
            line.split(',').map(|v| (!v.is_empty()).then(|| v.parse().unwrap())).collect()
        })
        .collect();
    let raters = rows.iter().map(Vec::len).max().unwrap();
    let rows = rows
        .into_iter()
        .map(|mut r| {
            r.resize(raters, None);
            r
        })
        .collect();
    Ratings::new(3, rows).unwrap()
}

/// The tool's competences and, per item, its posterior over labels 0..3 (`None` for an
/// empty line).
fn tool(name: &str, mode: &str) -> (Vec<f64>, Vec<Option<Vec<f64>>>) {
    let competence: Vec<f64> = read(&format!("{name}.{mode}.competence"))
        .trim()
        .split('\t')
        .map(|v| v.parse().unwrap())
        .collect();
    let posteriors = read(&format!("{name}.{mode}.prediction"))
        .lines()
        .map(|line| {
            if line.is_empty() {
                return None;
            }
            let by_label: HashMap<usize, f64> = line
                .split('\t')
                .map(|pair| {
                    let (l, p) = pair.split_once(' ').unwrap();
                    (l.parse().unwrap(), p.parse().unwrap())
                })
                .collect();
            Some((0..3).map(|l| by_label[&l]).collect())
        })
        .collect();
    (competence, posteriors)
}

fn check(name: &str, mode: MaceMode, fit: &MaceResult, tol: f64) {
    let (competence, posteriors) = tool(name, if mode == MaceMode::Em { "em" } else { "vb" });
    assert_eq!(fit.competence.len(), competence.len(), "{name} {mode:?}: raters");
    for (j, (got, want)) in fit.competence.iter().zip(&competence).enumerate() {
        assert!((got - want).abs() < tol, "{name} {mode:?}: competence[{j}] {got} vs tool {want}");
    }
    assert_eq!(fit.posteriors.len(), posteriors.len(), "{name} {mode:?}: items");
    for (i, want) in posteriors.iter().enumerate() {
        let Some(want) = want else {
            assert_eq!(fit.labels[i], None, "{name} {mode:?}: item {i} is unrated");
            continue;
        };
        for (c, (got, want)) in fit.posteriors[i].iter().zip(want).enumerate() {
            assert!(
                (got - want).abs() < tol,
                "{name} {mode:?}: posterior[{i}][{c}] {got} vs tool {want}"
            );
        }
        let best = (0..3).fold(0, |b, c| if want[c] > want[b] { c } else { b });
        assert_eq!(fit.labels[i], Some(best), "{name} {mode:?}: label of item {i}");
    }
}

/// Halyard run as the tool was (1000 iterations, no early stop) equals the tool's output
/// to 1e-9 in both modes, on both panels.
#[test]
fn mace_equals_official_tool_at_its_fixed_point() {
    for name in ["panel400", "small"] {
        let r = panel(name);
        for cfg in [MaceConfig::default(), MaceConfig::em()] {
            let cfg = MaceConfig { iterations: MAX_ITERATIONS, tolerance: 0.0, ..cfg };
            let fit = mace(&r, cfg).unwrap();
            assert_eq!(fit.iterations, MAX_ITERATIONS);
            check(name, cfg.mode, &fit, 1e-9);
        }
    }
}

/// Halyard's defaults (Variational Bayes, as the tool's; `em()` for `--em`) stop at the
/// tolerance within the cap, report convergence, and give the tool's fixed point to 1e-5
/// (a log-likelihood change below 1e-9 leaves the posteriors up to about 1.5e-6 from it).
#[test]
fn mace_defaults_converge_to_official_tool() {
    assert_eq!(MaceConfig::default().mode, MaceMode::Variational);
    assert_eq!((MaceConfig::default().alpha, MaceConfig::default().beta), (0.5, 0.5));
    assert_eq!(MaceConfig::em().mode, MaceMode::Em);
    for name in ["panel400", "small"] {
        let r = panel(name);
        for cfg in [MaceConfig::default(), MaceConfig::em()] {
            let fit = mace(&r, cfg).unwrap();
            eprintln!(
                "{name} {:?}: {} iterations, converged {}",
                cfg.mode, fit.iterations, fit.converged
            );
            assert!(fit.converged && fit.iterations < cfg.iterations, "{name} {cfg:?}: {fit:?}");
            check(name, cfg.mode, &fit, 1e-5);
        }
    }
}

/// A configuration written before issue 45 (no `mode`, `alpha`, `beta`) reads back as the
/// EM fit it was; the mode serialises in lowercase.
#[test]
fn mace_config_without_mode_reads_as_em() {
    let old = r#"{"restarts":10,"iterations":50,"tolerance":1e-9,"smoothing":0.01,"seed":7}"#;
    let cfg: MaceConfig = serde_json::from_str(old).unwrap();
    assert_eq!(cfg, MaceConfig { iterations: 50, seed: 7, ..MaceConfig::em() });
    let j = serde_json::to_value(MaceConfig::default()).unwrap();
    assert_eq!(j["mode"], "variational");
}

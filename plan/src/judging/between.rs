//! The panel against independence (issue 45, item 9).
//!
//! "Effective number of judges", n / (1 + (n − 1)·ρ̄) from the mean correlation of the
//! judges' errors, misleads: phi is bounded by the error rates, so a judge whose 10% of
//! errors all fall inside another's 30% has phi 0.51 with it and gives n_eff 1.33 although
//! it adds nothing to a majority. What a reader can act on instead: the error correlation
//! matrix as it is, and the panel's observed majority accuracy beside the accuracy the same
//! judges would reach if they erred independently
//! ([`independent_panel_accuracy`]: each judge's confusion rows against the truth and the
//! truth's class shares, on the same units). Below the prediction, the judges err
//! together; at it, they are as good as independent.

use halyard_pipelines::metrics::agreement::{
    independent_panel_accuracy, majority, Majority, Ratings,
};
use halyard_pipelines::metrics::interval::{bootstrap_clustered, Bootstrap};
use serde::{Deserialize, Serialize};

use super::clusters::{by_item, proportion_ci};
use super::figure::Figure;

/// The judges' majority against the truth beside the independence prediction, over the
/// units with a truth (every share is of them; no verdict — a tie, no rating — is never
/// right).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PanelIndependence {
    /// Units with a truth.
    pub units: u64,
    /// Share the judges' majority gets right, interval over questions.
    pub observed: Figure,
    /// Share with a majority verdict.
    pub observed_coverage: f64,
    /// What independent judges with the same confusion rows would get right …
    pub independent: f64,
    /// … and how often they would reach a verdict.
    pub independent_coverage: f64,
    /// observed − independent, percentile bootstrap over questions (both recomputed on
    /// each resample). Negative: the judges err together.
    pub difference: Figure,
}

/// [`PanelIndependence`] of the ratings `r` (one row per unit) against `truth`, clusters
/// from `items`. `None` without a unit with a truth, or where the prediction is undefined
/// (more judges than it handles).
pub fn panel_vs_independence(
    r: &Ratings,
    truth: &[Option<usize>],
    items: &[&str],
    cfg: Bootstrap,
) -> Option<PanelIndependence> {
    if items.len() != truth.len() {
        return None;
    }
    let mut known: Vec<usize> =
        (0..truth.len().min(r.items.len())).filter(|&i| truth[i].is_some()).collect();
    if known.is_empty() {
        return None;
    }
    // The prediction sums floating-point shares: the units in one order whatever order the
    // run stored them in (a resumed run), so that the figure is the same to the last digit.
    known.sort_by(|&a, &b| {
        (items[a], &r.items[a], truth[a]).cmp(&(items[b], &r.items[b], truth[b]))
    });
    let sub = r.subset(&known);
    let t: Vec<Option<usize>> = known.iter().map(|&i| truth[i]).collect();
    let at: Vec<&str> = known.iter().map(|&i| items[i]).collect();
    let all = independent_panel_accuracy(&sub, &t).ok()?;
    let hits: Vec<bool> = sub
        .items
        .iter()
        .zip(&t)
        .map(|(row, t)| matches!(majority(row), Majority::Label(c) if Some(c) == *t))
        .collect();
    let difference = bootstrap_clustered(&by_item(&at), cfg, |idx| {
        let rows = sub.subset(idx);
        let ts: Vec<Option<usize>> = idx.iter().map(|&i| t[i]).collect();
        independent_panel_accuracy(&rows, &ts)
            .ok()
            .map(|p| p.observed.correct - p.independent.correct)
    });
    Some(PanelIndependence {
        units: known.len() as u64,
        observed: Figure::of(proportion_ci(&hits, &at, cfg)),
        observed_coverage: all.observed.coverage,
        independent: all.independent.correct,
        independent_coverage: all.independent.coverage,
        difference: Figure::of(difference),
    })
}

#[cfg(test)]
mod tests {
    //! The nested case of issue 45: judge B's errors (10% of units) all fall inside judge
    //! A's (30%); judge C errs on 20%, independently of both. The design is exact: in
    //! every block of 50 units, A errs on units 0–2 of each ten, B on unit 0, C on the
    //! first ten, and the truth alternates by block, so every rate holds in each class.

    use halyard_pipelines::metrics::agreement::error_correlations;

    use super::*;

    fn nested(judges: usize) -> (Ratings, Vec<Option<usize>>, Vec<String>) {
        let (mut rows, mut truth, mut items) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..1000usize {
            let t = (i / 50) % 2;
            let wrong = [i % 10 < 3, i % 10 == 0, (i / 10) % 5 == 0];
            rows.push((0..judges).map(|j| Some(if wrong[j] { 1 - t } else { t })).collect());
            truth.push(Some(t));
            items.push(format!("q{}", i / 4));
        }
        (Ratings::new(2, rows).unwrap(), truth, items)
    }

    fn interval(f: &Figure) -> halyard_pipelines::metrics::interval::Interval {
        match f {
            Figure::Value(i) => *i,
            Figure::Undefined { undefined } => panic!("{undefined}"),
        }
    }

    /// Three judges: the majority is wrong wherever B is (A is too: 10%) and where A's
    /// other errors meet C's (20% · 20% = 4%): 86% right. Independent judges of accuracy
    /// 0.7, 0.9 and 0.8 are right where at most one errs: 0.7·0.9·0.8 + 0.3·0.9·0.8 +
    /// 0.7·0.1·0.8 + 0.7·0.9·0.2 = 0.902. The figure shows 0.86 beside 0.902.
    #[test]
    fn nested_errors_fall_short_of_independence() {
        let (r, truth, items) = nested(3);
        let items: Vec<&str> = items.iter().map(String::as_str).collect();
        let p = panel_vs_independence(&r, &truth, &items, Bootstrap::default()).unwrap();
        assert_eq!(p.units, 1000);
        assert!((interval(&p.observed).estimate - 0.86).abs() < 1e-12, "{p:?}");
        assert!((p.independent - 0.902).abs() < 1e-9, "{p:?}");
        assert_eq!((p.observed_coverage, p.independent_coverage), (1.0, 1.0));
        let d = interval(&p.difference);
        assert!((d.estimate + 0.042).abs() < 1e-9 && d.high.unwrap() < 0.0, "{d:?}");
        assert_eq!(d.clusters, Some(250));
        // The error correlation of A and B is phi = (0.1·0.7 − 0.2·0) / √(0.3·0.7·0.1·0.9).
        let c = error_correlations(&r, &truth).unwrap();
        let phi = 0.07 / (0.3f64 * 0.7 * 0.1 * 0.9).sqrt();
        assert!((c[0][1].unwrap() - phi).abs() < 1e-9, "{c:?}");
    }

    /// The pair, B's errors inside A's: n_eff read 2 / (1 + 0.51) = 1.33. Two
    /// independent judges of accuracy 0.7 and 0.9 agree-and-are-right 0.63 of the time
    /// and agree at all 0.63 + 0.03 = 0.66; nested, they agree wherever B is right or A
    /// and B both err: right 0.7, verdict on 0.8.
    #[test]
    fn nested_pair_against_independence() {
        let (r, truth, items) = nested(2);
        let items: Vec<&str> = items.iter().map(String::as_str).collect();
        let p = panel_vs_independence(&r, &truth, &items, Bootstrap::default()).unwrap();
        assert!((interval(&p.observed).estimate - 0.7).abs() < 1e-12, "{p:?}");
        assert!((p.observed_coverage - 0.8).abs() < 1e-12, "{p:?}");
        assert!((p.independent - 0.63).abs() < 1e-9, "{p:?}");
        assert!((p.independent_coverage - 0.66).abs() < 1e-9, "{p:?}");
        // No truth: no figure.
        assert!(
            panel_vs_independence(&r, &vec![None; 1000], &items, Bootstrap::default()).is_none()
        );
    }
}

//! Judge figures' intervals over questions (issue 45, item 10).
//!
//! A judge figure is computed over units, but units are not independent: HypoTermQA's
//! answers of different models to one question share that question (a hard question is
//! hard for every answer and every judge), and HVI's sentences share their passage. An
//! interval that resamples units as if independent is too narrow. Every interval here
//! resamples **clusters** — the units with the same [`UnitKey::item`](super::UnitKey) —
//! with [`bootstrap_clustered`]: each resample draws as many clusters as there are, with
//! replacement, and recomputes the figure over their units.
//!
//! A proportion keeps Wilson's interval where every cluster holds one unit (the units are
//! then independent as far as the design says); with larger clusters it is the cluster
//! bootstrap. A proportion of 0 or 1 over clustered units gives every resample the same
//! value, so the bootstrap says nothing: Wilson's interval over the clusters (each counted
//! as one observation, the most a cluster can be worth) stands in.

use std::collections::HashMap;

use halyard_pipelines::metrics::agreement::{
    cohen_kappa, fleiss_kappa, krippendorff_alpha_nominal, Ratings,
};
use halyard_pipelines::metrics::interval::{bootstrap_clustered, wilson, Bootstrap, Interval};
use halyard_pipelines::metrics::MetricError;

/// Positions `0..items.len()` grouped by equal item, clusters in order of first appearance.
pub fn by_item<S: AsRef<str>>(items: &[S]) -> Vec<Vec<usize>> {
    let mut at: HashMap<&str, usize> = HashMap::new();
    let mut out: Vec<Vec<usize>> = Vec::new();
    for (i, it) in items.iter().enumerate() {
        let next = out.len();
        let c = *at.entry(it.as_ref()).or_insert(next);
        if c == next {
            out.push(Vec::new());
        }
        out[c].push(i);
    }
    out
}

/// Cohen's κ of two labellers on the same units, interval over the units' clusters
/// (`items[i]` is unit i's cluster). Errors as [`cohen_kappa`].
pub fn kappa_ci<S: AsRef<str>>(
    categories: usize,
    a: &[usize],
    b: &[usize],
    items: &[S],
    cfg: Bootstrap,
) -> Result<Interval, MetricError> {
    check_len(a.len(), items.len())?;
    cohen_kappa(categories, a, b)?;
    bootstrap_clustered(&by_item(items), cfg, |idx| {
        let x: Vec<usize> = idx.iter().map(|&i| a[i]).collect();
        let y: Vec<usize> = idx.iter().map(|&i| b[i]).collect();
        cohen_kappa(categories, &x, &y).ok()
    })
}

/// Fleiss' κ over the units every rater rated, interval over their clusters. Errors as
/// [`fleiss_kappa`].
pub fn fleiss_ci<S: AsRef<str>>(
    r: &Ratings,
    items: &[S],
    cfg: Bootstrap,
) -> Result<Interval, MetricError> {
    check_len(r.items.len(), items.len())?;
    fleiss_kappa(r)?;
    let keep: Vec<usize> =
        (0..r.items.len()).filter(|&i| r.items[i].iter().all(Option::is_some)).collect();
    let sub = r.subset(&keep);
    let sub_items: Vec<&str> = keep.iter().map(|&i| items[i].as_ref()).collect();
    bootstrap_clustered(&by_item(&sub_items), cfg, |idx| fleiss_kappa(&sub.subset(idx)).ok())
}

/// Krippendorff's nominal α over the units with two or more ratings, interval over their
/// clusters. Errors as [`krippendorff_alpha_nominal`].
pub fn alpha_ci<S: AsRef<str>>(
    r: &Ratings,
    items: &[S],
    cfg: Bootstrap,
) -> Result<Interval, MetricError> {
    check_len(r.items.len(), items.len())?;
    krippendorff_alpha_nominal(r)?;
    let keep: Vec<usize> = (0..r.items.len())
        .filter(|&i| r.items[i].iter().filter(|v| v.is_some()).count() >= 2)
        .collect();
    let sub = r.subset(&keep);
    let sub_items: Vec<&str> = keep.iter().map(|&i| items[i].as_ref()).collect();
    bootstrap_clustered(&by_item(&sub_items), cfg, |idx| {
        krippendorff_alpha_nominal(&sub.subset(idx)).ok()
    })
}

/// The share of `hits` that are true: Wilson's interval when every cluster holds one unit,
/// else the cluster bootstrap (Wilson over the clusters when every unit is a hit, or none
/// is). Errors: `Empty` for no units; `LengthMismatch`.
pub fn proportion_ci<S: AsRef<str>>(
    hits: &[bool],
    items: &[S],
    cfg: Bootstrap,
) -> Result<Interval, MetricError> {
    check_len(hits.len(), items.len())?;
    let n = hits.len() as u64;
    let k = hits.iter().filter(|h| **h).count() as u64;
    let clusters = by_item(items);
    if clusters.len() as u64 == n {
        return wilson(k, n);
    }
    if k == 0 || k == n {
        let c = clusters.len() as u64;
        let mut w = wilson(if k == 0 { 0 } else { c }, c)?;
        w.clusters = Some(c);
        w.n = n;
        return Ok(w);
    }
    bootstrap_clustered(&clusters, cfg, |idx| {
        Some(idx.iter().filter(|&&i| hits[i]).count() as f64 / idx.len() as f64)
    })
}

fn check_len(units: usize, items: usize) -> Result<(), MetricError> {
    if units != items {
        return Err(MetricError::LengthMismatch {
            what: "units vs their clusters",
            left: units,
            right: items,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Designed panels where the units of a question share a part of their outcome: with
    //! m units per question and intra-question correlation ρ, Kish's design effect is
    //! 1 + (m − 1)ρ, so an interval over questions is √(1 + (m − 1)ρ) times as wide as
    //! one that takes the units as independent (Kish 1965, *Survey Sampling*, §5.4).

    use halyard_pipelines::metrics::agreement::cohen_kappa_ci;
    use halyard_pipelines::metrics::interval::SplitMix64;

    use super::*;

    const QUESTIONS: usize = 400;
    const PER_QUESTION: usize = 4;

    /// Per unit, whether a judge is right (probability 0.8): in a question drawn "shared"
    /// (probability `rho`) every unit has one outcome, otherwise each its own — the
    /// intra-question correlation is `rho`.
    fn outcomes(rho: f64, seed: u64) -> (Vec<bool>, Vec<String>) {
        let mut s = SplitMix64::new(seed);
        let (mut hits, mut items) = (Vec::new(), Vec::new());
        for q in 0..QUESTIONS {
            let shared = s.uniform() < rho;
            let common = s.uniform() < 0.8;
            for _ in 0..PER_QUESTION {
                let own = s.uniform() < 0.8;
                hits.push(if shared { common } else { own });
                items.push(format!("q{q}"));
            }
        }
        (hits, items)
    }

    fn width(i: &Interval) -> f64 {
        let (l, h) = i.bounds().unwrap();
        h - l
    }

    #[test]
    fn accuracy_interval_widens_by_the_design_effect() {
        let cfg = Bootstrap::default();
        for (rho, seed) in [(0.0, 1), (0.5, 2), (1.0, 3)] {
            let (hits, items) = outcomes(rho, seed);
            let k = hits.iter().filter(|h| **h).count() as u64;
            let plain = wilson(k, hits.len() as u64).unwrap();
            let clustered = proportion_ci(&hits, &items, cfg).unwrap();
            assert_eq!(clustered.clusters, Some(QUESTIONS as u64));
            assert_eq!(clustered.estimate, plain.estimate);
            let expected = (1.0 + (PER_QUESTION as f64 - 1.0) * rho).sqrt();
            let ratio = width(&clustered) / width(&plain);
            assert!(
                (ratio / expected - 1.0).abs() < 0.12,
                "ρ {rho}: ratio {ratio}, expected {expected}"
            );
        }
        // One unit per question: Wilson's interval itself.
        let hits = [true, false, true, true];
        let w = proportion_ci(&hits, &["a", "b", "c", "d"], cfg).unwrap();
        assert_eq!(w, wilson(3, 4).unwrap());
        // Every unit right: Wilson over the questions.
        let all = proportion_ci(&[true; 6], &["a", "a", "a", "b", "b", "b"], cfg).unwrap();
        assert_eq!(all.bounds(), wilson(2, 2).unwrap().bounds());
        assert!(proportion_ci(&hits, &["a"], cfg).is_err());
    }

    /// Two judges who disagree on whole questions (ρ = 1 between the units of a
    /// question): κ's interval over questions is √4 = 2 times the one over units.
    #[test]
    fn kappa_interval_widens_by_the_design_effect() {
        let cfg = Bootstrap::default();
        let mut s = SplitMix64::new(9);
        let (mut a, mut b, mut items) = (Vec::new(), Vec::new(), Vec::new());
        for q in 0..QUESTIONS {
            let label = usize::from(s.uniform() < 0.4);
            let other = if s.uniform() < 0.2 { 1 - label } else { label };
            for _ in 0..PER_QUESTION {
                a.push(label);
                b.push(other);
                items.push(format!("q{q}"));
            }
        }
        let plain = cohen_kappa_ci(2, &a, &b, cfg).unwrap();
        let clustered = kappa_ci(2, &a, &b, &items, cfg).unwrap();
        assert_eq!(clustered.estimate, plain.estimate);
        let ratio = width(&clustered) / width(&plain);
        assert!((ratio / 2.0 - 1.0).abs() < 0.12, "ratio {ratio}");
    }

    #[test]
    fn clusters_group_by_item_in_order() {
        assert_eq!(by_item(&["b", "a", "b", "c", "a"]), vec![vec![0, 2], vec![1, 4], vec![3]]);
        assert!(by_item::<&str>(&[]).is_empty());
    }
}

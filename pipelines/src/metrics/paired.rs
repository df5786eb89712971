//! Paired comparisons of two models on the same items, for the leaderboard (issue 16).
//!
//! Two models scored on the same questions are not independent samples: most of the
//! variance is the questions'. A paired test looks only at how the two differ item by item.
//! - [`paired_bootstrap_mean`]: a per-item score (BLEU-4, accuracy of an item, a 0/1
//!   outcome): the mean difference A − B with the percentile bootstrap interval over the
//!   shared items (the same resampled items for both models).
//! - [`paired_bootstrap_by`]: any figure computed from the shared items (AUROC, F1).
//! - [`mcnemar`]: paired binary outcomes (an HTS-style "valid answer" per question):
//!   McNemar's exact test (two-sided binomial on the discordant pairs) with Newcombe's
//!   interval for the difference of proportions.
//! - [`delong_paired`]: two AUROCs on the same labelled items (two judges scoring the same
//!   completions): DeLong, DeLong & Clarke-Pearson's (1988) test of correlated AUROCs.
//!
//! Each returns a [`PairedTest`]: the difference with its interval, the p-value and whether
//! the difference is significant at 5%.

use serde::{Deserialize, Serialize};

use super::interval::{
    mean_at, midranks, percentile_bootstrap, sample_variance, wilson, Bootstrap, CiMethod,
    Interval, LEVEL, Z95,
};
use super::MetricError;

/// Which paired test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PairedTestKind {
    /// Paired percentile bootstrap; p = 2·min(share of resampled differences ≤ 0, ≥ 0).
    PairedBootstrap,
    /// McNemar's exact test: two-sided binomial(b + c, ½) on the discordant pairs.
    McnemarExact,
    /// DeLong's test of two correlated AUROCs: z = ΔAUROC / √var(Δ) with the covariance of
    /// the structural components; p two-sided from the normal distribution.
    DelongPaired,
}

impl PairedTestKind {
    /// The method's name as reports print it.
    pub fn name(self) -> &'static str {
        match self {
            PairedTestKind::PairedBootstrap => "paired bootstrap",
            PairedTestKind::McnemarExact => "McNemar exact",
            PairedTestKind::DelongPaired => "DeLong paired",
        }
    }
}

/// Discordant pairs of a McNemar test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Discordant {
    /// Items where only A succeeds.
    pub only_a: u64,
    /// Items where only B succeeds.
    pub only_b: u64,
}

/// The comparison of model A with model B on their shared items.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PairedTest {
    pub test: PairedTestKind,
    /// A − B, with its 95% interval; `n` = shared items.
    pub difference: Interval,
    pub p_value: f64,
    /// `p < 0.05` (for the bootstrap: the interval excludes 0).
    pub significant: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discordant: Option<Discordant>,
}

fn check_paired<T>(a: &[T], b: &[T]) -> Result<(), MetricError> {
    if a.len() != b.len() {
        return Err(MetricError::LengthMismatch {
            what: "paired items (A vs B)",
            left: a.len(),
            right: b.len(),
        });
    }
    if a.is_empty() {
        return Err(MetricError::Empty { what: "shared items" });
    }
    Ok(())
}

/// Paired bootstrap of a difference figure `diff(indices)` = figure_A − figure_B on the
/// same resampled shared items; the estimate is `diff(0..n)`. Resamples where the figure is
/// undefined are dropped. Errors: `Empty`; `Undefined` when the difference is undefined on
/// the items or on every resample.
pub fn paired_bootstrap_by(
    n: usize,
    cfg: Bootstrap,
    diff: impl Fn(&[usize]) -> Option<f64>,
) -> Result<PairedTest, MetricError> {
    let (difference, reps) = percentile_bootstrap(n, cfg, CiMethod::PairedBootstrap, diff)?;
    let used = reps.len() as f64;
    let at_most_zero = reps.iter().filter(|d| **d <= 0.0).count() as f64;
    let at_least_zero = reps.iter().filter(|d| **d >= 0.0).count() as f64;
    let p_value = (2.0 * at_most_zero.min(at_least_zero) / used).min(1.0);
    // A collapsed interval (every resample gives one difference) is not estimable
    // (issue 29); the p-value still decides: 1 for identical models, 0 for a constant
    // non-zero difference.
    let significant = match difference.bounds() {
        Some((low, high)) => !(low <= 0.0 && 0.0 <= high),
        None => p_value < 1.0 - LEVEL,
    };
    Ok(PairedTest {
        test: PairedTestKind::PairedBootstrap,
        significant,
        difference,
        p_value,
        discordant: None,
    })
}

/// Paired bootstrap of the mean per-item difference `mean(a_i − b_i)` over the shared
/// items (`a[i]` and `b[i]` are the two models' scores on item i).
/// Errors: `LengthMismatch`; `Empty`; `NotANumber`.
pub fn paired_bootstrap_mean(
    a: &[f64],
    b: &[f64],
    cfg: Bootstrap,
) -> Result<PairedTest, MetricError> {
    check_paired(a, b)?;
    super::reject_nan("model A's item scores", a)?;
    super::reject_nan("model B's item scores", b)?;
    let d: Vec<f64> = a.iter().zip(b).map(|(x, y)| x - y).collect();
    paired_bootstrap_by(d.len(), cfg, |idx| Some(mean_at(&d, idx)))
}

/// `ln Σ_{i=0}^{k} C(n, i) / 2ⁿ` in log space (no underflow for large n).
fn ln_binomial_half_cdf(k: u64, n: u64) -> f64 {
    let ln_half = 0.5f64.ln();
    let mut ln_pmf = n as f64 * ln_half; // i = 0
    let mut terms = vec![ln_pmf];
    for i in 0..k {
        ln_pmf += ((n - i) as f64).ln() - ((i + 1) as f64).ln();
        terms.push(ln_pmf);
    }
    let max = terms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    max + terms.iter().map(|t| (t - max).exp()).sum::<f64>().ln()
}

/// McNemar's exact test on paired binary outcomes (`a[i]`: model A succeeded on item i):
/// with b = items only A got right and c = items only B got right, the two-sided p-value
/// `min(1, 2·P(X ≤ min(b, c)))`, X ~ Binomial(b + c, ½) (1 when b + c = 0). The difference
/// of the success proportions, A − B, gets Newcombe's hybrid score interval (Newcombe 1998,
/// Stat Med 17:2635, method 10): the two Wilson intervals combined with the correlation φ
/// of the 2×2 table, **continuity-corrected** as Newcombe gives it (and Altman, Machin,
/// Bryant & Gardner 2000, "Statistics with Confidence", ch. 6; R's `contingencytables`,
/// `Newcombe_square_and_add_CI_paired_2x2`): with the cells both, only A, only B, neither
/// (AD − BC = both·neither − onlyA·onlyB) and N items, φ = (AD − BC − N/2)/√(margins) when
/// AD − BC > N/2, 0 when 0 ≤ AD − BC ≤ N/2, and the raw (AD − BC)/√(margins) when
/// AD − BC < 0; 0 when a margin is 0. (Before issue 45 the raw φ was used throughout,
/// which narrows the interval of positively correlated outcomes: 0.0222–0.2168 instead of
/// the published 0.0115–0.2265 for Altman et al.'s Table 6.2.)
/// Errors: `LengthMismatch`; `Empty`.
pub fn mcnemar(a: &[bool], b: &[bool]) -> Result<PairedTest, MetricError> {
    check_paired(a, b)?;
    let mut t = [[0u64; 2]; 2]; // t[A][B]
    for (&x, &y) in a.iter().zip(b) {
        t[x as usize][y as usize] += 1;
    }
    let (both, only_a, only_b, neither) = (t[1][1], t[1][0], t[0][1], t[0][0]);
    let n = a.len() as u64;
    let discordant = only_a + only_b;
    let p_value = if discordant == 0 {
        1.0
    } else {
        (2.0 * ln_binomial_half_cdf(only_a.min(only_b), discordant).exp()).min(1.0)
    };
    let (w1, w2) = (wilson(both + only_a, n)?, wilson(both + only_b, n)?);
    let (p1, p2) = (w1.estimate, w2.estimate);
    // Wilson intervals of n ≥ 1 items always have bounds.
    let ((l1, h1), (l2, h2)) = (w1.bounds().unwrap_or((p1, p1)), w2.bounds().unwrap_or((p2, p2)));
    let margins = [(both + only_a), (only_b + neither), (both + only_b), (only_a + neither)];
    let phi = if margins.contains(&0) {
        0.0
    } else {
        let ad_bc = both as f64 * neither as f64 - only_a as f64 * only_b as f64;
        let half_n = n as f64 / 2.0;
        let corrected = if ad_bc > half_n {
            ad_bc - half_n
        } else if ad_bc >= 0.0 {
            0.0
        } else {
            ad_bc
        };
        corrected / margins.iter().map(|&m| m as f64).product::<f64>().sqrt()
    };
    let theta = p1 - p2;
    let side = |x: f64, y: f64| (x * x - 2.0 * phi * x * y + y * y).max(0.0).sqrt();
    let low = theta - side(p1 - l1, h2 - p2);
    let high = theta + side(h1 - p1, p2 - l2);
    Ok(PairedTest {
        test: PairedTestKind::McnemarExact,
        difference: Interval {
            estimate: theta,
            low: Some(low.max(-1.0)),
            high: Some(high.min(1.0)),
            level: LEVEL,
            method: CiMethod::NewcombePaired,
            n,
            resamples: None,
            seed: None,
            not_estimable: None,
            clusters: None,
        },
        p_value,
        significant: p_value < 1.0 - LEVEL,
        discordant: Some(Discordant { only_a, only_b }),
    })
}

/// DeLong's structural components of one score vector: `V10` over the positives and
/// `V01` over the negatives, in the order they appear (mid-rank form, as
/// [`super::interval::delong`]).
fn structural_components(labels: &[bool], scores: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let pos: Vec<f64> = labels.iter().zip(scores).filter(|p| *p.0).map(|p| *p.1).collect();
    let neg: Vec<f64> = labels.iter().zip(scores).filter(|p| !*p.0).map(|p| *p.1).collect();
    let (n1, n0) = (pos.len(), neg.len());
    let all: Vec<f64> = pos.iter().chain(&neg).copied().collect();
    let r_all = midranks(&all);
    let (r_pos, r_neg) = (midranks(&pos), midranks(&neg));
    let v10 = (0..n1).map(|i| (r_all[i] - r_pos[i]) / n0 as f64).collect();
    let v01 = (0..n0).map(|j| 1.0 - (r_all[n1 + j] - r_neg[j]) / n1 as f64).collect();
    (v10, v01)
}

/// Sample covariance (denominator n − 1) of two equally long vectors of at least 2.
fn sample_covariance(x: &[f64], y: &[f64]) -> f64 {
    let n = x.len() as f64;
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    x.iter().zip(y).map(|(a, b)| (a - mx) * (b - my)).sum::<f64>() / (n - 1.0)
}

/// DeLong's test of two correlated AUROCs: model A's and model B's scores of the same
/// items (`labels[i]`: item i is hallucinated, the positive class). The difference
/// AUROC_A − AUROC_B has variance `(S10_AA + S10_BB − 2·S10_AB)/n₁ + (S01_AA + S01_BB −
/// 2·S01_AB)/n₀` (DeLong, DeLong & Clarke-Pearson 1988, eq. 6 with contrast (1, −1));
/// p = erfc(|z|/√2). Errors as [`super::interval::delong`], plus `LengthMismatch`, and
/// `Undefined` when the difference has no variance (both scorers separate the classes
/// alike): no test can be made then, and the report says why.
pub fn delong_paired(labels: &[bool], a: &[f64], b: &[f64]) -> Result<PairedTest, MetricError> {
    check_paired(a, b)?;
    if labels.len() != a.len() {
        return Err(MetricError::LengthMismatch {
            what: "labels vs scores",
            left: labels.len(),
            right: a.len(),
        });
    }
    let (da, db) = (super::interval::delong(labels, a)?, super::interval::delong(labels, b)?);
    let (a10, a01) = structural_components(labels, a);
    let (b10, b01) = structural_components(labels, b);
    let (n1, n0) = (a10.len() as f64, a01.len() as f64);
    let var10 = sample_variance(&a10) + sample_variance(&b10) - 2.0 * sample_covariance(&a10, &b10);
    let var01 = sample_variance(&a01) + sample_variance(&b01) - 2.0 * sample_covariance(&a01, &b01);
    let variance = var10 / n1 + var01 / n0;
    let estimate = da.auroc - db.auroc;
    if variance.is_nan() || variance <= 1e-15 {
        return Err(MetricError::Undefined {
            what: "DeLong paired test",
            reason: "the AUROC difference has no variance on these items (the two scorers rank them alike)",
        });
    }
    let sd = variance.sqrt();
    let p_value = libm::erfc((estimate / sd).abs() / std::f64::consts::SQRT_2).min(1.0);
    Ok(PairedTest {
        test: PairedTestKind::DelongPaired,
        difference: Interval {
            estimate,
            low: Some((estimate - Z95 * sd).max(-1.0)),
            high: Some((estimate + Z95 * sd).min(1.0)),
            level: LEVEL,
            method: CiMethod::DelongPaired,
            n: labels.len() as u64,
            resamples: None,
            seed: None,
            not_estimable: None,
            clusters: None,
        },
        p_value,
        significant: p_value < 1.0 - LEVEL,
        discordant: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DeLong's paired test against an independent computation: the structural components
    /// from the Mann-Whitney kernel ψ(x, y) = [x > y] + ½[x = y] summed pair by pair (the
    /// 1988 paper's definition, not the mid-rank form used here), in a few lines of Python
    /// (the values below; `math.erfc` for p), for 6 hallucinated and 6 faithful items.
    #[test]
    fn delong_paired_matches_the_kernel_definition() {
        let labels = [true, true, true, true, true, false, false, false, false, false, false, true];
        let a = [0.9, 0.8, 0.7, 0.4, 0.6, 0.3, 0.2, 0.5, 0.1, 0.4, 0.35, 0.55];
        let b = [0.6, 0.5, 0.9, 0.3, 0.2, 0.4, 0.1, 0.6, 0.2, 0.3, 0.5, 0.45];
        let t = delong_paired(&labels, &a, &b).unwrap();
        let close = |x: f64, y: f64| (x - y).abs() < 1e-12;
        assert!(close(t.difference.estimate, 0.958_333_333_333_333_4 - 0.666_666_666_666_666_6));
        let sd = 0.021_990_740_740_740_74f64.sqrt();
        assert!(close(t.difference.high.unwrap() - t.difference.estimate, Z95 * sd), "{t:?}");
        assert!((t.p_value - 0.049_202_789_177_490_34).abs() < 1e-12, "{t:?}");
        assert!(t.significant && t.test == PairedTestKind::DelongPaired);
        // The same scorer twice: no variance, so no test (not p = 1 from 0/0).
        assert!(delong_paired(&labels, &a, &a).is_err());
        assert!(delong_paired(&labels, &a, &b[..3]).is_err());
    }

    /// Identical models: difference 0, p = 1, not significant, under both tests.
    #[test]
    fn identical_models_do_not_differ() {
        let a = [true, false, true, true, false];
        let m = mcnemar(&a, &a).unwrap();
        assert_eq!((m.difference.estimate, m.p_value, m.significant), (0.0, 1.0, false));
        let s = [0.1, 0.5, 0.7, 0.2];
        let p = paired_bootstrap_mean(&s, &s, Bootstrap::default()).unwrap();
        assert_eq!((p.difference.estimate, p.p_value, p.significant), (0.0, 1.0, false));
        // Issue 29: every resample gives 0, so the interval is not estimable, not [0, 0].
        use crate::metrics::interval::NotEstimable;
        assert_eq!(p.difference.bounds(), None);
        assert_eq!(p.difference.not_estimable, Some(NotEstimable::EveryResampleGives(0.0)));
    }

    /// Issue 45 (7): Newcombe's paired interval equals the published worked example of
    /// Altman, Machin, Bryant & Gardner (2000), "Statistics with Confidence" (2nd ed.),
    /// Table 6.2 (41 pairs: 14 both positive, 5 positive by the first method only, 0 by the
    /// second only, 22 neither): difference 0.1220 with 95% interval 0.0115 to 0.2265,
    /// printed to 4 decimals (AD − BC = 308 > N/2, so φ = (308 − 20.5)/√(19·22·14·27)).
    /// Swapping the two models negates the interval.
    #[test]
    fn newcombe_paired_matches_altman_table_6_2() {
        let rows = [(true, true, 14), (true, false, 5), (false, true, 0), (false, false, 22)];
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for (x, y, count) in rows {
            a.extend(std::iter::repeat_n(x, count));
            b.extend(std::iter::repeat_n(y, count));
        }
        let m = mcnemar(&a, &b).unwrap();
        let (low, high) = m.difference.bounds().unwrap();
        assert!((m.difference.estimate - 0.1220).abs() < 5e-5, "{m:?}");
        assert!((low - 0.0115).abs() < 5e-5 && (high - 0.2265).abs() < 5e-5, "{m:?}");
        // The raw φ (before issue 45) gave 0.0222 to 0.2168: narrower than published.
        assert!(low < 0.02 && high > 0.22, "{m:?}");
        let swapped = mcnemar(&b, &a).unwrap();
        let (sl, sh) = swapped.difference.bounds().unwrap();
        assert!((sl + high).abs() < 1e-12 && (sh + low).abs() < 1e-12, "{swapped:?}");
    }

    /// A model better on every item is significantly better; mismatched inputs are errors.
    #[test]
    fn clear_difference_and_bad_input() {
        let a = vec![true; 30];
        let b = vec![false; 30];
        let m = mcnemar(&a, &b).unwrap();
        assert!(m.significant && m.p_value < 1e-8 && m.difference.low.unwrap() > 0.5, "{m:?}");
        assert_eq!(m.discordant, Some(Discordant { only_a: 30, only_b: 0 }));
        assert!(mcnemar(&a, &b[..3]).is_err());
        assert!(mcnemar(&[], &[]).is_err());
        let up: Vec<f64> = (0..20).map(|i| i as f64 / 20.0 + 0.3).collect();
        let base: Vec<f64> = (0..20).map(|i| i as f64 / 20.0).collect();
        let p = paired_bootstrap_mean(&up, &base, Bootstrap::default()).unwrap();
        assert!(p.significant && (p.difference.estimate - 0.3).abs() < 1e-12, "{p:?}");
        assert!(paired_bootstrap_mean(&[f64::NAN], &[0.0], Bootstrap::default()).is_err());
    }
}

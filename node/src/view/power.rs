//! The power of a paired comparison of two rates (McNemar's test), by Connor's
//! sample-size formula (R. J. Connor, "Sample size for testing differences in proportions
//! for the paired-sample design", Biometrics 43(1):207–211, 1987, p. 209):
//!
//! ```text
//! n = ( z(1−α/2)·√ψ + z(1−β)·√(ψ − δ²) )² / δ²
//! ```
//!
//! where δ = p10 − p01 is the difference of the two rates (the share of items only A gets
//! right minus the share only B gets right) and ψ = p10 + p01 is the **discordance rate**,
//! the share of items on which the two disagree. The formula needs ψ: Halyard assumes the
//! discordance rate observed on the shared items (stated with every figure), since the
//! models' disagreement is a property of the pair, not of the difference sought.
//!
//! Two figures per comparison, at α = 0.05 two-sided and 80% power:
//! - the **minimum detectable difference** at this n: the δ for which the formula gives n;
//! - the **n needed** to detect a chosen difference.
//!
//! The quantiles are the standard normal's: z(0.975) = 1.959964, z(0.80) = 0.841621.
//! The test module checks Connor's worked example and a simulation of the exact McNemar
//! test that `halyard report` runs.

/// z(1 − 0.05/2), the standard normal quantile.
pub const Z_ALPHA: f64 = 1.959_963_984_540_054;
/// z(0.80), the standard normal quantile: 80% power.
pub const Z_POWER: f64 = 0.841_621_233_572_914_3;

/// Pairs needed to detect a rate difference `delta` at discordance rate `psi` (α = 0.05
/// two-sided, 80% power), before rounding up; `None` when no n can (δ = 0, or ψ < δ²
/// or ψ > 1: no such table of pairs).
pub fn pairs_needed(delta: f64, psi: f64) -> Option<f64> {
    let d = delta.abs();
    // NaN compares false both ways: refused with the rest.
    let usable = d > 0.0 && psi >= d && psi <= 1.0;
    if !usable {
        return None;
    }
    let top = Z_ALPHA * psi.sqrt() + Z_POWER * (psi - d * d).sqrt();
    Some(top * top / (d * d))
}

/// The smallest rate difference detectable with `n` pairs at discordance rate `psi`
/// (α = 0.05 two-sided, 80% power): the δ with [`pairs_needed`]`(δ, ψ) = n`, found by
/// bisection (n falls as δ grows, over 0 < δ ≤ ψ); `None` when even δ = ψ (every
/// discordant pair one way) needs more than n pairs, or ψ is 0.
pub fn min_detectable(n: u64, psi: f64) -> Option<f64> {
    let usable = n > 0 && psi > 0.0 && psi <= 1.0;
    if !usable {
        return None;
    }
    let n = n as f64;
    let needs = |d: f64| pairs_needed(d, psi).unwrap_or(f64::INFINITY);
    if needs(psi) > n {
        return None;
    }
    let (mut lo, mut hi) = (0.0_f64, psi);
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if needs(mid) > n {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(hi)
}

/// The power figures of one comparison of rates, as the view shows them.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Power {
    /// Shared items (pairs).
    pub n: u64,
    /// The discordance rate assumed: the share of shared items the two disagree on.
    pub discordance: f64,
    /// The smallest difference detectable at this n (α = 0.05, 80% power).
    pub min_detectable: Option<f64>,
    /// The difference asked about, and the pairs needed to detect it.
    pub target: f64,
    pub n_needed: Option<u64>,
}

/// Power of a comparison with `n` shared items, `only_a` and `only_b` discordant pairs,
/// for detecting a difference of `target`.
pub fn power(n: u64, only_a: u64, only_b: u64, target: f64) -> Power {
    let discordance = if n == 0 { 0.0 } else { (only_a + only_b) as f64 / n as f64 };
    Power {
        n,
        discordance,
        min_detectable: min_detectable(n, discordance),
        target,
        n_needed: pairs_needed(target, discordance).map(|x| x.ceil() as u64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use halyard_pipelines::metrics::interval::SplitMix64;
    use halyard_pipelines::metrics::paired::mcnemar;

    /// Connor's worked example (1987, p. 209; reproduced by the calculator at
    /// powerandsamplesize.com, "McNemar Z-test, 2-sided"): p01 = 0.45, p10 = 0.05,
    /// α = 0.05, 80% power: ψ = 0.5, δ = −0.4, n = 22.01, so 23 pairs.
    #[test]
    fn connor_worked_example() {
        let n = pairs_needed(0.05 - 0.45, 0.5).unwrap();
        assert!((n - 22.01).abs() < 0.01, "{n}");
        assert_eq!(n.ceil() as u64, 23);
        // The inverse: 23 pairs detect a difference just under 0.4 at ψ = 0.5.
        let d = min_detectable(23, 0.5).unwrap();
        assert!(d < 0.4 && d > 0.38, "{d}");
        assert!((pairs_needed(d, 0.5).unwrap() - 23.0).abs() < 1e-6);
    }

    /// Impossible inputs give no figure rather than a number.
    #[test]
    fn no_figure_where_no_table_exists() {
        assert_eq!(pairs_needed(0.0, 0.3), None);
        assert_eq!(pairs_needed(0.4, 0.3), None, "δ larger than ψ");
        assert_eq!(min_detectable(0, 0.3), None);
        assert_eq!(min_detectable(100, 0.0), None, "no discordant pairs");
        assert_eq!(min_detectable(3, 0.1), None, "3 pairs detect nothing at ψ = 0.1");
        let p = power(0, 0, 0, 0.05);
        assert_eq!((p.min_detectable, p.n_needed), (None, None));
    }

    /// Cross-check by simulation: at the n Connor's formula gives, McNemar's exact test
    /// (the one `halyard report` runs, `halyard_pipelines::metrics::paired::mcnemar`) finds
    /// the difference in about 80% of simulated studies; at half that n, far fewer.
    /// (Connor's is a normal approximation and the exact test is conservative: the
    /// simulated power is a few points under 80%.)
    #[test]
    fn simulated_power_of_the_exact_test_matches_connor() {
        let (p10, p01) = (0.15, 0.05);
        let n = pairs_needed(p10 - p01, p10 + p01).unwrap().ceil() as usize;
        assert_eq!(n, 155, "ψ = 0.2, δ = 0.1");
        let rate = |n: usize, seed: u64| {
            let mut rng = SplitMix64::new(seed);
            let studies = 2000;
            let mut found = 0;
            for _ in 0..studies {
                let (mut a, mut b) = (Vec::with_capacity(n), Vec::with_capacity(n));
                for _ in 0..n {
                    let u = rng.uniform();
                    // A right only, B right only, both right (the rest both wrong).
                    let (x, y) = if u < p10 {
                        (true, false)
                    } else if u < p10 + p01 {
                        (false, true)
                    } else {
                        let both = u < p10 + p01 + 0.4;
                        (both, both)
                    };
                    a.push(x);
                    b.push(y);
                }
                if mcnemar(&a, &b).unwrap().p_value < 0.05 {
                    found += 1;
                }
            }
            found as f64 / studies as f64
        };
        let at_n = rate(n, 7);
        assert!((0.72..=0.86).contains(&at_n), "simulated power {at_n} at n = {n}");
        let at_half = rate(n / 2, 8);
        assert!(at_half < 0.6, "simulated power {at_half} at n = {}", n / 2);
        // The minimum detectable difference at n is the δ simulated.
        let d = min_detectable(n as u64, 0.2).unwrap();
        assert!((d - 0.1).abs() < 0.002, "{d}");
    }
}

//! Hallucination Vulnerability Index (Rawte et al. 2023, Eq. 1; spec §4.2).
//!
//! ```text
//! HVI = 100/(2U) · [ (N − N_EFM)·(1 − P_EFM + δ1) + (N − N_ESL)·(1 − P_ESL + δ2) ]
//! ```
//!
//! This is the spec's recommended reading of the printed `Σ_{x=1}^{U}`: summing per-sentence
//! 0/1 indicators gives exactly these counts (reading them as totals inside the sum would
//! multiply the value by U and break the stated 0–100 range).
//!
//! What could not be verified (spec §4.2, §6.11) is left to the caller, as explicit
//! inputs: the estimator of `P_EFM` / `P_ESL` (no default is given), and `δ1`, `δ2`
//! (default 0). The paper reportedly first computes an **initial** HVI with δ = 0
//! ([`hvi_initial`]), then derives δ1, δ2 from the mean and standard deviation of the
//! initial values over its 15 LLMs (exact rule unknown, so not implemented) and computes
//! the **δ-adjusted** HVI ([`hvi`] with [`HviParams::with_deltas`]); for a 0–100 ranking
//! scale, clip with [`ranking_scale`].

use serde::{Deserialize, Serialize};

use super::{reject_nan, MetricError};

/// Sentence counts of one LLM over the evaluated passages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HviCounts {
    /// `U`: sentences generated.
    pub sentences: u64,
    /// `N(x)`: hallucinated sentences.
    pub hallucinated: u64,
    /// `N(EFM)`: sentences annotated extrinsic factual mirage.
    pub efm: u64,
    /// `N(ESL)`: sentences annotated extrinsic silver lining.
    pub esl: u64,
}

/// The weights of Eq. 1.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct HviParams {
    /// `P(EFM)`, the LLM's probability of producing EFM, in [0, 1].
    pub p_efm: f64,
    /// `P(ESL)`, in [0, 1].
    pub p_esl: f64,
    /// `δ1`, damping of the FM term (default 0).
    pub delta1: f64,
    /// `δ2`, damping of the SL term (default 0).
    pub delta2: f64,
}

impl HviParams {
    /// `P_EFM`, `P_ESL` with `δ1 = δ2 = 0` (the initial HVI).
    pub fn new(p_efm: f64, p_esl: f64) -> HviParams {
        HviParams { p_efm, p_esl, delta1: 0.0, delta2: 0.0 }
    }

    /// The same probabilities with damping factors `δ1`, `δ2`.
    pub fn with_deltas(self, delta1: f64, delta2: f64) -> HviParams {
        HviParams { delta1, delta2, ..self }
    }
}

/// HVI of one LLM (Eq. 1, spec §4.2), not clipped: with δ = 0 it lies in [0, 100]; δ > 0
/// can push it above 100 and δ < 0 below 0.
///
/// Errors: `Empty` for `U = 0`; `OutOfRange` unless `N ≤ U`, `N_EFM ≤ N`, `N_ESL ≤ N`,
/// `P ∈ [0, 1]` and δ finite; `NotANumber` for a NaN weight.
pub fn hvi(counts: HviCounts, params: HviParams) -> Result<f64, MetricError> {
    let HviCounts { sentences: u, hallucinated: n, efm, esl } = counts;
    let HviParams { p_efm, p_esl, delta1, delta2 } = params;
    reject_nan("HVI weights (P_EFM, P_ESL, δ1, δ2)", &[p_efm, p_esl, delta1, delta2])?;
    if u == 0 {
        return Err(MetricError::Empty { what: "sentences (U)" });
    }
    let over = |what, value: u64, expected| {
        Err(MetricError::OutOfRange { what, value: value as f64, expected })
    };
    if n > u {
        return over("N (hallucinated sentences)", n, "at most U");
    }
    if efm > n {
        return over("N_EFM", efm, "at most N");
    }
    if esl > n {
        return over("N_ESL", esl, "at most N");
    }
    for (what, p) in [("P_EFM", p_efm), ("P_ESL", p_esl)] {
        if !(0.0..=1.0).contains(&p) {
            return Err(MetricError::OutOfRange {
                what,
                value: p,
                expected: "a probability in [0, 1]",
            });
        }
    }
    for (what, d) in [("δ1", delta1), ("δ2", delta2)] {
        if !d.is_finite() {
            return Err(MetricError::OutOfRange { what, value: d, expected: "a finite number" });
        }
    }
    let fm = (n - efm) as f64 * (1.0 - p_efm + delta1);
    let sl = (n - esl) as f64 * (1.0 - p_esl + delta2);
    Ok(100.0 / (2.0 * u as f64) * (fm + sl))
}

/// The initial HVI: Eq. 1 with `δ1 = δ2 = 0` (spec §4.2).
pub fn hvi_initial(counts: HviCounts, p_efm: f64, p_esl: f64) -> Result<f64, MetricError> {
    hvi(counts, HviParams::new(p_efm, p_esl))
}

/// The 0–100 ranking scale the spec recommends: the value clipped to [0, 100]
/// (the paper's final scale is not a min–max rescaling, spec §4.2). NaN stays NaN.
pub fn ranking_scale(hvi: f64) -> f64 {
    hvi.clamp(0.0, 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(u: u64, n: u64, efm: u64, esl: u64) -> HviCounts {
        HviCounts { sentences: u, hallucinated: n, efm, esl }
    }

    /// No hallucinated sentence gives 0, whatever the weights.
    #[test]
    fn no_hallucination_is_zero() {
        assert_eq!(
            hvi(counts(10, 0, 0, 0), HviParams::new(0.2, 0.9).with_deltas(0.3, 0.1)),
            Ok(0.0)
        );
    }

    /// Inconsistent counts, U = 0, P outside [0, 1], NaN and infinite δ are typed errors.
    #[test]
    fn invalid_inputs() {
        let p = HviParams::new(0.1, 0.1);
        assert!(matches!(hvi(counts(0, 0, 0, 0), p), Err(MetricError::Empty { .. })));
        assert!(matches!(hvi(counts(5, 6, 0, 0), p), Err(MetricError::OutOfRange { .. })));
        assert!(matches!(
            hvi(counts(5, 2, 3, 0), p),
            Err(MetricError::OutOfRange { what: "N_EFM", .. })
        ));
        assert!(matches!(
            hvi(counts(5, 2, 0, 3), p),
            Err(MetricError::OutOfRange { what: "N_ESL", .. })
        ));
        assert!(matches!(
            hvi(counts(5, 2, 0, 0), HviParams::new(1.1, 0.0)),
            Err(MetricError::OutOfRange { .. })
        ));
        assert!(matches!(
            hvi(counts(5, 2, 0, 0), HviParams::new(f64::NAN, 0.0)),
            Err(MetricError::NotANumber { .. })
        ));
        assert!(hvi(counts(5, 2, 0, 0), p.with_deltas(f64::INFINITY, 0.0)).is_err());
    }

    /// δ > 0 can exceed 100; the ranking scale clips it back.
    #[test]
    fn deltas_can_exceed_scale() {
        let v = hvi(counts(10, 10, 0, 0), HviParams::new(0.0, 0.0).with_deltas(0.5, 0.5)).unwrap();
        assert_eq!(v, 150.0);
        assert_eq!(ranking_scale(v), 100.0);
        assert_eq!(ranking_scale(-3.0), 0.0);
    }
}

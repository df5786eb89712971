//! Counts → HVI per model, and the leaderboard.
//!
//! Per spec §4.2 the report gives the **initial** HVI (δ1 = δ2 = 0), the **δ-adjusted**
//! HVI with the configured δ1, δ2 (equal to the initial one by default), and the
//! adjusted value on the 0–100 **ranking scale** (clipped; the paper's final scale is not
//! a min–max rescaling). How the paper derived δ from the 15 models' initial values is not
//! known, so δ is an input, never computed.

use serde::{Deserialize, Serialize};

use crate::common::OddCounts;
use crate::metrics::hvi::{hvi, ranking_scale, HviCounts, HviParams};
use crate::metrics::interval::{bootstrap_by, with_bracket, Bootstrap, Interval};

/// Where `P_EFM` / `P_ESL` comes from.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Probability {
    /// A given value in [0, 1], the same for every model.
    Fixed(f64),
    /// Halyard's default: the model's own relative frequency, `N_EFM / U` (resp.
    /// `N_ESL / U`). The paper's estimator is not retrievable (spec §4.2, §6.11).
    RelativeFrequency,
}

impl Probability {
    fn value(self, count: u64, sentences: u64) -> f64 {
        match self {
            Probability::Fixed(p) => p,
            Probability::RelativeFrequency if sentences == 0 => 0.0,
            Probability::RelativeFrequency => count as f64 / sentences as f64,
        }
    }
}

/// The inputs of Eq. 1 besides the counts.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Weights {
    pub p_efm: Probability,
    pub p_esl: Probability,
    pub delta1: f64,
    pub delta2: f64,
}

impl Default for Weights {
    fn default() -> Weights {
        Weights {
            p_efm: Probability::RelativeFrequency,
            p_esl: Probability::RelativeFrequency,
            delta1: 0.0,
            delta2: 0.0,
        }
    }
}

/// The figures of one (benchmark, model).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub pipeline: String,
    pub model: String,
    /// `judge` or `labels`.
    pub source: String,
    pub counts: HviCounts,
    /// Sentences left out because the judge gave no verdict (judge mode).
    pub judge_errors: u64,
    /// Prompts whose passage call failed (judge mode).
    pub failed_passages: u64,
    /// Passages that were empty or refusals (judge mode, issue 29): no sentence judged.
    #[serde(default)]
    pub odd_passages: OddCounts,
    /// Judge outputs that were empty or refusals (asked again; judge errors when still).
    #[serde(default)]
    pub odd_judge_outputs: OddCounts,
    pub p_efm: f64,
    pub p_esl: f64,
    pub delta1: f64,
    pub delta2: f64,
    /// Eq. 1 with δ1 = δ2 = 0.
    pub hvi_initial: Option<f64>,
    /// Eq. 1 with the configured δ.
    pub hvi: Option<f64>,
    /// `hvi` clipped to [0, 100].
    pub hvi_ranking: Option<f64>,
    /// 95% interval of `hvi`: a seeded bootstrap over the model's sentences (with
    /// relative-frequency weights, P_EFM and P_ESL are recomputed on each resample; fixed
    /// ones stay fixed).
    #[serde(default)]
    pub hvi_ci95: Option<Interval>,
    /// Why HVI is missing (e.g. no sentence).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// HVI of one model from its counts.
pub fn score(
    model: &str,
    source: &str,
    counts: HviCounts,
    judge_errors: u64,
    failed_passages: u64,
    w: Weights,
) -> Report {
    let p_efm = w.p_efm.value(counts.efm, counts.sentences);
    let p_esl = w.p_esl.value(counts.esl, counts.sentences);
    let params = HviParams::new(p_efm, p_esl);
    let (hvi_initial, adjusted) =
        (hvi(counts, params), hvi(counts, params.with_deltas(w.delta1, w.delta2)));
    let error = adjusted.as_ref().err().map(|e| e.to_string());
    let hvi_value = adjusted.ok();
    let hvi_ci95 = hvi_value.and_then(|_| hvi_interval(counts, w));
    Report {
        pipeline: super::plan::PIPELINE.into(),
        model: model.into(),
        source: source.into(),
        counts,
        judge_errors,
        failed_passages,
        odd_passages: OddCounts::default(),
        odd_judge_outputs: OddCounts::default(),
        p_efm,
        p_esl,
        delta1: w.delta1,
        delta2: w.delta2,
        hvi_initial: hvi_initial.ok(),
        hvi: hvi_value,
        hvi_ranking: hvi_value.map(ranking_scale),
        hvi_ci95,
        error,
    }
}

/// The bootstrap interval of HVI over the sentences. A sentence is one of: not
/// hallucinated, hallucinated EFM, hallucinated ESL, hallucinated otherwise (a sentence
/// has one category, so the counts fix how many of each). `None` when the counts are
/// inconsistent or HVI is undefined on every resample.
fn hvi_interval(counts: HviCounts, w: Weights) -> Option<Interval> {
    let HviCounts { sentences: u, hallucinated: n, efm, esl } = counts;
    if n > u || efm + esl > n {
        return None;
    }
    let kinds: Vec<u8> = [(0u8, u - n), (1, efm), (2, esl), (3, n - efm - esl)]
        .iter()
        .flat_map(|&(k, c)| std::iter::repeat_n(k, c as usize))
        .collect();
    let stat = |idx: &[usize]| {
        let mut c = HviCounts { sentences: idx.len() as u64, hallucinated: 0, efm: 0, esl: 0 };
        for &i in idx {
            let k = kinds[i];
            c.hallucinated += u64::from(k != 0);
            c.efm += u64::from(k == 1);
            c.esl += u64::from(k == 2);
        }
        let p_efm = w.p_efm.value(c.efm, c.sentences);
        let p_esl = w.p_esl.value(c.esl, c.sentences);
        hvi(c, HviParams::new(p_efm, p_esl).with_deltas(w.delta1, w.delta2)).ok()
    };
    bootstrap_by(kinds.len(), Bootstrap::default(), stat).ok()
}

fn num(v: Option<f64>) -> String {
    v.map_or("–".into(), |x| format!("{x:.2}"))
}

/// One benchmark's section: the leaderboard, most vulnerable (highest HVI) first.
pub fn render_markdown(reports: &[Report]) -> String {
    let mut rows: Vec<&Report> = reports.iter().collect();
    rows.sort_by(|a, b| {
        b.hvi.unwrap_or(f64::NEG_INFINITY).total_cmp(&a.hvi.unwrap_or(f64::NEG_INFINITY))
    });
    let mut md = String::from(
        "HVI = 100/(2U) · [(N − N_EFM)(1 − P_EFM + δ1) + (N − N_ESL)(1 − P_ESL + δ2)] (Rawte et al. 2023, Eq. 1, count form). \
         Higher = more vulnerable. `initial`: δ1 = δ2 = 0; `HVI`: with the configured δ, in brackets its 95% interval \
         (a seeded bootstrap over the model's sentences; sentences of one passage are not independent, so it is too narrow); \
         `0–100`: HVI clipped for ranking.\n\n",
    );
    md.push_str("### Leaderboard\n\n| rank | model | HVI | initial | 0–100 | U | N | N_EFM | N_ESL | P_EFM | P_ESL | δ1 | δ2 | judge errors | passages left out |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (i, r) in rows.iter().enumerate() {
        let c = r.counts;
        md.push_str(&format!(
            "| {} | `{}` | {} | {} | {} | {} | {} | {} | {} | {:.4} | {:.4} | {} | {} | {} | {} |\n",
            i + 1,
            r.model,
            with_bracket(r.hvi, r.hvi_ci95.as_ref(), 1.0, 2),
            num(r.hvi_initial),
            num(r.hvi_ranking),
            c.sentences,
            c.hallucinated,
            c.efm,
            c.esl,
            r.p_efm,
            r.p_esl,
            r.delta1,
            r.delta2,
            r.judge_errors,
            r.failed_passages + r.odd_passages.total()
        ));
    }
    md.push('\n');
    for r in reports {
        if let Some(e) = &r.error {
            md.push_str(&format!("`{}`: HVI not computed: {e}.\n", r.model));
        }
        if r.failed_passages > 0 || r.odd_passages.total() > 0 {
            md.push_str(&format!(
                "`{}`: passages left out (no sentence judged): {} failed call(s), {}.\n",
                r.model,
                r.failed_passages,
                r.odd_passages.describe()
            ));
        }
        if r.odd_judge_outputs.total() > 0 {
            md.push_str(&format!(
                "`{}`: judge outputs empty or refused (no verdict, asked again): {}.\n",
                r.model,
                r.odd_judge_outputs.describe()
            ));
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With fixed weights HVI is the mean of a per-sentence value, 50·((1−P_EFM+δ1)·[h, not
    /// EFM] plus (1−P_ESL+δ2)·[h, not ESL]), so its interval must equal the bootstrap of
    /// that mean (the Python-checked `bootstrap_mean`) on the same seed.
    #[test]
    fn hvi_interval_is_the_bootstrap_of_per_sentence_values() {
        use crate::metrics::interval::bootstrap_mean;
        let c = HviCounts { sentences: 60, hallucinated: 25, efm: 7, esl: 4 };
        let (pe, ps, d1, d2) = (0.3, 0.2, 0.1, 0.05);
        let w = Weights {
            p_efm: Probability::Fixed(pe),
            p_esl: Probability::Fixed(ps),
            delta1: d1,
            delta2: d2,
        };
        let r = score("m", "labels", c, 0, 0, w);
        let (a, b) = (1.0 - pe + d1, 1.0 - ps + d2);
        // In the order the interval's kinds are laid out: not hallucinated, EFM, ESL, other.
        let mut x = vec![0.0; 35];
        x.extend(std::iter::repeat_n(50.0 * b, 7)); // EFM: only the SL term
        x.extend(std::iter::repeat_n(50.0 * a, 4)); // ESL: only the FM term
        x.extend(std::iter::repeat_n(50.0 * (a + b), 14));
        let want = bootstrap_mean(&x, Bootstrap::default()).unwrap();
        let got = r.hvi_ci95.unwrap();
        let ((gl, gh), (wl, wh)) = (got.bounds().unwrap(), want.bounds().unwrap());
        for (g, w) in [(got.estimate, want.estimate), (gl, wl), (gh, wh)] {
            assert!((g - w).abs() < 1e-9, "{got:?} vs {want:?}");
        }
        assert_eq!((got.n, got.resamples), (60, want.resamples));
        let md = render_markdown(std::slice::from_ref(&r));
        assert!(md.contains(&format!("| {:.2} [{gl:.2}, {gh:.2}] |", got.estimate)), "{md}");
        // Inconsistent counts (labelled mode reads them from a file): no interval.
        let bad = HviCounts { sentences: 10, hallucinated: 5, efm: 4, esl: 3 };
        assert!(score("m", "labels", bad, 0, 0, w).hvi_ci95.is_none());
    }

    /// The spec's worked example (§5.5) through fixed weights, and the relative-frequency default.
    #[test]
    fn worked_example_and_default() {
        let c = HviCounts { sentences: 100, hallucinated: 40, efm: 10, esl: 5 };
        let w = Weights {
            p_efm: Probability::Fixed(0.3),
            p_esl: Probability::Fixed(0.2),
            delta1: 0.1,
            delta2: 0.05,
        };
        let r = score("m", "labels", c, 0, 0, w);
        assert!((r.hvi_initial.unwrap() - 24.5).abs() < 1e-9);
        assert!((r.hvi.unwrap() - 26.875).abs() < 1e-9);
        let r = score("m", "labels", c, 0, 0, Weights::default());
        assert_eq!((r.p_efm, r.p_esl), (0.1, 0.05));
        assert!((r.hvi.unwrap() - 0.5 * (30.0 * 0.9 + 35.0 * 0.95)).abs() < 1e-9);
        let ci = r.hvi_ci95.unwrap();
        let (low, high) = ci.bounds().unwrap();
        assert!(low < r.hvi.unwrap() && r.hvi.unwrap() < high, "{ci:?}");
        assert_eq!((ci.n, ci.estimate), (100, r.hvi.unwrap()));
        let r = score(
            "m",
            "judge",
            HviCounts { sentences: 0, hallucinated: 0, efm: 0, esl: 0 },
            2,
            1,
            Weights::default(),
        );
        assert!(r.hvi.is_none() && r.error.is_some());
        let md = render_markdown(&[r]);
        assert!(
            md.contains("HVI not computed")
                && md.contains("passages left out (no sentence judged): 1 failed call(s)"),
            "{md}"
        );
    }
}

//! 95% intervals for every reported figure (issue 16).
//!
//! Evaluation harnesses (lm-evaluation-harness, Inspect, HELM) report a standard error
//! beside each score; a bare number makes two models 1 point apart look different when
//! the question set cannot tell them apart. Every figure Halyard reports carries an
//! [`Interval`]: the estimate, the 95% bounds, the method and the number of items.
//!
//! - [`wilson`]: a proportion (k of n): the Wilson score interval, good at small n and
//!   near 0 or 1 where the normal ("Wald") interval fails.
//! - [`bootstrap_mean`], [`bootstrap_by`], [`f1_bootstrap`]: a figure that is not a
//!   proportion (a mean of per-item scores such as BLEU-4 or ROUGE-L, a macro accuracy,
//!   F1): the percentile bootstrap over items, with a fixed seed and resample count so that
//!   a report is reproducible bit for bit.
//! - [`auroc_delong`], [`mean_auroc_delong`]: AUROC, by DeLong's variance (the
//!   structural components computed from mid-ranks), and the mean of independent
//!   per-dataset AUROCs from the sum of their variances (not estimable when a part's
//!   variance is 0: see below).
//! - [`auroc_newcombe`], [`mean_auroc_newcombe`]: AUROC by Newcombe's (2006) score
//!   interval, and the mean of independent AUROCs (RealHall's aggregate, issue 45) by
//!   square-and-add of those intervals. DeLong's variance is 0 at AUROC 0 or 1 and with
//!   all scores tied, so a small dataset that happens to separate perfectly adds nothing to
//!   a summed variance and the mean's interval narrows silently (coverage 0.86 instead of
//!   0.95 in `tests::aggregate_interval_coverage_with_a_small_dataset`); Newcombe's interval
//!   does not collapse there (its lower bound at AUROC 1 with 4 + 4 items is 0.58).
//!
//! **Not estimable** (issue 29): an interval that collapses to a point (a bootstrap whose
//! resamples all give one value, one item, a DeLong variance of 0 at perfect separation or
//! with tied scores, a class of fewer than 2 items) would print as `[x, x]` and look
//! precise. Such an interval has no bounds (`low`/`high` are `null` in JSON) and carries
//! [`NotEstimable`], the reason, which every renderer prints instead of the bracket. The
//! Wilson interval of a proportion never collapses (it is not zero-width at 0 or n).
//!
//! The units are independent items in every method; where a report's unit is not (the
//! evaluation rows of one HypoTermQA answer), the interval is narrower than it should be
//! and the report says so.
//!
//! Paired comparisons of two models on the same items are in [`super::paired`].
//! `pipelines/tests/data/ci_reference.py` recomputes every method independently (scipy for
//! Wilson and the exact binomial, a direct O(mn) DeLong, the same generator for the
//! bootstrap) and `pipelines/tests/ci_reference.rs` checks these functions against it.

use serde::{Deserialize, Serialize};

use super::classification::Confusion;
use super::MetricError;

/// The confidence level of every interval.
pub const LEVEL: f64 = 0.95;
/// Φ⁻¹(0.975), the two-sided 95% normal quantile.
pub const Z95: f64 = 1.959_963_984_540_054;
/// Bootstrap resamples unless a caller asks otherwise.
pub const DEFAULT_RESAMPLES: u32 = 2000;
/// The bootstrap seed unless a caller asks otherwise ("HALY" in ASCII).
pub const DEFAULT_SEED: u64 = 0x4841_4c59;

/// How an interval was computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CiMethod {
    /// Wilson score interval of a proportion.
    Wilson,
    /// Percentile bootstrap over items (type-7 quantiles of the resampled figures).
    Bootstrap,
    /// AUROC ± z·√(DeLong variance), clipped to [0, 1].
    Delong,
    /// Mean of independent AUROCs ± z·√(Σ var_d / D²), clipped to [0, 1].
    DelongMean,
    /// One AUROC's score interval by Newcombe (2006), his method 5.
    Newcombe,
    /// Mean of independent AUROCs, their Newcombe (2006) intervals combined by
    /// square-and-add (MOVER, Zou & Donner 2008).
    NewcombeMean,
    /// Paired bootstrap over the items two models share (difference of their figures).
    PairedBootstrap,
    /// Newcombe's hybrid score interval (method 10) for a paired difference of proportions.
    NewcombePaired,
    /// Difference of two correlated AUROCs ± z·√var, DeLong's paired covariance.
    DelongPaired,
    /// Percentile bootstrap over clusters of units (a question's answers, a passage's
    /// sentences): each resample draws whole clusters with replacement.
    ClusterBootstrap,
}

impl CiMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            CiMethod::Wilson => "wilson",
            CiMethod::Bootstrap => "bootstrap",
            CiMethod::Delong => "delong",
            CiMethod::DelongMean => "delong_mean",
            CiMethod::Newcombe => "newcombe",
            CiMethod::NewcombeMean => "newcombe_mean",
            CiMethod::PairedBootstrap => "paired_bootstrap",
            CiMethod::NewcombePaired => "newcombe_paired",
            CiMethod::DelongPaired => "delong_paired",
            CiMethod::ClusterBootstrap => "cluster_bootstrap",
        }
    }
}

/// Why an interval cannot be estimated (issue 29). Serialised as its sentence
/// ([`NotEstimable::as_string`]); a sentence this version does not know reads back as
/// [`NotEstimable::Other`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(into = "String", from = "String")]
pub enum NotEstimable {
    /// One item: every resample is that item.
    FewerThanTwoItems,
    /// One cluster: every cluster-bootstrap resample is that cluster.
    FewerThanTwoClusters,
    /// DeLong's variance needs at least 2 items of each class.
    FewerThanTwoPerClass,
    /// Every item has the same value (score): every resample gives it, DeLong's
    /// variance is 0.
    NoVariation,
    /// AUROC 0 or 1: DeLong's variance is 0 (a bootstrap would give the same value on
    /// every resample).
    PerfectSeparation,
    /// DeLong's variance is 0 for another reason (or every part's, for a mean).
    ZeroVariance,
    /// Every bootstrap resample gives this value.
    EveryResampleGives(f64),
    /// The 2.5% and 97.5% quantiles of the resamples coincide (most resamples give one
    /// value).
    QuantilesCoincide,
    /// A part of a combined figure has no variance (named by the figure's note).
    PartWithoutVariance,
    /// A reason written by another version.
    Other,
}

impl NotEstimable {
    /// The reason as reports print it after "not estimable: ".
    pub fn as_string(self) -> String {
        match self {
            NotEstimable::FewerThanTwoItems => "fewer than 2 items".into(),
            NotEstimable::FewerThanTwoClusters => "fewer than 2 clusters".into(),
            NotEstimable::FewerThanTwoPerClass => {
                "fewer than 2 items of a class (DeLong needs 2 hallucinated and 2 faithful)".into()
            }
            NotEstimable::NoVariation => "no variation in scores".into(),
            NotEstimable::PerfectSeparation => {
                "perfect separation (AUROC 0 or 1): DeLong's variance is 0".into()
            }
            NotEstimable::ZeroVariance => "DeLong's variance is 0".into(),
            NotEstimable::EveryResampleGives(v) => format!("every resample gives {v}"),
            NotEstimable::QuantilesCoincide => {
                "the 2.5% and 97.5% resample quantiles coincide".into()
            }
            NotEstimable::PartWithoutVariance => "a part has no DeLong variance".into(),
            NotEstimable::Other => "reason not recorded".into(),
        }
    }
}

impl From<NotEstimable> for String {
    fn from(n: NotEstimable) -> String {
        n.as_string()
    }
}

impl From<String> for NotEstimable {
    fn from(s: String) -> NotEstimable {
        use NotEstimable::*;
        let known = [
            FewerThanTwoItems,
            FewerThanTwoClusters,
            FewerThanTwoPerClass,
            NoVariation,
            PerfectSeparation,
            ZeroVariance,
            QuantilesCoincide,
            PartWithoutVariance,
        ];
        if let Some(k) = known.into_iter().find(|k| k.as_string() == s) {
            return k;
        }
        match s.strip_prefix("every resample gives ").map(str::parse::<f64>) {
            Some(Ok(v)) => EveryResampleGives(v),
            _ => Other,
        }
    }
}

impl std::fmt::Display for NotEstimable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.as_string())
    }
}

/// A figure with its 95% interval, in the figure's own unit (a share in percent has its
/// interval in percent). `low` and `high` are `None` exactly when the interval is not
/// estimable, and then `not_estimable` says why.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    pub estimate: f64,
    pub low: Option<f64>,
    pub high: Option<f64>,
    /// 0.95.
    pub level: f64,
    pub method: CiMethod,
    /// Items the figure is computed from.
    pub n: u64,
    /// Bootstrap: resamples the bounds come from (those where the figure is undefined,
    /// e.g. F1 of a resample without positives, are dropped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resamples: Option<u32>,
    /// Bootstrap: the generator's seed (with `resamples`, the interval is reproducible).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Why there are no bounds (issue 29); `None` for an estimable interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_estimable: Option<NotEstimable>,
    /// Cluster bootstrap: the clusters resampled (`n` counts their units); `None` for
    /// every other method (and in reports written before issue 45).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clusters: Option<u64>,
}

impl Interval {
    /// The same interval in another unit (`100.0`: a fraction as a percentage).
    pub fn scaled(self, factor: f64) -> Interval {
        Interval {
            estimate: self.estimate * factor,
            low: self.low.map(|l| l * factor),
            high: self.high.map(|h| h * factor),
            ..self
        }
    }

    /// `(low, high)`, or `None` when the interval is not estimable.
    pub fn bounds(&self) -> Option<(f64, f64)> {
        match (self.low, self.high, self.not_estimable) {
            (Some(l), Some(h), None) => Some((l, h)),
            _ => None,
        }
    }

    /// " [low, high]" of the interval times `factor` (100: a fraction as a percentage), with
    /// `decimals` digits: the bracket Markdown reports put after a figure; " [not
    /// estimable: why]" when the interval is not estimable.
    pub fn bracket(&self, factor: f64, decimals: usize) -> String {
        match self.bounds() {
            Some((l, h)) => format!(" [{:.d$}, {:.d$}]", l * factor, h * factor, d = decimals),
            None => format!(" [not estimable: {}]", self.why()),
        }
    }

    /// "low{sep}high" with `decimals` digits, or "not estimable: why".
    pub fn range(&self, decimals: usize, sep: &str) -> String {
        match self.bounds() {
            Some((l, h)) => format!("{l:.d$}{sep}{h:.d$}", d = decimals),
            None => format!("not estimable: {}", self.why()),
        }
    }

    /// The reason an interval is not estimable ("" for an estimable one).
    pub fn why(&self) -> String {
        match (self.bounds(), self.not_estimable) {
            (Some(_), _) => String::new(),
            (None, Some(n)) => n.as_string(),
            (None, None) => NotEstimable::Other.as_string(),
        }
    }

    /// Whether `value` lies inside the bounds (inclusive); `false` when not estimable.
    pub fn contains(&self, value: f64) -> bool {
        self.bounds().is_some_and(|(l, h)| l <= value && value <= h)
    }

    fn closed(estimate: f64, low: f64, high: f64, method: CiMethod, n: u64) -> Interval {
        Interval {
            estimate,
            low: Some(low),
            high: Some(high),
            level: LEVEL,
            method,
            n,
            resamples: None,
            seed: None,
            not_estimable: None,
            clusters: None,
        }
    }

    /// An interval that cannot be estimated, and why.
    pub fn not_estimable(estimate: f64, method: CiMethod, n: u64, why: NotEstimable) -> Interval {
        Interval {
            estimate,
            low: None,
            high: None,
            level: LEVEL,
            method,
            n,
            resamples: None,
            seed: None,
            not_estimable: Some(why),
            clusters: None,
        }
    }
}

/// A figure with its interval's [`Interval::bracket`] ("–" when there is no figure; no
/// bracket when there is no interval).
pub fn with_bracket(
    value: Option<f64>,
    ci: Option<&Interval>,
    factor: f64,
    decimals: usize,
) -> String {
    match value {
        None => "–".into(),
        Some(v) => format!(
            "{:.d$}{}",
            v * factor,
            ci.map_or(String::new(), |c| c.bracket(factor, decimals)),
            d = decimals
        ),
    }
}

/// The Wilson score interval of `successes` out of `n`:
/// `(p̂ + z²/2n ± z·√(p̂(1−p̂)/n + z²/4n²)) / (1 + z²/n)`, bounds clipped to [0, 1].
/// Errors: `Empty` for `n = 0`; `OutOfRange` for `successes > n`.
pub fn wilson(successes: u64, n: u64) -> Result<Interval, MetricError> {
    if n == 0 {
        return Err(MetricError::Empty { what: "proportion's denominator" });
    }
    if successes > n {
        return Err(MetricError::OutOfRange {
            what: "successes",
            value: successes as f64,
            expected: "at most the denominator",
        });
    }
    let (k, nf) = (successes as f64, n as f64);
    let p = k / nf;
    let z2 = Z95 * Z95;
    let denom = 1.0 + z2 / nf;
    let center = (p + z2 / (2.0 * nf)) / denom;
    let half = Z95 * (p * (1.0 - p) / nf + z2 / (4.0 * nf * nf)).sqrt() / denom;
    let low = if successes == 0 { 0.0 } else { (center - half).max(0.0) };
    let high = if successes == n { 1.0 } else { (center + half).min(1.0) };
    Ok(Interval::closed(p, low, high, CiMethod::Wilson, n))
}

/// Resample count and seed of a bootstrap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bootstrap {
    pub resamples: u32,
    pub seed: u64,
}

impl Default for Bootstrap {
    fn default() -> Self {
        Bootstrap { resamples: DEFAULT_RESAMPLES, seed: DEFAULT_SEED }
    }
}

/// SplitMix64 (Steele, Lea & Flood 2014): tiny, fast, and trivially re-implemented in the
/// Python reference, which is what makes the bootstrap checkable bit for bit. The one
/// seeded generator of the figures (bootstraps, MACE's starts, permutation tests).
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// An index in `0..n` (multiply-shift; the bias is below 2⁻⁴⁰ for any realistic n).
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }

    /// A uniform draw in [0, 1) (the top 53 bits).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// The `q`-quantile of sorted values, linear interpolation between order statistics
/// (numpy's default, Hyndman–Fan type 7). `sorted` is not empty.
pub(crate) fn quantile(sorted: &[f64], q: f64) -> f64 {
    let h = (sorted.len() - 1) as f64 * q;
    let lo = h.floor() as usize;
    match sorted.get(lo + 1) {
        Some(next) => sorted[lo] + (h - lo as f64) * (next - sorted[lo]),
        None => sorted[lo],
    }
}

/// The figures of `resamples` index resamples of `0..n` (drawn in order: resample r takes
/// n consecutive draws), where `stat` is defined and not NaN.
pub(crate) fn resampled(
    n: usize,
    cfg: Bootstrap,
    stat: impl Fn(&[usize]) -> Option<f64>,
) -> Vec<f64> {
    let mut rng = SplitMix64::new(cfg.seed);
    let mut idx = vec![0usize; n];
    let mut out = Vec::with_capacity(cfg.resamples as usize);
    for _ in 0..cfg.resamples {
        for i in idx.iter_mut() {
            *i = rng.below(n);
        }
        if let Some(v) = stat(&idx).filter(|v| !v.is_nan()) {
            out.push(v);
        }
    }
    out
}

/// Percentile bootstrap of the figure `stat` computes from a list of item indices (each
/// resample draws n indices with replacement). The estimate is `stat(0..n)`.
/// Errors: `Empty` for `n = 0`; `Undefined` when the figure is undefined on the items
/// themselves or on every resample.
pub fn bootstrap_by(
    n: usize,
    cfg: Bootstrap,
    stat: impl Fn(&[usize]) -> Option<f64>,
) -> Result<Interval, MetricError> {
    percentile_bootstrap(n, cfg, CiMethod::Bootstrap, stat).map(|(interval, _)| interval)
}

/// The percentile interval of `stat` labelled `method`, and the sorted resampled figures
/// (for a p-value).
pub(crate) fn percentile_bootstrap(
    n: usize,
    cfg: Bootstrap,
    method: CiMethod,
    stat: impl Fn(&[usize]) -> Option<f64>,
) -> Result<(Interval, Vec<f64>), MetricError> {
    if n == 0 {
        return Err(MetricError::Empty { what: "bootstrap items" });
    }
    let all: Vec<usize> = (0..n).collect();
    let estimate = stat(&all).filter(|v| !v.is_nan()).ok_or(MetricError::Undefined {
        what: "bootstrapped figure",
        reason: "undefined on the items themselves",
    })?;
    let reps = resampled(n, cfg, stat);
    let few = (n == 1).then_some(NotEstimable::FewerThanTwoItems);
    let (interval, reps) = percentile_interval(estimate, reps, few, cfg)?;
    Ok((Interval { method, n: n as u64, ..interval }, reps))
}

/// The percentile interval of the resampled figures `reps` around `estimate`, and `reps`
/// sorted; not estimable with `few` (too few items or clusters to resample) or when the
/// quantiles coincide (a collapsed interval is not an estimate of precision, issue 29).
/// The caller sets `method`, `n` and `clusters`.
fn percentile_interval(
    estimate: f64,
    mut reps: Vec<f64>,
    few: Option<NotEstimable>,
    cfg: Bootstrap,
) -> Result<(Interval, Vec<f64>), MetricError> {
    if reps.is_empty() {
        return Err(MetricError::Undefined {
            what: "bootstrap interval",
            reason: "the figure is undefined on every resample",
        });
    }
    reps.sort_by(f64::total_cmp);
    let alpha = 1.0 - LEVEL;
    let (low, high) = (quantile(&reps, alpha / 2.0), quantile(&reps, 1.0 - alpha / 2.0));
    let why = if low < high {
        None
    } else if few.is_some() {
        few
    } else if reps[0] == reps[reps.len() - 1] {
        Some(NotEstimable::EveryResampleGives(reps[0]))
    } else {
        Some(NotEstimable::QuantilesCoincide)
    };
    let interval = Interval {
        estimate,
        low: why.is_none().then_some(low),
        high: why.is_none().then_some(high),
        level: LEVEL,
        method: CiMethod::Bootstrap,
        n: 0,
        resamples: Some(reps.len() as u32),
        seed: Some(cfg.seed),
        not_estimable: why,
        clusters: None,
    };
    Ok((interval, reps))
}

/// Percentile bootstrap over clusters (issue 45): `clusters` lists the unit indices of
/// each cluster (the answers of one question, the sentences of one passage). Each resample
/// draws `clusters.len()` clusters with replacement and passes the concatenation of their
/// unit indices to `stat` (so its length varies from resample to resample); the estimate
/// is `stat` over every unit, in cluster order. Units of one cluster are usually alike (one
/// question is hard for every model), so resampling units as if independent gives an
/// interval too narrow; resampling clusters keeps their dependence. The interval's `n` is
/// the number of units and `clusters` the number of clusters. With one unit per cluster
/// (`[[0], [1], …]`) the draws, and so the interval, are exactly [`bootstrap_by`]'s
/// (method aside). Not estimable with one cluster, or when the resample quantiles coincide.
/// Errors: `Empty` for no clusters or an empty cluster; `Malformed` for a unit listed
/// twice; `Undefined` when the figure is undefined on all units or on every resample.
pub fn bootstrap_clustered(
    clusters: &[Vec<usize>],
    cfg: Bootstrap,
    stat: impl Fn(&[usize]) -> Option<f64>,
) -> Result<Interval, MetricError> {
    if clusters.is_empty() {
        return Err(MetricError::Empty { what: "bootstrap clusters" });
    }
    if clusters.iter().any(Vec::is_empty) {
        return Err(MetricError::Empty { what: "a bootstrap cluster's units" });
    }
    let all: Vec<usize> = clusters.iter().flatten().copied().collect();
    let mut sorted = all.clone();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(MetricError::Malformed {
            what: "bootstrap clusters",
            input: format!("unit {}", w[0]),
            reason: "a unit is listed twice (in one cluster or in two)",
        });
    }
    let estimate = stat(&all).filter(|v| !v.is_nan()).ok_or(MetricError::Undefined {
        what: "bootstrapped figure",
        reason: "undefined on the units themselves",
    })?;
    let c = clusters.len();
    let mut rng = SplitMix64::new(cfg.seed);
    let mut idx = Vec::with_capacity(all.len() * 2);
    let mut reps = Vec::with_capacity(cfg.resamples as usize);
    for _ in 0..cfg.resamples {
        idx.clear();
        for _ in 0..c {
            idx.extend_from_slice(&clusters[rng.below(c)]);
        }
        if let Some(v) = stat(&idx).filter(|v| !v.is_nan()) {
            reps.push(v);
        }
    }
    let few = (c == 1).then_some(NotEstimable::FewerThanTwoClusters);
    let (interval, _) = percentile_interval(estimate, reps, few, cfg)?;
    Ok(Interval {
        method: CiMethod::ClusterBootstrap,
        n: all.len() as u64,
        clusters: Some(c as u64),
        ..interval
    })
}

/// Mean of the values at `idx`, summed left to right.
pub(crate) fn mean_at(values: &[f64], idx: &[usize]) -> f64 {
    let mut s = 0.0;
    for &i in idx {
        s += values[i];
    }
    s / idx.len() as f64
}

/// Percentile bootstrap of the mean of per-item values (BLEU-4, ROUGE-L, kwPrec,
/// BERTScore, a macro accuracy). Errors: `Empty`; `NotANumber`.
/// Not estimable (no variation) when every value is the same.
pub fn bootstrap_mean(values: &[f64], cfg: Bootstrap) -> Result<Interval, MetricError> {
    super::reject_nan("bootstrapped values", values)?;
    let mut ci = bootstrap_by(values.len(), cfg, |idx| Some(mean_at(values, idx)))?;
    if values.len() > 1 && values.iter().all(|v| *v == values[0]) {
        (ci.low, ci.high, ci.not_estimable) = (None, None, Some(NotEstimable::NoVariation));
    }
    Ok(ci)
}

/// Percentile bootstrap of F1 (hallucination positive) over the classified items of a
/// confusion table (items in the order TP, FP, TN, FN; resamples without a positive
/// and without a positive prediction are dropped, F1 being 0/0 there).
/// Errors: `Empty` for no items; `Undefined` when F1 itself is undefined.
pub fn f1_bootstrap(c: &Confusion, cfg: Bootstrap) -> Result<Interval, MetricError> {
    let kinds: Vec<u8> = [(0u8, c.true_pos), (1, c.false_pos), (2, c.true_neg), (3, c.false_neg)]
        .iter()
        .flat_map(|&(k, n)| std::iter::repeat_n(k, n as usize))
        .collect();
    bootstrap_by(kinds.len(), cfg, |idx| {
        let mut n = [0u64; 4];
        for &i in idx {
            n[kinds[i] as usize] += 1;
        }
        Confusion { true_pos: n[0], false_pos: n[1], true_neg: n[2], false_neg: n[3] }.f1()
    })
}

/// AUROC and DeLong's variance of it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct DelongAuroc {
    pub auroc: f64,
    pub variance: f64,
    pub positives: u64,
    pub negatives: u64,
}

/// Mid-ranks (1-based, ties averaged) of `values`.
pub(crate) fn midranks(values: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[a].partial_cmp(&values[b]).unwrap_or(std::cmp::Ordering::Equal));
    let mut ranks = vec![0.0; values.len()];
    let mut start = 0;
    while start < order.len() {
        let mut end = start + 1;
        while end < order.len() && values[order[end]] == values[order[start]] {
            end += 1;
        }
        let r = (start + 1 + end) as f64 / 2.0;
        for &i in &order[start..end] {
            ranks[i] = r;
        }
        start = end;
    }
    ranks
}

/// Sample variance (denominator n − 1) of at least two values.
pub(crate) fn sample_variance(v: &[f64]) -> f64 {
    let m = v.iter().sum::<f64>() / v.len() as f64;
    v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() - 1) as f64
}

/// AUROC (ties ½, hallucinated positive) and its variance by DeLong, DeLong &
/// Clarke-Pearson (1988), through the mid-rank form of the structural components (Sun &
/// Xu 2014): `V10_i = (R_i − R⁺_i)/n₀` for positive i and `V01_j = 1 − (R_j − R⁻_j)/n₁` for
/// negative j, where R is the mid-rank among all scores and R⁺/R⁻ within its class;
/// `var = s²(V10)/n₁ + s²(V01)/n₀`. Errors as [`super::auroc::auroc`], plus `Undefined`
/// with fewer than 2 items in a class (a sample variance needs 2).
pub fn delong(labels: &[bool], scores: &[f64]) -> Result<DelongAuroc, MetricError> {
    let auroc = super::auroc::auroc(labels, scores)?;
    let pos: Vec<f64> = labels.iter().zip(scores).filter(|p| *p.0).map(|p| *p.1).collect();
    let neg: Vec<f64> = labels.iter().zip(scores).filter(|p| !*p.0).map(|p| *p.1).collect();
    let (n1, n0) = (pos.len(), neg.len());
    if n1 < 2 || n0 < 2 {
        return Err(MetricError::Undefined {
            what: "DeLong variance",
            reason: "it needs at least 2 hallucinated and 2 faithful items",
        });
    }
    let all: Vec<f64> = pos.iter().chain(&neg).copied().collect();
    let r_all = midranks(&all);
    let (r_pos, r_neg) = (midranks(&pos), midranks(&neg));
    let v10: Vec<f64> = (0..n1).map(|i| (r_all[i] - r_pos[i]) / n0 as f64).collect();
    let v01: Vec<f64> = (0..n0).map(|j| 1.0 - (r_all[n1 + j] - r_neg[j]) / n1 as f64).collect();
    let variance = sample_variance(&v10) / n1 as f64 + sample_variance(&v01) / n0 as f64;
    Ok(DelongAuroc { auroc, variance, positives: n1 as u64, negatives: n0 as u64 })
}

fn normal_interval(estimate: f64, variance: f64, method: CiMethod, n: u64) -> Interval {
    let half = Z95 * variance.max(0.0).sqrt();
    Interval::closed(estimate, (estimate - half).max(0.0), (estimate + half).min(1.0), method, n)
}

/// AUROC with DeLong's 95% interval, `AUROC ± z·√var` clipped to [0, 1]. Not estimable
/// (issue 29) with fewer than 2 items of a class, and where the variance is 0: all scores
/// tied (no variation), AUROC 0 or 1 (perfect separation). Errors as
/// [`super::auroc::auroc`] (the AUROC itself is undefined).
pub fn auroc_delong(labels: &[bool], scores: &[f64]) -> Result<Interval, MetricError> {
    let auroc = super::auroc::auroc(labels, scores)?;
    let n = labels.len() as u64;
    let not = |why| Ok(Interval::not_estimable(auroc, CiMethod::Delong, n, why));
    let d = match delong(labels, scores) {
        Ok(d) => d,
        Err(MetricError::Undefined { .. }) => return not(NotEstimable::FewerThanTwoPerClass),
        Err(e) => return Err(e),
    };
    if d.variance <= 0.0 {
        return not(if scores.iter().all(|s| *s == scores[0]) {
            NotEstimable::NoVariation
        } else if d.auroc == 0.0 || d.auroc == 1.0 {
            NotEstimable::PerfectSeparation
        } else {
            NotEstimable::ZeroVariance
        });
    }
    Ok(normal_interval(d.auroc, d.variance, CiMethod::Delong, d.positives + d.negatives))
}

/// The unweighted mean of independent AUROCs with the interval `mean ± z·√(Σ var_d)/D`,
/// clipped to [0, 1]; n = all items. Not estimable (`PartWithoutVariance`) when a part's
/// variance is 0 (issue 45: it would narrow the interval silently; RealHall's aggregate
/// uses [`mean_auroc_newcombe`]). Errors: `Empty`; `NotANumber` for a NaN AUROC or
/// variance.
pub fn mean_auroc_delong(parts: &[DelongAuroc]) -> Result<Interval, MetricError> {
    if parts.is_empty() {
        return Err(MetricError::Empty { what: "per-dataset AUROCs" });
    }
    let values: Vec<f64> = parts.iter().flat_map(|p| [p.auroc, p.variance]).collect();
    super::reject_nan("per-dataset AUROC and variance", &values)?;
    let d = parts.len() as f64;
    let mean = parts.iter().map(|p| p.auroc).sum::<f64>() / d;
    let var = parts.iter().map(|p| p.variance).sum::<f64>() / (d * d);
    let n = parts.iter().map(|p| p.positives + p.negatives).sum();
    if var <= 0.0 {
        return Ok(Interval::not_estimable(
            mean,
            CiMethod::DelongMean,
            n,
            NotEstimable::ZeroVariance,
        ));
    }
    if parts.iter().any(|p| p.variance <= 0.0) {
        return Ok(Interval::not_estimable(
            mean,
            CiMethod::DelongMean,
            n,
            NotEstimable::PartWithoutVariance,
        ));
    }
    Ok(normal_interval(mean, var, CiMethod::DelongMean, n))
}

/// Hanley & McNeil's (1982) variance of an AUROC θ from m positives and n negatives, with
/// their m − 1 and n − 1 replaced by `m_star` and `n_star`:
/// `θ(1 − θ)(1 + n*(1 − θ)/(2 − θ) + m*·θ/(1 + θ))/(mn)`.
fn hanley_mcneil_variance(theta: f64, m_star: f64, n_star: f64, m: f64, n: f64) -> f64 {
    theta
        * (1.0 - theta)
        * (1.0 + n_star * (1.0 - theta) / (2.0 - theta) + m_star * theta / (1.0 + theta))
        / (m * n)
}

/// Newcombe's (2006) score interval for one AUROC, his method 5 ("Confidence intervals for
/// an effect size measure based on the Mann–Whitney statistic. Part 2", Stat Med 25:559):
/// the bounds are the θ where `|θ̂ − θ| = z·√V(θ)`, V Hanley & McNeil's variance evaluated
/// at θ (not at θ̂, as Wilson's interval does for a proportion) with m* = n* = (m + n)/2 − 1.
/// The interval never collapses: at θ̂ = 1 its lower bound is below 1. `positives` and
/// `negatives` are the items of each class (m and n). Errors: `NotANumber`; `OutOfRange`
/// for an AUROC outside [0, 1]; `SingleClass` for a class without items.
pub fn auroc_newcombe(auroc: f64, positives: u64, negatives: u64) -> Result<Interval, MetricError> {
    super::reject_nan("AUROC", &[auroc])?;
    if !(0.0..=1.0).contains(&auroc) {
        return Err(MetricError::OutOfRange { what: "AUROC", value: auroc, expected: "in [0, 1]" });
    }
    if positives == 0 || negatives == 0 {
        return Err(MetricError::SingleClass {
            positives: positives as usize,
            negatives: negatives as usize,
        });
    }
    let (m, n) = (positives as f64, negatives as f64);
    let star = (m + n) / 2.0 - 1.0;
    let sd = |t: f64| hanley_mcneil_variance(t, star, star, m, n).max(0.0).sqrt();
    // f(θ) = θ̂ − θ + s·z·√V(θ) changes sign on [lo, hi]: bisection to the last bit.
    let root = |mut lo: f64, mut hi: f64, s: f64| {
        let f = |t: f64| auroc - t + s * Z95 * sd(t);
        let f_lo = f(lo);
        for _ in 0..200 {
            let mid = 0.5 * (lo + hi);
            if mid <= lo || mid >= hi {
                break;
            }
            if (f(mid) > 0.0) == (f_lo > 0.0) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        0.5 * (lo + hi)
    };
    let low = if auroc <= 0.0 { 0.0 } else { root(0.0, auroc, -1.0) };
    let high = if auroc >= 1.0 { 1.0 } else { root(auroc, 1.0, 1.0) };
    Ok(Interval::closed(auroc, low, high, CiMethod::Newcombe, positives + negatives))
}

/// The unweighted mean of independent AUROCs (RealHall's aggregate over datasets, spec
/// §3.2; issue 45) with each part's Newcombe (2006) interval ([`auroc_newcombe`]) combined
/// by square-and-add, the method of variance estimates recovery (Zou & Donner 2008,
/// "Construction of confidence limits about effect measures: a general approach", Stat Med
/// 27:1693; Newcombe's paired interval does the same for two proportions):
/// `low = mean − √(Σ (θ̂_d − L_d)²)/D`, `high = mean + √(Σ (U_d − θ̂_d)²)/D`, clipped to
/// [0, 1]; n = all items. Each part needs only its AUROC and class sizes
/// (`DelongAuroc::variance` is not used), so a part with one item of a class, a perfectly
/// separating part and a part of tied scores all count with an interval of their own
/// width. Errors: `Empty`; as [`auroc_newcombe`] for a part.
pub fn mean_auroc_newcombe(parts: &[DelongAuroc]) -> Result<Interval, MetricError> {
    if parts.is_empty() {
        return Err(MetricError::Empty { what: "per-dataset AUROCs" });
    }
    let d = parts.len() as f64;
    let (mut mean, mut below, mut above, mut n) = (0.0, 0.0, 0.0, 0);
    for p in parts {
        let ci = auroc_newcombe(p.auroc, p.positives, p.negatives)?;
        let (l, h) = ci.bounds().unwrap_or((p.auroc, p.auroc));
        mean += p.auroc / d;
        below += (p.auroc - l) * (p.auroc - l);
        above += (h - p.auroc) * (h - p.auroc);
        n += p.positives + p.negatives;
    }
    let low = (mean - below.sqrt() / d).max(0.0);
    let high = (mean + above.sqrt() / d).min(1.0);
    Ok(Interval::closed(mean, low, high, CiMethod::NewcombeMean, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Wilson at the edges: 0 and n successes reach the bound exactly; bad input is an error.
    #[test]
    fn wilson_edges() {
        let z = wilson(0, 10).unwrap();
        let (zl, zh) = z.bounds().unwrap();
        assert_eq!((z.estimate, zl), (0.0, 0.0));
        assert!(zh > 0.2 && zh < 0.35, "{z:?}");
        let f = wilson(10, 10).unwrap();
        let (fl, fh) = f.bounds().unwrap();
        assert_eq!((f.estimate, fh), (1.0, 1.0));
        assert!((fl - (1.0 - zh)).abs() < 1e-12, "symmetric");
        assert!(wilson(0, 0).is_err());
        assert!(wilson(3, 2).is_err());
    }

    /// The bootstrap is reproducible from its seed, differs with another seed, and brackets
    /// the estimate; an undefined figure is an error, not a number.
    #[test]
    fn bootstrap_is_seeded() {
        let v: Vec<f64> = (0..50).map(|i| (i % 7) as f64 / 7.0).collect();
        let a = bootstrap_mean(&v, Bootstrap::default()).unwrap();
        assert_eq!(a, bootstrap_mean(&v, Bootstrap::default()).unwrap());
        let b = bootstrap_mean(&v, Bootstrap { seed: 1, ..Bootstrap::default() }).unwrap();
        assert_ne!(a.bounds(), b.bounds());
        let (al, ah) = a.bounds().unwrap();
        assert!(al < a.estimate && a.estimate < ah);
        assert_eq!((a.n, a.resamples, a.method), (50, Some(2000), CiMethod::Bootstrap));
        assert!(bootstrap_mean(&[], Bootstrap::default()).is_err());
        assert!(bootstrap_by(3, Bootstrap::default(), |_| None).is_err());
        let c = Confusion { true_pos: 0, false_pos: 0, true_neg: 5, false_neg: 0 };
        assert!(f1_bootstrap(&c, Bootstrap::default()).is_err());
    }

    /// DeLong needs two items per class; perfect separation has variance 0.
    #[test]
    fn delong_edges() {
        assert!(delong(&[true, false, false], &[1.0, 0.0, 0.5]).is_err());
        let d = delong(&[true, true, false, false], &[0.9, 0.8, 0.1, 0.2]).unwrap();
        assert_eq!((d.auroc, d.variance), (1.0, 0.0));
        let i = auroc_delong(&[true, true, false, false], &[0.9, 0.1, 0.8, 0.2]).unwrap();
        let (l, h) = i.bounds().unwrap();
        assert!(l < 0.5 && h <= 1.0 && l >= 0.0, "{i:?}");
        assert!(mean_auroc_delong(&[]).is_err());
    }

    /// Issue 45 (10): with one unit per cluster the cluster bootstrap makes exactly
    /// `bootstrap_by`'s draws, so its interval is the same (method and cluster count aside).
    #[test]
    fn cluster_bootstrap_of_singletons_is_bootstrap_by() {
        let v: Vec<f64> = (0..37).map(|i| ((i * 7919) % 13) as f64).collect();
        let stat = |idx: &[usize]| Some(mean_at(&v, idx));
        let singletons: Vec<Vec<usize>> = (0..v.len()).map(|i| vec![i]).collect();
        for cfg in [Bootstrap::default(), Bootstrap { resamples: 500, seed: 9 }] {
            let plain = bootstrap_by(v.len(), cfg, stat).unwrap();
            let clustered = bootstrap_clustered(&singletons, cfg, stat).unwrap();
            assert_eq!(clustered.method, CiMethod::ClusterBootstrap);
            assert_eq!(clustered.clusters, Some(37));
            assert_eq!(
                Interval { method: CiMethod::Bootstrap, clusters: None, ..clustered },
                plain
            );
        }
        // Bad input is an error; one cluster is not estimable.
        assert!(bootstrap_clustered(&[], Bootstrap::default(), stat).is_err());
        assert!(bootstrap_clustered(&[vec![0], vec![]], Bootstrap::default(), stat).is_err());
        let twice = bootstrap_clustered(&[vec![0, 1], vec![1]], Bootstrap::default(), stat);
        assert!(matches!(twice, Err(MetricError::Malformed { .. })), "{twice:?}");
        let one = bootstrap_clustered(&[vec![0, 1, 2]], Bootstrap::default(), stat).unwrap();
        assert_eq!(one.not_estimable, Some(NotEstimable::FewerThanTwoClusters));
        assert_eq!((one.n, one.clusters), (3, Some(1)));
    }

    /// Issue 45 (10), a simulation with a designed intra-cluster correlation of 1: 200
    /// clusters of 4 identical 0/1 units, P(1) = 0.5. The proportion's true sampling sd is
    /// √(0.25/200) = 0.0354 (the 200 clusters are the independent draws), so a 95% interval
    /// is 2·1.96·0.0354 = 0.139 wide and covers 0.5 in 95% of data sets. Over 200 seeded
    /// data sets the cluster bootstrap's mean width is within 10% of 0.139 and its coverage
    /// within 0.05 of 0.95 (the coverage of 200 data sets has an sd of 0.015); the unit
    /// bootstrap, treating the 800 units as independent, is half as wide (0.069) and covers
    /// about 68% of the time.
    #[test]
    fn cluster_bootstrap_width_matches_designed_correlation() {
        let (datasets, clusters, size) = (200, 200, 4);
        let cfg = Bootstrap { resamples: 400, seed: DEFAULT_SEED };
        let mut rng = SplitMix64::new(45);
        let (mut width, mut covered, mut plain_width, mut plain_covered) = (0.0, 0, 0.0, 0);
        for _ in 0..datasets {
            let units: Vec<f64> = (0..clusters)
                .flat_map(|_| std::iter::repeat_n((rng.next_u64() >> 63) as f64, size))
                .collect();
            let groups: Vec<Vec<usize>> =
                (0..clusters).map(|c| (c * size..(c + 1) * size).collect()).collect();
            let stat = |idx: &[usize]| Some(mean_at(&units, idx));
            let ci = bootstrap_clustered(&groups, cfg, stat).unwrap();
            let (l, h) = ci.bounds().unwrap();
            width += (h - l) / datasets as f64;
            covered += usize::from(ci.contains(0.5));
            let plain = bootstrap_by(units.len(), cfg, stat).unwrap();
            let (l, h) = plain.bounds().unwrap();
            plain_width += (h - l) / datasets as f64;
            plain_covered += usize::from(plain.contains(0.5));
        }
        let designed = 2.0 * Z95 * (0.25f64 / clusters as f64).sqrt();
        let coverage = covered as f64 / datasets as f64;
        let plain_coverage = plain_covered as f64 / datasets as f64;
        eprintln!(
            "designed width {designed:.4}; cluster bootstrap {width:.4}, coverage {coverage:.3}; \
             unit bootstrap {plain_width:.4}, coverage {plain_coverage:.3}"
        );
        assert!((width / designed - 1.0).abs() < 0.1, "cluster width {width} vs {designed}");
        assert!((coverage - 0.95).abs() < 0.05, "cluster coverage {coverage}");
        assert!(plain_width < 0.6 * designed, "unit bootstrap width {plain_width}");
        assert!(plain_coverage < 0.8, "unit bootstrap coverage {plain_coverage}");
    }

    /// Newcombe's (2006) AUROC interval does not collapse where DeLong's does (AUROC 1,
    /// tied scores, one item of a class), brackets its estimate, and refuses bad input.
    #[test]
    fn newcombe_auroc_interval_does_not_collapse() {
        for (auroc, m, n) in [(1.0, 4, 4), (0.0, 4, 4), (0.5, 2, 2), (0.75, 1, 3), (0.8, 40, 40)] {
            let ci = auroc_newcombe(auroc, m, n).unwrap();
            let (l, h) = ci.bounds().unwrap();
            assert!(l < h && l <= auroc && auroc <= h, "{auroc} {m} {n}: {ci:?}");
            assert!((0.0..=1.0).contains(&l) && (0.0..=1.0).contains(&h));
        }
        let perfect = auroc_newcombe(1.0, 4, 4).unwrap();
        assert!(perfect.low.unwrap() > 0.55 && perfect.low.unwrap() < 0.65, "{perfect:?}");
        // Mirror image: AUROC θ and 1 − θ give mirrored bounds.
        let (a, b) = (auroc_newcombe(0.7, 10, 10).unwrap(), auroc_newcombe(0.3, 10, 10).unwrap());
        assert!((a.low.unwrap() - (1.0 - b.high.unwrap())).abs() < 1e-12, "{a:?} {b:?}");
        assert!(auroc_newcombe(f64::NAN, 2, 2).is_err());
        assert!(auroc_newcombe(1.5, 2, 2).is_err());
        assert!(auroc_newcombe(0.5, 0, 2).is_err());
        assert!(mean_auroc_newcombe(&[]).is_err());
    }

    /// Issue 45 (6), a seeded simulation with a designed effect: RealHall's aggregate over
    /// four datasets, three of 40 + 40 items (binormal scores, true AUROC 0.75) and one of
    /// 4 + 4 (true AUROC 0.79), which separates perfectly in about 18% of draws. Over 2000
    /// draws (coverage sd 0.005): the summed DeLong variances (before issue 45) cover the
    /// true mean AUROC 86% of the time, below 0.91; `mean_auroc_delong` now refuses
    /// an interval whenever a part has variance 0; Newcombe's intervals by square-and-add
    /// cover within 0.02 of 0.95 and always give an interval.
    #[test]
    fn aggregate_interval_coverage_with_a_small_dataset() {
        let mut rng = SplitMix64::new(4506);
        let mut normal = || {
            let u1 = ((rng.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            let u2 = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
        };
        // Binormal, unit variances, shift δ: AUROC = Φ(δ/√2) = erfc(−δ/2)/2.
        let designs = [(40, 0.954), (40, 0.954), (40, 0.954), (4, 1.145)];
        let truth = designs.iter().map(|&(_, d)| libm::erfc(-d / 2.0) / 2.0).sum::<f64>() / 4.0;
        let draws = 2000;
        let (mut before, mut perfect, mut refused, mut after) = (0, 0, 0, 0);
        for _ in 0..draws {
            let mut parts = Vec::new();
            for &(size, shift) in &designs {
                let labels: Vec<bool> = (0..2 * size).map(|i| i < size).collect();
                let scores: Vec<f64> =
                    labels.iter().map(|&pos| normal() + if pos { shift } else { 0.0 }).collect();
                parts.push(delong(&labels, &scores).unwrap());
            }
            perfect += usize::from(parts[3].auroc == 1.0);
            let mean = parts.iter().map(|p| p.auroc).sum::<f64>() / 4.0;
            let half = Z95 * parts.iter().map(|p| p.variance).sum::<f64>().sqrt() / 4.0;
            before += usize::from((mean - truth).abs() <= half);
            let delong_mean = mean_auroc_delong(&parts).unwrap();
            refused += usize::from(delong_mean.bounds().is_none());
            after += usize::from(mean_auroc_newcombe(&parts).unwrap().contains(truth));
        }
        let share = |k: usize| k as f64 / draws as f64;
        eprintln!(
            "true mean AUROC {truth:.4}; small dataset perfect in {:.3} of draws; coverage: \
             summed DeLong {:.3}, Newcombe square-and-add {:.3}; mean_auroc_delong not \
             estimable in {:.3}",
            share(perfect),
            share(before),
            share(after),
            share(refused)
        );
        assert!((0.14..0.24).contains(&share(perfect)), "perfect {}", share(perfect));
        assert!(share(before) < 0.91, "summed DeLong coverage {}", share(before));
        assert!(share(refused) >= share(perfect), "refused {}", share(refused));
        assert!((share(after) - 0.95).abs() < 0.02, "Newcombe coverage {}", share(after));
    }

    /// Issue 29 (6): an interval that collapses to a point is not estimable and says why,
    /// never [x, x]: constant values, one item, a DeLong variance of 0.
    #[test]
    fn collapsed_intervals_say_why() {
        let text = |ci: Interval| with_bracket(Some(ci.estimate), Some(&ci), 1.0, 4);
        let constant = bootstrap_mean(&[0.3; 10], Bootstrap::default()).unwrap();
        assert_eq!(text(constant), "0.3000 [not estimable: no variation in scores]");
        let one = bootstrap_mean(&[0.3], Bootstrap::default()).unwrap();
        assert_eq!(text(one), "0.3000 [not estimable: fewer than 2 items]");
        let c = Confusion { true_pos: 10, false_pos: 0, true_neg: 10, false_neg: 0 };
        let f1 = f1_bootstrap(&c, Bootstrap::default()).unwrap();
        assert_eq!(text(f1), "1.0000 [not estimable: every resample gives 1]");
        let tied = auroc_delong(&[true, true, false, false], &[0.0; 4]).unwrap();
        assert_eq!(text(tied), "0.5000 [not estimable: no variation in scores]");
        let perfect = auroc_delong(&[true, true, false, false], &[0.9, 0.8, 0.1, 0.2]).unwrap();
        assert!(text(perfect).starts_with("1.0000 [not estimable: perfect separation"));
        let few = auroc_delong(&[true, false, false], &[0.9, 0.1, 0.95]).unwrap();
        assert!(text(few).starts_with("0.5000 [not estimable: fewer than 2 items of a class"));
        // Wilson at 0 or n is not zero-width: it stays estimable.
        assert!(wilson(0, 10).unwrap().bounds().is_some());
        assert!(wilson(10, 10).unwrap().bounds().is_some());
        // The reason survives JSON: bounds null, the sentence beside them.
        let j = serde_json::to_value(constant).unwrap();
        assert!(j["low"].is_null() && j["high"].is_null(), "{j}");
        assert_eq!(j["not_estimable"], "no variation in scores");
        let back: Interval = serde_json::from_value(j).unwrap();
        assert_eq!(back, constant);
        let mean = mean_auroc_delong(&[DelongAuroc {
            auroc: 1.0,
            variance: 0.0,
            positives: 2,
            negatives: 2,
        }]);
        assert_eq!(mean.unwrap().not_estimable, Some(NotEstimable::ZeroVariance));
    }
}

//! Inter-rater agreement: how far LLM judges agree with human labels and with each other
//! ("Judges under test").
//!
//! A judge's accuracy against a human label says how often it is right; agreement
//! statistics say how much of that is more than chance would give, and whether several
//! judges are several independent opinions or one opinion repeated.
//!
//! - [`cohen_kappa`] (Cohen 1960, "A coefficient of agreement for nominal scales"): two
//!   raters (a judge and a human reference, or two judges) on the same items,
//!   `κ = (p_o − p_e) / (1 − p_e)` with `p_o` the observed share of agreements and `p_e`
//!   the share expected from the two raters' own label frequencies. Unweighted.
//! - [`fleiss_kappa`] (Fleiss 1971, "Measuring nominal scale agreement among many
//!   raters"): any fixed number of raters. Fleiss's statistic assumes every item is rated
//!   by every rater, so **only items rated by every rater are used**; items with a missing
//!   rating are left out (use Krippendorff's α to keep them).
//! - [`krippendorff_alpha_nominal`] (Krippendorff 2011, "Computing Krippendorff's
//!   Alpha-Reliability", the coincidence-matrix form): any number of raters, missing
//!   ratings allowed; an item contributes its pairable values (items with at least 2
//!   ratings), `α = 1 − D_o / D_e`.
//! - [`cohen_kappa_ci`], [`fleiss_kappa_ci`], [`krippendorff_alpha_ci`]: the percentile
//!   bootstrap over items of [`super::interval::bootstrap_by`] (seeded, reproducible). For
//!   α this is the plain item bootstrap, not Krippendorff's own bootstrap of pairable
//!   values (Hayes & Krippendorff 2007).
//! - [`error_correlations`]: whether judges err on the same items, the phi correlation of
//!   their error indicators against a reference. Three judges that share their mistakes
//!   are worth less than three independent ones, but φ alone does not say how much less:
//!   it is capped by the error rates (a judge whose 10% errors all fall inside another's
//!   30% has φ = 0.51, and Kish's n/(1 + (n − 1)φ) would call the pair 1.33 judges although
//!   the second adds nothing). So Halyard no longer reports that "effective number"
//!   (issue 45); instead:
//! - [`independent_panel_accuracy`]: the majority panel's observed accuracy and coverage
//!   beside what the same judges would achieve if they erred independently given the
//!   truth ([`independent_majority`], exact over the judges' votes). The gap is what
//!   shared errors cost the panel.
//! - [`majority`]: the per-item majority label (ties reported, not broken).
//! - [`super::mace`]: MACE, which weighs raters by estimated competence instead of
//!   counting votes.
//!
//! Categories are indices `0..k`; a missing rating is `None`. Nothing panics on input:
//! mismatched lengths, categories out of range and empty inputs are a [`MetricError`], and
//! a statistic that is 0/0 (every rating in one category, so that chance agreement is 1)
//! is `Undefined`, never NaN.
//!
//! `pipelines/tests/data/agreement_reference.py` recomputes every statistic independently
//! (scikit-learn, statsmodels, the `krippendorff` package, textbook examples) and
//! `pipelines/tests/agreement_reference.rs` checks these functions against it.

use serde::{Deserialize, Serialize};

use super::interval::{bootstrap_by, Bootstrap, Interval};
use super::MetricError;

/// Ratings of items by raters: items[i][r] = rater r's category for item i, None = not rated.
#[derive(Clone, Debug, PartialEq)]
pub struct Ratings {
    pub categories: usize,
    pub items: Vec<Vec<Option<usize>>>,
}

impl Ratings {
    /// Checked ratings: at least 1 category (`OutOfRange`), every item rated by the same
    /// number of raters (`LengthMismatch` against the first item), every category below
    /// `categories` (`OutOfRange`). No items, or no raters, is allowed here; the
    /// statistics refuse them (`Empty`).
    pub fn new(categories: usize, items: Vec<Vec<Option<usize>>>) -> Result<Ratings, MetricError> {
        if categories == 0 {
            return Err(MetricError::OutOfRange {
                what: "number of categories",
                value: 0.0,
                expected: "at least 1",
            });
        }
        let raters = items.first().map_or(0, Vec::len);
        for row in &items {
            if row.len() != raters {
                return Err(MetricError::LengthMismatch {
                    what: "raters per item (first item vs another)",
                    left: raters,
                    right: row.len(),
                });
            }
            check_categories("rating", categories, row.iter().flatten().copied())?;
        }
        Ok(Ratings { categories, items })
    }

    /// Raters (columns); 0 without items.
    pub fn raters(&self) -> usize {
        self.items.first().map_or(0, Vec::len)
    }

    /// The items at `idx`, in that order and with repeats (a bootstrap resample). Indices
    /// past the last item are skipped.
    pub fn subset(&self, idx: &[usize]) -> Ratings {
        Ratings {
            categories: self.categories,
            items: idx.iter().filter_map(|&i| self.items.get(i).cloned()).collect(),
        }
    }

    /// Per item, how many ratings fell in each category.
    fn counts(&self) -> Vec<Vec<u64>> {
        self.items
            .iter()
            .map(|row| {
                let mut c = vec![0u64; self.categories];
                for &v in row.iter().flatten() {
                    c[v] += 1;
                }
                c
            })
            .collect()
    }

    /// `Empty` without items or without raters.
    fn check_not_empty(&self) -> Result<(), MetricError> {
        if self.items.is_empty() {
            return Err(MetricError::Empty { what: "rated items" });
        }
        if self.raters() == 0 {
            return Err(MetricError::Empty { what: "raters" });
        }
        Ok(())
    }

    /// A public field may have been changed since `new`: check again.
    pub(crate) fn check(&self) -> Result<(), MetricError> {
        Ratings::new(self.categories, Vec::new())?;
        let raters = self.raters();
        for row in &self.items {
            if row.len() != raters {
                return Err(MetricError::LengthMismatch {
                    what: "raters per item (first item vs another)",
                    left: raters,
                    right: row.len(),
                });
            }
            check_categories("rating", self.categories, row.iter().flatten().copied())?;
        }
        self.check_not_empty()
    }
}

/// `OutOfRange` at the first value that is not a category index below `k`.
fn check_categories(
    what: &'static str,
    k: usize,
    values: impl IntoIterator<Item = usize>,
) -> Result<(), MetricError> {
    match values.into_iter().find(|&v| v >= k) {
        Some(v) => Err(MetricError::OutOfRange {
            what,
            value: v as f64,
            expected: "a category index below the number of categories",
        }),
        None => Ok(()),
    }
}

/// Square confusion matrix, rows = truth (reference), columns = rater's label.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConfusionMatrix {
    pub categories: usize,
    pub counts: Vec<Vec<u64>>,
}

impl ConfusionMatrix {
    /// Counts of (truth, rated) pairs. Errors: `OutOfRange` for 0 categories or a label
    /// not below `categories`; `LengthMismatch`; `Empty` for no pairs.
    pub fn from_pairs(
        categories: usize,
        truth: &[usize],
        rated: &[usize],
    ) -> Result<Self, MetricError> {
        if categories == 0 {
            return Err(MetricError::OutOfRange {
                what: "number of categories",
                value: 0.0,
                expected: "at least 1",
            });
        }
        if truth.len() != rated.len() {
            return Err(MetricError::LengthMismatch {
                what: "paired labels (truth vs rated)",
                left: truth.len(),
                right: rated.len(),
            });
        }
        if truth.is_empty() {
            return Err(MetricError::Empty { what: "paired labels" });
        }
        check_categories("truth label", categories, truth.iter().copied())?;
        check_categories("rated label", categories, rated.iter().copied())?;
        let mut counts = vec![vec![0u64; categories]; categories];
        for (&t, &r) in truth.iter().zip(rated) {
            counts[t][r] += 1;
        }
        Ok(ConfusionMatrix { categories, counts })
    }

    /// All pairs.
    pub fn total(&self) -> u64 {
        self.counts.iter().flatten().sum()
    }

    /// Pairs on the diagonal (rated = truth).
    pub fn agreements(&self) -> u64 {
        self.counts.iter().enumerate().filter_map(|(i, row)| row.get(i)).sum()
    }

    /// Cohen's κ of the table; `None` when chance agreement is 1 (or the table is empty).
    fn kappa(&self) -> Option<f64> {
        let n = self.total() as f64;
        if n == 0.0 {
            return None;
        }
        let p_o = self.agreements() as f64 / n;
        let mut p_e = 0.0;
        for c in 0..self.counts.len() {
            let row: u64 = self.counts[c].iter().sum();
            let col: u64 = self.counts.iter().filter_map(|r| r.get(c)).sum();
            p_e += (row as f64 / n) * (col as f64 / n);
        }
        (p_e < 1.0).then(|| (p_o - p_e) / (1.0 - p_e))
    }
}

const KAPPA_UNDEFINED: MetricError = MetricError::Undefined {
    what: "Cohen's kappa",
    reason: "both raters put every item in the same single category (chance agreement is 1)",
};

/// Cohen's (1960) unweighted κ of two raters' labels on the same items,
/// `(p_o − p_e) / (1 − p_e)`. Symmetric in `a` and `b`. Errors: as
/// [`ConfusionMatrix::from_pairs`]; `Undefined` when `p_e = 1` (both raters used one and
/// the same category for every item).
pub fn cohen_kappa(categories: usize, a: &[usize], b: &[usize]) -> Result<f64, MetricError> {
    ConfusionMatrix::from_pairs(categories, a, b)?.kappa().ok_or(KAPPA_UNDEFINED)
}

/// [`cohen_kappa`] with the percentile bootstrap over items (resamples where κ is undefined
/// are dropped); the estimate is κ on all items. Errors as [`cohen_kappa`].
pub fn cohen_kappa_ci(
    categories: usize,
    a: &[usize],
    b: &[usize],
    cfg: Bootstrap,
) -> Result<Interval, MetricError> {
    cohen_kappa(categories, a, b)?;
    bootstrap_by(a.len(), cfg, |idx| {
        let mut counts = vec![vec![0u64; categories]; categories];
        for &i in idx {
            counts[a[i]][b[i]] += 1;
        }
        ConfusionMatrix { categories, counts }.kappa()
    })
}

/// Fleiss's κ of per-item category counts, using the items whose counts sum to `raters`.
fn fleiss_from_counts(counts: &[Vec<u64>], idx: &[usize], raters: usize) -> Option<f64> {
    let k = counts.first().map_or(0, Vec::len);
    let m = raters as f64;
    let mut totals = vec![0.0; k];
    let (mut p_sum, mut n_items) = (0.0, 0usize);
    for &i in idx {
        let c = &counts[i];
        if c.iter().sum::<u64>() != raters as u64 {
            continue;
        }
        let squares: f64 = c.iter().map(|&x| (x * x) as f64).sum();
        p_sum += (squares - m) / (m * (m - 1.0));
        for (t, &x) in totals.iter_mut().zip(c) {
            *t += x as f64;
        }
        n_items += 1;
    }
    if n_items == 0 || raters < 2 {
        return None;
    }
    let nf = n_items as f64;
    let p_bar = p_sum / nf;
    let p_e: f64 = totals.iter().map(|t| (t / (nf * m)).powi(2)).sum();
    (p_e < 1.0).then(|| (p_bar - p_e) / (1.0 - p_e))
}

/// Fleiss's (1971) κ: `(P̄ − P̄_e) / (1 − P̄_e)` with `P_i = (Σ_j n_ij² − m) / (m(m − 1))`
/// the agreement within item i among its m raters and `P̄_e = Σ_j p_j²` from the overall
/// category shares. **Only items rated by every rater are used** (Fleiss's statistic
/// assumes a fixed number of ratings per item); the rest are ignored.
/// Errors: `Empty` (no items, no raters); `Undefined` with fewer than 2 raters, no item
/// rated by every rater, or `P̄_e = 1` (every rating in one category).
pub fn fleiss_kappa(r: &Ratings) -> Result<f64, MetricError> {
    r.check()?;
    let counts = r.counts();
    let all: Vec<usize> = (0..counts.len()).collect();
    fleiss_checked(&counts, &all, r.raters())
}

fn fleiss_checked(counts: &[Vec<u64>], idx: &[usize], raters: usize) -> Result<f64, MetricError> {
    if raters < 2 {
        return Err(MetricError::Undefined {
            what: "Fleiss's kappa",
            reason: "it needs at least 2 raters",
        });
    }
    if !idx.iter().any(|&i| counts[i].iter().sum::<u64>() == raters as u64) {
        return Err(MetricError::Undefined {
            what: "Fleiss's kappa",
            reason: "no item is rated by every rater",
        });
    }
    fleiss_from_counts(counts, idx, raters).ok_or(MetricError::Undefined {
        what: "Fleiss's kappa",
        reason: "every rating is in one category (chance agreement is 1)",
    })
}

/// [`fleiss_kappa`] with the percentile bootstrap over the items it uses (those rated by
/// every rater; `n` counts them). Errors as [`fleiss_kappa`].
pub fn fleiss_kappa_ci(r: &Ratings, cfg: Bootstrap) -> Result<Interval, MetricError> {
    r.check()?;
    let m = r.raters();
    let counts: Vec<Vec<u64>> =
        r.counts().into_iter().filter(|c| c.iter().sum::<u64>() == m as u64).collect();
    let all: Vec<usize> = (0..counts.len()).collect();
    fleiss_checked(&counts, &all, m)?;
    bootstrap_by(counts.len(), cfg, |idx| fleiss_from_counts(&counts, idx, m))
}

/// Krippendorff's nominal α of per-item category counts, over the items at `idx` with at
/// least 2 ratings (pairable). `None` when no value is pairable or `D_e = 0`.
///
/// Coincidences: item u with `m_u` ratings, `n_uc` of them in c, adds
/// `n_uc (n_uk − [c = k]) / (m_u − 1)` to `o_ck`; `n_c = Σ_k o_ck`, `n = Σ_c n_c`. Nominal
/// δ is 1 off the diagonal, so `D_o ∝ Σ_u Σ_c n_uc (m_u − n_uc) / (m_u − 1)` and
/// `D_e ∝ (n² − Σ_c n_c²) / (n − 1)` (Krippendorff 2011, eqs. for nominal data).
fn alpha_from_counts(counts: &[Vec<u64>], idx: &[usize]) -> Option<f64> {
    let k = counts.first().map_or(0, Vec::len);
    let mut n_c = vec![0.0; k];
    let mut disagree = 0.0;
    for &i in idx {
        let c = &counts[i];
        let m_u: u64 = c.iter().sum();
        if m_u < 2 {
            continue;
        }
        let m = m_u as f64;
        for (t, &x) in n_c.iter_mut().zip(c) {
            *t += x as f64;
            disagree += x as f64 * (m - x as f64) / (m - 1.0);
        }
    }
    let n: f64 = n_c.iter().sum();
    let expected = n * n - n_c.iter().map(|x| x * x).sum::<f64>();
    (n > 1.0 && expected > 0.0).then(|| 1.0 - (n - 1.0) * disagree / expected)
}

fn alpha_checked(counts: &[Vec<u64>], idx: &[usize]) -> Result<f64, MetricError> {
    if !idx.iter().any(|&i| counts[i].iter().sum::<u64>() >= 2) {
        return Err(MetricError::Undefined {
            what: "Krippendorff's alpha",
            reason: "no item has 2 or more ratings (no pairable values)",
        });
    }
    alpha_from_counts(counts, idx).ok_or(MetricError::Undefined {
        what: "Krippendorff's alpha",
        reason: "every pairable value is in one category (expected disagreement is 0)",
    })
}

/// Krippendorff's α for nominal data (Krippendorff 2011, "Computing Krippendorff's
/// Alpha-Reliability", coincidence-matrix form), `α = 1 − D_o / D_e`. Missing ratings are
/// allowed; only pairable values count (items with at least 2 ratings), an item with one
/// rating is ignored. Errors: `Empty`; `Undefined` without pairable values or when all
/// pairable values are one category (`D_e = 0`).
pub fn krippendorff_alpha_nominal(r: &Ratings) -> Result<f64, MetricError> {
    r.check()?;
    let counts = r.counts();
    let all: Vec<usize> = (0..counts.len()).collect();
    alpha_checked(&counts, &all)
}

/// [`krippendorff_alpha_nominal`] with the percentile bootstrap over items: the items with
/// at least 2 ratings are resampled (`n` counts them). This is the ordinary item
/// bootstrap, **not** Krippendorff's own bootstrap (Hayes & Krippendorff 2007), which
/// resamples pairable values from the coincidence matrix. Errors as
/// [`krippendorff_alpha_nominal`].
pub fn krippendorff_alpha_ci(r: &Ratings, cfg: Bootstrap) -> Result<Interval, MetricError> {
    r.check()?;
    let counts: Vec<Vec<u64>> =
        r.counts().into_iter().filter(|c| c.iter().sum::<u64>() >= 2).collect();
    let all: Vec<usize> = (0..counts.len()).collect();
    alpha_checked(&counts, &all)?;
    bootstrap_by(counts.len(), cfg, |idx| alpha_from_counts(&counts, idx))
}

/// The ratings are whole and `truth` is one label (or none) per rated item, each below
/// the number of categories.
fn check_truth(r: &Ratings, truth: &[Option<usize>]) -> Result<(), MetricError> {
    r.check()?;
    if truth.len() != r.items.len() {
        return Err(MetricError::LengthMismatch {
            what: "truth labels vs rated items",
            left: truth.len(),
            right: r.items.len(),
        });
    }
    check_categories("truth label", r.categories, truth.iter().flatten().copied())
}

/// Correlation of raters' errors against a reference: for each pair of raters, the phi
/// (Pearson) correlation of their error indicators (rated != truth) over items where both
/// rated and truth known; None where undefined (a rater with no variation in errors).
///
/// The result is a symmetric `raters × raters` matrix. The diagonal is `Some(1.0)` for a
/// rater whose errors vary (over the items it rated with a known truth), `None` otherwise.
/// Off the diagonal, `None` also where the two raters share no such item. Errors:
/// `LengthMismatch` when `truth` is not one entry per item; `OutOfRange` for a truth not
/// below the number of categories; as [`Ratings::new`] for changed ratings; `Empty`.
pub fn error_correlations(
    r: &Ratings,
    truth: &[Option<usize>],
) -> Result<Vec<Vec<Option<f64>>>, MetricError> {
    check_truth(r, truth)?;
    // errors[j][i]: Some(rater j erred on item i), None where unrated or truth unknown.
    let m = r.raters();
    let errors: Vec<Vec<Option<bool>>> = (0..m)
        .map(|j| {
            r.items
                .iter()
                .zip(truth)
                .map(|(row, t)| match (row[j], t) {
                    (Some(v), Some(t)) => Some(v != *t),
                    _ => None,
                })
                .collect()
        })
        .collect();
    let mut out = vec![vec![None; m]; m];
    for a in 0..m {
        out[a][a] = phi(&errors[a], &errors[a]).map(|_| 1.0);
        for b in a + 1..m {
            let p = phi(&errors[a], &errors[b]);
            out[a][b] = p;
            out[b][a] = p;
        }
    }
    Ok(out)
}

/// The phi coefficient of two binary series over the positions where both are known:
/// `(n11 n00 − n10 n01) / √(n1· n0· n·1 n·0)`; `None` when a margin is 0.
fn phi(x: &[Option<bool>], y: &[Option<bool>]) -> Option<f64> {
    let mut n = [[0u64; 2]; 2];
    for (a, b) in x.iter().zip(y) {
        if let (Some(a), Some(b)) = (a, b) {
            n[*a as usize][*b as usize] += 1;
        }
    }
    let margins = [n[1][0] + n[1][1], n[0][0] + n[0][1], n[0][1] + n[1][1], n[0][0] + n[1][0]];
    if margins.contains(&0) {
        return None;
    }
    let num = n[1][1] as f64 * n[0][0] as f64 - n[1][0] as f64 * n[0][1] as f64;
    let den = margins.iter().map(|&x| x as f64).product::<f64>().sqrt();
    Some((num / den).clamp(-1.0, 1.0))
}

/// The most judges [`independent_majority`] combines (its states are the judges' vote
/// counts, at most C(m + k, k) of them).
pub const MAX_PANEL_JUDGES: usize = 32;

/// A majority panel's outcome over units with a known truth, as shares of those units.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PanelOutcome {
    /// Share of units whose verdict is the truth (no verdict counts as not right).
    pub correct: f64,
    /// Share of units with a verdict (a plurality label; a tie or no rating is none).
    pub coverage: f64,
}

impl PanelOutcome {
    /// Accuracy over the units with a verdict, `correct / coverage`; `None` without any.
    pub fn accuracy_on_verdicts(&self) -> Option<f64> {
        (self.coverage > 0.0).then(|| self.correct / self.coverage)
    }
}

/// A majority panel's observed outcome beside the outcome the same judges would give if
/// their votes were independent given the truth (issue 45, item 9).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PanelVsIndependence {
    /// Units with a known truth (every share is of these).
    pub units: u64,
    /// The panel's majority (ties and unrated units: no verdict) against the truth.
    pub observed: PanelOutcome,
    /// [`independent_majority`] of the judges' observed confusion rows and the truth's
    /// class shares on the same units.
    pub independent: PanelOutcome,
}

/// What a majority panel would achieve if its judges voted independently given the truth:
/// `rows[j][t][v]` is P(judge j votes v | truth t) for v in `0..k` and, at `v = k`, the
/// probability that it gives no rating (a judge error); `prior[t]` is the share of units
/// whose truth is t. The panel's verdict is the plurality of the ratings given, none on a
/// tie or without ratings ([`majority`]). Exact: the distribution of the vote counts is
/// built judge by judge (a convolution over count vectors, the same sum as enumerating
/// every joint vote), then `correct = Σ_t prior[t]·P(plurality is t | t)` and
/// `coverage = Σ_t prior[t]·P(a plurality exists | t)`.
///
/// For three judges of accuracy p on two classes (no missing ratings) this is the
/// Condorcet jury sum `p³ + 3p²(1 − p)` with coverage 1; two judges that disagree give no
/// verdict, so with accuracies p and q, `correct = pq` and `coverage = pq + (1 − p)(1 − q)`.
/// Errors: `Empty` (no judges, no classes); `OutOfRange` for more than
/// [`MAX_PANEL_JUDGES`] judges, a probability that is negative or NaN, a row or the prior
/// not summing to 1 (within 1e-9); `LengthMismatch` for rows not k × (k + 1).
pub fn independent_majority(
    rows: &[Vec<Vec<f64>>],
    prior: &[f64],
) -> Result<PanelOutcome, MetricError> {
    let k = prior.len();
    if k == 0 {
        return Err(MetricError::Empty { what: "truth classes of the panel prediction" });
    }
    if rows.is_empty() {
        return Err(MetricError::Empty { what: "judges of the panel prediction" });
    }
    if rows.len() > MAX_PANEL_JUDGES {
        return Err(MetricError::OutOfRange {
            what: "judges of the panel prediction",
            value: rows.len() as f64,
            expected: "at most MAX_PANEL_JUDGES (32)",
        });
    }
    let distribution = |what: &'static str, v: &[f64]| -> Result<(), MetricError> {
        if let Some(&x) = v.iter().find(|x| x.is_nan() || **x < 0.0) {
            return Err(MetricError::OutOfRange {
                what,
                value: x,
                expected: "a probability (0 or more)",
            });
        }
        let sum: f64 = v.iter().sum();
        if (sum - 1.0).abs() > 1e-9 {
            return Err(MetricError::OutOfRange { what, value: sum, expected: "a sum of 1" });
        }
        Ok(())
    };
    distribution("truth class shares", prior)?;
    for judge in rows {
        if judge.len() != k {
            return Err(MetricError::LengthMismatch {
                what: "a judge's confusion rows vs truth classes",
                left: judge.len(),
                right: k,
            });
        }
        for row in judge {
            if row.len() != k + 1 {
                return Err(MetricError::LengthMismatch {
                    what: "a confusion row vs classes + 1 (no rating)",
                    left: row.len(),
                    right: k + 1,
                });
            }
            distribution("a judge's confusion row", row)?;
        }
    }
    let (mut correct, mut coverage) = (0.0, 0.0);
    for (t, &p_t) in prior.iter().enumerate() {
        if p_t == 0.0 {
            continue;
        }
        // Distribution of the vote counts per class (the no-rating count is implied).
        // A BTreeMap, not a HashMap: its order, and so the order of the sums, is the same
        // in every process (a report is reproducible bit for bit).
        let mut states: std::collections::BTreeMap<Vec<u8>, f64> =
            std::iter::once((vec![0u8; k], 1.0)).collect();
        for judge in rows {
            let row = &judge[t];
            let mut next = std::collections::BTreeMap::new();
            for (counts, p) in &states {
                for (v, &q) in row.iter().enumerate() {
                    if q == 0.0 {
                        continue;
                    }
                    let mut c = counts.clone();
                    if v < k {
                        c[v] += 1;
                    }
                    *next.entry(c).or_insert(0.0) += p * q;
                }
            }
            states = next;
        }
        for (counts, p) in states {
            let top = *counts.iter().max().unwrap_or(&0);
            let mut leaders = counts.iter().enumerate().filter(|(_, &c)| c == top && c > 0);
            if let (Some((label, _)), None) = (leaders.next(), leaders.next()) {
                coverage += p_t * p;
                if label == t {
                    correct += p_t * p;
                }
            }
        }
    }
    Ok(PanelOutcome { correct, coverage })
}

/// A majority panel's observed accuracy and coverage beside what independence would
/// predict ([`independent_majority`]), over the units with a known truth: each judge's
/// confusion row for truth t is the share of t-units it labelled v (or left unrated), the
/// prior the truth's class shares, all on those units. Observed and predicted differ only
/// through how the judges err together: where they err on the same units (one judge's
/// errors nested in another's, a shared blind spot) the observed panel falls short
/// of the prediction; independent judges meet it. Errors: as [`Ratings::new`] for changed
/// ratings; `Empty`; `LengthMismatch` when `truth` is not one per item; `OutOfRange` for a
/// truth not below the categories or more than [`MAX_PANEL_JUDGES`] judges; `Undefined`
/// when no unit has a truth.
pub fn independent_panel_accuracy(
    r: &Ratings,
    truth: &[Option<usize>],
) -> Result<PanelVsIndependence, MetricError> {
    check_truth(r, truth)?;
    let (k, m) = (r.categories, r.raters());
    let mut per_class = vec![0u64; k];
    let mut counts = vec![vec![vec![0u64; k + 1]; k]; m];
    let (mut units, mut correct, mut verdicts) = (0u64, 0u64, 0u64);
    for (row, t) in r.items.iter().zip(truth) {
        let Some(t) = *t else { continue };
        units += 1;
        per_class[t] += 1;
        for (j, v) in row.iter().enumerate() {
            counts[j][t][v.unwrap_or(k)] += 1;
        }
        if let Majority::Label(c) = majority(row) {
            verdicts += 1;
            correct += u64::from(c == t);
        }
    }
    if units == 0 {
        return Err(MetricError::Undefined {
            what: "panel accuracy",
            reason: "no unit has a known truth",
        });
    }
    let share = |x: u64, of: u64| if of == 0 { 0.0 } else { x as f64 / of as f64 };
    let rows: Vec<Vec<Vec<f64>>> = counts
        .iter()
        .map(|judge| {
            judge
                .iter()
                .zip(&per_class)
                .map(|(row, &n_t)| {
                    if n_t == 0 {
                        // A class the truth never takes: its row has weight 0.
                        let mut none = vec![0.0; k + 1];
                        none[k] = 1.0;
                        none
                    } else {
                        row.iter().map(|&c| share(c, n_t)).collect()
                    }
                })
                .collect()
        })
        .collect();
    let prior: Vec<f64> = per_class.iter().map(|&c| share(c, units)).collect();
    Ok(PanelVsIndependence {
        units,
        observed: PanelOutcome { correct: share(correct, units), coverage: share(verdicts, units) },
        independent: independent_majority(&rows, &prior)?,
    })
}

/// Per-item majority among the present ratings: `Label(c)`, `Tie(tied categories)`, or
/// `Unrated` (no rating).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Majority {
    /// One category has more ratings than any other.
    Label(usize),
    /// These categories (ascending) share the largest count.
    Tie(Vec<usize>),
    /// No rater rated the item.
    Unrated,
}

/// The plurality ("majority vote") of one item's present ratings: the category with the
/// most ratings, `Tie` (ascending categories) when several share the largest count,
/// `Unrated` when every rating is `None`. Ties are not broken here: the caller decides.
pub fn majority(row: &[Option<usize>]) -> Majority {
    let mut counts: Vec<(usize, usize)> = Vec::new();
    for &v in row.iter().flatten() {
        match counts.iter_mut().find(|(c, _)| *c == v) {
            Some((_, n)) => *n += 1,
            None => counts.push((v, 1)),
        }
    }
    let Some(best) = counts.iter().map(|&(_, n)| n).max() else {
        return Majority::Unrated;
    };
    let mut top: Vec<usize> = counts.iter().filter(|&&(_, n)| n == best).map(|&(c, _)| c).collect();
    top.sort_unstable();
    match top.as_slice() {
        [one] => Majority::Label(*one),
        _ => Majority::Tie(top),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ratings(k: usize, rows: &[&[Option<usize>]]) -> Ratings {
        Ratings::new(k, rows.iter().map(|r| r.to_vec()).collect()).unwrap()
    }

    /// The constructor refuses ragged rows, categories out of range and 0 categories.
    #[test]
    fn ratings_are_checked() {
        assert!(matches!(
            Ratings::new(2, vec![vec![Some(0), None], vec![Some(1)]]),
            Err(MetricError::LengthMismatch { left: 2, right: 1, .. })
        ));
        assert!(matches!(
            Ratings::new(2, vec![vec![Some(2)]]),
            Err(MetricError::OutOfRange { .. })
        ));
        assert!(Ratings::new(0, vec![]).is_err());
        let r = Ratings::new(3, vec![]).unwrap();
        assert_eq!(r.raters(), 0);
        assert!(matches!(fleiss_kappa(&r), Err(MetricError::Empty { .. })));
        assert!(matches!(krippendorff_alpha_nominal(&r), Err(MetricError::Empty { .. })));
        let r = ratings(2, &[&[Some(0), Some(1)], &[None, Some(1)]]);
        assert_eq!(r.raters(), 2);
        assert_eq!(r.subset(&[1, 1, 7]).items, vec![vec![None, Some(1)]; 2]);
        // A field changed after construction is checked again, not indexed out of range.
        let mut bad = r.clone();
        bad.items[0][0] = Some(5);
        assert!(matches!(fleiss_kappa(&bad), Err(MetricError::OutOfRange { .. })));
        assert!(error_correlations(&bad, &[None, None]).is_err());
    }

    /// Cohen's κ: input errors, perfect agreement, the undefined case, symmetry.
    #[test]
    fn cohen_edges() {
        assert!(matches!(cohen_kappa(2, &[], &[]), Err(MetricError::Empty { .. })));
        assert!(matches!(cohen_kappa(2, &[0], &[0, 1]), Err(MetricError::LengthMismatch { .. })));
        assert!(matches!(cohen_kappa(2, &[0, 2], &[0, 1]), Err(MetricError::OutOfRange { .. })));
        assert_eq!(cohen_kappa(2, &[0, 1, 1], &[0, 1, 1]), Ok(1.0));
        assert!(matches!(cohen_kappa(3, &[2, 2], &[2, 2]), Err(MetricError::Undefined { .. })));
        // One rater constant, the other not: p_e < 1, κ = 0.
        assert_eq!(cohen_kappa(2, &[0, 0, 0, 0], &[0, 1, 0, 1]), Ok(0.0));
        let (a, b) = ([0, 1, 2, 1, 0, 2, 2], [0, 1, 1, 1, 2, 2, 0]);
        assert_eq!(cohen_kappa(3, &a, &b), cohen_kappa(3, &b, &a));
        let m = ConfusionMatrix::from_pairs(3, &a, &b).unwrap();
        assert_eq!((m.total(), m.agreements()), (7, 4));
        assert_eq!(m.counts[0], vec![1, 0, 1]);
        assert!(ConfusionMatrix::from_pairs(0, &[], &[]).is_err());
        assert!(cohen_kappa_ci(3, &[2, 2], &[2, 2], Bootstrap::default()).is_err());
        let ci = cohen_kappa_ci(3, &a, &b, Bootstrap::default()).unwrap();
        assert_eq!(Ok(ci.estimate), cohen_kappa(3, &a, &b));
    }

    /// Fleiss: only complete items count; undefined cases are errors, not NaN.
    #[test]
    fn fleiss_edges() {
        let all_agree = ratings(2, &[&[Some(0); 3], &[Some(1); 3]]);
        assert_eq!(fleiss_kappa(&all_agree), Ok(1.0));
        let one_category = ratings(2, &[&[Some(1); 3], &[Some(1); 3]]);
        assert!(matches!(fleiss_kappa(&one_category), Err(MetricError::Undefined { .. })));
        let incomplete = ratings(2, &[&[Some(0), None], &[None, Some(1)]]);
        assert!(matches!(fleiss_kappa(&incomplete), Err(MetricError::Undefined { .. })));
        let one_rater = ratings(2, &[&[Some(0)], &[Some(1)]]);
        assert!(matches!(fleiss_kappa(&one_rater), Err(MetricError::Undefined { .. })));
        // The incomplete third item is ignored: same κ as without it.
        let with = ratings(2, &[&[Some(0), Some(0)], &[Some(1), Some(0)], &[Some(1), None]]);
        let without = ratings(2, &[&[Some(0), Some(0)], &[Some(1), Some(0)]]);
        assert_eq!(fleiss_kappa(&with), fleiss_kappa(&without));
        let ci = fleiss_kappa_ci(&with, Bootstrap::default()).unwrap();
        assert_eq!(ci.n, 2);
    }

    /// Krippendorff: single ratings are not pairable; one category is undefined.
    #[test]
    fn alpha_edges() {
        let singles = ratings(2, &[&[Some(0), None], &[None, Some(1)]]);
        assert!(matches!(krippendorff_alpha_nominal(&singles), Err(MetricError::Undefined { .. })));
        let one = ratings(2, &[&[Some(1), Some(1)], &[Some(1), None]]);
        assert!(matches!(krippendorff_alpha_nominal(&one), Err(MetricError::Undefined { .. })));
        let agree = ratings(3, &[&[Some(0), Some(0), None], &[Some(2), None, Some(2)]]);
        assert_eq!(krippendorff_alpha_nominal(&agree), Ok(1.0));
        let ci = krippendorff_alpha_ci(&agree, Bootstrap::default()).unwrap();
        assert_eq!((ci.estimate, ci.n), (1.0, 2));
        assert!(ci.bounds().is_none(), "every resample gives 1: not estimable");
    }

    /// Error correlations: identical error patterns correlate 1, opposite −1; a rater
    /// that is always right has no defined correlation.
    #[test]
    fn error_correlation_edges() {
        let truth = [Some(0), Some(1), Some(0), Some(1)];
        let r = ratings(
            2,
            &[
                &[Some(1), Some(1), Some(0), Some(0)],
                &[Some(1), Some(1), Some(1), Some(1)],
                &[Some(0), Some(0), Some(1), Some(0)],
                &[Some(1), Some(0), Some(0), Some(1)],
            ],
        );
        // Errors (columns against truth): rater 0 [1,0,0,0], rater 1 [1,0,0,1],
        // rater 2 [0,0,1,1], rater 3 none. phi(0,1) = (1·2 − 0·1)/√(1·3·2·2) = 1/√3.
        let c = error_correlations(&r, &truth).unwrap();
        assert_eq!(c.len(), 4);
        let third = 1.0 / 3f64.sqrt();
        assert!((c[0][1].unwrap() - third).abs() < 1e-15);
        assert!((c[0][2].unwrap() + third).abs() < 1e-15);
        assert_eq!(c[1][2], Some(0.0));
        assert_eq!((c[3][3], c[0][3], c[0][0]), (None, None, Some(1.0)));
        for (a, row) in c.iter().enumerate() {
            for (b, v) in row.iter().enumerate() {
                assert_eq!(*v, c[b][a]);
            }
        }
        assert!(error_correlations(&r, &truth[..3]).is_err());
        assert!(error_correlations(&r, &[Some(2), None, None, None]).is_err());
        let same = ratings(2, &[&[Some(1), Some(1)], &[Some(1), Some(1)], &[Some(0), Some(0)]]);
        let t = [Some(0), Some(1), Some(0)];
        let c = error_correlations(&same, &t).unwrap();
        assert_eq!(c, vec![vec![Some(1.0); 2]; 2]);
        let perfect = ratings(2, &[&[Some(0), Some(1)], &[Some(1), Some(1)]]);
        let c = error_correlations(&perfect, &[Some(0), Some(1)]).unwrap();
        assert_eq!(c[0][0], None);
        assert_eq!(c[0][1], None);
    }

    fn symmetric(p: f64) -> Vec<Vec<f64>> {
        vec![vec![p, 1.0 - p, 0.0], vec![1.0 - p, p, 0.0]]
    }

    /// Issue 45 (9), values by hand: three independent judges of accuracy 0.8 on two
    /// classes give the Condorcet jury sum p³ + 3p²(1 − p) = 0.896 with coverage 1; two
    /// independent 85% judges agree (a verdict) on 0.85² + 0.15² = 74.5% of the units and
    /// are right on 0.85² = 72.25%, 97.0% of their verdicts (the figures).
    #[test]
    fn independent_majority_by_hand() {
        let three = independent_majority(&vec![symmetric(0.8); 3], &[0.5, 0.5]).unwrap();
        assert!((three.correct - 0.896).abs() < 1e-12 && (three.coverage - 1.0).abs() < 1e-12);
        let two = independent_majority(&vec![symmetric(0.85); 2], &[0.3, 0.7]).unwrap();
        assert!((two.correct - 0.7225).abs() < 1e-12, "{two:?}");
        assert!((two.coverage - 0.745).abs() < 1e-12, "{two:?}");
        assert!((two.accuracy_on_verdicts().unwrap() - 0.969_798_657_718_120_8).abs() < 1e-12);
        // A judge that never rates: the other judge decides alone.
        let silent = vec![vec![0.0, 0.0, 1.0], vec![0.0, 0.0, 1.0]];
        let alone = independent_majority(&[symmetric(0.7), silent], &[0.5, 0.5]).unwrap();
        assert!((alone.correct - 0.7).abs() < 1e-12 && (alone.coverage - 1.0).abs() < 1e-12);
        // Reproducible bit for bit (the sums run in one order in every call and process).
        let row = |a: f64, b: f64, c: f64| vec![a, b, c, 1.0 - a - b - c];
        let judge =
            |x: f64| vec![row(0.7 - x, 0.1, 0.1 + x), row(0.2, 0.6, 0.1), row(0.1, x, 0.8 - x)];
        let panel: Vec<_> = (0..7).map(|j| judge(0.01 * j as f64)).collect();
        let first = independent_majority(&panel, &[0.2, 0.3, 0.5]).unwrap();
        for _ in 0..20 {
            assert_eq!(independent_majority(&panel, &[0.2, 0.3, 0.5]).unwrap(), first);
        }
        // Bad input is an error.
        assert!(independent_majority(&[], &[1.0]).is_err());
        assert!(independent_majority(&[symmetric(0.8)], &[]).is_err());
        assert!(independent_majority(&[symmetric(0.8)], &[0.5, 0.6]).is_err());
        assert!(independent_majority(&[symmetric(1.2)], &[0.5, 0.5]).is_err());
        assert!(independent_majority(&[vec![vec![1.0, 0.0]; 2]], &[0.5, 0.5]).is_err());
        assert!(independent_majority(&vec![symmetric(0.8); 33], &[0.5, 0.5]).is_err());
    }

    /// A design whose three judges err exactly independently (1000 units: every pattern of
    /// right/wrong in proportion p^r (1 − p)^(3 − r), p = 0.8) meets the prediction: the
    /// observed majority is right on 896 units, 0.896 as the Condorcet sum.
    #[test]
    fn independent_errors_meet_the_prediction() {
        let mut rows = Vec::new();
        let mut truth = Vec::new();
        for pattern in 0..8u32 {
            let right = |j: u32| pattern & (1 << j) == 0;
            let count = (0..3).map(|j| if right(j) { 4 } else { 1 }).product::<u32>() * 8;
            for u in 0..count {
                let t = (u % 2) as usize;
                rows.push((0..3).map(|j| Some(if right(j) { t } else { 1 - t })).collect());
                truth.push(Some(t));
            }
        }
        assert_eq!(rows.len(), 1000);
        let r = Ratings::new(2, rows).unwrap();
        let p = independent_panel_accuracy(&r, &truth).unwrap();
        assert_eq!(p.units, 1000);
        assert!((p.observed.correct - 0.896).abs() < 1e-12, "{p:?}");
        assert!((p.independent.correct - 0.896).abs() < 1e-12, "{p:?}");
        assert!(
            (p.observed.coverage - 1.0).abs() < 1e-12
                && (p.independent.coverage - 1.0).abs() < 1e-12
        );
    }

    /// Issue 45 (9), the nested case: on 200 units (100 per class) judge A errs on 30 of
    /// each class and judge B on 10 of those 30. Their error φ is 0.07/√(0.3·0.7·0.1·0.9) =
    /// 0.509 (Kish's n_eff would say 1.33 judges). Observed, by hand: both right on 70% (a
    /// right verdict), they disagree on 20% (a tie: no verdict), both wrong on 10%: correct
    /// 0.70, coverage 0.80, 87.5% of verdicts right. Independence predicts both right on
    /// 0.7·0.9 = 0.63 and both wrong on 0.3·0.1 = 0.03: coverage 0.66, 95.5% of verdicts
    /// right. The panel's verdicts are less accurate than independence predicts (its errors
    /// are shared), and less accurate than B alone (90%).
    #[test]
    fn nested_errors_fall_short_of_independence() {
        let mut rows = Vec::new();
        let mut truth = Vec::new();
        for t in 0..2usize {
            for u in 0..100 {
                let (a_wrong, b_wrong) = (u < 30, u < 10);
                let vote = |wrong: bool| Some(if wrong { 1 - t } else { t });
                rows.push(vec![vote(a_wrong), vote(b_wrong)]);
                truth.push(Some(t));
            }
        }
        let r = Ratings::new(2, rows).unwrap();
        let phi = error_correlations(&r, &truth).unwrap()[0][1].unwrap();
        assert!((phi - 0.07 / (0.3f64 * 0.7 * 0.1 * 0.9).sqrt()).abs() < 1e-12, "{phi}");
        let p = independent_panel_accuracy(&r, &truth).unwrap();
        let close = |x: f64, y: f64| (x - y).abs() < 1e-12;
        assert!(close(p.observed.correct, 0.70) && close(p.observed.coverage, 0.80), "{p:?}");
        assert!(close(p.independent.correct, 0.63), "{p:?}");
        assert!(close(p.independent.coverage, 0.66), "{p:?}");
        let (seen, predicted) = (
            p.observed.accuracy_on_verdicts().unwrap(),
            p.independent.accuracy_on_verdicts().unwrap(),
        );
        assert!(close(seen, 0.875) && close(predicted, 0.63 / 0.66), "{p:?}");
        assert!(seen < predicted && seen < 0.9);
        // Bad input.
        assert!(independent_panel_accuracy(&r, &truth[..3]).is_err());
        assert!(independent_panel_accuracy(&r, &vec![None; 200]).is_err());
        let mut bad = truth.clone();
        bad[0] = Some(2);
        assert!(independent_panel_accuracy(&r, &bad).is_err());
    }

    /// Majority: label, tie (ascending), unrated.
    #[test]
    fn majority_cases() {
        assert_eq!(majority(&[Some(2), Some(1), Some(2), None]), Majority::Label(2));
        assert_eq!(majority(&[Some(2), Some(0), None, Some(1)]), Majority::Tie(vec![0, 1, 2]));
        assert_eq!(majority(&[Some(3), Some(1), Some(1), Some(3)]), Majority::Tie(vec![1, 3]));
        assert_eq!(majority(&[None, None]), Majority::Unrated);
        assert_eq!(majority(&[]), Majority::Unrated);
    }
}

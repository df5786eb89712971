//! MACE: which raters to trust, learnt from their ratings alone.
//!
//! Hovy, Berg-Kirkpatrick, Vaswani & Hovy (NAACL 2013), "Learning Whom to Trust with
//! MACE". A majority vote counts a careless judge as much as a careful one; MACE estimates
//! each rater's competence and weighs the ratings by it.
//!
//! ## The model
//! For each item i a true label `T_i` is drawn uniformly from the k categories (the
//! paper's uniform prior). Rater j, on each item it rates, spams with probability
//! `1 − θ_j`: spamming, it draws its label from its own spamming distribution `ξ_j` over
//! the k labels; not spamming, it gives `T_i`. So
//! `P(A_ij = a | T_i = c) = (1 − θ_j) ξ_j(a) + θ_j [a = c]`, and `θ_j` (the paper's
//! "trustworthiness", here `competence`) is the probability that rater j's label is the
//! truth rather than noise.
//!
//! ## Fitting
//! Two fits, as the reference tool (`MACE.java`, github.com/dirkhovy/MACE) offers them
//! ([`MaceMode`]): **Variational Bayes** (the tool's default, and [`MaceConfig::default`])
//! and plain **EM** for the maximum-likelihood θ and ξ (the tool's `--em`,
//! [`MaceConfig::em`]). Both run the same loop:
//! - **initialisation**, per restart: every weight `1 + 0.5·u` (u uniform in [0, 1), the
//!   tool's `DEFAULT_NOISE = 0.5`), normalised: first the (spam, know) pair of every
//!   rater, then every rater's ξ over the k labels. The draws come from the crate's
//!   SplitMix64 seeded with `MaceConfig::seed` (one generator across all restarts), so a
//!   fit is reproducible bit for bit;
//! - **E-step**: the posterior of each item's label (uniform prior times the product over
//!   its raters, computed in log space so that many raters do not underflow, with the
//!   factor common to every label taken out so that equal evidence is an exact tie), the
//!   data's log-likelihood, and per rating the expected counts of "knew" and "spammed with
//!   label a";
//! - **M-step**, EM: `θ_j` and `ξ_j` are the expected counts normalised after adding
//!   `smoothing / k` to every count (the tool's default is `--smoothing 0.01/|values|`:
//!   `MaceConfig::smoothing` is that numerator, 0.01);
//! - **M-step**, Variational Bayes (Hovy et al. 2013, §2.2): with a Beta(α, β) prior on
//!   (spam, know) and a symmetric Dirichlet(10) prior on ξ_j (the tool's fixed
//!   `strategyPriors`), each weight is `exp ψ(count + prior) / exp ψ(Σ counts + priors)`
//!   (ψ the digamma function): the expectation of the log-probability under the
//!   variational posterior, exponentiated. These weights do not sum to 1 (they sum to a
//!   little less); the E-step uses them as they are, as the tool does. The tool's priors
//!   are α = β = 0.5 (`--alpha`, `--beta`; α weighs "spam", β "know");
//! - an E-step runs first, then at most `iterations` times an M-step followed by an
//!   E-step; a run stops (**converged**) when the log-likelihood (the tool's "log marginal
//!   likelihood", computed with the weights above) changes by less than `tolerance` in an
//!   iteration. The tool runs a fixed number of iterations (50 unless `--iterations`, at
//!   most 1000); panels of 180+ units need 86–258 to reach 1e-9 (issue 45), so the cap here
//!   is the tool's maximum, 1000, and `converged: false` says that the cap, not the
//!   tolerance, stopped the chosen restart;
//! - of `restarts` runs, the one with the highest final log-likelihood is kept (the first
//!   one on equal likelihoods), as the tool does.
//!
//! **Competence** is the tool's `competence` output: θ_j in EM; in Variational Bayes the
//! "know" weight `exp E[ln θ_j]`, which is a little below θ_j's posterior mean (and near
//! `1 − 1/(2n)` rather than 1 for a rater who is never wrong on n items).
//!
//! The log-likelihood is `Σ_i ln Σ_c (1/k) Π_j P(A_ij | T_i = c)` over the rated items.
//! An item nobody rated does not enter the fit: its posterior is the uniform prior and its
//! label `None`. The label of an item is its posterior's argmax, the lowest category on a
//! tie.
//!
//! `pipelines/tests/data/agreement_reference.py` checks one EM step derived by hand, and
//! full fits against an independent numpy EM. `pipelines/tests/mace_tool.rs` checks both
//! modes against the official tool's output on committed fixtures
//! (`pipelines/tests/data/mace_tool/`, with the command that made it).

use serde::{Deserialize, Serialize};

use super::agreement::Ratings;
use super::interval::{SplitMix64, DEFAULT_SEED};
use super::MetricError;

/// The tool's initial noise: weights `1 + 0.5·u` before normalising.
const INIT_NOISE: f64 = 0.5;

/// The tool's Dirichlet prior on every label of a rater's spamming distribution (Variational
/// Bayes; `strategyPriors` in `MACE.java`, not an option there).
const STRATEGY_PRIOR: f64 = 10.0;
/// The tool's cap on iterations (`--iterations` accepts 1 to 1000).
pub const MAX_ITERATIONS: u32 = 1000;

/// How MACE's parameters are estimated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MaceMode {
    /// Maximum likelihood by EM with smoothing (the tool's `--em`). The default of a
    /// configuration read without a `mode`: every fit before issue 45 was EM.
    #[default]
    Em,
    /// Variational Bayes with Beta(α, β) and Dirichlet(10) priors (the tool's default).
    Variational,
}

impl MaceMode {
    pub fn as_str(self) -> &'static str {
        match self {
            MaceMode::Em => "em",
            MaceMode::Variational => "variational",
        }
    }
}

fn half() -> f64 {
    0.5
}

/// How MACE is fitted. [`MaceConfig::default`] is the tool's default (Variational Bayes),
/// [`MaceConfig::em`] its `--em`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MaceConfig {
    /// EM or Variational Bayes. A configuration written without one (before issue 45)
    /// reads as EM, which is what produced it.
    #[serde(default)]
    pub mode: MaceMode,
    /// Random restarts; the best log-likelihood wins. At least 1.
    pub restarts: u32,
    /// The most iterations (M-step then E-step) of a restart.
    pub iterations: u32,
    /// A restart stops when the log-likelihood changes by less than this (0: never early).
    pub tolerance: f64,
    /// EM: numerator of the pseudo-count `smoothing / k` added to every expected count
    /// before normalising (the tool's `0.01/|values|`). Greater than 0.
    pub smoothing: f64,
    /// Variational Bayes: the Beta prior's weight on "spam" (the tool's `--alpha`, 0.5).
    #[serde(default = "half")]
    pub alpha: f64,
    /// Variational Bayes: the Beta prior's weight on "know" (the tool's `--beta`, 0.5).
    #[serde(default = "half")]
    pub beta: f64,
    /// Seed of the initialisation draws.
    pub seed: u64,
}

impl Default for MaceConfig {
    /// The MACE tool's defaults: Variational Bayes with α = β = 0.5, 10 restarts; then
    /// up to 1000 iterations (the tool's maximum; it runs 50 without a tolerance) until
    /// the log-likelihood changes by less than 1e-9, and the crate's bootstrap seed.
    fn default() -> Self {
        MaceConfig {
            mode: MaceMode::Variational,
            restarts: 10,
            iterations: MAX_ITERATIONS,
            tolerance: 1e-9,
            smoothing: 0.01,
            alpha: 0.5,
            beta: 0.5,
            seed: DEFAULT_SEED,
        }
    }
}

impl MaceConfig {
    /// The tool's `--em`: maximum likelihood with smoothing 0.01/k (otherwise as
    /// [`MaceConfig::default`]).
    pub fn em() -> Self {
        MaceConfig { mode: MaceMode::Em, ..MaceConfig::default() }
    }
}

/// A fitted MACE model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MaceResult {
    /// θ_j per rater: the probability that rater j gives the true label (does not spam).
    pub competence: Vec<f64>,
    /// ξ_j per rater: the distribution of its labels when spamming (Variational Bayes: the
    /// weights normalised to sum to 1).
    pub spamming: Vec<Vec<f64>>,
    /// Per item, P(T_i = c | data); the uniform prior for an unrated item.
    pub posteriors: Vec<Vec<f64>>,
    /// Argmax of the posterior (the lowest category on a tie); `None` for an unrated item.
    pub labels: Vec<Option<usize>>,
    /// Log-likelihood of the ratings under the fitted parameters.
    pub log_likelihood: f64,
    /// Iterations of the chosen restart.
    pub iterations: u32,
    /// The chosen restart stopped by the tolerance, not by the iteration cap.
    pub converged: bool,
    /// Restarts run.
    pub restarts: u32,
}

/// Per rater the weights of knowing (θ) and of spamming (1 − θ in EM; in Variational
/// Bayes its own weight), and ξ.
#[derive(Clone)]
struct Params {
    know: Vec<f64>,
    spam: Vec<f64>,
    strategy: Vec<Vec<f64>>,
}

/// The rated items: (rater, label) pairs, and their original index.
struct Data {
    k: usize,
    raters: usize,
    items: Vec<(usize, Vec<(usize, usize)>)>,
    total_items: usize,
}

/// One E-step's output.
struct Expectation {
    /// Posteriors of the rated items, in `Data::items` order.
    posteriors: Vec<Vec<f64>>,
    log_likelihood: f64,
    /// Per rater: expected (spammed, knew) counts.
    knew: Vec<[f64; 2]>,
    /// Per rater and label: expected count of spamming with that label.
    spammed: Vec<Vec<f64>>,
}

fn data(r: &Ratings) -> Result<Data, MetricError> {
    r.check()?;
    let items: Vec<(usize, Vec<(usize, usize)>)> = r
        .items
        .iter()
        .enumerate()
        .map(|(i, row)| {
            (i, row.iter().enumerate().filter_map(|(j, v)| v.map(|v| (j, v))).collect::<Vec<_>>())
        })
        .filter(|(_, a)| !a.is_empty())
        .collect();
    if items.is_empty() {
        return Err(MetricError::Undefined { what: "MACE", reason: "no item has a rating" });
    }
    Ok(Data { k: r.categories, raters: r.raters(), items, total_items: r.items.len() })
}

fn e_step(d: &Data, p: &Params) -> Expectation {
    let k = d.k;
    let mut out = Expectation {
        posteriors: Vec::with_capacity(d.items.len()),
        log_likelihood: 0.0,
        knew: vec![[0.0; 2]; d.raters],
        spammed: vec![vec![0.0; k]; d.raters],
    };
    let prior = -(k as f64).ln();
    let mut logw = vec![0.0; k];
    let mut votes: Vec<Vec<f64>> = vec![Vec::new(); k];
    for (_, ratings) in &d.items {
        // P(A_ij = a | T = c) = noise_j(a) (1 + [a = c] θ_j / noise_j(a)) with
        // noise_j(a) = (1 − θ_j) ξ_j(a): the product of the noises is common to every c, and
        // c's own factor is the sum of ln(1 + θ_j / noise_j) over the raters who said c,
        // summed in ascending order so that equal evidence gives an exact tie.
        let mut common = prior;
        votes.iter_mut().for_each(Vec::clear);
        for &(j, a) in ratings {
            let noise = p.spam[j] * p.strategy[j][a];
            common += noise.ln();
            votes[a].push((p.know[j] / noise).ln_1p());
        }
        for (w, v) in logw.iter_mut().zip(votes.iter_mut()) {
            v.sort_by(f64::total_cmp);
            *w = v.iter().sum();
        }
        let max = logw.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = logw.iter().map(|w| (w - max).exp()).sum();
        out.log_likelihood += common + max + sum.ln();
        let post: Vec<f64> = logw.iter().map(|w| (w - max).exp() / sum).collect();
        for &(j, a) in ratings {
            let noise = p.spam[j] * p.strategy[j][a];
            // Given T = a, the rater knew with probability θ / (noise + θ); given T ≠ a it
            // must have spammed.
            let knew = post[a] * p.know[j] / (noise + p.know[j]);
            let elsewhere: f64 =
                post.iter().enumerate().filter(|&(c, _)| c != a).map(|p| p.1).sum();
            let spammed = post[a] * noise / (noise + p.know[j]) + elsewhere;
            out.knew[j][0] += spammed;
            out.knew[j][1] += knew;
            out.spammed[j][a] += spammed;
        }
        out.posteriors.push(post);
    }
    out
}

fn m_step(d: &Data, e: &Expectation, smoothing: f64) -> Params {
    let s = smoothing / d.k as f64;
    let know: Vec<f64> =
        e.knew.iter().map(|[spam, know]| (know + s) / (spam + know + 2.0 * s)).collect();
    let strategy = e
        .spammed
        .iter()
        .map(|row| {
            let total: f64 = row.iter().sum::<f64>() + s * d.k as f64;
            row.iter().map(|c| (c + s) / total).collect()
        })
        .collect();
    Params { spam: know.iter().map(|k| 1.0 - k).collect(), know, strategy }
}

/// The Variational Bayes M-step, as `MACE.java`'s `variationalNormalize`: every weight is
/// `exp ψ(count + prior) / exp ψ(Σ (counts + priors))`.
fn vb_m_step(e: &Expectation, alpha: f64, beta: f64) -> Params {
    let w = |x: f64, norm: f64| digamma(x).exp() / digamma(norm).exp();
    let (mut know, mut spam) = (Vec::new(), Vec::new());
    for [s, k] in &e.knew {
        let norm = s + alpha + k + beta;
        spam.push(w(s + alpha, norm));
        know.push(w(k + beta, norm));
    }
    let strategy = e
        .spammed
        .iter()
        .map(|row| {
            let norm: f64 = row.iter().map(|c| c + STRATEGY_PRIOR).sum();
            row.iter().map(|c| w(c + STRATEGY_PRIOR, norm)).collect()
        })
        .collect();
    Params { know, spam, strategy }
}

/// The digamma function ψ(x) for x > 0: the recurrence ψ(x) = ψ(x + 1) − 1/x up to
/// x ≥ 10, then the asymptotic series `ln x − 1/2x − Σ B₂ₖ/(2k x²ᵏ)` to x⁻¹⁴ (error below
/// 1e-15 there). NaN for x ≤ 0 or NaN (never reached: every argument is a count plus a
/// positive prior).
pub(crate) fn digamma(mut x: f64) -> f64 {
    if x.is_nan() || x <= 0.0 {
        return f64::NAN;
    }
    let mut acc = 0.0;
    while x < 10.0 {
        acc -= 1.0 / x;
        x += 1.0;
    }
    let x2 = 1.0 / (x * x);
    // B₂/2, B₄/4, … B₁₄/14: 1/12, −1/120, 1/252, −1/240, 1/132, −691/32760, 1/12.
    let series = x2
        * (1.0 / 12.0
            - x2 * (1.0 / 120.0
                - x2 * (1.0 / 252.0
                    - x2 * (1.0 / 240.0
                        - x2 * (1.0 / 132.0 - x2 * (691.0 / 32760.0 - x2 / 12.0))))));
    acc + x.ln() - 0.5 / x - series
}

/// One run from `p`: (final parameters, final E-step, iterations, converged).
fn run(
    d: &Data,
    mut p: Params,
    iterations: u32,
    tolerance: f64,
    cfg: &MaceConfig,
) -> (Params, Expectation, u32, bool) {
    let mut e = e_step(d, &p);
    for it in 1..=iterations {
        let before = e.log_likelihood;
        p = match cfg.mode {
            MaceMode::Em => m_step(d, &e, cfg.smoothing),
            MaceMode::Variational => vb_m_step(&e, cfg.alpha, cfg.beta),
        };
        e = e_step(d, &p);
        if (e.log_likelihood - before).abs() < tolerance {
            return (p, e, it, true);
        }
    }
    (p, e, iterations, false)
}

fn result(
    d: &Data,
    p: Params,
    e: Expectation,
    iterations: u32,
    converged: bool,
    restarts: u32,
) -> MaceResult {
    let mut posteriors = vec![vec![1.0 / d.k as f64; d.k]; d.total_items];
    let mut labels = vec![None; d.total_items];
    for ((i, _), post) in d.items.iter().zip(e.posteriors) {
        // The first maximum: the lowest category on a tie.
        let best =
            post.iter().enumerate().fold(0, |best, (c, &v)| if v > post[best] { c } else { best });
        labels[*i] = Some(best);
        posteriors[*i] = post;
    }
    let spamming = p
        .strategy
        .into_iter()
        .map(|row| {
            let total: f64 = row.iter().sum();
            row.into_iter().map(|x| x / total).collect()
        })
        .collect();
    MaceResult {
        competence: p.know,
        spamming,
        posteriors,
        labels,
        log_likelihood: e.log_likelihood,
        iterations,
        converged,
        restarts,
    }
}

fn check_smoothing(smoothing: f64) -> Result<(), MetricError> {
    if smoothing.is_finite() && smoothing > 0.0 {
        Ok(())
    } else {
        Err(MetricError::OutOfRange {
            what: "MACE smoothing",
            value: smoothing,
            expected: "a finite number greater than 0",
        })
    }
}

/// The tool's random start: (spam, know) weights of every rater, then every rater's ξ.
fn random_start(d: &Data, rng: &mut SplitMix64) -> Params {
    let know: Vec<f64> = (0..d.raters)
        .map(|_| {
            let spam = 1.0 + INIT_NOISE * rng.uniform();
            let know = 1.0 + INIT_NOISE * rng.uniform();
            know / (spam + know)
        })
        .collect();
    let strategy = (0..d.raters)
        .map(|_| {
            let w: Vec<f64> = (0..d.k).map(|_| 1.0 + INIT_NOISE * rng.uniform()).collect();
            let total: f64 = w.iter().sum();
            w.iter().map(|x| x / total).collect()
        })
        .collect();
    Params { spam: know.iter().map(|k| 1.0 - k).collect(), know, strategy }
}

/// Fits MACE by EM or Variational Bayes with random restarts (see the module docs).
/// Errors: as [`Ratings::new`] for ratings changed after construction; `Empty` (no items,
/// no raters); `Undefined` when no item has a rating; `OutOfRange` for 0 restarts, a
/// smoothing or a prior (α, β) that is not a finite positive number, or a NaN or negative
/// tolerance.
pub fn mace(r: &Ratings, cfg: MaceConfig) -> Result<MaceResult, MetricError> {
    let d = data(r)?;
    check_smoothing(cfg.smoothing)?;
    for (what, v) in [("MACE prior alpha", cfg.alpha), ("MACE prior beta", cfg.beta)] {
        if !(v.is_finite() && v > 0.0) {
            return Err(MetricError::OutOfRange {
                what,
                value: v,
                expected: "a finite number greater than 0",
            });
        }
    }
    if cfg.restarts == 0 {
        return Err(MetricError::OutOfRange {
            what: "MACE restarts",
            value: 0.0,
            expected: "at least 1",
        });
    }
    if cfg.tolerance.is_nan() || cfg.tolerance < 0.0 {
        return Err(MetricError::OutOfRange {
            what: "MACE tolerance",
            value: cfg.tolerance,
            expected: "0 or more",
        });
    }
    let mut rng = SplitMix64::new(cfg.seed);
    let mut best: Option<(Params, Expectation, u32, bool)> = None;
    for _ in 0..cfg.restarts {
        let start = random_start(&d, &mut rng);
        let fit = run(&d, start, cfg.iterations, cfg.tolerance, &cfg);
        let better = match &best {
            None => !fit.1.log_likelihood.is_nan(),
            Some(b) => fit.1.log_likelihood > b.1.log_likelihood,
        };
        if better {
            best = Some(fit);
        }
    }
    let (p, e, iterations, converged) = best.ok_or(MetricError::Undefined {
        what: "MACE",
        reason: "the log-likelihood is NaN on every restart",
    })?;
    Ok(result(&d, p, e, iterations, converged, cfg.restarts))
}

/// EM (the tool's `--em`) from a given start, for exactly `iterations` iterations (no tolerance, one restart):
/// lets the reference tests check the EM arithmetic from a fixed initialisation.
/// `init_competence[j]` in [0, 1), `init_spamming[j]` a distribution over the k labels with
/// every label's probability above 0 (so that every rating is possible under every true
/// label, as after any M-step with smoothing).
/// Errors as [`mace`], plus `LengthMismatch` and `OutOfRange` for a malformed start.
#[doc(hidden)]
pub fn mace_from(
    r: &Ratings,
    init_competence: &[f64],
    init_spamming: &[Vec<f64>],
    iterations: u32,
    smoothing: f64,
) -> Result<MaceResult, MetricError> {
    let d = data(r)?;
    check_smoothing(smoothing)?;
    for (what, len) in
        [("initial competences", init_competence.len()), ("initial spamming", init_spamming.len())]
    {
        if len != d.raters {
            return Err(MetricError::LengthMismatch { what, left: len, right: d.raters });
        }
    }
    if let Some(&v) = init_competence.iter().find(|v| !(0.0..1.0).contains(*v)) {
        return Err(MetricError::OutOfRange {
            what: "initial competence",
            value: v,
            expected: "in [0, 1)",
        });
    }
    for row in init_spamming {
        if row.len() != d.k {
            return Err(MetricError::LengthMismatch {
                what: "initial spamming distribution vs categories",
                left: row.len(),
                right: d.k,
            });
        }
        let sum: f64 = row.iter().sum();
        if row.iter().any(|v| v.is_nan() || *v <= 0.0) || (sum - 1.0).abs() > 1e-9 {
            return Err(MetricError::OutOfRange {
                what: "initial spamming distribution's sum",
                value: sum,
                expected: "positive values summing to 1",
            });
        }
    }
    let start = Params {
        know: init_competence.to_vec(),
        spam: init_competence.iter().map(|k| 1.0 - k).collect(),
        strategy: init_spamming.to_vec(),
    };
    let cfg = MaceConfig { smoothing, ..MaceConfig::em() };
    let (p, e, it, converged) = run(&d, start, iterations, 0.0, &cfg);
    Ok(result(&d, p, e, it, converged, 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ratings(k: usize, rows: &[&[Option<usize>]]) -> Ratings {
        Ratings::new(k, rows.iter().map(|r| r.to_vec()).collect()).unwrap()
    }

    /// Bad input is an error: no items, no ratings, bad configuration, bad start.
    #[test]
    fn refuses_bad_input() {
        let cfg = MaceConfig::default();
        assert!(matches!(
            mace(&Ratings::new(2, vec![]).unwrap(), cfg),
            Err(MetricError::Empty { .. })
        ));
        let unrated = ratings(2, &[&[None, None]]);
        assert!(matches!(mace(&unrated, cfg), Err(MetricError::Undefined { .. })));
        let r = ratings(2, &[&[Some(0), Some(1)], &[Some(1), None]]);
        for bad in [
            MaceConfig { restarts: 0, ..cfg },
            MaceConfig { smoothing: 0.0, ..cfg },
            MaceConfig { smoothing: f64::NAN, ..cfg },
            MaceConfig { tolerance: f64::NAN, ..cfg },
            MaceConfig { tolerance: -1.0, ..cfg },
            MaceConfig { alpha: 0.0, ..cfg },
            MaceConfig { beta: f64::INFINITY, ..cfg },
        ] {
            assert!(matches!(mace(&r, bad), Err(MetricError::OutOfRange { .. })), "{bad:?}");
        }
        let uniform = vec![vec![0.5, 0.5]; 2];
        assert!(mace_from(&r, &[0.5], &uniform, 1, 0.01).is_err());
        assert!(mace_from(&r, &[0.5, 1.5], &uniform, 1, 0.01).is_err());
        assert!(mace_from(&r, &[0.5, 1.0], &uniform, 1, 0.01).is_err(), "θ = 1: no noise");
        let certain = [vec![1.0, 0.0], vec![0.5, 0.5]];
        assert!(mace_from(&r, &[0.5, 0.5], &certain, 1, 0.01).is_err(), "ξ(a) = 0");
        assert!(mace_from(&r, &[0.5, 0.5], &uniform, 1, 0.0).is_err());
        assert!(mace_from(&r, &[0.5, 0.5], &[vec![0.5, 0.6], vec![0.5, 0.5]], 1, 0.01).is_err());
        assert!(mace_from(&r, &[0.5, 0.5], &[vec![1.0], vec![0.5, 0.5]], 1, 0.01).is_err());
        let mut changed = r.clone();
        changed.items[1].push(None);
        assert!(matches!(mace(&changed, cfg), Err(MetricError::LengthMismatch { .. })));
    }

    /// Unanimous raters, in both modes: every label is the shared one, posteriors near 1,
    /// the fit is reproducible, and an unrated item gets the uniform prior and no label.
    /// (Variational Bayes's competence of a rater never wrong on n = 4 items is
    /// `exp(ψ(n + β) − ψ(n + α + β))`, about 0.9, not near 1 as EM's.)
    #[test]
    fn unanimous_raters() {
        for (cfg, least) in [(MaceConfig::em(), 0.99), (MaceConfig::default(), 0.85)] {
            let r = ratings(
                3,
                &[
                    &[Some(0), Some(0), Some(0)],
                    &[Some(2), Some(2), Some(2)],
                    &[Some(1), Some(1), Some(1)],
                    &[None, None, None],
                    &[Some(2), Some(2), Some(2)],
                ],
            );
            let m = mace(&r, cfg).unwrap();
            assert_eq!(m.labels, vec![Some(0), Some(2), Some(1), None, Some(2)]);
            assert_eq!(m.posteriors[3], vec![1.0 / 3.0; 3]);
            assert!(m.posteriors[0][0] > 0.99, "{m:?}");
            assert!(m.competence.iter().all(|&c| c > least), "{m:?}");
            assert!(m.log_likelihood.is_finite() && m.converged && m.restarts == 10);
            assert_eq!(m, mace(&r, cfg).unwrap());
            for row in m.spamming.iter().chain(&m.posteriors) {
                assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-12);
            }
        }
    }

    /// ψ at published values (Abramowitz & Stegun 6.3.2, 6.3.3, 6.3.2 with the recurrence
    /// 6.3.5, and the series 6.3.14 near 0): ψ(1) = −γ, ψ(½) = −γ − 2 ln 2, ψ(10) = H₉ − γ = 2.251752589066721.
    #[test]
    fn digamma_published_values() {
        use std::f64::consts::PI;
        let gamma = 0.577_215_664_901_532_9;
        for (x, want) in [
            (1.0, -gamma),
            (0.5, -gamma - 2.0 * std::f64::consts::LN_2),
            (10.0, 2.251_752_589_066_721),
            // A&S 6.3.14: ψ(1 + x) = −γ + ζ(2)x − ζ(3)x² + ζ(4)x³ − …, and ψ(x) = ψ(1 + x) − 1/x.
            (
                1e-3,
                -1000.0 - gamma + PI.powi(2) / 6.0 * 1e-3 - 1.202_056_903_159_594 * 1e-6
                    + PI.powi(4) / 90.0 * 1e-9,
            ),
        ] {
            let got = digamma(x);
            assert!((got - want).abs() < 1e-12 * want.abs().max(1.0), "ψ({x}) = {got}, not {want}");
        }
        assert!(digamma(0.0).is_nan() && digamma(-1.0).is_nan());
    }

    /// A posterior tie goes to the lowest category; one category is a trivial fit.
    #[test]
    fn ties_and_one_category() {
        let r = ratings(2, &[&[Some(1), Some(0)]]);
        let m = mace_from(&r, &[0.5, 0.5], &[vec![0.5, 0.5], vec![0.5, 0.5]], 0, 0.01).unwrap();
        assert_eq!(m.posteriors[0], vec![0.5, 0.5]);
        assert_eq!(m.labels, vec![Some(0)]);
        assert_eq!((m.iterations, m.converged), (0, false));
        let one = ratings(1, &[&[Some(0), None], &[Some(0), Some(0)]]);
        let m = mace(&one, MaceConfig::em()).unwrap();
        assert_eq!(m.labels, vec![Some(0), Some(0)]);
        assert!(m.log_likelihood.abs() < 1e-12);
    }
}

//! The judges' figures: a pure function of what they labelled and the human labels.
//!
//! - **Human truth** of a unit ([`super::truth`]): from the labels of provenance `human`
//!   only, by the benchmark's `human_truth` — the annotators' majority (a tie is no truth,
//!   counted and named), or MACE over the annotators (variational Bayes or EM). Agreement
//!   among annotators is Krippendorff's α over the units with two or more human labels,
//!   and their pairwise disagreement beside each judge's ([`super::truth::pairwise_disagreement`]).
//!   Labels of other provenance (`llm:<model>`, `rule`) are measured against under their
//!   own name ([`SourceFigures`]).
//! - **Per judge against humans** ([`VsHuman`]): the confusion matrix (rows truth, columns
//!   judge), accuracy and error rate with Wilson 95% intervals over the units with a
//!   verdict, with their coverage, and the same over every unit with a truth where no
//!   verdict (judge error, panel tie) never matches; Cohen's κ with a bootstrap interval
//!   — HypoTermQA's Appendix V. Over every unit with a truth, rule-labelled ones included,
//!   the error rate and the favourable share beside the human one per item group
//!   ([`ScoreVsHuman`], HypoTermQA §4.4 / Figure 4).
//! - **Between judges**: pairwise Cohen's κ over the units both judged, Fleiss' κ (units
//!   every judge judged) and Krippendorff's α (nominal, missing verdicts allowed), each
//!   with a bootstrap interval over questions ([`super::clusters`]); with human truth, the
//!   phi correlation of the judges' errors and the judges' majority beside the accuracy
//!   of independent judges ([`super::between`]).
//! - **Panel**: its verdict per unit ([`Verdict`]) and the same figures against humans;
//!   MACE's competence per judge and whether its EM converged.
//! - **Leniency** and **self-preference** (HypoTermQA §4.3), separate rows
//!   ([`super::preference`]): a judge's favourable share against each other judge's, and
//!   the interaction — its excess on its own model's answers minus its excess elsewhere.

use std::collections::{BTreeMap, HashMap};

use halyard_pipelines::metrics::agreement::{
    error_correlations, majority, ConfusionMatrix, Majority, Ratings,
};
use halyard_pipelines::metrics::interval::{bootstrap_by, Bootstrap};
use halyard_pipelines::metrics::mace::{mace, MaceConfig};
use serde::{Deserialize, Serialize};

pub use super::figure::{Figure, MaceSummary};
use super::truth::{
    annotator_name, human_truth, pairwise_disagreement, HumanTruth, PairwiseDisagreement,
    Provenance,
};
use super::{clusters, HumanLabel, HumanLabels, Judged, UnitKey, Verdict};

/// Units listed in `disagreements` at most (the count says how many there were).
pub const DISAGREEMENTS_LISTED: usize = 2000;
/// Unknown human labels listed at most (all are counted).
pub const UNKNOWN_LISTED: usize = 50;
/// Characters of a question or answer kept in the disagreement list.
const TEXT_KEPT: usize = 1500;

/// A labeller (judge or panel) against human truth (or against another label source).
///
/// Two denominators, both shown: the units where it gave a verdict (`n`: `accuracy`,
/// `error_rate`, `kappa`, the confusion matrix) and every unit with a truth (`units`:
/// `accuracy_all`, `error_rate_all`, where no verdict — a tie, a judge error — is an
/// outcome of its own that never matches the truth). `coverage` = n / units. A panel
/// and a single judge compare on the same units only in the all-units figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VsHuman {
    /// The truth these figures use (`majority`, `mace`, `mace-em`; or the source's name).
    #[serde(default)]
    pub truth: String,
    /// Units with a truth.
    #[serde(default)]
    pub units: u64,
    /// Units with both a truth and this labeller's label.
    pub n: u64,
    /// Units with a truth that this labeller left without a label.
    pub unlabelled: u64,
    pub confusion: ConfusionMatrix,
    /// Over the `n` units with a verdict.
    pub accuracy: Figure,
    pub error_rate: Figure,
    pub kappa: Figure,
    /// n / units (Wilson).
    pub coverage: Figure,
    /// Right / units: no verdict counts as not right (Wilson).
    pub accuracy_all: Figure,
    /// (wrong + no verdict) / units (Wilson).
    pub error_rate_all: Figure,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JudgeFigures {
    pub judge: String,
    /// Units it labelled.
    pub labelled: u64,
    /// Units it gave no usable label (judge errors).
    pub missing: u64,
    /// How many of its labels fell in each category.
    pub distribution: Vec<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vs_human: Option<VsHuman>,
    /// MACE's estimate of its competence (probability of not spamming), with `mace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mace_competence: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PairKappa {
    pub a: String,
    pub b: String,
    pub n: u64,
    pub kappa: Figure,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Between {
    pub pairwise_kappa: Vec<PairKappa>,
    pub fleiss_kappa: Figure,
    pub krippendorff_alpha: Figure,
    /// Per pair of judges, the phi correlation of their errors against human truth
    /// (`null`: undefined), in judge order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_correlation: Option<Vec<Vec<Option<f64>>>>,
    /// With a truth: the judges' majority against it beside what the same judges would
    /// reach erring independently (issue 45: replaces the "effective number of judges").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub panel_vs_independence: Option<super::between::PanelIndependence>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PanelFigures {
    pub verdict: Verdict,
    /// Units with a verdict.
    pub decided: u64,
    /// Majority: units where the top labels tie (no verdict).
    pub ties: u64,
    /// Units no judge labelled.
    pub unjudged: u64,
    pub distribution: Vec<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mace: Option<MaceSummary>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vs_human: Option<VsHuman>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UnknownLabel {
    #[serde(flatten)]
    pub key: UnitKey,
    pub source: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HumanFigures {
    pub files: Vec<String>,
    /// Human labels (provenance `human`; other sources are in `sources`).
    pub labels: u64,
    pub annotators: u64,
    /// How a unit's labels become its truth.
    pub truth: HumanTruth,
    /// Units of this run (rule-labelled ones included) with a human label.
    pub labelled_units: u64,
    /// Units of this run with a human truth.
    pub units_with_truth: u64,
    /// `majority`: units whose annotators tie (no truth), left out of every figure.
    pub annotator_ties: u64,
    /// `mace`/`mace-em`: each annotator's competence and the fit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mace: Option<HumanMace>,
    /// Judge–annotator and annotator–annotator disagreement (two or more named
    /// annotators).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pairwise: Option<PairwiseDisagreement>,
    /// Labels naming a unit this run did not judge: counted, the first listed.
    pub unknown: u64,
    pub unknown_listed: Vec<UnknownLabel>,
    /// Krippendorff's α among annotators (units with two or more human labels).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inter_annotator_alpha: Option<Figure>,
    /// Units with two or more human labels.
    pub multiply_annotated: u64,
}

/// MACE over the human annotators.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HumanMace {
    /// (annotator, competence), in the order annotators first appear.
    pub competence: Vec<(String, f64)>,
    pub fit: MaceSummary,
}

/// Labels from a source other than people (`llm:<model>`, `rule`, `unstated`): the judges
/// and the panel measured against them, under that name, never as human truth.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SourceFigures {
    pub provenance: Provenance,
    pub labels: u64,
    /// Units of this run with a label from it.
    pub units: u64,
    /// Its labels naming a unit this run did not judge (counted, never dropped silently).
    #[serde(default)]
    pub unknown: u64,
    /// Per judge (in judge order), agreement with these labels.
    pub per_judge: Vec<VsHuman>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub panel: Option<VsHuman>,
}

/// One labeller's share of the favourable label in one group, beside the human share on
/// the same units, and their paired difference.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GroupShare {
    pub group: String,
    pub units: u64,
    /// Of them, units the labeller gave the favourable label.
    pub labeller: u64,
    /// Of them, units whose human truth is the favourable label.
    pub human: u64,
    /// (labeller − human) / units, with a percentile interval from a paired bootstrap
    /// over items (a question's answers are resampled together).
    pub difference: Figure,
}

/// A labeller over every unit with a human truth, rule-labelled ones included (there its
/// label is the rule's): HypoTermQA §4.4 / Figure 4.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScoreVsHuman {
    pub labeller: String,
    pub truth: HumanTruth,
    /// The label whose share the groups compare (HypoTermQA's `valid`).
    pub favourable: String,
    /// Units with a human truth.
    pub units: u64,
    /// Of them, labelled by rule.
    pub ruled: u64,
    /// Of them, left without a verdict (`judge_error`, a panel's tie): never right.
    pub no_verdict: u64,
    /// Labelled otherwise than the truth (no verdict included).
    pub wrong: u64,
    /// wrong / units, Wilson 95%.
    pub error_rate: Figure,
    /// The favourable label's share per item group (HypoTermQA: `hypothetical` — its
    /// HTS — and `valid`).
    pub groups: Vec<GroupShare>,
}

pub use super::preference::{Excess, Leniency, SelfPreference};

/// A unit the judges (or judges and human) disagree on, for report.html.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Disagreement {
    #[serde(flatten)]
    pub key: UnitKey,
    pub question: String,
    pub answer: Option<String>,
    /// Per judge, its label (`null`: none).
    pub votes: Vec<Option<String>>,
    pub panel: Option<String>,
    pub human: Option<String>,
}

/// The judges of one benchmark, measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JudgeReport {
    pub benchmark: usize,
    pub pipeline: String,
    pub unit: String,
    pub categories: Vec<String>,
    pub judges: Vec<String>,
    pub units: u64,
    pub per_judge: Vec<JudgeFigures>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub between: Option<Between>,
    pub panel: PanelFigures,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub human: Option<HumanFigures>,
    /// Agreement with label sources that are not people, each under its provenance.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<SourceFigures>,
    /// Per judge and the panel, over every unit with a human truth (§4.4).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub score_vs_human: Vec<ScoreVsHuman>,
    /// Per judge, its favourable rate against the other judges' on the same units.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leniency: Vec<Leniency>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub self_preference: Vec<SelfPreference>,
    /// Units where judges disagree or a judge disagrees with the human truth.
    pub disagreements_total: u64,
    pub disagreements: Vec<Disagreement>,
}

/// The panel's verdict per unit (`None`: no verdict), with MACE's per-judge competence.
pub struct PanelVerdicts {
    pub labels: Vec<Option<usize>>,
    pub ties: u64,
    pub mace: Option<(Vec<f64>, MaceSummary)>,
}

/// The panel's verdict on every unit of `j`.
pub fn verdicts(j: &Judged) -> PanelVerdicts {
    let k = j.categories.len();
    match &j.verdict {
        Verdict::Majority => {
            let mut ties = 0;
            let labels = j
                .units
                .iter()
                .map(|u| match majority(&u.votes) {
                    Majority::Label(c) => Some(c),
                    Majority::Tie(_) => {
                        ties += 1;
                        None
                    }
                    Majority::Unrated => None,
                })
                .collect();
            PanelVerdicts { labels, ties, mace: None }
        }
        Verdict::Primary { judge } => {
            let at = j.judges.iter().position(|s| s.name == *judge).unwrap_or(0);
            let labels = j.units.iter().map(|u| u.votes.get(at).copied().flatten()).collect();
            PanelVerdicts { labels, ties: 0, mace: None }
        }
        Verdict::Mace => {
            let cfg = MaceConfig::default();
            let rows: Vec<Vec<Option<usize>>> = j.units.iter().map(|u| u.votes.clone()).collect();
            match Ratings::new(k, rows).and_then(|r| mace(&r, cfg)) {
                Ok(m) => {
                    let summary = MaceSummary::of(&m, cfg);
                    PanelVerdicts { labels: m.labels, ties: 0, mace: Some((m.competence, summary)) }
                }
                // No unit judged at all: no verdict anywhere.
                Err(_) => PanelVerdicts { labels: vec![None; j.units.len()], ties: 0, mace: None },
            }
        }
    }
}

/// `labels` against `truth` (named `truth_name`), per unit.
///
/// `items[i]` is unit i's question (its cluster): rates get Wilson's interval when every
/// question holds one unit, else a bootstrap over questions ([`clusters::proportion_ci`]);
/// κ a bootstrap over questions.
fn vs_human(
    k: usize,
    truth_name: &str,
    truth: &[Option<usize>],
    labels: &[Option<usize>],
    items: &[&str],
    cfg: Bootstrap,
) -> Option<VsHuman> {
    let (mut t, mut p, mut unlabelled) = (Vec::new(), Vec::new(), 0u64);
    // Per unit with a truth: its question, whether it has a verdict, whether it is right.
    let (mut at, mut all_items, mut has, mut right) = (vec![], vec![], vec![], vec![]);
    for ((h, l), item) in truth.iter().zip(labels).zip(items) {
        match (h, l) {
            (Some(h), Some(l)) => {
                t.push(*h);
                p.push(*l);
                at.push(*item);
            }
            (Some(_), None) => unlabelled += 1,
            _ => {}
        }
        if let Some(h) = h {
            all_items.push(*item);
            has.push(l.is_some());
            right.push(*l == Some(*h));
        }
    }
    if t.is_empty() && unlabelled == 0 {
        return None;
    }
    // A labeller that labelled none of the units with a truth keeps its row (all its
    // verdicts are missing there), with an empty matrix.
    let confusion = if t.is_empty() {
        ConfusionMatrix { categories: k, counts: vec![vec![0; k]; k] }
    } else {
        ConfusionMatrix::from_pairs(k, &t, &p).ok()?
    };
    let n = t.len() as u64;
    let units = n + unlabelled;
    let hits: Vec<bool> = t.iter().zip(&p).map(|(a, b)| a == b).collect();
    let misses: Vec<bool> = hits.iter().map(|h| !h).collect();
    let wrong_all: Vec<bool> = right.iter().map(|r| !r).collect();
    let rate = |x: &[bool], at: &[&str]| Figure::of(clusters::proportion_ci(x, at, cfg));
    Some(VsHuman {
        truth: truth_name.to_string(),
        units,
        n,
        unlabelled,
        accuracy: rate(&hits, &at),
        error_rate: rate(&misses, &at),
        kappa: Figure::of(clusters::kappa_ci(k, &t, &p, &at, cfg)),
        coverage: rate(&has, &all_items),
        accuracy_all: rate(&right, &all_items),
        error_rate_all: rate(&wrong_all, &all_items),
        confusion,
    })
}

/// Each labeller (judges, then the panel) over every unit with a truth, rule-labelled
/// units included, and its favourable-label share per item group beside the human share.
fn score_vs_human(
    j: &Judged,
    rule: HumanTruth,
    truth_all: &[Option<usize>],
    labellers: &[(String, Vec<Option<usize>>)],
    cfg: Bootstrap,
) -> Vec<ScoreVsHuman> {
    let Some(fav) = j.favourable else { return Vec::new() };
    let keys: Vec<&UnitKey> =
        j.units.iter().map(|u| &u.key).chain(j.ruled.iter().map(|r| &r.key)).collect();
    let group_of = |key: &UnitKey| j.item_groups.get(&key.item).cloned();
    let mut groups: Vec<String> = Vec::new();
    for (key, t) in keys.iter().zip(truth_all) {
        let g = group_of(key).unwrap_or_else(|| "all".into());
        if t.is_some() && !groups.contains(&g) {
            groups.push(g);
        }
    }
    groups.sort();
    let mut out = Vec::new();
    for (name, labels) in labellers {
        let rule_labels = j.ruled.iter().map(|r| Some(r.label));
        let labels: Vec<Option<usize>> = labels.iter().copied().chain(rule_labels).collect();
        let (mut units, mut ruled, mut no_verdict, mut wrong) = (0u64, 0u64, 0u64, 0u64);
        let (mut misses, mut at): (Vec<bool>, Vec<&str>) = (Vec::new(), Vec::new());
        for (n, (t, l)) in truth_all.iter().zip(&labels).enumerate() {
            let Some(t) = t else { continue };
            misses.push(*l != Some(*t));
            at.push(keys[n].item.as_str());
            units += 1;
            ruled += u64::from(n >= j.units.len());
            no_verdict += u64::from(l.is_none());
            wrong += u64::from(*l != Some(*t));
        }
        if units == 0 {
            continue;
        }
        let shares = groups
            .iter()
            .map(|g| {
                // Per item (cluster): Σ (labeller favourable − human favourable), units.
                let mut cluster: BTreeMap<&str, (i64, u64)> = BTreeMap::new();
                let (mut n, mut lab, mut hum) = (0u64, 0u64, 0u64);
                for (key, (t, l)) in keys.iter().zip(truth_all.iter().zip(&labels)) {
                    let Some(t) = t else { continue };
                    if group_of(key).as_deref().unwrap_or("all") != g {
                        continue;
                    }
                    let (lf, hf) = (*l == Some(fav), *t == fav);
                    n += 1;
                    lab += u64::from(lf);
                    hum += u64::from(hf);
                    let c = cluster.entry(key.item.as_str()).or_default();
                    c.0 += i64::from(lf) - i64::from(hf);
                    c.1 += 1;
                }
                let c: Vec<(i64, u64)> = cluster.into_values().collect();
                let diff = bootstrap_by(c.len(), cfg, |idx| {
                    let (d, m) =
                        idx.iter().fold((0i64, 0u64), |(d, m), &i| (d + c[i].0, m + c[i].1));
                    (m > 0).then(|| d as f64 / m as f64)
                });
                GroupShare {
                    group: g.clone(),
                    units: n,
                    labeller: lab,
                    human: hum,
                    difference: Figure::of(diff),
                }
            })
            .collect();
        out.push(ScoreVsHuman {
            labeller: name.clone(),
            truth: rule,
            favourable: j.categories.get(fav).cloned().unwrap_or_default(),
            units,
            ruled,
            no_verdict,
            wrong,
            error_rate: Figure::of(clusters::proportion_ci(&misses, &at, cfg)),
            groups: shares,
        });
    }
    out
}

fn distribution(k: usize, labels: impl Iterator<Item = Option<usize>>) -> Vec<u64> {
    let mut d = vec![0u64; k];
    for c in labels.flatten() {
        if let Some(x) = d.get_mut(c) {
            *x += 1;
        }
    }
    d
}

/// Measure the judges of `j` against each other and against `human` (with the labels
/// that came with the dataset).
pub fn analyse(benchmark: usize, j: &Judged, human: &HumanLabels) -> JudgeReport {
    let k = j.categories.len();
    let cfg = Bootstrap::default();
    let n_judges = j.judges.len();
    let names: Vec<String> = j.judges.iter().map(|s| s.name.clone()).collect();
    let panel = verdicts(j);

    // Labels: one per (unit, annotator, provenance): the same file given in the sweep
    // and imported, or an annotator who labelled a unit twice, counts once (the later
    // line wins).
    let mut all_labels: Vec<HumanLabel> = Vec::new();
    let mut named: HashMap<(UnitKey, String, Provenance), usize> = HashMap::new();
    for l in j.dataset_labels.iter().chain(&human.labels) {
        match &l.annotator {
            Some(a) => match named.entry((l.key.clone(), a.clone(), l.provenance.clone())) {
                std::collections::hash_map::Entry::Occupied(e) => all_labels[*e.get()] = l.clone(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(all_labels.len());
                    all_labels.push(l.clone());
                }
            },
            None => all_labels.push(l.clone()),
        }
    }
    let human_only: Vec<&HumanLabel> =
        all_labels.iter().filter(|l| l.provenance.is_human()).collect();
    // Units, then rule-labelled outputs: human labels on either count.
    let mut index: HashMap<&UnitKey, usize> =
        j.units.iter().enumerate().map(|(n, u)| (&u.key, n)).collect();
    for (n, r) in j.ruled.iter().enumerate() {
        index.entry(&r.key).or_insert(j.units.len() + n);
    }
    let n_all = j.units.len() + j.ruled.len();
    let rule = human.truth;
    let fitted = human_truth(rule, k, &human_only, &index, n_all);
    let truth_all = fitted.labels.clone();
    let truth: Vec<Option<usize>> = truth_all[..j.units.len()].to_vec();
    let mut by_key: BTreeMap<&UnitKey, Vec<usize>> = BTreeMap::new();
    for l in &human_only {
        by_key.entry(&l.key).or_default().push(l.label);
    }
    let mut multiply = 0u64;
    let mut annotator_rows: Vec<Vec<usize>> = Vec::new();
    let mut annotator_items: Vec<&str> = Vec::new();
    for (key, ls) in &by_key {
        if index.contains_key(key) && ls.len() > 1 {
            multiply += 1;
            annotator_rows.push(ls.clone());
            annotator_items.push(key.item.as_str());
        }
    }
    let unknown: Vec<&HumanLabel> =
        all_labels.iter().filter(|l| !index.contains_key(&l.key)).collect();
    let has_human = !human_only.is_empty();
    let human_figs = has_human.then(|| {
        let annotators: std::collections::BTreeSet<String> =
            human_only.iter().map(|l| annotator_name(l)).collect();
        let width = annotator_rows.iter().map(Vec::len).max().unwrap_or(0);
        let alpha = (!annotator_rows.is_empty()).then(|| {
            let rows = annotator_rows
                .iter()
                .map(|r| (0..width).map(|i| r.get(i).copied()).collect())
                .collect();
            Figure::of(
                Ratings::new(k, rows).and_then(|r| clusters::alpha_ci(&r, &annotator_items, cfg)),
            )
        });
        let unit_votes: Vec<(&UnitKey, Vec<Option<usize>>)> =
            j.units.iter().map(|u| (&u.key, u.votes.clone())).collect();
        HumanFigures {
            files: human.files.iter().map(|f| f.display().to_string()).collect(),
            labels: human_only.len() as u64,
            annotators: annotators.len() as u64,
            truth: rule,
            labelled_units: fitted.labelled,
            units_with_truth: truth_all.iter().filter(|t| t.is_some()).count() as u64,
            annotator_ties: fitted.ties,
            mace: fitted
                .mace
                .as_ref()
                .map(|(c, fit)| HumanMace { competence: c.clone(), fit: fit.clone() }),
            pairwise: pairwise_disagreement(&names, &unit_votes, &human_only, cfg),
            unknown: unknown.len() as u64,
            unknown_listed: unknown
                .iter()
                .take(UNKNOWN_LISTED)
                .map(|l| UnknownLabel { key: l.key.clone(), source: l.source.clone() })
                .collect(),
            inter_annotator_alpha: alpha,
            multiply_annotated: multiply,
        }
    });
    let truth_name = rule.describe();
    let unit_items: Vec<&str> = j.units.iter().map(|u| u.key.item.as_str()).collect();
    let with_truth = truth.iter().any(Option::is_some);

    // Per judge.
    let mace_comp = panel.mace.as_ref().map(|(c, _)| c.clone());
    let per_judge: Vec<JudgeFigures> = (0..n_judges)
        .map(|jj| {
            let votes: Vec<Option<usize>> = j.units.iter().map(|u| u.votes[jj]).collect();
            JudgeFigures {
                judge: names[jj].clone(),
                labelled: votes.iter().filter(|v| v.is_some()).count() as u64,
                missing: votes.iter().filter(|v| v.is_none()).count() as u64,
                distribution: distribution(k, votes.iter().copied()),
                vs_human: if with_truth {
                    vs_human(k, truth_name, &truth, &votes, &unit_items, cfg)
                } else {
                    None
                },
                mace_competence: mace_comp.as_ref().and_then(|c| c.get(jj).copied()),
            }
        })
        .collect();

    // Between judges.
    let between = (n_judges > 1).then(|| {
        let rows: Vec<Vec<Option<usize>>> = j.units.iter().map(|u| u.votes.clone()).collect();
        let ratings = Ratings::new(k, rows);
        // Intervals resample questions (passages), not units (issue 45).
        let items: Vec<&str> = j.units.iter().map(|u| u.key.item.as_str()).collect();
        let mut pairwise_kappa = Vec::new();
        for a in 0..n_judges {
            for b in a + 1..n_judges {
                let (mut x, mut y, mut at) = (Vec::new(), Vec::new(), Vec::new());
                for u in &j.units {
                    if let (Some(p), Some(q)) = (u.votes[a], u.votes[b]) {
                        x.push(p);
                        y.push(q);
                        at.push(u.key.item.as_str());
                    }
                }
                pairwise_kappa.push(PairKappa {
                    a: names[a].clone(),
                    b: names[b].clone(),
                    n: x.len() as u64,
                    kappa: Figure::of(clusters::kappa_ci(k, &x, &y, &at, cfg)),
                });
            }
        }
        let (fleiss_kappa, krippendorff_alpha, error_correlation, panel_vs_independence) =
            match &ratings {
                Ok(r) => (
                    Figure::of(clusters::fleiss_ci(r, &items, cfg)),
                    Figure::of(clusters::alpha_ci(r, &items, cfg)),
                    with_truth.then(|| error_correlations(r, &truth).ok()).flatten(),
                    with_truth
                        .then(|| super::between::panel_vs_independence(r, &truth, &items, cfg))
                        .flatten(),
                ),
                Err(e) => {
                    let u = || Figure::Undefined { undefined: e.to_string() };
                    (u(), u(), None, None)
                }
            };
        Between {
            pairwise_kappa,
            fleiss_kappa,
            krippendorff_alpha,
            error_correlation,
            panel_vs_independence,
        }
    });

    // The panel.
    let panel_figs = PanelFigures {
        verdict: j.verdict.clone(),
        decided: panel.labels.iter().filter(|l| l.is_some()).count() as u64,
        ties: panel.ties,
        unjudged: j.units.iter().filter(|u| u.votes.iter().all(Option::is_none)).count() as u64,
        distribution: distribution(k, panel.labels.iter().copied()),
        mace: panel.mace.as_ref().map(|(_, s)| s.clone()),
        vs_human: if with_truth {
            vs_human(k, truth_name, &truth, &panel.labels, &unit_items, cfg)
        } else {
            None
        },
    };

    // Label sources that are not people, each under its own name.
    let mut provenances: Vec<&Provenance> = Vec::new();
    for l in all_labels.iter().filter(|l| !l.provenance.is_human()) {
        if !provenances.contains(&&l.provenance) {
            provenances.push(&l.provenance);
        }
    }
    let sources: Vec<SourceFigures> = provenances
        .into_iter()
        .map(|p| {
            let ls: Vec<&HumanLabel> = all_labels.iter().filter(|l| l.provenance == *p).collect();
            let units_index: HashMap<&UnitKey, usize> =
                j.units.iter().enumerate().map(|(n, u)| (&u.key, n)).collect();
            let t = human_truth(HumanTruth::Majority, k, &ls, &units_index, j.units.len());
            let name = p.describe();
            SourceFigures {
                provenance: p.clone(),
                labels: ls.len() as u64,
                units: t.labelled,
                unknown: ls.iter().filter(|l| !units_index.contains_key(&l.key)).count() as u64,
                per_judge: (0..n_judges)
                    .filter_map(|jj| {
                        let votes: Vec<Option<usize>> =
                            j.units.iter().map(|u| u.votes[jj]).collect();
                        vs_human(k, &name, &t.labels, &votes, &unit_items, cfg)
                    })
                    .collect(),
                panel: vs_human(k, &name, &t.labels, &panel.labels, &unit_items, cfg),
            }
        })
        .collect();

    // Every unit with a human truth, rule-labelled ones included (HypoTermQA §4.4).
    let score_vs_human = if truth_all.iter().any(Option::is_some) {
        let mut labellers: Vec<(String, Vec<Option<usize>>)> = (0..n_judges)
            .map(|jj| (names[jj].clone(), j.units.iter().map(|u| u.votes[jj]).collect()))
            .collect();
        if n_judges > 1 {
            labellers.push((format!("panel ({})", j.verdict.describe()), panel.labels.clone()));
        }
        score_vs_human(j, rule, &truth_all, &labellers, cfg)
    } else {
        Vec::new()
    };

    let self_preference = super::preference::self_preference(j, cfg);
    let leniency = super::preference::leniency(j, cfg);

    // Disagreements.
    let name = |c: Option<usize>| c.and_then(|c| j.categories.get(c).cloned());
    let mut disagreements = Vec::new();
    let mut total = 0u64;
    for (n, u) in j.units.iter().enumerate() {
        let given: Vec<usize> = u.votes.iter().flatten().copied().collect();
        let judges_differ = given.windows(2).any(|w| w[0] != w[1]);
        let human_differs = truth[n].is_some_and(|t| given.iter().any(|&g| g != t));
        if !(judges_differ || human_differs) {
            continue;
        }
        total += 1;
        if disagreements.len() < DISAGREEMENTS_LISTED {
            disagreements.push(Disagreement {
                key: u.key.clone(),
                question: u.question.chars().take(TEXT_KEPT).collect(),
                answer: u.answer.as_ref().map(|a| a.chars().take(TEXT_KEPT).collect()),
                votes: u.votes.iter().map(|v| name(*v)).collect(),
                panel: name(panel.labels[n]),
                human: name(truth[n]),
            });
        }
    }

    JudgeReport {
        benchmark,
        pipeline: j.pipeline.to_string(),
        unit: j.unit.to_string(),
        categories: j.categories.clone(),
        judges: names,
        units: j.units.len() as u64,
        per_judge,
        between,
        panel: panel_figs,
        human: human_figs,
        sources,
        score_vs_human,
        leniency,
        self_preference,
        disagreements_total: total,
        disagreements,
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::judging::Unit;

    use crate::judging::test_spec as spec;

    fn unit(item: usize, model: &str, votes: [Option<usize>; 3]) -> Unit {
        Unit {
            key: UnitKey { item: item.to_string(), model: model.into(), part: None },
            question: format!("q{item}"),
            answer: Some("a".into()),
            votes: votes.to_vec(),
        }
    }

    fn judged(units: Vec<Unit>, verdict: Verdict) -> Judged {
        Judged {
            pipeline: "hypotermqa",
            unit: "answer",
            part: None,
            categories: vec!["valid".into(), "hallucination".into()],
            favourable: Some(0),
            judges: vec![spec("a"), spec("b"), spec("self")],
            answerers: vec![spec("m"), spec("self")],
            verdict,
            units,
            dataset_labels: Vec::new(),
            ruled: Vec::new(),
            item_groups: Default::default(),
        }
    }

    fn label(item: usize, model: &str, label: usize, who: &str) -> HumanLabel {
        HumanLabel {
            key: UnitKey { item: item.to_string(), model: model.into(), part: None },
            label,
            annotator: Some(who.into()),
            source: format!("h:{item}"),
            provenance: Provenance::Human,
        }
    }

    /// The judge "self" calls every answer of its own model valid, which a and b call
    /// hallucinations half of the time: self-preference positive; a human label for an
    /// unjudged item is counted; a two-two split among annotators gives no truth.
    #[test]
    fn self_preference_unknown_labels_and_ties() {
        let mut units = Vec::new();
        for i in 0..40 {
            let h = i % 2;
            units.push(unit(i, "self", [Some(h), Some(h), Some(0)]));
            units.push(unit(i, "m", [Some(h), Some(h), Some(h)]));
        }
        let j = judged(units, Verdict::Majority);
        let mut human = HumanLabels::default();
        for i in 0..40 {
            human.labels.push(label(i, "m", i % 2, "h1"));
        }
        human.labels.push(label(999, "m", 0, "h1"));
        human.labels.push(label(0, "self", 0, "h1"));
        human.labels.push(label(0, "self", 1, "h2"));
        let r = analyse(0, &j, &human);
        let sp = &r.self_preference;
        assert_eq!(sp.len(), 1, "{sp:?}");
        // On its own answers it leads a and b by half; on m's it agrees with them.
        let own = sp[0].own.as_ref().unwrap();
        assert_eq!((sp[0].judge.as_str(), own.units, sp[0].questions_paired), ("self", 40, 40));
        assert_eq!((own.judge_rate, own.others_rate), (1.0, 0.5));
        assert_eq!(sp[0].elsewhere.as_ref().unwrap().excess.estimate(), Some(0.0));
        assert!(sp[0].significant && sp[0].difference.estimate() == Some(0.5), "{sp:?}");
        let h = r.human.as_ref().unwrap();
        assert_eq!((h.unknown, h.annotator_ties, h.units_with_truth), (1, 1, 40));
        assert_eq!(h.unknown_listed[0].key.item, "999");
        // Against the 40 labelled answers of "m" every judge is right.
        for pj in &r.per_judge {
            let v = pj.vs_human.as_ref().unwrap();
            assert_eq!((v.n, v.confusion.agreements()), (40, 40), "{}", pj.judge);
        }
        // Disagreements: the 20 answers of "self" where a and b say hallucination.
        assert_eq!(r.disagreements_total, 20);
        assert_eq!(r.disagreements[0].votes.len(), 3);
        assert_eq!(r.panel.ties, 0);
    }

    #[test]
    fn majority_ties_and_primary() {
        let units = vec![
            unit(0, "m", [Some(0), Some(1), None]),
            unit(1, "m", [Some(1), Some(1), Some(0)]),
            unit(2, "m", [None, None, None]),
        ];
        let r = analyse(0, &judged(units.clone(), Verdict::Majority), &HumanLabels::default());
        assert_eq!((r.panel.ties, r.panel.decided, r.panel.unjudged), (1, 1, 1));
        let p = verdicts(&judged(units, Verdict::Primary { judge: "b".into() }));
        assert_eq!(p.labels, vec![Some(1), Some(1), None]);
    }
}

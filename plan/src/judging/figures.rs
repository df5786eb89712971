//! The judges' figures: a pure function of what they labelled and the human labels.
//!
//! - **Human truth** of a unit: the label of its annotators (their majority when they
//!   differ; a tie is no truth, counted). Agreement among annotators is Krippendorff's α
//!   over the units with two or more labels (α needs no annotator identity).
//! - **Per judge against humans**: the confusion matrix (rows human, columns judge),
//!   accuracy and error rate with Wilson 95% intervals, Cohen's κ with a bootstrap
//!   interval — HypoTermQA's Figure 4 and Appendix V. A judge's missing verdict (judge
//!   error) is counted apart, not as an error.
//! - **Between judges**: pairwise Cohen's κ over the units both judged, Fleiss' κ (units
//!   every judge judged) and Krippendorff's α (nominal, missing verdicts allowed), each
//!   with a bootstrap interval over units; with human truth, the phi correlation of the
//!   judges' errors and the panel's effective number of independent judges.
//! - **Panel**: its verdict per unit ([`Verdict`]) and the same figures against humans;
//!   MACE's competence per judge and whether its EM converged.
//! - **Self-preference** (HypoTermQA §4.3): for a judge that is also a model under test,
//!   on its own model's answers, how often it gives the favourable label against how
//!   often the other judges' majority does: McNemar's exact test with Newcombe's interval
//!   of the difference (positive: it favours itself).

use std::collections::{BTreeMap, HashMap};

use halyard_pipelines::metrics::agreement::{
    cohen_kappa_ci, effective_raters, error_correlations, fleiss_kappa_ci, krippendorff_alpha_ci,
    majority, ConfusionMatrix, Majority, Ratings,
};
use halyard_pipelines::metrics::interval::{wilson, Bootstrap, Interval};
use halyard_pipelines::metrics::mace::{mace, MaceConfig};
use halyard_pipelines::metrics::paired::{mcnemar, PairedTest};
use serde::{Deserialize, Serialize};

use super::{same_model, HumanLabel, HumanLabels, Judged, UnitKey, Verdict};

/// Units listed in `disagreements` at most (the count says how many there were).
pub const DISAGREEMENTS_LISTED: usize = 2000;
/// Unknown human labels listed at most (all are counted).
pub const UNKNOWN_LISTED: usize = 50;
/// Characters of a question or answer kept in the disagreement list.
const TEXT_KEPT: usize = 1500;

/// A figure with its interval, or why there is none (too few units, one class).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Figure {
    Value(Interval),
    Undefined { undefined: String },
}

impl Figure {
    fn of(r: Result<Interval, halyard_pipelines::metrics::MetricError>) -> Figure {
        match r {
            Ok(i) => Figure::Value(i),
            Err(e) => Figure::Undefined { undefined: e.to_string() },
        }
    }

    pub fn estimate(&self) -> Option<f64> {
        match self {
            Figure::Value(i) => Some(i.estimate),
            Figure::Undefined { .. } => None,
        }
    }
}

/// A labeller (judge or panel) against human truth.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VsHuman {
    /// Units with both a human truth and this labeller's label.
    pub n: u64,
    /// Units with a human truth that this labeller left without a label.
    pub unlabelled: u64,
    pub confusion: ConfusionMatrix,
    pub accuracy: Figure,
    pub error_rate: Figure,
    pub kappa: Figure,
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
    /// n / (1 + (n − 1)·ρ̄) from the mean error correlation ρ̄.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_judges: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MaceSummary {
    pub converged: bool,
    pub iterations: u32,
    pub restarts: u32,
    pub log_likelihood: f64,
    pub config: MaceConfig,
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
    pub labels: u64,
    pub annotators: u64,
    /// Units of this run with a human truth.
    pub units_with_truth: u64,
    /// Units whose annotators tie (no truth).
    pub annotator_ties: u64,
    /// Labels naming a unit this run did not judge: counted, the first listed.
    pub unknown: u64,
    pub unknown_listed: Vec<UnknownLabel>,
    /// Krippendorff's α among annotators (units with two or more human labels).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inter_annotator_alpha: Option<Figure>,
    /// Units with two or more human labels.
    pub multiply_annotated: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SelfPreference {
    pub judge: String,
    /// The model under test that is the judge's own model.
    pub model: String,
    pub favourable: String,
    /// Own-model units judged by it and by at least one other judge.
    pub n: u64,
    pub own_rate: f64,
    pub others_rate: f64,
    /// own − others, McNemar's exact test with Newcombe's interval.
    pub test: PairedTest,
    /// The same comparison on the other models' answers: a lenient judge leads there too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elsewhere: Option<PairedTest>,
}

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
                    let summary = MaceSummary {
                        converged: m.converged,
                        iterations: m.iterations,
                        restarts: m.restarts,
                        log_likelihood: m.log_likelihood,
                        config: cfg,
                    };
                    PanelVerdicts { labels: m.labels, ties: 0, mace: Some((m.competence, summary)) }
                }
                // No unit judged at all: no verdict anywhere.
                Err(_) => PanelVerdicts { labels: vec![None; j.units.len()], ties: 0, mace: None },
            }
        }
    }
}

/// Human truth per unit key: the annotators' majority; ties are `None`.
fn truth_by_key(labels: &[HumanLabel]) -> BTreeMap<&UnitKey, Vec<usize>> {
    let mut by: BTreeMap<&UnitKey, Vec<usize>> = BTreeMap::new();
    for l in labels {
        by.entry(&l.key).or_default().push(l.label);
    }
    by
}

fn vs_human(
    k: usize,
    truth: &[Option<usize>],
    labels: &[Option<usize>],
    cfg: Bootstrap,
) -> Option<VsHuman> {
    let (mut t, mut p, mut unlabelled) = (Vec::new(), Vec::new(), 0u64);
    for (h, l) in truth.iter().zip(labels) {
        match (h, l) {
            (Some(h), Some(l)) => {
                t.push(*h);
                p.push(*l);
            }
            (Some(_), None) => unlabelled += 1,
            _ => {}
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
    let agree = confusion.agreements();
    Some(VsHuman {
        n,
        unlabelled,
        accuracy: Figure::of(wilson(agree, n)),
        error_rate: Figure::of(wilson(n - agree, n)),
        kappa: Figure::of(cohen_kappa_ci(k, &t, &p, cfg)),
        confusion,
    })
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

    // Human truth per unit.
    // One label per (unit, annotator): the same file given in the sweep and imported, or
    // an annotator who labelled a unit twice, counts once (the later line wins).
    let mut all_human: Vec<HumanLabel> = Vec::new();
    let mut named: HashMap<(UnitKey, String), usize> = HashMap::new();
    for l in j.dataset_labels.iter().chain(&human.labels) {
        match &l.annotator {
            Some(a) => match named.entry((l.key.clone(), a.clone())) {
                std::collections::hash_map::Entry::Occupied(e) => all_human[*e.get()] = l.clone(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(all_human.len());
                    all_human.push(l.clone());
                }
            },
            None => all_human.push(l.clone()),
        }
    }
    let by_key = truth_by_key(&all_human);
    let index: HashMap<&UnitKey, usize> =
        j.units.iter().enumerate().map(|(n, u)| (&u.key, n)).collect();
    let mut truth: Vec<Option<usize>> = vec![None; j.units.len()];
    let (mut ties, mut multiply) = (0u64, 0u64);
    let mut annotator_rows: Vec<Vec<usize>> = Vec::new();
    for (key, ls) in &by_key {
        let Some(&u) = index.get(key) else { continue };
        let row: Vec<Option<usize>> = ls.iter().map(|&l| Some(l)).collect();
        match majority(&row) {
            Majority::Label(c) => truth[u] = Some(c),
            Majority::Tie(_) => ties += 1,
            Majority::Unrated => {}
        }
        if ls.len() > 1 {
            multiply += 1;
            annotator_rows.push(ls.clone());
        }
    }
    let unknown: Vec<&HumanLabel> =
        all_human.iter().filter(|l| !index.contains_key(&l.key)).collect();
    let has_human = !all_human.is_empty();
    let human_figs = has_human.then(|| {
        let annotators: std::collections::BTreeSet<String> = all_human
            .iter()
            .map(|l| l.annotator.clone().unwrap_or_else(|| format!("anonymous {}", l.source)))
            .collect();
        let width = annotator_rows.iter().map(Vec::len).max().unwrap_or(0);
        let alpha = (!annotator_rows.is_empty()).then(|| {
            let rows = annotator_rows
                .iter()
                .map(|r| (0..width).map(|i| r.get(i).copied()).collect())
                .collect();
            Figure::of(Ratings::new(k, rows).and_then(|r| krippendorff_alpha_ci(&r, cfg)))
        });
        HumanFigures {
            files: human.files.iter().map(|f| f.display().to_string()).collect(),
            labels: all_human.len() as u64,
            annotators: annotators.len() as u64,
            units_with_truth: truth.iter().filter(|t| t.is_some()).count() as u64,
            annotator_ties: ties,
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
                vs_human: if with_truth { vs_human(k, &truth, &votes, cfg) } else { None },
                mace_competence: mace_comp.as_ref().and_then(|c| c.get(jj).copied()),
            }
        })
        .collect();

    // Between judges.
    let between = (n_judges > 1).then(|| {
        let rows: Vec<Vec<Option<usize>>> = j.units.iter().map(|u| u.votes.clone()).collect();
        let ratings = Ratings::new(k, rows);
        let mut pairwise_kappa = Vec::new();
        for a in 0..n_judges {
            for b in a + 1..n_judges {
                let (mut x, mut y) = (Vec::new(), Vec::new());
                for u in &j.units {
                    if let (Some(p), Some(q)) = (u.votes[a], u.votes[b]) {
                        x.push(p);
                        y.push(q);
                    }
                }
                pairwise_kappa.push(PairKappa {
                    a: names[a].clone(),
                    b: names[b].clone(),
                    n: x.len() as u64,
                    kappa: Figure::of(cohen_kappa_ci(k, &x, &y, cfg)),
                });
            }
        }
        let (fleiss_kappa, krippendorff_alpha, error_correlation) = match &ratings {
            Ok(r) => (
                Figure::of(fleiss_kappa_ci(r, cfg)),
                Figure::of(krippendorff_alpha_ci(r, cfg)),
                with_truth.then(|| error_correlations(r, &truth).ok()).flatten(),
            ),
            Err(e) => {
                let u = || Figure::Undefined { undefined: e.to_string() };
                (u(), u(), None)
            }
        };
        let effective_judges =
            error_correlation.as_ref().and_then(|c| effective_raters(n_judges, c));
        Between {
            pairwise_kappa,
            fleiss_kappa,
            krippendorff_alpha,
            error_correlation,
            effective_judges,
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
        vs_human: if with_truth { vs_human(k, &truth, &panel.labels, cfg) } else { None },
    };

    let self_preference = self_preference(j);

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
        self_preference,
        disagreements_total: total,
        disagreements,
    }
}

/// Judge `jj`'s verdicts against the majority of the judges of models other than
/// `model` (a judge of the same model would share the preference being measured), on
/// `model`'s answers (`own`) or on the other models' answers: whether each gave the
/// favourable label `fav`. Answers the judge left without a verdict, or where the others
/// tie or gave none, are no comparison (counting them either way would move the
/// difference).
fn favour_pairs(
    j: &Judged,
    jj: usize,
    fav: usize,
    model: &halyard_pipelines::common::ModelSpec,
    own: bool,
) -> (Vec<bool>, Vec<bool>) {
    let (mut judge, mut others) = (Vec::new(), Vec::new());
    for u in j.units.iter().filter(|u| (u.key.model == model.name) == own) {
        let Some(v) = u.votes[jj] else { continue };
        let rest: Vec<Option<usize>> = u
            .votes
            .iter()
            .enumerate()
            .filter(|(o, _)| *o != jj && !same_model(&j.judges[*o], model))
            .map(|(_, v)| v.map(|c| usize::from(c == fav)))
            .collect();
        let Majority::Label(c) = majority(&rest) else { continue };
        judge.push(v == fav);
        others.push(c == 1);
    }
    (judge, others)
}

/// Every judge that is also a model under test, on that model's units, against the
/// judges of other models (none: no comparison); beside it the same comparison on the
/// other models' answers, where a judge that is merely lenient leads too.
fn self_preference(j: &Judged) -> Vec<SelfPreference> {
    let Some(fav) = j.favourable else { return Vec::new() };
    if j.judges.len() < 2 {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (jj, judge) in j.judges.iter().enumerate() {
        for model in j.answerers.iter().filter(|m| same_model(m, judge)) {
            let (own, others) = favour_pairs(j, jj, fav, model, true);
            let Ok(test) = mcnemar(&own, &others) else { continue };
            let rate = |x: &[bool]| x.iter().filter(|b| **b).count() as f64 / x.len() as f64;
            out.push(SelfPreference {
                judge: judge.name.clone(),
                model: model.name.clone(),
                favourable: j.categories[fav].clone(),
                n: own.len() as u64,
                own_rate: rate(&own),
                others_rate: rate(&others),
                test,
                elsewhere: {
                    let (judge, others) = favour_pairs(j, jj, fav, model, false);
                    mcnemar(&judge, &others).ok()
                },
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use halyard_pipelines::common::ModelSpec;
    use halyard_proto::ModelRef;

    use super::*;
    use crate::judging::Unit;

    fn spec(name: &str) -> ModelSpec {
        ModelSpec {
            name: name.into(),
            model_ref: ModelRef {
                backend: "openai".into(),
                endpoint: "http://x".into(),
                model: name.into(),
            },
            pool: name.into(),
            api_key_env: None,
            temperature: 0.0,
            max_tokens: None,
            seed: None,
            timeout_ms: 1000,
        }
    }

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
        }
    }

    fn label(item: usize, model: &str, label: usize, who: &str) -> HumanLabel {
        HumanLabel {
            key: UnitKey { item: item.to_string(), model: model.into(), part: None },
            label,
            annotator: Some(who.into()),
            source: format!("h:{item}"),
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
        assert_eq!((sp[0].judge.as_str(), sp[0].n), ("self", 40));
        assert_eq!((sp[0].own_rate, sp[0].others_rate), (1.0, 0.5));
        assert!(sp[0].test.significant && sp[0].test.difference.estimate > 0.0);
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

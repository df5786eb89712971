//! Human truth and where labels come from (issue 45).
//!
//! - **Provenance** of a label source: `human`, `llm:<model>` (a model labelled it, e.g.
//!   ChainPoll's COVID-QA and TriviaQA labels, GPT-4's), `rule` or `rule:<name>` (a rule
//!   decided it, e.g. ChainPoll's DROP labels: F1 = 0). Only `human` labels are human
//!   truth; agreement with any other source is reported under that source's name and
//!   never mixed into the inter-annotator figures.
//! - **Human truth** of a unit (`human_truth = "…"` in a benchmark): `majority` (the
//!   annotators' majority; a tie leaves the unit without truth, counted and named in every
//!   figure), `mace` (MACE over the annotators, variational Bayes as the MACE tool's
//!   default — the HVI paper's aggregation of its four annotators) or `mace-em` (MACE's
//!   EM). MACE gives every labelled unit a truth, ties included.
//! - **Pairwise disagreement** (ChainPoll's claim that GPT-4 "disagreed with annotators
//!   no more than annotators with each other"): the disagreement rate of every
//!   judge–annotator and annotator–annotator pair on the units both labelled, the pooled
//!   rate of each judge against the annotators beside the pooled rate among annotators,
//!   and their difference, all with percentile intervals from a bootstrap over items
//!   (a unit's item is its cluster: answers of several models to one question, or the
//!   sentences of one passage, are resampled together).

use std::collections::{BTreeMap, HashMap};

use halyard_pipelines::metrics::agreement::{majority, Majority, Ratings};
use halyard_pipelines::metrics::interval::{bootstrap_by, Bootstrap};
use halyard_pipelines::metrics::mace::{mace, MaceConfig};
use serde::{Deserialize, Serialize};

use super::figure::{Figure, MaceSummary};
use super::{HumanLabel, UnitKey};

/// Who or what gave a label.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Provenance {
    /// A person: human truth.
    #[default]
    Human,
    /// A model (`llm:gpt-4`).
    Llm(String),
    /// A rule (`rule`, or `rule:drop-f1`).
    Rule(Option<String>),
    /// Labels that came with a dataset whose provenance is not known to Halyard and not
    /// stated in the sweep: not human truth until stated.
    Unstated,
}

impl Provenance {
    /// `human`, `llm:<model>`, `rule` or `rule:<name>`; the error says what is allowed.
    pub fn parse(s: &str) -> Result<Provenance, String> {
        let t = s.trim();
        let bad = || {
            format!("{s:?} is not a provenance (\"human\", \"llm:<model>\", \"rule\" or \"rule:<name>\")")
        };
        match t {
            "human" => Ok(Provenance::Human),
            "rule" => Ok(Provenance::Rule(None)),
            _ => match t.split_once(':') {
                Some(("llm", m)) if !m.trim().is_empty() => Ok(Provenance::Llm(m.trim().into())),
                Some(("rule", r)) if !r.trim().is_empty() => {
                    Ok(Provenance::Rule(Some(r.trim().into())))
                }
                _ => Err(bad()),
            },
        }
    }

    /// As the report and the labels file spell it.
    pub fn describe(&self) -> String {
        match self {
            Provenance::Human => "human".into(),
            Provenance::Llm(m) => format!("llm:{m}"),
            Provenance::Rule(None) => "rule".into(),
            Provenance::Rule(Some(r)) => format!("rule:{r}"),
            Provenance::Unstated => "unstated".into(),
        }
    }

    pub fn is_human(&self) -> bool {
        *self == Provenance::Human
    }
}

impl Serialize for Provenance {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.describe())
    }
}

impl<'de> Deserialize<'de> for Provenance {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Provenance, D::Error> {
        let s = String::deserialize(d)?;
        if s == "unstated" {
            return Ok(Provenance::Unstated);
        }
        Provenance::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// How the human labels of a unit become its truth (`human_truth` in a benchmark).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HumanTruth {
    /// The annotators' majority; a tie is no truth.
    #[default]
    Majority,
    /// MACE over the annotators, the MACE tool's default fit (variational Bayes).
    Mace,
    /// MACE fitted by EM (the tool's `--em`).
    MaceEm,
}

/// The values `human_truth` takes.
pub const HUMAN_TRUTH_VALUES: &str = "\"majority\", \"mace\" or \"mace-em\"";

impl HumanTruth {
    /// A `human_truth` value; the error names the values allowed.
    pub fn parse(s: &str) -> Result<HumanTruth, String> {
        match s {
            "majority" => Ok(HumanTruth::Majority),
            "mace" => Ok(HumanTruth::Mace),
            "mace-em" => Ok(HumanTruth::MaceEm),
            other => Err(format!("{other:?} is not {HUMAN_TRUTH_VALUES}")),
        }
    }

    /// As the sweep and the report spell it.
    pub fn describe(self) -> &'static str {
        match self {
            HumanTruth::Majority => "majority",
            HumanTruth::Mace => "mace",
            HumanTruth::MaceEm => "mace-em",
        }
    }

    /// The MACE fit this truth uses (none for `majority`).
    pub fn mace_config(self) -> Option<MaceConfig> {
        match self {
            HumanTruth::Majority => None,
            HumanTruth::Mace => Some(MaceConfig::default()),
            HumanTruth::MaceEm => Some(MaceConfig::em()),
        }
    }
}

/// The human truth of a run's units.
#[derive(Clone, Debug, PartialEq)]
pub struct Truth {
    /// Per unit (in the order of the index given), its truth.
    pub labels: Vec<Option<usize>>,
    /// Units with at least one human label.
    pub labelled: u64,
    /// `majority`: units whose annotators tie (no truth).
    pub ties: u64,
    /// `mace`: each annotator's competence (annotator names in order) and the fit.
    pub mace: Option<(Vec<(String, f64)>, MaceSummary)>,
}

/// The name of a label's annotator (an anonymous line is an annotator of its own).
pub fn annotator_name(l: &HumanLabel) -> String {
    l.annotator.clone().unwrap_or_else(|| format!("anonymous {}", l.source))
}

/// The human truth of the `n` units of `index` from `labels` (human provenance only,
/// one per unit and annotator), by `rule`. MACE is fitted on every labelled unit (those
/// of other runs too: more evidence on each annotator), and read on the run's.
pub fn human_truth(
    rule: HumanTruth,
    k: usize,
    labels: &[&HumanLabel],
    index: &HashMap<&UnitKey, usize>,
    n: usize,
) -> Truth {
    let mut by: BTreeMap<&UnitKey, Vec<&HumanLabel>> = BTreeMap::new();
    for l in labels {
        by.entry(&l.key).or_default().push(l);
    }
    let mut out = Truth { labels: vec![None; n], labelled: 0, ties: 0, mace: None };
    for key in by.keys() {
        if index.contains_key(key) {
            out.labelled += 1;
        }
    }
    let Some(cfg) = rule.mace_config() else {
        for (key, ls) in &by {
            let Some(&u) = index.get(key) else { continue };
            let row: Vec<Option<usize>> = ls.iter().map(|l| Some(l.label)).collect();
            match majority(&row) {
                Majority::Label(c) => out.labels[u] = Some(c),
                Majority::Tie(_) => out.ties += 1,
                Majority::Unrated => {}
            }
        }
        return out;
    };
    let mut names: Vec<String> = Vec::new();
    let mut column: HashMap<String, usize> = HashMap::new();
    for ls in by.values() {
        for l in ls {
            let name = annotator_name(l);
            if !column.contains_key(&name) {
                column.insert(name.clone(), names.len());
                names.push(name);
            }
        }
    }
    let keys: Vec<&UnitKey> = by.keys().copied().collect();
    let rows: Vec<Vec<Option<usize>>> = by
        .values()
        .map(|ls| {
            let mut row = vec![None; names.len()];
            for l in ls {
                row[column[&annotator_name(l)]] = Some(l.label);
            }
            row
        })
        .collect();
    if let Ok(m) = Ratings::new(k, rows).and_then(|r| mace(&r, cfg)) {
        for (key, label) in keys.iter().zip(&m.labels) {
            if let Some(&u) = index.get(key) {
                out.labels[u] = *label;
            }
        }
        let summary = MaceSummary::of(&m, cfg);
        out.mace = Some((names.into_iter().zip(m.competence).collect(), summary));
    }
    out
}

/// The disagreement of two labellers on the units both labelled.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PairDisagreement {
    pub a: String,
    pub b: String,
    /// Units both labelled.
    pub n: u64,
    /// Of them, units where their labels differ.
    pub disagree: u64,
    /// disagree / n, with a percentile interval from a bootstrap over items.
    pub rate: Figure,
}

/// One judge against every annotator, beside the annotators among themselves.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JudgeVsAnnotators {
    pub judge: String,
    /// Per annotator, in annotator order.
    pub pairs: Vec<PairDisagreement>,
    /// Σ disagree / Σ n over its pairs.
    pub pooled: Figure,
    /// pooled − the annotators' pooled rate, bootstrapped over items together (positive:
    /// the judge disagrees with annotators more than they do with each other).
    pub minus_annotators: Figure,
}

/// ChainPoll's comparison: who disagrees with whom, and how often.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PairwiseDisagreement {
    /// Named annotators with human labels on this run's units.
    pub annotators: Vec<String>,
    pub annotator_pairs: Vec<PairDisagreement>,
    /// Σ disagree / Σ n over the annotator pairs.
    pub annotators_pooled: Figure,
    pub judges: Vec<JudgeVsAnnotators>,
}

/// Per cluster, (disagreements, comparisons).
type Counts = Vec<(u64, u64)>;

fn ratio(c: &Counts, idx: &[usize]) -> Option<f64> {
    let (d, n) = idx.iter().fold((0u64, 0u64), |(d, n), &i| (d + c[i].0, n + c[i].1));
    (n > 0).then(|| d as f64 / n as f64)
}

fn rate_figure(c: &Counts, cfg: Bootstrap) -> Figure {
    Figure::of(bootstrap_by(c.len(), cfg, |idx| ratio(c, idx)))
}

fn pair(a: &str, b: &str, c: &Counts, cfg: Bootstrap) -> PairDisagreement {
    let (disagree, n) = c.iter().fold((0, 0), |(d, n), x| (d + x.0, n + x.1));
    PairDisagreement { a: a.into(), b: b.into(), n, disagree, rate: rate_figure(c, cfg) }
}

/// Pairwise disagreement of `judges` (per unit, per judge: its label) with the named
/// annotators of `labels` (human, one per unit and annotator) and among the annotators.
/// Anonymous labels name no annotator to pair with and are left out. `None` with fewer
/// than two named annotators on the run's units.
pub fn pairwise_disagreement(
    judge_names: &[String],
    units: &[(&UnitKey, Vec<Option<usize>>)],
    labels: &[&HumanLabel],
    cfg: Bootstrap,
) -> Option<PairwiseDisagreement> {
    let at: HashMap<&UnitKey, usize> = units.iter().enumerate().map(|(n, u)| (u.0, n)).collect();
    let mut annotators: Vec<String> = Vec::new();
    // Per unit, per annotator (by position in `annotators`): its label.
    let mut given: Vec<BTreeMap<usize, usize>> = vec![BTreeMap::new(); units.len()];
    for l in labels {
        let (Some(name), Some(&u)) = (&l.annotator, at.get(&l.key)) else { continue };
        let a = match annotators.iter().position(|x| x == name) {
            Some(a) => a,
            None => {
                annotators.push(name.clone());
                annotators.len() - 1
            }
        };
        given[u].insert(a, l.label);
    }
    if annotators.len() < 2 {
        return None;
    }
    // Clusters: the units' items, in first-seen order.
    let mut cluster_of: HashMap<&str, usize> = HashMap::new();
    let unit_cluster: Vec<usize> = units
        .iter()
        .map(|(k, _)| {
            let next = cluster_of.len();
            *cluster_of.entry(k.item.as_str()).or_insert(next)
        })
        .collect();
    let clusters = cluster_of.len();
    let counts = |f: &dyn Fn(usize) -> Option<(u64, u64)>| -> Counts {
        let mut c = vec![(0u64, 0u64); clusters];
        for (u, &cl) in unit_cluster.iter().enumerate() {
            if let Some((d, n)) = f(u) {
                c[cl].0 += d;
                c[cl].1 += n;
            }
        }
        c
    };
    let both = |x: Option<usize>, y: Option<usize>| match (x, y) {
        (Some(x), Some(y)) => Some((u64::from(x != y), 1)),
        _ => None,
    };
    let mut annotator_pairs = Vec::new();
    let mut pooled_ann: Counts = vec![(0, 0); clusters];
    for a in 0..annotators.len() {
        for b in a + 1..annotators.len() {
            let c = counts(&|u| both(given[u].get(&a).copied(), given[u].get(&b).copied()));
            for (p, x) in pooled_ann.iter_mut().zip(&c) {
                p.0 += x.0;
                p.1 += x.1;
            }
            annotator_pairs.push(pair(&annotators[a], &annotators[b], &c, cfg));
        }
    }
    let judges = judge_names
        .iter()
        .enumerate()
        .map(|(j, name)| {
            let mut pooled: Counts = vec![(0, 0); clusters];
            let pairs = annotators
                .iter()
                .enumerate()
                .map(|(a, ann)| {
                    let c = counts(&|u| both(units[u].1[j], given[u].get(&a).copied()));
                    for (p, x) in pooled.iter_mut().zip(&c) {
                        p.0 += x.0;
                        p.1 += x.1;
                    }
                    pair(name, ann, &c, cfg)
                })
                .collect();
            let minus = bootstrap_by(clusters, cfg, |idx| {
                Some(ratio(&pooled, idx)? - ratio(&pooled_ann, idx)?)
            });
            JudgeVsAnnotators {
                judge: name.clone(),
                pairs,
                pooled: rate_figure(&pooled, cfg),
                minus_annotators: Figure::of(minus),
            }
        })
        .collect();
    Some(PairwiseDisagreement {
        annotators,
        annotator_pairs,
        annotators_pooled: rate_figure(&pooled_ann, cfg),
        judges,
    })
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::judging::figures::{analyse, Figure, VsHuman};
    use crate::judging::{HumanLabels, Judged, Ruled, Unit, Verdict};

    use crate::judging::test_spec as spec;

    fn key(item: usize, model: &str) -> UnitKey {
        UnitKey { item: item.to_string(), model: model.into(), part: None }
    }

    fn unit(item: usize, model: &str, votes: Vec<Option<usize>>) -> Unit {
        Unit { key: key(item, model), question: format!("q{item}"), answer: None, votes }
    }

    fn judged(judges: &[&str], categories: &[&str], units: Vec<Unit>) -> Judged {
        Judged {
            pipeline: "hypotermqa",
            unit: "answer",
            part: None,
            categories: categories.iter().map(|c| c.to_string()).collect(),
            favourable: Some(0),
            judges: judges.iter().map(|j| spec(j)).collect(),
            answerers: vec![spec("m")],
            verdict: Verdict::Majority,
            units,
            dataset_labels: Vec::new(),
            ruled: Vec::new(),
            item_groups: Default::default(),
        }
    }

    fn label(k: UnitKey, label: usize, who: &str, provenance: Provenance) -> HumanLabel {
        HumanLabel {
            source: format!("h:{}", k.item),
            key: k,
            label,
            annotator: Some(who.into()),
            provenance,
        }
    }

    fn est(f: &Figure) -> f64 {
        f.estimate().expect("a value")
    }

    fn bounds(f: &Figure) -> (f64, f64) {
        match f {
            Figure::Value(i) => i.bounds().expect("bounds"),
            Figure::Undefined { undefined } => panic!("undefined: {undefined}"),
        }
    }

    /// Issue 45 item 3, a designed simulation: 400 binary units, two judges each wrong on
    /// 60 (15%), wrong together on 9 = 400 · 0.15² (independent errors). The majority
    /// panel decides the 298 units where they agree (coverage 298/400 = 74.5%), right on
    /// 289 of them (96.98%), but right on only 289/400 = 72.25% of all units, below
    /// either judge (340/400 = 85%). Hand counts.
    #[test]
    fn coverage_of_two_independent_85pct_judges_in_a_majority_panel() {
        let truth = |i: usize| i % 2;
        let wrong_a = |i: usize| i < 60;
        let wrong_b = |i: usize| (51..111).contains(&i);
        let units = (0..400)
            .map(|i| {
                let v = |w: bool| Some(if w { 1 - truth(i) } else { truth(i) });
                unit(i, "m", vec![v(wrong_a(i)), v(wrong_b(i))])
            })
            .collect();
        let j = judged(&["a", "b"], &["valid", "hallucination"], units);
        let mut human = HumanLabels::default();
        for i in 0..400 {
            human.labels.push(label(key(i, "m"), truth(i), "h1", Provenance::Human));
        }
        let r = analyse(0, &j, &human);
        let a: &VsHuman = r.per_judge[0].vs_human.as_ref().unwrap();
        assert_eq!((a.units, a.n, a.unlabelled, a.truth.as_str()), (400, 400, 0, "majority"));
        assert!((est(&a.accuracy) - 340.0 / 400.0).abs() < 1e-12);
        assert!((est(&a.accuracy_all) - 340.0 / 400.0).abs() < 1e-12);
        let p = r.panel.vs_human.as_ref().unwrap();
        assert_eq!((p.units, p.n, p.unlabelled), (400, 298, 102));
        assert_eq!(r.panel.ties, 102);
        assert!((est(&p.accuracy) - 289.0 / 298.0).abs() < 1e-12, "{:?}", p.accuracy);
        assert!((est(&p.coverage) - 0.745).abs() < 1e-12);
        assert!((est(&p.accuracy_all) - 0.7225).abs() < 1e-12);
        assert!((est(&p.error_rate_all) - 111.0 / 400.0).abs() < 1e-12);
        // Wilson (1927) score interval of 289/298 by hand: p̂ = 0.969799, z = 1.959964,
        // centre (p̂ + z²/596)/(1 + z²/298) = 0.963820, half-width 0.020212.
        let (lo, hi) = bounds(&p.accuracy);
        assert!((lo - 0.943608).abs() < 1e-5 && (hi - 0.984031).abs() < 1e-5, "{lo} {hi}");
        // report.md names the truth and shows the coverage beside the panel's accuracy.
        let md = crate::judging::markdown(&r);
        assert!(md.contains("**Human truth: `majority`**"), "{md}");
        assert!(md.contains("| **panel (majority)** | 400 | 298 (74.5 ["), "{md}");
        assert!(md.contains("| 97.0 [") && md.contains("| 72.2 ["), "{md}");
    }

    /// Issue 45 item 4, a designed panel of four annotators (the HVI paper's setup): a
    /// and b always right, c wrong on the first 40 units, d a spammer who always says 1.
    /// Majority truth: the 20 units where c errs on a true 0 are 2–2 ties, left without
    /// truth (counted); MACE (both fits) finds d's spamming and gives every unit the
    /// designed truth. Each figure names its truth.
    #[test]
    fn mace_truth_resolves_the_ties_a_spammer_makes() {
        let truth = |i: usize| i % 2;
        let units = (0..200).map(|i| unit(i, "m", vec![Some(truth(i))])).collect();
        let j = judged(&["judge"], &["valid", "hallucination"], units);
        let mut human = HumanLabels::default();
        for i in 0..200 {
            let t = truth(i);
            for (who, l) in [("a", t), ("b", t), ("c", if i < 40 { 1 - t } else { t }), ("d", 1)] {
                human.labels.push(label(key(i, "m"), l, who, Provenance::Human));
            }
        }
        let r = analyse(0, &j, &human);
        let h = r.human.as_ref().unwrap();
        assert_eq!(
            (h.truth, h.annotator_ties, h.units_with_truth),
            (HumanTruth::Majority, 20, 180)
        );
        let v = r.per_judge[0].vs_human.as_ref().unwrap();
        assert_eq!((v.units, v.confusion.agreements(), v.truth.as_str()), (180, 180, "majority"));
        for rule in [HumanTruth::Mace, HumanTruth::MaceEm] {
            human.truth = rule;
            let r = analyse(0, &j, &human);
            let h = r.human.as_ref().unwrap();
            assert_eq!((h.annotator_ties, h.units_with_truth), (0, 200), "{rule:?}");
            let v = r.per_judge[0].vs_human.as_ref().unwrap();
            assert_eq!((v.units, v.confusion.agreements()), (200, 200), "{rule:?}");
            assert_eq!(v.truth, rule.describe());
            let m = h.mace.as_ref().unwrap();
            let comp = |who: &str| m.competence.iter().find(|(n, _)| n == who).unwrap().1;
            assert!(comp("d") < comp("c") && comp("c") < comp("a"), "{rule:?}: {m:?}");
        }
        assert!(HumanTruth::parse("vote").unwrap_err().contains("\"majority\", \"mace\""));
    }

    /// Issue 45 item 5: labels of a model (ChainPoll's COVID-QA: GPT-4) are no human
    /// truth. Two human annotators who agree everywhere have α = 1 whatever the GPT-4
    /// labels say; the judge's agreement with the GPT-4 labels is reported under
    /// `llm:gpt-4` (hand count: it differs from them on 10 of 50 units).
    #[test]
    fn labels_of_a_model_are_their_own_source_not_human_truth() {
        let units = (0..50).map(|i| unit(i, "dataset", vec![Some(i % 2)])).collect();
        let mut j = judged(&["judge"], &["no_hallucination", "hallucination"], units);
        let gpt4 = Provenance::parse("llm:gpt-4").unwrap();
        j.dataset_labels = (0..50)
            .map(|i| {
                label(
                    key(i, "dataset"),
                    if i < 10 { 1 - i % 2 } else { i % 2 },
                    "dataset",
                    gpt4.clone(),
                )
            })
            .collect();
        // A GPT-4 label naming an item this run did not judge: counted under its source.
        j.dataset_labels.push(label(key(999, "dataset"), 1, "dataset", gpt4.clone()));
        let mut human = HumanLabels::default();
        for i in 0..50 {
            for who in ["h1", "h2"] {
                human.labels.push(label(key(i, "dataset"), i % 2, who, Provenance::Human));
            }
        }
        let r = analyse(0, &j, &human);
        let h = r.human.as_ref().unwrap();
        assert_eq!((h.labels, h.annotators), (100, 2), "the dataset is no annotator");
        assert_eq!(h.inter_annotator_alpha.as_ref().and_then(Figure::estimate), Some(1.0));
        assert_eq!(r.per_judge[0].vs_human.as_ref().unwrap().confusion.agreements(), 50);
        assert_eq!(r.sources.len(), 1);
        let s = &r.sources[0];
        assert_eq!((s.provenance.describe().as_str(), s.units, s.unknown), ("llm:gpt-4", 50, 1));
        let v = &s.per_judge[0];
        assert_eq!((v.truth.as_str(), v.n, v.confusion.agreements()), ("llm:gpt-4", 50, 40));
        // Without human labels there is no human section at all.
        let r = analyse(0, &j, &HumanLabels::default());
        assert!(r.human.is_none() && r.score_vs_human.is_empty());
        assert_eq!(r.sources[0].per_judge[0].confusion.agreements(), 40);
        // Parsing.
        assert_eq!(Provenance::parse("rule").unwrap(), Provenance::Rule(None));
        assert_eq!(Provenance::parse("rule:drop-f1").unwrap().describe(), "rule:drop-f1");
        assert!(Provenance::parse("llm:").is_err() && Provenance::parse("person").is_err());
    }

    /// Issue 45 item 11, HypoTermQA §4.4 / Figure 4: one human label on each of 180
    /// answers (90 hypothetical questions, 90 valid; 30 of the valid answers include no
    /// term and are labelled `irrelevant` by rule). Judge a differs from the human on
    /// exactly 12: 4 hallucinations it calls valid (hypothetical), 2 judge errors and 4
    /// valid answers it calls hallucinations (valid), and 2 rule-labelled answers the
    /// human calls valid (every judge's label there is the rule's). Judge b differs only
    /// on those 2. Hand counts: a's error 12/180 = 6.67%, b's 2/180; a's HTS 34/90 against
    /// the human's 30/90 on the same answers (+4.44 points), on valid questions 54/90
    /// valid against 62/90 (−8.89 points).
    #[test]
    fn hypotermqa_4_4_judge_wrong_on_12_of_180() {
        let (valid, hall, irr) = (0, 1, 2);
        let human_of = |i: usize| match i {
            0..=89 => {
                if i.is_multiple_of(3) {
                    valid
                } else {
                    hall
                }
            }
            90..=149 => valid,
            150 | 151 => valid,
            _ => irr,
        };
        let a_of = |i: usize| match i {
            // Hypothetical: four hallucinations called valid (i % 3 != 0).
            1 | 2 | 4 | 5 => Some(valid),
            90 | 91 => None,
            92..=95 => Some(hall),
            _ => Some(human_of(i)),
        };
        let units = (0..150).map(|i| unit(i, "m", vec![a_of(i), Some(human_of(i))])).collect();
        let mut j = judged(&["a", "b"], &["valid", "hallucination", "irrelevant"], units);
        j.ruled = (150..180).map(|i| Ruled { key: key(i, "m"), label: irr }).collect();
        j.item_groups = (0..180)
            .map(|i| (i.to_string(), if i < 90 { "hypothetical" } else { "valid" }.to_string()))
            .collect();
        let mut human = HumanLabels::default();
        for i in 0..180 {
            human.labels.push(label(key(i, "m"), human_of(i), "h1", Provenance::Human));
        }
        let r = analyse(0, &j, &human);
        let h = r.human.as_ref().unwrap();
        assert_eq!((h.unknown, h.labelled_units, h.units_with_truth), (0, 180, 180));
        let a = r.score_vs_human.iter().find(|s| s.labeller == "a").unwrap();
        assert_eq!((a.units, a.ruled, a.no_verdict, a.wrong), (180, 30, 2, 12));
        assert!((est(&a.error_rate) - 12.0 / 180.0).abs() < 1e-12);
        // Wilson (1927) score interval of 12/180 by hand: p̂ = 1/15, z = 1.959964,
        // centre (p̂ + z²/360)/(1 + z²/180) = 0.075722, half-width 0.037177: 3.85%–11.29%
        // statsmodels 0.15.0, proportion_confint(12, 180, method="wilson"), gives
        // (0.0385440749, 0.1128986899).
        let (lo, hi) = bounds(&a.error_rate);
        assert!((lo - 0.038544).abs() < 1e-5 && (hi - 0.112899).abs() < 1e-5, "{lo} {hi}");
        let hyp = a.groups.iter().find(|g| g.group == "hypothetical").unwrap();
        assert_eq!((hyp.units, hyp.labeller, hyp.human), (90, 34, 30));
        assert!((est(&hyp.difference) - 4.0 / 90.0).abs() < 1e-12);
        let (lo, hi) = bounds(&hyp.difference);
        assert!(lo <= 4.0 / 90.0 && 4.0 / 90.0 <= hi && lo >= 0.0, "{lo} {hi}");
        let val = a.groups.iter().find(|g| g.group == "valid").unwrap();
        assert_eq!((val.units, val.labeller, val.human), (90, 54, 62));
        assert!((est(&val.difference) + 8.0 / 90.0).abs() < 1e-12);
        let b = r.score_vs_human.iter().find(|s| s.labeller == "b").unwrap();
        assert_eq!((b.units, b.wrong, b.no_verdict), (180, 2, 0));
        let hyp_b = b.groups.iter().find(|g| g.group == "hypothetical").unwrap();
        assert_eq!(est(&hyp_b.difference), 0.0);
        // The panel (majority of a and b): a tie on the 8 answers a labels wrongly (no
        // verdict, wrong); where a gives none, b's vote decides; the 2 rule-labelled ones.
        let p = r.score_vs_human.iter().find(|s| s.labeller.starts_with("panel")).unwrap();
        assert_eq!((p.units, p.no_verdict, p.wrong), (180, 8, 10));
        // The judged-units figure keeps its own denominator: 150 answers, 2 without verdict.
        let v = r.per_judge[0].vs_human.as_ref().unwrap();
        assert_eq!((v.units, v.n, v.unlabelled, v.confusion.agreements()), (150, 148, 2, 140));
    }

    /// Issue 45 item 12, a designed panel: 50 questions × 2 models = 100 units, three
    /// annotators (h2 differs from h1 on units 0–9, h3 on units 10–19) and two judges
    /// (j1 differs from h1 on units 20–24, j2 on units 20–59). Hand counts: annotator
    /// pairs 10, 10 and 20 in 100 (pooled 40/300); j1 against them 5, 15, 15 (pooled
    /// 35/300, 1.67 points below the annotators: "no more than annotators with each
    /// other"); j2 40, 50, 50 (140/300, 33.3 points above, an interval clear of 0).
    #[test]
    fn judge_versus_annotator_disagreement_beside_annotator_pairs() {
        let flip = |x: usize| 1 - x;
        let units: Vec<(UnitKey, Vec<Option<usize>>)> = (0..100)
            .map(|u| {
                let t = (u / 2) % 2;
                let k = key(u / 2, if u % 2 == 0 { "m1" } else { "m2" });
                let j1 = if (20..25).contains(&u) { flip(t) } else { t };
                let j2 = if (20..60).contains(&u) { flip(t) } else { t };
                (k, vec![Some(j1), Some(j2)])
            })
            .collect();
        let mut labels = Vec::new();
        for (u, (k, _)) in units.iter().enumerate() {
            let t = (u / 2) % 2;
            labels.push(label(k.clone(), t, "h1", Provenance::Human));
            labels.push(label(
                k.clone(),
                if u < 10 { flip(t) } else { t },
                "h2",
                Provenance::Human,
            ));
            let h3 = if (10..20).contains(&u) { flip(t) } else { t };
            labels.push(label(k.clone(), h3, "h3", Provenance::Human));
        }
        let refs: Vec<&HumanLabel> = labels.iter().collect();
        let unit_refs: Vec<(&UnitKey, Vec<Option<usize>>)> =
            units.iter().map(|(k, v)| (k, v.clone())).collect();
        let names = vec!["j1".to_string(), "j2".to_string()];
        let p = pairwise_disagreement(&names, &unit_refs, &refs, Bootstrap::default()).unwrap();
        let counts: Vec<(u64, u64)> = p.annotator_pairs.iter().map(|x| (x.disagree, x.n)).collect();
        assert_eq!(counts, vec![(10, 100), (10, 100), (20, 100)]);
        assert!((est(&p.annotators_pooled) - 40.0 / 300.0).abs() < 1e-12);
        let j1 = &p.judges[0];
        let c1: Vec<u64> = j1.pairs.iter().map(|x| x.disagree).collect();
        assert_eq!(c1, vec![5, 15, 15]);
        assert!((est(&j1.pooled) - 35.0 / 300.0).abs() < 1e-12);
        assert!((est(&j1.minus_annotators) + 5.0 / 300.0).abs() < 1e-12);
        let (lo, hi) = bounds(&j1.minus_annotators);
        assert!(lo < 0.0 && 0.0 < hi, "j1 no worse than annotators: {lo} {hi}");
        let j2 = &p.judges[1];
        assert!((est(&j2.pooled) - 140.0 / 300.0).abs() < 1e-12);
        let (lo, _) = bounds(&j2.minus_annotators);
        assert!(lo > 0.0, "j2 disagrees more than the annotators: {lo}");
        // Each rate's interval holds its estimate.
        for x in p.annotator_pairs.iter().chain(&j1.pairs) {
            let (lo, hi) = bounds(&x.rate);
            assert!(lo <= est(&x.rate) && est(&x.rate) <= hi);
        }
    }
}

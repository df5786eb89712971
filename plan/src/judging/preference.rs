//! Leniency and self-preference (issue 45): two different questions about a judge.
//!
//! - **Leniency**: does the judge give the favourable label (HypoTermQA's `valid`, HVI's
//!   `not_hallucinated`) more often than the other judges, on the same units, whoever's
//!   they are? Each other judge is compared with it on every unit both labelled — no
//!   majority of the others, so no unit is dropped because they tie — and the comparisons
//!   are pooled: the judge's excess is the mean of `fav(judge) − fav(other)` over the
//!   (unit, other judge) pairs.
//! - **Self-preference** (HypoTermQA §4.3) is the *interaction*: the judge's excess over the
//!   others on its own model's answers minus its excess on the other models' answers (a
//!   difference of differences). A judge that is lenient on every answer leads on both
//!   and shows none; one that favours its own model leads only there. The others a judge
//!   is compared with on an answer are the judges with no stake in it (not the same model
//!   as the answer's), so another judge's own self-preference does not move the figure.
//!   The two excesses are taken over the same questions where possible (questions with an
//!   answer of the judge's model and one of another model), so the difference is paired by
//!   question.
//!
//! Intervals: percentile bootstrap over questions ([`bootstrap_clustered`], a cluster is a
//! unit key's `item`: HypoTermQA's question, HVI's passage), which keeps the dependence
//! between the pairs of one unit and between the units of one question. The
//! self-preference p-value is a permutation test within questions: under the null that
//! the judge's excess does not depend on which model gave the answer, which answer of a
//! question is "its own" is exchangeable, so the own/other flags are shuffled among each
//! question's answers ([`PERMUTATIONS`] times, seeded) and the p-value is the share of
//! shuffles whose |difference| reaches the observed one. It keeps the question pairing and
//! needs no large-sample approximation; McNemar on the two discordance tables would treat
//! the pairs of a unit, and the units of a question, as independent.
//!
//! What it assumes: leniency is an excess of the same size on every model's answers. A
//! judge whose leniency scales with how often answers are unfavourable shows a difference
//! when its own model's answers are unfavourable more (or less) often than the others':
//! the rows show the other judges' favourable rate on both sides to read that against.

use std::collections::HashMap;

use halyard_pipelines::common::ModelSpec;
use halyard_pipelines::metrics::interval::{bootstrap_clustered, Bootstrap, SplitMix64};
use serde::{Deserialize, Serialize};

use super::figure::Figure;
use super::{same_model, Judged};

/// Shuffles of the self-preference permutation test.
pub const PERMUTATIONS: u32 = 2000;
/// A self-preference is reported as found below this p-value.
pub const SIGNIFICANCE: f64 = 0.05;

/// One judge's favourable rate against the other judges', all models' units.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Leniency {
    pub judge: String,
    pub favourable: String,
    #[serde(flatten)]
    pub excess: Excess,
}

/// A judge's excess over other judges on a set of units.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Excess {
    /// Units the judge labelled along with at least one judge it is compared with.
    pub units: u64,
    /// (unit, other judge) comparisons.
    pub pairs: u64,
    /// Questions (clusters) of those units.
    pub questions: u64,
    /// The judge's favourable rate over the comparisons …
    pub judge_rate: f64,
    /// … and the other judges' over the same comparisons.
    pub others_rate: f64,
    /// `judge_rate − others_rate`, with the percentile bootstrap over questions.
    pub excess: Figure,
}

/// A judge that is also a model under test: its excess on that model's answers minus its
/// excess on the other models' answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SelfPreference {
    pub judge: String,
    /// The model under test that is the judge's own model.
    pub model: String,
    pub favourable: String,
    /// Its excess on its own model's answers (over the judges of other models) …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own: Option<Excess>,
    /// … and on the answers of models it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elsewhere: Option<Excess>,
    /// Questions with comparisons on both sides; when there are any, `own`, `elsewhere` and
    /// `difference` use only these (paired by question).
    pub questions_paired: u64,
    /// own − elsewhere, percentile bootstrap over questions.
    pub difference: Figure,
    /// Two-sided permutation test within questions (`None`: no difference to test).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p_value: Option<f64>,
    pub permutations: u32,
    /// `p_value < 0.05`.
    pub significant: bool,
}

/// One unit's comparisons of the judge with the others.
#[derive(Clone, Copy, Debug)]
struct Row {
    cluster: usize,
    own: bool,
    /// Comparisons (other judges that labelled the unit).
    pairs: u64,
    /// The judge's favourable labels over them (0 or `pairs`) and the others'.
    judge_fav: u64,
    others_fav: u64,
}

#[derive(Clone, Copy, Default)]
struct Sums {
    pairs: u64,
    judge_fav: u64,
    others_fav: u64,
}

impl Sums {
    fn add(&mut self, r: &Row) {
        self.pairs += r.pairs;
        self.judge_fav += r.judge_fav;
        self.others_fav += r.others_fav;
    }

    fn excess(&self) -> Option<f64> {
        (self.pairs > 0)
            .then(|| (self.judge_fav as f64 - self.others_fav as f64) / self.pairs as f64)
    }
}

/// The answerer spec of a unit's model alias (`None`: not a model under test, e.g.
/// ChainPoll's `dataset`).
fn answerer<'a>(j: &'a Judged, alias: &str) -> Option<&'a ModelSpec> {
    j.answerers.iter().find(|m| m.name == alias)
}

/// Judge `jj`'s comparisons on the units `keep` selects, against the judges `compare`
/// admits for that unit; the unit's own flag from `own`. Units without comparisons are
/// left out. Clusters are numbered by first appearance.
fn rows(
    j: &Judged,
    jj: usize,
    fav: usize,
    keep: impl Fn(&super::Unit) -> Option<bool>,
    compare: impl Fn(&super::Unit, usize) -> bool,
) -> Vec<Row> {
    let mut clusters: HashMap<&str, usize> = HashMap::new();
    let mut out = Vec::new();
    for u in &j.units {
        let Some(own) = keep(u) else { continue };
        let Some(v) = u.votes.get(jj).copied().flatten() else { continue };
        let (mut pairs, mut others_fav) = (0u64, 0u64);
        for (o, w) in u.votes.iter().enumerate() {
            let Some(w) = w else { continue };
            if o == jj || !compare(u, o) {
                continue;
            }
            pairs += 1;
            others_fav += u64::from(*w == fav);
        }
        if pairs == 0 {
            continue;
        }
        let next = clusters.len();
        let cluster = *clusters.entry(u.key.item.as_str()).or_insert(next);
        out.push(Row {
            cluster,
            own,
            pairs,
            judge_fav: if v == fav { pairs } else { 0 },
            others_fav,
        });
    }
    out
}

/// Row indices per cluster (non-empty clusters only, in cluster order).
fn cluster_lists(rows: &[Row]) -> Vec<Vec<usize>> {
    let n = rows.iter().map(|r| r.cluster + 1).max().unwrap_or(0);
    let mut lists = vec![Vec::new(); n];
    for (i, r) in rows.iter().enumerate() {
        lists[r.cluster].push(i);
    }
    lists.retain(|l| !l.is_empty());
    lists
}

fn sums<'a>(rows: &'a [Row], idx: impl Iterator<Item = &'a usize>) -> Sums {
    let mut s = Sums::default();
    for &i in idx {
        s.add(&rows[i]);
    }
    s
}

/// The excess of `rows` with its interval over their clusters.
fn excess(rows: &[Row], cfg: Bootstrap) -> Option<Excess> {
    let all = sums(rows, (0..rows.len()).collect::<Vec<_>>().iter());
    if all.pairs == 0 {
        return None;
    }
    let clusters = cluster_lists(rows);
    let fig =
        Figure::of(bootstrap_clustered(&clusters, cfg, |idx| sums(rows, idx.iter()).excess()));
    Some(Excess {
        units: rows.len() as u64,
        pairs: all.pairs,
        questions: clusters.len() as u64,
        judge_rate: all.judge_fav as f64 / all.pairs as f64,
        others_rate: all.others_fav as f64 / all.pairs as f64,
        excess: fig,
    })
}

/// Own-minus-elsewhere excess of the rows at `idx`, with `own` read from `flags` (the
/// observed flags, or a shuffle of them).
fn difference(rows: &[Row], flags: &[bool], idx: &[usize]) -> Option<f64> {
    let (mut own, mut other) = (Sums::default(), Sums::default());
    for &i in idx {
        if flags[i] {
            own.add(&rows[i])
        } else {
            other.add(&rows[i])
        }
    }
    Some(own.excess()? - other.excess()?)
}

/// Two-sided permutation p-value of the own/elsewhere difference: the own flags shuffled
/// within each cluster. `None` when the observed difference is undefined.
fn permutation_p(rows: &[Row], clusters: &[Vec<usize>], cfg: Bootstrap) -> Option<f64> {
    let flags: Vec<bool> = rows.iter().map(|r| r.own).collect();
    let all: Vec<usize> = (0..rows.len()).collect();
    let observed = difference(rows, &flags, &all)?.abs();
    let mut rng = SplitMix64::new(cfg.seed ^ 0x5E1F_0000_0000_0045);
    let mut shuffled = flags.clone();
    let (mut reached, mut valid) = (0u64, 0u64);
    for _ in 0..PERMUTATIONS {
        for c in clusters {
            // Fisher–Yates over the cluster's flags.
            for k in (1..c.len()).rev() {
                let m = rng.below(k + 1);
                let (a, b) = (c[k], c[m]);
                shuffled.swap(a, b);
            }
        }
        if let Some(d) = difference(rows, &shuffled, &all) {
            valid += 1;
            // A tolerance for sums that equal the observed one in another order.
            reached += u64::from(d.abs() >= observed - 1e-12);
        }
    }
    Some((1 + reached) as f64 / (1 + valid) as f64)
}

/// Every judge's leniency (with a favourable label and two or more judges).
pub fn leniency(j: &Judged, cfg: Bootstrap) -> Vec<Leniency> {
    let Some(fav) = j.favourable else { return Vec::new() };
    if j.judges.len() < 2 {
        return Vec::new();
    }
    (0..j.judges.len())
        .filter_map(|jj| {
            let rows = rows(j, jj, fav, |_| Some(false), |_, _| true);
            Some(Leniency {
                judge: j.judges[jj].name.clone(),
                favourable: j.categories.get(fav)?.clone(),
                excess: excess(&rows, cfg)?,
            })
        })
        .collect()
}

/// Every judge that is also a model under test, against the judges with no stake in each
/// answer: its excess on its own model's answers minus its excess on answers of models it
/// is not.
pub fn self_preference(j: &Judged, cfg: Bootstrap) -> Vec<SelfPreference> {
    let Some(fav) = j.favourable else { return Vec::new() };
    let Some(favourable) = j.categories.get(fav) else { return Vec::new() };
    if j.judges.len() < 2 {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (jj, judge) in j.judges.iter().enumerate() {
        for model in j.answerers.iter().filter(|m| same_model(m, judge)) {
            // Own: this model's answers; elsewhere: answers of models the judge is not.
            let keep = |u: &super::Unit| {
                if u.key.model == model.name {
                    Some(true)
                } else if answerer(j, &u.key.model).is_some_and(|m| same_model(m, judge)) {
                    None
                } else {
                    Some(false)
                }
            };
            // The judges compared: none that is the answer's model.
            let compare = |u: &super::Unit, o: usize| {
                j.judges.get(o).is_some_and(|other| {
                    answerer(j, &u.key.model).is_none_or(|m| !same_model(m, other))
                })
            };
            let mut rows = rows(j, jj, fav, keep, compare);
            // Paired by question where possible.
            let mut sides: HashMap<usize, (bool, bool)> = HashMap::new();
            for r in &rows {
                let s = sides.entry(r.cluster).or_default();
                if r.own {
                    s.0 = true
                } else {
                    s.1 = true
                }
            }
            let paired = sides.values().filter(|(a, b)| *a && *b).count();
            if paired > 0 {
                rows.retain(|r| sides[&r.cluster] == (true, true));
            }
            let own_rows: Vec<Row> = rows.iter().copied().filter(|r| r.own).collect();
            let else_rows: Vec<Row> = rows.iter().copied().filter(|r| !r.own).collect();
            let (own, elsewhere) = (excess(&own_rows, cfg), excess(&else_rows, cfg));
            let clusters = cluster_lists(&rows);
            let flags: Vec<bool> = rows.iter().map(|r| r.own).collect();
            let (difference, p_value) = match (&own, &elsewhere) {
                (Some(_), Some(_)) => (
                    Figure::of(bootstrap_clustered(&clusters, cfg, |idx| {
                        difference(&rows, &flags, idx)
                    })),
                    permutation_p(&rows, &clusters, cfg),
                ),
                (None, _) => (
                    Figure::Undefined {
                        undefined: format!(
                            "no answer of {} was labelled by {} and by a judge of another model",
                            model.name, judge.name
                        ),
                    },
                    None,
                ),
                (_, None) => (
                    Figure::Undefined {
                        undefined: format!(
                            "no answer of another model was labelled by {} and by a judge that is not that model",
                            judge.name
                        ),
                    },
                    None,
                ),
            };
            out.push(SelfPreference {
                judge: judge.name.clone(),
                model: model.name.clone(),
                favourable: favourable.clone(),
                own,
                elsewhere,
                questions_paired: paired as u64,
                difference,
                p_value,
                permutations: PERMUTATIONS,
                significant: p_value.is_some_and(|p| p < SIGNIFICANCE),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    //! Simulations with designed effects. The scripted judges see each answer's designed
    //! truth and the other judges' scripted labels, never this module: the designed
    //! excess of a judge follows from the script's probabilities alone (worked out at each
    //! test), and the figures must find it.

    use super::*;
    use crate::judging::{Unit, UnitKey, Verdict};

    const QUESTIONS: usize = 360;
    /// Every model's answers are favourable with this probability.
    const FAVOURABLE: f64 = 0.7;
    /// The honest judges' independent error rate.
    const ERROR: f64 = 0.1;
    const FAV: usize = 0;
    const UNFAV: usize = 1;

    use crate::judging::test_spec as spec;

    /// The scripts' own draws (SplitMix64, seeded per test).
    struct Script(SplitMix64);

    impl Script {
        fn new(seed: u64) -> Script {
            Script(SplitMix64::new(seed))
        }

        fn uniform(&mut self) -> f64 {
            self.0.uniform()
        }

        fn honest(&mut self, truth: usize) -> usize {
            if self.uniform() < ERROR {
                1 - truth
            } else {
                truth
            }
        }
    }

    #[derive(Clone, Copy, PartialEq)]
    enum Lean {
        /// On every answer.
        Everywhere,
        /// On its own model's answers only.
        OwnOnly,
    }

    fn judged(judges: &[&str], models: &[&str], units: Vec<Unit>) -> Judged {
        Judged {
            pipeline: "hypotermqa",
            unit: "answer",
            part: None,
            categories: vec!["valid".into(), "hallucination".into()],
            favourable: Some(FAV),
            judges: judges.iter().map(|n| spec(n)).collect(),
            answerers: models.iter().map(|n| spec(n)).collect(),
            verdict: Verdict::Majority,
            units,
            dataset_labels: Vec::new(),
            ruled: Vec::new(),
            item_groups: Default::default(),
        }
    }

    fn unit(q: usize, model: &str, votes: Vec<Option<usize>>) -> Unit {
        Unit {
            key: UnitKey { item: format!("q{q}"), model: model.into(), part: None },
            question: format!("question {q}"),
            answer: Some("answer".into()),
            votes,
        }
    }

    /// 360 questions answered by models a, b, c, judged by a, b and c. Judges a and b are
    /// honest (independent errors of 10%). Judge c copies them where they agree and tosses
    /// a coin where they disagree, except on the answers it leans on (`lean`), where it
    /// says favourable wherever they disagree, and with probability `q` where both say
    /// unfavourable.
    ///
    /// Designed excess of c on a leaned answer, over a or b (either, or both pooled):
    /// P(a ≠ b)·½ + q·P(a = b = unfavourable) = 2·0.1·0.9·½ + q·(0.3·0.9² + 0.7·0.1²)
    /// = 0.09 + 0.25·q; on other answers 0 (the coin matches a disagreeing pair's ½).
    fn three(lean: Lean, q: f64, seed: u64) -> Judged {
        let mut s = Script::new(seed);
        let mut units = Vec::new();
        for i in 0..QUESTIONS {
            for m in ["a", "b", "c"] {
                let truth = if s.uniform() < FAVOURABLE { FAV } else { UNFAV };
                let (va, vb) = (s.honest(truth), s.honest(truth));
                let leaned = lean == Lean::Everywhere || m == "c";
                let coin = s.uniform();
                let vc = if va != vb {
                    if leaned || coin < 0.5 {
                        FAV
                    } else {
                        UNFAV
                    }
                } else if va == UNFAV && leaned && coin < q {
                    FAV
                } else {
                    va
                };
                units.push(unit(i, m, vec![Some(va), Some(vb), Some(vc)]));
            }
        }
        judged(&["a", "b", "c"], &["a", "b", "c"], units)
    }

    fn designed_three(q: f64) -> f64 {
        2.0 * ERROR * (1.0 - ERROR) * 0.5
            + q * ((1.0 - FAVOURABLE) * (1.0 - ERROR).powi(2) + FAVOURABLE * ERROR * ERROR)
    }

    fn interval(f: &Figure) -> halyard_pipelines::metrics::interval::Interval {
        match f {
            Figure::Value(i) => *i,
            Figure::Undefined { undefined } => panic!("undefined: {undefined}"),
        }
    }

    fn row<'a>(r: &'a [SelfPreference], judge: &str) -> &'a SelfPreference {
        r.iter().find(|s| s.judge == judge).unwrap_or_else(|| panic!("no row of {judge}"))
    }

    /// Issue 45's first reproduction: a judge lenient on every answer, with no
    /// self-preference. The old test (McNemar against the others' majority, own answers
    /// only) flagged it at p < 1e-9; the interaction does not, and leniency does, with the
    /// designed 0.165 inside its interval.
    #[test]
    fn lenient_everywhere_is_leniency_not_self_preference() {
        let q = 0.3;
        let j = three(Lean::Everywhere, q, 45);
        let cfg = Bootstrap::default();
        let sp = self_preference(&j, cfg);
        assert_eq!(sp.len(), 3, "every judge is a model under test");
        let c = row(&sp, "c");
        let d = interval(&c.difference);
        eprintln!("lenient everywhere: self-preference {d:?} p {:?}", c.p_value);
        assert!(!c.significant && c.p_value.unwrap() >= 0.05, "{c:?}");
        assert!(d.contains(0.0), "{d:?}");
        // Both sides carry the designed leniency.
        let designed = designed_three(q);
        for side in [c.own.as_ref().unwrap(), c.elsewhere.as_ref().unwrap()] {
            assert!(interval(&side.excess).contains(designed), "{designed} {side:?}");
        }
        assert_eq!(c.questions_paired, QUESTIONS as u64);
        let len = leniency(&j, cfg);
        let lc = len.iter().find(|l| l.judge == "c").unwrap();
        let li = interval(&lc.excess.excess);
        eprintln!("lenient everywhere: leniency {li:?}");
        assert!(li.low.unwrap() > 0.0 && li.contains(designed), "{designed} {li:?}");
        // Every unit compared with both other judges, no tie dropped.
        assert_eq!(lc.excess.pairs, 2 * 3 * QUESTIONS as u64);
        assert_eq!(li.clusters, Some(QUESTIONS as u64));
    }

    /// Issue 45's second reproduction: a judge lenient only on its own model's answers,
    /// among them every answer where the two other judges disagree (those the others'
    /// majority dropped, so the old test saw no discordant pair). Flagged, with the
    /// designed difference inside the interval; with `q = 0` the whole effect sits on
    /// those answers.
    #[test]
    fn lenient_on_its_own_answers_is_self_preference() {
        let cfg = Bootstrap::default();
        for (q, seed) in [(0.3, 7), (0.0, 8)] {
            let j = three(Lean::OwnOnly, q, seed);
            let sp = self_preference(&j, cfg);
            let c = row(&sp, "c");
            let designed = designed_three(q);
            let d = interval(&c.difference);
            eprintln!("own only, q {q}: designed {designed}, {d:?} p {:?}", c.p_value);
            assert!(c.significant && c.p_value.unwrap() < 0.01, "q {q}: {c:?}");
            assert!(d.low.unwrap() > 0.0 && d.contains(designed), "q {q}: {designed} {d:?}");
            assert!(interval(&c.elsewhere.as_ref().unwrap().excess).contains(0.0), "{c:?}");
            // Leniency sees a third of it (a third of c's comparisons are on its own
            // model's answers).
            let len = leniency(&j, cfg);
            let lc = len.iter().find(|l| l.judge == "c").unwrap();
            assert!(interval(&lc.excess.excess).contains(designed / 3.0), "{lc:?}");
        }
    }

    /// report.md shows leniency and self-preference as separate tables, each figure with
    /// its interval.
    #[test]
    fn report_shows_both_rows() {
        let j = three(Lean::OwnOnly, 0.3, 7);
        let r = crate::judging::analyse(0, &j, &crate::judging::HumanLabels::default());
        assert_eq!((r.leniency.len(), r.self_preference.len()), (3, 3));
        let md = super::super::render::markdown(&r);
        let c = row(&r.self_preference, "c");
        let d = interval(&c.difference);
        let shown = format!("{:+.1}{} |", d.estimate * 100.0, d.bracket(100.0, 1));
        assert!(md.contains("### Leniency") && md.contains("### Self-preference"), "{md}");
        assert!(md.contains(&format!("| c | c | {QUESTIONS} |")) && md.contains(&shown), "{md}");
        let l = &r.leniency.iter().find(|l| l.judge == "c").unwrap().excess;
        let e = interval(&l.excess);
        assert!(md.contains(&format!("{:+.1}{} |", e.estimate * 100.0, e.bracket(100.0, 1))));
        assert!(md.contains("every interval above resamples questions"), "{md}");
    }

    /// Calibration over 100 seeds (slow in a debug build: `cargo test -p halyard-plan
    /// --lib calibration -- --ignored --nocapture`): the share of lenient-everywhere panels
    /// whose self-preference is found (the test's size, designed 5%), and the share of
    /// own-only panels whose interval holds the designed difference (designed 95%).
    #[test]
    #[ignore]
    fn calibration() {
        let cfg = Bootstrap { resamples: 1000, ..Bootstrap::default() };
        let (mut found, mut covered) = (0, 0);
        let runs = 100;
        for seed in 0..runs {
            let j = three(Lean::Everywhere, 0.3, 1000 + seed);
            found += usize::from(row(&self_preference(&j, cfg), "c").significant);
            let j = three(Lean::OwnOnly, 0.3, 2000 + seed);
            let sp = self_preference(&j, cfg);
            covered +=
                usize::from(interval(&row(&sp, "c").difference).contains(designed_three(0.3)));
        }
        eprintln!("size {found}/{runs}, coverage {covered}/{runs}");
        assert!(found <= 12 && covered >= 85, "size {found}/{runs}, coverage {covered}/{runs}");
    }

    /// Two judges: a (no model under test) and c, over models m1, m2 and c. Judge c copies
    /// a, except on the answers it leans on, where a says unfavourable: there it says
    /// favourable with probability q. Designed excess on a leaned answer:
    /// q·P(a unfavourable) = q·(0.3·0.9 + 0.7·0.1) = 0.34·q.
    fn two(lean: Lean, q: f64, seed: u64) -> Judged {
        let mut s = Script::new(seed);
        let mut units = Vec::new();
        for i in 0..QUESTIONS {
            for m in ["m1", "m2", "c"] {
                let truth = if s.uniform() < FAVOURABLE { FAV } else { UNFAV };
                let va = s.honest(truth);
                let leaned = lean == Lean::Everywhere || m == "c";
                let vc = if va == UNFAV && leaned && s.uniform() < q { FAV } else { va };
                units.push(unit(i, m, vec![Some(va), Some(vc)]));
            }
        }
        judged(&["a", "c"], &["m1", "m2", "c"], units)
    }

    #[test]
    fn two_judges() {
        let cfg = Bootstrap::default();
        let q = 0.4;
        let designed = q * ((1.0 - FAVOURABLE) * (1.0 - ERROR) + FAVOURABLE * ERROR);
        // Self-preference.
        let sp = self_preference(&two(Lean::OwnOnly, q, 11), cfg);
        assert_eq!(sp.len(), 1);
        let d = interval(&sp[0].difference);
        assert!(sp[0].significant && d.contains(designed) && d.low.unwrap() > 0.0, "{sp:?}");
        // Leniency everywhere.
        let j = two(Lean::Everywhere, q, 12);
        let sp = self_preference(&j, cfg);
        assert!(!sp[0].significant && interval(&sp[0].difference).contains(0.0), "{sp:?}");
        let len = leniency(&j, cfg);
        let lc = interval(&len[1].excess.excess);
        assert!(lc.low.unwrap() > 0.0 && lc.contains(designed), "{designed} {lc:?}");
        // a's leniency is the mirror image: one other judge.
        assert_eq!(len[0].excess.excess.estimate(), Some(-lc.estimate));
    }

    /// Both judges models under test: on the other model's answers the only other judge
    /// is that model, so there is nothing to compare, and the row says why.
    #[test]
    fn no_comparison_elsewhere_is_named() {
        let mut s = Script::new(3);
        let mut units = Vec::new();
        for i in 0..20 {
            for m in ["a", "c"] {
                let v = if s.uniform() < 0.5 { FAV } else { UNFAV };
                units.push(unit(i, m, vec![Some(v), Some(v)]));
            }
        }
        let sp = self_preference(&judged(&["a", "c"], &["a", "c"], units), Bootstrap::default());
        assert_eq!(sp.len(), 2);
        for r in &sp {
            assert!(r.p_value.is_none() && !r.significant, "{r:?}");
            match &r.difference {
                Figure::Undefined { undefined } => assert!(undefined.contains("another model")),
                f => panic!("{f:?}"),
            }
        }
    }
}

//! AutoHall figures from the item labels (spec `metrics.md` §2.1 step 3, §2.2, §2.3).
//!
//! - Hallucination rate = hallucinated / classified references (Table 2's #H/#Total),
//!   with the counts of every way a claim can fail to be classified beside it.
//! - Balanced set (the authors' code, not the paper's "randomly sample"): n = min(#H,
//!   #F); the first n hallucinated and the first n factual references in file order.
//!   With #H ≤ #F (the usual case, 18–28 % hallucinated) this is the authors' "all
//!   hallucinated, then factual ones in file order until the count is reached".
//! - Detection on the balanced set: Eq. 3 ("any of the K pairs conflicts"), hallucination
//!   positive, accuracy / precision / recall / F1, and the same for every k in 1..=K on
//!   the first k pairs (the K-ablation from the same calls). References of the balanced
//!   set whose K verdicts are not all known (a failed sample or check) are left out and
//!   counted.
//! - The baselines (when run): Zero-/Few-Self-Check and SelfCk-1gm on the same balanced
//!   set, hallucination positive (see [`super::baselines`]).
//!
//! Every rate carries its 95% interval (issue 16): the hallucination rate, accuracy,
//! precision and recall Wilson; F1 a seeded bootstrap over the references.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::baselines::Baseline;
use super::plan::{ItemLabel, Pair, Status};
use crate::common::OddCounts;
use crate::metrics::autohall::GoldLabel;
use crate::metrics::autohall::{k_ablation, DetectionRecord};
use crate::metrics::classification::{ClassificationIntervals, ClassificationMetrics, Confusion};
use crate::metrics::interval::{wilson, with_bracket, Interval};

/// One row of the K-ablation (the last row is the headline at K).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KRow {
    pub k: usize,
    pub confusion: Confusion,
    pub metrics: ClassificationMetrics,
    #[serde(default)]
    pub ci95: ClassificationIntervals,
    pub mean_conflicts_hallucinated: Option<f64>,
    pub mean_conflicts_factual: Option<f64>,
}

/// Detection figures of one model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DetectionReport {
    pub k: u32,
    /// Balanced references with all K verdicts (the denominator of every rate).
    pub scored: u64,
    pub scored_hallucinated: u64,
    pub scored_factual: u64,
    /// Balanced references left out because a sample or a pair check failed.
    pub incomplete: u64,
    /// Of the scored references, those with at least one comparison decided by an empty
    /// or refused sample or check answer (issue 29): counted as conflicts by the
    /// authors' rule, and shown beside the figures they move.
    #[serde(default)]
    pub scored_with_odd_checks: u64,
    /// The comparisons of scored references with an empty or refused sample.
    #[serde(default)]
    pub odd_samples: OddCounts,
    /// The comparisons of scored references with an empty or refused check answer.
    #[serde(default)]
    pub odd_check_answers: OddCounts,
    /// `None` when nothing could be scored.
    pub at_k: Option<KRow>,
    pub ablation: Vec<KRow>,
}

/// Classified / hallucinated counts for one gold label.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GoldCounts {
    pub classified: u64,
    pub hallucinated: u64,
}

/// The figures of one (benchmark, model).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub pipeline: String,
    pub model: String,
    /// Claims with a kept label in the benchmark (after `limit`).
    pub claims: u64,
    /// Rows of the file left out for their label, by label.
    pub dropped_labels: BTreeMap<String, u64>,
    /// Claims by what became of them (`reference_failed`, `refused`, ...).
    pub status: BTreeMap<String, u64>,
    pub classified: u64,
    pub hallucinated: u64,
    pub factual: u64,
    /// hallucinated / classified; `None` when nothing was classified.
    pub hallucination_rate: Option<f64>,
    /// Its 95% Wilson interval.
    #[serde(default)]
    pub hallucination_rate_ci95: Option<Interval>,
    pub by_gold: BTreeMap<String, GoldCounts>,
    /// n of the balanced set (per class); the set holds 2n references.
    pub balanced_per_class: u64,
    /// `None` when detection is off (`samples = 0`).
    pub detection: Option<DetectionReport>,
    /// References that were empty or refusals (all `refused`; the phrase filter counts the
    /// rest of `refused`).
    #[serde(default)]
    pub odd_references: OddCounts,
    /// Classification answers that were empty or refusals (all `unclassified`).
    #[serde(default)]
    pub odd_classifications: OddCounts,
    /// The paper's baselines on the balanced set (empty when not run).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub baselines: Vec<BaselineReport>,
}

/// One baseline's detection figures on the balanced set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BaselineReport {
    pub method: Baseline,
    /// Balanced references with a verdict or an unparseable answer (the denominator).
    pub scored: u64,
    /// Of those, answers without a verdict, scored as wrong predictions (the notebook's rule).
    pub unparseable: u64,
    /// Balanced references left out: the job failed, or no sample came back (SelfCk-1gm).
    pub incomplete: u64,
    pub confusion: Confusion,
    pub metrics: ClassificationMetrics,
    pub ci95: ClassificationIntervals,
}

/// A baseline's figures over the balanced references.
fn baseline_report(method: Baseline, balanced: &[&ItemLabel]) -> BaselineReport {
    let (mut truth, mut predicted) = (Vec::new(), Vec::new());
    let (mut unparseable, mut incomplete) = (0, 0);
    for l in balanced {
        let (Some(h), Some(v)) = (l.hallucinated, l.baselines.as_ref().and_then(|b| b.get(method)))
        else {
            incomplete += 1;
            continue;
        };
        match (v.hallucinated, &v.error) {
            (Some(p), _) => predicted.push(p),
            (None, None) => {
                unparseable += 1;
                predicted.push(!h);
            }
            (None, Some(_)) => {
                incomplete += 1;
                continue;
            }
        }
        truth.push(h);
    }
    let confusion = Confusion::from_labels(&truth, &predicted).unwrap_or_default();
    BaselineReport {
        method,
        scored: truth.len() as u64,
        unparseable,
        incomplete,
        confusion,
        metrics: confusion.metrics(),
        ci95: ClassificationIntervals::of(&confusion),
    }
}

/// The balanced set (see the module doc): item indices, in file order.
pub fn balanced_set(labels: &[ItemLabel]) -> BTreeSet<u32> {
    let class = |h: bool| labels.iter().filter(move |l| l.hallucinated == Some(h)).map(|l| l.index);
    let n = class(true).count().min(class(false).count());
    class(true).take(n).chain(class(false).take(n)).collect()
}

fn k_row(r: &crate::metrics::autohall::AblationRow) -> KRow {
    KRow {
        k: r.k,
        confusion: r.confusion,
        metrics: r.confusion.metrics(),
        ci95: ClassificationIntervals::of(&r.confusion),
        mean_conflicts_hallucinated: r.mean_conflicts_hallucinated,
        mean_conflicts_factual: r.mean_conflicts_factual,
    }
}

/// Score one model's labels (`samples` = K of the benchmark, `claims` its claim count).
pub fn score(
    model: &str,
    claims: u64,
    dropped: &BTreeMap<String, u64>,
    samples: u32,
    labels: &[ItemLabel],
) -> Report {
    let mut status: BTreeMap<String, u64> =
        Status::ALL.iter().map(|s| (s.as_str().to_string(), 0)).collect();
    let mut by_gold: BTreeMap<String, GoldCounts> = BTreeMap::new();
    let (mut odd_references, mut odd_classifications) =
        (OddCounts::default(), OddCounts::default());
    for l in labels {
        odd_references.add(l.reference_kind);
        odd_classifications.add(l.classification_kind);
        *status.entry(l.status.as_str().to_string()).or_default() += 1;
        if let Some(h) = l.hallucinated {
            let g = by_gold.entry(gold_name(l.gold).into()).or_default();
            g.classified += 1;
            g.hallucinated += h as u64;
        }
    }
    let classified = labels.iter().filter(|l| l.hallucinated.is_some()).count() as u64;
    let hallucinated = labels.iter().filter(|l| l.hallucinated == Some(true)).count() as u64;
    let balanced = balanced_set(labels);
    let detection = (samples > 0).then(|| {
        let mut records = Vec::new();
        let mut incomplete = 0;
        let (mut with_odd, mut odd_samples, mut odd_check_answers) =
            (0, OddCounts::default(), OddCounts::default());
        for l in labels.iter().filter(|l| balanced.contains(&l.index)) {
            match (l.hallucinated, l.conflicts()) {
                (Some(h), Some(c)) if c.len() == samples as usize => {
                    records.push(DetectionRecord { hallucinated: h, conflicts: c });
                    with_odd += u64::from(l.pairs.iter().any(Pair::is_odd));
                    for p in &l.pairs {
                        odd_samples.add(p.sample_kind);
                        odd_check_answers.add(p.answer_kind);
                    }
                }
                _ => incomplete += 1,
            }
        }
        let ablation: Vec<KRow> = k_ablation(&records, samples as usize)
            .map(|rows| rows.iter().map(k_row).collect())
            .unwrap_or_default();
        let scored_hallucinated = records.iter().filter(|r| r.hallucinated).count() as u64;
        DetectionReport {
            k: samples,
            scored: records.len() as u64,
            scored_hallucinated,
            scored_factual: records.len() as u64 - scored_hallucinated,
            incomplete,
            scored_with_odd_checks: with_odd,
            odd_samples,
            odd_check_answers,
            at_k: ablation.last().cloned(),
            ablation,
        }
    });
    Report {
        pipeline: super::PIPELINE.into(),
        model: model.into(),
        claims,
        dropped_labels: dropped.clone(),
        status,
        classified,
        hallucinated,
        factual: classified - hallucinated,
        hallucination_rate: (classified > 0).then(|| hallucinated as f64 / classified as f64),
        hallucination_rate_ci95: wilson(hallucinated, classified).ok(),
        by_gold,
        balanced_per_class: balanced.len() as u64 / 2,
        detection,
        odd_references,
        odd_classifications,
        baselines: baselines_of(labels, &balanced),
    }
}

/// The baselines' reports, when any balanced reference holds baseline verdicts.
fn baselines_of(labels: &[ItemLabel], balanced: &BTreeSet<u32>) -> Vec<BaselineReport> {
    let set: Vec<&ItemLabel> = labels.iter().filter(|l| balanced.contains(&l.index)).collect();
    if !set.iter().any(|l| l.baselines.is_some()) {
        return Vec::new();
    }
    let with_1gm = set.iter().any(|l| l.baselines.as_ref().is_some_and(|b| b.selfck_1gm.is_some()));
    Baseline::ALL
        .into_iter()
        .filter(|b| *b != Baseline::SelfCk1gm || with_1gm)
        .map(|b| baseline_report(b, &set))
        .collect()
}

/// The baselines' table (none when they did not run).
fn baselines_markdown(rows: &[BaselineReport]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut md = String::from("\nBaselines on the same balanced set (unparseable answers count as wrong, failed checks are left out):\n\n| method | scored | unparseable | left out | acc | P | R | F1 |\n|---|---|---|---|---|---|---|---|\n");
    for b in rows {
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            b.method.as_str(),
            b.scored,
            b.unparseable,
            b.incomplete,
            with_bracket(b.metrics.accuracy, b.ci95.accuracy.as_ref(), 100.0, 2),
            with_bracket(b.metrics.precision, b.ci95.precision.as_ref(), 100.0, 2),
            with_bracket(b.metrics.recall, b.ci95.recall.as_ref(), 100.0, 2),
            with_bracket(b.metrics.f1, b.ci95.f1.as_ref(), 100.0, 2)
        ));
    }
    md
}

fn gold_name(g: GoldLabel) -> &'static str {
    match g {
        GoldLabel::Supported => "supported",
        GoldLabel::Refuted => "refuted",
    }
}

/// The benchmark's Markdown section: a leaderboard across models, then each model's
/// counts and K-ablation.
pub fn render_markdown(title: &str, reports: &[Report]) -> String {
    let mut md = format!("## {title}\n\n");
    md.push_str("Hallucination rate = hallucinated / classified references; detection on the balanced set, hallucination positive, figures ×100. In brackets: the 95% interval (Wilson for the rate, accuracy, precision and recall; a seeded bootstrap over references for F1).\n\n");
    md.push_str("| model | claims | classified | hallucinated | rate % | balanced 2n | K | scored | scored with empty/refused checks | acc | P | R | F1 |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    let mut order: Vec<&Report> = reports.iter().collect();
    let f1 = |r: &Report| {
        r.detection
            .as_ref()
            .and_then(|d| d.at_k.as_ref())
            .and_then(|k| k.metrics.f1)
            .unwrap_or(-1.0)
    };
    order.sort_by(|a, b| f1(b).total_cmp(&f1(a)).then(a.model.cmp(&b.model)));
    for r in order {
        let (k, scored, odd, at_k) = match &r.detection {
            Some(d) => (
                d.k.to_string(),
                d.scored.to_string(),
                d.scored_with_odd_checks.to_string(),
                d.at_k.as_ref(),
            ),
            None => ("off".into(), "–".into(), "–".into(), None),
        };
        let fig = |f: fn(&ClassificationMetrics) -> Option<f64>,
                   c: fn(&ClassificationIntervals) -> Option<&Interval>| {
            at_k.map_or("–".into(), |k| with_bracket(f(&k.metrics), c(&k.ci95), 100.0, 2))
        };
        md.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} | {k} | {scored} | {odd} | {} | {} | {} | {} |\n",
            r.model,
            r.claims,
            r.classified,
            r.hallucinated,
            with_bracket(r.hallucination_rate, r.hallucination_rate_ci95.as_ref(), 100.0, 2),
            r.balanced_per_class * 2,
            fig(|m| m.accuracy, |c| c.accuracy.as_ref()),
            fig(|m| m.precision, |c| c.precision.as_ref()),
            fig(|m| m.recall, |c| c.recall.as_ref()),
            fig(|m| m.f1, |c| c.f1.as_ref()),
        ));
    }
    for r in reports {
        md.push_str(&format!("\n### `{}`\n\n", r.model));
        let status: Vec<String> = r.status.iter().map(|(k, v)| format!("{k} {v}")).collect();
        md.push_str(&format!("Claims {}: {}.", r.claims, status.join(", ")));
        if !r.dropped_labels.is_empty() {
            let d: Vec<String> = r.dropped_labels.iter().map(|(k, v)| format!("{k} {v}")).collect();
            md.push_str(&format!(" Rows dropped for their label: {}.", d.join(", ")));
        }
        md.push_str(&format!(
            " Empty or refused references (refused): {}; classification answers (unclassified): {}.",
            r.odd_references.describe(),
            r.odd_classifications.describe()
        ));
        for (g, c) in &r.by_gold {
            md.push_str(&format!(
                " Gold {g}: {} of {} hallucinated.",
                c.hallucinated, c.classified
            ));
        }
        md.push('\n');
        if let Some(d) = r.detection.as_ref().filter(|d| !d.ablation.is_empty()) {
            md.push_str(&format!(
                "\nDetection: {} scored ({} hallucinated, {} factual), {} left out (failed sample or check). \
                 {} of the scored references had a comparison with an empty or refused sample ({}) or check \
                 answer ({}), counted as a conflict by the authors' rule.\n\n",
                d.scored,
                d.scored_hallucinated,
                d.scored_factual,
                d.incomplete,
                d.scored_with_odd_checks,
                d.odd_samples.describe(),
                d.odd_check_answers.describe()
            ));
            md.push_str("| k | TP | FP | TN | FN | acc | P | R | F1 | mean Num_c (H) | mean Num_c (F) |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
            for row in &d.ablation {
                let c = row.confusion;
                let num = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.2}"));
                md.push_str(&format!(
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                    row.k,
                    c.true_pos,
                    c.false_pos,
                    c.true_neg,
                    c.false_neg,
                    with_bracket(row.metrics.accuracy, row.ci95.accuracy.as_ref(), 100.0, 2),
                    with_bracket(row.metrics.precision, row.ci95.precision.as_ref(), 100.0, 2),
                    with_bracket(row.metrics.recall, row.ci95.recall.as_ref(), 100.0, 2),
                    with_bracket(row.metrics.f1, row.ci95.f1.as_ref(), 100.0, 2),
                    num(row.mean_conflicts_hallucinated),
                    num(row.mean_conflicts_factual)
                ));
            }
            md.push_str(&baselines_markdown(&r.baselines));
        } else if let Some(d) = &r.detection {
            md.push_str(&format!(
                "\nDetection: nothing to score (balanced set of {} references, {} left out).\n",
                r.balanced_per_class * 2,
                d.incomplete
            ));
        }
    }
    md
}

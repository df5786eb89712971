//! RealHall's aggregate over datasets (spec `metrics.md` §3.2): for one judge, the
//! unweighted mean of its per-dataset AUROCs for every method (ChainPoll, each ChainPoll
//! metric, the SelfCheck-NGram Avg and Max baselines, the Max and mean pseudo-entropy,
//! Avg/Max(−log p)), with a 95% interval from each dataset's Newcombe (2006) AUROC
//! interval, combined by square-and-add (the datasets are independent;
//! [`mean_auroc_newcombe`]). Until issue 45 the interval summed the per-dataset DeLong
//! variances, and a small dataset that separated perfectly (DeLong variance 0) narrowed it
//! silently: coverage 0.86 instead of 0.95 in
//! `metrics::interval::tests::aggregate_interval_coverage_with_a_small_dataset`. Newcombe's
//! interval needs only the AUROC and the class sizes, so a dataset with one item of a class
//! or all scores tied counts too, with the width its size gives it. And
//! "quality vs ours" (ChainPoll Table 5, note e):
//! `mean_d(AUROC_d − 0.5) / mean_d(AUROC_d^ChainPoll − 0.5)`.
//!
//! "ChainPoll" on a dataset is the metric RealHall uses there: Adherence on closed-domain
//! datasets (those benchmarked with `adherence`, which needs their context documents),
//! Correctness on the others (the paper's Tables 1, 3 and 4). A method missing on some
//! dataset (no sampler, no probability model, an undefined AUROC) has no aggregate, and the
//! row says on which datasets it is missing. Each row gives the items behind each
//! dataset's AUROC (`per_dataset_n`) and the items left unscored there.

use serde::{Deserialize, Serialize};

use super::plan::Metric;
use super::score::{Ranking, Report};
use crate::metrics::auroc::relative_quality;
use crate::metrics::interval::{mean_auroc_newcombe, DelongAuroc, Interval};

/// One method's AUROCs over the datasets.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AggregateRow {
    /// `chainpoll`, `chainpoll_correctness`, `chainpoll_adherence`, `selfcheck_avg`,
    /// `selfcheck_max`, `pseudo_entropy_max`, `pseudo_entropy_mean`, `avg_neg_logprob` or
    /// `max_neg_logprob`.
    pub method: String,
    /// Per dataset, in the order of [`Aggregate::datasets`].
    pub per_dataset: Vec<Option<f64>>,
    /// Items scored (the AUROC's n) per dataset, and items left unscored there.
    #[serde(default)]
    pub per_dataset_n: Vec<u64>,
    #[serde(default)]
    pub per_dataset_unscored: Vec<u64>,
    /// The mean AUROC with its 95% interval (`newcombe_mean`; `delong_mean` in reports
    /// written before issue 45); `None` when a dataset lacks the AUROC.
    pub aggregate_auroc: Option<Interval>,
    /// Quality vs ChainPoll; `None` when undefined (a missing AUROC, or ChainPoll at chance).
    pub quality_vs_chainpoll: Option<f64>,
    /// Why a figure is missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A judge's RealHall aggregate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Aggregate {
    pub model: String,
    pub datasets: Vec<String>,
    /// The ChainPoll metric taken as "ChainPoll" on each dataset.
    pub chainpoll_metric: Vec<Metric>,
    pub rows: Vec<AggregateRow>,
}

/// The RealHall metric of a dataset: Adherence when it was run there, else Correctness.
fn realhall_metric(r: &Report) -> Metric {
    if r.metrics.iter().any(|m| m.metric == Metric::Adherence) {
        Metric::Adherence
    } else {
        Metric::Correctness
    }
}

fn metric_ranking(r: &Report, metric: Metric) -> Option<&Ranking> {
    r.metrics.iter().find(|m| m.metric == metric).map(|m| &m.ranking)
}

/// A dataset's AUROC and class sizes (Newcombe's interval does not use the variance).
fn part_of(k: &Ranking) -> Option<DelongAuroc> {
    Some(DelongAuroc {
        auroc: k.auroc?,
        variance: k.auroc_variance.unwrap_or(0.0),
        positives: k.scored_positive,
        negatives: k.scored - k.scored_positive,
    })
}

fn row(
    method: &str,
    datasets: &[String],
    per: Vec<Option<&Ranking>>,
    chainpoll: &[Option<f64>],
) -> AggregateRow {
    let per_dataset: Vec<Option<f64>> = per.iter().map(|k| k.and_then(|k| k.auroc)).collect();
    let names = |f: &dyn Fn(&Option<&Ranking>) -> bool| -> Vec<&str> {
        datasets.iter().zip(&per).filter(|(_, k)| f(k)).map(|(d, _)| d.as_str()).collect()
    };
    let missing = names(&|k| k.and_then(|k| k.auroc).is_none());
    let parts: Option<Vec<DelongAuroc>> = per.iter().map(|k| k.and_then(part_of)).collect();
    let values: Option<Vec<f64>> = per_dataset.iter().copied().collect();
    let aggregate_auroc = parts.and_then(|p| mean_auroc_newcombe(&p).ok());
    let reference: Option<Vec<f64>> = chainpoll.iter().copied().collect();
    let quality_vs_chainpoll = match (values, reference) {
        (Some(v), Some(r)) => relative_quality(&v, &r).ok(),
        _ => None,
    };
    let mut notes = Vec::new();
    if !missing.is_empty() {
        notes.push(format!("no AUROC on: {}", missing.join(", ")));
    }
    AggregateRow {
        method: method.into(),
        per_dataset,
        per_dataset_n: per.iter().map(|k| k.map_or(0, |k| k.scored)).collect(),
        per_dataset_unscored: per.iter().map(|k| k.map_or(0, |k| k.unscored)).collect(),
        aggregate_auroc,
        quality_vs_chainpoll,
        note: (!notes.is_empty()).then(|| notes.join("; ")),
    }
}

/// The aggregate of one judge over its per-dataset reports (`(dataset name, report)`, one
/// per dataset, all of the same judge). `None` for no reports.
pub fn realhall_aggregate(per_dataset: &[(String, &Report)]) -> Option<Aggregate> {
    let (_, first) = per_dataset.first()?;
    let datasets: Vec<String> = per_dataset.iter().map(|(d, _)| d.clone()).collect();
    let chosen: Vec<Metric> = per_dataset.iter().map(|(_, r)| realhall_metric(r)).collect();
    let chainpoll: Vec<Option<&Ranking>> =
        per_dataset.iter().zip(&chosen).map(|((_, r), m)| metric_ranking(r, *m)).collect();
    let reference: Vec<Option<f64>> = chainpoll.iter().map(|k| k.and_then(|k| k.auroc)).collect();
    let mut rows = vec![row("chainpoll", &datasets, chainpoll, &reference)];
    for metric in [Metric::Correctness, Metric::Adherence] {
        let per: Vec<Option<&Ranking>> =
            per_dataset.iter().map(|(_, r)| metric_ranking(r, metric)).collect();
        if per.iter().any(Option::is_some) {
            rows.push(row(&format!("chainpoll_{}", metric.as_str()), &datasets, per, &reference));
        }
    }
    type Pick = fn(&Report) -> Option<&Ranking>;
    let baselines: [(&str, Pick); 6] = [
        ("selfcheck_avg", |r| r.selfcheck_avg.as_ref()),
        ("selfcheck_max", |r| r.selfcheck_max.as_ref()),
        ("pseudo_entropy_max", |r| r.logprob_baselines.pseudo_entropy_max.as_ref()),
        ("pseudo_entropy_mean", |r| r.logprob_baselines.pseudo_entropy_mean.as_ref()),
        ("avg_neg_logprob", |r| r.logprob_baselines.avg_neg_logprob.as_ref()),
        ("max_neg_logprob", |r| r.logprob_baselines.max_neg_logprob.as_ref()),
    ];
    for (name, pick) in baselines {
        let per: Vec<Option<&Ranking>> = per_dataset.iter().map(|(_, r)| pick(r)).collect();
        rows.push(row(name, &datasets, per, &reference));
    }
    Some(Aggregate { model: first.model.clone(), datasets, chainpoll_metric: chosen, rows })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chainpoll::score::{CommonSubset, LogprobReport, MetricReport};
    use crate::metrics::interval::{auroc_newcombe, CiMethod};

    fn ranking(auroc: f64) -> Ranking {
        Ranking {
            scored: 20,
            scored_positive: 10,
            auroc: Some(auroc),
            auroc_variance: Some(0.001),
            ..Ranking::default()
        }
    }

    fn report(metrics: &[(Metric, f64)], selfcheck: Option<f64>) -> Report {
        Report {
            pipeline: "chainpoll".into(),
            model: "j".into(),
            items: 20,
            positives: 10,
            negatives: 10,
            polls_per_item: 5,
            unparseable_policy: "exclude".into(),
            verdict_rule: String::new(),
            metrics: metrics
                .iter()
                .map(|&(metric, a)| MetricReport {
                    metric,
                    ranking: ranking(a),
                    polls: 0,
                    yes: 0,
                    no: 0,
                    unparseable: 0,
                    unparseable_by_reason: Default::default(),
                    failed: 0,
                })
                .collect(),
            selfcheck_avg: selfcheck.map(ranking),
            selfcheck_max: None,
            selfcheck_all_samples_failed: None,
            logprob_baselines: LogprobReport::default(),
            common_subset: CommonSubset::default(),
        }
    }

    /// The spec's worked example (§5.4): ChainPoll [0.8, 0.75, 0.7, 0.9] → 0.7875, another
    /// method [0.6, 0.65, 0.55, 0.7] → 0.625, quality 0.434782609; Adherence stands for
    /// ChainPoll on the closed-domain datasets; a method missing somewhere has no aggregate.
    #[test]
    fn worked_example() {
        use Metric::{Adherence as A, Correctness as C};
        let reports = [
            report(&[(C, 0.8)], Some(0.6)),
            report(&[(C, 0.75)], Some(0.65)),
            report(&[(C, 0.3), (A, 0.7)], Some(0.55)),
            report(&[(C, 0.2), (A, 0.9)], Some(0.7)),
        ];
        let per: Vec<(String, &Report)> =
            reports.iter().enumerate().map(|(i, r)| (format!("d{i}"), r)).collect();
        let agg = realhall_aggregate(&per).unwrap();
        assert_eq!(agg.chainpoll_metric, [C, C, A, A]);
        let get = |m: &str| agg.rows.iter().find(|r| r.method == m).unwrap();
        let cp = get("chainpoll").aggregate_auroc.unwrap();
        assert!((cp.estimate - 0.7875).abs() < 1e-12);
        // Square-and-add of the four datasets' Newcombe intervals (10 + 10 items each).
        let above: f64 = [0.8, 0.75, 0.7, 0.9]
            .iter()
            .map(|&a| (auroc_newcombe(a, 10, 10).unwrap().high.unwrap() - a).powi(2))
            .sum();
        let half = above.sqrt() / 4.0;
        assert!((cp.high.unwrap() - cp.estimate - half).abs() < 1e-12 && cp.n == 80, "{cp:?}");
        assert_eq!(cp.method, CiMethod::NewcombeMean);
        assert_eq!(get("chainpoll").per_dataset_n, [20, 20, 20, 20]);
        let sc = get("selfcheck_avg");
        assert!((sc.aggregate_auroc.unwrap().estimate - 0.625).abs() < 1e-12);
        assert!((sc.quality_vs_chainpoll.unwrap() - 0.434782609).abs() < 1e-9);
        assert_eq!(get("chainpoll").quality_vs_chainpoll, Some(1.0));
        let adh = get("chainpoll_adherence");
        assert_eq!(adh.per_dataset, [None, None, Some(0.7), Some(0.9)]);
        assert!(adh.aggregate_auroc.is_none() && adh.note.as_deref().unwrap().contains("d0, d1"));
        let pe = get("pseudo_entropy_max");
        assert!(pe.aggregate_auroc.is_none() && pe.quality_vs_chainpoll.is_none());
        assert!(realhall_aggregate(&[]).is_none());
    }

    /// Issue 45 (6): a dataset without a DeLong variance (a class of one item) or with a
    /// variance of 0 (perfect separation) does not narrow the aggregate: it counts with its
    /// own Newcombe interval, so the aggregate is wider than the other dataset's alone
    /// would make it, never narrower.
    #[test]
    fn aggregate_with_a_collapsed_delong_variance_stays_wide() {
        use Metric::Correctness as C;
        let mut r1 = report(&[(C, 0.8)], None);
        r1.metrics[0].ranking.auroc_variance = None;
        let mut r0 = report(&[(C, 1.0)], None);
        r0.metrics[0].ranking.auroc_variance = Some(0.0);
        let r2 = report(&[(C, 0.6)], None);
        let other = auroc_newcombe(0.6, 10, 10).unwrap();
        for (name, r) in [("one item of a class", &r1), ("perfect separation", &r0)] {
            let agg = realhall_aggregate(&[("d1".into(), r), ("d2".into(), &r2)]).unwrap();
            let cp = &agg.rows[0];
            let ci = cp.aggregate_auroc.unwrap();
            let (l, h) = ci.bounds().unwrap_or_else(|| panic!("{name}: {ci:?}"));
            // The mean of two: with the first dataset's interval of width 0, the aggregate's
            // would be half the other's; it is wider.
            let (ol, oh) = other.bounds().unwrap();
            assert!(h - l > (oh - ol) / 2.0 + 0.01, "{name}: {ci:?}");
            assert!(cp.note.is_none(), "{name}: {:?}", cp.note);
        }
    }
}

//! RealHall's aggregate over datasets (spec `metrics.md` §3.2): for one judge, the
//! unweighted mean of its per-dataset AUROCs for every method (ChainPoll, each ChainPoll
//! metric, the SelfCheck-NGram Avg and Max baselines, pseudo-entropy), with a 95%
//! interval from the per-dataset DeLong variances (the datasets are independent), and
//! "quality vs ours" (ChainPoll Table 5, note e):
//! `mean_d(AUROC_d − 0.5) / mean_d(AUROC_d^ChainPoll − 0.5)`.
//!
//! "ChainPoll" on a dataset is the metric RealHall uses there: Adherence on closed-domain
//! datasets (those benchmarked with `adherence`, which needs their context documents),
//! Correctness on the others (the paper's Tables 1, 3 and 4). A method missing on some
//! dataset (no sampler, no probability model, an undefined AUROC) has no aggregate, and the
//! row says on which datasets it is missing.

use serde::{Deserialize, Serialize};

use super::plan::Metric;
use super::score::{Ranking, Report};
use crate::metrics::auroc::relative_quality;
use crate::metrics::interval::{mean_auroc_delong, DelongAuroc, Interval};

/// One method's AUROCs over the datasets.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AggregateRow {
    /// `chainpoll`, `chainpoll_correctness`, `chainpoll_adherence`, `selfcheck_avg`,
    /// `selfcheck_max` or `pseudo_entropy`.
    pub method: String,
    /// Per dataset, in the order of [`Aggregate::datasets`].
    pub per_dataset: Vec<Option<f64>>,
    /// The mean AUROC with its 95% interval (`delong_mean`); `None` when a dataset lacks it.
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

fn delong_of(k: &Ranking) -> Option<DelongAuroc> {
    Some(DelongAuroc {
        auroc: k.auroc?,
        variance: k.auroc_variance?,
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
    let missing: Vec<&str> = datasets
        .iter()
        .zip(&per)
        .filter(|(_, k)| k.and_then(delong_of).is_none())
        .map(|(d, _)| d.as_str())
        .collect();
    let parts: Option<Vec<DelongAuroc>> = per.iter().map(|k| k.and_then(delong_of)).collect();
    let aggregate_auroc = parts.and_then(|p| mean_auroc_delong(&p).ok());
    let values: Option<Vec<f64>> = per_dataset.iter().copied().collect();
    let reference: Option<Vec<f64>> = chainpoll.iter().copied().collect();
    let quality_vs_chainpoll = match (values, reference) {
        (Some(v), Some(r)) => relative_quality(&v, &r).ok(),
        _ => None,
    };
    AggregateRow {
        method: method.into(),
        per_dataset,
        aggregate_auroc,
        quality_vs_chainpoll,
        note: (!missing.is_empty())
            .then(|| format!("no AUROC with a DeLong variance on: {}", missing.join(", "))),
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
    let baselines: [(&str, Pick); 3] = [
        ("selfcheck_avg", |r| r.selfcheck_avg.as_ref()),
        ("selfcheck_max", |r| r.selfcheck_max.as_ref()),
        ("pseudo_entropy", |r| r.pseudo_entropy.ranking.as_ref()),
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
    use crate::chainpoll::score::{MetricReport, PseudoEntropyReport};
    use crate::metrics::interval::Z95;

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
                    failed: 0,
                })
                .collect(),
            selfcheck_avg: selfcheck.map(ranking),
            selfcheck_max: None,
            selfcheck_all_samples_failed: None,
            pseudo_entropy: PseudoEntropyReport::default(),
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
        let half = Z95 * (4.0f64 * 0.001).sqrt() / 4.0;
        assert!((cp.high - cp.estimate - half).abs() < 1e-12 && cp.n == 80, "{cp:?}");
        let sc = get("selfcheck_avg");
        assert!((sc.aggregate_auroc.unwrap().estimate - 0.625).abs() < 1e-12);
        assert!((sc.quality_vs_chainpoll.unwrap() - 0.434782609).abs() < 1e-9);
        assert_eq!(get("chainpoll").quality_vs_chainpoll, Some(1.0));
        let adh = get("chainpoll_adherence");
        assert_eq!(adh.per_dataset, [None, None, Some(0.7), Some(0.9)]);
        assert!(adh.aggregate_auroc.is_none() && adh.note.as_deref().unwrap().contains("d0, d1"));
        let pe = get("pseudo_entropy");
        assert!(pe.aggregate_auroc.is_none() && pe.quality_vs_chainpoll.is_none());
        assert!(realhall_aggregate(&[]).is_none());
    }
}

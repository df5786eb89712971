//! ChainPoll figures from the item labels (spec `metrics.md` §3.1, §3.2, §3.4): per
//! metric, AUROC of the ChainPoll score against the labels (hallucinated positive, ties
//! counted ½), with the poll counts behind it; the same for the SelfCheck-NGram Avg and
//! Max passage scores, and for the pseudo-entropy of a probability model. Items without a
//! score (every poll failed or unparseable under `exclude`; every sample failed; no
//! log-probabilities) are left out of that AUROC and counted. Every AUROC carries its 95%
//! DeLong interval and variance (issue 16); [`super::aggregate`] combines datasets.

use serde::{Deserialize, Serialize};

use super::plan::{ItemLabel, Metric};
use crate::metrics::auroc::auroc;
use crate::metrics::interval::{auroc_delong, delong, with_bracket, Interval};

/// AUROC of one score over the items that have it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Ranking {
    /// Items with a score (the AUROC's n), and how many of them are hallucinated.
    pub scored: u64,
    pub scored_positive: u64,
    /// Items without a score.
    pub unscored: u64,
    /// `None` when the scored items hold only one class.
    pub auroc: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auroc_error: Option<String>,
    /// 95% DeLong interval of the AUROC (`None` with fewer than 2 items of a class).
    #[serde(default)]
    pub auroc_ci95: Option<Interval>,
    /// DeLong's variance of the AUROC (what the aggregate over datasets combines).
    #[serde(default)]
    pub auroc_variance: Option<f64>,
    /// Mean score of hallucinated and of faithful items.
    pub mean_positive: Option<f64>,
    pub mean_negative: Option<f64>,
}

/// One metric's figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetricReport {
    pub metric: Metric,
    #[serde(flatten)]
    pub ranking: Ranking,
    pub polls: u64,
    pub yes: u64,
    pub no: u64,
    pub unparseable: u64,
    pub failed: u64,
}

/// The figures of one (benchmark, judge model).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub pipeline: String,
    pub model: String,
    pub items: u64,
    pub positives: u64,
    pub negatives: u64,
    pub polls_per_item: u32,
    /// `exclude` or `count_as_no`.
    pub unparseable_policy: String,
    /// How a poll's verdict is read ([`VERDICT_RULE`]).
    pub verdict_rule: String,
    pub metrics: Vec<MetricReport>,
    /// SelfCheck-NGram unigram baseline (Avg and Max passage scores), with a sampler.
    pub selfcheck_avg: Option<Ranking>,
    pub selfcheck_max: Option<Ranking>,
    /// Items whose SelfCheck samples all failed (unscored, not scored on the completion
    /// alone); with a sampler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selfcheck_all_samples_failed: Option<u64>,
    /// The pseudo-entropy baseline (spec §3.3).
    pub pseudo_entropy: PseudoEntropyReport,
}

/// The pseudo-entropy baseline of one judge's benchmark: its AUROC, or why there is none.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PseudoEntropyReport {
    /// The probability model (sweep alias).
    pub model: Option<String>,
    /// Score = mean per-token pseudo-entropy of the completion under that model.
    pub ranking: Option<Ranking>,
    /// Why there is no figure (no probability model, or one that cannot score a text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_computed: Option<String>,
}

/// The verdict-parsing rule, as the report states it.
pub const VERDICT_RULE: &str = "the last standalone word \"yes\" or \"no\" (case-insensitive) of the poll's output; the prompts ask for a final line \"Answer: yes\" or \"Answer: no\"; a poll with neither word is unparseable";

fn ranking(pairs: &[(bool, Option<f64>)]) -> Ranking {
    let scored: Vec<(bool, f64)> = pairs.iter().filter_map(|(l, s)| s.map(|s| (*l, s))).collect();
    let labels: Vec<bool> = scored.iter().map(|p| p.0).collect();
    let scores: Vec<f64> = scored.iter().map(|p| p.1).collect();
    let mean = |class: bool| {
        let v: Vec<f64> = scored.iter().filter(|p| p.0 == class).map(|p| p.1).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let (auroc, auroc_error) = match auroc(&labels, &scores) {
        Ok(a) => (Some(a), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let auroc_ci95 = auroc_delong(&labels, &scores).ok();
    let auroc_variance = delong(&labels, &scores).ok().map(|d| d.variance);
    Ranking {
        scored: scored.len() as u64,
        scored_positive: labels.iter().filter(|l| **l).count() as u64,
        unscored: (pairs.len() - scored.len()) as u64,
        auroc,
        auroc_error,
        auroc_ci95,
        auroc_variance,
        mean_positive: mean(true),
        mean_negative: mean(false),
    }
}

/// Score one judge's labels.
pub fn score(cfg: &super::Config, labels: &[ItemLabel]) -> Report {
    let metrics = cfg
        .metrics
        .iter()
        .map(|&metric| {
            let of = |l: &ItemLabel| l.metrics.iter().find(|m| m.metric == metric).cloned();
            let pairs: Vec<(bool, Option<f64>)> =
                labels.iter().map(|l| (l.label, of(l).and_then(|m| m.score))).collect();
            let polls: Vec<super::Poll> =
                labels.iter().filter_map(of).flat_map(|m| m.polls).collect();
            let count =
                |f: &dyn Fn(&super::Poll) -> bool| polls.iter().filter(|p| f(p)).count() as u64;
            MetricReport {
                metric,
                ranking: ranking(&pairs),
                polls: polls.len() as u64,
                yes: count(&|p| p.verdict == Some(true)),
                no: count(&|p| p.verdict == Some(false)),
                unparseable: count(&|p| p.verdict.is_none() && p.error.is_none()),
                failed: count(&|p| p.error.is_some()),
            }
        })
        .collect();
    let baseline = |pick: fn(&super::SelfCheckLabel) -> Option<f64>| {
        cfg.sampler.as_ref().map(|_| {
            let pairs: Vec<(bool, Option<f64>)> =
                labels.iter().map(|l| (l.label, l.selfcheck.as_ref().and_then(pick))).collect();
            ranking(&pairs)
        })
    };
    let positives = labels.iter().filter(|l| l.label).count() as u64;
    Report {
        pipeline: super::PIPELINE.into(),
        model: cfg.judge.name.clone(),
        items: labels.len() as u64,
        positives,
        negatives: labels.len() as u64 - positives,
        polls_per_item: cfg.polls,
        unparseable_policy: match cfg.unparseable {
            crate::metrics::chainpoll::Unparseable::Exclude => "exclude".into(),
            crate::metrics::chainpoll::Unparseable::CountAsNo => "count_as_no".into(),
        },
        verdict_rule: VERDICT_RULE.into(),
        metrics,
        selfcheck_avg: baseline(|s| s.avg),
        selfcheck_max: baseline(|s| s.max),
        selfcheck_all_samples_failed: cfg.sampler.as_ref().map(|(_, s)| {
            let all_failed = |l: &&ItemLabel| {
                l.selfcheck.as_ref().is_some_and(|c| c.samples == 0 && c.failed_samples == *s)
            };
            labels.iter().filter(all_failed).count() as u64
        }),
        pseudo_entropy: pseudo_entropy_report(cfg, labels),
    }
}

fn pseudo_entropy_report(cfg: &super::Config, labels: &[ItemLabel]) -> PseudoEntropyReport {
    let Some(m) = &cfg.probability else {
        return PseudoEntropyReport {
            not_computed: Some("no probability model configured".into()),
            ..PseudoEntropyReport::default()
        };
    };
    let model = Some(m.name.clone());
    if let Err(why) = super::baselines::probability_support(m) {
        return PseudoEntropyReport { model, ranking: None, not_computed: Some(why) };
    }
    let pairs: Vec<(bool, Option<f64>)> =
        labels.iter().map(|l| (l.label, l.pseudo_entropy.as_ref().and_then(|p| p.score))).collect();
    PseudoEntropyReport { model, ranking: Some(ranking(&pairs)), not_computed: None }
}

fn num(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{v:.4}"))
}

/// An AUROC with its DeLong interval in brackets.
fn auroc_text(r: Option<&Ranking>) -> String {
    r.map_or("–".into(), |r| with_bracket(r.auroc, r.auroc_ci95.as_ref(), 1.0, 4))
}

/// The benchmark's Markdown section: a leaderboard of judges by AUROC, then the counts.
pub fn render_markdown(title: &str, reports: &[Report]) -> String {
    let mut md = format!(
        "## {title}\n\nAUROC against the labels (hallucinated = positive, ties count ½), in brackets its 95% DeLong interval; ChainPoll score = share of \"yes\" polls. Verdict: {VERDICT_RULE}.\n\n"
    );
    let Some(first) = reports.first() else { return md };
    let mut head = String::from("| judge |");
    for m in &first.metrics {
        head.push_str(&format!(" ChainPoll-{} AUROC |", m.metric.as_str()));
    }
    head.push_str(
        " SelfCheck-1gram Avg AUROC | SelfCheck-1gram Max AUROC | pseudo-entropy AUROC |\n|---|",
    );
    head.push_str(&"---|".repeat(first.metrics.len() + 3));
    md.push_str(&head);
    md.push('\n');
    let mut order: Vec<&Report> = reports.iter().collect();
    let key = |r: &Report| r.metrics.first().and_then(|m| m.ranking.auroc).unwrap_or(-1.0);
    order.sort_by(|a, b| key(b).total_cmp(&key(a)).then(a.model.cmp(&b.model)));
    for r in order {
        md.push_str(&format!("| `{}` |", r.model));
        for m in &r.metrics {
            md.push_str(&format!(" {} |", auroc_text(Some(&m.ranking))));
        }
        md.push_str(&format!(
            " {} | {} | {} |\n",
            auroc_text(r.selfcheck_avg.as_ref()),
            auroc_text(r.selfcheck_max.as_ref()),
            r.pseudo_entropy.ranking.as_ref().map_or("n/c".into(), |s| auroc_text(Some(s)))
        ));
    }
    for r in reports {
        md.push_str(&format!(
            "\n### `{}`\n\n{} items ({} hallucinated, {} not), {} polls per item; unparseable polls: {}; failed polls are left out of N.\n\n",
            r.model,
            r.items,
            r.positives,
            r.negatives,
            r.polls_per_item,
            if r.unparseable_policy == "exclude" { "left out of N" } else { "counted as \"no\"" }
        ));
        md.push_str("| score | scored | unscored | AUROC | mean (halluc.) | mean (faithful) | polls | yes | no | unparseable | failed |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
        let row = |name: String, k: &Ranking, polls: Option<&MetricReport>| {
            let p = |f: fn(&MetricReport) -> u64| polls.map_or("–".into(), |m| f(m).to_string());
            format!(
                "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                k.scored,
                k.unscored,
                auroc_text(Some(k)),
                num(k.mean_positive),
                num(k.mean_negative),
                p(|m| m.polls),
                p(|m| m.yes),
                p(|m| m.no),
                p(|m| m.unparseable),
                p(|m| m.failed)
            )
        };
        for m in &r.metrics {
            md.push_str(&row(format!("ChainPoll-{}", m.metric.as_str()), &m.ranking, Some(m)));
        }
        for (name, s) in [
            ("SelfCheck-1gram Avg", &r.selfcheck_avg),
            ("SelfCheck-1gram Max", &r.selfcheck_max),
            ("pseudo-entropy", &r.pseudo_entropy.ranking),
        ] {
            if let Some(s) = s {
                md.push_str(&row(name.into(), s, None));
            }
        }
        if let Some(why) = &r.pseudo_entropy.not_computed {
            md.push_str(&format!("\nPseudo-entropy: not computed ({why}).\n"));
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chainpoll::{Config, ItemLabel};
    use crate::common::ModelSpec;
    use crate::metrics::chainpoll::Unparseable;
    use halyard_proto::ModelRef;
    use serde_json::{json, Value};

    fn spec(name: &str, backend: &str) -> ModelSpec {
        ModelSpec {
            name: name.into(),
            model_ref: ModelRef {
                backend: backend.into(),
                endpoint: "http://x".into(),
                model: name.into(),
            },
            pool: name.into(),
            api_key_env: None,
            temperature: 0.7,
            max_tokens: None,
            seed: None,
            timeout_ms: 1000,
        }
    }

    fn config(sampler: bool, probability: bool) -> Config {
        Config {
            judge: spec("j", "openai"),
            polls: 1,
            metrics: vec![Metric::Correctness],
            unparseable: Unparseable::Exclude,
            sampler: sampler.then(|| (spec("s", "openai"), 2)),
            probability: probability.then(|| spec("p", "gguf")),
        }
    }

    /// A label with a ChainPoll score (`None`: its one poll is unparseable), and optional
    /// SelfCheck and token-log-probability scores.
    fn label(i: usize, positive: bool, cp: Option<f64>, sc: Option<f64>, lp: Option<f64>) -> ItemLabel {
        let poll = match cp {
            Some(s) => json!({"output": "Answer: x", "verdict": s > 0.5}),
            None => json!({"output": "Hmm.", "verdict": null, "unreadable": "no_answer_line"}),
        };
        let mut v = json!({
            "pipeline": "chainpoll", "model": "j", "index": i, "id": i.to_string(), "line": i + 1,
            "label": positive,
            "metrics": [{"metric": "correctness", "polls": [poll], "score": cp}],
        });
        if let Some(s) = sc {
            v["selfcheck"] = json!({"samples": 2, "failed_samples": 0, "avg": s, "max": s});
        }
        if let Some(p) = lp {
            v["logprob_scores"] = json!({
                "tokens": 3, "pseudo_entropy_max": p, "pseudo_entropy_mean": p / 2.0,
                "avg_neg_logprob": p, "max_neg_logprob": p});
        }
        serde_json::from_value(v).unwrap()
    }

    /// Issue 29 (6): a judge that always answers "no" on 100 items has AUROC 0.5 and an
    /// interval that cannot be estimated (no variation in scores), not [0.5, 0.5]; the
    /// same for perfect separation and for a class of one item.
    #[test]
    fn collapsed_intervals_are_not_estimable() {
        let cfg = config(false, false);
        let always_no: Vec<ItemLabel> =
            (0..100).map(|i| label(i, i % 2 == 0, Some(0.0), None, None)).collect();
        let r = score(&cfg, &always_no);
        let md = render_markdown("t", std::slice::from_ref(&r));
        assert!(!md.contains("[0.5000, 0.5000]"), "{md}");
        assert!(md.contains("0.5000 [not estimable: no variation in scores]"), "{md}");
        let j = serde_json::to_value(&r).unwrap();
        let ci = &j["metrics"][0]["auroc_ci95"];
        assert!(ci["low"].is_null() && ci["high"].is_null(), "{ci}");
        assert_eq!(ci["not_estimable"], "no variation in scores");
        let perfect: Vec<ItemLabel> = (0..10)
            .map(|i| label(i, i % 2 == 0, Some(if i % 2 == 0 { 1.0 } else { 0.0 }), None, None))
            .collect();
        let md = render_markdown("t", &[score(&cfg, &perfect)]);
        assert!(!md.contains("[1.0000, 1.0000]"), "{md}");
        assert!(md.contains("1.0000 [not estimable: perfect separation"), "{md}");
        let one_positive: Vec<ItemLabel> =
            (0..5).map(|i| label(i, i == 0, Some(0.2 * i as f64), None, None)).collect();
        let md = render_markdown("t", &[score(&cfg, &one_positive)]);
        assert!(md.contains("[not estimable: fewer than 2 items of a class"), "{md}");
    }

    /// Issue 29 (7, 8): the token-log-probability baselines are reported as the paper's
    /// Max pseudo-entropy, the mean pseudo-entropy, and SelfCheckGPT's Avg(−log p) and
    /// Max(−log p), each named for what it is, with its AUROC; items without
    /// log-probabilities are counted beside them.
    #[test]
    fn logprob_baselines_named_for_what_they_are() {
        let cfg = config(false, true);
        let labels: Vec<ItemLabel> = (0..8)
            .map(|i| {
                let lp = (i != 7).then_some(if i % 2 == 0 { 2.0 + i as f64 } else { 1.0 });
                label(i, i % 2 == 0, Some(0.5), None, lp)
            })
            .collect();
        let r = score(&cfg, &labels);
        let j = serde_json::to_value(&r).unwrap();
        let b = &j["logprob_baselines"];
        for key in ["pseudo_entropy_max", "pseudo_entropy_mean", "avg_neg_logprob", "max_neg_logprob"]
        {
            assert_eq!(b[key]["auroc"], 1.0, "{key}: {b}");
            assert_eq!((b[key]["scored"].as_u64(), b[key]["unscored"].as_u64()), (Some(7), Some(1)));
        }
        let md = render_markdown("t", &[r]);
        for name in ["Max pseudo-entropy", "Mean pseudo-entropy", "Avg(−log p)", "Max(−log p)"] {
            assert!(md.contains(&format!("| {name} |")), "{name}: {md}");
            assert!(md.contains(&format!("{name} AUROC")), "{name}: {md}");
        }
        assert!(!md.contains("| pseudo-entropy |"), "{md}");
    }

    /// Issue 29 (11): methods scored on different items are also reported on the common
    /// subset (items every method scored), with both n.
    #[test]
    fn common_subset_beside_all_scored() {
        let cfg = config(true, false);
        let labels: Vec<ItemLabel> = (0..12)
            .map(|i| {
                let pos = i % 2 == 0;
                let cp = (i != 0).then_some(if pos { 0.8 } else { 0.2 });
                let sc = (i != 1 && i != 3).then_some(if pos { 1.0 + i as f64 } else { 12.0 - i as f64 });
                label(i, pos, cp, sc, None)
            })
            .collect();
        let r = score(&cfg, &labels);
        let j = serde_json::to_value(&r).unwrap();
        assert_eq!(j["common_subset"]["items"], 9);
        let cp = &j["metrics"][0];
        assert_eq!((cp["scored"].as_u64(), cp["on_common_subset"]["scored"].as_u64()), (Some(11), Some(9)));
        assert_eq!(j["selfcheck_avg"]["on_common_subset"]["scored"], 9);
        let md = render_markdown("t", &[r]);
        assert!(md.contains("common subset"), "{md}");
        assert!(md.contains("(n=9)"), "{md}");
    }
}

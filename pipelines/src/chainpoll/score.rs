//! ChainPoll figures from the item labels (spec `metrics.md` §3.1, §3.2, §3.4): per
//! metric, AUROC of the ChainPoll score against the labels (hallucinated positive, ties
//! counted ½), with the poll counts behind it; the same for the SelfCheck-NGram Avg and
//! Max passage scores, and for the scores from a probability model's token
//! log-probabilities (issue 29: the seed paper's **Max** pseudo-entropy, the mean
//! pseudo-entropy, SelfCheckGPT's Avg(−log p) and Max(−log p), each named for what it is).
//!
//! Items without a score (every poll failed or unparseable under `exclude`; every sample
//! failed; no log-probabilities) are left out of that AUROC and counted, by reason. Every
//! AUROC carries its 95% DeLong interval and variance (issue 16), or says why the interval
//! is not estimable (issue 29). Methods can score different items; each AUROC is also
//! given on the **common subset**, the items every computed method scored (issue 29), so
//! that two methods' figures can be compared on the same items. [`super::aggregate`]
//! combines datasets.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::baselines::LogprobScores;
use super::plan::{ItemLabel, Metric};
use crate::metrics::auroc::auroc;
use crate::metrics::chainpoll::Unreadable;
use crate::metrics::interval::{auroc_delong, delong, with_bracket, Interval};

/// The AUROC of one score on a subset of the items.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SubsetAuroc {
    /// Items of the subset (the AUROC's n), and how many are hallucinated.
    pub scored: u64,
    pub scored_positive: u64,
    /// `None` when the subset holds only one class (or no item).
    pub auroc: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auroc_error: Option<String>,
    /// 95% DeLong interval, or why it is not estimable.
    #[serde(default)]
    pub auroc_ci95: Option<Interval>,
}

/// AUROC of one score over the items that have it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Ranking {
    /// Items with a score (the AUROC's n), and how many of them are hallucinated.
    pub scored: u64,
    pub scored_positive: u64,
    /// Items without a score.
    pub unscored: u64,
    /// Why items have no score, with their counts (issue 29).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unscored_by_reason: BTreeMap<String, u64>,
    /// `None` when the scored items hold only one class.
    pub auroc: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auroc_error: Option<String>,
    /// 95% DeLong interval of the AUROC, or why it is not estimable (fewer than 2 items of
    /// a class, no variation in the scores, perfect separation); `None` without an AUROC.
    #[serde(default)]
    pub auroc_ci95: Option<Interval>,
    /// DeLong's variance of the AUROC (what the aggregate over datasets combines).
    #[serde(default)]
    pub auroc_variance: Option<f64>,
    /// Mean score of hallucinated and of faithful items.
    pub mean_positive: Option<f64>,
    pub mean_negative: Option<f64>,
    /// The AUROC on the items every computed method of the report scored (issue 29).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_common_subset: Option<SubsetAuroc>,
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
    /// Unparseable polls by why (issue 29): an empty output, or no final answer line.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unparseable_by_reason: BTreeMap<Unreadable, u64>,
    pub failed: u64,
}

/// The items every computed method scored.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CommonSubset {
    pub items: u64,
    pub positives: u64,
    /// The methods it is common to (report names, as in the tables).
    pub methods: Vec<String>,
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
    /// The baselines from the probability model's token log-probabilities.
    pub logprob_baselines: LogprobReport,
    /// The items every computed method scored, on which each AUROC is also given.
    pub common_subset: CommonSubset,
}

/// The token-log-probability baselines of one judge's benchmark (spec §3.3; issue 29):
/// their AUROCs, or why there are none.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LogprobReport {
    /// The probability model (sweep alias).
    pub model: Option<String>,
    /// Score = max over the completion's tokens of the per-token pseudo-entropy (the seed
    /// paper's "Max pseudo-entropy").
    pub pseudo_entropy_max: Option<Ranking>,
    /// Score = mean over the completion's tokens of the per-token pseudo-entropy.
    pub pseudo_entropy_mean: Option<Ranking>,
    /// SelfCheckGPT's Avg(−log p) of the completion.
    pub avg_neg_logprob: Option<Ranking>,
    /// SelfCheckGPT's Max(−log p) of the completion.
    pub max_neg_logprob: Option<Ranking>,
    /// Why there is no figure (no probability model, or one that cannot score a text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_computed: Option<String>,
}

/// The verdict-parsing rule, as the report states it.
pub const VERDICT_RULE: &str = "the poll's last non-empty line must be \"Answer: yes\" or \"Answer: no\" (case-insensitive, Markdown emphasis ignored), the final line the prompts require; any other poll (empty, a refusal, a verdict in prose, a stray \"yes\"/\"no\" in the reasoning) is unparseable";

/// Report names of the methods, as the tables print them.
pub const CHAINPOLL_PREFIX: &str = "ChainPoll-";
pub const SELFCHECK_AVG: &str = "SelfCheck-1gram Avg";
pub const SELFCHECK_MAX: &str = "SelfCheck-1gram Max";
pub const PSEUDO_ENTROPY_MAX: &str = "Max pseudo-entropy";
pub const PSEUDO_ENTROPY_MEAN: &str = "Mean pseudo-entropy";
pub const AVG_NEG_LOGPROB: &str = "Avg(−log p)";
pub const MAX_NEG_LOGPROB: &str = "Max(−log p)";

/// An item's score under one method, or why it has none.
type Scored = Result<f64, String>;

fn subset_auroc(pairs: &[(bool, f64)]) -> (Option<f64>, Option<String>, Option<Interval>) {
    let labels: Vec<bool> = pairs.iter().map(|p| p.0).collect();
    let scores: Vec<f64> = pairs.iter().map(|p| p.1).collect();
    match auroc(&labels, &scores) {
        Ok(a) => (Some(a), None, auroc_delong(&labels, &scores).ok()),
        Err(e) => (None, Some(e.to_string()), None),
    }
}

/// The ranking of one method over all items (`scores[i]` of item i), with its AUROC on
/// the items where `common[i]`.
fn ranking(labels: &[bool], scores: &[Scored], common: Option<&[bool]>) -> Ranking {
    let scored: Vec<(bool, f64)> =
        labels.iter().zip(scores).filter_map(|(l, s)| s.as_ref().ok().map(|s| (*l, *s))).collect();
    let mut unscored_by_reason = BTreeMap::new();
    for why in scores.iter().filter_map(|s| s.as_ref().err()) {
        *unscored_by_reason.entry(why.clone()).or_insert(0) += 1;
    }
    let mean = |class: bool| {
        let v: Vec<f64> = scored.iter().filter(|p| p.0 == class).map(|p| p.1).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let (auroc, auroc_error, auroc_ci95) = subset_auroc(&scored);
    let ls: Vec<bool> = scored.iter().map(|p| p.0).collect();
    let ss: Vec<f64> = scored.iter().map(|p| p.1).collect();
    let on_common_subset = common.map(|c| {
        let sub: Vec<(bool, f64)> = labels
            .iter()
            .zip(scores)
            .zip(c)
            .filter(|(_, in_common)| **in_common)
            .filter_map(|((l, s), _)| s.as_ref().ok().map(|s| (*l, *s)))
            .collect();
        let (auroc, auroc_error, auroc_ci95) = subset_auroc(&sub);
        SubsetAuroc {
            scored: sub.len() as u64,
            scored_positive: sub.iter().filter(|p| p.0).count() as u64,
            auroc,
            auroc_error,
            auroc_ci95,
        }
    });
    Ranking {
        scored: scored.len() as u64,
        scored_positive: ls.iter().filter(|l| **l).count() as u64,
        unscored: (scores.len() - scored.len()) as u64,
        unscored_by_reason,
        auroc,
        auroc_error,
        auroc_ci95,
        auroc_variance: delong(&ls, &ss).ok().map(|d| d.variance),
        mean_positive: mean(true),
        mean_negative: mean(false),
        on_common_subset,
    }
}

/// An item's ChainPoll score under `metric`, or why it has none.
fn chainpoll_scored(l: &ItemLabel, metric: Metric) -> Scored {
    let Some(m) = l.metrics.iter().find(|m| m.metric == metric) else {
        return Err("metric not run".into());
    };
    match m.score {
        Some(s) => Ok(s),
        None if !m.polls.is_empty() && m.polls.iter().all(|p| p.error.is_some()) => {
            Err("every poll failed".into())
        }
        None if m.polls.is_empty() => Err("no poll".into()),
        None => Err("no readable verdict (every poll unparseable or failed)".into()),
    }
}

/// An item's SelfCheck score (`pick`), or why it has none.
fn selfcheck_scored(l: &ItemLabel, pick: fn(&super::SelfCheckLabel) -> Option<f64>) -> Scored {
    let Some(c) = &l.selfcheck else { return Err("no SelfCheck label".into()) };
    if let Some(v) = pick(c) {
        return Ok(v);
    }
    if c.samples == 0 && c.failed_samples > 0 {
        return Err("every sample job failed".into());
    }
    Err(c.error.clone().unwrap_or_else(|| "not scored".into()))
}

/// An item's token-log-probability score (`pick`), or why it has none (the reason's part
/// before its details).
fn logprob_scored(
    l: &ItemLabel,
    pick: fn(&LogprobScores) -> Option<f64>,
    why: fn(&LogprobScores) -> Option<&String>,
) -> Scored {
    let Some(p) = &l.logprob_scores else { return Err("no probability job".into()) };
    if let Some(v) = pick(p) {
        return Ok(v);
    }
    // A job-level error is "<reason>: <details>"; a score's own error is short already.
    Err(match (&p.error, why(p)) {
        (Some(e), _) => e.split(": ").next().unwrap_or(e).to_string(),
        (None, Some(e)) => e.clone(),
        (None, None) => "not scored".into(),
    })
}

/// Score one judge's labels.
pub fn score(cfg: &super::Config, labels: &[ItemLabel]) -> Report {
    let truth: Vec<bool> = labels.iter().map(|l| l.label).collect();
    // Every computed method: its report name and its per-item scores.
    let mut methods: Vec<(String, Vec<Scored>)> = cfg
        .metrics
        .iter()
        .map(|&m| {
            let name = format!("{CHAINPOLL_PREFIX}{}", m.as_str());
            (name, labels.iter().map(|l| chainpoll_scored(l, m)).collect())
        })
        .collect();
    if cfg.sampler.is_some() {
        methods.push((
            SELFCHECK_AVG.into(),
            labels.iter().map(|l| selfcheck_scored(l, |c| c.avg)).collect(),
        ));
        methods.push((
            SELFCHECK_MAX.into(),
            labels.iter().map(|l| selfcheck_scored(l, |c| c.max)).collect(),
        ));
    }
    let logprob_support = match &cfg.probability {
        None => Err("no probability model configured".to_string()),
        Some(m) => super::baselines::probability_support(m),
    };
    type Pick = fn(&LogprobScores) -> Option<f64>;
    type Why = fn(&LogprobScores) -> Option<&String>;
    let logprob_methods: [(&str, Pick, Why); 4] = [
        (PSEUDO_ENTROPY_MAX, |p| p.pseudo_entropy_max, |p| p.pseudo_entropy_error.as_ref()),
        (PSEUDO_ENTROPY_MEAN, |p| p.pseudo_entropy_mean, |p| p.pseudo_entropy_error.as_ref()),
        (AVG_NEG_LOGPROB, |p| p.avg_neg_logprob, |p| p.neg_logprob_error.as_ref()),
        (MAX_NEG_LOGPROB, |p| p.max_neg_logprob, |p| p.neg_logprob_error.as_ref()),
    ];
    if logprob_support.is_ok() {
        for (name, pick, why) in logprob_methods {
            methods
                .push((name.into(), labels.iter().map(|l| logprob_scored(l, pick, why)).collect()));
        }
    }
    let common: Vec<bool> =
        (0..labels.len()).map(|i| methods.iter().all(|(_, s)| s[i].is_ok())).collect();
    let rank = |name: &str| {
        methods.iter().find(|(n, _)| n == name).map(|(_, s)| ranking(&truth, s, Some(&common)))
    };
    let metrics = cfg
        .metrics
        .iter()
        .map(|&metric| {
            let polls: Vec<&super::Poll> = labels
                .iter()
                .filter_map(|l| l.metrics.iter().find(|m| m.metric == metric))
                .flat_map(|m| &m.polls)
                .collect();
            let count =
                |f: &dyn Fn(&super::Poll) -> bool| polls.iter().filter(|p| f(p)).count() as u64;
            let mut unparseable_by_reason = BTreeMap::new();
            for p in polls.iter().filter(|p| p.verdict.is_none() && p.error.is_none()) {
                // Labels stored before issue 29 carry no reason: it is the final line's.
                let why = p.unreadable.unwrap_or(Unreadable::NoAnswerLine);
                *unparseable_by_reason.entry(why).or_insert(0) += 1;
            }
            MetricReport {
                metric,
                ranking: rank(&format!("{CHAINPOLL_PREFIX}{}", metric.as_str()))
                    .unwrap_or_default(),
                polls: polls.len() as u64,
                yes: count(&|p| p.verdict == Some(true)),
                no: count(&|p| p.verdict == Some(false)),
                unparseable: count(&|p| p.verdict.is_none() && p.error.is_none()),
                unparseable_by_reason,
                failed: count(&|p| p.error.is_some()),
            }
        })
        .collect();
    let logprob_baselines = match logprob_support {
        Err(why) => LogprobReport {
            model: cfg.probability.as_ref().map(|m| m.name.clone()),
            not_computed: Some(why),
            ..LogprobReport::default()
        },
        Ok(()) => LogprobReport {
            model: cfg.probability.as_ref().map(|m| m.name.clone()),
            pseudo_entropy_max: rank(PSEUDO_ENTROPY_MAX),
            pseudo_entropy_mean: rank(PSEUDO_ENTROPY_MEAN),
            avg_neg_logprob: rank(AVG_NEG_LOGPROB),
            max_neg_logprob: rank(MAX_NEG_LOGPROB),
            not_computed: None,
        },
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
        selfcheck_avg: rank(SELFCHECK_AVG),
        selfcheck_max: rank(SELFCHECK_MAX),
        selfcheck_all_samples_failed: cfg.sampler.as_ref().map(|(_, s)| {
            let all_failed = |l: &&ItemLabel| {
                l.selfcheck.as_ref().is_some_and(|c| c.samples == 0 && c.failed_samples == *s)
            };
            labels.iter().filter(all_failed).count() as u64
        }),
        logprob_baselines,
        common_subset: CommonSubset {
            items: common.iter().filter(|c| **c).count() as u64,
            positives: common.iter().zip(&truth).filter(|(c, l)| **c && **l).count() as u64,
            methods: methods.into_iter().map(|(n, _)| n).collect(),
        },
    }
}

impl Report {
    /// Every computed method of the report, by its report name, in table order.
    pub fn rankings(&self) -> Vec<(String, &Ranking)> {
        let mut out: Vec<(String, &Ranking)> = self
            .metrics
            .iter()
            .map(|m| (format!("{CHAINPOLL_PREFIX}{}", m.metric.as_str()), &m.ranking))
            .collect();
        let b = &self.logprob_baselines;
        for (name, r) in [
            (SELFCHECK_AVG, &self.selfcheck_avg),
            (SELFCHECK_MAX, &self.selfcheck_max),
            (PSEUDO_ENTROPY_MAX, &b.pseudo_entropy_max),
            (PSEUDO_ENTROPY_MEAN, &b.pseudo_entropy_mean),
            (AVG_NEG_LOGPROB, &b.avg_neg_logprob),
            (MAX_NEG_LOGPROB, &b.max_neg_logprob),
        ] {
            if let Some(r) = r {
                out.push((name.to_string(), r));
            }
        }
        out
    }
}

fn num(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{v:.4}"))
}

/// An AUROC with its DeLong interval in brackets (or why the interval is not estimable),
/// or why there is no AUROC.
pub fn auroc_text(auroc: Option<f64>, ci: Option<&Interval>, error: Option<&str>) -> String {
    match (auroc, error) {
        (None, Some(e)) => format!("– ({e})"),
        _ => with_bracket(auroc, ci, 1.0, 4),
    }
}

fn ranking_text(r: &Ranking) -> String {
    auroc_text(r.auroc, r.auroc_ci95.as_ref(), r.auroc_error.as_deref())
}

/// "why: n; why: n" of reason counts, or "–" (a `|` escaped for Markdown tables).
pub fn reasons_text<K: std::fmt::Display>(reasons: &BTreeMap<K, u64>) -> String {
    if reasons.is_empty() {
        return "–".into();
    }
    let parts: Vec<String> = reasons.iter().map(|(k, n)| format!("{k}: {n}")).collect();
    parts.join("; ").replace('|', "\\|").replace('\n', " ")
}

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The common-subset AUROC cell: "0.7000 [0.6000, 0.8000] (n=9)".
fn common_text(r: &Ranking) -> String {
    match &r.on_common_subset {
        None => "–".into(),
        Some(c) => format!(
            "{} (n={})",
            auroc_text(c.auroc, c.auroc_ci95.as_ref(), c.auroc_error.as_deref()),
            c.scored
        ),
    }
}

/// The benchmark's Markdown section: a leaderboard of judges by AUROC, then the counts.
pub fn render_markdown(title: &str, reports: &[Report]) -> String {
    let mut md = format!(
        "## {title}\n\nAUROC against the labels (hallucinated = positive, ties count ½), in brackets its 95% DeLong interval (or why it cannot be estimated), then n, the items scored; ChainPoll score = share of \"yes\" polls. Verdict: {VERDICT_RULE}. Baselines: SelfCheck-1gram Avg/Max (unigram model of the completion and the sampled answers); from the probability model's token log-probabilities of the completion, the {PSEUDO_ENTROPY_MAX} over tokens (the ChainPoll paper's baseline), the {PSEUDO_ENTROPY_MEAN}, and SelfCheckGPT's {AVG_NEG_LOGPROB} and {MAX_NEG_LOGPROB} (sentence scores averaged over sentences). n/c: not computed.\n\n"
    );
    let Some(first) = reports.first() else { return md };
    let mut head = String::from("| judge |");
    for m in &first.metrics {
        head.push_str(&format!(" ChainPoll-{} AUROC |", m.metric.as_str()));
    }
    let baselines = [
        SELFCHECK_AVG,
        SELFCHECK_MAX,
        PSEUDO_ENTROPY_MAX,
        PSEUDO_ENTROPY_MEAN,
        AVG_NEG_LOGPROB,
        MAX_NEG_LOGPROB,
    ];
    for b in baselines {
        head.push_str(&format!(" {b} AUROC |"));
    }
    head.push_str("\n|---|");
    head.push_str(&"---|".repeat(first.metrics.len() + baselines.len()));
    md.push_str(&head);
    md.push('\n');
    let mut order: Vec<&Report> = reports.iter().collect();
    let key = |r: &Report| r.metrics.first().and_then(|m| m.ranking.auroc).unwrap_or(-1.0);
    order.sort_by(|a, b| key(b).total_cmp(&key(a)).then(a.model.cmp(&b.model)));
    let cell = |r: Option<&Ranking>| {
        r.map_or("n/c".into(), |r| format!("{} (n={})", ranking_text(r), r.scored))
    };
    for r in order {
        md.push_str(&format!("| `{}` |", r.model));
        for m in &r.metrics {
            md.push_str(&format!(" {} |", cell(Some(&m.ranking))));
        }
        let b = &r.logprob_baselines;
        for x in [
            &r.selfcheck_avg,
            &r.selfcheck_max,
            &b.pseudo_entropy_max,
            &b.pseudo_entropy_mean,
            &b.avg_neg_logprob,
            &b.max_neg_logprob,
        ] {
            md.push_str(&format!(" {} |", cell(x.as_ref())));
        }
        md.push('\n');
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
        let rankings = r.rankings();
        let sizes: Vec<u64> = rankings.iter().map(|(_, k)| k.scored).collect();
        if sizes.iter().any(|n| Some(n) != sizes.first()) {
            md.push_str(&format!(
                "**The methods scored different items** (n from {} to {}): compare them on the common subset, the {} items ({} hallucinated) every method scored.\n\n",
                sizes.iter().min().unwrap_or(&0),
                sizes.iter().max().unwrap_or(&0),
                r.common_subset.items,
                r.common_subset.positives
            ));
        }
        md.push_str("| score | scored | unscored (why) | AUROC (all scored) | AUROC on the common subset (n) | mean (halluc.) | mean (faithful) | polls | yes | no | unparseable (why) | failed |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        let row = |name: &str, k: &Ranking, polls: Option<&MetricReport>| {
            let p = |f: fn(&MetricReport) -> u64| polls.map_or("–".into(), |m| f(m).to_string());
            let unparseable = polls.map_or("–".into(), |m| {
                if m.unparseable == 0 {
                    "0".into()
                } else {
                    format!("{} ({})", m.unparseable, reasons_text(&m.unparseable_by_reason))
                }
            });
            let unscored = if k.unscored == 0 {
                "0".to_string()
            } else {
                format!("{} ({})", k.unscored, reasons_text(&k.unscored_by_reason))
            };
            format!(
                "| {name} | {} | {unscored} | {} | {} | {} | {} | {} | {} | {} | {unparseable} | {} |\n",
                k.scored,
                ranking_text(k),
                common_text(k),
                num(k.mean_positive),
                num(k.mean_negative),
                p(|m| m.polls),
                p(|m| m.yes),
                p(|m| m.no),
                p(|m| m.failed)
            )
        };
        for m in &r.metrics {
            md.push_str(&row(
                &format!("{CHAINPOLL_PREFIX}{}", m.metric.as_str()),
                &m.ranking,
                Some(m),
            ));
        }
        for (name, k) in rankings.iter().skip(r.metrics.len()) {
            md.push_str(&row(name, k, None));
        }
        if let Some(why) = &r.logprob_baselines.not_computed {
            md.push_str(&format!(
                "\n{PSEUDO_ENTROPY_MAX}, {PSEUDO_ENTROPY_MEAN}, {AVG_NEG_LOGPROB}, {MAX_NEG_LOGPROB}: not computed ({why}).\n"
            ));
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
    use serde_json::json;

    fn spec(name: &str, backend: &str) -> ModelSpec {
        let m = crate::common::test_model(name);
        ModelSpec {
            model_ref: ModelRef { backend: backend.into(), ..m.model_ref.clone() },
            temperature: 0.7,
            ..m
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
    fn label(
        i: usize,
        positive: bool,
        cp: Option<f64>,
        sc: Option<f64>,
        lp: Option<f64>,
    ) -> ItemLabel {
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
        for key in
            ["pseudo_entropy_max", "pseudo_entropy_mean", "avg_neg_logprob", "max_neg_logprob"]
        {
            assert_eq!(b[key]["auroc"], 1.0, "{key}: {b}");
            assert_eq!(
                (b[key]["scored"].as_u64(), b[key]["unscored"].as_u64()),
                (Some(7), Some(1))
            );
        }
        let md = render_markdown("t", &[r]);
        for name in ["Max pseudo-entropy", "Mean pseudo-entropy", "Avg(−log p)", "Max(−log p)"]
        {
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
                let sc = (i != 1 && i != 3).then_some(if pos {
                    1.0 + i as f64
                } else {
                    12.0 - i as f64
                });
                label(i, pos, cp, sc, None)
            })
            .collect();
        let r = score(&cfg, &labels);
        let j = serde_json::to_value(&r).unwrap();
        assert_eq!(j["common_subset"]["items"], 9);
        let cp = &j["metrics"][0];
        assert_eq!(
            (cp["scored"].as_u64(), cp["on_common_subset"]["scored"].as_u64()),
            (Some(11), Some(9))
        );
        assert_eq!(j["selfcheck_avg"]["on_common_subset"]["scored"], 9);
        let md = render_markdown("t", &[r]);
        assert!(md.contains("common subset"), "{md}");
        assert!(md.contains("| 1 (no final \"Answer: yes/no\" line: 1) |"), "{md}");
        assert!(md.contains("(n=9)"), "{md}");
    }

    /// Issue 29: items a baseline could not score are counted beside it, by why: the
    /// probability job failed, it returned no log-probabilities, or its positions lacked
    /// the top alternatives (pseudo-entropy only; Avg/Max(−log p) still score them).
    #[test]
    fn unscored_items_are_counted_by_why() {
        let cfg = config(false, true);
        let mut labels: Vec<ItemLabel> =
            (0..6).map(|i| label(i, i % 2 == 0, Some(0.5), None, Some(1.0 + i as f64))).collect();
        let mut set = |i: usize, v: serde_json::Value| {
            labels[i].logprob_scores = Some(serde_json::from_value(v).unwrap());
        };
        set(0, json!({"tokens": 0, "error": "probability job failed: HTTP 500"}));
        set(
            1,
            json!({"tokens": 0, "error": "no token log-probabilities returned: model `p` gave none"}),
        );
        set(
            2,
            json!({"tokens": 3, "avg_neg_logprob": 2.0, "max_neg_logprob": 3.0,
            "pseudo_entropy_error": "pseudo-entropy is undefined: a token position has no top alternatives"}),
        );
        let r = score(&cfg, &labels);
        let b = &r.logprob_baselines;
        let pe = b.pseudo_entropy_max.as_ref().unwrap();
        assert_eq!((pe.scored, pe.unscored), (3, 3));
        let want: BTreeMap<String, u64> = [
            ("no token log-probabilities returned", 1),
            ("probability job failed", 1),
            ("pseudo-entropy is undefined: a token position has no top alternatives", 1),
        ]
        .into_iter()
        .map(|(k, n)| (k.to_string(), n))
        .collect();
        assert_eq!(pe.unscored_by_reason, want);
        let avg = b.avg_neg_logprob.as_ref().unwrap();
        assert_eq!((avg.scored, avg.unscored_by_reason.len()), (4, 2));
        let md = render_markdown("t", &[r]);
        assert!(md.contains("| Avg(−log p) | 4 | 2 (no token log-probabilities returned: 1; probability job failed: 1) |"), "{md}");
    }
}

//! `pipeline = "chainpoll"`: ChainPoll on labelled items; the models under test are the
//! judges being evaluated (see `halyard_pipelines::chainpoll`).

use std::path::PathBuf;

use halyard_pipelines::chainpoll::aggregate::AggregateRow;
use halyard_pipelines::chainpoll::{self, Metric};
use halyard_pipelines::common::{ModelSpec, ResultLookup};
use halyard_pipelines::metrics::chainpoll::Unparseable;

use serde::Deserialize;

use super::table::{
    dataset_err, human_labels, human_truth, int_in, limit, model_named, models_of, parse,
};
use super::{encoded, Benchmark, Checking, Evaluation, Pipeline};
use crate::judging::human::Shape;
use crate::judging::truth::Provenance;
use crate::judging::{self, HumanLabel, HumanLabels, Judged, Panel, PanelKeys, Unit, UnitKey};
use crate::report::{RealHallPart, Section};
use crate::sweep::error::{key_err, SweepError};
use crate::PlanError;

/// `pipeline = "chainpoll"`: its table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Table {
    models: Vec<String>,
    dataset: Option<String>,
    limit: Option<i64>,
    samples: Option<i64>,
    polls: Option<i64>,
    metrics: Option<Vec<String>>,
    unparseable: Option<String>,
    sampler: Option<String>,
    /// The panel verdict over the judges (`models`).
    panel: Option<String>,
    human_labels: Option<String>,
    /// How human labels become truth (`majority`, `mace`, `mace-em`).
    human_truth: Option<String>,
    /// Who labelled the dataset: `human`, `llm:<model>`, `rule[:<name>]`.
    dataset_labels: Option<String>,
}

/// ChainPoll: labelled items judged by each model (the judges under evaluation).
#[derive(Clone, Debug)]
pub struct ChainPoll {
    pub config: Vec<chainpoll::Config>,
    pub dataset: PathBuf,
    pub items: Vec<chainpoll::Item>,
    /// Rows left out to balance the labels.
    pub skipped: u64,
    /// The judges (`models`) as a panel, with its verdict (`panel`).
    pub panel: Panel,
    /// `human_labels`, besides the dataset's own labels.
    pub human: HumanLabels,
    /// Who labelled the dataset ([`dataset_provenance`]).
    pub provenance: Provenance,
}

/// ChainPoll's labels of an item, as judges and human labels give them.
pub const CATEGORIES: [&str; 2] = ["no_hallucination", "hallucination"];

fn categories() -> Vec<String> {
    CATEGORIES.map(String::from).to_vec()
}

/// The labels file shape of ChainPoll: one label per item, `model` = "dataset" (the
/// dataset's completion is the judged output).
pub fn shape(categories: &[String]) -> Shape<'_> {
    Shape { pipeline: chainpoll::PIPELINE, categories, part: None }
}

/// The `model` of a ChainPoll unit: the dataset's completion.
pub const DATASET_MODEL: &str = "dataset";

/// Who labelled the datasets Halyard knows, by the dataset file's name: its stem,
/// lower-cased and without `-`, `_`, `.` and spaces, starts with the name. RealHall's four
/// (ChainPoll paper, appendix A.3; spec `metrics.md` §3.2) and AutoHall's labels
/// (`datasets/chainpoll/`). A dataset not listed here has provenance `unstated` (not human
/// truth) unless the benchmark states it with `dataset_labels`.
pub const KNOWN_DATASETS: [(&str, &str, &str); 5] = [
    ("covidqa", "llm:gpt-4", "RealHall COVID-QA: GPT-4 as sole annotator"),
    ("triviaqa", "llm:gpt-4", "RealHall TriviaQA: GPT-4 as sole annotator"),
    ("drop", "rule:drop-f1", "RealHall DROP: hallucinated iff lm-eval-harness DROP F1 = 0"),
    ("openassistant", "human", "RealHall Open Assistant: human annotation"),
    (
        "autohall",
        "rule:autohall",
        "AutoHall: hallucinated iff the generator's classification of the claim with its own reference differs from the fact-checking gold label",
    ),
];

/// The provenance of a known dataset's labels (by its file name) and why.
pub fn dataset_provenance(path: &std::path::Path) -> Option<(Provenance, &'static str)> {
    let stem = path.file_stem()?.to_str()?.to_lowercase();
    let norm: String = stem.chars().filter(|c| !matches!(c, '-' | '_' | '.' | ' ')).collect();
    KNOWN_DATASETS
        .iter()
        .find(|(name, _, _)| norm.starts_with(name))
        .and_then(|(_, p, why)| Provenance::parse(p).ok().map(|p| (p, *why)))
}

/// `pipeline = "chainpoll"`: `dataset`, `models` (the judges), optional `polls`,
/// `metrics`, `unparseable`, `sampler` with `samples`, and `limit`.
pub(super) fn check(cx: &mut Checking<'_>, raw: &toml::Table) -> Result<Benchmark, SweepError> {
    let table: Table = parse(cx, raw, chainpoll::PIPELINE)?;
    let b = &table;
    let (f, i, models) = (cx.file, cx.index, cx.models);
    let k = |field: &str| format!("benchmark[{i}].{field}");
    let judges = models_of(f, i, &b.models, models)?;
    let keys = PanelKeys { judges: Some(&b.models), panel: b.panel.as_deref(), judge: None };
    let panel = judging::panel(f, i, keys, models, chainpoll::PIPELINE)?
        .ok_or_else(|| key_err(f, k("models"), "needs at least one judge"))?;
    let mut human = human_labels(cx, b.human_labels.as_deref(), shape(&categories()))?;
    human.truth = human_truth(cx, b.human_truth.as_deref())?;
    let polls = int_in(f, k("polls"), b.polls, 1, 100, chainpoll::plan::DEFAULT_POLLS as i64)?;
    let metrics = metrics(f, i, b)?;
    let unparseable = match b.unparseable.as_deref().unwrap_or("exclude") {
        "exclude" => Unparseable::Exclude,
        "no" => Unparseable::CountAsNo,
        other => {
            return Err(key_err(
                f,
                k("unparseable"),
                format!("{other:?} is not \"exclude\" or \"no\""),
            ))
        }
    };
    let sampler = sampler(cx, b)?;
    let Some(rel) = &b.dataset else {
        return Err(key_err(f, k("dataset"), "required for pipeline \"chainpoll\""));
    };
    let dataset = cx.base.join(rel);
    let provenance = match b.dataset_labels.as_deref() {
        Some(p) => Provenance::parse(p).map_err(|e| key_err(f, k("dataset_labels"), e))?,
        None => dataset_provenance(&dataset).map_or(Provenance::Unstated, |(p, _)| p),
    };
    let ds_err = |reason: String| dataset_err(f, i, "dataset", &dataset, reason);
    let mut set = chainpoll::read_items(&dataset).map_err(|e| ds_err(e.to_string()))?;
    if let Some(l) = limit(f, i, b.limit)? {
        set.items.truncate(l);
    }
    if set.items.is_empty() {
        return Err(key_err(f, k("dataset"), format!("{} holds no item", dataset.display())));
    }
    if metrics.contains(&Metric::Adherence) {
        if let Some(item) = set.items.iter().find(|it| it.context.is_none()) {
            return Err(ds_err(format!(
                "line {}: metric \"adherence\" needs a `context`, and this item has none",
                item.line
            )));
        }
    }
    let config = judges
        .into_iter()
        .map(|judge| chainpoll::Config {
            judge,
            polls,
            metrics: metrics.clone(),
            unparseable,
            sampler: sampler.clone(),
            // The sampler doubles as the pseudo-entropy probability model (issue 16) until
            // the sweep gets its own key.
            probability: sampler.as_ref().map(|(m, _)| m.clone()),
        })
        .collect();
    Ok(Benchmark::new(ChainPoll {
        config,
        dataset,
        items: set.items,
        skipped: set.skipped_unbalanced,
        panel,
        human,
        provenance,
    }))
}

/// `metrics`: at least one, each known and given once (default correctness).
fn metrics(f: &str, i: usize, b: &Table) -> Result<Vec<Metric>, SweepError> {
    let mut metrics = Vec::new();
    for (j, m) in b.metrics.clone().unwrap_or_else(|| vec!["correctness".into()]).iter().enumerate()
    {
        let metric = match m.as_str() {
            "correctness" => Metric::Correctness,
            "adherence" => Metric::Adherence,
            other => {
                return Err(key_err(
                    f,
                    format!("benchmark[{i}].metrics[{j}]"),
                    format!("{other:?} is not \"correctness\" or \"adherence\""),
                ))
            }
        };
        if metrics.contains(&metric) {
            return Err(key_err(
                f,
                format!("benchmark[{i}].metrics[{j}]"),
                format!("{m:?} listed twice"),
            ));
        }
        metrics.push(metric);
    }
    if metrics.is_empty() {
        return Err(key_err(
            f,
            format!("benchmark[{i}].metrics"),
            "needs at least one of \"correctness\", \"adherence\"",
        ));
    }
    Ok(metrics)
}

/// `sampler` and `samples`: the model that draws the SelfCheck samples, and how many.
fn sampler(cx: &Checking<'_>, b: &Table) -> Result<Option<(ModelSpec, u32)>, SweepError> {
    let (f, i) = (cx.file, cx.index);
    let k = |field: &str| format!("benchmark[{i}].{field}");
    match &b.sampler {
        None if b.samples.is_some() => {
            Err(key_err(f, k("samples"), "needs `sampler`, the model that draws the samples"))
        }
        None => Ok(None),
        Some(name) => {
            let spec = model_named(f, k("sampler"), name, cx.models)?.spec.clone();
            let samples = int_in(
                f,
                k("samples"),
                b.samples,
                1,
                1000,
                chainpoll::plan::DEFAULT_SAMPLES as i64,
            )?;
            Ok(Some((spec, samples)))
        }
    }
}

impl Pipeline for ChainPoll {
    fn name(&self) -> &'static str {
        chainpoll::PIPELINE
    }

    fn model_names(&self) -> Vec<String> {
        self.config.iter().map(|c| c.judge.name.clone()).collect()
    }

    fn judged_labels(&self) -> Option<super::JudgedLabels> {
        Some((categories(), None))
    }

    fn item_count(&self) -> usize {
        self.items.len()
    }

    fn evaluate(&self, model: usize, item: u32, known: &dyn ResultLookup) -> Evaluation {
        let it = &self.items[item as usize];
        encoded(chainpoll::evaluate(&self.config[model], item, it, known))
    }

    /// One section with a leaderboard across the judges, figures per judge, label rows.
    fn report(&self, out: &mut Section<'_>) -> Result<(), PlanError> {
        let mut reports = Vec::new();
        let mut all = Vec::with_capacity(self.config.len());
        for (m, c) in self.config.iter().enumerate() {
            let mut items: Vec<chainpoll::ItemLabel> = out.labels(m)?;
            for l in &mut items {
                // Labels stored by an earlier version follow the current verdict rule.
                chainpoll::reread_verdicts(c, l);
                out.row(l)?;
            }
            let report = chainpoll::score(c, &items);
            let mut v = out.entry(&report, &self.dataset)?;
            if let Some(o) = v.as_object_mut() {
                o.insert("skipped_unbalanced_rows".into(), self.skipped.into());
            }
            out.json.push(v);
            out.across.chainpoll.push(RealHallPart {
                bench: out.bench,
                dataset: self.dataset.display().to_string(),
                report: report.clone(),
            });
            reports.push(report);
            all.push(items);
        }
        let title = format!("Benchmark {}: chainpoll on `{}`", out.bench, self.dataset.display());
        out.md.push_str(&chainpoll::render_markdown(&title, &reports));
        out.md.push('\n');
        let cats = categories();
        let mut human = self.human.clone();
        if let Some(imported) = out.imported_labels(shape(&cats))? {
            human.extend(imported);
        }
        let judged = self.judged(&all);
        let jr = judging::analyse(out.bench, &judged, &human);
        judging::verdict_file::write(out, &judged)?;
        out.md.push_str(&judging::markdown(&jr));
        out.across.judges.push(jr);
        Ok(())
    }
}

impl ChainPoll {
    /// Each judge's verdict on each item: its first metric's ChainPoll score, at least ½
    /// is "hallucination"; no score (no usable poll) is no verdict. The dataset's label
    /// is a label of annotator "dataset" with the dataset's provenance: human truth only
    /// when `human`, else agreement under its own name.
    fn judged(&self, all: &[Vec<chainpoll::ItemLabel>]) -> Judged {
        // A stored label of another judge (a run resumed with another sweep) is no vote.
        let by_index: Vec<std::collections::HashMap<u32, &chainpoll::ItemLabel>> = all
            .iter()
            .zip(&self.config)
            .map(|(ls, c)| {
                ls.iter().filter(|l| l.model == c.judge.name).map(|l| (l.index, l)).collect()
            })
            .collect();
        let key = |it: &chainpoll::Item| UnitKey {
            item: it.id.clone(),
            model: DATASET_MODEL.into(),
            part: None,
        };
        let units = self
            .items
            .iter()
            .enumerate()
            .map(|(n, it)| Unit {
                key: key(it),
                question: it.prompt.clone(),
                answer: Some(it.completion.clone()),
                votes: by_index
                    .iter()
                    .map(|g| {
                        let score = g.get(&(n as u32))?.metrics.first()?.score?;
                        Some(usize::from(score >= 0.5))
                    })
                    .collect(),
            })
            .collect();
        let dataset_labels = self
            .items
            .iter()
            .map(|it| HumanLabel {
                key: key(it),
                label: usize::from(it.label),
                annotator: Some("dataset".into()),
                source: format!("{}:{}", self.dataset.display(), it.line),
                provenance: self.provenance.clone(),
            })
            .collect();
        Judged {
            pipeline: chainpoll::PIPELINE,
            unit: "item",
            part: None,
            categories: categories(),
            favourable: None,
            judges: self.panel.judges.clone(),
            answerers: Vec::new(),
            verdict: self.panel.verdict.clone(),
            units,
            dataset_labels,
            ruled: Vec::new(),
            item_groups: Default::default(),
        }
    }
}

/// RealHall's aggregate of one judge over the sweep's ChainPoll benchmarks (spec
/// `metrics.md` §3.2; issue 29), in `report.json`'s `realhall`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RealHallEntry {
    pub model: String,
    /// The benchmarks (sweep indices) and their datasets, in sweep order.
    pub benchmarks: Vec<usize>,
    pub datasets: Vec<String>,
    /// The ChainPoll metric taken as "ChainPoll" on each dataset.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub chainpoll_metric: Vec<Metric>,
    pub rows: Vec<AggregateRow>,
    /// Why there is no aggregate (the same dataset in two benchmarks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_computed: Option<String>,
}

/// The aggregate of every judge benchmarked on two or more ChainPoll datasets, in the
/// order judges first appear; a judge on one dataset has none (its benchmark's figures are
/// the whole story). A dataset benchmarked twice for a judge makes its aggregate not
/// computed: the aggregate's interval assumes independent datasets.
pub fn realhall(parts: &[RealHallPart]) -> Vec<RealHallEntry> {
    let mut judges: Vec<&str> = Vec::new();
    for p in parts {
        if !judges.contains(&p.report.model.as_str()) {
            judges.push(&p.report.model);
        }
    }
    let mut out = Vec::new();
    for judge in judges {
        let mine: Vec<&RealHallPart> = parts.iter().filter(|p| p.report.model == judge).collect();
        if mine.len() < 2 {
            continue;
        }
        let mut entry = RealHallEntry {
            model: judge.to_string(),
            benchmarks: mine.iter().map(|p| p.bench).collect(),
            datasets: mine.iter().map(|p| p.dataset.clone()).collect(),
            chainpoll_metric: Vec::new(),
            rows: Vec::new(),
            not_computed: None,
        };
        let twice = mine.iter().enumerate().find_map(|(i, p)| {
            mine[..i].iter().find(|q| q.dataset == p.dataset).map(|q| (q.bench, p))
        });
        if let Some((first, p)) = twice {
            entry.not_computed = Some(format!(
                "dataset `{}` is in benchmarks {first} and {}: the aggregate needs distinct (independent) datasets",
                p.dataset, p.bench
            ));
            out.push(entry);
            continue;
        }
        let per: Vec<(String, &chainpoll::Report)> =
            mine.iter().map(|p| (p.dataset.clone(), &p.report)).collect();
        if let Some(a) = chainpoll::realhall_aggregate(&per) {
            entry.chainpoll_metric = a.chainpoll_metric;
            entry.rows = a.rows;
        }
        out.push(entry);
    }
    out
}

/// The RealHall section of `report.md` (nothing without an aggregate).
pub fn realhall_markdown(entries: &[RealHallEntry]) -> String {
    if entries.is_empty() {
        return String::new();
    }
    let mut md = String::from(
        "## RealHall aggregate\n\nPer judge benchmarked on several ChainPoll datasets: the unweighted mean of its per-dataset AUROCs (ChainPoll = Adherence on a dataset run with it, else Correctness; ChainPoll paper Tables 1, 3, 4), in brackets its 95% interval from the per-dataset Newcombe (2006) AUROC intervals combined by square-and-add (or why it cannot be estimated); per dataset, the AUROC with its n (items scored) and the items left unscored; quality vs ChainPoll = mean(AUROC − 0.5) / mean(AUROC of ChainPoll − 0.5).\n",
    );
    for e in entries {
        let benches: Vec<String> = e.benchmarks.iter().map(|b| b.to_string()).collect();
        md.push_str(&format!("\n### `{}` (benchmarks {})\n\n", e.model, benches.join(", ")));
        if let Some(why) = &e.not_computed {
            md.push_str(&format!("Not computed: {why}.\n"));
            continue;
        }
        md.push_str("| method |");
        for d in &e.datasets {
            md.push_str(&format!(" `{d}` AUROC (n; unscored) |"));
        }
        md.push_str(" aggregate AUROC | quality vs ChainPoll | note |\n|---|");
        md.push_str(&"---|".repeat(e.datasets.len() + 3));
        md.push('\n');
        for r in &e.rows {
            md.push_str(&format!("| {} |", r.method));
            for i in 0..e.datasets.len() {
                let v = r.per_dataset.get(i).copied().flatten();
                md.push_str(&format!(
                    " {} ({}; {}) |",
                    v.map_or("–".into(), |v| format!("{v:.4}")),
                    r.per_dataset_n.get(i).copied().unwrap_or(0),
                    r.per_dataset_unscored.get(i).copied().unwrap_or(0)
                ));
            }
            let agg = r.aggregate_auroc.as_ref();
            md.push_str(&format!(
                " {} | {} | {} |\n",
                halyard_pipelines::metrics::interval::with_bracket(
                    agg.map(|a| a.estimate),
                    agg,
                    1.0,
                    4
                ),
                r.quality_vs_chainpoll.map_or("–".into(), |q| format!("{q:.4}")),
                r.note.as_deref().unwrap_or("")
            ));
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 45 item 5: the provenance of a dataset's labels, stated per dataset (ChainPoll
    /// paper appendix A.3: COVID-QA and TriviaQA by GPT-4, DROP by a rule; AutoHall's by
    /// its rule), overridden by `dataset_labels`; bad `dataset_labels` and `human_truth`
    /// values are refused naming the key.
    #[test]
    fn dataset_label_provenance() {
        let of =
            |name: &str| dataset_provenance(std::path::Path::new(name)).map(|(p, _)| p.describe());
        assert_eq!(of("data/RealHall_COVID-QA.jsonl"), None, "the name must start the stem");
        assert_eq!(of("data/covid_qa_retrieval.jsonl").as_deref(), Some("llm:gpt-4"));
        assert_eq!(of("TriviaQA.jsonl").as_deref(), Some("llm:gpt-4"));
        assert_eq!(of("drop-dev.jsonl").as_deref(), Some("rule:drop-f1"));
        assert_eq!(of("open_assistant.jsonl").as_deref(), Some("human"));
        assert_eq!(of("autohall_climate_gpt35.jsonl").as_deref(), Some("rule:autohall"));
        assert_eq!(of("my-labels.jsonl"), None);
        let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../datasets/chainpoll/autohall_climate_gpt35.jsonl");
        let sweep = |extra: &str| {
            format!(
                "name = \"s\"\n[[model]]\nname = \"j\"\nbackend = \"noop\"\n\n[[benchmark]]\npipeline = \"chainpoll\"\ndataset = \"{}\"\nmodels = [\"j\"]\n{extra}\n",
                shipped.display()
            )
        };
        let path = std::path::Path::new("/tmp/s.toml");
        let ok = |extra: &str| crate::sweep::parse(path, &sweep(extra)).map(|_| ());
        ok("").unwrap();
        ok("dataset_labels = \"llm:gpt-4\"\nhuman_truth = \"mace\"").unwrap();
        let e = ok("dataset_labels = \"people\"").unwrap_err().to_string();
        assert!(e.contains("benchmark[0].dataset_labels") && e.contains("llm:<model>"), "{e}");
        let e = ok("human_truth = \"vote\"").unwrap_err().to_string();
        assert!(e.contains("benchmark[0].human_truth") && e.contains("\"mace-em\""), "{e}");
    }
    use halyard_pipelines::chainpoll::{Config, ItemLabel};
    use halyard_pipelines::common::ModelSpec;
    use halyard_pipelines::metrics::chainpoll::Unparseable;
    use halyard_proto::ModelRef;

    fn config(judge: &str) -> Config {
        Config {
            judge: ModelSpec {
                name: judge.into(),
                model_ref: ModelRef {
                    backend: "openai".into(),
                    endpoint: "http://x".into(),
                    model: judge.into(),
                },
                pool: judge.into(),
                api_key_env: None,
                temperature: 0.7,
                max_tokens: None,
                seed: None,
                timeout_ms: 1000,
                structured_output: false,
            },
            polls: 1,
            metrics: vec![Metric::Correctness],
            unparseable: Unparseable::Exclude,
            sampler: None,
            probability: None,
        }
    }

    /// A report of `judge` on 8 items whose ChainPoll scores rank `good` of the 4
    /// hallucinated items above the faithful ones.
    fn part(bench: usize, dataset: &str, judge: &str, good: usize) -> RealHallPart {
        let labels: Vec<ItemLabel> = (0..8)
            .map(|i| {
                let positive = i < 4;
                let s = match (positive, i < good) {
                    (true, true) => 0.8,
                    (true, false) => 0.1,
                    (false, _) => 0.2 + 0.1 * (i % 2) as f64,
                };
                serde_json::from_value(serde_json::json!({
                    "pipeline": "chainpoll", "model": judge, "index": i, "id": i.to_string(),
                    "line": i + 1, "label": positive,
                    "metrics": [{"metric": "correctness", "polls": [], "score": s}]
                }))
                .unwrap()
            })
            .collect();
        RealHallPart {
            bench,
            dataset: dataset.into(),
            report: chainpoll::score(&config(judge), &labels),
        }
    }

    /// Issue 29 (9): a sweep with two ChainPoll datasets reports the RealHall aggregate of
    /// the judge run on both (the mean of its AUROCs, with its interval), in report.md and
    /// report.json; a judge on one dataset has none; a dataset run twice is not aggregated.
    #[test]
    fn realhall_over_the_sweeps_datasets() {
        let parts =
            [part(0, "a.jsonl", "j1", 4), part(0, "a.jsonl", "j2", 4), part(1, "b.jsonl", "j1", 2)];
        let agg = realhall(&parts);
        assert_eq!(agg.len(), 1, "{agg:?}");
        let e = &agg[0];
        assert_eq!((e.model.as_str(), e.benchmarks.as_slice()), ("j1", &[0, 1][..]));
        let cp = &e.rows[0];
        assert_eq!(cp.method, "chainpoll");
        let (a, b) =
            (parts[0].report.metrics[0].ranking.auroc, parts[2].report.metrics[0].ranking.auroc);
        let mean = (a.unwrap() + b.unwrap()) / 2.0;
        let ci = cp.aggregate_auroc.unwrap();
        assert!((ci.estimate - mean).abs() < 1e-12, "{ci:?}");
        assert_eq!(cp.per_dataset_n, [8, 8]);
        let md = realhall_markdown(&agg);
        assert!(
            md.contains("## RealHall aggregate") && md.contains("### `j1` (benchmarks 0, 1)"),
            "{md}"
        );
        assert!(md.contains(&format!("| chainpoll | {:.4} (8; 0) |", a.unwrap())), "{md}");
        assert!(md.contains(&format!("{:.4} [", mean)), "{md}");
        let j = serde_json::to_value(&agg).unwrap();
        assert_eq!(j[0]["rows"][0]["aggregate_auroc"]["method"], "newcombe_mean");
        // The same dataset twice: not aggregated, and the report says why.
        let twice = realhall(&[part(0, "a.jsonl", "j1", 4), part(2, "a.jsonl", "j1", 3)]);
        assert!(twice[0].not_computed.as_deref().unwrap().contains("benchmarks 0 and 2"));
        assert!(realhall(&parts[..1]).is_empty() && realhall_markdown(&[]).is_empty());
    }
}

//! `pipeline = "hvi"`: the Hallucination Vulnerability Index per model, from a judge's
//! sentence labels on each model's passages (judge mode) or from a labelled-sentence file
//! (see `halyard_pipelines::hvi`).

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use halyard_pipelines::common::{Plan, ResultLookup};
use halyard_pipelines::hvi::{self, Probability, Weights};
use serde::Deserialize;

use super::table::{dataset_err, human_labels, human_truth, models_of, parse, read_rows};
use super::{encoded, Benchmark, Checking, Evaluation, Pipeline};
use crate::judging::human::Shape;
use crate::judging::{self, HumanLabels, Judged, Panel, PanelKeys, Unit, UnitKey};
use crate::report::Section;
use crate::sweep::error::{key_err, SweepError};
use crate::PlanError;

/// `pipeline = "hvi"`: its table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Table {
    models: Vec<String>,
    dataset: Option<String>,
    limit: Option<i64>,
    judge: Option<String>,
    judges: Option<Vec<String>>,
    panel: Option<String>,
    human_labels: Option<String>,
    /// How human labels become truth (`majority`, `mace`, `mace-em`).
    human_truth: Option<String>,
    system_prompt: Option<String>,
    /// A labelled-sentence file instead of a prompt dataset and judge.
    labels: Option<String>,
    /// Eq. 1 weights.
    p_efm: Option<RawProbability>,
    p_esl: Option<RawProbability>,
    delta1: Option<f64>,
    delta2: Option<f64>,
}

/// `p_efm` / `p_esl`: a number in [0, 1] or `"relative_frequency"`.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum RawProbability {
    Number(f64),
    Name(String),
}

#[derive(Clone, Debug)]
pub enum Hvi {
    /// Judge mode: passages for prompts, a judge per sentence.
    Judge {
        /// One per (model under test, judge), model-major.
        config: Vec<hvi::Config>,
        panel: Panel,
        dataset: PathBuf,
        prompts: Vec<hvi::Prompt>,
        weights: hvi::Weights,
        human: HumanLabels,
    },
    /// From a labelled file: one item per model, no job.
    Labels { models: Vec<String>, file: PathBuf, rows: Vec<hvi::LabelRow>, weights: hvi::Weights },
}

fn probability(
    f: &str,
    key: String,
    raw: &Option<RawProbability>,
) -> Result<Probability, SweepError> {
    match raw {
        None => Ok(Probability::RelativeFrequency),
        Some(RawProbability::Name(n)) if n == "relative_frequency" => {
            Ok(Probability::RelativeFrequency)
        }
        Some(RawProbability::Number(p)) if (0.0..=1.0).contains(p) => Ok(Probability::Fixed(*p)),
        Some(RawProbability::Number(p)) => {
            Err(key_err(f, key, format!("{p} is not a probability in [0, 1]")))
        }
        Some(RawProbability::Name(n)) => Err(key_err(
            f,
            key,
            format!("{n:?} is neither a number in [0, 1] nor \"relative_frequency\""),
        )),
    }
}

/// `pipeline = "hvi"`: judge mode (`dataset` of prompts, `models`, `judge`, optional
/// `system_prompt` and `limit`) or labelled mode (`labels` file, `models` = names in it);
/// `p_efm`, `p_esl`, `delta1`, `delta2` in both.
pub(super) fn check(cx: &mut Checking<'_>, raw: &toml::Table) -> Result<Benchmark, SweepError> {
    let table: Table = parse(cx, raw, hvi::PIPELINE)?;
    let b = &table;
    let (f, i) = (cx.file, cx.index);
    let k = |field: &str| format!("benchmark[{i}].{field}");
    let mut weights = Weights {
        p_efm: probability(f, k("p_efm"), &b.p_efm)?,
        p_esl: probability(f, k("p_esl"), &b.p_esl)?,
        ..Weights::default()
    };
    for (key, v, slot) in
        [("delta1", b.delta1, &mut weights.delta1), ("delta2", b.delta2, &mut weights.delta2)]
    {
        if let Some(d) = v {
            if !d.is_finite() {
                return Err(key_err(f, k(key), format!("{d} is not a finite number")));
            }
            *slot = d;
        }
    }
    let hvi =
        match (&b.labels, &b.dataset) {
            (Some(_), Some(_)) => {
                return Err(key_err(
                    f,
                    k("labels"),
                    "give either `labels` (labelled file) or `dataset` (judge mode), not both",
                ))
            }
            (None, None) => return Err(key_err(
                f,
                k("dataset"),
                "required for pipeline \"hvi\": a prompt `dataset` (judge mode) or a `labels` file",
            )),
            (Some(rel), None) => labels_mode(cx, b, rel, weights)?,
            (None, Some(rel)) => judge_mode(cx, b, rel, weights)?,
        };
    Ok(Benchmark::new(hvi))
}

/// Labelled mode: the models named must have rows in the file.
fn labels_mode(
    cx: &Checking<'_>,
    b: &Table,
    rel: &str,
    weights: Weights,
) -> Result<Hvi, SweepError> {
    let (f, i) = (cx.file, cx.index);
    let k = |field: &str| format!("benchmark[{i}].{field}");
    let not_here = [
        ("judge", b.judge.is_some()),
        ("judges", b.judges.is_some()),
        ("panel", b.panel.is_some()),
        ("human_labels", b.human_labels.is_some()),
        ("human_truth", b.human_truth.is_some()),
        ("system_prompt", b.system_prompt.is_some()),
        ("limit", b.limit.is_some()),
    ];
    if let Some((key, _)) = not_here.iter().find(|(_, set)| *set) {
        return Err(key_err(
            f,
            k(key),
            format!("does not apply to pipeline {:?}", "hvi with `labels`"),
        ));
    }
    let file = cx.base.join(rel);
    let rows = hvi::read_labels(&file).map_err(|e| dataset_err(f, i, "labels", &file, e))?;
    if b.models.is_empty() {
        return Err(key_err(f, k("models"), "name the models of the labelled file to report"));
    }
    let mut names: Vec<String> = Vec::new();
    for (j, name) in b.models.iter().enumerate() {
        let key = format!("benchmark[{i}].models[{j}]");
        if names.contains(name) {
            return Err(key_err(f, key, format!("model {name:?} listed twice")));
        }
        if !rows.iter().any(|r| &r.model == name) {
            return Err(key_err(
                f,
                key,
                format!("model {name:?} has no rows in {}", file.display()),
            ));
        }
        names.push(name.clone());
    }
    Ok(Hvi::Labels { models: names, file, rows, weights })
}

/// Judge mode: a prompt dataset, the models under test, one judge.
fn judge_mode(
    cx: &Checking<'_>,
    b: &Table,
    rel: &str,
    weights: Weights,
) -> Result<Hvi, SweepError> {
    let (f, i, models) = (cx.file, cx.index, cx.models);
    let k = |field: &str| format!("benchmark[{i}].{field}");
    let keys = PanelKeys {
        judge: b.judge.as_deref(),
        judges: b.judges.as_deref(),
        panel: b.panel.as_deref(),
    };
    let panel = judging::panel(f, i, keys, models, hvi::PIPELINE)?.ok_or_else(|| {
        key_err(
            f,
            k("judge"),
            "required for pipeline \"hvi\" with a prompt `dataset` (or `judges`)",
        )
    })?;
    let mut config = Vec::new();
    for model in models_of(f, i, &b.models, models)? {
        for judge in &panel.judges {
            config.push(hvi::Config {
                model: model.clone(),
                judge: judge.clone(),
                system_prompt: b.system_prompt.clone(),
            });
        }
    }
    let mut human = human_labels(cx, b.human_labels.as_deref(), shape(&categories()))?;
    human.truth = human_truth(cx, b.human_truth.as_deref())?;
    let dataset = cx.base.join(rel);
    let prompts = read_rows(f, i, b.limit, &dataset, "prompts", hvi::read_prompts)?;
    Ok(Hvi::Judge { config, panel, dataset, prompts, weights, human })
}

impl Pipeline for Hvi {
    fn name(&self) -> &'static str {
        hvi::PIPELINE
    }

    fn model_count(&self) -> usize {
        match self {
            Hvi::Judge { config, .. } => config.len(),
            Hvi::Labels { models, .. } => models.len(),
        }
    }

    fn model_names(&self) -> Vec<String> {
        match self {
            Hvi::Judge { config, panel, .. } => config
                .iter()
                .map(|c| match panel.is_panel() {
                    true => format!("{} (judge {})", c.model.name, c.judge.name),
                    false => c.model.name.clone(),
                })
                .collect(),
            Hvi::Labels { models, .. } => models.clone(),
        }
    }

    fn judged_labels(&self) -> Option<super::JudgedLabels> {
        matches!(self, Hvi::Judge { .. }).then(|| (categories(), Some("sentence")))
    }

    fn item_count(&self) -> usize {
        match self {
            Hvi::Judge { prompts, .. } => prompts.len(),
            Hvi::Labels { .. } => 1,
        }
    }

    fn evaluate(&self, model: usize, item: u32, known: &dyn ResultLookup) -> Evaluation {
        match self {
            Hvi::Judge { config, prompts, .. } => {
                encoded(hvi::evaluate(&config[model], &prompts[item as usize], known))
            }
            Hvi::Labels { models, rows, .. } => {
                encoded(Plan::Done(hvi::evaluate_labelled(&models[model], rows)))
            }
        }
    }

    /// One section with a leaderboard across the models, and an entry per model.
    fn report(&self, out: &mut Section<'_>) -> Result<(), PlanError> {
        match self {
            Hvi::Judge { config, panel, dataset, weights, human, .. } => {
                report_judge_mode(out, config, panel, dataset, *weights, human)
            }
            Hvi::Labels { models, file, weights, .. } => {
                report_labels_mode(out, models, file, *weights)
            }
        }
    }
}

fn report_judge_mode(
    out: &mut Section<'_>,
    config: &[hvi::Config],
    panel: &Panel,
    dataset: &Path,
    weights: Weights,
    human: &HumanLabels,
) -> Result<(), PlanError> {
    let mut reports = Vec::new();
    let mut all = Vec::with_capacity(config.len());
    for (m, c) in config.iter().enumerate() {
        let ls: Vec<hvi::ItemLabel> = out.labels_written(m)?;
        let name = match panel.is_panel() {
            true => format!("{} (judge {})", c.model.name, c.judge.name),
            false => c.model.name.clone(),
        };
        let r = judge_report(&name, &ls, weights);
        out.json.push(out.entry(&r, dataset)?);
        reports.push(r);
        all.push(ls);
    }
    let judge = panel.names().join(", ");
    let title = format!("hvi on `{}`, judge `{judge}`", dataset.display());
    let cats = categories();
    let mut human = human.clone();
    if let Some(imported) = out.imported_labels(shape(&cats))? {
        human.extend(imported);
    }
    if !panel.is_panel() && human.labels.is_empty() {
        out.section(&title, &hvi::render_markdown(&reports));
        return Ok(());
    }
    let judged = judged(config, panel, &all);
    let jr = judging::analyse(out.bench, &judged, &human);
    judging::verdict_file::write(out, &judged)?;
    if panel.is_panel() {
        // The panel's HVI per model: every sentence with the panel's verdict.
        let verdicts = judging::figures::verdicts(&judged);
        let by_key: HashMap<&UnitKey, Option<usize>> =
            judged.units.iter().map(|u| &u.key).zip(verdicts.labels.iter().copied()).collect();
        for (m, group) in all.chunks(panel.judges.len()).enumerate() {
            let c = &config[m * panel.judges.len()];
            let Some(first) = group.first() else { continue };
            let ls: Vec<hvi::ItemLabel> = first
                .iter()
                .map(|l| {
                    let mut l = l.clone();
                    for (n, s) in l.sentences.iter_mut().enumerate() {
                        let key = UnitKey {
                            item: l.id.clone(),
                            model: l.model.clone(),
                            part: Some(n.to_string()),
                        };
                        s.verdict = by_key.get(&key).copied().flatten().map(|v| VERDICTS[v]);
                        s.category = match s.verdict {
                            Some(hvi::judge::Verdict::Extrinsic) => {
                                Some(hvi::dataset::Category::of(l.factual, true))
                            }
                            Some(hvi::judge::Verdict::Intrinsic) => {
                                Some(hvi::dataset::Category::of(l.factual, false))
                            }
                            _ => None,
                        };
                    }
                    l.judge = format!("panel:{}", panel.verdict.describe());
                    l
                })
                .collect();
            let name = format!("{} (panel {})", c.model.name, panel.verdict.describe());
            let r = judge_report(&name, &ls, weights);
            let mut v = out.entry(&r, dataset)?;
            if let Some(o) = v.as_object_mut() {
                o.insert("panel".into(), serde_json::json!(panel.names()));
            }
            out.json.push(v);
            reports.push(r);
        }
    }
    out.section(&title, &hvi::render_markdown(&reports));
    out.md.push_str(&judging::markdown(&jr));
    out.across.judges.push(jr);
    Ok(())
}

/// The HVI report of one model's labels (by one judge or the panel).
fn judge_report(name: &str, ls: &[hvi::ItemLabel], weights: Weights) -> hvi::Report {
    let judge_errors =
        ls.iter().flat_map(|l| &l.sentences).filter(|s| s.verdict.is_none()).count() as u64;
    let failed = ls.iter().filter(|l| l.passage_error.is_some()).count() as u64;
    let mut r = hvi::score(name, "judge", hvi::plan::counts_of(ls), judge_errors, failed, weights);
    (r.odd_passages, r.odd_judge_outputs) = hvi::plan::odd_of(ls);
    r
}

/// HVI's sentence labels, as judges and human labels give them.
pub const CATEGORIES: [&str; 3] = ["not_hallucinated", "intrinsic", "extrinsic"];
const VERDICTS: [hvi::judge::Verdict; 3] = [
    hvi::judge::Verdict::NotHallucinated,
    hvi::judge::Verdict::Intrinsic,
    hvi::judge::Verdict::Extrinsic,
];

fn categories() -> Vec<String> {
    CATEGORIES.map(String::from).to_vec()
}

/// The labels file shape of HVI: one label per sentence (`sentence`: its index in the
/// passage, from 0).
pub fn shape(categories: &[String]) -> Shape<'_> {
    Shape { pipeline: hvi::PIPELINE, categories, part: Some("sentence") }
}

/// One unit per sentence of each model's passages, with each judge's verdict.
fn judged(config: &[hvi::Config], panel: &Panel, all: &[Vec<hvi::ItemLabel>]) -> Judged {
    let j = panel.judges.len();
    let mut units = Vec::new();
    let mut answerers = Vec::new();
    for (m, group) in all.chunks(j).enumerate() {
        answerers.push(config[m * j].model.clone());
        // A stored label of another model or judge (a run resumed with another sweep) is
        // no vote.
        let by_id: Vec<HashMap<&str, &hvi::ItemLabel>> = group
            .iter()
            .enumerate()
            .map(|(jj, ls)| {
                let c = &config[m * j + jj];
                ls.iter()
                    .filter(|l| l.model == c.model.name && l.judge == c.judge.name)
                    .map(|l| (l.id.as_str(), l))
                    .collect()
            })
            .collect();
        let mut ids: BTreeSet<&str> = BTreeSet::new();
        for g in &by_id {
            ids.extend(g.keys());
        }
        for id in ids {
            let Some(first) = by_id.iter().find_map(|g| g.get(id)) else { continue };
            for (n, s) in first.sentences.iter().enumerate() {
                let votes = by_id
                    .iter()
                    .map(|g| {
                        let v = g.get(id)?.sentences.get(n)?.verdict?;
                        VERDICTS.iter().position(|x| *x == v)
                    })
                    .collect();
                units.push(Unit {
                    key: UnitKey {
                        item: id.to_string(),
                        model: first.model.clone(),
                        part: Some(n.to_string()),
                    },
                    question: first.passage.clone().unwrap_or_default(),
                    answer: Some(s.sentence.clone()),
                    votes,
                });
            }
        }
    }
    Judged {
        pipeline: hvi::PIPELINE,
        unit: "sentence",
        part: Some("sentence"),
        categories: categories(),
        favourable: Some(0),
        judges: panel.judges.clone(),
        answerers,
        verdict: panel.verdict.clone(),
        units,
        dataset_labels: Vec::new(),
        ruled: Vec::new(),
        item_groups: Default::default(),
    }
}

fn report_labels_mode(
    out: &mut Section<'_>,
    models: &[String],
    file: &Path,
    weights: Weights,
) -> Result<(), PlanError> {
    let mut reports = Vec::new();
    for (m, name) in models.iter().enumerate() {
        let ls: Vec<hvi::ModelLabels> = out.labels_written(m)?;
        let counts =
            ls.first().map_or(hvi::plan::evaluate_labelled(name, &[]).counts, |l| l.counts);
        let r = hvi::score(name, "labels", counts, 0, 0, weights);
        out.json.push(out.entry(&r, file)?);
        reports.push(r);
    }
    let title = format!("hvi from labelled sentences `{}`", file.display());
    out.section(&title, &hvi::render_markdown(&reports));
    Ok(())
}

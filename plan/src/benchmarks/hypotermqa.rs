//! `pipeline = "hypotermqa"`: HypoTermQA evaluation of each model under test on a
//! question dataset (or on one built in the same run: `dataset_from`), with one judge
//! (`judge`) or a panel (`judges`, see [`crate::judging`]).
//!
//! A panel is one configuration per (model under test, judge): every judge runs the
//! whole judge stage on every answer as ordinary jobs (the answer job is the same job for
//! all of them). The report keeps each judge's HTS and adds the panel's, from the
//! panel's verdict on each answer, and the judges' figures.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::PathBuf;

use halyard_pipelines::common::ResultLookup;
use halyard_pipelines::hypotermqa::{self, Question, Semantics};

use serde::Deserialize;

use super::table::{human_labels, human_truth, model_named, parse, read_rows};
use super::{build, encoded, Benchmark, Checking, Evaluation, Pipeline};
use crate::judging::human::Shape;
use crate::judging::{self, HumanLabels, Judged, Panel, PanelKeys, Unit, UnitKey};
use crate::report::Section;
use crate::sweep::error::{key_err, SweepError};
use crate::PlanError;

/// `pipeline = "hypotermqa"`: its table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Table {
    models: Vec<String>,
    dataset: Option<String>,
    /// Instead of `dataset`: the index of a `hypotermqa-build` benchmark.
    dataset_from: Option<i64>,
    judge: Option<String>,
    judges: Option<Vec<String>>,
    panel: Option<String>,
    human_labels: Option<String>,
    /// How human labels become truth (`majority`, `mace`, `mace-em`).
    human_truth: Option<String>,
    semantics: Option<String>,
    system_prompt: Option<String>,
    limit: Option<i64>,
}

#[derive(Clone, Debug)]
pub struct HypoTermQa {
    /// One per (model under test, judge), model-major: `config[m * judges + j]`.
    pub config: Vec<hypotermqa::Config>,
    pub panel: Panel,
    pub dataset: PathBuf,
    pub questions: Vec<Question>,
    /// `human_labels`: read and checked with the sweep.
    pub human: HumanLabels,
}

/// HypoTermQA's answer labels, as judges and human labels give them.
pub const CATEGORIES: [&str; 3] = ["valid", "hallucination", "irrelevant"];

fn categories() -> Vec<String> {
    CATEGORIES.map(String::from).to_vec()
}

/// The labels file shape of HypoTermQA: one label per answer.
pub fn shape(categories: &[String]) -> Shape<'_> {
    Shape { pipeline: hypotermqa::PIPELINE, categories, part: None }
}

/// `pipeline = "hypotermqa"`: `dataset` (or `dataset_from`), `models`, `judge`, optional
/// `semantics`, `system_prompt` and `limit`.
pub(super) fn check(cx: &mut Checking<'_>, raw: &toml::Table) -> Result<Benchmark, SweepError> {
    let table: Table = parse(cx, raw, hypotermqa::PIPELINE)?;
    let b = &table;
    let (f, i) = (cx.file, cx.index);
    let k = |field: &str| format!("benchmark[{i}].{field}");
    if b.models.is_empty() {
        return Err(key_err(f, k("models"), "needs at least one model under test"));
    }
    let dataset_rel = dataset_key(cx, b)?;
    let (config, panel) = configs(cx, b)?;
    let mut human = human_labels(cx, b.human_labels.as_deref(), shape(&categories()))?;
    human.truth = human_truth(cx, b.human_truth.as_deref())?;
    if b.dataset_from.is_some() {
        // Read after the build phase (build::load_built).
        let dataset = PathBuf::from(format!("<benchmark[{i}].dataset_from>"));
        let questions = Vec::new();
        return Ok(Benchmark::new(HypoTermQa { config, panel, dataset, questions, human }));
    }
    let dataset = cx.base.join(dataset_rel);
    let questions =
        read_rows(f, i, b.limit, &dataset, "questions", |p| hypotermqa::read_dataset(p))?;
    Ok(Benchmark::new(HypoTermQa { config, panel, dataset, questions, human }))
}

/// `dataset` (its path as given), or `dataset_from` (an earlier build, recorded in
/// `cx.built_inputs`; the path is then empty).
fn dataset_key(cx: &mut Checking<'_>, b: &Table) -> Result<String, SweepError> {
    let (f, i) = (cx.file, cx.index);
    let k = |field: &str| format!("benchmark[{i}].{field}");
    match (&b.dataset, b.dataset_from) {
        (Some(d), None) => Ok(d.clone()),
        (None, Some(from)) => {
            let built = build::dataset_from(f, i, from, &cx.earlier)?;
            let limit = match b.limit {
                Some(l) if l < 1 => {
                    return Err(key_err(f, k("limit"), format!("{l} must be at least 1")))
                }
                l => l.map(|l| l as usize),
            };
            cx.built_inputs.push(build::BuiltInput { eval: i, build: built, limit });
            Ok(String::new())
        }
        (Some(_), Some(_)) => {
            Err(key_err(f, k("dataset_from"), "give `dataset` or `dataset_from`, not both"))
        }
        (None, None) => Err(key_err(
            f,
            k("dataset"),
            "required for pipeline \"hypotermqa\" (or `dataset_from`)",
        )),
    }
}

/// One configuration per (model under test, judge), all with the benchmark's semantics.
fn configs(cx: &Checking<'_>, b: &Table) -> Result<(Vec<hypotermqa::Config>, Panel), SweepError> {
    let (f, i, models) = (cx.file, cx.index, cx.models);
    let k = |field: &str| format!("benchmark[{i}].{field}");
    let keys = PanelKeys {
        judge: b.judge.as_deref(),
        judges: b.judges.as_deref(),
        panel: b.panel.as_deref(),
    };
    let panel = judging::panel(f, i, keys, models, hypotermqa::PIPELINE)?.ok_or_else(|| {
        key_err(f, k("judge"), "required for pipeline \"hypotermqa\" (or `judges`)")
    })?;
    let semantics = match b.semantics.as_deref().unwrap_or("paper") {
        "paper" => Semantics::Paper,
        "reference" => Semantics::Reference,
        other => {
            return Err(key_err(
                f,
                k("semantics"),
                format!("{other:?} is not \"paper\" or \"reference\""),
            ))
        }
    };
    let mut config = Vec::new();
    let mut seen = HashSet::new();
    for (j, name) in b.models.iter().enumerate() {
        if !seen.insert(name) {
            return Err(key_err(
                f,
                format!("benchmark[{i}].models[{j}]"),
                format!("model {name:?} listed twice"),
            ));
        }
        let model = model_named(f, format!("benchmark[{i}].models[{j}]"), name, models)?;
        for judge in &panel.judges {
            config.push(hypotermqa::Config {
                semantics,
                model: model.spec.clone(),
                judge: judge.clone(),
                system_prompt: b.system_prompt.clone(),
            });
        }
    }
    Ok((config, panel))
}

impl Pipeline for HypoTermQa {
    fn name(&self) -> &'static str {
        hypotermqa::PIPELINE
    }

    fn model_names(&self) -> Vec<String> {
        let panel = self.panel.is_panel();
        self.config
            .iter()
            .map(|c| {
                if panel {
                    format!("{} (judge {})", c.model.name, c.judge.name)
                } else {
                    c.model.name.clone()
                }
            })
            .collect()
    }

    fn judged_labels(&self) -> Option<super::JudgedLabels> {
        Some((categories(), None))
    }

    fn item_count(&self) -> usize {
        self.questions.len()
    }

    fn evaluate(&self, model: usize, item: u32, known: &dyn ResultLookup) -> Evaluation {
        encoded(hypotermqa::evaluate(&self.config[model], &self.questions[item as usize], known))
    }

    /// One section per (model under test, judge), with its score and its rows in
    /// `labels.jsonl`; with a panel or human labels, the panel's score per model and the
    /// judges' figures.
    fn report(&self, out: &mut Section<'_>) -> Result<(), PlanError> {
        let (b, dataset) = (out.bench, &self.dataset);
        let counts = hypotermqa::QuestionCounts::from_questions(&self.questions);
        let mut all: Vec<Vec<hypotermqa::ItemLabel>> = Vec::with_capacity(self.config.len());
        for (m, c) in self.config.iter().enumerate() {
            let labels: Vec<hypotermqa::ItemLabel> = out.labels(m)?;
            let first = out.lines();
            for l in &labels {
                out.row(l)?;
            }
            let meta = hypotermqa::ScoreMeta {
                model: c.model.name.clone(),
                judge: c.judge.name.clone(),
                semantics: c.semantics,
            };
            let report = hypotermqa::score(&meta, &counts, &labels);
            out.md
                .push_str(&format!("## Benchmark {b}: hypotermqa on `{}`\n\n", dataset.display()));
            out.md.push_str(&hypotermqa::render_markdown(&report));
            out.md.push('\n');
            let mut v = out.entry(&report, dataset)?;
            if let Some(o) = v.as_object_mut() {
                o.insert("labels_lines".into(), serde_json::json!([first, out.lines()]));
            }
            out.json.push(v);
            all.push(labels);
        }
        let cats = categories();
        let mut human = self.human.clone();
        if let Some(imported) = out.imported_labels(shape(&cats))? {
            human.extend(imported);
        }
        if !self.panel.is_panel() && human.labels.is_empty() {
            return Ok(());
        }
        let judged = self.judged(&all);
        let jr = judging::analyse(b, &judged, &human);
        judging::verdict_file::write(out, &judged)?;
        if self.panel.is_panel() {
            self.panel_scores(out, &counts, &all, &judged, &jr)?;
        }
        out.md.push_str(&judging::markdown(&jr));
        out.across.judges.push(jr);
        Ok(())
    }
}

impl HypoTermQa {
    fn judges(&self) -> usize {
        self.panel.judges.len()
    }

    /// The answers the judges labelled: one unit per (model under test, question) that
    /// got an answer, with each judge's answer label (judge error: no verdict).
    fn judged(&self, all: &[Vec<hypotermqa::ItemLabel>]) -> Judged {
        let j = self.judges();
        let mut units = Vec::new();
        let mut ruled = Vec::new();
        let mut item_groups = BTreeMap::new();
        let mut answerers = Vec::new();
        for (m, group) in all.chunks(j).enumerate() {
            answerers.push(self.config[m * j].model.clone());
            // Labels of each judge by question id (a judge's item may be missing in a
            // run stopped early: that judge has no verdict on it). A stored label of
            // another model or judge (a run resumed with another sweep) is no vote.
            let by_q: Vec<BTreeMap<i64, &hypotermqa::ItemLabel>> = group
                .iter()
                .enumerate()
                .map(|(jj, ls)| {
                    let c = &self.config[m * j + jj];
                    ls.iter()
                        .filter(|l| l.model == c.model.name && l.judge == c.judge.name)
                        .map(|l| (l.question_id, l))
                        .collect()
                })
                .collect();
            let mut qids: BTreeSet<i64> = BTreeSet::new();
            for g in &by_q {
                qids.extend(g.keys());
            }
            for q in qids {
                let Some(first) = by_q.iter().find_map(|g| g.get(&q)) else { continue };
                let group = match first.question_type {
                    hypotermqa::QuestionType::Hypothetical => "hypothetical",
                    _ => "valid",
                };
                item_groups.insert(q.to_string(), group.to_string());
                let key = UnitKey { item: q.to_string(), model: first.model.clone(), part: None };
                // No answer: nothing to label.
                if first.answer.is_none() {
                    continue;
                }
                // An answer that includes none of the terms: labelled by rule (irrelevant),
                // no judge was asked; not a unit of the judges' agreement, but counted in
                // the all-answers figures with the rule's label for every judge (§4.4).
                if !first.terms.iter().any(|t| t.included) {
                    if let Some(label) = answer_category(first.answer_label) {
                        ruled.push(judging::Ruled { key, label });
                    }
                    continue;
                }
                let votes = by_q
                    .iter()
                    .map(|g| g.get(&q).and_then(|l| answer_category(l.answer_label)))
                    .collect();
                units.push(Unit {
                    key,
                    question: first.question.clone(),
                    answer: first.answer.clone(),
                    votes,
                });
            }
        }
        Judged {
            pipeline: hypotermqa::PIPELINE,
            unit: "answer",
            part: None,
            categories: categories(),
            favourable: Some(0),
            judges: self.panel.judges.clone(),
            answerers,
            verdict: self.panel.verdict.clone(),
            units,
            dataset_labels: Vec::new(),
            ruled,
            item_groups,
        }
    }

    /// The panel's HTS per model under test: each answer labelled with the panel's
    /// verdict (no verdict, a tie: `judge_error`).
    fn panel_scores(
        &self,
        out: &mut Section<'_>,
        counts: &hypotermqa::QuestionCounts,
        all: &[Vec<hypotermqa::ItemLabel>],
        judged: &Judged,
        jr: &judging::JudgeReport,
    ) -> Result<(), PlanError> {
        let verdicts = judging::figures::verdicts(judged);
        let mut by_unit: HashMap<&UnitKey, Option<usize>> = HashMap::new();
        for (u, v) in judged.units.iter().zip(&verdicts.labels) {
            by_unit.insert(&u.key, *v);
        }
        let name = format!("panel:{}", jr.panel.verdict.describe());
        for (m, group) in all.chunks(self.judges()).enumerate() {
            let c = &self.config[m * self.judges()];
            // Every question any judge labelled, from the first judge that did.
            let mut items: BTreeMap<i64, hypotermqa::ItemLabel> = BTreeMap::new();
            for l in group.iter().flatten() {
                items.entry(l.question_id).or_insert_with(|| l.clone());
            }
            let labels: Vec<hypotermqa::ItemLabel> = items
                .into_values()
                .map(|mut l| {
                    let key = UnitKey {
                        item: l.question_id.to_string(),
                        model: l.model.clone(),
                        part: None,
                    };
                    if let Some(v) = by_unit.get(&key) {
                        l.answer_label = v.map_or(hypotermqa::AnswerLabel::JudgeError, |c| {
                            [
                                hypotermqa::AnswerLabel::Valid,
                                hypotermqa::AnswerLabel::Hallucination,
                                hypotermqa::AnswerLabel::Irrelevant,
                            ][c]
                        });
                    }
                    l.judge = name.clone();
                    l
                })
                .collect();
            let meta = hypotermqa::ScoreMeta {
                model: c.model.name.clone(),
                judge: name.clone(),
                semantics: c.semantics,
            };
            let report = hypotermqa::score(&meta, counts, &labels);
            out.md.push_str(&format!(
                "## Benchmark {}: hypotermqa on `{}`, panel verdict\n\nAnswer labels (and so HTS) are the panel's verdict; the term, row and judge-check tables below are the first judge's ({}).\n\n",
                out.bench,
                self.dataset.display(),
                self.panel.judges[0].name
            ));
            out.md.push_str(&hypotermqa::render_markdown(&report));
            out.md.push('\n');
            let mut v = out.entry(&report, &self.dataset)?;
            if let Some(o) = v.as_object_mut() {
                o.insert("panel".into(), serde_json::json!(self.panel.names()));
            }
            out.json.push(v);
        }
        Ok(())
    }
}

/// A judge's answer label as a vote: judge errors and unanswered items are none.
fn answer_category(l: hypotermqa::AnswerLabel) -> Option<usize> {
    match l {
        hypotermqa::AnswerLabel::Valid => Some(0),
        hypotermqa::AnswerLabel::Hallucination => Some(1),
        hypotermqa::AnswerLabel::Irrelevant => Some(2),
        hypotermqa::AnswerLabel::JudgeError | hypotermqa::AnswerLabel::Unanswered => None,
    }
}

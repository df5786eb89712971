//! # Judging the judges (issue 31)
//!
//! Every pipeline where a judge model labels another model's output can run a **panel**
//! (`judges = ["a", "b", "c"]`): each member judges every item as ordinary jobs, and the
//! report measures the judges — against human labels ([`human`]) and against each
//! other — the way the seed papers measure theirs (HypoTermQA §4.3–4.4, ChainPoll's
//! human agreement, HVI's MACE).
//!
//! A pipeline hands its judged units to this module as [`Judged`]: one [`Unit`] per
//! thing a judge labels (a HypoTermQA answer, an HVI sentence, a ChainPoll item), with
//! every judge's vote as an index into the pipeline's label set (`None`: that judge gave
//! no usable verdict). [`figures::analyse`] turns it, with the human labels, into a
//! [`figures::JudgeReport`]: per judge against humans (confusion matrix, accuracy and
//! error rate with Wilson intervals, Cohen's κ), between judges (pairwise κ, Fleiss' κ,
//! Krippendorff's α, error correlation and the majority beside independent judges),
//! human inter-annotator agreement, leniency and self-preference, the panel's verdict,
//! every interval over questions ([`clusters`]), and the units where
//! judges or judge and human disagree (report.html lists them).
//!
//! The panel's verdict ([`Verdict`]) is `majority` (ties named), `mace` (MACE's EM over
//! the judges' competence) or one judge as `primary`. It is a pure function of the
//! stored per-judge labels, so changing it needs no new call: the report is rewritten.

use halyard_pipelines::common::ModelSpec;
use serde::{Deserialize, Serialize};

use crate::sweep::error::{key_err, SweepError};
use crate::sweep::models::Model;

pub mod between;
pub mod clusters;
pub mod figure;
pub mod figures;
pub mod human;
pub mod preference;
mod render;
mod render_truth;
pub mod truth;
pub mod verdict_file;

pub use figures::{analyse, JudgeReport};
pub use human::{HumanLabel, HumanLabels};
pub use render::markdown;

/// How a panel's verdict on a unit is reached (`panel = "…"` in the sweep).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "rule", rename_all = "snake_case")]
pub enum Verdict {
    /// The label most judges gave; a tie is no verdict, and named.
    Majority,
    /// MACE (Hovy et al. 2013): the label with the highest posterior under the judges'
    /// estimated competence.
    Mace,
    /// One judge's label.
    Primary { judge: String },
}

impl Verdict {
    /// As the sweep and the report spell it.
    pub fn describe(&self) -> String {
        match self {
            Verdict::Majority => "majority".into(),
            Verdict::Mace => "mace".into(),
            Verdict::Primary { judge } => format!("primary:{judge}"),
        }
    }
}

/// A benchmark's judges: one (the `judge` form) or a panel (`judges`), and its verdict.
#[derive(Clone, Debug, PartialEq)]
pub struct Panel {
    pub judges: Vec<ModelSpec>,
    pub verdict: Verdict,
}

impl Panel {
    pub fn names(&self) -> Vec<String> {
        self.judges.iter().map(|j| j.name.clone()).collect()
    }

    pub fn is_panel(&self) -> bool {
        self.judges.len() > 1
    }
}

/// The keys of a benchmark table that name its judges.
#[derive(Debug, Default)]
pub struct PanelKeys<'a> {
    pub judge: Option<&'a str>,
    pub judges: Option<&'a [String]>,
    pub panel: Option<&'a str>,
}

/// `judge = "a"` or `judges = ["a", "b", …]` with optional `panel = "majority" | "mace" |
/// "primary:NAME"`; every name a sweep model, none twice. `required`: one of the two
/// must be given (else `Ok(None)` when both are absent).
pub fn panel(
    f: &str,
    i: usize,
    keys: PanelKeys<'_>,
    models: &[Model],
    pipeline: &str,
) -> Result<Option<Panel>, SweepError> {
    let k = |field: &str| format!("benchmark[{i}].{field}");
    let names: Vec<(String, &str)> = match (keys.judge, keys.judges) {
        (Some(_), Some(_)) => {
            return Err(key_err(
                f,
                k("judges"),
                "give `judge` (one) or `judges` (a panel), not both",
            ))
        }
        (Some(j), None) => vec![(k("judge"), j)],
        (None, Some(js)) => {
            if js.is_empty() {
                return Err(key_err(f, k("judges"), "needs at least one judge"));
            }
            js.iter()
                .enumerate()
                .map(|(n, j)| (format!("benchmark[{i}].judges[{n}]"), j.as_str()))
                .collect()
        }
        (None, None) => {
            if keys.panel.is_some() {
                return Err(key_err(f, k("panel"), "needs `judges`"));
            }
            return Ok(None);
        }
    };
    let mut judges: Vec<ModelSpec> = Vec::new();
    for (key, name) in names {
        if judges.iter().any(|j| j.name == name) {
            return Err(key_err(f, key, format!("judge {name:?} listed twice")));
        }
        let Some(m) = models.iter().find(|m| m.spec.name == name) else {
            let known: Vec<&str> = models.iter().map(|m| m.spec.name.as_str()).collect();
            return Err(key_err(
                f,
                key,
                format!("unknown model {name:?} (models in this sweep: {})", known.join(", ")),
            ));
        };
        judges.push(m.spec.clone());
    }
    let verdict = match keys.panel {
        None | Some("majority") => Verdict::Majority,
        Some("mace") => Verdict::Mace,
        Some(p) => match p.strip_prefix("primary:") {
            Some(name) if judges.iter().any(|j| j.name == name) => {
                Verdict::Primary { judge: name.to_string() }
            }
            Some(name) => {
                return Err(key_err(
                    f,
                    k("panel"),
                    format!("{name:?} is not one of the judges of this {pipeline} benchmark"),
                ))
            }
            None => {
                return Err(key_err(
                    f,
                    k("panel"),
                    format!("{p:?} is not \"majority\", \"mace\" or \"primary:<judge>\""),
                ))
            }
        },
    };
    if verdict == Verdict::Mace && judges.len() < 2 {
        return Err(key_err(f, k("panel"), "\"mace\" needs at least two judges"));
    }
    Ok(Some(Panel { judges, verdict }))
}

/// What a pipeline's judges labelled, for the figures of this module.
#[derive(Clone, Debug, PartialEq)]
pub struct Judged {
    pub pipeline: &'static str,
    /// What one unit is ("answer", "sentence", "item").
    pub unit: &'static str,
    /// The part of an item a unit is, if any ("sentence"): the labels file's key for it.
    pub part: Option<&'static str>,
    /// The label set; votes index it.
    pub categories: Vec<String>,
    /// The label a judge favouring an answer gives it (HypoTermQA's `valid`): the
    /// self-preference test compares how often a judge gives it to its own model's
    /// answers with how often the other judges do.
    pub favourable: Option<usize>,
    /// The judges, in vote order, each with the model it is (to find its own answers).
    pub judges: Vec<ModelSpec>,
    /// The models under test, whose answers are judged (alias → spec).
    pub answerers: Vec<ModelSpec>,
    pub verdict: Verdict,
    pub units: Vec<Unit>,
    /// Labels that came with the dataset (ChainPoll's), annotator "dataset", each with the
    /// dataset's provenance ([`truth::Provenance`]): human truth only when `human`.
    pub dataset_labels: Vec<HumanLabel>,
    /// Outputs labelled by a rule, not by a judge (HypoTermQA answers that include none of
    /// the terms): every judge's label is the rule's. Not units (every judge would
    /// "agree"), but human labels on them count in the all-answers figures
    /// ([`figures::ScoreVsHuman`], HypoTermQA §4.4).
    pub ruled: Vec<Ruled>,
    /// The group of each item (HypoTermQA's question type, `hypothetical` or `valid`), for
    /// figures split by it; empty: one group.
    pub item_groups: std::collections::BTreeMap<String, String>,
}

/// An output labelled by a rule (the same label for every judge).
#[derive(Clone, Debug, PartialEq)]
pub struct Ruled {
    pub key: UnitKey,
    /// The rule's label (an index into the label set).
    pub label: usize,
}

/// One thing the judges labelled.
#[derive(Clone, Debug, PartialEq)]
pub struct Unit {
    pub key: UnitKey,
    /// What a person reading the disagreement needs: the question (or prompt) …
    pub question: String,
    /// … and the judged text.
    pub answer: Option<String>,
    /// Per judge: the index of its label, `None` when it gave none (judge error).
    pub votes: Vec<Option<usize>>,
}

/// A unit's identity, as a labels file names it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct UnitKey {
    pub item: String,
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<String>,
}

impl std::fmt::Display for UnitKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "item {} of {}", self.item, self.model)?;
        if let Some(p) = &self.part {
            write!(f, ", part {p}")?;
        }
        Ok(())
    }
}

/// Whether two specs are the same model, whatever their sweep aliases and sampling: a
/// judge judging answers of its own model. Same backend and endpoint, and the same model
/// name sent to the API; for a local `gguf` model the endpoint (the file's identity) alone,
/// since its model name is the sweep alias.
pub fn same_model(a: &ModelSpec, b: &ModelSpec) -> bool {
    let (a, b) = (&a.model_ref, &b.model_ref);
    a.backend == b.backend
        && a.endpoint == b.endpoint
        && (a.backend == "gguf" || a.model == b.model)
}

/// A model for unit tests: the OpenAI backend at a dummy endpoint, pool = name.
#[cfg(test)]
pub(crate) fn test_spec(name: &str) -> ModelSpec {
    ModelSpec {
        name: name.into(),
        model_ref: halyard_proto::ModelRef {
            backend: "openai".into(),
            endpoint: "http://x".into(),
            model: name.into(),
        },
        pool: name.into(),
        api_key_env: None,
        temperature: 0.0,
        max_tokens: None,
        seed: None,
        timeout_ms: 1000,
        structured_output: false,
    }
}

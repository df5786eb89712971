//! Labels → figures: the overall of each form (spec §1.3–§1.6) and per news type (§1.7).
//!
//! Every figure carries its 95% interval (issue 16), keyed by the figure's field name in
//! `ci95` (and `ci95_by_type`): selective accuracy is a proportion (Wilson); the
//! discriminative accuracies are means of per-item accuracies and BLEU-4, ROUGE-L, kwPrec,
//! length and BERTScore are means of per-item values (seeded bootstrap over the valid
//! items).

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::dataset::NewsType;
use super::embed::{similarity, Embedder, PAPER_BERT_MODEL};
use super::plan::{AppliedGeneration, Case, Config, ItemLabel};
use crate::common::OddCounts;
use crate::metrics::interval::{bootstrap_mean, wilson, Bootstrap, Interval};
use crate::metrics::uhgeval::{
    generative_overall, keyword_overall, selective_overall, sentence_overall, AccuracyOverall,
    GenerativeItem, GenerativeOverall, KeywordItem, KeywordOverall, SelectiveItem, SentenceItem,
    UhgVariant,
};

/// A form's overall, and the same over each news type's items (types without items are
/// left out).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FormReport<T> {
    pub overall: T,
    pub by_type: BTreeMap<NewsType, T>,
    /// 95% intervals of the overall figures, by field name.
    #[serde(default)]
    pub ci95: Intervals,
    #[serde(default)]
    pub ci95_by_type: BTreeMap<NewsType, Intervals>,
}

/// 95% intervals by figure name (`avg_accuracy`, `avg_bleu4`, ...).
pub type Intervals = BTreeMap<String, Interval>;

fn form_report<I: Clone, T>(
    items: &[(NewsType, I)],
    overall: fn(&[I]) -> T,
    ci: fn(&[I]) -> Intervals,
) -> FormReport<T> {
    let all: Vec<I> = items.iter().map(|(_, i)| i.clone()).collect();
    let (mut by_type, mut ci95_by_type) = (BTreeMap::new(), BTreeMap::new());
    for t in NewsType::ALL {
        let of: Vec<I> = items.iter().filter(|(ty, _)| *ty == t).map(|(_, i)| i.clone()).collect();
        if !of.is_empty() {
            by_type.insert(t, overall(&of));
            ci95_by_type.insert(t, ci(&of));
        }
    }
    FormReport { overall: overall(&all), by_type, ci95: ci(&all), ci95_by_type }
}

/// A named per-item value.
type Field<I> = (&'static str, fn(&I) -> f64);

/// Bootstrap intervals of the means of `fields` over the valid items (none without one).
fn mean_cis<I>(valid: &[&I], fields: &[Field<I>]) -> Intervals {
    fields
        .iter()
        .filter_map(|(name, f)| {
            let v: Vec<f64> = valid.iter().map(|i| f(i)).collect();
            bootstrap_mean(&v, Bootstrap::default()).ok().map(|ci| (name.to_string(), ci))
        })
        .collect()
}

fn keyword_ci(items: &[KeywordItem]) -> Intervals {
    let valid: Vec<&KeywordItem> = items.iter().filter(|i| i.valid).collect();
    mean_cis(&valid, &[("avg_accuracy", |i| i.accuracy)])
}

fn sentence_ci(items: &[SentenceItem]) -> Intervals {
    let valid: Vec<&SentenceItem> = items.iter().filter(|i| i.valid).collect();
    mean_cis(&valid, &[("accuracy", |i| i.accuracy)])
}

fn selective_ci(items: &[SelectiveItem]) -> Intervals {
    let valid = items.iter().filter(|i| i.valid).count() as u64;
    let correct = items.iter().filter(|i| i.valid && i.correct).count() as u64;
    wilson(correct, valid).ok().map(|w| ("accuracy".to_string(), w)).into_iter().collect()
}

fn generative_ci(items: &[GenerativeItem]) -> Intervals {
    let valid: Vec<&GenerativeItem> = items.iter().filter(|i| i.valid).collect();
    mean_cis(
        &valid,
        &[
            ("avg_bleu4", |i| i.bleu4),
            ("avg_rouge_l", |i| i.rouge_l),
            ("avg_kw_prec", |i| i.kw_prec),
            ("avg_length", |i| i.length as f64),
        ],
    )
}

/// The "BERTScore" column (spec §1.6, §6.2).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BertScore {
    /// The embedding model; `None`: not computed.
    pub model: Option<String>,
    /// Mean over valid items.
    pub avg: Option<f64>,
    /// Its 95% bootstrap interval.
    #[serde(default)]
    pub ci95: Option<Interval>,
    /// The model UHGEval used ([`PAPER_BERT_MODEL`]).
    #[serde(default)]
    pub paper_model: String,
    /// Whether the figure is comparable with the paper's (only with the paper's model).
    #[serde(default)]
    pub comparable_to_paper: bool,
    /// Why it is missing, or which model computed it.
    pub note: String,
}

impl BertScore {
    fn missing(note: String) -> BertScore {
        BertScore {
            model: None,
            avg: None,
            ci95: None,
            paper_model: PAPER_BERT_MODEL.into(),
            comparable_to_paper: false,
            note,
        }
    }

    /// The column from per-item similarities computed with `model`.
    fn of(model: &str, values: &[f64]) -> BertScore {
        let comparable = model == PAPER_BERT_MODEL;
        BertScore {
            model: Some(model.to_string()),
            avg: (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64),
            ci95: bootstrap_mean(values, Bootstrap::default()).ok(),
            paper_model: PAPER_BERT_MODEL.into(),
            comparable_to_paper: comparable,
            note: if comparable {
                format!("cosine similarity of `{model}` embeddings, the paper's model")
            } else {
                format!(
                    "cosine similarity of `{model}` embeddings; UHGEval used {PAPER_BERT_MODEL}: \
                     not comparable with the paper's figures"
                )
            },
        }
    }
}

/// Generative figures: the averages of the chosen variant (its BLEU-4 in `avg_bleu4`), both
/// BLEU-4 variants side by side, and the BERTScore column.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GenerativeReport {
    pub overall: GenerativeOverall,
    pub by_type: BTreeMap<NewsType, GenerativeOverall>,
    /// Mean BLEU-4 \[paper\] (no brevity penalty) over valid items.
    pub avg_bleu4_paper: Option<f64>,
    /// Mean BLEU-4 \[v2\] (nltk, brevity penalty) over valid items.
    pub avg_bleu4_v2: Option<f64>,
    pub bert_score: BertScore,
    /// 95% intervals of the overall figures (`avg_bleu4` of the chosen variant,
    /// `avg_bleu4_paper`, `avg_bleu4_v2`, `avg_rouge_l`, `avg_kw_prec`, `avg_length`).
    #[serde(default)]
    pub ci95: Intervals,
    #[serde(default)]
    pub ci95_by_type: BTreeMap<NewsType, Intervals>,
}

/// The figures of one (benchmark, model).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub pipeline: String,
    pub model: String,
    pub variant: UhgVariant,
    /// Items with a label.
    pub items: usize,
    /// Model calls that became dead letters (each makes its item invalid in its form).
    pub failed_calls: usize,
    /// Items made invalid by a failed call, by form (`keyword`, `sentence`, `selective`,
    /// `generative`); only forms with such items are listed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub invalid_by_failed_call: BTreeMap<String, usize>,
    /// Answers that were empty or refusals (read by UHGEval's rules, issue 29).
    #[serde(default)]
    pub odd_answers: OddCounts,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keyword: Option<FormReport<KeywordOverall>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sentence: Option<FormReport<AccuracyOverall>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selective: Option<FormReport<AccuracyOverall>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generative: Option<GenerativeReport>,
    /// UHGEval's top_p / top_k: requested, and applied to this model's requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<AppliedGeneration>,
}

/// Not computed without a model.
pub const BERT_NOT_COMPUTED: &str = "not computed (no embedding model configured)";

/// Scores one model's labels with its configuration: the generation parameters applied,
/// and BERTScore from the `bert` jobs when the configuration names an embedder (else from
/// `embedder`, in process, if given).
pub fn score_config(
    cfg: &Config,
    cases: &[Case],
    labels: &[ItemLabel],
    embedder: Option<&dyn Embedder>,
) -> Report {
    let mut r = score(&cfg.model.name, cfg.variant, cases, labels, embedder);
    r.generation = Some(cfg.generation.applied_to(&cfg.model.model_ref.backend));
    if let (Some(e), Some(g)) = (&cfg.bert_embedder, r.generative.as_mut()) {
        g.bert_score = bert_from_jobs(&e.name, labels);
    }
    r
}

/// BERTScore from the labels' `bert` jobs; a valid item without a score makes it missing.
fn bert_from_jobs(model: &str, labels: &[ItemLabel]) -> BertScore {
    let mut values = Vec::new();
    for l in labels {
        let Some(g) = l.generative.as_ref().filter(|g| g.valid) else { continue };
        match g.bert.as_ref().map(|b| (b.score, &b.error)) {
            Some((Some(v), _)) => values.push(v),
            Some((None, e)) => {
                let why = e.as_deref().unwrap_or("no score");
                return BertScore::missing(format!("not computed (item {}: {why})", l.id));
            }
            None => {
                return BertScore::missing(format!("not computed (item {} has no bert job)", l.id))
            }
        }
    }
    BertScore::of(model, &values)
}

/// Scores one model's labels. `cases` supplies the references for BERTScore; `embedder`
/// is the BERTScore model, if any.
pub fn score(
    model: &str,
    variant: UhgVariant,
    cases: &[Case],
    labels: &[ItemLabel],
    embedder: Option<&dyn Embedder>,
) -> Report {
    let mut failed_calls = 0;
    let mut odd_answers = OddCounts::default();
    let mut invalid_by_failed_call: BTreeMap<String, usize> = BTreeMap::new();
    // Counts an item's answers in one form; true when one of them failed.
    let mut count = |form: &str, answers: &mut dyn Iterator<Item = &super::plan::Answer>| {
        let mut failed = false;
        for a in answers {
            failed_calls += usize::from(a.failed());
            failed |= a.failed();
            odd_answers.add(a.kind);
        }
        if failed {
            *invalid_by_failed_call.entry(form.to_string()).or_default() += 1;
        }
    };
    let (mut kw, mut se, mut sl, mut gen) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for l in labels {
        let t = l.news_type;
        if let Some(k) = &l.keyword {
            count("keyword", &mut k.keywords.iter().map(|v| &v.answer));
            kw.push((t, KeywordItem { accuracy: k.accuracy, num_kws: k.num_kws, valid: k.valid }));
        }
        if let Some(s) = &l.sentence {
            count("sentence", &mut [&s.on_hallucinated, &s.on_real].into_iter());
            se.push((t, SentenceItem { accuracy: s.accuracy, valid: s.valid }));
        }
        if let Some(s) = &l.selective {
            count("selective", &mut std::iter::once(&s.answer));
            sl.push((t, SelectiveItem { correct: s.correct, valid: s.valid }));
        }
        if let Some(g) = &l.generative {
            count("generative", &mut std::iter::once(&g.answer).chain(g.extraction.iter()));
            gen.push((l, g));
        }
    }
    let generative = (!gen.is_empty()).then(|| generative_report(variant, cases, &gen, embedder));
    Report {
        pipeline: super::PIPELINE.into(),
        model: model.into(),
        variant,
        items: labels.len(),
        failed_calls,
        invalid_by_failed_call,
        odd_answers,
        keyword: (!kw.is_empty()).then(|| form_report(&kw, keyword_overall, keyword_ci)),
        sentence: (!se.is_empty()).then(|| form_report(&se, sentence_overall, sentence_ci)),
        selective: (!sl.is_empty()).then(|| form_report(&sl, selective_overall, selective_ci)),
        generative,
        generation: None,
    }
}

fn generative_report(
    variant: UhgVariant,
    cases: &[Case],
    gen: &[(&ItemLabel, &super::plan::GenerativeLabel)],
    embedder: Option<&dyn Embedder>,
) -> GenerativeReport {
    let item = |g: &super::plan::GenerativeLabel, bleu4: f64| GenerativeItem {
        bleu4,
        rouge_l: g.rouge_l,
        kw_prec: g.kw_prec,
        length: g.length,
        valid: g.valid,
    };
    let chosen: Vec<(NewsType, GenerativeItem)> = gen
        .iter()
        .map(|(l, g)| {
            let b = match variant {
                UhgVariant::Paper => g.bleu4_paper,
                UhgVariant::V2 => g.bleu4_v2,
            };
            (l.news_type, item(g, b))
        })
        .collect();
    let fr = form_report(&chosen, generative_overall, generative_ci);
    let values = |f: fn(&super::plan::GenerativeLabel) -> f64| -> Vec<f64> {
        gen.iter().filter(|(_, g)| g.valid).map(|(_, g)| f(g)).collect()
    };
    let avg = |v: &[f64]| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
    let (paper, v2) = (values(|g| g.bleu4_paper), values(|g| g.bleu4_v2));
    let mut ci95 = fr.ci95;
    for (name, v) in [("avg_bleu4_paper", &paper), ("avg_bleu4_v2", &v2)] {
        if let Ok(ci) = bootstrap_mean(v, Bootstrap::default()) {
            ci95.insert(name.to_string(), ci);
        }
    }
    GenerativeReport {
        overall: fr.overall,
        by_type: fr.by_type,
        avg_bleu4_paper: avg(&paper),
        avg_bleu4_v2: avg(&v2),
        bert_score: bert_score(cases, gen, embedder),
        ci95,
        ci95_by_type: fr.ci95_by_type,
    }
}

fn bert_score(
    cases: &[Case],
    gen: &[(&ItemLabel, &super::plan::GenerativeLabel)],
    embedder: Option<&dyn Embedder>,
) -> BertScore {
    let Some(e) = embedder else {
        return BertScore::missing(BERT_NOT_COMPUTED.into());
    };
    let refs: HashMap<&str, &str> =
        cases.iter().map(|c| (c.item.id.as_str(), c.item.news_remainder.as_str())).collect();
    let mut values = Vec::new();
    for (l, g) in gen.iter().filter(|(_, g)| g.valid) {
        let Some(reference) = refs.get(l.id.as_str()) else {
            return BertScore::missing(format!(
                "not computed (item {} is not in the dataset)",
                l.id
            ));
        };
        match similarity(e, &g.continuation, reference) {
            Ok(v) => values.push(v),
            Err(err) => {
                return BertScore::missing(format!(
                    "not computed ({}: item {}: {err})",
                    e.name(),
                    l.id
                ))
            }
        }
    }
    BertScore::of(e.name(), &values)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::uhgeval::{Choice, OptionOrder};
    use crate::uhgeval::embed::tests::CharCounts;
    use crate::uhgeval::plan::{Answer, GenerativeLabel, SelectiveLabel};
    use crate::uhgeval::render_markdown;

    fn answer(error: Option<&str>) -> Answer {
        Answer {
            job: "j".into(),
            text: error.is_none().then(|| "x".into()),
            error: error.map(String::from),
            kind: None,
        }
    }

    fn label(id: &str, t: NewsType, continuation: &str, valid: bool, correct: bool) -> ItemLabel {
        ItemLabel {
            id: id.into(),
            news_type: t,
            model: "m".into(),
            variant: UhgVariant::Paper,
            keyword: None,
            sentence: None,
            selective: Some(SelectiveLabel {
                order: OptionOrder::HallucinatedFirst,
                answer: answer(None),
                choice: Choice::B,
                correct,
                valid: true,
            }),
            generative: Some(GenerativeLabel {
                answer: answer(if valid { None } else { Some("boom") }),
                continuation: continuation.into(),
                valid,
                extraction: None,
                keywords: vec![],
                bleu4_paper: 0.5,
                bleu4_v2: 0.001,
                rouge_l: 0.25,
                kw_prec: 1.0,
                length: continuation.chars().count(),
                bert: None,
            }),
        }
    }

    fn case(id: &str, remainder: &str) -> Case {
        let mut item = crate::uhgeval::parse_line(
            "t",
            1,
            r#"{"id": "doc_000001", "headLine": "h", "broadcastDate": "d", "type": "doc", "newsBeginning": "b", "hallucinatedContinuation": "h", "annotations": [], "realContinuation": "r", "newsRemainder": "r"}"#,
        )
        .unwrap();
        item.id = id.into();
        item.news_remainder = remainder.into();
        crate::uhgeval::prepare(vec![item]).remove(0)
    }

    /// Averages over valid items, per type; BERTScore with an embedder, a note without.
    #[test]
    fn figures_and_bert_score() {
        let labels = [
            label("doc_000001", NewsType::Doc, "的是", true, true),
            label("num_000002", NewsType::Num, "", false, false),
        ];
        let cases = [case("doc_000001", "的是"), case("num_000002", "是")];
        let r = score("m", UhgVariant::Paper, &cases, &labels, None);
        let g = r.generative.as_ref().unwrap();
        assert_eq!(
            (g.overall.num, g.overall.avg_bleu4, g.avg_bleu4_v2),
            (1, Some(0.5), Some(0.001))
        );
        assert_eq!(g.bert_score.note, BERT_NOT_COMPUTED);
        assert_eq!(r.failed_calls, 1);
        let s = r.selective.as_ref().unwrap();
        assert_eq!(
            (s.overall.accuracy, s.by_type[&NewsType::Num].accuracy),
            (Some(0.5), Some(0.0))
        );
        let md = render_markdown(&[r]);
        assert!(
            // Selective accuracy 1 of 2 with Wilson(1, 2) = 0.0945–0.9055; one valid
            // continuation: its bootstrap intervals cannot be estimated (issue 29: they
            // were printed as the point, [x, x]).
            md.contains("| `m` | 0.5000 [0.0945, 0.9055] | 2 | 0.5000 [not estimable: fewer than 2 items] | 0.2500 [not estimable: fewer than 2 items] | 1.0000 [not estimable: fewer than 2 items] | n/c | 2.0000 [not estimable: fewer than 2 items] | 1 |"),
            "{md}"
        );
        let r = score("m", UhgVariant::Paper, &cases, &labels, Some(&CharCounts));
        let b = &r.generative.unwrap().bert_score;
        assert_eq!(b.model.as_deref(), Some("char-counts"));
        assert!((b.avg.unwrap() - 1.0).abs() < 1e-12, "{b:?}");
    }

    /// Issue 16: every figure has its interval (Wilson for selective accuracy, bootstrap
    /// for the means), the applied generation parameters are stated, and BERTScore from
    /// `bert` jobs names its model and is marked not comparable with the paper's.
    #[test]
    fn intervals_generation_and_bert_from_jobs() {
        let mut labels: Vec<ItemLabel> = (0..6)
            .map(|i| label(&format!("doc_00000{i}"), NewsType::Doc, "的是", true, i % 3 != 0))
            .collect();
        for (i, l) in labels.iter_mut().enumerate() {
            let g = l.generative.as_mut().unwrap();
            g.rouge_l = i as f64 / 10.0;
            g.bert = Some(crate::uhgeval::embed::BertLabel {
                score: Some(0.5 + i as f64 / 100.0),
                error: None,
            });
        }
        let mut embedder = crate::common::test_model("minilm");
        embedder.model_ref.backend = "embed".into();
        let cfg = Config {
            variant: UhgVariant::Paper,
            forms: vec![],
            model: crate::common::test_model("m"),
            generation: crate::uhgeval::Generation::default(),
            bert_embedder: Some(embedder),
        };
        let r = score_config(&cfg, &[], &labels, None);
        let sel = &r.selective.as_ref().unwrap().ci95["accuracy"];
        assert_eq!(*sel, wilson(4, 6).unwrap());
        let g = r.generative.as_ref().unwrap();
        let rouge = &g.ci95["avg_rouge_l"];
        assert_eq!((rouge.n, rouge.estimate), (6, g.overall.avg_rouge_l.unwrap()));
        let (low, high) = rouge.bounds().unwrap();
        assert!(low < rouge.estimate && rouge.estimate < high);
        assert!(g.ci95.contains_key("avg_bleu4_v2") && g.ci95_by_type.contains_key(&NewsType::Doc));
        let b = &g.bert_score;
        assert_eq!((b.model.as_deref(), b.comparable_to_paper), (Some("minilm"), false));
        assert!((b.avg.unwrap() - 0.525).abs() < 1e-12 && b.ci95.unwrap().n == 6);
        assert!(b.note.contains("not comparable") && b.note.contains(PAPER_BERT_MODEL));
        let applied = r.generation.unwrap();
        assert_eq!((applied.applied.top_p, applied.applied.top_k), (Some(0.9), None));
        labels[2].generative.as_mut().unwrap().bert = None;
        let missing = score_config(&cfg, &[], &labels, None).generative.unwrap().bert_score;
        assert!(missing.avg.is_none() && missing.note.contains("doc_000002"), "{missing:?}");
    }
}

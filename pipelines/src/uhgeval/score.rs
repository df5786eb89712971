//! Labels → figures: the overall of each form (spec §1.3–§1.6), per news type (§1.7), and
//! the Markdown leaderboard across models.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::dataset::NewsType;
use super::embed::{similarity, Embedder};
use super::plan::{Case, ItemLabel};
use crate::metrics::uhgeval::{
    generative_overall, keyword_overall, selective_overall, sentence_overall, AccuracyOverall, GenerativeItem,
    GenerativeOverall, KeywordItem, KeywordOverall, SelectiveItem, SentenceItem, UhgVariant,
};

/// A form's overall, and the same over each news type's items (types without items are
/// left out).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FormReport<T> {
    pub overall: T,
    pub by_type: BTreeMap<NewsType, T>,
}

fn form_report<I: Clone, T>(items: &[(NewsType, I)], overall: fn(&[I]) -> T) -> FormReport<T> {
    let all: Vec<I> = items.iter().map(|(_, i)| i.clone()).collect();
    let mut by_type = BTreeMap::new();
    for t in NewsType::ALL {
        let of: Vec<I> = items.iter().filter(|(ty, _)| *ty == t).map(|(_, i)| i.clone()).collect();
        if !of.is_empty() {
            by_type.insert(t, overall(&of));
        }
    }
    FormReport { overall: overall(&all), by_type }
}

/// The "BERTScore" column (spec §1.6, §6.2).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BertScore {
    /// The embedding model; `None`: not computed.
    pub model: Option<String>,
    /// Mean over valid items.
    pub avg: Option<f64>,
    /// Why it is missing, or which model computed it.
    pub note: String,
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
}

/// The figures of one (benchmark, model).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub pipeline: String,
    pub model: String,
    pub variant: UhgVariant,
    /// Items with a label.
    pub items: usize,
    /// Model calls that became dead letters (read as empty answers).
    pub failed_calls: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keyword: Option<FormReport<KeywordOverall>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sentence: Option<FormReport<AccuracyOverall>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selective: Option<FormReport<AccuracyOverall>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generative: Option<GenerativeReport>,
}

/// Not computed without a model.
pub const BERT_NOT_COMPUTED: &str = "not computed (no embedding model configured)";

/// Scores one model's labels. `cases` supplies the references for BERTScore; `embedder`
/// is the BERTScore model, if any.
pub fn score(model: &str, variant: UhgVariant, cases: &[Case], labels: &[ItemLabel], embedder: Option<&dyn Embedder>) -> Report {
    let mut failed_calls = 0;
    let mut count = |a: &super::plan::Answer| failed_calls += usize::from(a.error.is_some());
    let (mut kw, mut se, mut sl, mut gen) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for l in labels {
        let t = l.news_type;
        if let Some(k) = &l.keyword {
            k.keywords.iter().for_each(|v| count(&v.answer));
            kw.push((t, KeywordItem { accuracy: k.accuracy, num_kws: k.num_kws, valid: k.valid }));
        }
        if let Some(s) = &l.sentence {
            count(&s.on_hallucinated);
            count(&s.on_real);
            se.push((t, SentenceItem { accuracy: s.accuracy, valid: s.valid }));
        }
        if let Some(s) = &l.selective {
            count(&s.answer);
            sl.push((t, SelectiveItem { correct: s.correct, valid: s.valid }));
        }
        if let Some(g) = &l.generative {
            count(&g.answer);
            g.extraction.iter().for_each(&mut count);
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
        keyword: (!kw.is_empty()).then(|| form_report(&kw, keyword_overall)),
        sentence: (!se.is_empty()).then(|| form_report(&se, sentence_overall)),
        selective: (!sl.is_empty()).then(|| form_report(&sl, selective_overall)),
        generative,
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
    let fr = form_report(&chosen, generative_overall);
    let avg_of = |f: fn(&super::plan::GenerativeLabel) -> f64| {
        let v: Vec<f64> = gen.iter().filter(|(_, g)| g.valid).map(|(_, g)| f(g)).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    GenerativeReport {
        overall: fr.overall,
        by_type: fr.by_type,
        avg_bleu4_paper: avg_of(|g| g.bleu4_paper),
        avg_bleu4_v2: avg_of(|g| g.bleu4_v2),
        bert_score: bert_score(cases, gen, embedder),
    }
}

fn bert_score(
    cases: &[Case],
    gen: &[(&ItemLabel, &super::plan::GenerativeLabel)],
    embedder: Option<&dyn Embedder>,
) -> BertScore {
    let Some(e) = embedder else {
        return BertScore { model: None, avg: None, note: BERT_NOT_COMPUTED.into() };
    };
    let refs: HashMap<&str, &str> = cases.iter().map(|c| (c.item.id.as_str(), c.item.news_remainder.as_str())).collect();
    let mut values = Vec::new();
    for (l, g) in gen.iter().filter(|(_, g)| g.valid) {
        let Some(reference) = refs.get(l.id.as_str()) else {
            return BertScore { model: None, avg: None, note: format!("not computed (item {} is not in the dataset)", l.id) };
        };
        match similarity(e, &g.continuation, reference) {
            Ok(v) => values.push(v),
            Err(err) => {
                return BertScore { model: None, avg: None, note: format!("not computed ({}: item {}: {err})", e.name(), l.id) }
            }
        }
    }
    let avg = (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64);
    BertScore {
        model: Some(e.name().to_string()),
        avg,
        note: format!("cosine similarity of `{}` embeddings (UHGEval used text2vec-base-chinese)", e.name()),
    }
}

fn num(v: Option<f64>) -> String {
    v.map_or("–".into(), |x| format!("{x:.4}"))
}

/// One benchmark's Markdown section: the leaderboard (one row per model, sweep order),
/// then each model's figures per news type.
pub fn render_markdown(reports: &[Report]) -> String {
    let mut md = String::new();
    let Some(first) = reports.first() else { return md };
    md.push_str(&format!("Variant `{}`", first.variant_str()));
    md.push_str(
        ": discriminative accuracy is the mean item accuracy over valid items, selective accuracy is \
         #correct/#valid, generative metrics are means over valid continuations against the whole `newsRemainder`.\n\n",
    );
    let has = |f: fn(&Report) -> bool| reports.iter().any(f);
    let (kw, se, sl, ge) =
        (has(|r| r.keyword.is_some()), has(|r| r.sentence.is_some()), has(|r| r.selective.is_some()), has(|r| r.generative.is_some()));
    let mut head = vec!["model".to_string()];
    if kw {
        head.extend(["keyword avg. acc.", "avg. #kws", "#valid"].map(String::from));
    }
    if se {
        head.extend(["sentence avg. acc.", "#valid"].map(String::from));
    }
    if sl {
        head.extend(["selective acc.", "#valid"].map(String::from));
    }
    if ge {
        let b = format!("BLEU-4 ({})", first.variant_str());
        head.extend([b.as_str(), "ROUGE-L", "kwPrec", "BERTScore", "avg. len.", "#valid"].map(String::from));
    }
    md.push_str("### Leaderboard\n\n");
    md.push_str(&format!("| {} |\n|{}\n", head.join(" | "), "---|".repeat(head.len())));
    for r in reports {
        let mut row = vec![format!("`{}`", r.model)];
        if kw {
            let o = r.keyword.as_ref().map(|f| f.overall);
            row.extend([num(o.and_then(|o| o.avg_accuracy)), num(o.and_then(|o| o.avg_num_kws)), o.map_or("–".into(), |o| o.num.to_string())]);
        }
        for (on, f) in [(se, &r.sentence), (sl, &r.selective)] {
            if on {
                let o = f.as_ref().map(|f| f.overall);
                row.extend([num(o.and_then(|o| o.accuracy)), o.map_or("–".into(), |o| o.num.to_string())]);
            }
        }
        if ge {
            let g = r.generative.as_ref();
            let o = g.map(|g| g.overall);
            row.extend([
                num(o.and_then(|o| o.avg_bleu4)),
                num(o.and_then(|o| o.avg_rouge_l)),
                num(o.and_then(|o| o.avg_kw_prec)),
                g.map_or("–".into(), |g| g.bert_score.avg.map_or("n/c".into(), |v| format!("{v:.4}"))),
                num(o.and_then(|o| o.avg_length)),
                o.map_or("–".into(), |o| o.num.to_string()),
            ]);
        }
        md.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    md.push('\n');
    if ge {
        for r in reports {
            if let Some(g) = &r.generative {
                md.push_str(&format!(
                    "`{}`: BLEU-4 paper (no brevity penalty) {}, v2 (nltk, with brevity penalty) {}; BERTScore: {}.\n",
                    r.model,
                    num(g.avg_bleu4_paper),
                    g.avg_bleu4_v2.map_or("–".into(), |v| format!("{v:.4e}")),
                    g.bert_score.note
                ));
            }
        }
        md.push('\n');
    }
    for r in reports {
        md.push_str(&format!("### `{}` by news type\n\n| type | keyword acc. | sentence acc. | selective acc. | BLEU-4 | ROUGE-L | kwPrec | #valid |\n|---|---|---|---|---|---|---|---|\n", r.model));
        for t in NewsType::ALL {
            let k = r.keyword.as_ref().and_then(|f| f.by_type.get(&t)).and_then(|o| o.avg_accuracy);
            let s = r.sentence.as_ref().and_then(|f| f.by_type.get(&t)).and_then(|o| o.accuracy);
            let c = r.selective.as_ref().and_then(|f| f.by_type.get(&t)).and_then(|o| o.accuracy);
            let g = r.generative.as_ref().and_then(|g| g.by_type.get(&t));
            md.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
                t.as_str(),
                num(k),
                num(s),
                num(c),
                num(g.and_then(|g| g.avg_bleu4)),
                num(g.and_then(|g| g.avg_rouge_l)),
                num(g.and_then(|g| g.avg_kw_prec)),
                r.type_items(t)
            ));
        }
        md.push('\n');
        if r.failed_calls > 0 {
            md.push_str(&format!("{} model call(s) failed and were read as empty answers (invalid).\n\n", r.failed_calls));
        }
    }
    md
}

impl Report {
    fn variant_str(&self) -> &'static str {
        match self.variant {
            UhgVariant::Paper => "paper",
            UhgVariant::V2 => "v2",
        }
    }

    /// #valid of the first form with results for type `t` (for the per-type table).
    fn type_items(&self, t: NewsType) -> String {
        let k = self.keyword.as_ref().and_then(|f| f.by_type.get(&t)).map(|o| o.num);
        let s = self.sentence.as_ref().and_then(|f| f.by_type.get(&t)).map(|o| o.num);
        let c = self.selective.as_ref().and_then(|f| f.by_type.get(&t)).map(|o| o.num);
        let g = self.generative.as_ref().and_then(|f| f.by_type.get(&t)).map(|o| o.num);
        let parts: Vec<String> = [("kw", k), ("sent", s), ("sel", c), ("gen", g)]
            .into_iter()
            .filter_map(|(n, v)| v.map(|v| format!("{n} {v}")))
            .collect();
        if parts.is_empty() {
            "–".into()
        } else {
            format!("valid: {}", parts.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::uhgeval::embed::tests::CharCounts;
    use crate::uhgeval::plan::{Answer, GenerativeLabel, SelectiveLabel};
    use crate::metrics::uhgeval::{Choice, OptionOrder};

    fn answer(error: Option<&str>) -> Answer {
        Answer { job: "j".into(), text: error.is_none().then(|| "x".into()), error: error.map(String::from) }
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
        assert_eq!((g.overall.num, g.overall.avg_bleu4, g.avg_bleu4_v2), (1, Some(0.5), Some(0.001)));
        assert_eq!(g.bert_score.note, BERT_NOT_COMPUTED);
        assert_eq!(r.failed_calls, 1);
        let s = r.selective.as_ref().unwrap();
        assert_eq!((s.overall.accuracy, s.by_type[&NewsType::Num].accuracy), (Some(0.5), Some(0.0)));
        let md = render_markdown(&[r]);
        assert!(md.contains("| `m` | 0.5000 | 2 | 0.5000 | 0.2500 | 1.0000 | n/c | 2.0000 | 1 |"), "{md}");
        let r = score("m", UhgVariant::Paper, &cases, &labels, Some(&CharCounts));
        let b = &r.generative.unwrap().bert_score;
        assert_eq!(b.model.as_deref(), Some("char-counts"));
        assert!((b.avg.unwrap() - 1.0).abs() < 1e-12, "{b:?}");
    }
}

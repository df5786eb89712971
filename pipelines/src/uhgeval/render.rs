//! The Markdown section of a UHGEval benchmark: the leaderboard across models and each
//! model's figures per news type.

use super::dataset::NewsType;
use super::score::{Intervals, Report};
use crate::metrics::interval::with_bracket;
use crate::metrics::uhgeval::UhgVariant;

fn num(v: Option<f64>) -> String {
    v.map_or("–".into(), |x| format!("{x:.4}"))
}

/// A figure with its 95% interval from `cis` (by figure name) in brackets.
fn ci(v: Option<f64>, cis: Option<&Intervals>, name: &str) -> String {
    with_bracket(v, cis.and_then(|c| c.get(name)), 1.0, 4)
}

/// One benchmark's Markdown section: the leaderboard (one row per model, sweep order),
/// then each model's figures per news type.
pub fn render_markdown(reports: &[Report]) -> String {
    let mut md = String::new();
    let Some(first) = reports.first() else { return md };
    md.push_str(&format!("Variant `{}`", first.variant_str()));
    md.push_str(
        ": discriminative accuracy is the mean item accuracy over valid items, selective accuracy is \
         #correct/#valid, generative metrics are means over valid continuations against the whole `newsRemainder`. \
         In brackets: the 95% interval (Wilson for selective accuracy, a seeded bootstrap over valid items for the means).\n\n",
    );
    let has = |f: fn(&Report) -> bool| reports.iter().any(f);
    let (kw, se, sl, ge) = (
        has(|r| r.keyword.is_some()),
        has(|r| r.sentence.is_some()),
        has(|r| r.selective.is_some()),
        has(|r| r.generative.is_some()),
    );
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
        head.extend(
            [b.as_str(), "ROUGE-L", "kwPrec", "BERTScore", "avg. len.", "#valid"].map(String::from),
        );
    }
    md.push_str("### Leaderboard\n\n");
    md.push_str(&format!("| {} |\n|{}\n", head.join(" | "), "---|".repeat(head.len())));
    for r in reports {
        let mut row = vec![format!("`{}`", r.model)];
        if kw {
            let o = r.keyword.as_ref().map(|f| f.overall);
            let cis = r.keyword.as_ref().map(|f| &f.ci95);
            row.extend([
                ci(o.and_then(|o| o.avg_accuracy), cis, "avg_accuracy"),
                num(o.and_then(|o| o.avg_num_kws)),
                o.map_or("–".into(), |o| o.num.to_string()),
            ]);
        }
        for (on, f) in [(se, &r.sentence), (sl, &r.selective)] {
            if on {
                let o = f.as_ref().map(|f| f.overall);
                row.extend([
                    ci(o.and_then(|o| o.accuracy), f.as_ref().map(|f| &f.ci95), "accuracy"),
                    o.map_or("–".into(), |o| o.num.to_string()),
                ]);
            }
        }
        if ge {
            let g = r.generative.as_ref();
            let o = g.map(|g| g.overall);
            let cis = g.map(|g| &g.ci95);
            row.extend([
                ci(o.and_then(|o| o.avg_bleu4), cis, "avg_bleu4"),
                ci(o.and_then(|o| o.avg_rouge_l), cis, "avg_rouge_l"),
                ci(o.and_then(|o| o.avg_kw_prec), cis, "avg_kw_prec"),
                g.map_or("–".into(), |g| match g.bert_score.avg {
                    None => "n/c".into(),
                    v => with_bracket(v, g.bert_score.ci95.as_ref(), 1.0, 4),
                }),
                ci(o.and_then(|o| o.avg_length), cis, "avg_length"),
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
            let kf = r.keyword.as_ref();
            let k = kf.and_then(|f| f.by_type.get(&t)).and_then(|o| o.avg_accuracy);
            let sf = r.sentence.as_ref();
            let s = sf.and_then(|f| f.by_type.get(&t)).and_then(|o| o.accuracy);
            let cf = r.selective.as_ref();
            let c = cf.and_then(|f| f.by_type.get(&t)).and_then(|o| o.accuracy);
            let gf = r.generative.as_ref();
            let g = gf.and_then(|g| g.by_type.get(&t));
            let gc = gf.and_then(|g| g.ci95_by_type.get(&t));
            md.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
                t.as_str(),
                ci(k, kf.and_then(|f| f.ci95_by_type.get(&t)), "avg_accuracy"),
                ci(s, sf.and_then(|f| f.ci95_by_type.get(&t)), "accuracy"),
                ci(c, cf.and_then(|f| f.ci95_by_type.get(&t)), "accuracy"),
                ci(g.and_then(|g| g.avg_bleu4), gc, "avg_bleu4"),
                ci(g.and_then(|g| g.avg_rouge_l), gc, "avg_rouge_l"),
                ci(g.and_then(|g| g.avg_kw_prec), gc, "avg_kw_prec"),
                r.type_items(t)
            ));
        }
        md.push('\n');
        if r.failed_calls > 0 {
            let forms: Vec<String> =
                r.invalid_by_failed_call.iter().map(|(f, n)| format!("{f} {n}")).collect();
            md.push_str(&format!(
                "{} model call(s) failed (dead letters); each makes its item invalid in its form, \
                 left out of the averages: {}.\n\n",
                r.failed_calls,
                forms.join(", ")
            ));
        }
        if r.odd_answers.total() > 0 {
            md.push_str(&format!(
                "Empty or refused answers, read by UHGEval's rules: {}.\n\n",
                r.odd_answers.describe()
            ));
        }
    }
    md
}

impl Report {
    pub(crate) fn variant_str(&self) -> &'static str {
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

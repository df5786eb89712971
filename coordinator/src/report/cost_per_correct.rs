//! Cost per correct answer (issue 53): what one non-hallucinated answer of a model cost,
//! per result (model under test × judge) of the pipelines where a model under test
//! answers and each answer is found hallucinated or not, with a 95% interval.
//!
//! What "correct" and "cost" are, per pipeline ([`Rule`]):
//! - **HypoTermQA**: an answer labelled `valid` (neither hallucinated nor irrelevant),
//!   over every question; cost: the model's `answer` stage.
//! - **AutoHall**: a claim whose reference the model classified as the gold label says
//!   (`factual`: not hallucinated, spec §2.1 step 3), over every claim (a refused,
//!   unclassified or failed reference is not correct); cost: its `reference` and
//!   `classify` stages (the detection's `sample`, `pair` and baseline calls are the
//!   evaluation's).
//! - **HVI** (judge mode): a sentence of the model's passages its judge (or the panel)
//!   found not hallucinated, over the sentences judged (`U`); cost: the `passage` stage.
//!   Sentences of one passage are not independent, so the interval is narrower than a
//!   passage-level one would be (the book says so).
//! - **ChainPoll** and **UHGEval**: none. ChainPoll's model is a detector scoring given
//!   completions, it answers nothing of its own; UHGEval's discriminative forms are
//!   detection questions, and its generative continuations are scored by overlap with the
//!   reference (BLEU, ROUGE-L, kwPrec), never labelled hallucinated or not.
//!   [`markdown`] says so when such a benchmark is in the run.
//!
//! Judging costs are left out everywhere: they are the evaluation's cost, not the
//! model's. The cost is the answers at the model's prices whether this run paid for them
//! or the result cache answered them (paid in an earlier run: its `saved`): what using
//! the model costs does not fall to nothing on a rerun. **cost per correct** = cost / correct; its interval takes the cost as known
//! and the share of correct answers as the uncertain part: with the Wilson 95% interval
//! (low, high) of correct / answers, it is cost / (answers · high) to cost /
//! (answers · low) (no upper bound when low is 0).
//!
//! No figure where it would mislead: a model without a price (cost 0), no correct answer,
//! or a model under test in two benchmarks of the same pipeline (its stages' cost covers
//! both; the table says so).

use halyard_pipelines::metrics::interval::wilson;
use serde::Serialize;
use serde_json::Value;

/// One row of `report.json`'s `cost_per_correct`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CostPerCorrect {
    pub benchmark: u64,
    pub pipeline: String,
    pub model: String,
    pub judge: String,
    /// What one answer is (`answer`, `claim`, `sentence`).
    pub unit: String,
    /// USD of the model's answers at its prices: paid in this run plus answered from the
    /// result cache (`saved`, paid before).
    pub cost: f64,
    /// Of `cost`, what the result cache answered.
    pub from_cache: f64,
    /// Answers that were correct, and answers.
    pub correct: u64,
    pub answers: u64,
    /// USD per correct answer, with its 95% interval; `None` with `note` saying why.
    pub per_correct: Option<f64>,
    pub low: Option<f64>,
    pub high: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// How one pipeline's result gives its correct answers.
struct Rule {
    pipeline: &'static str,
    unit: &'static str,
    /// The model's own stages (what using it costs).
    stages: &'static [&'static str],
    /// (model alias, judge, correct, answers) of a `report.json` entry; `None`: the entry
    /// has no answers of the model to count (HVI from a labels file).
    read: fn(&Value) -> Option<Counted>,
}

/// (model alias, judge, correct answers, answers) of one `report.json` entry.
type Counted = (String, String, u64, u64);

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or("?").to_string()
}

const RULES: [Rule; 3] = [
    Rule {
        pipeline: "hypotermqa",
        unit: "answer",
        stages: &["answer"],
        read: |e| {
            let l = &e["answer_labels"];
            let correct = u(&l["hypothetical"]["valid"]) + u(&l["valid"]["valid"]);
            Some((text(&e["model"]), text(&e["judge"]), correct, u(&e["questions"])))
        },
    },
    Rule {
        pipeline: "autohall",
        unit: "claim",
        stages: &["reference", "classify"],
        // The model classifies its own reference: no other judge.
        read: |e| {
            Some((
                text(&e["model"]),
                "(itself, against gold)".into(),
                u(&e["factual"]),
                u(&e["claims"]),
            ))
        },
    },
    Rule {
        pipeline: "hvi",
        unit: "sentence",
        stages: &["passage"],
        read: |e| {
            if e["source"] != "judge" {
                return None;
            }
            // With a panel, one entry per judge ("m (judge j)") and the panel's ("m (panel
            // rule)"); with one judge, the model's alias alone.
            let name = text(&e["model"]);
            let (model, judge) = match name.split_once(" (") {
                Some((m, rest)) => (m.to_string(), rest.trim_end_matches(')').to_string()),
                None => (name, "judge".into()),
            };
            let c = &e["counts"];
            let sentences = u(&c["sentences"]);
            Some((model, judge, sentences.saturating_sub(u(&c["hallucinated"])), sentences))
        },
    },
];

/// Pipelines without a cost per correct answer, and why.
const NONE: [(&str, &str); 2] = [
    ("chainpoll", "its model is a detector scoring given completions and answers nothing of its own"),
    ("uhgeval", "its discriminative forms are detection questions and its continuations are scored by overlap with the reference, never labelled hallucinated or not"),
];

/// The rows of a report's benchmark entries, given its cost table's `by_model_stage`.
pub fn rows(benchmarks: &[Value], by_model_stage: &[Value]) -> Vec<CostPerCorrect> {
    let mut out = Vec::new();
    for rule in &RULES {
        let mine: Vec<(u64, (String, String, u64, u64))> = benchmarks
            .iter()
            .filter(|e| e["pipeline"] == rule.pipeline)
            .filter_map(|e| Some((e["benchmark"].as_u64().unwrap_or(0), (rule.read)(e)?)))
            .collect();
        for (bench, (model, judge, correct, answers)) in &mine {
            let stages = by_model_stage.iter().filter(|c| {
                c["model"] == model.as_str() && rule.stages.iter().any(|s| c["stage"] == *s)
            });
            let sum = |field: &str| stages.clone().filter_map(|c| c[field].as_f64()).sum::<f64>();
            let from_cache = sum("saved");
            let cost = sum("cost") + from_cache;
            let shared = mine.iter().any(|(b, o)| o.0 == *model && b != bench);
            let mut row = CostPerCorrect {
                benchmark: *bench,
                pipeline: rule.pipeline.into(),
                model: model.clone(),
                judge: judge.clone(),
                unit: rule.unit.into(),
                cost,
                from_cache,
                correct: *correct,
                answers: *answers,
                per_correct: None,
                low: None,
                high: None,
                note: None,
            };
            row.note = if shared {
                Some(format!("the model answers in more than one {} benchmark: its cost is not per benchmark", rule.pipeline))
            } else if cost <= 0.0 {
                Some("no cost (the model has no price)".into())
            } else if row.correct == 0 {
                Some("no correct answer".into())
            } else {
                None
            };
            if row.note.is_none() {
                row.per_correct = Some(cost / row.correct as f64);
                let n = row.answers.max(row.correct);
                if let Ok(w) = wilson(row.correct, n) {
                    if let Some((lo, hi)) = w.bounds() {
                        row.low = (hi > 0.0).then(|| cost / (n as f64 * hi));
                        row.high = (lo > 0.0).then(|| cost / (n as f64 * lo));
                    }
                }
            }
            out.push(row);
        }
    }
    // Say so for the results of pipelines without one.
    for (p, why) in NONE {
        for e in benchmarks.iter().filter(|e| e["pipeline"] == p) {
            out.push(CostPerCorrect {
                benchmark: e["benchmark"].as_u64().unwrap_or(0),
                pipeline: p.into(),
                model: text(&e["model"]),
                judge: "–".into(),
                unit: "–".into(),
                cost: 0.0,
                from_cache: 0.0,
                correct: 0,
                answers: 0,
                per_correct: None,
                low: None,
                high: None,
                note: Some(format!("no cost per correct answer: {why}")),
            });
        }
    }
    out.sort_by_key(|r| r.benchmark);
    out
}

/// What a correct answer is, for the text above the tables.
pub const MEANING: &str = "A correct answer: HypoTermQA, an answer labelled valid (neither hallucinated nor irrelevant), over every question (cost: the answer stage); AutoHall, a claim whose reference the model classified as its gold label says (factual), over every claim (cost: the reference and classify stages); HVI, a sentence of the model's passages judged not hallucinated, over the sentences judged (cost: the passage stage; sentences of one passage are not independent, so its interval is too narrow).";

fn usd(x: Option<f64>) -> String {
    x.map_or("–".into(), |v| format!("${v:.6}"))
}

/// " (of which $x from the result cache)" when any.
fn cached(from_cache: f64) -> String {
    if from_cache > 0.0 {
        format!(" (of which ${from_cache:.6} from the result cache)")
    } else {
        String::new()
    }
}

/// The Markdown table (nothing when there is no HypoTermQA result).
pub fn markdown(rows: &[CostPerCorrect]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut md = format!("## Cost per correct answer\n\nUSD of the model's answers per correct answer, with a 95% interval from the Wilson interval of the share correct (the cost taken as known). Judging costs are left out; answers from the result cache count at the model's prices (paid in an earlier run). {MEANING}\n\n| benchmark | model | judge | cost | correct / answers | per correct | 95% CI | pipeline (unit) |\n|---|---|---|---|---|---|---|---|\n");
    for r in rows {
        let ci = match (r.low, r.high, &r.note) {
            (_, _, Some(n)) => n.clone(),
            (Some(l), Some(h), None) => format!("{} to {}", usd(Some(l)), usd(Some(h))),
            (Some(l), None, None) => format!("{} to ∞", usd(Some(l))),
            _ => "–".into(),
        };
        md.push_str(&format!(
            "| {} | {} | {} | ${:.6}{} | {} / {} | {} | {} | {} ({}) |\n",
            r.benchmark,
            r.model,
            r.judge,
            r.cost,
            cached(r.from_cache),
            r.correct,
            r.answers,
            usd(r.per_correct),
            ci,
            r.pipeline,
            r.unit
        ));
    }
    md.push('\n');
    md
}

/// The `report.html` section: per benchmark, a price/performance plot (x: USD per
/// correct answer with its interval as a whisker; y: the share of answers correct), then
/// the table. `rows` is `report.json`'s `cost_per_correct` (nothing when absent).
pub fn html(rows: &Value) -> String {
    use super::html::esc;
    use std::fmt::Write as _;
    let Some(rows) = rows.as_array().filter(|r| !r.is_empty()) else {
        return String::new();
    };
    let mut o = format!("<h2 id=\"cost-per-correct\">Cost per correct answer</h2><p class=\"meta\">USD of the model's answers per correct answer; the whisker is the 95% interval (the Wilson interval of the share correct, the cost taken as known). Judging costs are left out; answers from the result cache count at the model's prices (paid in an earlier run). {}</p>", esc(MEANING));
    let mut benches: Vec<u64> = rows.iter().filter_map(|r| r["benchmark"].as_u64()).collect();
    benches.dedup();
    for b in benches {
        let pts: Vec<&Value> = rows
            .iter()
            .filter(|r| r["benchmark"].as_u64() == Some(b) && r["per_correct"].is_number())
            .collect();
        if pts.is_empty() {
            continue;
        }
        let xmax = pts
            .iter()
            .map(|r| r["high"].as_f64().or(r["per_correct"].as_f64()).unwrap_or(0.0))
            .fold(0.0_f64, f64::max)
            .max(1e-12)
            * 1.1;
        let (w, h, left, top) = (520.0, 260.0, 70.0, 20.0);
        let x = |v: f64| left + w * (v / xmax);
        let y = |share: f64| top + h * (1.0 - share);
        let _ = write!(
            o,
            "<figure class=\"price-performance\" data-benchmark=\"{b}\"><figcaption>Benchmark {b}: price/performance</figcaption><svg width=\"{}\" height=\"{}\" role=\"img\"><line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#999\"/><line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{}\" stroke=\"#999\"/><text x=\"{}\" y=\"{}\" text-anchor=\"middle\">USD per correct answer (0 to ${:.6})</text><text x=\"12\" y=\"{}\" transform=\"rotate(-90 12 {})\" text-anchor=\"middle\">share of {}s correct</text>",
            left + w + 140.0,
            top + h + 50.0,
            top + h,
            left + w,
            top + h,
            top + h,
            left + w / 2.0,
            top + h + 36.0,
            xmax,
            top + h / 2.0,
            top + h / 2.0,
            esc(pts[0]["unit"].as_str().unwrap_or("answer"))
        );
        for r in &pts {
            let share = r["correct"].as_f64().unwrap_or(0.0)
                / r["answers"].as_f64().unwrap_or(1.0).max(1.0);
            let px = x(r["per_correct"].as_f64().unwrap_or(0.0));
            let py = y(share);
            if let (Some(lo), Some(hi)) = (r["low"].as_f64(), r["high"].as_f64()) {
                let _ = write!(o, "<line class=\"pp-ci\" x1=\"{:.2}\" y1=\"{py:.2}\" x2=\"{:.2}\" y2=\"{py:.2}\" stroke=\"#555\"/>", x(lo), x(hi));
            }
            let label = format!(
                "{} (judge {})",
                r["model"].as_str().unwrap_or("?"),
                r["judge"].as_str().unwrap_or("?")
            );
            let _ = write!(
                o,
                "<circle class=\"pp-point\" cx=\"{px:.2}\" cy=\"{py:.2}\" r=\"5\" fill=\"#1e88e5\"><title>{}: ${:.6} per correct, {:.1}% correct</title></circle><text x=\"{:.2}\" y=\"{:.2}\" font-size=\"11\">{}</text>",
                esc(&label),
                r["per_correct"].as_f64().unwrap_or(0.0),
                share * 100.0,
                px + 8.0,
                py - 6.0,
                esc(&label)
            );
        }
        o.push_str("</svg></figure>");
    }
    let _ = write!(o, "<table><tr><th>benchmark</th><th>model</th><th>judge</th><th>cost</th><th>correct / answers</th><th>per correct</th><th>95% CI</th><th>pipeline (unit)</th></tr>");
    let usd = |v: &Value| v.as_f64().map_or("–".into(), |x| format!("${x:.6}"));
    for r in rows {
        let ci = match (r["note"].as_str(), r["high"].is_null()) {
            (Some(n), _) => n.to_string(),
            (None, false) => format!("{} to {}", usd(&r["low"]), usd(&r["high"])),
            (None, true) => format!("{} to ∞", usd(&r["low"])),
        };
        let _ = write!(
            o,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}{}</td><td>{} / {}</td><td>{}</td><td>{}</td><td>{} ({})</td></tr>",
            r["benchmark"].as_u64().unwrap_or(0),
            esc(r["model"].as_str().unwrap_or("?")),
            esc(r["judge"].as_str().unwrap_or("?")),
            usd(&r["cost"]),
            esc(&cached(r["from_cache"].as_f64().unwrap_or(0.0))),
            r["correct"].as_u64().unwrap_or(0),
            r["answers"].as_u64().unwrap_or(0),
            usd(&r["per_correct"]),
            esc(&ci),
            esc(r["pipeline"].as_str().unwrap_or("hypotermqa")),
            esc(r["unit"].as_str().unwrap_or("answer"))
        );
    }
    o.push_str("</table>");
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(b: u64, model: &str, hyp_valid: u64, valid_valid: u64, questions: u64) -> Value {
        json!({"pipeline": "hypotermqa", "benchmark": b, "model": model, "judge": "j",
            "questions": questions,
            "answer_labels": {"hypothetical": {"valid": hyp_valid}, "valid": {"valid": valid_valid}}})
    }

    /// Hand count: model-a spent $0.30 on 20 answers, 12 of them valid (5 + 7): $0.025 per
    /// correct answer; the Wilson interval of 12/20 is 0.38658 to 0.78119 (Wilson 1927;
    /// e.g. R's `prop.test(12, 20, correct = FALSE)`), so $0.0192 to $0.0388.
    #[test]
    fn hand_count() {
        let costs = vec![
            json!({"model": "model-a", "stage": "answer", "cost": 0.25}),
            json!({"model": "model-a", "stage": "answer", "cost": 0.05}),
            json!({"model": "j", "stage": "acceptance", "cost": 9.0}),
        ];
        let r = &rows(&[entry(0, "model-a", 5, 7, 20)], &costs)[0];
        assert_eq!((r.correct, r.answers), (12, 20));
        assert!((r.cost - 0.30).abs() < 1e-12);
        assert!((r.per_correct.unwrap() - 0.025).abs() < 1e-12);
        assert!((r.low.unwrap() - 0.30 / (20.0 * 0.781193)).abs() < 1e-5, "{r:?}");
        assert!((r.high.unwrap() - 0.30 / (20.0 * 0.386582)).abs() < 1e-5, "{r:?}");
        assert!(markdown(std::slice::from_ref(r))
            .contains("| 0 | model-a | j | $0.300000 | 12 / 20 | $0.025000 |"));
    }

    /// No figure where it would mislead, each with its reason.
    /// Issue 51: a rerun answered from the result cache costs what the answers cost at
    /// the model's prices (the cache's `saved`), not nothing; the table says how much
    /// came from the cache.
    #[test]
    fn answers_from_the_cache_count_at_their_price() {
        let costs = vec![
            json!({"model": "model-a", "stage": "answer", "cost": 0.0, "saved": 0.30}),
            json!({"model": "j", "stage": "acceptance", "cost": 0.0, "saved": 9.0}),
        ];
        let rs = rows(&[entry(0, "model-a", 5, 7, 20)], &costs);
        let r = &rs[0];
        assert!((r.cost - 0.30).abs() < 1e-12 && (r.from_cache - 0.30).abs() < 1e-12, "{r:?}");
        assert!((r.per_correct.unwrap() - 0.30 / 12.0).abs() < 1e-12);
        assert!(markdown(&rs).contains("$0.300000 (of which $0.300000 from the result cache)"));
    }

    #[test]
    fn no_figure_without_price_or_correct_answers() {
        let costs = vec![json!({"model": "b", "stage": "answer", "cost": 0.1})];
        let rs = rows(&[entry(0, "a", 3, 3, 10), entry(1, "b", 0, 0, 10)], &costs);
        assert_eq!(rs[0].per_correct, None);
        assert!(rs[0].note.as_deref().unwrap().contains("no price"));
        assert!(rs[1].note.as_deref().unwrap().contains("no correct answer"));
        let shared = rows(&[entry(0, "b", 3, 3, 10), entry(1, "b", 3, 3, 10)], &costs);
        assert!(shared.iter().all(|r| r.per_correct.is_none()));
    }

    /// Hand count, AutoHall: model-m's references ($0.10) and classifications ($0.02) for
    /// 40 claims, 25 of them factual (classified as the gold label says); its detection
    /// samples and pair checks ($5 and $1) are the evaluation's and left out: $0.12 / 25 =
    /// $0.0048 per correct claim; the Wilson interval of 25/40 is 0.47032 to 0.75777 (R's
    /// `prop.test(25, 40, correct = FALSE)`), so $0.12 / (40 · 0.75777) = $0.003959 to
    /// $0.12 / (40 · 0.47032) = $0.006379.
    #[test]
    fn hand_count_autohall() {
        let costs = vec![
            json!({"model": "model-m", "stage": "reference", "cost": 0.10}),
            json!({"model": "model-m", "stage": "classify", "cost": 0.02}),
            json!({"model": "model-m", "stage": "sample", "cost": 5.0}),
            json!({"model": "model-m", "stage": "pair", "cost": 1.0}),
        ];
        let e = json!({"pipeline": "autohall", "benchmark": 2, "model": "model-m",
            "claims": 40, "classified": 36, "hallucinated": 11, "factual": 25});
        let r = &rows(&[e], &costs)[0];
        assert_eq!((r.pipeline.as_str(), r.unit.as_str()), ("autohall", "claim"));
        assert_eq!((r.correct, r.answers), (25, 40));
        assert!((r.cost - 0.12).abs() < 1e-12, "{r:?}");
        assert!((r.per_correct.unwrap() - 0.0048).abs() < 1e-12, "{r:?}");
        assert!((r.low.unwrap() - 0.003958984).abs() < 1e-7, "{r:?}");
        assert!((r.high.unwrap() - 0.006378576).abs() < 1e-7, "{r:?}");
    }

    /// Hand count, HVI (judge mode, a panel of two): model-h's passages cost $0.20; the
    /// judge j1 found 10 of its 50 sentences hallucinated, the panel 12 of 50: $0.20 / 40 =
    /// $0.005 and $0.20 / 38 per correct sentence; the Wilson interval of 40/50 is 0.66963
    /// to 0.88756, so $0.004507 to $0.005973. The judges' calls are left out; an HVI from a
    /// labels file (no calls) has no row; ChainPoll and UHGEval say why they have none.
    #[test]
    fn hand_count_hvi_and_pipelines_without() {
        let costs = vec![
            json!({"model": "model-h", "stage": "passage", "cost": 0.20}),
            json!({"model": "j1", "stage": "sentence_judge", "cost": 3.0}),
        ];
        let hvi = |name: &str, hallucinated: u64| {
            json!({"pipeline": "hvi", "benchmark": 1, "model": name, "source": "judge",
                "counts": {"sentences": 50, "hallucinated": hallucinated, "efm": 0, "esl": 0}})
        };
        let rs = rows(
            &[
                hvi("model-h (judge j1)", 10),
                hvi("model-h (panel majority)", 12),
                json!({"pipeline": "hvi", "benchmark": 3, "model": "x", "source": "labels",
                    "counts": {"sentences": 9, "hallucinated": 1}}),
                json!({"pipeline": "chainpoll", "benchmark": 4, "model": "det"}),
                json!({"pipeline": "uhgeval", "benchmark": 5, "model": "u"}),
            ],
            &costs,
        );
        assert_eq!(rs.len(), 4, "{rs:?}");
        let (a, p) = (&rs[0], &rs[1]);
        assert_eq!(
            (a.model.as_str(), a.judge.as_str(), a.unit.as_str()),
            ("model-h", "judge j1", "sentence")
        );
        assert_eq!((a.correct, a.answers), (40, 50));
        assert!((a.cost - 0.20).abs() < 1e-12);
        assert!((a.per_correct.unwrap() - 0.005).abs() < 1e-12, "{a:?}");
        assert!((a.low.unwrap() - 0.004506725).abs() < 1e-7, "{a:?}");
        assert!((a.high.unwrap() - 0.005973457).abs() < 1e-7, "{a:?}");
        assert_eq!((p.judge.as_str(), p.correct), ("panel majority", 38));
        assert!((p.per_correct.unwrap() - 0.20 / 38.0).abs() < 1e-12, "{p:?}");
        assert!(rs[2].note.as_deref().unwrap().contains("detector"), "{:?}", rs[2]);
        assert!(
            rs[3].note.as_deref().unwrap().contains("never labelled hallucinated"),
            "{:?}",
            rs[3]
        );
        let md = markdown(&rs);
        assert!(md.contains("| 1 | model-h | judge j1 | $0.200000 | 40 / 50 | $0.005000 | $0.004507 to $0.005973 | hvi (sentence) |"), "{md}");
        assert!(md.contains("AutoHall, a claim whose reference"), "{md}");
    }
}

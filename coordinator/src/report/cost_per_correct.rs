//! Cost per correct answer (issue 53): what one non-hallucinated answer of a model cost,
//! per HypoTermQA result (model under test × judge), with a 95% interval.
//!
//! - **cost**: the model's own calls, its `answer` stage in the run's cost table (what
//!   using the model costs; judging is the evaluation's cost and is left out);
//! - **correct**: answers labelled `valid` (neither hallucinated nor irrelevant), over
//!   every question of the benchmark;
//! - **cost per correct** = cost / correct; its interval takes the cost as known and the
//!   share of correct answers as the uncertain part: with the Wilson 95% interval
//!   (low, high) of correct / answers, it is cost / (answers · high) to
//!   cost / (answers · low) (no upper bound when low is 0).
//!
//! No figure where it would mislead: a model without a price (cost 0), no correct answer,
//! or a model under test in two HypoTermQA benchmarks (its answer stage's cost covers
//! both; the table says so).

use halyard_pipelines::metrics::interval::wilson;
use serde::Serialize;
use serde_json::Value;

/// One row of `report.json`'s `cost_per_correct`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CostPerCorrect {
    pub benchmark: u64,
    pub model: String,
    pub judge: String,
    /// USD spent on the model's answers.
    pub cost: f64,
    /// Answers labelled valid, and answers (questions).
    pub correct: u64,
    pub answers: u64,
    /// USD per correct answer, with its 95% interval; `None` with `note` saying why.
    pub per_correct: Option<f64>,
    pub low: Option<f64>,
    pub high: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The rows of a report's benchmark entries, given its cost table's `by_model_stage`.
pub fn rows(benchmarks: &[Value], by_model_stage: &[Value]) -> Vec<CostPerCorrect> {
    let hyp: Vec<&Value> = benchmarks.iter().filter(|e| e["pipeline"] == "hypotermqa").collect();
    let mut out = Vec::new();
    for e in &hyp {
        let model = e["model"].as_str().unwrap_or("?").to_string();
        let bench = e["benchmark"].as_u64().unwrap_or(0);
        let cost: f64 = by_model_stage
            .iter()
            .filter(|c| c["model"] == model.as_str() && c["stage"] == "answer")
            .filter_map(|c| c["cost"].as_f64())
            .sum();
        let labels = &e["answer_labels"];
        let correct = labels["hypothetical"]["valid"].as_u64().unwrap_or(0)
            + labels["valid"]["valid"].as_u64().unwrap_or(0);
        let answers = e["questions"].as_u64().unwrap_or(0);
        let shared = hyp
            .iter()
            .any(|o| o["model"] == model.as_str() && o["benchmark"].as_u64() != Some(bench));
        let mut row = CostPerCorrect {
            benchmark: bench,
            model,
            judge: e["judge"].as_str().unwrap_or("?").to_string(),
            cost,
            correct,
            answers,
            per_correct: None,
            low: None,
            high: None,
            note: None,
        };
        row.note = if shared {
            Some("the model answers in more than one HypoTermQA benchmark: its answer cost is not per benchmark".into())
        } else if cost <= 0.0 {
            Some("no cost (the model has no price)".into())
        } else if correct == 0 {
            Some("no correct answer".into())
        } else {
            None
        };
        if row.note.is_none() {
            row.per_correct = Some(cost / correct as f64);
            if let Ok(w) = wilson(correct, answers.max(correct)) {
                if let Some((lo, hi)) = w.bounds() {
                    let n = answers.max(correct) as f64;
                    row.low = (hi > 0.0).then(|| cost / (n * hi));
                    row.high = (lo > 0.0).then(|| cost / (n * lo));
                }
            }
        }
        out.push(row);
    }
    out
}

fn usd(x: Option<f64>) -> String {
    x.map_or("–".into(), |v| format!("${v:.6}"))
}

/// The Markdown table (nothing when there is no HypoTermQA result).
pub fn markdown(rows: &[CostPerCorrect]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut md = String::from("## Cost per correct answer\n\nUSD of the model's answers per answer labelled valid (neither hallucinated nor irrelevant), with a 95% interval from the Wilson interval of the share correct (the cost taken as known). Judging costs are left out.\n\n| benchmark | model | judge | cost | correct / answers | per correct | 95% CI |\n|---|---|---|---|---|---|---|\n");
    for r in rows {
        let ci = match (r.low, r.high, &r.note) {
            (_, _, Some(n)) => n.clone(),
            (Some(l), Some(h), None) => format!("{} to {}", usd(Some(l)), usd(Some(h))),
            (Some(l), None, None) => format!("{} to ∞", usd(Some(l))),
            _ => "–".into(),
        };
        md.push_str(&format!(
            "| {} | {} | {} | ${:.6} | {} / {} | {} | {} |\n",
            r.benchmark,
            r.model,
            r.judge,
            r.cost,
            r.correct,
            r.answers,
            usd(r.per_correct),
            ci
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
    let mut o = String::from("<h2 id=\"cost-per-correct\">Cost per correct answer</h2><p class=\"meta\">USD of the model's answers per answer labelled valid; the whisker is the 95% interval (the Wilson interval of the share correct, the cost taken as known). Judging costs are left out.</p>");
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
            "<figure class=\"price-performance\"><figcaption>Benchmark {b}: price/performance</figcaption><svg width=\"{}\" height=\"{}\" role=\"img\"><line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#999\"/><line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{}\" stroke=\"#999\"/><text x=\"{}\" y=\"{}\" text-anchor=\"middle\">USD per correct answer (0 to ${:.6})</text><text x=\"12\" y=\"{}\" transform=\"rotate(-90 12 {})\" text-anchor=\"middle\">share correct</text>",
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
            top + h / 2.0
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
    let _ = write!(o, "<table><tr><th>benchmark</th><th>model</th><th>judge</th><th>cost</th><th>correct / answers</th><th>per correct</th><th>95% CI</th></tr>");
    let usd = |v: &Value| v.as_f64().map_or("–".into(), |x| format!("${x:.6}"));
    for r in rows {
        let ci = match (r["note"].as_str(), r["high"].is_null()) {
            (Some(n), _) => n.to_string(),
            (None, false) => format!("{} to {}", usd(&r["low"]), usd(&r["high"])),
            (None, true) => format!("{} to ∞", usd(&r["low"])),
        };
        let _ = write!(
            o,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} / {}</td><td>{}</td><td>{}</td></tr>",
            r["benchmark"].as_u64().unwrap_or(0),
            esc(r["model"].as_str().unwrap_or("?")),
            esc(r["judge"].as_str().unwrap_or("?")),
            usd(&r["cost"]),
            r["correct"].as_u64().unwrap_or(0),
            r["answers"].as_u64().unwrap_or(0),
            usd(&r["per_correct"]),
            esc(&ci)
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
}

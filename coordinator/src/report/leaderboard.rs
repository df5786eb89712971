//! `halyard report RUN_DIR...`: several runs' `report.json` merged into one leaderboard
//! (Markdown and HTML). Every HypoTermQA result (model under test × run) is a row,
//! ranked by HTS (higher is better), with its answer counts, judge, semantics, dataset
//! and cost. Rows are comparable only under the same judge, semantics and questions, so
//! the leaderboard warns when they differ. Results of other pipelines are listed as
//! skipped.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::html::esc;

#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub run: String,
    pub run_dir: PathBuf,
    pub model: String,
    pub judge: String,
    pub semantics: String,
    pub dataset: String,
    pub hts: f64,
    pub valid_hypothetical: u64,
    pub hypothetical_questions: u64,
    pub questions: u64,
    /// Answers to hypothetical questions: hallucination, irrelevant, judge_error, unanswered.
    pub hyp_hallucination: u64,
    pub hyp_irrelevant: u64,
    pub hyp_judge_error: u64,
    pub hyp_unanswered: u64,
    /// Answers to valid questions labelled valid, of how many.
    pub valid_valid: u64,
    pub valid_questions: u64,
    /// USD spent on this model under test in its run (all stages), if priced.
    pub cost: Option<f64>,
}

#[derive(Debug, Default)]
pub struct Leaderboard {
    /// Best first.
    pub rows: Vec<Row>,
    pub warnings: Vec<String>,
    pub skipped: Vec<String>,
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

fn s(v: &Value) -> String {
    v.as_str().unwrap_or("?").to_string()
}

/// Read `report.json` of each run directory (or a report.json path) and rank.
pub fn load(dirs: &[PathBuf]) -> Result<Leaderboard, String> {
    let mut lb = Leaderboard::default();
    for d in dirs {
        let path = if d.is_dir() { d.join("report.json") } else { d.clone() };
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("{}: {e} (is the run finished?)", path.display()))?;
        let report: Value = serde_json::from_str(&text)
            .map_err(|e| format!("{}: not a report.json: {e}", path.display()))?;
        let benchmarks = report["benchmarks"]
            .as_array()
            .ok_or_else(|| format!("{}: no `benchmarks` array", path.display()))?;
        let run = s(&report["run"]["name"]);
        let run_dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        for b in benchmarks {
            let model = s(&b["model"]);
            if b["pipeline"] != "hypotermqa" {
                lb.skipped.push(format!(
                    "{run}: {} results for {model} (not a HypoTermQA benchmark)",
                    s(&b["pipeline"])
                ));
                continue;
            }
            let hyp = &b["answer_labels"]["hypothetical"];
            let val = &b["answer_labels"]["valid"];
            let valid_questions: u64 = [
                "valid",
                "hallucination",
                "irrelevant",
                "judge_error",
                "unanswered",
                "not_labelled",
            ]
            .iter()
            .map(|k| u(&val[*k]))
            .sum();
            let cost = report["costs"]["by_model"]
                .as_array()
                .and_then(|a| a.iter().find(|c| c["model"] == b["model"]))
                .and_then(|c| c["cost"].as_f64());
            let priced = report["costs"]["prices"].as_object().is_some_and(|p| !p.is_empty());
            lb.rows.push(Row {
                run: run.clone(),
                run_dir: run_dir.clone(),
                model,
                judge: s(&b["judge"]),
                semantics: s(&b["semantics"]),
                dataset: s(&b["dataset"]),
                hts: b["hts"].as_f64().ok_or_else(|| {
                    format!("{}: a hypotermqa result without `hts`", path.display())
                })?,
                valid_hypothetical: u(&b["valid_answers_to_hypothetical"]),
                hypothetical_questions: u(&b["hypothetical_questions"]),
                questions: u(&b["questions"]),
                hyp_hallucination: u(&hyp["hallucination"]),
                hyp_irrelevant: u(&hyp["irrelevant"]),
                hyp_judge_error: u(&hyp["judge_error"]),
                hyp_unanswered: u(&hyp["unanswered"]),
                valid_valid: u(&val["valid"]),
                valid_questions,
                cost: cost.filter(|_| priced),
            });
        }
    }
    if lb.rows.is_empty() {
        return Err("no HypoTermQA results in these runs".into());
    }
    lb.rows.sort_by(|a, b| {
        b.hts.total_cmp(&a.hts).then_with(|| a.model.cmp(&b.model)).then_with(|| a.run.cmp(&b.run))
    });
    let distinct = |f: &dyn Fn(&Row) -> String| {
        let mut v: Vec<String> = lb.rows.iter().map(f).collect();
        v.sort();
        v.dedup();
        v
    };
    let judges = distinct(&|r| r.judge.clone());
    if judges.len() > 1 {
        lb.warnings.push(format!(
            "runs used different judges ({}): HTS values are not directly comparable",
            judges.join(", ")
        ));
    }
    let sems = distinct(&|r| r.semantics.clone());
    if sems.len() > 1 {
        lb.warnings.push(format!(
            "runs used different semantics ({}): HTS values are not directly comparable",
            sems.join(", ")
        ));
    }
    let sets = distinct(&|r| format!("{} ({} questions)", r.dataset, r.questions));
    if sets.len() > 1 {
        lb.warnings.push(format!("runs evaluated different question sets: {}", sets.join("; ")));
    }
    Ok(lb)
}

const HEADERS: [&str; 13] = [
    "rank",
    "model",
    "HTS (%)",
    "valid / hypothetical",
    "hallucination",
    "irrelevant",
    "judge_error",
    "unanswered",
    "valid questions answered validly",
    "judge",
    "semantics",
    "run",
    "cost (USD)",
];

/// The cells of row `i` (rank `i + 1`), in [`HEADERS`] order, as plain text.
fn cells(i: usize, r: &Row) -> [String; 13] {
    [
        (i + 1).to_string(),
        r.model.clone(),
        format!("{:.2}", r.hts),
        format!("{} / {}", r.valid_hypothetical, r.hypothetical_questions),
        r.hyp_hallucination.to_string(),
        r.hyp_irrelevant.to_string(),
        r.hyp_judge_error.to_string(),
        r.hyp_unanswered.to_string(),
        format!("{} / {}", r.valid_valid, r.valid_questions),
        r.judge.clone(),
        r.semantics.clone(),
        r.run.clone(),
        r.cost.map_or("-".to_string(), |c| format!("{c:.4}")),
    ]
}

pub fn render_markdown(lb: &Leaderboard) -> String {
    let mut md = String::from("# HypoTermQA leaderboard\n\nRanked by HTS (valid answers to hypothetical questions, higher is better).\n\n");
    for w in &lb.warnings {
        let _ = writeln!(md, "> **Warning:** {w}");
    }
    if !lb.warnings.is_empty() {
        md.push('\n');
    }
    let _ = writeln!(md, "| {} |\n|{}", HEADERS.join(" | "), "---|".repeat(HEADERS.len()));
    for (i, r) in lb.rows.iter().enumerate() {
        let _ = writeln!(md, "| {} |", cells(i, r).join(" | "));
    }
    for sk in &lb.skipped {
        let _ = writeln!(md, "\nSkipped: {sk}");
    }
    md
}

pub fn render_html(lb: &Leaderboard) -> String {
    let mut o = String::from("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>HypoTermQA leaderboard</title>");
    let _ = write!(
        o,
        "<style>{}</style><script>{}</script></head><body><h1>HypoTermQA leaderboard</h1>",
        super::html::STYLE,
        super::html::SCRIPT
    );
    o.push_str("<p class=\"meta\">Ranked by HTS (valid answers to hypothetical questions, higher is better).</p>");
    for w in &lb.warnings {
        let _ = write!(o, "<p class=\"warning\"><b>Warning:</b> {}</p>", esc(w));
    }
    // HTS bars, 0–100.
    const W: f64 = 500.0;
    const LEFT: f64 = 260.0;
    let h = 28.0 * lb.rows.len() as f64 + 10.0;
    let _ = write!(o, "<figure><figcaption>HTS (%)</figcaption><svg class=\"chart\" role=\"img\" width=\"{}\" height=\"{h}\" viewBox=\"0 0 {} {h}\">", LEFT + W + 60.0, LEFT + W + 60.0);
    for (i, r) in lb.rows.iter().enumerate() {
        let y = 8.0 + 28.0 * i as f64;
        let label = format!("{} ({})", r.model, r.run);
        let _ = write!(
            o,
            "<text class=\"bar-label\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
            LEFT - 8.0,
            y + 15.0,
            esc(&label)
        );
        let w = (W * r.hts / 100.0).max(1.0);
        let _ = write!(
            o,
            "<a href=\"#row-{i}\"><rect class=\"seg seg-valid\" x=\"{LEFT}\" y=\"{y}\" width=\"{w:.2}\" height=\"22\" fill=\"#43a047\"><title>{}: HTS {:.2}%</title></rect></a><text class=\"bar-total\" x=\"{:.2}\" y=\"{}\">{:.1}%</text>",
            esc(&label),
            r.hts,
            LEFT + w + 6.0,
            y + 15.0,
            r.hts
        );
    }
    o.push_str("</svg></figure><table><tr>");
    for h in HEADERS {
        let _ = write!(o, "<th>{h}</th>");
    }
    o.push_str("</tr>");
    for (i, r) in lb.rows.iter().enumerate() {
        let _ = write!(o, "<tr id=\"row-{i}\">");
        for (c, text) in cells(i, r).iter().enumerate() {
            // The run links to its own report.
            let text = if HEADERS[c] == "run" {
                format!(
                    "<a href=\"{}\">{}</a>",
                    esc(&r.run_dir.join("report.html").display().to_string()),
                    esc(text)
                )
            } else {
                esc(text)
            };
            let _ = write!(o, "<td>{text}</td>");
        }
        o.push_str("</tr>");
    }
    o.push_str("</table>");
    for sk in &lb.skipped {
        let _ = write!(o, "<p class=\"meta\">Skipped: {}</p>", esc(sk));
    }
    o.push_str("<div id=\"render-check\" data-ok=\"pending\"></div></body></html>\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(dir: &Path, name: &str, entries: Value) {
        std::fs::create_dir_all(dir).unwrap();
        let r = serde_json::json!({"run": {"name": name}, "benchmarks": entries, "costs": {"prices": {}}});
        std::fs::write(dir.join("report.json"), r.to_string()).unwrap();
    }

    fn entry(model: &str, judge: &str, semantics: &str, hts: f64) -> Value {
        serde_json::json!({"pipeline": "hypotermqa", "model": model, "judge": judge, "semantics": semantics, "dataset": "d.jsonl",
            "questions": 9, "hts": hts, "hypothetical_questions": 3, "valid_answers_to_hypothetical": 1,
            "answer_labels": {"hypothetical": {"valid": 1, "hallucination": 2}, "valid": {"valid": 4, "irrelevant": 2}}})
    }

    #[test]
    fn ranks_by_hts_and_warns_on_mixed_judges() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        report(
            &a,
            "a",
            serde_json::json!([entry("m1", "j", "paper", 10.0), {"pipeline": "noop", "model": "n"}]),
        );
        report(&b, "b", serde_json::json!([entry("m2", "j2", "paper", 50.0)]));
        let lb = load(&[a.clone(), b.clone()]).unwrap();
        assert_eq!(lb.rows.iter().map(|r| r.model.as_str()).collect::<Vec<_>>(), ["m2", "m1"]);
        assert_eq!(lb.warnings.len(), 1, "{:?}", lb.warnings);
        assert!(lb.warnings[0].contains("different judges"));
        assert_eq!(lb.skipped.len(), 1);
        assert_eq!(lb.rows[1].valid_questions, 6);
        let md = render_markdown(&lb);
        assert!(md.contains("| 1 | m2 | 50.00 |") && md.contains("**Warning:**"), "{md}");
        // Same judge and semantics: no warning.
        let lb = load(&[a]).unwrap();
        assert!(lb.warnings.is_empty());
        assert!(load(&[t.path().join("missing")]).unwrap_err().contains("missing"));
    }
}

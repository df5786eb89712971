//! `halyard report RUN_DIR...`: several runs' `report.json` merged into one leaderboard
//! (Markdown and HTML). Every HypoTermQA result (model under test × run) is a row,
//! ranked by HTS (higher is better), with its answer counts, judge, semantics, dataset
//! and cost, and HTS's 95% Wilson interval. Rows are comparable only under the same judge,
//! semantics and questions, so the leaderboard warns when they differ. Results of other
//! pipelines are listed as skipped.
//!
//! Each pair of adjacent rows on the same questions (same dataset, judge and semantics)
//! gets McNemar's exact test on the hypothetical questions both answered (valid answer or
//! not, read from the runs' `labels.jsonl`), so a rank that the questions cannot tell apart
//! is marked "not significant" instead of looking like a real difference.
//!
//! Every pipeline's results, HypoTermQA's included, are also compared pair by pair on the
//! items they share, each figure with its own paired test ([`super::paired_runs`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use halyard_pipelines::metrics::interval::Interval;
use halyard_pipelines::metrics::paired::{mcnemar, PairedTest};
use serde_json::Value;

use super::html::esc;
use super::paired_runs::{self, p_text, PairedRow};

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
    /// Of the answers to hypothetical questions, those that were empty or refusals
    /// (issue 29; labelled irrelevant by the rules, shown as their own column).
    pub hyp_empty: u64,
    pub hyp_refused: u64,
    /// Answers to valid questions labelled valid, of how many.
    pub valid_valid: u64,
    pub valid_questions: u64,
    /// USD spent on this model under test in its run (all stages), if priced.
    pub cost: Option<f64>,
    /// HTS's 95% interval (percent), when the report has one.
    pub hts_ci: Option<Interval>,
    /// Per hypothetical question id: whether the answer was labelled valid (from the run's
    /// `labels.jsonl`); `Err` says why it could not be read.
    pub hypothetical: Result<BTreeMap<i64, bool>, String>,
}

/// Row `rank` (0-based) compared with the row below it.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    pub upper: usize,
    /// McNemar's test (A = the upper row) on the shared hypothetical questions, or why the
    /// two rows were not compared.
    pub test: Result<PairedTest, String>,
}

#[derive(Debug, Default)]
pub struct Leaderboard {
    /// Best first.
    pub rows: Vec<Row>,
    /// One per adjacent pair of rows (`comparisons[i]`: row i vs row i + 1).
    pub comparisons: Vec<Comparison>,
    pub warnings: Vec<String>,
    pub skipped: Vec<String>,
    /// Paired comparisons of every pipeline's results ([`super::paired_runs`]).
    pub paired: Vec<PairedRow>,
    /// Every run's judges measured against human labels (issue 31), one row per judge
    /// and per panel.
    pub judges: Vec<JudgeRow>,
    /// Every run's cost per correct answer (`report.json`'s `cost_per_correct`, issue 53):
    /// (run, row).
    pub cost_per_correct: Vec<(String, Value)>,
}

/// A judge (or a panel) of one run's benchmark against that run's human labels.
#[derive(Clone, Debug, PartialEq)]
pub struct JudgeRow {
    pub run: String,
    pub benchmark: u64,
    pub pipeline: String,
    pub judge: String,
    /// The human truth (`majority`, `mace`, `mace-em`).
    pub truth: String,
    /// Units with a truth.
    pub units: u64,
    /// Of them, units with a verdict.
    pub n: u64,
    /// "12.3 [9.1, 16.4]" (percent, Wilson 95%): over the `n` units with a verdict.
    pub error_rate: String,
    /// The same over all `units`, no verdict counted as wrong.
    pub error_rate_all: String,
    pub kappa: String,
}

/// The judge rows of one report.json.
fn judge_rows(run: &str, report: &Value) -> Vec<JudgeRow> {
    let mut out = Vec::new();
    let pct = |v: &Value| v.as_f64().map_or("–".to_string(), |x| format!("{:.1}", x * 100.0));
    let ci =
        |e: &Value| format!("{} [{}, {}]", pct(&e["estimate"]), pct(&e["low"]), pct(&e["high"]));
    for j in report["judges"].as_array().into_iter().flatten() {
        let panel = format!("panel ({})", s(&j["panel"]["verdict"]["rule"]));
        let rows = j["per_judge"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| (s(&p["judge"]), &p["vs_human"]))
            .chain(std::iter::once((panel, &j["panel"]["vs_human"])));
        for (judge, v) in rows {
            if !v.is_object() {
                continue;
            }
            // Reports written before issue 45 have no all-units figures: "–".
            let units = v["units"].as_u64().unwrap_or(u(&v["n"]) + u(&v["unlabelled"]));
            out.push(JudgeRow {
                run: run.to_string(),
                benchmark: u(&j["benchmark"]),
                pipeline: s(&j["pipeline"]),
                judge,
                truth: v["truth"].as_str().filter(|t| !t.is_empty()).unwrap_or("majority").into(),
                units,
                n: u(&v["n"]),
                error_rate: ci(&v["error_rate"]),
                error_rate_all: ci(&v["error_rate_all"]),
                kappa: v["kappa"]["estimate"].as_f64().map_or("–".into(), |k| format!("{k:.3}")),
            });
        }
    }
    out
}

const JUDGE_HEADERS: [&str; 10] = [
    "run",
    "benchmark",
    "pipeline",
    "judge",
    "human truth",
    "units with truth",
    "with a verdict",
    "error rate %, verdicts only [95% CI]",
    "error rate %, all units [95% CI]",
    "Cohen's κ vs human",
];

fn judges_markdown(lb: &Leaderboard) -> String {
    if lb.judges.is_empty() {
        return String::new();
    }
    let mut md = format!(
        "\n## Judges against human labels\n\n| {} |\n|{}\n",
        JUDGE_HEADERS.join(" | "),
        "---|".repeat(JUDGE_HEADERS.len())
    );
    for r in &lb.judges {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.run,
            r.benchmark,
            r.pipeline,
            r.judge,
            r.truth,
            r.units,
            r.n,
            r.error_rate,
            r.error_rate_all,
            r.kappa
        );
    }
    md
}

fn judges_html(lb: &Leaderboard) -> String {
    if lb.judges.is_empty() {
        return String::new();
    }
    let mut o = String::from("<h2>Judges against human labels</h2><table><tr>");
    for h in JUDGE_HEADERS {
        let _ = write!(o, "<th>{}</th>", esc(h));
    }
    o.push_str("</tr>");
    for r in &lb.judges {
        let _ = write!(
            o,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&r.run),
            r.benchmark,
            esc(&r.pipeline),
            esc(&r.judge),
            esc(&r.truth),
            r.units,
            r.n,
            esc(&r.error_rate),
            esc(&r.error_rate_all),
            esc(&r.kappa)
        );
    }
    o.push_str("</table>");
    o
}

/// Hypothetical questions' outcomes of the entry whose rows are `lines` of `labels`.
fn hypothetical_outcomes(labels: &Path, lines: (u64, u64)) -> Result<BTreeMap<i64, bool>, String> {
    let mut out = BTreeMap::new();
    for (i, v) in paired_runs::label_rows(labels, lines)?.iter().enumerate() {
        if v["question_type"] != "hypothetical" {
            continue;
        }
        let at = || format!("{}: line {}", labels.display(), lines.0 + i as u64 + 1);
        let id = v["question_id"].as_i64().ok_or_else(|| format!("{}: no question_id", at()))?;
        let label =
            v["answer_label"].as_str().ok_or_else(|| format!("{}: no answer_label", at()))?;
        out.insert(id, label == "valid");
    }
    Ok(out)
}

/// McNemar's test of `a` against `b` on their shared hypothetical questions, when they are
/// comparable.
fn compare(a: &Row, b: &Row) -> Result<PairedTest, String> {
    if (&a.dataset, a.questions, &a.judge, &a.semantics)
        != (&b.dataset, b.questions, &b.judge, &b.semantics)
    {
        return Err("not compared: different questions, judge or semantics".into());
    }
    let (ha, hb) = match (&a.hypothetical, &b.hypothetical) {
        (Ok(x), Ok(y)) => (x, y),
        (Err(e), _) | (_, Err(e)) => return Err(format!("not compared: {e}")),
    };
    let (xs, ys): (Vec<bool>, Vec<bool>) =
        ha.iter().filter_map(|(id, x)| hb.get(id).map(|y| (*x, *y))).unzip();
    mcnemar(&xs, &ys).map_err(|e| format!("not compared: {e}"))
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
    let mut runs = Vec::new();
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
        lb.judges.extend(judge_rows(&run, &report));
        for c in report["cost_per_correct"].as_array().into_iter().flatten() {
            lb.cost_per_correct.push((run.clone(), c.clone()));
        }
        let run_dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        runs.push((run.clone(), run_dir.clone(), benchmarks.clone()));
        for b in benchmarks {
            let model = s(&b["model"]);
            if b["pipeline"] != "hypotermqa" {
                lb.skipped.push(format!(
                    "{run}: {} results for {model} are not in the HTS table (see the paired comparisons)",
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
            let hypothetical = match (b["labels_lines"][0].as_u64(), b["labels_lines"][1].as_u64())
            {
                (Some(x), Some(y)) => hypothetical_outcomes(&run_dir.join("labels.jsonl"), (x, y)),
                _ => Err(format!("{}: the entry has no `labels_lines`", path.display())),
            };
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
                hyp_empty: u(&b["odd_answers_hypothetical"]["empty"]),
                hyp_refused: u(&b["odd_answers_hypothetical"]["refusal"]),
                valid_valid: u(&val["valid"]),
                valid_questions,
                cost: cost.filter(|_| priced),
                hts_ci: serde_json::from_value(b["hts_share"]["ci95"].clone()).ok(),
                hypothetical,
            });
        }
    }
    lb.paired = paired_runs::compare(&runs, &mut lb.warnings);
    if lb.rows.is_empty() && lb.skipped.is_empty() {
        return Err("no benchmark results in these runs".into());
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
    lb.comparisons = lb
        .rows
        .windows(2)
        .enumerate()
        .map(|(upper, w)| Comparison { upper, test: compare(&w[0], &w[1]) })
        .collect();
    Ok(lb)
}

const HEADERS: [&str; 16] = [
    "rank",
    "model",
    "HTS (%)",
    "valid / hypothetical",
    "hallucination",
    "irrelevant",
    "judge_error",
    "unanswered",
    "empty / refused",
    "valid questions answered validly",
    "judge",
    "semantics",
    "run",
    "cost (USD)",
    "HTS 95% CI",
    "vs next row",
];

/// "better (p = 0.012)" / "not significant (p = 0.41)" / "not compared"; "worse on shared
/// questions" when the upper row loses on the questions both answered.
fn versus(c: Option<&Comparison>) -> String {
    match c.map(|c| &c.test) {
        None => "-".into(),
        // The rows are ranked on all their questions, the test sees the shared ones only:
        // there the upper row can be the worse one.
        Some(Ok(t)) if t.significant && t.difference.estimate < 0.0 => {
            format!("worse on shared questions (p = {})", p_text(t.p_value))
        }
        Some(Ok(t)) if t.significant => format!("better (p = {})", p_text(t.p_value)),
        Some(Ok(t)) => format!("not significant (p = {})", p_text(t.p_value)),
        Some(Err(_)) => "not compared".into(),
    }
}

/// The cells of row `i` (rank `i + 1`), in [`HEADERS`] order, as plain text.
fn cells(lb: &Leaderboard, i: usize) -> [String; 16] {
    let r = &lb.rows[i];
    [
        (i + 1).to_string(),
        r.model.clone(),
        format!("{:.2}", r.hts),
        format!("{} / {}", r.valid_hypothetical, r.hypothetical_questions),
        r.hyp_hallucination.to_string(),
        r.hyp_irrelevant.to_string(),
        r.hyp_judge_error.to_string(),
        r.hyp_unanswered.to_string(),
        format!("{} / {}", r.hyp_empty, r.hyp_refused),
        format!("{} / {}", r.valid_valid, r.valid_questions),
        r.judge.clone(),
        r.semantics.clone(),
        r.run.clone(),
        r.cost.map_or("-".to_string(), |c| format!("{c:.4}")),
        r.hts_ci.map_or("-".to_string(), |c| c.range(2, "–")),
        versus(lb.comparisons.get(i)),
    ]
}

/// The adjacent pairs' tests, as a Markdown table.
fn comparisons_markdown(lb: &Leaderboard) -> String {
    if lb.comparisons.is_empty() {
        return String::new();
    }
    let mut md = String::from("\n## Adjacent rows\n\nMcNemar's exact test on the hypothetical questions both rows answered (valid answer or not); the HTS difference (percentage points) with Newcombe's paired 95% interval. Not significant: the questions cannot tell the two rows apart at the 5% level.\n\n| ranks | models | shared questions | only upper valid | only lower valid | HTS difference (pp) | 95% CI | p | result |\n|---|---|---|---|---|---|---|---|---|\n");
    for c in &lb.comparisons {
        let (a, b) = (&lb.rows[c.upper], &lb.rows[c.upper + 1]);
        let ranks = format!("{} vs {}", c.upper + 1, c.upper + 2);
        let models = format!("{} ({}) vs {} ({})", a.model, a.run, b.model, b.run);
        match &c.test {
            Ok(t) => {
                let d = t.difference.scaled(100.0);
                let (only_a, only_b) = t.discordant.map_or((0, 0), |d| (d.only_a, d.only_b));
                let _ = writeln!(
                    md,
                    "| {ranks} | {models} | {} | {only_a} | {only_b} | {:+.2} | {} | {} | {} |",
                    d.n,
                    d.estimate,
                    d.range(2, " to "),
                    p_text(t.p_value),
                    if t.significant { "significant" } else { "not significant" }
                );
            }
            Err(e) => {
                let _ = writeln!(md, "| {ranks} | {models} | - | - | - | - | - | - | {e} |");
            }
        }
    }
    md
}

/// The cells of a cost-per-correct row: run, benchmark, model, judge, correct / answers,
/// cost, per correct, 95% CI (or why there is no figure), pipeline (unit).
fn cost_per_correct_cells(run: &str, c: &Value) -> [String; 9] {
    let usd = |v: &Value| v.as_f64().map_or("–".into(), |x| format!("${x:.6}"));
    let ci = match (c["note"].as_str(), c["high"].is_null()) {
        (Some(n), _) => n.to_string(),
        (None, false) => format!("{} to {}", usd(&c["low"]), usd(&c["high"])),
        (None, true) => format!("{} to ∞", usd(&c["low"])),
    };
    [
        run.to_string(),
        u(&c["benchmark"]).to_string(),
        s(&c["model"]),
        s(&c["judge"]),
        format!("{} / {}", u(&c["correct"]), u(&c["answers"])),
        usd(&c["cost"]),
        usd(&c["per_correct"]),
        ci,
        // Reports before AutoHall and HVI had one (HypoTermQA, answers).
        format!(
            "{} ({})",
            c["pipeline"].as_str().unwrap_or("hypotermqa"),
            c["unit"].as_str().unwrap_or("answer")
        ),
    ]
}

const COST_PER_CORRECT_HEADERS: [&str; 9] = [
    "run",
    "benchmark",
    "model",
    "judge",
    "correct / answers",
    "cost",
    "per correct",
    "95% CI",
    "pipeline (unit)",
];

fn cost_per_correct_markdown(lb: &Leaderboard) -> String {
    if lb.cost_per_correct.is_empty() {
        return String::new();
    }
    let mut md = format!(
        "\n## Cost per correct answer\n\nUSD of a model's answers per correct answer, with a 95% interval (the Wilson interval of the share correct, the cost taken as known). {}\n\n| {} |\n|{}\n",
        super::cost_per_correct::MEANING,
        COST_PER_CORRECT_HEADERS.join(" | "),
        "---|".repeat(COST_PER_CORRECT_HEADERS.len())
    );
    for (run, c) in &lb.cost_per_correct {
        let _ = writeln!(md, "| {} |", cost_per_correct_cells(run, c).join(" | "));
    }
    md
}

fn cost_per_correct_html(lb: &Leaderboard) -> String {
    if lb.cost_per_correct.is_empty() {
        return String::new();
    }
    let mut o = format!("<h2>Cost per correct answer</h2><p class=\"meta\">USD of a model's answers per correct answer, with a 95% interval (the Wilson interval of the share correct, the cost taken as known). {}</p><table><tr>", esc(super::cost_per_correct::MEANING));
    for h in COST_PER_CORRECT_HEADERS {
        let _ = write!(o, "<th>{h}</th>");
    }
    o.push_str("</tr>");
    for (run, c) in &lb.cost_per_correct {
        o.push_str("<tr>");
        for t in cost_per_correct_cells(run, c) {
            let _ = write!(o, "<td>{}</td>", esc(&t));
        }
        o.push_str("</tr>");
    }
    o.push_str("</table>");
    o
}

pub fn render_markdown(lb: &Leaderboard) -> String {
    let mut md = String::from("# Leaderboard\n\nHypoTermQA results ranked by HTS (valid answers to hypothetical questions, higher is better); every pipeline's results compared pair by pair below.\n\n");
    for w in &lb.warnings {
        let _ = writeln!(md, "> **Warning:** {w}");
    }
    if !lb.warnings.is_empty() {
        md.push('\n');
    }
    if lb.rows.is_empty() {
        md.push_str("No HypoTermQA results in these runs.\n");
    } else {
        let _ = writeln!(md, "| {} |\n|{}", HEADERS.join(" | "), "---|".repeat(HEADERS.len()));
        for i in 0..lb.rows.len() {
            let _ = writeln!(md, "| {} |", cells(lb, i).join(" | "));
        }
    }
    md.push_str(&comparisons_markdown(lb));
    md.push_str(&cost_per_correct_markdown(lb));
    md.push_str(&judges_markdown(lb));
    md.push_str(&paired_runs::markdown(&lb.paired));
    for sk in &lb.skipped {
        let _ = writeln!(md, "\nSkipped: {sk}");
    }
    md
}

pub fn render_html(lb: &Leaderboard) -> String {
    let mut o = String::from("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Halyard leaderboard</title>");
    let _ = write!(
        o,
        "<style>{}</style><script>{}</script></head><body><h1>Leaderboard</h1>",
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
    super::html::open_chart(&mut o, "HTS (%)", LEFT + W + 60.0, lb.rows.len());
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
            "<a href=\"#row-{i}\"><rect class=\"seg seg-valid\" x=\"{LEFT}\" y=\"{y}\" width=\"{w:.2}\" height=\"22\" fill=\"#43a047\"><title>{}: HTS {:.2}%</title></rect></a>",
            esc(&label),
            r.hts,
        );
        let mut end = LEFT + w;
        if let Some((low, high)) = r.hts_ci.as_ref().and_then(|c| c.bounds()) {
            let scale = W / 100.0;
            super::html::whisker(&mut o, LEFT, scale, y + 11.0, low, high, &label);
            end = end.max(LEFT + high * scale);
        }
        let _ = write!(
            o,
            "<text class=\"bar-total\" x=\"{:.2}\" y=\"{}\">{:.1}%</text>",
            end + 6.0,
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
        for (c, text) in cells(lb, i).iter().enumerate() {
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
    if !lb.comparisons.is_empty() {
        o.push_str("<h2>Adjacent rows</h2><p class=\"meta\">McNemar's exact test on the hypothetical questions both rows answered; the HTS difference in percentage points with Newcombe's paired 95% interval.</p><table><tr><th>ranks</th><th>models</th><th>shared questions</th><th>only upper valid</th><th>only lower valid</th><th>HTS difference (pp)</th><th>95% CI</th><th>p</th><th>result</th></tr>");
        for c in &lb.comparisons {
            let (a, b) = (&lb.rows[c.upper], &lb.rows[c.upper + 1]);
            let _ = write!(
                o,
                "<tr><td>{} vs {}</td><td>{} ({}) vs {} ({})</td>",
                c.upper + 1,
                c.upper + 2,
                esc(&a.model),
                esc(&a.run),
                esc(&b.model),
                esc(&b.run)
            );
            match &c.test {
                Ok(t) => {
                    let d = t.difference.scaled(100.0);
                    let (x, y) = t.discordant.map_or((0, 0), |d| (d.only_a, d.only_b));
                    let _ = write!(
                        o,
                        "<td class=\"num\">{}</td><td class=\"num\">{x}</td><td class=\"num\">{y}</td><td class=\"num\">{:+.2}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
                        d.n,
                        d.estimate,
                        esc(&d.range(2, " to ")),
                        p_text(t.p_value),
                        if t.significant { "significant" } else { "<b>not significant</b>" }
                    );
                }
                Err(e) => {
                    let _ = write!(o, "<td colspan=\"7\">{}</td></tr>", esc(e));
                }
            }
        }
        o.push_str("</table>");
    }
    o.push_str(&cost_per_correct_html(lb));
    o.push_str(&judges_html(lb));
    if !lb.paired.is_empty() {
        o.push_str("<h2>Paired comparisons (every pipeline)</h2><p class=\"meta\">Each two results of one figure on the items both have: A − B with its 95% interval and the test named (McNemar exact, paired bootstrap, DeLong paired).</p><table><tr><th>benchmark</th><th>figure</th><th>A</th><th>B</th><th>shared items</th><th>A − B</th><th>95% CI</th><th>test</th><th>result</th></tr>");
        for r in &lb.paired {
            let _ = write!(o, "<tr><td>{}</td><td>{}</td>", esc(&r.group), esc(&r.figure));
            for c in paired_runs::cells(r) {
                let _ = write!(o, "<td>{}</td>", esc(&c));
            }
            o.push_str("</tr>");
        }
        o.push_str("</table>");
    }
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
            "answer_labels": {"hypothetical": {"valid": 1, "hallucination": 2}, "valid": {"valid": 4, "irrelevant": 2}},
            "odd_answers_hypothetical": {"empty": 0, "refusal": 2}})
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
        // Issue 29: empty and refused answers to hypothetical questions, their own column.
        assert_eq!((lb.rows[0].hyp_empty, lb.rows[0].hyp_refused), (0, 2));
        let md = render_markdown(&lb);
        assert!(md.contains("| 1 | m2 | 50.00 |") && md.contains("**Warning:**"), "{md}");
        // Same judge and semantics: no warning.
        let lb = load(&[a]).unwrap();
        assert!(lb.warnings.is_empty());
        assert!(load(&[t.path().join("missing")]).unwrap_err().contains("missing"));
    }

    /// A run whose report's entry `e` has its labels (hypothetical question i valid when
    /// `valid(i)`, for ids in `ids`) at lines 0..n of its labels.jsonl.
    fn run_with_labels(
        dir: &Path,
        name: &str,
        model: &str,
        ids: &[i64],
        valid: &dyn Fn(i64) -> bool,
    ) {
        let mut lines = String::new();
        for id in ids {
            let label = if valid(*id) { "valid" } else { "hallucination" };
            lines.push_str(&format!(
                "{{\"question_id\":{id},\"question_type\":\"hypothetical\",\"answer_label\":\"{label}\"}}\n"
            ));
        }
        // A valid question's row is not a hypothetical outcome.
        lines.push_str(
            "{\"question_id\":1000,\"question_type\":\"valid_fresh\",\"answer_label\":\"valid\"}\n",
        );
        let n = ids.len() + 1;
        let k = ids.iter().filter(|i| valid(**i)).count();
        let hts = k as f64 * 100.0 / ids.len() as f64;
        let mut e = entry(model, "j", "paper", hts);
        e["labels_lines"] = serde_json::json!([0, n]);
        e["questions"] = 40.into();
        e["hts_share"] = serde_json::json!({"numerator": k, "denominator": ids.len(), "percent": hts,
            "ci95": {"estimate": hts, "low": hts - 5.0, "high": hts + 5.0, "level": 0.95, "method": "wilson", "n": ids.len()}});
        report(dir, name, serde_json::json!([e]));
        std::fs::write(dir.join("labels.jsonl"), lines).unwrap();
    }

    /// Two-sided exact McNemar p-value computed directly: 2·Σ_{i≤min} C(n, i)/2ⁿ.
    fn exact_p(only_a: u64, only_b: u64) -> f64 {
        let n = only_a + only_b;
        let mut c = 1.0f64;
        let mut sum = 0.0;
        for i in 0..=only_a.min(only_b) {
            if i > 0 {
                c = c * (n - i + 1) as f64 / i as f64;
            }
            sum += c;
        }
        (2.0 * sum / 2f64.powi(n as i32)).min(1.0)
    }

    /// Adjacent rows on the same questions get McNemar's test on their shared hypothetical
    /// questions; a difference the questions cannot tell apart is marked not significant.
    #[test]
    fn adjacent_rows_get_a_paired_test() {
        let t = tempfile::tempdir().unwrap();
        let ids: Vec<i64> = (0..20).collect();
        // A: valid on 0..12; B: valid on 0..3 and 19 → only A on 3..12 (9), only B on 19 (1).
        run_with_labels(&t.path().join("a"), "a", "m1", &ids, &|i| i < 12);
        let b_valid = |i: i64| i < 3 || i == 19;
        run_with_labels(&t.path().join("b"), "b", "m2", &ids, &b_valid);
        // C answers like B, plus a question B does not have: compared on the 20 shared.
        let c_ids: Vec<i64> = (0..21).collect();
        run_with_labels(&t.path().join("c"), "c", "m3", &c_ids, &|i| b_valid(i) || i == 20);
        let dirs: Vec<PathBuf> = ["a", "b", "c"].iter().map(|d| t.path().join(d)).collect();
        let lb = load(&dirs).unwrap();
        let order: Vec<&str> = lb.rows.iter().map(|r| r.model.as_str()).collect();
        assert_eq!(order, ["m1", "m3", "m2"], "C's extra valid answer ranks it above B");
        assert_eq!(lb.comparisons.len(), 2);
        let ab = lb.comparisons[0].test.as_ref().unwrap();
        assert_eq!(ab.difference.n, 20);
        let d = ab.discordant.unwrap();
        assert_eq!((d.only_a, d.only_b), (9, 1), "A vs C: C is valid on 0..3, 19 (and 20)");
        assert!((ab.p_value - exact_p(9, 1)).abs() < 1e-12, "{}", ab.p_value);
        assert!(ab.significant);
        // C vs B on their 20 shared questions: identical outcomes.
        let cb = lb.comparisons[1].test.as_ref().unwrap();
        assert_eq!((cb.difference.n, cb.p_value, cb.significant), (20, 1.0, false));
        let md = render_markdown(&lb);
        assert!(md.contains("better (p = 0.021)"), "{md}");
        assert!(md.contains("not significant (p = 1.000)"), "{md}");
        assert!(md.contains("| 1 vs 2 | m1 (a) vs m3 (c) | 20 | 9 | 1 | +40.00 |"), "{md}");
        // A vs B directly (the two only): the same 9 / 1 split.
        let lb = load(&dirs[..2]).unwrap();
        let ab = lb.comparisons[0].test.as_ref().unwrap();
        assert_eq!(ab.discordant.map(|d| (d.only_a, d.only_b)), Some((9, 1)));
        assert!((ab.p_value - exact_p(9, 1)).abs() < 1e-12 && ab.significant);
        assert!((exact_p(9, 1) - 22.0 / 1024.0).abs() < 1e-15);
        let html = render_html(&lb);
        assert_eq!(html.matches("<line class=\"ci\"").count(), 2, "a whisker per row");
        assert!(html.contains("<h2>Adjacent rows</h2>"));

        // Ranked higher on all its questions, worse on the shared ones: said so.
        let e = t.path().join("e");
        let f = t.path().join("f");
        // E: valid on 0..12 of 0..20 (60%); F: valid on 0..20 and on none of 20..40 (50%).
        run_with_labels(&e, "e", "m5", &ids, &|i| i < 12);
        let f_ids: Vec<i64> = (0..40).collect();
        run_with_labels(&f, "f", "m6", &f_ids, &|i| i < 20);
        let lb = load(&[e, f]).unwrap();
        assert_eq!(lb.rows[0].model, "m5");
        let t2 = lb.comparisons[0].test.as_ref().unwrap();
        assert_eq!(t2.discordant.map(|d| (d.only_a, d.only_b)), Some((0, 8)));
        assert!(t2.significant && t2.difference.estimate < 0.0);
        assert!(render_markdown(&lb).contains("worse on shared questions (p = 0.008)"));

        // Another judge: not compared, and said so.
        let mut r: Value =
            serde_json::from_str(&std::fs::read_to_string(dirs[1].join("report.json")).unwrap())
                .unwrap();
        r["benchmarks"][0]["judge"] = "j2".into();
        std::fs::write(dirs[1].join("report.json"), r.to_string()).unwrap();
        let lb = load(&dirs[..2]).unwrap();
        assert!(lb.comparisons[0].test.as_ref().unwrap_err().contains("different"));
        assert!(render_markdown(&lb).contains("| not compared |"));
        // Labels missing: not compared, with the file named.
        std::fs::remove_file(dirs[0].join("labels.jsonl")).unwrap();
        let lb = load(&dirs[..1]).unwrap();
        assert!(lb.rows[0].hypothetical.as_ref().unwrap_err().contains("labels.jsonl"));
    }
}

//! `report.html`: one self-contained page (inline SVG and a few lines of script, nothing
//! fetched from the network) drawn from `report.json`'s value and `labels.jsonl`.
//!
//! Per benchmark:
//! - HypoTermQA: the HTS table, and stacked bars of valid / hallucination / irrelevant /
//!   judge_error (and unanswered, not labelled) per model, for answers to hypothetical and
//!   to valid questions (as the HypoTermQA paper's figures 3 and 5), then evaluation rows
//!   by valid-term source and by check type. Each answer bar segment links to a list of
//!   the matching rows of `labels.jsonl` (line numbers, question, answer).
//! - Any other pipeline: a generic table of its numeric figures per model.
//!
//! Then tokens, calls, latency and cost per model and stage, job totals and dead letters.
//! The page's script checks its own charts after load and writes the result into
//! `#render-check` (`data-ok="1"`, segment counts, script errors), which the browser test
//! reads from the rendered DOM.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::BufRead;
use std::path::Path;

use serde_json::Value;

/// Rows of `labels.jsonl` listed per (model, question group, label).
pub const SAMPLES: usize = 25;

/// Answer labels in the order the bars stack them, with their colours.
const ANSWER_LABELS: [(&str, &str); 6] = [
    ("valid", "#43a047"),
    ("hallucination", "#e53935"),
    ("irrelevant", "#9e9e9e"),
    ("judge_error", "#ffb300"),
    ("unanswered", "#5c6bc0"),
    ("not_labelled", "#d7d7d7"),
];

/// The height of a bar's row in a chart, in pixels.
const ROW: f64 = 28.0;

const ROW_SOURCES: [&str; 3] = ["llm_suggestion", "title_similarity", "text_similarity"];
const ROW_CHECKS: [&str; 3] = ["code_check", "acceptance", "meaning"];

pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

fn trunc(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(n).collect::<String>())
    }
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// A sample row of `labels.jsonl`.
struct Sample {
    line: u64,
    question_id: String,
    question: String,
    answer: String,
}

/// "hypothetical" or "valid" for a HypoTermQA question type.
fn group_of(question_type: &str) -> &'static str {
    if question_type == "hypothetical" {
        "hypothetical"
    } else {
        "valid"
    }
}

fn anchor(entry: usize, group: &str, label: &str) -> String {
    format!("s-{entry}-{group}-{label}")
}

/// Sample rows per (report entry, group, answer label) of the HypoTermQA entries, read
/// from `labels.jsonl` (entries name their line range as `labels_lines`).
fn read_samples(entries: &[Value], labels: &Path) -> Result<BTreeMap<String, Vec<Sample>>, String> {
    let ranges: Vec<(usize, u64, u64)> = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e["pipeline"] == "hypotermqa")
        .filter_map(|(i, e)| {
            Some((i, e["labels_lines"][0].as_u64()?, e["labels_lines"][1].as_u64()?))
        })
        .collect();
    let mut out: BTreeMap<String, Vec<Sample>> = BTreeMap::new();
    if ranges.is_empty() {
        return Ok(out);
    }
    let f = std::fs::File::open(labels).map_err(|e| format!("{}: {e}", labels.display()))?;
    for (n, line) in std::io::BufReader::new(f).lines().enumerate() {
        let n = n as u64;
        let Some(&(entry, _, _)) = ranges.iter().find(|(_, a, b)| (*a..*b).contains(&n)) else {
            continue;
        };
        let line = line.map_err(|e| format!("{}: line {}: {e}", labels.display(), n + 1))?;
        let v: Value = serde_json::from_str(&line)
            .map_err(|e| format!("{}: line {}: {e}", labels.display(), n + 1))?;
        let group = group_of(v["question_type"].as_str().unwrap_or(""));
        let label = v["answer_label"].as_str().unwrap_or("?");
        let list = out.entry(anchor(entry, group, label)).or_default();
        if list.len() < SAMPLES {
            list.push(Sample {
                line: n + 1,
                question_id: v["question_id"].to_string(),
                question: trunc(v["question"].as_str().unwrap_or(""), 160),
                answer: match v["answer"].as_str() {
                    Some(a) => trunc(a, 200),
                    None => format!(
                        "(no answer: {})",
                        trunc(v["answer_error"].as_str().unwrap_or("dead letter"), 160)
                    ),
                },
            });
        }
    }
    Ok(out)
}

/// One bar of a stacked chart: a label on the left and (name, count, link) segments.
struct Bar {
    label: String,
    segments: Vec<(&'static str, u64, Option<String>)>,
}

/// Opens a chart: a captioned figure and an SVG `width` wide with `rows` bars.
pub(crate) fn open_chart(out: &mut String, title: &str, width: f64, rows: usize) {
    let height = ROW * rows as f64 + 10.0;
    let _ = write!(
        out,
        "<figure><figcaption>{}</figcaption><svg class=\"chart\" role=\"img\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\">",
        esc(title)
    );
}

/// A horizontal stacked bar chart in SVG, each bar scaled to 100% of its own total.
fn stacked_chart(out: &mut String, title: &str, bars: &[Bar]) {
    const W: f64 = 560.0;
    const LEFT: f64 = 220.0;
    open_chart(out, title, LEFT + W + 60.0, bars.len());
    for (i, bar) in bars.iter().enumerate() {
        let y = 8.0 + ROW * i as f64;
        let total: u64 = bar.segments.iter().map(|s| s.1).sum();
        let _ = write!(
            out,
            "<text class=\"bar-label\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
            LEFT - 8.0,
            y + 15.0,
            esc(&bar.label)
        );
        let mut x = LEFT;
        for (name, n, link) in &bar.segments {
            if *n == 0 || total == 0 {
                continue;
            }
            let w = W * *n as f64 / total as f64;
            let colour = ANSWER_LABELS.iter().find(|(l, _)| l == name).map_or("#888", |(_, c)| c);
            let pct = *n as f64 * 100.0 / total as f64;
            let rect = format!(
                "<rect class=\"seg seg-{name}\" x=\"{x:.2}\" y=\"{y}\" width=\"{w:.2}\" height=\"{}\" fill=\"{colour}\"><title>{}: {name} {n} of {total} ({pct:.1}%)</title></rect>",
                ROW - 6.0,
                esc(&bar.label)
            );
            match link {
                Some(href) => {
                    let _ = write!(out, "<a href=\"#{href}\">{rect}</a>");
                }
                None => out.push_str(&rect),
            }
            if w >= 34.0 {
                let _ = write!(out, "<text class=\"seg-text\" x=\"{:.2}\" y=\"{}\" text-anchor=\"middle\">{pct:.0}%</text>", x + w / 2.0, y + 15.0);
            }
            x += w;
        }
        let _ = write!(
            out,
            "<text class=\"bar-total\" x=\"{}\" y=\"{}\">n={total}</text>",
            LEFT + W + 6.0,
            y + 15.0
        );
    }
    out.push_str("</svg>");
    legend(out, bars);
    out.push_str("</figure>");
}

/// A 95% interval drawn as a whisker over a bar: a line from `low` to `high` (in the
/// chart's unit; `scale` pixels per unit from `left`) at height `y`, with end caps.
pub(crate) fn whisker(
    out: &mut String,
    left: f64,
    scale: f64,
    y: f64,
    low: f64,
    high: f64,
    label: &str,
) {
    let (x0, x1) = (left + low * scale, left + high * scale);
    let _ = write!(
        out,
        "<g class=\"ci\"><title>{}: 95% interval {low:.2} to {high:.2}</title><line class=\"ci\" x1=\"{x0:.2}\" y1=\"{y:.2}\" x2=\"{x1:.2}\" y2=\"{y:.2}\"/><line x1=\"{x0:.2}\" y1=\"{:.2}\" x2=\"{x0:.2}\" y2=\"{:.2}\"/><line x1=\"{x1:.2}\" y1=\"{:.2}\" x2=\"{x1:.2}\" y2=\"{:.2}\"/></g>",
        esc(label),
        y - 5.0,
        y + 5.0,
        y - 5.0,
        y + 5.0
    );
}

/// A figure of one model for [`interval_chart`]: label, estimate, 95% bounds (or why the
/// interval is not estimable, issue 29).
struct Point {
    label: String,
    estimate: f64,
    ci: Option<(f64, f64)>,
    not_estimable: Option<String>,
}

/// Bars of one figure across models, from 0 to the figure's scale (1 for fractions and
/// AUROC, 100 for percentages, else the largest bound), each with its interval's whisker.
fn interval_chart(out: &mut String, title: &str, points: &[Point]) {
    const W: f64 = 500.0;
    const LEFT: f64 = 220.0;
    let top = points
        .iter()
        .map(|p| p.ci.map_or(p.estimate, |c| c.1.max(p.estimate)))
        .fold(0.0f64, f64::max);
    let max = if top <= 1.0 {
        1.0
    } else if top <= 100.0 {
        100.0
    } else {
        top
    };
    open_chart(out, title, LEFT + W + 140.0, points.len());
    let scale = W / max;
    for (i, p) in points.iter().enumerate() {
        let y = 8.0 + ROW * i as f64;
        let w = (p.estimate.max(0.0) * scale).max(1.0);
        let _ = write!(
            out,
            "<text class=\"bar-label\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text><rect class=\"seg seg-figure\" x=\"{LEFT}\" y=\"{y}\" width=\"{w:.2}\" height=\"{}\" fill=\"#90caf9\"><title>{}: {}</title></rect>",
            LEFT - 8.0,
            y + 15.0,
            esc(&p.label),
            ROW - 6.0,
            esc(&p.label),
            p.estimate
        );
        let mut end = LEFT + w;
        let mut text = format!("{:.4}", p.estimate);
        if let Some((low, high)) = p.ci {
            whisker(out, LEFT, scale, y + 11.0, low.max(0.0), high.min(max), &p.label);
            end = end.max(LEFT + high.min(max) * scale);
            text = format!("{:.4} [{low:.4}, {high:.4}]", p.estimate);
        } else if let Some(why) = &p.not_estimable {
            text = format!("{:.4} [not estimable: {}]", p.estimate, esc(why));
        }
        let _ = write!(
            out,
            "<text class=\"bar-total\" x=\"{:.2}\" y=\"{}\">{text}</text>",
            end + 6.0,
            y + 15.0
        );
    }
    out.push_str("</svg></figure>");
}

/// An interval object of `report.json` (`estimate`, `low`, `high`, and `not_estimable`
/// when the bounds are null) as a chart point.
fn point(label: &str, o: &Value) -> Option<Point> {
    Some(Point {
        label: label.to_string(),
        estimate: o["estimate"].as_f64()?,
        ci: bounds(o),
        not_estimable: bounds(o).is_none().then(|| not_estimable_text(o)),
    })
}

/// Why an interval object has no bounds.
fn not_estimable_text(v: &Value) -> String {
    v["not_estimable"].as_str().unwrap_or("reason not recorded").to_string()
}

/// `report.json` intervals (objects with `estimate`, `low`, `high`) of an entry, by path
/// (dotted, at most `depth` levels down), as points labelled `label`.
fn intervals_of(
    v: &Value,
    prefix: &str,
    depth: usize,
    label: &str,
    out: &mut Vec<(String, Point)>,
) {
    let Some(o) = v.as_object() else { return };
    if o.contains_key("estimate") && o.contains_key("low") && o.contains_key("high") {
        if let Some(p) = point(label, v) {
            out.push((prefix.to_string(), p));
        }
        return;
    }
    if depth == 0 {
        return;
    }
    for (k, x) in o {
        let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
        intervals_of(x, &key, depth - 1, label, out);
    }
}

fn legend(out: &mut String, bars: &[Bar]) {
    out.push_str("<div class=\"legend\">");
    for (name, colour) in ANSWER_LABELS {
        if bars.iter().any(|b| b.segments.iter().any(|s| s.0 == name && s.1 > 0)) {
            let _ = write!(out, "<span><i style=\"background:{colour}\"></i>{name}</span>");
        }
    }
    out.push_str("</div>");
}

fn answer_bar(
    entry: usize,
    e: &Value,
    group: &str,
    samples: &BTreeMap<String, Vec<Sample>>,
) -> Bar {
    let counts = &e["answer_labels"][group];
    Bar {
        label: e["model"].as_str().unwrap_or("?").to_string(),
        segments: ANSWER_LABELS
            .iter()
            .map(|(l, _)| {
                let a = anchor(entry, group, l);
                let link = samples.contains_key(&a).then_some(a);
                (*l, u(&counts[*l]), link)
            })
            .collect(),
    }
}

/// Bars of `LabelShares` objects (`{count, valid: {numerator…}, …}`) under `section`.
fn share_bars(entries: &[(usize, &Value)], section: &str, keys: &[&str]) -> Vec<Bar> {
    let mut bars = Vec::new();
    for (_, e) in entries {
        for k in keys {
            let s = &e[section][*k];
            bars.push(Bar {
                label: format!("{} · {}", e["model"].as_str().unwrap_or("?"), k.replace('_', " ")),
                segments: ANSWER_LABELS[..4]
                    .iter()
                    .map(|(l, _)| (*l, u(&s[*l]["numerator"]), None))
                    .collect(),
            });
        }
    }
    bars
}

fn hypotermqa_section(
    out: &mut String,
    b: u64,
    entries: &[(usize, &Value)],
    samples: &BTreeMap<String, Vec<Sample>>,
) {
    let first = entries[0].1;
    let _ = write!(out, "<h2 id=\"bench-{b}\">Benchmark {b}: HypoTermQA</h2><p class=\"meta\">Dataset <code>{}</code>", esc(first["dataset"].as_str().unwrap_or("?")));
    let judges: std::collections::BTreeSet<String> =
        entries.iter().map(|(_, e)| e["judge"].as_str().unwrap_or("?").to_string()).collect();
    let sems: std::collections::BTreeSet<String> =
        entries.iter().map(|(_, e)| e["semantics"].as_str().unwrap_or("?").to_string()).collect();
    let _ = write!(
        out,
        ", judge <b>{}</b>, semantics <b>{}</b>.</p>",
        esc(&judges.into_iter().collect::<Vec<_>>().join(", ")),
        esc(&sems.into_iter().collect::<Vec<_>>().join(", "))
    );
    out.push_str("<table class=\"hts\"><tr><th>model</th><th>HTS (%)</th><th>95% CI (Wilson)</th><th>valid answers to hypothetical questions</th><th>questions</th><th>labelled</th><th>judge errors (checks)</th></tr>");
    for (_, e) in entries {
        let _ = write!(
            out,
            "<tr><td>{}</td><td class=\"num\">{:.2}</td><td class=\"num\">{}</td><td class=\"num\">{} / {}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{} / {}</td></tr>",
            esc(e["model"].as_str().unwrap_or("?")),
            e["hts"].as_f64().unwrap_or(0.0),
            ci_text(&e["hts_share"]["ci95"]),
            u(&e["valid_answers_to_hypothetical"]),
            u(&e["hypothetical_questions"]),
            u(&e["questions"]),
            u(&e["items_labelled"]),
            u(&e["judge_error"]["checks"]["numerator"]),
            u(&e["judge_error"]["checks"]["denominator"]),
        );
    }
    out.push_str("</table><div class=\"charts\">");
    let hts: Vec<Point> = entries
        .iter()
        .map(|(_, e)| Point {
            label: e["model"].as_str().unwrap_or("?").to_string(),
            estimate: e["hts"].as_f64().unwrap_or(0.0),
            ci: bounds(&e["hts_share"]["ci95"]),
            not_estimable: None,
        })
        .collect();
    interval_chart(out, "HTS (%) with its 95% interval", &hts);
    let hyp: Vec<Bar> =
        entries.iter().map(|(i, e)| answer_bar(*i, e, "hypothetical", samples)).collect();
    stacked_chart(out, "Answers to hypothetical questions (click a segment for its rows)", &hyp);
    let valid: Vec<Bar> =
        entries.iter().map(|(i, e)| answer_bar(*i, e, "valid", samples)).collect();
    stacked_chart(out, "Answers to valid questions", &valid);
    stacked_chart(
        out,
        "Evaluation rows of valid terms, by term source",
        &share_bars(entries, "rows_by_valid_term_source", &ROW_SOURCES),
    );
    stacked_chart(
        out,
        "Evaluation rows, by check type",
        &share_bars(entries, "rows_by_check_type", &ROW_CHECKS),
    );
    out.push_str(
        "</div><h3>Rows of <a href=\"labels.jsonl\">labels.jsonl</a> behind the bars</h3>",
    );
    for (i, e) in entries {
        for group in ["hypothetical", "valid"] {
            for (label, _) in ANSWER_LABELS {
                let a = anchor(*i, group, label);
                let Some(list) = samples.get(&a) else { continue };
                let n = u(&e["answer_labels"][group][label]);
                let _ = write!(
                    out,
                    "<details id=\"{a}\" class=\"samples\"><summary>{} · {group} questions · <b>{label}</b>: {n} answers (first {} listed)</summary><table><tr><th>labels.jsonl line</th><th>question id</th><th>question</th><th>answer</th></tr>",
                    esc(e["model"].as_str().unwrap_or("?")),
                    list.len()
                );
                for s in list {
                    let _ = write!(
                        out,
                        "<tr><td class=\"num\"><a href=\"labels.jsonl\">{}</a></td><td class=\"num\">{}</td><td>{}</td><td>{}</td></tr>",
                        s.line,
                        esc(&s.question_id),
                        esc(&s.question),
                        esc(&s.answer)
                    );
                }
                out.push_str("</table></details>");
            }
        }
    }
}

/// The bounds of an interval object of `report.json`.
fn bounds(v: &Value) -> Option<(f64, f64)> {
    Some((v["low"].as_f64()?, v["high"].as_f64()?))
}

/// "low–high" of an interval object, "not estimable: why", or "–".
fn ci_text(v: &Value) -> String {
    match bounds(v) {
        Some((l, h)) => format!("{l:.2}–{h:.2}"),
        None if v.is_object() => format!("not estimable: {}", not_estimable_text(v)),
        None => "–".into(),
    }
}

/// Numeric fields of a report entry, nested objects flattened with dots (two levels).
fn numeric_fields(v: &Value, prefix: &str, depth: usize, out: &mut Vec<(String, String)>) {
    let Some(o) = v.as_object() else { return };
    for (k, x) in o {
        let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
        match x {
            Value::Number(n) if k != "benchmark" => out.push((key, n.to_string())),
            Value::Object(_) if depth > 0 => numeric_fields(x, &key, depth - 1, out),
            _ => {}
        }
    }
}

fn generic_section(out: &mut String, b: u64, entries: &[(usize, &Value)]) {
    let pipeline = entries[0].1["pipeline"].as_str().unwrap_or("unknown");
    let _ = write!(
        out,
        "<h2 id=\"bench-{b}\">Benchmark {b}: {}</h2><table class=\"generic\"><tr><th>figure</th>",
        esc(pipeline)
    );
    let mut rows: Vec<String> = Vec::new();
    let mut cells: Vec<BTreeMap<String, String>> = Vec::new();
    for (_, e) in entries {
        let _ = write!(out, "<th>{}</th>", esc(e["model"].as_str().unwrap_or("?")));
        let mut f = Vec::new();
        numeric_fields(e, "", 2, &mut f);
        for (k, _) in &f {
            if !rows.contains(k) {
                rows.push(k.clone());
            }
        }
        cells.push(f.into_iter().collect());
    }
    out.push_str("</tr>");
    for r in rows {
        let _ = write!(out, "<tr><td>{}</td>", esc(&r));
        for c in &cells {
            let _ =
                write!(out, "<td class=\"num\">{}</td>", esc(c.get(&r).map_or("", String::as_str)));
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
    // One chart per interval the entries carry (two levels down), models as bars.
    let mut figures: BTreeMap<String, Vec<Point>> = BTreeMap::new();
    for (_, e) in entries {
        let mut found = Vec::new();
        intervals_of(e, "", 2, e["model"].as_str().unwrap_or("?"), &mut found);
        for (path, p) in found {
            figures.entry(path).or_default().push(p);
        }
    }
    if !figures.is_empty() {
        out.push_str("<div class=\"charts\">");
        for (path, points) in &figures {
            interval_chart(out, &format!("{path} with its 95% interval"), points);
        }
        out.push_str("</div>");
    }
}

/// An AUROC cell of `report.json` values: "0.7000 [0.6000, 0.8000]", "0.5000 [not
/// estimable: why]", or "– (why there is no AUROC)".
fn auroc_cell(auroc: &Value, ci: &Value, error: &Value) -> String {
    let Some(a) = auroc.as_f64() else {
        return format!("– ({})", error.as_str().unwrap_or("no AUROC"));
    };
    match bounds(ci) {
        Some((l, h)) => format!("{a:.4} [{l:.4}, {h:.4}]"),
        None if ci.is_object() => format!("{a:.4} [not estimable: {}]", not_estimable_text(ci)),
        None => format!("{a:.4}"),
    }
}

/// "why: n; …" of a `report.json` map of counts, after the total ("0" when none).
fn counts_cell(total: &Value, by: &Value) -> String {
    let n = u(total);
    match by.as_object().filter(|o| n > 0 && !o.is_empty()) {
        None => n.to_string(),
        Some(o) => {
            let parts: Vec<String> = o.iter().map(|(k, v)| format!("{k}: {}", u(v))).collect();
            format!("{n} ({})", parts.join("; "))
        }
    }
}

/// The methods of a ChainPoll entry: (report name, its ranking object).
fn chainpoll_methods(e: &Value) -> Vec<(String, &Value)> {
    use halyard_pipelines::chainpoll::score as s;
    let mut out: Vec<(String, &Value)> = e["metrics"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| (format!("{}{}", s::CHAINPOLL_PREFIX, m["metric"].as_str().unwrap_or("?")), m))
        .collect();
    let b = &e["logprob_baselines"];
    for (name, v) in [
        (s::SELFCHECK_AVG, &e["selfcheck_avg"]),
        (s::SELFCHECK_MAX, &e["selfcheck_max"]),
        (s::PSEUDO_ENTROPY_MAX, &b["pseudo_entropy_max"]),
        (s::PSEUDO_ENTROPY_MEAN, &b["pseudo_entropy_mean"]),
        (s::AVG_NEG_LOGPROB, &b["avg_neg_logprob"]),
        (s::MAX_NEG_LOGPROB, &b["max_neg_logprob"]),
    ] {
        if v.is_object() {
            out.push((name.to_string(), v));
        }
    }
    out
}

/// ChainPoll: per judge and method, the AUROC with its interval (or why not), the items
/// scored and unscored (why), the AUROC on the common subset, the poll counts; then one
/// chart per method across judges.
fn chainpoll_section(out: &mut String, b: u64, entries: &[(usize, &Value)]) {
    let first = entries[0].1;
    let _ = write!(
        out,
        "<h2 id=\"bench-{b}\">Benchmark {b}: ChainPoll</h2><p class=\"meta\">Dataset <code>{}</code>. AUROC against the labels (hallucinated positive), in brackets its 95% DeLong interval or why it cannot be estimated. Verdict: {}</p>",
        esc(first["dataset"].as_str().unwrap_or("?")),
        esc(first["verdict_rule"].as_str().unwrap_or("?"))
    );
    out.push_str("<table class=\"chainpoll\"><tr><th>judge</th><th>method</th><th>AUROC (all scored)</th><th>scored</th><th>unscored (why)</th><th>AUROC on the common subset</th><th>common subset n</th><th>polls</th><th>unparseable polls (why)</th><th>failed polls</th></tr>");
    let mut figures: BTreeMap<String, Vec<Point>> = BTreeMap::new();
    for (_, e) in entries {
        let model = e["model"].as_str().unwrap_or("?");
        for (name, m) in chainpoll_methods(e) {
            let c = &m["on_common_subset"];
            let poll = |k: &str| {
                if m.get("polls").is_some() {
                    u(&m[k]).to_string()
                } else {
                    "–".into()
                }
            };
            let unparseable = if m.get("polls").is_some() {
                counts_cell(&m["unparseable"], &m["unparseable_by_reason"])
            } else {
                "–".into()
            };
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td><td class=\"num\">{}</td></tr>",
                esc(model),
                esc(&name),
                esc(&auroc_cell(&m["auroc"], &m["auroc_ci95"], &m["auroc_error"])),
                u(&m["scored"]),
                esc(&counts_cell(&m["unscored"], &m["unscored_by_reason"])),
                esc(&if c.is_object() { auroc_cell(&c["auroc"], &c["auroc_ci95"], &c["auroc_error"]) } else { "–".into() }),
                if c.is_object() { u(&c["scored"]).to_string() } else { "–".into() },
                poll("polls"),
                esc(&unparseable),
                poll("failed"),
            );
            if let Some(p) = point(model, &m["auroc_ci95"]) {
                figures.entry(name).or_default().push(p);
            }
        }
        if let Some(why) = e["logprob_baselines"]["not_computed"].as_str() {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>token-log-probability baselines</td><td colspan=\"8\">not computed: {}</td></tr>",
                esc(model),
                esc(why)
            );
        }
    }
    out.push_str("</table><div class=\"charts\">");
    for (name, points) in &figures {
        interval_chart(out, &format!("{name} AUROC with its 95% interval"), points);
    }
    out.push_str("</div>");
}

/// RealHall's aggregate over the sweep's ChainPoll datasets, per judge (issue 29).
fn realhall_section(out: &mut String, realhall: &Value) {
    let Some(list) = realhall.as_array().filter(|l| !l.is_empty()) else { return };
    out.push_str("<h2 id=\"realhall\">RealHall aggregate</h2><p class=\"meta\">Per judge, the unweighted mean of its per-dataset AUROCs (ChainPoll: Adherence where the dataset was run with it, else Correctness), in brackets its 95% interval from the per-dataset Newcombe (2006) AUROC intervals combined by square-and-add, or why it cannot be estimated; quality vs ChainPoll = mean(AUROC − 0.5) / mean(AUROC<sub>ChainPoll</sub> − 0.5).</p>");
    for a in list {
        let datasets: Vec<&str> =
            a["datasets"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        let _ = write!(out, "<h3>{}</h3>", esc(a["model"].as_str().unwrap_or("?")));
        if let Some(why) = a["not_computed"].as_str() {
            let _ = write!(out, "<p>Not computed: {}</p>", esc(why));
            continue;
        }
        out.push_str("<table class=\"realhall\"><tr><th>method</th>");
        for d in &datasets {
            let _ = write!(out, "<th>{} AUROC (n; unscored)</th>", esc(d));
        }
        out.push_str("<th>aggregate AUROC</th><th>quality vs ChainPoll</th><th>note</th></tr>");
        for r in a["rows"].as_array().into_iter().flatten() {
            let _ = write!(out, "<tr><td>{}</td>", esc(r["method"].as_str().unwrap_or("?")));
            for i in 0..datasets.len() {
                let v = r["per_dataset"][i].as_f64().map_or("–".into(), |v| format!("{v:.4}"));
                let _ = write!(
                    out,
                    "<td class=\"num\">{v} ({}; {})</td>",
                    u(&r["per_dataset_n"][i]),
                    u(&r["per_dataset_unscored"][i])
                );
            }
            let agg = &r["aggregate_auroc"];
            let _ = write!(
                out,
                "<td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
                esc(&auroc_cell(&agg["estimate"], agg, &Value::Null)),
                r["quality_vs_chainpoll"].as_f64().map_or("–".into(), |q| format!("{q:.4}")),
                esc(r["note"].as_str().unwrap_or(""))
            );
        }
        out.push_str("</table>");
    }
}

fn cost_section(out: &mut String, costs: &Value) {
    let _ = write!(
        out,
        "<h2 id=\"cost\">Tokens, latency and cost</h2><p>Total cost: <b>${:.4}</b>",
        costs["total"].as_f64().unwrap_or(0.0)
    );
    if let Some(m) = costs["max_cost"].as_f64() {
        let _ = write!(out, " (limit ${m:.2})");
    }
    let saved = costs["saved"].as_f64().unwrap_or(0.0);
    if saved > 0.0 {
        let _ = write!(
            out,
            "; saved by the result cache: <b>${saved:.4}</b> (its answers at the models' prices, not in the cost)"
        );
    }
    out.push_str("</p>");
    if let Some(p) = costs["prices"].as_object().filter(|p| !p.is_empty()) {
        out.push_str("<table><tr><th>model</th><th>USD / 1M input tokens</th><th>USD / 1M output tokens</th></tr>");
        for (m, v) in p {
            let _ = write!(
                out,
                "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
                esc(m),
                v["input"].as_f64().unwrap_or(0.0),
                v["output"].as_f64().unwrap_or(0.0)
            );
        }
        out.push_str("</table>");
    }
    out.push_str("<table class=\"costs\"><tr><th>model</th><th>stage</th><th>jobs</th><th>dead letters</th><th>calls</th><th>retries</th><th>cache hits</th><th>paid</th><th>machine cache</th><th>shared cache</th><th>prompt tokens</th><th>completion tokens</th><th>mean latency (ms)</th><th>cost (USD)</th><th>saved (USD)</th></tr>");
    let rows = costs["by_model_stage"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(costs["by_model"].as_array().into_iter().flatten());
    for c in rows {
        let jobs = u(&c["jobs"]);
        let (machine, shared) = (u(&c["machine_cache"]), u(&c["shared_cache"]));
        // A cache answer made no call: the mean is over the paid jobs.
        let called = jobs.saturating_sub(machine).saturating_sub(shared);
        let mean = if called == 0 { 0.0 } else { u(&c["latency_ms_total"]) as f64 / called as f64 };
        let stage = c["stage"].as_str().unwrap_or("?");
        let class = if stage == "*" { " class=\"total\"" } else { "" };
        let _ = write!(
            out,
            "<tr{class}><td>{}</td><td>{}</td><td class=\"num\">{jobs}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{machine}</td><td class=\"num\">{shared}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{mean:.0}</td><td class=\"num\">{:.4}</td><td class=\"num\">{:.4}</td></tr>",
            esc(c["model"].as_str().unwrap_or("?")),
            esc(if stage == "*" { "all stages" } else { stage }),
            u(&c["dead_letters"]),
            u(&c["calls"]),
            u(&c["retries"]),
            u(&c["cache_hits"]),
            u(&c["paid"]),
            u(&c["prompt_tokens"]),
            u(&c["completion_tokens"]),
            c["cost"].as_f64().unwrap_or(0.0),
            c["saved"].as_f64().unwrap_or(0.0)
        );
    }
    out.push_str("</table>");
}

fn jobs_section(out: &mut String, report: &Value) {
    let j = &report["jobs"];
    out.push_str("<h2 id=\"jobs\">Jobs</h2><table><tr>");
    let keys = [
        "done",
        "completed",
        "dead_letters",
        "model_calls",
        "cache_hits",
        "prompt_tokens",
        "completion_tokens",
    ];
    for k in keys {
        let _ = write!(out, "<th>{}</th>", k.replace('_', " "));
    }
    out.push_str("</tr><tr>");
    for k in keys {
        let _ = write!(out, "<td class=\"num\">{}</td>", u(&j[k]));
    }
    out.push_str("</tr></table>");
    let dead = report["dead_letters"].as_array().cloned().unwrap_or_default();
    let _ = write!(out, "<h2 id=\"dead-letters\">Dead letters ({})</h2>", dead.len());
    if dead.is_empty() {
        out.push_str("<p>None.</p>");
        return;
    }
    out.push_str("<table class=\"dead\"><tr><th>job</th><th>pool</th><th>stage</th><th>model</th><th>kind</th><th>HTTP</th><th>deliveries</th><th>error</th></tr>");
    for d in dead.iter().take(500) {
        let s = |k: &str| esc(d[k].as_str().unwrap_or("?"));
        let _ = write!(
            out,
            "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
            s("job"),
            s("pool"),
            s("stage"),
            s("model"),
            s("kind"),
            d["http_status"].as_u64().map(|c| c.to_string()).unwrap_or_default(),
            u(&d["deliveries"]),
            esc(&trunc(d["error"].as_str().unwrap_or(""), 300))
        );
    }
    out.push_str("</table>");
    if dead.len() > 500 {
        let _ = write!(out, "<p>… and {} more in report.json.</p>", dead.len() - 500);
    }
}

pub(crate) const STYLE: &str = "body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:24px auto;max-width:1100px;color:#222;padding:0 12px}\
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ddd}h3{font-size:15px}\
table{border-collapse:collapse;margin:8px 0;font-size:13px}td,th{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}\
th{background:#f5f5f5}td.num{text-align:right;font-variant-numeric:tabular-nums}tr.total td{font-weight:600;background:#fafafa}\
figure{margin:12px 0}figcaption{font-weight:600;margin-bottom:4px}svg.chart text{font-size:12px;fill:#222}svg.chart text.seg-text{fill:#fff;font-size:11px}\
svg.chart a rect:hover{opacity:.75;cursor:pointer}.legend span{margin-right:14px;font-size:12px}.legend i{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px}\
svg.chart g.ci line{stroke:#111;stroke-width:1.5}details.samples{margin:4px 0}details.samples:target{outline:2px solid #1e88e5}.meta{color:#555}#render-check{color:#888;font-size:11px;margin-top:30px}.warning{background:#fff3e0;border-left:4px solid #fb8c00;padding:6px 10px}";

/// The page checks itself once loaded: every bar segment drawn with a real size, no
/// script errors; the result goes into #render-check for the browser test to read.
pub(crate) const SCRIPT: &str = "window.__errors=[];window.addEventListener('error',function(e){window.__errors.push(String(e.message))});\
window.addEventListener('load',function(){var c=document.getElementById('render-check');try{\
var segs=Array.prototype.slice.call(document.querySelectorAll('svg.chart rect.seg'));\
var drawn=segs.filter(function(r){var b=r.getBBox();return b.width>0&&b.height>0}).length;\
c.dataset.charts=document.querySelectorAll('svg.chart').length;c.dataset.segments=segs.length;c.dataset.drawn=drawn;\
c.dataset.links=document.querySelectorAll('svg.chart a').length;\
c.dataset.whiskers=Array.prototype.slice.call(document.querySelectorAll('svg.chart line.ci')).filter(function(l){return l.getBBox().width>0}).length;\
c.dataset.errors=window.__errors.join(' | ');c.dataset.ok=(window.__errors.length===0&&drawn===segs.length)?'1':'0';\
c.textContent='render check: '+drawn+' of '+segs.length+' bar segments drawn in '+c.dataset.charts+' charts'+(window.__errors.length?'; errors: '+c.dataset.errors:'');\
}catch(err){c.dataset.ok='0';c.dataset.errors=String(err);c.textContent='render check failed: '+err}});";

/// The whole page for a report (`report.json`'s value; `labels` is its `labels.jsonl`).
/// `judges`: the judges part of the page (`judges_html::section`), placed after the
/// benchmarks' sections.
pub fn render(report: &Value, labels: &Path, judges: &str) -> Result<String, String> {
    let entries: Vec<Value> = report["benchmarks"].as_array().cloned().unwrap_or_default();
    let samples = read_samples(&entries, labels)?;
    let name = report["run"]["name"].as_str().unwrap_or("run");
    let mut out = String::with_capacity(64 << 10);
    let _ = write!(
        out,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><title>Halyard report: {}</title><style>{STYLE}</style><script>{SCRIPT}</script></head><body><h1>Halyard report: {}</h1><p class=\"meta\">Run <code>{}</code>, sweep <code>{}</code>. Files: <a href=\"report.json\">report.json</a>, <a href=\"report.md\">report.md</a>, <a href=\"labels.jsonl\">labels.jsonl</a>.</p>",
        esc(name),
        esc(name),
        esc(report["run"]["id"].as_str().unwrap_or("?")),
        esc(report["run"]["sweep"].as_str().unwrap_or("?"))
    );
    let mut by_bench: BTreeMap<u64, Vec<(usize, &Value)>> = BTreeMap::new();
    for (i, e) in entries.iter().enumerate() {
        by_bench.entry(u(&e["benchmark"])).or_default().push((i, e));
    }
    for (b, es) in &by_bench {
        if es.iter().all(|(_, e)| e["pipeline"] == "hypotermqa") {
            hypotermqa_section(&mut out, *b, es, &samples);
        } else if es.iter().all(|(_, e)| e["pipeline"] == "chainpoll") {
            chainpoll_section(&mut out, *b, es);
        } else {
            generic_section(&mut out, *b, es);
        }
    }
    realhall_section(&mut out, &report["realhall"]);
    out.push_str(judges);
    cost_section(&mut out, &report["costs"]);
    out.push_str(&super::cost_per_correct::html(&report["cost_per_correct"]));
    jobs_section(&mut out, report);
    out.push_str("<div id=\"render-check\" data-ok=\"pending\"></div></body></html>\n");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unknown pipelines fall back to a table of their numbers; names are escaped.
    #[test]
    fn generic_fallback_and_escaping() {
        let dir = tempfile::tempdir().unwrap();
        let labels = dir.path().join("labels.jsonl");
        std::fs::write(&labels, "").unwrap();
        let report = serde_json::json!({
            "run": {"id": "r", "name": "<x>", "sweep": "s.toml"},
            "benchmarks": [{"benchmark": 0, "pipeline": "future-bench", "model": "m<1>", "score": 0.5, "nested": {"n": 3},
                "score_ci95": {"estimate": 0.5, "low": 0.4, "high": 0.6, "method": "wilson", "n": 80}}],
            "jobs": {"done": 1}, "costs": {"total": 0.0}, "dead_letters": []
        });
        let html = render(&report, &labels, "").unwrap();
        assert!(html.contains("Benchmark 0: future-bench"));
        assert!(html.contains("<td>nested.n</td><td class=\"num\">3</td>"), "{html}");
        assert!(html.contains("m&lt;1&gt;") && !html.contains("m<1>"));
        // An interval gets a chart of its own, the model's bar with its whisker (the scale
        // of a fraction is 0–1: 500 px, so 0.4–0.6 is x 420–520).
        assert!(html.contains("score_ci95 with its 95% interval"), "{html}");
        assert!(
            html.contains("<line class=\"ci\" x1=\"420.00\" y1=\"19.00\" x2=\"520.00\""),
            "{html}"
        );
        assert!(html.contains("0.5000 [0.4000, 0.6000]"), "{html}");
        assert!(
            !html.contains("http://") && !html.contains("https://"),
            "the page must not reference the network"
        );
    }

    /// Issue 29: a ChainPoll benchmark gets its own section: every method's AUROC with its
    /// interval or why it is not estimable (the generic table never showed the per-metric
    /// AUROCs, which sit in an array), unscored items and unparseable polls with why, the
    /// common-subset AUROC; and the RealHall aggregate has its section.
    #[test]
    fn chainpoll_and_realhall_sections() {
        let dir = tempfile::tempdir().unwrap();
        let labels = dir.path().join("labels.jsonl");
        std::fs::write(&labels, "").unwrap();
        let m = |i: usize, s: Option<f64>, why: &str| {
            let poll = match s {
                Some(_) => serde_json::json!({"output": "Answer: no", "verdict": false}),
                None => serde_json::json!({"output": "", "verdict": null, "unreadable": why}),
            };
            serde_json::json!({"pipeline": "chainpoll", "model": "j", "index": i, "id": i.to_string(),
                "line": i + 1, "label": i.is_multiple_of(2),
                "metrics": [{"metric": "correctness", "polls": [poll], "score": s}]})
        };
        let items: Vec<halyard_pipelines::chainpoll::ItemLabel> = (0..10)
            .map(|i| m(i, (i != 9).then_some(0.0), "empty"))
            .map(|v| serde_json::from_value(v).unwrap())
            .collect();
        let cfg = halyard_pipelines::chainpoll::Config {
            judge: halyard_pipelines::common::ModelSpec {
                name: "j".into(),
                model_ref: halyard_proto::ModelRef {
                    backend: "openai".into(),
                    endpoint: "http://x".into(),
                    model: "j".into(),
                },
                pool: "j".into(),
                api_key_env: None,
                temperature: 0.7,
                max_tokens: None,
                seed: None,
                timeout_ms: 1000,
                structured_output: false,
            },
            polls: 1,
            metrics: vec![halyard_pipelines::chainpoll::Metric::Correctness],
            unparseable: halyard_pipelines::metrics::chainpoll::Unparseable::Exclude,
            sampler: None,
            probability: None,
        };
        let mut entry =
            serde_json::to_value(halyard_pipelines::chainpoll::score(&cfg, &items)).unwrap();
        entry["benchmark"] = 0.into();
        entry["dataset"] = "d.jsonl".into();
        let realhall = serde_json::json!([{"model": "j", "benchmarks": [0, 1], "datasets": ["d.jsonl", "e.jsonl"],
            "rows": [{"method": "chainpoll", "per_dataset": [0.5, 0.7], "per_dataset_n": [9, 10], "per_dataset_unscored": [1, 0],
                "aggregate_auroc": {"estimate": 0.6, "low": null, "high": null, "level": 0.95, "method": "delong_mean", "n": 19,
                    "not_estimable": "a part has no DeLong variance"}, "quality_vs_chainpoll": 1.0}]}]);
        let report = serde_json::json!({
            "run": {"id": "r", "name": "n", "sweep": "s.toml"}, "benchmarks": [entry],
            "realhall": realhall, "jobs": {"done": 1}, "costs": {"total": 0.0}, "dead_letters": []
        });
        let html = render(&report, &labels, "").unwrap();
        assert!(html.contains("Benchmark 0: ChainPoll"), "{html}");
        assert!(html.contains("<td>ChainPoll-correctness</td><td class=\"num\">0.5000 [not estimable: no variation in scores]</td><td class=\"num\">9</td><td>1 (no readable verdict (every poll unparseable or failed): 1)</td>"), "{html}");
        assert!(html.contains("<td>1 (empty: 1)</td>"), "{html}");
        assert!(html.contains("not computed: no probability model configured"), "{html}");
        assert!(
            html.contains("0.5000 [not estimable: no variation in scores]</text>"),
            "chart: {html}"
        );
        assert!(html.contains("<h2 id=\"realhall\">RealHall aggregate</h2>"), "{html}");
        assert!(html.contains("<td class=\"num\">0.5000 (9; 1)</td><td class=\"num\">0.7000 (10; 0)</td><td class=\"num\">0.6000 [not estimable: a part has no DeLong variance]</td>"), "{html}");
    }
}

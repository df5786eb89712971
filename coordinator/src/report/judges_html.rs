//! `report.html`'s judges part (issue 31), from `report.json`'s `judges`: per benchmark,
//! an agreement heat map (Cohen's κ of every pair of judges, and of each judge with the
//! human labels) and the list of units where judges, or a judge and the human label,
//! disagree — each with its question, answer and every verdict, filterable by text and
//! by who disagrees.

use std::fmt::Write as _;

use serde_json::Value;

use super::html::esc;

/// A cell colour for κ: red at κ ≤ 0 through yellow to green at κ = 1.
fn heat(kappa: f64) -> String {
    let k = kappa.clamp(0.0, 1.0);
    format!("hsl({:.0},70%,{:.0}%)", 120.0 * k, 85.0 - 20.0 * k)
}

fn kappa_of(v: &Value) -> Option<f64> {
    v["estimate"].as_f64()
}

/// The heat map of one judge report: judges (and "human") on both axes.
fn heat_map(out: &mut String, r: &Value) {
    let judges: Vec<&str> =
        r["judges"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    let with_human =
        r["per_judge"].as_array().is_some_and(|js| js.iter().any(|j| j["vs_human"].is_object()));
    let mut axes: Vec<&str> = judges.clone();
    if with_human {
        axes.push("human");
    }
    let kappa = |a: &str, b: &str| -> Option<f64> {
        if a == b {
            return Some(1.0);
        }
        if a == "human" || b == "human" {
            let j = if a == "human" { b } else { a };
            let pj = r["per_judge"].as_array()?.iter().find(|x| x["judge"] == j)?;
            return kappa_of(&pj["vs_human"]["kappa"]);
        }
        let pair = r["between"]["pairwise_kappa"]
            .as_array()?
            .iter()
            .find(|p| (p["a"] == a && p["b"] == b) || (p["a"] == b && p["b"] == a))?;
        kappa_of(&pair["kappa"])
    };
    out.push_str("<table class=\"heat\"><tr><th>Cohen's κ</th>");
    for a in &axes {
        let _ = write!(out, "<th>{}</th>", esc(a));
    }
    out.push_str("</tr>");
    for a in &axes {
        let _ = write!(out, "<tr><th>{}</th>", esc(a));
        for b in &axes {
            match kappa(a, b) {
                Some(k) => {
                    let _ = write!(
                        out,
                        "<td class=\"heat-cell\" data-kappa=\"{k:.4}\" style=\"background:{}\">{k:.2}</td>",
                        heat(k)
                    );
                }
                None => out.push_str("<td class=\"heat-cell\" data-kappa=\"\">–</td>"),
            }
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
}

/// A rate with its interval, in percent ("–" when absent).
fn pct_ci(f: &Value) -> String {
    let pct = |x: &Value| x.as_f64().map_or("–".into(), |x| format!("{:.1}", x * 100.0));
    match (f["low"].as_f64(), f["high"].as_f64()) {
        (Some(_), Some(_)) => {
            format!("{} [{}, {}]", pct(&f["estimate"]), pct(&f["low"]), pct(&f["high"]))
        }
        _ => pct(&f["estimate"]),
    }
}

/// Per-judge (and panel) figures against a truth, with coverage and the all-units figures.
fn vs_table(out: &mut String, rows: &[(String, &Value)]) {
    out.push_str("<table><tr><th>labeller</th><th>units with truth</th><th>with a verdict</th><th>coverage %</th><th>error rate %, verdicts only</th><th>error rate %, all units</th><th>Cohen's κ</th></tr>");
    for (name, v) in rows {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(name),
            v["units"],
            v["n"],
            pct_ci(&v["coverage"]),
            pct_ci(&v["error_rate"]),
            pct_ci(&v["error_rate_all"]),
            kappa_of(&v["kappa"]).map_or("–".into(), |k| format!("{k:.3}"))
        );
    }
    out.push_str("</table>");
}

/// Per-judge error rates against humans with their intervals and coverage, the §4.4
/// table over every unit, pairwise disagreement, and agreement with other label sources.
fn vs_human_table(out: &mut String, r: &Value) {
    let mut rows: Vec<(String, &Value)> = r["per_judge"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|j| j["vs_human"].is_object())
        .map(|j| (j["judge"].as_str().unwrap_or("?").to_string(), &j["vs_human"]))
        .collect();
    if r["panel"]["vs_human"].is_object() {
        rows.push(("panel".into(), &r["panel"]["vs_human"]));
    }
    if !rows.is_empty() {
        let _ = write!(
            out,
            "<h4>Against human labels (truth: {})</h4><p>Verdicts only: the units the labeller decided (coverage beside); all units: no verdict counts as wrong. Wilson 95% intervals.</p>",
            esc(r["human"]["truth"].as_str().unwrap_or("majority"))
        );
        vs_table(out, &rows);
    }
    if let Some(list) = r["score_vs_human"].as_array().filter(|l| !l.is_empty()) {
        out.push_str("<h4>Every unit with a human truth (HypoTermQA §4.4)</h4><p>Rule-labelled units included; no verdict is wrong. Per group: the judge's and the human share of the favourable label on the same units, and the difference (paired bootstrap over items, 95%).</p><table><tr><th>labeller</th><th>units</th><th>by rule</th><th>no verdict</th><th>error rate %</th><th>per group: judge % vs human %, difference (pp)</th></tr>");
        for s in list {
            let groups: Vec<String> = s["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|g| {
                    let n = g["units"].as_f64().unwrap_or(0.0).max(1.0);
                    let share = |x: &Value| x.as_f64().unwrap_or(0.0) * 100.0 / n;
                    let d = &g["difference"];
                    format!(
                        "{}: {:.1} vs {:.1}, {}",
                        g["group"].as_str().unwrap_or("?"),
                        share(&g["labeller"]),
                        share(&g["human"]),
                        pct_ci(d)
                    )
                })
                .collect();
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(s["labeller"].as_str().unwrap_or("?")),
                s["units"],
                s["ruled"],
                s["no_verdict"],
                pct_ci(&s["error_rate"]),
                esc(&groups.join("; "))
            );
        }
        out.push_str("</table>");
    }
    let p = &r["human"]["pairwise"];
    if p.is_object() {
        out.push_str("<h4>Pairwise disagreement</h4><p>Human labels only; 95% bootstrap over items.</p><table><tr><th>who</th><th>pooled disagreement %</th><th>minus the annotators' (pp)</th></tr>");
        let _ = write!(
            out,
            "<tr><td>annotators among themselves</td><td>{}</td><td>–</td></tr>",
            pct_ci(&p["annotators_pooled"])
        );
        for j in p["judges"].as_array().into_iter().flatten() {
            let _ = write!(
                out,
                "<tr><td>{} against the annotators</td><td>{}</td><td>{}</td></tr>",
                esc(j["judge"].as_str().unwrap_or("?")),
                pct_ci(&j["pooled"]),
                pct_ci(&j["minus_annotators"])
            );
        }
        out.push_str("</table>");
    }
    let judges: Vec<&str> =
        r["judges"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    for s in r["sources"].as_array().into_iter().flatten() {
        let _ = write!(
            out,
            "<h4>Agreement with dataset labels ({})</h4><p>Not human truth.</p>",
            esc(s["provenance"].as_str().unwrap_or("?"))
        );
        let mut rows: Vec<(String, &Value)> = judges
            .iter()
            .zip(s["per_judge"].as_array().into_iter().flatten())
            .map(|(j, v)| (j.to_string(), v))
            .collect();
        if s["panel"].is_object() {
            rows.push(("panel".into(), &s["panel"]));
        }
        vs_table(out, &rows);
    }
}

/// Between judges against the truth: the error correlation matrix and the judges'
/// majority beside independent judges (issue 45, item 9).
fn between_figures(out: &mut String, r: &Value) {
    let b = &r["between"];
    let judges: Vec<&str> =
        r["judges"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    if let Some(rows) = b["error_correlation"].as_array() {
        out.push_str("<h4>Error correlation</h4><p>Phi correlation of two judges' errors against the truth, over the units both labelled (bounded by their error rates: read it beside them).</p><table><tr><th></th>");
        for j in &judges {
            let _ = write!(out, "<th>{}</th>", esc(j));
        }
        out.push_str("</tr>");
        for (a, row) in rows.iter().enumerate() {
            let _ = write!(out, "<tr><th>{}</th>", esc(judges.get(a).copied().unwrap_or("?")));
            for v in row.as_array().into_iter().flatten() {
                let cell = v.as_f64().map_or("–".into(), |v| format!("{v:.3}"));
                let _ = write!(out, "<td>{cell}</td>");
            }
            out.push_str("</tr>");
        }
        out.push_str("</table>");
    }
    let p = &b["panel_vs_independence"];
    if p.is_object() {
        let pct = |x: &Value| x.as_f64().map_or("–".into(), |x| format!("{:.1}", x * 100.0));
        let _ = write!(
            out,
            "<p>The judges' majority over {} units with a truth: right (%) {} (a verdict on {}%); independent judges with the same confusion rows: {}% (a verdict on {}%). Observed − independent (pp): {} (95% bootstrap over questions; negative: the judges err together).</p>",
            p["units"],
            esc(&pct_ci(&p["observed"])),
            pct(&p["observed_coverage"]),
            pct(&p["independent"]),
            pct(&p["independent_coverage"]),
            esc(&pct_ci(&p["difference"]))
        );
    }
}

/// "judge % vs others %: excess [interval]" of one side of a comparison (JSON `Excess`).
fn excess_cell(e: &Value) -> String {
    if !e.is_object() {
        return "–".into();
    }
    let rate = |x: &Value| x.as_f64().map_or("–".into(), |x| format!("{:.1}", x * 100.0));
    format!(
        "{} vs {}: {} ({} units)",
        rate(&e["judge_rate"]),
        rate(&e["others_rate"]),
        pct_ci(&e["excess"]),
        e["units"]
    )
}

/// The leniency and self-preference tables (issue 45), from `leniency` and
/// `self_preference`.
fn preference_tables(out: &mut String, r: &Value) {
    if let Some(list) = r["leniency"].as_array().filter(|l| !l.is_empty()) {
        out.push_str("<h4>Leniency</h4><p>Each judge's share of the favourable label against each other judge's on the same units, pooled: excess in percentage points, 95% bootstrap over questions. Relative to this panel.</p><table><tr><th>judge</th><th>units</th><th>questions</th><th>its % vs others' %: excess (pp)</th></tr>");
        for l in list {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(l["judge"].as_str().unwrap_or("?")),
                l["units"],
                l["questions"],
                esc(&excess_cell(l))
            );
        }
        out.push_str("</table>");
    }
    if let Some(list) = r["self_preference"].as_array().filter(|l| !l.is_empty()) {
        out.push_str("<h4>Self-preference</h4><p>The interaction: the judge's excess on its own model's answers minus its excess on other models' answers, paired by question; 95% bootstrap over questions; p from a permutation test within questions.</p><table><tr><th>judge</th><th>own model</th><th>questions paired</th><th>own model's answers</th><th>other models' answers</th><th>self-preference (pp)</th><th>p</th></tr>");
        for sp in list {
            let p = sp["p_value"].as_f64().map_or("–".into(), |p| {
                format!(
                    "{p:.4}{}",
                    if sp["significant"].as_bool() == Some(true) { " (significant)" } else { "" }
                )
            });
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(sp["judge"].as_str().unwrap_or("?")),
                esc(sp["model"].as_str().unwrap_or("?")),
                sp["questions_paired"],
                esc(&excess_cell(&sp["own"])),
                esc(&excess_cell(&sp["elsewhere"])),
                esc(&pct_ci(&sp["difference"])),
                esc(&p)
            );
        }
        out.push_str("</table>");
    }
}

/// The disagreement list with its filters.
fn disagreements(out: &mut String, b: u64, r: &Value) {
    let list: Vec<&Value> = r["disagreements"].as_array().into_iter().flatten().collect();
    let total = r["disagreements_total"].as_u64().unwrap_or(0);
    let judges: Vec<&str> =
        r["judges"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    let _ = write!(
        out,
        "<h4>Disagreements ({total}{})</h4><p><input type=\"search\" placeholder=\"filter by text\" oninput=\"halyardFilter({b})\" id=\"dis-q-{b}\"> <label><input type=\"checkbox\" id=\"dis-h-{b}\" onchange=\"halyardFilter({b})\"> only where a judge differs from the human label</label> <span id=\"dis-n-{b}\">{}</span> shown</p>",
        if (list.len() as u64) < total { format!(", first {} listed", list.len()) } else { String::new() },
        list.len()
    );
    let _ = write!(out, "<table class=\"dis\" id=\"dis-{b}\"><tr><th>item</th><th>model</th><th>question</th><th>answer</th>");
    for j in &judges {
        let _ = write!(out, "<th>{}</th>", esc(j));
    }
    out.push_str("<th>panel</th><th>human</th></tr>");
    for d in list {
        let human = d["human"].as_str();
        let votes: Vec<Option<&str>> =
            d["votes"].as_array().into_iter().flatten().map(Value::as_str).collect();
        let vs_human = human.is_some_and(|h| votes.iter().flatten().any(|v| *v != h));
        let part = d["part"].as_str().map(|p| format!(" #{p}")).unwrap_or_default();
        let _ = write!(
            out,
            "<tr class=\"dis-row\" data-human=\"{}\"><td>{}{}</td><td>{}</td><td>{}</td><td>{}</td>",
            u8::from(vs_human),
            esc(d["item"].as_str().unwrap_or("?")),
            esc(&part),
            esc(d["model"].as_str().unwrap_or("?")),
            esc(d["question"].as_str().unwrap_or("")),
            esc(d["answer"].as_str().unwrap_or("(none)"))
        );
        for v in &votes {
            let cls = match (v, human) {
                (Some(v), Some(h)) if *v != h => " class=\"off\"",
                _ => "",
            };
            let _ = write!(out, "<td{cls}>{}</td>", esc(v.unwrap_or("–")));
        }
        let _ = write!(
            out,
            "<td>{}</td><td>{}</td></tr>",
            esc(d["panel"].as_str().unwrap_or("–")),
            esc(human.unwrap_or("–"))
        );
    }
    out.push_str("</table>");
}

/// Styles and the filter script of the judges part.
const JUDGES_HEAD: &str = "<style>table.heat td.heat-cell{text-align:center;min-width:3.5em}table.dis td{vertical-align:top;max-width:28em;font-size:.85em}table.dis td.off{font-weight:bold;color:#b71c1c}</style><script>function halyardFilter(b){var q=document.getElementById('dis-q-'+b).value.toLowerCase();var h=document.getElementById('dis-h-'+b).checked;var n=0;document.querySelectorAll('#dis-'+b+' tr.dis-row').forEach(function(r){var ok=(!q||r.textContent.toLowerCase().indexOf(q)>=0)&&(!h||r.dataset.human==='1');r.style.display=ok?'':'none';if(ok)n++;});document.getElementById('dis-n-'+b).textContent=n;}</script>";

/// The judges part of the page (nothing when the report has none).
pub fn section(judges: &Value) -> String {
    let mut page = String::new();
    let out = &mut page;
    let Some(list) = judges.as_array().filter(|l| !l.is_empty()) else { return page };
    out.push_str(JUDGES_HEAD);
    out.push_str("<h2 id=\"judges\">Judges</h2>");
    for r in list {
        let b = r["benchmark"].as_u64().unwrap_or(0);
        let _ = write!(
            out,
            "<section class=\"judges\" data-benchmark=\"{b}\"><h3>Benchmark {b}: {} judges ({} {}s, verdict {})</h3>",
            esc(r["pipeline"].as_str().unwrap_or("?")),
            r["units"],
            esc(r["unit"].as_str().unwrap_or("unit")),
            esc(r["panel"]["verdict"]["rule"].as_str().unwrap_or("?"))
        );
        heat_map(out, r);
        between_figures(out, r);
        vs_human_table(out, r);
        preference_tables(out, r);
        disagreements(out, b, r);
        out.push_str("</section>");
    }
    page
}

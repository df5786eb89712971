//! Compare: the paired tests `halyard report A B …` makes (the same function,
//! `halyard_coordinator::report::paired_runs::compare`), over the runs picked (one run
//! compares its models with each other), each McNemar row with its power
//! ([`super::power`]) and its discordant items.

use std::path::PathBuf;

use halyard_coordinator::report::paired_runs;
use serde::Serialize;
use serde_json::Value;

use super::power::{power, Power};

/// The runs of a comparison: (key, directory, `report.json`'s benchmark entries).
pub type Runs = Vec<(String, PathBuf, Vec<Value>)>;

/// Read the report entries of the runs `keys` (directories from `dirs`).
pub fn load(keys: &[(String, PathBuf)]) -> Result<Runs, String> {
    let mut out = Vec::new();
    for (k, dir) in keys {
        let report = super::runs::read_json(&dir.join("report.json"))?
            .ok_or_else(|| format!("run {k} has no report.json yet (is it still running?)"))?;
        let entries = report["benchmarks"].as_array().cloned().unwrap_or_default();
        out.push((k.clone(), dir.clone(), entries));
    }
    Ok(out)
}

#[derive(Serialize)]
pub struct Row {
    pub group: String,
    pub figure: String,
    pub a: String,
    pub b: String,
    pub shared: usize,
    /// `halyard report`'s cells: A − B, its 95% interval, the test, the result.
    pub difference: String,
    pub interval: String,
    pub test: String,
    pub verdict: String,
    pub only_a: Option<u64>,
    pub only_b: Option<u64>,
    /// McNemar rows: the minimum detectable difference and the n needed for `target`.
    pub power: Option<Power>,
}

#[derive(Serialize)]
pub struct Comparison {
    pub rows: Vec<Row>,
    pub warnings: Vec<String>,
    pub target: f64,
}

/// Every paired row of the runs, with power for the McNemar rows (`target`: the
/// difference whose n needed is asked for).
pub fn compare(runs: &Runs, target: f64) -> Comparison {
    let mut warnings = Vec::new();
    let rows = paired_runs::compare(runs, &mut warnings)
        .into_iter()
        .map(|r| {
            let cells = paired_runs::cells(&r);
            let disc = r.test.as_ref().ok().and_then(|t| t.discordant);
            Row {
                difference: cells[3].clone(),
                interval: cells[4].clone(),
                test: cells[5].clone(),
                verdict: cells[6].clone(),
                only_a: disc.map(|d| d.only_a),
                only_b: disc.map(|d| d.only_b),
                power: disc.map(|d| power(r.shared as u64, d.only_a, d.only_b, target)),
                group: r.group,
                figure: r.figure,
                a: r.a,
                b: r.b,
                shared: r.shared,
            }
        })
        .collect();
    Comparison { rows, warnings, target }
}

/// One discordant item: its id, which side succeeded, and where each side's row is.
#[derive(Serialize)]
pub struct Discordant {
    pub item: String,
    pub a_right: bool,
    /// The run keys of A and B (from "model (run)").
    pub run_a: String,
    pub model_a: String,
    pub run_b: String,
    pub model_b: String,
}

/// "model (run)" → (model, run).
fn split_who(who: &str) -> (String, String) {
    match who.rfind(" (") {
        Some(i) if who.ends_with(')') => {
            (who[..i].to_string(), who[i + 2..who.len() - 1].to_string())
        }
        _ => (who.to_string(), String::new()),
    }
}

/// The discordant items of one row.
pub fn discordant(runs: &Runs, group: &str, figure: &str, a: &str, b: &str) -> Vec<Discordant> {
    let (model_a, run_a) = split_who(a);
    let (model_b, run_b) = split_who(b);
    paired_runs::discordant_items(runs, group, figure, a, b)
        .into_iter()
        .map(|(item, a_right)| Discordant {
            item,
            a_right,
            run_a: run_a.clone(),
            model_a: model_a.clone(),
            run_b: run_b.clone(),
            model_b: model_b.clone(),
        })
        .collect()
}

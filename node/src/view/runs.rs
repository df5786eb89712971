//! The runs `halyard view` shows: found under the directories it was given, each read
//! from what its coordinator publishes (`status.json`, rewritten atomically while it runs)
//! and what a finished run wrote (`report.json`). Nothing here opens a run's store: a
//! live run's store belongs to its coordinator (it holds the store's lock), and a
//! finished run's report files are everything the view needs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

/// A status not rewritten for this long belongs to a coordinator that is gone (it writes
/// one every second or so while it runs).
const STALE_MS: u64 = 60_000;

/// Run directories under `dirs`: each given directory that is a run itself (it holds a
/// `report.json` or a `status.json`), else its subdirectories that are. Keys are the
/// directory names, made unique with `-2`, `-3`, … in the order found.
pub fn discover(dirs: &[PathBuf]) -> BTreeMap<String, PathBuf> {
    let mut found: Vec<PathBuf> = Vec::new();
    for d in dirs {
        if is_run(d) {
            found.push(d.clone());
            continue;
        }
        let Ok(rd) = std::fs::read_dir(d) else { continue };
        let mut subs: Vec<PathBuf> =
            rd.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| is_run(p)).collect();
        subs.sort();
        found.extend(subs);
    }
    let mut out = BTreeMap::new();
    for p in found {
        let base = p.file_name().map_or("run".into(), |n| n.to_string_lossy().into_owned());
        let base: String = base
            .chars()
            .map(|c| if c.is_alphanumeric() || "-_.".contains(c) { c } else { '_' })
            .collect();
        let mut key = base.clone();
        let mut i = 2;
        while out.contains_key(&key) {
            key = format!("{base}-{i}");
            i += 1;
        }
        out.insert(key, p);
    }
    out
}

fn is_run(p: &Path) -> bool {
    p.join("report.json").is_file() || p.join("status.json").is_file()
}

/// A JSON file of a run, or `None` when it is missing; a file that does not parse is an
/// error naming it (a status is replaced by rename, so a reader never sees half of one).
pub fn read_json(path: &Path) -> Result<Option<Value>, String> {
    match std::fs::read(path) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| format!("{}: not JSON: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// One run as the runs page lists it.
#[derive(Serialize)]
pub struct RunSummary {
    pub key: String,
    pub name: String,
    pub dir: String,
    /// `running` (a coordinator rewrites its status), `complete`, `interrupted`,
    /// `cost_limit`, or `stale` (the status says running but nobody rewrote it for a
    /// minute: its coordinator is gone).
    pub state: String,
    pub live: bool,
    pub has_report: bool,
    pub items_done: Option<u64>,
    pub items_total: Option<u64>,
    pub rate_items_per_s: Option<f64>,
    pub eta_s: Option<f64>,
    pub spent: Option<f64>,
    pub dead_letters: Option<u64>,
    pub updated_unix_ms: Option<u64>,
    /// Per benchmark entry of a finished run: pipeline, model, judge, headline figure.
    pub headline: Vec<Headline>,
    /// What could not be read (a file that is not JSON), shown with the run.
    pub problems: Vec<String>,
}

#[derive(Serialize)]
pub struct Headline {
    pub benchmark: u64,
    pub pipeline: String,
    pub model: String,
    pub judge: Option<String>,
    pub figure: String,
    pub value: Option<f64>,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The summary of the run in `dir`.
pub fn summary(key: &str, dir: &Path) -> RunSummary {
    let mut problems = Vec::new();
    let status = read_json(&dir.join("status.json")).unwrap_or_else(|e| {
        problems.push(e);
        None
    });
    let report = read_json(&dir.join("report.json")).unwrap_or_else(|e| {
        problems.push(e);
        None
    });
    summarize(key, &dir.display().to_string(), status, report, problems)
}

/// The summary of a run known only from the status its coordinator published on the
/// broker's status bucket (a run on another machine): progress, no report or items.
/// The entry is anyone's message on the broker: only its numbers and names are read,
/// and the page shows them as text.
pub fn from_broker(status: Value) -> RunSummary {
    let name = status["name"].as_str().unwrap_or("?").to_string();
    let key: String = format!("nats-{name}")
        .chars()
        .map(|c| if c.is_alphanumeric() || "-_.".contains(c) { c } else { '_' })
        .collect();
    summarize(&key, "", Some(status), None, Vec::new())
}

fn summarize(
    key: &str,
    dir: &str,
    status: Option<Value>,
    report: Option<Value>,
    problems: Vec<String>,
) -> RunSummary {
    let st = status.as_ref();
    let get_u = |k: &str| st.and_then(|s| s[k].as_u64());
    let get_f = |k: &str| st.and_then(|s| s[k].as_f64());
    let updated = get_u("updated_unix_ms");
    let mut state = st.and_then(|s| s["state"].as_str().map(str::to_string)).unwrap_or_else(|| {
        if report.is_some() {
            "complete".into()
        } else {
            "unknown".into()
        }
    });
    if state == "running" && updated.is_some_and(|u| now_ms().saturating_sub(u) > STALE_MS) {
        state = "stale".into();
    }
    let name = report
        .as_ref()
        .and_then(|r| r["run"]["name"].as_str())
        .or_else(|| st.and_then(|s| s["name"].as_str()))
        .unwrap_or(key)
        .to_string();
    let headline = report.as_ref().map(headlines).unwrap_or_default();
    RunSummary {
        key: key.to_string(),
        name,
        dir: dir.to_string(),
        live: state == "running",
        state,
        has_report: report.is_some(),
        items_done: get_u("items_done"),
        items_total: get_u("items_total"),
        rate_items_per_s: get_f("rate_items_per_s"),
        eta_s: get_f("eta_s"),
        spent: get_f("spent")
            .or_else(|| report.as_ref().and_then(|r| r["costs"]["total"].as_f64())),
        dead_letters: get_u("dead_letters")
            .or_else(|| report.as_ref().and_then(|r| r["jobs"]["dead_letters"].as_u64())),
        updated_unix_ms: updated,
        headline,
        problems,
    }
}

/// The headline figure of each benchmark entry: HypoTermQA's HTS, else the entry's first
/// top-level number that names a rate, score or accuracy, else its first number.
fn headlines(report: &Value) -> Vec<Headline> {
    let mut out = Vec::new();
    for e in report["benchmarks"].as_array().into_iter().flatten() {
        let Some(o) = e.as_object() else { continue };
        let numeric: Vec<(&String, f64)> = o
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "benchmark" | "labels_lines"))
            .filter_map(|(k, v)| v.as_f64().or_else(|| v["estimate"].as_f64()).map(|x| (k, x)))
            .collect();
        let pick = numeric
            .iter()
            .find(|(k, _)| k.as_str() == "hts")
            .or_else(|| {
                numeric.iter().find(|(k, _)| {
                    ["rate", "score", "accuracy", "auroc", "hvi", "f1"]
                        .iter()
                        .any(|w| k.contains(w))
                })
            })
            .or_else(|| numeric.first());
        out.push(Headline {
            benchmark: e["benchmark"].as_u64().unwrap_or(0),
            pipeline: e["pipeline"].as_str().unwrap_or("?").to_string(),
            model: e["model"].as_str().unwrap_or("?").to_string(),
            judge: e["judge"].as_str().map(str::to_string),
            figure: pick.map_or(String::new(), |(k, _)| k.to_string()),
            value: pick.map(|(_, v)| *v),
        });
    }
    out
}

//! `halyard labels import RUN_DIR FILE [--benchmark N] [--sweep S]`: attach human labels
//! to a finished run and write its report again, with the judges measured against them.
//!
//! The file is checked line by line against the benchmark's labels (an error names the
//! line and the field) before anything is written, then copied into the run as
//! `human-labels/benchmark-N.jsonl` (replacing an earlier import for that benchmark); the
//! report is rewritten from the stored run state, so no model is called. The sweep is the
//! one `report.json` names, unless `--sweep` gives it.

use std::path::{Path, PathBuf};

use halyard_plan::judging::human::Shape;
use halyard_plan::judging::HumanLabels;
use halyard_plan::report::imported_labels_path;

use crate::NodeError;

pub struct Imported {
    pub benchmark: usize,
    pub labels: usize,
    pub stored: PathBuf,
    /// Whether an earlier import of this benchmark was replaced.
    pub replaced: bool,
}

fn usage(msg: String) -> NodeError {
    NodeError::Usage(msg)
}

/// The sweep file of the run in `run`: `--sweep`, or the one its `report.json` names.
fn sweep_path(run: &Path, given: Option<&Path>) -> Result<PathBuf, NodeError> {
    if let Some(p) = given {
        return Ok(p.to_path_buf());
    }
    let report = run.join("report.json");
    let text = std::fs::read_to_string(&report).map_err(|e| {
        usage(format!(
            "{}: {e} (is {} a finished run? `halyard run` writes report.json when the run ends)",
            report.display(),
            run.display()
        ))
    })?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|source| NodeError::Json { what: report.display().to_string(), source })?;
    let Some(sweep) = v["run"]["sweep"].as_str() else {
        return Err(usage(format!("{}: no run.sweep; pass --sweep", report.display())));
    };
    let p = PathBuf::from(sweep);
    if !p.is_file() {
        return Err(usage(format!(
            "the run's sweep {sweep} (from {}) is not here; pass --sweep",
            report.display()
        )));
    }
    Ok(p)
}

/// Check `file`, store it in the run and rewrite the report.
pub fn run(
    run: &Path,
    file: &Path,
    benchmark: Option<usize>,
    sweep: Option<&Path>,
) -> Result<Imported, NodeError> {
    let sweep_file = sweep_path(run, sweep)?;
    let sweep = halyard_plan::sweep::load(&sweep_file)?;
    let judged: Vec<(usize, halyard_plan::benchmarks::JudgedLabels)> = sweep
        .benchmarks
        .iter()
        .enumerate()
        .filter_map(|(i, b)| b.ops().judged_labels().map(|s| (i, s)))
        .collect();
    let (b, (categories, part)) = match benchmark {
        Some(n) => judged.into_iter().find(|(i, _)| *i == n).ok_or_else(|| {
            usage(format!(
                "benchmark {n} of {} has no judges to measure (or does not exist)",
                sweep_file.display()
            ))
        })?,
        None => match judged.len() {
            1 => judged.into_iter().next().expect("one element"),
            0 => {
                return Err(usage(format!(
                    "{} has no benchmark with judges (hypotermqa, chainpoll, hvi with a dataset)",
                    sweep_file.display()
                )))
            }
            _ => {
                let list: Vec<String> = judged.iter().map(|(i, _)| i.to_string()).collect();
                return Err(usage(format!(
                    "{} has several benchmarks with judges ({}): pass --benchmark N",
                    sweep_file.display(),
                    list.join(", ")
                )));
            }
        },
    };
    let pipeline = sweep.benchmarks[b].pipeline();
    let shape = Shape { pipeline, categories: &categories, part };
    // Read once: what is stored is exactly what was checked.
    let text = std::fs::read_to_string(file)
        .map_err(|e| usage(format!("human labels {}: cannot read: {e}", file.display())))?;
    let labels = HumanLabels::from_text(file, &text, shape).map_err(|e| usage(e.to_string()))?;
    let stored = imported_labels_path(run, b);
    let replaced = stored.exists();
    let io = |what: String| move |source| NodeError::Io { what, source };
    if let Some(dir) = stored.parent() {
        std::fs::create_dir_all(dir).map_err(io(format!("create {}", dir.display())))?;
    }
    // The earlier import is kept aside until the report is rewritten with the new one; if
    // the rewrite fails, it is put back and the run is as it was.
    let backup = stored.with_extension("jsonl.previous");
    if replaced {
        std::fs::rename(&stored, &backup)
            .map_err(io(format!("keep the earlier import {}", stored.display())))?;
    }
    let restore = || {
        if replaced {
            let _ = std::fs::rename(&backup, &stored);
        } else {
            let _ = std::fs::remove_file(&stored);
        }
    };
    let tmp = stored.with_extension("jsonl.tmp");
    let write = std::fs::write(&tmp, text.as_bytes()).and_then(|_| std::fs::rename(&tmp, &stored));
    if let Err(e) = write {
        restore();
        return Err(NodeError::Io { what: format!("store {}", stored.display()), source: e });
    }
    if let Err(e) = halyard_coordinator::report::rewrite(sweep, run) {
        restore();
        // The report of the earlier labels again, as it was before.
        return Err(NodeError::Coordinator(e).context(format!(
            "rewrite the report of {} (the labels were not imported)",
            run.display()
        )));
    }
    if replaced {
        let _ = std::fs::remove_file(&backup);
    }
    Ok(Imported { benchmark: b, labels: labels.labels.len(), stored, replaced })
}

//! `halyard labels import RUN_DIR FILE [--benchmark N] [--sweep S]`: attach human labels
//! to a finished run and write its report again, with the judges measured against them.
//!
//! The file is checked line by line against the benchmark's labels (an error names the
//! line and the field) before anything is written, then copied into the run as
//! `human-labels/benchmark-N.jsonl` (replacing an earlier import for that benchmark); the
//! report is rewritten from the stored run state, so no model is called. The sweep is the
//! one `report.json` names, unless `--sweep` gives it.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use halyard_plan::judging::human::parse;
use halyard_plan::judging::human::Shape;
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
    let stored = imported_labels_path(run, b);
    let io = |what: String| move |source| NodeError::Io { what, source };
    if let Some(dir) = stored.parent() {
        std::fs::create_dir_all(dir).map_err(io(format!("create {}", dir.display())))?;
    }
    // Read once, line by line, into the temporary copy: what is stored is exactly what
    // was checked, and the file is never held whole in memory.
    let src = std::fs::File::open(file)
        .map_err(|e| usage(format!("human labels {}: cannot read: {e}", file.display())))?;
    let tmp = stored.with_extension("jsonl.tmp");
    let name = file.display().to_string();
    let labels = copy_checked(src, &name, &tmp, |line_no, line| {
        parse(&name, line, shape).map(|ls| ls.len()).map_err(|mut e| {
            e.line = line_no;
            usage(e.to_string())
        })
    })?;
    let replaced = stored.exists();
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
    if let Err(e) = std::fs::rename(&tmp, &stored) {
        let _ = std::fs::remove_file(&tmp);
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
    Ok(Imported { benchmark: b, labels, stored, replaced })
}

/// The longest line of a labels file read (a label line is well under a KiB; a file
/// without newlines is not read whole into memory).
const MAX_LINE: u64 = 1 << 20;

/// Copy `src` to a new file `tmp` line by line, each line checked by `check` (its
/// 1-based number and text; returns the labels it holds) before it is written; the total
/// of labels. `tmp` is created anew (an earlier one removed first; `create_new` refuses a
/// symbolic link put there, so nothing outside the run is written through it) and synced;
/// on any error it is removed.
fn copy_checked(
    src: impl Read,
    name: &str,
    tmp: &Path,
    mut check: impl FnMut(usize, &str) -> Result<usize, NodeError>,
) -> Result<usize, NodeError> {
    let io = |what: String| move |source| NodeError::Io { what, source };
    match std::fs::remove_file(tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(io(format!("remove the stale {}", tmp.display()))(e))
        }
        _ => {}
    }
    let out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(tmp)
        .map_err(io(format!("create {}", tmp.display())))?;
    let copy = || -> Result<usize, NodeError> {
        let mut out = std::io::BufWriter::new(&out);
        let mut src = BufReader::new(src);
        let mut line = Vec::new();
        let mut total = 0;
        for line_no in 1.. {
            line.clear();
            let n = (&mut src)
                .take(MAX_LINE + 1)
                .read_until(b'\n', &mut line)
                .map_err(|e| usage(format!("human labels {name}: cannot read: {e}")))?;
            if n == 0 {
                break;
            }
            if n as u64 > MAX_LINE {
                return Err(usage(format!(
                    "human labels {name}: line {line_no} is longer than {MAX_LINE} bytes \
                     (a label is one JSON object per line)"
                )));
            }
            let text = std::str::from_utf8(&line).map_err(|e| {
                usage(format!("human labels {name}: line {line_no} is not UTF-8: {e}"))
            })?;
            total += check(line_no, text)?;
            out.write_all(&line).map_err(io(format!("write {}", tmp.display())))?;
        }
        out.flush().map_err(io(format!("write {}", tmp.display())))?;
        Ok(total)
    };
    let result = copy().and_then(|n| {
        out.sync_all().map_err(io(format!("sync {}", tmp.display())))?;
        Ok(n)
    });
    if result.is_err() {
        let _ = std::fs::remove_file(tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(_: usize, line: &str) -> Result<usize, NodeError> {
        if line.contains("bad") {
            return Err(NodeError::Usage("bad line".into()));
        }
        Ok(usize::from(!line.trim().is_empty()))
    }

    /// Issue 49: the copy is checked line by line and written to a file created anew: a
    /// symbolic link planted at the temporary name is replaced, never written through.
    #[test]
    fn the_copy_is_checked_and_never_follows_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let tmp = dir.path().join("benchmark-0.jsonl.tmp");
        std::os::unix::fs::symlink(&victim, &tmp).unwrap();
        let text = "{\"a\": 1}\n\n{\"b\": 2}";
        assert_eq!(copy_checked(text.as_bytes(), "l", &tmp, count).unwrap(), 2);
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert!(!std::fs::symlink_metadata(&tmp).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read_to_string(&tmp).unwrap(), text);
        // A bad line: an error, and no temporary copy left.
        let e = copy_checked("ok\nbad\n".as_bytes(), "l", &tmp, count).unwrap_err();
        assert!(e.to_string().contains("bad line"), "{e}");
        assert!(!tmp.exists());
    }

    /// Issue 49: an endless file without newlines is refused at the line limit, not read
    /// into memory whole; the lines are numbered as read.
    #[test]
    fn the_file_is_read_a_bounded_line_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let tmp = dir.path().join("x.tmp");
        let e = copy_checked(std::io::repeat(b'x'), "endless", &tmp, count).unwrap_err();
        assert!(e.to_string().contains("line 1 is longer than 1048576 bytes"), "{e}");
        assert!(!tmp.exists());
        let mut seen = Vec::new();
        let lines = "a\nb\n\nc".as_bytes();
        copy_checked(lines, "l", &tmp, |n, l| {
            seen.push((n, l.trim_end().to_string()));
            Ok(0)
        })
        .unwrap();
        let want = [(1, "a"), (2, "b"), (3, ""), (4, "c")].map(|(n, l)| (n, l.to_string()));
        assert_eq!(seen, want);
    }
}

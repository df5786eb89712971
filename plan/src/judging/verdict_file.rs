//! The panel's verdict on every unit, left on disk beside `labels.jsonl` (issue 53):
//! `panel/benchmark-N.jsonl`, one row per unit the judges labelled, written with the
//! report wherever a pipeline measures its judges ([`super::analyse`]: a panel, or one
//! judge with human labels), so `halyard view` shows each item's panel verdict from the
//! same function the report uses ([`super::figures::verdicts`]), not a second one.
//!
//! A row: `{"item", "model", "part"?, "votes": [{"judge", "label"}], "verdict", "rule"}`,
//! `label` and `verdict` `null` where there is none (a judge error, a tie); an output a
//! rule labelled (HypoTermQA's answers that include none of the terms) has `"ruled": true`
//! and the rule's label for every judge and as the verdict.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{figures, Judged, UnitKey};
use crate::report::{io_err, write_atomic, Section};
use crate::PlanError;

/// Where benchmark `bench`'s panel verdicts are in a run directory.
pub fn path(dir: &Path, bench: usize) -> PathBuf {
    dir.join("panel").join(format!("benchmark-{bench}.jsonl"))
}

#[derive(Serialize)]
struct Vote<'a> {
    judge: &'a str,
    label: Option<&'a str>,
}

#[derive(Serialize)]
struct Row<'a> {
    #[serde(flatten)]
    key: &'a UnitKey,
    votes: Vec<Vote<'a>>,
    verdict: Option<&'a str>,
    rule: &'a str,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    ruled: bool,
}

/// Write `judged`'s verdicts for this section's benchmark.
pub fn write(out: &Section<'_>, judged: &Judged) -> Result<(), PlanError> {
    let verdicts = figures::verdicts(judged);
    let rule = judged.verdict.describe();
    let cat = |c: Option<usize>| c.and_then(|c| judged.categories.get(c)).map(String::as_str);
    let mut text = Vec::new();
    let mut push = |row: &Row<'_>| -> Result<(), PlanError> {
        serde_json::to_writer(&mut text, row).map_err(|e| out.err(e))?;
        text.push(b'\n');
        Ok(())
    };
    for (u, v) in judged.units.iter().zip(&verdicts.labels) {
        let votes = judged
            .judges
            .iter()
            .zip(&u.votes)
            .map(|(j, l)| Vote { judge: &j.name, label: cat(*l) })
            .collect();
        push(&Row { key: &u.key, votes, verdict: cat(*v), rule: &rule, ruled: false })?;
    }
    for r in &judged.ruled {
        let label = cat(Some(r.label));
        let votes = judged.judges.iter().map(|j| Vote { judge: &j.name, label }).collect();
        push(&Row { key: &r.key, votes, verdict: label, rule: &rule, ruled: true })?;
    }
    let dir = out.dir.join("panel");
    std::fs::create_dir_all(&dir).map_err(|e| io_err(out.dir, format!("panel/: {e}")))?;
    write_atomic(&dir, &format!("benchmark-{}.jsonl", out.bench), &text)
}

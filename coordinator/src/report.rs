//! Writing a finished run's report: `report.json`, `report.md`, `labels.jsonl`.
//!
//! Files are written to a temporary name and renamed, so a reader never sees half a
//! report. The benchmark figures are a pure function of the stored labels; job
//! accounting (calls, cache hits, tokens, latency) sits apart under `jobs`, since a
//! resumed run legitimately differs there from an uninterrupted one.

use std::io::Write;
use std::path::{Path, PathBuf};

use halyard_pipelines::hypotermqa::{self, ItemLabel};
use halyard_proto::Outcome;
use serde::Serialize;
use uuid::Uuid;

use crate::state::{JobTotals, RunState};
use crate::sweep::Benchmark;
use crate::{CoordinatorConfig, CoordinatorError};

#[derive(Serialize)]
pub struct DeadLetter {
    pub job: String,
    pub pool: Option<String>,
    pub stage: Option<String>,
    pub model: Option<String>,
    pub kind: String,
    pub error: String,
    pub http_status: Option<u16>,
    pub deliveries: u64,
}

#[derive(Serialize)]
struct RunInfo<'a> {
    id: Uuid,
    name: &'a str,
    sweep: String,
}

#[derive(Serialize)]
struct ReportJson<'a> {
    run: RunInfo<'a>,
    benchmarks: Vec<serde_json::Value>,
    jobs: JobTotals,
    dead_letters: Vec<DeadLetter>,
}

fn io_err(dir: &Path, e: impl std::fmt::Display) -> CoordinatorError {
    CoordinatorError::Report { dir: dir.display().to_string(), reason: e.to_string() }
}

fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), CoordinatorError> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut f = std::fs::File::create(&tmp).map_err(|e| io_err(dir, format!("{name}: {e}")))?;
    f.write_all(bytes).and_then(|_| f.sync_all()).map_err(|e| io_err(dir, format!("{name}: {e}")))?;
    std::fs::rename(&tmp, dir.join(name)).map_err(|e| io_err(dir, format!("{name}: {e}")))
}

/// Labels of one (benchmark, model) in dataset order.
fn labels_of(state: &RunState, bench: u32, model: u32, dir: &Path) -> Result<Vec<ItemLabel>, CoordinatorError> {
    let mut out = Vec::new();
    for r in state.labels() {
        let (k, v) = r?;
        if k.bench == bench && k.model == model {
            out.push(serde_json::from_slice(&v).map_err(|e| io_err(dir, format!("stored label {k:?}: {e}")))?);
        }
    }
    Ok(out)
}

pub fn dead_letters(state: &RunState) -> Result<Vec<DeadLetter>, CoordinatorError> {
    let mut out = Vec::new();
    for r in state.results() {
        let r = r?;
        if let Outcome::Failed(f) = &r.outcome {
            let meta = state.job_meta(&r.job)?;
            out.push(DeadLetter {
                job: r.job.to_string(),
                pool: meta.as_ref().map(|m| m.pool.clone()),
                stage: meta.as_ref().map(|m| m.stage.clone()),
                model: meta.map(|m| m.model),
                kind: format!("{:?}", f.kind).to_lowercase(),
                error: f.error.clone(),
                http_status: f.http_status,
                deliveries: r.deliveries,
            });
        }
    }
    Ok(out)
}

/// Write the report files into the run directory; returns it.
pub fn write(cfg: &CoordinatorConfig, state: &RunState, run: Uuid) -> Result<PathBuf, CoordinatorError> {
    let dir = cfg.run_dir.clone();
    let mut benchmarks = Vec::new();
    let mut md = format!("# Halyard run `{}`\n\nRun id `{run}`, sweep `{}`.\n\n", cfg.sweep.name, cfg.sweep.file.display());
    let mut labels_jsonl = Vec::new();
    for (b, bench) in cfg.sweep.benchmarks.iter().enumerate() {
        match bench {
            Benchmark::HypoTermQa { config, questions, dataset } => {
                for (m, c) in config.iter().enumerate() {
                    let labels = labels_of(state, b as u32, m as u32, &dir)?;
                    for l in &labels {
                        serde_json::to_writer(&mut labels_jsonl, l).map_err(|e| io_err(&dir, e))?;
                        labels_jsonl.push(b'\n');
                    }
                    let meta = hypotermqa::ScoreMeta { model: c.model.name.clone(), judge: c.judge.name.clone(), semantics: c.semantics };
                    let report = hypotermqa::score(&meta, &hypotermqa::QuestionCounts::from_questions(questions), &labels);
                    md.push_str(&format!("## Benchmark {b}: hypotermqa on `{}`\n\n", dataset.display()));
                    md.push_str(&hypotermqa::render_markdown(&report));
                    md.push('\n');
                    let mut v = serde_json::to_value(&report).map_err(|e| io_err(&dir, e))?;
                    if let Some(o) = v.as_object_mut() {
                        o.insert("benchmark".into(), b.into());
                        o.insert("dataset".into(), dataset.display().to_string().into());
                    }
                    benchmarks.push(v);
                }
            }
        }
    }
    let totals = state.totals()?;
    let dead = dead_letters(state)?;
    md.push_str("## Jobs\n\n| done | completed | dead letters | model calls | cache hits | prompt tokens | completion tokens |\n|---|---|---|---|---|---|---|\n");
    md.push_str(&format!(
        "| {} | {} | {} | {} | {} | {} | {} |\n\n",
        totals.done, totals.completed, totals.dead_letters, totals.model_calls, totals.cache_hits, totals.prompt_tokens, totals.completion_tokens
    ));
    if !dead.is_empty() {
        md.push_str("## Dead letters\n\n| job | stage | model | kind | error |\n|---|---|---|---|---|\n");
        for d in &dead {
            let err = d.error.replace('|', "\\|").replace('\n', " ");
            md.push_str(&format!(
                "| `{}` | {} | {} | {} | {} |\n",
                d.job,
                d.stage.as_deref().unwrap_or("?"),
                d.model.as_deref().unwrap_or("?"),
                d.kind,
                err.chars().take(200).collect::<String>()
            ));
        }
        md.push('\n');
    }
    let report = ReportJson {
        run: RunInfo { id: run, name: &cfg.sweep.name, sweep: cfg.sweep.file.display().to_string() },
        benchmarks,
        jobs: totals,
        dead_letters: dead,
    };
    let json = serde_json::to_vec_pretty(&report).map_err(|e| io_err(&dir, e))?;
    write_atomic(&dir, "labels.jsonl", &labels_jsonl)?;
    write_atomic(&dir, "report.md", md.as_bytes())?;
    write_atomic(&dir, "report.json", &json)?;
    Ok(dir)
}


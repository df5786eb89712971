//! Writing a finished run's report: `report.json`, `report.md`, `labels.jsonl`, and
//! `report.html` (see [`crate::html`]).
//!
//! Files are written to a temporary name and renamed, so a reader never sees half a
//! report. `labels.jsonl` is streamed from the run state to its file (a run may have
//! millions of items); the `noop` pipeline's labels are tallied the same way. The benchmark figures are a pure function of the stored labels; job
//! accounting (calls, cache hits, tokens, latency) sits apart under `jobs`, since a
//! resumed run legitimately differs there from an uninterrupted one.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use halyard_pipelines::hypotermqa;
use halyard_pipelines::noop;
use halyard_proto::Outcome;
use serde::Serialize;
use uuid::Uuid;

use crate::state::{JobTotals, RunState};
use crate::sweep::Benchmark;
use crate::{CoordinatorConfig, CoordinatorError};

#[path = "report_judged.rs"]
mod judged;
#[path = "report_uhgeval_hvi.rs"]
mod uhgeval_hvi;

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
    costs: crate::cost::CostSection,
    dead_letters: Vec<DeadLetter>,
}

pub(crate) fn io_err(dir: &Path, e: impl std::fmt::Display) -> CoordinatorError {
    CoordinatorError::Report { dir: dir.display().to_string(), reason: e.to_string() }
}

pub(crate) fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), CoordinatorError> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut f = std::fs::File::create(&tmp).map_err(|e| io_err(dir, format!("{name}: {e}")))?;
    f.write_all(bytes).and_then(|_| f.sync_all()).map_err(|e| io_err(dir, format!("{name}: {e}")))?;
    std::fs::rename(&tmp, dir.join(name)).map_err(|e| io_err(dir, format!("{name}: {e}")))
}

/// `labels.jsonl`, written to a temporary file as labels are read, renamed at the end.
struct LabelsFile {
    tmp: PathBuf,
    out: BufWriter<std::fs::File>,
    /// Rows written so far.
    lines: u64,
}

impl LabelsFile {
    fn create(dir: &Path) -> Result<LabelsFile, CoordinatorError> {
        let tmp = dir.join(".labels.jsonl.tmp");
        let f = std::fs::File::create(&tmp).map_err(|e| io_err(dir, format!("labels.jsonl: {e}")))?;
        Ok(LabelsFile { tmp, out: BufWriter::new(f), lines: 0 })
    }

    fn row(&mut self, dir: &Path, label: &impl Serialize) -> Result<(), CoordinatorError> {
        serde_json::to_writer(&mut self.out, label).map_err(|e| io_err(dir, e))?;
        self.lines += 1;
        self.out.write_all(b"\n").map_err(|e| io_err(dir, format!("labels.jsonl: {e}")))
    }

    fn finish(self, dir: &Path) -> Result<(), CoordinatorError> {
        let f = self.out.into_inner().map_err(|e| io_err(dir, format!("labels.jsonl: {}", e.error())))?;
        f.sync_all().map_err(|e| io_err(dir, format!("labels.jsonl: {e}")))?;
        std::fs::rename(&self.tmp, dir.join("labels.jsonl")).map_err(|e| io_err(dir, format!("labels.jsonl: {e}")))
    }
}

/// Labels of one (benchmark, model) in dataset order.
fn labels_of<T: serde::de::DeserializeOwned>(state: &RunState, bench: u32, model: u32, dir: &Path) -> Result<Vec<T>, CoordinatorError> {
    let mut out = Vec::new();
    for r in state.labels_of(bench, model) {
        let (k, v) = r?;
        out.push(serde_json::from_slice(&v).map_err(|e| io_err(dir, format!("stored label {k:?}: {e}")))?);
    }
    Ok(out)
}

/// Tally one (benchmark, model) of a noop benchmark, streaming its labels to `labels`.
fn noop_report(
    state: &RunState,
    bench: u32,
    model: u32,
    c: &noop::Config,
    items: u64,
    labels: &mut LabelsFile,
    dir: &Path,
) -> Result<noop::Report, CoordinatorError> {
    let mut tally = noop::Tally::new(&c.model.name, items);
    for r in state.labels_of(bench, model) {
        let (k, v) = r?;
        let l: noop::ItemLabel = serde_json::from_slice(&v).map_err(|e| io_err(dir, format!("stored label {k:?}: {e}")))?;
        tally.add(&l);
        labels.row(dir, &l)?;
    }
    Ok(tally.finish())
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
    let mut labels_jsonl = LabelsFile::create(&dir)?;
    for (b, bench) in cfg.sweep.benchmarks.iter().enumerate() {
        match bench {
            Benchmark::Noop { config, jobs } => {
                for (m, c) in config.iter().enumerate() {
                    let first = labels_jsonl.lines;
                    let report = noop_report(state, b as u32, m as u32, c, *jobs as u64, &mut labels_jsonl, &dir)?;
                    md.push_str(&format!("## Benchmark {b}: noop, {jobs} jobs per model\n\n"));
                    md.push_str(&noop::render_markdown(&report));
                    md.push('\n');
                    let mut v = serde_json::to_value(&report).map_err(|e| io_err(&dir, e))?;
                    if let Some(o) = v.as_object_mut() {
                        o.insert("benchmark".into(), b.into());
                        o.insert("labels_lines".into(), serde_json::json!([first, labels_jsonl.lines]));
                    }
                    benchmarks.push(v);
                }
            }
            Benchmark::AutoHall { config, dataset, claims, dropped, samples } => {
                let mut out = judged::Sink { state, dir: &dir, md: &mut md, benchmarks: &mut benchmarks, labels: &mut labels_jsonl };
                judged::write_autohall(&mut out, b, config, dataset, claims.len() as u64, dropped, *samples)?;
            }
            Benchmark::ChainPoll { config, dataset, skipped, .. } => {
                let mut out = judged::Sink { state, dir: &dir, md: &mut md, benchmarks: &mut benchmarks, labels: &mut labels_jsonl };
                judged::write_chainpoll(&mut out, b, config, dataset, *skipped)?;
            }
            Benchmark::HypoTermQaBuild { config, knowledge_base } => {
                for (m, c) in config.iter().enumerate() {
                    let v = crate::sweep::build::report(state, b, m, c, knowledge_base, &dir, &mut md, |l| labels_jsonl.row(&dir, l))?;
                    benchmarks.push(v);
                }
            }
            Benchmark::HypoTermQa { config, questions, dataset } => {
                for (m, c) in config.iter().enumerate() {
                    let labels = labels_of(state, b as u32, m as u32, &dir)?;
                    let first = labels_jsonl.lines;
                    for l in &labels {
                        labels_jsonl.row(&dir, l)?;
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
                        o.insert("labels_lines".into(), serde_json::json!([first, labels_jsonl.lines]));
                    }
                    benchmarks.push(v);
                }
            }
            other => {
                if let Some(section) = uhgeval_hvi::section(state, b, other, &mut labels_jsonl, &dir)? {
                    md.push_str(&section.markdown);
                    benchmarks.extend(section.json);
                }
            }
        }
    }
    let totals = state.totals()?;
    let dead = dead_letters(state)?;
    let costs = crate::cost::CostSection::new(&cfg.sweep, state.costs()?);
    md.push_str("## Jobs\n\n| done | completed | dead letters | model calls | cache hits | prompt tokens | completion tokens |\n|---|---|---|---|---|---|---|\n");
    md.push_str(&format!(
        "| {} | {} | {} | {} | {} | {} | {} |\n\n",
        totals.done, totals.completed, totals.dead_letters, totals.model_calls, totals.cache_hits, totals.prompt_tokens, totals.completion_tokens
    ));
    md.push_str(&costs.render_markdown());
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
        costs,
        dead_letters: dead,
    };
    let value = serde_json::to_value(&report).map_err(|e| io_err(&dir, e))?;
    let json = serde_json::to_vec_pretty(&value).map_err(|e| io_err(&dir, e))?;
    labels_jsonl.finish(&dir)?;
    write_atomic(&dir, "report.md", md.as_bytes())?;
    write_atomic(&dir, "report.json", &json)?;
    let html = crate::html::render(&value, &dir.join("labels.jsonl")).map_err(|e| io_err(&dir, format!("report.html: {e}")))?;
    write_atomic(&dir, "report.html", html.as_bytes())?;
    Ok(dir)
}


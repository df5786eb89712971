//! Writing a finished run's report: `report.json`, `report.md`, `labels.jsonl`, and
//! `report.html` ([`html`]); and merging finished runs into a leaderboard
//! ([`leaderboard`]).
//!
//! Files are written to a temporary name and renamed, so a reader never sees half a
//! report. `labels.jsonl` is streamed from the run state to its file (a run may have
//! millions of items). Each benchmark writes its own section ([`Section`], through its
//! pipeline's `report`); the figures are a pure function of the stored labels. Job
//! accounting (calls, cache hits, tokens, latency) sits apart under `jobs`, since a
//! resumed run legitimately differs there from an uninterrupted one.

use std::path::PathBuf;

use halyard_plan::report::{io_err, write_atomic, Across, LabelsFile, Section};
use halyard_proto::Outcome;
use serde::Serialize;
use uuid::Uuid;

use crate::state::{JobTotals, RunDb};
use crate::{CoordinatorConfig, CoordinatorError};

pub mod cost_per_correct;
pub mod html;
mod judges_html;
pub mod leaderboard;
pub mod paired_runs;

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

/// Refusals over every process of the run, and the results held aside for jobs the run
/// never planned (left when it completed).
#[derive(Serialize)]
struct IntakeReport {
    refused_messages: u64,
    refused_results: u64,
    held_unplanned: u64,
}

#[derive(Serialize)]
struct ReportJson<'a> {
    run: RunInfo<'a>,
    benchmarks: Vec<serde_json::Value>,
    jobs: JobTotals,
    /// What the run refused of what workers (or anyone) published on its results
    /// subjects (issue 33).
    intake: IntakeReport,
    costs: halyard_plan::cost::CostSection,
    /// USD per answer labelled valid, per HypoTermQA result, with its interval (issue 53).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    cost_per_correct: Vec<cost_per_correct::CostPerCorrect>,
    dead_letters: Vec<DeadLetter>,
    /// Endpoint outages seen during the run (pools paused by their workers).
    outages: Vec<OutageRow>,
    /// RealHall's aggregate over the sweep's ChainPoll datasets, per judge benchmarked on
    /// two or more (issue 29).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    realhall: Vec<halyard_plan::benchmarks::chainpoll::RealHallEntry>,
    /// The judges of every benchmark with a panel or human labels, measured (issue 31).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    judges: Vec<halyard_plan::judging::JudgeReport>,
    /// The managed servers (`backend = "server"`) the answers came from: command,
    /// declared revision and version, identity (issue 35).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    servers: Vec<halyard_plan::sweep::server::ServerRow>,
    /// The models whose judge calls had structured output (issue 45).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    structured_output: Vec<halyard_plan::sweep::StructuredRow>,
}

/// An outage in `report.json`.
#[derive(Serialize)]
struct OutageRow {
    #[serde(flatten)]
    span: halyard_plan::outage::OutageSpan,
    /// Its length in seconds (until the report, if it was still going on).
    down_s: u64,
}

/// The outages table (Markdown; nothing when there were none).
fn outages_markdown(rows: &[OutageRow]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut md = String::from("## Endpoint outages\n\nPools paused by their workers while the endpoint was down (their jobs waited; none was dead-lettered for it).\n\n| pool | reason | down for | error |\n|---|---|---|---|\n");
    for r in rows {
        let open = if r.span.until_ms.is_none() { " (not seen to end)" } else { "" };
        md.push_str(&format!(
            "| {} | {} | {}{open} | {} |\n",
            r.span.pool,
            r.span.reason,
            halyard_plan::outage::duration(r.down_s),
            r.span.error.replace('|', "\\|")
        ));
    }
    md.push('\n');
    md
}

pub fn dead_letters(state: &RunDb) -> Result<Vec<DeadLetter>, CoordinatorError> {
    let mut out = Vec::new();
    for r in state.results() {
        let (job, r) = r?;
        if let Outcome::Failed(f) = &r.outcome {
            let meta = state.job_meta(&job)?;
            out.push(DeadLetter {
                job: job.to_string(),
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

/// What [`write`] wrote: the run directory, and how many dead letters the report lists.
pub struct Written {
    pub dir: PathBuf,
    pub dead_letters: u64,
}

/// Write the report files into the run directory.
pub fn write(
    cfg: &CoordinatorConfig,
    state: &RunDb,
    run: Uuid,
) -> Result<Written, CoordinatorError> {
    let dir = cfg.run_dir.clone();
    let mut benchmarks = Vec::new();
    let mut md = format!(
        "# Halyard run `{}`\n\nRun id `{run}`, sweep `{}`.\n\n",
        cfg.sweep.name,
        cfg.sweep.file.display()
    );
    let mut labels = LabelsFile::create(&dir)?;
    let mut across = Across::default();
    for (b, bench) in cfg.sweep.benchmarks.iter().enumerate() {
        let mut section = Section {
            state,
            bench: b,
            dir: &dir,
            md: &mut md,
            json: &mut benchmarks,
            labels: &mut labels,
            across: &mut across,
        };
        bench.ops().report(&mut section)?;
    }
    let realhall = halyard_plan::benchmarks::chainpoll::realhall(&across.chainpoll);
    md.push_str(&halyard_plan::benchmarks::chainpoll::realhall_markdown(&realhall));
    let totals = state.totals()?;
    let dead = dead_letters(state)?;
    let dead_count = dead.len() as u64;
    let costs = halyard_plan::cost::CostSection::new(
        &cfg.sweep.models,
        cfg.sweep.run.max_cost,
        state.costs()?,
    );
    md.push_str(&jobs_markdown(&totals));
    let i = state.intake()?;
    let intake = IntakeReport {
        refused_messages: i.refused_messages,
        refused_results: i.refused_results,
        held_unplanned: state.held_count()?.results,
    };
    md.push_str(&intake_markdown(&intake));
    md.push_str(&costs.render_markdown());
    let per_correct = {
        let c = serde_json::to_value(&costs).map_err(|e| io_err(&dir, e))?;
        cost_per_correct::rows(
            &benchmarks,
            c["by_model_stage"].as_array().map_or(&[], Vec::as_slice),
        )
    };
    md.push_str(&cost_per_correct::markdown(&per_correct));
    md.push_str(&dead_letters_markdown(&dead));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let outages: Vec<OutageRow> = state
        .outages()?
        .into_iter()
        .map(|span| OutageRow { down_s: span.down_s(now), span })
        .collect();
    md.push_str(&outages_markdown(&outages));
    let servers = halyard_plan::sweep::server::report_rows(&cfg.sweep.models);
    md.push_str(&halyard_plan::sweep::server::report_markdown(&servers));
    let structured_output = halyard_plan::sweep::structured_rows(&cfg.sweep.models);
    md.push_str(&halyard_plan::sweep::structured_markdown(&structured_output));
    let report = ReportJson {
        run: RunInfo {
            id: run,
            name: &cfg.sweep.name,
            sweep: cfg.sweep.file.display().to_string(),
        },
        benchmarks,
        jobs: totals,
        intake,
        costs,
        cost_per_correct: per_correct,
        dead_letters: dead,
        outages,
        realhall,
        judges: across.judges,
        servers,
        structured_output,
    };
    let value = serde_json::to_value(&report).map_err(|e| io_err(&dir, e))?;
    let json = serde_json::to_vec_pretty(&value).map_err(|e| io_err(&dir, e))?;
    labels.finish(&dir)?;
    write_atomic(&dir, "report.md", md.as_bytes())?;
    write_atomic(&dir, "report.json", &json)?;
    let judges = judges_html::section(&value["judges"]);
    let html = html::render(&value, &dir.join("labels.jsonl"), &judges)
        .map_err(|e| io_err(&dir, format!("report.html: {e}")))?;
    write_atomic(&dir, "report.html", html.as_bytes())?;
    Ok(Written { dir, dead_letters: dead_count })
}

/// Write the report of the run in `run_dir` again from its stored state (after `halyard
/// labels import`): the same files a finished run writes. `sweep` is the run's sweep.
pub fn rewrite(
    mut sweep: halyard_plan::sweep::Sweep,
    run_dir: &std::path::Path,
) -> Result<Written, CoordinatorError> {
    let state = RunDb::open_run(run_dir)?;
    halyard_plan::sweep::load_built(&mut sweep, run_dir)?;
    let (meta, _) = state.run_meta(&sweep.name)?;
    let cfg = CoordinatorConfig { sweep, run_dir: run_dir.to_path_buf() };
    write(&cfg, &state, meta.id)
}

/// The job totals table (Markdown).
fn jobs_markdown(totals: &JobTotals) -> String {
    let mut md = String::from("## Jobs\n\n| done | completed | dead letters | model calls | cache hits | prompt tokens | completion tokens |\n|---|---|---|---|---|---|---|\n");
    md.push_str(&format!(
        "| {} | {} | {} | {} | {} | {} | {} |\n\n",
        totals.done,
        totals.completed,
        totals.dead_letters,
        totals.model_calls,
        totals.cache_hits,
        totals.prompt_tokens,
        totals.completion_tokens
    ));
    md
}

/// What the run refused (Markdown; nothing when it refused nothing).
fn intake_markdown(i: &IntakeReport) -> String {
    if i.refused_messages == 0 && i.refused_results == 0 && i.held_unplanned == 0 {
        return String::new();
    }
    format!(
        "## Refused

{} results messages refused (undecodable, another run's, a worker's refusal of a forged job, naming an unusable object, on no pool's subject); {} results refused (from a pool that does not serve their job, or for a job never planned past the bound of results held aside); {} results held aside for jobs the run never planned. None of them is in a figure above.\n\n",
        i.refused_messages, i.refused_results, i.held_unplanned
    )
}

/// The dead letters table (Markdown; nothing when there are none).
fn dead_letters_markdown(dead: &[DeadLetter]) -> String {
    let mut md = String::new();
    if dead.is_empty() {
        return md;
    }
    md.push_str(
        "## Dead letters\n\n| job | stage | model | kind | error |\n|---|---|---|---|---|\n",
    );
    for d in dead {
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
    md
}

//! `halyard check SWEEP.toml` and the check `halyard run` makes first (issue 48).
//!
//! The sweep is validated as `run` validates it; then every model is checked as a worker
//! on this machine would use it: API models (`openai`, `anthropic`, each in its own
//! dialect) with one minimal request each
//! ([`halyard_worker::backend::probe`]: reachable, key accepted, model known, answer
//! shape, latency; the cost of the probe calls at the models' prices), or only their
//! model list with `--no-calls`; `gguf` models by their file, `embed` models by their
//! folder, `server` models by their command's program. A table goes to stdout; the exit
//! status is [`EXIT_CANNOT_SERVE`] when any model cannot serve.
//!
//! `halyard run` makes the free part of the same check ([`preflight`]: key variables set,
//! `GET /models`) before anything starts, unless `--no-check`: the chat completion is
//! left to the run, so that running the same command again costs nothing more (one is
//! made only when the server lists its models and not the sweep's). Whatever
//! the check cannot see the coordinator's first-contact rule catches (`[run]
//! first_contact_s`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use halyard_node::coordinator::EXIT_CANNOT_SERVE;
use halyard_plan::sweep::{Model, Sweep};
use halyard_worker::backend::probe::{self, Dialect, Target};

#[derive(Args)]
pub struct CheckArgs {
    /// The sweep file (TOML).
    pub sweep: PathBuf,
    /// Make no chat completion: reachability, keys and the servers' model lists only
    /// (free on every provider).
    #[arg(long)]
    pub no_calls: bool,
    /// As for `run`: allow http:// model URLs on hosts that are not loopback.
    #[arg(long)]
    pub allow_insecure_http: bool,
}

/// One row of the table.
struct Row {
    model: String,
    endpoint: String,
    cells: [String; 5],
    cost: Option<f64>,
    problem: Option<String>,
    notes: Vec<String>,
}

/// `halyard check`: print the table; the exit status.
pub async fn run(a: CheckArgs) -> anyhow::Result<u8> {
    let sweep = halyard_node::load_sweep(&a.sweep, None)?;
    let (rows, calls, cost) = check(&sweep, !a.no_calls, a.allow_insecure_http).await?;
    print!("{}", table(&rows));
    if a.no_calls {
        println!("\nno chat completion made (--no-calls): model lists only");
    } else {
        println!(
            "\nprobe calls: {calls} chat completion(s) of at most {} tokens; cost {}",
            probe::PROBE_MAX_TOKENS,
            cost.map_or("unknown (no `price` in the sweep)".into(), |c| format!("${c:.6}"))
        );
    }
    let mut failed = 0;
    for r in &rows {
        for n in &r.notes {
            println!("note: {}: {n}", r.model);
        }
        if let Some(p) = &r.problem {
            failed += 1;
            eprintln!("error: model {:?}: {p}", r.model);
        }
    }
    if failed > 0 {
        eprintln!("{failed} model(s) of {} cannot serve", sweep.file.display());
        return Ok(EXIT_CANNOT_SERVE);
    }
    println!("every model of {} can serve", sweep.file.display());
    Ok(0)
}

/// `halyard run`'s check before anything starts (see the module docs): None when every
/// API model passes, else the message (the caller exits with [`EXIT_CANNOT_SERVE`]).
pub async fn preflight(sweep: &Sweep, insecure: bool) -> anyhow::Result<Option<String>> {
    let targets = targets(sweep, insecure);
    if targets.is_empty() {
        // No API model: no HTTP client (building one loads the system's root certificates,
        // a measurable share of a short run's start).
        return Ok(None);
    }
    let client = probe::client().map_err(anyhow::Error::msg)?;
    let mut problems = Vec::new();
    for (t, names) in targets {
        let mut r = probe::probe(&client, &t, false).await;
        // The server lists its models and not this one: only a call tells whether it
        // answers under this name anyway (llama.cpp's server does).
        if r.ok() && r.listed.is_some() && r.model_known != probe::Check::Yes {
            r = probe::probe(&client, &t, true).await;
        }
        if let Some((_, p)) = r.problem {
            problems.push(format!(
                "model {} (`{}` at {}): {p}",
                names.join(", "),
                t.model,
                url(&t)
            ));
        }
    }
    if problems.is_empty() {
        return Ok(None);
    }
    problems.push(
        "nothing was started: fix it and run the same command again (`halyard check SWEEP` \
         tests each model; --no-check skips this check)"
            .into(),
    );
    Ok(Some(problems.join("\n")))
}

/// `base_url`, API model name and key variable: one probe each.
type EndpointKey = (String, String, Option<String>);

/// The API models of `sweep`, one target per distinct endpoint, model and key variable,
/// with the sweep's names for it.
fn targets(sweep: &Sweep, insecure: bool) -> Vec<(Target, Vec<String>)> {
    let mut by: BTreeMap<EndpointKey, (Target, Vec<String>)> = BTreeMap::new();
    for m in sweep.models.iter().filter(|m| is_api(m)) {
        let s = &m.spec;
        let key = (s.model_ref.endpoint.clone(), s.model_ref.model.clone(), s.api_key_env.clone());
        let e = by.entry(key).or_insert_with(|| {
            let t = Target {
                name: s.name.clone(),
                base_url: s.model_ref.endpoint.clone(),
                model: s.model_ref.model.clone(),
                api_key_env: s.api_key_env.clone(),
                timeout: Duration::from_millis(s.timeout_ms.max(1000)),
                allow_insecure_http: insecure,
                dialect: Dialect::of_backend(&s.model_ref.backend).unwrap_or(Dialect::OpenAi),
            };
            (t, Vec::new())
        });
        e.1.push(format!("{:?}", s.name));
    }
    by.into_values().collect()
}

fn is_api(m: &Model) -> bool {
    Dialect::of_backend(&m.spec.model_ref.backend).is_some()
}

fn url(t: &Target) -> String {
    halyard_proto::redact::url(t.base_url.trim_end_matches('/'))
}

/// Check every model of `sweep`, API models with a chat completion when `calls`: the
/// rows and the chat completions made.
async fn check(
    sweep: &Sweep,
    calls: bool,
    insecure: bool,
) -> anyhow::Result<(Vec<Row>, usize, Option<f64>)> {
    let client = probe::client().map_err(anyhow::Error::msg)?;
    let mut probed = BTreeMap::new();
    for (t, _) in targets(sweep, insecure) {
        let r = probe::probe(&client, &t, calls).await;
        probed.insert((t.base_url.clone(), t.model.clone(), t.api_key_env.clone()), r);
    }
    let made = probed.values().filter(|r| r.latency.is_some()).count();
    let mut rows = Vec::new();
    // Each probe's cost once (models sharing an endpoint share its probe).
    let mut costed = std::collections::BTreeSet::new();
    let mut total: Option<f64> = None;
    for m in &sweep.models {
        let s = &m.spec;
        let key = (s.model_ref.endpoint.clone(), s.model_ref.model.clone(), s.api_key_env.clone());
        let Some(r) = probed.get(&key).filter(|_| is_api(m)) else {
            rows.push(local_row(m));
            continue;
        };
        let cost = r
            .usage
            .as_ref()
            // At the listed input and output prices (a probe reads and writes no cache).
            .and_then(|u| {
                m.price.as_ref().map(|p| {
                    (u.prompt_tokens as f64 * p.input + u.completion_tokens as f64 * p.output) / 1e6
                })
            });
        if let Some(c) = cost.filter(|_| costed.insert(key.clone())) {
            *total.get_or_insert(0.0) += c;
        }
        rows.push(Row {
            model: s.name.clone(),
            endpoint: format!(
                "{} ({})",
                halyard_proto::redact::url(s.model_ref.endpoint.trim_end_matches('/')),
                s.model_ref.model
            ),
            cells: [
                r.reachable.as_str().into(),
                r.key_accepted.as_str().into(),
                r.model_known.as_str().into(),
                r.answer_shape.as_str().into(),
                r.latency.map_or("-".into(), |l| format!("{} ms", l.as_millis())),
            ],
            cost,
            problem: r.problem.as_ref().map(|(_, p)| p.clone()),
            notes: r.notes.clone(),
        });
    }
    Ok((rows, made, total))
}

/// A model run on the worker's machine: its file, folder or program.
fn local_row(m: &Model) -> Row {
    let s = &m.spec;
    let (endpoint, problem) = if let Some(g) = &m.local {
        (format!("gguf file {}", g.path.display()), file_problem(&g.path, "the GGUF file"))
    } else if let Some(e) = &m.embed {
        (format!("embed folder {}", e.display()), file_problem(e, "the model folder"))
    } else if let Some(sv) = &m.server {
        let program = sv.command.first().cloned().unwrap_or_default();
        (format!("server command {program}"), program_problem(&program))
    } else {
        (format!("{} backend (no endpoint)", s.model_ref.backend), None)
    };
    let ok = if problem.is_some() { "NO" } else { "yes" };
    Row {
        model: s.name.clone(),
        endpoint,
        cells: [ok.into(), "-".into(), "-".into(), "-".into(), "-".into()],
        cost: None,
        problem,
        notes: Vec::new(),
    }
}

fn file_problem(p: &Path, what: &str) -> Option<String> {
    match std::fs::metadata(p) {
        Ok(_) => None,
        Err(e) => Some(format!("{what} {} cannot be read on this machine: {e}", p.display())),
    }
}

/// Whether `program` (a path, or a name looked up on `PATH`) exists here.
fn program_problem(program: &str) -> Option<String> {
    if program.is_empty() {
        return Some("the server's command is empty".into());
    }
    let p = Path::new(program);
    let found = if p.components().count() > 1 {
        p.is_file()
    } else {
        std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(p).is_file()))
    };
    (!found).then(|| format!("the server's program {program:?} is not found on this machine"))
}

/// The table, columns padded to their widest cell.
fn table(rows: &[Row]) -> String {
    let head = [
        "model",
        "endpoint",
        "reachable",
        "key accepted",
        "model known",
        "answer shape",
        "latency",
        "probe cost",
    ];
    let lines: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut l = vec![r.model.clone(), r.endpoint.clone()];
            l.extend(r.cells.iter().cloned());
            l.push(r.cost.map_or("-".into(), |c| format!("${c:.6}")));
            l
        })
        .collect();
    let mut width: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for l in &lines {
        for (w, c) in width.iter_mut().zip(l) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[String]| {
        let padded: Vec<String> =
            cells.iter().zip(&width).map(|(c, w)| format!("{c:<w$}")).collect();
        out.push_str(padded.join("  ").trim_end());
        out.push('\n');
    };
    line(&head.map(String::from));
    for l in &lines {
        line(l);
    }
    out
}

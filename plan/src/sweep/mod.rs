//! The sweep file: parsed into raw serde structs (unknown keys rejected), then checked
//! into a [`Sweep`] that refers only to known pipelines and models and whose datasets
//! have been read. Every error names the file, the key and what was expected.
//!
//! - [`models`]: `[[model]]` (backends, pools, sampling, limits), with [`backends`] (one
//!   row per backend: its keys and checks), [`price`], [`quota`] and [`replay`];
//! - `[[benchmark]]`: each pipeline checks its own table (see [`crate::benchmarks`]);
//! - `run`: the `[run]` table.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use halyard_pipelines::hypotermqa;
use serde::Deserialize;

use crate::benchmarks::hypotermqa::HypoTermQa;

pub mod anthropic;
pub mod backends;
pub mod batch_mode;
pub mod error;
pub mod identity;
pub mod models;
pub mod pools;
pub mod price;
pub mod quota;
pub mod replay;
pub mod run;
pub mod server;
#[cfg(test)]
mod tests;

pub use crate::benchmarks::build::BuiltInput;
pub use crate::benchmarks::noop::MAX_NOOP_JOBS;
pub use crate::benchmarks::Benchmark;
pub use error::{key_err, SweepError};
pub use identity::{check_identity, gguf_identity};
pub use models::{placement, structured_markdown, structured_rows, Model, StructuredRow};
pub use quota::{check_quota, QuotaSpec, RawQuota};
pub use run::{
    JobBatch, RunSettings, AUTO_BATCH_SPAN, AUTO_MAX_JOB_BATCH, DEFAULT_WINDOW, MAX_JOB_BATCH,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSweep {
    name: String,
    #[serde(default)]
    model: Vec<models::RawModel>,
    #[serde(default)]
    benchmark: Vec<toml::Table>,
    #[serde(default)]
    run: Option<run::RawRun>,
}

#[derive(Clone, Debug)]
pub struct Sweep {
    pub file: PathBuf,
    pub name: String,
    pub models: Vec<Model>,
    pub benchmarks: Vec<Benchmark>,
    pub run: RunSettings,
    /// Quotas of the pools that have one.
    pub quotas: BTreeMap<String, QuotaSpec>,
    /// Evaluation benchmarks that read a dataset built in this run (`dataset_from`).
    pub built_inputs: Vec<BuiltInput>,
}

impl Sweep {
    /// Pools and the concurrency each needs (the largest `max_concurrency` of its models).
    pub fn pools(&self) -> BTreeMap<String, usize> {
        let mut pools = BTreeMap::new();
        for m in &self.models {
            let e = pools.entry(m.spec.pool.clone()).or_insert(0);
            *e = (*e).max(m.max_concurrency);
        }
        pools
    }

    /// Pools whose every model runs locally or calls nothing (the backends that
    /// [`backends::BACKENDS`] marks `local`: `noop`, `gguf`, `embed`, `replay`): no paid
    /// call behind any of their jobs. `job_batch = "auto"` batches only these.
    pub fn local_pools(&self) -> BTreeSet<String> {
        let mut paid = BTreeSet::new();
        let mut all = BTreeSet::new();
        for m in &self.models {
            all.insert(m.spec.pool.clone());
            if !backends::row(&m.spec.model_ref.backend).is_some_and(|r| r.local) {
                paid.insert(m.spec.pool.clone());
            }
        }
        all.difference(&paid).cloned().collect()
    }
}

/// Read and check a sweep file, including its datasets.
pub fn load(path: &Path) -> Result<Sweep, SweepError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| SweepError::Read { file: file.clone(), reason: e.to_string() })?;
    parse(path, &text)
}

/// Check a sweep given as text; relative dataset paths resolve against `path`'s folder.
/// In order: the run name, the models, the benchmarks, `[run]`, the pools' quotas.
pub fn parse(path: &Path, text: &str) -> Result<Sweep, SweepError> {
    parse_with(path, text, true)
}

/// What a worker needs of a sweep file: its models, pools, quotas and `[run]` delivery
/// settings, checked as [`load`] checks them, but not its benchmarks: no dataset is read,
/// so a GPU node or an API worker needs only the sweep file (and its local models). The
/// returned sweep has no benchmarks.
pub fn load_pools(path: &Path) -> Result<Sweep, SweepError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| SweepError::Read { file: file.clone(), reason: e.to_string() })?;
    parse_with(path, &text, false)
}

fn parse_with(path: &Path, text: &str, benchmarks: bool) -> Result<Sweep, SweepError> {
    let file = path.display().to_string();
    let raw: RawSweep = toml::from_str(text)
        .map_err(|e| SweepError::Syntax { file: file.clone(), reason: e.to_string() })?;
    let f = file.as_str();
    check_name(f, &raw.name)?;
    let base = path.parent().unwrap_or(Path::new("."));
    let models = models::check_all(f, base, &raw.model)?;
    let (benchmarks, built_inputs) = if benchmarks {
        crate::benchmarks::check_all(f, base, &raw.benchmark, &models)?
    } else {
        Default::default()
    };
    let run = run::check(f, raw.run)?;
    let quotas = pools::pool_quotas(f, &models)?;
    pools::check_pools(f, &models)?;
    Ok(Sweep {
        file: path.to_path_buf(),
        name: raw.name,
        quotas,
        models,
        benchmarks,
        run,
        built_inputs,
    })
}

/// The run name names a directory: letters, digits, `-`, `_`, `.`, not starting with `.`.
fn check_name(f: &str, name: &str) -> Result<(), SweepError> {
    if name.is_empty()
        || name.starts_with('.')
        || !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(key_err(
            f,
            "name",
            format!("{name:?} is not a valid run name (letters, digits, '-', '_', '.')"),
        ));
    }
    Ok(())
}

/// After the build phase: read each built dataset with the evaluation pipeline's reader
/// into the benchmark that waits for it.
pub fn load_built(sweep: &mut Sweep, run_dir: &Path) -> Result<(), SweepError> {
    let file = sweep.file.display().to_string();
    for input in std::mem::take(&mut sweep.built_inputs) {
        let path: PathBuf = run_dir.join(crate::benchmarks::build::output_file(input.build));
        let key = format!("benchmark[{}].dataset_from", input.eval);
        let mut qs = hypotermqa::read_dataset(&path).map_err(|e| SweepError::Dataset {
            file: file.clone(),
            key: key.clone(),
            dataset: path.display().to_string(),
            reason: e.to_string(),
        })?;
        if let Some(l) = input.limit {
            qs.truncate(l);
        }
        if qs.is_empty() {
            return Err(key_err(
                &file,
                key,
                format!("the build wrote no questions to {}", path.display()),
            ));
        }
        if let Some(eval) = sweep.benchmarks[input.eval].get_mut::<HypoTermQa>() {
            eval.questions = qs;
            eval.dataset = path;
        }
    }
    Ok(())
}

//! The `hypotermqa-build` pipeline in a sweep: its `[benchmark.build]` table, embedding
//! models (`backend = "embed"`), evaluation benchmarks that read a built dataset
//! (`dataset_from`), and running a sweep in two phases when one does.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use halyard_embed::index::Metric;
use halyard_pipelines::hypotermqa;
use halyard_pipelines::hypotermqa_build::kb::{ExistenceCheck, Kb, KbTitles, KnownPhrases};
use halyard_pipelines::hypotermqa_build::{self as build, Topics};
use serde::Deserialize;

use super::{Benchmark, Model, RawBenchmark, Sweep, SweepError};

/// `[benchmark.build]` of a `pipeline = "hypotermqa-build"` benchmark.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBuild {
    /// The embedding model (a `[[model]]` with `backend = "embed"`).
    embedder: String,
    /// JSONL of `{title, text}`.
    knowledge_base: String,
    /// Topic names, or how many topics the generator should propose.
    topics: Option<Vec<String>>,
    generate_topics: Option<i64>,
    terms_per_topic: Option<i64>,
    term_temperature: Option<f64>,
    suggestions: Option<i64>,
    top_k: Option<i64>,
    metric: Option<String>,
    embed_batch: Option<i64>,
    /// Optional file of known phrases (one per line): terms in it are not hypothetical.
    known_phrases: Option<String>,
}

/// The file a build benchmark writes into the run directory.
pub fn output_file(bench: usize) -> String {
    format!("built-{bench}.jsonl")
}

fn key_err(file: &str, key: String, reason: impl Into<String>) -> SweepError {
    SweepError::Key { file: file.to_string(), key, reason: reason.into() }
}

/// A location-independent identity of an embedding-model folder: name, the size of its
/// weights and a hash of its config and tokenizer.
pub fn embed_identity(dir: &Path) -> std::io::Result<String> {
    let weights = std::fs::metadata(dir.join("model.safetensors"))?.len();
    let mut h = blake3::Hasher::new();
    h.update(&std::fs::read(dir.join("config.json"))?);
    h.update(&std::fs::read(dir.join("tokenizer.json"))?);
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let hex: String = h.finalize().as_bytes()[..8].iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("embed:{name}:{weights}:{hex}"))
}

/// Check `pipeline = "hypotermqa-build"`.
pub(super) fn build_benchmark(f: &str, i: usize, b: &RawBenchmark, models: &[Model], base: &Path) -> Result<Benchmark, SweepError> {
    let k = |field: &str| format!("benchmark[{i}].{field}");
    super::judged::reject_foreign_keys(f, i, b, "hypotermqa-build")?;
    let find = |key: String, name: &str| -> Result<&Model, SweepError> {
        models.iter().find(|m| m.spec.name == name).ok_or_else(|| {
            let known: Vec<&str> = models.iter().map(|m| m.spec.name.as_str()).collect();
            key_err(f, key, format!("unknown model {name:?} (models in this sweep: {})", known.join(", ")))
        })
    };
    let [generator] = b.models.as_slice() else {
        return Err(key_err(f, k("models"), "needs exactly one model: the generator"));
    };
    let generator = find(format!("benchmark[{i}].models[0]"), generator)?.spec.clone();
    if generator.model_ref.backend == "embed" {
        return Err(key_err(f, format!("benchmark[{i}].models[0]"), "the generator must be a chat model, not backend \"embed\""));
    }
    let raw = b.build.as_ref().ok_or_else(|| key_err(f, k("build"), "required for pipeline \"hypotermqa-build\" ([benchmark.build])"))?;
    let kb_key = || k("build.knowledge_base");
    let embedder = find(k("build.embedder"), &raw.embedder)?;
    if embedder.spec.model_ref.backend != "embed" {
        return Err(key_err(f, k("build.embedder"), format!("model {:?} must have backend \"embed\"", raw.embedder)));
    }
    let kb_path = base.join(&raw.knowledge_base);
    let kb = Arc::new(Kb::read(&kb_path).map_err(|e| key_err(f, kb_key(), e.to_string()))?);
    let int = |v: Option<i64>, key: &str, lo: i64, hi: i64, default: i64| -> Result<usize, SweepError> {
        let x = v.unwrap_or(default);
        if (lo..=hi).contains(&x) {
            Ok(x as usize)
        } else {
            Err(key_err(f, k(&format!("build.{key}")), format!("{x} is outside {lo}..={hi}")))
        }
    };
    let topics = match (&raw.topics, raw.generate_topics) {
        (Some(t), None) => {
            if t.is_empty() || t.iter().any(|x| x.trim().is_empty()) {
                return Err(key_err(f, k("build.topics"), "needs at least one topic, none empty"));
            }
            Topics::Given(t.clone())
        }
        (None, Some(n)) => Topics::Generate(int(Some(n), "generate_topics", 1, 10_000, 1)?),
        _ => return Err(key_err(f, k("build.topics"), "give either `topics = [...]` or `generate_topics = N`")),
    };
    let term_temperature = raw.term_temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&term_temperature) {
        return Err(key_err(f, k("build.term_temperature"), format!("{term_temperature} is outside 0..=2")));
    }
    let metric = match raw.metric.as_deref().unwrap_or("cosine") {
        "cosine" => Metric::Cosine,
        "l2" => Metric::L2,
        other => return Err(key_err(f, k("build.metric"), format!("{other:?} is not \"cosine\" or \"l2\""))),
    };
    let mut checks: Vec<Arc<dyn ExistenceCheck>> = vec![Arc::new(KbTitles(kb.clone()))];
    if let Some(p) = &raw.known_phrases {
        let path = base.join(p);
        checks.push(Arc::new(KnownPhrases::read(&path).map_err(|e| key_err(f, k("build.known_phrases"), e.to_string()))?));
    }
    let config = build::Config {
        generator,
        term_temperature: term_temperature as f32,
        embedder: embedder.spec.clone(),
        topics,
        terms_per_topic: int(raw.terms_per_topic, "terms_per_topic", 1, 100, 6)?,
        suggestions: int(raw.suggestions, "suggestions", 2, 50, 5)?,
        top_k: int(raw.top_k, "top_k", 2, 1000, 5)?,
        metric,
        embed_batch: int(raw.embed_batch, "embed_batch", 1, 1024, 64)?,
        kb,
        checks,
    };
    Ok(Benchmark::HypoTermQaBuild { config: vec![config], knowledge_base: kb_path })
}

/// A build waiting to feed an evaluation benchmark.
#[derive(Clone, Debug)]
pub struct BuiltInput {
    /// The evaluation benchmark (its questions are read once the build is done).
    pub eval: usize,
    /// The build benchmark.
    pub build: usize,
    pub limit: Option<usize>,
}

/// Check `dataset_from = N` of benchmark `i`: N is an earlier `hypotermqa-build`.
pub fn dataset_from(f: &str, i: usize, from: i64, benchmarks: &[Benchmark]) -> Result<usize, SweepError> {
    let key = format!("benchmark[{i}].dataset_from");
    match usize::try_from(from).ok().and_then(|n| benchmarks.get(n).map(|b| (n, b))) {
        Some((n, Benchmark::HypoTermQaBuild { .. })) => Ok(n),
        _ => Err(key_err(f, key, format!("{from} is not the index of an earlier [[benchmark]] with pipeline \"hypotermqa-build\""))),
    }
}

/// After the build phase: read each built dataset with the evaluation pipeline's reader
/// into the benchmark that waits for it.
pub fn load_built(sweep: &mut Sweep, run_dir: &Path) -> Result<(), SweepError> {
    let file = sweep.file.display().to_string();
    for input in std::mem::take(&mut sweep.built_inputs) {
        let path: PathBuf = run_dir.join(output_file(input.build));
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
            return Err(key_err(&file, key, format!("the build wrote no questions to {}", path.display())));
        }
        if let Benchmark::HypoTermQa { questions, dataset, .. } = &mut sweep.benchmarks[input.eval] {
            *questions = qs;
            *dataset = path;
        }
    }
    Ok(())
}

/// The sweep's embedding models, for the worker.
pub fn embed_models(s: &Sweep) -> Vec<(String, PathBuf)> {
    s.models.iter().filter_map(|m| m.embed.as_ref().map(|p| (m.spec.model_ref.endpoint.clone(), p.clone()))).collect()
}

/// Report one build benchmark: stream its labels to `labels.jsonl` (through `row`),
/// assemble the dataset, write it to the run directory (`built-<b>.jsonl`), add its
/// Markdown section to `md`, and return its `report.json` entry.
#[allow(clippy::too_many_arguments)]
pub(crate) fn report(
    state: &crate::state::RunState,
    b: usize,
    m: usize,
    c: &build::Config,
    knowledge_base: &Path,
    dir: &Path,
    md: &mut String,
    mut row: impl FnMut(&build::TopicLabel) -> Result<(), crate::CoordinatorError>,
) -> Result<serde_json::Value, crate::CoordinatorError> {
    use crate::report::io_err;
    let mut labels = Vec::new();
    for r in state.labels_of(b as u32, m as u32) {
        let (k, v) = r?;
        let l: build::TopicLabel = serde_json::from_slice(&v).map_err(|e| io_err(dir, format!("stored label {k:?}: {e}")))?;
        row(&l)?;
        labels.push(l);
    }
    let built = build::output::assemble(&labels, &c.kb);
    let name = output_file(b);
    let mut body = built.lines.join("\n");
    if !body.is_empty() {
        body.push('\n');
    }
    crate::report::write_atomic(dir, &name, body.as_bytes())?;
    md.push_str(&format!(
        "## Benchmark {b}: hypotermqa-build with `{}` (knowledge base `{}`, {} titles)\n\n",
        c.generator.name,
        knowledge_base.display(),
        c.kb.len()
    ));
    md.push_str(&build::output::render_markdown(&built, &name));
    md.push('\n');
    let mut v = serde_json::to_value(&built).map_err(|e| io_err(dir, e))?;
    if let Some(o) = v.as_object_mut() {
        o.insert("benchmark".into(), b.into());
        o.insert("pipeline".into(), build::PIPELINE.into());
        o.insert("generator".into(), c.generator.name.clone().into());
        o.insert("embedder".into(), c.embedder.name.clone().into());
        o.insert("knowledge_base".into(), knowledge_base.display().to_string().into());
        o.insert("dataset".into(), dir.join(&name).display().to_string().into());
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::super::parse;
    use super::*;

    const BASE: &str = r#"name = "b"
[[model]]
name = "gen"
backend = "openai"
base_url = "http://127.0.0.1:1/v1"
model = "g"
[[model]]
name = "minilm"
backend = "embed"
model_path = "emb"
"#;

    fn setup() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let emb = dir.path().join("emb");
        std::fs::create_dir(&emb).unwrap();
        for f in ["config.json", "tokenizer.json", "model.safetensors"] {
            std::fs::write(emb.join(f), f).unwrap();
        }
        std::fs::write(dir.path().join("kb.jsonl"), "{\"title\":\"Loom\",\"text\":\"A device.\"}\n").unwrap();
        dir
    }

    fn sweep(dir: &Path, rest: &str) -> Result<Sweep, SweepError> {
        parse(&dir.join("s.toml"), &format!("{BASE}{rest}"))
    }

    const BUILD: &str = "[[benchmark]]\npipeline = \"hypotermqa-build\"\nmodels = [\"gen\"]\n[benchmark.build]\nembedder = \"minilm\"\nknowledge_base = \"kb.jsonl\"\n";

    /// A build benchmark and an evaluation of its output: defaults, pools, identity.
    #[test]
    fn build_and_dataset_from() {
        let d = setup();
        let s = sweep(d.path(), &format!("{BUILD}topics = [\"A\", \"B\"]\n[[benchmark]]\npipeline = \"hypotermqa\"\ndataset_from = 0\nmodels = [\"gen\"]\njudge = \"gen\"\nlimit = 3\n")).unwrap();
        assert_eq!(s.benchmarks[0].item_count(), 2);
        assert_eq!(s.benchmarks[0].pipeline(), "hypotermqa-build");
        assert_eq!(s.benchmarks[1].item_count(), 0);
        assert_eq!(s.built_inputs.len(), 1);
        assert_eq!((s.built_inputs[0].eval, s.built_inputs[0].build, s.built_inputs[0].limit), (1, 0, Some(3)));
        let m = &s.models[1];
        assert_eq!(m.spec.pool, "embed/minilm");
        assert_eq!(m.max_concurrency, 1);
        assert!(m.spec.model_ref.endpoint.starts_with("embed:emb:17:"), "{}", m.spec.model_ref.endpoint);
        assert_eq!(embed_models(&s).len(), 1);
        let Benchmark::HypoTermQaBuild { config, .. } = &s.benchmarks[0] else { panic!() };
        let c = &config[0];
        assert_eq!((c.terms_per_topic, c.suggestions, c.top_k, c.embed_batch, c.term_temperature), (6, 5, 5, 64, 1.0));
        assert_eq!(c.checks.len(), 1);
    }

    /// Bad build settings name the key.
    #[test]
    fn errors_name_the_key() {
        let d = setup();
        let err = |rest: &str| sweep(d.path(), rest).unwrap_err().to_string();
        let e = err(BUILD);
        assert!(e.contains("benchmark[0].build.topics") && e.contains("generate_topics"), "{e}");
        let e = err(&format!("{BUILD}topics = [\"A\"]\ngenerate_topics = 3\n"));
        assert!(e.contains("benchmark[0].build.topics"), "{e}");
        let e = err(&BUILD.replace("embedder = \"minilm\"", "embedder = \"gen\"").replace("kb.jsonl\"", "kb.jsonl\"\ntopics = [\"A\"]"));
        assert!(e.contains("benchmark[0].build.embedder") && e.contains("backend \"embed\""), "{e}");
        std::fs::write(d.path().join("bad.jsonl"), "{\"title\":\"A\",\"text\":\"x\"}\n{\"title\":\"\",\"text\":\"y\"}\n").unwrap();
        let e = err(&format!("{}topics = [\"A\"]\n", BUILD.replace("kb.jsonl", "bad.jsonl")));
        assert!(e.contains("benchmark[0].build.knowledge_base") && e.contains("bad.jsonl:2: field `title`: is empty"), "{e}");
        let e = err(&format!("{BUILD}topics = [\"A\"]\nterms_per_topic = 0\n"));
        assert!(e.contains("benchmark[0].build.terms_per_topic") && e.contains("outside"), "{e}");
        let e = err(&format!("{BUILD}topics = [\"A\"]\nmetric = \"dot\"\n"));
        assert!(e.contains("benchmark[0].build.metric"), "{e}");
        let e = err(&format!("{BUILD}topics = [\"A\"]\nunknown_key = 1\n"));
        assert!(e.contains("unknown_key"), "{e}");
        let e = err("[[benchmark]]\npipeline = \"hypotermqa\"\ndataset_from = 0\nmodels = [\"gen\"]\njudge = \"gen\"\n");
        assert!(e.contains("benchmark[0].dataset_from"), "{e}");
        let e = err(&format!("{BUILD}topics = [\"A\"]\njudge = \"gen\"\n").replace("[benchmark.build]\n", "judge = \"gen\"\n[benchmark.build]\n").replace("topics = [\"A\"]\njudge = \"gen\"\n", "topics = [\"A\"]\n"));
        assert!(e.contains("benchmark[0].judge") && e.contains("hypotermqa-build"), "{e}");
        let e = err("[[model]]\nname = \"x\"\nbackend = \"embed\"\nmodel_path = \"nowhere\"\n[[benchmark]]\npipeline = \"noop\"\nmodels = [\"x\"]\njobs = 1\n");
        assert!(e.contains("model[2].model_path") && e.contains("fetch-embedder.sh"), "{e}");
    }
}

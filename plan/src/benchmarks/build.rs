//! `pipeline = "hypotermqa-build"`: its `[benchmark.build]` table, embedding models
//! (`backend = "embed"`), evaluation benchmarks that read a built dataset
//! (`dataset_from`), and running a sweep in two phases when one does.

use std::path::PathBuf;
use std::sync::Arc;

use halyard_embed::index::Metric;
use halyard_pipelines::common::{ModelSpec, ResultLookup};
use halyard_pipelines::hypotermqa_build::kb::{ExistenceCheck, Kb, KbTitles, KnownPhrases};
use halyard_pipelines::hypotermqa_build::{self as build, Topics};
use serde::Deserialize;

use super::table::{model_named, parse};
use super::{encoded, Benchmark, Checking, Evaluation, Pipeline};
use crate::report::Section;
use crate::sweep::error::{key_err, SweepError};
use crate::PlanError;

/// `pipeline = "hypotermqa-build"`: its table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Table {
    models: Vec<String>,
    /// `[benchmark.build]`.
    build: Option<RawBuild>,
}

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

/// Builds a HypoTermQA dataset: one item per topic, one generator.
#[derive(Clone, Debug)]
pub struct HypoTermQaBuild {
    pub config: Vec<build::Config>,
    pub knowledge_base: PathBuf,
}

/// The file a build benchmark writes into the run directory.
pub fn output_file(bench: usize) -> String {
    format!("built-{bench}.jsonl")
}

/// Check `pipeline = "hypotermqa-build"`: one generator (a chat model) and the
/// `[benchmark.build]` table.
pub(super) fn check(cx: &mut Checking<'_>, raw: &toml::Table) -> Result<Benchmark, SweepError> {
    let table: Table = parse(cx, raw, build::PIPELINE)?;
    let b = &table;
    let (f, i, models) = (cx.file, cx.index, cx.models);
    let k = |field: &str| format!("benchmark[{i}].{field}");
    let [generator] = b.models.as_slice() else {
        return Err(key_err(f, k("models"), "needs exactly one model: the generator"));
    };
    let generator =
        model_named(f, format!("benchmark[{i}].models[0]"), generator, models)?.spec.clone();
    if generator.model_ref.backend == "embed" {
        return Err(key_err(
            f,
            format!("benchmark[{i}].models[0]"),
            "the generator must be a chat model, not backend \"embed\"",
        ));
    }
    let raw = b.build.as_ref().ok_or_else(|| {
        key_err(f, k("build"), "required for pipeline \"hypotermqa-build\" ([benchmark.build])")
    })?;
    let embedder = model_named(f, k("build.embedder"), &raw.embedder, models)?;
    if embedder.spec.model_ref.backend != "embed" {
        return Err(key_err(
            f,
            k("build.embedder"),
            format!("model {:?} must have backend \"embed\"", raw.embedder),
        ));
    }
    let kb_path = cx.base.join(&raw.knowledge_base);
    let kb = Arc::new(
        Kb::read(&kb_path).map_err(|e| key_err(f, k("build.knowledge_base"), e.to_string()))?,
    );
    let config = settings(cx, raw, generator, embedder.spec.clone(), kb)?;
    Ok(Benchmark::new(HypoTermQaBuild { config: vec![config], knowledge_base: kb_path }))
}

/// The rest of `[benchmark.build]`: topics, sampling, similarity and existence checks.
fn settings(
    cx: &Checking<'_>,
    raw: &RawBuild,
    generator: ModelSpec,
    embedder: ModelSpec,
    kb: Arc<Kb>,
) -> Result<build::Config, SweepError> {
    let (f, i) = (cx.file, cx.index);
    let k = |field: &str| format!("benchmark[{i}].{field}");
    let int =
        |v: Option<i64>, key: &str, lo: i64, hi: i64, default: i64| -> Result<usize, SweepError> {
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
        _ => {
            return Err(key_err(
                f,
                k("build.topics"),
                "give either `topics = [...]` or `generate_topics = N`",
            ))
        }
    };
    let term_temperature = raw.term_temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&term_temperature) {
        return Err(key_err(
            f,
            k("build.term_temperature"),
            format!("{term_temperature} is outside 0..=2"),
        ));
    }
    let metric = match raw.metric.as_deref().unwrap_or("cosine") {
        "cosine" => Metric::Cosine,
        "l2" => Metric::L2,
        other => {
            return Err(key_err(
                f,
                k("build.metric"),
                format!("{other:?} is not \"cosine\" or \"l2\""),
            ))
        }
    };
    let mut checks: Vec<Arc<dyn ExistenceCheck>> = vec![Arc::new(KbTitles(kb.clone()))];
    if let Some(p) = &raw.known_phrases {
        let path = cx.base.join(p);
        checks.push(Arc::new(
            KnownPhrases::read(&path)
                .map_err(|e| key_err(f, k("build.known_phrases"), e.to_string()))?,
        ));
    }
    Ok(build::Config {
        generator,
        term_temperature: term_temperature as f32,
        embedder,
        topics,
        terms_per_topic: int(raw.terms_per_topic, "terms_per_topic", 1, 100, 6)?,
        suggestions: int(raw.suggestions, "suggestions", 2, 50, 5)?,
        top_k: int(raw.top_k, "top_k", 2, 1000, 5)?,
        metric,
        embed_batch: int(raw.embed_batch, "embed_batch", 1, 1024, 64)?,
        kb,
        checks,
    })
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
pub fn dataset_from(
    f: &str,
    i: usize,
    from: i64,
    benchmarks: &[Benchmark],
) -> Result<usize, SweepError> {
    let key = format!("benchmark[{i}].dataset_from");
    match usize::try_from(from).ok().and_then(|n| benchmarks.get(n).map(|b| (n, b))) {
        Some((n, b)) if b.get::<HypoTermQaBuild>().is_some() => Ok(n),
        _ => Err(key_err(f, key, format!("{from} is not the index of an earlier [[benchmark]] with pipeline \"hypotermqa-build\""))),
    }
}

impl Pipeline for HypoTermQaBuild {
    fn name(&self) -> &'static str {
        build::PIPELINE
    }

    fn model_names(&self) -> Vec<String> {
        self.config.iter().map(|c| c.generator.name.clone()).collect()
    }

    fn item_count(&self) -> usize {
        self.config.iter().map(|c| c.topic_count()).max().unwrap_or(0)
    }

    fn evaluate(&self, model: usize, item: u32, known: &dyn ResultLookup) -> Evaluation {
        encoded(build::evaluate(&self.config[model], item as u64, known))
    }

    /// Per generator: stream its labels to `labels.jsonl`, assemble the dataset, write it
    /// to the run directory (`built-<b>.jsonl`), and add its section and entry.
    fn report(&self, out: &mut Section<'_>) -> Result<(), PlanError> {
        let (b, knowledge_base) = (out.bench, &self.knowledge_base);
        for (m, c) in self.config.iter().enumerate() {
            let mut labels = Vec::new();
            for r in out.state.labels_of(b as u32, m as u32) {
                let (k, v) = r?;
                let l: build::TopicLabel = serde_json::from_slice(&v)
                    .map_err(|e| out.err(format!("stored label {k:?}: {e}")))?;
                out.row(&l)?;
                labels.push(l);
            }
            let built = build::output::assemble(&labels, &c.kb);
            let name = output_file(b);
            let mut body = built.lines.join("\n");
            if !body.is_empty() {
                body.push('\n');
            }
            crate::report::write_atomic(out.dir, &name, body.as_bytes())?;
            out.md.push_str(&format!(
                "## Benchmark {b}: hypotermqa-build with `{}` (knowledge base `{}`, {} titles)\n\n",
                c.generator.name,
                knowledge_base.display(),
                c.kb.len()
            ));
            out.md.push_str(&build::output::render_markdown(&built, &name));
            out.md.push('\n');
            let mut v = serde_json::to_value(&built).map_err(|e| out.err(e))?;
            if let Some(o) = v.as_object_mut() {
                o.insert("benchmark".into(), b.into());
                o.insert("pipeline".into(), build::PIPELINE.into());
                o.insert("generator".into(), c.generator.name.clone().into());
                o.insert("embedder".into(), c.embedder.name.clone().into());
                o.insert("knowledge_base".into(), knowledge_base.display().to_string().into());
                o.insert("dataset".into(), out.dir.join(&name).display().to_string().into());
            }
            out.json.push(v);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::sweep::parse;
    use crate::sweep::Sweep;

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
        std::fs::write(
            dir.path().join("kb.jsonl"),
            "{\"title\":\"Loom\",\"text\":\"A device.\"}\n",
        )
        .unwrap();
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
        assert_eq!(
            (s.built_inputs[0].eval, s.built_inputs[0].build, s.built_inputs[0].limit),
            (1, 0, Some(3))
        );
        let m = &s.models[1];
        assert_eq!(m.spec.pool, "embed/minilm");
        assert_eq!(m.max_concurrency, 1);
        assert!(
            m.spec.model_ref.endpoint.starts_with("embed:emb:17:"),
            "{}",
            m.spec.model_ref.endpoint
        );
        let build = s.benchmarks[0].get::<HypoTermQaBuild>().unwrap();
        let c = &build.config[0];
        assert_eq!(
            (c.terms_per_topic, c.suggestions, c.top_k, c.embed_batch, c.term_temperature),
            (6, 5, 5, 64, 1.0)
        );
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
        let e = err(&BUILD
            .replace("embedder = \"minilm\"", "embedder = \"gen\"")
            .replace("kb.jsonl\"", "kb.jsonl\"\ntopics = [\"A\"]"));
        assert!(
            e.contains("benchmark[0].build.embedder") && e.contains("backend \"embed\""),
            "{e}"
        );
        std::fs::write(
            d.path().join("bad.jsonl"),
            "{\"title\":\"A\",\"text\":\"x\"}\n{\"title\":\"\",\"text\":\"y\"}\n",
        )
        .unwrap();
        let e = err(&format!("{}topics = [\"A\"]\n", BUILD.replace("kb.jsonl", "bad.jsonl")));
        assert!(
            e.contains("benchmark[0].build.knowledge_base")
                && e.contains("bad.jsonl:2: field `title`: is empty"),
            "{e}"
        );
        let e = err(&format!("{BUILD}topics = [\"A\"]\nterms_per_topic = 0\n"));
        assert!(e.contains("benchmark[0].build.terms_per_topic") && e.contains("outside"), "{e}");
        let e = err(&format!("{BUILD}topics = [\"A\"]\nmetric = \"dot\"\n"));
        assert!(e.contains("benchmark[0].build.metric"), "{e}");
        let e = err(&format!("{BUILD}topics = [\"A\"]\nunknown_key = 1\n"));
        assert!(e.contains("unknown_key"), "{e}");
        let e = err("[[benchmark]]\npipeline = \"hypotermqa\"\ndataset_from = 0\nmodels = [\"gen\"]\njudge = \"gen\"\n");
        assert!(e.contains("benchmark[0].dataset_from"), "{e}");
        let e = err(&format!("{BUILD}topics = [\"A\"]\njudge = \"gen\"\n")
            .replace("[benchmark.build]\n", "judge = \"gen\"\n[benchmark.build]\n")
            .replace("topics = [\"A\"]\njudge = \"gen\"\n", "topics = [\"A\"]\n"));
        assert!(e.contains("benchmark[0].judge") && e.contains("hypotermqa-build"), "{e}");
        let e = err("[[model]]\nname = \"x\"\nbackend = \"embed\"\nmodel_path = \"nowhere\"\n[[benchmark]]\npipeline = \"noop\"\nmodels = [\"x\"]\njobs = 1\n");
        assert!(e.contains("model[2].model_path") && e.contains("fetch-embedder.sh"), "{e}");
    }
}

//! Sweep checks of the `autohall`, `chainpoll`, `uhgeval` and `hvi` benchmarks.

use std::path::Path;

use halyard_pipelines::chainpoll::Metric;
use halyard_pipelines::metrics::uhgeval::UhgVariant;

use super::autohall::AutoHall;
use super::chainpoll::ChainPoll;
use super::uhgeval::UhgEval;
use crate::sweep::{parse, Sweep, SweepError};

fn sweep(bench: &str, extra_model: &str) -> Result<Sweep, SweepError> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let text = format!(
            "name = \"t\"\n[[model]]\nname = \"m\"\nbackend = \"noop\"\n{extra_model}\n[[benchmark]]\n{}\n",
            bench.replace("ROOT", &root.display().to_string())
        );
    parse(&root.join("s.toml"), &text)
}

fn err(bench: &str) -> String {
    sweep(bench, "").expect_err("must be rejected").to_string()
}

const AH: &str = "pipeline = \"autohall\"\ndataset = \"ROOT/datasets/autohall/pubhealth_sample.jsonl\"\nmodels = [\"m\"]";
const CP: &str = "pipeline = \"chainpoll\"\ndataset = \"ROOT/datasets/chainpoll/autohall_climate_gpt35.jsonl\"\nmodels = [\"m\"]";

/// Defaults: K 13, classification at 0.1, references at the model's temperature; the
/// PubHealth sample (with NaN) loads; ChainPoll N 5, correctness, exclude.
#[test]
fn defaults() {
    let s = sweep(AH, "").unwrap();
    let Some(AutoHall { config, claims, samples, .. }) = s.benchmarks[0].get::<AutoHall>() else {
        panic!()
    };
    assert_eq!((*samples, claims.len(), config[0].classifier.temperature), (13, 40, 0.1));
    let s = sweep(&format!("{CP}\nsampler = \"m\""), "").unwrap();
    let ChainPoll { config, items, .. } = s.benchmarks[0].get::<ChainPoll>().unwrap();
    assert_eq!(
        (config[0].polls, items.len(), config[0].metrics.as_slice()),
        (5, 60, &[Metric::Correctness][..])
    );
    assert_eq!(config[0].sampler.as_ref().map(|s| s.1), Some(20));
}

/// Bad keys and values name the key; foreign keys are rejected.
#[test]
fn bad_keys() {
    for (bench, needle) in [
        (format!("{AH}\nsamples = -1"), "benchmark[0].samples`: -1 is outside"),
        (format!("{AH}\ntemperature = 3.0"), "benchmark[0].temperature`: 3 is outside"),
        (format!("{AH}\nno_conflict = \"loose\""), "benchmark[0].no_conflict`"),
        (
            format!("{AH}\nrefusal_phrases = [\" \"]"),
            "benchmark[0].refusal_phrases[0]`: must not be empty",
        ),
        (
            format!("{AH}\npolls = 3"),
            "benchmark[0].polls`: does not apply to pipeline \"autohall\"",
        ),
        (format!("{AH}\njudge = \"m\""), "benchmark[0].judge`: does not apply"),
        (AH.replace("pubhealth_sample", "missing"), "benchmark[0].dataset`"),
        (format!("{CP}\nmetrics = [\"truth\"]"), "benchmark[0].metrics[0]`"),
        (format!("{CP}\nmetrics = [\"adherence\"]"), "needs a `context`"),
        (format!("{CP}\nsamples = 3"), "benchmark[0].samples`: needs `sampler`"),
        (format!("{CP}\nsampler = \"x\""), "benchmark[0].sampler`: unknown model \"x\""),
        (format!("{CP}\nunparseable = \"yes\""), "benchmark[0].unparseable`"),
        (
            format!("{CP}\ntemperature = 0.5"),
            "benchmark[0].temperature`: does not apply to pipeline \"chainpoll\"",
        ),
        (format!("{CP}\npolls = 0"), "benchmark[0].polls`: 0 is outside"),
    ] {
        let e = err(&bench);
        assert!(e.contains(needle), "{needle:?} not in {e:?}");
    }
}

fn sweep_text(benchmark: &str) -> String {
    let ds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../datasets");
    format!(
        "name = \"t\"\n[[model]]\nname = \"a\"\nbackend = \"noop\"\n{}",
        benchmark.replace("DATASETS", &ds.display().to_string())
    )
}

/// Forms default to all four and keep their order; variant defaults to paper; limit applies.
#[test]
fn uhgeval_defaults() {
    let s = parse(Path::new("/tmp/s.toml"), &sweep_text("[[benchmark]]\npipeline = \"uhgeval\"\ndataset = \"DATASETS/uhgeval/uhgeval_concise_sample_20.jsonl\"\nmodels = [\"a\"]\nlimit = 3\n")).unwrap();
    let b = &s.benchmarks[0];
    assert_eq!((b.pipeline(), b.model_count(), b.item_count()), ("uhgeval", 1, 3));
    let UhgEval { config, .. } = b.get::<UhgEval>().unwrap();
    assert_eq!(config[0].forms.len(), 4);
    assert_eq!(config[0].variant, UhgVariant::Paper);
}

/// The new keys are errors on other pipelines, and an HVI benchmark needs exactly one input.
#[test]
fn foreign_keys_rejected() {
    let e = parse(
        Path::new("/tmp/s.toml"),
        &sweep_text(
            "[[benchmark]]\npipeline = \"noop\"\njobs = 1\nmodels = [\"a\"]\nvariant = \"v2\"\n",
        ),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("benchmark[0].variant`: does not apply to pipeline \"noop\""),
        "{e}"
    );
    let e = parse(
        Path::new("/tmp/s.toml"),
        &sweep_text("[[benchmark]]\npipeline = \"hvi\"\nmodels = [\"a\"]\n"),
    )
    .unwrap_err();
    assert!(e.to_string().contains("benchmark[0].dataset`: required"), "{e}");
    let both =
        "[[benchmark]]\npipeline = \"hvi\"\nmodels = [\"a\"]\nlabels = \"x\"\ndataset = \"y\"\n";
    assert!(parse(Path::new("/tmp/s.toml"), &sweep_text(both))
        .unwrap_err()
        .to_string()
        .contains("not both"));
    let delta = "[[benchmark]]\npipeline = \"hvi\"\nmodels = [\"a\"]\njudge = \"a\"\ndataset = \"DATASETS/hvi/climate_fever_claims_12.jsonl\"\ndelta1 = nan\n";
    assert!(parse(Path::new("/tmp/s.toml"), &sweep_text(delta))
        .unwrap_err()
        .to_string()
        .contains("benchmark[0].delta1"));
}

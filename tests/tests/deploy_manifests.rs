//! The deployment files agree with the code (issue 14): KEDA's ScaledObjects watch the
//! consumers Halyard creates for the sweep's pools, on the stream it creates; the Grafana
//! dashboard's queries name metrics Halyard documents as exported. A rename on either side
//! fails here instead of silently breaking autoscaling or a panel.
//!
//! (Schema validation of the rendered overlays and their invariants are `deploy/k8s/validate`
//! and `deploy/k8s/invariants.py`, run by `.ci/run` through `deploy/check`.)

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use halyard_plan::sweep;
use halyard_proto::subjects::{pool_consumer, JOBS_STREAM};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn read(rel: &str) -> String {
    let p = repo().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The documents of a multi-document YAML file.
fn documents(text: &str) -> Vec<String> {
    text.split("\n---\n").map(str::to_string).collect()
}

/// The text of the literal block `key: |` (dedented).
fn block(doc: &str, key: &str) -> Option<String> {
    let lines: Vec<&str> = doc.lines().collect();
    let start = lines.iter().position(|l| l.trim() == format!("{key}: |"))?;
    let indent = |l: &str| l.len() - l.trim_start().len();
    let key_indent = indent(lines[start]);
    let body: Vec<&str> = lines[start + 1..]
        .iter()
        .take_while(|l| l.trim().is_empty() || indent(l) > key_indent)
        .copied()
        .collect();
    let min = body.iter().filter(|l| !l.trim().is_empty()).map(|l| indent(l)).min()?;
    Some(body.iter().map(|l| l.get(min..).unwrap_or("")).collect::<Vec<_>>().join("\n"))
}

/// Values of every `key: value` line.
fn values(doc: &str, key: &str) -> Vec<String> {
    let prefix = format!("{key}:");
    doc.lines()
        .filter_map(|l| l.trim().strip_prefix(&prefix))
        .map(|v| v.trim().trim_matches('"').to_string())
        .collect()
}

fn kind(doc: &str) -> String {
    values(doc, "kind").into_iter().next().unwrap_or_default()
}

fn name(doc: &str) -> String {
    values(doc, "name").into_iter().next().unwrap_or_default()
}

/// The pools of the sweep held by ConfigMap `configmap` in `file`, through Halyard's own
/// sweep parser; paths inside the pod are mapped to this checkout's files. With `gpu`,
/// only the pools of the local models placed on that GPU (what `worker --gpu N` serves);
/// without, the pools of the models placed on no GPU (what a worker without `--gpu`
/// serves).
fn sweep_pools(file: &str, configmap: &str, gpu: Option<u32>) -> BTreeSet<String> {
    let text = read(file);
    let doc = documents(&text)
        .into_iter()
        .find(|d| kind(d) == "ConfigMap" && name(d) == configmap)
        .unwrap_or_else(|| panic!("{file}: no ConfigMap {configmap}"));
    let toml = block(&doc, "sweep.toml").unwrap_or_else(|| panic!("{configmap}: no sweep.toml"));
    let local = toml
        .replace("/etc/halyard/datasets/", &format!("{}/datasets/hypotermqa/", repo().display()))
        .replace("/models/", &format!("{}/models/", repo().display()));
    let s = sweep::parse(&repo().join(file), &local)
        .unwrap_or_else(|e| panic!("{file}: {configmap}'s sweep does not parse: {e}"));
    s.models
        .iter()
        .filter(|m| match (&m.server, gpu) {
            // A managed server on GPUs is a GPU worker's (`--gpu 0,1`), a CPU one any worker's.
            (Some(s), None) => s.gpus == 0,
            (Some(s), Some(_)) => s.gpus > 0,
            (None, _) => m.local.as_ref().and_then(|l| l.gpu) == gpu,
        })
        .map(|m| m.spec.pool.clone())
        .collect()
}

/// (stream, consumer) of every nats-jetstream trigger of ScaledObject `object` in `file`,
/// and the Deployment it scales.
fn triggers(file: &str, object: &str) -> (Vec<(String, String)>, String) {
    let text = read(file);
    let doc = documents(&text)
        .into_iter()
        .find(|d| kind(d) == "ScaledObject" && name(d) == object)
        .unwrap_or_else(|| panic!("{file}: no ScaledObject {object}"));
    let types = values(&doc, "- type");
    assert!(types.iter().all(|t| t == "nats-jetstream"), "{object}: triggers {types:?}");
    let (streams, consumers) = (values(&doc, "stream"), values(&doc, "consumer"));
    assert_eq!(streams.len(), types.len(), "{object}: one stream per trigger");
    assert_eq!(consumers.len(), types.len(), "{object}: one consumer per trigger");
    let target = doc.split("scaleTargetRef:").nth(1).map(name).unwrap_or_default();
    (streams.into_iter().zip(consumers).collect(), target)
}

/// The worker Deployment mounts the sweep ConfigMap the test read its pools from.
fn assert_mounts(file: &str, deployment: &str, configmap: &str) {
    let text = read(file);
    let doc = documents(&text)
        .into_iter()
        .find(|d| kind(d) == "Deployment" && name(d) == deployment)
        .unwrap_or_else(|| panic!("{file}: no Deployment {deployment}"));
    assert!(
        doc.contains(&format!("configMap: {{ name: {configmap} }}")),
        "{deployment} does not mount {configmap}"
    );
}

fn check_scaled_object(
    keda_file: &str,
    object: &str,
    (sweep_file, configmap, gpu): (&str, &str, Option<u32>),
    workers_file: &str,
) {
    let pools = sweep_pools(sweep_file, configmap, gpu);
    assert!(!pools.is_empty(), "{configmap}: no pools");
    let (triggers, target) = triggers(keda_file, object);
    assert_mounts(workers_file, &target, configmap);
    let wanted: BTreeSet<String> = pools.iter().map(|p| pool_consumer(p)).collect();
    let got: BTreeSet<String> = triggers.iter().map(|(_, c)| c.clone()).collect();
    assert_eq!(got, wanted, "{object}: consumers vs the pools {pools:?} of {configmap}");
    for (stream, _) in &triggers {
        assert_eq!(stream, JOBS_STREAM, "{object}: stream");
    }
}

/// The API workers' ScaledObject watches `pool-<token>` of both pools of the sweep they
/// serve, on HALYARD_JOBS.
#[test]
fn keda_watches_the_consumers_of_the_api_pools() {
    check_scaled_object(
        "deploy/k8s/base/keda.yaml",
        "halyard-worker",
        ("deploy/k8s/base/sweep.yaml", "halyard-sweep", None),
        "deploy/k8s/base/worker.yaml",
    );
}

/// The GPU workers' ScaledObject watches the consumer of the GGUF pool placed on GPU 0,
/// whose name carries a hash of the pool name (`gguf/smollm2@gpu0`).
#[test]
fn keda_watches_the_consumer_of_the_gpu_pool() {
    check_scaled_object(
        "deploy/k8s/overlays/gpu/worker-gpu.yaml",
        "halyard-worker-gpu",
        ("deploy/k8s/overlays/gpu/sweep.yaml", "halyard-sweep", Some(0)),
        "deploy/k8s/overlays/gpu/worker-gpu.yaml",
    );
}

/// In the GPU overlay the API workers' ScaledObject watches the judge's pool only: a
/// trigger on a pool the sweep lacks would watch a consumer that never exists.
#[test]
fn keda_watches_only_the_api_pools_of_the_gpu_sweep() {
    check_scaled_object(
        "deploy/k8s/overlays/gpu/keda-api.yaml",
        "halyard-worker",
        ("deploy/k8s/overlays/gpu/sweep.yaml", "halyard-sweep", None),
        "deploy/k8s/base/worker.yaml",
    );
}

/// The managed-server overlay (issue 35): its GPU workers' ScaledObject watches the
/// consumer of the vLLM model's pool (`server/llama-8b`, wherever it is served), and its
/// API workers' the judge's only.
#[test]
fn keda_watches_the_consumers_of_the_managed_server_overlay() {
    check_scaled_object(
        "deploy/k8s/overlays/gpu-server/worker-server.yaml",
        "halyard-worker-server",
        ("deploy/k8s/overlays/gpu-server/sweep.yaml", "halyard-sweep", Some(0)),
        "deploy/k8s/overlays/gpu-server/worker-server.yaml",
    );
    check_scaled_object(
        "deploy/k8s/overlays/gpu-server/keda-api.yaml",
        "halyard-worker",
        ("deploy/k8s/overlays/gpu-server/sweep.yaml", "halyard-sweep", None),
        "deploy/k8s/base/worker.yaml",
    );
}

/// A renamed consumer is caught: the check compares names, not shapes (issue 14).
#[test]
#[should_panic(expected = "consumers vs the pools")]
fn a_renamed_consumer_fails_the_check() {
    let dir = tempfile::tempdir().unwrap();
    let keda = read("deploy/k8s/base/keda.yaml").replace("pool-openai-judge", "pool-judge");
    let rel = dir.path().join("keda.yaml");
    std::fs::write(&rel, keda).unwrap();
    // `read` joins onto the repository; an absolute path replaces it.
    check_scaled_object(
        rel.to_str().unwrap(),
        "halyard-worker",
        ("deploy/k8s/base/sweep.yaml", "halyard-sweep", None),
        "deploy/k8s/base/worker.yaml",
    );
}

/// The Grafana dashboard is valid JSON, every panel has a query, and every metric the
/// queries name is one Halyard documents as exported (the book's "Metrics" section).
#[test]
fn dashboard_queries_name_exported_metrics() {
    let dashboard = read("deploy/compose/grafana/dashboards/halyard.json");
    let names = halyard_tests::compose::dashboard_metrics(&dashboard).unwrap();
    assert!(names.len() >= 15, "the dashboard covers Halyard's metrics: {names:?}");
    let docs = read("docs/src/guide/operating.md");
    let table = docs.split("## Metrics (Prometheus)").nth(1).expect("the book's Metrics section");
    let table = table.split("\n## ").next().unwrap();
    let documented = halyard_tests::compose::metric_names(table);
    for n in &names {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| n.strip_suffix(s))
            .filter(|f| documented.contains(*f))
            .unwrap_or(n);
        assert!(documented.contains(family), "dashboard metric {n} is not in README's table");
    }
}

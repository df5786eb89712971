//! The deployment files agree with the code (issue 14): the Grafana dashboard's queries
//! name metrics Halyard documents as exported. A rename on either side fails here instead
//! of silently breaking a panel.
//!
//! The Kubernetes overlays' ScaledObjects against the sweep's pools (Halyard's own sweep
//! parser and `pool_consumer`) are checked by `cli/tests/deploy_k8s.rs` since the shipped
//! overlays are what `halyard deploy k8s` writes (issue 46); schema validation of the
//! rendered overlays and their invariants are `deploy/k8s/validate` and
//! `deploy/k8s/invariants.py`, run by `.ci/run` through `deploy/check`.

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

fn read(rel: &str) -> String {
    let p = repo().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
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

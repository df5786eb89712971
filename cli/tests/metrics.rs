//! `/metrics`: scraped over HTTP while `halyard run --metrics ADDR` works, parsed with a
//! strict parser of the Prometheus text format, figures checked against the run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use halyard_tests::prometheus::{self, scrape, Scrape};
use halyard_tests::{free_port, ChildGuard, FakeOpenAi, Reply};

fn get(s: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    s.sum(name, labels)
}

#[test]
fn metrics_endpoint_scrapes_during_a_run() {
    let qs = load_questions(30);
    let rules = responder(question_index(&qs), None);
    // The first call is rate limited once (429 with Retry-After), then calls are slow
    // enough for several scrapes to land mid-run.
    let limited = Arc::new(AtomicBool::new(false));
    let l = limited.clone();
    let fake = FakeOpenAi::start_blocking(move |c| {
        if !l.swap(true, Ordering::SeqCst) {
            return Reply::Status {
                code: 429,
                body: "slow down".into(),
                retry_after: Some("1".into()),
            };
        }
        Reply::Delayed(Duration::from_millis(30), Box::new(rules(c)))
    });
    let dir = tempfile::tempdir().unwrap();
    let sweep = write_sweep(dir.path(), "m", &fake.base_url(), 30, 2);
    let text = std::fs::read_to_string(&sweep)
        .unwrap()
        .replace("max_tokens = 256", "max_tokens = 256\nprice = { input = 3.0, output = 15.0 }");
    std::fs::write(&sweep, text).unwrap();
    let out = dir.path().join("runs");
    let port = free_port();
    let mut cmd = halyard();
    cmd.args([
        "run",
        sweep.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--metrics",
        &format!("127.0.0.1:{port}"),
    ]);
    let mut child = ChildGuard::spawn(cmd);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut scrapes: Vec<Scrape> = Vec::new();
    // The last scrape taken while the run was in progress (the broker is up then; a
    // scrape while `halyard run` shuts down its own nats-server has no queue figures).
    let mut mid_run: Option<usize> = None;
    let status = loop {
        assert!(Instant::now() < deadline, "run did not finish");
        if let Some(st) = child.try_wait() {
            break st;
        }
        if let Some((ctype, body)) = scrape(port) {
            assert!(ctype.starts_with("text/plain") && ctype.contains("version=0.0.4"), "{ctype}");
            let s =
                prometheus::parse(&body).unwrap_or_else(|e| panic!("bad exposition: {e}\n{body}"));
            let done = get(&s, "halyard_items", &[("state", "done")]);
            let total = get(&s, "halyard_items", &[("state", "total")]);
            if total == 30.0 && done > 0.0 && done < total {
                mid_run = Some(scrapes.len());
            }
            scrapes.push(s);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "halyard run failed: {status:?}");
    let mid = mid_run
        .map(|i| &scrapes[i])
        .unwrap_or_else(|| panic!("no scrape saw the run in progress ({} scrapes)", scrapes.len()));
    let last = scrapes.last().expect("at least one scrape");
    let report = read_json(&out.join("m/report.json"));

    // Families and their types.
    for (name, kind) in [
        ("halyard_items", "gauge"),
        ("halyard_jobs_total", "counter"),
        ("halyard_model_calls_total", "counter"),
        ("halyard_tokens_total", "counter"),
        ("halyard_cost_usd_total", "counter"),
        ("halyard_model_call_latency_seconds", "histogram"),
        ("halyard_job_latency_seconds", "summary"),
        ("halyard_worker_calls_total", "counter"),
        ("halyard_worker_rate_limited_total", "counter"),
        ("halyard_worker_cooldowns_total", "counter"),
    ] {
        assert_eq!(last.types.get(name).map(String::as_str), Some(kind), "{name}");
    }
    // Queue depth per pool of the sweep, read from the broker during the run.
    assert_eq!(mid.types.get("halyard_queue_depth").map(String::as_str), Some("gauge"));
    for pool in ["model-a", "judge-a"] {
        assert_eq!(mid.find("halyard_queue_depth", &[("pool", pool)]).count(), 1, "pool {pool}");
    }
    // Counters never go down between scrapes.
    for w in scrapes.windows(2) {
        for name in
            ["halyard_model_calls_total", "halyard_tokens_total", "halyard_worker_calls_total"]
        {
            assert!(get(&w[1], name, &[]) >= get(&w[0], name, &[]), "{name} went down");
        }
    }
    // The 429 was seen and retried.
    assert!(
        scrapes.iter().any(|s| get(s, "halyard_worker_rate_limited_total", &[]) >= 1.0),
        "429 not counted"
    );
    assert!(get(last, "halyard_model_retries_total", &[]) >= 1.0);
    // The last scrape (taken at most 100 ms before the end) agrees with the report where
    // it had the whole run; totals can only lag.
    let done = get(last, "halyard_items", &[("state", "done")]);
    let prompt = get(last, "halyard_tokens_total", &[("kind", "prompt")]);
    assert!(prompt <= report["jobs"]["prompt_tokens"].as_f64().unwrap());
    if done == 30.0 {
        assert_eq!(prompt, report["jobs"]["prompt_tokens"].as_f64().unwrap());
        assert_eq!(
            get(last, "halyard_tokens_total", &[("kind", "completion")]),
            report["jobs"]["completion_tokens"].as_f64().unwrap()
        );
        let cost = get(last, "halyard_cost_usd_total", &[("model", "model-a")]);
        assert!((cost - report["costs"]["by_model"][0]["cost"].as_f64().unwrap()).abs() < 1e-9);
        assert_eq!(
            get(last, "halyard_cost_usd_total", &[("model", "judge-a")]),
            0.0,
            "unpriced model has a cost"
        );
    }
    assert!(get(last, "halyard_model_call_latency_seconds_count", &[("model", "model-a")]) > 0.0);
}

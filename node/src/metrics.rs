//! Prometheus `/metrics` (text exposition format 0.0.4) for the coordinator and the
//! worker, served by a small axum server. In `halyard run` (embedded mode) one endpoint
//! serves both sets, and only when `--metrics ADDR` is given.
//!
//! Coordinator: `halyard_items`, `halyard_items_active`, `halyard_jobs_total{state}`,
//! `halyard_jobs_held`, `halyard_result_batches_total`, per (model, stage)
//! `halyard_model_jobs_total`, `halyard_model_calls_total`, `halyard_model_retries_total`,
//! `halyard_model_dead_letters_total`, `halyard_checkpoint_hits_total`,
//! `halyard_tokens_total{kind}`, `halyard_cost_usd_total`, the histogram
//! `halyard_model_call_latency_seconds{model}`, the summary `halyard_job_latency_seconds`,
//! `halyard_cost_spent_usd`, `halyard_cost_limit_usd`, and per pool `halyard_queue_depth`,
//! `halyard_queue_in_flight`, `halyard_queue_waiting_pulls`; for batch pools
//! (`mode = "batch"`) per pool and state `halyard_provider_batches`,
//! `halyard_provider_batch_requests` and `halyard_provider_batch_oldest_seconds`.
//!
//! Worker: `halyard_worker_calls_total`, `halyard_worker_jobs_total{outcome}`,
//! `halyard_worker_checkpoint_hits_total`, `halyard_worker_rate_limited_total` (HTTP 429),
//! `halyard_worker_cooldowns_total`, `halyard_worker_pulls_total`,
//! `halyard_worker_pulled_total`, `halyard_worker_handed_back_total`, and per pool
//! `halyard_pool_paused{pool,reason}` (1 while its endpoint is down) and
//! `halyard_pool_outage_seconds_total`.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;

use halyard_broker::Broker;
use halyard_plan::cost::{by_model, ClassTotals, LATENCY_BUCKETS_S};
use halyard_plan::progress::Progress;
use halyard_worker::Stats;
use tokio::sync::watch;

use crate::status::{pool_status, PoolStatus};
use crate::NodeError;

/// Text exposition: each family's `# HELP`/`# TYPE` once, then its samples.
#[derive(Default)]
pub struct Exposition {
    out: String,
    declared: HashSet<String>,
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn number(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_string()
    } else if v.is_nan() {
        "NaN".to_string()
    } else {
        format!("{v}")
    }
}

impl Exposition {
    pub fn family(&mut self, name: &str, kind: &str, help: &str) -> &mut Self {
        if self.declared.insert(name.to_string()) {
            let _ = writeln!(
                self.out,
                "# HELP {name} {}",
                help.replace('\\', "\\\\").replace('\n', "\\n")
            );
            let _ = writeln!(self.out, "# TYPE {name} {kind}");
        }
        self
    }

    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) -> &mut Self {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape_label(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {}", number(value));
        self
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// What one endpoint exposes.
#[derive(Clone, Default)]
pub struct Sources {
    pub coordinator: Option<CoordinatorSource>,
    pub workers: Vec<(String, Arc<Stats>)>,
    /// The workers' broker connection (the coordinator's is in its source), for `/readyz`.
    pub broker: Option<Broker>,
}

/// `/healthz` (liveness): the process is alive, which its answering shows. The broker is
/// deliberately not part of it: a process without its broker reconnects on its own, and
/// restarting it (what a failed liveness probe does) would only cut its calls in flight,
/// to be paid again, on every pod at once during a broker outage. The broker is in
/// `/readyz`.
pub fn liveness(_: &Sources) -> Result<(), String> {
    Ok(())
}

/// `/readyz`: every broker connection of the process up, the coordinator planning (its
/// run open), and every worker's models loaded and consumers bound (not yet shutting
/// down).
pub fn readiness(src: &Sources) -> Result<(), String> {
    liveness(src)?;
    let mut brokers = src.coordinator.iter().map(|c| &c.broker).chain(src.broker.iter());
    brokers.try_for_each(Broker::connected)?;
    if let Some(c) = &src.coordinator {
        if c.progress.borrow().run.is_none() {
            return Err("coordinator: not planning yet".into());
        }
    }
    for (id, s) in &src.workers {
        if !s.ready.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(format!(
                "worker {id}: waiting for the broker's streams (made by a coordinator or \
                 `halyard broker init`), loading models, binding consumers or stopping"
            ));
        }
    }
    Ok(())
}

/// A probe's answer: 200 with `ok`, or 503 with the reason.
fn probe(r: Result<(), String>) -> (axum::http::StatusCode, String) {
    match r {
        Ok(()) => (axum::http::StatusCode::OK, "ok\n".into()),
        Err(why) => (axum::http::StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

#[derive(Clone)]
pub struct CoordinatorSource {
    pub progress: watch::Receiver<Progress>,
    pub broker: Broker,
    pub pools: Vec<String>,
}

/// The coordinator's figures: items, jobs, per (model, stage) classes, latencies, cost.
pub fn coordinator_metrics(e: &mut Exposition, p: &Progress) {
    run_metrics(e, p);
    class_metrics(e, &p.figures.costs);
    latency_metrics(e, p);
    cost_metrics(e, p);
}

/// Items and jobs of the run.
fn run_metrics(e: &mut Exposition, p: &Progress) {
    for t in &p.figures.targets {
        let bench = t.bench.to_string();
        for (state, v) in [("done", t.done), ("total", t.total)] {
            e.family(
                "halyard_items",
                "gauge",
                "Items (benchmark x model under test x dataset row) of the run, done and in total.",
            )
            .sample(
                "halyard_items",
                &[
                    ("benchmark", &bench),
                    ("pipeline", &t.pipeline),
                    ("model", &t.model),
                    ("state", state),
                ],
                v as f64,
            );
        }
    }
    e.family(
        "halyard_items_active",
        "gauge",
        "Items planned and unfinished (bounded by the window).",
    )
    .sample("halyard_items_active", &[], p.figures.active as f64);
    let completed = p.figures.results.saturating_sub(p.figures.dead_letters);
    for (state, v) in [
        ("published", p.figures.published),
        ("completed", completed),
        ("dead_letter", p.figures.dead_letters),
        ("duplicate", p.figures.duplicates),
    ] {
        e.family(
            "halyard_jobs_total",
            "counter",
            "Jobs by state, as this coordinator process saw them.",
        )
        .sample("halyard_jobs_total", &[("state", state)], v as f64);
    }
    e.family(
        "halyard_jobs_held",
        "gauge",
        "Paid jobs not published because the cost limit was reached.",
    )
    .sample("halyard_jobs_held", &[], p.figures.held as f64);
    e.family(
        "halyard_result_batches_total",
        "counter",
        "Result batches committed (one fsync of the run state each).",
    )
    .sample("halyard_result_batches_total", &[], p.result_batches as f64);
    e.family(
        "halyard_results_refused_total",
        "counter",
        "Results messages refused: undecodable, of another run, a worker's refusal of a forged job, or naming an unusable object.",
    )
    .sample("halyard_results_refused_total", &[], p.figures.refused_messages as f64);
    e.family(
        "halyard_results_rejected_total",
        "counter",
        "Results refused one by one: from a pool that does not serve their job, or for a job never planned once the results held aside were at their bound.",
    )
    .sample("halyard_results_rejected_total", &[], p.figures.refused_results as f64);
    e.family(
        "halyard_results_held",
        "gauge",
        "Results held aside for jobs not planned yet (a resumed run's smaller window, or forged ids).",
    )
    .sample("halyard_results_held", &[], p.figures.held_results as f64);
}

/// Jobs, calls, retries, dead letters, checkpoint hits, cost and tokens per (model, stage).
fn class_metrics(e: &mut Exposition, costs: &[ClassTotals]) {
    type Figure = fn(&ClassTotals) -> f64;
    let per_class: [(&str, &str, Figure); 6] = [
        (
            "halyard_model_jobs_total",
            "Completed jobs per model and stage (all processes of the run).",
            |c| c.jobs as f64,
        ),
        (
            "halyard_model_calls_total",
            "Backend calls (HTTP attempts, retries included) per model and stage.",
            |c| c.calls as f64,
        ),
        ("halyard_model_retries_total", "Attempts beyond the first per model and stage.", |c| {
            c.retries as f64
        }),
        (
            "halyard_model_dead_letters_total",
            "Jobs that became dead letters per model and stage.",
            |c| c.dead_letters as f64,
        ),
        (
            "halyard_checkpoint_hits_total",
            "Completions replayed from a worker checkpoint per model and stage.",
            |c| c.cache_hits as f64,
        ),
        (
            "halyard_cost_usd_total",
            "Cost in USD per model and stage, from the sweep's prices.",
            |c| c.cost,
        ),
    ];
    for (name, help, f) in per_class {
        for c in costs {
            e.family(name, "counter", help).sample(
                name,
                &[("model", &c.model), ("stage", &c.stage)],
                f(c),
            );
        }
    }
    for c in costs {
        for (kind, v) in [("prompt", c.prompt_tokens), ("completion", c.completion_tokens)] {
            e.family(
                "halyard_tokens_total",
                "counter",
                "Tokens per model, stage and kind (prompt or completion).",
            )
            .sample(
                "halyard_tokens_total",
                &[("model", &c.model), ("stage", &c.stage), ("kind", kind)],
                v as f64,
            );
        }
    }
}

/// Model call latency per model, and publish-to-result latency.
fn latency_metrics(e: &mut Exposition, p: &Progress) {
    let name = "halyard_model_call_latency_seconds";
    for m in by_model(&p.figures.costs) {
        e.family(
            name,
            "histogram",
            "Model call latency per model (the worker's measure of the successful call).",
        );
        let mut cumulative = 0u64;
        for (i, ub) in LATENCY_BUCKETS_S.iter().enumerate() {
            cumulative += m.latency_buckets.get(i).copied().unwrap_or(0);
            e.sample(
                &format!("{name}_bucket"),
                &[("model", &m.model), ("le", &number(*ub))],
                cumulative as f64,
            );
        }
        e.sample(&format!("{name}_bucket"), &[("model", &m.model), ("le", "+Inf")], m.jobs as f64);
        e.sample(
            &format!("{name}_sum"),
            &[("model", &m.model)],
            m.latency_ms_total as f64 / 1000.0,
        );
        e.sample(&format!("{name}_count"), &[("model", &m.model)], m.jobs as f64);
    }
    let name = "halyard_job_latency_seconds";
    e.family(
        name,
        "summary",
        "Publish-to-result latency of the jobs this coordinator process published.",
    );
    for q in [0.5, 0.9, 0.99] {
        let v = p.latency.quantile(q).map_or(f64::NAN, |d| d.as_secs_f64());
        e.sample(name, &[("quantile", &number(q))], v);
    }
    e.sample(&format!("{name}_count"), &[], p.latency.count() as f64);
}

/// Money spent, and the limit.
fn cost_metrics(e: &mut Exposition, p: &Progress) {
    let spent = p.figures.spent();
    e.family("halyard_cost_spent_usd", "gauge", "USD spent by the run so far.").sample(
        "halyard_cost_spent_usd",
        &[],
        spent,
    );
    if let Some(limit) = p.figures.max_cost {
        e.family("halyard_cost_limit_usd", "gauge", "The run's cost limit in USD (--max-cost).")
            .sample("halyard_cost_limit_usd", &[], limit);
    }
}

pub fn pool_metrics(e: &mut Exposition, pools: &[PoolStatus]) {
    for p in pools {
        for (name, help, v) in [
            (
                "halyard_queue_depth",
                "Jobs queued on the broker and not yet delivered, per pool.",
                p.pending,
            ),
            (
                "halyard_queue_in_flight",
                "Jobs delivered to workers and not yet acknowledged, per pool.",
                p.in_flight,
            ),
            (
                "halyard_queue_waiting_pulls",
                "Worker pull requests waiting for jobs, per pool.",
                p.waiting_pulls,
            ),
        ] {
            e.family(name, "gauge", help).sample(name, &[("pool", &p.pool)], v as f64);
        }
    }
}

pub fn worker_metrics(e: &mut Exposition, worker: &str, s: &Stats) {
    let w = [("worker", worker)];
    e.family(
        "halyard_worker_calls_total",
        "counter",
        "Backend calls made by the worker (HTTP attempts, retries included).",
    )
    .sample("halyard_worker_calls_total", &w, s.calls.get() as f64);
    for (outcome, v) in [
        ("completed", s.completed.get()),
        ("replayed", s.replayed.get()),
        ("dead_letter", s.dead_letters.get()),
        ("refused", s.refused.get()),
        ("retried", s.retried.get()),
    ] {
        e.family(
            "halyard_worker_jobs_total",
            "counter",
            "Job deliveries the worker finished, by outcome.",
        )
        .sample(
            "halyard_worker_jobs_total",
            &[("worker", worker), ("outcome", outcome)],
            v as f64,
        );
    }
    for (name, help, v) in [
        (
            "halyard_worker_checkpoint_hits_total",
            "Jobs answered from the worker's checkpoint without a model call.",
            s.replayed.get(),
        ),
        (
            "halyard_worker_cache_machine_hits_total",
            "Jobs answered from this machine's result cache without a model call.",
            s.cache_machine.get(),
        ),
        (
            "halyard_worker_cache_shared_hits_total",
            "Jobs answered from the broker's shared result cache without a model call.",
            s.cache_shared.get(),
        ),
        (
            "halyard_worker_cache_held_total",
            "Jobs handed back because another process of this machine was calling them (its result cache claim).",
            s.cache_held.get(),
        ),
        (
            "halyard_worker_rate_limited_total",
            "HTTP 429 responses received by the worker, retried ones included.",
            s.rate_limited.get(),
        ),
        (
            "halyard_worker_cooldowns_total",
            "Pool-wide cool-downs this worker started (quota pools).",
            s.cooldowns.get(),
        ),
        ("halyard_worker_pulls_total", "Pull requests sent to the broker.", s.pulls.get()),
        ("halyard_worker_pulled_total", "Jobs received from the broker.", s.pulled.get()),
        (
            "halyard_worker_handed_back_total",
            "Job deliveries handed back for the pool's reason (outage, 429s, shutdown), budget kept.",
            s.handed_back.get(),
        ),
    ] {
        e.family(name, "counter", help).sample(name, &w, v as f64);
    }
    for (pool, h) in s.pool_health.snapshot() {
        for r in halyard_proto::OutageReason::ALL {
            let labels = [("worker", worker), ("pool", pool.as_str()), ("reason", r.as_str())];
            e.family(
                "halyard_pool_paused",
                "gauge",
                "1 while the pool is paused because its endpoint is down, by reason.",
            )
            .sample(
                "halyard_pool_paused",
                &labels,
                f64::from(u8::from(h.paused == Some(r))),
            );
        }
        e.family(
            "halyard_pool_outage_seconds_total",
            "counter",
            "Seconds the pool spent paused (endpoint down), the current pause included.",
        )
        .sample(
            "halyard_pool_outage_seconds_total",
            &[("worker", worker), ("pool", pool.as_str())],
            h.outage.as_secs_f64(),
        );
    }
    server_metrics(e, worker, &s.servers.snapshot());
}

/// Each managed server of a worker: its state (one sample per state, 1 for the current
/// one), restarts, time to ready, and an info sample with its kind, GPU set and version.
/// Family by family, so each family's samples stay together.
pub fn server_metrics(
    e: &mut Exposition,
    worker: &str,
    servers: &[halyard_worker::server::ServerStat],
) {
    use halyard_worker::server::ServerState;
    let base = |v: &halyard_worker::server::ServerStat| {
        vec![
            ("worker", worker.to_string()),
            ("server", v.server.clone()),
            ("model", v.model.clone()),
        ]
    };
    let sample = |e: &mut Exposition, name: &str, labels: &[(&str, String)], value: f64| {
        let l: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        e.sample(name, &l, value);
    };
    if servers.is_empty() {
        return;
    }
    e.family(
        "halyard_server_state",
        "gauge",
        "1 for a managed server's current state (starting, ready, restarting, stopping, stopped, failed).",
    );
    for v in servers {
        for st in ServerState::ALL {
            let mut labels = base(v);
            labels.push(("state", st.as_str().to_string()));
            sample(e, "halyard_server_state", &labels, f64::from(u8::from(v.state == st)));
        }
    }
    e.family(
        "halyard_server_restarts_total",
        "counter",
        "Restarts of a managed server after a crash.",
    );
    for v in servers {
        sample(e, "halyard_server_restarts_total", &base(v), v.restarts as f64);
    }
    e.family(
        "halyard_server_ready_seconds",
        "gauge",
        "Seconds a managed server's latest start took to become ready.",
    );
    for v in servers {
        if let Some(r) = v.ready_s {
            sample(e, "halyard_server_ready_seconds", &base(v), r);
        }
    }
    e.family(
        "halyard_server_info",
        "gauge",
        "A managed server of the worker: its kind, GPU set and reported version (always 1).",
    );
    for v in servers {
        let mut info = base(v);
        info.extend([
            ("kind", v.kind.clone()),
            ("gpus", v.gpus.clone()),
            ("version", v.version.clone().unwrap_or_default()),
        ]);
        sample(e, "halyard_server_info", &info, 1.0);
    }
}

/// Provider batches (`mode = "batch"` pools) not over yet, per pool and state, read from
/// the broker at each scrape.
pub fn batch_metrics(e: &mut Exposition, groups: &[halyard_proto::provider_batch::BatchGroup]) {
    type Figure = fn(&halyard_proto::provider_batch::BatchGroup) -> f64;
    let families: [(&str, &str, Figure); 3] = [
        ("halyard_provider_batches", "Provider batches not over yet, per pool and state.", |g| {
            g.batches as f64
        }),
        (
            "halyard_provider_batch_requests",
            "Requests in provider batches not over yet, per pool and state.",
            |g| g.requests as f64,
        ),
        (
            "halyard_provider_batch_oldest_seconds",
            "Age of the oldest provider batch per pool and state (since submitted, or created).",
            |g| g.oldest_s,
        ),
    ];
    for (name, help, figure) in families {
        e.family(name, "gauge", help);
        for g in groups {
            e.sample(name, &[("pool", &g.pool), ("state", &g.state)], figure(g));
        }
    }
}

pub async fn render(src: &Sources) -> String {
    let mut e = Exposition::default();
    if let Some(c) = &src.coordinator {
        let p = c.progress.borrow().clone();
        coordinator_metrics(&mut e, &p);
        pool_metrics(&mut e, &pool_status(&c.broker, &c.pools).await);
        batch_metrics(&mut e, &halyard_broker::batches::summary(&c.broker, &c.pools).await);
    }
    for (id, s) in &src.workers {
        worker_metrics(&mut e, id, s);
    }
    e.finish()
}

/// Where to serve: `--metrics ADDR` (fatal when it cannot bind), `off`, or the default
/// address (a warning only when it is taken, e.g. by a second worker on the machine).
pub async fn serve(
    addr: Option<&str>,
    default: Option<&str>,
    src: Sources,
) -> Result<Option<SocketAddr>, NodeError> {
    let (addr, explicit) = match (addr, default) {
        (Some("off"), _) | (None, None) => return Ok(None),
        (Some(a), _) => (a, true),
        (None, Some(d)) => (d, false),
    };
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) if !explicit => {
            tracing::warn!(addr, error = %e, "metrics endpoint not started (give --metrics ADDR or --metrics off)");
            return Ok(None);
        }
        Err(e) => return Err(NodeError::io(format!("--metrics {addr}: cannot listen"), e)),
    };
    let local = listener
        .local_addr()
        .map_err(|e| NodeError::io(format!("--metrics {addr}: no local address"), e))?;
    let src = Arc::new(src);
    let (live, ready) = (src.clone(), src.clone());
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let src = src.clone();
                async move {
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            "text/plain; version=0.0.4; charset=utf-8",
                        )],
                        render(&src).await,
                    )
                }
            }),
        )
        .route("/healthz", axum::routing::get(move || std::future::ready(probe(liveness(&live)))))
        .route("/readyz", axum::routing::get(move || std::future::ready(probe(readiness(&ready)))));
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(error = %e, "metrics endpoint stopped");
        }
    });
    tracing::info!(addr = %local, "metrics at http://{local}/metrics");
    Ok(Some(local))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped_and_families_declared_once() {
        let mut e = Exposition::default();
        e.family("x_total", "counter", "help").sample("x_total", &[("m", "a\"b\\c\nd")], 1.0);
        e.family("x_total", "counter", "help").sample("x_total", &[("m", "z")], f64::INFINITY);
        let t = e.finish();
        assert_eq!(t.matches("# TYPE x_total counter").count(), 1);
        assert!(t.contains(r#"x_total{m="a\"b\\c\nd"} 1"#), "{t}");
        assert!(t.contains(r#"x_total{m="z"} +Inf"#), "{t}");
    }
}

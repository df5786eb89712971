//! `halyard view [DIR…]`: a local web app over run directories, served by the binary
//! itself with its assets built in (it works offline and fetches nothing).
//!
//! Layout:
//! - [`runs`]: the runs found and their summaries (from `status.json` while a run is
//!   live, `report.json` once it finished);
//! - [`items`]: the item browser's index over `labels.jsonl`, paged;
//! - [`compare`]: paired tests as `halyard report` makes them, with [`power`];
//! - this file: the HTTP routes (axum) and the security headers.
//!
//! With `--nats`, the runs page also lists the runs whose coordinators publish their
//! status on that broker's status bucket (runs on other machines), with their progress.
//!
//! Read-only: the view opens no store (a live run's store belongs to its coordinator,
//! which holds its lock) and writes nothing. Items of a live run are not browsable until
//! it finishes: its coordinator writes `labels.jsonl` with the report; meanwhile the view
//! shows what the run publishes (progress, rate, cost, ETA from its status, refreshed
//! every second).
//!
//! Every page is the same shell (`assets/app.html`) and one script (`assets/app.js`) that
//! builds the page from the JSON API with `textContent` only, so model output (HTML,
//! scripts, terminal escapes) is shown as text, never parsed; the Content-Security-Policy
//! allows nothing but this origin. A run's `report.html` (the report renderer's own page)
//! is shown in a frame, under a policy that lets its inline script and styles run and
//! nothing load.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use tokio::sync::watch;

pub mod compare;
pub mod items;
pub mod power;
pub mod runs;

use crate::NodeError;

const APP_HTML: &str = include_str!("assets/app.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// Pages of the app: only this origin, no inline script, no frames but its own.
const CSP_APP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-src 'self'; base-uri 'none'; form-action 'none'";
/// `report.html`: its inline style and script (the render check), nothing fetched.
const CSP_REPORT: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'";

/// What `halyard view` serves.
pub struct ViewConfig {
    /// Run directories, or directories holding run directories.
    pub dirs: Vec<PathBuf>,
    /// Where to listen (127.0.0.1 unless told otherwise).
    pub addr: SocketAddr,
    /// A broker whose status bucket lists live runs too (runs on other machines), read
    /// with these credentials.
    pub nats: Option<String>,
    pub auth: halyard_broker::auth::NatsAuth,
}

/// A built item index, with the `labels.jsonl` it was built from (length, modified).
type CachedIndex = (u64, std::time::SystemTime, Arc<items::Index>);

struct AppState {
    dirs: Vec<PathBuf>,
    /// The broker of `--nats`: its status bucket is read on every refresh of the runs.
    broker: Option<halyard_broker::Broker>,
    /// Built item indexes, by run directory, with the `labels.jsonl` they were built from
    /// (its length and modification time): a rewritten file is indexed again.
    indexes: Mutex<HashMap<PathBuf, CachedIndex>>,
}

type Shared = Arc<AppState>;

/// An error as the API answers it: a status and a message naming what is wrong.
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.1 }).to_string();
        (self.0, [(header::CONTENT_TYPE, "application/json")], body).into_response()
    }
}

fn json(v: &impl serde::Serialize) -> Response {
    match serde_json::to_string(v) {
        Ok(s) => ([(header::CONTENT_TYPE, "application/json")], s).into_response(),
        Err(e) => ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

impl AppState {
    fn runs(&self) -> BTreeMap<String, PathBuf> {
        runs::discover(&self.dirs)
    }

    fn run_dir(&self, key: &str) -> Result<PathBuf, ApiError> {
        self.runs().remove(key).ok_or_else(|| {
            ApiError(StatusCode::NOT_FOUND, format!("no run {key:?} under the directories viewed"))
        })
    }

    /// The item index of the run in `dir`, built on first use or when `labels.jsonl`
    /// changed.
    fn index(&self, dir: &std::path::Path) -> Result<Arc<items::Index>, ApiError> {
        let labels = dir.join("labels.jsonl");
        let meta = std::fs::metadata(&labels).map_err(|_| {
            ApiError(
                StatusCode::NOT_FOUND,
                format!(
                    "{} is not there yet: a run's items are browsable once it finishes (its coordinator writes them with the report)",
                    labels.display()
                ),
            )
        })?;
        let stamp = (meta.len(), meta.modified().unwrap_or(std::time::UNIX_EPOCH));
        {
            let cache = self.indexes.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((len, t, ix)) = cache.get(dir) {
                if (*len, *t) == stamp {
                    return Ok(ix.clone());
                }
            }
        }
        let ix = Arc::new(
            items::Index::build(dir).map_err(|e| ApiError(StatusCode::UNPROCESSABLE_ENTITY, e))?,
        );
        let mut cache = self.indexes.lock().unwrap_or_else(|p| p.into_inner());
        cache.insert(dir.to_path_buf(), (stamp.0, stamp.1, ix.clone()));
        Ok(ix)
    }
}

/// Run blocking file work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("view task failed: {e}"))
    })?
}

fn with_headers(mut r: Response, csp: &'static str) -> Response {
    let h = r.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(csp));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

async fn shell() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], APP_HTML).into_response()
}

async fn api_runs(State(s): State<Shared>) -> Result<Response, ApiError> {
    let broker = s.broker.clone();
    let mut list = blocking(move || {
        Ok(s.runs().iter().map(|(k, d)| runs::summary(k, d)).collect::<Vec<runs::RunSummary>>())
    })
    .await?;
    if let Some(b) = broker {
        // Runs on other machines: those whose name no directory here has.
        match halyard_broker::status::entries(&b, halyard_broker::status::STATUS_BUCKET).await {
            Ok(entries) => {
                for (key, bytes) in entries {
                    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
                        tracing::warn!(key, "unreadable status entry on the broker");
                        continue;
                    };
                    if !list.iter().any(|r| v["name"].as_str() == Some(r.name.as_str())) {
                        list.push(runs::from_broker(v));
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot read the broker's status bucket"),
        }
    }
    Ok(json(&list))
}

async fn api_run(
    State(s): State<Shared>,
    UrlPath(key): UrlPath<String>,
) -> Result<Response, ApiError> {
    blocking(move || {
        let dir = s.run_dir(&key)?;
        let summary = runs::summary(&key, &dir);
        let facets = match s.index(&dir) {
            Ok(ix) => Some(ix.facets()),
            Err(_) => None,
        };
        Ok(json(&serde_json::json!({ "run": summary, "facets": facets })))
    })
    .await
}

async fn api_items(
    State(s): State<Shared>,
    UrlPath(key): UrlPath<String>,
    Query(q): Query<items::Query>,
) -> Result<Response, ApiError> {
    blocking(move || {
        let dir = s.run_dir(&key)?;
        let ix = s.index(&dir)?;
        let page = ix.page(&q).map_err(|e| ApiError(StatusCode::BAD_REQUEST, e))?;
        Ok(json(&page))
    })
    .await
}

async fn api_item(
    State(s): State<Shared>,
    UrlPath((key, row)): UrlPath<(String, usize)>,
) -> Result<Response, ApiError> {
    blocking(move || {
        let dir = s.run_dir(&key)?;
        let ix = s.index(&dir)?;
        let report = runs::read_json(&dir.join("report.json"))
            .map_err(|e| ApiError(StatusCode::UNPROCESSABLE_ENTITY, e))?
            .unwrap_or_default();
        let dead = report["dead_letters"].as_array().cloned().unwrap_or_default();
        let item = ix.item(row, &dead).map_err(|e| ApiError(StatusCode::NOT_FOUND, e))?;
        Ok(json(&item))
    })
    .await
}

/// A run's `report.html`, as its report renderer wrote it.
async fn report_html(
    State(s): State<Shared>,
    UrlPath(key): UrlPath<String>,
) -> Result<Response, ApiError> {
    blocking(move || {
        let dir = s.run_dir(&key)?;
        let html = std::fs::read_to_string(dir.join("report.html")).map_err(|e| {
            ApiError(
                StatusCode::NOT_FOUND,
                format!(
                    "{}: {e} (a run has its report once it finishes)",
                    dir.join("report.html").display()
                ),
            )
        })?;
        let r = ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response();
        Ok(with_headers(r, CSP_REPORT))
    })
    .await
}

#[derive(Deserialize)]
struct CompareQuery {
    /// Run keys, comma-separated.
    runs: String,
    /// The difference whose n needed is asked for (default 0.05).
    target: Option<f64>,
    group: Option<String>,
    figure: Option<String>,
    a: Option<String>,
    b: Option<String>,
}

fn compare_runs(s: &AppState, q: &CompareQuery) -> Result<compare::Runs, ApiError> {
    let all = s.runs();
    let mut picked = Vec::new();
    for k in q.runs.split(',').map(str::trim).filter(|k| !k.is_empty()) {
        let dir = all.get(k).ok_or_else(|| {
            ApiError(StatusCode::NOT_FOUND, format!("no run {k:?} under the directories viewed"))
        })?;
        picked.push((k.to_string(), dir.clone()));
    }
    if picked.is_empty() {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            "runs=: name one run (its models are compared) or more".into(),
        ));
    }
    compare::load(&picked).map_err(|e| ApiError(StatusCode::UNPROCESSABLE_ENTITY, e))
}

async fn api_compare(
    State(s): State<Shared>,
    Query(q): Query<CompareQuery>,
) -> Result<Response, ApiError> {
    let target = q.target.unwrap_or(0.05);
    if !(target > 0.0 && target < 1.0) {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!("target={target}: a difference of rates between 0 and 1"),
        ));
    }
    blocking(move || {
        let runs = compare_runs(&s, &q)?;
        Ok(json(&compare::compare(&runs, target)))
    })
    .await
}

async fn api_discordant(
    State(s): State<Shared>,
    Query(q): Query<CompareQuery>,
) -> Result<Response, ApiError> {
    blocking(move || {
        let runs = compare_runs(&s, &q)?;
        let need = |v: &Option<String>, k: &str| {
            v.clone().ok_or_else(|| ApiError(StatusCode::BAD_REQUEST, format!("{k}= is missing")))
        };
        let (g, f, a, b) = (
            need(&q.group, "group")?,
            need(&q.figure, "figure")?,
            need(&q.a, "a")?,
            need(&q.b, "b")?,
        );
        Ok(json(&compare::discordant(&runs, &g, &f, &a, &b)))
    })
    .await
}

fn asset(body: &'static str, kind: &'static str) -> Response {
    ([(header::CONTENT_TYPE, kind)], body).into_response()
}

/// The app's routes over `dirs`.
pub fn router(dirs: Vec<PathBuf>, broker: Option<halyard_broker::Broker>) -> Router {
    let state = Arc::new(AppState { dirs, broker, indexes: Mutex::new(HashMap::new()) });
    let app = Router::new()
        .route("/", get(shell))
        .route("/run/{key}", get(shell))
        .route("/compare", get(shell))
        .route("/assets/app.js", get(|| async { asset(APP_JS, "text/javascript; charset=utf-8") }))
        .route("/assets/app.css", get(|| async { asset(APP_CSS, "text/css; charset=utf-8") }))
        .route("/api/runs", get(api_runs))
        .route("/api/run/{key}", get(api_run))
        .route("/api/run/{key}/items", get(api_items))
        .route("/api/run/{key}/item/{row}", get(api_item))
        .route("/api/compare", get(api_compare))
        .route("/api/compare/discordant", get(api_discordant))
        .with_state(state.clone());
    // The report's own page, under its own policy (set in its handler).
    let report = Router::new().route("/run/{key}/report.html", get(report_html)).with_state(state);
    app.layer(axum::middleware::map_response(|r: Response| async move { with_headers(r, CSP_APP) }))
        .merge(report)
}

/// Serve the view until `shutdown`; `ready` gets the address bound (port 0 picks one).
pub async fn run(
    cfg: ViewConfig,
    shutdown: watch::Receiver<bool>,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), NodeError> {
    for d in &cfg.dirs {
        if !d.is_dir() && cfg.nats.is_some() {
            tracing::warn!(dir = %d.display(), "not a directory: only the broker's runs are listed from it");
        } else if !d.is_dir() {
            return Err(NodeError::Usage(format!(
                "halyard view: {} is not a directory",
                d.display()
            )));
        }
    }
    let broker = match &cfg.nats {
        Some(url) => Some(
            halyard_broker::connect(
                &halyard_broker::BrokerConfig::new(url.clone(), "halyard-view")
                    .with_auth(cfg.auth.clone()),
            )
            .await?,
        ),
        None => None,
    };
    let listener = tokio::net::TcpListener::bind(cfg.addr).await.map_err(|e| NodeError::Io {
        what: format!("halyard view: cannot listen on {}", cfg.addr),
        source: e,
    })?;
    let local = listener
        .local_addr()
        .map_err(|e| NodeError::Io { what: "halyard view: local address".into(), source: e })?;
    ready(local);
    axum::serve(listener, router(cfg.dirs, broker))
        .with_graceful_shutdown(crate::shutdown::until(shutdown))
        .await
        .map_err(|e| NodeError::Io { what: format!("halyard view on {local}"), source: e })
}

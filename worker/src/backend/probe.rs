//! The first-contact probe of one API model (issue 48): what `halyard check` prints and
//! what `halyard run` checks before anything starts. It speaks the model's dialect
//! ([`Dialect`]): an OpenAI-compatible API (bearer key, `/chat/completions`) or
//! Anthropic's Messages API (`x-api-key` and `anthropic-version`, `/messages`, issue 52);
//! both list their models at `GET {base_url}/models` in the same shape.
//!
//! With this machine's keys, as a worker here would send them:
//!
//! 1. the URL must be one the workers would call (`https://`, or `http://` to loopback
//!    unless insecure HTTP is allowed), and the key variable set and not empty;
//! 2. `GET {base_url}/models` (free on every provider): whether anything listens (a
//!    refused connection, DNS, TLS), whether the key is accepted (401/403), and the
//!    server's model list when it has one; a 200 that is not JSON means `base_url`
//!    points at something else (a web page);
//! 3. with `calls`, one minimal chat completion or message (`max_tokens` =
//!    [`PROBE_MAX_TOKENS`]):
//!    the route (404), whether the server knows the model name, and whether the answer
//!    has the API's shape; its latency and token usage (the probe's cost) are kept.
//!
//! Step 3 is the only paid request. A server without a model list (404 on `/models`) is
//! not a failure: llama.cpp's server, for one, answers under any model name. A 429 or a
//! 5xx is not a wrong endpoint but a busy or broken one: reported, not a failure of
//! first contact (the run's outage handling waits for such an endpoint).

use std::time::{Duration, Instant};

use halyard_proto::{redact, OutageReason, Usage};

use crate::backend::anthropic::{decode_message, ANTHROPIC_VERSION};
use crate::backend::http_error::error_chain;
use crate::backend::http_guard::{check_url, read_body, HttpPolicy, KeyHosts};
use crate::backend::openai::{classify_transport, decode_completion};
use crate::call_error::ErrorClass;

/// `max_tokens` of the probe's chat completion.
pub const PROBE_MAX_TOKENS: u32 = 5;
/// The longest wait for the model list.
const LIST_TIMEOUT: Duration = Duration::from_secs(10);
/// Model names shown from the server's list.
const LIST_SHOWN: usize = 20;
/// The most of a probe's answer read: a model list of thousands of models fits.
const PROBE_BODY_LIMIT: u64 = 8 << 20;

/// One model to probe.
#[derive(Clone, Debug)]
pub struct Target {
    /// The sweep's name for it.
    pub name: String,
    pub base_url: String,
    /// The model name sent to the API.
    pub model: String,
    pub api_key_env: Option<String>,
    /// The model's `timeout_s`, for the chat completion.
    pub timeout: Duration,
    /// `--allow-insecure-http`: a key may go over plain http:// to a host that is not
    /// loopback (as the workers' check at start allows it).
    pub allow_insecure_http: bool,
    pub dialect: Dialect,
}

/// The API a model speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// `backend = "openai"`: any OpenAI-compatible server.
    OpenAi,
    /// `backend = "anthropic"`: the Messages API.
    Anthropic,
}

impl Dialect {
    /// The dialect of a sweep backend that speaks HTTP to an API, if it is one.
    pub fn of_backend(backend: &str) -> Option<Dialect> {
        match backend {
            "openai" => Some(Dialect::OpenAi),
            "anthropic" => Some(Dialect::Anthropic),
            _ => None,
        }
    }

    /// The route of a completion under `base_url`.
    fn route(self) -> &'static str {
        match self {
            Dialect::OpenAi => "/chat/completions",
            Dialect::Anthropic => "/messages",
        }
    }

    /// What its answer is called in messages.
    fn answer(self) -> &'static str {
        match self {
            Dialect::OpenAi => "an OpenAI chat completion",
            Dialect::Anthropic => "an Anthropic message",
        }
    }
}

/// One column of the probe's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    Yes,
    No,
    /// Not tested (an earlier check failed, or no call was made).
    Unknown,
}

impl Check {
    pub fn as_str(self) -> &'static str {
        match self {
            Check::Yes => "yes",
            Check::No => "NO",
            Check::Unknown => "-",
        }
    }
}

/// What the probe found; `problem` is set when the model cannot serve.
#[derive(Clone, Debug)]
pub struct Report {
    pub reachable: Check,
    pub key_accepted: Check,
    pub model_known: Check,
    pub answer_shape: Check,
    /// Of the chat completion, when one answered.
    pub latency: Option<Duration>,
    /// Tokens the chat completion used (the probe's cost).
    pub usage: Option<Usage>,
    /// The server's model list, when `/models` gave one.
    pub listed: Option<Vec<String>>,
    /// Why the model cannot serve, with the fix; the reason as the pool-health records
    /// name it (None for a key that is not set).
    pub problem: Option<(Option<OutageReason>, String)>,
    /// Worth knowing, not a failure (a 429, a 5xx, a model missing from the list).
    pub notes: Vec<String>,
}

impl Report {
    fn new() -> Report {
        Report {
            reachable: Check::Unknown,
            key_accepted: Check::Unknown,
            model_known: Check::Unknown,
            answer_shape: Check::Unknown,
            latency: None,
            usage: None,
            listed: None,
            problem: None,
            notes: Vec::new(),
        }
    }

    fn fail(mut self, reason: Option<OutageReason>, text: String) -> Report {
        self.problem = Some((reason, text));
        self
    }

    /// Whether the model can serve as far as the probe could tell.
    pub fn ok(&self) -> bool {
        self.problem.is_none()
    }
}

/// The HTTP client of probes (the workers' TLS provider and roots).
pub fn client() -> Result<reqwest::Client, String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))
}

/// Probe `t`; see the module docs. `calls`: make the chat completion (step 3).
pub async fn probe(client: &reqwest::Client, t: &Target, calls: bool) -> Report {
    let r = Report::new();
    let url = redact::url(t.base_url.trim_end_matches('/'));
    let policy = HttpPolicy { allow_insecure_http: t.allow_insecure_http, ..Default::default() };
    if let Err(e) = check_url(&t.base_url, policy) {
        return r.fail(None, e);
    }
    // The key goes only where this machine's operator allows (issue 49).
    if let Some(var) = &t.api_key_env {
        if let Err(e) = KeyHosts::from_env().and_then(|h| h.check(var, &t.base_url)) {
            return r.fail(None, e);
        }
    }
    let key = match &t.api_key_env {
        None => None,
        Some(var) => match std::env::var(var) {
            Ok(k) if !k.is_empty() => Some(k),
            Ok(_) => return r.fail(None, format!("`${var}` (its api_key_env) is empty on this machine: set it to the API key")),
            Err(_) => return r.fail(None, format!("`${var}` (its api_key_env) is not set on this machine: export {var}=<the API key>")),
        },
    };
    let r = list(client, t, &url, key.as_deref(), r).await;
    if !calls || !r.ok() {
        return r;
    }
    chat(client, t, &url, key.as_deref(), r).await
}

/// Step 2: the model list.
async fn list(
    client: &reqwest::Client,
    t: &Target,
    url: &str,
    key: Option<&str>,
    mut r: Report,
) -> Report {
    let req = client
        .get(format!("{}/models", t.base_url.trim_end_matches('/')))
        .timeout(LIST_TIMEOUT.min(t.timeout.max(Duration::from_secs(1))));
    let (status, body) = match send(req, key, t, url, &mut r).await {
        Ok(answer) => answer,
        Err(()) => return r,
    };
    match status {
        401 | 403 => return refused(r, t, url, status),
        200 => {}
        _ => return r,
    }
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body) else {
        r.answer_shape = Check::No;
        return r.fail(
            Some(OutageReason::NotApi),
            format!(
                "{url}/models answered 200 with something that is not JSON (starts {:?}): \
                 `base_url` points at another service; an OpenAI-compatible API's usually ends in /v1",
                snippet(&body)
            ),
        );
    };
    if key.is_some() {
        r.key_accepted = Check::Yes;
    }
    let ids: Option<Vec<String>> = v["data"]
        .as_array()
        .map(|a| a.iter().filter_map(|m| m["id"].as_str().map(str::to_string)).collect());
    if let Some(ids) = ids {
        if ids.contains(&t.model) {
            r.model_known = Check::Yes;
        } else {
            r.notes.push(format!(
                "{url}/models does not list {:?} (it lists {}); some servers answer any name",
                t.model,
                shown(&ids)
            ));
        }
        r.listed = Some(ids);
    }
    r
}

/// Step 3: one minimal chat completion.
async fn chat(
    client: &reqwest::Client,
    t: &Target,
    url: &str,
    key: Option<&str>,
    mut r: Report,
) -> Report {
    let body = serde_json::json!({
        "model": t.model,
        "messages": [{"role": "user", "content": "Reply with the word OK."}],
        "max_tokens": PROBE_MAX_TOKENS,
        "temperature": 0.0,
    });
    let route = t.dialect.route();
    let req = client
        .post(format!("{}{route}", t.base_url.trim_end_matches('/')))
        .json(&body)
        .timeout(t.timeout.max(Duration::from_secs(1)));
    let started = Instant::now();
    let (status, bytes) = match send(req, key, t, url, &mut r).await {
        Ok(answer) => answer,
        Err(()) => return r,
    };
    match status {
        200 => {}
        401 | 403 => return refused(r, t, url, status),
        404 => return not_found(r, t, url, &bytes),
        429 => {
            r.key_accepted = Check::Yes;
            r.notes.push(format!("{url} is rate limiting this key now (HTTP 429)"));
            return r;
        }
        s if s >= 500 => {
            r.notes.push(format!(
                "{url}{route} answers HTTP {s} now (the server is up but not serving: loading, overloaded, or a proxy without its backend): {:?}",
                snippet(&bytes)
            ));
            return r;
        }
        s => {
            return r.fail(
                None,
                format!("{url}{route} refused the probe with HTTP {s}: {:?}", snippet(&bytes)),
            )
        }
    }
    r.latency = Some(started.elapsed());
    if key.is_some() {
        r.key_accepted = Check::Yes;
    }
    r.model_known = Check::Yes;
    let decoded = match t.dialect {
        Dialect::OpenAi => decode_completion(&bytes).map(|d| d.usage),
        Dialect::Anthropic => decode_message(&bytes, None).map(|d| d.usage),
    };
    match decoded {
        Ok(usage) => {
            r.answer_shape = Check::Yes;
            r.usage = Some(usage);
            r
        }
        // A completion without text (the token limit hit before any): the API's shape.
        Err(e) if e.class == ErrorClass::Permanent => {
            r.answer_shape = Check::Yes;
            r
        }
        Err(_) => {
            r.answer_shape = Check::No;
            r.fail(
                Some(OutageReason::NotApi),
                format!(
                    "{url}{route} answered 200 with something that is not {} (starts {:?}): \
                     `base_url` points at another service; an API's usually ends in /v1",
                    t.dialect.answer(),
                    snippet(&bytes)
                ),
            )
        }
    }
}

/// Send one probe request (with the key, if any) and read its answer's status and body,
/// at most [`PROBE_BODY_LIMIT`] bytes of it (a body beyond that, or one cut off, reads as
/// empty: no answer of an API's probe is that large). A request that reached nothing is
/// recorded in `r` as the transport failure it was, and `Err` returned.
async fn send(
    mut req: reqwest::RequestBuilder,
    key: Option<&str>,
    t: &Target,
    url: &str,
    r: &mut Report,
) -> Result<(u16, Vec<u8>), ()> {
    if let Some(k) = key {
        req = match t.dialect {
            Dialect::OpenAi => req.bearer_auth(k),
            Dialect::Anthropic => req.header("x-api-key", k),
        };
    }
    if t.dialect == Dialect::Anthropic {
        req = req.header("anthropic-version", ANTHROPIC_VERSION);
    }
    let resp = match req.send().await {
        Ok(resp) => resp,
        Err(e) => {
            *r = transport(std::mem::replace(r, Report::new()), t, url, &e);
            return Err(());
        }
    };
    r.reachable = Check::Yes;
    let status = resp.status().as_u16();
    let body = read_body(resp, PROBE_BODY_LIMIT, url).await.unwrap_or_default();
    Ok((status, body))
}

fn transport(mut r: Report, t: &Target, url: &str, e: &reqwest::Error) -> Report {
    let (class, _) = classify_transport(e);
    let reason = match class {
        ErrorClass::Unavailable(reason) => reason,
        _ => OutageReason::Connection,
    };
    r.reachable = Check::No;
    let detail = redact::secrets(&error_chain(e).replace(t.base_url.as_str(), url));
    let text = match reason {
        OutageReason::Dns => {
            format!("the host name of {url} does not resolve (DNS); fix `base_url` ({detail})")
        }
        OutageReason::Tls => format!(
            "the TLS handshake with {url} failed: a certificate this machine does not trust, or \
             https:// to a plain-HTTP server; fix `base_url` or the server's certificate ({detail})"
        ),
        OutageReason::Timeout => format!(
            "{url} took the connection but did not answer within {:?} ({detail})",
            t.timeout
        ),
        _ => format!("nothing listens at {url}; start the server or fix `base_url` ({detail})"),
    };
    r.fail(Some(reason), text)
}

fn refused(mut r: Report, t: &Target, url: &str, status: u16) -> Report {
    r.key_accepted = Check::No;
    let text = match &t.api_key_env {
        Some(var) => format!(
            "{url} refused the key in `${var}` (HTTP {status}); set `{var}` to a key it accepts"
        ),
        None => format!(
            "{url} wants an API key (HTTP {status}); set the model's `api_key_env` to the name \
             of the variable that holds it"
        ),
    };
    r.fail(Some(OutageReason::Unauthorized), text)
}

fn not_found(mut r: Report, t: &Target, url: &str, body: &[u8]) -> Report {
    let said = String::from_utf8_lossy(body).to_ascii_lowercase();
    // A server whose model list answered, or whose 404 speaks of the model, has the
    // route: the name is what it does not know.
    let about_model = r.listed.is_some() || said.contains("model");
    let text = if about_model {
        r.model_known = Check::No;
        let listed = match &r.listed {
            Some(ids) => format!("; the server lists {}", shown(ids)),
            None => String::new(),
        };
        format!(
            "{url} does not know the model {:?} (HTTP 404: {:?}){listed}; fix `model`",
            t.model,
            snippet(body)
        )
    } else {
        format!(
            "nothing serves {url}{} (HTTP 404): a wrong route in `base_url` (an API's \
             usually ends in /v1)",
            t.dialect.route()
        )
    };
    r.fail(Some(OutageReason::NotFound), text)
}

/// The list as shown in messages (the first [`LIST_SHOWN`] names).
fn shown(ids: &[String]) -> String {
    if ids.is_empty() {
        return "no model".into();
    }
    let mut s: Vec<String> = ids.iter().take(LIST_SHOWN).map(|i| format!("{i:?}")).collect();
    if ids.len() > LIST_SHOWN {
        s.push(format!("… {} more", ids.len() - LIST_SHOWN));
    }
    s.join(", ")
}

fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(120)]);
    redact::secrets(text.trim())
}

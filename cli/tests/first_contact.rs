//! First contact (issue 48): a sweep whose endpoint never answers fails in seconds with
//! the fix named, not after `outage_patience_s`. Real sockets for each failure: nothing
//! listening, a TLS server whose certificate nobody trusts, 401, a 404 route, an
//! unknown model (with the server's model list), a body that is not the API's shape;
//! `halyard check` on the example sweep against the test kit's fake server.
//!
//! `halyard run` checks keys and endpoints first (exit 5 before anything starts); with
//! `--no-check` the workers pause the pool that never answered and the coordinator stops
//! the run after `[run] first_contact_s` (exit 5, resumable). Each run is bounded by
//! [`BOUND`], far below the default `outage_patience_s` of 6 h it replaces.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use std::time::{Duration, Instant};

use halyard_tests::{FakeOpenAi, Reply};

use crate::common::{
    dataset, halyard, load_questions, question_index, read_json, responder, write_sweep,
};

/// Exit status of a run stopped at first contact and of `halyard check` when a model
/// cannot serve.
const EXIT_CANNOT_SERVE: i32 = 5;
/// The longest a failing run may take here, start-up on a loaded machine included (the
/// sweeps set `first_contact_s = 3`).
const BOUND: Duration = Duration::from_secs(120);

/// A two-model HypoTermQA sweep (model-a, judge-a) on `base_url`, stopping at first
/// contact after 3 s; `key_env` adds `api_key_env` to both models.
fn sweep(dir: &Path, base_url: &str, key_env: Option<&str>) -> PathBuf {
    let path = write_sweep(dir, "fc", base_url, 4, 2);
    let mut text = std::fs::read_to_string(&path).unwrap();
    text = text.replace("[run]\n", "[run]\nfirst_contact_s = 3\n");
    if let Some(var) = key_env {
        text = text.replace(
            "backend = \"openai\"",
            &format!("backend = \"openai\"\napi_key_env = \"{var}\""),
        );
    }
    std::fs::write(&path, text).unwrap();
    path
}

/// `halyard run SWEEP` (plus `extra`) with `env` (None: unset), its output through
/// files beside `out`; panics past [`BOUND`].
fn run(sweep: &Path, out: &Path, extra: &[&str], env: &[(&str, Option<&str>)]) -> Output {
    let mut c = halyard();
    c.args(["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()]).args(extra);
    for (k, v) in env {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    let (so, se) = (out.with_extension("stdout"), out.with_extension("stderr"));
    c.stdout(std::fs::File::create(&so).unwrap()).stderr(std::fs::File::create(&se).unwrap());
    let started = Instant::now();
    let mut child = halyard_tests::ChildGuard::spawn(c);
    let status = child.wait_timeout(BOUND).unwrap_or_else(|| {
        panic!(
            "halyard run {extra:?} did not stop within {BOUND:?}:\n{}",
            std::fs::read_to_string(&se).unwrap_or_default()
        )
    });
    eprintln!("halyard run {extra:?}: {:?} after {:?}", status.code(), started.elapsed());
    Output { status, stdout: std::fs::read(&so).unwrap(), stderr: std::fs::read(&se).unwrap() }
}

/// Exit 5 and every needle in stderr.
fn assert_refused(o: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(EXIT_CANNOT_SERVE), "stderr:\n{stderr}");
    for n in needles {
        assert!(stderr.contains(n), "{n:?} not in stderr:\n{stderr}");
    }
}

/// A loopback port where nothing listens (bound, then closed).
fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A plain HTTP/1.1 server on its own thread: `answer(method, path)` gives status,
/// content type and body; every connection is closed after one answer.
fn http_server(answer: fn(&str, &str) -> (u16, &'static str, String)) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || serve_one(s, answer));
        }
    });
    format!("http://{addr}")
}

fn serve_one(mut s: TcpStream, answer: fn(&str, &str) -> (u16, &'static str, String)) {
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let Ok(n) = s.read(&mut chunk) else { return };
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let length = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string())
        })
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let mut words = head.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let (status, ctype, body) = answer(method, path);
    let _ = write!(
        s,
        "HTTP/1.1 {status} X\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// A TLS server on loopback whose certificate (made here with rcgen) nobody trusts.
fn tls_server() -> String {
    let rcgen::CertifiedKey { cert, signing_key } =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()]).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(signing_key.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![cert.der().clone()], key)
    .unwrap();
    let config = Arc::new(config);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let config = config.clone();
            std::thread::spawn(move || {
                s.set_read_timeout(Some(Duration::from_secs(10))).ok();
                let conn = rustls::ServerConnection::new(config).unwrap();
                let mut tls = rustls::StreamOwned::new(conn, s);
                // Drives the handshake, which the client breaks off: the certificate.
                let _ = tls.read(&mut [0u8; 64]);
            });
        }
    });
    format!("https://{addr}")
}

/// Nothing listens at `base_url`: `halyard run` refuses before anything starts, naming
/// the models, the URL and the fix; `--no-check` starts, the pool never answers, and the
/// coordinator stops the run after `first_contact_s` with the same fix.
#[test]
fn nothing_listening_is_named_in_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("http://127.0.0.1:{}/v1", closed_port());
    let sweep = sweep(dir.path(), &url, None);
    let out = dir.path().join("runs");
    let o = run(&sweep, &out, &[], &[]);
    assert_refused(
        &o,
        &[
            "model \"model-a\"",
            &format!("nothing listens at {url}; start the server or fix `base_url`"),
            "nothing was started",
        ],
    );
    assert!(!out.join("fc").join("nats").exists(), "the check started a broker");

    let o = run(&sweep, &out, &["--no-check"], &[]);
    assert_refused(
        &o,
        &[
            "has not answered since the run began",
            &format!("nothing listens at {url}; start the server or fix `base_url`"),
            "model \"model-a\"",
        ],
    );
    let run_dir = out.join("fc");
    assert_eq!(halyard_coordinator::dead_letters::count(&run_dir).unwrap(), 0);
}

/// A TLS server with a certificate nobody trusts: the handshake is named, with the fix.
#[test]
fn unknown_tls_certificate_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("{}/v1", tls_server());
    let sweep = sweep(dir.path(), &url, None);
    let o = run(&sweep, &dir.path().join("runs"), &[], &[]);
    assert_refused(&o, &[&format!("the TLS handshake with {url} failed"), "certificate"]);
}

/// A key variable that is not set, or is empty, is refused before anything starts,
/// naming it (by the check, and with `--no-check` by the workers' start); a key the API
/// refuses (401) stops the run at first contact naming `$VAR`, no job dead-lettered,
/// and the same command with the right key then completes.
#[test]
fn refused_or_missing_key_names_the_variable() {
    const VAR: &str = "FIRST_CONTACT_TEST_API_KEY";
    const GOOD: &str = "sk-good-first-contact";
    let qs = load_questions(4);
    let rules = responder(question_index(&qs), None);
    let fake = FakeOpenAi::start_blocking(move |c| {
        if c.authorization.as_deref() == Some(&format!("Bearer {GOOD}")) {
            rules(c)
        } else {
            Reply::Status {
                code: 401,
                body:
                    r#"{"error":{"message":"Incorrect API key provided","code":"invalid_api_key"}}"#
                        .into(),
                retry_after: None,
            }
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let sweep = sweep(dir.path(), &fake.base_url(), Some(VAR));
    let out = dir.path().join("runs");

    let o = run(&sweep, &out, &[], &[(VAR, None)]);
    assert_refused(&o, &[&format!("`${VAR}` (its api_key_env) is not set on this machine")]);
    let o = run(&sweep, &out, &[], &[(VAR, Some(""))]);
    assert_refused(&o, &[&format!("`${VAR}` (its api_key_env) is empty on this machine")]);
    let o = run(&sweep, &out, &["--no-check"], &[(VAR, None)]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("${VAR}, which is not set on this machine")), "{stderr}");
    assert!(fake.calls().is_empty(), "a call went out without its key");

    let o = run(&sweep, &out, &[], &[(VAR, Some("sk-wrong"))]);
    assert_refused(
        &o,
        &[
            "has not answered since the run began",
            &format!("refused the key in `${VAR}`"),
            &format!("set `{VAR}` to a key it accepts"),
        ],
    );
    assert!(!String::from_utf8_lossy(&o.stderr).contains("sk-wrong"), "the key was logged");
    let run_dir = out.join("fc");
    assert_eq!(halyard_coordinator::dead_letters::count(&run_dir).unwrap(), 0);
    assert!(fake.paid_calls().is_empty());

    // Fixed: the same command completes, every job answered once.
    let mut c = halyard();
    c.args(["run", sweep.to_str().unwrap(), "--out", out.to_str().unwrap()]).env(VAR, GOOD);
    let o = c.output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let report = read_json(&run_dir.join("report.json"));
    assert_eq!(report["jobs"]["dead_letters"], 0);
    // The 401s were never paid; the completed run's calls are all there are.
    assert_eq!(
        fake.paid_calls().len(),
        fake.calls()
            .iter()
            .filter(|c| c.authorization.as_deref() == Some(&format!("Bearer {GOOD}")))
            .count()
    );
}

/// `base_url` without its `/v1`: every call gets a 404 from the server's router; the
/// run stops at first contact naming the route.
#[test]
fn wrong_route_is_named() {
    let fake = FakeOpenAi::start_blocking(|_| Reply::Text("unused".into()));
    let dir = tempfile::tempdir().unwrap();
    let url = fake.base_url().trim_end_matches('/').trim_end_matches("/v1").to_string() + "/api";
    let sweep = sweep(dir.path(), &url, None);
    let o = run(&sweep, &dir.path().join("runs"), &[], &[]);
    assert_refused(
        &o,
        &[
            "has not answered since the run began",
            &format!("{url}/chat/completions answered 404: a wrong route"),
        ],
    );
}

/// A server that lists its models and answers 404 for the sweep's: the check names the
/// model and lists the server's; `halyard check` shows it in the table.
#[test]
fn unknown_model_lists_the_servers_models() {
    let url = http_server(|method, path| {
        match (method, path) {
        ("GET", "/v1/models") => (
            200,
            "application/json",
            r#"{"object":"list","data":[{"id":"served-model","object":"model"}]}"#.into(),
        ),
        ("POST", "/v1/chat/completions") => (
            404,
            "application/json",
            r#"{"error":{"message":"The model `fake-model` does not exist.","code":"model_not_found"}}"#.into(),
        ),
        _ => (404, "text/plain", "not found".into()),
    }
    }) + "/v1";
    let dir = tempfile::tempdir().unwrap();
    let sweep = sweep(dir.path(), &url, None);
    let o = run(&sweep, &dir.path().join("runs"), &[], &[]);
    assert_refused(
        &o,
        &[
            &format!("{url} does not know the model \"fake-model\""),
            "the server lists \"served-model\"; fix `model`",
        ],
    );
    let c = halyard().args(["check", sweep.to_str().unwrap()]).output().unwrap();
    let stdout = String::from_utf8_lossy(&c.stdout);
    assert_eq!(c.status.code(), Some(EXIT_CANNOT_SERVE), "{stdout}");
    let row = stdout.lines().find(|l| l.starts_with("model-a")).unwrap_or_default();
    let cells: Vec<&str> = row.split("  ").filter(|c| !c.is_empty()).map(str::trim).collect();
    assert_eq!(cells.get(2..6), Some(&["yes", "-", "NO", "-"][..]), "{stdout}");
}

/// A 200 that is not JSON (a web page at `base_url`): the run stops at first contact
/// saying the URL points at something that is not the API.
#[test]
fn answer_not_of_the_apis_shape_is_named() {
    let url = http_server(|_, path| match path {
        "/v1/chat/completions" => {
            (200, "text/html", "<html><body>Welcome to nginx!</body></html>".into())
        }
        _ => (404, "text/html", "<html>404</html>".into()),
    }) + "/v1";
    let dir = tempfile::tempdir().unwrap();
    let sweep = sweep(dir.path(), &url, None);
    let o = run(&sweep, &dir.path().join("runs"), &[], &[]);
    assert_refused(
        &o,
        &[
            "has not answered since the run began",
            &format!("{url} answered with something that is not an OpenAI chat completion"),
        ],
    );
}

/// `halyard check` on the README's API example against the test kit's fake server: one
/// minimal call, a table of yes, exit 0; `--no-calls` makes none; nothing listening is
/// NO and exit 5.
#[test]
fn check_on_the_example_sweep() {
    let fake = FakeOpenAi::start_blocking(|_| Reply::Text("OK".into()));
    let dir = tempfile::tempdir().unwrap();
    let example = crate::common::repo_root().join("examples/hypotermqa-openai.toml");
    let text = std::fs::read_to_string(&example)
        .unwrap()
        .replace("http://127.0.0.1:8080/v1", &fake.base_url())
        .replace("../datasets/hypotermqa/HypoTermQA_180.jsonl", dataset().to_str().unwrap());
    let sweep = dir.path().join("hypotermqa-openai.toml");
    std::fs::write(&sweep, &text).unwrap();
    let o = halyard().args(["check", sweep.to_str().unwrap()]).output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&o.stderr));
    for model in ["model-under-test", "judge"] {
        let row = stdout.lines().find(|l| l.starts_with(model)).unwrap_or_default();
        let cells: Vec<&str> = row.split("  ").filter(|c| !c.is_empty()).map(str::trim).collect();
        assert_eq!(cells.get(2..4), Some(&["yes", "-"][..]), "{stdout}");
        assert_eq!(cells.get(4..6), Some(&["yes", "yes"][..]), "{stdout}");
        assert!(cells.get(6).is_some_and(|l| l.ends_with(" ms")), "{stdout}");
    }
    assert!(stdout.contains("probe calls: 1 chat completion(s)"), "{stdout}");
    let calls = fake.calls();
    assert_eq!(calls.len(), 1, "both models share one endpoint and model: one probe");
    assert_eq!(calls[0].max_tokens, Some(5));

    let o = halyard().args(["check", "--no-calls", sweep.to_str().unwrap()]).output().unwrap();
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(fake.calls().len(), 1, "--no-calls made a call");

    let down = text.replace(&fake.base_url(), &format!("http://127.0.0.1:{}/v1", closed_port()));
    std::fs::write(&sweep, down).unwrap();
    let o = halyard().args(["check", sweep.to_str().unwrap()]).output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(EXIT_CANNOT_SERVE), "{stdout}");
    assert!(stdout.lines().any(|l| l.starts_with("judge") && l.contains(" NO ")), "{stdout}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("nothing listens at"));
}

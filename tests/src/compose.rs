//! Docker Compose projects for the deployment tests: one [`Compose`] per test, under a
//! unique project name (so parallel runs do not collide), torn down with its volumes and
//! the images it built when dropped, even after a panic.
//!
//! Also a minimal HTTP/1.0 GET ([`http_get`]) for the published ports (monitoring,
//! `/stats`, Prometheus' API): std only, no client crate.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::process::ChildGuard;

/// `Ok` when a Docker daemon answers `docker info`; the reason otherwise.
pub fn docker_available() -> Result<(), String> {
    match Command::new("docker").args(["info", "--format", "{{.ServerVersion}}"]).output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_string()),
        Err(e) => Err(format!("docker: {e}")),
    }
}

/// The compose command: `docker compose` (plugin) or `docker-compose` (standalone).
fn compose_program() -> Result<Vec<String>, String> {
    let plugin = Command::new("docker").args(["compose", "version"]).output();
    if plugin.is_ok_and(|o| o.status.success()) {
        return Ok(vec!["docker".into(), "compose".into()]);
    }
    match Command::new("docker-compose").arg("version").output() {
        Ok(o) if o.status.success() => Ok(vec!["docker-compose".into()]),
        _ => Err("neither `docker compose` nor `docker-compose` works".into()),
    }
}

/// Runs `program args`, returning stdout; stderr and the status in the error.
pub fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    stdout_or_error(&format!("{program} {args:?}"), out)
}

/// stdout of a command that succeeded; otherwise an error with everything it printed.
fn stdout_or_error(what: &str, out: std::process::Output) -> Result<String, String> {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        return Ok(stdout);
    }
    Err(format!("{what}: {}\n{stdout}{}", out.status, String::from_utf8_lossy(&out.stderr)))
}

/// A compose project: its files, directory, environment and the images it builds.
pub struct Compose {
    program: Vec<String>,
    project: String,
    dir: PathBuf,
    files: Vec<String>,
    env: HashMap<String, String>,
    /// Image tags to remove on drop (built by this project).
    pub images: Vec<String>,
    /// Volumes to remove on drop: anonymous volumes of containers that a scale-down
    /// removed (`down -v` only finds those of containers still there).
    pub volumes: Vec<String>,
    followers: Vec<ChildGuard>,
}

impl Compose {
    /// A project `name` over `files` (relative to `dir`), with `env` for substitution.
    pub fn new(
        name: &str,
        dir: &Path,
        files: &[&str],
        env: HashMap<String, String>,
    ) -> Result<Compose, String> {
        Ok(Compose {
            program: compose_program()?,
            project: name.to_string(),
            dir: dir.to_path_buf(),
            files: files.iter().map(|f| f.to_string()).collect(),
            env,
            images: Vec::new(),
            volumes: Vec::new(),
            followers: Vec::new(),
        })
    }

    pub fn project(&self) -> &str {
        &self.project
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.program[0]);
        c.args(&self.program[1..]).current_dir(&self.dir).envs(&self.env);
        for f in &self.files {
            c.args(["-f", f]);
        }
        c.args(["-p", &self.project]).args(args).stdin(Stdio::null());
        c
    }

    /// Runs a compose subcommand; its stdout, or an error with everything it printed.
    pub fn run(&self, args: &[&str]) -> Result<String, String> {
        let out = self.command(args).output().map_err(|e| format!("compose: {e}"))?;
        stdout_or_error(&format!("compose {args:?}"), out)
    }

    /// Container ids of a service (running or not).
    pub fn containers(&self, service: &str) -> Result<Vec<String>, String> {
        Ok(self.run(&["ps", "-q", service])?.lines().map(str::to_string).collect())
    }

    /// The host address a container's published `port` is bound to.
    pub fn host_port(container: &str, port: u16) -> Result<SocketAddr, String> {
        let out = run("docker", &["port", container, &format!("{port}/tcp")])?;
        let line = out.lines().find(|l| l.starts_with("127.0.0.1:") || l.starts_with("0.0.0.0:"));
        let line = line.ok_or_else(|| format!("{container}:{port} is not published: {out}"))?;
        line.trim().replace("0.0.0.0:", "127.0.0.1:").parse().map_err(|e| format!("{line}: {e}"))
    }

    /// The published address of `port` of the first container of `service`.
    pub fn service_port(&self, service: &str, port: u16) -> Result<SocketAddr, String> {
        let id = self.containers(service)?.into_iter().next().ok_or(format!("no {service}"))?;
        Compose::host_port(&id, port)
    }

    /// The project's network named `name` in the compose file.
    pub fn network(&self, name: &str) -> String {
        // Compose v1 strips characters other than [a-z0-9_-] from project names.
        format!("{}_{name}", self.project)
    }

    /// Follows a container's logs into `file` until the project is dropped, so that the
    /// logs of containers removed by a scale-down are kept.
    pub fn follow_logs(&mut self, container: &str, file: &Path) -> Result<(), String> {
        let out = std::fs::File::create(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let mut c = Command::new("docker");
        c.args(["logs", "-f", container]).stdout(out).stderr(err).stdin(Stdio::null());
        self.followers.push(ChildGuard::spawn(c));
        Ok(())
    }

    /// Writes the whole log of `container` into `file`: every start of it, which
    /// `docker logs -f` does not follow past the first stop (a container that a restart
    /// policy or `compose start` started again).
    pub fn save_logs(container: &str, file: &Path) -> Result<(), String> {
        let out = std::fs::File::create(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let status = Command::new("docker")
            .args(["logs", container])
            .stdout(out)
            .stderr(err)
            .stdin(Stdio::null())
            .status()
            .map_err(|e| format!("docker logs: {e}"))?;
        if !status.success() {
            return Err(format!("docker logs {container}: {status}"));
        }
        Ok(())
    }

    /// Remembers a container's volumes, to remove them on drop.
    pub fn own_volumes(&mut self, container: &str) -> Result<(), String> {
        let f = "{{range .Mounts}}{{if eq .Type \"volume\"}}{{.Name}} {{end}}{{end}}";
        let names = Compose::inspect(container, f)?;
        self.volumes.extend(names.split_whitespace().map(str::to_string));
        Ok(())
    }

    /// `docker inspect -f FORMAT container`, trimmed.
    pub fn inspect(container: &str, format: &str) -> Result<String, String> {
        Ok(run("docker", &["inspect", "-f", format, container])?.trim().to_string())
    }
}

impl Drop for Compose {
    fn drop(&mut self) {
        let down = self.run(&["down", "-v", "--remove-orphans", "-t", "5"]);
        if let Err(e) = down {
            eprintln!("compose down of {} failed: {e}", self.project);
        }
        for volume in &self.volumes {
            let _ = run("docker", &["volume", "rm", "-f", volume]);
        }
        for image in &self.images {
            let _ = run("docker", &["rmi", "-f", image]);
        }
        for mut f in self.followers.drain(..) {
            f.kill();
        }
    }
}

/// `GET path` over HTTP/1.0: the status code and the body.
pub fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let timeout = Duration::from_secs(5);
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("{addr}: {e}"))?;
    s.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| format!("GET {addr}{path}: {e}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or(format!("GET {path}: no header end"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("GET {path}: bad status line {head:?}"))?;
    Ok((code, body.to_string()))
}

/// `GET path` that must answer 200 with JSON.
pub fn get_json(addr: SocketAddr, path: &str) -> Result<serde_json::Value, String> {
    match http_get(addr, path)? {
        (200, body) => serde_json::from_str(&body).map_err(|e| format!("GET {path}: {e}")),
        (code, body) => Err(format!("GET {path}: HTTP {code}: {body}")),
    }
}

/// Percent-encodes a query-string value.
pub fn query_escape(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Metric names (`halyard_…`) in the `expr` of every panel target of a Grafana dashboard
/// (JSON text); an error names a panel without a query.
pub fn dashboard_metrics(dashboard: &str) -> Result<std::collections::BTreeSet<String>, String> {
    let v: serde_json::Value = serde_json::from_str(dashboard).map_err(|e| e.to_string())?;
    let panels = v["panels"].as_array().ok_or("no panels")?;
    let mut names = std::collections::BTreeSet::new();
    for p in panels {
        let title = p["title"].as_str().unwrap_or("?");
        let targets = p["targets"].as_array().filter(|t| !t.is_empty());
        let targets = targets.ok_or_else(|| format!("panel {title:?} has no query"))?;
        for t in targets {
            let expr = t["expr"].as_str().filter(|e| !e.trim().is_empty());
            let expr = expr.ok_or_else(|| format!("panel {title:?}: a target has no expr"))?;
            let found = metric_names(expr);
            if found.is_empty() && !expr.contains("job=\"halyard-") {
                return Err(format!("panel {title:?}: {expr:?} names no Halyard metric"));
            }
            names.extend(found);
        }
    }
    Ok(names)
}

/// The `halyard_…` identifiers in a PromQL expression.
pub fn metric_names(expr: &str) -> std::collections::BTreeSet<String> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = std::collections::BTreeSet::new();
    let mut rest = expr;
    while let Some(i) = rest.find("halyard_") {
        let before = rest[..i].chars().next_back();
        let len = rest[i..].find(|c: char| !ident(c)).unwrap_or(rest.len() - i);
        if !before.is_some_and(ident) {
            names.insert(rest[i..i + len].to_string());
        }
        rest = &rest[i + len..];
    }
    names
}

/// labels.jsonl rows without their job ids, for comparing two runs of one sweep: a job
/// id hashes the endpoint, and two runs may reach the same API under different URLs.
pub fn normalized_labels(path: &Path) -> Vec<String> {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(o) => {
                o.remove("job_id");
                o.remove("answer_job");
                o.values_mut().for_each(strip);
            }
            Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap();
            strip(&mut v);
            v.to_string()
        })
        .collect()
}

/// report.json's `benchmarks` without the dataset paths (which differ between hosts).
pub fn strip_dataset(benchmarks: &Value) -> Value {
    let mut b = benchmarks.clone();
    for item in b.as_array_mut().into_iter().flatten() {
        if let Some(o) = item.as_object_mut() {
            o.remove("dataset");
        }
    }
    b
}

/// The first value of the instant vector `query` evaluates to in Prometheus (0 if none).
pub fn prometheus_value(prometheus: SocketAddr, query: &str) -> f64 {
    let v = get_json(prometheus, &format!("/api/v1/query?query={}", query_escape(query))).unwrap();
    v["data"]["result"][0]["value"][1].as_str().and_then(|s| s.parse().ok()).unwrap_or(0.0)
}

//! A real `nats-server` with JetStream, per test.
//!
//! [`NatsServer::start`] runs the binary on `127.0.0.1` at a free port with its store
//! in a fresh temporary directory, and returns once the server logged
//! `Server is ready` and its client port accepts TCP connections. [`NatsServer::restart`]
//! kills it and starts it again on the same port and store, as a broker restart in
//! production would look to clients. Drop kills it (`SIGKILL`) and removes the
//! directory; the child is spawned with [`spawn_tied`], so it also dies with a crashed
//! test process.
//!
//! The temporary directory holds `store/` (passed as `-sd`) and `nats-server.log`
//! (its stdout and stderr, appended across restarts). When the owning thread is
//! panicking, drop prints the last lines of that log.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::process::spawn_tied;

/// How long a start or restart may take before the test fails.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// The log line nats-server prints once it accepts clients.
const READY_LINE: &str = "Server is ready";
/// Lines of the log shown in a failure message: the first and the last ones.
const HEAD_LINES: usize = 10;
const TAIL_LINES: usize = 40;
/// Fresh-port attempts when another process grabs the free port first.
const START_ATTEMPTS: usize = 3;

/// A port on 127.0.0.1 that was free a moment ago (bound to port 0, then released).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap_or_else(|e| panic!("bind 127.0.0.1:0 to find a free port: {e}"));
    listener.local_addr().unwrap_or_else(|e| panic!("local_addr of a bound listener: {e}")).port()
}

/// A running (or stopped) `nats-server` owned by one test.
#[derive(Debug)]
pub struct NatsServer {
    child: Mutex<Option<Child>>,
    port: u16,
    binary: PathBuf,
    extra: Vec<String>,
    store: PathBuf,
    log_path: PathBuf,
    // Last field: removed after Drop::drop has killed the child.
    dir: TempDir,
}

impl NatsServer {
    /// Starts a JetStream-enabled server on a free loopback port; panics if it cannot.
    pub fn start() -> NatsServer {
        NatsServer::start_with_args(&[])
    }

    /// Like [`NatsServer::start`], with extra command-line arguments for nats-server
    /// (e.g. `["--server_name", "n1"]`, `["-V"]`); they are kept for restarts.
    pub fn start_with_args(extra: &[&str]) -> NatsServer {
        let binary = find_binary(std::env::var_os("NATS_SERVER"), std::env::var_os("PATH"))
            .unwrap_or_else(|msg| panic!("{msg}"));
        let dir = tempfile::Builder::new()
            .prefix("halyard-nats-")
            .tempdir()
            .unwrap_or_else(|e| panic!("create a temp dir for nats-server: {e}"));
        let store = dir.path().join("store");
        std::fs::create_dir(&store).unwrap_or_else(|e| panic!("create {}: {e}", store.display()));
        let log_path = dir.path().join("nats-server.log");
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();

        let mut attempt = 1;
        loop {
            let port = free_port();
            match launch(&binary, port, &store, &log_path, &extra) {
                Ok(child) => {
                    return NatsServer {
                        child: Mutex::new(Some(child)),
                        port,
                        binary,
                        extra,
                        store,
                        log_path,
                        dir,
                    }
                }
                Err(failure) if failure.port_taken && attempt < START_ATTEMPTS => attempt += 1,
                Err(failure) => panic!("{}", failure.message),
            }
        }
    }

    /// The client URL, `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The client port; the same across restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The JetStream store directory (`-sd`); the same across restarts.
    pub fn store_dir(&self) -> &Path {
        &self.store
    }

    /// The file receiving the server's stdout and stderr.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The last `lines` lines of the server log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&read_log_from(&self.log_path, 0), lines)
    }

    /// The server's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        let mut child = self.lock_child();
        match child.as_mut().map(|c| c.try_wait()) {
            Some(Ok(None)) => child.as_ref().map(|c| c.id()),
            _ => None,
        }
    }

    /// True while the server process runs (false after `stop` or a crash).
    pub fn is_running(&self) -> bool {
        self.pid().is_some()
    }

    /// Kills the server (`SIGKILL`) and waits for it to exit. Idempotent.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.lock_child().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server as an operator would (SIGTERM: it flushes its store and closes
    /// client connections), waiting up to 10 s before killing it. Idempotent.
    pub fn stop_gracefully(&mut self) {
        if let Some(mut child) = self.lock_child().take() {
            // SAFETY: kill(2) on our own child's pid; no memory is touched.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// [`NatsServer::stop_gracefully`], then [`NatsServer::restart`]: a planned broker
    /// restart (an upgrade, a reboot).
    pub fn restart_gracefully(&mut self) {
        self.stop_gracefully();
        self.restart();
    }

    /// Kills the server if it runs, then starts it again on the same port and store
    /// directory with the same arguments, and waits until it is ready; panics with the
    /// log tail if it does not come back.
    pub fn restart(&mut self) {
        self.stop();
        match launch(&self.binary, self.port, &self.store, &self.log_path, &self.extra) {
            Ok(child) => *self.lock_child() = Some(child),
            Err(failure) if failure.port_taken => panic!(
                "nats-server restart: port {} was taken by another process while the \
                 server was down\n{}",
                self.port, failure.message
            ),
            Err(failure) => panic!("nats-server restart: {}", failure.message),
        }
    }

    fn lock_child(&self) -> std::sync::MutexGuard<'_, Option<Child>> {
        // A poisoned lock only means another thread panicked mid-call; the Option is intact.
        self.child.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!(
                "--- nats-server log ({}), last {TAIL_LINES} lines ---\n{}",
                self.dir.path().display(),
                self.log_tail(TAIL_LINES)
            );
        }
    }
}

/// Why a launch failed; `port_taken` when another process holds the port.
struct LaunchFailure {
    message: String,
    port_taken: bool,
}

/// Starts nats-server and waits until it is ready; on failure it is killed and reaped.
fn launch(
    binary: &Path,
    port: u16,
    store: &Path,
    log_path: &Path,
    extra: &[String],
) -> Result<Child, LaunchFailure> {
    let fail = |message: String| LaunchFailure { message, port_taken: false };
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_path)
        .map_err(|e| fail(format!("open {}: {e}", log_path.display())))?;
    let offset = log.metadata().map(|m| m.len()).unwrap_or(0);
    let log_out = log.try_clone().map_err(|e| fail(format!("dup {}: {e}", log_path.display())))?;

    let mut cmd = Command::new(binary);
    cmd.arg("-js")
        .args(["-a", "127.0.0.1", "-p", &port.to_string()])
        .arg("-sd")
        .arg(store)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(log_out)
        .stderr(log);
    let shown = format!("{cmd:?}");
    let mut child = spawn_tied(cmd).map_err(|e| fail(format!("could not spawn {shown}: {e}")))?;

    let deadline = Instant::now() + READY_TIMEOUT;
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    loop {
        let log_text = read_log_from(log_path, offset);
        let problem = match child.try_wait() {
            Ok(Some(status)) => Some(format!("exited with {status} before it was ready")),
            Err(e) => Some(format!("could not be polled: {e}")),
            Ok(None) if Instant::now() >= deadline => {
                Some(format!("was not ready after {READY_TIMEOUT:?}"))
            }
            Ok(None) => None,
        };
        if let Some(problem) = problem {
            let _ = child.kill();
            let _ = child.wait();
            return Err(LaunchFailure {
                port_taken: log_text.contains("address already in use"),
                message: format!(
                    "nats-server {problem}\ncommand: {shown}\nlog ({}):\n{}",
                    log_path.display(),
                    excerpt(&log_text)
                ),
            });
        }
        if log_text.contains(READY_LINE)
            && TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
        {
            return Ok(child);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The binary to run: `$NATS_SERVER`, else `nats-server` on `path`, else the Debian
/// locations (`/usr/sbin` is often missing from a non-root PATH).
fn find_binary(env: Option<OsString>, path: Option<OsString>) -> Result<PathBuf, String> {
    if let Some(explicit) = env.filter(|v| !v.is_empty()) {
        let explicit = PathBuf::from(explicit);
        return if explicit.is_file() {
            Ok(explicit)
        } else {
            Err(format!(
                "NATS_SERVER={} is not a file; unset it or install nats-server: \
                 apt-get install -y nats-server",
                explicit.display()
            ))
        };
    }
    let from_path = path.iter().flat_map(std::env::split_paths).map(|dir| dir.join("nats-server"));
    let fallback = ["/usr/sbin", "/usr/bin", "/usr/local/bin"]
        .iter()
        .map(|dir| Path::new(dir).join("nats-server"));
    from_path.chain(fallback).find(|p| p.is_file()).ok_or_else(|| {
        "nats-server not found (set NATS_SERVER or put it on PATH); \
         install nats-server: apt-get install -y nats-server"
            .to_string()
    })
}

/// The log from byte `offset` on (the current run's part); empty if unreadable.
fn read_log_from(path: &Path, offset: u64) -> String {
    let mut bytes = Vec::new();
    if let Ok(mut file) = File::open(path) {
        if file.seek(SeekFrom::Start(offset)).is_ok() {
            let _ = file.read_to_end(&mut bytes);
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The log for a failure message: all of it if short, else its head (nats-server
/// prints argument errors before its usage text) and its tail.
fn excerpt(text: &str) -> String {
    let all: Vec<&str> = text.lines().collect();
    if all.len() <= TAIL_LINES + HEAD_LINES {
        return all.join("\n");
    }
    format!(
        "{}\n[... {} lines ...]\n{}",
        all[..HEAD_LINES].join("\n"),
        all.len() - HEAD_LINES - TAIL_LINES,
        tail(text, TAIL_LINES)
    )
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::pid_alive;
    use std::io::{BufRead, BufReader};

    fn accepts(port: u16) -> bool {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok()
    }

    /// The first protocol line a client sees: `INFO {...}`.
    fn info_line(port: u16) -> String {
        let stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))
            .unwrap_or_else(|e| panic!("connect to nats on {port}: {e}"));
        stream.set_read_timeout(Some(Duration::from_secs(5))).expect("set read timeout");
        let mut line = String::new();
        BufReader::new(stream).read_line(&mut line).expect("read INFO line");
        assert!(line.starts_with("INFO "), "unexpected first line {line:?}");
        line
    }

    /// Start, restart on the same port and store, and drop leave nothing running.
    #[test]
    fn start_restart_drop() {
        let mut nats = NatsServer::start();
        let port = nats.port();
        assert_eq!(nats.url(), format!("nats://127.0.0.1:{port}"));
        assert!(accepts(port), "port {port} closed after start");
        assert!(nats.store_dir().is_dir());
        let first = nats.pid().expect("running after start");

        nats.restart();
        let second = nats.pid().expect("running after restart");
        assert_ne!(first, second, "restart kept the old process");
        assert!(!pid_alive(first), "old nats-server {first} survived restart");
        assert_eq!(nats.port(), port);
        assert!(accepts(port), "port {port} closed after restart");
        assert!(nats.store_dir().join("jetstream").is_dir(), "store dir not reused");
        let dir = nats.store_dir().parent().expect("store has a parent").to_path_buf();

        drop(nats);
        assert!(!pid_alive(second), "nats-server {second} survived drop");
        assert!(!accepts(port), "port {port} still accepts after drop");
        assert!(!dir.exists(), "temp dir {} left after drop", dir.display());
    }

    /// `stop` closes the port and `restart` brings a stopped server back.
    #[test]
    fn stop_then_restart() {
        let mut nats = NatsServer::start();
        nats.stop();
        assert!(!nats.is_running());
        assert!(!accepts(nats.port()), "port still open after stop");
        nats.stop(); // idempotent
        nats.restart();
        assert!(nats.is_running());
        assert!(accepts(nats.port()));
    }

    /// The server runs with JetStream on the requested port, and extra args reach it.
    #[test]
    fn jetstream_enabled_and_extra_args_passed() {
        let nats = NatsServer::start_with_args(&["--server_name", "halyard-test-n1"]);
        let info = info_line(nats.port());
        assert!(info.contains("\"jetstream\":true"), "JetStream off: {info}");
        assert!(info.contains("\"server_name\":\"halyard-test-n1\""), "{info}");
        assert!(nats.log_tail(100).contains(READY_LINE));
    }

    /// A server that cannot start fails the test with its log in the message.
    #[test]
    #[should_panic(expected = "nats-server exited")]
    fn bad_arguments_panic_with_log() {
        NatsServer::start_with_args(&["--no-such-flag-for-halyard"]);
    }

    /// A restart whose port another process took fails and says so.
    #[test]
    #[should_panic(expected = "was taken by another process")]
    fn restart_on_a_taken_port_panics() {
        let mut nats = NatsServer::start();
        nats.stop();
        let _squatter = TcpListener::bind((Ipv4Addr::LOCALHOST, nats.port())).expect("bind");
        nats.restart();
    }

    /// A missing binary names the install command.
    #[test]
    fn missing_binary_says_how_to_install() {
        let err = find_binary(None, Some(OsString::from("/nonexistent-halyard-dir")));
        // The Debian fallback may find it on this machine; only check the error text.
        if let Err(msg) = err {
            assert!(msg.contains("apt-get install -y nats-server"), "{msg}");
        }
        let err = find_binary(Some(OsString::from("/nonexistent/nats-server")), None)
            .expect_err("a bad NATS_SERVER must be an error");
        assert!(err.contains("apt-get install -y nats-server"), "{err}");
    }

    /// `free_port` returns a port that can be bound.
    #[test]
    fn free_port_is_bindable() {
        let port = free_port();
        assert_ne!(port, 0);
        TcpListener::bind((Ipv4Addr::LOCALHOST, port)).expect("free port can be bound");
    }
}

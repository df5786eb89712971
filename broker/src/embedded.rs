//! A private `nats-server` for embedded mode.
//!
//! Started with JetStream on a free loopback port and its store in a directory the caller
//! chooses (inside the run's output directory, so a resumed run finds its streams).
//! The child gets `PR_SET_PDEATHSIG = SIGKILL`: when the thread that started it dies
//! (including by SIGKILL of `halyard run`), the kernel kills the server too. Because the
//! signal is tied to the *thread*, the child is started from a dedicated thread that lives
//! exactly as long as the child.

use std::io::{BufRead, BufReader, Read};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::BrokerError;

pub struct EmbeddedNats {
    port: u16,
    pid: u32,
    thread: Option<std::thread::JoinHandle<()>>,
    log: PathBuf,
}

/// The `nats-server` binary: `$HALYARD_NATS_SERVER`, else `nats-server` on `PATH`.
pub fn server_binary() -> Result<PathBuf, BrokerError> {
    if let Some(p) = std::env::var_os("HALYARD_NATS_SERVER") {
        return Ok(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    // Debian installs it in /usr/sbin, which is often not on a user's PATH.
    let extra = ["/usr/sbin", "/usr/local/sbin", "/usr/bin", "/usr/local/bin"].map(PathBuf::from);
    for dir in std::env::split_paths(&path).chain(extra) {
        let cand = dir.join("nats-server");
        if cand.is_file() {
            return Ok(cand);
        }
    }
    Err(BrokerError::Embedded(
        "nats-server not found on PATH (install it: `apt-get install -y nats-server`, set HALYARD_NATS_SERVER, or pass --nats URL)"
            .into(),
    ))
}

fn free_port() -> Result<u16, BrokerError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| BrokerError::Embedded(format!("no free port: {e}")))?;
    l.local_addr().map(|a| a.port()).map_err(|e| BrokerError::Embedded(e.to_string()))
}

impl EmbeddedNats {
    /// Start a server storing JetStream data under `store_dir` and wait until it is ready.
    pub fn start(store_dir: &Path) -> Result<EmbeddedNats, BrokerError> {
        let bin = server_binary()?;
        std::fs::create_dir_all(store_dir)
            .map_err(|e| BrokerError::Embedded(format!("cannot create store dir {}: {e}", store_dir.display())))?;
        let port = free_port()?;
        let log = store_dir.join("nats-server.log");
        let log_file = std::fs::File::create(&log)
            .map_err(|e| BrokerError::Embedded(format!("cannot create {}: {e}", log.display())))?;
        let mut cmd = Command::new(&bin);
        cmd.args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(store_dir)
            .args(["--server_name", "halyard-embedded"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        set_parent_death_signal(&mut cmd);
        let (tx, rx) = mpsc::channel::<Result<u32, String>>();
        let thread = std::thread::Builder::new()
            .name("nats-server".into())
            .spawn(move || match cmd.spawn() {
                Ok(mut child) => {
                    let _ = tx.send(Ok(child.id()));
                    wait_child(&mut child);
                }
                Err(e) => {
                    let _ = tx.send(Err(e.to_string()));
                }
            })
            .map_err(|e| BrokerError::Embedded(format!("cannot start supervisor thread: {e}")))?;
        let pid = rx
            .recv()
            .map_err(|_| BrokerError::Embedded("supervisor thread died".into()))?
            .map_err(|e| BrokerError::Embedded(format!("cannot run {}: {e}", bin.display())))?;
        let me = EmbeddedNats { port, pid, thread: Some(thread), log };
        me.wait_ready(Duration::from_secs(20))?;
        Ok(me)
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    fn wait_ready(&self, timeout: Duration) -> Result<(), BrokerError> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(s) = TcpStream::connect_timeout(&([127, 0, 0, 1], self.port).into(), Duration::from_millis(200)) {
                let mut line = String::new();
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                if BufReader::new(s).read_line(&mut line).is_ok() && line.starts_with("INFO") {
                    return Ok(());
                }
            }
            if self.thread.as_ref().is_some_and(|t| t.is_finished()) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(BrokerError::Embedded(format!("nats-server did not become ready; log {}:\n{}", self.log.display(), self.log_tail())))
    }

    fn log_tail(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// Stop the server gracefully (SIGTERM, then SIGKILL after 10 s) and wait for it.
    pub fn stop(&mut self) {
        let Some(thread) = self.thread.take() else { return };
        // SAFETY: plain syscall on a pid we own; the supervisor thread has not reaped it
        // while `thread` is unfinished, so the pid cannot have been reused.
        unsafe { libc::kill(self.pid as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !thread.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if !thread.is_finished() {
            // SAFETY: as above.
            unsafe { libc::kill(self.pid as libc::pid_t, libc::SIGKILL) };
        }
        let _ = thread.join();
    }
}

impl Drop for EmbeddedNats {
    fn drop(&mut self) {
        self.stop();
    }
}

fn wait_child(child: &mut Child) {
    let _ = child.wait();
}

#[cfg(target_os = "linux")]
fn set_parent_death_signal(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches only the calling (child) process.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn set_parent_death_signal(_cmd: &mut Command) {}

//! One server process: spawned in its own process group with a parent-death signal, its
//! output in its own log file, its exit observed, stopped by signals to its group.
//!
//! Linux delivers the parent-death signal (`PR_SET_PDEATHSIG`) when the *thread* that
//! forked the child exits, not the process: a server forked on a thread of tokio's
//! blocking pool (retired after ten idle seconds) would be killed under the worker's
//! feet. Every server is therefore forked on one spawner thread that lives as long as
//! the worker's process, as the test harness does for its children.
//!
//! The process group carries the signals to what the server starts itself (vLLM's and
//! SGLang's tensor-parallel workers, TGI's shards): a stop or a crash clean-up signals
//! the whole group, so no GPU memory stays held by an orphan.
//!
//! The parent-death signal reaches the group's leader only. So that the rest of the group
//! goes too when the worker is killed (SIGKILL, where no cgroup cleans up), each server
//! has a guard: a `sh` whose standard input is a pipe only the worker holds open, which
//! kills the server's whole group when that pipe ends, which the kernel does as the
//! worker dies, however it dies (issue 49, item 8).
//!
//! A server's environment is the worker's without Halyard's secrets and other pools'
//! keys ([`scrubbed`]: every `HALYARD_*` variable and every `*_API_KEY`), plus what the
//! caller adds; HOME, PATH, `HF_*`, `CUDA_*`, the cache variables and everything else
//! pass through.

use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, OnceLock};

use tokio::sync::watch;

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// The sender to the process-lifetime spawner thread, started on first use.
fn spawner() -> io::Result<&'static mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();
    if let Some(s) = SPAWNER.get() {
        return Ok(s);
    }
    let (tx, rx) = mpsc::channel::<SpawnRequest>();
    std::thread::Builder::new().name("halyard-server-spawner".into()).spawn(move || {
        // Ends only when the process does: the sender lives in a static.
        for (mut cmd, reply) in rx {
            let _ = reply.send(cmd.spawn());
        }
    })?;
    Ok(SPAWNER.get_or_init(|| tx))
}

/// A running (or exited, not yet forgotten) server process.
pub struct Proc {
    pid: u32,
    /// The exit status once the waiter thread has reaped it.
    exited: watch::Receiver<Option<ExitStatus>>,
    /// The guard that kills the server's group when the worker dies, and the pipe whose
    /// end tells it so (see the module docs); `None` where `sh` could not be started.
    guard: Option<(Child, io::PipeWriter)>,
}

/// Whether the worker's variable `name` is kept from a server: Halyard's own
/// (`HALYARD_*`: broker credentials among them) and API keys (`*_API_KEY`, the form of
/// every provider's: another pool's key is no business of a local server's).
pub fn scrubbed(name: &std::ffi::OsStr) -> bool {
    let n = name.to_string_lossy().to_ascii_uppercase();
    n.starts_with("HALYARD_") || n.ends_with("_API_KEY")
}

impl Proc {
    /// Start `argv` with `env` added, stdout and stderr appended to `log`, in a new
    /// process group, killed with SIGKILL if this process dies.
    pub fn spawn(argv: &[String], env: &[(String, String)], log: &Path) -> io::Result<Proc> {
        let Some((program, args)) = argv.split_first() else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty command"));
        };
        let out = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
        let err = out.try_clone()?;
        let mut cmd = Command::new(program);
        for (name, _) in std::env::vars_os().filter(|(n, _)| scrubbed(n)) {
            cmd.env_remove(name);
        }
        cmd.args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the closure runs in the forked child before exec and makes only
        // async-signal-safe calls (prctl, getppid); its errors do not allocate.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The worker may have died between fork and prctl: nobody would kill us.
                if libc::getppid() != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        let (tx, rx) = mpsc::channel();
        spawner()?
            .send((cmd, tx))
            .map_err(|_| io::Error::other("the server spawner thread has died"))?;
        let mut child =
            rx.recv().map_err(|_| io::Error::other("the server spawner thread has died"))??;
        let pid = child.id();
        let (exit_tx, exit_rx) = watch::channel(None);
        // The waiter only reaps; the parent-death signal is tied to the spawner thread.
        std::thread::Builder::new().name(format!("halyard-server-wait-{pid}")).spawn(
            move || {
                let status = child.wait();
                let status = status.unwrap_or_else(|_| ExitStatus::from_raw(-1));
                let _ = exit_tx.send(Some(status));
            },
        )?;
        let guard = match guard(pid) {
            Ok(g) => Some(g),
            Err(e) => {
                tracing::warn!(pid, error = %e, "cannot start the guard of a managed server: if this worker is killed, what the server started may outlive it");
                None
            }
        };
        Ok(Proc { pid, exited: exit_rx, guard })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The exit status, if it has exited.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        *self.exited.borrow()
    }

    /// Wait until it has exited.
    pub async fn exited(&self) -> ExitStatus {
        let mut rx = self.exited.clone();
        let status = rx.wait_for(|s| s.is_some()).await.map(|s| *s);
        // The waiter thread gone without a status counts as exited.
        status.ok().flatten().unwrap_or_else(|| ExitStatus::from_raw(-1))
    }

    /// Send `signal` to the server's whole process group (the server and what it
    /// started). The group outlives its leader while members remain, so its id is not
    /// reused by another process meanwhile.
    pub fn signal_group(&self, signal: libc::c_int) {
        // SAFETY: a plain syscall; a negative pid names the process group.
        unsafe {
            libc::kill(-(self.pid as libc::pid_t), signal);
        }
    }

    /// Stop gracefully: SIGTERM to the group, SIGKILL after `grace`; waits for the exit.
    pub async fn stop(&self, grace: std::time::Duration) -> ExitStatus {
        self.signal_group(libc::SIGTERM);
        match tokio::time::timeout(grace, self.exited()).await {
            Ok(s) => {
                // Whatever of the group is left (a shard that ignored SIGTERM) goes too.
                self.signal_group(libc::SIGKILL);
                s
            }
            Err(_) => {
                self.signal_group(libc::SIGKILL);
                self.exited().await
            }
        }
    }
}

impl Drop for Proc {
    /// A server is never left behind by its handle: dropped while it may run (an error
    /// path, a panic), its group is killed. (Once its leader was reaped, whoever reaped
    /// it has signalled the group: the id is not signalled again, as it may be reused.)
    /// The guard is killed before its pipe closes, so it signals nothing.
    fn drop(&mut self) {
        if self.exit_status().is_none() {
            self.signal_group(libc::SIGKILL);
        }
        if let Some((mut child, pipe)) = self.guard.take() {
            let _ = child.kill();
            let _ = child.wait();
            drop(pipe);
        }
    }
}

/// Start the guard of the process group `pgid`: `sh`, reading its standard input (a pipe
/// whose other end is returned; the worker's pipes are close-on-exec, so no other child
/// holds it) until it ends, then killing the group.
fn guard(pgid: u32) -> io::Result<(Child, io::PipeWriter)> {
    let (reader, writer) = io::pipe()?;
    // Its own process group: a terminal's Ctrl-C to the worker's group does not end it.
    let child = Command::new("/bin/sh")
        .args(["-c", "read _; kill -9 -\"$0\" 2>/dev/null", &pgid.to_string()])
        .env_clear()
        .process_group(0)
        .stdin(reader)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    Ok((child, writer))
}

/// A human reading of an exit status: `exit code 3`, `killed by signal 9 (SIGKILL)`.
pub fn describe(s: ExitStatus) -> String {
    if let Some(code) = s.code() {
        return format!("exit code {code}");
    }
    match s.signal() {
        Some(sig) => {
            let name = match sig {
                libc::SIGKILL => " (SIGKILL)",
                libc::SIGTERM => " (SIGTERM)",
                libc::SIGSEGV => " (SIGSEGV)",
                libc::SIGABRT => " (SIGABRT)",
                libc::SIGINT => " (SIGINT)",
                _ => "",
            };
            format!("killed by signal {sig}{name}")
        }
        None => "ended (status unknown)".into(),
    }
}

/// A free TCP port on loopback (bound, then released for the server to take). Another
/// process may take it first; the server then fails to start and is restarted on
/// another port.
pub fn free_port() -> io::Result<u16> {
    let l = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(l.local_addr()?.port())
}

/// Append a line to the server's log (start markers), ignoring failures.
pub fn log_line(log: &Path, line: &str) {
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(log) {
        let _ = writeln!(f, "{line}");
    }
}

/// The last `lines` lines of `log` (read from its last 64 KiB), or why it cannot be read.
pub fn log_tail(log: &Path, lines: usize) -> String {
    let read = || -> io::Result<String> {
        let mut f = std::fs::File::open(log)?;
        let len = f.metadata()?.len();
        f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)))?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    };
    match read() {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", log.display()),
    }
}

/// The log file of a server: `<dir>/<label>.log`, the label made safe as a file name.
pub fn log_path(dir: &Path, label: &str) -> PathBuf {
    let safe: String = label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "-_.@,".contains(c) { c } else { '_' })
        .collect();
    dir.join(format!("{safe}.log"))
}

//! Child processes that cannot outlive the test process.
//!
//! Every child a test starts (`nats-server`, the `halyard` binary) is spawned with
//! `PR_SET_PDEATHSIG = SIGKILL`, so the kernel kills it when the test process dies,
//! even by `SIGKILL` or a panic in another thread that aborts.
//!
//! Linux delivers that signal when the *thread* that forked the child exits, not the
//! process. Test threads come and go (libtest runs each test on its own thread, tokio's
//! blocking pool retires idle threads after ten seconds), so a child forked on one of
//! them would be killed under the feet of whoever holds it. [`spawn_tied`] therefore
//! forks on one dedicated spawner thread that lives as long as the process.

use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// The sender to the process-lifetime spawner thread, started on first use.
fn spawner() -> &'static mpsc::Sender<SpawnRequest> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("halyard-tests-spawner".into())
            .spawn(move || {
                // Ends only when the process does: the sender lives in a static.
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("start the halyard-tests child-spawner thread");
        tx
    })
}

/// Spawns `cmd` so that the child gets `SIGKILL` when this process dies.
///
/// The fork happens on a thread that lives as long as the process (see the module
/// docs), so the child survives the calling thread ending.
pub fn spawn_tied(mut cmd: Command) -> io::Result<Child> {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe calls (prctl, getppid); building the errors does not allocate.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl: then nobody would kill us.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    let (tx, rx) = mpsc::channel();
    spawner().send((cmd, tx)).expect("halyard-tests spawner thread has died");
    rx.recv().expect("halyard-tests spawner thread has died")
}

/// The path of binary `name` (e.g. `"halyard"`) built into the same target directory
/// as the running test executable.
///
/// `env!("CARGO_BIN_EXE_halyard")` only exists in the `cli` package's own tests; tests
/// in other packages use this (and need `cargo build -p halyard` first). The
/// `HALYARD_BIN` environment variable, when set, wins for `"halyard"`.
pub fn cargo_bin(name: &str) -> std::path::PathBuf {
    if name == "halyard" {
        if let Some(path) = std::env::var_os("HALYARD_BIN").filter(|p| !p.is_empty()) {
            return path.into();
        }
    }
    let exe = std::env::current_exe()
        .unwrap_or_else(|e| panic!("locate the running test executable: {e}"));
    // target/<profile>/deps/<test-binary> -> target/<profile>/<name>
    let found = exe
        .ancestors()
        .skip(1)
        .take(3)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file());
    found.unwrap_or_else(|| {
        panic!(
            "binary {name:?} not found next to {}; build it first (cargo build -p {name}) \
             or set HALYARD_BIN",
            exe.display()
        )
    })
}

/// True while a process with this pid exists and is not a zombie.
pub fn pid_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks existence and permission; it sends nothing.
    let exists = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0;
    if !exists {
        return false;
    }
    // A killed child not yet reaped by its (new) parent still answers kill(pid, 0).
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_none_or(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// A child process that is killed (`SIGKILL`) and reaped when dropped.
///
/// Spawned with [`spawn_tied`], so it also dies with the test process.
#[derive(Debug)]
pub struct ChildGuard {
    child: Child,
    what: String,
    status: Option<ExitStatus>,
}

impl ChildGuard {
    /// Spawns `cmd`; panics with the program name and the OS error when that fails.
    pub fn spawn(cmd: Command) -> ChildGuard {
        let what = format!("{cmd:?}");
        match spawn_tied(cmd) {
            Ok(child) => ChildGuard { child, what, status: None },
            Err(e) => panic!("could not spawn {what}: {e}"),
        }
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The underlying child, e.g. to take its piped stdout.
    pub fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Sends `signal` (e.g. `libc::SIGTERM`) unless the child has already been reaped.
    pub fn signal(&mut self, signal: libc::c_int) {
        if self.try_wait().is_none() {
            // SAFETY: plain kill(2) on our own, not yet reaped, child.
            unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        }
    }

    /// Its exit status if it has exited, without blocking.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            match self.child.try_wait() {
                Ok(status) => self.status = status,
                Err(e) => panic!("try_wait on {}: {e}", self.what),
            }
        }
        self.status
    }

    /// Waits up to `limit` for the child to exit; `None` if it is still running.
    pub fn wait_timeout(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Kills the child with `SIGKILL` and reaps it.
    pub fn kill(&mut self) -> ExitStatus {
        if let Some(status) = self.try_wait() {
            return status;
        }
        let _ = self.child.kill();
        let status = match self.child.wait() {
            Ok(status) => status,
            Err(e) => panic!("wait for killed {}: {e}", self.what),
        };
        self.status = Some(status);
        status
    }

    /// True when `status` says the child died of `signal`.
    pub fn killed_by(status: ExitStatus, signal: libc::c_int) -> bool {
        status.signal() == Some(signal)
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Stdio;

    /// A child forked through `spawn_tied` survives the thread that asked for it.
    #[test]
    fn child_outlives_the_spawning_thread() {
        let mut guard = std::thread::spawn(|| {
            let mut cmd = Command::new("sleep");
            cmd.arg("30");
            ChildGuard::spawn(cmd)
        })
        .join()
        .expect("spawning thread panicked");
        std::thread::sleep(Duration::from_millis(200));
        assert!(guard.try_wait().is_none(), "child died with its spawning thread");
        let pid = guard.pid();
        drop(guard);
        assert!(!pid_alive(pid), "ChildGuard drop left pid {pid} running");
    }

    /// `wait_timeout` returns the exit status of a quick child and `None` for a slow one.
    #[test]
    fn wait_timeout_reports_exit_or_none() {
        let mut quick = ChildGuard::spawn(Command::new("true"));
        let status = quick.wait_timeout(Duration::from_secs(10));
        assert!(status.is_some_and(|s| s.success()), "`true` did not exit 0: {status:?}");

        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        let mut slow = ChildGuard::spawn(cmd);
        assert_eq!(slow.wait_timeout(Duration::from_millis(50)), None);
        slow.signal(libc::SIGTERM);
        let status = slow.wait_timeout(Duration::from_secs(10)).expect("SIGTERM ignored");
        assert!(ChildGuard::killed_by(status, libc::SIGTERM), "{status:?}");
    }

    /// `cargo_bin` finds a binary in the test's target directory and names it when missing.
    #[test]
    fn cargo_bin_locates_or_explains() {
        let exe = std::env::current_exe().expect("current exe");
        let name = exe.file_name().and_then(|n| n.to_str()).expect("utf-8 name");
        assert_eq!(cargo_bin(name), exe);
        let err = std::panic::catch_unwind(|| cargo_bin("no-such-halyard-binary"))
            .expect_err("a missing binary must panic");
        let msg = err.downcast_ref::<String>().expect("formatted panic message");
        assert!(msg.contains("cargo build -p no-such-halyard-binary"), "{msg}");
    }

    const HELPER_ENV: &str = "HALYARD_TESTS_PDEATHSIG_HELPER";

    /// Helper, not a test on its own: when re-executed with `HELPER_ENV` set, it starts a
    /// tied `sleep` and a `NatsServer`, prints their pids and exits without cleanup.
    #[test]
    fn pdeathsig_helper() {
        if std::env::var_os(HELPER_ENV).is_none() {
            return;
        }
        let mut cmd = Command::new("sleep");
        cmd.arg("60");
        let sleeper = spawn_tied(cmd).expect("spawn sleep");
        let nats = crate::nats::NatsServer::start();
        println!(
            "SLEEP_PID={} NATS_PID={} NATS_DIR={}",
            sleeper.id(),
            nats.pid().expect("nats-server is running"),
            nats.store_dir().parent().expect("store dir has a parent").display()
        );
        // Exit like a crashed test: no destructors, no kill.
        std::process::exit(0);
    }

    /// Children of a test process that dies without cleanup (sleep, nats-server) die too.
    #[test]
    fn children_die_with_a_crashed_test_process() {
        let exe = std::env::current_exe().expect("current test executable");
        let out = Command::new(exe)
            .args(["process::tests::pdeathsig_helper", "--exact", "--nocapture"])
            .env(HELPER_ENV, "1")
            .stdin(Stdio::null())
            .output()
            .expect("re-run the test binary as helper");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout.lines().find(|l| l.starts_with("SLEEP_PID=")).unwrap_or_else(|| {
            panic!(
                "helper printed no pids; stdout:\n{stdout}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        let field = |name: &str| -> String {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(name))
                .unwrap_or_else(|| panic!("no {name} in helper line {line:?}"))
                .to_string()
        };
        let pids: Vec<u32> = ["SLEEP_PID=", "NATS_PID="]
            .iter()
            .map(|name| field(name).parse().expect("pid is a number"))
            .collect();
        // The helper exited without dropping its TempDir; clean it up for it.
        let _ = std::fs::remove_dir_all(field("NATS_DIR="));
        let deadline = Instant::now() + Duration::from_secs(10);
        for pid in pids {
            while pid_alive(pid) {
                assert!(Instant::now() < deadline, "pid {pid} outlived its dead parent");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

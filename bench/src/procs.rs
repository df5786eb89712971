//! Child processes of the benchmark and their peak memory; the bytes a store leaves on
//! disk.
//!
//! Roles (coordinator, workers) run as separate processes so that each one's peak
//! resident set is its own: it is read from `wait4`'s `ru_maxrss` when the child is
//! reaped. Children are spawned with the test kit's [`spawn_tied`] (`PR_SET_PDEATHSIG =
//! SIGKILL`), so none outlives the benchmark.

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ExitStatus};

/// Spawn a command so that it is killed if this process dies: the test kit's helper
/// (`PR_SET_PDEATHSIG`, forked from a thread that lives as long as the process).
pub use halyard_tests::spawn_tied;

/// Send `signal` to a child that has not been reaped.
pub fn signal(child: &Child, signal: libc::c_int) {
    // SAFETY: kill(2) on our own child, which is not reaped until `reap` is called.
    unsafe { libc::kill(child.id() as libc::pid_t, signal) };
}

/// What a reaped child used.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    /// Peak resident set, bytes.
    pub max_rss: u64,
    /// User plus system CPU time, seconds.
    pub cpu_s: f64,
}

/// Wait for `child` and return its exit status and resource usage.
/// Blocking; the child must not have been waited for before.
pub fn reap(child: Child) -> io::Result<(ExitStatus, Usage)> {
    let pid = child.id() as libc::pid_t;
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain data that wait4 fills in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: wait4 on our own child pid with valid pointers.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == pid {
            break;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    // The pid is reaped; `Child` must not wait for it again (its Drop does not).
    drop(child);
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    // Linux reports ru_maxrss in KiB.
    let u = Usage {
        max_rss: usage.ru_maxrss.max(0) as u64 * 1024,
        cpu_s: secs(usage.ru_utime) + secs(usage.ru_stime),
    };
    Ok((ExitStatus::from_raw(status), u))
}

/// CPU time (user plus system, seconds) a running process has used so far.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start at field 3.
    let rest = s.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let (utime, stime): (u64, u64) = (f.get(11)?.parse().ok()?, f.get(12)?.parse().ok()?);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some((utime + stime) as f64 / hz)
}

/// Peak resident set of a running process (`VmHWM`), in bytes.
pub fn peak_rss(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Allocated bytes of the files under `dir` (what `du` counts).
pub fn disk_bytes(dir: &std::path::Path) -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let m = e.metadata()?;
        total += if m.is_dir() { disk_bytes(&e.path())? } else { m.blocks() * 512 };
    }
    Ok(total)
}

//! A private `nats-server` for embedded mode.
//!
//! Started with JetStream on a free loopback port and its store in a directory the caller
//! chooses (inside the run's output directory, so a resumed run finds its streams).
//!
//! Private means private to this run, not only to this machine: every start makes a new
//! nkey pair, and the server admits that key alone. The server's configuration file
//! (`nats-server.conf`, holding the public key only) and the seed (`client.nk`, what
//! [`EmbeddedNats::auth`] points clients to) are written 0600 in the 0700 store
//! directory; nothing secret goes on the command line, which other users can read. So
//! another local user can neither connect nor publish jobs into the run. The server also
//! gets a random name in that file, and [`EmbeddedNats::start`] is ready only once the
//! server on the port announces that name and requires authentication: a process that
//! grabbed the port first cannot pass for the run's own server.
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
    /// The random server name the child was configured with.
    name: String,
    /// The file holding the per-run nkey seed (0600).
    seed_file: PathBuf,
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
    let l = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| BrokerError::Embedded(format!("no free port: {e}")))?;
    l.local_addr().map(|a| a.port()).map_err(|e| BrokerError::Embedded(e.to_string()))
}

impl EmbeddedNats {
    /// Start a server storing JetStream data under `store_dir` and wait until it is ready.
    pub fn start(store_dir: &Path) -> Result<EmbeddedNats, BrokerError> {
        let bin = server_binary()?;
        let emb = |what: &str, p: &Path, e: std::io::Error| {
            BrokerError::Embedded(format!("cannot {what} {}: {e}", p.display()))
        };
        halyard_store::mark::create_private_dir(store_dir)
            .map_err(|e| emb("create store dir", store_dir, e))?;
        let port = free_port()?;
        let key = nkeys::KeyPair::new_user();
        let seed = key.seed().map_err(|e| BrokerError::Embedded(format!("nkey seed: {e}")))?;
        // A fresh public key is 56 random-looking characters: the server's name this run.
        let name = format!("halyard-{}", nkeys::KeyPair::new_user().public_key());
        let seed_file = store_dir.join("client.nk");
        write_private(&seed_file, &seed).map_err(|e| emb("write", &seed_file, e))?;
        let conf = store_dir.join("nats-server.conf");
        write_private(&conf, &server_config(port, &name, store_dir, &key.public_key()))
            .map_err(|e| emb("write", &conf, e))?;
        let log = store_dir.join("nats-server.log");
        let log_file = std::fs::File::create(&log).map_err(|e| emb("create", &log, e))?;
        let mut cmd = Command::new(&bin);
        cmd.arg("-c").arg(&conf).stdin(Stdio::null()).stdout(Stdio::null()).stderr(log_file);
        // A process group of its own: a terminal's Ctrl-C (SIGINT to the whole foreground
        // group) reaches Halyard, whose graceful stop still needs this server (hand-backs,
        // health records, the last commits); the server is stopped when Halyard is done
        // with it (`Drop`), and dies with Halyard in any case (parent-death signal).
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
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
        let me = EmbeddedNats { port, pid, thread: Some(thread), log, name, seed_file };
        me.wait_ready(Duration::from_secs(20))?;
        Ok(me)
    }

    /// The credentials of this run's server (its nkey seed file), for every client.
    pub fn auth(&self) -> crate::auth::NatsAuth {
        crate::auth::NatsAuth { nkey_seed_file: Some(self.seed_file.clone()), ..Default::default() }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Wait until the server on the port is our child: its INFO announces the random
    /// name only our configuration file holds, and that it requires authentication. A
    /// server with another name there is an error at once (someone else has the port).
    fn wait_ready(&self, timeout: Duration) -> Result<(), BrokerError> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(s) = TcpStream::connect_timeout(
                &([127, 0, 0, 1], self.port).into(),
                Duration::from_millis(200),
            ) {
                let mut line = String::new();
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                if BufReader::new(s).read_line(&mut line).is_ok() && line.starts_with("INFO") {
                    return check_info(&line, &self.name, self.port);
                }
            }
            if self.thread.as_ref().is_some_and(|t| t.is_finished()) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(BrokerError::Embedded(format!(
            "nats-server did not become ready; log {}:\n{}",
            self.log.display(),
            self.log_tail()
        )))
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

/// Whether the INFO line of the server on `port` is that of the server named `name`
/// with authentication required.
fn check_info(info: &str, name: &str, port: u16) -> Result<(), BrokerError> {
    let compact: String = info.chars().filter(|c| !c.is_whitespace()).collect();
    if !compact.contains(&format!("\"server_name\":\"{name}\"")) {
        return Err(BrokerError::Embedded(format!(
            "the server answering on 127.0.0.1:{port} is not the one this run started (another \
             process holds the port); refusing to use it"
        )));
    }
    if !compact.contains("\"auth_required\":true") {
        return Err(BrokerError::Embedded(format!(
            "the server on 127.0.0.1:{port} does not require authentication; refusing to use it"
        )));
    }
    Ok(())
}

/// The configuration of the private server: loopback only, JetStream in `store`, one
/// user (the run's nkey).
fn server_config(port: u16, name: &str, store: &Path, nkey: &str) -> String {
    let quoted = |s: &str| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
    format!(
        "listen: \"127.0.0.1:{port}\"\nserver_name: {}\njetstream {{\n  store_dir: {}\n}}\n\
         authorization {{\n  users = [ {{ nkey: {} }} ]\n}}\n",
        quoted(name),
        quoted(&store.display().to_string()),
        quoted(nkey)
    )
}

/// Write `text` to a new file readable by its owner only (a stale one is replaced).
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let _ = std::fs::remove_file(path);
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    o.open(path)?.write_all(text.as_bytes())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{auth::NatsAuth, BrokerConfig};
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    /// Issue 13: the private server admits this run's key and nothing else (no
    /// credentials, another key); its files are owner-only and no secret is on its
    /// command line.
    #[tokio::test]
    async fn only_the_runs_key_gets_in() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("nats");
        let n = EmbeddedNats::start(&store).unwrap();
        let ok =
            crate::connect(&BrokerConfig::new(n.url(), "t").with_auth(n.auth())).await.unwrap();
        ok.client.publish("halyard.test", "x".into()).await.unwrap();
        ok.client.flush().await.unwrap();
        let other_key = dir.path().join("other.nk");
        std::fs::write(&other_key, nkeys::KeyPair::new_user().seed().unwrap()).unwrap();
        for auth in [
            NatsAuth::default(),
            NatsAuth { nkey_seed_file: Some(other_key), ..Default::default() },
            NatsAuth { token: Some("guess".into()), ..Default::default() },
        ] {
            let mut cfg = BrokerConfig::new(n.url(), "intruder").with_auth(auth);
            cfg.connect_wait = Duration::from_secs(1);
            let e = crate::connect(&cfg).await.err().expect("an intruder got in");
            assert!(e.to_string().contains("authorization violation"), "{e}");
        }
        assert_eq!(mode(&store), 0o700);
        for f in ["client.nk", "nats-server.conf"] {
            assert_eq!(mode(&store.join(f)), 0o600, "{f}");
        }
        let seed = std::fs::read_to_string(store.join("client.nk")).unwrap();
        let conf = std::fs::read_to_string(store.join("nats-server.conf")).unwrap();
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", n.pid())).unwrap();
        assert!(
            !conf.contains(seed.trim()) && !String::from_utf8_lossy(&cmdline).contains(seed.trim())
        );
    }

    /// `wait_ready` accepts only a server announcing this run's name and requiring auth.
    #[test]
    fn info_must_be_our_servers() {
        let ours = r#"INFO {"server_id":"N1","server_name":"halyard-X","auth_required":true}"#;
        assert!(check_info(ours, "halyard-X", 1).is_ok());
        let e = check_info(ours, "halyard-Y", 1).unwrap_err().to_string();
        assert!(e.contains("not the one this run started"), "{e}");
        let open = r#"INFO {"server_name":"halyard-X","max_payload":1048576}"#;
        assert!(check_info(open, "halyard-X", 1)
            .unwrap_err()
            .to_string()
            .contains("authentication"));
    }
}

//! `http-probe URL`: exit 0 when `GET URL` answers 2xx within 2 seconds, else 1 with the
//! reason on stderr. The healthcheck of the FROM-scratch images (which have no wget or
//! curl), e.g. the local nats-server image's `http-probe http://127.0.0.1:8222/healthz`.
//! Plain `http://host:port/path` only.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(2);

fn main() -> ExitCode {
    let Some(url) = std::env::args().nth(1) else {
        eprintln!("usage: http-probe http://HOST:PORT/PATH");
        return ExitCode::from(2);
    };
    match probe(&url) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("http-probe {url}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn probe(url: &str) -> Result<(), String> {
    let rest = url.strip_prefix("http://").ok_or("only http:// URLs")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr = authority
        .to_socket_addrs()
        .map_err(|e| format!("resolve {authority}: {e}"))?
        .next()
        .ok_or_else(|| format!("{authority} resolves to no address"))?;
    let mut stream =
        TcpStream::connect_timeout(&addr, TIMEOUT).map_err(|e| format!("connect {addr}: {e}"))?;
    stream.set_read_timeout(Some(TIMEOUT)).map_err(|e| e.to_string())?;
    stream.set_write_timeout(Some(TIMEOUT)).map_err(|e| e.to_string())?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(|e| format!("send: {e}"))?;
    let mut head = [0u8; 64];
    let n = stream.read(&mut head).map_err(|e| format!("read: {e}"))?;
    let line = String::from_utf8_lossy(&head[..n]);
    let status = line.split_whitespace().nth(1).unwrap_or("");
    if status.starts_with('2') && status.len() == 3 {
        Ok(())
    } else {
        Err(format!("answered {:?}", line.lines().next().unwrap_or("")))
    }
}

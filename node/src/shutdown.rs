//! Signals: the first SIGINT/SIGTERM asks every part of the process to stop gracefully;
//! a second one exits at once.

use tokio::sync::watch;

/// First SIGINT/SIGTERM: graceful stop (flips the watch). Second: exit at once; nothing
/// durable is lost, since every acked result is already flushed. The handlers are
/// installed before this returns (not when a task first runs), so a signal that comes
/// while the process is still starting is a graceful stop too, never the default kill.
pub fn signal() -> watch::Receiver<bool> {
    use tokio::signal::unix::{signal, SignalKind};
    let (tx, rx) = watch::channel(false);
    let mut term = signal(SignalKind::terminate()).ok();
    let mut int = signal(SignalKind::interrupt()).ok();
    tokio::spawn(async move {
        next_signal(&mut term, &mut int).await;
        tracing::warn!("signal received: stopping gracefully (send again to exit at once)");
        let _ = tx.send(true);
        next_signal(&mut term, &mut int).await;
        eprintln!("second signal: exiting now");
        std::process::exit(130);
    });
    rx
}

/// The next SIGTERM or SIGINT (each only if it could be hooked).
async fn next_signal(
    term: &mut Option<tokio::signal::unix::Signal>,
    int: &mut Option<tokio::signal::unix::Signal>,
) {
    async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
        match s.as_mut() {
            Some(s) => {
                s.recv().await;
            }
            None => std::future::pending().await,
        }
    }
    tokio::select! { _ = recv(term) => {}, _ = recv(int) => {} }
}

/// Resolves once `rx` turns true (or its sender is gone).
pub async fn until(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

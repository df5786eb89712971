//! The fake's server thread, and scripted outages.
//!
//! The server runs on its own thread with its own tokio runtime. An [`Outage::Refuse`]
//! drops that runtime, which closes the listener and every open connection (requests in
//! flight see their connection closed, new ones are refused), and binds the same port
//! again when the outage ends. [`Outage::Unavailable`] and [`Outage::Hang`] keep the
//! server up and change what every request gets: a 503, or no answer at all (the client
//! times out); a request hung this way stays unanswered after the outage.

use std::net::SocketAddr;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use axum::Router;
use tokio::sync::mpsc as tmpsc;

use super::FakeOpenAi;

/// What the fake API does during an outage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outage {
    /// Nothing listens: connections are refused, open ones closed.
    Refuse,
    /// Every request gets `503 Service Unavailable`.
    Unavailable,
    /// Every request is received and never answered.
    Hang,
}

pub(super) enum Cmd {
    /// Start refusing connections.
    Down,
    /// Listen again on the same port.
    Up,
    Stop,
}

/// A command with the channel that says when it took effect.
pub(super) type Order = (Cmd, mpsc::Sender<Result<(), String>>);

/// Runs the server until `Stop` (or every sender is gone), going down and up on order.
pub(super) fn serve(
    listener: std::net::TcpListener,
    app: Router,
    mut orders: tmpsc::UnboundedReceiver<Order>,
    ready: mpsc::Sender<Result<(), String>>,
) {
    let Ok(addr) = listener.local_addr() else {
        let _ = ready.send(Err("listener has no address".into()));
        return;
    };
    let mut listener = Some(listener);
    let mut ready = Some(ready);
    while let Some(l) = listener.take() {
        // Returns on `Down` or `Stop` (`Up` while up is answered inside).
        match run_up(l, app.clone(), &mut orders, ready.take()) {
            // The runtime is gone: the listener and every connection are closed.
            Some((Cmd::Down, done)) => {
                let _ = done.send(Ok(()));
            }
            _ => return,
        }
        // Down: wait for the order to come back up.
        while listener.is_none() {
            match orders.blocking_recv() {
                Some((Cmd::Up, done)) => match rebind(addr) {
                    Ok(l) => {
                        listener = Some(l);
                        ready = Some(done);
                    }
                    Err(e) => {
                        let _ = done.send(Err(e));
                        return;
                    }
                },
                Some((Cmd::Down, done)) => {
                    let _ = done.send(Ok(()));
                }
                Some((Cmd::Stop, _)) | None => return,
            }
        }
    }
}

/// Serve on `listener` in a fresh runtime until an order other than `Up` comes (or the
/// server ends); dropping the runtime on return closes everything it served.
fn run_up(
    listener: std::net::TcpListener,
    app: Router,
    orders: &mut tmpsc::UnboundedReceiver<Order>,
    ready: Option<mpsc::Sender<Result<(), String>>>,
) -> Option<Order> {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("fake-openai-rt")
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            if let Some(r) = ready {
                let _ = r.send(Err(format!("build tokio runtime: {e}")));
            }
            return None;
        }
    };
    let order = runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(listener) => listener,
            Err(e) => {
                if let Some(r) = ready {
                    let _ = r.send(Err(format!("register listener with tokio: {e}")));
                }
                return None;
            }
        };
        let mut server = tokio::spawn(async move { axum::serve(listener, app).await });
        if let Some(r) = ready {
            let _ = r.send(Ok(()));
        }
        loop {
            tokio::select! {
                order = orders.recv() => match order {
                    Some((Cmd::Up, done)) => { let _ = done.send(Ok(())); }
                    other => { server.abort(); return other; }
                },
                ended = &mut server => {
                    eprintln!("fake OpenAI server ended early: {ended:?}");
                    return None;
                }
            }
        }
    });
    // Dropping the runtime cancels every connection task, hanging ones included.
    drop(runtime);
    order
}

/// Bind `addr` again (the port was ours a moment ago; retry briefly in case the kernel
/// has not let go of it yet).
fn rebind(addr: SocketAddr) -> Result<std::net::TcpListener, String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match std::net::TcpListener::bind(addr) {
            Ok(l) => {
                l.set_nonblocking(true).map_err(|e| format!("set_nonblocking: {e}"))?;
                return Ok(l);
            }
            Err(e) if Instant::now() >= deadline => {
                return Err(format!("cannot listen on {addr} again after the outage: {e}"))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Sends orders to the server thread and waits for them to take effect.
#[derive(Clone)]
pub(super) struct Control {
    pub(super) orders: tmpsc::UnboundedSender<Order>,
}

impl Control {
    pub(super) fn order(&self, cmd: Cmd) -> Result<(), String> {
        let (tx, rx) = mpsc::channel();
        self.orders.send((cmd, tx)).map_err(|_| "the server thread is gone".to_string())?;
        rx.recv().unwrap_or(Err("the server thread is gone".into()))
    }
}

/// Keeps the outage state the handler reads (`Unavailable`, `Hang`).
pub(super) type OutageState = Arc<std::sync::Mutex<Option<Outage>>>;

impl FakeOpenAi {
    /// Start an outage of this kind now (ending any other). Returns once it is in
    /// effect: for `Refuse`, once nothing listens and every connection is closed.
    pub fn go_down(&self, kind: Outage) {
        self.come_back();
        if kind == Outage::Refuse {
            self.control.order(Cmd::Down).unwrap_or_else(|e| panic!("fake OpenAI: go down: {e}"));
        } else {
            *self.outage_lock() = Some(kind);
        }
    }

    /// End the outage: listen again on the same port, answer as the responder says.
    pub fn come_back(&self) {
        self.control.order(Cmd::Up).unwrap_or_else(|e| panic!("fake OpenAI: come back: {e}"));
        *self.outage_lock() = None;
    }

    /// The current `Unavailable` or `Hang` outage (a `Refuse` is not kept here).
    fn outage_lock(&self) -> std::sync::MutexGuard<'_, Option<Outage>> {
        self.shared.outage.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An outage of `kind` from now for `window`, ended by a thread of its own; join the
    /// handle to wait for its end.
    pub fn outage_for(&self, kind: Outage, window: Duration) -> std::thread::JoinHandle<()> {
        self.go_down(kind);
        let control = self.control.clone();
        let state = self.shared.outage.clone();
        std::thread::spawn(move || {
            std::thread::sleep(window);
            let _ = control.order(Cmd::Up);
            *state.lock().unwrap_or_else(|p| p.into_inner()) = None;
        })
    }
}

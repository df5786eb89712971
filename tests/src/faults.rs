//! Faults in front of a fake API's responder (issue 29): the calls a figure is made of
//! fail in every way an API fails, and then succeed, so that a test can check the run's
//! figures and labels equal those of a run without faults.
//!
//! [`Faults::wrap`] puts the injector in front of a responder. Off at first; once
//! [`Faults::enable`]d, one request in four (chosen by a hash of its model and messages),
//! up to [`MAX_FAULTED_REQUESTS`] of them, gets two faulty answers before the real one,
//! the kinds in turn: `503 Service Unavailable`, a body cut mid-way (the connection
//! dropped), a `200` with an empty body, a `200` with truncated JSON. (The cap keeps a large
//! sweep's test short: each 503 or dropped connection pauses the pool until a probe
//! answers.) A server kill (connections refused for a
//! window) mid-run is [`FakeOpenAi::outage_for`], started by [`kill_during`].

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::fake_openai::{request_key, ChatCall, FakeOpenAi, Outage, Reply};

/// Faulty answers each chosen request gets before its real one.
pub const FAULTS_PER_REQUEST: u32 = 2;
/// Requests that get faults, at most.
pub const MAX_FAULTED_REQUESTS: usize = 40;

/// The fault injector's state, shared by the responder and the test.
#[derive(Default)]
pub struct Faults {
    on: AtomicBool,
    attempts: Mutex<HashMap<String, u32>>,
    injected: [AtomicUsize; 4],
}

/// The kinds, in [`Faults::injected`]'s order.
pub const KINDS: [&str; 4] = ["503", "reset mid-body", "empty body", "truncated JSON"];

impl Faults {
    pub fn new() -> Arc<Faults> {
        Arc::new(Faults::default())
    }

    /// Inject faults from now on.
    pub fn enable(&self) {
        self.on.store(true, Ordering::SeqCst);
    }

    /// Faults injected so far, by kind ([`KINDS`]).
    pub fn injected(&self) -> [usize; 4] {
        std::array::from_fn(|i| self.injected[i].load(Ordering::SeqCst))
    }

    /// `inner` behind the injector.
    pub fn wrap<F>(
        self: &Arc<Self>,
        inner: F,
    ) -> impl Fn(&ChatCall) -> Reply + Send + Sync + 'static
    where
        F: Fn(&ChatCall) -> Reply + Send + Sync + 'static,
    {
        let me = self.clone();
        move |call: &ChatCall| me.fault(call).unwrap_or_else(|| inner(call))
    }

    fn fault(&self, call: &ChatCall) -> Option<Reply> {
        if !self.on.load(Ordering::SeqCst) {
            return None;
        }
        let key = request_key(call);
        let mut h = std::collections::hash_map::DefaultHasher::new();
        key.hash(&mut h);
        let h = h.finish();
        if !h.is_multiple_of(4) {
            return None;
        }
        {
            let mut seen = self.attempts.lock().unwrap_or_else(|p| p.into_inner());
            if !seen.contains_key(&key) && seen.len() >= MAX_FAULTED_REQUESTS {
                return None;
            }
            let n = seen.entry(key).or_default();
            if *n >= FAULTS_PER_REQUEST {
                return None;
            }
            *n += 1;
        }
        let total: usize = self.injected().iter().sum();
        let kind = total % 4;
        self.injected[kind].fetch_add(1, Ordering::SeqCst);
        Some(match kind {
            0 => Reply::Status {
                code: 503,
                body: r#"{"error":{"message":"overloaded (fault injected)","type":"server_error"}}"#
                    .into(),
                retry_after: None,
            },
            1 => Reply::ResetMidBody("a body that never arrives whole".into()),
            2 => Reply::Garbage(String::new()),
            _ => Reply::Garbage(
                r#"{"id":"chatcmpl-x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"The answ"#
                    .into(),
            ),
        })
    }
}

/// Once `api` has received `calls` more calls than when this starts, refuses connections
/// for `window` (a killed server that comes back). Meant for a scoped thread beside the
/// run; returns whether the kill happened (false when `done` was set first).
pub fn kill_during(api: &FakeOpenAi, calls: usize, window: Duration, done: &AtomicBool) -> bool {
    let start = api.call_count();
    while api.call_count() < start + calls {
        if done.load(Ordering::SeqCst) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = api.outage_for(Outage::Refuse, window).join();
    true
}

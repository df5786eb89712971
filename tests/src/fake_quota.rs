//! A fake OpenAI-compatible API that enforces a quota the way a paid API does.
//!
//! [`FakeQuotaApi`] is a [`FakeOpenAi`] whose responder keeps a sliding window (60 s by
//! default) of the requests it admitted and the tokens charged for them. How a request is
//! charged is [`QuotaConfig::counts`]: [`Counting::MaxTokens`] charges its prompt plus its
//! `max_tokens` at admission and refunds nothing (OpenAI's documented behaviour),
//! [`Counting::Usage`] charges the tokens it used (prompt + completion). A request is
//! admitted when one more request and its charge still fit in the window;
//! otherwise it gets `429` with a `Retry-After` of the seconds until enough of the window
//! has slid by. Admitted requests are answered after a configurable latency with a
//! completion of `completion_tokens` tokens (at most the request's `max_tokens`) and the
//! usage the fake charged. [`FakeQuotaApi::storm`] makes every request a 429 for a while.
//!
//! The fake counts prompt tokens its own way (four tokens per three words, plus three
//! per message and three for the reply), not the way Halyard estimates them, so the
//! worker's correction from reported usage is exercised.
//!
//! The [`QuotaLedger`] keeps every admission, so a test or benchmark can ask for the
//! most requests and tokens admitted in any window, and how many 429s were sent.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::fake_openai::{ChatCall, FakeOpenAi, Reply};

/// How the fake API limits and answers.
#[derive(Clone, Debug)]
pub struct QuotaConfig {
    /// Requests per window.
    pub rpm: u64,
    /// Tokens (prompt + completion) per window.
    pub tpm: u64,
    /// The sliding window (60 s for per-minute quotas).
    pub window: Duration,
    /// Time to answer an admitted request.
    pub latency: Duration,
    /// Completion tokens of each answer (capped by the request's `max_tokens`).
    pub completion_tokens: u64,
    /// How a request's tokens are charged.
    pub counts: Counting,
}

/// How the fake charges a request's tokens against the quota.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Counting {
    /// Prompt + completion actually produced.
    #[default]
    Usage,
    /// Prompt + `max_tokens` (or, without it, the completion) at admission, no refund.
    MaxTokens,
}

impl QuotaConfig {
    pub fn per_minute(rpm: u64, tpm: u64) -> QuotaConfig {
        QuotaConfig {
            rpm,
            tpm,
            window: Duration::from_secs(60),
            latency: Duration::from_millis(100),
            completion_tokens: 20,
            counts: Counting::Usage,
        }
    }
}

/// One admitted request: when (since the fake started) and the tokens charged for it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Admission {
    pub at: Duration,
    pub tokens: u64,
}

/// What the fake admitted and refused.
#[derive(Debug)]
pub struct QuotaLedger {
    cfg: QuotaConfig,
    start: Instant,
    state: Mutex<LedgerState>,
    rejected: AtomicU64,
}

#[derive(Debug, Default)]
struct LedgerState {
    /// Admissions still inside the window, and their token sum.
    recent: VecDeque<Admission>,
    recent_tokens: u64,
    all: Vec<Admission>,
    storm_until: Option<Instant>,
    storm_retry_after: u64,
}

/// Prompt tokens as the fake counts them.
pub fn prompt_tokens(messages: &[(String, String)]) -> u64 {
    messages
        .iter()
        .map(|(_, c)| (c.split_whitespace().count() as u64 * 4).div_ceil(3) + 3)
        .sum::<u64>()
        + 3
}

impl QuotaLedger {
    fn lock(&self) -> MutexGuard<'_, LedgerState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admit or refuse one call.
    fn decide(&self, call: &ChatCall) -> Reply {
        let completion = call
            .max_tokens
            .map_or(self.cfg.completion_tokens, |m| m.min(self.cfg.completion_tokens));
        let prompt = prompt_tokens(&call.messages);
        let cost = match self.cfg.counts {
            Counting::Usage => prompt + completion,
            Counting::MaxTokens => prompt + call.max_tokens.unwrap_or(completion),
        };
        let now = Instant::now();
        let at = now.duration_since(self.start);
        let mut s = self.lock();
        if s.storm_until.is_some_and(|u| u > now) {
            let retry_after = s.storm_retry_after;
            drop(s);
            self.rejected.fetch_add(1, Ordering::SeqCst);
            return Reply::rate_limited(retry_after);
        }
        while let Some(a) = s.recent.front().copied() {
            if at.saturating_sub(a.at) >= self.cfg.window {
                s.recent.pop_front();
                s.recent_tokens -= a.tokens;
            } else {
                break;
            }
        }
        if s.recent.len() as u64 + 1 > self.cfg.rpm || s.recent_tokens + cost > self.cfg.tpm {
            // Wait until enough of the window has slid by: the oldest admission whose
            // departure makes room for this request.
            let (mut n, mut tokens, mut free_at) = (s.recent.len() as u64, s.recent_tokens, at);
            for a in &s.recent {
                if n < self.cfg.rpm && tokens + cost <= self.cfg.tpm {
                    break;
                }
                n -= 1;
                tokens -= a.tokens;
                free_at = a.at + self.cfg.window;
            }
            drop(s);
            self.rejected.fetch_add(1, Ordering::SeqCst);
            let secs = free_at.saturating_sub(at).as_secs_f64().ceil().max(1.0) as u64;
            return Reply::rate_limited(secs);
        }
        let a = Admission { at, tokens: cost };
        s.recent.push_back(a);
        s.recent_tokens += cost;
        s.all.push(a);
        drop(s);
        Reply::TextWithUsage {
            text: format!("answer {}", call.seq),
            prompt_tokens: prompt,
            completion_tokens: completion,
        }
        .after(self.cfg.latency)
    }

    /// Time since the fake started (the clock of [`Admission::at`]).
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Admissions in `[from, to)` on the fake's clock.
    pub fn admitted_between(&self, from: Duration, to: Duration) -> u64 {
        self.lock().all.iter().filter(|a| a.at >= from && a.at < to).count() as u64
    }

    /// Every admission so far, in order.
    pub fn admissions(&self) -> Vec<Admission> {
        self.lock().all.clone()
    }

    pub fn admitted(&self) -> u64 {
        self.lock().all.len() as u64
    }

    /// 429s sent (quota exceeded or storm).
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::SeqCst)
    }

    /// The most requests, and the most tokens, admitted in any window of length `window`
    /// (each maximised on its own).
    pub fn max_in_window(&self, window: Duration) -> (u64, u64) {
        max_in_window(&self.lock().all, window)
    }
}

/// The most admissions and tokens inside any half-open window `[t, t + window)`.
pub fn max_in_window(all: &[Admission], window: Duration) -> (u64, u64) {
    let (mut lo, mut tokens, mut best_n, mut best_t) = (0usize, 0u64, 0u64, 0u64);
    for (hi, a) in all.iter().enumerate() {
        tokens += a.tokens;
        while a.at.saturating_sub(all[lo].at) >= window {
            tokens -= all[lo].tokens;
            lo += 1;
        }
        best_n = best_n.max((hi + 1 - lo) as u64);
        best_t = best_t.max(tokens);
    }
    (best_n, best_t)
}

/// The fake API; see the module docs.
pub struct FakeQuotaApi {
    pub server: FakeOpenAi,
    pub ledger: Arc<QuotaLedger>,
}

impl FakeQuotaApi {
    /// Start the server (from any thread); it listens on `127.0.0.1`.
    pub fn start(cfg: QuotaConfig) -> FakeQuotaApi {
        let ledger = Arc::new(QuotaLedger {
            cfg,
            start: Instant::now(),
            state: Mutex::default(),
            rejected: AtomicU64::new(0),
        });
        let l = ledger.clone();
        let server = FakeOpenAi::start_blocking(move |call| l.decide(call));
        FakeQuotaApi { server, ledger }
    }

    pub fn base_url(&self) -> String {
        self.server.base_url()
    }

    /// Answer every request with 429 (`Retry-After: retry_after_s`) for `d` from now.
    pub fn storm(&self, d: Duration, retry_after_s: u64) {
        let mut s = self.ledger.lock();
        s.storm_until = Some(Instant::now() + d);
        s.storm_retry_after = retry_after_s;
    }
}

/// The `i`th chat job of a quota test or benchmark: one short user message to the
/// OpenAI-compatible API at `base_url`, in `pool`, for run `run`.
pub fn chat_job(
    run: uuid::Uuid,
    pool: &str,
    base_url: &str,
    max_tokens: u32,
    i: u64,
) -> halyard_proto::Job {
    use halyard_proto::{ChatMessage, JobKey, ModelRef, Sampling};
    let key = JobKey {
        pipeline: "quota-test".into(),
        stage: "call".into(),
        stage_version: 1,
        model: ModelRef { backend: "openai".into(), endpoint: base_url.into(), model: "m".into() },
        messages: vec![ChatMessage::user(format!("question number {i}"))],
        sampling: Sampling { max_tokens: Some(max_tokens), ..Default::default() },
        sample_index: 0,
    };
    halyard_proto::Job::new(run, pool, key, 30_000)
}

/// Publish jobs `from..to` of [`chat_job`] to the pool's job subject (the streams must
/// exist) and wait for JetStream to confirm them all.
pub async fn publish_chat_jobs(
    js: &async_nats::jetstream::Context,
    run: uuid::Uuid,
    pool: &str,
    base_url: &str,
    max_tokens: u32,
    jobs: std::ops::Range<u64>,
) -> Result<(), String> {
    let subject = halyard_proto::subjects::job_subject(pool);
    let mut acks = Vec::new();
    for i in jobs {
        let job = chat_job(run, pool, base_url, max_tokens, i);
        let payload = halyard_proto::encode(&job).map_err(|e| e.to_string())?;
        let m = async_nats::jetstream::message::PublishMessage::build()
            .payload(payload.into())
            .message_id(format!("{run}:{}", job.id));
        acks.push(
            js.send_publish(subject.clone(), m)
                .await
                .map_err(|e| format!("publish job {i}: {e}"))?,
        );
        if acks.len() >= 256 {
            for a in acks.drain(..) {
                a.await.map_err(|e| format!("job not confirmed: {e}"))?;
            }
        }
    }
    for a in acks {
        a.await.map_err(|e| format!("job not confirmed: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(words: usize, max_tokens: Option<u64>) -> ChatCall {
        ChatCall {
            messages: vec![("user".into(), vec!["w"; words].join(" "))],
            max_tokens,
            ..Default::default()
        }
    }

    /// Requests beyond the window's quota get 429 with the wait until room frees up;
    /// tokens bind as well as requests.
    #[test]
    fn window_limits_requests_and_tokens() {
        let cfg = QuotaConfig {
            rpm: 3,
            tpm: 1000,
            window: Duration::from_secs(60),
            latency: Duration::ZERO,
            completion_tokens: 10,
            counts: Counting::Usage,
        };
        let l = QuotaLedger {
            cfg,
            start: Instant::now(),
            state: Mutex::default(),
            rejected: AtomicU64::new(0),
        };
        for _ in 0..3 {
            assert!(matches!(l.decide(&call(3, None)), Reply::Delayed(..)));
        }
        match l.decide(&call(3, None)) {
            Reply::Status { code: 429, retry_after: Some(s), .. } => {
                assert!((59..=60).contains(&s.parse::<u64>().unwrap()), "{s}")
            }
            other => panic!("expected 429, got {other:?}"),
        }
        assert_eq!((l.admitted(), l.rejected()), (3, 1));
        // Each call: prompt 4 + 3 + 3 = 10, completion 10 → 20 tokens.
        assert_eq!(l.max_in_window(Duration::from_secs(60)), (3, 60));
        // 15 tokens a call (10 prompt, 5 completion): two fit in 44, a third does not.
        let tcfg = QuotaConfig { rpm: 100, tpm: 44, ..l.cfg.clone() };
        let t = QuotaLedger {
            cfg: tcfg,
            start: Instant::now(),
            state: Mutex::default(),
            rejected: AtomicU64::new(0),
        };
        assert!(matches!(t.decide(&call(3, Some(5))), Reply::Delayed(..)));
        assert!(matches!(t.decide(&call(3, Some(5))), Reply::Delayed(..)));
        assert!(matches!(t.decide(&call(3, Some(5))), Reply::Status { code: 429, .. }));
    }

    /// With `max_tokens` counting a request is charged prompt + max_tokens however short
    /// its answer; with `usage` counting, what it used (issue 18).
    #[test]
    fn max_tokens_counting_charges_the_reservation() {
        let ledger = |counts| QuotaLedger {
            cfg: QuotaConfig {
                counts,
                completion_tokens: 10,
                ..QuotaConfig::per_minute(100, 1000)
            },
            start: Instant::now(),
            state: Mutex::default(),
            rejected: AtomicU64::new(0),
        };
        // Prompt: 3 words → 4 + 3 + 3 = 10 tokens; max_tokens 90, answer 10 tokens.
        let u = ledger(Counting::Usage);
        let m = ledger(Counting::MaxTokens);
        for l in [&u, &m] {
            assert!(matches!(l.decide(&call(3, Some(90))), Reply::Delayed(..)));
        }
        assert_eq!(u.admissions()[0].tokens, 20);
        assert_eq!(m.admissions()[0].tokens, 100);
        // Ten fit in 1000 tokens reserved this way, the eleventh does not.
        for _ in 1..10 {
            assert!(matches!(m.decide(&call(3, Some(90))), Reply::Delayed(..)));
        }
        assert!(matches!(m.decide(&call(3, Some(90))), Reply::Status { code: 429, .. }));
        assert!(matches!(u.decide(&call(3, Some(90))), Reply::Delayed(..)));
    }

    /// The sliding maximum counts every window, not only aligned minutes.
    #[test]
    fn sliding_maximum() {
        let at = |s: f64| Admission { at: Duration::from_secs_f64(s), tokens: 10 };
        let all = [at(0.0), at(50.0), at(55.0), at(59.9), at(60.0), at(100.0), at(119.0)];
        assert_eq!(max_in_window(&all, Duration::from_secs(60)), (5, 50));
        assert_eq!(max_in_window(&[], Duration::from_secs(60)), (0, 0));
    }
}

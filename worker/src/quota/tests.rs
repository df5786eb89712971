//! The limiter under paused tokio time: rate, spacing, weights, refunds, rebuilds and
//! cool-downs. Paused time makes these exact and immune to machine load.

use std::time::Duration;

use tokio::time::Instant;

use super::limiter::{share_per_minute, PoolLimiter};
use super::*;

/// Admission times of `acquire(cost)` called back to back for `secs` seconds.
async fn admit_for(l: &PoolLimiter, secs: u64, cost: u64, actual: Option<u64>) -> Vec<Duration> {
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let mut at = Vec::new();
    loop {
        l.acquire(cost).await;
        let now = Instant::now();
        if now >= end {
            return at;
        }
        at.push(now - start);
        if let Some(a) = actual {
            l.correct(cost, a);
        }
    }
}

fn quota(rpm: Option<u32>, tpm: Option<u64>) -> PoolQuota {
    PoolQuota::new(rpm, tpm)
}

/// The request limiter admits its share, evenly spaced (no two requests closer than
/// the period when burst is 1), and no more than the quota in the first minute.
#[tokio::test(start_paused = true)]
async fn rate_is_the_share_and_evenly_spaced() {
    let l = PoolLimiter::new(quota(Some(600), None), 1);
    let at = admit_for(&l, 60, 0, None).await;
    let share = share_per_minute(600.0, DEFAULT_HEADROOM, 1, 1.5);
    // Burst 1 plus 50 ms of slack (0.5 of a request at ~10 a second).
    assert!((share - (600.0 * (1.0 - DEFAULT_HEADROOM) - 1.5)).abs() < 1e-9, "{share}");
    assert_eq!(l.rates().requests, Some(share));
    assert!((at.len() as f64 - share).abs() <= 1.0, "admitted {} in 60 s, share {share}", at.len());
    assert!(at.len() <= 600);
    // Spacing: never two requests within half a period (the other half is timer slack).
    let period = Duration::from_secs_f64(60.0 / share);
    for w in at.windows(2) {
        assert!(
            w[1] - w[0] >= period.mul_f64(0.5) - Duration::from_micros(200),
            "burst: {:?} then {:?}",
            w[0],
            w[1]
        );
    }
    // The limiter starts empty: the first request waits at least half a period.
    assert!(at[0] >= period.mul_f64(0.5) - Duration::from_micros(200), "first at {:?}", at[0]);
}

/// Tokens are weights: a request costing 100 tokens against 6000 TPM gets ~59 a minute,
/// and never more tokens in the minute than the quota.
#[tokio::test(start_paused = true)]
async fn tokens_weigh_requests() {
    let l = PoolLimiter::new(quota(None, Some(6000)), 1);
    let at = admit_for(&l, 60, 100, None).await;
    let tokens = at.len() as u64 * 100;
    assert!(tokens <= 6000, "{tokens} tokens in a minute");
    assert!(tokens as f64 >= 0.97 * 6000.0 - 100.0, "{tokens} tokens in a minute");
}

/// Usage below the estimate is refunded: requests estimated at 100 tokens that use 50
/// get twice as many through; a debt (usage above the estimate) slows them down.
#[tokio::test(start_paused = true)]
async fn usage_corrects_the_estimate() {
    let l = PoolLimiter::new(quota(None, Some(6000)), 1);
    let refunded = admit_for(&l, 60, 100, Some(50)).await.len() as f64;
    assert!(
        (refunded - 6000.0 * (1.0 - DEFAULT_HEADROOM) / 50.0).abs() <= 3.0,
        "{refunded} requests"
    );
    let l = PoolLimiter::new(quota(None, Some(6000)), 1);
    let indebted = admit_for(&l, 60, 100, Some(200)).await.len() as f64;
    assert!(
        (indebted - 6000.0 * (1.0 - DEFAULT_HEADROOM) / 200.0).abs() <= 3.0,
        "{indebted} requests"
    );
    // A 429 refunds the whole estimate.
    let l = PoolLimiter::new(quota(None, Some(6000)), 1);
    l.correct(100, 0);
    assert_eq!(l.balance(), 100);
}

/// A membership change rebuilds the limiter at `quota / members`, and a request waiting
/// on the old limiter is admitted on the new one's terms.
#[tokio::test(start_paused = true)]
async fn membership_change_rebuilds_the_share() {
    let l = std::sync::Arc::new(PoolLimiter::new(quota(Some(600), Some(60_000)), 1));
    let one = share_per_minute(600.0, DEFAULT_HEADROOM, 1, 1.5);
    assert_eq!(l.rates().requests, Some(one));
    assert!(l.set_members(4));
    assert!(!l.set_members(4), "same count: no rebuild");
    let r = l.rates().requests.unwrap();
    // A quarter of the quota: 50 ms of slack is 0.125 of a request, rounded up to cells.
    assert!((r - (600.0 * (1.0 - DEFAULT_HEADROOM) / 4.0 - 1.15)).abs() < 1e-9, "{r}");
    let four = admit_for(&l, 60, 10, None).await.len() as f64;
    assert!((four - r).abs() <= 1.0, "{four} vs {r}");
    // Shrink to one member at a tenth of a period into a long wait: the waiter is served
    // at the new rate, not the old one.
    l.set_members(1);
    let a = admit_for(&l, 30, 10, None).await.len() as f64;
    assert!((a - one / 2.0).abs() <= 2.0, "{a}");
    // A crashed member leaving (2 → 1) doubles the share.
    let l = PoolLimiter::new(quota(Some(600), None), 2);
    let two = l.rates().requests.unwrap();
    l.set_members(1);
    assert!(l.rates().requests.unwrap() > 1.9 * two);
}

/// A waiter blocked on a slow share is woken by a rebuild to a fast one.
#[tokio::test(start_paused = true)]
async fn rebuild_wakes_waiters() {
    let l = std::sync::Arc::new(PoolLimiter::new(quota(Some(6), None), 6));
    // Six members of a 6 RPM quota with bursts of 1.1: the share is floored at a tiny
    // rate, so the first request waits very long.
    let start = Instant::now();
    let l2 = l.clone();
    let waiter = tokio::spawn(async move {
        l2.acquire(0).await;
        Instant::now()
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!waiter.is_finished());
    l.set_members(1);
    let done = waiter.await.unwrap();
    // One member: about 4.9 a minute, some 12 s a request.
    assert!(done - start < Duration::from_secs(5 + 13), "{:?}", done - start);
}

/// A cool-down admits nothing until it ends, then runs at half rate and steps back up
/// to the full share over the recovery time; a second 429 during it does not start
/// another cool-down.
#[tokio::test(start_paused = true)]
async fn cool_down_pauses_then_recovers() {
    let l = std::sync::Arc::new(PoolLimiter::new(quota(Some(600), None), 1));
    let one = share_per_minute(600.0, DEFAULT_HEADROOM, 1, 1.5);
    let epoch = l.epoch();
    assert!(l.cool_down(Duration::from_secs(10)));
    assert!(!l.cool_down(Duration::from_secs(5)), "extends, does not start another");
    assert_eq!(l.epoch(), epoch + 1);
    let rec = {
        let l = l.clone();
        tokio::spawn(async move { l.recover(Duration::from_secs(20)).await })
    };
    let start = Instant::now();
    l.acquire(0).await;
    assert!(Instant::now() - start >= Duration::from_secs(10), "admitted during the pause");
    assert_eq!(l.factor(), 0.5);
    let half = admit_for(&l, 4, 0, None).await.len() as f64;
    assert!((half - one * 0.5 / 15.0).abs() <= 2.0, "{half} in 4 s at half rate");
    rec.await.unwrap();
    assert_eq!(l.factor(), 1.0);
    let full = admit_for(&l, 6, 0, None).await.len() as f64;
    assert!((full - one / 10.0).abs() <= 2.0, "{full} in 6 s at full rate");
}

/// A local pause (quota headers say the budget is spent) holds requests until it ends.
#[tokio::test(start_paused = true)]
async fn local_pause_holds_requests() {
    let l = PoolLimiter::new(quota(Some(6000), None), 1);
    l.pause_local(Instant::now() + Duration::from_secs(3));
    let start = Instant::now();
    l.acquire(0).await;
    assert!(Instant::now() - start >= Duration::from_secs(3));
    assert_eq!(l.factor(), 1.0, "a local pause is not a cool-down");
}

/// A member that left admits nothing more, however long a request waits.
#[tokio::test(start_paused = true)]
async fn closed_limiter_admits_nothing() {
    let l = PoolLimiter::new(quota(Some(6000), None), 1);
    l.acquire(0).await;
    l.close();
    assert!(tokio::time::timeout(Duration::from_secs(3600), l.acquire(0)).await.is_err());
}

#[test]
fn reset_header_forms() {
    assert_eq!(parse_reset("1s"), Some(Duration::from_secs(1)));
    assert_eq!(parse_reset("6m0s"), Some(Duration::from_secs(360)));
    assert_eq!(parse_reset("20ms"), Some(Duration::from_millis(20)));
    assert_eq!(parse_reset("1h2m3.5s"), Some(Duration::from_secs_f64(3723.5)));
    assert_eq!(parse_reset("2.5"), Some(Duration::from_millis(2500)));
    for bad in ["", "soon", "5x", "-1", "s", "1s2"] {
        assert_eq!(parse_reset(bad), None, "{bad:?}");
    }
    let h = RateHeaders::parse(|n| match n {
        "x-ratelimit-remaining-requests" => Some("0"),
        "x-ratelimit-reset-requests" => Some("250ms"),
        "x-ratelimit-remaining-tokens" => Some("junk"),
        _ => None,
    });
    assert_eq!(h.remaining_requests, Some(0));
    assert_eq!(h.reset_requests, Some(Duration::from_millis(250)));
    assert_eq!(h.remaining_tokens, None);
}

#[test]
fn estimate_counts_prompt_and_max_tokens() {
    use halyard_proto::{ChatMessage, JobKey, ModelRef, Sampling};
    let key = |max_tokens| JobKey {
        pipeline: "p".into(),
        stage: "s".into(),
        stage_version: 1,
        model: ModelRef {
            backend: "openai".into(),
            endpoint: "http://x".into(),
            model: "m".into(),
        },
        messages: vec![ChatMessage::system("12345678"), ChatMessage::user("abc")],
        sampling: Sampling { max_tokens, ..Default::default() },
        sample_index: 0,
    };
    let job = |k: JobKey| Job {
        v: 1,
        id: k.id(),
        run: uuid::Uuid::nil(),
        pool: "p".into(),
        key: k,
        timeout_ms: 1,
    };
    // (2 + 4) + (1 + 4) + 3 = 14 prompt tokens.
    assert_eq!(estimate_tokens(&job(key(Some(100)))), 114);
    assert_eq!(estimate_tokens(&job(key(None))), 14 + DEFAULT_COMPLETION_ESTIMATE);
}

/// Under `max_tokens` counting a request is charged its prompt + max_tokens, the unused
/// completion never refunded (the prompt's estimate corrected by the reported count);
/// under `usage` counting it is charged what it used (issue 18).
#[test]
fn charges_follow_the_counting_mode() {
    use halyard_proto::Usage;
    let u = |p, c| Usage { prompt_tokens: p, completion_tokens: c, cache: None };
    // Estimate 114: 14 prompt + 100 max_tokens; the answer used 20 completion tokens.
    assert_eq!(charged_tokens(TpmCounts::MaxTokens, 114, Some(100), &u(14, 20)), 114);
    assert_eq!(charged_tokens(TpmCounts::MaxTokens, 114, Some(100), &u(10, 20)), 110);
    assert_eq!(charged_tokens(TpmCounts::MaxTokens, 114, Some(100), &u(30, 20)), 130);
    // Without max_tokens the reservation is unknown: what was used, never below the estimate.
    assert_eq!(charged_tokens(TpmCounts::MaxTokens, 270, None, &u(14, 20)), 270);
    assert_eq!(charged_tokens(TpmCounts::MaxTokens, 270, None, &u(14, 300)), 314);
    assert_eq!(charged_tokens(TpmCounts::Usage, 114, Some(100), &u(14, 20)), 34);
    // No usage reported: the estimate stands either way.
    for m in [TpmCounts::MaxTokens, TpmCounts::Usage] {
        assert_eq!(charged_tokens(m, 114, Some(100), &u(0, 0)), 114);
    }
    assert_eq!(PoolQuota::new(None, Some(1)).tpm_counts, TpmCounts::MaxTokens);
    assert_eq!("usage".parse::<TpmCounts>(), Ok(TpmCounts::Usage));
    assert_eq!(" max_tokens ".parse::<TpmCounts>(), Ok(TpmCounts::MaxTokens));
    assert!("tokens".parse::<TpmCounts>().unwrap_err().contains("tokens"));
}

/// With `max_tokens` counting, requests estimated at 100 tokens that use 50 get no more
/// through than their estimates allow: nothing the API still holds is spent (issue 18).
#[tokio::test(start_paused = true)]
async fn max_tokens_counting_keeps_no_credit() {
    let l = PoolLimiter::new(quota(None, Some(6000)), 1);
    let usage = halyard_proto::Usage { prompt_tokens: 10, completion_tokens: 40, cache: None };
    let start = Instant::now();
    let mut n = 0u64;
    while Instant::now() - start < Duration::from_secs(60) {
        l.acquire(100).await;
        n += 1;
        l.correct(100, charged_tokens(TpmCounts::MaxTokens, 100, Some(90), &usage));
    }
    assert!(n * 100 <= 6000 + 100, "{n} requests of 100 tokens in a minute");
    assert_eq!(l.balance(), 0);
}

/// Issue 33: a correction at the extremes (the API said 2^64 − 1 tokens) leaves a debt of
/// at most a minute of the share, so the next request is admitted within about a minute
/// instead of never; corrections never overflow.
#[tokio::test(start_paused = true)]
async fn an_absurd_correction_costs_at_most_a_minute() {
    let l = PoolLimiter::new(quota(None, Some(6000)), 1);
    l.acquire(100).await;
    l.correct(100, u64::MAX);
    let share = l.rates().tokens.unwrap();
    assert!(l.balance() < 0 && l.balance() >= -(share as i64), "{}", l.balance());
    l.correct(u64::MAX, u64::MAX);
    l.correct(u64::MAX, 0);
    assert!(l.balance() > 0, "credit, no overflow: {}", l.balance());
    let l = PoolLimiter::new(quota(None, Some(6000)), 1);
    l.acquire(100).await;
    l.correct(100, u64::MAX);
    let start = Instant::now();
    l.acquire(100).await;
    assert!(Instant::now() - start <= Duration::from_secs(125), "{:?}", Instant::now() - start);
}

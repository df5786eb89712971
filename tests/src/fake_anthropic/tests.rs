//! The fake against the API reference: headers, error shapes, caching, the limiter.

use std::time::Duration;

use serde_json::{json, Value};

use super::*;

fn post(fake: &FakeAnthropic, headers: &[(&str, &str)], body: Value) -> (u16, HeaderMap, Value) {
    // reqwest is built without a default TLS provider (as in the worker).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut req =
            reqwest::Client::new().post(format!("{}/messages", fake.base_url())).json(&body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let r = req.timeout(Duration::from_secs(30)).send().await.unwrap();
        let status = r.status().as_u16();
        let h = r.headers().clone();
        let v = r.json::<Value>().await.unwrap_or(Value::Null);
        (status, h, v)
    })
}

const H: &[(&str, &str)] = &[("x-api-key", "k"), ("anthropic-version", "2023-06-01")];

/// Missing key, version or max_tokens, and bad fields, get the API's errors.
#[test]
fn requests_are_checked_as_the_api_checks_them() {
    let fake = FakeAnthropic::start(Limits::default(), |_| Reply::Text("hi".into()));
    let ok =
        json!({"model": "claude", "max_tokens": 5, "messages": [{"role": "user", "content": "q"}]});
    let (s, _, v) = post(&fake, &H[1..], ok.clone());
    assert_eq!((s, v["error"]["type"].as_str()), (401, Some("authentication_error")));
    let (s, _, v) = post(&fake, &H[..1], ok.clone());
    assert_eq!((s, v["type"].as_str()), (400, Some("error")));
    let mut no_max = ok.clone();
    no_max.as_object_mut().unwrap().remove("max_tokens");
    let (s, _, v) = post(&fake, H, no_max);
    assert_eq!(s, 400);
    assert!(v["error"]["message"].as_str().unwrap().contains("max_tokens"), "{v}");
    let mut hot = ok.clone();
    hot["temperature"] = json!(1.5);
    assert_eq!(post(&fake, H, hot).0, 400);
    let (s, _, v) = post(&fake, H, ok);
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (v["content"][0]["text"].as_str(), v["stop_reason"].as_str()),
        (Some("hi"), Some("end_turn"))
    );
    assert_eq!(fake.paid().len(), 1);
}

/// A cached system prompt is written once, then read; a long answer stops at max_tokens;
/// 529 and refusals have the API's shapes.
#[test]
fn caching_truncation_overload_refusal() {
    let fake =
        FakeAnthropic::start(Limits::default(), |c| match c.messages.last().unwrap().1.as_str() {
            "overload" => overloaded(),
            "refuse" => Reply::Refusal("No.".into()),
            _ => Reply::Text("one two three four five six".into()),
        });
    let body = |q: &str| {
        json!({"model": "claude", "max_tokens": 4,
               "system": [{"type": "text", "text": "a long fixed instruction", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
               "messages": [{"role": "user", "content": q}]})
    };
    let (_, _, first) = post(&fake, H, body("x y"));
    assert_eq!(first["usage"]["cache_creation_input_tokens"], 4);
    assert_eq!(first["usage"]["cache_creation"]["ephemeral_1h_input_tokens"], 4);
    assert_eq!(first["usage"]["input_tokens"], 2);
    assert_eq!(first["stop_reason"], "max_tokens");
    assert_eq!(first["usage"]["output_tokens"], 4);
    let (_, _, second) = post(&fake, H, body("z"));
    assert_eq!(
        (
            second["usage"]["cache_read_input_tokens"].as_u64(),
            second["usage"]["input_tokens"].as_u64()
        ),
        (Some(4), Some(1))
    );
    let (s, _, v) = post(&fake, H, body("overload"));
    assert_eq!((s, v["error"]["type"].as_str()), (529, Some("overloaded_error")));
    let (s, _, v) = post(&fake, H, body("refuse"));
    assert_eq!((s, v["stop_reason"].as_str()), (200, Some("refusal")));
}

/// The output-token bucket admits by max_tokens, settles to what was produced, and
/// refuses beyond it with 429, retry-after and the rate-limit headers. (Its refill, 166
/// tokens a second, would need 9 s to admit the refused call: far more than the test.)
#[test]
fn output_tokens_per_minute_are_enforced() {
    let limits = Limits { rpm: None, itpm: None, otpm: Some(10_000) };
    let fake = FakeAnthropic::start(limits, |_| Reply::Text("w ".repeat(1500)));
    let body = json!({"model": "claude", "max_tokens": 4000, "messages": [{"role": "user", "content": "q"}]});
    // Each call reserves 4,000 and settles to 1,500: five fit (10,000 − 4 × 1,500 ≥ 4,000).
    for _ in 0..5 {
        let (s, h, _) = post(&fake, H, body.clone());
        assert_eq!(s, 200);
        assert!(h.contains_key("anthropic-ratelimit-output-tokens-remaining"));
    }
    // 2,500 left: a max_tokens of 4,000 no longer fits.
    let (s, h, v) = post(&fake, H, body);
    assert_eq!((s, v["error"]["type"].as_str()), (429, Some("rate_limit_error")));
    assert!(h.get("retry-after").unwrap().to_str().unwrap().parse::<u64>().unwrap() >= 1);
    assert_eq!(h["anthropic-ratelimit-output-tokens-limit"], "10000");
    let l = fake.ledger();
    assert_eq!((l.rejected, l.admitted.len()), (1, 5));
    assert!(l.admitted.iter().all(|(_, n)| *n == 1500));
}

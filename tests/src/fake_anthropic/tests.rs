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

/// A request to the batch API: (status, body as text).
fn call(
    fake: &FakeAnthropic,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, String) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut req = reqwest::Client::new()
            .request(method, format!("{}{path}", fake.base_url()))
            .header("x-api-key", "k")
            .header("anthropic-version", "2023-06-01");
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.timeout(Duration::from_secs(30)).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    })
}

fn request(id: &str, q: &str) -> Value {
    json!({"custom_id": id, "params": {"model": "claude", "max_tokens": 5,
           "messages": [{"role": "user", "content": q}]}})
}

/// Issue 52: the Message Batches life cycle: create (checked), in progress, ended after
/// the delay with a mix of the four result types, results streamed with their padding,
/// listed newest first with paging, and cancelled; errors have the API's shapes.
#[test]
fn message_batches_life_cycle() {
    let script = BatchScript {
        delay: Duration::from_millis(300),
        fate: std::sync::Arc::new(|c: &ChatCall, _: u32| {
            match c.messages.last().unwrap().1.as_str() {
                "late" => Fate::Expired,
                "stop" => Fate::Canceled,
                _ => Fate::Run,
            }
        }),
        padding: 3 << 20,
        fault_every: None,
        cut_create_replies: 0,
    };
    let fake = FakeAnthropic::start_with_batches(Limits::default(), script, |c| {
        match c.messages.last().unwrap().1.as_str() {
            "busy" => overloaded(),
            _ => Reply::Text("yes".into()),
        }
    });
    use reqwest::Method as M;
    let (s, v) = call(&fake, M::POST, "/messages/batches", Some(json!({"requests": []})));
    assert_eq!(s, 400, "{v}");
    let dup = json!({"requests": [request("a", "q"), request("a", "q")]});
    let (s, v) = call(&fake, M::POST, "/messages/batches", Some(dup));
    assert!(s == 400 && v.contains("requests.1.custom_id"), "{v}");
    let bad_id = json!({"requests": [request("a b", "q")]});
    assert_eq!(call(&fake, M::POST, "/messages/batches", Some(bad_id)).0, 400);

    let reqs = json!({"requests": [request("ok", "q"), request("exp", "late"),
        request("can", "stop"), request("err", "busy"),
        {"custom_id": "bad", "params": {"model": "claude", "messages": [{"role": "user", "content": "q"}]}}]});
    let (s, v) = call(&fake, M::POST, "/messages/batches", Some(reqs));
    assert_eq!(s, 200, "{v}");
    let b: Value = serde_json::from_str(&v).unwrap();
    assert_eq!(
        (b["processing_status"].as_str(), b["request_counts"]["processing"].as_u64()),
        (Some("in_progress"), Some(5))
    );
    let id = b["id"].as_str().unwrap().to_string();
    let (s, v) = call(&fake, M::GET, &format!("/messages/batches/{id}/results"), None);
    assert!(s == 400 && v.contains("still processing"), "{v}");
    std::thread::sleep(Duration::from_millis(400));
    let (_, v) = call(&fake, M::GET, &format!("/messages/batches/{id}"), None);
    let b: Value = serde_json::from_str(&v).unwrap();
    assert_eq!(b["processing_status"], "ended");
    assert_eq!(
        b["request_counts"],
        json!({"processing": 0, "succeeded": 1, "errored": 2, "canceled": 1, "expired": 1})
    );
    assert!(b["results_url"].as_str().unwrap().ends_with(&format!("{id}/results")));
    let (s, text) = call(&fake, M::GET, &format!("/messages/batches/{id}/results"), None);
    assert_eq!(s, 200);
    assert!(text.len() > 3 << 20, "padding streamed");
    let lines: Vec<Value> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let types: Vec<(&str, &str)> = lines
        .iter()
        .map(|l| (l["custom_id"].as_str().unwrap(), l["result"]["type"].as_str().unwrap()))
        .collect();
    assert_eq!(
        types,
        [
            ("ok", "succeeded"),
            ("exp", "expired"),
            ("can", "canceled"),
            ("err", "errored"),
            ("bad", "errored")
        ]
    );
    assert_eq!(lines[0]["result"]["message"]["content"][0]["text"], "yes");
    assert_eq!(lines[3]["result"]["error"]["error"]["type"], "overloaded_error");
    assert_eq!(lines[4]["result"]["error"]["error"]["type"], "invalid_request_error");
    assert_eq!(fake.paid().len(), 1);
    assert_eq!(fake.paid()[0].batch.as_deref(), Some(format!("{id}#0").as_str()));

    // A second batch, cancelled at once: every request canceled; the list is newest
    // first and pages with after_id.
    let (_, v) =
        call(&fake, M::POST, "/messages/batches", Some(json!({"requests": [request("x", "q")]})));
    let id2 = serde_json::from_str::<Value>(&v).unwrap()["id"].as_str().unwrap().to_string();
    let (_, v) = call(&fake, M::POST, &format!("/messages/batches/{id2}/cancel"), None);
    assert_eq!(serde_json::from_str::<Value>(&v).unwrap()["processing_status"], "canceling");
    let (_, v) = call(&fake, M::GET, "/messages/batches?limit=1", None);
    let page: Value = serde_json::from_str(&v).unwrap();
    assert_eq!(
        (page["data"][0]["id"].as_str(), page["has_more"].as_bool()),
        (Some(id2.as_str()), Some(true))
    );
    assert_eq!(page["data"][0]["request_counts"]["canceled"], 1);
    let (_, v) = call(&fake, M::GET, &format!("/messages/batches?limit=1&after_id={id2}"), None);
    let page: Value = serde_json::from_str(&v).unwrap();
    assert_eq!(
        (page["data"][0]["id"].as_str(), page["has_more"].as_bool()),
        (Some(id.as_str()), Some(false))
    );
    assert_eq!(call(&fake, M::GET, "/messages/batches/msgbatch_nope", None).0, 404);
    assert_eq!(fake.batches().len(), 2);
    assert_eq!(fake.results_served(), 1);
}

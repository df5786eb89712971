//! Tests of the fake over real sockets, with a minimal blocking HTTP/1.1 client.

use super::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Instant;

/// A parsed HTTP response.
#[derive(Debug)]
struct RawResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl RawResponse {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("response body is not JSON ({e}): {:?}", self.body))
    }
}

/// POSTs `body` with `Connection: close` and reads the whole response.
fn raw_post(
    port: u16,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> std::io::Result<RawResponse> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
    stream.set_read_timeout(Some(timeout))?;
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no header/body separator in response {text:?}"));
    let mut lines = head.lines();
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Ok(RawResponse { status, headers, body: body.to_string() })
}

fn chat_body(model: &str, user: &str) -> String {
    json!({
        "model": model,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": user},
        ],
        "temperature": 0.5,
        "max_tokens": 16,
        "seed": 7,
        "some_unknown_field": {"ignored": true},
    })
    .to_string()
}

fn post_chat(fake: &FakeOpenAi, user: &str) -> RawResponse {
    raw_post(
        fake.port(),
        "/v1/chat/completions",
        &chat_body("m1", user),
        &[],
        Duration::from_secs(10),
    )
    .expect("POST to the fake")
}

/// Polls `cond` for up to 10 s; panics with `what` if it never holds.
fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A `Text` reply is a standard chat.completion with word-count usage, and the call is logged.
#[test]
fn text_reply_is_a_chat_completion() {
    let fake = FakeOpenAi::start_blocking(|call| Reply::Text(format!("echo {}", call.model)));
    assert_eq!(fake.base_url(), format!("http://127.0.0.1:{}/v1", fake.port()));
    let res = raw_post(
        fake.port(),
        "/v1/chat/completions",
        &chat_body("m1", "what is a halyard"),
        &[("Authorization", "Bearer sk-test")],
        Duration::from_secs(10),
    )
    .expect("POST");
    assert_eq!(res.status, 200, "{res:?}");
    assert_eq!(res.header("content-type"), Some("application/json"));
    let v = res.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "m1");
    assert!(v["id"].is_string() && v["created"].is_u64(), "{v}");
    assert_eq!(v["choices"][0]["index"], 0);
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], "echo m1");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // "be brief" (2) + "what is a halyard" (4); "echo m1" (2).
    assert_eq!(v["usage"], json!({"prompt_tokens": 6, "completion_tokens": 2, "total_tokens": 8}));

    let calls = fake.calls();
    assert_eq!(calls.len(), 1);
    let call = &calls[0];
    assert_eq!(call.model, "m1");
    assert_eq!(
        call.messages,
        vec![
            ("system".to_string(), "be brief".to_string()),
            ("user".to_string(), "what is a halyard".to_string()),
        ]
    );
    assert_eq!(call.temperature, Some(0.5));
    assert_eq!(call.max_tokens, Some(16));
    assert_eq!(call.authorization.as_deref(), Some("Bearer sk-test"));
    assert_eq!(call.seq, 0);
    assert_eq!(call.body["seed"], 7);
}

/// The path without `/v1` is served too; `TextWithUsage` reports the given usage.
#[test]
fn path_without_v1_and_explicit_usage() {
    let fake = FakeOpenAi::start_blocking(|_| Reply::TextWithUsage {
        text: "ok".into(),
        prompt_tokens: 100,
        completion_tokens: 5,
    });
    let res = raw_post(
        fake.port(),
        "/chat/completions",
        &chat_body("m", "x"),
        &[],
        Duration::from_secs(10),
    )
    .expect("POST");
    assert_eq!(res.status, 200, "{res:?}");
    assert_eq!(res.json()["usage"]["total_tokens"], 105);
}

/// `Status` 429 carries its body and the `Retry-After` header.
#[test]
fn status_429_with_retry_after() {
    let fake = FakeOpenAi::start_blocking(|_| Reply::rate_limited(3));
    let res = post_chat(&fake, "hi");
    assert_eq!(res.status, 429);
    assert_eq!(res.header("retry-after"), Some("3"));
    assert_eq!(res.json()["error"]["code"], "rate_limit_exceeded");

    let plain = FakeOpenAi::start_blocking(|_| Reply::Status {
        code: 503,
        body: "overloaded".into(),
        retry_after: None,
    });
    let res = post_chat(&plain, "hi");
    assert_eq!((res.status, res.body.as_str()), (503, "overloaded"));
    assert_eq!(res.header("retry-after"), None);
    assert_eq!(plain.call_count(), 1);
}

/// `Garbage` is a 200 whose body is served verbatim, even when it is not JSON.
#[test]
fn garbage_is_served_verbatim() {
    let fake = FakeOpenAi::start_blocking(|call| {
        if call.messages.last().is_some_and(|(_, c)| c == "shape") {
            Reply::Garbage(r#"{"choices": "nope"}"#.into())
        } else {
            Reply::Garbage("<html>not json".into())
        }
    });
    let res = post_chat(&fake, "text");
    assert_eq!((res.status, res.body.as_str()), (200, "<html>not json"));
    let res = post_chat(&fake, "shape");
    assert_eq!((res.status, res.body.as_str()), (200, r#"{"choices": "nope"}"#));
}

/// A `Delayed` call is logged and in flight before it is answered, and answered after the delay.
#[test]
fn delayed_reply_is_logged_before_answering() {
    let delay = Duration::from_millis(300);
    let fake =
        Arc::new(FakeOpenAi::start_blocking(move |_| Reply::Text("late".into()).after(delay)));
    let client = {
        let fake = Arc::clone(&fake);
        std::thread::spawn(move || {
            let started = Instant::now();
            (post_chat(&fake, "hi"), started.elapsed())
        })
    };
    eventually("the delayed call to be in flight", || fake.in_flight() == 1);
    assert_eq!(fake.call_count(), 1, "call not logged before its reply");
    let (res, elapsed) = client.join().expect("client thread");
    assert_eq!(res.status, 200);
    assert!(elapsed >= delay, "answered after {elapsed:?}, before the {delay:?} delay");
    eventually("in_flight back to 0", || fake.in_flight() == 0);
}

/// A `Hang` call is logged and stays in flight while the client times out.
#[test]
fn hang_never_answers_but_is_logged() {
    let fake = FakeOpenAi::start_blocking(|_| Reply::Hang);
    let res = raw_post(
        fake.port(),
        "/v1/chat/completions",
        &chat_body("m", "hi"),
        &[],
        Duration::from_millis(200),
    );
    assert!(res.is_err(), "Hang was answered: {res:?}");
    assert_eq!(fake.call_count(), 1);
    drop(fake); // must not wait for the hanging request
}

/// `max_in_flight` is the number of calls held at once; `reset_counters` clears the log.
#[test]
fn concurrency_high_water_mark() {
    let gate = Gate::new();
    let fake = Arc::new(FakeOpenAi::start_blocking({
        let gate = gate.clone();
        move |_| Reply::Text("ok".into()).behind(&gate)
    }));
    let clients: Vec<_> = (0..4)
        .map(|i| {
            let fake = Arc::clone(&fake);
            std::thread::spawn(move || post_chat(&fake, &format!("q{i}")))
        })
        .collect();
    eventually("4 calls in flight", || fake.in_flight() == 4);
    assert_eq!(fake.call_count(), 4);
    assert_eq!(fake.max_in_flight(), 4);
    gate.open();
    for client in clients {
        assert_eq!(client.join().expect("client thread").status, 200);
    }
    eventually("in_flight back to 0", || fake.in_flight() == 0);
    assert_eq!(fake.max_in_flight(), 4, "high-water mark must stay");
    post_chat(&fake, "one more");
    assert_eq!(fake.max_in_flight(), 4);

    fake.reset_counters();
    assert_eq!((fake.call_count(), fake.max_in_flight()), (0, 0));
    post_chat(&fake, "after reset");
    assert_eq!(fake.max_in_flight(), 1);
    assert_eq!(fake.calls()[0].seq, 5, "seq keeps counting across resets");
}

/// Calls are logged in arrival order and `repeats` counts identical model+messages.
#[test]
fn call_log_order_and_repeats() {
    let fake = FakeOpenAi::start_blocking(|_| Reply::Text("ok".into()));
    for user in ["a", "b", "a", "a"] {
        assert_eq!(post_chat(&fake, user).status, 200);
    }
    let calls = fake.calls();
    let seqs: Vec<u64> = calls.iter().map(|c| c.seq).collect();
    assert_eq!(seqs, [0, 1, 2, 3]);
    let users: Vec<&str> = calls.iter().map(|c| c.messages[1].1.as_str()).collect();
    assert_eq!(users, ["a", "b", "a", "a"]);
    assert_eq!(repeats(&calls), 2);

    let mut other_model = calls[0].clone();
    other_model.model = "m2".into();
    assert_ne!(request_key(&other_model), request_key(&calls[0]));
    let mut other_role = calls[0].clone();
    other_role.messages[1].0 = "assistant".into();
    assert_ne!(request_key(&other_role), request_key(&calls[0]));
    assert_eq!(repeats(&[calls[0].clone(), other_model, other_role]), 0);
}

/// A body that is not JSON gets 400 and is not logged; a panicking responder gives 500.
#[test]
fn bad_json_and_responder_panic() {
    let fake = FakeOpenAi::start_blocking(|_| panic!("scripted failure"));
    let res =
        raw_post(fake.port(), "/v1/chat/completions", "{not json", &[], Duration::from_secs(10))
            .expect("POST");
    assert_eq!(res.status, 400, "{res:?}");
    assert_eq!(fake.call_count(), 0);
    let res = post_chat(&fake, "hi");
    assert_eq!(res.status, 500);
    assert!(res.body.contains("scripted failure"), "{}", res.body);
    assert_eq!(fake.call_count(), 1);
    assert_eq!(fake.in_flight(), 0);
}

/// `start` works in an async test, and the fake answers while that runtime's only thread blocks.
#[tokio::test(flavor = "current_thread")]
async fn serves_while_the_async_test_thread_blocks() {
    let fake =
        FakeOpenAi::start(|_| Reply::Text("ok".into()).after(Duration::from_millis(20))).await;
    // Blocking I/O on the test runtime's only thread: the fake must not depend on it.
    let res = post_chat(&fake, "hi");
    assert_eq!(res.status, 200);
    drop(fake); // dropping inside an async context must not panic
}

/// After drop the port refuses connections.
#[test]
fn drop_closes_the_port() {
    let fake = FakeOpenAi::start_blocking(|_| Reply::Text("ok".into()));
    let port = fake.port();
    assert_eq!(post_chat(&fake, "hi").status, 200);
    drop(fake);
    assert!(TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err(), "port {port} still open");
}

/// A `Refuse` outage closes the listener and cuts the request in flight; the fake
/// listens again on the same port when it comes back; only answered calls are paid.
#[test]
fn refused_connections_then_back_on_the_same_port() {
    let gate = Gate::new();
    let fake = FakeOpenAi::start_blocking({
        let gate = gate.clone();
        move |_| Reply::Text("ok".into()).behind(&gate)
    });
    let port = fake.port();
    let held = std::thread::spawn(move || {
        raw_post(
            port,
            "/v1/chat/completions",
            &chat_body("m", "held"),
            &[],
            Duration::from_secs(10),
        )
    });
    eventually("the held call in flight", || fake.in_flight() == 1);
    fake.go_down(Outage::Refuse);
    // The client sees the connection closed without an answer (raw_post panics on an
    // empty response, or reports the IO error).
    let cut = held.join();
    assert!(!matches!(&cut, Ok(Ok(r)) if r.status == 200), "the held call was answered");
    assert_eq!(fake.in_flight(), 0);
    let refused = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    gate.open();
    fake.come_back();
    assert_eq!(post_chat(&fake, "after").status, 200);
    assert_eq!(fake.port(), port);
    let paid: Vec<String> = fake.paid_calls().iter().map(|c| c.messages[1].1.clone()).collect();
    assert_eq!(paid, ["after"], "the cut call was not answered");
    assert_eq!(fake.call_count(), 2);
}

/// An `Unavailable` outage answers 503 to every call for its window, then the responder
/// answers again; a `Hang` outage answers nothing; neither is paid.
#[test]
fn unavailable_and_hang_windows() {
    let fake = FakeOpenAi::start_blocking(|_| Reply::Text("ok".into()));
    let end = fake.outage_for(Outage::Unavailable, Duration::from_millis(300));
    let r = post_chat(&fake, "during");
    assert_eq!(r.status, 503);
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("unavailable"));
    end.join().unwrap();
    assert_eq!(post_chat(&fake, "after").status, 200);
    fake.go_down(Outage::Hang);
    let hung = raw_post(
        fake.port(),
        "/v1/chat/completions",
        &chat_body("m", "hung"),
        &[],
        Duration::from_millis(200),
    );
    assert!(hung.is_err(), "a hung call was answered: {hung:?}");
    fake.come_back();
    assert_eq!(post_chat(&fake, "back").status, 200);
    assert_eq!(fake.paid_calls().len(), 2);
    assert_eq!(fake.call_count(), 4);
}

/// Issue 45: the fake checks `response_format` as OpenAI does (a name of 1 to 64 of
/// a-z, A-Z, 0-9, `_`, `-`; a schema object; a known type), answering 400 otherwise and
/// logging no call, and records a well-formed `json_schema`'s name and schema text as
/// sent (keys in the sender's order).
#[test]
fn response_format_is_checked_and_recorded() {
    let fake = FakeOpenAi::start_blocking(|_| Reply::Text("{}".into()));
    let post = |format: &str| {
        let body = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"q"}}],"response_format":{format}}}"#
        );
        raw_post(fake.port(), "/v1/chat/completions", &body, &[], Duration::from_secs(10))
            .expect("POST to the fake")
    };
    let schema = r#"{"type":"object","properties":{"z":{"type":"string"},"a":{"type":"string"}}}"#;
    let ok = post(&format!(
        r#"{{"type":"json_schema","json_schema":{{"name":"j_1-x","strict":true,"schema":{schema}}}}}"#
    ));
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(post(r#"{"type":"text"}"#).status, 200);
    for bad in [
        format!(
            r#"{{"type":"json_schema","json_schema":{{"name":"has space","schema":{schema}}}}}"#
        ),
        format!(
            r#"{{"type":"json_schema","json_schema":{{"name":"{}","schema":{schema}}}}}"#,
            "n".repeat(65)
        ),
        r#"{"type":"json_schema","json_schema":{"name":"j","schema":"not an object"}}"#.to_string(),
        r#"{"type":"json_schema"}"#.to_string(),
        r#"{"type":"yaml"}"#.to_string(),
    ] {
        let r = post(&bad);
        assert_eq!(r.status, 400, "{bad}: {}", r.body);
        assert!(r.body.contains("response_format"), "{}", r.body);
    }
    let calls = fake.calls();
    assert_eq!(calls.len(), 2, "refused requests are not logged");
    assert_eq!(calls[0].json_schema, Some(("j_1-x".to_string(), schema.to_string())));
    assert_eq!(calls[1].json_schema, None);
}

//! Issue 13: the HTTP backend against real local servers: bodies past the limit are a
//! permanent error (with and without a Content-Length), the API key comes from the
//! worker's model spec, and errors carry neither URL credentials nor key-like text from
//! the server's body.

use std::time::Duration;

use halyard_proto::pool::HttpModelSpec;
use halyard_proto::{ChatMessage, Job, JobKey, ModelRef, Sampling};
use halyard_tests::{FakeOpenAi, Reply};
use halyard_worker::backend::openai::OpenAi;
use halyard_worker::backend::ErrorClass;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn spec(base_url: &str, key_env: Option<&str>) -> HttpModelSpec {
    HttpModelSpec {
        backend: "openai".into(),
        base_url: base_url.into(),
        model: "m".into(),
        api_key_env: key_env.map(String::from),
        prompt_cache: None,
    }
}

fn job(base_url: &str) -> Job {
    let key = JobKey {
        pipeline: "t".into(),
        stage: "s".into(),
        stage_version: 1,
        model: ModelRef { backend: "openai".into(), endpoint: base_url.into(), model: "m".into() },
        messages: vec![ChatMessage::user("q")],
        sampling: Sampling::default(),
        sample_index: 0,
    };
    Job::new(uuid::Uuid::nil(), "p", key, 10_000)
}

/// A server that answers every connection with a chunked 200 of `total` bytes.
async fn chunked_server(total: usize) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
                if s.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![b' '; 1024];
                for _ in 0..total.div_ceil(1024) {
                    let mut c = format!("{:x}\r\n", chunk.len()).into_bytes();
                    c.extend_from_slice(&chunk);
                    c.extend_from_slice(b"\r\n");
                    if s.write_all(&c).await.is_err() {
                        return;
                    }
                }
                let _ = s.write_all(b"0\r\n\r\n").await;
            });
        }
    });
    format!("http://{addr}/v1")
}

/// A body over the limit is a permanent error naming the limit, whether the server says
/// its length up front or streams it; one under the limit is read.
#[tokio::test]
async fn bodies_past_the_limit_are_permanent_errors() {
    let fake = FakeOpenAi::start(|_| Reply::Text("x".repeat(8 << 10))).await;
    let url = fake.base_url();
    let small = OpenAi::new(4096).unwrap();
    let e = small.call(&job(&url), &spec(&url, None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent);
    assert!(e.message.contains("larger than the limit of 4096 bytes"), "{}", e.message);
    let large = OpenAi::new(1 << 20).unwrap();
    let c = large.call(&job(&url), &spec(&url, None)).await.unwrap();
    assert_eq!(c.text.len(), 8 << 10);

    let streamed = chunked_server(64 << 10).await;
    let e = small.call(&job(&streamed), &spec(&streamed, None)).await.unwrap_err();
    assert_eq!(e.class, ErrorClass::Permanent);
    assert!(e.message.contains("larger than the limit"), "{}", e.message);
}

/// The key sent is the one the worker's model spec names; a job cannot choose another.
#[tokio::test]
async fn the_key_comes_from_the_model_spec() {
    std::env::set_var("HALYARD_TEST_HTTP_KEY", "key-from-worker-config");
    let fake = FakeOpenAi::start(|_| Reply::Text("ok".into())).await;
    let url = fake.base_url();
    let http = OpenAi::new(1 << 20).unwrap();
    http.call(&job(&url), &spec(&url, Some("HALYARD_TEST_HTTP_KEY"))).await.unwrap();
    http.call(&job(&url), &spec(&url, None)).await.unwrap();
    let auth: Vec<Option<String>> = fake.calls().into_iter().map(|c| c.authorization).collect();
    assert_eq!(auth, [Some("Bearer key-from-worker-config".to_string()), None]);
    let e = http.call(&job(&url), &spec(&url, Some("HALYARD_TEST_UNSET_KEY"))).await.unwrap_err();
    assert!(e.is_permanent() && e.message.contains("HALYARD_TEST_UNSET_KEY"), "{}", e.message);
}

/// Errors show neither the credentials of the URL nor keys echoed in the server's body.
#[tokio::test]
async fn errors_are_redacted() {
    let fake = FakeOpenAi::start(|_| Reply::Status {
        code: 401,
        body: r#"{"error":{"message":"Incorrect API key provided: sk-live-0123456789abcdefXYZ. Authorization: Bearer abc.def"}}"#.into(),
        retry_after: None,
    })
    .await;
    let url = fake.base_url().replace("http://", "http://user:hunter2@");
    let http = OpenAi::new(1 << 20).unwrap();
    let e = http.call(&job(&url), &spec(&url, None)).await.unwrap_err();
    for secret in ["hunter2", "sk-live-0123456789abcdefXYZ", "abc.def"] {
        assert!(!e.message.contains(secret), "{secret} in {}", e.message);
    }
    assert!(
        e.message.contains("HTTP 401") && e.message.contains("[redacted]@127.0.0.1"),
        "{}",
        e.message
    );

    // A connection failure names the URL without its credentials too.
    let port = halyard_tests::free_port();
    let closed = format!("http://user:hunter2@127.0.0.1:{port}/v1");
    let mut j = job(&closed);
    j.timeout_ms = Duration::from_secs(2).as_millis() as u64;
    let e = http.call(&j, &spec(&closed, None)).await.unwrap_err();
    assert!(!e.message.contains("hunter2"), "{}", e.message);
    assert!(e.message.contains(&format!("[redacted]@127.0.0.1:{port}")), "{}", e.message);
}

/// Issue 45: a structured-output job's `response_format` reaches the server (the fake
/// checks its form as OpenAI does: a malformed one would be a 400) with the job's schema
/// byte for byte, keys in the job's order, less `maxLength` (OpenAI's strict mode takes
/// no length keyword); a job without a schema sends none.
#[tokio::test]
async fn response_format_reaches_the_server() {
    let fake = FakeOpenAi::start(|_| Reply::Text("{}".into())).await;
    let client = OpenAi::new(1 << 20).unwrap();
    let schema = r#"{"type":"object","properties":{"term":{"type":"string","enum":["T"]},"reasoning":{"type":"string","maxLength":300},"certainty":{"type":"string","enum":["UNREAL","MENTIONED","UNKNOWN"]}},"required":["term","reasoning","certainty"],"additionalProperties":false}"#;
    let mut structured = job(&fake.base_url());
    structured.key.sampling.json_schema = Some(Box::new(halyard_proto::OutputSchema {
        name: "hypotermqa_acceptance".into(),
        schema: schema.into(),
    }));
    let m = spec(&fake.base_url(), None);
    client.call(&job(&fake.base_url()), &m).await.expect("plain call");
    client.call(&structured, &m).await.expect("structured call");
    let calls = fake.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].json_schema, None);
    assert!(calls[0].body.get("response_format").is_none());
    let sent = schema.replace(r#","maxLength":300"#, "");
    assert_eq!(calls[1].json_schema, Some(("hypotermqa_acceptance".into(), sent)));
    assert_eq!(calls[1].body["response_format"]["type"], "json_schema");
    assert_eq!(calls[1].body["response_format"]["json_schema"]["strict"], true);
}

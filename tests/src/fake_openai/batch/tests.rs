//! Tests of the fake's Batch API over real HTTP, with reqwest as the worker uses it
//! (multipart upload included).

use super::*;
use crate::fake_openai::{ChatCall, FakeOpenAi, Gate, Outage, Reply};
use std::time::Duration;

/// The fake plus an HTTP client for it.
struct Api {
    fake: FakeOpenAi,
    http: reqwest::Client,
}

fn http_client() -> reqwest::Client {
    // The workspace's reqwest brings rustls without a crypto provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_proxy()
        // Fresh connections: outages close them.
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .expect("reqwest client")
}

fn start(responder: impl Fn(&ChatCall) -> Reply + Send + Sync + 'static) -> Api {
    Api { fake: FakeOpenAi::start_blocking(responder), http: http_client() }
}

fn request_line(custom_id: &str, model: &str, prompt: &str) -> String {
    json!({
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 8,
        },
    })
    .to_string()
}

/// A JSONL input file of `(custom_id, prompt)` requests to model `m1`.
fn input(requests: &[(&str, &str)]) -> String {
    requests.iter().map(|(id, prompt)| request_line(id, "m1", prompt) + "\n").collect()
}

/// The prompt of a one-message call.
fn prompt(call: &ChatCall) -> &str {
    call.messages.last().map(|(_, c)| c.as_str()).unwrap_or_default()
}

fn status_of(batch: &Value) -> &str {
    batch["status"].as_str().unwrap_or_else(|| panic!("batch without status: {batch}"))
}

fn jsonl_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSONL line {l:?}: {e}")))
        .collect()
}

fn assert_error_body(status: u16, body: &Value, expected: u16) {
    assert_eq!(status, expected, "{body}");
    let error = &body["error"];
    assert!(error["message"].is_string(), "no error message: {body}");
    assert!(error["type"].is_string(), "no error type: {body}");
    assert!(error.get("param").is_some() && error.get("code").is_some(), "{body}");
}

impl Api {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.fake.base_url())
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> (u16, Value) {
        let response = request.send().await.expect("request to the fake");
        let status = response.status().as_u16();
        let text = response.text().await.expect("response body");
        let body = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{status} body is not JSON ({e}): {text:?}"));
        (status, body)
    }

    async fn upload_form(&self, form: reqwest::multipart::Form) -> (u16, Value) {
        self.send(self.http.post(self.url("/files")).multipart(form)).await
    }

    /// Uploads `jsonl` as a batch input file.
    async fn upload(&self, jsonl: &str) -> (u16, Value) {
        let part = reqwest::multipart::Part::bytes(jsonl.as_bytes().to_vec())
            .file_name("in.jsonl")
            .mime_str("application/jsonl")
            .expect("mime");
        let form = reqwest::multipart::Form::new().text("purpose", "batch").part("file", part);
        self.upload_form(form).await
    }

    async fn upload_ok(&self, jsonl: &str) -> String {
        let (status, file) = self.upload(jsonl).await;
        assert_eq!(status, 200, "{file}");
        file["id"].as_str().expect("file id").to_string()
    }

    async fn post_json(&self, path: &str, body: Value) -> (u16, Value) {
        self.send(self.http.post(self.url(path)).json(&body)).await
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        self.send(self.http.get(self.url(path))).await
    }

    async fn create(&self, file_id: &str) -> Value {
        let (status, batch) = self
            .post_json(
                "/batches",
                json!({
                    "input_file_id": file_id,
                    "endpoint": "/v1/chat/completions",
                    "completion_window": "24h",
                }),
            )
            .await;
        assert_eq!(status, 200, "{batch}");
        batch
    }

    async fn retrieve(&self, id: &str) -> Value {
        let (status, batch) = self.get(&format!("/batches/{id}")).await;
        assert_eq!(status, 200, "{batch}");
        batch
    }

    async fn cancel(&self, id: &str) -> (u16, Value) {
        self.send(self.http.post(self.url(&format!("/batches/{id}/cancel")))).await
    }

    /// The statuses of `n` successive retrieves.
    async fn statuses(&self, id: &str, n: usize) -> Vec<String> {
        let mut statuses = Vec::new();
        for _ in 0..n {
            statuses.push(status_of(&self.retrieve(id).await).to_string());
        }
        statuses
    }

    async fn content(&self, file_id: &Value) -> String {
        let id = file_id.as_str().unwrap_or_else(|| panic!("no file id: {file_id}"));
        let response = self
            .http
            .get(self.url(&format!("/files/{id}/content")))
            .send()
            .await
            .expect("download");
        assert_eq!(response.status().as_u16(), 200);
        let text = response.text().await.expect("file content");
        assert_eq!(self.fake.file_content(id).as_deref(), Some(text.as_bytes()));
        text
    }
}

/// Text for most prompts, a 400 for "bad", a 500 for "boom".
fn mixed_responder(call: &ChatCall) -> Reply {
    match prompt(call) {
        "bad" => Reply::Status {
            code: 400,
            body: r#"{"error":{"message":"bad prompt","type":"invalid_request_error","param":null,"code":"invalid_prompt"}}"#.into(),
            retry_after: None,
        },
        "boom" => Reply::Status {
            code: 500,
            body: r#"{"error":{"message":"boom","type":"server_error","param":null,"code":null}}"#
                .into(),
            retry_after: Some("3".into()),
        },
        other => Reply::Text(format!("answer to {other}")),
    }
}

/// Upload, create, retrieve to completion, download both files; the requests ran once,
/// through the responder, and none of them is an online call.
#[tokio::test]
async fn batch_round_trip() {
    let api = start(mixed_responder);
    let jsonl = input(&[("a", "hello world"), ("b", "bad"), ("c", "boom"), ("d", "why")]);
    let (status, file) = api.upload(&jsonl).await;
    assert_eq!(status, 200, "{file}");
    assert!(file["id"].as_str().unwrap().starts_with("file-"), "{file}");
    assert_eq!(file["object"], "file");
    assert_eq!(file["bytes"], jsonl.len());
    assert_eq!(file["filename"], "in.jsonl");
    assert_eq!(file["purpose"], "batch");
    assert!(file["created_at"].is_u64());
    let file_id = file["id"].as_str().unwrap();
    let (status, same) = api.get(&format!("/files/{file_id}")).await;
    assert_eq!((status, &same), (200, &file));

    let (status, batch) = api
        .send(api.http.post(api.url("/batches")).header("Authorization", "Bearer sk-batch").json(
            &json!({
                "input_file_id": file_id,
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
                "metadata": {"sweep": "s1"},
            }),
        ))
        .await;
    assert_eq!(status, 200, "{batch}");
    let id = batch["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("batch_"), "{batch}");
    let mut keys: Vec<&str> = batch.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "cancelled_at",
            "cancelling_at",
            "completed_at",
            "completion_window",
            "created_at",
            "endpoint",
            "error_file_id",
            "errors",
            "expired_at",
            "expires_at",
            "failed_at",
            "finalizing_at",
            "id",
            "in_progress_at",
            "input_file_id",
            "metadata",
            "object",
            "output_file_id",
            "request_counts",
            "status",
        ]
    );
    assert_eq!(batch["object"], "batch");
    assert_eq!(batch["endpoint"], "/v1/chat/completions");
    assert_eq!(batch["input_file_id"], file_id);
    assert_eq!(batch["completion_window"], "24h");
    assert_eq!(batch["status"], "validating");
    assert_eq!(batch["metadata"], json!({"sweep": "s1"}));
    assert_eq!(batch["request_counts"], json!({"total": 4, "completed": 0, "failed": 0}));
    let created_at = batch["created_at"].as_u64().unwrap();
    assert_eq!(batch["expires_at"], created_at + 24 * 3600);
    for null in ["errors", "output_file_id", "error_file_id", "in_progress_at", "completed_at"] {
        assert!(batch[null].is_null(), "{null} in {batch}");
    }

    let b = api.retrieve(&id).await;
    assert_eq!(status_of(&b), "in_progress");
    assert!(b["in_progress_at"].is_u64(), "{b}");
    assert!(api.fake.batch_requests().is_empty(), "ran before leaving in_progress");

    let b = api.retrieve(&id).await;
    assert_eq!(status_of(&b), "finalizing");
    assert!(b["finalizing_at"].is_u64(), "{b}");
    assert_eq!(b["request_counts"], json!({"total": 4, "completed": 2, "failed": 2}));
    assert!(b["output_file_id"].is_null(), "files are written on completion: {b}");

    let b = api.retrieve(&id).await;
    assert_eq!(status_of(&b), "completed", "{b}");
    assert!(b["completed_at"].is_u64(), "{b}");
    assert_eq!(b["request_counts"], json!({"total": 4, "completed": 2, "failed": 2}));

    let output = jsonl_lines(&api.content(&b["output_file_id"]).await);
    let ids: Vec<&str> = output.iter().map(|l| l["custom_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["a", "d"]);
    let line = &output[0];
    assert!(line["id"].as_str().unwrap().starts_with("batch_req_"), "{line}");
    assert!(line["error"].is_null(), "{line}");
    assert_eq!(line["response"]["status_code"], 200);
    assert!(line["response"]["request_id"].as_str().unwrap().starts_with("req_"), "{line}");
    let body = &line["response"]["body"];
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "m1");
    assert_eq!(body["choices"][0]["message"]["content"], "answer to hello world");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6})
    );

    let errors = jsonl_lines(&api.content(&b["error_file_id"]).await);
    let ids: Vec<&str> = errors.iter().map(|l| l["custom_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["b", "c"]);
    assert_eq!(errors[0]["response"]["status_code"], 400);
    assert_eq!(errors[0]["response"]["body"]["error"]["code"], "invalid_prompt");
    assert!(errors[0]["error"].is_null());
    assert_eq!(errors[1]["response"]["status_code"], 500);
    assert_eq!(errors[1]["response"]["body"]["error"]["message"], "boom");

    let (status, out_file) =
        api.get(&format!("/files/{}", b["output_file_id"].as_str().unwrap())).await;
    assert_eq!(status, 200);
    assert_eq!(out_file["purpose"], "batch_output");

    // More retrieves change nothing and run nothing again.
    assert_eq!(api.statuses(&id, 2).await, ["completed", "completed"]);
    let requests = api.fake.batch_requests();
    let ran: Vec<(&str, Option<u16>)> =
        requests.iter().map(|r| (r.custom_id.as_str(), r.status_code)).collect();
    assert_eq!(ran, [("a", Some(200)), ("b", Some(400)), ("c", Some(500)), ("d", Some(200))]);
    for r in &requests {
        assert_eq!(r.batch_id, id);
        assert_eq!(r.call.model, "m1");
        assert_eq!(r.call.max_tokens, Some(8));
        assert_eq!(r.call.authorization.as_deref(), Some("Bearer sk-batch"));
    }
    assert_eq!(prompt(&requests[0].call), "hello world");
    assert!(api.fake.paid_calls().is_empty(), "batch requests are not online calls");
    assert_eq!(api.fake.call_count(), 0);
    assert_eq!(api.fake.files_uploaded(), 1);
    assert_eq!(api.fake.batches_created(), 1);
    assert_eq!(api.fake.batch_retrieves(), 5);
    let batches = api.fake.batches();
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0]["status"], "completed");

    // An output file is no batch input; a deleted file is gone.
    let (status, body) = api
        .post_json(
            "/batches",
            json!({"input_file_id": b["output_file_id"], "endpoint": "/v1/chat/completions",
                   "completion_window": "24h"}),
        )
        .await;
    assert_error_body(status, &body, 400);
    let (status, deleted) = api.send(api.http.delete(api.url(&format!("/files/{file_id}")))).await;
    assert_eq!(status, 200);
    assert_eq!(deleted, json!({"id": file_id, "object": "file", "deleted": true}));
    let (status, body) = api.get(&format!("/files/{file_id}/content")).await;
    assert_error_body(status, &body, 404);

    // Online calls still go to the online log only.
    let response = api
        .http
        .post(api.url("/chat/completions"))
        .json(&json!({"model": "m1", "messages": [{"role": "user", "content": "online"}]}))
        .send()
        .await
        .expect("online call");
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(api.fake.paid_calls().len(), 1);
    assert_eq!(api.fake.batch_requests().len(), 4);
}

/// `GET /v1/batches` lists newest first with `limit`/`after` cursors; listing moves nothing.
#[tokio::test]
async fn list_pagination() {
    let api = start(|_| Reply::Text("ok".into()));
    let file = api.upload_ok(&input(&[("a", "x")])).await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(api.create(&file).await["id"].as_str().unwrap().to_string());
    }
    let newest: Vec<&str> = ids.iter().rev().map(String::as_str).collect();
    let page_ids = |page: &Value| -> Vec<String> {
        page["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["id"].as_str().unwrap().to_string())
            .collect()
    };

    let (status, all) = api.get("/batches").await;
    assert_eq!(status, 200);
    assert_eq!(all["object"], "list");
    assert_eq!(page_ids(&all), newest);
    assert_eq!((&all["first_id"], &all["last_id"]), (&json!(newest[0]), &json!(newest[4])));
    assert_eq!(all["has_more"], false);

    let mut seen = Vec::new();
    let mut path = "/batches?limit=2".to_string();
    let mut pages = 0;
    loop {
        let (status, page) = api.get(&path).await;
        assert_eq!(status, 200, "{page}");
        pages += 1;
        seen.extend(page_ids(&page));
        if page["has_more"] == false {
            break;
        }
        path = format!("/batches?limit=2&after={}", page["last_id"].as_str().unwrap());
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, newest);

    // Without /v1 too.
    let response = api
        .http
        .get(format!("http://{}/batches?limit=1", api.fake.addr()))
        .send()
        .await
        .expect("list");
    let page: Value = response.json().await.expect("json");
    assert_eq!(page_ids(&page), [newest[0]]);
    assert_eq!(page["has_more"], true);

    for bad in ["/batches?limit=0", "/batches?limit=101", "/batches?limit=two"] {
        let (status, body) = api.get(bad).await;
        assert_error_body(status, &body, 400);
    }
    let (status, body) = api.get("/batches?after=batch_nope").await;
    assert_error_body(status, &body, 404);
    assert!(api.fake.batches().iter().all(|b| b["status"] == "validating"));
    assert_eq!(api.fake.batch_retrieves(), 0);
    assert_eq!(api.fake.batches_created(), 5);
}

/// `retrieves_per_step` stretches each status; a closed `hold` gate keeps batches in
/// progress, running nothing, until it opens.
#[tokio::test]
async fn steps_and_hold() {
    let api = start(|_| Reply::Text("ok".into()));
    let file = api.upload_ok(&input(&[("a", "x"), ("b", "y")])).await;
    api.fake.set_batch_script(BatchScript { retrieves_per_step: 2, ..BatchScript::default() });
    let id = api.create(&file).await["id"].as_str().unwrap().to_string();
    assert_eq!(
        api.statuses(&id, 6).await,
        ["validating", "in_progress", "in_progress", "finalizing", "finalizing", "completed"]
    );

    let gate = Gate::new();
    api.fake.set_batch_script(BatchScript { hold: Some(gate.clone()), ..BatchScript::default() });
    let id = api.create(&file).await["id"].as_str().unwrap().to_string();
    let statuses = api.statuses(&id, 10).await;
    assert!(statuses.iter().all(|s| s == "in_progress"), "{statuses:?}");
    assert_eq!(api.fake.batch_requests().len(), 2, "only the first batch ran");
    gate.open();
    assert_eq!(api.statuses(&id, 2).await, ["finalizing", "completed"]);
    assert_eq!(api.fake.batch_requests().len(), 4);
    assert_eq!(api.fake.batch_script().retrieves_per_step, 1);
}

/// With `expire_after = 2` only the first two requests run; the rest are `batch_expired`.
#[tokio::test]
async fn expiry_writes_partial_output() {
    let api = start(|call| Reply::Text(format!("re {}", prompt(call))));
    let file = api.upload_ok(&input(&[("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")])).await;
    api.fake.set_batch_script(BatchScript { expire_after: Some(2), ..BatchScript::default() });
    let id = api.create(&file).await["id"].as_str().unwrap().to_string();
    assert_eq!(api.statuses(&id, 2).await, ["in_progress", "expired"]);
    let b = api.retrieve(&id).await;
    assert_eq!(status_of(&b), "expired");
    assert!(b["expired_at"].is_u64(), "{b}");
    assert!(b["completed_at"].is_null(), "{b}");
    assert_eq!(b["request_counts"], json!({"total": 4, "completed": 2, "failed": 2}));

    let output = jsonl_lines(&api.content(&b["output_file_id"]).await);
    let ids: Vec<&str> = output.iter().map(|l| l["custom_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["a", "b"]);
    assert_eq!(output[1]["response"]["body"]["choices"][0]["message"]["content"], "re 2");
    let errors = jsonl_lines(&api.content(&b["error_file_id"]).await);
    let ids: Vec<&str> = errors.iter().map(|l| l["custom_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["c", "d"]);
    for line in &errors {
        assert!(line["response"].is_null(), "{line}");
        assert_eq!(line["error"]["code"], "batch_expired");
        assert_eq!(line["error"]["message"], EXPIRED_MESSAGE);
    }
    let ran: Vec<String> = api.fake.batch_requests().into_iter().map(|r| r.custom_id).collect();
    assert_eq!(ran, ["a", "b"]);
    assert_eq!(api.fake.batch_script().expire_after, Some(2), "not consumed");

    api.fake.set_batch_script(BatchScript::default());
    let id = api.create(&file).await["id"].as_str().unwrap().to_string();
    assert_eq!(api.statuses(&id, 3).await, ["in_progress", "finalizing", "completed"]);
}

/// `fail_next` fails the next batch's validation (only that one); mixed models fail too.
#[tokio::test]
async fn failed_validation() {
    let api = start(|_| Reply::Text("ok".into()));
    let file = api.upload_ok(&input(&[("a", "x"), ("b", "y")])).await;
    api.fake.set_batch_script(BatchScript {
        fail_next: Some("token_limit_exceeded".into()),
        ..BatchScript::default()
    });
    let id = api.create(&file).await["id"].as_str().unwrap().to_string();
    assert!(api.fake.batch_script().fail_next.is_none(), "taken by the create");
    assert_eq!(api.statuses(&id, 3).await, ["failed", "failed", "failed"]);
    let b = api.retrieve(&id).await;
    assert!(b["failed_at"].is_u64(), "{b}");
    assert_eq!(b["errors"]["object"], "list");
    let error = &b["errors"]["data"][0];
    assert_eq!(error["code"], "token_limit_exceeded");
    assert!(error["message"].is_string(), "{b}");
    assert!(error["param"].is_null() && error["line"].is_null(), "{b}");
    assert!(b["output_file_id"].is_null() && b["error_file_id"].is_null(), "{b}");
    assert!(api.fake.batch_requests().is_empty());
    let (status, body) = api.cancel(&id).await;
    assert_error_body(status, &body, 409);

    let id = api.create(&file).await["id"].as_str().unwrap().to_string();
    assert_eq!(api.statuses(&id, 3).await, ["in_progress", "finalizing", "completed"]);

    let mixed = request_line("a", "m1", "x") + "\n" + &request_line("b", "m2", "y") + "\n";
    let mixed = api.upload_ok(&mixed).await;
    let id = api.create(&mixed).await["id"].as_str().unwrap().to_string();
    let b = api.retrieve(&id).await;
    assert_eq!(status_of(&b), "failed");
    assert_eq!(b["errors"]["data"][0]["code"], "mismatched_model");
    assert_eq!(api.fake.batch_requests().len(), 2);
}

/// Bad uploads and bad batch requests get 4xx with OpenAI error bodies; nothing is stored.
#[tokio::test]
async fn bad_requests_are_rejected() {
    let api = start(|_| Reply::Text("ok".into()));
    let good = request_line("a", "m1", "x");
    let with = |f: &dyn Fn(&mut Value)| {
        let mut v: Value = serde_json::from_str(&good).unwrap();
        f(&mut v);
        v.to_string()
    };
    let bad_files = [
        "not json".to_string(),
        "[1, 2]".to_string(),
        with(&|v| {
            v.as_object_mut().unwrap().remove("custom_id");
        }),
        with(&|v| v["custom_id"] = json!(7)),
        with(&|v| v["method"] = json!("GET")),
        with(&|v| {
            v.as_object_mut().unwrap().remove("method");
        }),
        with(&|v| v["url"] = json!("/v1/embeddings")),
        with(&|v| v["body"] = json!("hi")),
        with(&|v| {
            v.as_object_mut().unwrap().remove("body");
        }),
        format!("{good}\n{}", with(&|v| v["body"]["model"] = json!("m1"))),
        format!("{good}\n\n{}", request_line("b", "m1", "y")),
        String::new(),
    ];
    for jsonl in &bad_files {
        let (status, body) = api.upload(jsonl).await;
        assert_error_body(status, &body, 400);
        assert_eq!(body["error"]["param"], "file", "{jsonl:?}: {body}");
        assert_eq!(body["error"]["code"], "invalid_file_format", "{jsonl:?}: {body}");
    }
    let (_, body) = api.upload(&format!("{good}\n{good}\n")).await;
    assert!(body["error"]["message"].as_str().unwrap().contains("duplicate custom_id"), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("line 2"), "{body}");

    let part = || reqwest::multipart::Part::bytes(good.clone().into_bytes()).file_name("in.jsonl");
    use reqwest::multipart::Form;
    let forms = [
        ("purpose", Form::new().text("purpose", "fine-tune").part("file", part())),
        ("purpose", Form::new().part("file", part())),
        ("file", Form::new().text("purpose", "batch")),
        ("file", Form::new().text("purpose", "batch").text("file", good.clone())),
    ];
    for (param, form) in forms {
        let (status, body) = api.upload_form(form).await;
        assert_error_body(status, &body, 400);
        assert_eq!(body["error"]["param"], param, "{body}");
    }
    let (status, body) = api.post_json("/files", json!({"purpose": "batch"})).await;
    assert_error_body(status, &body, 400);
    assert_eq!(api.fake.files_uploaded(), 0);

    // CRLF line ends and a final newline are fine.
    let crlf = format!("{good}\r\n{}\r\n", request_line("b", "m1", "y"));
    let file = api.upload_ok(&crlf).await;

    let create = |changes: Value| {
        let mut body = json!({
            "input_file_id": file,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        });
        for (k, v) in changes.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let bad_creates = [
        (json!({"input_file_id": "file-nope"}), 404),
        (json!({"input_file_id": null}), 400),
        (json!({"endpoint": "/v1/embeddings"}), 400),
        (json!({"completion_window": "1h"}), 400),
        (json!({"metadata": {"k": 1}}), 400),
        (json!({"metadata": "k"}), 400),
    ];
    for (changes, expected) in bad_creates {
        let (status, body) = api.post_json("/batches", create(changes)).await;
        assert_error_body(status, &body, expected);
    }
    let response = api
        .http
        .post(api.url("/batches"))
        .header("Content-Type", "application/json")
        .body("{not json")
        .send()
        .await
        .expect("post");
    assert_eq!(response.status().as_u16(), 400);
    assert_eq!(api.fake.batches_created(), 0);

    for path in ["/batches/batch_nope", "/files/file-nope", "/files/file-nope/content"] {
        let (status, body) = api.get(path).await;
        assert_error_body(status, &body, 404);
    }
    let (status, body) = api.cancel("batch_nope").await;
    assert_error_body(status, &body, 404);
    assert_eq!(api.fake.batch_retrieves(), 1);
    assert_eq!(api.fake.batches().len(), 0);
}

/// Cancel: `cancelling`, then `cancelled` on the next retrieve; nothing not yet run runs.
#[tokio::test]
async fn cancel_before_running() {
    let api = start(|_| Reply::Text("ok".into()));
    let file = api.upload_ok(&input(&[("a", "x"), ("b", "y"), ("c", "z")])).await;
    let gate = Gate::new();
    api.fake.set_batch_script(BatchScript { hold: Some(gate.clone()), ..BatchScript::default() });
    let id = api.create(&file).await["id"].as_str().unwrap().to_string();
    assert_eq!(api.statuses(&id, 2).await, ["in_progress", "in_progress"]);
    let (status, b) = api.cancel(&id).await;
    assert_eq!((status, status_of(&b)), (200, "cancelling"), "{b}");
    assert!(b["cancelling_at"].is_u64(), "{b}");
    let (status, b) = api.cancel(&id).await;
    assert_eq!((status, status_of(&b)), (200, "cancelling"), "{b}");
    gate.open();
    let b = api.retrieve(&id).await;
    assert_eq!(status_of(&b), "cancelled", "{b}");
    assert!(b["cancelled_at"].is_u64(), "{b}");
    assert!(b["output_file_id"].is_null(), "{b}");
    assert_eq!(b["request_counts"], json!({"total": 3, "completed": 0, "failed": 3}));
    let errors = jsonl_lines(&api.content(&b["error_file_id"]).await);
    assert_eq!(errors.len(), 3);
    assert!(errors
        .iter()
        .all(|l| l["error"]["code"] == "batch_cancelled" && l["response"].is_null()));
    assert!(api.fake.batch_requests().is_empty());
    assert_eq!(api.statuses(&id, 2).await, ["cancelled", "cancelled"]);
    let (status, b) = api.cancel(&id).await;
    assert_eq!((status, status_of(&b)), (200, "cancelled"));

    let id = api.create(&file).await["id"].as_str().unwrap().to_string();
    api.statuses(&id, 3).await;
    let (status, body) = api.cancel(&id).await;
    assert_error_body(status, &body, 409);
}

/// Delayed and gated requests keep a batch in progress without blocking the retrieve;
/// a hanging one keeps it there until cancelled, or is cut when the batch expires.
#[tokio::test]
async fn delayed_gated_and_hanging_requests() {
    let delay = Duration::from_millis(400);
    let gate = Gate::new();
    let api = start({
        let gate = gate.clone();
        move |call| match prompt(call) {
            "slow" => Reply::Text("late".into()).after(delay),
            "gated" => Reply::Text("opened".into()).behind(&gate),
            "hang" => Reply::Hang,
            _ => Reply::Text("quick".into()),
        }
    });
    let file = api
        .upload_ok(&input(&[("q", "quick"), ("s", "slow"), ("g", "gated"), ("h", "hang")]))
        .await;
    let id = api.create(&file).await["id"].as_str().unwrap().to_string();
    assert_eq!(api.statuses(&id, 1).await, ["in_progress"]);
    let started = std::time::Instant::now();
    let b = api.retrieve(&id).await;
    assert!(started.elapsed() < delay, "the retrieve waited for the delayed request");
    assert_eq!(status_of(&b), "in_progress");
    assert_eq!(b["request_counts"], json!({"total": 4, "completed": 1, "failed": 0}));
    let codes: Vec<Option<u16>> = api.fake.batch_requests().iter().map(|r| r.status_code).collect();
    assert_eq!(codes, [Some(200), None, None, None]);

    tokio::time::sleep(delay).await;
    let b = api.retrieve(&id).await;
    assert_eq!(b["request_counts"]["completed"], 2, "{b}");
    gate.open();
    let b = api.retrieve(&id).await;
    assert_eq!(b["request_counts"]["completed"], 3, "{b}");
    assert_eq!(api.statuses(&id, 3).await, ["in_progress"; 3], "the hanging request holds it");

    let (status, _) = api.cancel(&id).await;
    assert_eq!(status, 200);
    let b = api.retrieve(&id).await;
    assert_eq!(status_of(&b), "cancelled");
    let output = jsonl_lines(&api.content(&b["output_file_id"]).await);
    let contents: Vec<&str> = output
        .iter()
        .map(|l| l["response"]["body"]["choices"][0]["message"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(contents, ["quick", "late", "opened"]);
    let errors = jsonl_lines(&api.content(&b["error_file_id"]).await);
    assert_eq!(errors.len(), 1);
    assert_eq!(
        (&errors[0]["custom_id"], &errors[0]["error"]["code"]),
        (&json!("h"), &json!("batch_cancelled"))
    );
    let codes: Vec<Option<u16>> = api.fake.batch_requests().iter().map(|r| r.status_code).collect();
    assert_eq!(codes, [Some(200), Some(200), Some(200), None]);

    // Expiring: the hanging request is cut, the one after it never runs.
    let file = api.upload_ok(&input(&[("q", "quick"), ("h", "hang"), ("n", "never")])).await;
    api.fake.set_batch_script(BatchScript { expire_after: Some(2), ..BatchScript::default() });
    let id = api.create(&file).await["id"].as_str().unwrap().to_string();
    assert_eq!(api.statuses(&id, 2).await, ["in_progress", "expired"]);
    let b = api.retrieve(&id).await;
    assert_eq!(jsonl_lines(&api.content(&b["output_file_id"]).await).len(), 1);
    let errors = jsonl_lines(&api.content(&b["error_file_id"]).await);
    let expired: Vec<(&str, &str)> = errors
        .iter()
        .map(|l| (l["custom_id"].as_str().unwrap(), l["error"]["code"].as_str().unwrap()))
        .collect();
    assert_eq!(expired, [("h", "batch_expired"), ("n", "batch_expired")]);
    let ran: Vec<String> = api
        .fake
        .batch_requests()
        .into_iter()
        .filter(|r| r.batch_id == id)
        .map(|r| r.custom_id)
        .collect();
    assert_eq!(ran, ["q", "h"]);
}

/// A panicking responder gives a 500 line; `Garbage` is a 200 line with the text as body.
#[tokio::test]
async fn panics_and_garbage_in_a_batch() {
    let api = start(|call| match prompt(call) {
        "panic" => panic!("scripted batch failure"),
        "garbage" => Reply::Garbage("<html>".into()),
        _ => Reply::Status { code: 1000, body: String::new(), retry_after: None },
    });
    let file = api.upload_ok(&input(&[("p", "panic"), ("g", "garbage"), ("x", "odd")])).await;
    let id = api.create(&file).await["id"].as_str().unwrap().to_string();
    let b = api.statuses(&id, 3).await;
    assert_eq!(b.last().unwrap(), "completed");
    let b = api.retrieve(&id).await;
    let output = jsonl_lines(&api.content(&b["output_file_id"]).await);
    assert_eq!(output.len(), 1);
    assert_eq!(output[0]["response"]["body"], "<html>");
    let errors = jsonl_lines(&api.content(&b["error_file_id"]).await);
    assert_eq!(errors.len(), 2);
    assert_eq!(errors[0]["response"]["status_code"], 500);
    let message = errors[0]["response"]["body"]["error"]["message"].as_str().unwrap();
    assert!(message.contains("scripted batch failure"), "{message}");
    assert_eq!(errors[1]["response"]["status_code"], 500);
}

/// Outages hit the batch endpoints too; a batch does not move while its retrieves fail,
/// and its state survives the listener going away.
#[tokio::test]
async fn outage_during_polling() {
    let api = start(|_| Reply::Text("ok".into()));
    let file = api.upload_ok(&input(&[("a", "x")])).await;
    let id = api.create(&file).await["id"].as_str().unwrap().to_string();
    assert_eq!(api.statuses(&id, 1).await, ["in_progress"]);

    api.fake.go_down(Outage::Unavailable);
    let (status, body) = api.get(&format!("/batches/{id}")).await;
    assert_error_body(status, &body, 503);
    let (status, body) = api.upload(&input(&[("b", "y")])).await;
    assert_error_body(status, &body, 503);
    let (status, body) = api.get("/batches").await;
    assert_error_body(status, &body, 503);
    assert_eq!(api.fake.batches()[0]["status"], "in_progress");
    api.fake.come_back();

    api.fake.go_down(Outage::Hang);
    let hung = api
        .http
        .get(api.url(&format!("/batches/{id}")))
        .timeout(Duration::from_millis(200))
        .send()
        .await;
    assert!(hung.is_err(), "a hung retrieve was answered: {hung:?}");
    api.fake.come_back();

    api.fake.go_down(Outage::Refuse);
    let refused = api.http.get(api.url(&format!("/batches/{id}"))).send().await;
    assert!(refused.is_err(), "answered while refusing: {refused:?}");
    api.fake.come_back();

    assert_eq!(api.statuses(&id, 2).await, ["finalizing", "completed"]);
    let b = api.retrieve(&id).await;
    assert_eq!(jsonl_lines(&api.content(&b["output_file_id"]).await).len(), 1);
    // Counted: 1 before, the 503, the hung one, 3 after; not the refused one.
    assert_eq!(api.fake.batch_retrieves(), 6);
    assert_eq!(api.fake.files_uploaded(), 1);
}

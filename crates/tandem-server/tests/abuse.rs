//! Hostile and broken input: the API key in both API styles, request timeouts, a burst of 200
//! simultaneous requests against a limit of 50, oversized bodies, deeply nested JSON, invalid
//! UTF-8, wrong types, and a seeded in-process fuzz run of mutated bodies through the router
//! (plus raw bytes through parsing + template rendering). Every answer is a clean JSON error or
//! a normal response, and a good request right after is served.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use common::fake::Fake;
use common::Server;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tandem_server::scripted::{Script, ScriptedBackend};
use tandem_server::ServerConfig;
use tower::ServiceExt;

fn chat_body() -> Value {
    json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})
}

#[tokio::test]
async fn api_key_in_both_styles() {
    let cfg = ServerConfig { port: 0, api_key: Some("sekret".into()), ..ServerConfig::default() };
    let s = Server::start(Fake::new(4096), cfg).await;
    let (st, v) = s.post("/v1/chat/completions", &chat_body()).await;
    assert_eq!((st, v["error"]["code"].as_str()), (401, Some("invalid_api_key")), "{v}");
    let (st, v) = s.post("/v1/messages", &json!({"max_tokens": 5, "messages": []})).await;
    assert_eq!(
        (st, v["type"].as_str(), v["error"]["type"].as_str()),
        (401, Some("error"), Some("authentication_error"))
    );
    let send = |header: &'static str, value: &'static str| {
        s.client.post(s.url("/v1/chat/completions")).header(header, value).json(&chat_body()).send()
    };
    assert_eq!(send("authorization", "Bearer sekret").await.unwrap().status().as_u16(), 200);
    assert_eq!(send("x-api-key", "sekret").await.unwrap().status().as_u16(), 200);
    assert_eq!(send("authorization", "Bearer sekreT").await.unwrap().status().as_u16(), 401);
    assert_eq!(send("x-api-key", "sekret-and-more").await.unwrap().status().as_u16(), 401);
    assert_eq!(s.get("/health").await.0, 200);
    assert_eq!(s.get("/v1/models").await.0, 401);
}

#[tokio::test]
async fn request_timeout_whole_and_streamed() {
    let fake = Fake::new(100_000);
    let cfg = ServerConfig { port: 0, request_timeout: Some(Duration::from_millis(300)), ..ServerConfig::default() };
    let s = Server::start(fake.clone(), cfg).await;
    let slow = json!({"prompt": "SLOW", "max_tokens": 5000});
    let (st, v) = s.post("/v1/completions", &slow).await;
    assert_eq!((st, v["error"]["code"].as_str()), (504, Some("timeout")), "{v}");
    let mut stream = slow.clone();
    stream["stream"] = json!(true);
    let (st, _, data) = s.stream("/v1/completions", &stream).await;
    assert_eq!(st, 200);
    let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "timeout");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !fake.shared.cancelled.load(Ordering::SeqCst) {
        assert!(tokio::time::Instant::now() < deadline, "the timed-out request was not cancelled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (st, _) = s.post("/v1/completions", &json!({"prompt": "hi", "max_tokens": 3})).await;
    assert_eq!(st, 200);
}

#[tokio::test]
async fn burst_of_200_against_a_limit_of_50() {
    let cfg = ServerConfig { port: 0, max_concurrent_requests: 50, ..ServerConfig::default() };
    let s = Arc::new(Server::start(Fake::new(100_000), cfg).await);
    let mut tasks = Vec::new();
    for i in 0..200 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let body = if i % 2 == 0 {
                json!({"prompt": "SLOW", "max_tokens": 100})
            } else {
                json!({"prompt": "SLOW", "max_tokens": 100, "stream": true})
            };
            let resp = s.client.post(s.url("/v1/completions")).json(&body).send().await.unwrap();
            let status = resp.status().as_u16();
            let retry = resp.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string());
            let text = resp.text().await.unwrap();
            (status, retry, text)
        }));
    }
    let (mut ok, mut busy) = (0, 0);
    for t in tasks {
        let (status, retry, text) = t.await.unwrap();
        match status {
            200 => ok += 1,
            429 => {
                busy += 1;
                assert_eq!(retry.as_deref(), Some("1"));
                let v: Value = serde_json::from_str(&text).unwrap();
                assert_eq!(v["error"]["type"], "rate_limit_error");
            }
            other => panic!("unexpected status {other}: {text}"),
        }
    }
    assert!(ok >= 50 && busy >= 50, "ok {ok}, busy {busy}");
    let (st, _) = s.post("/v1/chat/completions", &chat_body()).await;
    assert_eq!(st, 200);
}

#[tokio::test]
async fn malformed_bodies_get_clean_errors() {
    let cfg = ServerConfig { port: 0, max_body_bytes: 256 * 1024, ..ServerConfig::default() };
    let s = Server::start(Fake::new(4096), cfg).await;
    let deep_array = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let deep_object = format!("{{\"messages\": {}1{}}}", "{\"a\":".repeat(5000), "}".repeat(5000));
    let deep_content = json!({"messages": [{"role": "user", "content": nested(120)}]}).to_string();
    let deep_tools =
        json!({"messages": [{"role": "user", "content": "x"}], "tools": [nested(120)], "max_tokens": 2}).to_string();
    let huge = json!({"messages": [{"role": "user", "content": "x".repeat(300 * 1024)}]}).to_string();
    let bodies: Vec<(Vec<u8>, &[u16])> = vec![
        (deep_array.into_bytes(), &[400, 413]),
        (deep_object.into_bytes(), &[400]),
        (deep_content.into_bytes(), &[400]),
        (deep_tools.into_bytes(), &[200, 400]),
        (huge.into_bytes(), &[413]),
        (b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}".to_vec(), &[400]),
        (vec![0xc3, 0x28, 0xa0, 0xa1], &[400]),
        (b"\0\0\0".to_vec(), &[400]),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}).to_string().into_bytes(),
            &[400],
        ),
        (json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1e300}).to_string().into_bytes(), &[400]),
        (json!({"messages": [{"role": "user", "content": "x"}], "stop": {"a": 1}}).to_string().into_bytes(), &[400]),
        (json!({"messages": [{"role": 7, "content": "x"}]}).to_string().into_bytes(), &[400]),
        (
            json!({"messages": [{"role": "assistant", "content": null, "tool_calls": "nope"}]})
                .to_string()
                .into_bytes(),
            &[200, 400],
        ),
    ];
    for path in ["/v1/chat/completions", "/v1/messages", "/v1/completions", "/v1/messages/count_tokens"] {
        for (body, allowed) in &bodies {
            let (st, v) = s.post_raw(path, body.clone()).await;
            let lenient =
                path != "/v1/chat/completions" && (st == 400 || (st == 200 && path.ends_with("count_tokens")));
            assert!(allowed.contains(&st) || lenient, "{path} {:.60}: {st} {v}", String::from_utf8_lossy(body));
            if st >= 400 {
                let anthropic = path.starts_with("/v1/messages");
                assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{path}: {v}");
                assert_eq!(v["type"].as_str() == Some("error"), anthropic, "{path}: {v}");
            }
        }
    }
    let (st, _) = s.post("/v1/chat/completions", &chat_body()).await;
    assert_eq!(st, 200);
}

fn nested(depth: usize) -> Value {
    (0..depth).fold(json!("leaf"), |v, i| if i % 2 == 0 { json!([v]) } else { json!({"k": v}) })
}

/// Seeds for the mutator: valid bodies of every route.
fn seeds() -> Vec<(&'static str, Value)> {
    let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}]);
    vec![
        (
            "/v1/chat/completions",
            json!({"model": "scripted", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "2"}], "tools": tools, "tool_choice": "auto", "max_tokens": 8, "temperature": 0.5,
            "stream": false, "logprobs": false, "chat_template_kwargs": {"enable_thinking": true}, "max_thinking_tokens": 4, "stop": ["x"]}),
        ),
        ("/v1/completions", json!({"prompt": "hello", "max_tokens": 4, "stream": true, "stop": "x", "seed": 3})),
        (
            "/v1/messages",
            json!({"model": "scripted", "max_tokens": 8, "system": [{"type": "text", "text": "s"}], "stream": true,
            "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "thinking", "thinking": "t"}, {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "2"}]}],
            "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "any"}, "thinking": {"type": "enabled", "budget_tokens": 4}, "stop_sequences": ["z"]}),
        ),
        ("/v1/messages/count_tokens", json!({"messages": [{"role": "user", "content": "hi"}]})),
        (
            "/v1/responses",
            json!({"model": "scripted", "instructions": "s", "max_output_tokens": 8, "stream": true, "store": true,
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{\"a\":1}"},
            {"type": "function_call_output", "call_id": "c", "output": "2"}, {"type": "reasoning", "summary": []}],
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}], "tool_choice": "auto",
            "reasoning": {"effort": "low"}, "text": {"format": {"type": "text"}}, "previous_response_id": null}),
        ),
    ]
}

fn random_value(rng: &mut StdRng, depth: usize) -> Value {
    match rng.random_range(0..if depth > 3 { 6 } else { 8 }) {
        0 => Value::Null,
        1 => json!(rng.random::<bool>()),
        2 => json!(rng.random_range(-5i64..100_000)),
        3 => json!(rng.random::<f64>() * 1e6 - 5e5),
        4 => json!(
            [
                "",
                "user",
                "assistant",
                "tool",
                "function",
                "text",
                "auto",
                "none",
                "<tool_call>",
                "<think>",
                "{{ x }}",
                "{% for %}",
                "\u{0}",
                "é"
            ][rng.random_range(0..14)]
        ),
        5 => json!(-1),
        6 => Value::Array((0..rng.random_range(0..4)).map(|_| random_value(rng, depth + 1)).collect()),
        _ => {
            let keys = [
                "role",
                "content",
                "type",
                "text",
                "name",
                "messages",
                "tools",
                "max_tokens",
                "stream",
                "function",
                "arguments",
                "input",
            ];
            Value::Object(
                (0..rng.random_range(0..4))
                    .map(|_| (keys[rng.random_range(0..keys.len())].to_string(), random_value(rng, depth + 1)))
                    .collect(),
            )
        }
    }
}

/// Replaces, deletes or retypes a random node of `v`.
fn mutate(rng: &mut StdRng, v: &mut Value, depth: usize) {
    let here = depth > 0 && rng.random_range(0..4) == 0;
    match v {
        Value::Object(map) if !map.is_empty() && !here => {
            let keys: Vec<String> = map.keys().cloned().collect();
            let k = &keys[rng.random_range(0..keys.len())];
            match rng.random_range(0..6) {
                0 => {
                    map.remove(k);
                }
                1 => {
                    map.insert(k.clone(), random_value(rng, depth));
                }
                _ => mutate(rng, map.get_mut(k).expect("key"), depth + 1),
            }
        }
        Value::Array(list) if !list.is_empty() && !here => {
            let i = rng.random_range(0..list.len());
            match rng.random_range(0..5) {
                0 => {
                    list.remove(i);
                }
                1 => list.push(random_value(rng, depth)),
                _ => mutate(rng, &mut list[i], depth + 1),
            }
        }
        _ => *v = random_value(rng, depth),
    }
}

/// Byte-level damage: flips, truncation, insertion.
fn damage(rng: &mut StdRng, bytes: &mut Vec<u8>) {
    for _ in 0..rng.random_range(1..4) {
        if bytes.is_empty() {
            break;
        }
        let i = rng.random_range(0..bytes.len());
        match rng.random_range(0..3) {
            0 => bytes[i] = rng.random(),
            1 => bytes.truncate(i),
            _ => bytes.insert(i, b"{[\"\\}]:,0"[rng.random_range(0..9)]),
        }
    }
}

#[tokio::test]
async fn seeded_fuzz_through_the_router() {
    let script: Script = serde_json::from_value(
        json!({"default_reply": "<think>a</think>b<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>"}),
    )
    .unwrap();
    let cfg = ServerConfig { port: 0, max_body_bytes: 64 * 1024, ..ServerConfig::default() };
    let app = tandem_server::router(ScriptedBackend::new(script).unwrap(), &cfg);
    let mut rng = StdRng::seed_from_u64(0x7a4d_e111);
    let seeds = seeds();
    let iterations = 3000;
    let mut statuses = std::collections::BTreeMap::new();
    for it in 0..iterations {
        let (path, seed) = &seeds[rng.random_range(0..seeds.len())];
        let mut body = seed.clone();
        for _ in 0..rng.random_range(1..4) {
            mutate(&mut rng, &mut body, 0);
        }
        let mut bytes = serde_json::to_vec(&body).unwrap();
        if rng.random_range(0..4) == 0 {
            damage(&mut rng, &mut bytes);
        }
        tandem_server::fuzzing::request_and_template(&bytes);
        let req =
            Request::post(*path).header("content-type", "application/json").body(Body::from(bytes.clone())).unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        let status = resp.status().as_u16();
        let ctype = resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
        let data = tokio::time::timeout(Duration::from_secs(10), axum::body::to_bytes(resp.into_body(), 1 << 20))
            .await
            .unwrap_or_else(|_| panic!("iteration {it}: body did not end"))
            .unwrap();
        *statuses.entry(status).or_insert(0) += 1;
        assert!(
            matches!(status, 200 | 400 | 404 | 413),
            "iteration {it} {path}: {status} {}",
            String::from_utf8_lossy(&data)
        );
        if !ctype.starts_with("text/event-stream") {
            let v: Value = serde_json::from_slice(&data)
                .unwrap_or_else(|e| panic!("iteration {it}: non-JSON ({e}): {}", String::from_utf8_lossy(&data)));
            if status >= 400 {
                let anthropic = path.starts_with("/v1/messages");
                assert_eq!(v["type"].as_str() == Some("error"), anthropic, "iteration {it} {path}: {v}");
            }
        }
    }
    assert!(
        statuses.get(&200).copied().unwrap_or(0) > 100 && statuses.get(&400).copied().unwrap_or(0) > 100,
        "{statuses:?}"
    );
    // Raw random bytes through parsing and rendering.
    for _ in 0..2000 {
        let n = rng.random_range(0..200);
        let bytes: Vec<u8> = (0..n).map(|_| rng.random()).collect();
        tandem_server::fuzzing::request_and_template(&bytes);
    }
}

/// A backend whose `submit` panics: the handler's panic becomes a JSON 500 and the server
/// keeps serving.
struct Panicky(Fake);

impl tandem_server::Backend for Panicky {
    fn info(&self) -> &tandem_engine::ModelInfo {
        self.0.info()
    }
    fn tokenize(&self, text: &str, add_bos: bool) -> Result<Vec<u32>, String> {
        self.0.tokenize(text, add_bos)
    }
    fn add_bos_by_default(&self) -> bool {
        true
    }
    fn bos_token(&self) -> Option<String> {
        self.0.bos_token()
    }
    fn render_chat(
        &self,
        m: &[Value],
        o: &tandem_server::ChatRenderOptions,
    ) -> Result<tandem_server::RenderedChat, String> {
        self.0.render_chat(m, o)
    }
    fn submit(
        &self,
        req: tandem_engine::GenerateRequest,
    ) -> Result<tokio::sync::mpsc::Receiver<tandem_engine::GenerationEvent>, tandem_engine::SubmitError> {
        if req.prompt_ids.len() > 150 {
            panic!("scripted bug");
        }
        self.0.submit(req)
    }
}

#[tokio::test]
async fn a_panicking_handler_answers_500_and_the_server_carries_on() {
    let s = Server::start(Panicky(Fake::new(4096)), ServerConfig { port: 0, ..ServerConfig::default() }).await;
    let long = json!({"messages": [{"role": "user", "content": "x".repeat(200)}], "max_tokens": 3});
    let (st, v) = s.post("/v1/chat/completions", &long).await;
    assert_eq!((st, v["error"]["type"].as_str()), (500, Some("server_error")), "{v}");
    let (st, _) = s.post("/v1/chat/completions", &chat_body()).await;
    assert_eq!(st, 200);
}

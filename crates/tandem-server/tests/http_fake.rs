//! The HTTP layer end to end over real sockets, on a scripted fake backend: response shapes,
//! streaming framing, every refusal's status and JSON body, engine failures, cancellation on
//! disconnect, and that the server keeps serving after bad input.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::fake::{Fake, ANSWER, BOS};
use common::{assert_error, chunks, Server};
use serde_json::{json, Value};
use tandem_server::ServerConfig;

const CONTEXT: usize = 4096;

fn cfg() -> ServerConfig {
    ServerConfig { port: 0, max_body_bytes: 64 * 1024, default_max_tokens: 100, ..ServerConfig::default() }
}

async fn start() -> (Server, Fake) {
    let fake = Fake::new(CONTEXT);
    (Server::start(fake.clone(), cfg()).await, fake)
}

fn chat_body(extra: Value) -> Value {
    let mut body = json!({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "temperature": 0});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

#[tokio::test]
async fn health_models_and_unknown_routes() {
    let (s, _) = start().await;
    assert_eq!(s.get("/health").await, (200, json!({"status": "ok"})));
    let (st, models) = s.get("/v1/models").await;
    assert_eq!(st, 200);
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "fake-model");
    assert_eq!(models["data"][0]["owned_by"], "tandem");
    assert_eq!(s.get("/v1/models/fake-model").await.0, 200);
    let (st, body) = s.get("/v1/models/other").await;
    assert_error(st, &body, 404, "unknown model card");
    let (st, body) = s.get("/nope").await;
    assert_error(st, &body, 404, "unknown route");
    let (st, body) = s.get("/v1/chat/completions").await;
    assert_error(st, &body, 405, "GET on a POST route");
}

#[tokio::test]
async fn chat_whole_answer() {
    let (s, fake) = start().await;
    let (st, v) = s.post("/v1/chat/completions", &chat_body(json!({"return_token_ids": true}))).await;
    assert_eq!(st, 200, "{v}");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "fake-model");
    let choice = &v["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"], json!({"role": "assistant", "content": ANSWER}));
    assert_eq!(choice["finish_reason"], "stop");
    assert!(choice["logprobs"].is_null());
    let ids = choice["token_ids"].as_array().unwrap();
    assert_eq!(ids.len(), ANSWER.len());
    let usage = &v["usage"];
    assert_eq!(usage["completion_tokens"], ids.len());
    assert_eq!(usage["prompt_tokens"], v["prompt_token_ids"].as_array().unwrap().len());
    assert_eq!(
        usage["total_tokens"],
        usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
    );
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);

    let req = fake.last_request();
    assert_eq!(req.prompt_ids[0], BOS);
    assert_eq!(req.prompt_ids.iter().filter(|&&i| i == BOS).count(), 1);
    assert_eq!(req.sampling.temperature, 0.0);
    assert_eq!(req.stop.max_tokens, 100, "default max_tokens");
    assert_eq!(req.message_boundaries, vec![1 + "<|im_start|>user\nhi<|im_end|>\n".len()]);
    assert!(req.logprobs.is_none());
}

#[tokio::test]
async fn chat_stream_matches_whole_answer() {
    let (s, _) = start().await;
    let body = chat_body(json!({"stream": true, "stream_options": {"include_usage": true}, "return_token_ids": true}));
    let (st, ctype, data) = s.stream("/v1/chat/completions", &body).await;
    assert_eq!(st, 200);
    assert!(ctype.starts_with("text/event-stream"), "{ctype}");
    let chunks = chunks(&data);
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let id = chunks[0]["id"].as_str().unwrap();
    let mut text = String::new();
    let mut ids = Vec::new();
    let mut finish = None;
    for c in &chunks {
        assert_eq!(c["id"], id);
        assert_eq!(c["object"], "chat.completion.chunk");
        if let Some(choice) = c["choices"].get(0) {
            text.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
            ids.extend(choice["token_ids"].as_array().into_iter().flatten().cloned());
            if !choice["finish_reason"].is_null() {
                finish = Some(choice["finish_reason"].clone());
            }
        }
    }
    assert_eq!(text, ANSWER);
    assert_eq!(finish, Some(json!("stop")));
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], ids.len());

    let (_, whole) = s.post("/v1/chat/completions", &chat_body(json!({"return_token_ids": true}))).await;
    assert_eq!(json!(ids), whole["choices"][0]["token_ids"]);
    assert_eq!(chunks[0]["prompt_token_ids"], whole["prompt_token_ids"]);

    // Without include_usage: no usage chunk, still [DONE].
    let (_, _, data) = s.stream("/v1/chat/completions", &chat_body(json!({"stream": true}))).await;
    let plain = common::chunks(&data);
    assert!(plain.iter().all(|c| c.get("usage").is_none() && !c["choices"].as_array().unwrap().is_empty()));
}

#[tokio::test]
async fn chat_logprobs_and_length_finish() {
    let (s, fake) = start().await;
    let (st, v) =
        s.post("/v1/chat/completions", &chat_body(json!({"logprobs": true, "top_logprobs": 2, "max_tokens": 3}))).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 3);
    for e in content {
        assert!(e["token"].is_string() && e["logprob"].is_number() && e["bytes"].is_array(), "{e}");
        assert_eq!(e["top_logprobs"].as_array().unwrap().len(), 2);
    }
    assert_eq!(fake.last_request().logprobs, Some(2));
    assert_eq!(fake.last_request().stop.max_tokens, 3);

    let (_, _, data) =
        s.stream("/v1/chat/completions", &chat_body(json!({"stream": true, "logprobs": true, "max_tokens": 3}))).await;
    let with_lp = chunks(&data).iter().filter(|c| c["choices"][0]["logprobs"]["content"].is_array()).count();
    assert_eq!(with_lp, 3);
}

#[tokio::test]
async fn completions_whole_and_stream() {
    let (s, fake) = start().await;
    let body = json!({"prompt": "Say hi", "max_tokens": 50, "logprobs": 1, "return_token_ids": true, "temperature": 0});
    let (st, v) = s.post("/v1/completions", &body).await;
    assert_eq!(st, 200, "{v}");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(v["object"], "text_completion");
    let choice = &v["choices"][0];
    assert_eq!(choice["text"], ANSWER);
    let lp = &choice["logprobs"];
    let n = ANSWER.len();
    for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
        assert_eq!(lp[key].as_array().unwrap().len(), n, "{key}: {lp}");
    }
    assert!(lp["top_logprobs"][0].is_object());
    assert_eq!(lp["text_offset"][0], 0);
    assert_eq!(choice["token_ids"].as_array().unwrap().len(), n);
    assert_eq!(v["usage"]["completion_tokens"], n);
    assert_eq!(v["usage"]["prompt_tokens"], 1 + "Say hi".len());
    assert!(fake.last_request().message_boundaries.is_empty());

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    sbody["stream_options"] = json!({"include_usage": true});
    let (st, _, data) = s.stream("/v1/completions", &sbody).await;
    assert_eq!(st, 200);
    let chunks = chunks(&data);
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(text, ANSWER);
    let ids: Vec<Value> =
        chunks.iter().flat_map(|c| c["choices"][0]["token_ids"].as_array().cloned().unwrap_or_default()).collect();
    assert_eq!(json!(ids), choice["token_ids"]);
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], n);

    // Token-id prompts, bare and nested; no BOS is added to ids.
    for prompt in [json!([20, 21, 22]), json!([[20, 21, 22]]), json!(["Say hi"])] {
        let (st, v) = s.post("/v1/completions", &json!({"prompt": prompt, "max_tokens": 2})).await;
        assert_eq!(st, 200, "{prompt}: {v}");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
    }
    s.post("/v1/completions", &json!({"prompt": [20, 21, 22], "max_tokens": 2})).await;
    assert_eq!(fake.last_request().prompt_ids, vec![20, 21, 22]);
}

#[tokio::test]
async fn default_max_tokens_is_capped_by_the_context() {
    let fake = Fake::new(40);
    let s = Server::start(fake.clone(), cfg()).await;
    let (st, _) = s.post("/v1/completions", &json!({"prompt": "0123456789"})).await;
    assert_eq!(st, 200);
    assert_eq!(fake.last_request().stop.max_tokens, 40 - 11);
}

#[tokio::test]
async fn bad_input_is_refused_with_json_errors() {
    let (s, _) = start().await;
    let long = "x".repeat(CONTEXT + 10);
    let chat = "/v1/chat/completions";
    let cmpl = "/v1/completions";
    type Case<'a> = (&'a str, String, u16, Option<&'a str>, Option<&'a str>);
    let cases: Vec<Case> = vec![
        // (path, raw body, status, code, param)
        (chat, "{not json".into(), 400, Some("invalid_json"), None),
        (chat, "".into(), 400, Some("invalid_json"), None),
        (cmpl, "[1,2".into(), 400, Some("invalid_json"), None),
        (chat, "[]".into(), 400, None, None),
        (chat, json!({"messages": "hi"}).to_string(), 400, None, Some("messages")),
        (
            chat,
            json!({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}).to_string(),
            400,
            None,
            Some("temperature"),
        ),
        (
            chat,
            json!({"messages": [{"role": "wizard", "content": "x"}]}).to_string(),
            400,
            None,
            Some("messages[0].role"),
        ),
        (chat, json!({}).to_string(), 400, None, Some("messages")),
        (chat, json!({"messages": []}).to_string(), 400, None, Some("messages")),
        (chat, json!({"messages": [{"role": "user"}]}).to_string(), 400, None, Some("messages[0].content")),
        (
            chat,
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}).to_string(),
            400,
            None,
            Some("messages[0].content[0].type"),
        ),
        (chat, chat_body(json!({"model": "gpt-9"})).to_string(), 404, Some("model_not_found"), Some("model")),
        (cmpl, json!({"model": "gpt-9", "prompt": "x"}).to_string(), 404, Some("model_not_found"), Some("model")),
        (chat, chat_body(json!({"n": 2})).to_string(), 400, None, Some("n")),
        (chat, chat_body(json!({"temperature": -1})).to_string(), 400, None, Some("temperature")),
        (chat, chat_body(json!({"top_p": 0})).to_string(), 400, None, Some("top_p")),
        (chat, chat_body(json!({"top_k": -5})).to_string(), 400, None, Some("top_k")),
        (chat, chat_body(json!({"min_p": 1.5})).to_string(), 400, None, Some("min_p")),
        (chat, chat_body(json!({"repetition_penalty": 0})).to_string(), 400, None, Some("repetition_penalty")),
        (chat, chat_body(json!({"presence_penalty": 9})).to_string(), 400, None, Some("presence_penalty")),
        (chat, chat_body(json!({"frequency_penalty": -9})).to_string(), 400, None, Some("frequency_penalty")),
        (chat, chat_body(json!({"max_tokens": 0})).to_string(), 400, None, Some("max_tokens")),
        (
            chat,
            chat_body(json!({"max_tokens": CONTEXT})).to_string(),
            400,
            Some("context_length_exceeded"),
            Some("max_tokens"),
        ),
        (
            chat,
            chat_body(json!({"max_completion_tokens": CONTEXT * 2})).to_string(),
            400,
            Some("context_length_exceeded"),
            Some("max_tokens"),
        ),
        (
            chat,
            chat_body(json!({"messages": [{"role": "user", "content": long}]})).to_string(),
            400,
            Some("context_length_exceeded"),
            Some("messages"),
        ),
        (chat, chat_body(json!({"top_logprobs": 2})).to_string(), 400, None, Some("top_logprobs")),
        (chat, chat_body(json!({"logprobs": true, "top_logprobs": 50})).to_string(), 400, None, Some("top_logprobs")),
        (chat, chat_body(json!({"stop": [1, 2]})).to_string(), 400, None, Some("stop")),
        (chat, chat_body(json!({"stop_token_ids": [300]})).to_string(), 400, None, Some("stop_token_ids")),
        (chat, chat_body(json!({"tools": "all"})).to_string(), 400, None, Some("tools")),
        (cmpl, json!({}).to_string(), 400, None, Some("prompt")),
        (cmpl, json!({"prompt": []}).to_string(), 400, None, Some("prompt")),
        (cmpl, json!({"prompt": ["a", "b"]}).to_string(), 400, None, Some("prompt")),
        (cmpl, json!({"prompt": [[1], [2]]}).to_string(), 400, None, Some("prompt")),
        (cmpl, json!({"prompt": [1, 300]}).to_string(), 400, Some("invalid_token"), Some("prompt")),
        (cmpl, json!({"prompt": [-1]}).to_string(), 400, Some("invalid_token"), Some("prompt")),
        (cmpl, json!({"prompt": {"text": "x"}}).to_string(), 400, None, Some("prompt")),
        (cmpl, json!({"prompt": long}).to_string(), 400, Some("context_length_exceeded"), Some("prompt")),
        (cmpl, json!({"prompt": "x", "echo": true}).to_string(), 400, None, Some("echo")),
        (cmpl, json!({"prompt": "x", "logprobs": true}).to_string(), 400, None, Some("logprobs")),
        (cmpl, json!({"prompt": "x", "logprobs": 99}).to_string(), 400, None, Some("logprobs")),
        (cmpl, json!({"prompt": "x", "n": 3}).to_string(), 400, None, Some("n")),
        (cmpl, json!({"prompt": "x", "max_tokens": -1}).to_string(), 400, None, Some("max_tokens")),
    ];
    for (path, body, status, code, param) in cases {
        let what = format!("{path} {body:.80}");
        let (st, v) = s.post_raw(path, body.clone()).await;
        assert_error(st, &v, status, &what);
        if let Some(code) = code {
            assert_eq!(v["error"]["code"], code, "{what}: {v}");
        }
        if let Some(param) = param {
            assert_eq!(v["error"]["param"], param, "{what}: {v}");
        }
        if status < 500 {
            assert_eq!(v["error"]["type"], "invalid_request_error", "{what}: {v}");
        }
    }

    // Too large a body: 413 with a JSON body.
    let huge = json!({"prompt": "y".repeat(100 * 1024)}).to_string();
    let (st, v) = s.post_raw(cmpl, huge).await;
    assert_error(st, &v, 413, "oversized body");

    // Still serving.
    let (st, v) = s.post("/v1/chat/completions", &chat_body(json!({}))).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], ANSWER);
}

#[tokio::test]
async fn engine_refusals_and_failures() {
    let (s, _) = start().await;
    let resp = s.client.post(s.url("/v1/completions")).json(&json!({"prompt": "QUEUEFULL"})).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 429);
    assert_eq!(resp.headers().get("retry-after").unwrap(), "1");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "queue_full");

    for stream in [false, true] {
        let (st, v) = s.post("/v1/completions", &json!({"prompt": "ERRFIRST", "stream": stream})).await;
        assert_error(st, &v, 500, "error before the first token");
        assert!(v["error"]["message"].as_str().unwrap().contains("scripted failure"));
    }
    let (st, v) = s.post("/v1/completions", &json!({"prompt": "ERRMID"})).await;
    assert_error(st, &v, 500, "error midway, not streaming");

    let (st, _, data) = s
        .stream(
            "/v1/chat/completions",
            &chat_body(json!({"stream": true, "messages": [{"role": "user", "content": "ERRMID"}]})),
        )
        .await;
    assert_eq!(st, 200);
    let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
    assert!(last["error"]["message"].as_str().unwrap().contains("mid-stream"), "{data:?}");
    assert!(!data.iter().any(|d| d == "[DONE]"));

    let (st, _) = s.post("/v1/chat/completions", &chat_body(json!({}))).await;
    assert_eq!(st, 200);
}

#[tokio::test]
async fn disconnect_cancels_the_request() {
    let (s, fake) = start().await;
    let body = json!({"prompt": "SLOW", "stream": true, "max_tokens": 2000});
    let mut resp = s.client.post(s.url("/v1/completions")).json(&body).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let first = resp.chunk().await.unwrap().unwrap();
    assert!(std::str::from_utf8(&first).unwrap().contains("data:"));
    drop(resp);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !fake.shared.cancelled.load(Ordering::SeqCst) {
        assert!(tokio::time::Instant::now() < deadline, "the engine receiver outlived the client");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn concurrent_requests() {
    let (s, _) = start().await;
    let s = std::sync::Arc::new(s);
    let mut tasks = Vec::new();
    for i in 0..16 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            if i % 2 == 0 {
                s.post("/v1/chat/completions", &chat_body(json!({}))).await
            } else {
                s.post_raw("/v1/chat/completions", "{oops").await
            }
        }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        let (st, _) = t.await.unwrap();
        assert_eq!(st, if i % 2 == 0 { 200 } else { 400 });
    }
}

//! The server on the real engine with the tiny Qwen2 fixture (random weights, context 256,
//! vocabulary 384), over real sockets: whole and streamed chat and completions agree for greedy
//! decoding, usage matches the token ids, log-probability shapes, every refusal, cancellation on
//! disconnect, that a good request is served after the bad ones, and Anthropic's
//! `stop_sequence` reporting.

mod common;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{assert_error, chunks, Server};
use serde_json::{json, Value};
use tandem_engine::{EngineConfig, EngineHandle};
use tandem_server::ServerConfig;

const MODEL: &str = "tiny-qwen2";

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny/qwen2")
}

async fn start() -> (Server, EngineHandle) {
    let cfg = EngineConfig { model_id: MODEL.into(), ..EngineConfig::default() };
    let engine = EngineHandle::load(&fixture(), cfg).expect("load the tiny qwen2 fixture");
    let server_cfg =
        ServerConfig { port: 0, max_body_bytes: 64 * 1024, default_max_tokens: 32, ..ServerConfig::default() };
    (Server::start(engine.clone(), server_cfg).await, engine)
}

fn chat(extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL,
        "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello there"}],
        "temperature": 0,
        "max_tokens": 12,
        "return_token_ids": true,
    });
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

fn usage_consistent(usage: &Value, prompt_ids: &Value, completion_ids: &[Value]) {
    assert_eq!(usage["prompt_tokens"], prompt_ids.as_array().unwrap().len(), "{usage}");
    assert_eq!(usage["completion_tokens"], completion_ids.len(), "{usage}");
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
    );
    assert!(usage["prompt_tokens_details"]["cached_tokens"].is_u64());
}

/// Text, token ids, finish reason and the usage chunk of a chat stream.
fn chat_stream_parts(chunks: &[Value]) -> (String, Vec<Value>, Value, Value) {
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let (mut text, mut ids, mut finish) = (String::new(), Vec::new(), Value::Null);
    for c in chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        if let Some(ch) = c["choices"].get(0) {
            text.push_str(ch["delta"]["content"].as_str().unwrap_or(""));
            ids.extend(ch["token_ids"].as_array().cloned().unwrap_or_default());
            if !ch["finish_reason"].is_null() {
                finish = ch["finish_reason"].clone();
            }
        }
    }
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]), "usage chunk last");
    (text, ids, finish, last["usage"].clone())
}

#[tokio::test]
async fn chat_whole_and_streamed_agree() {
    let (s, _engine) = start().await;
    let (st, whole) = s.post("/v1/chat/completions", &chat(json!({}))).await;
    assert_eq!(st, 200, "{whole}");
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["model"], MODEL);
    let choice = &whole["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(["stop", "length"].contains(&choice["finish_reason"].as_str().unwrap()));
    let ids = choice["token_ids"].as_array().unwrap().clone();
    assert!(!ids.is_empty() && ids.len() <= 12);
    usage_consistent(&whole["usage"], &whole["prompt_token_ids"], &ids);

    let body = chat(json!({"stream": true, "stream_options": {"include_usage": true}}));
    let (st, ctype, data) = s.stream("/v1/chat/completions", &body).await;
    assert_eq!(st, 200);
    assert!(ctype.starts_with("text/event-stream"));
    let chunks = chunks(&data);
    let (text, sids, finish, usage) = chat_stream_parts(&chunks);
    assert_eq!(text, choice["message"]["content"].as_str().unwrap());
    assert_eq!(sids, ids);
    assert_eq!(finish, choice["finish_reason"]);
    assert_eq!(chunks[0]["prompt_token_ids"], whole["prompt_token_ids"]);
    usage_consistent(&usage, &whole["prompt_token_ids"], &sids);
}

#[tokio::test]
async fn ignore_eos_runs_to_max_tokens() {
    let (s, _engine) = start().await;
    let (st, v) = s.post("/v1/chat/completions", &chat(json!({"ignore_eos": true, "max_tokens": 20}))).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 20);
    assert_eq!(v["choices"][0]["token_ids"].as_array().unwrap().len(), 20);
}

#[tokio::test]
async fn completions_whole_and_streamed_agree() {
    let (s, _engine) = start().await;
    for prompt in
        [json!("Once upon a time"), json!([10, 20, 30, 40]), json!([[10, 20, 30, 40]]), json!(["Once upon a time"])]
    {
        let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": 10, "temperature": 0, "return_token_ids": true, "ignore_eos": true});
        let (st, whole) = s.post("/v1/completions", &body).await;
        assert_eq!(st, 200, "{prompt}: {whole}");
        assert_eq!(whole["object"], "text_completion");
        let choice = &whole["choices"][0];
        let ids = choice["token_ids"].as_array().unwrap().clone();
        assert_eq!(ids.len(), 10);
        assert_eq!(choice["finish_reason"], "length");
        usage_consistent(&whole["usage"], &choice["prompt_token_ids"], &ids);
        if prompt.is_array() && prompt[0].is_number() {
            assert_eq!(choice["prompt_token_ids"], prompt);
        }

        let mut sbody = body.clone();
        sbody["stream"] = json!(true);
        sbody["stream_options"] = json!({"include_usage": true});
        let (st, _, data) = s.stream("/v1/completions", &sbody).await;
        assert_eq!(st, 200);
        let chunks = chunks(&data);
        let text: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
        let sids: Vec<Value> =
            chunks.iter().flat_map(|c| c["choices"][0]["token_ids"].as_array().cloned().unwrap_or_default()).collect();
        assert_eq!(text, choice["text"].as_str().unwrap(), "{prompt}");
        assert_eq!(sids, ids, "{prompt}");
        assert_eq!(chunks.last().unwrap()["usage"], whole["usage"]);
    }
}

#[tokio::test]
async fn logprob_shapes() {
    let (s, _engine) = start().await;
    let (st, v) = s
        .post(
            "/v1/chat/completions",
            &chat(json!({"logprobs": true, "top_logprobs": 3, "ignore_eos": true, "max_tokens": 5})),
        )
        .await;
    assert_eq!(st, 200, "{v}");
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 5);
    for e in content {
        assert!(e["token"].is_string() && e["bytes"].is_array(), "{e}");
        let lp = e["logprob"].as_f64().unwrap();
        assert!(lp <= 0.0, "{e}");
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the chosen token is the most likely one.
        assert!((top[0]["logprob"].as_f64().unwrap() - lp).abs() < 1e-4, "{e}");
    }

    let body = json!({"prompt": "abc", "max_tokens": 4, "logprobs": 2, "temperature": 0, "ignore_eos": true});
    let (st, v) = s.post("/v1/completions", &body).await;
    assert_eq!(st, 200, "{v}");
    let lp = &v["choices"][0]["logprobs"];
    for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
        assert_eq!(lp[key].as_array().unwrap().len(), 4, "{key}: {lp}");
    }
    assert!(lp["top_logprobs"].as_array().unwrap().iter().all(|m| m.is_object() && !m.as_object().unwrap().is_empty()));
    assert_eq!(lp["text_offset"][0], 0);
}

#[tokio::test]
async fn bad_input_then_good_input() {
    let (s, _engine) = start().await;
    let chat_path = "/v1/chat/completions";
    let cmpl = "/v1/completions";
    let long = "hello world ".repeat(200);
    type Case<'a> = (&'a str, String, u16, Option<&'a str>);
    let cases: Vec<Case> = vec![
        (chat_path, "{\"messages\": [".into(), 400, Some("invalid_json")),
        (chat_path, json!({"messages": [{"role": "user", "content": 5}]}).to_string(), 400, None),
        (chat_path, json!({"messages": "hi"}).to_string(), 400, None),
        (chat_path, json!({"model": MODEL}).to_string(), 400, None),
        (chat_path, json!({"messages": []}).to_string(), 400, None),
        (chat_path, chat(json!({"model": "nope"})).to_string(), 404, Some("model_not_found")),
        (
            chat_path,
            chat(json!({"messages": [{"role": "user", "content": long}]})).to_string(),
            400,
            Some("context_length_exceeded"),
        ),
        (chat_path, chat(json!({"max_tokens": 300})).to_string(), 400, Some("context_length_exceeded")),
        (chat_path, chat(json!({"n": 2})).to_string(), 400, None),
        (chat_path, chat(json!({"temperature": -2})).to_string(), 400, None),
        (chat_path, chat(json!({"top_p": 7})).to_string(), 400, None),
        (cmpl, json!({"prompt": [1, 384]}).to_string(), 400, Some("invalid_token")),
        (cmpl, json!({"prompt": ["a", "b"]}).to_string(), 400, None),
        (cmpl, json!({"prompt": long}).to_string(), 400, Some("context_length_exceeded")),
        (cmpl, json!({"prompt": "x".repeat(100_000)}).to_string(), 413, None),
    ];
    for (path, body, status, code) in cases {
        let what = format!("{path} {body:.80}");
        let (st, v) = s.post_raw(path, body).await;
        assert_error(st, &v, status, &what);
        if let Some(code) = code {
            assert_eq!(v["error"]["code"], code, "{what}: {v}");
        }
    }
    let (st, v) = s.post(chat_path, &chat(json!({}))).await;
    assert_eq!(st, 200, "{v}");
    let (st, v) = s.post(cmpl, &json!({"prompt": "still here", "max_tokens": 3})).await;
    assert_eq!(st, 200, "{v}");
}

#[tokio::test]
async fn models_and_health() {
    let (s, _engine) = start().await;
    assert_eq!(s.get("/health").await, (200, json!({"status": "ok"})));
    let (st, v) = s.get("/v1/models").await;
    assert_eq!(st, 200);
    assert_eq!(v["data"][0]["id"], MODEL);
    assert_eq!(v["data"][0]["owned_by"], "tandem");
    assert_eq!(v["data"][0]["max_model_len"], 256);
}

#[tokio::test]
async fn disconnect_cancels_in_the_engine() {
    let (s, engine) = start().await;
    let body = json!({"prompt": "go", "max_tokens": 250, "ignore_eos": true, "stream": true});
    let mut resp = s.client.post(s.url("/v1/completions")).json(&body).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let first = resp.chunk().await.unwrap().unwrap();
    assert!(std::str::from_utf8(&first).unwrap().contains("data:"));
    drop(resp);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let stats = engine.stats();
        if stats.cancelled.load(Ordering::SeqCst) == 1 && stats.running.load(Ordering::SeqCst) == 0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the request kept running after the client left");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The engine is free for the next request.
    let (st, _) = s.post("/v1/completions", &json!({"prompt": "next", "max_tokens": 2})).await;
    assert_eq!(st, 200);
}

#[tokio::test]
async fn message_boundaries_fall_on_message_ends() {
    use tandem_server::{Backend, ChatRenderOptions};
    let engine =
        EngineHandle::load(&fixture(), EngineConfig { model_id: MODEL.into(), ..EngineConfig::default() }).unwrap();
    let messages = vec![
        json!({"role": "system", "content": "Be brief."}),
        json!({"role": "user", "content": "Hi there!"}),
        json!({"role": "assistant", "content": "Hello."}),
        json!({"role": "user", "content": "And now?"}),
    ];
    let opts = ChatRenderOptions { add_generation_prompt: true, ..ChatRenderOptions::default() };
    let rendered = engine.render_chat(&messages, &opts).unwrap();
    let prompt = tandem_server::prompt::chat_prompt(&engine, &messages, &opts).unwrap();
    assert_eq!(prompt.message_boundaries.len(), 4, "{:?}", prompt.message_boundaries);
    assert!(prompt.message_boundaries.windows(2).all(|w| w[0] < w[1]));
    for (&b, &end) in prompt.message_boundaries.iter().zip(&rendered.message_ends) {
        let prefix = engine.tokenizer().decode(&prompt.ids[..b], false);
        assert_eq!(prefix, rendered.text[..end], "boundary {b}");
    }
}

#[tokio::test]
async fn anthropic_stop_sequence_on_the_real_engine() {
    let (s, _engine) = start().await;
    let msgs = json!([{"role": "user", "content": "Hello there"}]);
    let (st, full) = s.post("/v1/messages", &json!({"max_tokens": 16, "temperature": 0, "messages": msgs})).await;
    assert_eq!(st, 200, "{full}");
    let text = full["content"][0]["text"].as_str().unwrap().to_string();
    assert_eq!(full["stop_sequence"], Value::Null, "{full}");
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    assert!(chars.len() >= 4, "the greedy answer is long enough to cut: {text:?}");
    // A stop sequence from the middle of the greedy answer: the answer ends right before it.
    let from = chars[chars.len() / 2].0;
    let stop: String = text[from..].chars().take(2).collect();
    let want = &text[..text.find(&stop).unwrap()];
    let body = json!({"max_tokens": 16, "temperature": 0, "messages": msgs, "stop_sequences": ["\u{1}never", stop]});
    let (st, v) = s.post("/v1/messages", &body).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!((v["stop_reason"].as_str(), v["stop_sequence"].as_str()), (Some("stop_sequence"), Some(stop.as_str())));
    assert_eq!(v["content"][0]["text"], want, "{v}");

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let (st, _, data) = s.stream("/v1/messages", &sbody).await;
    assert_eq!(st, 200);
    let events: Vec<Value> = data.iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    let delta = events.iter().find(|e| e["type"] == "message_delta").expect("a message_delta event");
    assert_eq!(delta["delta"], json!({"stop_reason": "stop_sequence", "stop_sequence": stop}));
    let streamed: String = events.iter().filter_map(|e| e["delta"]["text"].as_str()).collect();
    assert_eq!(streamed, want);
}

/// `tool_choice: "required"` on the random-weight fixture, in each call format: whatever the
/// model would have written, every answer is a call of the offered tool with arguments of the
/// right types (the grammar also bounds them, so the random model finishes), and
/// `response_format` JSON parses. Whole and streamed.
#[tokio::test]
async fn required_tool_calls_and_json_always_parse_on_the_real_engine() {
    use tandem_server::tools::ToolFormat;
    let cfg = EngineConfig { model_id: MODEL.into(), ..EngineConfig::default() };
    let engine = EngineHandle::load(&fixture(), cfg).expect("load the tiny qwen2 fixture");
    let tool = json!({"type": "function", "function": {"name": "book", "parameters": {
        "type": "object",
        "properties": {"days": {"type": "integer", "minimum": 1, "maximum": 9}, "room": {"enum": ["single", "double"]}},
        "required": ["days", "room"], "additionalProperties": false}}});
    for format in [ToolFormat::Hermes, ToolFormat::QwenXml, ToolFormat::Llama3] {
        let server_cfg = ServerConfig {
            port: 0,
            default_max_tokens: 32,
            tool_parser: tandem_server::config::ToolParserChoice::Fixed(format),
            ..ServerConfig::default()
        };
        let s = Server::start(engine.clone(), server_cfg).await;
        for seed in 0..4 {
            let body = chat(json!({"temperature": 1.0, "seed": seed, "max_tokens": 210, "tools": [tool],
                                   "tool_choice": "required", "parallel_tool_calls": false}));
            let (st, v) = s.post("/v1/chat/completions", &body).await;
            assert_eq!(st, 200, "{v}");
            let c = &v["choices"][0];
            assert_eq!(c["finish_reason"], "tool_calls", "{format:?} seed {seed}: {v}");
            let call = &c["message"]["tool_calls"][0]["function"];
            assert_eq!(call["name"], "book", "{v}");
            let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap())
                .unwrap_or_else(|e| panic!("{format:?} seed {seed}: {e}: {v}"));
            assert!(args["days"].is_i64(), "{format:?}: {args}");
            assert!(["single", "double"].contains(&args["room"].as_str().unwrap_or("")), "{format:?}: {args}");
        }
    }
    let s = Server::start(engine.clone(), ServerConfig { port: 0, ..ServerConfig::default() }).await;
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string", "maxLength": 5}},
                        "required": ["n", "s"], "additionalProperties": false,
                        // Compact: a random model would otherwise spend its tokens on blanks.
                        "x-guidance": {"whitespace_flexible": false}});
    for seed in 0..4 {
        let rf = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}});
        let body = chat(json!({"temperature": 1.0, "seed": seed, "max_tokens": 60, "response_format": rf}));
        let (_, whole) = s.post("/v1/chat/completions", &body).await;
        let text = whole["choices"][0]["message"]["content"].as_str().unwrap().to_string();
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(v["n"].is_i64() && v["s"].as_str().is_some_and(|s| s.chars().count() <= 5), "{v}");
        let mut sbody = body.clone();
        sbody["stream"] = json!(true);
        let (_, _, events) = s.stream("/v1/chat/completions", &sbody).await;
        let streamed: String = chunks(&events)
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_string))
            .collect();
        assert_eq!(streamed, text, "streamed equals whole");
    }
    let (st, e) = s.post("/v1/chat/completions", &chat(json!({"guided_regex": "(unclosed"}))).await;
    assert_eq!((st, e["error"]["code"].as_str()), (400, Some("invalid_grammar")), "{e}");
}

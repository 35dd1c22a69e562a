//! The agent-facing API end to end over real sockets, on the scripted backend (real chat
//! template, parsers and thinking driver; scripted model output): tool calls whole and
//! streamed, `tool_choice`, a multi-step tool conversation, reasoning content, the thinking
//! budget and loop escape, and the Anthropic Messages API with its streaming events and stop
//! sequences.

mod common;

use common::{chunks, Server};
use serde_json::{json, Value};
use tandem_server::scripted::{Script, ScriptedBackend};
use tandem_server::ServerConfig;

const CALL: &str =
    "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
const LONG_THOUGHT: &str = "step one, step two, step three, step four, step five, step six, step seven, step eight, step nine, step ten, step eleven, step twelve, and so on for a long while.";

fn script() -> Script {
    serde_json::from_value(json!({
        "model": "scripted",
        "rules": [
            {"when": "weather?", "reply": CALL},
            {"when": "<tool_response>", "reply": "It is 22C in Paris."},
            {"when": "two plus two", "reply": "<think>\nTwo plus two is four.\n</think>\n\nThe answer is 4."},
            {"when": "think long", "reply": format!("{LONG_THOUGHT}\n</think>\n\nNatural answer.")},
            {"when": "think loop", "reply": "I wonder. Let me reconsider. ".repeat(60)},
            {"when": "now the answer.", "reply": "Budget answer, which is long enough to be cut."},
            {"when": "time to answer.", "reply": "Loop answer."},
            {"when": "fenced weather", "reply": "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```"},
            {"when": "json data", "reply": "{\"name\": \"Paris\", \"country\": \"France\"}"},
            {"when": "xml please", "reply": "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"}
        ],
        "default_reply": "Hello!"
    }))
    .unwrap()
}

fn cfg() -> ServerConfig {
    ServerConfig {
        port: 0,
        default_max_tokens: 500,
        thinking_loop_ngram: 16,
        thinking_loop_repeats: 4,
        ..ServerConfig::default()
    }
}

async fn start() -> Server {
    Server::start(ScriptedBackend::new(script()).unwrap(), cfg()).await
}

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}])
}

fn chat(messages: Value, extra: Value) -> Value {
    let mut body = json!({"model": "scripted", "messages": messages});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

/// Content, reasoning and tool calls accumulated from chat chunks, and the finish reason.
fn accumulate(chunks: &[Value]) -> (String, String, Vec<Value>, String) {
    let (mut content, mut reasoning, mut calls, mut finish) =
        (String::new(), String::new(), Vec::<Value>::new(), String::new());
    for c in chunks {
        let Some(choice) = c["choices"].get(0) else { continue };
        let d = &choice["delta"];
        content.push_str(d["content"].as_str().unwrap_or(""));
        reasoning.push_str(d["reasoning_content"].as_str().unwrap_or(""));
        for tc in d["tool_calls"].as_array().into_iter().flatten() {
            let i = tc["index"].as_u64().unwrap() as usize;
            if i == calls.len() {
                assert!(
                    tc["id"].is_string() && tc["function"]["name"].is_string(),
                    "first delta of a call names it: {tc}"
                );
                calls.push(json!({"id": tc["id"], "type": tc["type"], "function": {"name": tc["function"]["name"], "arguments": ""}}));
            }
            let args = format!(
                "{}{}",
                calls[i]["function"]["arguments"].as_str().unwrap(),
                tc["function"]["arguments"].as_str().unwrap_or("")
            );
            calls[i]["function"]["arguments"] = json!(args);
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (content, reasoning, calls, finish)
}

#[tokio::test]
async fn tool_calls_whole_and_streamed() {
    let s = start().await;
    let body = chat(user("Paris weather?"), json!({"tools": tools()}));
    let (st, v) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(st, 200, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], "Let me check.");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    assert_eq!(
        serde_json::from_str::<Value>(call["function"]["arguments"].as_str().unwrap()).unwrap(),
        json!({"city": "Paris"})
    );

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let (st, _, data) = s.stream("/v1/chat/completions", &sbody).await;
    assert_eq!(st, 200);
    let (content, _, calls, finish) = accumulate(&chunks(&data));
    assert_eq!(content, "Let me check.");
    assert_eq!(finish, "tool_calls");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["function"]["arguments"], call["function"]["arguments"]);
    let fragments = chunks(&data)
        .iter()
        .filter(|c| {
            c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str().is_some_and(|a| !a.is_empty())
        })
        .count();
    assert!(fragments > 1, "arguments arrive in several deltas while generated");

    // XML format typed by the schema when the server is told to parse it.
    let xml = ServerConfig {
        tool_parser: tandem_server::config::ToolParserChoice::Fixed(tandem_server::tools::ToolFormat::QwenXml),
        ..cfg()
    };
    let sx = Server::start(ScriptedBackend::new(script()).unwrap(), xml).await;
    let (_, v) = sx.post("/v1/chat/completions", &chat(user("xml please"), json!({"tools": tools()}))).await;
    let args = v["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].as_str().unwrap().to_string();
    assert_eq!(serde_json::from_str::<Value>(&args).unwrap(), json!({"city": "Rome", "days": 3}));
}

#[tokio::test]
async fn calls_written_as_plain_json() {
    // Models that answer a tool request with a bare or fenced JSON object instead of their
    // template's syntax: a call when it names an offered tool with fitting arguments.
    let s = start().await;
    let body = chat(user("fenced weather"), json!({"tools": tools()}));
    let (st, v) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(st, 200, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert_eq!(choice["message"]["content"], Value::Null);
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris"}));
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let (_, _, data) = s.stream("/v1/chat/completions", &sbody).await;
    let (content, _, calls, finish) = accumulate(&chunks(&data));
    assert_eq!((content.as_str(), finish.as_str(), calls.len()), ("", "tool_calls", 1));
    assert_eq!(calls[0]["function"]["arguments"], call["function"]["arguments"]);
    // The Anthropic API sees the same call as a tool_use block.
    let msg = json!({"model": "scripted", "max_tokens": 200, "messages": [{"role": "user", "content": "fenced weather"}],
        "tools": [{"name": "get_weather", "input_schema": tools()[0]["function"]["parameters"]}]});
    let (st, v) = s.post("/v1/messages", &msg).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["stop_reason"], "tool_use", "{v}");
    let block = v["content"].as_array().unwrap().iter().find(|b| b["type"] == "tool_use").unwrap();
    assert_eq!((&block["name"], &block["input"]), (&json!("get_weather"), &json!({"city": "Paris"})));
    // JSON that is not a call of an offered tool stays content.
    let (_, v) = s.post("/v1/chat/completions", &chat(user("json data"), json!({"tools": tools()}))).await;
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["message"]["content"], "{\"name\": \"Paris\", \"country\": \"France\"}");
}

#[tokio::test]
async fn tool_choice_variants() {
    let s = start().await;
    // none: tools are not offered and calls are not parsed.
    let (_, v) =
        s.post("/v1/chat/completions", &chat(user("weather?"), json!({"tools": tools(), "tool_choice": "none"}))).await;
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(v["choices"][0]["message"]["content"].as_str().unwrap().contains("<tool_call>"));
    assert!(v["choices"][0]["message"].get("tool_calls").is_none());
    // Named function and required still parse; parallel_tool_calls=false keeps one call.
    for choice in [json!("required"), json!({"type": "function", "function": {"name": "get_weather"}})] {
        let (st, v) = s
            .post(
                "/v1/chat/completions",
                &chat(user("weather?"), json!({"tools": tools(), "tool_choice": choice, "parallel_tool_calls": false})),
            )
            .await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["choices"][0]["message"]["tool_calls"].as_array().unwrap().len(), 1);
    }
    // A model that does not call the tool: the answer comes back as content.
    let (_, v) =
        s.post("/v1/chat/completions", &chat(user("hi"), json!({"tools": tools(), "tool_choice": "required"}))).await;
    assert_eq!(v["choices"][0]["message"]["content"], "Hello!");
    for (extra, param) in [
        (json!({"tools": tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}), "tool_choice"),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (json!({"tools": tools(), "tool_choice": "sometimes"}), "tool_choice"),
        (json!({"tools": tools(), "tool_choice": 5}), "tool_choice"),
        (json!({"max_thinking_tokens": 0}), "max_thinking_tokens"),
    ] {
        let (st, v) = s.post("/v1/chat/completions", &chat(user("x"), extra.clone())).await;
        assert_eq!((st, v["error"]["param"].as_str()), (400, Some(param)), "{extra}: {v}");
    }
}

#[tokio::test]
async fn multi_step_tool_conversation() {
    let s = start().await;
    let mut messages = vec![
        json!({"role": "system", "content": "You are helpful."}),
        json!({"role": "user", "content": "Paris weather?"}),
    ];
    let (_, v) = s.post("/v1/chat/completions", &chat(json!(messages), json!({"tools": tools()}))).await;
    let msg = v["choices"][0]["message"].clone();
    let id = msg["tool_calls"][0]["id"].as_str().unwrap().to_string();
    messages.push(msg);
    messages.push(json!({"role": "tool", "tool_call_id": id, "content": "22C and sunny"}));
    let (st, v) = s.post("/v1/chat/completions", &chat(json!(messages), json!({"tools": tools()}))).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], "It is 22C in Paris.");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn reasoning_content() {
    let s = start().await;
    let (_, v) = s.post("/v1/chat/completions", &chat(user("two plus two?"), json!({}))).await;
    let m = &v["choices"][0]["message"];
    assert_eq!(
        (m["reasoning_content"].as_str(), m["content"].as_str()),
        (Some("Two plus two is four."), Some("The answer is 4."))
    );
    let (_, _, data) = s.stream("/v1/chat/completions", &chat(user("two plus two?"), json!({"stream": true}))).await;
    let (content, reasoning, _, _) = accumulate(&chunks(&data));
    assert_eq!((reasoning.as_str(), content.as_str()), ("Two plus two is four.", "The answer is 4."));
    // enable_thinking opens the block in the generation prompt: output starts inside it.
    let (_, v) = s
        .post(
            "/v1/chat/completions",
            &chat(user("think long"), json!({"chat_template_kwargs": {"enable_thinking": true}})),
        )
        .await;
    assert_eq!(v["choices"][0]["message"]["reasoning_content"], LONG_THOUGHT);
    assert_eq!(v["choices"][0]["message"]["content"], "Natural answer.");
}

#[tokio::test]
async fn thinking_budget_and_loop_escape() {
    let s = start().await;
    let budget = 20;
    let body = chat(
        user("think long"),
        json!({"enable_thinking": true, "max_thinking_tokens": budget, "max_tokens": 12, "return_token_ids": true}),
    );
    let (st, v) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(st, 200, "{v}");
    let m = &v["choices"][0]["message"];
    let reasoning = m["reasoning_content"].as_str().unwrap();
    // Bytes are tokens: thinking stopped after `budget` tokens, then the transition.
    assert!(reasoning.starts_with(&LONG_THOUGHT[..budget]), "{reasoning}");
    assert!(reasoning.ends_with("Okay, I have thought enough; now the answer."), "{reasoning}");
    assert!(!reasoning.contains(&LONG_THOUGHT[..budget + 1]));
    // The answer is bounded by max_tokens alone.
    assert_eq!(m["content"], "Budget answe");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let ids = v["choices"][0]["token_ids"].as_array().unwrap().len();
    assert_eq!(v["usage"]["completion_tokens"], ids);
    assert_eq!(v["usage"]["prompt_tokens"], v["prompt_token_ids"].as_array().unwrap().len());

    // Streamed: same split.
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let (_, _, data) = s.stream("/v1/chat/completions", &sbody).await;
    let (content, sreasoning, _, finish) = accumulate(&chunks(&data));
    assert_eq!((sreasoning.as_str(), content.as_str(), finish.as_str()), (reasoning, "Budget answe", "length"));

    // A loop is detected and escaped.
    let (_, v) = s.post("/v1/chat/completions", &chat(user("think loop"), json!({"enable_thinking": true}))).await;
    let m = &v["choices"][0]["message"];
    let reasoning = m["reasoning_content"].as_str().unwrap();
    assert!(reasoning.ends_with("time to answer."), "{reasoning}");
    assert!(reasoning.len() < 200, "the loop was cut early: {reasoning}");
    assert_eq!(m["content"], "Loop answer.");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
}

/// `(event, data)` pairs of an Anthropic stream.
async fn anthropic_events(s: &Server, body: &Value) -> Vec<(String, Value)> {
    let resp = s.client.post(s.url("/v1/messages")).json(body).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let text = resp.text().await.unwrap();
    text.split("\n\n")
        .filter_map(|frame| {
            let ev = frame.lines().find_map(|l| l.strip_prefix("event: "))?;
            let data = frame.lines().find_map(|l| l.strip_prefix("data: "))?;
            Some((ev.to_string(), serde_json::from_str(data).unwrap()))
        })
        .collect()
}

fn anthropic_tools() -> Value {
    json!([{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}])
}

#[tokio::test]
async fn anthropic_messages() {
    let s = start().await;
    let body = json!({"model": "scripted", "max_tokens": 200, "system": "Be brief.", "tools": anthropic_tools(),
        "messages": [{"role": "user", "content": "Paris weather?"}]});
    let (st, v) = s.post("/v1/messages", &body).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        (v["type"].as_str(), v["role"].as_str(), v["stop_reason"].as_str()),
        (Some("message"), Some("assistant"), Some("tool_use"))
    );
    assert!(v["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(v["content"][0], json!({"type": "text", "text": "Let me check."}));
    let tool = &v["content"][1];
    assert_eq!((tool["type"].as_str(), tool["name"].as_str()), (Some("tool_use"), Some("get_weather")));
    assert_eq!(tool["input"], json!({"city": "Paris"}));
    assert!(v["usage"]["input_tokens"].as_u64().unwrap() > 0);

    // Second step with tool_result.
    let step2 = json!({"model": "scripted", "max_tokens": 200, "tools": anthropic_tools(), "messages": [
        {"role": "user", "content": "Paris weather?"},
        {"role": "assistant", "content": v["content"]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool["id"], "content": "22C"}]}
    ]});
    let (st, v2) = s.post("/v1/messages", &step2).await;
    assert_eq!(st, 200, "{v2}");
    assert_eq!(v2["content"][0]["text"], "It is 22C in Paris.");
    assert_eq!(v2["stop_reason"], "end_turn");

    // Streaming: the event sequence and its accumulated blocks.
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let events = anthropic_events(&s, &sbody).await;
    assert_eq!(events[0].0, "message_start");
    assert_eq!(events[0].1["message"]["usage"]["input_tokens"], v["usage"]["input_tokens"]);
    assert_eq!(events[1].0, "ping");
    assert_eq!(events.last().unwrap().0, "message_stop");
    let delta = &events[events.len() - 2];
    assert_eq!((delta.0.as_str(), delta.1["delta"]["stop_reason"].as_str()), ("message_delta", Some("tool_use")));
    let text: String = events.iter().filter_map(|e| e.1["delta"]["text"].as_str()).collect();
    let json_args: String = events.iter().filter_map(|e| e.1["delta"]["partial_json"].as_str()).collect();
    assert_eq!(text, "Let me check.");
    assert_eq!(serde_json::from_str::<Value>(&json_args).unwrap(), json!({"city": "Paris"}));
    let starts: Vec<&str> = events
        .iter()
        .filter(|e| e.0 == "content_block_start")
        .map(|e| e.1["content_block"]["type"].as_str().unwrap())
        .collect();
    assert_eq!(starts, ["text", "tool_use"]);
    for (name, data) in &events {
        assert_eq!(data["type"], name.as_str());
    }

    // Thinking with a budget.
    let think = json!({"max_tokens": 50, "thinking": {"type": "enabled", "budget_tokens": 20}, "messages": [{"role": "user", "content": "think long"}]});
    let (_, v) = s.post("/v1/messages", &think).await;
    assert_eq!(v["content"][0]["type"], "thinking");
    assert!(v["content"][0]["thinking"].as_str().unwrap().ends_with("now the answer."));
    assert_eq!(v["content"][1]["text"], "Budget answer, which is long enough to be cut.");
    let mut sthink = think.clone();
    sthink["stream"] = json!(true);
    let events = anthropic_events(&s, &sthink).await;
    let thinking: String = events.iter().filter_map(|e| e.1["delta"]["thinking"].as_str()).collect();
    assert_eq!(thinking, v["content"][0]["thinking"].as_str().unwrap());

    // max_tokens as the stop reason; count_tokens.
    let (_, v) =
        s.post("/v1/messages", &json!({"max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})).await;
    assert_eq!((v["stop_reason"].as_str(), v["content"][0]["text"].as_str()), (Some("max_tokens"), Some("Hel")));
    let (st, c) = s
        .post(
            "/v1/messages/count_tokens",
            &json!({"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(st, 200);
    assert_eq!(c["input_tokens"], "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n".len());
}

#[tokio::test]
async fn anthropic_stop_sequence() {
    let s = start().await;
    let msgs = json!([{"role": "user", "content": "two plus two"}]);
    let body = json!({"max_tokens": 100, "stop_sequences": ["nowhere", "is 4"], "messages": msgs});
    let (st, v) = s.post("/v1/messages", &body).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!((v["stop_reason"].as_str(), v["stop_sequence"].as_str()), (Some("stop_sequence"), Some("is 4")), "{v}");
    assert_eq!(v["content"][0]["thinking"], "Two plus two is four.");
    assert_eq!(v["content"][1], json!({"type": "text", "text": "The answer "}));

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let events = anthropic_events(&s, &sbody).await;
    let delta = &events[events.len() - 2];
    assert_eq!(delta.0, "message_delta");
    assert_eq!(delta.1["delta"], json!({"stop_reason": "stop_sequence", "stop_sequence": "is 4"}));
    assert_eq!(events[0].1["message"]["stop_sequence"], Value::Null);
    let text: String = events.iter().filter_map(|e| e.1["delta"]["text"].as_str()).collect();
    assert_eq!(text, "The answer ");

    // No stop sequence matched: `end_turn` and a null `stop_sequence`.
    let body = json!({"max_tokens": 100, "stop_sequences": ["nowhere"], "messages": msgs});
    let (_, v) = s.post("/v1/messages", &body).await;
    assert_eq!((v["stop_reason"].as_str(), &v["stop_sequence"]), (Some("end_turn"), &Value::Null), "{v}");
    sbody["stop_sequences"] = json!(["nowhere"]);
    let events = anthropic_events(&s, &sbody).await;
    assert_eq!(events[events.len() - 2].1["delta"], json!({"stop_reason": "end_turn", "stop_sequence": null}));

    // The OpenAI route keeps `finish_reason: "stop"` for a stop string.
    let (_, v) = s.post("/v1/chat/completions", &chat(msgs, json!({"stop": ["is 4"]}))).await;
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], "The answer ");
}

#[tokio::test]
async fn anthropic_errors() {
    let s = start().await;
    let cases = [
        (json!({"messages": [{"role": "user", "content": "hi"}]}), 400, "invalid_request_error"),
        (json!({"max_tokens": 5}), 400, "invalid_request_error"),
        (json!({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}), 400, "invalid_request_error"),
        (
            json!({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "model": "claude-9"}),
            404,
            "not_found_error",
        ),
        (
            json!({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}),
            400,
            "invalid_request_error",
        ),
        (json!({"max_tokens": 99999, "messages": [{"role": "user", "content": "x"}]}), 400, "invalid_request_error"),
    ];
    for (body, status, kind) in cases {
        let (st, v) = s.post("/v1/messages", &body).await;
        assert_eq!(st, status, "{body}: {v}");
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], kind, "{v}");
        assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    let (st, v) = s.post_raw("/v1/messages", "{oops").await;
    assert_eq!((st, v["type"].as_str()), (400, Some("error")));
    let (st, v) = s.post("/v1/messages/nope", &json!({})).await;
    assert_eq!((st, v["error"]["type"].as_str()), (404, Some("not_found_error")));
}

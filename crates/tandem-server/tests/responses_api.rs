//! The OpenAI Responses API end to end over real sockets, on the scripted backend (real chat
//! template and parsers, scripted model output): text answers whole and streamed (the events
//! add up to the response object), a function-tool round trip through `previous_response_id`,
//! stored responses (GET, DELETE, `store: false`), instructions, the token limit, and refusals.

mod common;

use common::Server;
use serde_json::{json, Value};
use tandem_server::scripted::{Script, ScriptedBackend};
use tandem_server::ServerConfig;

const CALL: &str = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

async fn start() -> Server {
    let script: Script = serde_json::from_value(json!({
        "model": "scripted",
        "rules": [
            {"when": "weather?", "reply": CALL},
            {"when": "<tool_response>", "reply": "It is 22C in Paris."},
            {"when": "remember zebra", "reply": "Noted."},
            {"when": "Noted.", "reply": "You said zebra."},
            {"when": "Answer in French.", "reply": "Bonjour."},
            {"when": "ponder", "reply": "<think>\nHmm.\n</think>\n\nDone."}
        ],
        "default_reply": "Hello there, how can I help?"
    }))
    .unwrap();
    let cfg = ServerConfig { port: 0, default_max_tokens: 200, ..ServerConfig::default() };
    Server::start(ScriptedBackend::new(script).unwrap(), cfg).await
}

fn tools() -> Value {
    json!([{"type": "function", "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}])
}

/// The text of a response's message items.
fn output_text(r: &Value) -> String {
    r["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().unwrap().iter().map(|p| p["text"].as_str().unwrap().to_string()))
        .collect()
}

#[tokio::test]
async fn text_whole_stored_and_deleted() {
    let s = start().await;
    let (st, r) = s.post("/v1/responses", &json!({"model": "scripted", "input": "hi"})).await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["object"], "response");
    assert!(r["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(r["status"], "completed");
    assert_eq!(output_text(&r), "Hello there, how can I help?");
    let msg = &r["output"][0];
    assert_eq!(
        (&msg["type"], &msg["role"], &msg["status"]),
        (&json!("message"), &json!("assistant"), &json!("completed"))
    );
    assert_eq!(r["usage"]["output_tokens"], 28);
    assert!(r["usage"]["input_tokens"].as_u64().unwrap() > 0);
    let id = r["id"].as_str().unwrap().to_string();
    // Stored: GET returns the same object; DELETE forgets it.
    assert_eq!(s.get(&format!("/v1/responses/{id}")).await, (200, r.clone()));
    let del = s.client.delete(s.url(&format!("/v1/responses/{id}"))).send().await.unwrap();
    assert_eq!(del.status().as_u16(), 200);
    assert_eq!(del.json::<Value>().await.unwrap()["deleted"], true);
    assert_eq!(s.get(&format!("/v1/responses/{id}")).await.0, 404);
    // store: false keeps nothing.
    let (_, r) = s.post("/v1/responses", &json!({"input": "hi", "store": false})).await;
    assert_eq!(s.get(&format!("/v1/responses/{}", r["id"].as_str().unwrap())).await.0, 404);
    // Instructions become the system message; message items with content parts work too.
    let body = json!({"instructions": "Answer in French.", "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]});
    let (_, r) = s.post("/v1/responses", &body).await;
    assert_eq!(output_text(&r), "Bonjour.");
    assert_eq!(r["instructions"], "Answer in French.");
    // The token limit: status incomplete.
    let (_, r) = s.post("/v1/responses", &json!({"input": "hi", "max_output_tokens": 5})).await;
    assert_eq!(
        (r["status"].as_str(), r["incomplete_details"]["reason"].as_str()),
        (Some("incomplete"), Some("max_output_tokens"))
    );
    assert_eq!(output_text(&r), "Hello");
    // Reasoning becomes a reasoning item before the message.
    let (_, r) = s.post("/v1/responses", &json!({"input": "ponder"})).await;
    assert_eq!(r["output"][0]["type"], "reasoning");
    assert_eq!(r["output"][0]["content"][0]["text"].as_str().map(str::trim), Some("Hmm."));
    assert_eq!(output_text(&r), "Done.");
}

#[tokio::test]
async fn conversation_and_tool_round_trip_through_previous_response_id() {
    let s = start().await;
    let (_, first) = s.post("/v1/responses", &json!({"input": "remember zebra"})).await;
    assert_eq!(output_text(&first), "Noted.");
    let body = json!({"input": "which word?", "previous_response_id": first["id"]});
    let (st, second) = s.post("/v1/responses", &body).await;
    assert_eq!(st, 200, "{second}");
    assert_eq!(output_text(&second), "You said zebra.", "the stored conversation came first");
    assert_eq!(second["previous_response_id"], first["id"]);
    // Without the history the same input gets the default answer.
    let (_, alone) = s.post("/v1/responses", &json!({"input": "which word?"})).await;
    assert_eq!(output_text(&alone), "Hello there, how can I help?");

    let (_, call) = s.post("/v1/responses", &json!({"input": "Paris weather?", "tools": tools()})).await;
    let item = &call["output"][0];
    assert_eq!((&item["type"], &item["name"]), (&json!("function_call"), &json!("get_weather")), "{call}");
    assert_eq!(serde_json::from_str::<Value>(item["arguments"].as_str().unwrap()).unwrap(), json!({"city": "Paris"}));
    let back = json!({"previous_response_id": call["id"], "tools": tools(),
        "input": [{"type": "function_call_output", "call_id": item["call_id"], "output": "22C"}]});
    let (st, answer) = s.post("/v1/responses", &back).await;
    assert_eq!(st, 200, "{answer}");
    assert_eq!(output_text(&answer), "It is 22C in Paris.");

    let (st, e) = s.post("/v1/responses", &json!({"input": "x", "previous_response_id": "resp_missing"})).await;
    assert_eq!((st, e["error"]["param"].as_str()), (404, Some("previous_response_id")));
}

#[tokio::test]
async fn streamed_events_add_up_to_the_response() {
    let s = start().await;
    for body in
        [json!({"input": "hi", "stream": true}), json!({"input": "Paris weather?", "tools": tools(), "stream": true})]
    {
        let (st, ctype, data) = s.stream("/v1/responses", &body).await;
        assert_eq!(st, 200);
        assert!(ctype.starts_with("text/event-stream"));
        let events: Vec<Value> = data.iter().map(|d| serde_json::from_str(d).unwrap()).collect();
        let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(&types[..2], ["response.created", "response.in_progress"]);
        assert_eq!(types.last(), Some(&"response.completed"));
        for (i, e) in events.iter().enumerate() {
            assert_eq!(e["sequence_number"], i, "{e}");
        }
        let done = &events.last().unwrap()["response"];
        let text: String = events
            .iter()
            .filter(|e| e["type"] == "response.output_text.delta")
            .map(|e| e["delta"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(text, output_text(done));
        let args: String = events
            .iter()
            .filter(|e| e["type"] == "response.function_call_arguments.delta")
            .map(|e| e["delta"].as_str().unwrap().to_string())
            .collect();
        let calls: Vec<&Value> =
            done["output"].as_array().unwrap().iter().filter(|i| i["type"] == "function_call").collect();
        assert_eq!(args, calls.first().map_or("", |c| c["arguments"].as_str().unwrap()));
        // Every item is announced and finished with the content the response holds.
        let finished: Vec<&Value> =
            events.iter().filter(|e| e["type"] == "response.output_item.done").map(|e| &e["item"]).collect();
        assert_eq!(finished, done["output"].as_array().unwrap().iter().collect::<Vec<_>>());
        // The streamed response is stored like a whole one.
        assert_eq!(s.get(&format!("/v1/responses/{}", done["id"].as_str().unwrap())).await, (200, done.clone()));
    }
}

#[tokio::test]
async fn refusals() {
    let s = start().await;
    for (body, status, param) in [
        (json!({"model": "scripted"}), 400, "input"),
        (json!({"input": "x", "tools": [{"type": "web_search"}]}), 400, "tools[0]"),
        (json!({"input": [{"type": "item_reference", "id": "msg_1"}]}), 400, "input[0]"),
        (json!({"input": "x", "model": "gpt-9"}), 404, "model"),
        (
            json!({"input": "x", "text": {"format": {"type": "json_schema", "name": "a", "schema": 3}}}),
            400,
            "response_format",
        ),
    ] {
        let (st, e) = s.post("/v1/responses", &body).await;
        assert_eq!((st, e["error"]["param"].as_str()), (status, Some(param)), "{body}: {e}");
    }
}

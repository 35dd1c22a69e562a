//! Model names: the served model answers to its id and to its aliases (`--served-model-name`,
//! the catalogue alias, the file name) on every generation route, lists them all in
//! `GET /v1/models`, refuses other names with 404, and with `any_model` accepts any name.

mod common;

use common::fake::Fake;
use common::{assert_error, Server};
use serde_json::json;
use tandem_server::ServerConfig;

fn cfg(aliases: &[&str], any_model: bool) -> ServerConfig {
    ServerConfig {
        port: 0,
        default_max_tokens: 8,
        model_aliases: aliases.iter().map(|s| s.to_string()).collect(),
        any_model,
        ..ServerConfig::default()
    }
}

fn chat(model: &str) -> serde_json::Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "temperature": 0, "max_tokens": 4})
}

fn messages(model: &str) -> serde_json::Value {
    json!({"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
}

#[tokio::test]
async fn aliases_are_listed_and_accepted_on_every_route() {
    let s = Server::start(Fake::new(4096), cfg(&["gpt-4o-mini", "qwen2.5-coder-0.5b", "fake-model"], false)).await;
    let (st, list) = s.get("/v1/models").await;
    assert_eq!(st, 200);
    let ids: Vec<&str> = list["data"].as_array().unwrap().iter().map(|c| c["id"].as_str().unwrap()).collect();
    // The id first, each name once (an alias equal to the id is not repeated).
    assert_eq!(ids, ["fake-model", "gpt-4o-mini", "qwen2.5-coder-0.5b"]);
    for name in ["fake-model", "gpt-4o-mini", "qwen2.5-coder-0.5b"] {
        let (st, card) = s.get(&format!("/v1/models/{name}")).await;
        assert_eq!((st, card["id"].as_str()), (200, Some(name)));
        let (st, v) = s.post("/v1/chat/completions", &chat(name)).await;
        assert_eq!(st, 200, "{name}: {v}");
        // Responses name the model by its id, whichever name the request used.
        assert_eq!(v["model"], "fake-model");
        let (st, v) = s.post("/v1/completions", &json!({"model": name, "prompt": "x", "max_tokens": 2})).await;
        assert_eq!(st, 200, "{name}: {v}");
        let (st, v) = s.post("/v1/messages", &messages(name)).await;
        assert_eq!(st, 200, "{name}: {v}");
    }
    let (st, body) = s.post("/v1/chat/completions", &chat("gpt-5")).await;
    assert_error(st, &body, 404, "a name that is neither the id nor an alias");
    let (st, body) = s.get("/v1/models/gpt-5").await;
    assert_error(st, &body, 404, "an unknown model card");
    // Names are exact: no case folding, no prefix matches.
    let (st, body) = s.post("/v1/chat/completions", &chat("GPT-4o-mini")).await;
    assert_error(st, &body, 404, "a name differing in case");
}

#[tokio::test]
async fn any_model_accepts_every_name() {
    let s = Server::start(Fake::new(4096), cfg(&[], true)).await;
    for name in ["fake-model", "gpt-5", "claude-sonnet-4-5", ""] {
        let (st, v) = s.post("/v1/chat/completions", &chat(name)).await;
        assert_eq!(st, 200, "{name}: {v}");
        assert_eq!(v["model"], "fake-model");
        let (st, v) = s.post("/v1/messages", &messages(name)).await;
        assert_eq!(st, 200, "{name}: {v}");
    }
    assert_eq!(s.get("/v1/models/gpt-5").await.0, 200);
    let (_, list) = s.get("/v1/models").await;
    assert_eq!(list["data"].as_array().unwrap().len(), 1, "only real names are listed: {list}");
}

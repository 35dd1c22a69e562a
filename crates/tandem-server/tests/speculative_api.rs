//! Speculative decoding through the HTTP API on the real engine (tiny Llama fixture drafting
//! for itself): the per-request `speculative` override, the `usage.speculative` extension,
//! unchanged greedy output, refusal of a method the server does not offer, and the
//! speculation metrics.

mod common;

use std::path::PathBuf;

use common::{assert_error, Server};
use serde_json::{json, Value};
use tandem_engine::{EngineConfig, EngineHandle, SpecConfig, SpecMethod};
use tandem_server::ServerConfig;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny/llama")
}

async fn start() -> Server {
    let dev = candle_core::Device::Cpu;
    let target = tandem_model::loader::load(&fixture(), &dev).unwrap();
    let draft = tandem_model::loader::load(&fixture(), &dev).unwrap();
    let cfg = EngineConfig {
        model_id: "tiny".into(),
        speculative: SpecConfig {
            method: SpecMethod::Draft,
            num_draft_tokens: 3,
            adaptive: false,
            ..Default::default()
        },
        ..EngineConfig::default()
    };
    let engine = EngineHandle::start_with_draft(target, Some(draft), cfg).unwrap();
    Server::start(engine, ServerConfig { port: 0, ..ServerConfig::default() }).await
}

fn body(spec: Value) -> Value {
    json!({
        "messages": [{"role": "user", "content": "Hello there, tell me something"}],
        "temperature": 0, "max_tokens": 24, "ignore_eos": true, "return_token_ids": true,
        "speculative": spec,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speculation_is_per_request_reported_and_lossless() {
    let s = start().await;
    let (st, off) = s.post("/v1/chat/completions", &body(json!({"method": "off"}))).await;
    assert_eq!(st, 200, "{off}");
    assert!(off["usage"].get("speculative").is_none(), "{off}");
    let (st, on) = s.post("/v1/chat/completions", &body(json!({"method": "draft", "num_draft_tokens": 2}))).await;
    assert_eq!(st, 200, "{on}");
    assert_eq!(on["choices"][0]["token_ids"], off["choices"][0]["token_ids"]);
    let sp = &on["usage"]["speculative"];
    assert!(sp["drafted_tokens"].as_u64().unwrap() > 0, "{on}");
    // The draft model is the target itself: every draft is accepted, 3 tokens per step but
    // the last (23 tokens after the first: 7 steps of 3, one of 2).
    assert_eq!(sp["acceptance_rate"], 1.0, "{sp}");
    assert_eq!(sp["mean_accepted_length"], 23.0 / 8.0, "{sp}");
    let (st, ngram) = s.post("/v1/chat/completions", &body(json!({"method": "ngram"}))).await;
    assert_eq!(st, 200);
    assert_eq!(ngram["choices"][0]["token_ids"], off["choices"][0]["token_ids"]);

    let (st, err) = s.post("/v1/chat/completions", &body(json!({"method": "mtp"}))).await;
    assert_error(st, &err, 400, "mtp on a model without an MTP head");
    let (st, err) = s.post("/v1/chat/completions", &body(json!({"method": "telepathy"}))).await;
    assert!(st == 400 || st == 422, "{st} {err}");

    let metrics = reqwest::get(s.url("/metrics")).await.unwrap().text().await.unwrap();
    let line = metrics.lines().find(|l| l.starts_with("tandem_spec_drafted_tokens_total ")).unwrap();
    assert!(line.split(' ').nth(1).unwrap().parse::<f64>().unwrap() > 0.0, "{line}");
    assert!(metrics.contains("tandem_spec_position_acceptance_rate{position=\"0\"} 1"), "{metrics}");
}

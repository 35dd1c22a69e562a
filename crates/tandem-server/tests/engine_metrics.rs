//! `/metrics` and the engine's memory over real sockets on the tiny Qwen2 fixture: a repeated
//! chat reports cached prompt tokens and the Prometheus text shows the prefix hits; 32
//! concurrent streaming clients, a quarter of them disconnecting early, all either complete or
//! are cancelled, and afterwards every KV block not held by the prefix cache and every state
//! slot is free again.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{chunks, sse_data, Server};
use serde_json::{json, Value};
use tandem_engine::{EngineConfig, EngineHandle};
use tandem_server::ServerConfig;

const MODEL: &str = "tiny-qwen2";

async fn start() -> (Server, EngineHandle) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny/qwen2");
    let engine =
        EngineHandle::load(&path, EngineConfig { model_id: MODEL.into(), ..EngineConfig::default() }).expect("engine");
    let cfg = ServerConfig { port: 0, default_max_tokens: 32, ..ServerConfig::default() };
    (Server::start(engine.clone(), cfg).await, engine)
}

fn chat(user: &str, max_tokens: usize, stream: bool) -> Value {
    json!({
        "model": MODEL,
        "messages": [{"role": "system", "content": "You are a careful assistant with tools."}, {"role": "user", "content": user}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": stream,
    })
}

async fn metrics(s: &Server) -> (String, HashMap<String, f64>) {
    let resp = s.client.get(s.url("/metrics")).send().await.expect("send");
    assert_eq!(resp.status().as_u16(), 200);
    let ctype = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    assert!(ctype.starts_with("text/plain"), "{ctype}");
    let text = resp.text().await.expect("body");
    let values = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(' ').and_then(|(k, v)| Some((k.to_string(), v.parse().ok()?))))
        .collect();
    (text, values)
}

async fn wait_for_no_leaks(e: &EngineHandle) {
    let s = e.stats();
    let t = Instant::now();
    loop {
        let l = |a: &std::sync::atomic::AtomicUsize| a.load(Ordering::Relaxed);
        if l(&s.running) == 0
            && l(&s.waiting) == 0
            && l(&s.kv_bytes) == 0
            && s.kv_blocks_used() == l(&s.prefix_cache_blocks)
            && l(&s.state_slots_free) == l(&s.state_slots_total)
        {
            return;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "engine memory did not return to baseline: {s:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_chat_is_served_from_the_prefix_cache_and_metrics_show_it() {
    let (s, e) = start().await;
    let (st, first) =
        s.post("/v1/chat/completions", &chat("Tell me about caches, please, in some detail.", 8, false)).await;
    assert_eq!(st, 200, "{first}");
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let (_, second) =
        s.post("/v1/chat/completions", &chat("Tell me about caches, please, in some detail.", 8, false)).await;
    assert_eq!(second["choices"][0]["message"], first["choices"][0]["message"]);
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached >= 16, "{second}");
    wait_for_no_leaks(&e).await;
    let (text, m) = metrics(&s).await;
    assert_eq!(m["tandem_prefix_hit_tokens_total"], cached as f64, "{text}");
    assert!(m["tandem_prefix_hit_ratio"] > 0.0 && m["tandem_prefix_hit_ratio"] < 1.0);
    assert_eq!(m["tandem_requests_running"], 0.0);
    assert!(m["tandem_kv_blocks_total"] > 0.0);
    assert_eq!(m["tandem_kv_blocks_used"], m["tandem_prefix_cache_blocks"]);
    assert_eq!(m["tandem_requests_finished_total"], 2.0);
    for name in ["tandem_requests_waiting", "tandem_kv_blocks_free", "tandem_checkpoints", "tandem_preemptions_total"] {
        assert!(m.contains_key(name), "{name} missing:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_streams_with_disconnects_return_memory_to_baseline() {
    let (s, e) = start().await;
    let mut tasks = Vec::new();
    for i in 0..32 {
        let (client, url) = (s.client.clone(), s.url("/v1/chat/completions"));
        let body = chat(&format!("Question number {i}: what is {} plus {}?", i * 7, i % 5), 24 + i % 9, true);
        tasks.push(tokio::spawn(async move {
            let mut resp = client.post(url).json(&body).send().await.expect("send");
            assert_eq!(resp.status().as_u16(), 200);
            if i % 4 == 3 {
                // Read one chunk, then hang up.
                let _ = resp.chunk().await;
                return None;
            }
            let text = resp.text().await.expect("body");
            Some(chunks(&sse_data(&text)))
        }));
    }
    let mut completed = 0;
    for t in tasks {
        if let Some(chunks) = t.await.expect("client task") {
            let last =
                chunks.iter().rev().find(|c| c["choices"].get(0).is_some_and(|ch| !ch["finish_reason"].is_null()));
            assert!(last.is_some(), "a surviving stream must finish");
            completed += 1;
        }
    }
    assert_eq!(completed, 24);
    wait_for_no_leaks(&e).await;
    let (_, m) = metrics(&s).await;
    assert_eq!(m["tandem_requests_running"] + m["tandem_requests_waiting"], 0.0);
    assert_eq!(m["tandem_state_slots_free"], m["tandem_state_slots_total"]);
    assert_eq!(m["tandem_requests_finished_total"] + m["tandem_requests_cancelled_total"], 32.0);
}

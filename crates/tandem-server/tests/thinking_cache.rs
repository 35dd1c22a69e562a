//! The thinking-budget continuation on the real engine: after the driver closes the reasoning
//! block it submits prompt + reasoning + transition as a new request, and that request finds its
//! prefix in the prefix cache. The fixtures' chat templates do not open a `<think>` block, so a
//! thin [`Backend`] wrapper appends one to the rendered prompt (as Qwen3 templates do with
//! `enable_thinking`); everything else is the real engine.
//!
//! Attention-only model (tiny Qwen2): every full KV block of prompt + reasoning is reused.
//! Hybrid model (tiny Qwen3.5, recurrent layers): the continuation resumes at the recurrent-state
//! checkpoint the cancelled first request kept at the last block boundary it reached while
//! thinking, and recomputes only the tokens after it.

mod common;

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use common::Server;
use serde_json::{json, Value};
use tandem_engine::engine::ModelInfo;
use tandem_engine::{EngineConfig, EngineHandle, EngineStats, GenerateRequest, GenerationEvent, SubmitError};
use tandem_server::{Backend, ChatRenderOptions, RenderedChat, ServerConfig};
use tokio::sync::mpsc;

/// The real engine, with a chat template that opens the reasoning block.
struct Thinking(EngineHandle);

impl Backend for Thinking {
    fn info(&self) -> &ModelInfo {
        Backend::info(&self.0)
    }
    fn tokenize(&self, text: &str, add_bos: bool) -> Result<Vec<u32>, String> {
        Backend::tokenize(&self.0, text, add_bos)
    }
    fn add_bos_by_default(&self) -> bool {
        Backend::add_bos_by_default(&self.0)
    }
    fn bos_token(&self) -> Option<String> {
        Backend::bos_token(&self.0)
    }
    fn render_chat(&self, messages: &[Value], opts: &ChatRenderOptions) -> Result<RenderedChat, String> {
        let mut r = Backend::render_chat(&self.0, messages, opts)?;
        r.text.push_str("<think>\n");
        Ok(r)
    }
    fn submit(&self, req: GenerateRequest) -> Result<mpsc::Receiver<GenerationEvent>, SubmitError> {
        Backend::submit(&self.0, req)
    }
    fn stats(&self) -> Option<&EngineStats> {
        Backend::stats(&self.0)
    }
}

const BUDGET: usize = 40;

/// Tokens per KV block (the engine's default).
fn block() -> usize {
    EngineConfig::default().block_size
}

/// Serves `fixture` behind [`Thinking`] and runs one chat request whose reasoning hits the
/// budget. Returns the response and the engine's prefix-cache hit tokens (the continuation's:
/// the engine is fresh, so the first request has none).
async fn budget_cut(fixture: &str) -> (Value, usize) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(fixture);
    let engine = EngineHandle::load(&dir, EngineConfig { model_id: "tiny".into(), ..EngineConfig::default() })
        .unwrap_or_else(|e| panic!("load {fixture}: {e}"));
    let stats_engine = engine.clone();
    let s = Server::start(Thinking(engine), ServerConfig { port: 0, ..ServerConfig::default() }).await;
    let body = json!({
        "messages": [
            {"role": "system", "content": "You are a careful assistant. Think step by step before answering."},
            {"role": "user", "content": "How many prime numbers are there below one hundred?"}
        ],
        "temperature": 0, "ignore_eos": true, "max_tokens": 6, "max_thinking_tokens": BUDGET,
        "return_token_ids": true,
    });
    let (st, v) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(st, 200, "{fixture}: {v}");
    let hits = stats_engine.stats().prefix_hit_tokens.load(Ordering::SeqCst);
    (v, hits)
}

/// The budget path was taken; returns (prompt tokens, reported cached tokens).
fn check_cut(fixture: &str, v: &Value) -> (usize, usize) {
    let m = &v["choices"][0]["message"];
    let reasoning = m["reasoning_content"].as_str().unwrap_or_else(|| panic!("{fixture}: no reasoning: {v}"));
    assert!(reasoning.ends_with("now the answer."), "{fixture}: the budget closed the block: {reasoning:?}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{fixture}: {v}");
    let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() as usize;
    let ids = v["choices"][0]["token_ids"].as_array().unwrap().len();
    assert_eq!(v["usage"]["completion_tokens"], ids, "{fixture}: {v}");
    assert!(ids > BUDGET, "{fixture}: reasoning + transition + answer: {v}");
    (prompt, cached)
}

#[tokio::test]
async fn continuation_reuses_prompt_and_reasoning_blocks_on_attention_models() {
    let (v, hits) = budget_cut("tiny/qwen2").await;
    let (prompt, cached) = check_cut("qwen2", &v);
    // The continuation's prompt is prompt + BUDGET reasoning tokens + transition; the first
    // request committed at least the blocks below prompt + BUDGET - 1 (the last sampled token
    // may not have been fed before it was cancelled).
    let reused_at_least = (prompt + BUDGET - 1) / block() * block();
    assert!(hits >= reused_at_least && hits > prompt, "hits {hits}, prompt {prompt}: the reasoning was reused");
    // Usage reports it, capped at the original prompt.
    assert_eq!(cached, prompt, "{v}");
}

#[tokio::test]
async fn continuation_resumes_inside_the_reasoning_on_hybrid_models() {
    let (v, hits) = budget_cut("hybrid/qwen3_5").await;
    let (prompt, cached) = check_cut("qwen3_5", &v);
    // Recurrent state exists only at checkpoints; the cancelled first request left one at the
    // last block boundary it reached while thinking, so the continuation resumes there.
    let last_boundary = (prompt + BUDGET - 1) / block() * block();
    assert!(last_boundary > prompt, "the reasoning crosses a block boundary");
    assert_eq!(hits, last_boundary, "prompt {prompt}");
    assert_eq!(cached, prompt, "{v}");
}

//! A scripted backend: bytes are tokens, the template is ChatML, and the prompt text picks the
//! behaviour (`QUEUEFULL`, `ERRFIRST`, `ERRMID`, `SLOW`; otherwise it answers "Héllo, wörld!"
//! one byte per token, so 'é' and 'ö' each take a token with empty text).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tandem_engine::engine::ModelInfo;
use tandem_engine::{
    FinishReason, GenerateRequest, GenerationEvent, PositionLogprobs, SubmitError, Timings, TokenLogprob, Usage,
};
use tandem_server::{Backend, ChatRenderOptions, RenderedChat};
use tokio::sync::mpsc;

pub const ANSWER: &str = "Héllo, wörld!";
pub const BOS: u32 = 1;

#[derive(Default)]
pub struct Shared {
    pub requests: Mutex<Vec<GenerateRequest>>,
    pub cancelled: AtomicBool,
}

#[derive(Clone)]
pub struct Fake {
    pub info: ModelInfo,
    pub shared: Arc<Shared>,
}

impl Fake {
    pub fn new(context_length: usize) -> Self {
        Self {
            info: ModelInfo { id: "fake-model".into(), context_length, vocab_size: 300, created: 1_700_000_000 },
            shared: Arc::default(),
        }
    }

    pub fn last_request(&self) -> GenerateRequest {
        self.shared.requests.lock().unwrap().last().cloned().expect("a request was submitted")
    }
}

fn byte_id(b: u8) -> u32 {
    b as u32 + 10
}

fn decode(ids: &[u32]) -> String {
    let bytes: Vec<u8> = ids.iter().filter(|&&i| (10..266).contains(&i)).map(|&i| (i - 10) as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

impl Backend for Fake {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn tokenize(&self, text: &str, add_bos: bool) -> Result<Vec<u32>, String> {
        let mut ids = if add_bos { vec![BOS] } else { vec![] };
        ids.extend(text.bytes().map(byte_id));
        Ok(ids)
    }

    fn add_bos_by_default(&self) -> bool {
        true
    }

    fn bos_token(&self) -> Option<String> {
        Some("<s>".into())
    }

    fn render_chat(&self, messages: &[Value], opts: &ChatRenderOptions) -> Result<RenderedChat, String> {
        let mut out = RenderedChat::default();
        for m in messages {
            let role = m["role"].as_str().ok_or("role")?;
            let content = m["content"].as_str().ok_or("content")?;
            out.text.push_str(&format!("<|im_start|>{role}\n{content}<|im_end|>\n"));
            out.message_ends.push(out.text.len());
        }
        if opts.add_generation_prompt {
            out.text.push_str("<|im_start|>assistant\n");
        }
        Ok(out)
    }

    fn submit(&self, req: GenerateRequest) -> Result<mpsc::Receiver<GenerationEvent>, SubmitError> {
        let prompt = decode(&req.prompt_ids);
        if prompt.contains("QUEUEFULL") {
            return Err(SubmitError::QueueFull);
        }
        if req.prompt_ids.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
        self.shared.requests.lock().unwrap().push(req.clone());
        let (tx, rx) = mpsc::channel(4);
        let shared = self.shared.clone();
        tokio::spawn(async move {
            let usage = |n| Usage {
                prompt_tokens: req.prompt_ids.len(),
                completion_tokens: n,
                cached_tokens: 0,
                ..Default::default()
            };
            if prompt.contains("ERRFIRST") {
                let _ = tx.send(GenerationEvent::Error("scripted failure".into())).await;
                return;
            }
            let slow = prompt.contains("SLOW");
            let bytes: Vec<u8> = if slow { b"ab".repeat(10_000) } else { ANSWER.as_bytes().to_vec() };
            let mut pending = Vec::new();
            let mut n = 0;
            for &b in &bytes {
                if n == req.stop.max_tokens {
                    let text = String::from_utf8_lossy(&pending).into_owned();
                    let done = GenerationEvent::Finished {
                        reason: FinishReason::Length,
                        text,
                        stop_string: None,
                        usage: usage(n),
                        timings: Timings::default(),
                    };
                    let _ = tx.send(done).await;
                    return;
                }
                if prompt.contains("ERRMID") && n == 2 {
                    let _ = tx.send(GenerationEvent::Error("scripted mid-stream failure".into())).await;
                    return;
                }
                pending.push(b);
                let text = match std::str::from_utf8(&pending) {
                    Ok(s) => {
                        let s = s.to_string();
                        pending.clear();
                        s
                    }
                    Err(_) => String::new(),
                };
                let id = byte_id(b);
                let logprobs = req.logprobs.map(|k| PositionLogprobs {
                    chosen: TokenLogprob { id, text: text.clone(), logprob: -0.25 },
                    top: (0..k as u32)
                        .map(|i| TokenLogprob { id: 10 + i, text: format!("t{i}"), logprob: -0.25 - i as f32 })
                        .collect(),
                });
                if tx.send(GenerationEvent::Token { id, text, logprobs }).await.is_err() {
                    shared.cancelled.store(true, Ordering::SeqCst);
                    return;
                }
                n += 1;
                if slow {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            let done = GenerationEvent::Finished {
                reason: FinishReason::Stop,
                text: String::new(),
                stop_string: None,
                usage: usage(n),
                timings: Timings::default(),
            };
            let _ = tx.send(done).await;
        });
        Ok(rx)
    }
}

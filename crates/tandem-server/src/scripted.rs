//! A backend that replays scripted answers, for end-to-end tests of the API surface with the
//! official client libraries (hidden `tandem serve --test-script FILE`). A real model with random
//! weights cannot be made to write a tool call or a reasoning block; this backend can, while the
//! HTTP layer, chat-template rendering (minijinja, the real [`ChatTemplate`]), output parsing and
//! thinking driver are the production ones.
//!
//! Tokens are bytes (id = byte + 3). The answer is the `reply` of the rule whose `when` text
//! occurs latest in the rendered prompt (so in a multi-step conversation the newest message
//! decides), else `default_reply`. Replies stream one byte-token at a time and honour
//! `max_tokens`, stop strings (with the engine's matcher, reporting the one that matched) and
//! cancellation. The script is JSON:
//!
//! ```json
//! {"model": "scripted", "context_length": 8192, "chat_template": "…optional…",
//!  "rules": [{"when": "weather", "reply": "<tool_call>…</tool_call>"}], "default_reply": "Hello."}
//! ```

use serde::Deserialize;
use serde_json::Value;
use tandem_engine::engine::ModelInfo;
use tandem_engine::stop::StopStringMatcher;
use tandem_engine::{FinishReason, GenerateRequest, GenerationEvent, SubmitError, Timings, Usage};
use tandem_model::chat_template::{ChatTemplate, RenderOptions};
use tokio::sync::mpsc;

use crate::backend::{Backend, ChatRenderOptions, RenderedChat};

/// A Qwen3-style ChatML template with Hermes tool calls and `<think>` support.
pub const DEFAULT_TEMPLATE: &str = r#"{%- set sys = messages[0].content if messages and messages[0].role == 'system' else '' -%}
{%- if tools -%}
{{- '<|im_start|>system\n' + sys + ('\n\n' if sys else '') + '# Tools\n\n<tools>' -}}
{%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
{{- '\n</tools>\n\nFor each function call, return a json object within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif sys -%}
{{- '<|im_start|>system\n' + sys + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
{%- if message.role == 'system' and loop.first -%}
{%- elif message.role == 'assistant' -%}
{{- '<|im_start|>assistant\n' -}}
{%- if message.reasoning_content -%}{{- '<think>\n' + message.reasoning_content + '\n</think>\n\n' -}}{%- endif -%}
{{- message.content or '' -}}
{%- for tc in (message.tool_calls or []) -%}
{{- '\n<tool_call>\n{"name": "' + tc.function.name + '", "arguments": ' + (tc.function.arguments | tojson) + '}\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- elif message.role == 'tool' -%}
{{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' -}}
{%- else -%}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- if enable_thinking is defined and enable_thinking -%}{{- '<think>\n' -}}{%- endif -%}
{%- endif -%}"#;

#[derive(Debug, Clone, Deserialize)]
pub struct Rule {
    pub when: String,
    pub reply: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Script {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub context_length: Option<usize>,
    #[serde(default)]
    pub chat_template: Option<String>,
    #[serde(default)]
    pub rules: Vec<Rule>,
    #[serde(default)]
    pub default_reply: Option<String>,
}

/// The scripted backend.
pub struct ScriptedBackend {
    info: ModelInfo,
    template: ChatTemplate,
    script: Script,
}

const OFFSET: u32 = 3;

impl ScriptedBackend {
    pub fn new(script: Script) -> anyhow::Result<Self> {
        let source = script.chat_template.clone().unwrap_or_else(|| DEFAULT_TEMPLATE.to_string());
        let template = ChatTemplate::new(&source, None, Some("<|im_end|>".into()))?;
        let info = ModelInfo {
            id: script.model.clone().unwrap_or_else(|| "scripted".into()),
            context_length: script.context_length.unwrap_or(8192),
            vocab_size: 256 + OFFSET as usize,
            created: crate::response_meta::unix_now(),
        };
        Ok(Self { info, template, script })
    }

    /// Reads a script file.
    pub fn from_file(path: &std::path::Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        let script: Script = serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        Self::new(script)
    }

    /// The reply for a rendered prompt.
    pub fn reply_for(&self, prompt: &str) -> String {
        self.script
            .rules
            .iter()
            .filter_map(|r| prompt.rfind(&r.when).map(|pos| (pos, r)))
            .max_by_key(|(pos, _)| *pos)
            .map(|(_, r)| r.reply.clone())
            .or_else(|| self.script.default_reply.clone())
            .unwrap_or_else(|| "Hello from the scripted backend.".into())
    }
}

fn decode(ids: &[u32]) -> String {
    let bytes: Vec<u8> = ids.iter().filter_map(|&i| i.checked_sub(OFFSET).and_then(|b| u8::try_from(b).ok())).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

impl Backend for ScriptedBackend {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn tokenize(&self, text: &str, _add_bos: bool) -> Result<Vec<u32>, String> {
        Ok(text.bytes().map(|b| u32::from(b) + OFFSET).collect())
    }

    fn add_bos_by_default(&self) -> bool {
        false
    }

    fn bos_token(&self) -> Option<String> {
        None
    }

    fn render_chat(&self, messages: &[Value], opts: &ChatRenderOptions) -> Result<RenderedChat, String> {
        let ro = RenderOptions {
            add_generation_prompt: opts.add_generation_prompt,
            tools: opts.tools.clone(),
            extra: opts.extra.clone(),
        };
        let r = self.template.render(messages, &ro).map_err(|e| e.to_string())?;
        Ok(RenderedChat { text: r.text, message_ends: r.message_ends })
    }

    fn chat_template_source(&self) -> Option<String> {
        Some(self.template.source().to_string())
    }

    fn submit(&self, req: GenerateRequest) -> Result<mpsc::Receiver<GenerationEvent>, SubmitError> {
        if req.prompt_ids.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
        if req.prompt_ids.len() + req.stop.max_tokens > self.info.context_length {
            return Err(SubmitError::MaxTokensTooLarge {
                prompt: req.prompt_ids.len(),
                max_tokens: req.stop.max_tokens,
                context: self.info.context_length,
            });
        }
        let reply = self.reply_for(&decode(&req.prompt_ids));
        let (tx, rx) = mpsc::channel(8);
        tokio::spawn(async move {
            let mut stops = StopStringMatcher::new(&req.stop.stop_strings);
            let prompt_tokens = req.prompt_ids.len();
            // The last event: held-back text, and the stop string if one matched.
            let end = move |stops: &mut StopStringMatcher, reason, tail: &str, n| {
                let (mut text, matched) = stops.push(tail);
                if !matched {
                    text.push_str(&stops.flush());
                }
                let stop_string = stops.matched_stop().map(str::to_owned);
                GenerationEvent::Finished {
                    reason: if stop_string.is_some() { FinishReason::Stop } else { reason },
                    text,
                    stop_string,
                    usage: Usage { prompt_tokens, completion_tokens: n, cached_tokens: 0, ..Default::default() },
                    timings: Timings::default(),
                }
            };
            let mut pending = Vec::new();
            let mut n = 0;
            for b in reply.bytes() {
                if n == req.stop.max_tokens {
                    let tail = String::from_utf8_lossy(&pending).into_owned();
                    let _ = tx.send(end(&mut stops, FinishReason::Length, &tail, n)).await;
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
                let (text, matched) = stops.push(&text);
                if tx.send(GenerationEvent::Token { id: u32::from(b) + OFFSET, text, logprobs: None }).await.is_err() {
                    return;
                }
                n += 1;
                if matched {
                    break;
                }
            }
            let _ = tx.send(end(&mut stops, FinishReason::Stop, "", n)).await;
        });
        Ok(rx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn backend() -> ScriptedBackend {
        let script: Script = serde_json::from_value(json!({"rules": [
            {"when": "weather", "reply": "<tool_call>{}</tool_call>"},
            {"when": "<tool_response>", "reply": "It is sunny."}
        ]}))
        .unwrap();
        ScriptedBackend::new(script).unwrap()
    }

    #[test]
    fn template_renders_tools_calls_and_results() {
        let b = backend();
        let msgs = vec![
            json!({"role": "system", "content": "sys"}),
            json!({"role": "user", "content": "weather in Paris?"}),
            json!({"role": "assistant", "content": "", "reasoning_content": "hm", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}),
            json!({"role": "tool", "tool_call_id": "c", "content": "22C"}),
        ];
        let opts = ChatRenderOptions {
            add_generation_prompt: true,
            tools: Some(json!([{"type": "function", "function": {"name": "get_weather"}}])),
            extra: Default::default(),
            ..Default::default()
        };
        let r = b.render_chat(&msgs, &opts).unwrap();
        assert!(r.text.starts_with("<|im_start|>system\nsys\n\n# Tools\n\n<tools>\n{"), "{}", r.text);
        assert!(
            r.text.contains(
                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
            ),
            "{}",
            r.text
        );
        assert!(r.text.contains("<think>\nhm\n</think>"), "{}", r.text);
        assert!(
            r.text.ends_with("<tool_response>\n22C\n</tool_response><|im_end|>\n<|im_start|>assistant\n"),
            "{}",
            r.text
        );
        assert_eq!(b.reply_for(&r.text), "It is sunny.");
        assert_eq!(b.reply_for("weather?"), "<tool_call>{}</tool_call>");
        let mut extra = serde_json::Map::new();
        extra.insert("enable_thinking".into(), json!(true));
        let t = b
            .render_chat(
                &[json!({"role": "user", "content": "x"})],
                &ChatRenderOptions { add_generation_prompt: true, tools: None, extra, force_call: false },
            )
            .unwrap();
        assert!(t.text.ends_with("<|im_start|>assistant\n<think>\n"));
        assert_eq!(
            crate::tools::ToolFormat::detect(&b.chat_template_source().unwrap()),
            Some(crate::tools::ToolFormat::Hermes)
        );
    }
}

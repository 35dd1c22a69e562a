//! The chat response objects: `chat.completion` for whole answers and the
//! `chat.completion.chunk` stream format (role delta, content / `reasoning_content` /
//! `tool_calls` deltas, finish chunk, usage chunk). Generated text goes through the
//! [`OutputParser`] in both modes; an answer with tool calls finishes with `tool_calls`.

use serde::Serialize;
use tandem_engine::{FinishReason, PositionLogprobs, Usage};

use crate::generation::Completion;
use crate::logprobs::{ChatLogprobEntry, ChatLogprobs};
use crate::output::{OutEvent, OutputConfig, OutputParser, Parsed};
use crate::response_meta::{ResponseMeta, UsageBody};
use crate::sse::ChunkFormat;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ToolCallBody {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AssistantMessage {
    pub role: &'static str,
    /// `null` when the answer is only tool calls.
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallBody>,
}

impl AssistantMessage {
    pub fn from_parsed(p: Parsed) -> Self {
        let tool_calls: Vec<ToolCallBody> = p
            .calls
            .into_iter()
            .map(|c| ToolCallBody {
                id: c.id,
                kind: "function",
                function: FunctionCall { name: c.name, arguments: c.arguments },
            })
            .collect();
        let content = if p.content.is_empty() && !tool_calls.is_empty() { None } else { Some(p.content) };
        let reasoning_content = (!p.reasoning.is_empty()).then_some(p.reasoning);
        Self { role: "assistant", content, reasoning_content, tool_calls }
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChatChoice {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: &'static str,
    /// vLLM extension (`return_token_ids`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// A whole chat answer.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: UsageBody,
    /// vLLM extension (`return_token_ids`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}

impl ChatCompletion {
    /// `prompt_ids` is `Some` when the client asked for token ids; `logprobs` when it asked for
    /// log-probabilities; `output` says how to split the text.
    pub fn new(
        meta: ResponseMeta,
        done: Completion,
        output: &OutputConfig,
        prompt_ids: Option<Vec<u32>>,
        logprobs: bool,
    ) -> Self {
        let with_ids = prompt_ids.is_some();
        let message = AssistantMessage::from_parsed(Parsed::from_text(output, &done.text));
        // A call cut by the token limit is not a finished call: `length` says so.
        let finish_reason = if message.tool_calls.is_empty() || done.finish_reason == FinishReason::Length {
            done.finish_reason.as_str()
        } else {
            "tool_calls"
        };
        Self {
            id: meta.id,
            object: "chat.completion",
            created: meta.created,
            model: meta.model,
            choices: vec![ChatChoice {
                index: 0,
                message,
                logprobs: logprobs.then(|| ChatLogprobs::from_positions(&done.logprobs)),
                finish_reason,
                token_ids: with_ids.then_some(done.token_ids),
            }],
            usage: UsageBody::from(&done.usage),
            prompt_token_ids: prompt_ids,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionDelta,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallDelta>,
}

impl Delta {
    /// The delta of a run of parsed output events.
    pub fn from_events(events: Vec<OutEvent>) -> Self {
        let mut d = Delta::default();
        for e in events {
            match e {
                OutEvent::Reasoning(s) => d.reasoning_content.get_or_insert_with(String::new).push_str(&s),
                OutEvent::Content(s) => d.content.get_or_insert_with(String::new).push_str(&s),
                OutEvent::ToolStart { index, id, name } => d.tool_calls.push(ToolCallDelta {
                    index,
                    id: Some(id),
                    kind: Some("function"),
                    function: FunctionDelta { name: Some(name), arguments: String::new() },
                }),
                OutEvent::ToolArgs { index, fragment } => match d.tool_calls.last_mut() {
                    Some(t) if t.index == index => t.function.arguments.push_str(&fragment),
                    _ => d.tool_calls.push(ToolCallDelta {
                        index,
                        id: None,
                        kind: None,
                        function: FunctionDelta { name: None, arguments: fragment },
                    }),
                },
            }
        }
        d
    }

    fn is_empty(&self) -> bool {
        self.role.is_none() && self.content.is_none() && self.reasoning_content.is_none() && self.tool_calls.is_empty()
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChatChunk<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: Vec<ChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageBody>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// Streams chat chunks for one response.
pub struct ChatChunks {
    meta: ResponseMeta,
    /// `Some` when the client asked for token ids (taken by the opening chunk).
    prompt_ids: Option<Vec<u32>>,
    return_token_ids: bool,
    logprobs: bool,
    parser: OutputParser,
}

impl ChatChunks {
    pub fn new(meta: ResponseMeta, output: &OutputConfig, prompt_ids: Option<Vec<u32>>, logprobs: bool) -> Self {
        Self { meta, return_token_ids: prompt_ids.is_some(), prompt_ids, logprobs, parser: OutputParser::new(output) }
    }

    fn chunk(&self, choices: Vec<ChunkChoice>, usage: Option<UsageBody>, prompt_token_ids: Option<Vec<u32>>) -> String {
        let chunk = ChatChunk {
            id: &self.meta.id,
            object: "chat.completion.chunk",
            created: self.meta.created,
            model: &self.meta.model,
            choices,
            usage,
            prompt_token_ids,
        };
        serde_json::to_string(&chunk).unwrap_or_default()
    }
}

impl ChunkFormat for ChatChunks {
    fn opening(&mut self) -> Option<String> {
        let choice = ChunkChoice {
            index: 0,
            delta: Delta { role: Some("assistant"), content: Some(String::new()), ..Delta::default() },
            logprobs: None,
            finish_reason: None,
            token_ids: None,
        };
        let prompt_ids = self.prompt_ids.take();
        Some(self.chunk(vec![choice], None, prompt_ids))
    }

    fn token(&mut self, id: u32, text: &str, logprobs: Option<&PositionLogprobs>) -> Option<String> {
        let logprobs = logprobs.filter(|_| self.logprobs);
        let delta = Delta::from_events(self.parser.push(text));
        if delta.is_empty() && logprobs.is_none() && !self.return_token_ids {
            return None;
        }
        let choice = ChunkChoice {
            index: 0,
            delta,
            logprobs: logprobs.map(|p| ChatLogprobs { content: vec![ChatLogprobEntry::new(p)] }),
            finish_reason: None,
            token_ids: self.return_token_ids.then(|| vec![id]),
        };
        Some(self.chunk(vec![choice], None, None))
    }

    fn finish(&mut self, reason: FinishReason, text: &str) -> String {
        let mut events = self.parser.push(text);
        events.extend(self.parser.finish());
        let finish =
            if self.parser.made_calls() && reason != FinishReason::Length { "tool_calls" } else { reason.as_str() };
        let choice = ChunkChoice {
            index: 0,
            delta: Delta::from_events(events),
            logprobs: None,
            finish_reason: Some(finish),
            token_ids: None,
        };
        self.chunk(vec![choice], None, None)
    }

    fn usage(&mut self, usage: &Usage) -> String {
        self.chunk(Vec::new(), Some(UsageBody::from(usage)), None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use tandem_engine::TokenLogprob;

    fn meta() -> ResponseMeta {
        ResponseMeta { id: "chatcmpl-x".into(), created: 5, model: "m".into() }
    }

    fn parse(s: &str) -> Value {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn whole_completion_shape() {
        let done = Completion {
            text: "hi".into(),
            token_ids: vec![7, 8],
            logprobs: vec![],
            finish_reason: FinishReason::Stop,
            stop_string: None,
            usage: Usage { prompt_tokens: 3, completion_tokens: 2, cached_tokens: 0, ..Default::default() },
        };
        let out = OutputConfig::default();
        let v = serde_json::to_value(ChatCompletion::new(meta(), done.clone(), &out, None, false)).unwrap();
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["choices"][0]["message"], serde_json::json!({"role": "assistant", "content": "hi"}));
        assert!(v["choices"][0]["logprobs"].is_null());
        assert!(v["choices"][0].get("token_ids").is_none());
        assert_eq!(v["usage"]["total_tokens"], 5);
        let v = serde_json::to_value(ChatCompletion::new(meta(), done, &out, Some(vec![1, 2, 3]), true)).unwrap();
        assert_eq!(v["choices"][0]["token_ids"], serde_json::json!([7, 8]));
        assert_eq!(v["prompt_token_ids"], serde_json::json!([1, 2, 3]));
        assert_eq!(v["choices"][0]["logprobs"]["content"], serde_json::json!([]));
    }

    #[test]
    fn chunk_sequence() {
        let mut f = ChatChunks::new(meta(), &OutputConfig::default(), None, true);
        let open = parse(&f.opening().unwrap());
        assert_eq!(open["object"], "chat.completion.chunk");
        assert_eq!(open["choices"][0]["delta"]["role"], "assistant");
        assert!(f.token(1, "", None).is_none());
        let lp = PositionLogprobs { chosen: TokenLogprob { id: 1, text: "a".into(), logprob: -0.1 }, top: vec![] };
        let t = parse(&f.token(1, "a", Some(&lp)).unwrap());
        assert_eq!(t["choices"][0]["delta"], serde_json::json!({"content": "a"}));
        assert_eq!(t["choices"][0]["logprobs"]["content"][0]["token"], "a");
        let fin = parse(&f.finish(FinishReason::Length, ""));
        assert_eq!(fin["choices"][0]["finish_reason"], "length");
        assert_eq!(fin["choices"][0]["delta"], serde_json::json!({}));
        let u =
            parse(&f.usage(&Usage { prompt_tokens: 1, completion_tokens: 1, cached_tokens: 0, ..Default::default() }));
        assert_eq!(u["choices"], serde_json::json!([]));
        assert_eq!(u["usage"]["total_tokens"], 2);
    }

    #[test]
    fn token_ids_in_chunks() {
        let mut f = ChatChunks::new(meta(), &OutputConfig::default(), Some(vec![4, 5]), false);
        assert_eq!(parse(&f.opening().unwrap())["prompt_token_ids"], serde_json::json!([4, 5]));
        let t = parse(&f.token(9, "", None).unwrap());
        assert_eq!(t["choices"][0]["token_ids"], serde_json::json!([9]));
        assert!(t["choices"][0]["logprobs"].is_null());
    }

    #[test]
    fn tool_calls_and_reasoning() {
        use crate::tools::{ToolFormat, ToolSchemas};
        let out = OutputConfig {
            reasoning_inside: false,
            parse_reasoning: true,
            tools: Some((ToolFormat::Hermes, ToolSchemas::default(), true)),
        };
        let text = "<think>\nhm\n</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";
        let done = Completion {
            text: text.into(),
            token_ids: vec![],
            logprobs: vec![],
            finish_reason: FinishReason::Stop,
            stop_string: None,
            usage: Usage::default(),
        };
        let v = serde_json::to_value(ChatCompletion::new(meta(), done, &out, None, false)).unwrap();
        let m = &v["choices"][0]["message"];
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
        assert!(m["content"].is_null());
        assert_eq!(m["reasoning_content"], "hm");
        assert_eq!(m["tool_calls"][0]["type"], "function");
        assert_eq!(m["tool_calls"][0]["function"], serde_json::json!({"name": "f", "arguments": "{\"a\": 1}"}));

        let mut f = ChatChunks::new(meta(), &out, None, false);
        let mut deltas = Vec::new();
        for ch in text.chars() {
            deltas.extend(f.token(0, &ch.to_string(), None).map(|c| parse(&c)["choices"][0]["delta"].clone()));
        }
        let fin = parse(&f.finish(FinishReason::Stop, ""));
        assert_eq!(fin["choices"][0]["finish_reason"], "tool_calls");
        deltas.push(fin["choices"][0]["delta"].clone());
        let reasoning: String = deltas.iter().filter_map(|d| d["reasoning_content"].as_str()).collect();
        assert_eq!(reasoning, "hm");
        let calls: Vec<&Value> = deltas.iter().filter_map(|d| d["tool_calls"].as_array()).flatten().collect();
        assert_eq!(calls[0]["function"]["name"], "f");
        assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
        let args: String = calls.iter().filter_map(|c| c["function"]["arguments"].as_str()).collect();
        assert_eq!(args, "{\"a\": 1}");
    }
}

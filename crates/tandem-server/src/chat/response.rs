//! The chat response objects: `chat.completion` for whole answers and the
//! `chat.completion.chunk` stream format (role delta, content deltas, finish chunk, usage chunk).

use serde::Serialize;
use tandem_engine::{FinishReason, PositionLogprobs, Usage};

use crate::generation::Completion;
use crate::logprobs::{ChatLogprobEntry, ChatLogprobs};
use crate::response_meta::{ResponseMeta, UsageBody};
use crate::sse::ChunkFormat;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AssistantMessage {
    pub role: &'static str,
    pub content: String,
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
    /// log-probabilities.
    pub fn new(meta: ResponseMeta, done: Completion, prompt_ids: Option<Vec<u32>>, logprobs: bool) -> Self {
        let with_ids = prompt_ids.is_some();
        Self {
            id: meta.id,
            object: "chat.completion",
            created: meta.created,
            model: meta.model,
            choices: vec![ChatChoice {
                index: 0,
                message: AssistantMessage { role: "assistant", content: done.text },
                logprobs: logprobs.then(|| ChatLogprobs::from_positions(&done.logprobs)),
                finish_reason: done.finish_reason.as_str(),
                token_ids: with_ids.then_some(done.token_ids),
            }],
            usage: UsageBody::from(&done.usage),
            prompt_token_ids: prompt_ids,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
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
}

impl ChatChunks {
    pub fn new(meta: ResponseMeta, prompt_ids: Option<Vec<u32>>, logprobs: bool) -> Self {
        Self { meta, return_token_ids: prompt_ids.is_some(), prompt_ids, logprobs }
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
            delta: Delta { role: Some("assistant"), content: Some(String::new()) },
            logprobs: None,
            finish_reason: None,
            token_ids: None,
        };
        let prompt_ids = self.prompt_ids.take();
        Some(self.chunk(vec![choice], None, prompt_ids))
    }

    fn token(&mut self, id: u32, text: &str, logprobs: Option<&PositionLogprobs>) -> Option<String> {
        let logprobs = logprobs.filter(|_| self.logprobs);
        if text.is_empty() && logprobs.is_none() && !self.return_token_ids {
            return None;
        }
        let choice = ChunkChoice {
            index: 0,
            delta: Delta { role: None, content: Some(text.to_string()) },
            logprobs: logprobs.map(|p| ChatLogprobs { content: vec![ChatLogprobEntry::new(p)] }),
            finish_reason: None,
            token_ids: self.return_token_ids.then(|| vec![id]),
        };
        Some(self.chunk(vec![choice], None, None))
    }

    fn finish(&mut self, reason: FinishReason, text: &str) -> String {
        let choice = ChunkChoice {
            index: 0,
            delta: Delta { role: None, content: (!text.is_empty()).then(|| text.to_string()) },
            logprobs: None,
            finish_reason: Some(reason.as_str()),
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
            usage: Usage { prompt_tokens: 3, completion_tokens: 2, cached_tokens: 0 },
        };
        let v = serde_json::to_value(ChatCompletion::new(meta(), done.clone(), None, false)).unwrap();
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["choices"][0]["message"], serde_json::json!({"role": "assistant", "content": "hi"}));
        assert!(v["choices"][0]["logprobs"].is_null());
        assert!(v["choices"][0].get("token_ids").is_none());
        assert_eq!(v["usage"]["total_tokens"], 5);
        let v = serde_json::to_value(ChatCompletion::new(meta(), done, Some(vec![1, 2, 3]), true)).unwrap();
        assert_eq!(v["choices"][0]["token_ids"], serde_json::json!([7, 8]));
        assert_eq!(v["prompt_token_ids"], serde_json::json!([1, 2, 3]));
        assert_eq!(v["choices"][0]["logprobs"]["content"], serde_json::json!([]));
    }

    #[test]
    fn chunk_sequence() {
        let mut f = ChatChunks::new(meta(), None, true);
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
        let u = parse(&f.usage(&Usage { prompt_tokens: 1, completion_tokens: 1, cached_tokens: 0 }));
        assert_eq!(u["choices"], serde_json::json!([]));
        assert_eq!(u["usage"]["total_tokens"], 2);
    }

    #[test]
    fn token_ids_in_chunks() {
        let mut f = ChatChunks::new(meta(), Some(vec![4, 5]), false);
        assert_eq!(parse(&f.opening().unwrap())["prompt_token_ids"], serde_json::json!([4, 5]));
        let t = parse(&f.token(9, "", None).unwrap());
        assert_eq!(t["choices"][0]["token_ids"], serde_json::json!([9]));
        assert!(t["choices"][0]["logprobs"].is_null());
    }
}

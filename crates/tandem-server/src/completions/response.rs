//! The legacy completion objects: a whole `text_completion`, and the stream of `text_completion`
//! chunks (text deltas, finish chunk, usage chunk), with legacy-format log-probabilities.

use serde::Serialize;
use tandem_engine::{FinishReason, PositionLogprobs, Usage};

use crate::generation::Completion;
use crate::logprobs::{LegacyLogprobs, LegacyOffsets};
use crate::response_meta::{ResponseMeta, UsageBody};
use crate::sse::ChunkFormat;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    pub logprobs: Option<LegacyLogprobs>,
    pub finish_reason: Option<&'static str>,
    /// vLLM extension (`return_token_ids`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
    /// vLLM extension (`return_token_ids`), on the whole object and the first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// A whole completion, or one chunk of a streamed one (same `object` in both).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TextCompletion<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageBody>,
}

/// The whole response; `prompt_ids` is `Some` when the client asked for token ids.
pub fn whole(meta: &ResponseMeta, done: Completion, prompt_ids: Option<Vec<u32>>, logprobs: bool) -> serde_json::Value {
    let logprobs = logprobs.then(|| {
        let mut out = LegacyLogprobs::default();
        let mut offsets = LegacyOffsets::default();
        for p in &done.logprobs {
            offsets.next(&mut out, p);
        }
        out
    });
    let body = TextCompletion {
        id: &meta.id,
        object: "text_completion",
        created: meta.created,
        model: &meta.model,
        choices: vec![CompletionChoice {
            index: 0,
            text: done.text,
            logprobs,
            finish_reason: Some(done.finish_reason.as_str()),
            token_ids: prompt_ids.is_some().then_some(done.token_ids),
            prompt_token_ids: prompt_ids,
        }],
        usage: Some(UsageBody::from(&done.usage)),
    };
    serde_json::to_value(body).unwrap_or_default()
}

/// Streams completion chunks for one response.
pub struct CompletionChunks {
    meta: ResponseMeta,
    prompt_ids: Option<Vec<u32>>,
    return_token_ids: bool,
    logprobs: bool,
    offsets: LegacyOffsets,
}

impl CompletionChunks {
    pub fn new(meta: ResponseMeta, prompt_ids: Option<Vec<u32>>, logprobs: bool) -> Self {
        Self { meta, return_token_ids: prompt_ids.is_some(), prompt_ids, logprobs, offsets: LegacyOffsets::default() }
    }

    fn chunk(&self, choices: Vec<CompletionChoice>, usage: Option<UsageBody>) -> String {
        let chunk = TextCompletion {
            id: &self.meta.id,
            object: "text_completion",
            created: self.meta.created,
            model: &self.meta.model,
            choices,
            usage,
        };
        serde_json::to_string(&chunk).unwrap_or_default()
    }
}

impl ChunkFormat for CompletionChunks {
    fn opening(&mut self) -> Option<String> {
        None
    }

    fn token(&mut self, id: u32, text: &str, logprobs: Option<&PositionLogprobs>) -> Option<String> {
        let logprobs = logprobs.filter(|_| self.logprobs).map(|p| {
            let mut out = LegacyLogprobs::default();
            self.offsets.next(&mut out, p);
            out
        });
        if text.is_empty() && logprobs.is_none() && !self.return_token_ids {
            return None;
        }
        let choice = CompletionChoice {
            index: 0,
            text: text.to_string(),
            logprobs,
            finish_reason: None,
            token_ids: self.return_token_ids.then(|| vec![id]),
            prompt_token_ids: self.prompt_ids.take(),
        };
        Some(self.chunk(vec![choice], None))
    }

    fn finish(&mut self, reason: FinishReason, text: &str) -> String {
        let choice = CompletionChoice {
            index: 0,
            text: text.to_string(),
            logprobs: None,
            finish_reason: Some(reason.as_str()),
            token_ids: None,
            prompt_token_ids: self.prompt_ids.take(),
        };
        self.chunk(vec![choice], None)
    }

    fn usage(&mut self, usage: &Usage) -> String {
        self.chunk(Vec::new(), Some(UsageBody::from(usage)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};
    use tandem_engine::TokenLogprob;

    fn meta() -> ResponseMeta {
        ResponseMeta { id: "cmpl-x".into(), created: 5, model: "m".into() }
    }

    fn lp(text: &str) -> PositionLogprobs {
        PositionLogprobs { chosen: TokenLogprob { id: 1, text: text.into(), logprob: -0.5 }, top: vec![] }
    }

    #[test]
    fn whole_shape() {
        let done = Completion {
            text: "ab".into(),
            token_ids: vec![1, 2],
            logprobs: vec![lp("a"), lp("b")],
            finish_reason: FinishReason::Length,
            stop_string: None,
            usage: Usage { prompt_tokens: 2, completion_tokens: 2, cached_tokens: 0, ..Default::default() },
        };
        let v = whole(&meta(), done, Some(vec![9]), true);
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["choices"][0]["text"], "ab");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert_eq!(v["choices"][0]["token_ids"], json!([1, 2]));
        assert_eq!(v["choices"][0]["prompt_token_ids"], json!([9]));
        assert_eq!(v["choices"][0]["logprobs"]["text_offset"], json!([0, 1]));
        assert_eq!(v["choices"][0]["logprobs"]["tokens"], json!(["a", "b"]));
        assert_eq!(v["usage"]["total_tokens"], 4);
    }

    #[test]
    fn chunks() {
        let mut f = CompletionChunks::new(meta(), None, true);
        assert!(f.opening().is_none());
        let a: Value = serde_json::from_str(&f.token(1, "a", Some(&lp("a"))).unwrap()).unwrap();
        let b: Value = serde_json::from_str(&f.token(2, "b", Some(&lp("b"))).unwrap()).unwrap();
        assert_eq!(a["choices"][0]["text"], "a");
        assert!(a["choices"][0]["finish_reason"].is_null());
        assert_eq!(b["choices"][0]["logprobs"]["text_offset"], json!([1]));
        let fin: Value = serde_json::from_str(&f.finish(FinishReason::Stop, "")).unwrap();
        assert_eq!(fin["choices"][0]["finish_reason"], "stop");
        let u: Value = serde_json::from_str(&f.usage(&Usage::default())).unwrap();
        assert_eq!(u["choices"], json!([]));
        let mut plain = CompletionChunks::new(meta(), None, false);
        assert!(plain.token(1, "", None).is_none());
    }
}

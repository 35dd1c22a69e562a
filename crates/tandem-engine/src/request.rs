//! The public request/response types of the engine: what callers submit and what they get back.

use serde::{Deserialize, Serialize};

/// How the next token is chosen. Defaults are greedy-equivalent only when `temperature == 0`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// 0 disables top-k.
    pub top_k: usize,
    /// 1.0 disables top-p (nucleus) filtering.
    pub top_p: f32,
    /// 0.0 disables min-p filtering (keep tokens with p >= min_p * p_max).
    pub min_p: f32,
    /// 1.0 disables. Divides positive logits / multiplies negative logits of seen tokens.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token already seen.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per previous occurrence.
    pub frequency_penalty: f32,
    /// How many of the most recent tokens (prompt included) the penalties look at; 0 = all.
    pub penalty_last_n: usize,
    /// Seed of the per-request RNG; `None` draws one from the OS.
    pub seed: Option<u64>,
    /// Added to the logits of these token ids before anything else (OpenAI's `logit_bias`).
    #[serde(default)]
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: None,
            logit_bias: Vec::new(),
        }
    }
}

/// When generation ends.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StopParams {
    /// Maximum number of generated tokens.
    pub max_tokens: usize,
    /// Extra token ids that end generation (the model's EOS ids are always added unless
    /// `ignore_eos`).
    pub stop_token_ids: Vec<u32>,
    /// Strings that end generation; the matched string is not part of the output text.
    pub stop_strings: Vec<String>,
    /// Keep generating past EOS tokens.
    pub ignore_eos: bool,
}

/// One generation request, already tokenised.
#[derive(Debug, Clone, Default)]
pub struct GenerateRequest {
    pub prompt_ids: Vec<u32>,
    pub sampling: SamplingParams,
    pub stop: StopParams,
    /// Return the log-probability of each generated token and this many top alternatives
    /// (`Some(0)` = only the chosen token's log-prob).
    pub logprobs: Option<usize>,
    /// Token offsets of chat-message boundaries inside the prompt, and positions past it where
    /// a continuation may resume (where a thinking budget cuts the reasoning): models with
    /// recurrent layers keep a prefix-cache checkpoint at the block boundary at or before each.
    pub message_boundaries: Vec<usize>,
    /// Overrides the server's speculative decoding settings for this request.
    pub speculative: Option<crate::spec::SpecRequest>,
    /// The grammar the output must match (constrained decoding); `None` for free text.
    pub grammar: Option<crate::constraint::Grammar>,
}

/// A token and its log-probability under the (unfiltered, temperature 1) model distribution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    pub id: u32,
    pub text: String,
    pub logprob: f32,
}

/// Log-probabilities at one generated position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PositionLogprobs {
    pub chosen: TokenLogprob,
    pub top: Vec<TokenLogprob>,
}

/// Why a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// EOS token, stop token id or stop string (which one: `GenerationEvent::Finished::stop_string`).
    Stop,
    /// `max_tokens` or the context length was reached.
    Length,
}

impl FinishReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Token counts of a finished request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache (0 until the prefix cache exists).
    pub cached_tokens: usize,
    /// Of those, the tokens read back from the prefix cache's disk tier.
    #[serde(default)]
    pub disk_cached_tokens: usize,
    /// Speculative decoding: drafted and accepted tokens.
    #[serde(default)]
    pub speculative: crate::spec::SpecUsage,
}

/// Wall-clock timings of a finished request, in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// From submission until the first generated token was sampled.
    pub ttft_s: f64,
    /// Time spent in prefill forwards for this request.
    pub prefill_s: f64,
    /// From the first token to the last.
    pub decode_s: f64,
}

impl Timings {
    pub fn prefill_tok_per_s(&self, prompt_tokens: usize) -> f64 {
        if self.prefill_s > 0.0 {
            prompt_tokens as f64 / self.prefill_s
        } else {
            0.0
        }
    }
    /// Decode rate counts the tokens after the first (the first comes from prefill).
    pub fn decode_tok_per_s(&self, completion_tokens: usize) -> f64 {
        if self.decode_s > 0.0 && completion_tokens > 1 {
            (completion_tokens - 1) as f64 / self.decode_s
        } else {
            0.0
        }
    }
}

/// What the engine streams back for a request, in order: zero or more `Token`s, then exactly
/// one `Finished` or `Error`.
#[derive(Debug, Clone, PartialEq)]
pub enum GenerationEvent {
    Token {
        id: u32,
        /// Text that became final with this token (may be empty while a multi-byte character or
        /// a possible stop string is incomplete).
        text: String,
        logprobs: Option<PositionLogprobs>,
    },
    Finished {
        reason: FinishReason,
        /// Text held back for a possible stop string that turned out not to be one.
        text: String,
        /// The one of the request's `stop_strings` that ended generation (`reason` is then
        /// `Stop`); `None` when an EOS / stop token id, `max_tokens` or the context ended it.
        stop_string: Option<String>,
        usage: Usage,
        timings: Timings,
    },
    Error(String),
}

/// Why a submission was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SubmitError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {prompt} tokens, more than the context length of {context}")]
    PromptTooLong { prompt: usize, context: usize },
    #[error("prompt ({prompt} tokens) plus max_tokens ({max_tokens}) exceeds the context length of {context}")]
    MaxTokensTooLarge { prompt: usize, max_tokens: usize, context: usize },
    #[error("token id {0} is outside the vocabulary")]
    InvalidToken(u32),
    #[error("invalid sampling parameter: {0}")]
    InvalidParam(String),
    #[error("invalid grammar: {0}")]
    InvalidGrammar(String),
    #[error("the request queue is full")]
    QueueFull,
    #[error("the engine has stopped")]
    Stopped,
}

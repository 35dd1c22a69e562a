//! What the HTTP layer needs from the engine, as a trait: model facts, tokenisation, chat-template
//! rendering and request submission. [`tandem_engine::EngineHandle`] implements it (see
//! `engine_backend.rs`); tests implement it with scripted fakes to reach paths a real model
//! cannot be made to take on demand (queue full, mid-stream failures, slow streams).

use serde_json::{Map, Value};
use tandem_engine::engine::ModelInfo;
use tandem_engine::{GenerateRequest, GenerationEvent, SubmitError};
use tokio::sync::mpsc;

/// Options of one chat-template rendering.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatRenderOptions {
    /// Append the assistant header so the model answers next.
    pub add_generation_prompt: bool,
    /// The request's `tools`, exposed to the template.
    pub tools: Option<Value>,
    /// The request's `chat_template_kwargs`, exposed to the template as extra variables.
    pub extra: Map<String, Value>,
    /// The answer must be tool calls (`tool_choice` required or a named function): decoding is
    /// constrained to the model's call format over the offered tools. Not seen by the template.
    pub force_call: bool,
}

/// A rendered conversation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RenderedChat {
    pub text: String,
    /// Byte offsets into `text` where each message ends.
    pub message_ends: Vec<usize>,
}

/// The engine as the server sees it. Every method must be cheap to call from any thread except
/// [`Backend::tokenize`] and [`Backend::render_chat`], which the server runs off the async
/// workers.
pub trait Backend: Send + Sync + 'static {
    /// The served model: its id, context length, vocabulary size and load time.
    fn info(&self) -> &ModelInfo;
    /// Text to token ids; `add_bos` prepends the BOS token.
    fn tokenize(&self, text: &str, add_bos: bool) -> Result<Vec<u32>, String>;
    /// Whether plain text prompts get a BOS token.
    fn add_bos_by_default(&self) -> bool;
    /// The BOS token's text, if the model has one.
    fn bos_token(&self) -> Option<String>;
    /// Renders `messages` (OpenAI message objects, content already flattened to text) with the
    /// model's chat template, or a ChatML fallback when it has none.
    fn render_chat(&self, messages: &[Value], opts: &ChatRenderOptions) -> Result<RenderedChat, String>;
    /// The chat template's source, used to pick the tool-call format.
    fn chat_template_source(&self) -> Option<String> {
        None
    }
    /// `text` as a Lark expression in this model's vocabulary: a reference to its special token
    /// when it has one with exactly this text, else a string literal (for grammars that name
    /// tags such as `<tool_call>`).
    fn grammar_literal(&self, text: &str) -> String {
        tandem_engine::constraint::lark_string(text)
    }
    /// Queues a request. Dropping the returned receiver cancels it.
    fn submit(&self, req: GenerateRequest) -> Result<mpsc::Receiver<GenerationEvent>, SubmitError>;
    /// The engine's counters for `/metrics`, when there is an engine behind.
    fn stats(&self) -> Option<&tandem_engine::EngineStats> {
        None
    }
}

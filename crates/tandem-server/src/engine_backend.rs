//! [`Backend`] for the real engine: model facts from [`EngineHandle::info`], tokenisation through
//! its tokenizer, rendering through the model's chat template (ChatML when it has none).

use std::sync::{Arc, OnceLock};

use serde_json::Value;
use tandem_engine::engine::ModelInfo;
use tandem_engine::{EngineHandle, GenerateRequest, GenerationEvent, SubmitError};
use tandem_model::chat_template::{ChatTemplate, RenderOptions, CHATML_TEMPLATE};
use tokio::sync::mpsc;

use crate::backend::{Backend, ChatRenderOptions, RenderedChat};

/// The ChatML fallback, built once.
fn chatml() -> Result<&'static Arc<ChatTemplate>, String> {
    static CHATML: OnceLock<Result<Arc<ChatTemplate>, String>> = OnceLock::new();
    CHATML
        .get_or_init(|| ChatTemplate::new(CHATML_TEMPLATE).map(Arc::new).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(Clone::clone)
}

impl Backend for EngineHandle {
    fn info(&self) -> &ModelInfo {
        EngineHandle::info(self)
    }

    fn tokenize(&self, text: &str, add_bos: bool) -> Result<Vec<u32>, String> {
        self.tokenizer().encode(text, add_bos).map_err(|e| e.to_string())
    }

    fn add_bos_by_default(&self) -> bool {
        self.tokenizer().add_bos_by_default()
    }

    fn bos_token(&self) -> Option<String> {
        self.tokenizer().bos_token()
    }

    fn render_chat(&self, messages: &[Value], opts: &ChatRenderOptions) -> Result<RenderedChat, String> {
        let template = match self.chat_template() {
            Some(t) => t,
            None => chatml()?,
        };
        let opts = RenderOptions {
            add_generation_prompt: opts.add_generation_prompt,
            tools: opts.tools.clone(),
            extra: opts.extra.clone(),
        };
        let r = template.render(messages, &opts).map_err(|e| e.to_string())?;
        Ok(RenderedChat { text: r.text, message_ends: r.message_ends })
    }

    fn submit(&self, req: GenerateRequest) -> Result<mpsc::Receiver<GenerationEvent>, SubmitError> {
        EngineHandle::submit(self, req)
    }
}

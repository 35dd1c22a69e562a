//! [`Backend`] for the real engine: model facts from [`EngineHandle::info`], tokenisation through
//! its tokenizer, rendering through its chat template (the engine substitutes ChatML when the
//! model has none or its own does not compile).

use serde_json::Value;
use tandem_engine::{EngineHandle, GenerateRequest, GenerationEvent, ModelInfo, SubmitError};
use tandem_model::chat_template::RenderOptions;
use tokio::sync::mpsc;

use crate::backend::{Backend, ChatRenderOptions, RenderedChat};

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
        let template = self.chat_template().ok_or("the model has no usable chat template")?;
        let opts = RenderOptions {
            add_generation_prompt: opts.add_generation_prompt,
            tools: opts.tools.clone(),
            extra: opts.extra.clone(),
        };
        let r = template.render(messages, &opts).map_err(|e| e.to_string())?;
        Ok(RenderedChat { text: r.text, message_ends: r.message_ends })
    }

    fn chat_template_source(&self) -> Option<String> {
        self.chat_template().map(|t| t.source().to_string())
    }

    fn grammar_literal(&self, text: &str) -> String {
        match self.grammars() {
            Ok(g) => g.token_or_literal(self.tokenizer(), text),
            Err(_) => tandem_engine::constraint::lark_string(text),
        }
    }

    fn submit(&self, req: GenerateRequest) -> Result<mpsc::Receiver<GenerationEvent>, SubmitError> {
        EngineHandle::submit(self, req)
    }

    fn stats(&self) -> Option<&tandem_engine::EngineStats> {
        Some(EngineHandle::stats(self))
    }
}

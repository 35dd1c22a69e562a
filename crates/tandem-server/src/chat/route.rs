//! The `/v1/chat/completions` handler: validate, render and tokenise, budget against the
//! context, submit, then answer whole or as a stream.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use tandem_engine::GenerateRequest;

use super::request::ChatCompletionRequest;
use super::response::{ChatChunks, ChatCompletion};
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::generation::collect;
use crate::params::token_budget;
use crate::prompt::chat_prompt;
use crate::response_meta::ResponseMeta;
use crate::sse::{first_event, sse_response};
use crate::state::AppState;

pub async fn chat_completions(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<ChatCompletionRequest>,
) -> Result<Response, ApiError> {
    state.check_model(req.common.model.as_deref())?;
    let (model, context, vocab) = {
        let info = state.backend.info();
        (info.id.clone(), info.context_length, info.vocab_size)
    };
    let params = req.common.validate(vocab)?;
    let logprobs = req.engine_logprobs()?;
    let messages = req.template_messages()?;
    let opts = req.render_options()?;
    drop(req);

    let prompt = state.blocking(move |b| chat_prompt(b, &messages, &opts)).await?;
    let max_tokens = token_budget(prompt.ids.len(), params.max_tokens, context, state.cfg.default_max_tokens)?;
    let prompt_ids = params.return_token_ids.then(|| prompt.ids.clone());
    let gen = GenerateRequest {
        prompt_ids: prompt.ids,
        sampling: params.sampling,
        stop: tandem_engine::StopParams { max_tokens, ..params.stop },
        logprobs,
        message_boundaries: prompt.message_boundaries,
    };
    let mut rx = state.backend.submit(gen)?;
    let meta = ResponseMeta::new("chatcmpl", &model);
    if params.stream {
        let first = first_event(&mut rx).await?;
        let fmt = ChatChunks::new(meta, prompt_ids, logprobs.is_some());
        Ok(sse_response(first, rx, fmt, params.include_usage))
    } else {
        let done = collect(rx).await?;
        Ok(axum::Json(ChatCompletion::new(meta, done, prompt_ids, logprobs.is_some())).into_response())
    }
}

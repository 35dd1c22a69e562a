//! The `/v1/chat/completions` handler: admit, validate, render and submit ([`submit_chat`]),
//! then answer whole or as a stream.

use axum::extract::State;
use axum::response::{IntoResponse, Response};

use super::request::ChatCompletionRequest;
use super::response::{ChatChunks, ChatCompletion};
use super::submit::{submit_chat, ChatJob};
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::generation::collect_until;
use crate::response_meta::ResponseMeta;
use crate::sse::{first_event_until, sse_response};
use crate::state::{Admitted, AppState};

pub async fn chat_completions(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<ChatCompletionRequest>,
) -> Result<Response, ApiError> {
    let Admitted { guard, model, vocab, .. } = state.admit_for(req.common.model.as_deref())?;
    let params = req.common.validate(vocab)?;
    let logprobs = req.engine_logprobs()?;
    let max_thinking_tokens = match req.max_thinking_tokens {
        Some(0) => {
            return Err(ApiError::invalid_param("max_thinking_tokens", "max_thinking_tokens must be at least 1."))
        }
        m => m.map(|m| usize::try_from(m).unwrap_or(usize::MAX)),
    };
    let job = ChatJob {
        messages: req.template_messages()?,
        opts: req.render_options()?,
        params: params.clone(),
        logprobs,
        parallel: req.parallel_tool_calls.unwrap_or(true),
        max_thinking_tokens,
    };
    drop(req);
    let mut sub = submit_chat(&state, job).await?;
    let prompt_ids = params.return_token_ids.then(|| sub.prompt_ids.clone());
    let meta = ResponseMeta::new("chatcmpl", &model);
    if params.stream {
        let first = first_event_until(&mut sub.rx, &guard).await?;
        let fmt = ChatChunks::new(meta, &sub.output, prompt_ids, logprobs.is_some());
        Ok(sse_response(first, sub.rx, fmt, params.include_usage, guard))
    } else {
        let done = collect_until(sub.rx, &guard).await?;
        Ok(axum::Json(ChatCompletion::new(meta, done, &sub.output, prompt_ids, logprobs.is_some())).into_response())
    }
}

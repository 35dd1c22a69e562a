//! The `/v1/completions` handler: validate, tokenise or check the prompt ids, budget against the
//! context, submit, then answer whole or as a stream.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use tandem_engine::{GenerateRequest, StopParams};

use super::request::CompletionRequest;
use super::response::{whole, CompletionChunks};
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::generation::collect_until;
use crate::params::token_budget;
use crate::prompt::completion_prompt;
use crate::response_meta::ResponseMeta;
use crate::sse::{first_event_until, sse_response};
use crate::state::{Admitted, AppState};

pub async fn completions(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<CompletionRequest>,
) -> Result<Response, ApiError> {
    let Admitted { guard, model, context, vocab } = state.admit_for(req.common.model.as_deref())?;
    req.check_supported()?;
    let params = req.common.validate(vocab)?;
    let logprobs = req.engine_logprobs()?;
    let prompt = req.prompt;

    let prompt_ids = state.blocking(move |b| completion_prompt(b, &prompt)).await?;
    if prompt_ids.is_empty() {
        return Err(ApiError::invalid_param("prompt", "The prompt is empty."));
    }
    let max_tokens =
        token_budget(prompt_ids.len(), params.max_tokens, context, state.cfg.default_max_tokens).map_err(|mut e| {
            if e.param.as_deref() == Some("messages") {
                e.param = Some("prompt".into());
            }
            e
        })?;
    let echo_ids = params.return_token_ids.then(|| prompt_ids.clone());
    let gen = GenerateRequest {
        prompt_ids,
        sampling: params.sampling,
        stop: StopParams { max_tokens, ..params.stop },
        logprobs,
        message_boundaries: Vec::new(),
        speculative: params.speculative.clone(),
        grammar: params.grammar.clone(),
    };
    let mut rx = state.backend.submit(gen)?;
    let meta = ResponseMeta::new("cmpl", &model);
    if params.stream {
        let first = first_event_until(&mut rx, &guard).await?;
        let fmt = CompletionChunks::new(meta, echo_ids, logprobs.is_some());
        Ok(sse_response(first, rx, fmt, params.include_usage, guard))
    } else {
        let done = collect_until(rx, &guard).await?;
        Ok(axum::Json(whole(&meta, done, echo_ids, logprobs.is_some())).into_response())
    }
}

//! The Anthropic Messages API: `POST /v1/messages` (whole or streamed) and
//! `POST /v1/messages/count_tokens`. Requests are translated into the chat pipeline's inputs
//! ([`request`]), submitted like OpenAI chat requests ([`crate::chat::submit`]), and answered in
//! Anthropic's shapes ([`response`]); every error has Anthropic's body
//! `{"type":"error","error":{"type","message"}}`.
//!
//! Differences from Anthropic's service: `thinking` blocks carry an empty `signature`; without a
//! `thinking` field the chat template's default applies (Qwen3 models think by default);
//! `budget_tokens` counts separately from `max_tokens`, which bounds the answer after the
//! thinking block (as `max_thinking_tokens` does on the OpenAI route). A stop sequence that
//! ends the answer is reported as Anthropic does (`stop_reason: "stop_sequence"` and the
//! matched string in `stop_sequence`).

pub mod request;
pub mod response;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tandem_engine::GenerationEvent;

use crate::chat::submit::{submit_chat, ChatJob};
use crate::error::{AnthropicError, ApiError};
use crate::extract::{parse_json, JsonBody};
use crate::generation::collect_until;
use crate::prompt::chat_prompt;
use crate::sse::{first_event_until, named_event_response, EventSource};
use crate::state::{Admitted, AppState};
use request::MessagesRequest;
use response::{message_id, whole_message, EventWriter};

/// A JSON body whose rejections are Anthropic-style errors.
pub struct AnthropicJson<T>(pub T);

impl<S: Send + Sync, T: JsonBody> FromRequest<S> for AnthropicJson<T> {
    type Rejection = AnthropicError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::payload_too_large()
            } else {
                ApiError::invalid(format!("Could not read the request body: {}", rejection.body_text()))
            }
        })?;
        Ok(AnthropicJson(parse_json(&bytes)?))
    }
}

/// `POST /v1/messages`.
pub async fn messages(
    State(state): State<AppState>,
    AnthropicJson(req): AnthropicJson<MessagesRequest>,
) -> Result<Response, AnthropicError> {
    let Admitted { guard, model, vocab, .. } = state.admit_for(req.model.as_deref())?;
    let params = req.common(false)?.validate(vocab)?;
    let (budget, enable_thinking) = req.thinking()?;
    let (opts, parallel) = req.render_options(enable_thinking)?;
    let job = ChatJob {
        messages: req.template_messages()?,
        opts,
        params: params.clone(),
        logprobs: None,
        parallel,
        max_thinking_tokens: budget,
    };
    drop(req);
    let mut sub = submit_chat(&state, job).await?;
    let id = message_id();
    if !params.stream {
        let done = collect_until(sub.rx, &guard).await?;
        let stop = done.stop_string.as_deref();
        let body = whole_message(&id, &model, &sub.output, &done.text, done.finish_reason, stop, &done.usage);
        return Ok(axum::Json(body).into_response());
    }
    let first = first_event_until(&mut sub.rx, &guard).await?;
    let opening = EventWriter::start(&id, &model, sub.prompt_ids.len());
    Ok(named_event_response(first, sub.rx, opening, Events(EventWriter::new(&sub.output)), guard))
}

/// The stream's events: the writer's, and Anthropic error events.
struct Events(EventWriter);

impl EventSource for Events {
    fn on_event(&mut self, event: Option<GenerationEvent>) -> (Vec<response::Event>, bool) {
        on_event(&mut self.0, event)
    }
    fn timeout(&self) -> response::Event {
        ("error", ApiError::timeout().anthropic_body())
    }
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": N}` for the rendered prompt.
pub async fn count_tokens(
    State(state): State<AppState>,
    AnthropicJson(req): AnthropicJson<MessagesRequest>,
) -> Result<Response, AnthropicError> {
    state.check_model(req.model.as_deref())?;
    let _guard = state.admit()?;
    let (_, enable_thinking) = req.thinking()?;
    let (opts, _) = req.render_options(enable_thinking)?;
    let messages = req.template_messages()?;
    let prompt = state.blocking(move |b| chat_prompt(b, &messages, &opts)).await?;
    Ok(axum::Json(json!({"input_tokens": prompt.ids.len()})).into_response())
}

/// Applies one engine event to the writer, returning the events to send and whether the
/// stream is over.
fn on_event(writer: &mut EventWriter, event: Option<GenerationEvent>) -> (Vec<response::Event>, bool) {
    match event {
        Some(GenerationEvent::Token { text, .. }) => (writer.text(&text), false),
        Some(GenerationEvent::Finished { reason, text, stop_string, usage, .. }) => {
            (writer.finish(reason, stop_string.as_deref(), &text, &usage), true)
        }
        Some(GenerationEvent::Error(msg)) => {
            (vec![("error", ApiError::internal(format!("Generation failed: {msg}")).anthropic_body())], true)
        }
        None => (
            vec![("error", ApiError::internal("The engine ended the request without finishing it.").anthropic_body())],
            true,
        ),
    }
}

//! The OpenAI Responses API: `POST /v1/responses` (whole or streamed), `GET` and `DELETE
//! /v1/responses/{id}`. A request is translated into a chat-completions request
//! ([`request`]) and goes through the chat pipeline ([`crate::chat::submit`]); the answer is
//! written as Responses output items and events ([`response`]). Responses are stored (unless
//! `store: false`) in a bounded in-memory store ([`store`]) so that `previous_response_id`
//! continues a conversation server-side.
//!
//! Differences from OpenAI's service: function tools only (no built-in tools); text input only;
//! `reasoning` items carry the model's `<think>` text as `reasoning_text` content (no
//! summaries, no encrypted content); `reasoning.effort` `none` / `minimal` turns thinking off
//! and other efforts leave it on; `text.format` other than text is refused until constrained
//! decoding exists; stored responses live in memory and are lost on restart.

pub mod request;
pub mod response;
pub mod store;

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tandem_engine::GenerationEvent;

use crate::chat::request::ChatCompletionRequest;
use crate::chat::submit::{submit_chat, ChatJob};
use crate::error::ApiError;
use crate::extract::{ApiJson, JsonBody};
use crate::generation::collect_until;
use crate::output::OutputParser;
use crate::sse::{first_event_until, named_event_response, EventSource};
use crate::state::{Admitted, AppState};
use response::{assistant_message, new_id, Writer};
use store::ResponseStore;

/// The raw JSON body (translated by [`request::translate`]).
pub struct ResponsesBody(pub Value);

impl JsonBody for ResponsesBody {
    fn from_json(value: &Value) -> Result<Self, ApiError> {
        Ok(Self(value.clone()))
    }
}

fn not_found(id: &str, param: Option<&str>) -> ApiError {
    let mut e = ApiError::invalid(format!("No response with id `{id}` is stored."));
    e.status = StatusCode::NOT_FOUND;
    match param {
        Some(p) => e.with_param(p),
        None => e,
    }
}

/// `POST /v1/responses`.
pub async fn create(
    State(state): State<AppState>,
    ApiJson(ResponsesBody(body)): ApiJson<ResponsesBody>,
) -> Result<Response, ApiError> {
    let history = match body.get("previous_response_id").and_then(Value::as_str) {
        Some(prev) => state.responses.get(prev).ok_or_else(|| not_found(prev, Some("previous_response_id")))?.1,
        None => Vec::new(),
    };
    let t = request::translate(&body, history)?;
    drop(body);
    let req = ChatCompletionRequest::from_json(&t.chat)?;
    let Admitted { guard, model, vocab, .. } = state.admit_for(req.common.model.as_deref())?;
    let params = req.common.validate(vocab)?;
    let job = ChatJob {
        messages: req.template_messages()?,
        opts: req.render_options()?,
        params,
        logprobs: None,
        parallel: req.parallel_tool_calls.unwrap_or(true),
        max_thinking_tokens: None,
    };
    drop(req);
    let mut sub = submit_chat(&state, job).await?;
    let id = new_id("resp");
    let mut writer = Writer::new(&id, &model, t.echo);
    let keep = t.store.then(|| Keep { store: state.responses.clone(), id: id.clone(), conversation: t.conversation });
    if !t.stream {
        let done = collect_until(sub.rx, &guard).await?;
        let mut parser = OutputParser::new(&sub.output);
        writer.push(parser.push(&done.text));
        writer.push(parser.finish());
        let (_, r) = writer.finish(done.finish_reason, &done.usage);
        if let Some(k) = keep {
            k.save(&r, writer.items());
        }
        return Ok(axum::Json(r).into_response());
    }
    let first = first_event_until(&mut sub.rx, &guard).await?;
    let opening = writer.start();
    let source = Streamer { parser: OutputParser::new(&sub.output), writer, keep };
    Ok(named_event_response(first, sub.rx, opening, source, guard))
}

/// Where a finished response is stored.
struct Keep {
    store: Arc<ResponseStore>,
    id: String,
    conversation: Vec<Value>,
}

impl Keep {
    fn save(self, response: &Value, items: &[Value]) {
        let mut conversation = self.conversation;
        conversation.push(assistant_message(items));
        self.store.put(&self.id, response.clone(), conversation);
    }
}

/// A streamed response: engine text through the output parser into Responses events; the
/// finished response is stored.
struct Streamer {
    parser: OutputParser,
    writer: Writer,
    keep: Option<Keep>,
}

fn error_event(e: &ApiError) -> response::Event {
    ("error", json!({"type": "error", "code": e.code, "message": e.message, "param": e.param}))
}

impl EventSource for Streamer {
    fn on_event(&mut self, event: Option<GenerationEvent>) -> (Vec<response::Event>, bool) {
        match event {
            Some(GenerationEvent::Token { text, .. }) => (self.writer.push(self.parser.push(&text)), false),
            Some(GenerationEvent::Finished { reason, text, usage, .. }) => {
                let mut parsed = self.parser.push(&text);
                parsed.extend(self.parser.finish());
                let mut events = self.writer.push(parsed);
                let (end, r) = self.writer.finish(reason, &usage);
                events.extend(end);
                if let Some(k) = self.keep.take() {
                    k.save(&r, self.writer.items());
                }
                (events, true)
            }
            Some(GenerationEvent::Error(msg)) => {
                (vec![error_event(&ApiError::internal(format!("Generation failed: {msg}")))], true)
            }
            None => {
                (vec![error_event(&ApiError::internal("The engine ended the request without finishing it."))], true)
            }
        }
    }
    fn timeout(&self) -> response::Event {
        error_event(&ApiError::timeout())
    }
}

/// `GET /v1/responses/{id}`.
pub async fn get(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let (r, _) = state.responses.get(&id).ok_or_else(|| not_found(&id, None))?;
    Ok(axum::Json(r).into_response())
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    if !state.responses.delete(&id) {
        return Err(not_found(&id, None));
    }
    Ok(axum::Json(json!({"id": id, "object": "response.deleted", "deleted": true})).into_response())
}

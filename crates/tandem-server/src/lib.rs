//! `tandem-server`: the OpenAI- and Anthropic-compatible HTTP API over the engine.
//!
//! Requests enter as JSON on `POST /v1/chat/completions`, `POST /v1/completions` and
//! `POST /v1/messages` (+ `/v1/messages/count_tokens`, [`anthropic`]); [`extract::ApiJson`] and
//! [`anthropic::AnthropicJson`] turn bad bodies into errors in the caller's API style. Each
//! request passes the API key check ([`auth`]) and the admission limiter ([`state`]: a
//! concurrency limit answered with 429, a deadline), is validated ([`params`],
//! [`chat::request`], [`completions::request`]), rendered through the chat template and
//! tokenised ([`prompt`]), budgeted against the context and submitted to the engine as a
//! [`tandem_engine::GenerateRequest`] — for chats through the [`thinking`] driver, which
//! enforces the thinking budget and escapes reasoning loops. Generated text is split into
//! reasoning, content and tool calls ([`output`]: [`reasoning`] + [`tools`]) and leaves either
//! as one response object ([`generation`]) or as server-sent events ([`sse`]). The engine is seen
//! through the [`Backend`] trait, implemented for [`tandem_engine::EngineHandle`] and, for SDK
//! tests, by the [`scripted`] backend. Every failure is an [`ApiError`]; input never panics the
//! server.

pub mod anthropic;
pub mod auth;
pub mod backend;
pub mod chat;
pub mod completions;
pub mod config;
mod engine_backend;
pub mod error;
pub mod extract;
#[doc(hidden)]
pub mod fuzzing;
pub mod generation;
pub mod health;
pub mod listener;
pub mod logprobs;
pub mod metrics;
pub mod models;
pub mod output;
pub mod params;
pub mod prompt;
pub mod reasoning;
pub mod response_meta;
pub mod responses;
pub mod scripted;
pub mod server;
pub mod sse;
pub mod state;
pub mod structured;
pub mod thinking;
pub mod tools;

pub use backend::{Backend, ChatRenderOptions, RenderedChat};
pub use config::ServerConfig;
pub use error::ApiError;
pub use server::{router, router_on, serve, serve_on};

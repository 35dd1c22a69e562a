//! `tandem-server`: the OpenAI-compatible HTTP API over the engine.
//!
//! Requests enter as JSON on `POST /v1/chat/completions` and `POST /v1/completions`
//! ([`extract::ApiJson`] turns bad bodies into OpenAI-style errors), are validated
//! ([`params`], [`chat::request`], [`completions::request`]), turned into prompt token ids through
//! the chat template and tokenizer ([`prompt`]), budgeted against the context and submitted to
//! the engine as a [`tandem_engine::GenerateRequest`]. Engine events leave either collected into
//! one response object ([`generation`]) or as server-sent events ([`sse`]). The engine is seen
//! through the [`Backend`] trait, implemented for [`tandem_engine::EngineHandle`]. `GET /v1/models`
//! and `GET /health` report the model and liveness. Every failure is an [`ApiError`]: an HTTP
//! status with an OpenAI-style JSON body; input never panics the server.

pub mod backend;
pub mod chat;
pub mod completions;
pub mod config;
mod engine_backend;
pub mod error;
pub mod extract;
pub mod generation;
pub mod health;
pub mod logprobs;
pub mod models;
pub mod params;
pub mod prompt;
pub mod response_meta;
pub mod server;
pub mod sse;
pub mod state;

pub use backend::{Backend, ChatRenderOptions, RenderedChat};
pub use config::ServerConfig;
pub use error::ApiError;
pub use server::{router, router_on, serve, serve_on};

//! The state every route handler shares: the backend, the server settings, the tool-call format
//! chosen for the model, and the admission limiter (concurrency limit + per-request deadline).

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::backend::Backend;
use crate::config::{ServerConfig, ToolParserChoice};
use crate::error::ApiError;
use crate::tools::ToolFormat;

/// An admitted generation request: its guard, and the served model's id (for responses),
/// context length and vocabulary size.
pub struct Admitted {
    pub guard: RequestGuard,
    pub model: String,
    pub context: usize,
    pub vocab: usize,
}

/// Cloned into every handler by axum.
#[derive(Clone)]
pub struct AppState {
    pub backend: Arc<dyn Backend>,
    pub cfg: Arc<ServerConfig>,
    /// The tool-call format to parse, `None` when parsing is off.
    pub tool_format: Option<ToolFormat>,
    /// Stored Responses API responses (`previous_response_id`, `GET /v1/responses/{id}`).
    pub responses: Arc<crate::responses::store::ResponseStore>,
    limiter: Option<Arc<Semaphore>>,
}

/// What an admitted request holds until its response is complete: a concurrency permit and its
/// deadline.
#[derive(Debug, Default)]
pub struct RequestGuard {
    _permit: Option<OwnedSemaphorePermit>,
    pub deadline: Option<Instant>,
}

impl AppState {
    pub fn new(backend: Arc<dyn Backend>, cfg: &ServerConfig) -> Self {
        let tool_format = match cfg.tool_parser {
            ToolParserChoice::Off => None,
            ToolParserChoice::Fixed(f) => Some(f),
            ToolParserChoice::Auto => Some(
                backend.chat_template_source().as_deref().and_then(ToolFormat::detect).unwrap_or(ToolFormat::Hermes),
            ),
        };
        let limiter = (cfg.max_concurrent_requests > 0).then(|| Arc::new(Semaphore::new(cfg.max_concurrent_requests)));
        Self { backend, cfg: Arc::new(cfg.clone()), tool_format, responses: Arc::default(), limiter }
    }

    /// Ok when the request names no model, one of the served model's names, or any name
    /// with `any_model`.
    pub fn check_model(&self, requested: Option<&str>) -> Result<(), ApiError> {
        match requested {
            None | Some("") => Ok(()),
            Some(m) if self.serves(m) || self.cfg.any_model => Ok(()),
            Some(m) => Err(ApiError::model_not_found(m)),
        }
    }

    /// Whether `name` is the model's id or one of its aliases.
    pub fn serves(&self, name: &str) -> bool {
        name == self.backend.info().id || self.cfg.model_aliases.iter().any(|a| a == name)
    }

    /// The model's names: its id first, then the aliases.
    pub fn model_names(&self) -> Vec<String> {
        let mut names = vec![self.backend.info().id.clone()];
        for a in &self.cfg.model_aliases {
            if !names.contains(a) {
                names.push(a.clone());
            }
        }
        names
    }

    /// Admits a generation request naming `model` (404 for a name it does not answer to, 429
    /// at the concurrency limit), with what the routes need of the served model.
    pub fn admit_for(&self, model: Option<&str>) -> Result<Admitted, ApiError> {
        self.check_model(model)?;
        let guard = self.admit()?;
        let info = self.backend.info();
        Ok(Admitted { guard, model: info.id.clone(), context: info.context_length, vocab: info.vocab_size })
    }

    /// Admits a generation request, or refuses it with 429 when the server is at its limit.
    pub fn admit(&self) -> Result<RequestGuard, ApiError> {
        let permit = match &self.limiter {
            None => None,
            Some(sem) => Some(sem.clone().try_acquire_owned().map_err(|_| ApiError::overloaded())?),
        };
        let deadline = self.cfg.request_timeout.map(|t| Instant::now() + t);
        Ok(RequestGuard { _permit: permit, deadline })
    }

    /// Runs CPU-heavy prompt work (templating, tokenising) off the async workers.
    pub async fn blocking<T, F>(&self, f: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn Backend) -> Result<T, ApiError> + Send + 'static,
    {
        let backend = self.backend.clone();
        tokio::task::spawn_blocking(move || f(backend.as_ref()))
            .await
            .map_err(|e| ApiError::internal(format!("prompt preparation failed: {e}")))?
    }
}

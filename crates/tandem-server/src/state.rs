//! The state every route handler shares: the backend and the server settings.

use std::sync::Arc;

use crate::backend::Backend;
use crate::config::ServerConfig;
use crate::error::ApiError;

/// Cloned into every handler by axum.
#[derive(Clone)]
pub struct AppState {
    pub backend: Arc<dyn Backend>,
    pub cfg: Arc<ServerConfig>,
}

impl AppState {
    /// Ok when the request names no model, or the served one.
    pub fn check_model(&self, requested: Option<&str>) -> Result<(), ApiError> {
        match requested {
            None | Some("") => Ok(()),
            Some(m) if m == self.backend.info().id => Ok(()),
            Some(m) => Err(ApiError::model_not_found(m)),
        }
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

//! The router (routes, body limit, JSON fallbacks) and the listener loop with graceful shutdown.

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::Uri;
use axum::routing::{get, post};
use axum::Router;
use tokio::net::TcpListener;

use crate::backend::Backend;
use crate::config::ServerConfig;
use crate::error::ApiError;
use crate::state::AppState;

/// All routes, on `engine` (an [`tandem_engine::EngineHandle`], or any other [`Backend`]).
pub fn router<B: Backend>(engine: B, cfg: &ServerConfig) -> Router {
    router_on(Arc::new(engine), cfg)
}

/// [`router`] for a backend already behind an `Arc`.
pub fn router_on(backend: Arc<dyn Backend>, cfg: &ServerConfig) -> Router {
    let state = AppState { backend, cfg: Arc::new(cfg.clone()) };
    Router::new()
        .route("/v1/chat/completions", post(crate::chat::chat_completions))
        .route("/v1/completions", post(crate::completions::completions))
        .route("/v1/models", get(crate::models::list_models))
        .route("/v1/models/{id}", get(crate::models::get_model))
        .route("/health", get(crate::health::health))
        .fallback(|uri: Uri| async move { ApiError::route_not_found(uri.path()) })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .layer(DefaultBodyLimit::max(cfg.max_body_bytes))
        .with_state(state)
}

/// Binds `cfg.host:cfg.port` and serves until ctrl-c or SIGTERM.
pub async fn serve<B: Backend>(engine: B, cfg: ServerConfig) -> anyhow::Result<()> {
    let addr = cfg.addr();
    let listener = TcpListener::bind(&addr).await.map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    serve_on(listener, engine, cfg).await
}

/// Serves on an already-bound listener (tests bind port 0) until ctrl-c or SIGTERM; in-flight
/// requests are allowed to finish.
pub async fn serve_on<B: Backend>(listener: TcpListener, engine: B, cfg: ServerConfig) -> anyhow::Result<()> {
    let addr = listener.local_addr()?;
    let model = engine.info().id.clone();
    let app = router(engine, &cfg);
    tracing::info!(%addr, %model, "serving the OpenAI-compatible API on http://{addr}/v1");
    axum::serve(listener, app).with_graceful_shutdown(shutdown_signal()).await?;
    tracing::info!("server stopped");
    Ok(())
}

/// Resolves on ctrl-c (SIGINT) or, on Unix, SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        match tokio::signal::ctrl_c().await {
            Ok(()) => tracing::info!("ctrl-c received, shutting down"),
            Err(e) => {
                tracing::warn!("cannot listen for ctrl-c ({e})");
                std::future::pending::<()>().await
            }
        }
    };
    #[cfg(unix)]
    let term = async {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
                tracing::info!("SIGTERM received, shutting down");
            }
            Err(e) => {
                tracing::warn!("cannot listen for SIGTERM ({e})");
                std::future::pending::<()>().await
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

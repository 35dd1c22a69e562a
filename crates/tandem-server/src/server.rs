//! The router (routes, API key, body limit, JSON fallbacks in the caller's API style) and the
//! listener loop with graceful shutdown.

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::Uri;
use axum::routing::{get, post};
use axum::Router;
use tokio::net::TcpListener;

use crate::backend::Backend;
use crate::config::ServerConfig;
use crate::error::{ApiError, ErrorStyle};
use crate::state::AppState;

/// All routes, on `engine` (an [`tandem_engine::EngineHandle`], or any other [`Backend`]).
pub fn router<B: Backend>(engine: B, cfg: &ServerConfig) -> Router {
    router_on(Arc::new(engine), cfg)
}

/// [`router`] for a backend already behind an `Arc`.
pub fn router_on(backend: Arc<dyn Backend>, cfg: &ServerConfig) -> Router {
    let state = AppState::new(backend, cfg);
    Router::new()
        .route("/v1/chat/completions", post(crate::chat::chat_completions))
        .route("/v1/completions", post(crate::completions::completions))
        .route("/v1/messages", post(crate::anthropic::messages))
        .route("/v1/responses", post(crate::responses::create))
        .route("/v1/responses/{id}", get(crate::responses::get).delete(crate::responses::delete))
        .route("/v1/messages/count_tokens", post(crate::anthropic::count_tokens))
        .route("/v1/models", get(crate::models::list_models))
        .route("/v1/models/{id}", get(crate::models::get_model))
        .route("/health", get(crate::health::health))
        .route("/metrics", get(crate::metrics::metrics))
        .fallback(|uri: Uri| async move {
            ApiError::route_not_found(uri.path()).into_styled(ErrorStyle::for_path(uri.path()))
        })
        .method_not_allowed_fallback(|uri: Uri| async move {
            ApiError::method_not_allowed().into_styled(ErrorStyle::for_path(uri.path()))
        })
        .layer(DefaultBodyLimit::max(cfg.max_body_bytes))
        .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(cfg.body_read_timeout))
        .layer(axum::middleware::from_fn_with_state(state.clone(), crate::auth::require_api_key))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(panic_response))
        .with_state(state)
}

/// A handler that panicked (a bug, never expected) still answers with a JSON 500; the server
/// and every other request carry on.
fn panic_response(_: Box<dyn std::any::Any + Send + 'static>) -> axum::response::Response {
    use axum::response::IntoResponse;
    tracing::error!("a request handler panicked");
    ApiError::internal("Internal error while handling the request.").into_response()
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
    let limits = crate::listener::ConnLimits {
        max_connections: cfg.max_connections.max(1),
        header_read_timeout: cfg.header_read_timeout,
    };
    crate::listener::serve(listener, app, limits, shutdown_signal()).await?;
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

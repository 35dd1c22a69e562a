//! The error type of the model crate.

/// Everything that can go wrong while loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("tensor error: {0}")]
    Candle(#[from] candle_core::Error),
    #[error("I/O error on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid model config: {0}")]
    Config(String),
    #[error("missing tensor `{0}` in the checkpoint")]
    MissingTensor(String),
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    #[error("chat template error: {0}")]
    Template(String),
    #[error("model not found: {0}")]
    NotFound(String),
    #[error("fetch failed: {0}")]
    Fetch(String),
    #[error("invalid input: {0}")]
    Input(String),
}

pub type Result<T> = std::result::Result<T, ModelError>;

impl ModelError {
    /// Wraps an I/O error with the path it happened on.
    pub fn io(path: impl AsRef<std::path::Path>, source: std::io::Error) -> Self {
        ModelError::Io { path: path.as_ref().display().to_string(), source }
    }
}

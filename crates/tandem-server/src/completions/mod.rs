//! `POST /v1/completions`: legacy text completion from a text or token-id prompt, answered as
//! one `text_completion` object or a stream of them.

pub mod request;
pub mod response;
pub mod route;

pub use request::CompletionRequest;
pub use route::completions;

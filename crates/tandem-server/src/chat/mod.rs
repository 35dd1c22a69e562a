//! `POST /v1/chat/completions`: OpenAI chat requests rendered through the model's chat template,
//! answered as one `chat.completion` object or a stream of `chat.completion.chunk`s.

pub mod request;
pub mod response;
pub mod route;
pub mod submit;

pub use request::{ChatCompletionRequest, ChatMessage, Role, ToolChoice};
pub use route::chat_completions;

//! Placeholder; being written.
pub struct ChatTemplate;

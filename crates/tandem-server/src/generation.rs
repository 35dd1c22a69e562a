//! Draining an engine receiver into one finished completion (the non-streaming path).

use tandem_engine::{FinishReason, GenerationEvent, PositionLogprobs, Usage};
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::state::RequestGuard;

/// Everything a non-streaming response reports.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub text: String,
    pub token_ids: Vec<u32>,
    /// One entry per generated token that came with log-probabilities.
    pub logprobs: Vec<PositionLogprobs>,
    pub finish_reason: FinishReason,
    /// The request's stop string that ended it, if one did.
    pub stop_string: Option<String>,
    pub usage: Usage,
}

/// Waits for the request to finish. An engine error, or a channel closed without `Finished`,
/// becomes a 500. Dropping the returned future drops `rx`, which cancels the request.
pub async fn collect(mut rx: mpsc::Receiver<GenerationEvent>) -> Result<Completion, ApiError> {
    let mut text = String::new();
    let mut token_ids = Vec::new();
    let mut logprobs = Vec::new();
    while let Some(event) = rx.recv().await {
        match event {
            GenerationEvent::Token { id, text: piece, logprobs: lp } => {
                token_ids.push(id);
                text.push_str(&piece);
                logprobs.extend(lp);
            }
            GenerationEvent::Finished { reason, text: tail, stop_string, usage, .. } => {
                text.push_str(&tail);
                return Ok(Completion { text, token_ids, logprobs, finish_reason: reason, stop_string, usage });
            }
            GenerationEvent::Error(msg) => return Err(ApiError::internal(format!("Generation failed: {msg}"))),
        }
    }
    Err(ApiError::internal("The engine ended the request without finishing it."))
}

/// [`collect`] bounded by the guard's deadline (504 after it; the receiver is dropped, which
/// cancels the request).
pub async fn collect_until(rx: mpsc::Receiver<GenerationEvent>, guard: &RequestGuard) -> Result<Completion, ApiError> {
    match guard.deadline {
        None => collect(rx).await,
        Some(d) => tokio::time::timeout_at(d, collect(rx)).await.map_err(|_| ApiError::timeout())?,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_engine::Timings;

    fn tok(id: u32, text: &str) -> GenerationEvent {
        GenerationEvent::Token { id, text: text.into(), logprobs: None }
    }

    #[tokio::test]
    async fn collects_text_ids_and_tail() {
        let (tx, rx) = mpsc::channel(8);
        tx.send(tok(1, "he")).await.unwrap();
        tx.send(tok(2, "")).await.unwrap();
        let usage = Usage { prompt_tokens: 5, completion_tokens: 2, cached_tokens: 0, ..Default::default() };
        tx.send(GenerationEvent::Finished {
            reason: FinishReason::Stop,
            text: "y".into(),
            stop_string: Some("STOP".into()),
            usage,
            timings: Timings::default(),
        })
        .await
        .unwrap();
        let c = collect(rx).await.unwrap();
        assert_eq!((c.text.as_str(), c.token_ids, c.finish_reason), ("hey", vec![1, 2], FinishReason::Stop));
        assert_eq!(c.stop_string.as_deref(), Some("STOP"));
        assert_eq!(c.usage, usage);
    }

    #[tokio::test]
    async fn errors_and_hangups_are_500() {
        let (tx, rx) = mpsc::channel(8);
        tx.send(tok(1, "a")).await.unwrap();
        tx.send(GenerationEvent::Error("boom".into())).await.unwrap();
        assert_eq!(collect(rx).await.unwrap_err().status.as_u16(), 500);
        let (tx, rx) = mpsc::channel::<GenerationEvent>(8);
        drop(tx);
        assert_eq!(collect(rx).await.unwrap_err().status.as_u16(), 500);
    }
}

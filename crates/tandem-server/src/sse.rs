//! Server-sent-event framing of a generation: the route supplies a [`ChunkFormat`] that turns
//! engine events into JSON chunks, this module turns the event channel into `data: …` frames,
//! then the optional usage chunk and `data: [DONE]`. A failure midway sends one error frame
//! (the OpenAI error body) and ends the stream. The stream owns the engine receiver, so when the
//! client disconnects and axum drops the body, the receiver is dropped and the request cancelled.
//!
//! APIs whose events are named (`event: …` lines: Anthropic messages, OpenAI Responses) supply
//! an [`EventSource`] instead and get [`named_event_response`], the same loop.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use tandem_engine::{FinishReason, GenerationEvent, PositionLogprobs, Usage};
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::state::RequestGuard;

/// Formats one route's chunks (each a serialised JSON object).
pub trait ChunkFormat: Send + 'static {
    /// Chunk sent before the first token (the chat role delta), if any.
    fn opening(&mut self) -> Option<String>;
    /// Chunk for one generated token; `None` skips it (nothing to report yet).
    fn token(&mut self, id: u32, text: &str, logprobs: Option<&PositionLogprobs>) -> Option<String>;
    /// The final chunk, carrying the finish reason and any held-back text.
    fn finish(&mut self, reason: FinishReason, text: &str) -> String;
    /// The usage chunk (empty `choices`), sent only when the client asked for it.
    fn usage(&mut self, usage: &Usage) -> String;
}

/// Waits for the first engine event, so that a failure before any token can still be answered
/// with a plain JSON error instead of a stream.
pub async fn first_event(rx: &mut mpsc::Receiver<GenerationEvent>) -> Result<GenerationEvent, ApiError> {
    match rx.recv().await {
        Some(GenerationEvent::Error(msg)) => Err(ApiError::internal(format!("Generation failed: {msg}"))),
        Some(ev) => Ok(ev),
        None => Err(ApiError::internal("The engine ended the request without finishing it.")),
    }
}

/// Waits for the first event until the guard's deadline (504 after it).
pub async fn first_event_until(
    rx: &mut mpsc::Receiver<GenerationEvent>,
    guard: &RequestGuard,
) -> Result<GenerationEvent, ApiError> {
    match guard.deadline {
        None => first_event(rx).await,
        Some(d) => tokio::time::timeout_at(d, first_event(rx)).await.map_err(|_| ApiError::timeout())?,
    }
}

/// Receives the next event, or `Err` once `deadline` has passed.
pub async fn recv_until(
    rx: &mut mpsc::Receiver<GenerationEvent>,
    deadline: Option<tokio::time::Instant>,
) -> Result<Option<GenerationEvent>, ()> {
    match deadline {
        None => Ok(rx.recv().await),
        Some(d) => tokio::time::timeout_at(d, rx.recv()).await.map_err(|_| ()),
    }
}

/// The event read ahead (`first`), else the channel's next one before the deadline (`Err`
/// when the deadline passes; `Ok(None)` when the channel closed).
async fn first_or_next(
    first: &mut Option<GenerationEvent>,
    rx: &mut mpsc::Receiver<GenerationEvent>,
    deadline: Option<tokio::time::Instant>,
) -> Result<Option<GenerationEvent>, ()> {
    match first.take() {
        Some(e) => Ok(Some(e)),
        None => recv_until(rx, deadline).await,
    }
}

/// The `text/event-stream` response for a request whose first event is `first`. The guard
/// (concurrency permit, deadline) lives as long as the stream.
pub fn sse_response<F: ChunkFormat>(
    first: GenerationEvent,
    rx: mpsc::Receiver<GenerationEvent>,
    fmt: F,
    include_usage: bool,
    guard: RequestGuard,
) -> Response {
    use futures::StreamExt;
    let events = frames_guarded(first, rx, fmt, include_usage, guard)
        .map(|data| Ok::<_, Infallible>(Event::default().data(data)));
    Sse::new(events).keep_alive(KeepAlive::default()).into_response()
}

struct State<F> {
    rx: Option<mpsc::Receiver<GenerationEvent>>,
    first: Option<GenerationEvent>,
    pending: VecDeque<String>,
    fmt: F,
    include_usage: bool,
    guard: RequestGuard,
}

impl<F: ChunkFormat> State<F> {
    fn apply(&mut self, event: Option<GenerationEvent>) {
        match event {
            Some(GenerationEvent::Token { id, text, logprobs }) => {
                self.pending.extend(self.fmt.token(id, &text, logprobs.as_ref()));
            }
            Some(GenerationEvent::Finished { reason, text, usage, .. }) => {
                self.pending.push_back(self.fmt.finish(reason, &text));
                if self.include_usage {
                    self.pending.push_back(self.fmt.usage(&usage));
                }
                self.pending.push_back("[DONE]".to_string());
                self.rx = None;
            }
            Some(GenerationEvent::Error(msg)) => self.fail(format!("Generation failed: {msg}")),
            None => self.fail("The engine ended the request without finishing it.".to_string()),
        }
    }

    fn fail(&mut self, msg: String) {
        self.pending.push_back(ApiError::internal(msg).body().to_string());
        self.rx = None;
    }
}

/// The `data:` payloads of the stream, in order.
pub fn frames<F: ChunkFormat>(
    first: GenerationEvent,
    rx: mpsc::Receiver<GenerationEvent>,
    fmt: F,
    include_usage: bool,
) -> impl Stream<Item = String> + Send {
    frames_guarded(first, rx, fmt, include_usage, RequestGuard::default())
}

/// [`frames`] holding `guard`; past its deadline the stream ends with an error frame.
pub fn frames_guarded<F: ChunkFormat>(
    first: GenerationEvent,
    rx: mpsc::Receiver<GenerationEvent>,
    mut fmt: F,
    include_usage: bool,
    guard: RequestGuard,
) -> impl Stream<Item = String> + Send {
    let pending: VecDeque<String> = fmt.opening().into_iter().collect();
    let state = State { rx: Some(rx), first: Some(first), pending, fmt, include_usage, guard };
    futures::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(data) = s.pending.pop_front() {
                return Some((data, s));
            }
            let deadline = s.guard.deadline;
            let rx = s.rx.as_mut()?;
            let Ok(event) = first_or_next(&mut s.first, rx, deadline).await else {
                s.pending.push_back(ApiError::timeout().body().to_string());
                s.rx = None;
                continue;
            };
            s.apply(event);
        }
    })
}

/// Turns engine events into named server-sent events.
pub trait EventSource: Send + 'static {
    /// The events for one engine event (`None`: the channel closed without finishing) and
    /// whether the stream is over.
    fn on_event(&mut self, event: Option<GenerationEvent>) -> (Vec<NamedEvent>, bool);
    /// The event sent when the request's deadline passes (the stream then ends).
    fn timeout(&self) -> NamedEvent;
}

/// An event name and its JSON data.
pub type NamedEvent = (&'static str, serde_json::Value);

/// An SSE response of named events: `opening`, then `source`'s events for `first` and each
/// engine event after it. It owns `rx` and `guard`: a client that disconnects cancels the
/// request, and past the guard's deadline the stream ends with `source.timeout()`.
pub fn named_event_response<S: EventSource>(
    first: GenerationEvent,
    rx: mpsc::Receiver<GenerationEvent>,
    opening: Vec<NamedEvent>,
    source: S,
    guard: RequestGuard,
) -> Response {
    struct St<S> {
        rx: Option<mpsc::Receiver<GenerationEvent>>,
        first: Option<GenerationEvent>,
        pending: VecDeque<NamedEvent>,
        source: S,
        guard: RequestGuard,
    }
    let st = St { rx: Some(rx), first: Some(first), pending: VecDeque::from(opening), source, guard };
    let events = futures::stream::unfold(st, |mut s| async move {
        loop {
            if let Some((name, data)) = s.pending.pop_front() {
                return Some((Ok::<_, Infallible>(Event::default().event(name).data(data.to_string())), s));
            }
            let deadline = s.guard.deadline;
            let rx = s.rx.as_mut()?;
            let Ok(event) = first_or_next(&mut s.first, rx, deadline).await else {
                s.pending.push_back(s.source.timeout());
                s.rx = None;
                continue;
            };
            let (events, done) = s.source.on_event(event);
            s.pending.extend(events);
            if done {
                s.rx = None;
            }
        }
    });
    Sse::new(events).keep_alive(KeepAlive::default()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use tandem_engine::Timings;

    struct Plain;
    impl ChunkFormat for Plain {
        fn opening(&mut self) -> Option<String> {
            Some("open".into())
        }
        fn token(&mut self, id: u32, text: &str, _: Option<&PositionLogprobs>) -> Option<String> {
            (!text.is_empty()).then(|| format!("{id}:{text}"))
        }
        fn finish(&mut self, reason: FinishReason, text: &str) -> String {
            format!("fin:{}:{text}", reason.as_str())
        }
        fn usage(&mut self, usage: &Usage) -> String {
            format!("usage:{}", usage.completion_tokens)
        }
    }

    fn tok(id: u32, text: &str) -> GenerationEvent {
        GenerationEvent::Token { id, text: text.into(), logprobs: None }
    }

    fn finished() -> GenerationEvent {
        let usage = Usage { prompt_tokens: 1, completion_tokens: 3, cached_tokens: 0, ..Default::default() };
        GenerationEvent::Finished {
            reason: FinishReason::Stop,
            text: "!".into(),
            stop_string: None,
            usage,
            timings: Timings::default(),
        }
    }

    #[tokio::test]
    async fn full_stream_with_usage() {
        let (tx, rx) = mpsc::channel(8);
        tx.send(tok(2, "")).await.unwrap();
        tx.send(tok(3, "c")).await.unwrap();
        tx.send(finished()).await.unwrap();
        let out: Vec<String> = frames(tok(1, "a"), rx, Plain, true).collect().await;
        assert_eq!(out, ["open", "1:a", "3:c", "fin:stop:!", "usage:3", "[DONE]"]);
    }

    #[tokio::test]
    async fn no_usage_when_not_asked() {
        let (_tx, rx) = mpsc::channel(1);
        let out: Vec<String> = frames(finished(), rx, Plain, false).collect().await;
        assert_eq!(out, ["open", "fin:stop:!", "[DONE]"]);
    }

    #[tokio::test]
    async fn midstream_error_ends_with_error_frame() {
        let (tx, rx) = mpsc::channel(8);
        tx.send(GenerationEvent::Error("boom".into())).await.unwrap();
        let out: Vec<String> = frames(tok(1, "a"), rx, Plain, true).collect().await;
        assert_eq!(out.len(), 3);
        let err: serde_json::Value = serde_json::from_str(&out[2]).unwrap();
        assert!(err["error"]["message"].as_str().unwrap().contains("boom"));

        let (tx, rx) = mpsc::channel::<GenerationEvent>(8);
        drop(tx);
        let out: Vec<String> = frames(tok(1, "a"), rx, Plain, true).collect().await;
        assert!(out.last().unwrap().contains("\"error\""));
    }

    #[tokio::test]
    async fn dropping_the_stream_drops_the_receiver() {
        let (tx, rx) = mpsc::channel(8);
        let stream = frames(tok(1, "a"), rx, Plain, true);
        assert!(!tx.is_closed());
        drop(stream);
        assert!(tx.is_closed());
    }

    #[tokio::test]
    async fn first_event_errors() {
        let (tx, mut rx) = mpsc::channel(8);
        tx.send(GenerationEvent::Error("x".into())).await.unwrap();
        assert_eq!(first_event(&mut rx).await.unwrap_err().status.as_u16(), 500);
        drop(tx);
        assert_eq!(first_event(&mut rx).await.unwrap_err().status.as_u16(), 500);
    }
}

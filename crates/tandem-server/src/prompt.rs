//! Turning request input into prompt token ids: chat messages through the template (with the
//! token offsets of message boundaries for prefix-cache checkpoints), and legacy `prompt` values
//! (text or token ids).

use serde_json::Value;

use crate::backend::{Backend, ChatRenderOptions};
use crate::error::ApiError;

/// Prompt token ids plus the token offsets where chat messages end.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Prompt {
    pub ids: Vec<u32>,
    pub message_boundaries: Vec<usize>,
    /// The rendered text ends inside an open `<think>` block (the generation prompt opened it).
    pub opens_reasoning: bool,
}

/// Encodes prompt text, adding BOS when the model wants one and the text does not already start
/// with it (chat templates often write it themselves).
pub fn encode_text(backend: &dyn Backend, text: &str) -> Result<Vec<u32>, ApiError> {
    backend
        .tokenize(text, wants_bos(backend, text))
        .map_err(|e| ApiError::invalid(format!("Could not tokenize the prompt: {e}")))
}

fn wants_bos(backend: &dyn Backend, text: &str) -> bool {
    backend.add_bos_by_default() && !backend.bos_token().is_some_and(|b| !b.is_empty() && text.starts_with(&b))
}

/// Renders `messages` and tokenises the result.
pub fn chat_prompt(backend: &dyn Backend, messages: &[Value], opts: &ChatRenderOptions) -> Result<Prompt, ApiError> {
    let rendered = backend
        .render_chat(messages, opts)
        .map_err(|e| ApiError::invalid_param("messages", format!("Could not apply the chat template: {e}")))?;
    let text = rendered.text;
    let opens_reasoning = crate::reasoning::prompt_opens_reasoning(&text);
    let add_bos = wants_bos(backend, &text);
    let tokenize = |s: &str, bos: bool| {
        backend.tokenize(s, bos).map_err(|e| ApiError::invalid(format!("Could not tokenize the prompt: {e}")))
    };
    let ids = tokenize(&text, add_bos)?;

    // Cut points: valid, increasing byte offsets strictly inside the text.
    let mut cuts: Vec<usize> = Vec::new();
    for &end in &rendered.message_ends {
        if end > 0 && end < text.len() && text.is_char_boundary(end) && cuts.last().is_none_or(|&l| end > l) {
            cuts.push(end);
        }
    }
    let message_boundaries =
        if cuts.is_empty() { Vec::new() } else { boundaries(&text, &cuts, &ids, add_bos, &tokenize)? };
    Ok(Prompt { ids, message_boundaries, opens_reasoning })
}

type Tokenize<'a> = dyn Fn(&str, bool) -> Result<Vec<u32>, ApiError> + 'a;

/// Token offsets of byte offsets `cuts`. Tokenises each segment on its own (linear cost); when
/// the segments' tokens concatenate to exactly `ids` the offsets are exact. Otherwise (a merge
/// across a cut) falls back to tokenising each prefix.
fn boundaries(
    text: &str,
    cuts: &[usize],
    ids: &[u32],
    add_bos: bool,
    tokenize: &Tokenize,
) -> Result<Vec<usize>, ApiError> {
    let mut joined = Vec::with_capacity(ids.len());
    let mut offsets = Vec::with_capacity(cuts.len());
    let mut start = 0;
    for (i, &cut) in cuts.iter().chain(std::iter::once(&text.len())).enumerate() {
        joined.extend(tokenize(&text[start..cut], add_bos && i == 0)?);
        if cut < text.len() {
            offsets.push(joined.len());
        }
        start = cut;
    }
    if joined == ids {
        return Ok(offsets);
    }
    let mut offsets = Vec::with_capacity(cuts.len());
    for &cut in cuts {
        let n = tokenize(&text[..cut], add_bos)?.len().min(ids.len());
        if offsets.last().is_none_or(|&l| n > l) {
            offsets.push(n);
        }
    }
    Ok(offsets)
}

/// Parses a legacy `prompt`: a string, an array of token ids, or a one-element array of either.
pub fn completion_prompt(backend: &dyn Backend, prompt: &Value) -> Result<Vec<u32>, ApiError> {
    let vocab = backend.info().vocab_size;
    match prompt {
        Value::String(s) => encode_text(backend, s),
        Value::Array(items) if items.is_empty() => Err(ApiError::invalid_param("prompt", "The prompt is empty.")),
        Value::Array(items) if items.iter().all(Value::is_number) => token_ids(items, vocab),
        Value::Array(items) if items.len() > 1 && items.iter().all(|v| v.is_string() || v.is_array()) => {
            Err(ApiError::invalid_param("prompt", "Only one prompt per request is supported."))
        }
        Value::Array(items) => match &items[0] {
            Value::String(s) => encode_text(backend, s),
            Value::Array(ids) if !ids.is_empty() => token_ids(ids, vocab),
            Value::Array(_) => Err(ApiError::invalid_param("prompt", "The prompt is empty.")),
            _ => Err(bad_prompt()),
        },
        Value::Null => Err(ApiError::invalid_param("prompt", "The prompt is missing.")),
        _ => Err(bad_prompt()),
    }
}

fn bad_prompt() -> ApiError {
    ApiError::invalid_param(
        "prompt",
        "prompt must be a string, an array of token ids, or a one-element array of either.",
    )
}

fn token_ids(items: &[Value], vocab: usize) -> Result<Vec<u32>, ApiError> {
    items
        .iter()
        .map(|v| match v.as_u64().and_then(|id| u32::try_from(id).ok()) {
            Some(id) if (id as usize) < vocab => Ok(id),
            _ => Err(ApiError::invalid_param(
                "prompt",
                format!("Token id {v} is outside the vocabulary (size {vocab})."),
            )
            .with_code("invalid_token")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::RenderedChat;
    use serde_json::json;
    use tandem_engine::engine::ModelInfo;
    use tandem_engine::{GenerateRequest, GenerationEvent, SubmitError};

    /// Characters are tokens, except that "ab" is one token (so merges across cuts happen).
    struct CharBackend {
        info: ModelInfo,
        bos: bool,
    }
    impl Backend for CharBackend {
        fn info(&self) -> &ModelInfo {
            &self.info
        }
        fn tokenize(&self, text: &str, add_bos: bool) -> Result<Vec<u32>, String> {
            let mut ids = if add_bos { vec![1] } else { vec![] };
            let text = match text.strip_prefix("<s>") {
                Some(t) => {
                    ids.push(1);
                    t
                }
                None => text,
            };
            let chars: Vec<char> = text.chars().collect();
            let mut i = 0;
            while i < chars.len() {
                if chars[i] == 'a' && chars.get(i + 1) == Some(&'b') {
                    ids.push(2);
                    i += 2;
                } else {
                    ids.push(chars[i] as u32 + 10);
                    i += 1;
                }
            }
            Ok(ids)
        }
        fn add_bos_by_default(&self) -> bool {
            self.bos
        }
        fn bos_token(&self) -> Option<String> {
            Some("<s>".into())
        }
        fn render_chat(&self, messages: &[Value], _: &ChatRenderOptions) -> Result<RenderedChat, String> {
            let mut out = RenderedChat::default();
            for m in messages {
                out.text.push_str(m["content"].as_str().ok_or("no content")?);
                out.message_ends.push(out.text.len());
            }
            out.text.push('!');
            Ok(out)
        }
        fn submit(&self, _: GenerateRequest) -> Result<tokio::sync::mpsc::Receiver<GenerationEvent>, SubmitError> {
            Err(SubmitError::Stopped)
        }
    }

    fn backend(bos: bool) -> CharBackend {
        CharBackend { info: ModelInfo { id: "m".into(), context_length: 100, vocab_size: 200, created: 0 }, bos }
    }

    fn msgs(parts: &[&str]) -> Vec<Value> {
        parts.iter().map(|p| json!({"role": "user", "content": p})).collect()
    }

    #[test]
    fn boundaries_exact_when_segments_tokenise_alone() {
        let b = backend(true);
        let p = chat_prompt(&b, &msgs(&["xy", "zw"]), &ChatRenderOptions::default()).unwrap();
        assert_eq!(p.ids.len(), 1 + 4 + 1);
        assert_eq!(p.message_boundaries, vec![3, 5]);
    }

    #[test]
    fn boundaries_fall_back_on_merge() {
        let b = backend(false);
        // "xa" | "by": the full text tokenises "ab" as one token.
        let p = chat_prompt(&b, &msgs(&["xa", "by"]), &ChatRenderOptions::default()).unwrap();
        assert_eq!(p.ids.len(), 4); // x ab y !
        assert_eq!(p.message_boundaries, vec![2, 3]);
    }

    #[test]
    fn no_double_bos() {
        let b = backend(true);
        let p = chat_prompt(&b, &msgs(&["<s>hi"]), &ChatRenderOptions::default()).unwrap();
        assert_eq!(p.ids.iter().filter(|&&i| i == 1).count(), 1);
        assert_eq!(encode_text(&b, "<s>x").unwrap(), vec![1, 'x' as u32 + 10]);
        assert_eq!(encode_text(&b, "x").unwrap(), vec![1, 'x' as u32 + 10]);
    }

    #[test]
    fn template_errors_are_400() {
        let b = backend(true);
        let e = chat_prompt(&b, &[json!({"role": "user"})], &ChatRenderOptions::default()).unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
    }

    #[test]
    fn legacy_prompt_forms() {
        let b = backend(false);
        assert_eq!(completion_prompt(&b, &json!("x")).unwrap(), vec!['x' as u32 + 10]);
        assert_eq!(completion_prompt(&b, &json!(["x"])).unwrap(), vec!['x' as u32 + 10]);
        assert_eq!(completion_prompt(&b, &json!([3, 4])).unwrap(), vec![3, 4]);
        assert_eq!(completion_prompt(&b, &json!([[3, 4]])).unwrap(), vec![3, 4]);
        for bad in [
            json!([]),
            json!([[]]),
            json!(["a", "b"]),
            json!([[1], [2]]),
            json!([1, "a"]),
            json!(5),
            json!({}),
            json!(null),
            json!([true]),
        ] {
            let e = completion_prompt(&b, &bad).unwrap_err();
            assert_eq!(e.status.as_u16(), 400, "{bad}");
            assert_eq!(e.param.as_deref(), Some("prompt"), "{bad}");
        }
        for out_of_vocab in [json!([200]), json!([[1, 5000000000u64]]), json!([-1]), json!([1.5])] {
            let e = completion_prompt(&b, &out_of_vocab).unwrap_err();
            assert_eq!(e.code, Some("invalid_token"), "{out_of_vocab}");
        }
    }
}

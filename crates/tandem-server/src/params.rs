//! Request fields shared by `/v1/chat/completions` and `/v1/completions` (model, token budget,
//! sampling, stop rules, streaming switches) and their validation into the engine's
//! [`SamplingParams`] and [`StopParams`], including the context-length budget.

use serde::Deserialize;
use tandem_engine::{Grammar, SamplingParams, SpecRequest, StopParams};

use crate::error::ApiError;

/// `stop`: one string or several.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// Fields both completion routes accept (deserialised from the same body as each request type).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct CommonParams {
    pub model: Option<String>,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Option<StopField>,
    /// vLLM extension: token ids that end generation.
    pub stop_token_ids: Option<Vec<u32>>,
    pub n: Option<u64>,
    pub ignore_eos: Option<bool>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// vLLM extension: return the generated (and prompt) token ids.
    pub return_token_ids: Option<bool>,
    /// tandem extension: `{"method": "off"|"ngram"|"draft"|"mtp", "num_draft_tokens": k}`
    /// overrides the server's speculative decoding for this request.
    pub speculative: Option<SpecRequest>,
    /// OpenAI's `{"token id": bias}`, each bias in [-100, 100].
    pub logit_bias: Option<serde_json::Map<String, serde_json::Value>>,
    /// `{"type": "text" | "json_object"}` or `{"type": "json_schema", "json_schema": {"name",
    /// "schema", "strict"}}`: the output is constrained to match (see [`crate::structured`]).
    pub response_format: Option<serde_json::Value>,
    /// vLLM's guided decoding: a JSON schema (object or JSON text), a regex, a choice of
    /// strings, a grammar (Lark, or GBNF when it has `::=` rules).
    pub guided_json: Option<serde_json::Value>,
    pub guided_regex: Option<String>,
    pub guided_choice: Option<Vec<String>>,
    pub guided_grammar: Option<String>,
    /// llama.cpp's fields: a GBNF grammar (Lark also accepted) and a JSON schema.
    pub grammar: Option<String>,
    pub json_schema: Option<serde_json::Value>,
}

/// The validated, engine-ready form of [`CommonParams`].
#[derive(Debug, Clone, PartialEq)]
pub struct Validated {
    pub sampling: SamplingParams,
    /// Everything but `max_tokens`, which needs the prompt length (see [`token_budget`]).
    pub stop: StopParams,
    pub max_tokens: Option<usize>,
    pub stream: bool,
    pub include_usage: bool,
    pub return_token_ids: bool,
    pub speculative: Option<SpecRequest>,
    /// What the output must match, from `response_format`, `guided_*`, `grammar` or
    /// `json_schema` (at most one of them).
    pub grammar: Option<Grammar>,
}

impl CommonParams {
    /// Checks every value; `vocab_size` bounds `stop_token_ids`.
    pub fn validate(&self, vocab_size: usize) -> Result<Validated, ApiError> {
        if let Some(n) = self.n {
            if n != 1 {
                return Err(ApiError::invalid_param(
                    "n",
                    format!("n must be 1 (got {n}); only one choice per request is supported."),
                ));
            }
        }
        let max_tokens = match self.max_completion_tokens.or(self.max_tokens) {
            Some(0) => {
                let param = if self.max_completion_tokens.is_some() { "max_completion_tokens" } else { "max_tokens" };
                return Err(ApiError::invalid_param(param, format!("{param} must be at least 1.")));
            }
            Some(m) => Some(usize::try_from(m).unwrap_or(usize::MAX)),
            None => None,
        };

        let mut sampling = SamplingParams { temperature: 1.0, ..SamplingParams::default() };
        if let Some(t) = self.temperature {
            check(t.is_finite() && t >= 0.0, "temperature", "must be a finite number >= 0")?;
            sampling.temperature = t;
        }
        if let Some(p) = self.top_p {
            check(p.is_finite() && p > 0.0 && p <= 1.0, "top_p", "must be in (0, 1]")?;
            sampling.top_p = p;
        }
        if let Some(k) = self.top_k {
            check(k >= -1, "top_k", "must be -1 or 0 (disabled) or a positive integer")?;
            sampling.top_k = usize::try_from(k.max(0)).unwrap_or(usize::MAX);
        }
        if let Some(p) = self.min_p {
            check(p.is_finite() && (0.0..=1.0).contains(&p), "min_p", "must be in [0, 1]")?;
            sampling.min_p = p;
        }
        if let Some(r) = self.repetition_penalty {
            check(r.is_finite() && r > 0.0, "repetition_penalty", "must be a finite number > 0")?;
            sampling.repetition_penalty = r;
        }
        if let Some(p) = self.presence_penalty {
            check(p.is_finite() && (-2.0..=2.0).contains(&p), "presence_penalty", "must be in [-2, 2]")?;
            sampling.presence_penalty = p;
        }
        if let Some(p) = self.frequency_penalty {
            check(p.is_finite() && (-2.0..=2.0).contains(&p), "frequency_penalty", "must be in [-2, 2]")?;
            sampling.frequency_penalty = p;
        }
        sampling.seed = self.seed.map(|s| s as u64);
        if let Some(bias) = &self.logit_bias {
            if bias.len() > 1024 {
                return Err(ApiError::invalid_param("logit_bias", "At most 1024 entries are accepted.".to_string()));
            }
            for (k, v) in bias {
                let id = k.parse::<u32>().ok().filter(|&id| (id as usize) < vocab_size).ok_or_else(|| {
                    ApiError::invalid_param(
                        "logit_bias",
                        format!("`{k}` is not a token id of this model (0..{vocab_size})."),
                    )
                })?;
                let b = v.as_f64().filter(|b| b.is_finite() && (-100.0..=100.0).contains(b)).ok_or_else(|| {
                    ApiError::invalid_param(
                        "logit_bias",
                        format!("The bias of token {k} must be a number in [-100, 100]."),
                    )
                })?;
                sampling.logit_bias.push((id, b as f32));
            }
        }
        let grammar = crate::structured::grammar_of(self)?;

        let stop_strings = match &self.stop {
            None => Vec::new(),
            Some(StopField::One(s)) => vec![s.clone()],
            Some(StopField::Many(v)) => v.clone(),
        };
        let stop_strings: Vec<String> = stop_strings.into_iter().filter(|s| !s.is_empty()).collect();
        let stop_token_ids = self.stop_token_ids.clone().unwrap_or_default();
        if let Some(bad) = stop_token_ids.iter().find(|&&id| id as usize >= vocab_size) {
            return Err(ApiError::invalid_param(
                "stop_token_ids",
                format!("Token id {bad} is outside the vocabulary (size {vocab_size})."),
            ));
        }
        let stream = self.stream.unwrap_or(false);
        Ok(Validated {
            sampling,
            stop: StopParams {
                max_tokens: 0,
                stop_token_ids,
                stop_strings,
                ignore_eos: self.ignore_eos.unwrap_or(false),
            },
            max_tokens,
            stream,
            include_usage: stream && self.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false),
            return_token_ids: self.return_token_ids.unwrap_or(false),
            speculative: self.speculative.clone(),
            grammar,
        })
    }
}

fn check(ok: bool, param: &str, rule: &str) -> Result<(), ApiError> {
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid_param(param, format!("{param} {rule}.")))
    }
}

/// The number of tokens to generate: the requested count if it fits in the context, else
/// `min(default_max, context - prompt)` (`default_max == 0` means no cap). The prompt must leave
/// room for at least one token.
pub fn token_budget(
    prompt_len: usize,
    requested: Option<usize>,
    context: usize,
    default_max: usize,
) -> Result<usize, ApiError> {
    if prompt_len >= context {
        return Err(ApiError::context_length(
            "messages",
            format!(
                "This model's maximum context length is {context} tokens. However, your prompt has {prompt_len} tokens, \
                 leaving no room for the completion. Please reduce the length of the prompt."
            ),
        ));
    }
    let room = context - prompt_len;
    match requested {
        Some(m) if m > room => Err(ApiError::context_length(
            "max_tokens",
            format!(
                "This model's maximum context length is {context} tokens. However, you requested {} tokens \
                 ({prompt_len} in the prompt, {m} for the completion). Please reduce max_tokens or the prompt.",
                prompt_len.saturating_add(m)
            ),
        )),
        Some(m) => Ok(m),
        None if default_max == 0 => Ok(room),
        None => Ok(default_max.min(room)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extract::{parse_json, JsonBody};

    impl JsonBody for CommonParams {
        fn from_json(value: &serde_json::Value) -> Result<Self, ApiError> {
            crate::extract::from_value(value)
        }
    }

    fn parse(json: &str) -> CommonParams {
        parse_json(json.as_bytes()).unwrap()
    }

    #[test]
    fn defaults() {
        let v = parse("{}").validate(100).unwrap();
        assert_eq!(v.sampling.temperature, 1.0);
        assert_eq!(v.sampling.top_p, 1.0);
        assert_eq!(v.max_tokens, None);
        assert!(!v.stream && !v.include_usage && !v.return_token_ids);
        assert!(v.stop.stop_strings.is_empty());
    }

    #[test]
    fn full_set() {
        let v = parse(
            r#"{"temperature":0,"top_p":0.5,"top_k":-1,"min_p":0.1,"repetition_penalty":1.1,
                "presence_penalty":0.5,"frequency_penalty":-0.5,"seed":-3,"stop":["a","","b"],
                "stop_token_ids":[5],"n":1,"ignore_eos":true,"stream":true,
                "stream_options":{"include_usage":true},"return_token_ids":true,
                "max_tokens":7,"max_completion_tokens":9}"#,
        )
        .validate(100)
        .unwrap();
        assert_eq!(v.sampling.temperature, 0.0);
        assert_eq!(v.sampling.top_k, 0);
        assert_eq!(v.sampling.seed, Some((-3i64) as u64));
        assert_eq!(v.stop.stop_strings, vec!["a".to_string(), "b".to_string()]);
        assert_eq!(v.stop.stop_token_ids, vec![5]);
        assert!(v.stop.ignore_eos && v.stream && v.include_usage && v.return_token_ids);
        assert_eq!(v.max_tokens, Some(9));
        let one = parse(r#"{"stop":"x","stream_options":{"include_usage":true}}"#).validate(100).unwrap();
        assert_eq!(one.stop.stop_strings, vec!["x".to_string()]);
        assert!(!one.include_usage, "include_usage only applies to streams");
    }

    #[test]
    fn bad_values_are_400_with_param() {
        let cases = [
            (r#"{"n":2}"#, "n"),
            (r#"{"n":0}"#, "n"),
            (r#"{"max_tokens":0}"#, "max_tokens"),
            (r#"{"max_completion_tokens":0}"#, "max_completion_tokens"),
            (r#"{"temperature":-0.1}"#, "temperature"),
            (r#"{"temperature":1e300}"#, "temperature"),
            (r#"{"top_p":0}"#, "top_p"),
            (r#"{"top_p":1.5}"#, "top_p"),
            (r#"{"top_k":-2}"#, "top_k"),
            (r#"{"min_p":2}"#, "min_p"),
            (r#"{"repetition_penalty":0}"#, "repetition_penalty"),
            (r#"{"presence_penalty":3}"#, "presence_penalty"),
            (r#"{"frequency_penalty":-3}"#, "frequency_penalty"),
            (r#"{"stop_token_ids":[100]}"#, "stop_token_ids"),
            (r#"{"logit_bias":{"100":1}}"#, "logit_bias"),
            (r#"{"logit_bias":{"x":1}}"#, "logit_bias"),
            (r#"{"logit_bias":{"5":101}}"#, "logit_bias"),
            (r#"{"logit_bias":{"5":"high"}}"#, "logit_bias"),
            (r#"{"response_format":{"type":"xml"}}"#, "response_format"),
            (r#"{"response_format":{"type":"json_schema"}}"#, "response_format"),
            (r#"{"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":3}}}"#, "response_format"),
            (r#"{"guided_json":"{not json"}"#, "guided_json"),
            (r#"{"guided_choice":[]}"#, "guided_choice"),
            (r#"{"guided_regex":"a+","response_format":{"type":"json_object"}}"#, "guided_regex"),
        ];
        for (json, param) in cases {
            let e = parse(json).validate(100).unwrap_err();
            assert_eq!(e.status.as_u16(), 400, "{json}");
            assert_eq!(e.param.as_deref(), Some(param), "{json}");
        }
    }

    #[test]
    fn logit_bias_and_text_response_format_are_accepted() {
        let v = parse(r#"{"logit_bias":{"5":-100,"7":2.5},"response_format":{"type":"text"}}"#).validate(100).unwrap();
        let mut b = v.sampling.logit_bias.clone();
        b.sort_by_key(|e| e.0);
        assert_eq!(b, vec![(5, -100.0), (7, 2.5)]);
        assert!(parse(r#"{"response_format":null}"#).validate(100).is_ok());
    }

    #[test]
    fn wrong_types_are_rejected_by_the_parser() {
        for (json, param) in
            [(r#"{"temperature":"hot"}"#, "temperature"), (r#"{"stop":[1]}"#, "stop"), (r#"{"n":1.5}"#, "n")]
        {
            let e = parse_json::<CommonParams>(json.as_bytes()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{json}: {}", e.message);
        }
    }

    #[test]
    fn budget() {
        assert_eq!(token_budget(10, None, 100, 16).unwrap(), 16);
        assert_eq!(token_budget(90, None, 100, 16).unwrap(), 10);
        assert_eq!(token_budget(90, None, 100, 0).unwrap(), 10);
        assert_eq!(token_budget(90, Some(10), 100, 16).unwrap(), 10);
        let e = token_budget(90, Some(11), 100, 16).unwrap_err();
        assert_eq!((e.code, e.param.as_deref()), (Some("context_length_exceeded"), Some("max_tokens")));
        let e = token_budget(100, None, 100, 16).unwrap_err();
        assert_eq!(e.code, Some("context_length_exceeded"));
        assert!(token_budget(1, Some(usize::MAX), 100, 16).is_err());
    }
}

//! The part of a chat request both API styles share: render the conversation, budget tokens
//! against the context (thinking budget included), choose how to parse the output, and submit
//! through the [`thinking`](crate::thinking) driver.

use serde_json::Value;
use tandem_engine::{GenerateRequest, GenerationEvent, Grammar, StopParams};
use tokio::sync::mpsc;

use crate::backend::ChatRenderOptions;
use crate::error::ApiError;
use crate::output::OutputConfig;
use crate::params::{token_budget, Validated};
use crate::prompt::chat_prompt;
use crate::state::AppState;
use crate::thinking::{self, ThinkingPolicy};
use crate::tools::{force, ToolSchemas};

/// A chat generation ready to submit.
pub struct ChatJob {
    pub messages: Vec<Value>,
    pub opts: ChatRenderOptions,
    pub params: Validated,
    pub logprobs: Option<usize>,
    /// `parallel_tool_calls`.
    pub parallel: bool,
    /// The request's thinking budget (the server default applies when `None`).
    pub max_thinking_tokens: Option<usize>,
}

/// A submitted chat generation.
pub struct Submitted {
    pub rx: mpsc::Receiver<GenerationEvent>,
    pub prompt_ids: Vec<u32>,
    pub output: OutputConfig,
}

/// Renders, budgets and submits `job`.
pub async fn submit_chat(state: &AppState, job: ChatJob) -> Result<Submitted, ApiError> {
    let ChatJob { messages, opts, params, logprobs, parallel, max_thinking_tokens } = job;
    let info = state.backend.info();
    let context = info.context_length;
    let tools = match (&opts.tools, state.tool_format) {
        (Some(t), Some(f)) => Some((f, ToolSchemas::from_tools(Some(t)), parallel)),
        _ => None,
    };
    let grammar = match (opts.force_call, params.grammar.clone()) {
        (false, g) => g,
        (true, Some(_)) => {
            return Err(ApiError::invalid_param(
                "tool_choice",
                "A required tool call cannot be combined with response_format or a grammar.",
            ))
        }
        (true, None) => {
            let (Some(format), Some(offered)) = (state.tool_format, opts.tools.as_ref()) else {
                return Err(ApiError::invalid_param(
                    "tool_choice",
                    "This model's chat template shows no tool-call format, so a call cannot be required; \
                     start the server with --tool-parser hermes|qwen-xml|llama3.",
                ));
            };
            let backend = state.backend.clone();
            let g = force::forced_calls(format, offered, parallel, |t| backend.grammar_literal(t))
                .map_err(|e| ApiError::invalid_param("tool_choice", e))?;
            Some(g)
        }
    };
    let prompt = state.blocking(move |b| chat_prompt(b, &messages, &opts)).await?;
    let cfg = &state.cfg;
    if cfg.max_prompt_tokens > 0 && prompt.ids.len() > cfg.max_prompt_tokens {
        return Err(ApiError::context_length(
            "messages",
            format!(
                "The prompt has {} tokens; this server accepts at most {}.",
                prompt.ids.len(),
                cfg.max_prompt_tokens
            ),
        ));
    }
    let budget =
        max_thinking_tokens.or((cfg.default_max_thinking_tokens > 0).then_some(cfg.default_max_thinking_tokens));
    let answer = token_budget(prompt.ids.len(), params.max_tokens, context, cfg.default_max_tokens)?;
    let room = context - prompt.ids.len();
    let (max_tokens, answer_max) = match budget {
        Some(b) => (answer.saturating_add(b).min(room), Some(answer)),
        None => (answer, None),
    };
    let policy = ThinkingPolicy {
        budget,
        answer_max,
        loop_ngram: cfg.thinking_loop_ngram,
        loop_repeats: cfg.thinking_loop_repeats,
        inside: prompt.opens_reasoning,
        context,
    };
    // Output that starts inside a reasoning block is free up to `</think>`; the grammar binds
    // the answer after it.
    let grammar = grammar.map(|g| match prompt.opens_reasoning && cfg.parse_reasoning {
        true => Grammar::AfterText { close: "</think>".into(), inner: Box::new(g) },
        false => g,
    });
    let output = OutputConfig { reasoning_inside: prompt.opens_reasoning, parse_reasoning: cfg.parse_reasoning, tools };
    let gen = GenerateRequest {
        prompt_ids: prompt.ids.clone(),
        sampling: params.sampling,
        stop: StopParams { max_tokens, ..params.stop },
        logprobs,
        message_boundaries: prompt.message_boundaries,
        speculative: params.speculative.clone(),
        grammar,
    };
    let rx = thinking::submit(state.backend.clone(), gen, policy)?;
    Ok(Submitted { rx, prompt_ids: prompt.ids, output })
}

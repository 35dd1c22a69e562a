//! Seeded, reproducible agent workloads: a shared prefix (system prompt + tool schemas), a
//! per-session task context, and turns of tool results and short user messages, each sized in
//! tokens with a [`TokenCounter`]. The same config and counter always give the same texts and
//! token counts; sessions draw from their own seeded stream, so adding sessions leaves the
//! earlier ones unchanged.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::tokens::TokenCounter;

/// What to generate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadConfig {
    pub seed: u64,
    /// Concurrent sessions.
    pub sessions: usize,
    /// Tokens of the system prompt + tool schemas every session shares.
    pub shared_prefix_tokens: usize,
    /// Tokens of each session's own task context (its first user message).
    pub session_context_tokens: usize,
    /// Turns per session, drawn uniformly from this range (inclusive).
    pub turns_min: usize,
    pub turns_max: usize,
    /// Tokens of each turn's tool result, drawn uniformly from this range (inclusive).
    pub tool_result_tokens_min: usize,
    pub tool_result_tokens_max: usize,
    /// Tokens of the short user message after each tool result.
    pub user_tokens: usize,
    /// Tokens generated per turn (`max_tokens`).
    pub max_tokens: usize,
    /// Pause between a turn's answer and the next request, as a user or tool would take.
    pub think_time_ms: u64,
    /// The classic single-turn measurement: one short prompt per session, no shared prefix.
    pub single_turn: bool,
    /// Prompt tokens of the single-turn mode.
    pub single_turn_prompt_tokens: usize,
    /// The conversation carries a reply of up to `max_tokens` tokens from the workload
    /// ([`TurnPlan::reply`]) instead of each answer the server gave, so every system under
    /// test sees the same prompts (a random-weight model's answers differ from server to
    /// server, and so would every later prompt).
    #[serde(default)]
    pub fixed_replies: bool,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        Self {
            seed: 1,
            sessions: 1,
            shared_prefix_tokens: 8192,
            session_context_tokens: 512,
            turns_min: 10,
            turns_max: 20,
            tool_result_tokens_min: 100,
            tool_result_tokens_max: 600,
            user_tokens: 24,
            max_tokens: 64,
            think_time_ms: 0,
            single_turn: false,
            single_turn_prompt_tokens: 128,
            fixed_replies: false,
        }
    }
}

/// A text and its token count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sized {
    pub text: String,
    pub tokens: usize,
}

/// One turn: the tool result and user message appended before the request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnPlan {
    pub tool_result: Sized,
    pub user: Sized,
    /// The assistant's reply the conversation carries on with ([`WorkloadConfig::fixed_replies`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<Sized>,
}

/// One session: its context and turns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionPlan {
    pub id: usize,
    pub context: Sized,
    pub turns: Vec<TurnPlan>,
}

/// A whole workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    pub config: WorkloadConfig,
    /// The system prompt (empty in single-turn mode).
    pub shared_prefix: Sized,
    pub sessions: Vec<SessionPlan>,
    /// What counted the tokens.
    pub counter: String,
    pub exact_counts: bool,
}

/// Errors in a workload description.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum WorkloadError {
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    #[error("{what}: minimum {min} is above maximum {max}")]
    Range { what: &'static str, min: usize, max: usize },
}

const WORDS: &[&str] = &[
    "tool",
    "function",
    "argument",
    "returns",
    "string",
    "integer",
    "list",
    "file",
    "path",
    "search",
    "read",
    "write",
    "edit",
    "patch",
    "diff",
    "repository",
    "branch",
    "commit",
    "test",
    "build",
    "error",
    "warning",
    "result",
    "status",
    "value",
    "key",
    "object",
    "array",
    "schema",
    "required",
    "optional",
    "description",
    "parameter",
    "context",
    "line",
    "column",
    "module",
    "crate",
    "import",
    "export",
    "cache",
    "buffer",
    "stream",
    "request",
    "response",
    "header",
    "token",
    "offset",
    "length",
    "index",
    "query",
    "match",
    "pattern",
    "config",
];
const VERBS: &[&str] = &["read", "write", "list", "search", "run", "edit", "find", "fetch", "apply", "check"];
const NOUNS: &[&str] = &["file", "dir", "tests", "symbol", "diff", "log", "issue", "branch", "docs", "url"];

fn words(rng: &mut ChaCha8Rng, n: std::ops::Range<usize>) -> String {
    let n = rng.random_range(n);
    (0..n).map(|_| WORDS[rng.random_range(0..WORDS.len())]).collect::<Vec<_>>().join(" ")
}

/// A JSON-schema-like tool definition (one unit of the shared prefix).
fn tool_unit(rng: &mut ChaCha8Rng, i: usize) -> String {
    let name = format!("{}_{}_{i}", VERBS[rng.random_range(0..VERBS.len())], NOUNS[rng.random_range(0..NOUNS.len())]);
    let n_params = rng.random_range(1..=4);
    let params: Vec<String> = (0..n_params)
        .map(|p| {
            let ty = ["string", "integer", "boolean", "array"][rng.random_range(0..4)];
            format!("\"arg{p}\": {{\"type\": \"{ty}\", \"description\": \"{}\"}}", words(rng, 4..12))
        })
        .collect();
    format!(
        concat!(
            "{{\"name\": \"{}\", \"description\": \"{}.\", ",
            "\"parameters\": {{\"type\": \"object\", \"properties\": {{{}}}, \"required\": [\"arg0\"]}}}}\n"
        ),
        name,
        words(rng, 10..30),
        params.join(", ")
    )
}

/// A line of tool output: a location and a message, like grep or a compiler prints.
fn tool_output_unit(rng: &mut ChaCha8Rng, _i: usize) -> String {
    let f = format!("src/{}/{}.rs", WORDS[rng.random_range(0..WORDS.len())], WORDS[rng.random_range(0..WORDS.len())]);
    format!("{f}:{}:{}: {}\n", rng.random_range(1..2000), rng.random_range(1..80), words(rng, 4..14))
}

fn sentence_unit(rng: &mut ChaCha8Rng, _i: usize) -> String {
    format!("{}. ", words(rng, 6..18))
}

/// Builds a text from `head` and generated units, cut at a word boundary to the longest
/// prefix with at most `target` tokens (at least one word when `target > 0`).
fn fit(
    rng: &mut ChaCha8Rng,
    counter: &dyn TokenCounter,
    head: &str,
    target: usize,
    unit: fn(&mut ChaCha8Rng, usize) -> String,
) -> Sized {
    if target == 0 {
        return Sized { text: String::new(), tokens: 0 };
    }
    let mut text = head.to_string();
    let mut i = 0;
    let mut check_at = target * 2;
    // A counter that never reaches the target (it should count at least one token per 64
    // bytes) stops the growth instead of looping forever.
    let limit = target.saturating_mul(64).saturating_add(4096);
    loop {
        text.push_str(&unit(rng, i));
        i += 1;
        if text.len() >= check_at || text.len() > limit {
            if counter.count(&text) > target || text.len() > limit {
                break;
            }
            check_at = text.len() + text.len() / 4 + 16;
        }
    }
    // Word boundaries (after each run of whitespace); binary search the longest fitting prefix.
    let cuts: Vec<usize> = text
        .char_indices()
        .filter(|&(i, c)| c.is_whitespace() && !text[i + c.len_utf8()..].starts_with(char::is_whitespace))
        .map(|(i, c)| i + c.len_utf8())
        .collect();
    let (mut lo, mut hi) = (0usize, cuts.len());
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if counter.count(&text[..cuts[mid - 1]]) <= target {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let end = if lo == 0 { cuts.first().copied().unwrap_or(text.len()) } else { cuts[lo - 1] };
    let text = text[..end].trim_end().to_string();
    let tokens = counter.count(&text);
    Sized { text, tokens }
}

impl WorkloadConfig {
    /// Checks the ranges.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        if self.sessions == 0 {
            return Err(WorkloadError::Zero("sessions"));
        }
        if self.max_tokens == 0 {
            return Err(WorkloadError::Zero("max_tokens"));
        }
        if !self.single_turn && self.turns_min == 0 {
            return Err(WorkloadError::Zero("turns"));
        }
        if self.turns_min > self.turns_max {
            return Err(WorkloadError::Range { what: "turns", min: self.turns_min, max: self.turns_max });
        }
        if self.tool_result_tokens_min > self.tool_result_tokens_max {
            return Err(WorkloadError::Range {
                what: "tool result tokens",
                min: self.tool_result_tokens_min,
                max: self.tool_result_tokens_max,
            });
        }
        Ok(())
    }
}

/// Generates the workload `cfg` describes, sizing texts with `counter`.
pub fn generate(cfg: &WorkloadConfig, counter: &dyn TokenCounter) -> Result<Workload, WorkloadError> {
    cfg.validate()?;
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let shared_prefix = if cfg.single_turn {
        Sized { text: String::new(), tokens: 0 }
    } else {
        let head = "You are a coding agent working in a software repository. Use the tools below; answer \
                    tersely.\n# Tools\n";
        fit(&mut rng, counter, head, cfg.shared_prefix_tokens, tool_unit)
    };
    let sessions = (0..cfg.sessions)
        .map(|id| {
            let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ (0x9E37_79B9_7F4A_7C15u64.wrapping_mul(id as u64 + 1)));
            if cfg.single_turn {
                let context =
                    fit(&mut rng, counter, "Write about this: ", cfg.single_turn_prompt_tokens, sentence_unit);
                return SessionPlan { id, context, turns: Vec::new() };
            }
            let context =
                fit(&mut rng, counter, &format!("Task {id}: "), cfg.session_context_tokens.max(1), sentence_unit);
            let n_turns = rng.random_range(cfg.turns_min..=cfg.turns_max);
            // Replies from a stream of their own: the other texts are the same with or without.
            let mut replies =
                ChaCha8Rng::seed_from_u64(cfg.seed ^ (0xD1B5_4A32_D192_ED03u64.wrapping_mul(id as u64 + 1)));
            let turns = (0..n_turns)
                .map(|t| {
                    let n = rng.random_range(cfg.tool_result_tokens_min..=cfg.tool_result_tokens_max);
                    let tool_result = fit(&mut rng, counter, &format!("Tool result {}:\n", t + 1), n, tool_output_unit);
                    let user = fit(&mut rng, counter, "Next: ", cfg.user_tokens.max(1), sentence_unit);
                    let reply = cfg
                        .fixed_replies
                        .then(|| fit(&mut replies, counter, "Calling the tool. ", cfg.max_tokens, sentence_unit));
                    TurnPlan { tool_result, user, reply }
                })
                .collect();
            SessionPlan { id, context, turns }
        })
        .collect();
    Ok(Workload {
        config: cfg.clone(),
        shared_prefix,
        sessions,
        counter: counter.name(),
        exact_counts: counter.exact(),
    })
}

impl Workload {
    /// Requests the workload makes: one per turn (one per session in single-turn mode).
    pub fn requests(&self) -> usize {
        self.sessions.iter().map(|s| s.turns.len().max(1)).sum()
    }
}

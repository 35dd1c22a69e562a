//! Chat templates: turning a list of chat messages into the prompt text a model expects.
//!
//! Templates are the Jinja sources models ship (`tokenizer.chat_template` in GGUF,
//! `chat_template` in `tokenizer_config.json` or `chat_template.jinja` for Hugging Face). They
//! run in minijinja set up like transformers' sandbox: `trim_blocks` + `lstrip_blocks`, loop
//! controls, Python string/dict methods (`minijinja-contrib` pycompat), `tojson` with Python
//! `json.dumps` layout, `raise_exception` and `strftime_now` (see [`builtins`]).
//!
//! Sandbox: no loader (templates cannot read files), a fuel limit on executed instructions,
//! the default recursion limit, and a cap on the rendered output size. Memory and time are
//! bounded by the OS: with [`sandbox::enable`] (the CLI does it) renders run in worker
//! processes with an address-space limit and a deadline, so a template that builds huge
//! values fails its request instead of aborting the server.
//!
//! Message boundaries ([`Rendered::message_ends`]): the byte offset where message `i` ends is
//! the longest common prefix of the full rendering and the rendering of `messages[..=i]`
//! without a generation prompt. A prefix that fails to render (some templates refuse a
//! conversation without a user turn) or that renders differently gets the previous boundary,
//! so the offsets are non-decreasing and `text[..end]` is always a prefix of `text`. Only the
//! last [`BOUNDARY_MESSAGES`] messages get boundaries (earlier ones get 0, no boundary): one
//! prefix render each, so a render costs at most that many times one full render, linear in
//! the conversation (one render per message would be quadratic: 8,000 short messages took
//! 38 s). The newest boundaries are the ones the prefix cache resumes from.

mod builtins;
pub mod sandbox;

use std::path::Path;

use minijinja::{Environment, Value};

use crate::error::{ModelError, Result};

/// Fallback ChatML template used when a model ships none.
pub const CHATML_TEMPLATE: &str = "{%- for message in messages %}\
{{- '<|im_start|>' + message['role'] + '\\n' }}\
{%- if message['content'] is string %}{{- message['content'] }}\
{%- elif message['content'] is iterable %}{%- for part in message['content'] %}\
{%- if part['type'] == 'text' %}{{- part['text'] }}{%- endif %}{%- endfor %}\
{%- endif %}\
{{- '<|im_end|>' + '\\n' }}\
{%- endfor %}\
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/// Gemma's turn format, for Gemma checkpoints that ship no template (llama.cpp's GGUFs of
/// Gemma 3 often do not): `<start_of_turn>user` / `<start_of_turn>model` turns closed by
/// `<end_of_turn>`, the system prompt folded into the first user turn, contents trimmed.
pub const GEMMA_TEMPLATE: &str = "{{- bos_token }}\
{%- set ns = namespace(system='', text='') %}\
{%- for message in messages %}\
{%- if message['content'] is string %}{%- set ns.text = message['content'] %}\
{%- else %}{%- set ns.text = '' %}{%- for part in message['content'] %}\
{%- if part['type'] == 'text' %}{%- set ns.text = ns.text + part['text'] %}{%- endif %}{%- endfor %}{%- endif %}\
{%- if message['role'] == 'system' and loop.first %}{%- set ns.system = ns.text | trim + '\n\n' %}\
{%- else %}\
{{- '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\n' }}\
{%- if message['role'] == 'user' and ns.system %}{{- ns.system }}{%- set ns.system = '' %}{%- endif %}\
{{- ns.text | trim }}{{- '<end_of_turn>\n' }}\
{%- endif %}\
{%- endfor %}\
{%- if add_generation_prompt %}{{- '<start_of_turn>model\n' }}{%- endif %}";

/// Instructions one render may execute.
const FUEL: u64 = 20_000_000;
/// Messages at the end of a conversation that get message boundaries.
pub const BOUNDARY_MESSAGES: usize = 32;
/// Largest rendered prompt, in bytes.
const MAX_OUTPUT: usize = 4 << 20;
const TEMPLATE_NAME: &str = "chat";

/// Options of one render.
#[derive(Debug, Clone, Default)]
pub struct RenderOptions {
    /// Append the assistant turn header.
    pub add_generation_prompt: bool,
    /// Tool definitions (OpenAI format), passed as `tools`.
    pub tools: Option<serde_json::Value>,
    /// Extra template globals, e.g. `enable_thinking`.
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// A rendered prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub text: String,
    /// Byte offset in `text` where each message ends (for message boundaries).
    pub message_ends: Vec<usize>,
}

/// A compiled chat template. `Send + Sync`.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
    /// Worker processes renders go to ([`sandbox`]), when enabled.
    sandbox: Option<sandbox::Pool>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("source_len", &self.source.len()).finish()
    }
}

/// Writer that refuses to grow past [`MAX_OUTPUT`].
struct BoundedWriter(Vec<u8>);

impl std::io::Write for BoundedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > MAX_OUTPUT {
            return Err(std::io::Error::other("rendered prompt too large"));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn template_error(e: minijinja::Error) -> ModelError {
    if e.kind() == minijinja::ErrorKind::WriteFailure {
        return ModelError::Template(format!("rendered prompt exceeds {MAX_OUTPUT} bytes"));
    }
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        msg.push_str(&format!(": {s}"));
        source = s.source();
    }
    ModelError::Template(msg)
}

impl ChatTemplate {
    /// Compiles `source`; fails if it does not parse.
    pub fn new(source: &str, bos_token: Option<String>, eos_token: Option<String>) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        minijinja_contrib::add_to_environment(&mut env);
        env.add_filter("tojson", builtins::tojson);
        env.add_function("raise_exception", builtins::raise_exception);
        env.add_function("strftime_now", builtins::strftime_now);
        env.add_template_owned(TEMPLATE_NAME, builtins::strip_generation_tags(source)).map_err(template_error)?;
        let mut t = ChatTemplate { env, source: source.to_string(), bos_token, eos_token, sandbox: None };
        t.sandbox = sandbox::Pool::new(&t);
        Ok(t)
    }

    /// Renders `messages` (OpenAI-style message objects), with the end offset of every message:
    /// in a sandbox worker when [`sandbox::enable`] was called, else in this process.
    pub fn render(&self, messages: &[serde_json::Value], opts: &RenderOptions) -> Result<Rendered> {
        match &self.sandbox {
            Some(pool) => pool.render(messages, opts),
            None => self.render_local(messages, opts),
        }
    }

    /// [`Self::render`] in this process (what a sandbox worker runs).
    pub fn render_local(&self, messages: &[serde_json::Value], opts: &RenderOptions) -> Result<Rendered> {
        // Convert once; prefixes share the (reference-counted) message values.
        let values: Vec<Value> = messages.iter().map(Value::from_serialize).collect();
        let globals = self.globals(opts);
        let text = self.render_values(&globals, &values, opts.add_generation_prompt)?;
        let mut message_ends = Vec::with_capacity(messages.len());
        let mut last = 0;
        let first = values.len().saturating_sub(BOUNDARY_MESSAGES);
        for i in 0..values.len() {
            let end = if i < first {
                0
            } else if i + 1 == values.len() && !opts.add_generation_prompt {
                text.len()
            } else {
                match self.render_values(&globals, &values[..=i], false) {
                    Ok(prefix) => common_prefix_len(&text, &prefix),
                    Err(_) => last,
                }
            };
            last = last.max(end);
            message_ends.push(last);
        }
        Ok(Rendered { text, message_ends })
    }

    /// The template source as given.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Template globals other than `messages` and `add_generation_prompt`, in transformers'
    /// order of precedence: special tokens, then `extra` (which may override them).
    fn globals(&self, opts: &RenderOptions) -> Vec<(String, Value)> {
        let mut ctx: Vec<(String, Value)> = Vec::new();
        if let Some(b) = &self.bos_token {
            ctx.push(("bos_token".into(), Value::from(b.as_str())));
        }
        if let Some(e) = &self.eos_token {
            ctx.push(("eos_token".into(), Value::from(e.as_str())));
        }
        for (k, v) in &opts.extra {
            ctx.push((k.clone(), Value::from_serialize(v)));
        }
        let tools = opts.tools.as_ref().map(Value::from_serialize).unwrap_or(Value::from(()));
        ctx.push(("tools".into(), tools));
        ctx.push(("documents".into(), Value::from(())));
        ctx
    }

    fn render_values(
        &self,
        globals: &[(String, Value)],
        messages: &[Value],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let ctx: Value = globals
            .iter()
            .cloned()
            .chain([
                ("messages".to_string(), Value::from(messages.to_vec())),
                ("add_generation_prompt".to_string(), Value::from(add_generation_prompt)),
            ])
            .collect();
        let tmpl = self.env.get_template(TEMPLATE_NAME).map_err(template_error)?;
        let mut out = BoundedWriter(Vec::new());
        tmpl.render_captured_to(ctx, &mut out).map_err(template_error)?;
        String::from_utf8(out.0).map_err(|e| ModelError::Template(format!("non-UTF-8 output: {e}")))
    }
}

/// Length of the longest common prefix of `a` and `b`, at a char boundary of `a`.
fn common_prefix_len(a: &str, b: &str) -> usize {
    let mut n = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    while !a.is_char_boundary(n) {
        n -= 1;
    }
    n
}

/// The chat template a Hugging Face model directory ships: `chat_template.jinja`, else the
/// `chat_template` of `tokenizer_config.json` (a string, or a list of named templates, of
/// which the one named `default` — or the first — is taken).
pub fn hf_chat_template(dir: &Path) -> Result<Option<String>> {
    let jinja = dir.join("chat_template.jinja");
    match std::fs::read_to_string(&jinja) {
        Ok(s) => return Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(ModelError::io(&jinja, e)),
    }
    let cfg_path = dir.join("tokenizer_config.json");
    let text = match std::fs::read_to_string(&cfg_path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ModelError::io(&cfg_path, e)),
    };
    let cfg: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| ModelError::Template(format!("{}: {e}", cfg_path.display())))?;
    Ok(match cfg.get("chat_template") {
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(serde_json::Value::Array(list)) => {
            let named = |n: &str| list.iter().find(|t| t.get("name").and_then(|v| v.as_str()) == Some(n));
            named("default")
                .or_else(|| list.first())
                .and_then(|t| t.get("template"))
                .and_then(|t| t.as_str())
                .map(str::to_string)
        }
        _ => None,
    })
}

/// The chat template stored in a GGUF (`tokenizer.chat_template`).
pub fn gguf_chat_template(content: &candle_core::quantized::gguf_file::Content) -> Option<String> {
    match content.metadata.get("tokenizer.chat_template")? {
        candle_core::quantized::gguf_file::Value::String(s) => Some(s.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests;

//! Rendering chat templates in a separate process with an address-space limit and a deadline,
//! so that a hostile template from a model file (one that builds a gigabyte string, or joins a
//! 100 MB string a hundred times) fails the request that rendered it, never the server.
//!
//! minijinja's fuel bounds the instructions a render executes, not the memory or time a single
//! instruction takes (`"x" * n`, `s ~ s` doubled in a loop, `join` over large strings), and a
//! failed allocation aborts a Rust process. As Jinja's maintainers advise for untrusted
//! templates, the limit is set by the OS: the CLI turns the sandbox on at start
//! ([`enable`], with its own executable as the worker), and every [`super::ChatTemplate::render`]
//! then goes to one of [`WORKERS`] long-lived worker processes (`tandem __render-template`,
//! [`worker_main`]) that have `RLIMIT_AS` set to their size at start plus [`MEMORY_LIMIT`] and
//! answer within [`DEADLINE`], or are killed. A worker that dies or is killed is replaced on the
//! next render; the request gets an error saying which limit the template hit.
//!
//! The protocol is JSON lines over the worker's stdin / stdout: first the template (source and
//! special tokens), then one request per line (`messages`, `add_generation_prompt`, `tools`,
//! `extra`), each answered with `{"ok": {"text", "message_ends"}}` or `{"err": "..."}`.
//! Without [`enable`] (library use, unit tests) templates render in-process.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use serde_json::{json, Value};

use super::{ChatTemplate, RenderOptions, Rendered};
use crate::error::{ModelError, Result};

/// Memory a worker may take beyond its size at start.
pub const MEMORY_LIMIT: u64 = 1 << 30;
/// Longest a render may take.
pub const DEADLINE: Duration = Duration::from_secs(5);
/// Worker processes per template (renders beyond this many at once wait their turn).
pub const WORKERS: usize = 2;
/// The argument that makes the `tandem` binary a render worker.
pub const WORKER_ARG: &str = "__render-template";

static WORKER_EXE: OnceLock<PathBuf> = OnceLock::new();

/// Renders every chat template of this process in workers started from `exe` (which must call
/// [`worker_main`] when given [`WORKER_ARG`]). Call once, at start.
pub fn enable(exe: PathBuf) {
    let _ = WORKER_EXE.set(exe);
}

/// One worker process: its stdin, and its stdout lines arriving on a channel (a reader thread),
/// so a reply can be awaited with a deadline.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl Worker {
    fn spawn(exe: &PathBuf, header: &str) -> Result<Self> {
        let mut child = Command::new(exe)
            .arg(WORKER_ARG)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| ModelError::Template(format!("cannot start the template sandbox ({}): {e}", exe.display())))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            return Err(ModelError::Template("template sandbox without pipes".into()));
        };
        let (tx, lines) = mpsc::channel();
        std::thread::Builder::new()
            .name("template-sandbox".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| ModelError::Template(format!("template sandbox reader: {e}")))?;
        let mut w = Worker { child, stdin, lines };
        w.send(header)?;
        Ok(w)
    }

    fn send(&mut self, line: &str) -> Result<()> {
        let io = |e: std::io::Error| ModelError::Template(format!("template sandbox: {e}"));
        self.stdin.write_all(line.as_bytes()).map_err(io)?;
        self.stdin.write_all(b"\n").map_err(io)?;
        self.stdin.flush().map_err(io)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The workers of one template.
pub(super) struct Pool {
    header: String,
    slots: Vec<Mutex<Option<Worker>>>,
}

impl Pool {
    /// `None` unless the sandbox is [`enable`]d.
    pub(super) fn new(t: &ChatTemplate) -> Option<Self> {
        WORKER_EXE.get()?;
        let header = json!({"source": t.source, "bos": t.bos_token, "eos": t.eos_token}).to_string();
        Some(Pool { header, slots: (0..WORKERS).map(|_| Mutex::new(None)).collect() })
    }

    pub(super) fn render(&self, messages: &[Value], opts: &RenderOptions) -> Result<Rendered> {
        let exe = WORKER_EXE.get().ok_or_else(|| ModelError::Template("template sandbox not enabled".into()))?;
        let req = json!({
            "messages": messages,
            "add_generation_prompt": opts.add_generation_prompt,
            "tools": opts.tools,
            "extra": opts.extra,
        })
        .to_string();
        // A free worker if there is one, else wait for the first.
        let mut slot = self
            .slots
            .iter()
            .find_map(|s| s.try_lock().ok())
            .unwrap_or_else(|| self.slots[0].lock().unwrap_or_else(|p| p.into_inner()));
        if slot.is_none() {
            *slot = Some(Worker::spawn(exe, &self.header)?);
        }
        let w = slot.as_mut().ok_or_else(|| ModelError::Template("template sandbox unavailable".into()))?;
        if let Err(e) = w.send(&req) {
            *slot = None;
            return Err(e);
        }
        match w.lines.recv_timeout(DEADLINE) {
            Ok(line) => parse_reply(&line),
            Err(RecvTimeoutError::Timeout) => {
                *slot = None; // killed on drop
                Err(ModelError::Template(format!(
                    "the chat template took longer than {} s to render; it was stopped",
                    DEADLINE.as_secs()
                )))
            }
            Err(RecvTimeoutError::Disconnected) => {
                *slot = None;
                Err(ModelError::Template(format!(
                    "the chat template exceeded its memory limit ({} MiB) while rendering",
                    MEMORY_LIMIT >> 20
                )))
            }
        }
    }
}

fn parse_reply(line: &str) -> Result<Rendered> {
    let v: Value =
        serde_json::from_str(line).map_err(|e| ModelError::Template(format!("template sandbox reply: {e}")))?;
    if let Some(e) = v.get("err").and_then(Value::as_str) {
        return Err(ModelError::Template(e.to_string()));
    }
    let ok = v.get("ok").ok_or_else(|| ModelError::Template("template sandbox reply without a result".into()))?;
    let text = ok.get("text").and_then(Value::as_str).unwrap_or_default().to_string();
    let message_ends = ok
        .get("message_ends")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).map(|x| x as usize).collect())
        .unwrap_or_default();
    Ok(Rendered { text, message_ends })
}

/// Caps this process's address space at its current size plus `extra` bytes, and its CPU time.
#[cfg(unix)]
fn limit_self(extra: u64) {
    let vm = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|p| p.parse::<u64>().ok()))
        .map(|pages| pages * 4096);
    // Without /proc (macOS) a fixed cap that leaves room for the executable's mappings.
    let cap = vm.unwrap_or(2 << 30) + extra;
    let set = |res, v: u64| {
        let lim = libc::rlimit { rlim_cur: v as libc::rlim_t, rlim_max: v as libc::rlim_t };
        // SAFETY: setrlimit reads the struct it is given; nothing else is touched.
        unsafe { libc::setrlimit(res, &lim) };
    };
    set(libc::RLIMIT_AS, cap);
    // A backstop to the parent's deadline: the worker's whole life, not one render.
    set(libc::RLIMIT_CPU, 3600);
}

#[cfg(not(unix))]
fn limit_self(_extra: u64) {}

/// The worker: limits itself, reads the template, then answers requests until stdin closes.
pub fn worker_main() -> ! {
    limit_self(MEMORY_LIMIT);
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    let mut lines = stdin.lock().lines();
    let template = lines.next().and_then(|l| l.ok()).and_then(|l| serde_json::from_str::<Value>(&l).ok()).map(|h| {
        let s = |k: &str| h.get(k).and_then(Value::as_str).map(str::to_string);
        ChatTemplate::new(&s("source").unwrap_or_default(), s("bos"), s("eos"))
    });
    for line in lines {
        let Ok(line) = line else { break };
        let reply = match (&template, serde_json::from_str::<Value>(&line)) {
            (Some(Ok(t)), Ok(req)) => {
                let messages = req.get("messages").and_then(Value::as_array).cloned().unwrap_or_default();
                let opts = RenderOptions {
                    add_generation_prompt: req.get("add_generation_prompt").and_then(Value::as_bool).unwrap_or(false),
                    tools: req.get("tools").filter(|v| !v.is_null()).cloned(),
                    extra: req.get("extra").and_then(Value::as_object).cloned().unwrap_or_default(),
                };
                match t.render_local(&messages, &opts) {
                    Ok(r) => json!({"ok": {"text": r.text, "message_ends": r.message_ends}}),
                    Err(e) => json!({"err": e.to_string()}),
                }
            }
            (Some(Err(e)), _) => json!({"err": e.to_string()}),
            (None, _) => json!({"err": "template sandbox: no template"}),
            (_, Err(e)) => json!({"err": format!("template sandbox request: {e}")}),
        };
        if writeln!(out, "{reply}").and_then(|_| out.flush()).is_err() {
            break;
        }
    }
    std::process::exit(0)
}

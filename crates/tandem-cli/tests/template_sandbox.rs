//! Hostile chat templates (issue: hardening) against `tandem serve`: a template that doubles a
//! string 40 times, one that repeats a string a trillion times, and one that concatenates 100 MB
//! strings for minutes fail the request that rendered them (the sandbox worker hits its memory
//! limit or deadline) while the server keeps serving: a normal request right after each
//! succeeds within a second. And 8,000 one-character messages render in linear time.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::root;

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The triggers: the first message's content picks the hostile branch.
const TEMPLATE: &str = "{% if messages[0]['content'] == 'double' %}{% set ns = namespace(s='ab') %}\
{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}\
{% elif messages[0]['content'] == 'repeat' %}{{ ('x' * 1000000000000)|length }}\
{% elif messages[0]['content'] == 'slow' %}{% set s = 'x' * 50000000 %}{% for i in range(100000) %}\
{% set t = s ~ s %}{% endfor %}{% endif %}\
{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}\
{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// The tiny Qwen2 fixture with [`TEMPLATE`] as its chat template.
fn hostile_model() -> PathBuf {
    let src = root().join("fixtures/tiny/qwen2");
    let dir = root().join("target/test-template-sandbox").join(std::process::id().to_string());
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("tokenizer_config.json")).unwrap()).unwrap();
    cfg["chat_template"] = TEMPLATE.into();
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
    dir
}

/// POSTs a chat request with these message contents; the status code and body.
fn chat(port: u16, contents: &[&str]) -> (u16, String) {
    let messages: Vec<_> = contents.iter().map(|c| serde_json::json!({"role": "user", "content": c})).collect();
    let body = serde_json::json!({"messages": messages, "max_tokens": 2, "temperature": 0}).to_string();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let code = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, out)
}

fn serve(model: &Path) -> (Server, u16) {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let server = Server(
        Command::new(env!("CARGO_BIN_EXE_tandem"))
            .args(["serve", "-m", model.to_str().unwrap(), "--port", &port.to_string(), "-t", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let t0 = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(60), "tandem serve did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    (server, port)
}

#[test]
fn hostile_templates_fail_their_request_and_the_server_keeps_serving() {
    let model = hostile_model();
    let (mut server, port) = serve(&model);
    let (code, body) = chat(port, &["hello"]);
    assert_eq!(code, 200, "{body}");
    // minijinja 2.24 refuses a repetition beyond its range limit itself; doubling by
    // concatenation it does not catch. The doubling meets the memory limit in about a second
    // here, but on a busy machine the 5 s render limit can stop it first (seen once in the
    // full suite, 2026-12-07): either of the sandbox's limits is the right answer.
    let limits: [(&str, &[&str]); 3] =
        [("double", &["memory limit", "longer than"]), ("repeat", &["too large"]), ("slow", &["longer than"])];
    for (trigger, want) in limits {
        let t0 = Instant::now();
        let (code, body) = chat(port, &[trigger]);
        assert_eq!(code, 400, "{trigger}: {body}");
        assert!(want.iter().any(|w| body.contains(w)), "{trigger}: {body}");
        assert!(t0.elapsed() < Duration::from_secs(30), "{trigger} took {:?}", t0.elapsed());
        let t1 = Instant::now();
        let (code, body) = chat(port, &["hello"]);
        assert_eq!(code, 200, "after {trigger}: {body}");
        assert!(t1.elapsed() < Duration::from_secs(1), "after {trigger}: {:?}", t1.elapsed());
    }
    assert!(server.0.try_wait().unwrap().is_none(), "the server exited");
    // 8,000 one-character messages: boundaries for the last few only, so linear time.
    let many: Vec<&str> = (0..8000).map(|_| "a").collect();
    let t0 = Instant::now();
    let (code, body) = chat(port, &many);
    // The tiny fixture's context is shorter than this prompt: a clean 400 either way.
    assert!(code == 200 || code == 400, "{body}");
    assert!(t0.elapsed() < Duration::from_secs(10), "8,000 messages took {:?}", t0.elapsed());
    let _ = std::fs::remove_dir_all(&model);
}

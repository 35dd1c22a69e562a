//! `tandem bench sweep`, `tandem bench agent` and `tandem bench report` end to end on the tiny
//! fixture: a sweep with a runnable and an unsupported cell that resumes, and an agent run
//! against `tandem serve` whose report merges with itself.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{root, tandem};

fn out_dir(name: &str) -> PathBuf {
    let d = root().join("target/test-bench-suites").join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn sweep_runs_skips_and_resumes() {
    let model = root().join("fixtures/tiny/llama");
    let out = out_dir("sweep");
    let args = [
        "bench",
        "sweep",
        "-m",
        model.to_str().unwrap(),
        "-t",
        "1",
        "--weights",
        "native,q4_0,fp3",
        "--kv",
        "f32",
        "--chunks",
        "32",
        "--prompts",
        "64",
        "--gen",
        "4",
        "--ppl-tokens",
        "32",
        "--ppl-window",
        "16",
        "-o",
        out.to_str().unwrap(),
    ];
    let o = tandem(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let read = || -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(out.join("sweep.json")).unwrap()).unwrap()
    };
    let v = read();
    let cells = v["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 3);
    assert_eq!(cells[0]["outcome"]["status"], "done");
    assert!(cells[0]["outcome"]["peak_rss_bytes"].as_u64().unwrap() > 0);
    // Quantised at load.
    assert_eq!(cells[1]["outcome"]["status"], "done");
    assert_ne!(cells[1]["outcome"]["perplexity"], cells[0]["outcome"]["perplexity"]);
    assert_eq!(cells[2]["outcome"]["status"], "skipped");
    for f in ["sweep.md", "sweep_memory.png", "sweep_memory.svg"] {
        assert!(out.join(f).exists(), "{f}");
    }
    // Resume: the done cell keeps its measurement.
    let o = tandem(&args);
    assert!(o.status.success());
    assert_eq!(read()["cells"][0]["outcome"], v["cells"][0]["outcome"]);
    let o =
        tandem(&["bench", "report", out.join("sweep.json").to_str().unwrap(), "-o", out.join("r").to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.join("r/sweep_memory.svg").exists());
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether the server on `port` answers `GET /v1/models` with 200 (so it is ours and up).
fn answers_models(port: &str) -> bool {
    use std::io::{Read, Write};
    let Ok(mut c) = std::net::TcpStream::connect(format!("127.0.0.1:{port}")) else { return false };
    let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
    if c.write_all(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    c.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.1 200")
}

/// `tandem serve` on a free port, up once it answers; a server that exits first (its port
/// taken by another process between our probe and its bind) is started again on another port.
fn start_server(model: &std::path::Path) -> (Server, String) {
    for _ in 0..5 {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
        let mut server = Server(
            Command::new(env!("CARGO_BIN_EXE_tandem"))
                .args(["serve", "-m", model.to_str().unwrap(), "--port", &port, "-t", "1"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let t0 = Instant::now();
        loop {
            if server.0.try_wait().unwrap().is_some() {
                break; // exited: try another port
            }
            if answers_models(&port) {
                return (server, format!("http://127.0.0.1:{port}"));
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "tandem serve did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    panic!("tandem serve exited at start five times");
}

#[test]
fn agent_against_tandem_serve() {
    let model = root().join("fixtures/tiny/qwen2");
    let (_server, url) = start_server(&model);
    let out = out_dir("agent");
    let o = tandem(&[
        "bench",
        "agent",
        "--endpoint",
        &url,
        "--label",
        "tandem",
        "--tokenizer",
        model.to_str().unwrap(),
        "--sessions",
        "2",
        "--shared-prefix",
        "48",
        "--context",
        "16",
        "--turns",
        "3",
        "--tool-tokens",
        "8-16",
        "--user-tokens",
        "4",
        "--max-tokens",
        "4",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("agent.json")).unwrap()).unwrap();
    let sys = &v["systems"][0];
    assert_eq!(sys["overall"]["requests"], 6);
    assert_eq!(sys["overall"]["errors"], 0, "{sys}");
    assert_eq!(sys["overall"]["output_tokens"], 24);
    // Later turns reuse the earlier ones' KV through the prefix cache.
    let turn3_cached = sys["turns"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["turn"] == 3)
        .all(|t| t["cached_tokens"].as_u64().unwrap() > 0);
    assert!(turn3_cached, "{sys}");
    assert!(v["exact_counts"].as_bool().unwrap());
    let j = out.join("agent.json");
    let o =
        tandem(&["bench", "report", j.to_str().unwrap(), j.to_str().unwrap(), "-o", out.join("m").to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let merged: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("m/agent.json")).unwrap()).unwrap();
    assert_eq!(merged["systems"].as_array().unwrap().len(), 2);
}

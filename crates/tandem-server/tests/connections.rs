//! Connection-level abuse over real sockets: idle connections that never send a request, a
//! burst above the connection limit, a connection that stops half-way through its headers and
//! a slow body. None of them may lock other clients out: a normal request right after each
//! burst is answered within a second, and the server closes what it gave up on.

mod common;

use std::time::{Duration, Instant};

use common::fake::Fake;
use common::Server;
use tandem_server::ServerConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LIMIT: usize = 16;

fn cfg() -> ServerConfig {
    ServerConfig {
        port: 0,
        max_connections: LIMIT,
        header_read_timeout: Duration::from_millis(800),
        body_read_timeout: Duration::from_millis(800),
        ..ServerConfig::default()
    }
}

fn addr(s: &Server) -> String {
    s.url("").trim_start_matches("http://").to_string()
}

/// `GET /health` on a fresh connection; the status and how long it took.
async fn health(addr: &str) -> (u16, Duration) {
    let t0 = Instant::now();
    let mut c = TcpStream::connect(addr).await.expect("connect");
    c.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await.expect("write");
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut buf)).await;
    let text = String::from_utf8_lossy(&buf);
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, t0.elapsed())
}

/// Whether the server closed `c` (EOF or reset) within `within`.
async fn closed_by_server(c: &mut TcpStream, within: Duration) -> bool {
    let mut b = [0u8; 512];
    loop {
        match tokio::time::timeout(within, c.read(&mut b)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue, // e.g. a 408 before the close
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_cannot_lock_clients_out() {
    let s = Server::start(Fake::new(4096), cfg()).await;
    let a = addr(&s);
    assert_eq!(health(&a).await.0, 200);
    // Four times the limit of connections that never send a byte.
    let mut idle = Vec::new();
    for _ in 0..4 * LIMIT {
        idle.push(TcpStream::connect(&a).await.expect("connect"));
    }
    // A client arriving now displaces the oldest idle connection and is served at once.
    let (status, took) = health(&a).await;
    assert_eq!(status, 200, "health during the idle burst");
    assert!(took < Duration::from_secs(1), "health took {took:?}");
    // The server closes idle connections: displaced ones at once, the rest at the header timeout.
    for c in idle.iter_mut() {
        assert!(closed_by_server(c, Duration::from_secs(3)).await, "an idle connection stayed open");
    }
    assert_eq!(health(&a).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_headers_and_slow_bodies_time_out() {
    let s = Server::start(Fake::new(4096), cfg()).await;
    let a = addr(&s);
    // Headers that never end.
    let mut c = TcpStream::connect(&a).await.unwrap();
    c.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n").await.unwrap();
    assert!(closed_by_server(&mut c, Duration::from_secs(3)).await, "half-sent headers kept the connection");
    // A body that promises 1000 bytes and sends 10.
    let mut c = TcpStream::connect(&a).await.unwrap();
    c.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"prompt\":")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(3), c.read(&mut buf)).await.expect("an answer").unwrap_or(0);
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(text.starts_with("HTTP/1.1 408") || text.starts_with("HTTP/1.1 4"), "slow body answered {text:?}");
    let (status, took) = health(&a).await;
    assert_eq!(status, 200);
    assert!(took < Duration::from_secs(1), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_limit_with_every_connection_busy_new_ones_get_503_at_once() {
    let s = Server::start(Fake::new(4096), cfg()).await;
    let a = addr(&s);
    // Fill the table with connections that have started a request (headers sent, body pending).
    let mut busy = Vec::new();
    for _ in 0..LIMIT {
        let mut c = TcpStream::connect(&a).await.unwrap();
        c.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{")
            .await
            .unwrap();
        busy.push(c);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (status, took) = health(&a).await;
    assert_eq!(status, 503, "a connection past the limit while all are busy");
    assert!(took < Duration::from_secs(1), "{took:?}");
    // Once the slow bodies time out, service resumes.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    drop(busy);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(health(&a).await.0, 200);
}

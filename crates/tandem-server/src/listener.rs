//! The accept loop: every connection is served by hyper with a header-read timeout (idle and
//! keep-alive connections close), the number of open connections is bounded below the file
//! descriptor limit, and connections that never sent a request are the first to go when the
//! bound is reached, so idle sockets cannot lock clients out. Graceful shutdown lets requests
//! in flight finish.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

/// Limits the accept loop applies.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
}

/// One open connection: whether it has sent a request yet, and how to close it.
struct Slot {
    id: u64,
    started: Arc<AtomicBool>,
    abort: tokio::task::AbortHandle,
}

#[derive(Default)]
struct Table {
    slots: VecDeque<Slot>,
}

impl Table {
    /// Makes room for one more connection: true when there is room (possibly after closing the
    /// oldest connection that never sent a request).
    fn make_room(&mut self, max: usize) -> bool {
        if self.slots.len() < max {
            return true;
        }
        match self.slots.iter().position(|s| !s.started.load(Ordering::Relaxed)) {
            Some(i) => {
                if let Some(s) = self.slots.remove(i) {
                    s.abort.abort();
                }
                true
            }
            None => false,
        }
    }

    fn remove(&mut self, id: u64) {
        self.slots.retain(|s| s.id != id);
    }
}

const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: 97\r\n\r\n{\"error\":{\"message\":\"Too many open connections; retry shortly.\",\"type\":\"server_busy\",\"code\":503}}";

/// Serves `app` on `listener` until `shutdown` resolves, then waits for open requests.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let table = Arc::new(Mutex::new(Table::default()));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut next_id = 0u64;
    tokio::pin!(shutdown);
    loop {
        let (stream, peer): (tokio::net::TcpStream, SocketAddr) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!("accept error: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let room = table.lock().map(|mut t| t.make_room(limits.max_connections)).unwrap_or(false);
        if !room {
            tokio::spawn(async move {
                let mut stream = stream;
                let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(BUSY)).await;
            });
            tracing::debug!(%peer, "connection refused: at the connection limit");
            continue;
        }
        let _ = stream.set_nodelay(true);
        next_id += 1;
        let id = next_id;
        let started = Arc::new(AtomicBool::new(false));
        let flag = started.clone();
        let svc = tower::util::MapRequestLayer::new(move |req: axum::http::Request<hyper::body::Incoming>| {
            flag.store(true, Ordering::Relaxed);
            req
        });
        let svc = TowerToHyperService::new(tower::Layer::layer(&svc, app.clone()));
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
        builder.http2().timer(TokioTimer::new()).keep_alive_interval(Some(limits.header_read_timeout));
        let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), svc).into_owned();
        let watched = graceful.watch(conn);
        let t = table.clone();
        // The slot goes in before the task can end, so its removal always finds it.
        let mut guard = match table.lock() {
            Ok(g) => g,
            Err(_) => continue,
        };
        let (first_request, deadline) = (started.clone(), limits.header_read_timeout);
        let handle = tokio::spawn(async move {
            tokio::pin!(watched);
            // hyper's header timeout starts once it knows the protocol; a connection that sends
            // nothing at all is closed here when it has not started a request in time.
            tokio::select! {
                _ = &mut watched => {}
                () = tokio::time::sleep(deadline) => {
                    if first_request.load(Ordering::Relaxed) {
                        let _ = watched.await;
                    }
                }
            }
            if let Ok(mut t) = t.lock() {
                t.remove(id);
            }
        });
        guard.slots.push_back(Slot { id, started, abort: handle.abort_handle() });
        drop(guard);
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(Duration::from_secs(30)) => tracing::warn!("shutdown: gave up waiting for open requests"),
    }
    Ok(())
}

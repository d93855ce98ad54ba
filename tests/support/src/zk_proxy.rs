//! A TCP proxy that reads ZooKeeper's client-to-server frames, so a test can lose the reply to
//! one chosen request: it forwards the request, then closes the connection (FIN both ways)
//! before any reply comes back. The server still applies the request; the client sees a
//! connection loss and reconnects (through the proxy) with the same session.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// ZooKeeper request types (`ZooDefs.OpCode`), for [`ZkFrameProxy::lose_reply_to`].
pub mod zk_op {
    /// `create`.
    pub const CREATE: i32 = 1;
    /// `delete`.
    pub const DELETE: i32 = 2;
    /// `getChildren`.
    pub const GET_CHILDREN: i32 = 8;
    /// `getChildren2` (with the parent's Stat).
    pub const GET_CHILDREN2: i32 = 12;
    /// `create2` (with the new node's Stat).
    pub const CREATE2: i32 = 15;
}

/// A proxy from a free loopback port to a ZooKeeper server, losing chosen replies.
#[derive(Debug)]
pub struct ZkFrameProxy {
    /// The port clients connect to.
    pub port: u16,
    /// Armed rules, in order: the request types of which the next one loses its reply, and
    /// whether the client then sees a reset instead of a close.
    rules: Rules,
}

type Rules = Arc<Mutex<VecDeque<(Vec<i32>, bool)>>>;

impl ZkFrameProxy {
    /// Starts forwarding `127.0.0.1:{port}` to `target` (`host:port`).
    ///
    /// # Panics
    /// When it cannot bind a loopback port.
    pub async fn start(target: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let rules: Rules = Arc::default();
        let shared = Arc::clone(&rules);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (target, rules) = (target.clone(), Arc::clone(&shared));
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&target).await {
                        relay(client, server, rules).await;
                    }
                });
            }
        });
        ZkFrameProxy { port, rules }
    }

    /// Arms a rule: the next request of one of `ops` is forwarded, and then its connection is
    /// closed before the reply. Rules apply one after another, on whatever connection.
    pub fn lose_reply_to(&self, ops: &[i32]) {
        self.arm(ops, false);
    }

    /// As [`lose_reply_to`](Self::lose_reply_to), but the client's connection is reset (RST),
    /// which the client reports as an I/O error rather than a connection loss.
    pub fn reset_after(&self, ops: &[i32]) {
        self.arm(ops, true);
    }

    fn arm(&self, ops: &[i32], reset: bool) {
        self.rules
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back((ops.to_vec(), reset));
    }

    /// Drops every rule that has not fired.
    pub fn disarm(&self) {
        self.rules
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// How many armed rules have not fired yet.
    pub fn armed(&self) -> usize {
        self.rules
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

async fn relay(client: TcpStream, server: TcpStream, rules: Rules) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let stop = Arc::new(tokio::sync::Notify::new());
    let down = tokio::spawn({
        let stop = Arc::clone(&stop);
        async move {
            tokio::select! {
                _ = tokio::io::copy(&mut sr, &mut cw) => {}
                () = stop.notified() => {}
            }
            cw
        }
    });
    let mut first = true;
    // One client frame per pass: a 4-byte length, then the frame (the first is the connect
    // request, which has no request header; the others start with xid and type).
    loop {
        let mut len = [0u8; 4];
        if cr.read_exact(&mut len).await.is_err() {
            break;
        }
        let size = usize::try_from(i32::from_be_bytes(len)).unwrap_or(0);
        let mut frame = vec![0u8; size];
        if cr.read_exact(&mut frame).await.is_err() {
            break;
        }
        let op = (!first && size >= 8)
            .then(|| i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]));
        first = false;
        let lose = op.and_then(|op| {
            let mut rules = rules.lock().unwrap_or_else(PoisonError::into_inner);
            let hit = rules.front().is_some_and(|(ops, _)| ops.contains(&op));
            if hit {
                rules.pop_front().map(|(_, reset)| reset)
            } else {
                None
            }
        });
        if let Some(reset) = lose {
            // Stop the replies first: this request's must never reach the client. Then the
            // request goes to the server, which applies it, and both sides are closed: the
            // client's with FIN, or with RST (no FIN first, zero linger) for `reset`.
            stop.notify_one();
            let cw = down.await;
            if reset {
                // Deprecated because a non-zero linger blocks on drop; zero resets at once.
                #[allow(deprecated)]
                let _ = cr.as_ref().set_linger(Some(std::time::Duration::ZERO));
                if let Ok(cw) = cw {
                    cw.forget();
                }
            }
            let _ = sw.write_all(&len).await;
            let _ = sw.write_all(&frame).await;
            let _ = sw.shutdown().await;
            return;
        }
        if sw.write_all(&len).await.is_err() || sw.write_all(&frame).await.is_err() {
            break;
        }
    }
    let _ = sw.shutdown().await;
    if let Ok(mut cw) = down.await {
        let _ = cw.shutdown().await;
    }
}

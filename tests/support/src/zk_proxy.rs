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
    /// `sync` (fencelock's session probe).
    pub const SYNC: i32 = 9;
    /// `ping`.
    pub const PING: i32 = 11;
    /// `multiRead`.
    pub const MULTI_READ: i32 = 22;
}

/// How long [`ZkFrameProxy::hold_replies_after`] holds the replies at most.
const HOLD_AT_MOST: std::time::Duration = std::time::Duration::from_secs(3);

/// A proxy from a free loopback port to a ZooKeeper server, losing chosen replies.
#[derive(Debug)]
pub struct ZkFrameProxy {
    /// The port clients connect to.
    pub port: u16,
    /// Armed rules, in order: the request types of which the next one loses its reply, and
    /// whether the client then sees a reset instead of a close.
    rules: Rules,
    hold: Arc<Hold>,
}

type Rules = Arc<Mutex<VecDeque<(Vec<i32>, bool)>>>;

/// [`ZkFrameProxy::hold_replies_after`]'s state.
#[derive(Debug, Default)]
struct Hold {
    state: Mutex<HoldState>,
}

#[derive(Debug, Default)]
struct HoldState {
    /// The request type that starts a hold, and how many of its requests pass first.
    armed: Option<(i32, usize)>,
    /// Replies are being held.
    holding: bool,
    /// The requests the client sent while replies were held, in order.
    sent_while_held: Vec<i32>,
}

impl ZkFrameProxy {
    /// Starts forwarding `127.0.0.1:{port}` to `target` (`host:port`).
    ///
    /// # Panics
    /// When it cannot bind a loopback port.
    pub async fn start(target: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let rules: Rules = Arc::default();
        let hold: Arc<Hold> = Arc::default();
        let (shared, held) = (Arc::clone(&rules), Arc::clone(&hold));
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (target, rules, hold) =
                    (target.clone(), Arc::clone(&shared), Arc::clone(&held));
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&target).await {
                        relay(client, server, rules, hold).await;
                    }
                });
            }
        });
        ZkFrameProxy { port, rules, hold }
    }

    /// Arms a hold: from the next request of type `op` on, the server's replies are held back
    /// from the client, until the client has sent one more request (pings and syncs, which
    /// the session sends on its own clock, do not count) or 3 s have passed.
    /// [`sent_while_held`](Self::sent_while_held) then tells which requests the client sent
    /// without waiting for the reply to `op`: the requests it pipelined behind it.
    pub fn hold_replies_after(&self, op: i32) {
        self.hold_replies_after_nth(op, 1);
    }

    /// As [`hold_replies_after`](Self::hold_replies_after), from the `n`th next request of
    /// type `op` on (1 for the next).
    pub fn hold_replies_after_nth(&self, op: i32, n: usize) {
        let mut state = self
            .hold
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        state.armed = Some((op, n.saturating_sub(1)));
        state.sent_while_held.clear();
    }

    /// The requests the client sent while the last hold lasted (the held request first).
    pub fn sent_while_held(&self) -> Vec<i32> {
        self.hold
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .sent_while_held
            .clone()
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

async fn relay(client: TcpStream, server: TcpStream, rules: Rules, hold: Arc<Hold>) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let stop = Arc::new(tokio::sync::Notify::new());
    let down = tokio::spawn({
        let (stop, hold) = (Arc::clone(&stop), Arc::clone(&hold));
        async move {
            tokio::select! {
                () = copy_unless_held(&mut sr, &mut cw, &hold) => {}
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
        if let Some(op) = op {
            let mut state = hold.state.lock().unwrap_or_else(PoisonError::into_inner);
            if state.holding {
                state.sent_while_held.push(op);
            } else if let Some((armed, before)) = state.armed.filter(|(armed, _)| *armed == op) {
                if before > 0 {
                    state.armed = Some((armed, before - 1));
                } else {
                    // Held before the request goes out: its reply cannot overtake the hold.
                    state.armed = None;
                    state.holding = true;
                    state.sent_while_held.push(op);
                }
            }
        }
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

/// Copies the server's bytes to the client; while a hold lasts (`Hold::holding`), the bytes
/// read wait, until the client has sent a second request or [`HOLD_AT_MOST`] has passed.
async fn copy_unless_held(
    sr: &mut tokio::net::tcp::OwnedReadHalf,
    cw: &mut tokio::net::tcp::OwnedWriteHalf,
    hold: &Hold,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match sr.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let held_since = std::time::Instant::now();
        // Bounded: the hold ends once the client sent a second request, or after at most
        // HOLD_AT_MOST.
        loop {
            {
                let mut state = hold.state.lock().unwrap_or_else(PoisonError::into_inner);
                let sent = state
                    .sent_while_held
                    .iter()
                    .filter(|op| !is_probe(**op))
                    .count();
                let over = sent >= 2 || held_since.elapsed() >= HOLD_AT_MOST;
                if !state.holding || over {
                    state.holding = false;
                    break;
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        if cw.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

/// A request the session sends on its own clock, not for an operation.
fn is_probe(op: i32) -> bool {
    op == zk_op::PING || op == zk_op::SYNC
}

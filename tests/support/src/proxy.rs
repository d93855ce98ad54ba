//! A TCP proxy on loopback that can stop forwarding, to cut a client off from a server.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forward both ways.
    Forward,
    /// Accept and hold connections but forward nothing and send no RST: the hard case, where
    /// the client only learns of the cut from its own timers.
    BlackHole,
    /// Forward the client's bytes to the server but drop the server's replies: requests are
    /// applied, their answers lost. Like `BlackHole`, the connection is closed when forwarding
    /// resumes.
    DropReplies,
    /// Close every connection, and each new one as soon as it is accepted: the client's
    /// requests fail at once (the opposite of `BlackHole`).
    Refuse,
}

/// A proxy from a free loopback port to `target`, running on the current Tokio runtime.
#[derive(Debug)]
pub struct TcpProxy {
    /// The port clients connect to.
    pub port: u16,
    mode: watch::Sender<ProxyMode>,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl TcpProxy {
    /// Starts forwarding `127.0.0.1:{port}` to `target` (`host:port`).
    pub async fn start(target: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let (mode, rx) = watch::channel(ProxyMode::Forward);
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = std::sync::Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if *rx.borrow() == ProxyMode::Refuse {
                    drop(client);
                    continue;
                }
                let target = target.clone();
                let rx = rx.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&target).await {
                        pipe(client, server, rx).await;
                    }
                });
            }
        });
        TcpProxy {
            port,
            mode,
            accepted,
        }
    }

    /// How many connections clients have opened through the proxy so far (a client that
    /// reconnects shows here).
    pub fn connections(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The proxy's endpoint URL.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Switches every connection, present and future, to `mode`.
    pub fn set_mode(&self, mode: ProxyMode) {
        let _ = self.mode.send(mode);
    }
}

async fn pipe(client: TcpStream, server: TcpStream, mut mode: watch::Receiver<ProxyMode>) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let up = copy(&mut cr, &mut sw, mode.clone(), &[ProxyMode::BlackHole]);
    let down = copy(
        &mut sr,
        &mut cw,
        mode.clone(),
        &[ProxyMode::BlackHole, ProxyMode::DropReplies],
    );
    // A connection that was black-holed has lost bytes mid-stream: when forwarding resumes it is
    // closed, so the client reconnects instead of talking over a corrupted stream.
    let healed = async {
        let mut cut = *mode.borrow_and_update() != ProxyMode::Forward;
        while mode.changed().await.is_ok() {
            match *mode.borrow_and_update() {
                ProxyMode::Refuse => return,
                ProxyMode::BlackHole | ProxyMode::DropReplies => cut = true,
                ProxyMode::Forward if cut => return,
                ProxyMode::Forward => {}
            }
        }
        std::future::pending::<()>().await;
    };
    tokio::select! { _ = up => {}, _ = down => {}, () = healed => {} }
}

async fn copy(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
    mode: watch::Receiver<ProxyMode>,
    dropping: &[ProxyMode],
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if dropping.contains(&*mode.borrow()) {
            continue; // read and dropped: no RST, no FIN, nothing
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

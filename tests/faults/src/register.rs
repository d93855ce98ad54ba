//! The protected resource: a value with a version, fenced by token or not, logging everything.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fencelock::{Fence, FencingToken};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::broadcast;

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The contender was granted the lock (a reader-writer lock: to write).
    Acquired,
    /// The contender was granted a reader-writer lock to read, shared with other readers.
    AcquiredRead,
    /// The contender noticed it lost the lock.
    Lost,
    /// The contender released the lock.
    Released,
    /// A read of the value.
    Read,
    /// A write: accepted or refused, and whether the version it read was still current.
    Write {
        /// The register applied it.
        accepted: bool,
        /// The value changed between this contender's read and its write.
        stale_read: bool,
    },
}

/// One logged event, with the time it arrived at the register.
#[derive(Clone, Copy, Debug)]
pub struct Event {
    /// Since the register started.
    pub at: Duration,
    /// The contender's process id.
    pub pid: u32,
    /// The token the contender holds (or held).
    pub token: u64,
    /// What happened.
    pub kind: Kind,
}

struct State {
    fence: Option<Fence>,
    value: u64,
    version: u64,
    log: Vec<Event>,
    stop: bool,
}

/// A register served on loopback; `fenced` decides whether it checks tokens.
#[derive(Clone)]
pub struct Register {
    state: Arc<Mutex<State>>,
    /// The address contenders connect to.
    pub addr: String,
    events: broadcast::Sender<Event>,
}

impl Register {
    /// Starts serving on a free loopback port.
    pub async fn start(fenced: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let state = Arc::new(Mutex::new(State {
            fence: fenced.then(Fence::new),
            value: 0,
            version: 0,
            log: Vec::new(),
            stop: false,
        }));
        let (events, _) = broadcast::channel(4096);
        let register = Register {
            state,
            addr,
            events,
        };
        let server = register.clone();
        let started = Instant::now();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let server = server.clone();
                tokio::spawn(async move {
                    let (read, mut write) = stream.into_split();
                    let mut lines = BufReader::new(read).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        let reply = server.handle(&line, started.elapsed());
                        if write
                            .write_all(format!("{reply}\n").as_bytes())
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                });
            }
        });
        register
    }

    fn handle(&self, line: &str, at: Duration) -> String {
        let words: Vec<&str> = line.split_whitespace().collect();
        let number = |i: usize| {
            words
                .get(i)
                .and_then(|w| w.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let (pid, token) = (u32::try_from(number(1)).unwrap_or(0), number(2));
        let mut state = self.state.lock().unwrap();
        if state.stop {
            return "STOP".into();
        }
        let (kind, reply) = match words.first().copied() {
            Some("ACQUIRED") if words.get(3) == Some(&"read") => {
                (Kind::AcquiredRead, "OK".to_owned())
            }
            Some("ACQUIRED") => (Kind::Acquired, "OK".to_owned()),
            Some("LOST") => (Kind::Lost, "OK".to_owned()),
            Some("RELEASED") => (Kind::Released, "OK".to_owned()),
            Some("READ") => {
                // A read-modify-write is fenced at its read too: the new holder's read raises the
                // high-water mark, so a stale holder that wakes between that read and the new
                // holder's first write is refused. A write-only fence admits that write (seen
                // once in the seeded mix: a pause ended by chance inside the successor's first
                // step), and the successor's write then overwrites it: a lost update.
                if let Some(fence) = &state.fence {
                    let _ = fence.try_admit("register", FencingToken::new(token));
                }
                (
                    Kind::Read,
                    format!("VALUE {} {}", state.value, state.version),
                )
            }
            Some("WRITE") => {
                let (value, read_version) = (number(3), number(4));
                let accepted = match &state.fence {
                    Some(fence) => fence
                        .try_admit("register", FencingToken::new(token))
                        .is_ok(),
                    None => true,
                };
                let stale_read = read_version != state.version;
                if accepted {
                    state.value = value;
                    state.version += 1;
                }
                (
                    Kind::Write {
                        accepted,
                        stale_read,
                    },
                    if accepted { "OK" } else { "REFUSED" }.to_owned(),
                )
            }
            _ => return "ERROR".into(),
        };
        let event = Event {
            at,
            pid,
            token,
            kind,
        };
        state.log.push(event);
        let _ = self.events.send(event);
        reply
    }

    /// Every event so far, in arrival order.
    pub fn log(&self) -> Vec<Event> {
        self.state.lock().unwrap().log.clone()
    }

    /// From now on every request is answered STOP, and contenders exit.
    pub fn stop(&self) {
        self.state.lock().unwrap().stop = true;
    }

    /// Events as they arrive.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }
}

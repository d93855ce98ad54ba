//! The keys a session holds, watched on one stream, so that a guard's `lost` fires within about
//! one round trip when its key disappears behind its back (an operator's `etcdctl del`, a
//! revoked lease), instead of at its next fenced operation or never.
//!
//! One Watch stream per session, opened when the first lock is granted. Each grant adds one
//! watch on its key from `create_revision + 1` (so a delete that came before the watch is still
//! reported), with a watch id of our own (etcd 3.4+); the key's delete event (our own release's
//! included) ends the watch with one cancel. A broken stream is reopened with backoff and every
//! key watched again from its create revision; a watch that etcd cancels because that revision
//! was compacted is replaced by one read of the key.

use std::collections::HashMap;
use std::sync::Arc;

use etcd_client::{Client, EventType, WatchOptions, WatchStream};
use fencelock::raw::{Backoff, SharedTurn};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// A held key to watch.
pub(crate) struct Held {
    pub(crate) key: Arc<str>,
    pub(crate) created: i64,
    /// The guard's `lost`.
    pub(crate) trigger: CancellationToken,
    /// The session's turn on the lock's name (shared with the guard), ended here once the key
    /// is known gone.
    pub(crate) turn: Option<SharedTurn>,
}

impl Held {
    /// The key is gone: the guard's `lost` fires (unless it was released) and the session's
    /// next task on the name may put the key again.
    fn gone(&self) {
        self.trigger.cancel();
        if let Some(turn) = &self.turn {
            turn.end();
        }
    }
}

/// The session's side of the watcher task.
pub(crate) struct HeldKeys {
    tx: mpsc::UnboundedSender<Held>,
}

impl HeldKeys {
    /// Starts the watcher task; it ends when `session_over` fires.
    pub(crate) fn start(
        client: Client,
        session_over: CancellationToken,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(run(client, rx, session_over));
        (HeldKeys { tx }, task)
    }

    /// Watches `held.key` until it is deleted; its deletion fires `held.trigger`.
    pub(crate) fn watch(&self, held: Held) {
        let _ = self.tx.send(held);
    }
}

fn options(id: i64, from: i64) -> WatchOptions {
    WatchOptions::new()
        .with_start_revision(from)
        .with_watch_id(id)
}

async fn run(
    client: Client,
    mut rx: mpsc::UnboundedReceiver<Held>,
    session_over: CancellationToken,
) {
    let mut held: HashMap<i64, (Held, i64)> = HashMap::new(); // id -> (key, watch from)
    let mut next_id: i64 = 1;
    let mut backoff = Backoff::new();
    // Each pass opens one stream and serves it until it breaks; the session's end (at most one
    // TTL after etcd stops answering) or the session being dropped ends the loop.
    loop {
        if held.is_empty() {
            let first = tokio::select! {
                () = session_over.cancelled() => return,
                first = rx.recv() => match first { Some(first) => first, None => return },
            };
            if first.trigger.is_cancelled() {
                continue;
            }
            let from = first.created + 1;
            held.insert(next_id, (first, from));
            next_id += 1;
        }
        let Some(mut stream) = open(&client, &held).await else {
            tokio::select! {
                () = session_over.cancelled() => return,
                () = backoff.pause() => continue,
            }
        };
        backoff = Backoff::new();
        // One message per pass: a registration, or a response; a broken stream ends it.
        loop {
            tokio::select! {
                () = session_over.cancelled() => return,
                added = rx.recv() => {
                    let Some(added) = added else { return };
                    if added.trigger.is_cancelled() {
                        continue;
                    }
                    let (id, from) = (next_id, added.created + 1);
                    next_id += 1;
                    let sent = stream.watch(added.key.as_bytes(), Some(options(id, from))).await;
                    held.insert(id, (added, from));
                    if sent.is_err() {
                        break;
                    }
                }
                message = stream.message() => match message {
                    Ok(Some(resp)) => {
                        if !answer(&client, &mut stream, &mut held, &resp).await {
                            break;
                        }
                    }
                    Ok(None) | Err(_) => break,
                },
            }
        }
        tracing::debug!("etcd: the held-keys watch stream broke; reopening");
        tokio::select! {
            () = session_over.cancelled() => return,
            () = backoff.pause() => {}
        }
    }
}

/// Opens a stream watching every entry of `held` (`None` if etcd cannot be reached).
async fn open(client: &Client, held: &HashMap<i64, (Held, i64)>) -> Option<WatchStream> {
    let mut entries = held.iter();
    let (id, (first, from)) = entries.next()?;
    let mut watches = client.watch_client();
    let mut stream = watches
        .watch(first.key.as_bytes(), Some(options(*id, *from)))
        .await
        .ok()?;
    for (id, (entry, from)) in entries {
        stream
            .watch(entry.key.as_bytes(), Some(options(*id, *from)))
            .await
            .ok()?;
    }
    Some(stream)
}

/// Acts on one watch response; false when the stream must be reopened.
async fn answer(
    client: &Client,
    stream: &mut WatchStream,
    held: &mut HashMap<i64, (Held, i64)>,
    resp: &etcd_client::WatchResponse,
) -> bool {
    let id = resp.watch_id();
    if resp
        .events()
        .iter()
        .any(|e| e.event_type() == EventType::Delete)
    {
        if let Some((gone, _)) = held.remove(&id) {
            if !gone.trigger.is_cancelled() {
                tracing::warn!(key = %gone.key, "etcd: our lock key was deleted behind our back; lock lost");
            }
            gone.gone();
            return stream.cancel(id).await.is_ok();
        }
    }
    if resp.canceled() {
        let Some((entry, watched_from)) = held.remove(&id) else {
            return true;
        };
        // Our start revision was compacted: read the key once instead of its history.
        let mut kv = client.kv_client();
        match kv.get(entry.key.as_bytes(), None).await {
            Ok(now) => {
                let ours = now
                    .kvs()
                    .first()
                    .is_some_and(|kv| kv.create_revision() == entry.created);
                if !ours {
                    if !entry.trigger.is_cancelled() {
                        tracing::warn!(key = %entry.key, "etcd: our lock key is gone; lock lost");
                    }
                    entry.gone();
                    return true;
                }
                let from = now.header().map_or(entry.created + 1, |h| h.revision() + 1);
                let sent = stream
                    .watch(entry.key.as_bytes(), Some(options(id, from)))
                    .await;
                held.insert(id, (entry, from));
                return sent.is_ok();
            }
            Err(_) => {
                held.insert(id, (entry, watched_from)); // cancelled again on reopen, then read
                return false;
            }
        }
    }
    true
}

//! The watches on our own lock nodes, all of a session's in one task.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use zookeeper_client::{Client, EventType};

/// A granted node to watch.
pub(crate) struct OwnNode {
    pub(crate) path: Arc<str>,
    /// The highest version our own writes can have given the node, set before each is sent
    /// (ZooKeeper may tell the watcher before the writer's reply arrives).
    pub(crate) own_version: Arc<AtomicI32>,
    /// Fires the guard's `lost`.
    pub(crate) trigger: CancellationToken,
}

/// Fires a node's `trigger` as soon as the node is deleted or its data changed by someone else
/// (an operator's `delete`, `fencelock break`): ZooKeeper tells the watcher within about one
/// round trip, where a probe would not notice at all. One exists-watch request per grant, sent
/// after the grant; a data change of our own (a leader's proclaim) sets the watch again. A
/// node's watch ends with the node (our own release deletes it); the task ends with the session
/// (`session_over`), and drops its client handle then, so as not to keep a closing session
/// open. The watches survive reconnects (the client resets them).
///
/// One task for every node of the session, not one per node: a task per held lock kept its
/// whole state machine (about 1.1 KB) for as long as the lock was held; a node's pending watch
/// here is a few hundred bytes.
pub(crate) async fn watch_own_nodes(
    client: Client,
    mut granted: mpsc::UnboundedReceiver<OwnNode>,
    session_over: CancellationToken,
) {
    let mut watching = FuturesUnordered::new();
    loop {
        tokio::select! {
            () = session_over.cancelled() => return,
            node = granted.recv() => match node {
                Some(node) => watching.push(watch(&client, node)),
                None => return,
            },
            Some(again) = watching.next(), if !watching.is_empty() => {
                if let Some(node) = again {
                    watching.push(watch(&client, node));
                }
            }
        }
    }
}

/// One exists-watch on `node`, and the wait for it: the node again when it changed by our own
/// write (watch it again), `None` when its watch is over.
async fn watch(client: &Client, node: OwnNode) -> Option<OwnNode> {
    if node.trigger.is_cancelled() {
        return None; // released (or lost) before it was watched: send nothing
    }
    let watched = tokio::select! {
        () = node.trigger.cancelled() => return None,
        // Boxed: the request's state is large and lives one round trip; every held lock
        // keeps the wait below, which is small.
        watched = Box::pin(client.check_and_watch_stat(&node.path)) => watched,
    };
    let path = &node.path;
    let watcher = match watched {
        Ok((Some(stat), watcher)) => {
            if stat.version > node.own_version.load(Ordering::SeqCst) {
                tracing::warn!(%path, version = stat.version, "zookeeper: our lock node was changed behind our back; lock lost");
                node.trigger.cancel();
                return None;
            }
            watcher
        }
        Ok((None, _)) => {
            tracing::warn!(%path, "zookeeper: our lock node is already gone; lock lost");
            node.trigger.cancel();
            return None;
        }
        Err(e) => {
            // The reconnect check and every fenced operation still notice a deletion.
            tracing::debug!(%path, error = %e, "zookeeper: could not watch our lock node");
            return None;
        }
    };
    // Not raced against `trigger`: dropping an unfired watcher makes the client send a
    // removeWatches, and our own release's delete fires it for free.
    match watcher.changed().await.event_type {
        EventType::NodeDataChanged => Some(node), // the stat of the next pass tells whose
        EventType::NodeDeleted if !node.trigger.is_cancelled() => {
            tracing::warn!(%path, "zookeeper: our lock node was deleted behind our back; lock lost");
            node.trigger.cancel();
            None
        }
        _ => None,
    }
}

//! The watches on our own lock nodes, all of a session's in one task.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use futures::stream::{FuturesUnordered, StreamExt};
use futures::{Future, FutureExt};
use tokio::sync::{mpsc, OwnedMutexGuard};
use tokio_util::sync::CancellationToken;
use zookeeper_client::{Client, EventType, OneshotWatcher};

/// A granted node to watch.
pub(crate) struct OwnNode {
    pub(crate) path: Arc<str>,
    /// The highest version our own writes can have given the node, set before each is sent
    /// (ZooKeeper may tell the watcher before the writer's reply arrives).
    pub(crate) own_version: Arc<AtomicI32>,
    /// Fires the guard's `lost`.
    pub(crate) trigger: CancellationToken,
    /// A lock's per-name turn (`LocalTurns`), kept here, not in the guard, so that it ends when
    /// the node does (our release's delete, or an operator's), not when the guard is dropped:
    /// after `fencelock break` the next task of this instance is granted while the lost guard
    /// lives. Ending it early is safe: mutual exclusion is the ZooKeeper queue's; the turn only
    /// keeps this instance's tasks from each queueing a node.
    pub(crate) _turn: Option<OwnedMutexGuard<()>>,
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
/// whole state machine (about 1.1 KB) for as long as the lock was held. Here a node is in one
/// of two sets: `requesting` for the one round trip of its exists-watch request, whose state
/// is large, then `waiting` for as long as it is held, with only the node and its watcher's
/// wait (200 bytes, where one future for both stages was 376; see the test below).
pub(crate) async fn watch_own_nodes(
    client: Client,
    mut granted: mpsc::UnboundedReceiver<OwnNode>,
    session_over: CancellationToken,
) {
    let mut requesting = FuturesUnordered::new();
    let mut waiting = FuturesUnordered::new();
    loop {
        tokio::select! {
            () = session_over.cancelled() => return,
            node = granted.recv() => match node {
                Some(node) => requesting.push(request(&client, node)),
                None => return,
            },
            Some(watched) = requesting.next(), if !requesting.is_empty() => {
                if let Some((node, watcher)) = watched {
                    waiting.push(wait(node, watcher));
                }
            }
            Some(again) = waiting.next(), if !waiting.is_empty() => {
                if let Some(node) = again {
                    requesting.push(request(&client, node));
                }
            }
        }
    }
}

/// The exists-watch request: the node and its watcher while the node is ours, unchanged.
async fn request(client: &Client, node: OwnNode) -> Option<(OwnNode, OneshotWatcher)> {
    if node.trigger.is_cancelled() {
        return None; // released (or lost) before it was watched: send nothing
    }
    let watched = tokio::select! {
        () = node.trigger.cancelled() => return None,
        watched = client.check_and_watch_stat(&node.path) => watched,
    };
    let path = &node.path;
    match watched {
        Ok((Some(stat), watcher)) => {
            if stat.version > node.own_version.load(Ordering::SeqCst) {
                tracing::warn!(%path, version = stat.version, "zookeeper: our lock node was changed behind our back; lock lost");
                node.trigger.cancel();
                return None;
            }
            Some((node, watcher))
        }
        Ok((None, _)) => {
            tracing::warn!(%path, "zookeeper: our lock node is already gone; lock lost");
            node.trigger.cancel();
            None
        }
        Err(e) => {
            // The reconnect check and every fenced operation still notice a deletion.
            tracing::debug!(%path, error = %e, "zookeeper: could not watch our lock node");
            None
        }
    }
}

/// The wait on a node's watcher: the node again when it changed by our own write (watch it
/// again), `None` when its watch is over. A plain combinator, not an async fn, so that the
/// watcher is stored once (an async fn keeps its argument beside the future it moved into).
fn wait(node: OwnNode, watcher: OneshotWatcher) -> impl Future<Output = Option<OwnNode>> {
    // Not raced against `trigger`: dropping an unfired watcher makes the client send a
    // removeWatches, and our own release's delete fires it for free.
    watcher.changed().map(move |event| match event.event_type {
        EventType::NodeDataChanged => Some(node), // the stat of the next pass tells whose
        EventType::NodeDeleted if !node.trigger.is_cancelled() => {
            let path = &node.path;
            tracing::warn!(%path, "zookeeper: our lock node was deleted behind our back; lock lost");
            node.trigger.cancel();
            None
        }
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request_size<'a, F>(_: impl FnOnce(&'a Client, OwnNode) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    fn wait_size<F>(_: impl FnOnce(OwnNode, OneshotWatcher) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    fn changed_size<F>(_: impl FnOnce(OneshotWatcher) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// What a held lock keeps is its watcher's wait and the node, nothing more: the request's
    /// larger state lives only for its round trip.
    #[test]
    fn a_held_node_keeps_a_small_future() {
        let (waiting, changed) = (wait_size(wait), changed_size(OneshotWatcher::changed));
        let node = std::mem::size_of::<OwnNode>();
        assert!(
            waiting <= changed + node,
            "a held node's wait is {waiting} bytes: more than the watcher's wait ({changed}) and the node ({node})"
        );
        let requesting = request_size(request);
        assert!(
            requesting > waiting,
            "{requesting} <= {waiting}: nothing to gain"
        );
    }
}

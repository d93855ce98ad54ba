//! The lock protocol, compatible with Curator's `InterProcessMutex` (`LockInternals` and
//! `StandardLockInternalsDriver`).
//!
//! Acquire:
//! 1. create `B/N/_c_<uuid>-lock-` EPHEMERAL_SEQUENTIAL (create2: the reply's Stat carries the
//!    czxid, our fencing token); a missing `B/N` is created as a container, as Curator does; if the
//!    reply is lost, find our node by its `_c_<uuid>` tag, adopting it only if its
//!    `ephemeralOwner` is our session;
//! 2. one multi-read: the children of `B/N` and the checkpoint; sort the children by what follows
//!    the last `lock-`; first = ours means held. The first one is sent right behind the create,
//!    without waiting for its reply, and used if it lists our node;
//! 3. otherwise watch only the predecessor (`getData` with a watch) and go to 2 when it fires.
//!
//! Uncontended: one create and one multi-read, in one round trip. Release: one delete of our
//! path with version 0.
//!
//! A reader-writer lock (Curator's `InterProcessReadWriteLock`) is the same flow on one path
//! whose nodes are `_c_<uuid>-__READ__<seq>` and `_c_<uuid>-__WRIT__<seq>`: a writer is granted
//! as a lock's contender (first of all), a reader when no writer is ahead of it.

use std::fmt::Write as _;
use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use fencelock::raw::{Budget, Enqueued, Live, Withdraw};
use fencelock::{Error, LockName, Result};
use zookeeper_client::{Acls, Client, CreateMode, MultiReadResult};

use crate::paths::{is_wrapped, node_tag, sort_key, Recipe, WRITE_NAME};
use crate::session::ZkSession;
use crate::zk_error;

/// Our contender node.
#[derive(Clone, Debug)]
pub(crate) struct Node {
    pub(crate) path: String,
    pub(crate) czxid: i64,
}

impl Node {
    /// The node's name in its lock's directory (what a listing of it returns).
    pub(crate) fn child(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or_default()
    }
}

const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// Creates our node with `data` (a candidate's value; empty for a lock).
pub(crate) async fn create(
    client: &Client,
    dir: &str,
    (id, recipe): (&str, Recipe),
    data: &[u8],
    acls: Acls<'static>,
    limit: Duration,
) -> Result<Node> {
    let prefix = [dir, "/", &node_tag(id, recipe)].concat();
    // A few passes: a missing parent, or a container the server removed in between, or a lost
    // reply, each costs one more.
    for _ in 0..5 {
        let created = tokio::time::timeout(
            limit,
            client.create(
                &prefix,
                data,
                &CreateMode::EphemeralSequential.with_acls(acls),
            ),
        )
        .await;
        match created {
            Ok(Ok((stat, sequence))) => {
                // Sized up front (the client writes the sequence as `{:010}`): a `format!` here
                // grew its buffer several times.
                let mut path = String::with_capacity(prefix.len() + 10);
                path.push_str(&prefix);
                // Writing to a String cannot fail.
                let _ = write!(path, "{sequence}");
                path.shrink_to_fit(); // kept as long as the lock is held
                return Ok(Node {
                    path,
                    czxid: stat.czxid,
                });
            }
            Ok(Err(zookeeper_client::Error::NoNode)) => {
                let parents = CreateMode::Container.with_acls(acls);
                match tokio::time::timeout(limit, client.mkdir(dir, &parents)).await {
                    Ok(Ok(()) | Err(zookeeper_client::Error::NodeExists)) => {}
                    Ok(Err(e)) => return Err(zk_error("create the lock's parent nodes", e)),
                    Err(_) => {
                        return Err(Error::timed_out(
                            crate::KIND,
                            "create the lock's parent nodes",
                            limit,
                        ))
                    }
                }
            }
            // The create may have landed (its reply was lost, or the connection failed after
            // it went out): only a definite lookup may say it did not (review F2, F8).
            Ok(Err(e)) if !zk_error("create", e.clone()).is_retryable() => {
                return Err(zk_error("create the lock node", e))
            }
            Ok(Err(_)) | Err(_) => {
                if let Some(node) = find(client, dir, &node_tag(id, recipe), limit).await? {
                    tracing::debug!(path = %node.path, "zookeeper: adopted our node after a lost reply");
                    return Ok(node);
                }
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }
    Err(Error::unavailable(
        crate::KIND,
        format!("create the lock node under {dir}: no definite answer after 5 attempts"),
        None,
    ))
}

/// Our node by its tag, if it exists and belongs to our session (CURATOR-498): a definite
/// answer or an error, never "not found" for a lookup that failed (review F2). Should two
/// creates of one attempt both have landed, the lowest is kept and the others deleted.
async fn find(client: &Client, dir: &str, tag: &str, limit: Duration) -> Result<Option<Node>> {
    let mut attempts = 0;
    // Bounded: a few lookups, each within `limit`, then a clear error (the acquire's
    // withdrawal removes whatever landed).
    let children = loop {
        attempts += 1;
        match tokio::time::timeout(limit, client.list_children(dir)).await {
            Ok(Ok(children)) => break children,
            Ok(Err(zookeeper_client::Error::NoNode)) => return Ok(None),
            Ok(Err(e)) if !zk_error("list", e.clone()).is_retryable() || attempts >= 5 => {
                return Err(zk_error("look for our lock node after a lost reply", e))
            }
            Err(_) if attempts >= 5 => {
                return Err(Error::timed_out(
                    crate::KIND,
                    "look for our lock node after a lost reply",
                    limit,
                ))
            }
            _ => tokio::time::sleep(RETRY_PAUSE).await,
        }
    };
    let mut ours = Vec::new();
    for child in children.into_iter().filter(|c| c.starts_with(tag)) {
        let path = [dir, "/", &child].concat();
        let stat = tokio::time::timeout(limit, client.check_stat(&path)).await;
        match stat {
            Ok(Ok(Some(stat))) if stat.ephemeral_owner == client.session_id().0 => {
                ours.push(Node {
                    path,
                    czxid: stat.czxid,
                });
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(zk_error("look for our lock node after a lost reply", e)),
            Err(_) => {
                return Err(Error::timed_out(
                    crate::KIND,
                    "look for our lock node after a lost reply",
                    limit,
                ))
            }
        }
    }
    ours.sort_by(|a, b| sort_key(a.child()).cmp(sort_key(b.child())));
    let mut ours = ours.into_iter();
    let kept = ours.next();
    for extra in ours {
        tracing::warn!(path = %extra.path, "zookeeper: a second node of one attempt; deleting it");
        delete_node(client, &extra.path, limit, limit).await?;
    }
    Ok(kept)
}

/// Waits until no node ahead of ours blocks it (for a lock or a writer: until ours is first;
/// for a reader: until no writer is ahead); returns the checkpoint read in the same request.
///
/// `early` is the first pass's read when it was sent right behind our create ([`turn_read`]);
/// it is used only if it lists our node, the proof that ZooKeeper read it after the create.
pub(crate) async fn wait_turn(
    session: &ZkSession,
    (dir, checkpoint): (&str, &str),
    name: &LockName,
    (node, recipe): (&Node, Recipe),
    (try_once, early): (bool, Option<TurnRead<'_>>),
    limit: Duration,
) -> Result<Option<Vec<u8>>> {
    let client = &session.client;
    let lost = || Error::lost(name);
    let mut first_look = true;
    let mut early = early;
    // Failed requests pause longer while they keep failing; a predecessor's change resets it.
    let mut backoff = fencelock::raw::Backoff::new();
    // Each pass ends in the grant, an error, or a wait for the predecessor's change; retries
    // after connection loss end with the session.
    loop {
        if !session.is_live() {
            return Err(lost());
        }
        let early_results = match early.take() {
            Some(read) => match tokio::time::timeout(limit, read).await {
                Ok(Ok(results)) if lists(&results, 0, node.child()) => Some(results),
                _ => None, // read again, as if it had not been sent
            },
            None => None,
        };
        let read = match early_results {
            Some(results) => Ok(Ok(results)),
            None => tokio::time::timeout(limit, turn_read(client, dir, checkpoint)?).await,
        };
        let results = match read {
            Ok(Ok(results)) => results,
            Ok(Err(zookeeper_client::Error::SessionExpired)) => return Err(lost()),
            Ok(Err(e)) => {
                tracing::warn!(lock = %name, error = %e, "zookeeper: listing contenders failed; retrying");
                pause_or_lost(&mut backoff, session, name).await?;
                continue;
            }
            Err(_) => {
                pause_or_lost(&mut backoff, session, name).await?;
                continue;
            }
        };
        let mut results = results.into_iter();
        let children = match results.next() {
            Some(MultiReadResult::Children { children }) => children,
            Some(MultiReadResult::Error {
                err: zookeeper_client::Error::NoNode,
            }) => return Err(lost()),
            other => {
                return Err(Error::protocol(
                    crate::KIND,
                    format!("list contenders: unexpected reply {other:?}"),
                ))
            }
        };
        let saved = match results.next() {
            Some(MultiReadResult::Data { data, .. }) => Some(data),
            _ => None,
        };
        let place = place(&children, node.child(), recipe);
        if let Some(child) = place.wrapped {
            return Err(crate::paths::wrapped(dir, child));
        }
        let Some((position, blocker)) = place.ours else {
            // Our node is gone: the session expired or someone deleted it.
            return Err(lost());
        };
        if std::mem::take(&mut first_look) {
            fencelock::telemetry::record_queue_ahead(crate::KIND, position);
        }
        let Some(blocker) = blocker else {
            return Ok(saved);
        };
        if try_once {
            return Err(Error::would_block(name));
        }
        let predecessor = [dir, "/", blocker.as_ref()].concat();
        // Bounded by the request limit and by `lost` (review F11): a request made while
        // disconnected waits inside the client until it reconnects.
        let watched = tokio::select! {
            watched = tokio::time::timeout(limit, client.get_and_watch_data(&predecessor)) => watched,
            () = session.clock.lost_token().cancelled() => return Err(lost()),
        };
        match watched {
            Ok(Ok((_, _, watcher))) => tokio::select! {
                _ = watcher.changed() => backoff = fencelock::raw::Backoff::new(),
                () = session.clock.lost_token().cancelled() => return Err(lost()),
            },
            Ok(Err(zookeeper_client::Error::NoNode)) => {}
            Ok(Err(zookeeper_client::Error::SessionExpired)) => return Err(lost()),
            Ok(Err(e)) => {
                tracing::warn!(lock = %name, error = %e, "zookeeper: watching the predecessor failed; retrying");
                pause_or_lost(&mut backoff, session, name).await?;
            }
            Err(_) => pause_or_lost(&mut backoff, session, name).await?,
        }
    }
}

/// Our node, once `pending`'s create has answered, and what `send` sent right behind the
/// create instead of a round trip later (the first read of [`wait_turn`], a semaphore's count
/// read): ZooKeeper answers a session's requests in order, so that read sees our node. Its
/// user must still check that it lists our node before relying on it.
pub(crate) async fn created_then<R>(
    pending: &mut Enqueued<Node, Unqueue>,
    send: impl FnOnce() -> Option<R>,
) -> Result<(&Node, Option<R>)> {
    let mut reply = std::pin::pin!(pending.reply());
    // The first poll sends the create.
    let first = futures::poll!(reply.as_mut());
    let early = send();
    let node = match first {
        Poll::Ready(node) => node,
        Poll::Pending => reply.await,
    };
    Ok((node?, early))
}

/// A multi-read sent ([`turn_read`], the semaphore's count read).
pub(crate) type TurnRead<'a> = std::pin::Pin<
    Box<
        dyn Future<Output = std::result::Result<Vec<MultiReadResult>, zookeeper_client::Error>>
            + Send
            + 'a,
    >,
>;

/// Sends one pass's read (sent when this is called, not when the future is first polled): the
/// children of `dir` and the checkpoint, in one multi-read.
pub(crate) fn turn_read<'a>(
    client: &'a Client,
    dir: &str,
    checkpoint: &str,
) -> Result<TurnRead<'a>> {
    let mut reader = client.new_multi_reader();
    reader
        .add_get_children(dir)
        .map_err(|e| zk_error("list contenders", e))?;
    reader
        .add_get_data(checkpoint)
        .map_err(|e| zk_error("read the checkpoint", e))?;
    Ok(Box::pin(reader.commit()))
}

/// Whether the `i`th result of a multi-read is a listing with our node `child` in it.
pub(crate) fn lists(results: &[MultiReadResult], i: usize, child: &str) -> bool {
    matches!(results.get(i), Some(MultiReadResult::Children { children }) if children.iter().any(|c| c == child))
}

/// Where our node `ours` stands among `children` (in any order): how many are ahead of it,
/// and the one whose change we wait for, or `None` when none blocks us; `None` if our node is
/// not among them; and any child whose sequence number wrapped. A lock's or a writer's blocker: the one just ahead (Curator's
/// `StandardLockInternalsDriver`). A reader's: the nearest writer ahead, if any: Curator's
/// `readLockPredicate` grants the same way, though it watches the *first* writer ahead; the
/// nearest one spares the readers behind a second writer a wake-up when the first leaves.
///
/// One pass, each sort key computed once, no sort: a lock path holds a node per waiting
/// acquire, and sorting a thousand of them at every turn cost more CPU than the listing
/// itself (the `many` bench, issue 20).
fn place<'a>(children: &'a [String], ours: &str, recipe: Recipe) -> Place<'a> {
    let our_key = sort_key(ours);
    let mut place = Place {
        ours: None,
        wrapped: None,
    };
    let mut ahead = 0;
    let mut blocker: Option<(&str, &String)> = None;
    for child in children {
        let key = sort_key(child);
        if is_wrapped(key) {
            place.wrapped = Some(child);
        }
        if child == ours {
            place.ours = Some((0, None));
            continue;
        }
        if key >= our_key {
            continue;
        }
        ahead += 1;
        let blocks = recipe != Recipe::Read || child.contains(WRITE_NAME);
        if blocks && blocker.is_none_or(|(nearest, _)| key > nearest) {
            blocker = Some((key, child));
        }
    }
    if place.ours.is_some() {
        place.ours = Some((ahead, blocker.map(|(_, child)| child)));
    }
    place
}

/// What [`place`] found.
struct Place<'a> {
    /// Ours, if listed: how many are ahead of it, and the one to wait for.
    ours: Option<(usize, Option<&'a String>)>,
    /// A child whose sequence number wrapped ([`is_wrapped`]): the order is unsound.
    wrapped: Option<&'a String>,
}

async fn pause_or_lost(
    backoff: &mut fencelock::raw::Backoff,
    session: &ZkSession,
    name: &LockName,
) -> Result<()> {
    if backoff.pause_unless(session.clock.lost_token()).await {
        Ok(())
    } else {
        Err(Error::lost(name))
    }
}

/// Deletes our node, whatever its version (as Curator does: the path carries our per-acquire
/// uuid, so it cannot name anyone else's node; a version would leave a node whose data someone
/// changed undeletable, review F5); true if it was there (or an attempt whose reply was lost
/// found it there). Retried on connection loss within `budget`; a refusal ends it at once.
pub(crate) async fn delete_node(
    client: &Client,
    path: &str,
    attempt: Duration,
    budget: Duration,
) -> Result<bool> {
    let budget = Budget::start(budget);
    // Whether an earlier attempt may have deleted the node without our hearing of it.
    let mut maybe_applied = false;
    // Bounded by `budget`.
    loop {
        let limit = budget.attempt(attempt);
        match tokio::time::timeout(limit, client.delete(path, None)).await {
            Ok(Ok(())) => return Ok(true),
            // After a lost reply, the node we find gone is most likely gone by our own delete:
            // it was there when we sent it (review F9).
            Ok(Err(zookeeper_client::Error::NoNode)) => return Ok(maybe_applied),
            Ok(Err(
                e @ (zookeeper_client::Error::SessionExpired
                | zookeeper_client::Error::ClientClosed),
            )) => {
                // The session is over, and its ephemeral nodes with it.
                tracing::debug!(%path, error = %e, "zookeeper: session over; node gone with it");
                return Ok(false);
            }
            // A refusal (NoAuth) does not pass: retrying only hides it.
            Ok(Err(e)) if !zk_error("delete", e.clone()).is_retryable() => {
                return Err(zk_error("delete the lock node", e));
            }
            outcome if !budget.allows_retry_after(RETRY_PAUSE) => {
                return Err(match outcome {
                    Ok(Err(e)) => zk_error("delete the lock node", e),
                    _ => Error::timed_out(crate::KIND, format!("delete {path}"), limit),
                });
            }
            _ => {
                maybe_applied = true;
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }
}

/// Withdraws the node of an acquire that did not end in a guard ([`fencelock::raw::Enqueued`]):
/// the node the create returned, or, when its reply was lost, every node of ours tagged `id`.
pub(crate) struct Unqueue {
    pub(crate) session: std::sync::Arc<ZkSession>,
    pub(crate) dir: String,
    pub(crate) id: String,
    pub(crate) recipe: Recipe,
    pub(crate) limit: Duration,
    /// A lock's per-name turn (`LocalTurns`): kept until the node is withdrawn, or handed on
    /// to the node's watch (`OwnNode`) with the grant.
    pub(crate) turn: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Withdraw<Node> for Unqueue {
    const BACKEND: &'static str = crate::KIND;

    async fn withdraw(&mut self, first: Option<&Node>) -> Result<()> {
        let client = &self.session.client;
        let paths = match first {
            Some(node) => vec![node.path.clone()],
            None => {
                let tag = node_tag(&self.id, self.recipe);
                let listed =
                    tokio::time::timeout(self.limit, client.list_children(&self.dir)).await;
                match listed {
                    Ok(Ok(children)) => children
                        .into_iter()
                        .filter(|c| c.starts_with(&tag))
                        .map(|c| [&*self.dir, "/", &c].concat())
                        .collect(),
                    Ok(Err(zookeeper_client::Error::NoNode)) => Vec::new(),
                    Ok(Err(e)) => return Err(zk_error("look for a cancelled acquire's node", e)),
                    Err(_) => {
                        return Err(Error::timed_out(crate::KIND, "list contenders", self.limit))
                    }
                }
            }
        };
        for path in paths {
            delete_node(client, &path, self.limit, self.limit).await?;
        }
        Ok(())
    }

    /// Not the local clock: the session's nodes outlive it if the same session reconnects
    /// (review F3).
    fn session_alive(&self) -> bool {
        self.session.nodes_may_remain()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_waits_only_for_the_nearest_writer_ahead() {
        // Listed out of order, as ZooKeeper may list them.
        let children: Vec<String> = [
            "_c_d-__WRIT__0000000004",
            "_c_a-__READ__0000000001",
            "_c_f-__READ__0000000006",
            "_c_c-__READ__0000000003",
            "_c_e-__READ__0000000005",
            "_c_b-__WRIT__0000000002",
            "_c_g-__WRIT__0000000007",
        ]
        .map(String::from)
        .into();
        let at = |ours: &str, recipe| {
            let place = place(&children, ours, recipe);
            assert!(place.wrapped.is_none());
            place.ours.map(|(n, b)| (n, b.map(String::as_str)))
        };
        let d = Some("_c_d-__WRIT__0000000004");
        assert_eq!(at("_c_f-__READ__0000000006", Recipe::Read), Some((5, d)));
        assert_eq!(at("_c_e-__READ__0000000005", Recipe::Read), Some((4, d)));
        assert_eq!(at("_c_a-__READ__0000000001", Recipe::Read), Some((0, None)));
        assert_eq!(
            at("_c_c-__READ__0000000003", Recipe::Read).map(|p| p.0),
            Some(2)
        );
        assert_eq!(
            at("_c_g-__WRIT__0000000007", Recipe::Write),
            Some((6, Some("_c_f-__READ__0000000006")))
        );
        assert_eq!(
            at("_c_b-__WRIT__0000000002", Recipe::Write),
            Some((1, Some("_c_a-__READ__0000000001")))
        );
        assert_eq!(
            at("_c_z-__WRIT__0000000009", Recipe::Write),
            None,
            "ours is gone"
        );
        let locks: Vec<String> = ["_c_y-lock-0000000011", "_c_x-lock-0000000010"]
            .map(String::from)
            .into();
        assert_eq!(
            place(&locks, "_c_y-lock-0000000011", Recipe::Mutex).ours,
            Some((1, Some(&locks[1])))
        );
        assert_eq!(
            place(&locks, "_c_x-lock-0000000010", Recipe::Mutex).ours,
            Some((0, None))
        );
        let wrapped: Vec<String> = ["_c_y-lock-2147483647", "_c_x-lock--2147483648"]
            .map(String::from)
            .into();
        let place = place(&wrapped, "_c_y-lock-2147483647", Recipe::Mutex);
        assert_eq!(place.wrapped, Some(&wrapped[1]), "the wrap is reported");
    }
}

//! Reading and following an election's leader, as Curator's `LeaderLatch.getLeader` does: the
//! leader is the first child of the latch path in Curator's order, its data the leader's value.

use std::sync::Arc;
use std::time::Duration;

use fencelock::raw::Watched;
use fencelock::{Error, FencingToken, Leader, LockName, Result};
use zookeeper_client::{Client, OneshotWatcher};

use crate::backend::ZkBackend;
use crate::paths::sort_children;
use crate::session::ZkSession;
use crate::zk_error;

/// A ZooKeeper ensemble as an election's [`Watched`].
pub(crate) struct Elections<'a> {
    pub(crate) backend: &'a ZkBackend,
    /// The longest a wait lasts before the loop reads again anyway.
    pub(crate) idle: Duration,
}

/// The watches the read set (on the children, and on the leader's node), and the session that
/// holds them: a watch ends with its session.
pub(crate) struct Seen {
    watchers: Vec<OneshotWatcher>,
    session: Arc<ZkSession>,
}

pub(crate) async fn timed<T>(
    what: &'static str,
    limit: Duration,
    request: impl std::future::Future<Output = std::result::Result<T, zookeeper_client::Error>>,
) -> Result<std::result::Result<T, zookeeper_client::Error>> {
    tokio::time::timeout(limit, request)
        .await
        .map_err(|_| Error::timed_out(crate::KIND, what, limit))
}

/// Syncs the server this client reads from with the leader: a follower serves reads from its
/// own copy, which may trail, and no item older than the last change we were told of may be
/// reported.
pub(crate) async fn sync(client: &Client, dir: &str, limit: Duration) -> Result<()> {
    timed("sync before reading", limit, client.sync(dir))
        .await?
        .or_else(|e| match e {
            zookeeper_client::Error::NoNode => Ok(()),
            e => Err(zk_error("sync before reading", e)),
        })
}

/// The children of `dir` in sequence order, and a watch set by the same read: on the
/// children, or on `dir` itself when it does not exist (then no children). `None` when `dir`
/// was created between the two requests: read again.
pub(crate) async fn list_watching(
    client: &Client,
    dir: &str,
    limit: Duration,
) -> Result<Option<(Vec<String>, OneshotWatcher)>> {
    match timed(
        "list contenders",
        limit,
        client.list_and_watch_children(dir),
    )
    .await?
    {
        Ok((mut children, watcher)) => {
            sort_children(&mut children);
            Ok(Some((children, watcher)))
        }
        Err(zookeeper_client::Error::NoNode) => {
            let (stat, watcher) = timed("watch the path", limit, client.check_and_watch_stat(dir))
                .await?
                .map_err(|e| zk_error("watch the path", e))?;
            Ok(stat.is_none().then_some((Vec::new(), watcher)))
        }
        Err(e) => Err(zk_error("list contenders", e)),
    }
}

impl Seen {
    pub(crate) fn new(watchers: Vec<OneshotWatcher>, session: Arc<ZkSession>) -> Self {
        Seen { watchers, session }
    }
}

impl Watched for Elections<'_> {
    type Item = Option<Leader>;
    type Seen = Seen;

    async fn read(&self, name: &LockName) -> Result<(Option<Leader>, Seen)> {
        crate::paths::check_name(name)?;
        let session = self.backend.session().await?;
        let client: &Client = &session.client;
        let limit = self.backend.config().request_timeout;
        let dir = self.backend.paths().lock_dir(name);
        sync(client, &dir, limit).await?;
        // A leader that leaves between the two reads costs another pass; a few at most.
        for _ in 0..5 {
            let Some((children, children_watch)) = list_watching(client, &dir, limit).await? else {
                continue;
            };
            let Some(first) = children.first() else {
                let seen = Seen {
                    watchers: vec![children_watch],
                    session: Arc::clone(&session),
                };
                return Ok((None, seen));
            };
            let path = format!("{dir}/{first}");
            match timed("read the leader", limit, client.get_and_watch_data(&path)).await? {
                Ok((value, stat, data_watch)) => {
                    let leader = Leader::new(value, FencingToken::new(stat.czxid.unsigned_abs()));
                    let seen = Seen {
                        watchers: vec![children_watch, data_watch],
                        session: Arc::clone(&session),
                    };
                    return Ok((Some(leader), seen));
                }
                Err(zookeeper_client::Error::NoNode) => continue,
                Err(e) => return Err(zk_error("read the leader", e)),
            }
        }
        Err(Error::unavailable(
            crate::KIND,
            format!("read the leader of `{name}`: it kept changing between two reads"),
            None,
        ))
    }

    async fn changed(&self, _name: &LockName, seen: Seen) -> Result<()> {
        let any =
            futures::future::select_all(seen.watchers.into_iter().map(|w| Box::pin(w.changed())));
        tokio::select! {
            _ = any => {}
            // A new session has none of these watches: read again on it.
            () = seen.session.clock.lost_token().cancelled() => {}
            () = tokio::time::sleep(self.idle) => {}
        }
        Ok(())
    }
}

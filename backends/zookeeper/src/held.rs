//! The store half of a ZooKeeper lock: release by path and version, fenced state by multi-ops
//! with a check on our lock node.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use fencelock::raw::{keep_retrying, HeldLock};
use fencelock::{Error, FencingToken, LockName, ReleaseOutcome, Result, StateKey};
use zookeeper_client::{CheckWriteError, CreateMode, MultiReadResult};

use crate::mutex::delete_node;
use crate::session::ZkSession;
use crate::zk_error;

/// The check is that our node exists (any version): true exactly while we hold the lock (nodes
/// created later sort after ours; the path carries our per-acquire uuid, so no other node can
/// have it). A leader's proclaim changes the node's data, and so its version.
pub(crate) struct ZkHeld {
    /// Also where the lock's paths, ACLs and request limit are kept: one copy per instance,
    /// not per held lock.
    pub(crate) session: Arc<ZkSession>,
    pub(crate) name: LockName,
    /// Our node's path, shared with the session's held map and its watcher.
    pub(crate) path: Arc<str>,
    /// Our node's czxid: the token, and what tells our node from a later one at its path.
    pub(crate) czxid: i64,
    /// The version our own writes give the node (see `own_nodes`).
    pub(crate) own_version: Arc<AtomicI32>,
}

impl std::fmt::Debug for ZkHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkHeld")
            .field("path", &self.path)
            .field("czxid", &self.czxid)
            .finish_non_exhaustive()
    }
}

enum Write<'a> {
    Set(&'a [u8]),
    Create(&'a [u8]),
    Delete,
}

impl ZkHeld {
    fn refused(&self) -> Error {
        Error::not_held(&self.name, FencingToken::new(self.czxid.unsigned_abs()))
    }

    /// One multi: check our node, then the write. `Ok(false)`: the write's own precondition
    /// failed (the state node is missing, or exists for a create).
    async fn checked(&self, path: &str, write: Write<'_>) -> Result<bool> {
        let client = &self.session.client;
        let mut writer = client
            .new_check_writer(&self.path, None)
            .map_err(|e| zk_error("fenced write", e))?;
        let added = match write {
            Write::Set(value) => writer.add_set_data(path, value, None),
            Write::Create(value) => writer.add_create(
                path,
                value,
                &CreateMode::Persistent.with_acls(self.session.acls),
            ),
            Write::Delete => writer.add_delete(path, None),
        };
        added.map_err(|e| zk_error("fenced write", e))?;
        match tokio::time::timeout(self.session.limit, writer.commit()).await {
            Ok(Ok(_)) => Ok(true),
            Ok(Err(CheckWriteError::CheckFailed { .. })) => Err(self.refused()),
            Ok(Err(CheckWriteError::OperationFailed {
                source: zookeeper_client::Error::NoNode | zookeeper_client::Error::NodeExists,
                ..
            })) => Ok(false),
            Ok(Err(e)) => Err(zk_error("fenced write", e.into())),
            Err(_) => Err(Error::timed_out(
                crate::KIND,
                "fenced write",
                self.session.limit,
            )),
        }
    }
}

#[async_trait]
impl HeldLock for ZkHeld {
    async fn release(&self) -> Result<ReleaseOutcome> {
        self.session.unregister(&self.path);
        let released = delete_node(
            &self.session.client,
            &self.path,
            self.session.limit,
            self.session.limit,
        )
        .await;
        let released = match released {
            Ok(released) => released,
            Err(e) => {
                keep_deleting(
                    Arc::clone(&self.session),
                    self.path.to_string(),
                    self.session.limit,
                );
                return Err(e);
            }
        };
        tracing::info!(lock = %self.name, path = %self.path, released, "zookeeper: release");
        Ok(if released {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotOwned
        })
    }

    async fn put_state(&self, key: &StateKey, value: &[u8]) -> Result<()> {
        let path = self.session.paths.state(&self.name, key);
        // Set if it exists, else create; a concurrent create/delete (only by a stale holder,
        // whose check fails) costs one more pass.
        for _ in 0..3 {
            if self.checked(&path, Write::Set(value)).await? {
                return Ok(());
            }
            let dir = self.session.paths.state_dir(&self.name);
            let options = CreateMode::Persistent.with_acls(self.session.acls);
            let mkdir = self.session.client.mkdir(&dir, &options);
            match tokio::time::timeout(self.session.limit, mkdir).await {
                Ok(Ok(()) | Err(zookeeper_client::Error::NodeExists)) => {}
                Ok(Err(e)) => return Err(zk_error("create the state folder", e)),
                Err(_) => {
                    return Err(Error::timed_out(
                        crate::KIND,
                        "create the state folder",
                        self.session.limit,
                    ))
                }
            }
            if self.checked(&path, Write::Create(value)).await? {
                return Ok(());
            }
        }
        Err(Error::protocol(
            crate::KIND,
            format!("fenced put of {path}: the node kept appearing and vanishing"),
        ))
    }

    async fn get_state(&self, key: &StateKey) -> Result<Option<Vec<u8>>> {
        let path = self.session.paths.state(&self.name, key);
        let mut reader = self.session.client.new_multi_reader();
        reader
            .add_get_data(&self.path)
            .map_err(|e| zk_error("fenced get", e))?;
        reader
            .add_get_data(&path)
            .map_err(|e| zk_error("fenced get", e))?;
        let results = match tokio::time::timeout(self.session.limit, reader.commit()).await {
            Ok(Ok(results)) => results,
            Ok(Err(e)) => return Err(zk_error("fenced get", e)),
            Err(_) => {
                return Err(Error::timed_out(
                    crate::KIND,
                    "fenced get",
                    self.session.limit,
                ))
            }
        };
        // Both reads are one snapshot: our node existed when the value was read.
        let mut results = results.into_iter();
        if !matches!(results.next(), Some(MultiReadResult::Data { .. })) {
            return Err(self.refused());
        }
        Ok(match results.next() {
            Some(MultiReadResult::Data { data, .. }) => Some(data),
            _ => None,
        })
    }

    async fn delete_state(&self, key: &StateKey) -> Result<bool> {
        let path = self.session.paths.state(&self.name, key);
        let deleted = self.checked(&path, Write::Delete).await?;
        if deleted {
            // Housekeeping (review F13): the lock's state folder goes with its last key. Only
            // an empty folder is deleted (no version: any other key makes it NotEmpty), and a
            // holder putting state meanwhile creates it again.
            let dir = self.session.paths.state_dir(&self.name);
            match tokio::time::timeout(self.session.limit, self.session.client.delete(&dir, None))
                .await
            {
                Ok(
                    Ok(())
                    | Err(zookeeper_client::Error::NotEmpty | zookeeper_client::Error::NoNode),
                ) => {}
                Ok(Err(e)) => {
                    tracing::debug!(%dir, error = %e, "zookeeper: could not remove the state folder")
                }
                Err(_) => tracing::debug!(%dir, "zookeeper: removing the state folder timed out"),
            }
        }
        Ok(deleted)
    }

    async fn set_value(&self, value: &[u8]) -> Result<()> {
        let client = &self.session.client;
        let current = self.own_version.load(Ordering::SeqCst);
        // Before the write: its watch event may come before its reply.
        self.own_version.store(current + 1, Ordering::SeqCst);
        let set = tokio::time::timeout(
            self.session.limit,
            client.set_data(&self.path, value, Some(current)),
        )
        .await;
        match set {
            Ok(Ok(_)) => Ok(()),
            // Gone, or changed by someone else: either way no longer ours alone.
            Ok(Err(zookeeper_client::Error::NoNode | zookeeper_client::Error::BadVersion)) => {
                Err(self.refused())
            }
            outcome => {
                // Landed or not: the node's version says which, for the next proclaim.
                if let Ok(Some(stat)) = client.check_stat(&self.path).await {
                    if stat.czxid == self.czxid {
                        self.own_version.store(stat.version, Ordering::SeqCst);
                    }
                }
                Err(match outcome {
                    Ok(Err(e)) => zk_error("proclaim", e),
                    _ => Error::timed_out(crate::KIND, "proclaim", self.session.limit),
                })
            }
        }
    }

    fn release_in_background(self: Box<Self>) {
        self.session.unregister(&self.path);
        // A withdrawal until the first delete ends (review F12); a failed delete goes on in
        // `keep_deleting`.
        let (session, path, limit) = (
            Arc::clone(&self.session),
            self.path.to_string(),
            self.session.limit,
        );
        self.session
            .withdrawals
            .release_in_background(crate::KIND, &self.name, async move {
                if delete_node(&session.client, &path, limit, limit)
                    .await
                    .is_err()
                {
                    keep_deleting(session, path, limit);
                }
            });
    }
}

/// Deletes `path` in the background until done or the ZooKeeper session is over (Curator's
/// "guaranteed" delete): a node left behind blocks every other contender while the session
/// lives, and it can live on after our local clock gave up (review F3), so the retries follow
/// the client's session state, not the clock.
pub(crate) fn keep_deleting(session: Arc<ZkSession>, path: String, limit: Duration) {
    keep_retrying(
        crate::KIND,
        format!("delete {path}"),
        Arc::new(NodesRemain(session)),
        move |remains| {
            let (session, path) = (Arc::clone(&remains.0), path.clone());
            async move {
                delete_node(&session.client, &path, limit, limit)
                    .await
                    .map(drop)
            }
        },
    );
}

/// A session whose nodes may still exist at the server: until the client reports it expired,
/// closed or refused, which can be long after the local clock was lost (the same session
/// reconnects when a link heals before the server's expiry).
pub(crate) struct NodesRemain(pub(crate) Arc<ZkSession>);

impl fencelock::raw::Live for NodesRemain {
    fn is_live(&self) -> bool {
        self.0.nodes_may_remain()
    }
}

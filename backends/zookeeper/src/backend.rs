//! [`ZkBackend`]: the session and the acquire flow.

use std::sync::Arc;

use async_trait::async_trait;
use fencelock::{Error, FencingToken, LockBackend, LockGuard, LockName, LockStatus, Result, Wait};
use tokio::sync::Mutex as AsyncMutex;
use tokio::task::JoinHandle;
use zookeeper_client::{Acls, CreateMode, MultiReadResult};

use crate::held::ZkHeld;
use crate::mutex::{self, Node};
use crate::paths::{check_name, sort_key, Paths};
use crate::session::ZkSession;
use crate::{zk_error, ZkConfig, KIND};

/// A [`LockBackend`] on a ZooKeeper ensemble.
///
/// One instance is one ZooKeeper session, shared by all its locks. Its state drives the guards:
/// after a disconnect the locks survive if the client reconnects before the local deadline
/// (and each node is checked to still be ours); at the deadline, or when the session expires,
/// every guard fires `lost`, and the next acquire opens a new session. Nodes follow Curator's
/// `InterProcessMutex`, so Java services using Curator on the same path exclude us and we them.
///
/// Requests: an uncontended acquire is one create and one multi-read (children and the
/// checkpoint); a waiter adds one getData-with-watch and one multi-read per predecessor that
/// leaves; release is one delete; fenced put/delete is one multi (check + write), fenced get one
/// multi-read.
pub struct ZkBackend {
    config: ZkConfig,
    paths: Paths,
    acls: Acls<'static>,
    session: AsyncMutex<Option<Arc<ZkSession>>>,
}

impl std::fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkBackend")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl ZkBackend {
    /// Opens a session and makes sure the base path exists.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for bad settings, including a session timeout the server does
    /// not grant as asked; [`Error::Backend`] when no server answers within `connect_timeout` or
    /// authentication fails.
    ///
    /// # Cancel safety
    /// Cancel-safe: at most the base path is created.
    pub async fn connect(config: ZkConfig) -> Result<Self> {
        config.validate()?;
        let acls = if config.digest.is_some() {
            Acls::creator_all()
        } else {
            Acls::anyone_all()
        };
        let backend = ZkBackend {
            paths: Paths::new(&config.base_path),
            acls,
            session: AsyncMutex::new(None),
            config,
        };
        let session = backend.session().await?;
        match session
            .client
            .mkdir(
                &backend.config.base_path,
                &CreateMode::Persistent.with_acls(acls),
            )
            .await
        {
            Ok(()) | Err(zookeeper_client::Error::NodeExists) => Ok(backend),
            Err(e) => Err(zk_error("create the base path", e)),
        }
    }

    /// The settings this backend runs with.
    pub fn config(&self) -> &ZkConfig {
        &self.config
    }

    /// The live session's id and password, for diagnostics and for tests that need to end the
    /// session from another client.
    pub async fn session_info(&self) -> Option<zookeeper_client::SessionInfo> {
        self.session
            .lock()
            .await
            .as_ref()
            .filter(|s| s.is_live())
            .map(|s| s.client.session().clone())
    }

    async fn session(&self) -> Result<Arc<ZkSession>> {
        let mut slot = self.session.lock().await;
        if let Some(live) = slot.as_ref().filter(|s| s.is_live()) {
            return Ok(Arc::clone(live));
        }
        // Boxed: connecting is rare, and its state would enlarge every acquire future.
        let session = Box::pin(ZkSession::connect(&self.config)).await?;
        *slot = Some(Arc::clone(&session));
        Ok(session)
    }

    async fn acquire_once(&self, name: &LockName, try_once: bool) -> Result<LockGuard> {
        let session = self.session().await?;
        let limit = self.config.request_timeout;
        session.withdrawals.settled(name, limit).await;
        let id = uuid::Uuid::new_v4().to_string();
        let mut pending = Pending {
            create: Some(tokio::spawn({
                let (client, paths, name, id, acls) = (
                    session.client.clone(),
                    self.paths.clone(),
                    name.clone(),
                    id.clone(),
                    self.acls,
                );
                async move { mutex::create(&client, &paths, &name, &id, acls, limit).await }
            })),
            session: Some(Arc::clone(&session)),
            dir: self.paths.lock_dir(name),
            name: name.clone(),
            id,
            limit,
        };
        let node = pending.created(name).await?;
        let checkpoint =
            mutex::wait_turn(&session, &self.paths, name, &node, try_once, limit).await?;
        pending.session = None;
        tracing::info!(lock = %name, path = %node.path, czxid = node.czxid, "zookeeper: acquired");
        let held = ZkHeld {
            session: Arc::clone(&session),
            paths: self.paths.clone(),
            name: name.clone(),
            node: node.clone(),
            acls: self.acls,
            limit,
        };
        let guard = LockGuard::new(
            KIND,
            name.clone(),
            FencingToken::new(node.czxid.unsigned_abs()),
            Arc::clone(&session.clock),
            checkpoint,
            Box::new(held),
        );
        session.register(&node.path, guard.loss_trigger());
        Ok(guard)
    }
}

#[async_trait]
impl LockBackend for ZkBackend {
    fn kind(&self) -> &'static str {
        KIND
    }

    async fn acquire(&self, name: &LockName, wait: Wait) -> Result<LockGuard> {
        check_name(name)?;
        wait.limit(name, self.acquire_once(name, wait == Wait::Try))
            .await
    }

    async fn status(&self, name: &LockName) -> Result<LockStatus> {
        check_name(name)?;
        let session = self.session().await?;
        let dir = self.paths.lock_dir(name);
        // Two reads; a holder that leaves between them costs another pass, a few at most.
        for _ in 0..5 {
            let mut children = match session.client.list_children(&dir).await {
                Ok(children) => children,
                Err(zookeeper_client::Error::NoNode) => Vec::new(),
                Err(e) => return Err(zk_error("list contenders", e)),
            };
            children.sort_by(|a, b| sort_key(a).cmp(sort_key(b)));
            let Some(first) = children.first() else {
                return Ok(LockStatus::new(name.clone(), None, 0, None));
            };
            let stat = match session.client.check_stat(&format!("{dir}/{first}")).await {
                Ok(Some(stat)) => stat,
                Ok(None) => continue,
                Err(e) => return Err(zk_error("read the holder's node", e)),
            };
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
            let age =
                std::time::Duration::from_millis(now_ms.saturating_sub(stat.ctime).unsigned_abs());
            return Ok(LockStatus::new(
                name.clone(),
                Some(FencingToken::new(stat.czxid.unsigned_abs())),
                children.len() - 1,
                Some(age),
            ));
        }
        Err(Error::backend(
            KIND,
            format!("status of `{name}`: the holder kept changing between two reads; try again"),
            "busy lock",
        ))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockName>> {
        let session = self.session().await?;
        let base = &self.config.base_path;
        let mut names: Vec<String> = match session.client.list_children(base).await {
            Ok(children) => children,
            Err(zookeeper_client::Error::NoNode) => Vec::new(),
            Err(e) => return Err(zk_error("list locks", e)),
        };
        names.retain(|n| !n.starts_with('.') && n.starts_with(prefix));
        names.sort();
        if names.is_empty() {
            return Ok(Vec::new());
        }
        // Empty lock paths linger until the server reaps the container: keep those with
        // contenders, read in one request.
        let mut reader = session.client.new_multi_reader();
        for name in &names {
            reader
                .add_get_children(&format!("{base}/{name}"))
                .map_err(|e| zk_error("list locks", e))?;
        }
        let results = reader
            .commit()
            .await
            .map_err(|e| zk_error("list locks", e))?;
        names
            .into_iter()
            .zip(results)
            .filter(|(_, r)| matches!(r, MultiReadResult::Children { children } if !children.is_empty()))
            .map(|(n, _)| LockName::new(n))
            .collect()
    }
}

/// An acquire in progress. Unless disarmed (`session` taken), dropping it deletes our node in
/// the background, after the create request has finished so that a create still in flight
/// cannot land after the delete.
struct Pending {
    create: Option<JoinHandle<Result<Node>>>,
    session: Option<Arc<ZkSession>>,
    dir: String,
    name: LockName,
    id: String,
    limit: std::time::Duration,
}

impl Pending {
    async fn created(&mut self, name: &LockName) -> Result<Node> {
        let Some(task) = self.create.as_mut() else {
            return Err(Error::LockLost {
                name: name.to_string(),
            });
        };
        let out = task
            .await
            .map_err(|e| Error::backend(KIND, "create task failed", e))?;
        self.create = None;
        out
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        let withdrawal = session.withdrawals.begin(&self.name);
        let (create, dir, id, limit) = (
            self.create.take(),
            self.dir.clone(),
            self.id.clone(),
            self.limit,
        );
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(%dir, "zookeeper: acquire dropped outside a runtime; its node ends with the session");
            return;
        };
        runtime.spawn(async move {
            if let Some(task) = create {
                let _ = task.await;
            }
            mutex::withdraw(&session, &dir, &id, limit).await;
            drop(withdrawal);
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::time::Duration;

    use fencelock::{LockBackend, LockName, Wait};
    use fencelock_testsupport::{unique, ZkEnsemble};

    use super::*;

    /// The state a cancelled acquire leaves for a moment: our own node, ahead in the queue, is
    /// still being withdrawn. A try must wait for it, not report "held by another".
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn try_waits_for_our_own_withdrawal() {
        let ensemble = ZkEnsemble::start(1);
        let config =
            ZkConfig::new(ensemble.connect_string()).base_path(format!("/{}", unique("w")));
        let backend = ZkBackend::connect(config).await.unwrap();
        let name = LockName::new("job").unwrap();
        let session = backend.session().await.unwrap();
        let limit = Duration::from_secs(5);
        let leftover = uuid::Uuid::new_v4().to_string();
        mutex::create(
            &session.client,
            &backend.paths,
            &name,
            &leftover,
            backend.acls,
            limit,
        )
        .await
        .unwrap();
        let withdrawal = session.withdrawals.begin(&name);
        let dir = backend.paths.lock_dir(&name);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            mutex::withdraw(&session, &dir, &leftover, limit).await;
            drop(withdrawal);
        });
        let guard = backend.acquire(&name, Wait::Try).await.unwrap();
        drop(guard);
    }

    /// Every acquire's future is boxed (async-trait) and moved on every call: keep it small.
    #[test]
    fn the_acquire_future_stays_small() {
        let backend = ZkBackend {
            config: ZkConfig::new("127.0.0.1:1"),
            paths: Paths::new("/x"),
            acls: Acls::anyone_all(),
            session: AsyncMutex::new(None),
        };
        let name = LockName::new("job").unwrap();
        let size = std::mem::size_of_val(&backend.acquire_once(&name, false));
        assert!(size <= 2048, "the acquire future is {size} bytes");
    }
}

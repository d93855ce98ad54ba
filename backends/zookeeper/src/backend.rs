//! [`ZkBackend`]: the session and the acquire flow.

use std::sync::Arc;

use async_trait::async_trait;
use std::sync::atomic::AtomicI32;

use fencelock::raw::{observe_leader, watch_queue, Enqueued, Entry, Grant, SessionSlot, Watched};
use fencelock::{
    Access, Error, FencingToken, Leader, Leadership, LockBackend, LockGuard, LockName, LockStatus,
    Result, StateKey, Wait,
};
use futures::stream::BoxStream;
use tokio::sync::OwnedMutexGuard;
use zookeeper_client::{Acls, CreateMode, MultiReadResult};

use crate::election::Elections;
use crate::held::ZkHeld;
use crate::mutex::{self, Unqueue};
use crate::paths::{check_name, sort_children, Paths, Recipe};
use crate::queue::Queues;
use crate::semaphore;
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
/// ```no_run
/// # #[tokio::main] async fn main() -> fencelock::Result<()> {
/// use fencelock::LockBackendExt;
/// use fencelock_zookeeper::{ZkBackend, ZkConfig};
///
/// let locks = ZkBackend::connect(ZkConfig::new("127.0.0.1:2181")).await?;
/// let guard = locks.lock("nightly-report").await?; // a Curator InterProcessMutex on /fencelock/nightly-report
/// println!("token {} (the node's czxid)", guard.token());
/// let _ = guard.release().await?;
/// # Ok(()) }
/// ```
///
/// Requests: an uncontended acquire is one create and one multi-read (children and the
/// checkpoint); a waiter adds one getData-with-watch and one multi-read per predecessor that
/// leaves; release is one delete; fenced put/delete is one multi (check + write), fenced get one
/// multi-read.
pub struct ZkBackend {
    config: ZkConfig,
    /// `config.owner` encoded once: every node's data carries it.
    owner: String,
    paths: Paths,
    acls: Acls<'static>,
    session: SessionSlot<ZkSession>,
}

impl std::fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkBackend")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The ACLs of every node we create: only our digest identity when there is one.
pub(crate) fn acls(config: &ZkConfig) -> Acls<'static> {
    if config.digest.is_some() {
        Acls::creator_all()
    } else {
        Acls::anyone_all()
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
        let acls = acls(&config);
        let backend = ZkBackend {
            owner: config.owner.encode(),
            paths: Paths::new(&config.base_path),
            acls,
            session: SessionSlot::new(),
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
    ///
    /// # Cancel safety
    /// Cancel-safe: it only reads.
    pub async fn session_info(&self) -> Option<zookeeper_client::SessionInfo> {
        self.session
            .live()
            .await
            .map(|s| s.client.session().clone())
    }

    pub(crate) fn paths(&self) -> &Paths {
        &self.paths
    }

    pub(crate) async fn session(&self) -> Result<Arc<ZkSession>> {
        self.session
            .get_or_open(|| ZkSession::connect(&self.config))
            .await
    }

    /// Runs `attempt` under `wait`; a refused or timed-out acquire returns once its nodes are
    /// deleted.
    async fn acquire_with<T>(
        &self,
        name: &LockName,
        wait: Wait,
        attempt: impl std::future::Future<Output = Result<T>> + Send,
    ) -> Result<T> {
        let outcome = wait.limit(KIND, name, attempt).await;
        let limit = self.config.request_timeout;
        self.session
            .settle_refusal(|s| &s.withdrawals, name, limit, outcome)
            .await
    }

    async fn acquire_once(
        &self,
        name: &LockName,
        try_once: bool,
        entry: Entry<'_>,
    ) -> Result<LockGuard> {
        // A lock node's data says who queued it (Curator's says its IP address: foreign).
        let (recipe, data) = match entry {
            Entry::Lock => (Recipe::Mutex, self.owner.as_bytes()),
            Entry::Candidate(value) => (Recipe::Latch, value),
            Entry::Rw(Access::Read) => (Recipe::Read, self.owner.as_bytes()),
            Entry::Rw(Access::Write) => (Recipe::Write, self.owner.as_bytes()),
        };
        let session = self.session().await?;
        let limit = self.config.request_timeout;
        session.withdrawals.settled(name, limit).await;
        // A lock's tasks of this instance take turns before queueing a node (one node per
        // instance, as etcd's one key): a name contended by K tasks of a process is listed
        // with one node of it, not K. Candidates keep a node each, as Curator's latches do.
        let turn = match entry {
            Entry::Lock => Some(
                session
                    .turns
                    .take(name, try_once, session.clock.lost_token())
                    .await?,
            ),
            Entry::Candidate(_) | Entry::Rw(_) => None,
        };
        let id = crate::paths::attempt_id();
        let create = {
            let (client, paths, name, id, data, acls) = (
                session.client.clone(),
                self.paths.clone(),
                name.clone(),
                id.clone(),
                data.to_vec(),
                self.acls,
            );
            async move {
                let dir = paths.lock_dir(&name);
                mutex::create(&client, &dir, (&id, recipe), &data, acls, limit).await
            }
        };
        let unqueue = Unqueue {
            session: Arc::clone(&session),
            dir: self.paths.lock_dir(name),
            id,
            recipe,
            limit,
            turn,
        };
        let mut pending = Enqueued::new(&session.withdrawals, name, create, unqueue);
        let (dir, checkpoint) = (
            self.paths.lock_dir(name),
            self.paths.state(name, &StateKey::checkpoint()),
        );
        let (node, early) = mutex::created_then(&mut pending, || {
            mutex::turn_read(&session.client, &dir, &checkpoint).ok()
        })
        .await?;
        let checkpoint = mutex::wait_turn(
            &session,
            (&dir, &checkpoint),
            name,
            (node, recipe),
            (try_once, early),
            limit,
        )
        .await?;
        let (Some(unqueue), Some(node)) = pending.disarm() else {
            return Err(Error::internal(KIND, "a granted acquire lost its node"));
        };
        tracing::info!(lock = %name, path = %node.path, czxid = node.czxid, "zookeeper: acquired");
        Ok(self.guard_for(name, (node, unqueue.turn), checkpoint, &session))
    }

    /// The guard of a granted node: its czxid is the token; a watch on it fires `lost` when it
    /// is deleted behind our back.
    fn guard_for(
        &self,
        name: &LockName,
        (node, turn): (mutex::Node, Option<OwnedMutexGuard<()>>),
        checkpoint: Option<Vec<u8>>,
        session: &Arc<ZkSession>,
    ) -> LockGuard {
        let token = FencingToken::new(node.czxid.unsigned_abs());
        // One copy of the path for the session's held map and its watcher.
        let path: Arc<str> = Arc::from(node.path);
        let own_version = Arc::new(AtomicI32::new(0));
        let held = ZkHeld {
            session: Arc::clone(session),
            name: name.clone(),
            path: Arc::clone(&path),
            czxid: node.czxid,
            own_version: Arc::clone(&own_version),
        };
        let (guard, trigger) = Grant {
            backend: KIND,
            name: name.clone(),
            token,
            lease: Arc::clone(&session.clock),
            checkpoint,
            held: Box::new(held),
        }
        .into_guard_with_trigger();
        session.hold(crate::own_nodes::OwnNode {
            path,
            own_version,
            trigger,
            _turn: turn,
        });
        guard
    }
}

impl ZkBackend {
    /// One attempt at a permit (see `semaphore`): the gate, our lease, the count, then the
    /// gate goes to the next contender. Gate node and lease share one uuid, so `status` can
    /// tell a waiting gate holder's two nodes for one contender.
    async fn acquire_permit_once(
        &self,
        name: &LockName,
        permits: u32,
        try_once: bool,
    ) -> Result<LockGuard> {
        let session = self.session().await?;
        let limit = self.config.request_timeout;
        session.withdrawals.settled(name, limit).await;
        let id = crate::paths::attempt_id();
        let (gate_dir, leases_dir) = (self.paths.gate_dir(name), self.paths.leases_dir(name));
        let create = |dir: &str, recipe| {
            let (client, dir, id, data, acls) = (
                session.client.clone(),
                dir.to_owned(),
                id.clone(),
                self.owner.as_bytes().to_vec(),
                self.acls,
            );
            async move { mutex::create(&client, &dir, (&id, recipe), &data, acls, limit).await }
        };
        let unqueue = |dir: &str, recipe| Unqueue {
            session: Arc::clone(&session),
            dir: dir.to_owned(),
            id: id.clone(),
            recipe,
            limit,
            turn: None,
        };
        let mut gate = Enqueued::new(
            &session.withdrawals,
            name,
            create(&gate_dir, Recipe::Mutex),
            unqueue(&gate_dir, Recipe::Mutex),
        );
        let checkpoint = self.paths.state(name, &StateKey::checkpoint());
        let (gate_node, early) = mutex::created_then(&mut gate, || {
            mutex::turn_read(&session.client, &gate_dir, &checkpoint).ok()
        })
        .await?;
        mutex::wait_turn(
            &session,
            (&gate_dir, &checkpoint),
            name,
            (gate_node, Recipe::Mutex),
            (try_once, early),
            limit,
        )
        .await?;
        // Any `?` from here on withdraws both nodes: the lease, then the gate node.
        let mut lease = Enqueued::new(
            &session.withdrawals,
            name,
            create(&leases_dir, Recipe::Lease),
            unqueue(&leases_dir, Recipe::Lease),
        );
        let (lease_node, early) = mutex::created_then(&mut lease, || {
            semaphore::count_read(&session.client, &leases_dir).ok()
        })
        .await?;
        let admitted = semaphore::admit(
            &session,
            name,
            &leases_dir,
            (lease_node, early),
            permits,
            try_once,
            limit,
        )
        .await;
        if let Err(refused @ Error::PermitsMismatch { .. }) = admitted {
            // Refused: take nothing, visibly, before saying so.
            lease.withdraw_now(limit).await;
            gate.withdraw_now(limit).await;
            return Err(refused);
        }
        admitted?;
        // The gate goes to the next contender (its withdrawal is our release), before we
        // return, as Curator's `InterProcessSemaphoreV2` does: another instance's try right
        // after this grant must find the way open. Until the lease is disarmed, a
        // cancellation here withdraws it too.
        gate.withdraw_now(limit).await;
        let (_, Some(node)) = lease.disarm() else {
            return Err(Error::internal(
                KIND,
                "a granted permit lost its lease node",
            ));
        };
        tracing::info!(semaphore = %name, path = %node.path, czxid = node.czxid, "zookeeper: permit acquired");
        Ok(self.guard_for(name, (node, None), None, &session))
    }

    fn elections(&self) -> Elections<'_> {
        Elections {
            backend: self,
            idle: self.config.session_timeout,
        }
    }
}

#[async_trait]
impl LockBackend for ZkBackend {
    fn kind(&self) -> &'static str {
        KIND
    }

    async fn acquire(&self, name: &LockName, wait: Wait) -> Result<LockGuard> {
        check_name(name)?;
        let attempt = self.acquire_once(name, wait == Wait::Try, Entry::Lock);
        self.acquire_with(name, wait, attempt).await
    }

    async fn acquire_leadership(
        &self,
        name: &LockName,
        value: &[u8],
        wait: Wait,
    ) -> Result<Leadership> {
        check_name(name)?;
        let attempt = self.acquire_once(name, wait == Wait::Try, Entry::Candidate(value));
        let guard = self.acquire_with(name, wait, attempt).await?;
        Ok(Leadership::new(guard, value.to_vec()))
    }

    async fn acquire_permit(&self, name: &LockName, permits: u32, wait: Wait) -> Result<LockGuard> {
        check_name(name)?;
        fencelock::raw::check_permits(permits)?;
        let attempt = self.acquire_permit_once(name, permits, wait == Wait::Try);
        self.acquire_with(name, wait, attempt).await
    }

    async fn acquire_rw(&self, name: &LockName, access: Access, wait: Wait) -> Result<LockGuard> {
        check_name(name)?;
        let attempt = self.acquire_once(name, wait == Wait::Try, Entry::Rw(access));
        self.acquire_with(name, wait, attempt).await
    }

    async fn permit_status(&self, name: &LockName) -> Result<LockStatus> {
        check_name(name)?;
        Queues(self.elections()).permits(name).await
    }

    async fn close(&self) -> Result<()> {
        if let Some(session) = self.session.live().await {
            session
                .withdrawals
                .all_settled(self.config.request_timeout)
                .await;
            // The ZooKeeper session itself closes (and its nodes go) with its last handle.
            session.clock.close_because("the backend was closed");
        }
        Ok(())
    }

    async fn leader(&self, name: &LockName) -> Result<Option<Leader>> {
        Ok(self.elections().read(name).await?.0)
    }

    fn observe(&self, name: &LockName) -> BoxStream<'_, Result<Option<Leader>>> {
        observe_leader(KIND, self.elections(), name.clone())
    }

    async fn status(&self, name: &LockName) -> Result<LockStatus> {
        Ok(Queues(self.elections()).read_queue(name, false).await?.0)
    }

    fn watch(&self, name: &LockName) -> BoxStream<'_, Result<LockStatus>> {
        watch_queue(KIND, Queues(self.elections()), name.clone())
    }

    async fn break_lock(&self, name: &LockName) -> Result<Option<FencingToken>> {
        check_name(name)?;
        let session = self.session().await?;
        let dir = self.paths.lock_dir(name);
        let mut children = match session.client.list_children(&dir).await {
            Ok(children) => children,
            Err(zookeeper_client::Error::NoNode) => return Ok(None),
            Err(e) => return Err(zk_error("list contenders", e)),
        };
        sort_children(&mut children);
        let Some(first) = children.first() else {
            return Ok(None);
        };
        let path = [dir.as_str(), "/", first.as_str()].concat();
        let stat = match session.client.check_stat(&path).await {
            Ok(Some(stat)) => stat,
            Ok(None) => return Ok(None),
            Err(e) => return Err(zk_error("read the holder's node", e)),
        };
        // The version pins this incarnation of the node: nothing else is deleted.
        match session.client.delete(&path, Some(stat.version)).await {
            Ok(()) => {
                tracing::warn!(lock = %name, %path, "zookeeper: break: removed the holder's node");
                Ok(Some(FencingToken::new(stat.czxid.unsigned_abs())))
            }
            Err(zookeeper_client::Error::NoNode | zookeeper_client::Error::BadVersion) => Ok(None),
            Err(e) => Err(zk_error("delete the holder's node", e)),
        }
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
        Ok(names
            .into_iter()
            .zip(results)
            .filter(|(_, r)| matches!(r, MultiReadResult::Children { children } if !children.is_empty()))
            // A child that is no lock name was not written by us (review F13): skip it.
            .filter_map(|(n, _)| LockName::new(n).ok())
            .collect())
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
            &backend.paths.lock_dir(&name),
            (&leftover, Recipe::Mutex),
            b"",
            backend.acls,
            limit,
        )
        .await
        .unwrap();
        let withdrawal = session.withdrawals.begin(&name);
        let mut unqueue = Unqueue {
            session: Arc::clone(&session),
            dir: backend.paths.lock_dir(&name),
            id: leftover,
            recipe: Recipe::Mutex,
            limit,
            turn: None,
        };
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            fencelock::raw::Withdraw::withdraw(&mut unqueue, None)
                .await
                .unwrap();
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
            owner: "x".to_owned(),
            paths: Paths::new("/x"),
            acls: Acls::anyone_all(),
            session: SessionSlot::new(),
        };
        let name = LockName::new("job").unwrap();
        let size = std::mem::size_of_val(&backend.acquire_once(&name, false, Entry::Lock));
        assert!(size <= 2048, "the acquire future is {size} bytes");
    }
}

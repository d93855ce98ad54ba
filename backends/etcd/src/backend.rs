//! [`EtcdBackend`]: sessions, local turns, and the acquire flow.

use std::sync::Arc;

use async_trait::async_trait;
use etcd_client::{Client, GetOptions, SortOrder, SortTarget};
use fencelock::raw::{
    observe_leader, watch_queue, Enqueued, Entry, Grant, SessionSlot, SharedTurn, Watched,
};
use fencelock::{
    Access, Error, FencingToken, Leader, Leadership, LockBackend, LockGuard, LockName, LockStatus,
    Result, Wait,
};
use futures::stream::BoxStream;

use crate::election::Elections;
use crate::held::EtcdHeld;
use crate::keys::{Keys, QueueAt};
use crate::mutex::{self, Granted, Unqueue};
use crate::queue::Queues;
use crate::semaphore::{self, Ours, PermitKey, Unpermit};
use crate::session::Session;
use crate::watch::{Held, KeyGrant};
use crate::{call, EtcdConfig, KIND};

/// A [`LockBackend`] on an etcd cluster.
///
/// One instance is one client session: one lease, granted on the first acquire, kept alive by
/// the instance at TTL/3 and shared by all its locks; when it is lost, every guard of the
/// session fires `lost` and the next acquire starts a new lease. Separate instances contend like
/// separate processes. Locks are compatible with Go's `concurrency.Mutex` and `etcdctl lock`
/// (see the crate docs for the key layout).
///
/// Requests per operation: see [the protocol](crate#the-protocol).
///
/// ```no_run
/// # #[tokio::main] async fn main() -> fencelock::Result<()> {
/// use std::sync::Arc;
/// use fencelock::{LockBackend, LockBackendExt};
/// use fencelock_etcd::{EtcdBackend, EtcdConfig};
///
/// let locks: Arc<dyn LockBackend> =
///     Arc::new(EtcdBackend::connect(EtcdConfig::new(["http://127.0.0.1:2379"])).await?);
/// let guard = locks.lock("nightly-report").await?; // key fencelock/nightly-report/<lease hex>
/// println!("token {} (what `etcdctl lock` calls ETCD_LOCK_REV)", guard.token());
/// let _ = guard.release().await?;
/// # Ok(()) }
/// ```
pub struct EtcdBackend {
    /// Shared: the client is 3.5 KB by value, and every held lock keeps a handle.
    client: Arc<Client>,
    config: EtcdConfig,
    /// `config.owner` encoded once: every entry's value carries it.
    owner: String,
    keys: Keys,
    session: SessionSlot<Session>,
}

impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl EtcdBackend {
    /// Connects to the cluster and checks that it answers (and that the credentials work).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for bad settings; [`Error::Backend`] when no endpoint answers
    /// within `connect_timeout` or authentication fails.
    ///
    /// # Cancel safety
    /// Cancel-safe: nothing is written to etcd.
    pub async fn connect(config: EtcdConfig) -> Result<Self> {
        config.validate()?;
        let options = crate::connect::options(&config);
        let reach = format!(
            "connect to {:?} (check that etcd runs there, the endpoints, credentials and TLS settings)",
            config.endpoints
        );
        let client = call(
            &reach,
            config.connect_timeout,
            Client::connect(&config.endpoints, Some(options)),
        )
        .await?;
        let probe = GetOptions::new().with_count_only();
        call(&reach, config.connect_timeout, {
            let (mut client, prefix) = (client.clone(), config.prefix.clone());
            async move { client.get(prefix, Some(probe)).await }
        })
        .await?;
        Ok(EtcdBackend {
            client: Arc::new(client),
            keys: Keys::new(&config.prefix),
            owner: config.owner.encode(),
            config,
            session: SessionSlot::new(),
        })
    }

    /// The settings this backend runs with.
    pub fn config(&self) -> &EtcdConfig {
        &self.config
    }

    /// The current session's lease id, if a session is live (for diagnostics: it is the hex
    /// suffix of this instance's lock keys).
    ///
    /// # Cancel safety
    /// Cancel-safe: it only reads.
    pub async fn lease_id(&self) -> Option<i64> {
        self.session.live().await.map(|s| s.lease)
    }

    fn elections(&self) -> Elections<'_> {
        Elections {
            client: &self.client,
            keys: &self.keys,
            limit: self.config.request_timeout,
            idle: self.config.ttl,
        }
    }

    /// Runs `attempt` under `wait`, once more (on a new session) when the session was lost on
    /// the spot; a refused or timed-out acquire returns once its keys are deleted.
    async fn acquire_with<T, Fut>(
        &self,
        name: &LockName,
        wait: Wait,
        attempt: impl Fn() -> Fut + Send + Sync,
    ) -> Result<T>
    where
        T: Send,
        Fut: std::future::Future<Output = Result<T>> + Send,
    {
        let outcome = wait
            .limit(KIND, name, async {
                match attempt().await {
                    Err(e) if crate::lease_gone(&e) => attempt().await,
                    outcome => outcome,
                }
            })
            .await;
        let limit = self.config.request_timeout;
        self.session
            .settle_refusal(|s| &s.withdrawals, name, limit, outcome)
            .await
    }

    async fn session(&self) -> Result<Arc<Session>> {
        self.session
            .get_or_open(|| Session::grant(&self.client, &self.config))
            .await
    }

    /// Queues for `name` at `at` and waits for the front of that queue: the first half of an
    /// acquire, shared by locks, candidates and a semaphore's gate. The entry stays armed in
    /// the returned [`Front`]: dropping it withdraws the key.
    async fn enter(
        &self,
        name: &LockName,
        try_once: bool,
        entry: Entry<'_>,
        at: impl Fn(i64) -> QueueAt,
    ) -> Result<Front> {
        let session = self.session().await?;
        let limit = self.config.request_timeout;
        session.withdrawals.settled(name, limit).await;
        let turn = match entry {
            // Its key is unique to the attempt: readers of one instance share the lock.
            Entry::Rw(_) => None,
            Entry::Lock | Entry::Candidate(_) => Some(
                session
                    .turns
                    .take(name, try_once, session.clock.lost_token())
                    .await?,
            ),
        };
        // Shared with the enqueue's future, which may outlive this one (a withdrawal's task).
        let at = Arc::new(at(session.lease));
        let (value, unique) = match entry {
            Entry::Lock | Entry::Rw(_) => {
                let value = mutex::attempt_value(&self.owner);
                (value.clone().into_bytes(), Some(value))
            }
            Entry::Candidate(value) => (value.to_vec(), None),
        };
        let enqueue = {
            // Handles, not clones: a `Client` by value would make every acquire future
            // (and this task) kilobytes larger, and moving them costs on the hot path.
            let (client, at, name, session) = (
                Arc::clone(&self.client),
                Arc::clone(&at),
                name.clone(),
                Arc::clone(&session),
            );
            async move { mutex::enqueue(&client, &at, &name, &session, &value, limit).await }
        };
        let unqueue = Unqueue {
            client: Arc::clone(&self.client),
            session: Arc::clone(&session),
            key: at.key.clone(),
            value: unique,
            limit,
            turn,
        };
        let mut pending = Enqueued::new(&session.withdrawals, name, enqueue, unqueue);
        let queued = match pending.reply().await {
            Ok(queued) => queued,
            Err(e) => {
                if crate::lease_gone(&e) {
                    // Review F8: the next acquire must not wait for the keepalive (TTL/3) to
                    // find out; `acquire` retries once on a new session.
                    tracing::warn!(
                        lease = format_args!("{:x}", session.lease),
                        "etcd: the session's lease is gone; opening a new session"
                    );
                    session
                        .clock
                        .lose_because("the session's lease is gone (revoked or expired)");
                }
                return Err(e);
            }
        };
        let granted = if queued.owner {
            Granted {
                token: queued.created,
                checkpoint: queued.checkpoint.clone(),
            }
        } else if try_once {
            return Err(Error::would_block(name)); // `pending` withdraws our key
        } else {
            // Boxed: its state (a watch stream among it) would otherwise make the future of
            // every acquire, contended or not, larger.
            Box::pin(mutex::wait_for_turn(
                &self.client,
                &at,
                name,
                queued,
                &session,
                limit,
            ))
            .await?
        };
        Ok(Front {
            pending,
            granted,
            session,
        })
    }

    async fn acquire_once(
        &self,
        name: &LockName,
        try_once: bool,
        entry: Entry<'_>,
    ) -> Result<LockGuard> {
        let nonce = mutex::nonce();
        let front = self
            .enter(name, try_once, entry, |lease| match entry {
                Entry::Rw(access) => self.keys.rw_queue(name, access, lease, nonce),
                Entry::Lock | Entry::Candidate(_) => self.keys.lock_queue(name, lease),
            })
            .await?;
        let Front {
            pending,
            granted,
            session,
        } = front;
        let limit = self.config.request_timeout;
        let (Some(unqueue), Some(queued)) = pending.disarm() else {
            return Err(Error::internal(
                KIND,
                "a granted acquire lost its queue entry",
            ));
        };
        // A candidate's term is its key's create revision: what observers (ours, Go's) see of
        // the leader, and increasing from one leader to the next, since leaders are elected
        // in create order. A lock's token is the grant revision, as etcdctl's.
        let token = FencingToken::new(
            match entry {
                Entry::Lock | Entry::Rw(_) => granted.token,
                Entry::Candidate(_) => queued.created,
            }
            .unsigned_abs(),
        );
        tracing::info!(lock = %name, %token, key = %queued.key, created = queued.created, "etcd: acquired");
        let (key, created): (Arc<str>, i64) = (Arc::from(queued.key), queued.created);
        let turn = unqueue.turn.map(SharedTurn::new);
        let held = EtcdHeld {
            client: Arc::clone(&self.client),
            keys: self.keys.clone(),
            name: name.clone(),
            key: Arc::clone(&key),
            created: queued.created,
            token,
            limit,
            ttl: self.config.ttl,
            lease: session.lease,
            session: Arc::clone(&session),
            turn: turn.clone(),
        };
        let (guard, trigger) = Grant {
            backend: KIND,
            name: name.clone(),
            token,
            lease: Arc::clone(&session.clock),
            checkpoint: granted.checkpoint,
            held: Box::new(held),
        }
        .into_guard_with_trigger();
        session.held_keys.watch(Held {
            key,
            grant: KeyGrant {
                created,
                trigger,
                turn,
                // A lock's and a candidate's key is the session's for the name; an RW entry's
                // is unique to the attempt.
                reused: !matches!(entry, Entry::Rw(_)),
            },
        });
        Ok(guard)
    }
}

impl EtcdBackend {
    /// One attempt at a permit: the gate first, then our permit key and the count, in the
    /// gate's holder's Txn; while the count is over, the gate's holder waits for a release.
    async fn acquire_permit_once(
        &self,
        name: &LockName,
        permits: u32,
        try_once: bool,
    ) -> Result<LockGuard> {
        let mut front = self
            .enter(name, try_once, Entry::Lock, |lease| {
                self.keys.gate_queue(name, lease)
            })
            .await?;
        let session = Arc::clone(&front.session);
        let limit = self.config.request_timeout;
        let (gate_key, gate_created) = semaphore::gate(front.pending.reply().await?);
        let permit = PermitKey {
            key: self.keys.permit_key(name, session.lease, gate_created),
            prefix: self.keys.permits_prefix(name),
        };
        let put = {
            let (client, name, gate_key, permit, lease) = (
                Arc::clone(&self.client),
                name.clone(),
                gate_key.clone(),
                permit.clone(),
                session.lease,
            );
            let value = semaphore::permit_value(permits, &self.owner);
            async move {
                let gate = (gate_key.as_str(), gate_created);
                semaphore::put_permit(&client, &name, gate, &permit, &value, lease, limit).await
            }
        };
        let unpermit = Unpermit {
            client: Arc::clone(&self.client),
            session: Arc::clone(&session),
            key: permit.key.clone(),
            limit,
        };
        // Any `?` from here on withdraws both keys: the permit's, then the gate's.
        let mut pending = Enqueued::new(&session.withdrawals, name, put, unpermit);
        let counted = pending.reply().await?;
        let created = counted.created;
        let admits = match counted.admits(name, permits) {
            Ok(admits) => admits,
            Err(refused) => {
                // Refused: take nothing, visibly, before saying so.
                pending.withdraw_now(limit).await;
                front.pending.withdraw_now(limit).await;
                return Err(refused);
            }
        };
        let token = if admits {
            counted.revision
        } else if try_once {
            return Err(Error::would_block(name));
        } else {
            let ours = Ours {
                gate: (gate_key.as_str(), gate_created),
                permit: &permit,
                created,
            };
            Box::pin(semaphore::wait_for_permit(
                &self.client,
                name,
                ours,
                permits,
                &session,
                limit,
            ))
            .await?
        };
        // Admitted: the gate goes to the next contender (its withdrawal is our release), and
        // before we return, as Curator's semaphore releases its lock inside `acquire`: another
        // instance's try right after this grant must find the way open. Until the permit is
        // disarmed, a cancellation here withdraws it too.
        front.pending.withdraw_now(limit).await;
        let _ = pending.disarm();
        let token = FencingToken::new(token.unsigned_abs());
        tracing::info!(semaphore = %name, %token, key = %permit.key, "etcd: permit acquired");
        let key: Arc<str> = Arc::from(permit.key.as_str());
        let held = EtcdHeld {
            client: Arc::clone(&self.client),
            keys: self.keys.clone(),
            name: name.clone(),
            key: Arc::clone(&key),
            created,
            token,
            limit,
            ttl: self.config.ttl,
            lease: session.lease,
            session: Arc::clone(&session),
            turn: None,
        };
        let (guard, trigger) = Grant {
            backend: KIND,
            name: name.clone(),
            token,
            lease: Arc::clone(&session.clock),
            checkpoint: None,
            held: Box::new(held),
        }
        .into_guard_with_trigger();
        session.held_keys.watch(Held {
            key,
            grant: KeyGrant {
                created,
                trigger,
                turn: None,
                reused: false, // unique to the attempt
            },
        });
        Ok(guard)
    }
}

/// The front of a queue, reached: the entry (still armed), the grant, the session.
pub(crate) struct Front {
    pub(crate) pending: Enqueued<mutex::Queued, Unqueue>,
    pub(crate) granted: Granted,
    pub(crate) session: Arc<Session>,
}

#[async_trait]
impl LockBackend for EtcdBackend {
    fn kind(&self) -> &'static str {
        KIND
    }

    async fn acquire(&self, name: &LockName, wait: Wait) -> Result<LockGuard> {
        let try_once = wait == Wait::Try;
        self.acquire_with(name, wait, || {
            self.acquire_once(name, try_once, Entry::Lock)
        })
        .await
    }

    async fn acquire_leadership(
        &self,
        name: &LockName,
        value: &[u8],
        wait: Wait,
    ) -> Result<Leadership> {
        let (try_once, entry) = (wait == Wait::Try, Entry::Candidate(value));
        let guard = self
            .acquire_with(name, wait, || self.acquire_once(name, try_once, entry))
            .await?;
        Ok(Leadership::new(guard, value.to_vec()))
    }

    async fn acquire_permit(&self, name: &LockName, permits: u32, wait: Wait) -> Result<LockGuard> {
        fencelock::raw::check_permits(permits)?;
        let try_once = wait == Wait::Try;
        self.acquire_with(name, wait, || {
            self.acquire_permit_once(name, permits, try_once)
        })
        .await
    }

    async fn acquire_rw(&self, name: &LockName, access: Access, wait: Wait) -> Result<LockGuard> {
        let (try_once, entry) = (wait == Wait::Try, Entry::Rw(access));
        self.acquire_with(name, wait, || self.acquire_once(name, try_once, entry))
            .await
    }

    async fn permit_status(&self, name: &LockName) -> Result<LockStatus> {
        Queues(self.elections()).permits_at(name).await
    }

    async fn close(&self) -> Result<()> {
        let Some(session) = self.session.live().await else {
            return Ok(());
        };
        let limit = self.config.request_timeout;
        session.withdrawals.all_settled(limit).await;
        session.clock.close_because("the backend was closed");
        // As Go's `Session.Close`: the revoke deletes every key of the session at once.
        let revoked = call("revoke the session's lease", limit, {
            let (mut client, lease) = (Client::clone(&self.client), session.lease);
            async move { client.lease_revoke(lease).await }
        })
        .await;
        match revoked {
            // The session's own keepalive task revokes a lost lease too; either revoke will do.
            Err(e) if !crate::lease_gone(&e) => Err(e),
            _ => Ok(()),
        }
    }

    async fn leader(&self, name: &LockName) -> Result<Option<Leader>> {
        Ok(self.elections().read(name).await?.0)
    }

    fn observe(&self, name: &LockName) -> BoxStream<'_, Result<Option<Leader>>> {
        observe_leader(KIND, self.elections(), name.clone())
    }

    async fn status(&self, name: &LockName) -> Result<LockStatus> {
        Ok(Queues(self.elections()).read_at(name).await?.0)
    }

    fn watch(&self, name: &LockName) -> BoxStream<'_, Result<LockStatus>> {
        watch_queue(KIND, Queues(self.elections()), name.clone())
    }

    async fn break_lock(&self, name: &LockName) -> Result<Option<FencingToken>> {
        let first = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let resp = call("read the lock's holder", self.config.request_timeout, {
            let (mut client, prefix) = (Client::clone(&self.client), self.keys.lock_prefix(name));
            async move { client.get(prefix, Some(first)).await }
        })
        .await?;
        let Some(holder) = resp.kvs().first() else {
            return Ok(None);
        };
        let (key, created) = (
            String::from_utf8_lossy(holder.key()).into_owned(),
            holder.create_revision(),
        );
        // Owner-checked like every delete: a holder that released meanwhile is left alone.
        let removed =
            mutex::delete_if_created(&self.client, &key, created, self.config.request_timeout)
                .await?;
        tracing::warn!(lock = %name, %key, removed, "etcd: break: removed the holder's key");
        Ok(removed.then(|| FencingToken::new(created.unsigned_abs())))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockName>> {
        let keys = GetOptions::new().with_prefix().with_keys_only();
        let resp = call("list locks", self.config.request_timeout, {
            let (mut client, range) = (
                Client::clone(&self.client),
                format!("{}{prefix}", self.config.prefix),
            );
            async move { client.get(range, Some(keys)).await }
        })
        .await?;
        let mut names: Vec<LockName> = resp
            .kvs()
            .iter()
            .filter_map(|kv| {
                let rest = kv.key().strip_prefix(self.config.prefix.as_bytes())?;
                let name = std::str::from_utf8(rest).ok()?.split('/').next()?;
                LockName::new(name).ok()
            })
            .collect();
        names.dedup();
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::time::Duration;

    use fencelock::{LockBackend, LockName, Wait};
    use fencelock_testsupport::{unique, EtcdCluster};

    use super::*;

    async fn single_node_backend() -> (EtcdCluster, EtcdBackend) {
        let cluster = EtcdCluster::start(1);
        let config = EtcdConfig::new(cluster.endpoints()).prefix(format!("{}/", unique("b")));
        let backend = EtcdBackend::connect(config).await.unwrap();
        (cluster, backend)
    }

    /// The state a cancelled acquire leaves for a moment: its withdrawal still holds this
    /// session's turn on the name. A try must wait for it, not report "held by another".
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn try_waits_for_our_own_withdrawal() {
        let (_cluster, backend) = single_node_backend().await;
        let name = LockName::new("job").unwrap();
        let session = backend.session().await.unwrap();
        let turn = session
            .turns
            .take(&name, false, session.clock.lost_token())
            .await
            .unwrap();
        let withdrawal = session.withdrawals.begin(&name);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            drop(turn);
            drop(withdrawal);
        });
        let guard = backend.acquire(&name, Wait::Try).await.unwrap();
        drop(guard);
    }

    /// Review F2: a withdrawal of an earlier attempt that lands late (a retry after a timeout
    /// that the server still applied) must not delete this instance's next grant, whose key has
    /// the same name on the same lease. It compares the earlier key's create revision, or, when
    /// the enqueue's reply never came, the earlier attempt's value.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_late_withdrawal_cannot_delete_the_next_grant() {
        use fencelock::raw::Withdraw;
        let (cluster, b) = single_node_backend().await;
        let config = EtcdConfig::new(cluster.endpoints()).prefix(b.config().prefix.clone());
        let a = EtcdBackend::connect(config.clone()).await.unwrap();
        let c = EtcdBackend::connect(config).await.unwrap();
        let name = LockName::new("job").unwrap();
        let held = a.acquire(&name, Wait::Try).await.unwrap();

        // Attempt N of b: queued behind a, then withdrawn (cancelled).
        let session = b.session().await.unwrap();
        let value = mutex::attempt_value(&b.owner);
        let queued = mutex::enqueue(
            &b.client,
            &b.keys.lock_queue(&name, session.lease),
            &name,
            &session,
            value.as_bytes(),
            LIMIT,
        )
        .await
        .unwrap();
        assert!(!queued.owner);
        let turn = Arc::new(tokio::sync::Mutex::new(())).lock_owned().await;
        let mut late = Unqueue {
            client: Arc::clone(&b.client),
            session: Arc::clone(&session),
            key: b.keys.lock_queue(&name, session.lease).key,
            value: Some(value),
            limit: LIMIT,
            turn: Some(turn),
        };
        late.withdraw(Some(&queued)).await.unwrap();

        // Attempt N+1 is granted; the same key name on the same lease.
        let _ = held.release().await.unwrap();
        let granted = b.acquire(&name, Wait::Try).await.unwrap();
        // Attempt N's withdrawal lands again, late, with and without its reply.
        late.withdraw(Some(&queued)).await.unwrap();
        late.withdraw(None).await.unwrap();
        granted.fenced_put("still", "mine").await.unwrap();
        assert!(
            matches!(
                c.acquire(&name, Wait::Try).await,
                Err(Error::WouldBlock { .. })
            ),
            "the grant's key must survive a late withdrawal"
        );
        let _ = granted.release().await.unwrap();
    }

    const LIMIT: Duration = Duration::from_secs(5);

    /// Every acquire's future is boxed (async-trait) and moved; at 15 KB (a `Client` by value,
    /// the contended path and the session grant inline) that copy showed in profiles.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_acquire_future_stays_small() {
        let (_cluster, backend) = single_node_backend().await;
        let name = LockName::new("job").unwrap();
        let size = std::mem::size_of_val(&backend.acquire_once(&name, false, Entry::Lock));
        assert!(size <= 2048, "the acquire future is {size} bytes");
    }
}

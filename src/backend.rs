//! The backend trait: what a store must provide so that [`LockGuard`] works on it.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;

use futures::stream::{BoxStream, StreamExt};

use crate::{
    Error, FencingToken, Leader, Leadership, LockGuard, LockName, Owner, Result, StateKey,
};

/// How long an acquire may wait for a lock that someone else holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Wait {
    /// Wait until the lock is granted (or the backend fails).
    #[default]
    Forever,
    /// Wait at most this long, then fail with [`Error::Timeout`].
    Timeout(Duration),
    /// Do not wait: fail with [`Error::WouldBlock`] if the lock is held.
    Try,
}

impl Wait {
    /// Runs a waiting acquire under this policy's time limit: `Forever` runs it as is,
    /// `Timeout(d)` drops it after `d` and reports [`Error::Timeout`]. A backend calls this for
    /// the two waiting policies and handles [`Wait::Try`] itself. It runs the acquire in the
    /// `acquire` span and records its wait and outcome for `backend` (see
    /// [`telemetry`](crate::telemetry)).
    ///
    /// # Errors
    /// [`Error::Timeout`] when the limit passed first; otherwise what `acquire` returned.
    ///
    /// # Cancel safety
    /// Dropping `acquire` on timeout must leave nothing behind in the store; that is the
    /// backend's cancel-safety duty either way.
    pub fn limit<'a, T: 'a>(
        self,
        backend: &'static str,
        name: &'a LockName,
        acquire: impl Future<Output = Result<T>> + 'a,
    ) -> impl Future<Output = Result<T>> + 'a {
        // Boxed before the first await: each async layer below keeps its own copy of what it
        // is given (its argument, then the future it awaits), so the acquire (about 1 KB) was
        // held several times over and copied at every layer (a 6-8 KB future per acquire,
        // about 2k instructions of memcpy; callgrind).
        let acquire = Box::pin(acquire);
        crate::telemetry::acquire(backend, name.as_str(), self.bound(name, acquire))
    }

    async fn bound<T>(
        self,
        name: &LockName,
        acquire: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        match self {
            Wait::Timeout(waited) => {
                tokio::time::timeout(waited, acquire)
                    .await
                    .unwrap_or_else(|_| {
                        Err(Error::Timeout {
                            name: name.to_string(),
                            waited,
                        })
                    })
            }
            Wait::Forever | Wait::Try => acquire.await,
        }
    }
}

/// What [`LockGuard::release`] found at the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum ReleaseOutcome {
    /// We still owned the lock, and it is now free for the next contender. After a retried
    /// release whose first reply was lost, this also covers "our first attempt deleted it": the
    /// retry finds the entry gone and the store cannot tell who removed it; the entry was ours
    /// when that attempt was sent.
    Released,
    /// The lock was no longer ours (lease expired, taken away); nothing was deleted, so the
    /// next holder, if any, keeps it. Work done since the loss may have been refused or
    /// overwritten.
    NotOwned,
}

/// A store that grants leases on named locks, each with a [`FencingToken`](crate::FencingToken).
///
/// Use it as `Arc<dyn LockBackend>` to swap backends by configuration; the
/// [`LockBackendExt`] methods (`lock`, `try_lock`, `lock_timeout`) take plain `&str` names.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> fencelock::Result<()> {
/// use std::sync::Arc;
/// use fencelock::{LockBackend, LockBackendExt, MemoryBackend};
///
/// let backend: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
/// let guard = backend.lock("nightly-report").await?;
/// println!("holding {} with token {}", guard.name(), guard.token());
/// let _ = guard.release().await?;
/// # Ok(()) }
/// ```
///
/// # Contract
/// An implementation of [`acquire`](LockBackend::acquire) must (the [`raw`](crate::raw)
/// module has the shared pieces named here; the conformance suite, `fencelock::testkit`
/// (feature `testkit`), checks each point):
/// 1. grant a lock to at most one live [`LockGuard`] at a time, across all processes and
///    all instances sharing the store, **and within one instance** (a second acquire of a name the
///    instance already holds waits like any other contender; it never gets a second guard);
/// 2. give each grant a token strictly greater than every earlier grant's token of that name;
/// 3. keep the grant on a lease that the store expires on its own if the holder stops renewing,
///    and renew it with [`raw::keep_renewed`](crate::raw::keep_renewed), which renews at TTL/3
///    and feeds the session's [`raw::LeaseClock`](crate::raw::LeaseClock) with each renewal's
///    *send* time, so that the guard's `lost` fires before the store can expire it; keep one
///    session per instance in a [`raw::SessionSlot`](crate::raw::SessionSlot);
/// 4. honour [`Wait`]: `Try` makes one attempt and fails with [`Error::WouldBlock`]; `Timeout`
///    fails with [`Error::Timeout`] ([`Wait::limit`] does this); waiters are granted in arrival
///    order and each waits only for its predecessor (the tasks of one instance may first take
///    turns among themselves, [`raw::LocalTurns`](crate::raw::LocalTurns), so that across
///    instances the order is the one in which each instance's turn reaches the store);
/// 5. be cancel-safe: if the acquire future is dropped at any await point, or its request
///    fails, whatever it wrote to the store is removed: run the first request in a
///    [`raw::Enqueued`](crate::raw::Enqueued), which withdraws it after it has landed and
///    counts the withdrawal in the session's [`raw::Withdrawals`](crate::raw::Withdrawals); a
///    new acquire of the same name by the same instance first waits for those
///    ([`Withdrawals::settled`](crate::raw::Withdrawals::settled)), or a try right after a
///    cancelled acquire would find its own leftover; a refused or timed-out acquire returns
///    only once its entry is gone
///    ([`Withdrawals::settle_refusal`](crate::raw::Withdrawals::settle_refusal)), so that no
///    one sees it queued afterwards;
/// 6. hand the guard the checkpoint stored under [`StateKey::checkpoint`] at grant time;
/// 7. build the guard with [`raw::Grant`](crate::raw::Grant), and implement
///    [`raw::HeldLock`](crate::raw::HeldLock) for its store half, with every operation checked
///    *by the store* against the grant (a compare on the token, never a blind write or delete);
///    a lock that vanishes while its session lives (deleted behind its back) fires its own
///    `lost` through [`Grant::into_guard_with_trigger`](crate::raw::Grant::into_guard_with_trigger).
#[async_trait]
pub trait LockBackend: Send + Sync + fmt::Debug {
    /// A short name of the backend kind for errors and logs: `"etcd"`, `"zookeeper"`, `"memory"`.
    fn kind(&self) -> &'static str;

    /// Acquires the lock `name` under the wait policy `wait`.
    ///
    /// # Errors
    /// [`Error::WouldBlock`] (for [`Wait::Try`]), [`Error::Timeout`] (for [`Wait::Timeout`]),
    /// [`Error::LockLost`] if the session ended while waiting, [`Error::Backend`] when the store
    /// cannot be reached. `WouldBlock` and `Timeout` come once the attempt's queue entry is
    /// deleted (a timeout may so return up to the request timeout late): a `status` or
    /// another client's try right after them does not find it.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future removes the waiter from the queue (see the contract).
    async fn acquire(&self, name: &LockName, wait: Wait) -> Result<LockGuard>;

    /// Acquires one of the `permits` permits of the semaphore `name` under `wait`: at most
    /// `permits` guards of `name` are held at once, across every process. A permit is a
    /// [`LockGuard`] with a lock's guarantees: `lost` before the store could give the permit
    /// to someone else, an owner-checked release, fenced state the store refuses once the
    /// permit is gone, and a token unique to the grant that grows with each grant. Waiters are
    /// served in arrival order, and each release wakes one of them. The count is stored with
    /// the semaphore and checked by the store: while anyone holds or waits for a permit of
    /// `name`, an acquire with another count is refused. Use [`Semaphore`](crate::Semaphore)
    /// for the ergonomic form. The default says the backend does not support semaphores.
    ///
    /// What a permit's token can fence: `permits` holders coexist, so one resource fenced by
    /// the highest token seen would refuse every holder but the newest. Fence what one
    /// holder owns instead: a work item taken by the permit, or the permit holder's own
    /// fenced state ([`LockGuard::fenced_put`]), which the store refuses once the permit is
    /// lost.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> fencelock::Result<()> {
    /// use fencelock::{LockBackend, LockName, MemoryStore, Wait};
    ///
    /// let store = MemoryStore::new();
    /// let (a, b, c) = (store.backend(), store.backend(), store.backend());
    /// let pool = LockName::new("gpu")?;
    /// let first = a.acquire_permit(&pool, 2, Wait::Forever).await?;
    /// let second = b.acquire_permit(&pool, 2, Wait::Forever).await?;
    /// assert!(c.acquire_permit(&pool, 2, Wait::Try).await.is_err()); // both permits taken
    /// let _ = first.release().await?;
    /// let third = c.acquire_permit(&pool, 2, Wait::Try).await?;
    /// assert!(third.token() > second.token());
    /// # drop((second, third)); Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for `permits == 0`; [`Error::PermitsMismatch`] when the store
    /// holds another count for `name`; otherwise as [`acquire`](LockBackend::acquire).
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future withdraws everything the attempt queued, as for
    /// `acquire`.
    async fn acquire_permit(&self, name: &LockName, permits: u32, wait: Wait) -> Result<LockGuard> {
        let _ = (name, permits, wait);
        Err(Error::Unsupported {
            backend: self.kind(),
            what: "semaphores",
        })
    }

    /// Acquires the reader-writer lock `name` for `access` under `wait`: readers share it, a
    /// writer holds it alone, in arrival order (see [`RwLock`](crate::RwLock) for the policy
    /// and what the tokens mean). Each guard is a [`LockGuard`] with a lock's guarantees. The
    /// default says the backend does not support reader-writer locks.
    ///
    /// # Errors
    /// As [`acquire`](LockBackend::acquire); [`Error::Unsupported`] by default.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future withdraws the attempt's entry, as for `acquire`.
    async fn acquire_rw(
        &self,
        name: &LockName,
        access: crate::Access,
        wait: Wait,
    ) -> Result<LockGuard> {
        let _ = (name, access, wait);
        Err(Error::Unsupported {
            backend: self.kind(),
            what: "reader-writer locks",
        })
    }

    /// The permit holders and waiters of the semaphore `name`, as the store sees them now (for
    /// operators: `fencelock status --permits`): [`LockStatus::holders`] entries of the queue
    /// hold a permit, the rest wait, and [`LockStatus::permits`] is the stored count. The
    /// default says the backend does not support semaphores.
    ///
    /// # Errors
    /// [`Error::Unsupported`], or [`Error::Backend`] when the store cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only reads.
    async fn permit_status(&self, name: &LockName) -> Result<LockStatus> {
        let _ = name;
        Err(Error::Unsupported {
            backend: self.kind(),
            what: "semaphores",
        })
    }

    /// Who holds `name` and how many wait for it, as the store sees it now (for operators:
    /// `fencelock status`). The default says the backend does not support it.
    ///
    /// # Errors
    /// [`Error::Unsupported`], or [`Error::Backend`] when the store cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only reads.
    async fn status(&self, name: &LockName) -> Result<LockStatus> {
        let _ = name;
        Err(Error::Unsupported {
            backend: self.kind(),
            what: "status",
        })
    }

    /// Every change of who holds `name` and who waits for it (for operators: `fencelock status
    /// --watch`): first the lock as it is now, then a [`LockStatus`] whenever the holder or the
    /// queue differs from the last item, a free lock (`holder: None`) included. Each item
    /// comes from a fresh read of the store after a change, so the stream survives reconnects,
    /// etcd compaction and a ZooKeeper server move without reporting a stale holder; changes
    /// that come faster than it is read are coalesced (it never repeats an item, and never
    /// goes back to an older one). Store failures that may pass are retried; the stream yields
    /// an error and ends only on one that will not (bad credentials, say). The default yields
    /// one [`Error::Unsupported`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> fencelock::Result<()> {
    /// use futures::StreamExt;
    /// use fencelock::{LockBackend, LockBackendExt, LockName, MemoryBackend};
    ///
    /// let backend = MemoryBackend::new();
    /// let name = LockName::new("ledger")?;
    /// let mut changes = backend.watch(&name);
    /// assert_eq!(changes.next().await.transpose()?.map(|s| s.holder), Some(None)); // free
    /// let guard = backend.lock("ledger").await?;
    /// let seen = changes.next().await.transpose()?;
    /// assert_eq!(seen.and_then(|s| s.holder), Some(guard.token()));
    /// # drop(guard); Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Items are [`Error::Unsupported`], [`Error::InvalidName`] (a name the store cannot hold),
    /// or a lasting [`Error::Backend`]; each ends the stream.
    ///
    /// # Cancel safety
    /// Dropping the stream at any point is safe: it only reads.
    fn watch(&self, name: &LockName) -> BoxStream<'_, Result<LockStatus>> {
        let _ = name;
        futures::stream::once(futures::future::ready(Err(Error::Unsupported {
            backend: self.kind(),
            what: "watch",
        })))
        .boxed()
    }

    /// The names of locks that are held or waited for, starting with `prefix` (for operators:
    /// `fencelock list`). The default says the backend does not support it.
    ///
    /// # Errors
    /// [`Error::Unsupported`], or [`Error::Backend`] when the store cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only reads.
    async fn list(&self, prefix: &str) -> Result<Vec<LockName>> {
        let _ = prefix;
        Err(Error::Unsupported {
            backend: self.kind(),
            what: "list",
        })
    }

    /// Removes the current holder's entry of `name`, so that the next contender proceeds (for
    /// operators: `fencelock break`, for a holder that is stuck but keeps renewing). Returns
    /// the removed holder's token as [`status`](LockBackend::status) shows it, or `None` when
    /// the lock was free (or changed hands meanwhile). The old holder's `lost` fires (the etcd
    /// and ZooKeeper backends watch their own entries) and the store refuses its fenced
    /// operations; fencing keeps the rest safe, since the next holder's token is greater.
    /// The default says the backend does not support it.
    ///
    /// # Errors
    /// [`Error::Unsupported`], or [`Error::Backend`] when the store cannot be reached or
    /// refuses (another user's entry under ACLs).
    ///
    /// # Cancel safety
    /// Not cancel-safe: if dropped, the entry may or may not have been removed.
    async fn break_lock(&self, name: &LockName) -> Result<Option<FencingToken>> {
        let _ = name;
        Err(Error::Unsupported {
            backend: self.kind(),
            what: "break",
        })
    }

    /// Ends this instance's session now, after the withdrawals of cancelled acquires have
    /// finished (bounded by the backend's request timeout): call it before a process exits, so
    /// that nothing it queued or held outlives it by a TTL (a background withdrawal dies with
    /// the runtime). Guards still held lose their locks (`lost` fires). The next acquire opens
    /// a new session. The default does nothing.
    ///
    /// # Errors
    /// [`Error::Backend`] when the store could not be told (the lease then ends on its own).
    ///
    /// # Cancel safety
    /// Cancel-safe: a dropped close leaves the session to end with its lease or its last user.
    async fn close(&self) -> Result<()> {
        Ok(())
    }

    /// Campaigns in the election `name`: waits (under `wait`) to become its leader, publishing
    /// `value` to observers. An election is a lock whose entry carries the value, so it has a
    /// lock's guarantees: one leader at a time, a term (fencing token) that grows with every
    /// leadership, `lost` before the store could elect another, nothing left behind by a
    /// cancelled campaign. Its entries are laid out as Go's `concurrency.Election` (etcd) and
    /// Curator's `LeaderLatch` (ZooKeeper) write them; an election and a lock of the same name
    /// share a queue, so give them different names. The default says the backend does not
    /// support elections.
    ///
    /// # Errors
    /// As [`acquire`](LockBackend::acquire): [`Error::WouldBlock`], [`Error::Timeout`],
    /// [`Error::LockLost`] if the session ended while waiting, [`Error::Backend`];
    /// [`Error::Unsupported`] by default.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future withdraws the candidate, as for `acquire`.
    async fn acquire_leadership(
        &self,
        name: &LockName,
        value: &[u8],
        wait: Wait,
    ) -> Result<Leadership> {
        let _ = (name, value, wait);
        Err(Error::Unsupported {
            backend: self.kind(),
            what: "elections",
        })
    }

    /// The leader of the election `name` now, if any, read from the store's current state (not
    /// a cache). The default says the backend does not support elections.
    ///
    /// # Errors
    /// [`Error::Unsupported`], or [`Error::Backend`] when the store cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only reads.
    async fn leader(&self, name: &LockName) -> Result<Option<Leader>> {
        let _ = name;
        Err(Error::Unsupported {
            backend: self.kind(),
            what: "elections",
        })
    }

    /// Every change of the leader of `name`: first the leader now (`None` if there is none),
    /// then each new leader, each new value, and `None` whenever the election is leaderless.
    /// Each item comes from a fresh read of the store after a change, so the stream survives
    /// reconnects and compaction without reporting a stale leader, and coalesces changes that
    /// come faster than it is read (it never repeats an item). Store failures that may pass are
    /// retried; the stream yields an error and ends only on one that will not (bad
    /// credentials, say). The default yields one [`Error::Unsupported`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> fencelock::Result<()> {
    /// use futures::StreamExt;
    /// use fencelock::{LockBackend, LockBackendExt, LockName, MemoryBackend};
    ///
    /// let backend = MemoryBackend::new();
    /// let name = LockName::new("scheduler")?;
    /// let mut changes = backend.observe(&name);
    /// assert_eq!(changes.next().await.transpose()?, Some(None)); // no leader yet
    /// let leader = backend.campaign("scheduler", "node-a").await?;
    /// let seen = changes.next().await.transpose()?.flatten();
    /// assert_eq!(seen.map(|l| l.value), Some(b"node-a".to_vec()));
    /// # drop(leader); Ok(()) }
    /// ```
    fn observe(&self, name: &LockName) -> BoxStream<'_, Result<Option<Leader>>> {
        let _ = name;
        futures::stream::once(futures::future::ready(Err(Error::Unsupported {
            backend: self.kind(),
            what: "elections",
        })))
        .boxed()
    }
}

/// A lock as the store sees it at one moment ([`LockBackend::status`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockStatus {
    /// The lock's name.
    pub name: LockName,
    /// The holder's token, if the lock is held.
    pub holder: Option<FencingToken>,
    /// Contenders queued behind the holder.
    pub waiting: usize,
    /// How long ago the holder's queue entry was created (its wait included), where the store
    /// records it (not for keys written by other clients, such as `etcdctl lock`).
    pub age: Option<Duration>,
    /// Who holds it, when the holder's entry was written by fencelock (`None` when free, and for
    /// a foreign holder: Go's Mutex, `etcdctl lock`, Curator).
    pub owner: Option<Owner>,
    /// The whole queue in grant order, the holder first; empty when free.
    pub queue: Vec<QueueEntry>,
    /// How many entries at the front of [`queue`](LockStatus::queue) hold: 0 or 1 for a lock,
    /// up to [`permits`](LockStatus::permits) for a semaphore, the readers in front (or one
    /// writer) for a reader-writer lock.
    pub holders: usize,
    /// A semaphore's stored count of permits ([`LockBackend::permit_status`]); `None` for a
    /// lock, and for a semaphore no one holds or waits for.
    pub permits: Option<u32>,
}

/// One contender in a lock's queue, as [`LockBackend::status`] sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueEntry {
    /// The entry's token: the one it holds or will hold when granted. On etcd it is the key's
    /// create revision; a grant after a wait gets the (greater) revision at which it was
    /// seen, as `etcdctl lock` does.
    pub token: FencingToken,
    /// Who queued it; `None` for an entry written by another client (foreign).
    pub owner: Option<Owner>,
    /// How long ago the entry was created, where the store records it.
    pub age: Option<Duration>,
    /// A reader-writer lock's entry: a reader's or a writer's; `None` for a lock's.
    pub access: Option<crate::Access>,
}

impl QueueEntry {
    /// An entry; for backends.
    pub fn new(token: FencingToken, owner: Option<Owner>, age: Option<Duration>) -> Self {
        QueueEntry {
            token,
            owner,
            age,
            access: None,
        }
    }

    /// The entry, marked as a reader's or a writer's of a reader-writer lock; for backends.
    #[must_use]
    pub fn with_access(mut self, access: Option<crate::Access>) -> Self {
        self.access = access;
        self
    }
}

impl LockStatus {
    /// The status of a queue given in grant order (the holder first); for backends. The first
    /// entry holds; of a reader-writer lock, every reader before the first writer holds.
    pub fn from_queue(name: LockName, queue: Vec<QueueEntry>) -> Self {
        let first = queue.first();
        let holders = match first.and_then(|e| e.access) {
            Some(crate::Access::Read) => queue
                .iter()
                .take_while(|e| e.access == Some(crate::Access::Read))
                .count(),
            _ => usize::from(first.is_some()),
        };
        LockStatus {
            name,
            holder: first.map(|e| e.token),
            waiting: queue.len() - holders,
            age: first.and_then(|e| e.age),
            owner: first.and_then(|e| e.owner.clone()),
            holders,
            queue,
            permits: None,
        }
    }

    /// The status of a semaphore: `holders` hold a permit, in grant order, and `waiters` wait,
    /// in arrival order; `permits` is the stored count. For backends.
    pub fn from_permits(
        name: LockName,
        permits: Option<u32>,
        holders: Vec<QueueEntry>,
        waiters: Vec<QueueEntry>,
    ) -> Self {
        let held = holders.len();
        let mut status = LockStatus::from_queue(name, holders.into_iter().chain(waiters).collect());
        status.holders = held;
        status.waiting = status.queue.len() - held;
        status.permits = permits;
        if held == 0 {
            (status.holder, status.age, status.owner) = (None, None, None);
        }
        status
    }

    /// The entries that hold: the lock's holder, or a semaphore's permit holders.
    pub fn holding(&self) -> &[QueueEntry] {
        &self.queue[..self.holders.min(self.queue.len())]
    }

    /// A status; for backends.
    pub fn new(
        name: LockName,
        holder: Option<FencingToken>,
        waiting: usize,
        age: Option<Duration>,
    ) -> Self {
        LockStatus {
            name,
            holder,
            waiting,
            age,
            owner: None,
            queue: Vec::new(),
            holders: usize::from(holder.is_some()),
            permits: None,
        }
    }
}

/// The store half of a held lock, behind a [`LockGuard`]. Backend authors implement it; users
/// only see [`LockGuard`].
///
/// Every method is checked at the store against the grant (etcd: a Txn comparing the lock key's
/// create revision; ZooKeeper: a multi with a check on the lock node). When the store says the
/// grant is gone, return [`Error::NotHeld`]; the guard then fires `lost`.
///
/// # Cancel safety
/// The guard may drop any of these futures at an await point (its caller was cancelled). A
/// dropped [`release`](HeldLock::release) makes the guard call
/// [`release_in_background`](HeldLock::release_in_background), so `release` needs no undo of
/// its own; a dropped state operation may or may not have happened, as the guard documents.
#[async_trait]
pub trait HeldLock: Send + Sync + fmt::Debug {
    /// Deletes the grant if, and only if, it is still ours.
    ///
    /// # Errors
    /// [`Error::Backend`] when the store cannot be reached (the lease still ends the grant).
    async fn release(&self) -> Result<ReleaseOutcome>;

    /// Writes `value` under `key` next to the lock if the grant is still ours.
    ///
    /// # Errors
    /// [`Error::NotHeld`] if the store refused; [`Error::Backend`] on store failure.
    async fn put_state(&self, key: &StateKey, value: &[u8]) -> Result<()>;

    /// Reads `key` if the grant is still ours.
    ///
    /// # Errors
    /// [`Error::NotHeld`] if the store refused; [`Error::Backend`] on store failure.
    async fn get_state(&self, key: &StateKey) -> Result<Option<Vec<u8>>>;

    /// Deletes `key` if the grant is still ours; true if it existed.
    ///
    /// # Errors
    /// [`Error::NotHeld`] if the store refused; [`Error::Backend`] on store failure.
    async fn delete_state(&self, key: &StateKey) -> Result<bool>;

    /// Replaces the value stored in the grant's own entry if the grant is still ours (an
    /// election's [`proclaim`](crate::Leadership::proclaim)). The default says the backend
    /// cannot.
    ///
    /// # Errors
    /// [`Error::NotHeld`] if the store refused; [`Error::Backend`] on store failure.
    async fn set_value(&self, value: &[u8]) -> Result<()> {
        let _ = value;
        Err(Error::Unsupported {
            backend: "chosen",
            what: "proclaim",
        })
    }

    /// Releases without waiting, because the guard was dropped. Needs no caller runtime
    /// context beyond what the backend kept; must not block. A release that fails should go on
    /// while the session lives ([`raw::keep_retrying`](crate::raw::keep_retrying)): an entry left
    /// behind blocks every other contender.
    fn release_in_background(self: Box<Self>);
}

/// Convenience methods on every backend, taking `&str` names.
///
/// Implemented for every [`LockBackend`]; do not implement it yourself.
#[async_trait]
pub trait LockBackendExt: LockBackend {
    /// Waits for the lock `name`.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for a bad name, then as [`LockBackend::acquire`].
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`LockBackend::acquire`].
    async fn lock(&self, name: &str) -> Result<LockGuard> {
        self.acquire(&LockName::new(name)?, Wait::Forever).await
    }

    /// Takes the lock `name` only if it is free now.
    ///
    /// # Errors
    /// [`Error::WouldBlock`] if it is held; otherwise as [`LockBackendExt::lock`].
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`LockBackend::acquire`].
    async fn try_lock(&self, name: &str) -> Result<LockGuard> {
        self.acquire(&LockName::new(name)?, Wait::Try).await
    }

    /// Waits at most `timeout` for the lock `name`.
    ///
    /// # Errors
    /// [`Error::Timeout`] when the time is up; otherwise as [`LockBackendExt::lock`].
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`LockBackend::acquire`].
    async fn lock_timeout(&self, name: &str, timeout: Duration) -> Result<LockGuard> {
        self.acquire(&LockName::new(name)?, Wait::Timeout(timeout))
            .await
    }

    /// Waits to lead the election `name`, publishing `value`.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for a bad name, then as [`LockBackend::acquire_leadership`].
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`LockBackend::acquire_leadership`].
    async fn campaign(&self, name: &str, value: impl AsRef<[u8]> + Send) -> Result<Leadership> {
        self.acquire_leadership(&LockName::new(name)?, value.as_ref(), Wait::Forever)
            .await
    }

    /// Leads the election `name` only if it has no leader (nor earlier candidates) now.
    ///
    /// # Errors
    /// [`Error::WouldBlock`] if there is a leader; otherwise as [`LockBackendExt::campaign`].
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`LockBackend::acquire_leadership`].
    async fn try_campaign(&self, name: &str, value: impl AsRef<[u8]> + Send) -> Result<Leadership> {
        self.acquire_leadership(&LockName::new(name)?, value.as_ref(), Wait::Try)
            .await
    }
}

impl<B: LockBackend + ?Sized> LockBackendExt for B {}

//! The in-memory backend: the same semantics as the distributed backends, in one process.

mod store;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

pub use store::MemoryStore;
use store::{Position, Refused};

use crate::backend::{LockBackend, ReleaseOutcome, Wait};
use futures::stream::BoxStream;

use crate::raw::{
    check_margin, observe_leader, watch_queue, Grant, HeldLock, LeaseClock, Live, SessionSlot,
    Watched,
};
use crate::{
    Access, Error, FencingToken, Leader, Leadership, LockGuard, LockName, LockStatus, Owner,
    Result, StateKey,
};

const KIND: &str = "memory";

/// Settings of a [`MemoryBackend`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryConfig {
    /// Session lease TTL. Default 10 s; renewed every `ttl / 3`.
    pub ttl: Duration,
    /// How much earlier than `ttl` after a renewal was sent the holder gives the lock up.
    /// Default `ttl / 10`.
    pub safety_margin: Duration,
    /// Who this backend's acquisitions say they are, for `status`. Default
    /// [`Owner::current`], without a label.
    pub owner: Owner,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig::with_ttl(Duration::from_secs(10))
    }
}

impl MemoryConfig {
    /// A config with `ttl` and the default margin (`ttl / 10`).
    pub fn with_ttl(ttl: Duration) -> Self {
        MemoryConfig {
            ttl,
            safety_margin: ttl / 10,
            owner: Owner::current(),
        }
    }

    fn validate(&self) -> Result<()> {
        if self.ttl < Duration::from_millis(30) {
            return Err(Error::config("ttl", "must be at least 30 ms"));
        }
        check_margin("safety_margin", self.ttl, self.safety_margin)
    }
}

/// A lock backend inside one process, for tests of code that uses locks (and for the demo).
///
/// Sessions, TTL leases renewed at TTL/3, FIFO waiting, monotonic tokens, fenced state and
/// checkpoints behave as on etcd and ZooKeeper. Backends made from one [`MemoryStore`] contend
/// like separate processes; faults can be injected with [`MemoryBackend::expire_session`],
/// [`MemoryBackend::pause_renewals`] and [`MemoryStore::release_behind_back`]. All timing uses
/// Tokio's clock, so tests can run under `tokio::time::pause()`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> fencelock::Result<()> {
/// use fencelock::{LockBackendExt, MemoryStore};
///
/// let store = MemoryStore::new();
/// let (a, b) = (store.backend(), store.backend());
/// let held = a.lock("job").await?;
/// assert!(b.try_lock("job").await.is_err());
/// drop(held);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct MemoryBackend {
    store: MemoryStore,
    config: MemoryConfig,
    session: SessionSlot<Session>,
}

#[derive(Debug)]
struct Session {
    id: u64,
    store: MemoryStore,
    lease: Arc<LeaseClock>,
    renewals_paused: Arc<AtomicBool>,
}

impl Live for Session {
    fn is_live(&self) -> bool {
        !self.lease.lost_token().is_cancelled()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Like closing an etcd session: revoke, so nothing waits for the TTL.
        self.lease.lose();
        self.store.revoke(self.id);
    }
}

impl MemoryBackend {
    /// A backend on a store of its own, with default settings.
    pub fn new() -> Self {
        MemoryStore::new().backend()
    }

    /// A backend on `store` with `config`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when the TTL is under 30 ms or the margin is not below TTL/3.
    pub fn with_config(store: &MemoryStore, config: MemoryConfig) -> Result<Self> {
        config.validate()?;
        Ok(MemoryBackend {
            store: store.clone(),
            config,
            session: SessionSlot::new(),
        })
    }

    /// The store this backend talks to.
    pub fn store(&self) -> &MemoryStore {
        &self.store
    }

    /// Fault injection: the store expires this backend's session now, as a server does when it
    /// stops hearing from a client. The holder notices at its next renewal (within TTL/3).
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn expire_session(&self) {
        if let Some(session) = self.session.live().await {
            self.store.expire_session(session.id);
        }
    }

    /// Fault injection: stops (or resumes) sending renewals, as a paused or cut-off client would.
    /// The local deadline then passes and `lost` fires before the store expires the session.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn pause_renewals(&self, paused: bool) {
        if let Some(session) = self.session.live().await {
            session.renewals_paused.store(paused, Ordering::SeqCst);
        }
    }

    async fn session(&self) -> Result<Arc<Session>> {
        self.session
            .get_or_open(|| async {
                let ttl = self.config.ttl;
                let sent = Instant::now();
                let id = self.store.grant(ttl);
                let lease = LeaseClock::start(sent, ttl, self.config.safety_margin);
                let renewals_paused = Arc::new(AtomicBool::new(false));
                let renewer = MemoryRenewer {
                    store: self.store.clone(),
                    id,
                    ttl,
                    paused: Arc::clone(&renewals_paused),
                };
                tokio::spawn(crate::raw::keep_renewed(
                    KIND,
                    Arc::clone(&lease),
                    ttl,
                    ttl,
                    renewer,
                ));
                Ok(Arc::new(Session {
                    id,
                    store: self.store.clone(),
                    lease,
                    renewals_paused,
                }))
            })
            .await
    }
}

impl MemoryBackend {
    async fn acquire_entry(
        &self,
        name: &LockName,
        value: &[u8],
        (permits, access): (Option<u32>, Option<Access>),
        wait: Wait,
    ) -> Result<LockGuard> {
        wait.limit(KIND, name, async {
            let session = self.session().await?;
            let lost = || Error::lost(name);
            let token = self
                .store
                .enqueue(
                    name.as_str(),
                    session.id,
                    value,
                    &self.config.owner,
                    (permits, access),
                )
                .map_err(|refused| match (refused, permits) {
                    (Refused::Permits(stored), Some(asked)) => {
                        Error::permits_mismatch(name, stored, asked)
                    }
                    _ => lost(),
                })?;
            let mut pending = Pending {
                store: &self.store,
                name: name.as_str(),
                token: Some(token),
            };
            crate::telemetry::record_queue_ahead(KIND, self.store.ahead(name.as_str(), token));
            // Each pass ends in a grant, an error, or a wake from the predecessor's removal.
            loop {
                match self.store.position(name.as_str(), token) {
                    Position::Holder { checkpoint } => {
                        pending.token = None;
                        let held = MemoryHeld {
                            session: Arc::clone(&session),
                            name: name.clone(),
                            token,
                        };
                        let lease = Arc::clone(&session.lease);
                        return Ok(Grant {
                            backend: KIND,
                            name: name.clone(),
                            token: FencingToken::new(token),
                            lease,
                            checkpoint,
                            held: Box::new(held),
                        }
                        .into_guard());
                    }
                    Position::Gone => return Err(lost()),
                    Position::Waiting { .. } if wait == Wait::Try => {
                        return Err(Error::would_block(name))
                    }
                    Position::Waiting { wake } => tokio::select! {
                        () = wake.notified() => {}
                        () = session.lease.lost_token().cancelled() => return Err(lost()),
                    },
                }
            }
        })
        .await
    }
}

/// The memory store as an election's [`Watched`].
struct Elections<'a>(&'a MemoryStore);

impl Watched for Elections<'_> {
    type Item = Option<Leader>;
    type Seen = tokio::sync::watch::Receiver<u64>;

    async fn read(&self, name: &LockName) -> Result<(Option<Leader>, Self::Seen)> {
        // Subscribed before the read: a change after it is a change the receiver sees.
        let seen = self.0.subscribe();
        let leader = self
            .0
            .leader(name.as_str())
            .map(|(token, value)| Leader::new(value, FencingToken::new(token)));
        Ok((leader, seen))
    }

    async fn changed(&self, _name: &LockName, mut seen: Self::Seen) -> Result<()> {
        // An error means the store is gone; the next read says what is left.
        let _ = seen.changed().await;
        Ok(())
    }
}

/// The memory store as a lock's [`Watched`] queue.
struct Queues<'a>(&'a MemoryStore);

impl Watched for Queues<'_> {
    type Item = LockStatus;
    type Seen = tokio::sync::watch::Receiver<u64>;

    async fn read(&self, name: &LockName) -> Result<(LockStatus, Self::Seen)> {
        let seen = self.0.subscribe();
        Ok((self.0.status(name), seen))
    }

    async fn changed(&self, name: &LockName, seen: Self::Seen) -> Result<()> {
        Elections(self.0).changed(name, seen).await
    }
}

impl Default for MemoryBackend {
    fn default() -> Self {
        MemoryBackend::new()
    }
}

impl MemoryStore {
    /// A new backend (a new simulated client, with its own session) on this store, with default
    /// settings.
    pub fn backend(&self) -> MemoryBackend {
        MemoryBackend {
            store: self.clone(),
            config: MemoryConfig::default(),
            session: SessionSlot::new(),
        }
    }
}

/// The memory store's renewal, through the one renewal loop every backend uses.
struct MemoryRenewer {
    store: MemoryStore,
    id: u64,
    ttl: Duration,
    paused: Arc<AtomicBool>,
}

impl crate::raw::Renew for MemoryRenewer {
    fn renew(&mut self) -> impl std::future::Future<Output = crate::raw::Renewal> + Send {
        use crate::raw::Renewal;
        let outcome = if self.paused.load(Ordering::SeqCst) {
            // A paused or cut-off client: nothing reaches the store.
            Renewal::Failed("renewals paused (fault injection)".into())
        } else if self.store.keep_alive(self.id, self.ttl) {
            Renewal::Alive(self.ttl)
        } else {
            tracing::warn!(
                session = self.id,
                "memory backend: renewal refused, session expired"
            );
            Renewal::Gone("the store expired the session".into())
        };
        std::future::ready(outcome)
    }
}

/// Removes a queued entry unless disarmed: what makes a dropped acquire leave nothing behind.
struct Pending<'a> {
    store: &'a MemoryStore,
    name: &'a str,
    token: Option<u64>,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Some(token) = self.token {
            self.store.remove(self.name, token);
        }
    }
}

#[async_trait]
impl LockBackend for MemoryBackend {
    fn kind(&self) -> &'static str {
        KIND
    }

    async fn acquire(&self, name: &LockName, wait: Wait) -> Result<LockGuard> {
        self.acquire_entry(name, b"", (None, None), wait).await
    }

    async fn acquire_leadership(
        &self,
        name: &LockName,
        value: &[u8],
        wait: Wait,
    ) -> Result<Leadership> {
        let guard = self.acquire_entry(name, value, (None, None), wait).await?;
        Ok(Leadership::new(guard, value.to_vec()))
    }

    async fn close(&self) -> Result<()> {
        if let Some(session) = self.session.live().await {
            session.lease.close_because("the backend was closed");
            self.store.revoke(session.id);
        }
        Ok(())
    }

    async fn leader(&self, name: &LockName) -> Result<Option<Leader>> {
        Ok(Elections(&self.store).read(name).await?.0)
    }

    fn observe(&self, name: &LockName) -> BoxStream<'_, Result<Option<Leader>>> {
        observe_leader(KIND, Elections(&self.store), name.clone())
    }

    async fn acquire_permit(&self, name: &LockName, permits: u32, wait: Wait) -> Result<LockGuard> {
        crate::raw::check_permits(permits)?;
        self.acquire_entry(name, b"", (Some(permits), None), wait)
            .await
    }

    async fn acquire_rw(&self, name: &LockName, access: Access, wait: Wait) -> Result<LockGuard> {
        self.acquire_entry(name, b"", (None, Some(access)), wait)
            .await
    }

    async fn permit_status(&self, name: &LockName) -> Result<LockStatus> {
        Ok(self.store.permit_status(name))
    }

    async fn status(&self, name: &LockName) -> Result<LockStatus> {
        Ok(self.store.status(name))
    }

    fn watch(&self, name: &LockName) -> BoxStream<'_, Result<LockStatus>> {
        watch_queue(KIND, Queues(&self.store), name.clone())
    }

    async fn break_lock(&self, name: &LockName) -> Result<Option<FencingToken>> {
        Ok(self.store.release_behind_back(name))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockName>> {
        self.store
            .names(prefix)
            .into_iter()
            .map(LockName::new)
            .collect()
    }
}

#[derive(Debug)]
struct MemoryHeld {
    session: Arc<Session>,
    name: LockName,
    token: u64,
}

impl MemoryHeld {
    fn refused(&self) -> Error {
        Error::not_held(&self.name, FencingToken::new(self.token))
    }

    fn with_values<T>(
        &self,
        op: impl FnOnce(
            &mut std::collections::HashMap<(String, String), Vec<u8>>,
            (String, String),
        ) -> T,
        key: &StateKey,
    ) -> Result<T> {
        let slot = (self.name.to_string(), key.as_str().to_owned());
        self.session
            .store
            .with_values(self.name.as_str(), self.token, |values| op(values, slot))
            .ok_or_else(|| self.refused())
    }
}

#[async_trait]
impl HeldLock for MemoryHeld {
    async fn release(&self) -> Result<ReleaseOutcome> {
        Ok(
            if self.session.store.remove(self.name.as_str(), self.token) {
                ReleaseOutcome::Released
            } else {
                ReleaseOutcome::NotOwned
            },
        )
    }

    async fn put_state(&self, key: &StateKey, value: &[u8]) -> Result<()> {
        self.with_values(
            |values, slot| drop(values.insert(slot, value.to_vec())),
            key,
        )
    }

    async fn get_state(&self, key: &StateKey) -> Result<Option<Vec<u8>>> {
        self.with_values(|values, slot| values.get(&slot).cloned(), key)
    }

    async fn delete_state(&self, key: &StateKey) -> Result<bool> {
        self.with_values(|values, slot| values.remove(&slot).is_some(), key)
    }

    async fn set_value(&self, value: &[u8]) -> Result<()> {
        if self
            .session
            .store
            .set_value(self.name.as_str(), self.token, value)
        {
            Ok(())
        } else {
            Err(self.refused())
        }
    }

    fn release_in_background(self: Box<Self>) {
        // In-process: releasing now is as cheap as scheduling it.
        self.session.store.remove(self.name.as_str(), self.token);
    }
}

//! [`Semaphore`]: N permits of one name, each a [`LockGuard`].

use std::time::Duration;

use crate::{Error, LockBackend, LockGuard, LockName, LockStatus, Result, Wait};

/// A distributed semaphore: at most `permits` holders of `name` at once, across every process
/// that uses the same store, each holding a [`LockGuard`] (`lost`, `run`, token, owner-checked
/// release). A thin handle over [`LockBackend::acquire_permit`]; the count is stored with the
/// semaphore, so a contender with another count is refused ([`Error::PermitsMismatch`]).
///
/// On ZooKeeper it is Curator's `InterProcessSemaphoreV2` (same nodes: both contend for the same
/// permits); on etcd it follows Go's `concurrency.Mutex` (see the etcd crate's docs).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> fencelock::Result<()> {
/// use fencelock::{Semaphore, MemoryStore};
///
/// let store = MemoryStore::new();
/// let (a, b) = (store.backend(), store.backend());
/// let pool_a = Semaphore::new(&a, "encoders", 2)?;
/// let pool_b = Semaphore::new(&b, "encoders", 2)?;
/// let one = pool_a.acquire().await?;
/// let two = pool_b.acquire().await?;
/// assert!(pool_b.try_acquire().await.is_err()); // both permits are taken
/// assert_eq!(pool_a.status().await?.holders, 2);
/// let _ = one.release().await?;
/// let three = pool_b.try_acquire().await?;
/// # drop((two, three)); Ok(()) }
/// ```
#[derive(Debug)]
pub struct Semaphore<'a, B: LockBackend + ?Sized> {
    backend: &'a B,
    name: LockName,
    permits: u32,
}

impl<'a, B: LockBackend + ?Sized> Semaphore<'a, B> {
    /// A handle on the semaphore `name` with `permits` permits (nothing is sent yet).
    ///
    /// # Errors
    /// [`Error::InvalidName`] for a bad name, [`Error::InvalidConfig`] for `permits == 0`.
    pub fn new(backend: &'a B, name: &str, permits: u32) -> Result<Self> {
        check_permits(permits)?;
        Ok(Semaphore {
            backend,
            name: LockName::new(name)?,
            permits,
        })
    }

    /// The semaphore's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The number of permits.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// Acquires a permit under `wait`.
    ///
    /// # Errors
    /// As [`LockBackend::acquire_permit`].
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`LockBackend::acquire_permit`].
    pub async fn acquire_with(&self, wait: Wait) -> Result<LockGuard> {
        self.backend
            .acquire_permit(&self.name, self.permits, wait)
            .await
    }

    /// Waits for a permit.
    ///
    /// # Errors
    /// As [`LockBackend::acquire_permit`].
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`LockBackend::acquire_permit`].
    pub async fn acquire(&self) -> Result<LockGuard> {
        self.acquire_with(Wait::Forever).await
    }

    /// Takes a permit only if one is free now (and no one waits for it).
    ///
    /// # Errors
    /// [`Error::WouldBlock`] when every permit is taken; otherwise as
    /// [`LockBackend::acquire_permit`].
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`LockBackend::acquire_permit`].
    pub async fn try_acquire(&self) -> Result<LockGuard> {
        self.acquire_with(Wait::Try).await
    }

    /// Waits at most `timeout` for a permit.
    ///
    /// # Errors
    /// [`Error::Timeout`] when the time is up; otherwise as [`LockBackend::acquire_permit`].
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`LockBackend::acquire_permit`].
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<LockGuard> {
        self.acquire_with(Wait::Timeout(timeout)).await
    }

    /// Who holds a permit and who waits, as the store sees it now.
    ///
    /// # Errors
    /// As [`LockBackend::permit_status`].
    ///
    /// # Cancel safety
    /// Cancel-safe: it only reads.
    pub async fn status(&self) -> Result<LockStatus> {
        self.backend.permit_status(&self.name).await
    }
}

/// The one rule for a count of permits: at least one.
///
/// # Errors
/// [`Error::InvalidConfig`] (field `permits`) for 0.
pub fn check_permits(permits: u32) -> Result<()> {
    if permits == 0 {
        return Err(Error::config(
            "permits",
            "0 permits would admit no one; give a count of at least 1".to_owned(),
        ));
    }
    Ok(())
}

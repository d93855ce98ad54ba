//! [`RwLock`]: readers share a name, a writer holds it alone.

use std::time::Duration;

use crate::{LockBackend, LockGuard, LockName, Result, Wait};

/// What a reader-writer acquire asks for ([`LockBackend::acquire_rw`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// Shared: any number of readers hold together, while no writer does.
    Read,
    /// Exclusive: one writer, and no reader.
    Write,
}

/// A distributed reader-writer lock: readers share `name`, a writer holds it alone, and every
/// guard is a [`LockGuard`] (`lost`, `run`, token, owner-checked release). A thin handle over
/// [`LockBackend::acquire_rw`].
///
/// **Policy: arrival order.** Readers and writers queue in one line. A writer is granted when
/// everyone ahead of it has left; a reader when no writer is ahead of it. So a reader that
/// arrives after a waiting writer waits too, and a steady stream of readers cannot starve a
/// writer (nor writers a reader). There is no upgrade from read to write (two upgrading readers
/// would deadlock, CURATOR-276 and kazoo#649 show the hazards): release the read guard, then
/// acquire a write one, and re-read what you decided on.
///
/// **Tokens.** A writer's token fences exactly as a lock's: it exceeds every earlier writer's
/// and reader's. A reader's token exceeds every earlier writer's and is below every later
/// writer's, so it says which writes a reader may have seen: a resource that admits writes with
/// a high-water [`Fence`](crate::Fence) can refuse a read whose token is below
/// [`Fence::highest`](crate::Fence::highest) (a writer got in after that reader's grant, so the
/// reader has lost its lock). Readers must not `admit` their tokens: that would raise the mark
/// and refuse a concurrent reader with a lower one.
///
/// On ZooKeeper it is Curator's `InterProcessReadWriteLock` (its `__READ__` and `__WRIT__`
/// nodes: both contend on one lock); on etcd its keys are laid out as in etcd's
/// `experimental/recipes` `RWMutex` (`N/read/...`, `N/write/...`).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> fencelock::Result<()> {
/// use fencelock::{MemoryStore, RwLock};
///
/// let store = MemoryStore::new();
/// let (a, b, c) = (store.backend(), store.backend(), store.backend());
/// let config = RwLock::new(&a, "config")?;
/// let reading = config.read().await?;
/// let also = RwLock::new(&b, "config")?.try_read().await?; // readers share
/// assert!(RwLock::new(&c, "config")?.try_write().await.is_err()); // a writer waits
/// let read_token = reading.token();
/// let _ = (reading.release().await?, also.release().await?);
/// let writing = RwLock::new(&c, "config")?.try_write().await?;
/// assert!(writing.token() > read_token);
/// # drop(writing); Ok(()) }
/// ```
#[derive(Debug)]
pub struct RwLock<'a, B: LockBackend + ?Sized> {
    backend: &'a B,
    name: LockName,
}

impl<'a, B: LockBackend + ?Sized> RwLock<'a, B> {
    /// A handle on the reader-writer lock `name` (nothing is sent yet).
    ///
    /// # Errors
    /// [`Error::InvalidName`](crate::Error::InvalidName) for a bad name.
    pub fn new(backend: &'a B, name: &str) -> Result<Self> {
        Ok(RwLock {
            backend,
            name: LockName::new(name)?,
        })
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// Acquires `access` under `wait`.
    ///
    /// # Errors
    /// As [`LockBackend::acquire_rw`].
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`LockBackend::acquire_rw`].
    pub async fn acquire(&self, access: Access, wait: Wait) -> Result<LockGuard> {
        self.backend.acquire_rw(&self.name, access, wait).await
    }

    /// Waits to read.
    ///
    /// # Errors
    /// As [`LockBackend::acquire_rw`].
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`LockBackend::acquire_rw`].
    pub async fn read(&self) -> Result<LockGuard> {
        self.acquire(Access::Read, Wait::Forever).await
    }

    /// Waits to write.
    ///
    /// # Errors
    /// As [`LockBackend::acquire_rw`].
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`LockBackend::acquire_rw`].
    pub async fn write(&self) -> Result<LockGuard> {
        self.acquire(Access::Write, Wait::Forever).await
    }

    /// Reads only if no writer holds or waits now.
    ///
    /// # Errors
    /// [`Error::WouldBlock`](crate::Error::WouldBlock) otherwise; as
    /// [`LockBackend::acquire_rw`].
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`LockBackend::acquire_rw`].
    pub async fn try_read(&self) -> Result<LockGuard> {
        self.acquire(Access::Read, Wait::Try).await
    }

    /// Writes only if no one holds or waits now.
    ///
    /// # Errors
    /// [`Error::WouldBlock`](crate::Error::WouldBlock) otherwise; as
    /// [`LockBackend::acquire_rw`].
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`LockBackend::acquire_rw`].
    pub async fn try_write(&self) -> Result<LockGuard> {
        self.acquire(Access::Write, Wait::Try).await
    }

    /// Waits at most `timeout` for `access`.
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) when the time is up; as
    /// [`LockBackend::acquire_rw`].
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`LockBackend::acquire_rw`].
    pub async fn acquire_timeout(&self, access: Access, timeout: Duration) -> Result<LockGuard> {
        self.acquire(access, Wait::Timeout(timeout)).await
    }
}

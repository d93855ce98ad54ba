//! The fence store trait: where a resource keeps the tokens it admitted.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use fencelock::{Fence, FencingToken, Result};

/// Where a resource keeps, per lock, the token it admits, and how it holds an admission while
/// the write it protects runs. [`Fence`] (in memory, one process) and, with the `postgres`
/// feature, [`PgFenceStore`](crate::postgres::PgFenceStore) (durable, shared by every replica
/// using the database) implement it; [`FenceLayer`](crate::http::FenceLayer) takes any.
///
/// # Writing one (Redis, DynamoDB, a file)
/// An implementation must give these guarantees, which the memory and Postgres stores share:
/// - **Refuse lower tokens** with [`Error::StaleToken`](fencelock::Error::StaleToken): compare
///   and raise the mark in one atomic step of the store (Redis: a Lua script comparing and
///   setting; DynamoDB: `UpdateItem` with `ConditionExpression: token <= :t`; a file: a lock
///   file, read, compare, write and `fsync` a temporary file, rename). A read, a comparison in
///   this process and a separate write is the race the fence exists to prevent.
/// - **Hold older admissions against newer ones**: while an [`Admission`] is alive, a newer
///   token is not admitted (its `admit` waits), so an older write can never land after a newer
///   one. Stores that cannot hold anything (most key-value stores) must put the check into the
///   write itself instead (a conditional write on the data, as
///   [`update_fenced`](crate::postgres::update_fenced) does); say so in their docs.
/// - **Durable and shared**, or documented as not: a fence that forgets on restart, or differs
///   per replica, admits a stale holder after the restart or on the other replica.
/// - `reset` forgets the lock's mark (the recovery after the lock store was restored).
#[async_trait]
pub trait FenceStore: Send + Sync + 'static {
    /// Admits `token` for `lock`, waiting while admissions of older tokens are held.
    ///
    /// # Errors
    /// [`Error::StaleToken`](fencelock::Error::StaleToken) when a higher token was admitted;
    /// [`Error::TokenNotClaimed`](fencelock::Error::TokenNotClaimed) for a compare-and-set
    /// store; [`Error::Backend`](fencelock::Error::Backend) when the store fails.
    ///
    /// # Cancel safety
    /// Must be cancel safe: a cancelled admission holds nothing (the mark may have been raised).
    async fn admit(&self, lock: &str, token: FencingToken) -> Result<Admission>;

    /// The highest token admitted for `lock`.
    ///
    /// # Errors
    /// [`Error::Backend`](fencelock::Error::Backend) when the store fails.
    async fn highest(&self, lock: &str) -> Result<Option<FencingToken>>;

    /// Forgets `lock`'s mark (see [`Fence::reset`]).
    ///
    /// # Errors
    /// [`Error::Backend`](fencelock::Error::Backend) when the store fails.
    async fn reset(&self, lock: &str) -> Result<()>;
}

/// An admitted token: while it is alive, no newer token of its lock is admitted. Drop it when
/// the write it protects has finished.
#[must_use = "hold the admission across the write it protects"]
pub struct Admission {
    lock: String,
    token: FencingToken,
    _hold: Box<dyn Send + Sync>,
}

impl Admission {
    /// An admission that ends when `hold` is dropped (for store implementations).
    pub fn new(lock: &str, token: FencingToken, hold: impl Send + Sync + 'static) -> Self {
        Admission {
            lock: lock.to_owned(),
            token,
            _hold: Box::new(hold),
        }
    }

    /// The admitted token.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The lock it belongs to.
    pub fn lock(&self) -> &str {
        &self.lock
    }
}

impl fmt::Debug for Admission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admission")
            .field("lock", &self.lock)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl FenceStore for Fence {
    async fn admit(&self, lock: &str, token: FencingToken) -> Result<Admission> {
        let permit = Fence::admit(self, lock, token).await?;
        Ok(Admission::new(lock, token, permit))
    }

    async fn highest(&self, lock: &str) -> Result<Option<FencingToken>> {
        Ok(Fence::highest(self, lock))
    }

    async fn reset(&self, lock: &str) -> Result<()> {
        Fence::reset(self, lock).await;
        Ok(())
    }
}

#[async_trait]
impl<S: FenceStore + ?Sized> FenceStore for Arc<S> {
    async fn admit(&self, lock: &str, token: FencingToken) -> Result<Admission> {
        (**self).admit(lock, token).await
    }

    async fn highest(&self, lock: &str) -> Result<Option<FencingToken>> {
        (**self).highest(lock).await
    }

    async fn reset(&self, lock: &str) -> Result<()> {
        (**self).reset(lock).await
    }
}

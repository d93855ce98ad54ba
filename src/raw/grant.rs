//! [`Grant`]: what a backend hands over when the store grants a lock.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::raw::{HeldLock, LeaseClock};
use crate::{FencingToken, LockGuard, LockName};

/// A lock the store has granted, about to become a [`LockGuard`].
///
/// ```
/// # use std::sync::Arc; use std::time::Duration;
/// # use fencelock::{FencingToken, LockName, ReleaseOutcome, Result, StateKey};
/// # use fencelock::raw::{Grant, HeldLock, LeaseClock};
/// # #[derive(Debug)] struct MyHeld;
/// # #[async_trait::async_trait] impl HeldLock for MyHeld {
/// #   async fn release(&self) -> Result<ReleaseOutcome> { Ok(ReleaseOutcome::Released) }
/// #   async fn put_state(&self, _: &StateKey, _: &[u8]) -> Result<()> { Ok(()) }
/// #   async fn get_state(&self, _: &StateKey) -> Result<Option<Vec<u8>>> { Ok(None) }
/// #   async fn delete_state(&self, _: &StateKey) -> Result<bool> { Ok(false) }
/// #   fn release_in_background(self: Box<Self>) {}
/// # }
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<()> {
/// let lease = LeaseClock::start(tokio::time::Instant::now(), Duration::from_secs(10), Duration::from_secs(1));
/// let guard = Grant {
///     backend: "mine",
///     name: LockName::new("job")?,
///     token: FencingToken::new(7),
///     lease,
///     checkpoint: None,
///     held: Box::new(MyHeld),
/// }
/// .into_guard();
/// assert_eq!(guard.token(), FencingToken::new(7));
/// # drop(guard); Ok(()) }
/// ```
#[derive(Debug)]
pub struct Grant {
    /// The backend kind, as [`LockBackend::kind`](crate::LockBackend::kind) says it.
    pub backend: &'static str,
    /// The lock's name.
    pub name: LockName,
    /// The grant's fencing token.
    pub token: FencingToken,
    /// The session's lease; the guard's `lost` is a child of its `lost`.
    pub lease: Arc<LeaseClock>,
    /// What the store held under [`StateKey::checkpoint`](crate::StateKey::checkpoint) at grant
    /// time, read in the same request as the grant where the store allows.
    pub checkpoint: Option<Vec<u8>>,
    /// The store half: release and fenced state.
    pub held: Box<dyn HeldLock>,
}

impl Grant {
    /// The guard for this grant.
    pub fn into_guard(self) -> LockGuard {
        LockGuard::from_grant(self)
    }

    /// The guard, and the token that fires its `lost` alone: keep it to report that this one
    /// lock is gone while the session lives on (its node was deleted behind its back, say).
    /// Cancelling it never releases anything.
    pub fn into_guard_with_trigger(self) -> (LockGuard, CancellationToken) {
        let guard = LockGuard::from_grant(self);
        let trigger = guard.loss_trigger();
        (guard, trigger)
    }
}

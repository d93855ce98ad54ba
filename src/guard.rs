//! The one guard type every backend returns.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::backend::ReleaseOutcome;
use crate::raw::{Grant, HeldLock, LeaseClock};
use crate::{Error, FencingToken, LockName, Result, StateKey};

/// Proof of holding a lock, for as long as its lease lasts.
///
/// Holding a guard does **not** mean holding the lock forever: a lease can end under a paused or
/// cut-off holder. So:
/// - stop work when [`lost`](LockGuard::lost) fires, or run it inside [`run`](LockGuard::run);
/// - pass [`token`](LockGuard::token) to every resource you mutate, and let the resource refuse
///   lower tokens ([`Fence`](crate::Fence), or an SQL `WHERE fence_token <= $1`);
/// - or keep small state next to the lock with [`fenced_put`](LockGuard::fenced_put), which the
///   store itself refuses once the lock is not ours.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> fencelock::Result<()> {
/// use fencelock::{LockBackendExt, MemoryBackend};
///
/// let backend = MemoryBackend::new();
/// let guard = backend.lock("invoices").await?;
/// let resume_from = guard.last_checkpoint().map(|b| b.to_vec());
/// let done = guard
///     .run(async {
///         // ... work, stopped at once if the lock is lost ...
///         guard.checkpoint(b"batch 7").await?;
///         guard.fenced_put("last-run", b"2026-12-02").await
///     })
///     .await??;
/// assert_eq!(resume_from, None);
/// let _ = guard.release().await?;
/// # let _ = done; Ok(()) }
/// ```
///
/// # Drop
/// Dropping a guard fires its `lost` and releases the lock **in the background**: the release is
/// not done when `drop` returns, and if the process exits first the lock stays held until its
/// lease expires. Call [`release`](LockGuard::release) to know when, and whether, it happened.
/// A guard dropped on a thread outside any Tokio runtime releases on the runtime it was granted
/// on; only if that runtime has shut down too is the lock left to its lease (a warning says so).
#[must_use = "the lock is released (in the background) as soon as the guard is dropped"]
pub struct LockGuard {
    backend: &'static str,
    name: LockName,
    token: FencingToken,
    lease: Arc<LeaseClock>,
    lost: CancellationToken,
    checkpoint: Option<Vec<u8>>,
    held: Option<Box<dyn HeldLock>>,
    /// Why this one lock was lost, when the cause is the guard's own (not the session's).
    cause: std::sync::OnceLock<&'static str>,
    /// The runtime the grant was made on: a guard dropped on a thread outside any runtime
    /// releases on it (backends spawn their background release on the current runtime).
    runtime: Option<tokio::runtime::Handle>,
    /// When the lock was granted, for the hold-time metric.
    granted_at: tokio::time::Instant,
    /// The `lock` span: the work under the lock, in logs.
    span: tracing::Span,
}

impl LockGuard {
    /// The guard of a grant; backends build it with [`Grant::into_guard`].
    pub(crate) fn from_grant(grant: Grant) -> Self {
        let Grant {
            backend,
            name,
            token,
            lease,
            checkpoint,
            held,
        } = grant;
        let lost = lease.lost_token().child_token();
        tracing::debug!(backend, lock = %name, %token, "lock acquired");
        let span = tracing::info_span!("lock", backend, lock = %name, %token);
        LockGuard {
            backend,
            name,
            token,
            lease,
            lost,
            checkpoint,
            held: Some(held),
            cause: std::sync::OnceLock::new(),
            runtime: tokio::runtime::Handle::try_current().ok(),
            granted_at: tokio::time::Instant::now(),
            span,
        }
    }

    /// Why the lock was lost, for operators: the deadline passed, the store ended the session
    /// (with its reason), the store refused an operation, the lock was released... `None`
    /// while it is held.
    pub fn loss_cause(&self) -> Option<String> {
        if self.is_held() {
            return None;
        }
        if let Some(cause) = self.cause.get() {
            return Some((*cause).to_owned());
        }
        Some(self.lease.cause().unwrap_or_else(|| {
            "the backend reported this lock gone (its entry was deleted behind its back)".into()
        }))
    }

    /// The `lock` span (fields `backend`, `lock`, `token`), to run the work done under the
    /// lock in, so that its log lines say which lock and token it ran under.
    ///
    /// ```
    /// # async fn f(guard: fencelock::LockGuard) {
    /// use tracing::Instrument;
    /// async { tracing::info!("writing the ledger") }.instrument(guard.span().clone()).await;
    /// # }
    /// ```
    pub fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The fencing token of this acquisition; pass it to every resource you mutate.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The backend kind that granted this lock.
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// The local lease deadline: after it, the lock must be assumed gone. Renewals move it.
    pub fn deadline(&self) -> Instant {
        self.lease.deadline()
    }

    /// Resolves when the holder can no longer be sure it holds the lock: renewal failed, the local
    /// deadline passed, the session expired, the store refused an operation, or the guard was
    /// released or dropped.
    ///
    /// [`run`](LockGuard::run) does this for one future; with several steps, or work that must
    /// clean up when it stops, select on it yourself:
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> fencelock::Result<()> {
    /// use std::time::Duration;
    /// use fencelock::{LockBackendExt, MemoryBackend};
    ///
    /// let backend = MemoryBackend::new();
    /// let guard = backend.lock("compaction").await?;
    /// for batch in 0..3 {
    ///     tokio::select! {
    ///         biased;
    ///         () = guard.lost() => {
    ///             eprintln!("lock lost before batch {batch}: stopping");
    ///             break;
    ///         }
    ///         () = tokio::time::sleep(Duration::from_millis(1)) => {
    ///             guard.checkpoint(format!("batch {batch}")).await?; // fenced progress
    ///         }
    ///     }
    /// }
    /// let _ = guard.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`CancellationToken::cancelled`]: dropping the future misses nothing,
    /// and a new one resolves at once if the lock is already lost.
    pub fn lost(&self) -> WaitForCancellationFuture<'_> {
        self.lost.cancelled()
    }

    /// The `lost` signal as a token to hand to other tasks (a child token: cancelling it stops
    /// only those tasks' view, it does not release the lock).
    pub fn lost_token(&self) -> CancellationToken {
        self.lost.child_token()
    }

    /// The token that fires this guard's `lost` ([`Grant::into_guard_with_trigger`]).
    pub(crate) fn loss_trigger(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// True while the lease is live and the lock has not been reported lost. Checks the clock
    /// directly, so a late timer task cannot make it lie; once false, it stays false (and `lost`
    /// has fired).
    pub fn is_held(&self) -> bool {
        if self.lost.is_cancelled() {
            return false;
        }
        if !self.lease.is_live() {
            self.lost.cancel();
            return false;
        }
        true
    }

    /// The token, if the lock is still held: call it right before a mutation.
    ///
    /// # Errors
    /// [`Error::LockLost`] when [`is_held`](LockGuard::is_held) is false.
    pub fn ensure_held(&self) -> Result<FencingToken> {
        if self.is_held() {
            Ok(self.token)
        } else {
            self.lost.cancel();
            Err(self.lost_error())
        }
    }

    /// Runs `work` until it finishes or the lock is lost, whichever is first; on loss, `work` is
    /// dropped at its current await point.
    ///
    /// # Errors
    /// [`Error::LockLost`] when the lock was lost before `work` finished.
    ///
    /// # Cancel safety
    /// As cancel-safe as `work` itself.
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output> {
        self.ensure_held()?;
        let mut work = std::pin::pin!(work);
        // The clock is checked before every poll of `work`, not only through `lost`: after a
        // pause the timer wakes the work and the deadline task together, and the work must not
        // run first.
        let checked = std::future::poll_fn(|cx| {
            if !self.is_held() {
                return std::task::Poll::Ready(Err(self.lost_error()));
            }
            work.as_mut().poll(cx).map(Ok)
        });
        tokio::select! {
            biased;
            () = self.lost.cancelled() => Err(self.lost_error()),
            out = checked => out,
        }
    }

    /// Releases the lock, checking at the store that it is still ours.
    ///
    /// Fires `lost` first, so anything watching it stops before the lock is free.
    ///
    /// # Errors
    /// [`Error::Backend`] if the store could not be reached; the lock then ends with its lease.
    ///
    /// # Cancel safety
    /// If the future is dropped, the release goes on in the background as for `drop`.
    pub async fn release(mut self) -> Result<ReleaseOutcome> {
        if self.is_held() {
            let _ = self.cause.set("released");
        }
        self.lost.cancel();
        let Some(held) = self.held.take() else {
            return Ok(ReleaseOutcome::NotOwned);
        };
        crate::telemetry::record_hold(self.backend, self.granted_at.elapsed());
        let pending = ReleaseOnDrop(Some(held));
        let outcome = match &pending.0 {
            Some(held) => held.release().await,
            None => Ok(ReleaseOutcome::NotOwned),
        };
        pending.disarm();
        tracing::debug!(backend = self.backend, lock = %self.name, token = %self.token, ?outcome, "lock released");
        outcome
    }

    /// Stores `value` under `key` next to the lock. The store refuses it unless this guard still
    /// holds the lock, so a stale holder cannot overwrite its successor's state.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for a bad key, [`Error::LockLost`]/[`Error::NotHeld`] if the lock is
    /// gone (the guard's `lost` then fires), [`Error::Backend`] on store failure.
    ///
    /// # Cancel safety
    /// Not cancel-safe: if dropped, the write may or may not have happened.
    pub async fn fenced_put(&self, key: &str, value: impl AsRef<[u8]>) -> Result<()> {
        let key = StateKey::new(key)?;
        self.guarded(|held| held.put_state(&key, value.as_ref()))
            .await
    }

    /// Reads `key` next to the lock, refused unless this guard still holds the lock.
    ///
    /// # Errors
    /// As [`fenced_put`](LockGuard::fenced_put).
    ///
    /// # Cancel safety
    /// Cancel-safe.
    pub async fn fenced_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let key = StateKey::new(key)?;
        self.guarded(|held| held.get_state(&key)).await
    }

    /// Deletes `key` next to the lock, refused unless this guard still holds the lock; true if it
    /// existed.
    ///
    /// # Errors
    /// As [`fenced_put`](LockGuard::fenced_put).
    ///
    /// # Cancel safety
    /// Not cancel-safe: if dropped, the delete may or may not have happened.
    pub async fn fenced_delete(&self, key: &str) -> Result<bool> {
        let key = StateKey::new(key)?;
        self.guarded(|held| held.delete_state(&key)).await
    }

    /// Records progress of long work as a fenced write, so that if this holder loses the lock the
    /// next holder resumes from here ([`last_checkpoint`](LockGuard::last_checkpoint)).
    ///
    /// # Errors
    /// As [`fenced_put`](LockGuard::fenced_put).
    ///
    /// # Cancel safety
    /// Not cancel-safe: if dropped, the checkpoint may or may not have been written.
    pub async fn checkpoint(&self, progress: impl AsRef<[u8]>) -> Result<()> {
        let key = StateKey::checkpoint();
        self.guarded(|held| held.put_state(&key, progress.as_ref()))
            .await
    }

    /// Deletes the checkpoint once the work is complete, so the next holder starts fresh.
    ///
    /// # Errors
    /// As [`fenced_put`](LockGuard::fenced_put).
    ///
    /// # Cancel safety
    /// Not cancel-safe: if dropped, the checkpoint may or may not have been deleted.
    pub async fn clear_checkpoint(&self) -> Result<()> {
        let key = StateKey::checkpoint();
        self.guarded(|held| held.delete_state(&key)).await.map(drop)
    }

    /// The checkpoint a previous holder left, as it was when this guard was granted.
    pub fn last_checkpoint(&self) -> Option<&[u8]> {
        self.checkpoint.as_deref()
    }

    /// Changes the value of this guard's own entry (an election's published value).
    pub(crate) async fn set_value(&self, value: &[u8]) -> Result<()> {
        self.guarded(|held| held.set_value(value)).await
    }

    async fn guarded<'a, T, F, Fut>(&'a self, op: F) -> Result<T>
    where
        F: FnOnce(&'a dyn HeldLock) -> Fut,
        Fut: Future<Output = Result<T>> + 'a,
    {
        self.ensure_held()?;
        let held = self.held.as_deref().ok_or_else(|| self.lost_error())?;
        let out = op(held).await;
        if matches!(&out, Err(e) if e.is_lost()) {
            tracing::warn!(backend = self.backend, lock = %self.name, token = %self.token, "store refused a fenced operation; lock lost");
            if self
                .cause
                .set("the store refused a fenced operation: the lock is no longer ours")
                .is_ok()
                && !self.lost.is_cancelled()
            {
                crate::telemetry::record_loss("store_refused");
            }
            self.lost.cancel();
        }
        out
    }

    fn lost_error(&self) -> Error {
        Error::lost(&self.name)
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("backend", &self.backend)
            .field("name", &self.name)
            .field("token", &self.token)
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.lost.cancel();
        if let Some(held) = self.held.take() {
            crate::telemetry::record_hold(self.backend, self.granted_at.elapsed());
            tracing::debug!(backend = self.backend, lock = %self.name, token = %self.token, "guard dropped; releasing in the background");
            // Outside any runtime (a plain thread), the grant's runtime runs the release; if
            // that runtime has shut down too, the release is left to the lease.
            let _entered = match (tokio::runtime::Handle::try_current(), &self.runtime) {
                (Err(_), Some(runtime)) => Some(runtime.enter()),
                _ => None,
            };
            held.release_in_background();
        }
    }
}

/// Hands the store half to a background release if a `release()` future is dropped midway.
struct ReleaseOnDrop(Option<Box<dyn HeldLock>>);

impl ReleaseOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        if let Some(held) = self.0.take() {
            held.release_in_background();
        }
    }
}

//! Resource-side fencing for stores outside the lock service.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedRwLockReadGuard, RwLock};

use crate::{Error, FencingToken, Result};

/// The HTTP header that carries a fencing token: `Fencing-Token: <lock>=<token>`.
pub const FENCING_TOKEN_HEADER: &str = "Fencing-Token";

/// How a [`Fence`] decides which tokens to admit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FenceMode {
    /// Admit a token at least the highest admitted so far, and raise the mark to it (the
    /// default). The first write of a new holder is its claim.
    #[default]
    HighWater,
    /// Admit only the token the fence holds; a new holder installs its token first with
    /// [`Fence::claim`], which refuses tokens lower than the one held. This is the rule for
    /// resources that can keep a value and compare it for equality but not for order (a
    /// conditional write on an ETag, a version match): writes compare `==`, only the claim needs
    /// order, and the claim can be a read, a local comparison and a compare-and-set.
    CompareAndSet,
}

/// Keeps the token to admit per lock and refuses stale ones: the check a protected resource
/// makes so that a paused, expired holder cannot overwrite its successor's work.
///
/// Hold the returned [`FencePermit`] across the write. Writes with the same token run
/// concurrently; a newer token is admitted only once every permit of older tokens has been
/// dropped, so an older write can never land after a newer one. Each lock has its own state, so
/// locks never wait for each other, and the permit is `Send + 'static`: it can be held across
/// `.await` in a spawned task or an HTTP handler.
///
/// This fence lives in one process's memory; a resource served by several replicas, or one that
/// must remember across restarts, needs a durable fence shared by all of them (the
/// `fencelock-fence` crate has one in PostgreSQL, and the store trait for others).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use fencelock::{Error, Fence, FencingToken};
///
/// let fence = Fence::new();
/// let mut account = 0;
/// {
///     let _permit = fence.admit("payouts", FencingToken::new(7)).await.unwrap();
///     account += 10; // the write, while the permit is held
/// }
/// // A holder whose lease ended long ago wakes up with token 5:
/// let stale = fence.admit("payouts", FencingToken::new(5)).await;
/// assert!(matches!(stale, Err(Error::StaleToken { .. })));
/// assert_eq!(account, 10);
/// # }
/// ```
///
/// # The same rule elsewhere
/// - **SQL row**: keep a `fence_token` column next to the data and make every write conditional:
///   `UPDATE jobs SET state = $2, fence_token = $1 WHERE id = $3 AND fence_token <= $1`;
///   zero rows updated means a newer holder exists, so stop.
/// - **HTTP**: send [`FENCING_TOKEN_HEADER`] (`Fencing-Token: payouts=7`, see
///   [`format_header`]/[`parse_header`]); the server admits it with a `Fence` and answers
///   `409 Conflict` on [`Error::StaleToken`].
///
/// # Tokens that go backwards
/// A lock store restored from a snapshot, or a new cluster under the same lock name, hands out
/// tokens lower than ones this fence admitted. The fence refuses them ([`Error::StaleToken`]
/// says so): it cannot tell them from a stale holder. Once no holder from before the restore
/// can still be running, [`Fence::reset`] the lock.
#[derive(Debug, Default)]
pub struct Fence {
    mode: FenceMode,
    locks: Mutex<HashMap<String, Arc<Slot>>>,
}

#[derive(Debug, Default)]
struct Slot {
    /// The token to admit; changed only while `gate` is held for writing.
    current: Mutex<Option<FencingToken>>,
    /// Permits hold it shared; moving to a newer token takes it exclusively.
    gate: Arc<RwLock<()>>,
}

impl Slot {
    fn current(&self) -> Option<FencingToken> {
        *self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set(&self, token: Option<FencingToken>) {
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = token;
    }
}

/// Admission through a [`Fence`]: while it is held, no newer token of its lock is admitted.
#[derive(Debug)]
#[must_use = "hold the permit across the write it protects"]
pub struct FencePermit {
    lock: String,
    token: FencingToken,
    _gate: OwnedRwLockReadGuard<()>,
}

impl FencePermit {
    /// The token that was admitted.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The lock the token belongs to.
    pub fn lock(&self) -> &str {
        &self.lock
    }
}

/// What an admission must do, given the token the fence holds.
enum Step {
    Admit,
    Raise,
}

impl Fence {
    /// An empty high-water fence: the first token of each lock is admitted.
    pub fn new() -> Self {
        Fence::default()
    }

    /// An empty fence with the given admission rule.
    pub fn with_mode(mode: FenceMode) -> Self {
        Fence {
            mode,
            locks: Mutex::default(),
        }
    }

    /// The admission rule.
    pub fn mode(&self) -> FenceMode {
        self.mode
    }

    fn slot(&self, lock: &str) -> Arc<Slot> {
        let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(locks.entry(lock.to_owned()).or_default())
    }

    fn step(&self, lock: &str, token: FencingToken, current: Option<FencingToken>) -> Result<Step> {
        let step = self.decide(lock, token, current);
        if step.is_err() {
            crate::telemetry::record_admission("memory", false);
        }
        step
    }

    fn decide(
        &self,
        lock: &str,
        token: FencingToken,
        current: Option<FencingToken>,
    ) -> Result<Step> {
        match current {
            Some(held) if token < held => Err(Error::StaleToken {
                lock: lock.to_owned(),
                presented: token,
                highest: held,
            }),
            Some(held) if token == held => Ok(Step::Admit),
            _ if self.mode == FenceMode::CompareAndSet => Err(Error::TokenNotClaimed {
                lock: lock.to_owned(),
                presented: token,
                current,
            }),
            _ => Ok(Step::Raise),
        }
    }

    /// Admits `token` for `lock`, waiting for permits of older tokens to be dropped when the
    /// token is newer than the last admitted one (high-water mode raises the mark to it).
    ///
    /// # Errors
    /// [`Error::StaleToken`] when a higher token was already admitted (or claimed);
    /// [`Error::TokenNotClaimed`] in [`FenceMode::CompareAndSet`] for a token other than the
    /// claimed one.
    ///
    /// # Cancel safety
    /// Cancel safe: a cancelled admission admits nothing and leaves the mark as it was.
    pub async fn admit(&self, lock: &str, token: FencingToken) -> Result<FencePermit> {
        let slot = self.slot(lock);
        let shared = Arc::clone(&slot.gate).read_owned().await;
        if let Step::Admit = self.step(lock, token, slot.current())? {
            return Ok(self.permit(lock, token, shared));
        }
        drop(shared);
        let exclusive = Arc::clone(&slot.gate).write_owned().await;
        // Checked again: a newer token may have been admitted while this one waited.
        if let Step::Raise = self.step(lock, token, slot.current())? {
            slot.set(Some(token));
        }
        Ok(self.permit(lock, token, exclusive.downgrade()))
    }

    /// [`admit`](Fence::admit) without waiting, for synchronous code.
    ///
    /// # Errors
    /// As `admit`, and [`Error::WouldBlock`] when a newer token would have to wait for permits
    /// of older tokens still held.
    pub fn try_admit(&self, lock: &str, token: FencingToken) -> Result<FencePermit> {
        let busy = || Error::WouldBlock {
            name: lock.to_owned(),
        };
        let slot = self.slot(lock);
        if let Ok(shared) = Arc::clone(&slot.gate).try_read_owned() {
            if let Step::Admit = self.step(lock, token, slot.current())? {
                return Ok(self.permit(lock, token, shared));
            }
        }
        let exclusive = Arc::clone(&slot.gate)
            .try_write_owned()
            .map_err(|_| busy())?;
        if let Step::Raise = self.step(lock, token, slot.current())? {
            slot.set(Some(token));
        }
        Ok(self.permit(lock, token, exclusive.downgrade()))
    }

    /// Installs `token` as the one to admit for `lock` (the claim of a new holder in
    /// [`FenceMode::CompareAndSet`]; in high-water mode it raises the mark like an admission
    /// whose write is empty). Waits for permits of older tokens to be dropped.
    ///
    /// # Errors
    /// [`Error::StaleToken`] when a higher token was already claimed or admitted.
    ///
    /// # Cancel safety
    /// Cancel safe: a cancelled claim changes nothing.
    pub async fn claim(&self, lock: &str, token: FencingToken) -> Result<()> {
        let slot = self.slot(lock);
        let _exclusive = Arc::clone(&slot.gate).write_owned().await;
        match slot.current() {
            Some(held) if token < held => Err(Error::StaleToken {
                lock: lock.to_owned(),
                presented: token,
                highest: held,
            }),
            _ => {
                slot.set(Some(token));
                Ok(())
            }
        }
    }

    /// Forgets what was admitted for `lock`, so that its next token is admitted whatever it is:
    /// the operator's recovery after the lock store was restored from a snapshot or replaced.
    /// Call it only once no holder from before can still write. Waits for held permits.
    ///
    /// # Cancel safety
    /// Cancel safe: a cancelled reset changes nothing.
    pub async fn reset(&self, lock: &str) {
        let slot = self.slot(lock);
        let _exclusive = Arc::clone(&slot.gate).write_owned().await;
        slot.set(None);
    }

    /// The highest token admitted (or claimed) for `lock`.
    pub fn highest(&self, lock: &str) -> Option<FencingToken> {
        self.slot(lock).current()
    }

    fn permit(
        &self,
        lock: &str,
        token: FencingToken,
        gate: OwnedRwLockReadGuard<()>,
    ) -> FencePermit {
        crate::telemetry::record_admission("memory", true);
        FencePermit {
            lock: lock.to_owned(),
            token,
            _gate: gate,
        }
    }
}

/// Formats the value of a [`FENCING_TOKEN_HEADER`] header: `lock=token`.
pub fn format_header(lock: &str, token: FencingToken) -> String {
    format!("{lock}={token}")
}

/// Parses the value of a [`FENCING_TOKEN_HEADER`] header.
///
/// # Errors
/// [`Error::InvalidConfig`] naming the header when it is not `lock=token`.
pub fn parse_header(value: &str) -> Result<(String, FencingToken)> {
    let bad = || {
        Error::config(
            "Fencing-Token header",
            format!("expected `<lock>=<token>`, got {value:?}"),
        )
    };
    let (lock, token) = value.rsplit_once('=').ok_or_else(bad)?;
    let token = token.parse().map_err(|_| bad())?;
    if lock.is_empty() {
        return Err(bad());
    }
    Ok((lock.to_owned(), token))
}

#[cfg(test)]
mod tests;

//! Leader election: a lock whose holder publishes a value, with its term as fencing token.

use std::fmt;
use std::ops::Deref;

use crate::backend::ReleaseOutcome;
use crate::{FencingToken, LockGuard, Result};

/// The leader of an election as the store sees it ([`LockBackend::leader`](crate::LockBackend::leader),
/// [`LockBackend::observe`](crate::LockBackend::observe)).
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// What the leader published: its campaign value, or its last
    /// [`proclaim`](Leadership::proclaim). Curator's `LeaderLatch` publishes its participant id.
    pub value: Vec<u8>,
    /// The leader's term, the same number as its [`Leadership::term`]: a resource fencing on
    /// terms refuses every earlier leader. For leaders elected through another client (etcdctl,
    /// Curator) it is the number the store gives their entry (etcd: create revision; ZooKeeper:
    /// czxid), which is what fencelock leaders use too.
    pub term: FencingToken,
}

impl Leader {
    /// A leader; for backends.
    pub fn new(value: Vec<u8>, term: FencingToken) -> Self {
        Leader { value, term }
    }

    /// The value as text, with invalid UTF-8 replaced.
    pub fn value_lossy(&self) -> String {
        String::from_utf8_lossy(&self.value).into_owned()
    }
}

impl fmt::Debug for Leader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leader")
            .field("value", &self.value_lossy())
            .field("term", &self.term)
            .finish()
    }
}

/// Proof of leading an election, for as long as its lease lasts: a [`LockGuard`] (through
/// `Deref`: `lost`, `run`, `fenced_put`, checkpoints, `is_held`) plus the leader's published
/// value.
///
/// The [`term`](Leadership::term) is the fencing token of this leadership: strictly greater
/// than every earlier leader's of the same election. Pass it to every resource the leader
/// writes to, exactly as a lock's token.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> fencelock::Result<()> {
/// use fencelock::{Fence, LockBackendExt, MemoryBackend};
///
/// let backend = MemoryBackend::new();
/// let jobs = Fence::new(); // lives in the resource the leader writes to
/// let mut leader = backend.campaign("scheduler", "node-a:8080").await?;
/// leader
///     .run(async {
///         let _write = jobs.admit("scheduler", leader.term()).await?; // refuses earlier leaders
///         fencelock::Result::Ok(())
///     })
///     .await??;
/// leader.proclaim("node-a:9090").await?; // observers see the new value
/// let _ = leader.resign().await?;
/// # Ok(()) }
/// ```
///
/// # Drop
/// Dropping it resigns in the background, as dropping a [`LockGuard`] releases.
#[must_use = "leadership is given up (in the background) as soon as it is dropped"]
pub struct Leadership {
    guard: LockGuard,
    value: Vec<u8>,
}

impl Leadership {
    /// A leadership for a granted campaign; for backends, with the guard of the grant and the
    /// value the campaign published.
    pub fn new(guard: LockGuard, value: Vec<u8>) -> Self {
        Leadership { guard, value }
    }

    /// The term: this leadership's fencing token.
    pub fn term(&self) -> FencingToken {
        self.guard.token()
    }

    /// The value this leader publishes now.
    pub fn value(&self) -> &[u8] {
        &self.value
    }

    /// Publishes a new value (a new address, say), refused by the store unless this is still
    /// the leader. Observers see the change; the term stays.
    ///
    /// # Errors
    /// [`Error::LockLost`](crate::Error::LockLost)/[`Error::NotHeld`](crate::Error::NotHeld) if
    /// the leadership is gone (its `lost` then fires), [`Error::Unsupported`](crate::Error::Unsupported)
    /// where the backend cannot change a value, [`Error::Backend`](crate::Error::Backend) on store failure.
    ///
    /// # Cancel safety
    /// Not cancel-safe: if dropped, the value may or may not have changed at the store;
    /// [`value`](Leadership::value) keeps the old one.
    pub async fn proclaim(&mut self, value: impl AsRef<[u8]>) -> Result<()> {
        let value = value.as_ref();
        self.guard.set_value(value).await?;
        self.value = value.to_vec();
        Ok(())
    }

    /// Gives up the leadership at once, so the next candidate is elected without waiting for
    /// the lease.
    ///
    /// # Errors
    /// As [`LockGuard::release`].
    ///
    /// # Cancel safety
    /// If dropped, the resignation goes on in the background.
    pub async fn resign(self) -> Result<ReleaseOutcome> {
        self.guard.release().await
    }

    /// The lock guard behind this leadership.
    pub fn into_guard(self) -> LockGuard {
        self.guard
    }
}

impl Deref for Leadership {
    type Target = LockGuard;

    fn deref(&self) -> &LockGuard {
        &self.guard
    }
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("name", self.guard.name())
            .field("term", &self.term())
            .field("value", &String::from_utf8_lossy(&self.value))
            .finish_non_exhaustive()
    }
}

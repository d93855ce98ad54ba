//! The one error type of the crate.

use std::time::Duration;

use crate::{FencingToken, LockName};

/// A boxed error from a backend's client library, kept as the [`Error::Backend`] source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Shorthand for `Result<T, fencelock::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong when taking, holding or using a lock.
///
/// Every message says what to do next. Match on the variant, not the text.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The holder can no longer be sure it holds the lock (renewal failed, the lease deadline
    /// passed, the session expired, or the lock was released or taken away).
    #[error(
        "lock `{name}` was lost: stop mutating now; anything written after this may be refused \
         or overwritten by the next holder. Acquire the lock again to continue"
    )]
    LockLost {
        /// The lock's name.
        name: String,
    },

    /// The acquire waited as long as it was allowed to.
    #[error(
        "timed out after {waited:?} waiting for lock `{name}`: another holder still has it; \
         retry later or wait longer"
    )]
    Timeout {
        /// The lock's name.
        name: String,
        /// How long the acquire waited.
        waited: Duration,
    },

    /// A try-acquire found the lock held by someone else.
    #[error("lock `{name}` is held by another holder; retry later or wait for it")]
    WouldBlock {
        /// The lock's name.
        name: String,
    },

    /// The store refused an operation because this guard no longer owns the lock.
    #[error(
        "lock `{name}` is not held by this guard (token {token}): the store refused the \
         operation; stop mutating and acquire the lock again"
    )]
    NotHeld {
        /// The lock's name.
        name: String,
        /// The token of the guard that tried.
        token: FencingToken,
    },

    /// A fenced resource refused a token lower than one it has already accepted.
    #[error(
        "stale fencing token {presented} for `{lock}`: the resource already accepted {highest}, \
         so a newer holder exists and this writer must stop (or the lock store was restored \
         from a snapshot or replaced, and hands out lower tokens: reset the fence for `{lock}` \
         once no earlier holder can write)"
    )]
    StaleToken {
        /// The lock the token belongs to.
        lock: String,
        /// The token that was presented.
        presented: FencingToken,
        /// The highest token the resource has seen.
        highest: FencingToken,
    },

    /// A compare-and-set fence holds another token than the one presented: a newer holder must
    /// claim its token before writing (see `FenceMode::CompareAndSet`).
    #[error(
        "fencing token {presented} for `{lock}` is not the claimed one ({}): claim it before \
         writing",
        .current.map_or("none claimed".to_owned(), |c| format!("{c} is"))
    )]
    TokenNotClaimed {
        /// The lock the token belongs to.
        lock: String,
        /// The token that was presented.
        presented: FencingToken,
        /// The token the fence holds, if any.
        current: Option<FencingToken>,
    },

    /// A lock name or state key is not acceptable.
    #[error("invalid name {name:?}: {reason}; choose a name that {rule}")]
    InvalidName {
        /// The rejected input.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
        /// What a valid name looks like.
        rule: &'static str,
    },

    /// A configuration value is not acceptable.
    #[error("invalid configuration `{field}`: {reason}")]
    InvalidConfig {
        /// The setting, as it is spelled in the config struct or URL.
        field: &'static str,
        /// What is wrong and what would be accepted.
        reason: String,
    },

    /// A semaphore's contenders disagree on its number of permits: the store holds
    /// `stored` for `name` (written by the contenders already there), the caller asked for
    /// `requested`. Nothing was acquired or left behind; use the same count everywhere (a
    /// semaphore takes its count anew once no one holds or waits for a permit).
    #[error(
        "semaphore {name:?} has {stored} permits in the store, but this acquire asked for          {requested}; every contender must use the same count"
    )]
    PermitsMismatch {
        /// The semaphore's name.
        name: String,
        /// The count the store holds.
        stored: u32,
        /// The count this acquire asked for.
        requested: u32,
    },

    /// The backend does not offer this operation.
    #[error("the {backend} backend does not support {what}; use another backend or leave it out")]
    Unsupported {
        /// Which backend.
        backend: &'static str,
        /// The operation.
        what: &'static str,
    },

    /// The backend's store or client library failed. [`kind`](StoreFailure) says what the
    /// caller can do about it; [`Error::is_retryable`] is the short answer.
    #[error("{backend} backend ({kind}): {context}{}", suffix(.source.as_ref()))]
    Backend {
        /// Which backend (`"etcd"`, `"zookeeper"`, `"memory"`, ...).
        backend: &'static str,
        /// What kind of failure: unavailable, unauthorized, protocol, internal.
        kind: StoreFailure,
        /// What fencelock was doing, and what the user can check.
        context: String,
        /// The client library's error, when there is one.
        #[source]
        source: Option<BoxError>,
    },
}

/// What kind of store failure an [`Error::Backend`] is, by what the caller can do about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreFailure {
    /// No answer in time, connection lost, no leader, session moving: a retry may succeed.
    Unavailable,
    /// The credentials were refused, or they do not allow the operation: fix them; a retry
    /// will not help.
    Unauthorized,
    /// The store answered something the protocol does not allow (an incompatible client
    /// writing under our keys, or a bug): a retry will not help.
    Protocol,
    /// A failure inside fencelock itself (a task panicked): report it.
    Internal,
}

impl std::fmt::Display for StoreFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StoreFailure::Unavailable => "unavailable",
            StoreFailure::Unauthorized => "unauthorized",
            StoreFailure::Protocol => "protocol error",
            StoreFailure::Internal => "internal error",
        })
    }
}

fn suffix(source: Option<&BoxError>) -> String {
    source.map(|s| format!(": {s}")).unwrap_or_default()
}

impl Error {
    /// Builds an [`Error::Backend`] of `kind`.
    pub fn store(
        backend: &'static str,
        kind: StoreFailure,
        context: impl Into<String>,
        source: Option<BoxError>,
    ) -> Self {
        Error::Backend {
            backend,
            kind,
            context: context.into(),
            source,
        }
    }

    /// A store that did not answer, or a lost connection: [`StoreFailure::Unavailable`].
    pub fn unavailable(
        backend: &'static str,
        context: impl Into<String>,
        source: Option<BoxError>,
    ) -> Self {
        Error::store(backend, StoreFailure::Unavailable, context, source)
    }

    /// Refused credentials or permissions: [`StoreFailure::Unauthorized`].
    pub fn unauthorized(
        backend: &'static str,
        context: impl Into<String>,
        source: Option<BoxError>,
    ) -> Self {
        Error::store(backend, StoreFailure::Unauthorized, context, source)
    }

    /// An answer the protocol does not allow: [`StoreFailure::Protocol`].
    pub fn protocol(backend: &'static str, context: impl Into<String>) -> Self {
        Error::store(backend, StoreFailure::Protocol, context, None)
    }

    /// A failure inside fencelock: [`StoreFailure::Internal`].
    pub fn internal(backend: &'static str, context: impl Into<String>) -> Self {
        Error::store(backend, StoreFailure::Internal, context, None)
    }

    /// `what` got no answer within `after`: [`StoreFailure::Unavailable`].
    pub fn timed_out(backend: &'static str, what: impl std::fmt::Display, after: Duration) -> Self {
        Error::unavailable(
            backend,
            format!("{what}: no answer within {after:?}"),
            Some(Box::new(std::io::Error::from(std::io::ErrorKind::TimedOut))),
        )
    }

    /// [`Error::LockLost`] for `name`.
    pub fn lost(name: &LockName) -> Self {
        Error::LockLost {
            name: name.to_string(),
        }
    }

    /// [`Error::WouldBlock`] for `name`.
    pub fn would_block(name: &LockName) -> Self {
        Error::WouldBlock {
            name: name.to_string(),
        }
    }

    /// [`Error::PermitsMismatch`] for the semaphore `name`.
    pub fn permits_mismatch(name: &LockName, stored: u32, requested: u32) -> Self {
        Error::PermitsMismatch {
            name: name.to_string(),
            stored,
            requested,
        }
    }

    /// [`Error::NotHeld`]: the store refused the guard of `name` with `token`.
    pub fn not_held(name: &LockName, token: FencingToken) -> Self {
        Error::NotHeld {
            name: name.to_string(),
            token,
        }
    }

    /// True when a retry of the same operation may succeed: a store that was unavailable
    /// ([`StoreFailure::Unavailable`]). False for everything else, including lock-state errors
    /// (acquire again instead) and refused credentials.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Backend {
                kind: StoreFailure::Unavailable,
                ..
            }
        )
    }

    /// The kind of store failure, for an [`Error::Backend`].
    pub fn store_failure(&self) -> Option<StoreFailure> {
        match self {
            Error::Backend { kind, .. } => Some(*kind),
            _ => None,
        }
    }

    /// Builds an [`Error::InvalidConfig`].
    pub fn config(field: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidConfig {
            field,
            reason: reason.into(),
        }
    }

    /// True for errors that mean this holder must stop: [`Error::LockLost`], [`Error::NotHeld`]
    /// and [`Error::StaleToken`].
    pub fn is_lost(&self) -> bool {
        matches!(
            self,
            Error::LockLost { .. } | Error::NotHeld { .. } | Error::StaleToken { .. }
        )
    }
}

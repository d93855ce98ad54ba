//! The one error type of the crate.

use std::time::Duration;

use crate::FencingToken;

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
         so a newer holder exists; this writer must stop"
    )]
    StaleToken {
        /// The lock the token belongs to.
        lock: String,
        /// The token that was presented.
        presented: FencingToken,
        /// The highest token the resource has seen.
        highest: FencingToken,
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

    /// The backend does not offer this operation.
    #[error("the {backend} backend does not support {what}; use another backend or leave it out")]
    Unsupported {
        /// Which backend.
        backend: &'static str,
        /// The operation.
        what: &'static str,
    },

    /// The backend's store or client library failed.
    #[error("{backend} backend: {context}: {source}")]
    Backend {
        /// Which backend (`"etcd"`, `"zookeeper"`, `"memory"`, ...).
        backend: &'static str,
        /// What fencelock was doing, and what the user can check.
        context: String,
        /// The client library's error.
        #[source]
        source: BoxError,
    },
}

impl Error {
    /// Builds an [`Error::Backend`].
    pub fn backend(
        backend: &'static str,
        context: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::Backend {
            backend,
            context: context.into(),
            source: source.into(),
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

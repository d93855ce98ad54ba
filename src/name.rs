//! Validated lock names and fenced-state keys.

use std::fmt;
use std::sync::Arc;

use crate::{Error, Result};

/// The longest lock name or state key, in bytes.
///
/// Both etcd and ZooKeeper accept far longer keys; this bound keeps keys, paths and log lines
/// readable and leaves room for the backend's prefix.
pub const MAX_NAME_LEN: usize = 200;

const RULE: &str = "is 1 to 200 bytes without '/', NUL or control characters, and does not \
                    start with '.' (reserved for fencelock's bookkeeping)";

fn validate(name: &str) -> Result<()> {
    let invalid = |reason| {
        Err(Error::InvalidName {
            name: name.to_owned(),
            reason,
            rule: RULE,
        })
    };
    if name.is_empty() {
        return invalid("it is empty");
    }
    if name.len() > MAX_NAME_LEN {
        return invalid("it is longer than 200 bytes");
    }
    if name.contains('/') {
        // `a` and `a/b` would share the etcd prefix `a/` and the ZooKeeper subtree `a`.
        return invalid("it contains '/', which would make nested names collide");
    }
    if name.chars().any(char::is_control) {
        return invalid("it contains NUL or a control character");
    }
    if name.starts_with('.') {
        // Covers `.` and `..` (path segments) and keeps `.state` free for fenced state.
        return invalid("it starts with '.'");
    }
    Ok(())
}

/// The name of a lock: 1 to [`MAX_NAME_LEN`] bytes, no `/`, no NUL or control characters, and no
/// leading `.` (which also rules out `.` and `..`).
///
/// Because `/` is refused, no lock's keys can fall under another lock's prefix.
///
/// ```
/// use fencelock::LockName;
/// assert!(LockName::new("billing-run").is_ok());
/// assert!(LockName::new("a/b").is_err());
/// assert!(LockName::new("..").is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
// Shared, not copied: a name is cloned into every guard, request and per-name turn.
pub struct LockName(Arc<str>);

impl LockName {
    /// Validates a name.
    ///
    /// # Errors
    /// [`Error::InvalidName`] saying which rule the name breaks.
    pub fn new(name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        validate(&name)?;
        Ok(LockName(Arc::from(name)))
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for LockName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl TryFrom<&str> for LockName {
    type Error = Error;
    fn try_from(value: &str) -> Result<Self> {
        LockName::new(value)
    }
}

impl TryFrom<String> for LockName {
    type Error = Error;
    fn try_from(value: String) -> Result<Self> {
        LockName::new(value)
    }
}

/// The key of a small value kept next to a lock (fenced state); same rules as [`LockName`].
///
/// Keys starting with `__` are reserved (the checkpoint lives under one).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StateKey(String);

impl StateKey {
    /// Validates a key.
    ///
    /// # Errors
    /// [`Error::InvalidName`] when the key breaks a [`LockName`] rule or starts with `__`.
    pub fn new(key: impl Into<String>) -> Result<Self> {
        let key = key.into();
        validate(&key)?;
        if key.starts_with("__") {
            return Err(Error::InvalidName {
                name: key,
                reason: "keys starting with \"__\" are reserved",
                rule: "does not start with \"__\"",
            });
        }
        Ok(StateKey(key))
    }

    /// The reserved key under which [`LockGuard::checkpoint`](crate::LockGuard::checkpoint)
    /// stores progress.
    pub fn checkpoint() -> Self {
        StateKey("__checkpoint".to_owned())
    }

    /// The key as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for StateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_each_rule_with_a_typed_error() {
        for bad in ["", "a/b", "/", "a\0b", "tab\there", ".", "..", ".hidden"] {
            match LockName::new(bad) {
                Err(Error::InvalidName { name, .. }) => assert_eq!(name, bad),
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
        assert!(LockName::new("x".repeat(MAX_NAME_LEN)).is_ok());
        assert!(LockName::new("x".repeat(MAX_NAME_LEN + 1)).is_err());
        assert!(LockName::new("jobs:nightly-ü.1").is_ok());
    }

    #[test]
    fn state_keys_reserve_double_underscore() {
        assert!(StateKey::new("counter").is_ok());
        assert!(StateKey::new("__checkpoint").is_err());
        assert_eq!(StateKey::checkpoint().as_str(), "__checkpoint");
    }
}

//! The fencing token.

use std::fmt;
use std::str::FromStr;

/// A number that grows with every acquisition of a lock.
///
/// A protected resource remembers the highest token it has accepted and refuses writes that carry
/// a lower one (see [`Fence`](crate::Fence)). That turns a lease, which a paused holder can outlive
/// without noticing, into a lock that cannot corrupt anything.
///
/// Tokens are comparable only between acquisitions of **the same lock on the same cluster**: the
/// etcd backend uses the lock key's create revision, the ZooKeeper backend the lock node's czxid,
/// the memory backend a per-store counter. Each new acquisition's token is strictly greater than
/// every earlier acquisition's token of that lock. Tokens of two different locks, or from two
/// clusters, say nothing about each other.
///
/// ```
/// use fencelock::FencingToken;
/// let older = FencingToken::new(41);
/// let newer: FencingToken = "42".parse().unwrap();
/// assert!(older < newer);
/// assert_eq!(newer.to_string(), "42");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token (for example one read from an environment variable or a header).
    pub const fn new(value: u64) -> Self {
        FencingToken(value)
    }

    /// The raw number, to store next to protected data (an SQL column, a header).
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl FromStr for FencingToken {
    type Err = std::num::ParseIntError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.trim().parse().map(FencingToken)
    }
}

impl From<u64> for FencingToken {
    fn from(value: u64) -> Self {
        FencingToken(value)
    }
}

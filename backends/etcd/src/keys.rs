//! Where things live in etcd's key space.
//!
//! - lock `N` under prefix `P`: contenders' keys `P N "/" <lease id, lowercase hex>`, exactly as
//!   Go's `concurrency.NewMutex(session, P+N)` and `etcdctl lock P+N` write them;
//! - semaphore `N`: a gate, which is a Go Mutex at `P N "/locks/"`, and permit keys
//!   `P N "/leases/" <lease hex> "-" <gate key's create revision, hex>`;
//! - reader-writer lock `N`: a reader's key `P N "/read/" <lease hex> "-" <nonce hex>`, a
//!   writer's `P N "/write/" ...` (the layout of etcd's `recipes.RWMutex`), one key per attempt;
//! - fenced state of lock `N`: `P ".state/" N "/" <key>`. Lock names never start with `.`, so no
//!   contender's prefix scan (`P N "/"`) can ever see a state key.

use std::fmt::Write as _;
use std::sync::Arc;

use fencelock::{Access, LockName, StateKey};

/// Where one queue lives: the key a contender writes, the range it scans, and the checkpoint
/// its grant reads.
#[derive(Clone, Debug)]
pub(crate) struct QueueAt {
    pub(crate) prefix: String,
    pub(crate) key: String,
    pub(crate) checkpoint: String,
}

/// Cloned into every held lock, so the prefix is shared rather than copied.
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    prefix: Arc<str>,
}

impl Keys {
    pub(crate) fn new(prefix: &str) -> Self {
        Keys {
            prefix: Arc::from(prefix),
        }
    }

    /// The range every contender of `name` scans: `P N /`.
    pub(crate) fn lock_prefix(&self, name: &LockName) -> String {
        self.under(name, "/")
    }

    /// `P N` followed by `tail`, in one allocation: `format!` grows its buffer several times
    /// per key, built on every acquire (callgrind, `bench/cpu-profile`).
    fn under(&self, name: &LockName, tail: &str) -> String {
        [&*self.prefix, name.as_str(), tail].concat()
    }

    /// Where the lock `name`'s queue lives, for this session.
    pub(crate) fn lock_queue(&self, name: &LockName, lease: i64) -> QueueAt {
        let prefix = self.lock_prefix(name);
        QueueAt {
            key: lease_key(&prefix, lease),
            prefix,
            checkpoint: self.state_key(name, &StateKey::checkpoint()),
        }
    }

    /// Where the semaphore `name`'s gate lives, for this session: a Go Mutex at `P N /locks/`.
    pub(crate) fn gate_queue(&self, name: &LockName, lease: i64) -> QueueAt {
        let prefix = self.under(name, "/locks/");
        QueueAt {
            key: lease_key(&prefix, lease),
            prefix,
            checkpoint: self.state_key(name, &StateKey::checkpoint()),
        }
    }

    /// The range of the semaphore `name`'s permit keys: `P N /leases/`.
    pub(crate) fn permits_prefix(&self, name: &LockName) -> String {
        format!("{}leases/", self.lock_prefix(name))
    }

    /// The permit key of the attempt that holds the gate key created at `gate`: unique to the
    /// attempt, so its withdrawal can never touch another permit.
    pub(crate) fn permit_key(&self, name: &LockName, lease: i64, gate: i64) -> String {
        format!("{}{lease:x}-{gate:x}", self.permits_prefix(name))
    }

    /// Where an entry of the reader-writer lock `name` lives: a key of its own, unique to the
    /// attempt (`nonce`), at `P N /read/` or `P N /write/` as in etcd's `recipes.RWMutex`. A
    /// reader scans `P N /write/` for writers ahead of it; a writer scans all of `P N /`.
    pub(crate) fn rw_queue(
        &self,
        name: &LockName,
        access: Access,
        lease: i64,
        nonce: u64,
    ) -> QueueAt {
        let lock = self.lock_prefix(name);
        let side = match access {
            Access::Read => "read/",
            Access::Write => "write/",
        };
        QueueAt {
            key: format!("{lock}{side}{lease:x}-{nonce:016x}"),
            prefix: match access {
                Access::Read => format!("{lock}write/"),
                Access::Write => lock,
            },
            checkpoint: self.state_key(name, &StateKey::checkpoint()),
        }
    }

    /// Whether a key below a lock's prefix (`P N /` stripped) is a reader's or a writer's.
    pub(crate) fn access_of(rest: &[u8]) -> Option<Access> {
        if rest.starts_with(b"read/") {
            Some(Access::Read)
        } else if rest.starts_with(b"write/") {
            Some(Access::Write)
        } else {
            None
        }
    }

    pub(crate) fn state_key(&self, name: &LockName, key: &StateKey) -> String {
        [&*self.prefix, ".state/", name.as_str(), "/", key.as_str()].concat()
    }
}

/// `prefix` followed by the lease id in hex, as Go's Mutex names its key: sized up front.
fn lease_key(prefix: &str, lease: i64) -> String {
    let mut key = String::with_capacity(prefix.len() + 16);
    key.push_str(prefix);
    // Writing to a String cannot fail.
    let _ = write!(key, "{lease:x}");
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_go_mutex() {
        let keys = Keys::new("fencelock/");
        let name = LockName::new("jobs").unwrap();
        assert_eq!(
            keys.lock_queue(&name, 0x694d_7a1b_2c3d).key,
            "fencelock/jobs/694d7a1b2c3d"
        );
        assert_eq!(
            keys.state_key(&name, &StateKey::checkpoint()),
            "fencelock/.state/jobs/__checkpoint"
        );
        let reader = keys.rw_queue(&name, Access::Read, 0x69, 0xab);
        assert_eq!(reader.key, "fencelock/jobs/read/69-00000000000000ab");
        assert_eq!(reader.prefix, "fencelock/jobs/write/");
        let writer = keys.rw_queue(&name, Access::Write, 0x69, 0xab);
        assert_eq!(writer.key, "fencelock/jobs/write/69-00000000000000ab");
        assert_eq!(writer.prefix, keys.lock_prefix(&name));
        // No state key falls in any lock's scan range.
        assert!(!keys
            .state_key(&name, &StateKey::checkpoint())
            .starts_with(&keys.lock_prefix(&name)));
    }
}

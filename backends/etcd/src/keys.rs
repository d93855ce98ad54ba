//! Where things live in etcd's key space.
//!
//! - lock `N` under prefix `P`: contenders' keys `P N "/" <lease id, lowercase hex>`, exactly as
//!   Go's `concurrency.NewMutex(session, P+N)` and `etcdctl lock P+N` write them;
//! - fenced state of lock `N`: `P ".state/" N "/" <key>`. Lock names never start with `.`, so no
//!   contender's prefix scan (`P N "/"`) can ever see a state key.

use fencelock::{LockName, StateKey};

#[derive(Clone, Debug)]
pub(crate) struct Keys {
    prefix: String,
}

impl Keys {
    pub(crate) fn new(prefix: &str) -> Self {
        Keys {
            prefix: prefix.to_owned(),
        }
    }

    /// The range every contender of `name` scans: `P N /`.
    pub(crate) fn lock_prefix(&self, name: &LockName) -> String {
        format!("{}{}/", self.prefix, name)
    }

    /// This session's contender key for `name`.
    pub(crate) fn lock_key(&self, name: &LockName, lease: i64) -> String {
        format!("{}{lease:x}", self.lock_prefix(name))
    }

    pub(crate) fn state_key(&self, name: &LockName, key: &StateKey) -> String {
        format!("{}.state/{}/{}", self.prefix, name, key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_go_mutex() {
        let keys = Keys::new("fencelock/");
        let name = LockName::new("jobs").unwrap();
        assert_eq!(
            keys.lock_key(&name, 0x694d_7a1b_2c3d),
            "fencelock/jobs/694d7a1b2c3d"
        );
        assert_eq!(
            keys.state_key(&name, &StateKey::checkpoint()),
            "fencelock/.state/jobs/__checkpoint"
        );
        // No state key falls in any lock's scan range.
        assert!(!keys
            .state_key(&name, &StateKey::checkpoint())
            .starts_with(&keys.lock_prefix(&name)));
    }
}

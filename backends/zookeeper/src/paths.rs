//! Where things live in ZooKeeper's tree.
//!
//! - lock `N` under base `B`: Curator's lock path `B/N`, whose children are the contenders'
//!   nodes `_c_<uuid>-lock-<10 digit sequence>`, ordered by what follows the last `lock-`;
//! - election `N`: Curator's `LeaderLatch` path `B/N`, whose children are the candidates' nodes
//!   `_c_<uuid>-latch-<sequence>` holding the candidate's value (the latch's participant id),
//!   ordered by what follows the last `latch-`;
//! - semaphore `N`: Curator's `InterProcessSemaphoreV2` at `B/N`: its gate, an
//!   `InterProcessMutex` at `B/N/locks`, and its permits (leases) `B/N/leases/_c_<uuid>-lease-<seq>`;
//!   the data of `B/N/leases` is the count of permits (`3`), written by fencelock;
//! - reader-writer lock `N`: Curator's `InterProcessReadWriteLock` path `B/N`, whose children
//!   are readers' `_c_<uuid>-__READ__<seq>` and writers' `_c_<uuid>-__WRIT__<seq>`, in one
//!   order (what follows either name);
//! - fenced state of lock `N`: `B/.state/N/<key>`. Lock names never start with `.`, so no lock
//!   path, and no child listing of one, can contain state.

use std::sync::Arc;

use fencelock::{Error, LockName, Result, StateKey};

/// Curator's lock name for `InterProcessMutex`.
pub(crate) const LOCK_NAME: &str = "lock-";
/// Curator's lock name for `LeaderLatch`.
pub(crate) const LATCH_NAME: &str = "latch-";
/// Curator's lease name for `InterProcessSemaphoreV2`.
pub(crate) const LEASE_NAME: &str = "lease-";
/// Curator's lock names for the two sides of `InterProcessReadWriteLock`.
pub(crate) const READ_NAME: &str = "__READ__";
/// (`__WRIT__`: eight characters like `__READ__`; Curator 5 spells it so.)
pub(crate) const WRITE_NAME: &str = "__WRIT__";

/// Which Curator recipe a node belongs to: its name, and so its sort key, differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Recipe {
    /// `InterProcessMutex` (and `LeaderSelector`, which is one).
    Mutex,
    /// `LeaderLatch`.
    Latch,
    /// A lease (permit) of `InterProcessSemaphoreV2`.
    Lease,
    /// A reader of `InterProcessReadWriteLock`.
    Read,
    /// A writer of `InterProcessReadWriteLock`.
    Write,
}

impl Recipe {
    fn node_name(self) -> &'static str {
        match self {
            Recipe::Mutex => LOCK_NAME,
            Recipe::Latch => LATCH_NAME,
            Recipe::Lease => LEASE_NAME,
            Recipe::Read => READ_NAME,
            Recipe::Write => WRITE_NAME,
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Paths {
    /// Cloned into every held lock, so shared rather than copied.
    base: Arc<str>,
}

impl Paths {
    pub(crate) fn new(base: &str) -> Self {
        Paths {
            base: Arc::from(base),
        }
    }

    pub(crate) fn lock_dir(&self, name: &LockName) -> String {
        self.under(name, "")
    }

    /// `B/N` followed by `tail`, in one allocation: `format!` grew its buffer four or five
    /// times per path, a tenth of the client's instructions per acquire + release (callgrind).
    fn under(&self, name: &LockName, tail: &str) -> String {
        [&*self.base, "/", name.as_str(), tail].concat()
    }

    /// The prefix of our node: the server appends the sequence number.
    #[cfg(test)]
    pub(crate) fn node_prefix(&self, name: &LockName, id: &str, recipe: Recipe) -> String {
        format!("{}/{}", self.lock_dir(name), node_tag(id, recipe))
    }

    /// The gate of the semaphore `name`: Curator's `InterProcessSemaphoreV2` lock path
    /// `B/N/locks`, an `InterProcessMutex`.
    pub(crate) fn gate_dir(&self, name: &LockName) -> String {
        self.under(name, "/locks")
    }

    /// Where the semaphore `name`'s permits (Curator's leases) live: `B/N/leases`.
    pub(crate) fn leases_dir(&self, name: &LockName) -> String {
        self.under(name, "/leases")
    }

    pub(crate) fn state_dir(&self, name: &LockName) -> String {
        [&*self.base, "/.state/", name.as_str()].concat()
    }

    /// [`state_dir`](Self::state_dir)`/key`, in one allocation.
    pub(crate) fn state(&self, name: &LockName, key: &StateKey) -> String {
        [&*self.base, "/.state/", name.as_str(), "/", key.as_str()].concat()
    }
}

/// A new attempt's id, the uuid in its node's name: encoded straight into a string of its
/// length (`to_string` goes through `Display`, growing its buffer).
pub(crate) fn attempt_id() -> String {
    uuid::Uuid::new_v4()
        .hyphenated()
        .encode_lower(&mut uuid::Uuid::encode_buffer())
        .to_owned()
}

/// The "protected" part of a node name: `_c_<uuid>-lock-` (or `-latch-`), by which a client
/// finds its own node when a create succeeded but the reply was lost.
pub(crate) fn node_tag(id: &str, recipe: Recipe) -> String {
    ["_c_", id, "-", recipe.node_name()].concat()
}

/// Curator's sort key: what follows the last `lock-` (a latch's: `latch-`, a lease's:
/// `lease-`, a reader-writer lock's: `__READ__` or `__WRIT__`), or the whole name.
/// One path holds one recipe's nodes, so whichever of the names comes last is the one.
pub(crate) fn sort_key(child: &str) -> &str {
    let names = [LOCK_NAME, LATCH_NAME, LEASE_NAME, READ_NAME, WRITE_NAME];
    let bytes = child.as_bytes();
    // A sequential node's name: a name, then ZooKeeper's ten digits, which hold no name, so
    // that name is the last one. Five comparisons instead of a scan (a profile of an
    // uncontended acquire put this function at 4% of the client's instructions).
    if let Some(cut) = bytes.len().checked_sub(SEQUENCE_DIGITS) {
        if bytes[cut..].iter().all(u8::is_ascii_digit)
            && names.iter().any(|n| bytes[..cut].ends_with(n.as_bytes()))
        {
            return &child[cut..];
        }
    }
    // The end of the last occurrence of any name is the first end found scanning back, a few
    // bytes from the end for our nodes; five `rfind`s cost more than the rest of a listing.
    // The names are ASCII, so an end is a char boundary.
    (0..=bytes.len())
        .rev()
        .find(|&end| names.iter().any(|n| bytes[..end].ends_with(n.as_bytes())))
        .map_or(child, |end| &child[end..])
}

/// The digits ZooKeeper appends to a sequential node's name.
const SEQUENCE_DIGITS: usize = 10;

/// Whether a child is a reader's or a writer's node of a reader-writer lock.
pub(crate) fn access_of(child: &str) -> Option<fencelock::Access> {
    if child.contains(READ_NAME) {
        Some(fencelock::Access::Read)
    } else if child.contains(WRITE_NAME) {
        Some(fencelock::Access::Write)
    } else {
        None
    }
}

/// Sorts children in Curator's order ([`sort_key`]), computing each key once: a lock path
/// holds a node per waiting acquire, so with a thousand waiters a comparator that recomputed
/// the keys cost milliseconds of CPU per listing (the `many` bench, issue 20).
pub(crate) fn sort_children(children: &mut [String]) {
    children.sort_by_cached_key(|c| sort_key(c).to_owned());
}

/// Whether a contender's sort key shows a sequence number wrapped past 2^31 - 1: ZooKeeper
/// prints it as a negative number (`-2147483648`), which Curator's string order puts *before*
/// every older node, so a newcomer would see itself first while the holder still holds. That
/// takes 2^31 creates under one lock path that is never empty (an empty one is a container
/// that the server removes, which restarts the count); refuse clearly ([`wrapped`]) rather
/// than hand out a second grant.
pub(crate) fn is_wrapped(key: &str) -> bool {
    key.starts_with('-')
}

/// The refusal of a lock path whose `child` has a wrapped sequence number ([`is_wrapped`]).
pub(crate) fn wrapped(dir: &str, child: &str) -> Error {
    Error::protocol(
        crate::KIND,
        format!(
            "lock path {dir}: the sequence number of {child} wrapped past 2^31 - 1, so the \
             order of its contenders is no longer sound; stop every contender and delete \
             {dir} (it is recreated empty)"
        ),
    )
}

/// ZooKeeper refuses some code points in paths that lock names may otherwise contain.
pub(crate) fn check_name(name: &LockName) -> Result<()> {
    let bad = name
        .as_str()
        .chars()
        .any(|c| matches!(c, '\u{e000}'..='\u{f8ff}' | '\u{fff0}'..='\u{ffff}'));
    if bad || name.as_str() == "zookeeper" {
        return Err(Error::InvalidName {
            name: name.to_string(),
            reason: "ZooKeeper paths cannot hold private-use or U+FFF0..U+FFFF characters, nor the name `zookeeper`",
            rule: "uses other characters",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn curator_layout_and_order() {
        let paths = Paths::new("/fencelock");
        let name = LockName::new("jobs").unwrap();
        assert_eq!(
            paths.node_prefix(&name, "u1", Recipe::Mutex),
            "/fencelock/jobs/_c_u1-lock-"
        );
        assert_eq!(
            paths.node_prefix(&name, "u1", Recipe::Latch),
            "/fencelock/jobs/_c_u1-latch-"
        );
        assert_eq!(sort_key("_c_u1-latch-0000000007"), "0000000007");
        assert_eq!(
            paths.state(&name, &StateKey::checkpoint()),
            "/fencelock/.state/jobs/__checkpoint"
        );
        let mut children = vec![
            "_c_b-lock-0000000002",
            "_c_a-lock-0000000010",
            "_c_c-lock-0000000001",
        ];
        children.sort_by_key(|c| sort_key(c));
        assert_eq!(
            children,
            [
                "_c_c-lock-0000000001",
                "_c_b-lock-0000000002",
                "_c_a-lock-0000000010"
            ]
        );
        // A reader-writer lock's readers and writers share one order (Curator's
        // `SortingLockInternalsDriver` strips either name).
        let mut rw = vec!["_c_a-__WRIT__0000000003", "_c_b-__READ__0000000002"];
        rw.sort_by_key(|c| sort_key(c));
        assert_eq!(rw, ["_c_b-__READ__0000000002", "_c_a-__WRIT__0000000003"]);
        // Kazoo-style and unrelated children sort by their whole name, as in Curator.
        assert_eq!(sort_key("x__lock__0000000001"), "x__lock__0000000001");
    }

    /// The backward scan gives what the last match of each name gives (Curator's
    /// `lastIndexOf`), on names with several, none, or non-ASCII text.
    #[test]
    fn sort_key_is_what_follows_the_last_name() {
        let by_rfind = |child: &'static str| -> &'static str {
            [LOCK_NAME, LATCH_NAME, LEASE_NAME, READ_NAME, WRITE_NAME]
                .iter()
                .filter_map(|n| child.rfind(n).map(|i| i + n.len()))
                .max()
                .map_or(child, |i| &child[i..])
        };
        for child in [
            "_c_u-lock-0000000001",
            "_c_lock-lease-0000000002",
            "_c_u-lease-x-lock-0000000003",
            "_c_u-__READ__0000000004",
            "_c_u-__WRIT__-latch-0000000005",
            "é-lock-ü0000000006",
            "lock-",
            "nothing here",
            "",
            "_c_u-lock--2147483648",
            "lock-0000000001",
            "_c_u-lock-12345678901",
            "0000000000",
            "x0000000001",
            "_c_u-lock-lock-0000000001",
            "_c_u-lease-__READ__0000000001",
        ] {
            assert_eq!(sort_key(child), by_rfind(child), "{child:?}");
        }
    }

    /// Names on both sides of the 32-bit wrap: the string order would put the wrapped one
    /// first, so the check refuses it; below the wrap, order and check are fine.
    #[test]
    fn a_wrapped_sequence_is_refused_not_misordered() {
        let before = "_c_a-lock-2147483646".to_owned();
        let last = "_c_b-lock-2147483647".to_owned();
        let wrapped = "_c_c-lock--2147483648".to_owned();
        let mut sane = vec![last.clone(), before.clone()];
        sort_children(&mut sane);
        assert_eq!(sane, [before.clone(), last.clone()]);
        assert!(!sane.iter().any(|c| is_wrapped(sort_key(c))));
        let mut all = vec![before, last, wrapped.clone()];
        sort_children(&mut all);
        assert_eq!(all[0], wrapped, "string order puts the wrapped node first");
        assert!(is_wrapped(sort_key(&all[0])));
        let refused = super::wrapped("/b/n", &all[0]);
        assert!(refused.to_string().contains("wrapped"), "{refused}");
    }
}

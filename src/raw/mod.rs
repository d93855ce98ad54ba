//! For backend authors: the machinery every backend needs, written once.
//!
//! Users of locks never need this module; it is less stable than the crate root (OpenDAL's
//! `raw` has the same status). A backend keeps only its protocol (keys or paths, requests, the
//! wait for its turn) and takes the rest from here:
//!
//! | piece | what it guarantees |
//! |---|---|
//! | [`LeaseClock`] | the local deadline: send time of the last successful renewal + TTL − margin |
//! | [`keep_renewed`] + [`Renew`] | renewals at TTL/3, each one feeding the clock from its *send* time; retries after a failure; loses the clock when the store refuses |
//! | [`SessionSlot`] | one live session per backend instance, opened lazily, replaced after a loss |
//! | [`Enqueued`] + [`Withdraw`] | a cancelled, timed-out or failed acquire leaves nothing behind: its first request runs to the end (in the withdrawal's task if the acquire is dropped), then the entry is withdrawn, retried with backoff until the store answers while the session lives |
//! | [`LocalTurns`] | the tasks of one session take turns per name, FIFO, so a contended name costs the store one entry per instance |
//! | [`SharedTurn`] | a granted turn kept by the guard and the entry's watch, ended by whichever first knows the entry is gone |
//! | [`Withdrawals`] | a new acquire of the same name by the same instance waits for those withdrawals |
//! | [`keep_retrying`] | the background re-delete of a dropped guard, with the same rules |
//! | [`Grant`] | the one way to build a [`LockGuard`](crate::LockGuard) |
//! | [`HeldLock`] | the store half behind a guard |
//! | [`observe_leader`], [`watch_queue`] + [`Watched`] | an election's `observe`, a lock's `watch`: a fresh read after every change, never a stale item after a gap |
//! | [`check_margin`] | the one rule for a TTL and its safety margin |
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use fencelock::raw::LeaseClock;
//! use tokio::time::Instant;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! let ttl = Duration::from_secs(10);
//! let sent = Instant::now(); // just before the lease-grant request goes out
//! let clock: Arc<LeaseClock> = LeaseClock::start(sent, ttl, ttl / 10);
//! assert_eq!(clock.deadline(), sent + Duration::from_secs(9));
//! # }
//! ```

mod enqueued;
mod grant;
mod observe;
mod renew;
mod retry;
mod slot;
mod turns;

use std::time::Duration;

pub use crate::backend::HeldLock;
pub use crate::lease::LeaseClock;
pub use crate::semaphore::check_permits;
pub use crate::withdrawals::{Withdrawal, Withdrawals};
pub use enqueued::{Enqueued, Withdraw};
pub use grant::Grant;
pub use observe::{observe_leader, watch_queue, Watched};
pub use renew::{keep_renewed, Renew, Renewal};
pub use retry::{keep_retrying, spawn_detached, Backoff, Budget};
pub use slot::{Live, SessionSlot};
pub use turns::{LocalTurns, SharedTurn};

use crate::{Error, Result};

/// What an acquire puts in the store's queue: a lock's entry, or an election candidate's, which
/// carries the value the candidate publishes. Backends share one acquire flow for both and
/// differ only in the entry's layout (etcd: the key's value; ZooKeeper: the node's name and
/// data, as Curator's mutex and latch write them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry<'a> {
    /// A lock's entry ([`LockBackend::acquire`](crate::LockBackend::acquire)).
    Lock,
    /// An election candidate's entry, with the value it publishes
    /// ([`LockBackend::acquire_leadership`](crate::LockBackend::acquire_leadership)).
    Candidate(&'a [u8]),
    /// A reader's or a writer's entry of a reader-writer lock
    /// ([`LockBackend::acquire_rw`](crate::LockBackend::acquire_rw)).
    Rw(crate::Access),
}

/// Checks a TTL (or session timeout) and its safety margin: the margin must be below a third
/// of the TTL, or the holder would give the lock up between two renewals.
///
/// # Errors
/// [`Error::InvalidConfig`] naming `margin_field` when it is not.
pub fn check_margin(margin_field: &'static str, ttl: Duration, margin: Duration) -> Result<()> {
    if margin >= ttl / 3 {
        return Err(Error::config(
            margin_field,
            format!(
                "{margin:?} must be less than a third of the ttl ({ttl:?}), or the lock is lost \
                 between renewals"
            ),
        ));
    }
    Ok(())
}

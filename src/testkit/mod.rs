//! The conformance suite every backend must pass (feature `testkit`).
//!
//! A backend's tests implement [`BackendFactory`] and call [`conformance_tests!`](crate::conformance_tests), which makes
//! one `#[tokio::test]` per check:
//!
//! ```ignore
//! struct MyFactory { /* a connection to a test server, a unique prefix */ }
//! #[async_trait::async_trait]
//! impl fencelock::testkit::BackendFactory for MyFactory { /* ... */ }
//!
//! fencelock::conformance_tests!(MyFactory::new().await);
//! ```
//!
//! Each check panics with a message that says which property broke. Every wait is bounded by
//! [`BOUND`], so a broken backend fails instead of hanging. [`cut_off_holder`] is a fault
//! scenario for a backend's own fault tests, apart from the checks.
//!
//! # Panics
//! Every check, and [`cut_off_holder`], panics when its property breaks: that is how it fails
//! the test that calls it. None returns an error.
//!
//! # Cancel safety
//! A check dropped midway (its test timed out) may leave locks held until their leases end;
//! each check uses names of its own, so later checks are not disturbed.
//!
//! Like the [`raw`](crate::raw) module, this is for backend authors and not a stable part of
//! the public API.

mod checks;
mod election;
mod faults;
mod rwlock;
mod semaphore;
mod watch;

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;

pub use checks::*;
pub use election::*;
pub use faults::{cut_off_holder, observe_across_a_gap};
pub use rwlock::*;
pub use semaphore::*;
pub use watch::*;

use crate::{LockBackend, LockName};

/// The longest any single step of a check may take before the check fails.
pub const BOUND: Duration = Duration::from_secs(60);

/// Makes independent backend instances on one store, and breaks them on purpose.
#[async_trait]
pub trait BackendFactory: Send + Sync + 'static {
    /// The backend type under test.
    type Backend: LockBackend + 'static;

    /// A new instance with a session of its own, as a separate process would have.
    async fn connect(&self) -> Self::Backend;

    /// Makes the store end `backend`'s current session (as when its lease expires or the
    /// ensemble expires it). Its guards must then fire `lost`.
    async fn break_session(&self, backend: &Self::Backend);

    /// Deletes the current grant of `name` in the store, behind the holder's back (as an
    /// operator's delete would). The holder is not told.
    async fn steal(&self, name: &LockName);

    /// The lock name to use for `base`; a factory may add a per-test prefix here or in its
    /// backend config.
    fn name(&self, base: &str) -> LockName;
}

/// For interop tests: `status` read while another client (etcdctl, Go, Curator) holds with
/// `foreign_token` and one contender of this process waits. The holder shows as foreign, the
/// waiter names this process.
///
/// # Panics
/// When the status says otherwise.
pub fn assert_foreign_holder_then_ours(status: &crate::LockStatus, foreign_token: u64) {
    assert_eq!(
        status.holder.map(|t| t.get()),
        Some(foreign_token),
        "{status:?}"
    );
    assert_eq!(
        (status.owner.as_ref(), status.queue.len()),
        (None, 2),
        "{status:?}"
    );
    let ours = status.queue[1].owner.as_ref();
    assert_eq!(
        ours.map(crate::Owner::pid),
        Some(std::process::id()),
        "{status:?}"
    );
}

/// Awaits `fut`, failing the check with `what` if it takes longer than [`BOUND`].
///
/// # Panics
/// When `fut` takes longer than [`BOUND`].
///
/// # Cancel safety
/// As cancel-safe as `fut`.
pub async fn bounded<T>(what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(BOUND, fut).await {
        Ok(out) => out,
        Err(_) => panic!("{what}: did not finish within {BOUND:?}"),
    }
}

/// Reads with `read` every 20 ms until `done` holds for the answer, and returns that answer:
/// for a state another task reaches in its own time (a waiter queued), which a fixed pause
/// before one read misses on a busy machine.
///
/// # Panics
/// When `done` does not hold within [`BOUND`], with `what` and the last answer.
pub(crate) async fn until<T, F>(
    what: &str,
    mut read: impl FnMut() -> F,
    done: impl Fn(&T) -> bool,
) -> T
where
    T: std::fmt::Debug,
    F: Future<Output = T>,
{
    let start = tokio::time::Instant::now();
    loop {
        let answer = read().await;
        if done(&answer) {
            return answer;
        }
        if start.elapsed() > BOUND {
            panic!("{what}: still {answer:?} after {BOUND:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `backend`'s [`status`](LockBackend::status) of `name` shows at least `waiting`
/// entries behind the holder; for a backend without `status`, a fixed 300 ms pause instead.
///
/// For a test that must act only once a waiter is in the store (a fixed pause before acting
/// is too short on a busy machine).
///
/// # Panics
/// When the status fails, or does not show them within [`BOUND`].
///
/// # Cancel safety
/// Cancel safe: it only reads.
pub async fn until_queued<B: LockBackend + ?Sized>(
    what: &str,
    backend: &B,
    name: &LockName,
    waiting: usize,
) {
    if let Err(crate::Error::Unsupported { .. }) = backend.status(name).await {
        tokio::time::sleep(Duration::from_millis(300)).await;
        return;
    }
    until(
        what,
        move || async move {
            match backend.status(name).await {
                Ok(status) => status,
                Err(e) => panic!("{what}: status: {e}"),
            }
        },
        |status| status.waiting >= waiting,
    )
    .await;
}

/// Defines one `#[tokio::test]` per conformance check, each with a fresh factory made by
/// evaluating `$factory` (which may `.await`).
#[macro_export]
macro_rules! conformance_tests {
    ($factory:expr) => {
        $crate::conformance_tests!(@each $factory;
            mutual_exclusion, tokens_increase, try_and_timeout, fifo_order, waiter_ahead_gives_up,
            cancelled_acquire_leaves_nothing, release_is_owner_checked, lost_fires_and_run_stops,
            stale_fenced_writes_refused, checkpoint_handed_to_successor, drop_releases,
            try_right_after_own_drop,
            many_locks_on_one_instance, same_instance_contends, invalid_names_rejected,
            fenced_state_round_trip, try_after_own_cancelled_acquire, status_and_list,
            break_lets_the_next_contender_in, close_leaves_nothing_queued,
            election_one_leader_at_a_time,
            election_observe_sees_every_change, election_resign_hands_over_at_once,
            election_session_loss_ends_leadership, election_cancelled_campaign_leaves_nothing,
            watch_sees_acquire_handoff_and_release,
            semaphore_admits_at_most_n, semaphore_grant_leaves_the_way_open, semaphore_lost_permit_returns,
            semaphore_cancelled_acquire_leaves_nothing, semaphore_mismatched_count_refused,
            semaphore_fifo_and_status,
            rw_readers_share_writers_exclude, rw_waiting_writer_holds_back_later_readers,
            rw_lost_reader_lets_the_writer_in,
            rw_cancelled_acquires_leave_nothing_and_writers_stay_alone);
    };
    (@each $factory:expr; $($check:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let factory = $factory;
                $crate::testkit::$check(&factory).await;
            }
        )*
    };
}

#[cfg(test)]
mod tests {
    /// The names `conformance_tests!` runs, and the checks `checks.rs` defines, are the same.
    #[test]
    fn every_check_is_run() {
        let checks = [
            include_str!("checks.rs"),
            include_str!("election.rs"),
            include_str!("watch.rs"),
            include_str!("semaphore.rs"),
            include_str!("rwlock.rs"),
        ]
        .concat();
        let mut defined: Vec<&str> = checks
            .lines()
            .filter_map(|l| l.strip_prefix("pub async fn "))
            .filter(|rest| rest.contains("<F: BackendFactory>"))
            .filter_map(|rest| rest.split('<').next())
            .collect();
        let this = include_str!("mod.rs");
        let list = this
            .split("$crate::conformance_tests!(@each $factory;")
            .nth(1)
            .and_then(|rest| rest.split(");").next())
            .unwrap_or_default();
        let mut listed: Vec<&str> = list
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .collect();
        defined.sort_unstable();
        listed.sort_unstable();
        assert!(defined.len() >= 23, "found only {defined:?}");
        assert_eq!(defined, listed, "conformance_tests! must list every check");
    }
}

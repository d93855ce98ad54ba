//! For backend authors: cancelled acquires being withdrawn in the background
//! ([`Enqueued`](crate::raw::Enqueued) counts them here).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

use crate::{Error, LockName, Result};

/// Counts, per lock name, the withdrawals of cancelled acquires still running in the background
/// (deleting a queue entry whose acquire was dropped or timed out).
///
/// A new acquire of the same name by the same client first waits for them with
/// [`Withdrawals::settled`]: otherwise it would queue behind its own leftover entry and, for a
/// try, report the lock as held by someone else.
#[derive(Debug, Default)]
pub struct Withdrawals {
    names: Mutex<HashMap<LockName, watch::Sender<usize>>>,
}

/// One withdrawal in flight; dropping it marks the withdrawal done.
#[derive(Debug)]
#[must_use = "the withdrawal counts as running until this is dropped"]
pub struct Withdrawal {
    counter: watch::Sender<usize>,
}

impl Withdrawals {
    /// Marks a withdrawal of `name` as started (synchronously, so that it can be called in a
    /// `Drop` before the background task is spawned).
    pub fn begin(&self, name: &LockName) -> Withdrawal {
        let mut names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        names.retain(|_, c| *c.borrow() > 0);
        let counter = names
            .entry(name.clone())
            .or_insert_with(|| watch::channel(0).0)
            .clone();
        counter.send_modify(|n| *n += 1);
        Withdrawal { counter }
    }

    /// Runs `release`, the background release of a dropped guard of `name`, as a withdrawal:
    /// this client's next acquire of the name waits for it (see [`settled`](Self::settled)), so
    /// `drop(guard); backend.try_lock(name)` is not refused by our own entry. Whatever `release`
    /// owns (the held lock, a local turn on the name) is dropped before the withdrawal ends.
    /// Without a Tokio runtime nothing runs (see [`spawn_detached`](crate::raw::spawn_detached)).
    pub fn release_in_background(
        &self,
        backend: &'static str,
        name: &LockName,
        release: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let withdrawal = self.begin(name);
        crate::raw::spawn_detached(backend, "release a dropped guard", async move {
            release.await;
            drop(withdrawal);
        });
    }

    /// Waits until no withdrawal of `name` is running, for at most `limit` (after which the
    /// acquire goes on and, at worst, queues behind the leftover).
    ///
    /// # Cancel safety
    /// Cancel-safe: it only waits.
    pub async fn settled(&self, name: &LockName, limit: Duration) {
        let counter = self
            .names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .map(watch::Sender::subscribe);
        if let Some(mut counter) = counter {
            let _ = tokio::time::timeout(limit, counter.wait_for(|n| *n == 0)).await;
        }
    }
}

impl Withdrawals {
    /// Passes on an acquire's `outcome`, first waiting (at most `limit`) for the withdrawals of
    /// `name` when it was refused ([`Error::WouldBlock`]) or timed out ([`Error::Timeout`]).
    ///
    /// So a refused or timed-out acquire has visibly taken nothing when it returns, as Go's
    /// `Mutex.Lock` and Curator's `acquire(time)` delete their entry before returning: a
    /// `status` or another client's try right after it does not find it queued (a writer's
    /// lingering entry would refuse another client's reader). A timed-out acquire may so
    /// return up to `limit` after its wait.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only waits; the withdrawals go on.
    pub async fn settle_refusal<T>(
        &self,
        name: &LockName,
        limit: Duration,
        outcome: Result<T>,
    ) -> Result<T> {
        if matches!(
            outcome,
            Err(Error::WouldBlock { .. } | Error::Timeout { .. })
        ) {
            self.settled(name, limit).await;
        }
        outcome
    }

    /// Waits until no withdrawal of any name is running, for at most `limit` in all (before a
    /// session is closed, so that a process exiting right after a cancelled acquire leaves
    /// nothing queued).
    ///
    /// # Cancel safety
    /// Cancel-safe: it only waits.
    pub async fn all_settled(&self, limit: Duration) {
        let counters: Vec<_> = self
            .names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .map(watch::Sender::subscribe)
            .collect();
        let _ = tokio::time::timeout(limit, async {
            for mut counter in counters {
                let _ = counter.wait_for(|n| *n == 0).await;
            }
        })
        .await;
    }
}

impl Drop for Withdrawal {
    fn drop(&mut self) {
        self.counter.send_modify(|n| *n = n.saturating_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn settled_waits_for_every_withdrawal_of_the_name() {
        let withdrawals = std::sync::Arc::new(Withdrawals::default());
        let name = LockName::new("a").unwrap();
        let (one, two) = (withdrawals.begin(&name), withdrawals.begin(&name));
        let other = LockName::new("b").unwrap();
        withdrawals.settled(&other, Duration::from_secs(60)).await; // nothing to wait for
        let waiter = {
            let (w, name) = (std::sync::Arc::clone(&withdrawals), name.clone());
            tokio::spawn(async move { w.settled(&name, Duration::from_secs(60)).await })
        };
        drop(one);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(two);
        waiter.await.unwrap();
        assert_eq!(tokio::time::Instant::now().elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_refusal_or_a_timeout_waits_for_the_withdrawals() {
        let withdrawals = std::sync::Arc::new(Withdrawals::default());
        let name = LockName::new("a").unwrap();
        let pending = withdrawals.begin(&name);
        let limit = Duration::from_secs(60);
        let start = tokio::time::Instant::now();
        let granted = withdrawals.settle_refusal(&name, limit, Ok(7)).await;
        assert_eq!((granted.unwrap(), start.elapsed()), (7, Duration::ZERO));
        let lost = Err::<(), _>(Error::lost(&name));
        let lost = withdrawals.settle_refusal(&name, limit, lost).await;
        assert!(matches!(lost, Err(Error::LockLost { .. })), "{lost:?}");
        assert_eq!(start.elapsed(), Duration::ZERO);
        let ends = async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            drop(pending);
        };
        let refused = Err::<(), _>(Error::would_block(&name));
        let (refused, ()) = tokio::join!(withdrawals.settle_refusal(&name, limit, refused), ends);
        assert!(
            matches!(refused, Err(Error::WouldBlock { .. })),
            "{refused:?}"
        );
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        let stuck = withdrawals.begin(&name);
        let timed = Err::<(), _>(Error::Timeout {
            name: name.to_string(),
            waited: Duration::from_secs(1),
        });
        let timed = withdrawals.settle_refusal(&name, limit, timed).await;
        assert!(matches!(timed, Err(Error::Timeout { .. })), "{timed:?}");
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(62),
            "bounded by the limit"
        );
        drop(stuck);
    }
}

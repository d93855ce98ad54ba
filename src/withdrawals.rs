//! For backend authors: cancelled acquires being withdrawn in the background
//! ([`Enqueued`](crate::raw::Enqueued) counts them here).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

use crate::LockName;

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
}

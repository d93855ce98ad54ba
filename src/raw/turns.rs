//! [`LocalTurns`]: the tasks of one session take turns per lock name before touching the store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};
use tokio_util::sync::CancellationToken;

use crate::{Error, LockName, Result};

/// Per-name turns among the tasks of one session, FIFO: only the task whose turn it is has an
/// entry in the store's queue, so K tasks of one process contending for a name cost the store
/// one entry, and a handover between them wakes and lists no other waiter (it costs the next
/// task one acquire's requests). etcd needs it (a
/// session's key for a name is one key); ZooKeeper uses it so that a contended name is listed
/// with one node per instance, not per task.
///
/// A turn is held from before the first request until the entry is gone: kept in the
/// withdrawal of an acquire that did not end in a guard, then, once granted, where the
/// backend learns that the entry is gone (etcd: the guard's store half and the key's watch,
/// through a [`SharedTurn`]; ZooKeeper: the node's watch).
///
/// ```
/// # use fencelock::{LockName, Result};
/// # use fencelock::raw::LocalTurns;
/// # use tokio_util::sync::CancellationToken;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<()> {
/// let (turns, session_over) = (LocalTurns::default(), CancellationToken::new());
/// let name = LockName::new("job")?;
/// let mine = turns.take(&name, false, &session_over).await?;
/// assert!(turns.take(&name, true, &session_over).await.is_err(), "a try does not wait");
/// drop(mine);
/// let _next = turns.take(&name, true, &session_over).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Default)]
pub struct LocalTurns {
    queues: Mutex<Queues>,
}

#[derive(Debug, Default)]
struct Queues {
    by_name: HashMap<LockName, Weak<AsyncMutex<()>>>,
    /// Names no task waits on are swept out when the map reaches this size (then twice what
    /// is left): amortised, where a sweep at every new name made taking many names quadratic.
    sweep_at: usize,
}

impl LocalTurns {
    /// Waits for this session's turn on `name` (FIFO among its tasks).
    ///
    /// # Errors
    /// [`Error::WouldBlock`] for a try (`try_once`) while another task has the turn;
    /// [`Error::LockLost`] once `session_over` fires.
    ///
    /// # Cancel safety
    /// Cancel-safe: a dropped wait leaves its place in the queue and takes nothing.
    pub async fn take(
        &self,
        name: &LockName,
        try_once: bool,
        session_over: &CancellationToken,
    ) -> Result<OwnedMutexGuard<()>> {
        let queue = self.queue(name);
        if try_once {
            return queue.try_lock_owned().map_err(|_| Error::would_block(name));
        }
        tokio::select! {
            turn = queue.lock_owned() => Ok(turn),
            () = session_over.cancelled() => Err(Error::lost(name)),
        }
    }

    fn queue(&self, name: &LockName) -> Arc<AsyncMutex<()>> {
        let mut queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(queue) = queues.by_name.get(name).and_then(Weak::upgrade) {
            return queue;
        }
        if queues.by_name.len() >= queues.sweep_at {
            queues.by_name.retain(|_, q| q.strong_count() > 0);
            queues.sweep_at = (queues.by_name.len() * 2).max(64);
        }
        let queue = Arc::new(AsyncMutex::new(()));
        queues.by_name.insert(name.clone(), Arc::downgrade(&queue));
        queue
    }

    /// How many names the map keeps, for tests.
    #[cfg(test)]
    fn kept(&self) -> usize {
        self.queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .by_name
            .len()
    }
}

/// A granted turn kept by two holders, the guard's store half and the session's watch on the
/// entry: it ends as soon as either holder ends it ([`SharedTurn::end`]), or once both are
/// dropped; a holder that must end it when it goes calls `end` in its own `Drop`. The guard's
/// half ends it once its release is done, as a turn kept by the guard alone did; the watch's
/// half ends it when it sees the entry deleted, which is earlier when an operator
/// deleted the entry (`fencelock break`): a turn kept only by the guard made the next task of
/// the instance wait until the lost guard was dropped, where another instance's task
/// proceeds at once.
///
/// ```
/// # use fencelock::{LockName, Result};
/// # use fencelock::raw::{LocalTurns, SharedTurn};
/// # use tokio_util::sync::CancellationToken;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<()> {
/// let (turns, session_over) = (LocalTurns::default(), CancellationToken::new());
/// let name = LockName::new("job")?;
/// let guards_half = SharedTurn::new(turns.take(&name, false, &session_over).await?);
/// let watchs_half = guards_half.clone();
/// watchs_half.end(); // the watch saw the entry deleted
/// let _next = turns.take(&name, true, &session_over).await?; // while the guard's half lives
/// # drop(guards_half);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct SharedTurn(Arc<Mutex<Option<OwnedMutexGuard<()>>>>);

impl SharedTurn {
    /// A turn from [`LocalTurns::take`], to be cloned to its second holder.
    #[must_use]
    pub fn new(turn: OwnedMutexGuard<()>) -> Self {
        SharedTurn(Arc::new(Mutex::new(Some(turn))))
    }

    /// Ends the turn now, for both holders: the next task of the instance may queue.
    pub fn end(&self) {
        let turn = self.0.lock().unwrap_or_else(PoisonError::into_inner).take();
        drop(turn);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_shared_turn_lasts_while_either_half_lives_unless_ended() {
        let (turns, over) = (LocalTurns::default(), CancellationToken::new());
        let name = LockName::new("job").unwrap();
        let guards = SharedTurn::new(turns.take(&name, false, &over).await.unwrap());
        let watchs = guards.clone();
        drop(watchs); // a watch that ended without seeing the entry go
        assert!(turns.take(&name, true, &over).await.is_err(), "still held");
        drop(guards);
        let again = SharedTurn::new(turns.take(&name, true, &over).await.unwrap());
        let other = again.clone();
        other.end();
        assert!(
            turns.take(&name, true, &over).await.is_ok(),
            "ended by one half"
        );
        again.end(); // ending twice is harmless
    }

    #[tokio::test]
    async fn tasks_take_turns_in_order_and_a_try_does_not_wait() {
        let turns = Arc::new(LocalTurns::default());
        let over = CancellationToken::new();
        let name = LockName::new("job").unwrap();
        let first = turns.take(&name, false, &over).await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiting = Vec::new();
        for i in 0..3 {
            let (turns, over, name, order) = (
                Arc::clone(&turns),
                over.clone(),
                name.clone(),
                Arc::clone(&order),
            );
            waiting.push(tokio::spawn(async move {
                let _turn = turns.take(&name, false, &over).await.unwrap();
                order.lock().unwrap().push(i);
            }));
            tokio::time::sleep(Duration::from_millis(10)).await; // queued in this order
        }
        assert!(matches!(
            turns.take(&name, true, &over).await,
            Err(Error::WouldBlock { .. })
        ));
        let other = LockName::new("other").unwrap();
        drop(turns.take(&other, true, &over).await.unwrap()); // names are independent
        drop(first);
        for task in waiting {
            task.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), [0, 1, 2]);
    }

    #[tokio::test]
    async fn the_session_s_end_ends_the_wait() {
        let (turns, over) = (LocalTurns::default(), CancellationToken::new());
        let name = LockName::new("job").unwrap();
        let _held = turns.take(&name, false, &over).await.unwrap();
        over.cancel();
        assert!(matches!(
            turns.take(&name, false, &over).await,
            Err(Error::LockLost { .. })
        ));
    }

    /// Names nobody waits on are swept out, and not at every new name.
    #[tokio::test]
    async fn unused_names_are_swept_out_in_amortised_passes() {
        let (turns, over) = (LocalTurns::default(), CancellationToken::new());
        let mut held = Vec::new();
        for i in 0..1000 {
            let name = LockName::new(format!("n{i}")).unwrap();
            let turn = turns.take(&name, true, &over).await.unwrap();
            if i % 2 == 0 {
                held.push(turn);
            }
        }
        assert!(turns.kept() < 1000, "swept: {}", turns.kept());
        assert!(turns.kept() >= held.len(), "the held names stay");
        drop(held);
        for i in 0..3000 {
            let name = LockName::new(format!("m{i}")).unwrap();
            drop(turns.take(&name, true, &over).await.unwrap());
        }
        assert!(
            turns.kept() <= 64,
            "{} kept once nothing is held",
            turns.kept()
        );
    }
}

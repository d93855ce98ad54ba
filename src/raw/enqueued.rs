//! [`Enqueued`]: the first request of an acquire, and its withdrawal if the acquire does not
//! end in a guard.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;

use futures::FutureExt;
use tokio::task::JoinHandle;

use crate::raw::{spawn_detached, Backoff, Withdrawals};
use crate::{Error, LockName, Result};

/// How a backend removes the queue entry of an acquire that did not end in a guard.
pub trait Withdraw<T>: Send + 'static {
    /// The backend kind, for errors and logs (as [`LockBackend::kind`](crate::LockBackend::kind)).
    const BACKEND: &'static str;

    /// Removes what the first request wrote. `first` is its reply when it returned one (so the
    /// removal can compare what identifies *this* attempt, such as a create revision); `None`
    /// when it failed, and the entry may or may not exist. `Ok` means the store gave a definite
    /// answer: the entry was removed, or there is none.
    fn withdraw(&mut self, first: Option<&T>) -> impl Future<Output = Result<()>> + Send;

    /// While true, a failed withdrawal is retried. Once the session is gone the store removes
    /// its entries itself.
    fn session_alive(&self) -> bool;
}

/// The first request of an acquire (the one that writes the queue entry), and the undo if the
/// acquire fails, times out or is dropped before it is disarmed.
///
/// The request runs in the acquire's own task while [`reply`](Self::reply) is awaited (a task
/// of its own cost every acquire a spawn and a cross-task wake-up); if the acquire is dropped
/// with the request in flight, the request goes on in the withdrawal's task. The undo waits
/// for the first request to finish, so a write still in flight cannot land after it, then
/// calls [`Withdraw::withdraw`] until the store answers (retried with [`Backoff`] while the
/// session lives and the error is retryable). It is counted in
/// [`Withdrawals`] from the moment the acquire is dropped until that answer, and `W` is dropped
/// only then, so a per-name turn kept in `W` is held until the entry is gone.
///
/// ```
/// # use std::sync::Arc;
/// # use fencelock::{LockName, Result};
/// # use fencelock::raw::{Enqueued, Withdraw, Withdrawals};
/// struct Undo;
/// impl Withdraw<u64> for Undo {
///     const BACKEND: &'static str = "mine";
///     async fn withdraw(&mut self, first: Option<&u64>) -> Result<()> {
///         let _ = first; // delete the entry, comparing what identifies this attempt
///         Ok(())
///     }
///     fn session_alive(&self) -> bool { true }
/// }
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<()> {
/// let withdrawals = Arc::new(Withdrawals::default());
/// let name = LockName::new("job")?;
/// let mut pending = Enqueued::new(&withdrawals, &name, async { Ok(42u64) }, Undo);
/// let position = *pending.reply().await?;
/// // ... wait for the turn; any `?` from here on withdraws the entry ...
/// let (_undo, _reply) = pending.disarm(); // granted: keep the entry
/// # assert_eq!(position, 42); Ok(()) }
/// ```
#[must_use = "dropping it withdraws the entry at once"]
pub struct Enqueued<T: Send + 'static, W: Withdraw<T>> {
    /// Boxed so that a half-polled request can move into the withdrawal's task.
    first: Option<Pin<Box<dyn Future<Output = Result<T>> + Send>>>,
    reply: Option<T>,
    armed: Option<Armed<W>>,
}

struct Armed<W> {
    withdraw: W,
    withdrawals: Arc<Withdrawals>,
    name: LockName,
}

impl<T: Send + 'static, W: Withdraw<T>> Enqueued<T, W> {
    /// Takes `first` (not polled until [`reply`](Self::reply)) and arms the withdrawal.
    ///
    /// The withdrawal is spawned on the current Tokio runtime when this is dropped armed;
    /// outside a runtime it cannot run, is logged as a warning, and the entry is left to the
    /// session's end.
    pub fn new(
        withdrawals: &Arc<Withdrawals>,
        name: &LockName,
        first: impl Future<Output = Result<T>> + Send + 'static,
        withdraw: W,
    ) -> Self {
        Enqueued {
            first: Some(Box::pin(first)),
            reply: None,
            armed: Some(Armed {
                withdraw,
                withdrawals: Arc::clone(withdrawals),
                name: name.clone(),
            }),
        }
    }

    /// The first request's reply, once it has finished (the same reply on every call).
    ///
    /// # Errors
    /// The first request's error (the entry is then withdrawn when this is dropped).
    ///
    /// # Cancel safety
    /// Cancel-safe: the request is kept where it was, and a later call (or the withdrawal,
    /// which runs it to its end) goes on with it.
    pub async fn reply(&mut self) -> Result<&T> {
        if let Some(first) = self.first.as_mut() {
            // A panic in the request is an error here, as it was when the request ran in a task
            // of its own; and the panicked future is not kept, so no one polls it again.
            let out = AssertUnwindSafe(first.as_mut()).catch_unwind().await;
            self.first = None;
            let out = out.map_err(|_| Error::internal(W::BACKEND, "the first request panicked"))?;
            self.reply = Some(out?);
        }
        self.reply.as_ref().ok_or_else(|| {
            Error::internal(W::BACKEND, "the first request's reply was already taken")
        })
    }

    /// The acquire was granted: keep the entry. Returns the withdrawal (with whatever it kept,
    /// such as a per-name turn) and the first reply.
    pub fn disarm(mut self) -> (Option<W>, Option<T>) {
        (
            self.armed.take().map(|armed| armed.withdraw),
            self.reply.take(),
        )
    }
}

impl<T: Send + 'static, W: Withdraw<T>> Enqueued<T, W> {
    /// Withdraws the entry now and waits (at most `limit`) until the store has answered, so
    /// that a refused acquire has visibly taken nothing when it returns. The withdrawal is the
    /// one dropping would run, in its own task, so it goes on if this wait is cut short.
    ///
    /// # Cancel safety
    /// Cancel-safe: the withdrawal goes on in its task.
    pub async fn withdraw_now(mut self, limit: std::time::Duration) {
        if let Some(task) = self.start_withdrawal() {
            let _ = tokio::time::timeout(limit, task).await;
        }
    }

    fn start_withdrawal(&mut self) -> Option<JoinHandle<()>> {
        let Armed {
            mut withdraw,
            withdrawals,
            name,
        } = self.armed.take()?;
        // Counted synchronously, before the task runs: a new acquire of the name by this
        // instance must already see it.
        let withdrawal = withdrawals.begin(&name);
        let (first, reply) = (self.first.take(), self.reply.take());
        spawn_detached(W::BACKEND, "withdraw a cancelled acquire", async move {
            let reply = match first {
                Some(first) => AssertUnwindSafe(first)
                    .catch_unwind()
                    .await
                    .ok()
                    .and_then(Result::ok),
                None => reply,
            };
            let mut backoff = Backoff::new();
            // Ends with a definite answer, a non-retryable error, or the session's end.
            loop {
                match withdraw.withdraw(reply.as_ref()).await {
                    Ok(()) => {
                        tracing::debug!(backend = W::BACKEND, lock = %name, "cancelled acquire withdrawn");
                        break;
                    }
                    Err(e) if Backoff::should_retry(&e, withdraw.session_alive()) => {
                        tracing::debug!(backend = W::BACKEND, lock = %name, error = %e, "withdrawal failed; retrying");
                        backoff.pause().await;
                    }
                    Err(e) => {
                        tracing::warn!(backend = W::BACKEND, lock = %name, error = %e, "could not withdraw a cancelled acquire; its entry ends with the session");
                        break;
                    }
                }
            }
            drop(withdraw);
            drop(withdrawal);
        })
    }
}

impl<T: Send + 'static, W: Withdraw<T>> Drop for Enqueued<T, W> {
    fn drop(&mut self) {
        drop(self.start_withdrawal());
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;

    /// When each withdrawal ran, and the reply it was given.
    type Calls = Arc<std::sync::Mutex<Vec<(Duration, Option<u64>)>>>;

    #[derive(Clone, Default)]
    struct Log {
        calls: Calls,
        fail_first: Arc<AtomicUsize>,
        alive: Arc<AtomicBool>,
        dropped: Arc<AtomicBool>,
    }

    struct Undo {
        log: Log,
        start: Instant,
    }

    impl Withdraw<u64> for Undo {
        const BACKEND: &'static str = "test";

        async fn withdraw(&mut self, first: Option<&u64>) -> Result<()> {
            self.log
                .calls
                .lock()
                .unwrap()
                .push((Instant::now() - self.start, first.copied()));
            if self.log.fail_first.load(Ordering::SeqCst) > 0 {
                self.log.fail_first.fetch_sub(1, Ordering::SeqCst);
                return Err(Error::unavailable("test", "no answer", None));
            }
            Ok(())
        }
        fn session_alive(&self) -> bool {
            self.log.alive.load(Ordering::SeqCst)
        }
    }

    impl Drop for Undo {
        fn drop(&mut self) {
            self.log.dropped.store(true, Ordering::SeqCst);
        }
    }

    fn undo(log: &Log) -> Undo {
        log.alive.store(true, Ordering::SeqCst);
        Undo {
            log: log.clone(),
            start: Instant::now(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_drop_waits_for_the_first_request_then_withdraws_with_its_reply() {
        let (log, withdrawals) = (Log::default(), Arc::new(Withdrawals::default()));
        let name = LockName::new("job").unwrap();
        let first = async {
            tokio::time::sleep(Duration::from_secs(1)).await; // still in flight at the drop
            Ok(7u64)
        };
        drop(Enqueued::new(&withdrawals, &name, first, undo(&log)));
        // The withdrawal counts from the drop, before its task ran.
        let settled = tokio::time::timeout(
            Duration::from_millis(500),
            withdrawals.settled(&name, Duration::from_secs(60)),
        );
        assert!(
            settled.await.is_err(),
            "not settled while the first request runs"
        );
        withdrawals.settled(&name, Duration::from_secs(60)).await;
        let calls = log.calls.lock().unwrap().clone();
        assert_eq!(calls, [(Duration::from_secs(1), Some(7))]);
        assert!(log.dropped.load(Ordering::SeqCst));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_withdrawal_is_retried_and_keeps_the_turn_until_it_succeeds() {
        let (log, withdrawals) = (Log::default(), Arc::new(Withdrawals::default()));
        let name = LockName::new("job").unwrap();
        log.fail_first.store(3, Ordering::SeqCst);
        let first = async { Err::<u64, _>(Error::unavailable("test", "timed out", None)) };
        let mut pending = Enqueued::new(&withdrawals, &name, first, undo(&log));
        assert!(pending.reply().await.is_err());
        drop(pending);
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(
            !log.dropped.load(Ordering::SeqCst),
            "W (the turn) is kept while retrying"
        );
        withdrawals.settled(&name, Duration::from_secs(60)).await;
        let at: Vec<u128> = log
            .calls
            .lock()
            .unwrap()
            .iter()
            .map(|c| c.0.as_millis())
            .collect();
        assert_eq!(at, [0, 100, 300, 700], "backoff 100, 200, 400 ms");
        assert!(log.calls.lock().unwrap().iter().all(|c| c.1.is_none()));
        assert!(log.dropped.load(Ordering::SeqCst));
    }

    #[tokio::test(start_paused = true)]
    async fn retries_stop_when_the_session_ends() {
        let (log, withdrawals) = (Log::default(), Arc::new(Withdrawals::default()));
        let name = LockName::new("job").unwrap();
        log.fail_first.store(usize::MAX, Ordering::SeqCst);
        let pending = Enqueued::new(&withdrawals, &name, async { Ok(1u64) }, undo(&log));
        drop(pending);
        tokio::time::sleep(Duration::from_millis(150)).await;
        log.alive.store(false, Ordering::SeqCst);
        withdrawals.settled(&name, Duration::from_secs(60)).await;
        assert_eq!(log.calls.lock().unwrap().len(), 3); // 0, 100, then 300 ms finds it gone
        assert!(log.dropped.load(Ordering::SeqCst));
    }

    #[tokio::test(start_paused = true)]
    async fn disarmed_it_withdraws_nothing() {
        let (log, withdrawals) = (Log::default(), Arc::new(Withdrawals::default()));
        let name = LockName::new("job").unwrap();
        let mut pending = Enqueued::new(&withdrawals, &name, async { Ok(3u64) }, undo(&log));
        assert_eq!(*pending.reply().await.unwrap(), 3);
        let (w, reply) = pending.disarm();
        assert_eq!(reply, Some(3));
        drop(w);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(log.calls.lock().unwrap().is_empty());
    }

    /// The request runs inline while `reply` is awaited: a `reply` cut short keeps it where it
    /// was, a later `reply` finishes it, and a drop with it half-done finishes it in the
    /// withdrawal (which then sees its reply), sent once in all.
    #[tokio::test(start_paused = true)]
    async fn a_half_done_request_is_finished_by_the_next_reply_or_by_the_withdrawal() {
        let (log, withdrawals) = (Log::default(), Arc::new(Withdrawals::default()));
        let name = LockName::new("job").unwrap();
        let sent = Arc::new(AtomicUsize::new(0));
        let request = |sent: Arc<AtomicUsize>| async move {
            sent.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok(7u64)
        };

        let mut pending =
            Enqueued::new(&withdrawals, &name, request(Arc::clone(&sent)), undo(&log));
        let cut = tokio::time::timeout(Duration::from_millis(400), pending.reply()).await;
        assert!(cut.is_err(), "the request takes a second");
        assert_eq!(*pending.reply().await.unwrap(), 7);
        let (_w, _) = pending.disarm();
        assert_eq!(sent.load(Ordering::SeqCst), 1);

        let start = Instant::now();
        let mut pending =
            Enqueued::new(&withdrawals, &name, request(Arc::clone(&sent)), undo(&log));
        let cut = tokio::time::timeout(Duration::from_millis(400), pending.reply()).await;
        assert!(cut.is_err());
        drop(pending);
        withdrawals.settled(&name, Duration::from_secs(60)).await;
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(1),
            "withdrawn once the request ended"
        );
        let calls = log.calls.lock().unwrap().clone();
        assert_eq!(calls.len(), 1);
        assert_eq!(
            calls[0].1,
            Some(7),
            "the withdrawal is given the request's reply"
        );
        assert_eq!(sent.load(Ordering::SeqCst), 2, "each request sent once");
    }

    /// A first request that panics is an error of `reply`, and the withdrawal still runs (with
    /// no reply), without polling the panicked request again.
    #[tokio::test(start_paused = true)]
    async fn a_panicking_request_is_an_error_and_still_withdrawn() {
        let (log, withdrawals) = (Log::default(), Arc::new(Withdrawals::default()));
        let name = LockName::new("job").unwrap();
        let first = async {
            tokio::task::yield_now().await;
            if u64::from(std::hint::black_box(true)) == 1 {
                panic!("a bug in the request");
            }
            Ok(1u64)
        };
        let mut pending = Enqueued::new(&withdrawals, &name, first, undo(&log));
        let err = pending.reply().await.err().unwrap();
        assert!(err.to_string().contains("panicked"), "{err}");
        drop(pending);
        withdrawals.settled(&name, Duration::from_secs(60)).await;
        let calls = log.calls.lock().unwrap().clone();
        assert_eq!(calls.len(), 1, "withdrawn once");
        assert_eq!(calls[0].1, None);
    }
}

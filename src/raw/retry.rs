//! Background work that must outlive the call that started it: detached tasks, and retries
//! with backoff while a session lives.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::raw::Live;
use crate::{Error, Result};

/// The first pause of a [`Backoff`].
const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause of a [`Backoff`].
const MAX_PAUSE: Duration = Duration::from_secs(2);

/// Pauses between retries: 100 ms, doubling up to 2 s.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { next: FIRST_PAUSE }
    }
}

impl Backoff {
    /// A backoff at its first pause.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sleeps for the current pause and doubles the next one (up to 2 s).
    ///
    /// # Cancel safety
    /// Cancel-safe; a dropped pause still counts as taken.
    pub async fn pause(&mut self) {
        let pause = self.next;
        self.next = (self.next * 2).min(MAX_PAUSE);
        tokio::time::sleep(pause).await;
    }

    /// Sleeps for the current pause, as [`pause`](Backoff::pause) does, unless `lost` fires
    /// first: true if it slept, false if `lost` fired (a waiter's retry loop then ends).
    ///
    /// # Cancel safety
    /// Cancel-safe, as [`pause`](Backoff::pause).
    pub async fn pause_unless(&mut self, lost: &tokio_util::sync::CancellationToken) -> bool {
        tokio::select! {
            () = self.pause() => true,
            () = lost.cancelled() => false,
        }
    }

    /// Whether a failed attempt should be tried again: only for a store failure a retry may
    /// cure ([`Error::is_retryable`]) and while the session lives (after it, the store removes
    /// the session's entries itself).
    pub fn should_retry(error: &Error, session_alive: bool) -> bool {
        session_alive && error.is_retryable()
    }
}

/// The time one operation's attempts share (a release's retried deletes): each attempt is cut
/// to what is left, so that the whole ends within the budget, not up to one attempt after it.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    start: tokio::time::Instant,
    total: Duration,
}

impl Budget {
    /// A budget of `total`, counted from now.
    pub fn start(total: Duration) -> Self {
        Budget {
            start: tokio::time::Instant::now(),
            total,
        }
    }

    /// The limit of the next attempt: `attempt`, or what is left of the budget if less.
    pub fn attempt(&self, attempt: Duration) -> Duration {
        attempt.min(self.total.saturating_sub(self.start.elapsed()))
    }

    /// Whether an attempt after a pause of `pause` would still have time to run.
    pub fn allows_retry_after(&self, pause: Duration) -> bool {
        self.start.elapsed() + pause < self.total
    }
}

/// Spawns `work` on the current Tokio runtime without waiting for it; outside a runtime (a
/// guard dropped after its runtime shut down, say) logs that `what` is left to the lease.
/// Returns the task, for a caller that wants to wait for it.
pub fn spawn_detached(
    backend: &'static str,
    what: &str,
    work: impl Future<Output = ()> + Send + 'static,
) -> Option<tokio::task::JoinHandle<()>> {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => Some(runtime.spawn(work)),
        Err(_) => {
            tracing::warn!(
                backend,
                what,
                "no Tokio runtime to run this in the background; the lease will end it"
            );
            None
        }
    }
}

/// Runs `attempt` in the background until it succeeds, retrying with [`Backoff`] while
/// `session` lives and the error is retryable. For the re-delete of a dropped guard: an
/// entry left behind blocks every other contender until the session ends (Curator calls this
/// a guaranteed delete).
pub fn keep_retrying<S, A, Fut>(
    backend: &'static str,
    what: String,
    session: Arc<S>,
    mut attempt: A,
) where
    S: Live + 'static,
    A: FnMut(&Arc<S>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<()>> + Send,
{
    let task_what = what.clone();
    spawn_detached(backend, &what, async move {
        let mut backoff = Backoff::new();
        // Ends with success, a non-retryable error, or the session's end.
        loop {
            match attempt(&session).await {
                Ok(()) => return,
                Err(e) if Backoff::should_retry(&e, session.is_live()) => {
                    tracing::debug!(backend, what = %task_what, error = %e, "retrying");
                    backoff.pause().await;
                }
                Err(e) => {
                    tracing::warn!(backend, what = %task_what, error = %e, "giving up; the lease will end it");
                    return;
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    use tokio::time::Instant;

    use super::*;

    impl Live for AtomicBool {
        fn is_live(&self) -> bool {
            self.load(Ordering::SeqCst)
        }
    }

    fn unavailable() -> Error {
        Error::unavailable("test", "no answer", None)
    }

    #[tokio::test(start_paused = true)]
    async fn retries_with_growing_pauses_until_success() {
        let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
        let start = Instant::now();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let mut done_tx = Some(done_tx);
        let log = Arc::clone(&calls);
        keep_retrying(
            "test",
            "re-delete".into(),
            Arc::new(AtomicBool::new(true)),
            move |_| {
                let log = Arc::clone(&log);
                let finished = {
                    let mut log = log.lock().unwrap();
                    log.push(Instant::now() - start);
                    log.len() == 5
                };
                let tx = if finished { done_tx.take() } else { None };
                async move {
                    if let Some(tx) = tx {
                        let _ = tx.send(());
                        Ok(())
                    } else {
                        Err(unavailable())
                    }
                }
            },
        );
        done_rx.await.unwrap();
        let ms: Vec<u128> = calls
            .lock()
            .unwrap()
            .iter()
            .map(Duration::as_millis)
            .collect();
        assert_eq!(ms, [0, 100, 300, 700, 1500]);
    }

    #[tokio::test(start_paused = true)]
    async fn stops_when_the_session_ends_or_the_error_is_final() {
        for final_error in [false, true] {
            let alive = Arc::new(AtomicBool::new(true));
            let calls = Arc::new(AtomicUsize::new(0));
            let c = Arc::clone(&calls);
            keep_retrying("test", "re-delete".into(), Arc::clone(&alive), move |_| {
                c.fetch_add(1, Ordering::SeqCst);
                async move {
                    Err(if final_error {
                        Error::unauthorized("test", "denied", None)
                    } else {
                        unavailable()
                    })
                }
            });
            tokio::time::sleep(Duration::from_millis(350)).await;
            let expected = if final_error { 1 } else { 3 }; // at 0, 100 and 300 ms
            assert_eq!(calls.load(Ordering::SeqCst), expected);
            alive.store(false, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs(10)).await;
            let after = if final_error { 1 } else { 4 }; // the attempt after the pause, then none
            assert_eq!(calls.load(Ordering::SeqCst), after);
        }
    }
}

#[cfg(test)]
mod budget_tests {
    use super::Budget;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn an_attempt_is_cut_to_what_is_left_and_no_retry_starts_past_the_budget() {
        let budget = Budget::start(Duration::from_secs(1));
        let attempt = Duration::from_millis(666);
        assert_eq!(budget.attempt(attempt), attempt);
        tokio::time::advance(Duration::from_millis(866)).await;
        assert_eq!(budget.attempt(attempt), Duration::from_millis(134));
        assert!(budget.allows_retry_after(Duration::from_millis(100)));
        assert!(!budget.allows_retry_after(Duration::from_millis(200)));
        tokio::time::advance(Duration::from_millis(200)).await;
        assert_eq!(budget.attempt(attempt), Duration::ZERO);
    }
}

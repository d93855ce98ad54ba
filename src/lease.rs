//! The holder-side lease deadline, shared by every backend.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A lease as the holder sees it: a local deadline and a `lost` signal that fires when the
/// deadline passes or the backend declares the lease gone.
///
/// The deadline is conservative: each successful renewal moves it to *the moment the renewal
/// request was sent* plus the granted TTL minus a safety margin. The server starts its own clock
/// when it *receives* the request, which is later, so the holder's deadline always passes first.
/// The margin absorbs clock-rate drift and the time the holder needs to stop its work.
///
/// Backends create one per session (see [`keep_renewed`](crate::raw::keep_renewed)) and hand it to every [`LockGuard`](crate::LockGuard) of that
/// session; each guard's `lost` is a child of [`LeaseClock::lost_token`].
#[derive(Debug)]
pub struct LeaseClock {
    lost: CancellationToken,
    deadline: Mutex<Instant>,
    margin: Duration,
    /// When the grant request was sent: the first renewal is due an interval after it.
    started: Instant,
    /// Why the lease was lost, for operators (the first reason given wins).
    cause: Mutex<Option<String>>,
}

/// The cause when the deadline passed without a renewal.
const DEADLINE_PASSED: &str = "the lease deadline passed without a successful renewal (the \
                               store did not answer in time, or this process was paused)";

impl LeaseClock {
    /// Starts a lease whose grant request was sent at `sent_at` with `ttl`, and spawns the task
    /// that fires `lost` when the deadline passes.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// use std::time::Duration;
    /// use fencelock::raw::LeaseClock;
    /// use tokio::time::Instant;
    ///
    /// let sent = Instant::now(); // taken just before the grant request is sent
    /// let clock = LeaseClock::start(sent, Duration::from_secs(10), Duration::from_secs(1));
    /// // A renewal sent 3 s later moves the deadline to its send time + ttl - margin.
    /// tokio::time::sleep(Duration::from_secs(3)).await;
    /// clock.renewed(sent + Duration::from_secs(3), Duration::from_secs(10));
    /// assert_eq!(clock.deadline(), sent + Duration::from_secs(12));
    /// clock.lose(); // the store refused a renewal: every guard's `lost` fires
    /// assert!(!clock.is_live());
    /// # }
    /// ```
    ///
    /// # Panics
    /// Outside a Tokio runtime (it spawns the deadline task).
    pub fn start(sent_at: Instant, ttl: Duration, margin: Duration) -> Arc<Self> {
        let clock = Arc::new(LeaseClock {
            lost: CancellationToken::new(),
            deadline: Mutex::new(deadline_of(sent_at, ttl, margin)),
            margin,
            started: sent_at,
            cause: Mutex::new(None),
        });
        tokio::spawn(Arc::clone(&clock).watch_deadline());
        clock
    }

    async fn watch_deadline(self: Arc<Self>) {
        // Each pass either fires `lost` or sleeps until a deadline that a renewal moved later,
        // so the loop ends no later than the lease does.
        loop {
            let deadline = self.deadline();
            tokio::select! {
                () = self.lost.cancelled() => return,
                () = tokio::time::sleep_until(deadline) => {}
            }
            if Instant::now() >= self.deadline() {
                tracing::warn!("lease deadline passed without a successful renewal; lock(s) lost");
                self.end(DEADLINE_PASSED, Some("deadline"));
                return;
            }
        }
    }

    /// Records a successful renewal whose request was sent at `sent_at` and granted `ttl`.
    /// Never moves the deadline earlier, and does nothing once the lease is lost. A renewal
    /// that arrives after the deadline has passed loses the lease instead: the holder already
    /// had to assume it gone (and may have said so), and once lost stays lost.
    pub fn renewed(&self, sent_at: Instant, ttl: Duration) {
        if self.lost.is_cancelled() {
            return;
        }
        let candidate = deadline_of(sent_at, ttl, self.margin);
        let mut deadline = self.deadline.lock().unwrap_or_else(PoisonError::into_inner);
        if Instant::now() >= *deadline {
            drop(deadline);
            tracing::warn!("a renewal arrived after the lease deadline; lock(s) lost");
            self.end(DEADLINE_PASSED, Some("deadline"));
            return;
        }
        if candidate > *deadline {
            *deadline = candidate;
        }
    }

    /// Ends the lease because this side closed its session (dropped, replaced): `lost` fires,
    /// but it is not counted as a loss in [`LOSSES`](crate::telemetry::LOSSES).
    pub fn lose(&self) {
        self.close_because("the session ended");
    }

    /// Ends the lease because this side closed it, saying why (as [`lose`](LeaseClock::lose)).
    pub fn close_because(&self, cause: impl Into<String>) {
        self.end(cause, None);
    }

    /// Declares the lease gone, saying why (shown to operators by
    /// [`LockGuard::loss_cause`](crate::LockGuard::loss_cause)); the first cause given is kept.
    /// Counted as `session_ended` in [`LOSSES`](crate::telemetry::LOSSES).
    pub fn lose_because(&self, cause: impl Into<String>) {
        self.end(cause, Some("session_ended"));
    }

    /// Ends the lease; the first end counts under `counted`, if it is a loss.
    pub(crate) fn end(&self, cause: impl Into<String>, counted: Option<&'static str>) {
        {
            let mut slot = self.cause.lock().unwrap_or_else(PoisonError::into_inner);
            if slot.is_none() && !self.lost.is_cancelled() {
                *slot = Some(cause.into());
                if let Some(kind) = counted {
                    crate::telemetry::record_loss(kind);
                }
            }
        }
        self.lost.cancel();
    }

    /// Why the lease was lost; `None` while it is live.
    pub fn cause(&self) -> Option<String> {
        if self.is_live() {
            return None;
        }
        let cause = self.cause.lock().unwrap_or_else(PoisonError::into_inner);
        Some(cause.clone().unwrap_or_else(|| DEADLINE_PASSED.to_owned()))
    }

    /// When the lease's grant request was sent (the `sent_at` given to
    /// [`start`](LeaseClock::start)).
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The local deadline: past it, the holder must assume the lock is gone.
    pub fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// True while the lease is neither declared lost nor past its deadline. Checks the clock
    /// itself, so it is right even when the deadline task has not run yet.
    pub fn is_live(&self) -> bool {
        !self.lost.is_cancelled() && Instant::now() < self.deadline()
    }

    /// The session-wide `lost` token; guards take child tokens of it.
    pub fn lost_token(&self) -> &CancellationToken {
        &self.lost
    }
}

fn deadline_of(sent_at: Instant, ttl: Duration, margin: Duration) -> Instant {
    sent_at + ttl.saturating_sub(margin)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Review F9: the deadline task has not run yet (its runtime was blocked) when a renewal
    /// arrives after the deadline: the lease is lost, not revived.
    #[test]
    fn a_renewal_after_the_deadline_does_not_revive_the_lease() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        runtime.block_on(async {
            let ttl = Duration::from_millis(200);
            let clock = LeaseClock::start(Instant::now(), ttl, Duration::from_millis(20));
            std::thread::sleep(Duration::from_millis(250)); // blocks the deadline task
            assert!(!clock.is_live());
            clock.renewed(Instant::now(), ttl);
            assert!(clock.lost_token().is_cancelled(), "once lost, stays lost");
            assert!(!clock.is_live());
        });
    }

    #[tokio::test(start_paused = true)]
    async fn deadline_counts_from_send_time_minus_margin() {
        let sent = Instant::now();
        let clock = LeaseClock::start(sent, Duration::from_secs(10), Duration::from_secs(1));
        assert_eq!(clock.deadline(), sent + Duration::from_secs(9));
        tokio::time::sleep(Duration::from_secs(3)).await;
        // A renewal sent at t=2 (its reply arrived at t=3) counts from t=2.
        clock.renewed(sent + Duration::from_secs(2), Duration::from_secs(10));
        assert_eq!(clock.deadline(), sent + Duration::from_secs(11));
        // An older renewal never moves the deadline back.
        clock.renewed(sent, Duration::from_secs(10));
        assert_eq!(clock.deadline(), sent + Duration::from_secs(11));
        tokio::time::sleep_until(sent + Duration::from_millis(10_999)).await;
        assert!(clock.is_live());
        clock.lost_token().cancelled().await;
        assert_eq!(Instant::now(), sent + Duration::from_secs(11));
        assert!(!clock.is_live());
    }
}

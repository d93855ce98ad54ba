//! [`keep_renewed`]: the one renewal loop behind every lease.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::raw::LeaseClock;

/// How long to wait before retrying a failed renewal (capped at TTL/3).
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// What one renewal found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The store renewed the lease for this long (counted from when the request was sent).
    Alive(Duration),
    /// The store says the lease (session) is gone: every lock of it is lost.
    Gone(String),
    /// No definite answer (connection broken, error): retry soon; the deadline does not move.
    Failed(String),
}

/// One backend's renewal request: a keepalive on etcd, a probe on ZooKeeper.
pub trait Renew: Send {
    /// Sends one renewal and reads its answer. [`keep_renewed`] bounds it by the request
    /// timeout (an unanswered renewal counts as [`Renewal::Failed`]).
    fn renew(&mut self) -> impl Future<Output = Renewal> + Send;

    /// Called after a failed or unanswered renewal, before the retry: drop a broken stream,
    /// say. The default does nothing.
    fn reset(&mut self) {}

    /// How often to renew a lease of `ttl`. The default, `ttl / 3`, lets one renewal fail
    /// without losing the lease; a store whose proof of life is older than its answer (a
    /// ZooKeeper follower relays it to the leader late) may need more often.
    fn interval(&self, ttl: Duration) -> Duration {
        ttl / 3
    }
}

/// Renews a lease every `ttl / 3` until it is lost, and feeds `clock` with each success.
///
/// Each success moves the deadline to *the renewal's send time + min(granted, ttl) − margin*
/// (never the reply's arrival time: the store starts its clock later than we sent). A failure is
/// retried after 200 ms (at most TTL/3) and moves nothing, so a store that stops answering
/// costs the lock within one TTL. [`Renewal::Gone`] loses the clock at once. Returns when the
/// clock is lost, by this loop or by anyone else.
///
/// `backend` names the backend in log lines; `request_timeout` bounds each renewal (it is
/// capped at TTL/3, so one slow answer cannot skip a whole renewal period).
///
/// # Cancel safety
/// Cancel-safe: dropping it stops the renewals (the clock then runs out on its own).
pub async fn keep_renewed<R: Renew>(
    backend: &'static str,
    clock: Arc<LeaseClock>,
    ttl: Duration,
    request_timeout: Duration,
    mut renewer: R,
) {
    let interval = renewer.interval(ttl).min(ttl / 3);
    let limit = request_timeout.min(ttl / 3);
    // From the grant's send time, as the deadline counts (review F7): a slow grant reply must
    // not push the first renewal past the point the deadline allows for.
    let mut next = clock.started() + interval;
    // One renewal per pass; the loop ends when the lease is lost, which a store that stops
    // answering causes within one TTL (the clock's own deadline).
    loop {
        tokio::select! {
            () = clock.lost_token().cancelled() => return,
            () = tokio::time::sleep_until(next) => {}
        }
        if !clock.is_live() {
            // Past the deadline (a starved runtime): a renewal now could only revive a lease
            // the holder already had to give up.
            clock.end(
                "the lease deadline passed before the next renewal could be sent",
                Some("deadline"),
            );
            return;
        }
        let sent = Instant::now();
        let outcome = tokio::select! {
            () = clock.lost_token().cancelled() => return,
            outcome = tokio::time::timeout(limit, renewer.renew()) => outcome
                .unwrap_or_else(|_| Renewal::Failed(format!("no answer within {limit:?}"))),
        };
        let answered = Instant::now();
        let rtt = answered.saturating_duration_since(sent);
        match &outcome {
            Renewal::Alive(_) => {
                let margin = clock.deadline().saturating_duration_since(answered);
                crate::telemetry::record_renewal(backend, "alive", rtt, Some(margin));
            }
            Renewal::Gone(_) => crate::telemetry::record_renewal(backend, "gone", rtt, None),
            Renewal::Failed(_) => crate::telemetry::record_renewal(backend, "failed", rtt, None),
        }
        match outcome {
            Renewal::Alive(granted) => {
                clock.renewed(sent, granted.min(ttl));
                next = sent + interval;
            }
            Renewal::Gone(why) => {
                tracing::warn!(
                    backend,
                    %why,
                    "session ended on the server; every lock of this session is lost"
                );
                clock.lose_because(format!("the store ended the session: {why}"));
                return;
            }
            Renewal::Failed(why) => {
                tracing::warn!(
                    backend,
                    %why,
                    "renewal failed; the deadline is not extended; retrying"
                );
                renewer.reset();
                next = Instant::now() + RETRY_PAUSE.min(interval);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Answers each renewal after `delay` with the next scripted outcome (then `Gone`).
    struct Script {
        delay: Duration,
        outcomes: VecDeque<Renewal>,
        sent: Arc<std::sync::Mutex<Vec<Instant>>>,
        resets: Arc<AtomicUsize>,
    }

    impl Renew for Script {
        async fn renew(&mut self) -> Renewal {
            self.sent
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Instant::now());
            tokio::time::sleep(self.delay).await;
            self.outcomes
                .pop_front()
                .unwrap_or_else(|| Renewal::Gone("script over".into()))
        }
        fn reset(&mut self) {
            self.resets.fetch_add(1, Ordering::SeqCst);
        }
    }

    const TTL: Duration = Duration::from_secs(9);
    const MARGIN: Duration = Duration::from_secs(1);

    fn script(
        delay: Duration,
        outcomes: Vec<Renewal>,
    ) -> (
        Script,
        Arc<std::sync::Mutex<Vec<Instant>>>,
        Arc<AtomicUsize>,
    ) {
        let sent = Arc::new(std::sync::Mutex::new(Vec::new()));
        let resets = Arc::new(AtomicUsize::new(0));
        let script = Script {
            delay,
            outcomes: outcomes.into(),
            sent: Arc::clone(&sent),
            resets: Arc::clone(&resets),
        };
        (script, sent, resets)
    }

    #[tokio::test(start_paused = true)]
    async fn renews_at_a_third_of_the_ttl_and_counts_from_the_send_time() {
        let start = Instant::now();
        let clock = LeaseClock::start(start, TTL, MARGIN);
        // Each answer takes 2 s; the deadline must count from the send, not the answer.
        let (renewer, sent, _) = script(
            Duration::from_secs(2),
            vec![Renewal::Alive(TTL), Renewal::Alive(Duration::from_secs(60))],
        );
        let task = tokio::spawn(keep_renewed("test", Arc::clone(&clock), TTL, TTL, renewer));
        tokio::time::sleep(Duration::from_secs(5) + Duration::from_millis(1)).await;
        // First renewal sent at 3 s, answered at 5 s: deadline 3 + 9 - 1 = 11 s.
        assert_eq!(clock.deadline(), start + Duration::from_secs(11));
        tokio::time::sleep(Duration::from_secs(3)).await;
        // Second sent at 6 s (3 s after the first was sent); a grant above the ttl is capped.
        assert_eq!(clock.deadline(), start + Duration::from_secs(14));
        task.await.unwrap_or_default(); // the script then says Gone
        assert!(!clock.is_live());
        let sent = sent.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert_eq!(
            sent.iter().map(|t| *t - start).collect::<Vec<_>>(),
            [3, 6, 9].map(Duration::from_secs)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_retries_soon_resets_and_moves_nothing() {
        let start = Instant::now();
        let clock = LeaseClock::start(start, TTL, MARGIN);
        // The first renewal gets no answer within the 1 s request timeout.
        let (renewer, sent, resets) = script(
            Duration::from_millis(1500),
            vec![Renewal::Alive(TTL), Renewal::Failed("broken".into())],
        );
        let limit = Duration::from_secs(1);
        let task = tokio::spawn(keep_renewed(
            "test",
            Arc::clone(&clock),
            TTL,
            limit,
            renewer,
        ));
        tokio::time::sleep(Duration::from_millis(4500)).await;
        assert_eq!(
            resets.load(Ordering::SeqCst),
            1,
            "a timeout counts as a failure"
        );
        assert_eq!(
            clock.deadline(),
            start + TTL - MARGIN,
            "the deadline did not move"
        );
        clock.lose();
        task.await.unwrap_or_default();
        let sent = sent.lock().unwrap_or_else(|e| e.into_inner()).clone();
        // Sent at 3 s, timed out at 4 s, retried 200 ms later.
        assert_eq!(sent[1] - start, Duration::from_millis(4200));
    }

    /// Review F7 (etcd): the first renewal counts from the grant's send time, as the deadline
    /// does, not from when the renewal task started (after a slow grant reply).
    #[tokio::test(start_paused = true)]
    async fn the_first_renewal_counts_from_the_grants_send_time() {
        let sent_grant = Instant::now();
        let clock = LeaseClock::start(sent_grant, TTL, MARGIN);
        // The grant's reply took 2 s (raft, fsync, a slow link).
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (renewer, sent, _) = script(Duration::ZERO, vec![Renewal::Alive(TTL)]);
        let task = tokio::spawn(keep_renewed("test", Arc::clone(&clock), TTL, TTL, renewer));
        tokio::time::sleep(Duration::from_secs(4)).await;
        clock.lose();
        task.await.unwrap_or_default();
        let sent = sent.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert_eq!(sent.first().map(|at| *at - sent_grant), Some(TTL / 3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_that_never_answers_costs_the_lock_within_one_ttl() {
        let start = Instant::now();
        let clock = LeaseClock::start(start, TTL, MARGIN);
        let (renewer, _, _) = script(Duration::from_secs(3600), vec![]);
        let task = tokio::spawn(keep_renewed("test", Arc::clone(&clock), TTL, TTL, renewer));
        task.await.unwrap_or_default();
        assert_eq!(Instant::now() - start, TTL - MARGIN);
    }
}

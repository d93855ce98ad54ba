//! What fencelock measures, through the [`metrics`] facade, and the spans it opens.
//!
//! fencelock records into whatever recorder the application installed (Prometheus, StatsD,
//! OpenTelemetry...) and costs next to nothing without one; it installs none itself. The CLI's
//! `fencelock run --metrics-listen ADDR` serves them in Prometheus text format. Every backend
//! records the same metrics, from the shared machinery:
//!
//! | metric | kind | labels | what |
//! |---|---|---|---|
//! | `fencelock_acquire_wait_seconds` | histogram | `backend`, `outcome` | from the call to the outcome |
//! | `fencelock_acquires_total` | counter | `backend`, `outcome` | `granted`, `would_block`, `timeout`, `cancelled`, `error` |
//! | `fencelock_hold_seconds` | histogram | `backend` | from the grant to the release or the drop of the guard |
//! | `fencelock_renewal_rtt_seconds` | histogram | `backend` | each renewal's round trip, answered or not |
//! | `fencelock_renewal_margin_seconds` | histogram | `backend` | the local deadline minus now, when a renewal's answer arrives: how close the holder came to `lost` |
//! | `fencelock_renewals_total` | counter | `backend`, `outcome` | `alive`, `gone` (the store ended the session), `failed` |
//! | `fencelock_losses_total` | counter | `cause` | sessions lost: `deadline` (no renewal in time), `session_ended` (the store said so); guards lost alone: `store_refused` |
//! | `fencelock_sessions_opened_total` | `replaced` | sessions opened: `false` the first, `true` replacing a lost one (a re-open) |
//! | `fencelock_acquire_queue_ahead` | histogram | `backend` | contenders queued ahead of an acquire at its first look: 0 when the lock was free |
//! | `fencelock_fence_admissions_total` | counter | `store`, `outcome` | `admitted` or `refused`, at a resource's fence |
//!
//! Elections count in the acquire metrics too: a campaign is an acquire of the election's entry.
//!
//! Spans: each acquire runs in an `acquire` span (`backend`, `lock`), and each guard carries a
//! `lock` span (`backend`, `lock`, `token`), [`LockGuard::span`](crate::LockGuard::span), for
//! the work done under the lock, so that its log lines say which lock and token they ran under.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::{Error, Result};

/// Acquire wait time, by outcome (histogram, seconds).
pub const ACQUIRE_WAIT: &str = "fencelock_acquire_wait_seconds";
/// Acquires by outcome (counter).
pub const ACQUIRES: &str = "fencelock_acquires_total";
/// Hold time (histogram, seconds).
pub const HOLD: &str = "fencelock_hold_seconds";
/// Renewal round trip (histogram, seconds).
pub const RENEWAL_RTT: &str = "fencelock_renewal_rtt_seconds";
/// Deadline minus now at each renewal's answer (histogram, seconds).
pub const RENEWAL_MARGIN: &str = "fencelock_renewal_margin_seconds";
/// Renewals by outcome (counter).
pub const RENEWALS: &str = "fencelock_renewals_total";
/// Losses by cause (counter).
pub const LOSSES: &str = "fencelock_losses_total";
/// Sessions opened, first or replacing a lost one (counter).
pub const SESSIONS_OPENED: &str = "fencelock_sessions_opened_total";
/// Fence admissions by outcome (counter).
pub const FENCE_ADMISSIONS: &str = "fencelock_fence_admissions_total";
/// Contenders queued ahead of an acquire at its first look (histogram).
pub const QUEUE_AHEAD: &str = "fencelock_acquire_queue_ahead";

/// Registers the metrics' descriptions and units with the installed recorder (exporters show
/// them as `# HELP` lines). Optional; call it once after installing a recorder.
pub fn describe() {
    use metrics::{describe_counter, describe_histogram, Unit};
    describe_histogram!(
        ACQUIRE_WAIT,
        Unit::Seconds,
        "time from an acquire call to its outcome"
    );
    describe_counter!(ACQUIRES, "acquires by outcome");
    describe_histogram!(
        HOLD,
        Unit::Seconds,
        "time from a grant to the guard's release or drop"
    );
    describe_histogram!(
        RENEWAL_RTT,
        Unit::Seconds,
        "round trip of each lease renewal"
    );
    describe_histogram!(
        RENEWAL_MARGIN,
        Unit::Seconds,
        "local lease deadline minus now when a renewal's answer arrives"
    );
    describe_counter!(RENEWALS, "lease renewals by outcome");
    describe_counter!(
        SESSIONS_OPENED,
        "sessions opened (replaced: after a lost one)"
    );
    describe_counter!(LOSSES, "locks and sessions lost, by cause");
    describe_histogram!(
        QUEUE_AHEAD,
        Unit::Count,
        "contenders queued ahead of an acquire at its first look"
    );
    describe_counter!(
        FENCE_ADMISSIONS,
        "fencing-token admissions at a resource, by outcome"
    );
}

/// Records a fence's decision; for [`FenceStore`]-like checks outside this crate too.
///
/// [`FenceStore`]: https://docs.rs/fencelock-fence
pub fn record_admission(store: &'static str, admitted: bool) {
    let outcome = if admitted { "admitted" } else { "refused" };
    metrics::counter!(FENCE_ADMISSIONS, "store" => store, "outcome" => outcome).increment(1);
}

/// Records how many contenders were queued ahead of an acquire when it first looked; for
/// backends, once per acquire (a retried first request counts once).
pub fn record_queue_ahead(backend: &'static str, ahead: usize) {
    #[allow(clippy::cast_precision_loss)] // a queue is far shorter than 2^52
    metrics::histogram!(QUEUE_AHEAD, "backend" => backend).record(ahead as f64);
}

pub(crate) fn record_session_open(replaced: bool) {
    let replaced = if replaced { "true" } else { "false" };
    metrics::counter!(SESSIONS_OPENED, "replaced" => replaced).increment(1);
}

pub(crate) fn record_loss(cause: &'static str) {
    metrics::counter!(LOSSES, "cause" => cause).increment(1);
}

pub(crate) fn record_hold(backend: &'static str, held: Duration) {
    metrics::histogram!(HOLD, "backend" => backend).record(held.as_secs_f64());
}

pub(crate) fn record_renewal(
    backend: &'static str,
    outcome: &'static str,
    rtt: Duration,
    margin: Option<Duration>,
) {
    metrics::counter!(RENEWALS, "backend" => backend, "outcome" => outcome).increment(1);
    metrics::histogram!(RENEWAL_RTT, "backend" => backend).record(rtt.as_secs_f64());
    if let Some(margin) = margin {
        metrics::histogram!(RENEWAL_MARGIN, "backend" => backend).record(margin.as_secs_f64());
    }
}

/// Runs an acquire in its span and records its wait and outcome, also when it is dropped
/// before it ends (`cancelled`).
pub(crate) async fn acquire<T>(
    backend: &'static str,
    lock: &str,
    acquire: impl Future<Output = Result<T>>,
) -> Result<T> {
    use tracing::Instrument;
    let mut pending = Pending {
        backend,
        started: Instant::now(),
        done: false,
    };
    let span = tracing::debug_span!("acquire", backend, lock);
    let result = acquire.instrument(span).await;
    let outcome = match &result {
        Ok(_) => "granted",
        Err(Error::WouldBlock { .. }) => "would_block",
        Err(Error::Timeout { .. }) => "timeout",
        Err(_) => "error",
    };
    pending.finish(outcome);
    result
}

/// An acquire in progress: dropped unfinished, it counts as cancelled.
struct Pending {
    backend: &'static str,
    started: Instant,
    done: bool,
}

impl Pending {
    fn finish(&mut self, outcome: &'static str) {
        self.done = true;
        let backend = self.backend;
        metrics::counter!(ACQUIRES, "backend" => backend, "outcome" => outcome).increment(1);
        metrics::histogram!(ACQUIRE_WAIT, "backend" => backend, "outcome" => outcome)
            .record(self.started.elapsed().as_secs_f64());
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.done {
            self.finish("cancelled");
        }
    }
}

//! The metrics every backend records, read from a recorder installed for this test binary
//! (the memory backend; the etcd and ZooKeeper backends record them from the same code, and
//! their own tests scrape them).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use fencelock::telemetry::{
    ACQUIRES, ACQUIRE_WAIT, FENCE_ADMISSIONS, HOLD, LOSSES, QUEUE_AHEAD, RENEWALS, RENEWAL_MARGIN,
    SESSIONS_OPENED,
};
use fencelock::{
    Fence, FencingToken, LockBackend, LockBackendExt, MemoryBackend, MemoryConfig, MemoryStore,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::CompositeKey;

/// What was recorded since the last snapshot (taking one drains the recorder).
struct Recorded(Vec<(CompositeKey, DebugValue)>);

impl Recorded {
    fn take(snapshotter: &Snapshotter) -> Self {
        Recorded(
            snapshotter
                .snapshot()
                .into_vec()
                .into_iter()
                .map(|(key, _, _, value)| (key, value))
                .collect(),
        )
    }
}

/// The values recorded under `name` with all of `labels`.
fn values<'a>(recorded: &'a Recorded, name: &str, labels: &[(&str, &str)]) -> Vec<&'a DebugValue> {
    recorded
        .0
        .iter()
        .filter(|(key, _)| {
            let key = key.key();
            key.name() == name
                && labels.iter().all(|(k, v)| {
                    key.labels()
                        .any(|label| label.key() == *k && label.value() == *v)
                })
        })
        .map(|(_, value)| value)
        .collect()
}

fn counter(recorded: &Recorded, name: &str, labels: &[(&str, &str)]) -> u64 {
    values(recorded, name, labels)
        .iter()
        .map(|v| match v {
            DebugValue::Counter(n) => *n,
            other => panic!("{name} is not a counter: {other:?}"),
        })
        .sum()
}

fn samples(recorded: &Recorded, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    values(recorded, name, labels)
        .into_iter()
        .flat_map(|v| match v {
            DebugValue::Histogram(samples) => samples.iter().map(|s| s.0).collect::<Vec<_>>(),
            other => panic!("{name} is not a histogram: {other:?}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_holds_renewals_losses_and_admissions_are_measured() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();
    fencelock::telemetry::describe();

    let store = MemoryStore::new();
    let ttl = Duration::from_millis(900);
    let config = || MemoryConfig::with_ttl(ttl);
    let a = MemoryBackend::with_config(&store, config()).unwrap();
    let b = MemoryBackend::with_config(&store, config()).unwrap();
    let mem = [("backend", "memory")];

    let guard = a.lock("jobs").await.unwrap();
    assert!(b.try_lock("jobs").await.is_err());
    assert!(b
        .lock_timeout("jobs", Duration::from_millis(50))
        .await
        .is_err());
    let waiting = tokio::spawn(async move {
        let _ = b.lock("jobs").await;
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    waiting.abort();
    let _ = waiting.await;
    // Two renewals at least (every ttl/3 = 300 ms), then the release.
    tokio::time::sleep(Duration::from_millis(750)).await;
    let _ = guard.release().await.unwrap();
    let recorded = Recorded::take(&snapshotter);

    for (outcome, n) in [
        ("granted", 1),
        ("would_block", 1),
        ("timeout", 1),
        ("cancelled", 1),
    ] {
        let labels = [("backend", "memory"), ("outcome", outcome)];
        assert_eq!(counter(&recorded, ACQUIRES, &labels), n, "{outcome}");
    }
    // The grant found the lock free; the try, the timeout and the cancelled wait found a holder.
    let mut ahead = samples(&recorded, QUEUE_AHEAD, &mem);
    ahead.sort_by(f64::total_cmp);
    assert_eq!(
        ahead,
        [0.0, 1.0, 1.0, 1.0],
        "queue ahead at each first look"
    );
    let timeout_waits = samples(&recorded, ACQUIRE_WAIT, &[("outcome", "timeout")]);
    assert!(
        timeout_waits.iter().all(|w| *w >= 0.05),
        "a 50 ms timeout waited {timeout_waits:?}"
    );
    let holds = samples(&recorded, HOLD, &mem);
    assert!(holds.iter().any(|h| *h >= 0.75), "hold times {holds:?}");
    assert!(counter(&recorded, RENEWALS, &[("outcome", "alive")]) >= 2);
    let margins = samples(&recorded, RENEWAL_MARGIN, &mem);
    // A renewal answers at once here, with about ttl - margin - ttl/3 of the deadline left.
    assert!(
        !margins.is_empty() && margins.iter().all(|m| *m > 0.3 && *m < 0.9),
        "margins {margins:?}"
    );

    // Losses: renewals stopped (the deadline passes), and a session the store ended. Closing a
    // backend is not a loss.
    let c = MemoryBackend::with_config(&store, config()).unwrap();
    let held = c.lock("paused").await.unwrap();
    c.pause_renewals(true).await;
    tokio::time::timeout(Duration::from_secs(3), held.lost())
        .await
        .unwrap();
    // The next acquire replaces the lost session.
    drop(c.lock("paused").await.unwrap());
    let d = MemoryBackend::with_config(&store, config()).unwrap();
    let held = d.lock("expired").await.unwrap();
    d.expire_session().await;
    tokio::time::timeout(Duration::from_secs(3), held.lost())
        .await
        .unwrap();
    let e = MemoryBackend::with_config(&store, config()).unwrap();
    let _held = e.lock("closed").await.unwrap();
    e.close().await.unwrap();
    let recorded = Recorded::take(&snapshotter);
    assert_eq!(counter(&recorded, LOSSES, &[("cause", "deadline")]), 1);
    assert_eq!(counter(&recorded, LOSSES, &[("cause", "session_ended")]), 1);
    assert_eq!(
        counter(&recorded, LOSSES, &[]),
        2,
        "closing counted as a loss"
    );
    // c, d and e opened sessions; c opened a second one after its loss.
    assert_eq!(
        counter(&recorded, SESSIONS_OPENED, &[("replaced", "false")]),
        3
    );
    assert_eq!(
        counter(&recorded, SESSIONS_OPENED, &[("replaced", "true")]),
        1
    );

    let fence = Fence::new();
    drop(fence.admit("ledger", FencingToken::new(5)).await.unwrap());
    assert!(fence.admit("ledger", FencingToken::new(3)).await.is_err());
    let recorded = Recorded::take(&snapshotter);
    let memory_fence = |outcome| [("store", "memory"), ("outcome", outcome)];
    assert_eq!(
        counter(&recorded, FENCE_ADMISSIONS, &memory_fence("admitted")),
        1
    );
    assert_eq!(
        counter(&recorded, FENCE_ADMISSIONS, &memory_fence("refused")),
        1
    );
}

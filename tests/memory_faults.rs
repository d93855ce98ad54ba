//! Fault injection on the memory backend under Tokio's paused clock: deterministic timing.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a failure report

use std::time::Duration;

use fencelock::{
    LockBackendExt, LockName, MemoryBackend, MemoryConfig, MemoryStore, ReleaseOutcome,
};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(9);

fn backend(store: &MemoryStore) -> MemoryBackend {
    MemoryBackend::with_config(store, MemoryConfig::with_ttl(TTL)).unwrap()
}

#[tokio::test(start_paused = true)]
async fn stopped_renewals_fire_lost_before_the_store_expires_the_session() {
    let store = MemoryStore::new();
    let (a, b) = (backend(&store), backend(&store));
    let name = LockName::new("job").unwrap();
    let guard = a.lock("job").await.unwrap();
    // Renewals keep it alive for many TTLs.
    tokio::time::sleep(TTL * 4).await;
    assert!(guard.is_held());

    a.pause_renewals(true).await;
    let paused_at = Instant::now();
    guard.lost().await;
    let lost_after = paused_at.elapsed();
    // At that moment the store still lists us: nobody else could have been granted the lock.
    assert_eq!(store.holder(&name), Some(guard.token()));
    assert!(b.try_lock("job").await.is_err());
    // The deadline counts from the last renewal *sent* (at most TTL/3 before the pause) plus
    // TTL minus the margin (TTL/10), so it fires between 0.57 and 0.9 TTL after the pause.
    assert!(lost_after <= TTL - TTL / 10, "{lost_after:?}");
    assert!(lost_after >= TTL - TTL / 10 - TTL / 3, "{lost_after:?}");

    // The store expires the session a full TTL after the last renewal it received.
    let next = b.lock("job").await.unwrap();
    assert!(paused_at.elapsed() > lost_after);
    assert!(next.token() > guard.token());
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::NotOwned);
}

#[tokio::test(start_paused = true)]
async fn expired_session_is_noticed_at_the_next_renewal() {
    let store = MemoryStore::new();
    let a = backend(&store);
    let guard = a.lock("job").await.unwrap();
    let expired_at = Instant::now();
    a.expire_session().await;
    guard.lost().await;
    assert!(expired_at.elapsed() <= TTL / 3);
    // The next acquire opens a new session.
    let again = a.lock("job").await.unwrap();
    assert!(again.token() > guard.token());
}

#[tokio::test(start_paused = true)]
async fn work_in_run_is_cut_off_when_the_lease_lapses() {
    let store = MemoryStore::new();
    let a = backend(&store);
    let guard = a.lock("job").await.unwrap();
    a.pause_renewals(true).await;
    let steps = std::sync::atomic::AtomicU32::new(0);
    let result = guard
        .run(async {
            for _ in 0..1_000 {
                tokio::time::sleep(Duration::from_secs(1)).await;
                steps.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        })
        .await;
    assert!(matches!(result, Err(fencelock::Error::LockLost { .. })));
    let done = steps.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        done < 9,
        "work went on after the lease lapsed: {done} steps"
    );
}

#[test]
fn config_is_validated() {
    let store = MemoryStore::new();
    let err = MemoryBackend::with_config(&store, MemoryConfig::with_ttl(Duration::from_millis(1)))
        .unwrap_err();
    assert!(matches!(
        err,
        fencelock::Error::InvalidConfig { field: "ttl", .. }
    ));
    let mut config = MemoryConfig::with_ttl(Duration::from_secs(3));
    config.safety_margin = Duration::from_secs(2);
    let err = MemoryBackend::with_config(&store, config).unwrap_err();
    assert!(matches!(
        err,
        fencelock::Error::InvalidConfig {
            field: "safety_margin",
            ..
        }
    ));
}

/// Review F10: after a pause that blocked the runtime past the deadline, `run` must not poll
/// the work once more (letting it write) before the deadline task has fired `lost`.
#[test]
fn run_does_not_poll_the_work_past_the_deadline() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let ttl = Duration::from_millis(100);
        let backend =
            MemoryBackend::with_config(&MemoryStore::new(), MemoryConfig::with_ttl(ttl)).unwrap();
        let guard = backend.lock("job").await.unwrap();
        let mut wrote = false;
        let outcome = guard
            .run(async {
                std::thread::sleep(ttl * 2); // a pause: nothing else runs meanwhile
                tokio::task::yield_now().await;
                wrote = true; // the write a stale holder must not make
            })
            .await;
        assert!(outcome.is_err(), "run must report the loss");
        assert!(!wrote, "the work was polled past the deadline");
        assert!(!guard.is_held());
        assert!(!guard.is_held(), "once lost, stays lost");
    });
}

//! Faults against real ZooKeeper: the connected server stops, and a client is cut off.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::sync::Arc;

use fencelock::{LockBackendExt, ReleaseOutcome};
use fencelock_testsupport::ZkEnsemble;
use fencelock_zookeeper::ZkBackend;
use tokio::time::Instant;

/// The member whose `cons` lists our session.
async fn connected_member(ensemble: &ZkEnsemble, backend: &ZkBackend) -> Option<usize> {
    let sid = format!("sid=0x{:x}", backend.session_info().await?.id().0);
    (0..ensemble.members.len()).find(|&i| ensemble.connections(i).contains(&sid))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_moves_to_another_server_and_keeps_its_locks() {
    let mut ensemble = ZkEnsemble::start(3);
    let factory = common::ZkFactory::on(&ensemble).await;
    // Stopping a follower tests the move itself; a leader's loss adds an election, which may
    // rightly cost the locks (the local deadline does not wait for it).
    let mut attempt = 0;
    let (backend, member) = loop {
        attempt += 1;
        assert!(attempt <= 20, "no client landed on a follower");
        let backend = factory.backend().await;
        let _ = backend
            .lock("probe")
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        if let Some(i) = connected_member(&ensemble, &backend).await {
            if ensemble.mode(i) == "follower" {
                break (backend, i);
            }
        }
    };
    let guard = backend.lock("job").await.unwrap();
    guard.fenced_put("k", "before").await.unwrap();
    ensemble.kill(member);
    let killed_at = Instant::now();
    // Well within the session timeout the client has moved, and after two more timeouts it
    // still holds: the session survived.
    tokio::time::sleep(common::TIMEOUT * 2).await;
    assert!(
        guard.is_held(),
        "the lock must survive a move between servers"
    );
    guard.fenced_put("k", "after").await.unwrap();
    let now = connected_member(&ensemble, &backend).await;
    assert!(
        now.is_some() && now != Some(member),
        "the client must be on another server: {now:?}"
    );
    eprintln!(
        "moved from server {} to {:?}; held {:?} after the kill",
        member + 1,
        now.map(|i| i + 1),
        killed_at.elapsed()
    );
    ensemble.restart(member);
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_off_client_is_lost_before_the_ensemble_expires_it_and_is_fenced() {
    let factory = common::ZkFactory::on(common::shared_standalone()).await;
    let a = factory.proxied_backend().await;
    let b = Arc::new(factory.backend().await);
    let stale = a.lock("job").await.unwrap();
    stale.fenced_put("owner", "stale").await.unwrap();
    // The link heals by itself after three session timeouts.
    factory.cut_off(&a, common::TIMEOUT * 3);
    let (lost, granted) = fencelock::testkit::cut_off_holder(stale, &a, b, "job", || {}).await;
    eprintln!(
        "cut-off: lost {lost:?} after the cut, successor granted {granted:?} after the cut (session timeout {:?})",
        common::TIMEOUT
    );
}

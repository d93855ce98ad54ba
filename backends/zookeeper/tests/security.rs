//! Digest auth: lock nodes of one user cannot be deleted, nor the lock taken, by another.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use fencelock::{Error, LockBackendExt, ReleaseOutcome, StoreFailure};
use fencelock_testsupport::unique;
use fencelock_zookeeper::ZkBackend;
use zookeeper_client::Client;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_users_cannot_delete_or_take_our_locks() {
    let ensemble = common::shared_standalone();
    let connect = ensemble.connect_string();
    let base = format!("/{}", unique("acl"));
    let alice = ZkBackend::connect(common::config(&connect, &base).digest("alice", "alice-pw"))
        .await
        .unwrap();
    let guard = alice.lock("job").await.unwrap();
    guard.fenced_put("k", "v").await.unwrap();

    let dir = format!("{base}/job");
    let as_alice = Client::connector()
        .with_auth("digest", b"alice:alice-pw")
        .connect(&connect)
        .await
        .unwrap();
    let (acls, _) = as_alice.get_acl(&dir).await.unwrap();
    assert!(
        acls.iter()
            .all(|a| a.scheme() == "digest" && a.id().starts_with("alice:")),
        "{acls:?}"
    );

    for who in [Some("mallory:mallory-pw"), None] {
        let mut connector = Client::connector();
        if let Some(auth) = who {
            connector = connector.with_auth("digest", auth.as_bytes());
        }
        let other = connector.connect(&connect).await.unwrap();
        let children = other.list_children(&dir).await;
        // Listing needs READ, deleting a child needs DELETE on the parent: both are alice's.
        assert_eq!(
            children.unwrap_err(),
            zookeeper_client::Error::NoAuth,
            "{who:?}"
        );
        let node = as_alice.list_children(&dir).await.unwrap();
        let deleted = other.delete(&format!("{dir}/{}", node[0]), None).await;
        assert_eq!(
            deleted.unwrap_err(),
            zookeeper_client::Error::NoAuth,
            "{who:?}"
        );
    }

    // Another user's backend on the same base path is refused with a clear error.
    let mallory =
        ZkBackend::connect(common::config(&connect, &base).digest("mallory", "mallory-pw"))
            .await
            .unwrap();
    let err = mallory.try_lock("job").await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Backend {
                backend: "zookeeper",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("permission denied"), "{err}");
    assert_eq!(
        err.store_failure(),
        Some(StoreFailure::Unauthorized),
        "{err:?}"
    );
    assert!(!err.is_retryable());
    // Review F4: the refused attempt's withdrawal (its listing is refused too) must end at
    // once, not retry for the rest of the session and hold up the next attempt for the
    // withdrawal bound (the request timeout).
    let started = tokio::time::Instant::now();
    let again = mallory.try_lock("job").await.unwrap_err();
    assert_eq!(again.store_failure(), Some(StoreFailure::Unauthorized));
    let limit = mallory.config().request_timeout;
    assert!(
        started.elapsed() < limit / 2,
        "the second attempt waited {:?} for the first one's withdrawal (bound {limit:?})",
        started.elapsed()
    );

    assert!(guard.is_held());
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}

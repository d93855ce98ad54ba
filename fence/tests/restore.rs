//! Tokens that go backwards: an etcd restored from a snapshot hands out tokens lower than ones
//! the fences admitted. The fences refuse them, saying so, and admit them after a reset.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use fencelock::{Error, FencingToken, LockBackend, LockBackendExt};
use fencelock_etcd::{EtcdBackend, EtcdConfig};
use fencelock_fence::postgres::PgFenceStore;
use fencelock_fence::{Fence, FenceStore};
use fencelock_testsupport::{tmp_root, unique, EtcdCluster, PgServer};

async fn token(etcd: &EtcdCluster, prefix: &str) -> FencingToken {
    let config = EtcdConfig::new(etcd.endpoints())
        .prefix(prefix.to_owned())
        .ttl(Duration::from_secs(5));
    let backend = EtcdBackend::connect(config).await.unwrap();
    let guard = backend.lock("jobs").await.unwrap();
    let token = guard.token();
    let _ = guard.release().await.unwrap();
    let _ = backend.close().await;
    token
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_from_a_restored_etcd_are_refused_until_the_fence_is_reset() {
    let pg = PgServer::start();
    let mut etcd = EtcdCluster::start(1);
    let prefix = format!("{}/", unique("/restore"));
    let stores: Vec<(&str, Arc<dyn FenceStore>)> = vec![
        ("memory", Arc::new(Fence::new())),
        (
            "postgres",
            Arc::new(
                PgFenceStore::connect(&pg.url(), "restore_fence", 4)
                    .await
                    .unwrap(),
            ),
        ),
    ];

    let first = token(&etcd, &prefix).await;
    let snapshot = tmp_root().join(unique("etcd-snapshot.db"));
    etcd.save_snapshot(&snapshot);
    let mut last = first;
    for _ in 0..3 {
        last = token(&etcd, &prefix).await;
    }
    for (_, store) in &stores {
        drop(store.admit("jobs", last).await.unwrap());
    }

    etcd.restore_snapshot(&snapshot);
    let after = token(&etcd, &prefix).await;
    println!("tokens: {first} before the snapshot, {last} after it, {after} after the restore");
    assert!(
        after < last,
        "the restored etcd handed out {after}, not below {last}: nothing to show"
    );
    for (name, store) in &stores {
        match store.admit("jobs", after).await {
            Err(Error::StaleToken {
                presented, highest, ..
            }) => {
                assert_eq!((presented, highest), (after, last), "{name}");
            }
            other => panic!("{name}: a token from the restored etcd was not refused: {other:?}"),
        }
        let err = store.admit("jobs", after).await.unwrap_err();
        assert!(err.to_string().contains("restored"), "{name}: {err}");
        // The operator's recovery, once no holder from before the restore can write.
        store.reset("jobs").await.unwrap();
        let admission = store.admit("jobs", after).await.unwrap();
        assert_eq!(admission.token(), after, "{name}");
    }
}

//! Bad input gets a clear, typed error and loses nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::time::{Duration, Instant};

use fencelock::{Error, LockBackendExt};
use fencelock_testsupport::{free_port, unique};
use fencelock_zookeeper::{ZkBackend, ZkConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_servers_fail_within_the_connect_timeout() {
    let mut config = ZkConfig::new(format!("127.0.0.1:{}", free_port()));
    config.connect_timeout = Duration::from_secs(1);
    let start = Instant::now();
    let err = ZkBackend::connect(config).await.unwrap_err();
    // A hang detector, not a speed target: three times the configured timeout.
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "took {:?}",
        start.elapsed()
    );
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
    assert!(
        err.to_string().contains("check that ZooKeeper runs there"),
        "{err}"
    );
    assert!(
        err.is_retryable(),
        "an unreachable ensemble is worth retrying: {err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_timeouts_outside_the_servers_bounds_are_refused() {
    let connect = common::shared_standalone().connect_string();
    // The test servers tick every 500 ms: they allow 1 s to 10 s.
    for timeout in [Duration::from_millis(400), Duration::from_secs(30)] {
        // A small tick_time keeps the default margin valid for 400 ms, so the request reaches
        // the server and its refusal is what is tested.
        let config = ZkConfig::new(&connect)
            .base_path(format!("/{}", unique("bad")))
            .tick_time(Duration::from_millis(100))
            .session_timeout(timeout);
        match ZkBackend::connect(config).await {
            Err(Error::InvalidConfig {
                field: "session_timeout",
                reason,
            }) => {
                assert!(reason.contains("granted"), "{reason}");
            }
            other => panic!("{timeout:?}: expected InvalidConfig, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn invalid_settings_are_refused_before_connecting() {
    for (config, field) in [
        (ZkConfig::new(""), "connect"),
        (ZkConfig::new("h:1").base_path("fencelock"), "base_path"),
        (ZkConfig::new("h:1").base_path("/a/"), "base_path"),
        (ZkConfig::new("h:1").base_path("/a/.state"), "base_path"),
        (ZkConfig::new("h:1").digest("a:b", "pw"), "digest"),
        (ZkConfig::new("h:1").tick_time(Duration::ZERO), "tick_time"),
        // The default 2 s tick needs a margin of 1 s: a 3 s timeout leaves no room for it.
        (
            ZkConfig::new("h:1").session_timeout(Duration::from_secs(3)),
            "safety_margin",
        ),
        (
            {
                let mut c = ZkConfig::new("h:1");
                c.safety_margin = Duration::from_millis(900); // below tick_time / 2
                c
            },
            "safety_margin",
        ),
    ] {
        match ZkBackend::connect(config).await {
            Err(Error::InvalidConfig { field: got, .. }) => assert_eq!(got, field),
            other => panic!("expected InvalidConfig({field}), got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_zookeeper_cannot_store_are_refused() {
    let factory = common::ZkFactory::on(common::shared_standalone()).await;
    let backend = factory.backend().await;
    for bad in ["zookeeper", "private\u{e000}use", "a/b", ".."] {
        let got = backend.try_lock(bad).await;
        assert!(
            matches!(got, Err(Error::InvalidName { .. })),
            "{bad:?}: {got:?}"
        );
    }
}

/// Review F13: a foreign child of the base path whose name is no valid lock name (here over
/// 200 bytes), with a contender under it, is skipped by `list`, which used to fail whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_skips_foreign_children_that_are_no_lock_names() {
    use fencelock::LockBackend;
    let ensemble = common::shared_standalone();
    let base = format!("/{}", unique("foreign"));
    let backend = ZkBackend::connect(common::config(&ensemble.connect_string(), &base))
        .await
        .unwrap();
    let guard = backend.lock("job").await.unwrap();
    let admin = zookeeper_client::Client::connect(&ensemble.connect_string())
        .await
        .unwrap();
    let foreign = format!("{base}/{}", "x".repeat(230));
    let mode =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    admin.create(&foreign, b"", &mode).await.unwrap();
    admin
        .create(&format!("{foreign}/child"), b"", &mode)
        .await
        .unwrap();
    let names = backend.list("").await.unwrap();
    assert_eq!(
        names.iter().map(|n| n.as_str()).collect::<Vec<_>>(),
        ["job"],
        "{names:?}"
    );
    drop(guard);
}

/// Review F13: a finished lock leaves no state folder behind once its last key is deleted
/// (`clear_checkpoint`, `fenced_delete`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_folder_goes_with_its_last_key() {
    let factory = common::ZkFactory::on(common::shared_standalone()).await;
    let backend = factory.backend().await;
    let guard = backend.lock("tidy").await.unwrap();
    guard.checkpoint("step 1").await.unwrap();
    guard.fenced_put("other", "x").await.unwrap();
    let dir = format!("{}/.state/tidy", factory.base);
    guard.clear_checkpoint().await.unwrap();
    assert!(
        factory.admin.check_stat(&dir).await.unwrap().is_some(),
        "a folder with a key left stays"
    );
    assert!(guard.fenced_delete("other").await.unwrap());
    assert!(
        factory.admin.check_stat(&dir).await.unwrap().is_none(),
        "the folder must go with its last key"
    );
    guard.fenced_put("again", "y").await.unwrap(); // and comes back when needed
    let _ = guard.release().await.unwrap();
}

//! Bad input gets a clear, typed error and loses nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::time::{Duration, Instant};

use fencelock::{Error, LockBackendExt};
use fencelock_etcd::{EtcdBackend, EtcdConfig};
use fencelock_testsupport::free_port;

#[tokio::test]
async fn unreachable_endpoints_fail_within_the_connect_timeout() {
    let mut config = EtcdConfig::new([format!("http://127.0.0.1:{}", free_port())]);
    config.connect_timeout = Duration::from_secs(1);
    let start = Instant::now();
    let err = EtcdBackend::connect(config).await.unwrap_err();
    // A hang detector, not a speed target: the bound is three times the configured timeout.
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "took {:?}",
        start.elapsed()
    );
    assert!(
        matches!(
            err,
            Error::Backend {
                backend: "etcd",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("check that etcd runs there"),
        "{err}"
    );
    assert!(
        err.is_retryable(),
        "an unreachable cluster is worth retrying: {err:?}"
    );
}

#[tokio::test]
async fn invalid_settings_are_refused_before_connecting() {
    let endpoints = vec!["http://127.0.0.1:1".to_owned()];
    for (config, field) in [
        (
            EtcdConfig::new(endpoints.clone()).ttl(Duration::from_secs(1)),
            "ttl",
        ),
        (
            EtcdConfig::new(endpoints.clone()).ttl(Duration::from_millis(5500)),
            "ttl",
        ),
        // `locks` + `a` would share keys with `lock` + `sa`: the prefix must end with '/'.
        (EtcdConfig::new(endpoints.clone()).prefix("locks"), "prefix"),
        (
            EtcdConfig::new(endpoints.clone()).prefix("x/.state/"),
            "prefix",
        ),
        (EtcdConfig::new(Vec::<String>::new()), "endpoints"),
    ] {
        match EtcdBackend::connect(config).await {
            Err(Error::InvalidConfig { field: got, reason }) => {
                assert_eq!(got, field, "{reason}");
            }
            other => panic!("expected InvalidConfig({field}), got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_names_send_nothing() {
    let factory = common::EtcdFactory::on(common::shared_single()).await;
    let backend = EtcdBackend::connect(common::config(factory.endpoints.clone(), &factory.prefix))
        .await
        .unwrap();
    for bad in ["a/b", "..", "", "x\u{7}"] {
        assert!(
            matches!(backend.try_lock(bad).await, Err(Error::InvalidName { .. })),
            "{bad:?}"
        );
    }
    assert_eq!(
        backend.lease_id().await,
        None,
        "no session was opened for invalid names"
    );
    let keys = factory
        .admin
        .clone()
        .get(
            factory.prefix.as_str(),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    assert!(keys.kvs().is_empty());
}

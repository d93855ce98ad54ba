//! etcd auth (root, and a user whose role covers only its prefix) and TLS with client certs.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use fencelock::{Error, LockBackendExt, ReleaseOutcome, StoreFailure};
use fencelock_etcd::{EtcdBackend, EtcdConfig, EtcdTls};
use fencelock_testsupport::EtcdCluster;

fn setup_auth(cluster: &EtcdCluster) {
    for args in [
        &["user", "add", "root:rootpw", "--interactive=false"][..],
        &["role", "add", "app"],
        &[
            "role",
            "grant-permission",
            "app",
            "readwrite",
            "--prefix=true",
            "app/",
        ],
        &["user", "add", "app:apppw", "--interactive=false"],
        &["user", "grant-role", "app", "app"],
        &["auth", "enable"],
    ] {
        cluster
            .etcdctl(args)
            .unwrap_or_else(|e| panic!("etcdctl {args:?}: {e}"));
    }
}

async fn connect(
    cluster: &EtcdCluster,
    prefix: &str,
    creds: Option<(&str, &str)>,
) -> fencelock::Result<EtcdBackend> {
    let mut config = common::config(cluster.endpoints(), prefix);
    if let Some((user, password)) = creds {
        config = config.credentials(user, password);
    }
    EtcdBackend::connect(config).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_root_and_a_prefix_limited_user() {
    let cluster = EtcdCluster::start(1);
    setup_auth(&cluster);

    let root = connect(&cluster, "fencelock/", Some(("root", "rootpw")))
        .await
        .unwrap();
    let guard = root.lock("ops").await.unwrap();
    guard.fenced_put("k", "v").await.unwrap();
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);

    // The app user's role covers `app/`, which holds both its locks and their fenced state.
    let app = connect(&cluster, "app/", Some(("app", "apppw")))
        .await
        .unwrap();
    let guard = app.lock("job").await.unwrap();
    guard.checkpoint("half").await.unwrap();
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    let again = app.lock("job").await.unwrap();
    assert_eq!(again.last_checkpoint(), Some(&b"half"[..]));
    let _ = again.release().await.unwrap();

    // Outside its prefix the user is refused with etcd's reason.
    let outside = connect(&cluster, "other/", Some(("app", "apppw"))).await;
    let err = outside.expect_err("a prefix outside the role must be refused");
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
    assert!(err.to_string().contains("permission denied"), "{err}");
    assert_eq!(
        err.store_failure(),
        Some(StoreFailure::Unauthorized),
        "{err:?}"
    );
    assert!(!err.is_retryable());

    for (creds, why) in [
        (Some(("app", "wrong")), "authentication failed"),
        (None, "user name is empty"),
    ] {
        let err = connect(&cluster, "app/", creds)
            .await
            .expect_err("must be refused");
        assert!(matches!(err, Error::Backend { .. }), "{err:?}");
        assert!(err.to_string().contains(why), "expected {why:?} in: {err}");
        assert_eq!(
            err.store_failure(),
            Some(StoreFailure::Unauthorized),
            "{err:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_client_certificates() {
    let cluster = EtcdCluster::start_tls();
    let files = cluster.tls.clone().unwrap();
    let read = |p: &std::path::Path| std::fs::read(p).unwrap();
    let good = EtcdTls::with_ca(read(&files.ca))
        .client_cert(read(&files.client_cert), read(&files.client_key));
    let config = |tls: EtcdTls| {
        EtcdConfig::new(cluster.endpoints())
            .ttl(common::TTL)
            .tls(tls)
    };

    let backend = EtcdBackend::connect(config(good)).await.unwrap();
    let guard = backend.lock("secure").await.unwrap();
    guard.fenced_put("k", "v").await.unwrap();
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);

    // Without a client certificate the server refuses the handshake.
    let err = EtcdBackend::connect(config(EtcdTls::with_ca(read(&files.ca))))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Backend { .. }), "{err:?}");
    // A CA that did not sign the server certificate: our side refuses.
    let other = fencelock_testsupport::TlsFiles::generate(&cluster.dir.join("other-ca"), "x");
    let wrong = EtcdTls::with_ca(read(&other.ca))
        .client_cert(read(&files.client_cert), read(&files.client_key));
    let err = EtcdBackend::connect(config(wrong)).await.unwrap_err();
    assert!(matches!(err, Error::Backend { .. }), "{err:?}");
    eprintln!("tls refusal reads: {err}");
}

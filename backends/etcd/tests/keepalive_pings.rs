//! Issue 13.9 / review F13: the client's HTTP/2 keepalive pings never provoke etcd's GOAWAY
//! `too_many_pings`: an idle client keeps its one connection, and etcd logs no ping complaint.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;

use std::time::Duration;

use fencelock::LockBackendExt;
use fencelock_etcd::EtcdBackend;
use fencelock_testsupport::{unique, EtcdCluster, TcpProxy};

/// A backend connected but idle (no session yet: no stream on its connection) for 25 s, then
/// a holder idle for 12 s, through a proxy that counts connections: a GOAWAY would make the
/// client reconnect. grpc-go allows a ping on a connection without streams only every 2 h and
/// sends GOAWAY after the third.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_client_is_never_sent_away_for_pinging_too_often() {
    let cluster = EtcdCluster::start(1);
    let proxy = TcpProxy::start(format!("127.0.0.1:{}", cluster.members[0].client_port)).await;
    let prefix = format!("{}/", unique("pings"));
    let backend = EtcdBackend::connect(common::config(vec![proxy.endpoint()], &prefix))
        .await
        .unwrap();
    let connected = proxy.connections();
    tokio::time::sleep(Duration::from_secs(25)).await;
    let idle = proxy.connections();
    let guard = backend.lock("idle").await.unwrap();
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert!(guard.is_held());
    guard.fenced_put("k", "v").await.unwrap();
    let held = proxy.connections();
    let logs = cluster.logs();
    for complaint in ["too_many_pings", "too many pings", "ENHANCE_YOUR_CALM"] {
        assert!(!logs.contains(complaint), "etcd logged `{complaint}`");
    }
    assert_eq!(
        (idle, held),
        (connected, connected),
        "the client reconnected: connections after connect, idle and holding"
    );
    let _ = guard.release().await.unwrap();
}

//! Loss detection: from cutting a client off to `lost`, and to the server handing the lock on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock::{LockBackend, LockBackendExt};
use fencelock_etcd::{EtcdBackend, EtcdConfig};
use fencelock_testsupport::{ProxyMode, TcpProxy};
use fencelock_zookeeper::{ZkBackend, ZkConfig};

use crate::servers::Servers;

const TTL: Duration = Duration::from_secs(4);

async fn measure(
    cut: &dyn LockBackend,
    other: Arc<dyn LockBackend>,
    proxy: &TcpProxy,
) -> (Duration, Duration) {
    let guard = cut.lock("loss").await.unwrap();
    proxy.set_mode(ProxyMode::BlackHole);
    let at = Instant::now();
    let waiter = tokio::spawn(async move {
        let next = other.lock("loss").await.unwrap();
        let granted = Instant::now();
        let _ = next.release().await;
        granted
    });
    guard.lost().await;
    let lost = at.elapsed();
    let granted = waiter.await.unwrap() - at;
    (lost, granted)
}

fn print(label: String, (lost, granted): (Duration, Duration)) {
    println!(
        "| {label} | {:.2} s | {:.2} s | {:.2} s | {:.2} |",
        lost.as_secs_f64(),
        granted.as_secs_f64(),
        granted.as_secs_f64() - lost.as_secs_f64(),
        lost.as_secs_f64() / TTL.as_secs_f64()
    );
}

pub async fn run(servers: &Servers) {
    println!(
        "\n### Loss detection: a client cut off by a black hole (TTL / session timeout {TTL:?})\n"
    );
    println!("| setup | cut to `lost` | cut to another client granted | margin | `lost` / TTL |\n|---|---|---|---|---|");
    let prefix = Servers::prefix();
    let proxy = TcpProxy::start(
        servers.etcd.endpoints()[0]
            .trim_start_matches("http://")
            .to_owned(),
    )
    .await;
    let cut = EtcdBackend::connect(EtcdConfig::new([proxy.endpoint()]).prefix(&prefix).ttl(TTL))
        .await
        .unwrap();
    let other = EtcdBackend::connect(
        EtcdConfig::new(servers.etcd.endpoints())
            .prefix(&prefix)
            .ttl(TTL),
    )
    .await
    .unwrap();
    print(
        servers.label("etcd"),
        measure(&cut, Arc::new(other), &proxy).await,
    );

    let base = Servers::base();
    let proxy = TcpProxy::start(servers.zk.connect_string()).await;
    let config = |connect: String| {
        ZkConfig::new(connect)
            .base_path(&base)
            .tick_time(fencelock_testsupport::ZK_TICK)
            .session_timeout(TTL)
    };
    let cut = ZkBackend::connect(config(format!("127.0.0.1:{}", proxy.port)))
        .await
        .unwrap();
    let other = ZkBackend::connect(config(servers.zk.connect_string()))
        .await
        .unwrap();
    print(
        servers.label("zookeeper"),
        measure(&cut, Arc::new(other), &proxy).await,
    );
}

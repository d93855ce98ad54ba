//! Client instructions per uncontended acquire + release, one client at a time, for a profile
//! (issue 20 item 1): `fencelock-bench cpu <etcd|zookeeper> <fencelock|raw|peer> <n>` runs a
//! warm-up, then `n` operations of that client only, against a single node it starts. Under
//! `valgrind --tool=callgrind`, (instructions at `n`) - (instructions at 0), divided by `n`, is
//! what one operation costs the client process (every thread: the caller, the runtime, the
//! client's connection tasks); `bench/cpu-profile` runs the six pairs and prints the table.

use std::time::Duration;

use fencelock::LockBackendExt;
use zookeeper_client::{Acls, CreateMode};

use crate::latency::{etcd_peer, etcd_raw, zk_peer, zk_raw};
use crate::servers::Servers;

/// Operations before the counted ones, in both runs of a pair (connections, JIT-free caches).
const WARMUP: usize = 20;

pub async fn run(store: &str, client: &str, n: usize) {
    let servers = Servers::start(1);
    match store {
        "etcd" => etcd(&servers, client, n).await,
        "zookeeper" => zookeeper(&servers, client, n).await,
        other => panic!("unknown store {other:?}: etcd or zookeeper"),
    }
}

async fn etcd(servers: &Servers, client: &str, n: usize) {
    let prefix = Servers::prefix();
    // Long leases: the client runs 50 times slower under valgrind.
    let config = fencelock_etcd::EtcdConfig::new(servers.etcd_endpoint())
        .prefix(&prefix)
        .ttl(Duration::from_secs(60));
    let backend = fencelock_etcd::EtcdBackend::connect(config).await.unwrap();
    let mut raw = etcd_client::Client::connect(servers.etcd_endpoint(), None)
        .await
        .unwrap();
    let lease = raw.lease_grant(600, None).await.unwrap().id();
    let key = format!("{prefix}raw/{lease:x}");
    for _ in 0..WARMUP + n {
        match client {
            "fencelock" => {
                let guard = backend.lock("cpu").await.unwrap();
                let _ = guard.release().await.unwrap();
            }
            "raw" => etcd_raw(&mut raw, &key, lease).await,
            "peer" => etcd_peer(&mut raw, format!("{prefix}peer"), lease).await,
            other => panic!("unknown client {other:?}: fencelock, raw or peer"),
        }
    }
}

async fn zookeeper(servers: &Servers, client: &str, n: usize) {
    let base = Servers::base();
    let config = fencelock_zookeeper::ZkConfig::new(servers.zk_connect())
        .base_path(&base)
        .tick_time(fencelock_testsupport::ZK_TICK)
        .session_timeout(Duration::from_secs(10));
    let backend = fencelock_zookeeper::ZkBackend::connect(config)
        .await
        .unwrap();
    let zk = zookeeper_client::Client::connect(&servers.zk_connect())
        .await
        .unwrap();
    let dir = format!("{base}/raw");
    zk.mkdir(&dir, &CreateMode::Persistent.with_acls(Acls::anyone_all()))
        .await
        .unwrap();
    let peer_dir = format!("{base}/peer");
    for _ in 0..WARMUP + n {
        match client {
            "fencelock" => {
                let guard = backend.lock("cpu").await.unwrap();
                let _ = guard.release().await.unwrap();
            }
            "raw" => zk_raw(&zk, &dir).await,
            "peer" => zk_peer(&zk, &peer_dir).await,
            other => panic!("unknown client {other:?}: fencelock, raw or peer"),
        }
    }
}

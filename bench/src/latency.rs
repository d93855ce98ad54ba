//! Uncontended acquire + release, against the same requests sent raw and against the peer
//! clients' own locks.
//!
//! The three run interleaved, round by round, with the first of each round rotating, after a
//! warm-up: a first version ran them one after the other and charged fencelock, which ran first,
//! with the servers' own warm-up (ZooKeeper's JIT above all), which made it look 1.8x slower than
//! the raw requests when it was not.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, LockOptions, PutOptions, Txn, TxnOp};
use fencelock::{LockBackend, LockBackendExt};
use zookeeper_client::{Acls, CreateMode, LockOptions as ZkLockOptions, LockPrefix};

use crate::servers::Servers;
use crate::stats::{ms, percentiles, ratio};

pub const WARMUP: usize = 300;
pub const ROUNDS: usize = 500;

/// One timed operation (shared with `semaphore`).
pub type Op<'a> = Box<dyn FnMut() -> Pin<Box<dyn Future<Output = ()> + 'a>> + 'a>;

/// One acquire + release on `backend`.
fn fencelock_op(backend: &dyn LockBackend) -> Op<'_> {
    Box::new(move || {
        Box::pin(async move {
            let guard = backend.lock("lat").await.unwrap();
            let _ = guard.release().await.unwrap();
        })
    })
}

/// p50 and p99 of each op, run round-robin (shared with `semaphore`).
pub async fn interleaved(mut ops: Vec<Op<'_>>) -> Vec<(Duration, Duration)> {
    let count = ops.len();
    let mut samples = vec![Vec::with_capacity(ROUNDS); count];
    for round in 0..WARMUP + ROUNDS {
        for j in 0..count {
            let i = (round + j) % count;
            let start = Instant::now();
            ops[i]().await;
            if round >= WARMUP {
                samples[i].push(start.elapsed());
            }
        }
    }
    samples.iter_mut().map(|s| percentiles(s)).collect()
}

fn rows(label: &str, what: [&str; 3], figures: &[(Duration, Duration)]) {
    let (raw, peer) = (figures[1].0, figures[2].0);
    for (what, (p50, p99)) in what.iter().zip(figures) {
        println!(
            "| {label} | {what} | {} | {} | {} | {} |",
            ms(*p50),
            ms(*p99),
            ratio(*p50, raw),
            ratio(*p50, peer)
        );
    }
}

pub async fn run(servers: &Servers) {
    println!(
        "\n### Uncontended acquire + release ({}; {ROUNDS} rounds after {WARMUP} warm-up, the three clients interleaved)\n",
        servers.member0()
    );
    println!(
        "| setup | client | p50 | p99 | p50 / raw limit | p50 / peer |\n|---|---|---|---|---|---|"
    );
    etcd(servers).await;
    zookeeper(servers).await;
}

async fn etcd(servers: &Servers) {
    let clients = EtcdClients::start(servers).await;
    let figures = interleaved(clients.ops()).await;
    rows(
        &servers.label("etcd"),
        [
            "fencelock",
            "raw: 2 Txns",
            "peer: etcd-client lock/unlock RPCs",
        ],
        &figures,
    );
}

async fn zookeeper(servers: &Servers) {
    let clients = ZkClients::start(servers).await;
    let figures = interleaved(clients.ops()).await;
    rows(
        &servers.label("zookeeper"),
        [
            "fencelock",
            "raw: create, list, delete",
            "peer: zookeeper-client Client::lock",
        ],
        &figures,
    );
}

/// The three etcd clients of an uncontended acquire + release, each on a name of its own
/// (shared with `cpu`).
pub struct EtcdClients {
    backend: fencelock_etcd::EtcdBackend,
    /// Used by one operation at a time: a clone per operation (eight gRPC clients) cost
    /// the raw and peer clients about 11 k instructions each, which fencelock does not pay.
    client: tokio::sync::Mutex<etcd_client::Client>,
    lease: i64,
    raw_key: String,
    peer_name: String,
}

impl EtcdClients {
    pub async fn start(servers: &Servers) -> Self {
        let prefix = Servers::prefix();
        let backend = servers.etcd_backend(&prefix).await;
        let client = etcd_client::Client::connect(servers.etcd_endpoint(), None)
            .await
            .unwrap();
        let lease = client.clone().lease_grant(60, None).await.unwrap().id();
        EtcdClients {
            backend,
            client: tokio::sync::Mutex::new(client),
            lease,
            raw_key: format!("{prefix}raw/{lease:x}"),
            peer_name: format!("{prefix}peer"),
        }
    }

    /// fencelock, raw, peer.
    pub fn ops(&self) -> Vec<Op<'_>> {
        let lease = self.lease;
        // The operations run one after another: the lock is never contended.
        let raw: Op = Box::new(move || {
            Box::pin(async move {
                let mut client = self.client.lock().await;
                etcd_raw(&mut client, &self.raw_key, lease).await;
            })
        });
        let peer: Op = Box::new(move || {
            Box::pin(async move {
                let mut client = self.client.lock().await;
                etcd_peer(&mut client, self.peer_name.clone(), lease).await;
            })
        });
        vec![fencelock_op(&self.backend), raw, peer]
    }
}

/// The three ZooKeeper clients of an uncontended acquire + release, each in a directory of its
/// own (shared with `cpu`).
pub struct ZkClients {
    backend: fencelock_zookeeper::ZkBackend,
    zk: zookeeper_client::Client,
    dir: String,
    peer_dir: String,
}

impl ZkClients {
    pub async fn start(servers: &Servers) -> Self {
        let base = Servers::base();
        let backend = servers.zk_backend(&base).await;
        let zk = zookeeper_client::Client::connect(&servers.zk_connect())
            .await
            .unwrap();
        let dir = format!("{base}/raw");
        zk.mkdir(&dir, &CreateMode::Persistent.with_acls(Acls::anyone_all()))
            .await
            .unwrap();
        ZkClients {
            backend,
            zk,
            dir,
            peer_dir: format!("{base}/peer"),
        }
    }

    /// fencelock, raw, peer.
    pub fn ops(&self) -> Vec<Op<'_>> {
        let raw: Op = Box::new(move || Box::pin(zk_raw(&self.zk, &self.dir)));
        let peer: Op = Box::new(move || Box::pin(zk_peer(&self.zk, &self.peer_dir)));
        vec![fencelock_op(&self.backend), raw, peer]
    }
}

/// The raw etcd lock (shared with `many`): a put of `key` under `lease` if it is absent, then a
/// delete of that very key (compared on its create revision).
pub async fn etcd_raw(client: &mut etcd_client::Client, key: &str, lease: i64) {
    let put = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key,
            "",
            Some(PutOptions::new().with_lease(lease)),
        )]);
    let rev = client.txn(put).await.unwrap().header().unwrap().revision();
    let delete = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, rev)])
        .and_then([TxnOp::delete(key, None)]);
    client.txn(delete).await.unwrap();
}

/// The etcd peer (shared with `many`): etcd-client's lock RPC on `name` under `lease`, then
/// unlock.
pub async fn etcd_peer(client: &mut etcd_client::Client, name: String, lease: i64) {
    let options = LockOptions::new().with_lease(lease);
    let locked = client.lock(name, Some(options)).await.unwrap();
    client.unlock(locked.key().to_vec()).await.unwrap();
}

/// The raw ZooKeeper lock (shared with `many`): a sequential node in `dir`, the listing that
/// finds it first, its delete.
pub async fn zk_raw(zk: &zookeeper_client::Client, dir: &str) {
    let mode = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    let (_, seq) = zk.create(&format!("{dir}/n-"), b"", &mode).await.unwrap();
    zk.list_children(dir).await.unwrap();
    zk.delete(&format!("{dir}/n-{seq}"), None).await.unwrap();
}

/// The ZooKeeper peer (shared with `many`): zookeeper-client's `Client::lock` in `dir`.
pub async fn zk_peer(zk: &zookeeper_client::Client, dir: &str) {
    let options = ZkLockOptions::new(Acls::anyone_all())
        .with_ancestor_options(CreateMode::Persistent.with_acls(Acls::anyone_all()))
        .unwrap();
    let prefix = LockPrefix::new_curator(dir, "lock-").unwrap();
    let lock = zk.lock(prefix, b"", options).await.unwrap();
    // Its drop deletes in the background; delete here to time a synchronous release.
    zk.delete(lock.lock_path(), None).await.unwrap();
}

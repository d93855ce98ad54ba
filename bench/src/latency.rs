//! Uncontended acquire + release, against the same requests sent raw and against the peer
//! clients' own locks.

use std::future::Future;
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, LockOptions, PutOptions, Txn, TxnOp};
use fencelock::LockBackendExt;
use zookeeper_client::{Acls, CreateMode, LockOptions as ZkLockOptions, LockPrefix};

use crate::servers::Servers;
use crate::stats::{ms, percentiles, ratio};

const ROUNDS: usize = 300;

async fn measure<F, Fut>(mut op: F) -> (Duration, Duration)
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = ()>,
{
    for i in 0..20 {
        op(i).await; // warm-up
    }
    let mut samples = Vec::with_capacity(ROUNDS);
    for i in 0..ROUNDS {
        let start = Instant::now();
        op(i).await;
        samples.push(start.elapsed());
    }
    percentiles(&mut samples)
}

fn row(
    label: &str,
    what: &str,
    (p50, p99): (Duration, Duration),
    raw: (Duration, Duration),
    peer: (Duration, Duration),
) {
    println!(
        "| {label} | {what} | {} | {} | {} | {} |",
        ms(p50),
        ms(p99),
        ratio(p50, raw.0),
        ratio(p50, peer.0)
    );
}

pub async fn run(servers: &Servers) {
    println!("\n### Uncontended acquire + release ({ROUNDS} rounds after 20 warm-up)\n");
    println!(
        "| setup | client | p50 | p99 | p50 / raw limit | p50 / peer |\n|---|---|---|---|---|---|"
    );
    // etcd
    let label = servers.label("etcd");
    let prefix = Servers::prefix();
    let backend = servers.etcd_backend(&prefix).await;
    let ours = measure(|_| async {
        let guard = backend.lock("lat").await.unwrap();
        let _ = guard.release().await.unwrap();
    })
    .await;
    let mut client = etcd_client::Client::connect(servers.etcd.endpoints(), None)
        .await
        .unwrap();
    let lease = client.lease_grant(60, None).await.unwrap().id();
    let raw_key = format!("{prefix}raw/{lease:x}");
    let raw = measure(|_| {
        let (mut client, key) = (client.clone(), raw_key.clone());
        async move {
            let put = Txn::new()
                .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key.as_str(),
                    "",
                    Some(PutOptions::new().with_lease(lease)),
                )]);
            let rev = client.txn(put).await.unwrap().header().unwrap().revision();
            let delete = Txn::new()
                .when([Compare::create_revision(
                    key.as_str(),
                    CompareOp::Equal,
                    rev,
                )])
                .and_then([TxnOp::delete(key.as_str(), None)]);
            client.txn(delete).await.unwrap();
        }
    })
    .await;
    let peer = measure(|_| {
        let (mut client, name) = (client.clone(), format!("{prefix}peer"));
        async move {
            let locked = client
                .lock(name, Some(LockOptions::new().with_lease(lease)))
                .await
                .unwrap();
            client.unlock(locked.key().to_vec()).await.unwrap();
        }
    })
    .await;
    row(&label, "fencelock", ours, raw, peer);
    row(&label, "raw: 2 Txns", raw, raw, peer);
    row(
        &label,
        "peer: etcd-client lock/unlock RPCs",
        peer,
        raw,
        peer,
    );

    // ZooKeeper
    let label = servers.label("zookeeper");
    let base = Servers::base();
    let backend = servers.zk_backend(&base).await;
    let ours = measure(|_| async {
        let guard = backend.lock("lat").await.unwrap();
        let _ = guard.release().await.unwrap();
    })
    .await;
    let zk = zookeeper_client::Client::connect(&servers.zk.connect_string())
        .await
        .unwrap();
    let dir = format!("{base}/raw");
    zk.mkdir(&dir, &CreateMode::Persistent.with_acls(Acls::anyone_all()))
        .await
        .unwrap();
    let raw = measure(|_| {
        let (zk, dir) = (&zk, dir.clone());
        async move {
            let (_, seq) = zk
                .create(
                    &format!("{dir}/n-"),
                    b"",
                    &CreateMode::EphemeralSequential.with_acls(Acls::anyone_all()),
                )
                .await
                .unwrap();
            zk.list_children(&dir).await.unwrap();
            zk.delete(&format!("{dir}/n-{seq}"), None).await.unwrap();
        }
    })
    .await;
    let peer_dir = format!("{base}/peer");
    let peer = measure(|_| {
        let (zk, dir) = (&zk, peer_dir.clone());
        async move {
            let options = ZkLockOptions::new(Acls::anyone_all())
                .with_ancestor_options(CreateMode::Persistent.with_acls(Acls::anyone_all()))
                .unwrap();
            let lock = zk
                .lock(
                    LockPrefix::new_curator(&dir, "lock-").unwrap(),
                    b"",
                    options,
                )
                .await
                .unwrap();
            // Its drop deletes in the background; delete here to time a synchronous release.
            zk.delete(lock.lock_path(), None).await.unwrap();
        }
    })
    .await;
    row(&label, "fencelock", ours, raw, peer);
    row(&label, "raw: create, list, delete", raw, raw, peer);
    row(
        &label,
        "peer: zookeeper-client Client::lock",
        peer,
        raw,
        peer,
    );
}

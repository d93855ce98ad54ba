//! Semaphores (issue 17): uncontended permit acquire + release against the same requests sent
//! raw, and handoff with N permits ([`handoff`]).
//!
//! The raw side sends what the backends' semaphore protocol sends on the request path (read
//! from `backends/*/src/semaphore.rs` and `backend.rs`), in the same order; it leaves out what
//! fencelock sends off that path (the held-key watch messages), as `latency` does for locks.
//! As Curator's `InterProcessSemaphoreV2`, fencelock deletes the gate before the grant
//! returns (so another instance's try right after it finds the way open), and the permit at
//! the release; the raw side does the same.

mod handoff;

use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp};
use fencelock::{LockBackend, Semaphore};
use zookeeper_client::{Acls, CreateMode};

use crate::latency::{interleaved, Op, ROUNDS, WARMUP};
use crate::servers::Servers;
use crate::stats::{ms, ratio};

/// A value the size of fencelock's (`permits=<k> <millis>-<nonce> <owner>`), so that both sides
/// write as many bytes.
const VALUE: &str = "permits=1 1733000000000-00000000000000ab fencelock/1 host=bench pid=1";

pub async fn run(servers: &Servers) {
    println!(
        "\n### Semaphore: uncontended permit acquire + release ({}; 1 permit; {ROUNDS} rounds after {WARMUP} warm-up, interleaved)\n",
        servers.member0()
    );
    println!("| setup | client | p50 | p99 | p50 / raw |\n|---|---|---|---|---|");
    etcd(servers).await;
    zookeeper(servers).await;
    handoff::run(servers).await;
}

/// One permit acquire + release on `backend`.
fn fencelock_op(backend: &dyn LockBackend) -> Op<'_> {
    Box::new(move || {
        Box::pin(async move {
            let pool = Semaphore::new(backend, "lat", 1).unwrap();
            let permit = pool.acquire().await.unwrap();
            let _ = permit.release().await.unwrap();
        })
    })
}

fn rows<const N: usize>(label: &str, what: [&str; N], figures: &[(Duration, Duration)]) {
    let raw = figures[1].0;
    for (what, (p50, p99)) in what.iter().zip(figures) {
        println!(
            "| {label} | {what} | {} | {} | {} |",
            ms(*p50),
            ms(*p99),
            ratio(*p50, raw)
        );
    }
}

/// Sorted by create revision, as the gate's owner Range and the permits' count read.
fn by_creation() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
}

async fn etcd(servers: &Servers) {
    let prefix = Servers::prefix();
    let backend = servers.etcd_backend(&prefix).await;
    let client = etcd_client::Client::connect(servers.etcd_endpoint(), None)
        .await
        .unwrap();
    let lease = client.clone().lease_grant(60, None).await.unwrap().id();
    let (locks, leases) = (
        format!("{prefix}raw/locks/"),
        format!("{prefix}raw/leases/"),
    );
    let (gate, checkpoint) = (
        format!("{locks}{lease:x}"),
        format!("{prefix}.state/raw/__checkpoint"),
    );
    let ours = fencelock_op(&backend);
    let raw: Op = Box::new(|| {
        let mut client = client.clone();
        let (gate, locks, leases, checkpoint) = (&gate, &locks, &leases, &checkpoint);
        Box::pin(async move {
            let with_lease = || Some(PutOptions::new().with_lease(lease));
            // The gate: a Go Mutex's enqueue Txn (uncontended, so it is the grant).
            let enqueue = Txn::new()
                .when([Compare::create_revision(gate.as_str(), CompareOp::Equal, 0)])
                .and_then([
                    TxnOp::put(gate.as_str(), VALUE, with_lease()),
                    TxnOp::get(locks.as_str(), Some(by_creation().with_limit(1))),
                    TxnOp::get(checkpoint.as_str(), None),
                ])
                .or_else([TxnOp::get(gate.as_str(), None)]);
            let gated = client
                .txn(enqueue)
                .await
                .unwrap()
                .header()
                .unwrap()
                .revision();
            // The permit key, put and counted while the gate key is ours.
            let permit = format!("{leases}{lease:x}-{gated:x}");
            let put = Txn::new()
                .when([
                    Compare::create_revision(gate.as_str(), CompareOp::Equal, gated),
                    Compare::create_revision(permit.as_str(), CompareOp::Equal, 0),
                ])
                .and_then([
                    TxnOp::put(permit.as_str(), VALUE, with_lease()),
                    TxnOp::get(leases.as_str(), Some(by_creation())),
                ]);
            let held = client.txn(put).await.unwrap().header().unwrap().revision();
            let delete = |key: &str, created: i64| {
                let txn = Txn::new()
                    .when([Compare::create_revision(key, CompareOp::Equal, created)])
                    .and_then([TxnOp::delete(key, None)]);
                let mut client = client.clone();
                async move { client.txn(txn).await.unwrap() }
            };
            delete(gate, gated).await;
            delete(&permit, held).await;
        })
    });
    let figures = interleaved(vec![ours, raw]).await;
    rows(
        &servers.label("etcd"),
        [
            "fencelock",
            "raw: gate Txn, permit put+count Txn, gate delete Txn; permit delete Txn",
        ],
        &figures,
    );
}

async fn zookeeper(servers: &Servers) {
    let base = Servers::base();
    let backend = servers.zk_backend(&base).await;
    let zk = zookeeper_client::Client::connect(&servers.zk_connect())
        .await
        .unwrap();
    let (gate_dir, leases_dir) = (format!("{base}/raw/locks"), format!("{base}/raw/leases"));
    let checkpoint = format!("{base}/.state/raw/__checkpoint");
    for dir in [&gate_dir, &leases_dir] {
        zk.mkdir(dir, &CreateMode::Persistent.with_acls(Acls::anyone_all()))
            .await
            .unwrap();
    }
    // Declared before the ops, which share one lifetime; tags stay unique across both ops.
    let rounds = std::sync::atomic::AtomicU64::new(0);
    let ours = fencelock_op(&backend);
    // The same requests sent by hand, with the count check as fencelock sends it (one
    // multi-read that also admits) or as it did before (`earlier`: getData, getChildren, and a
    // watched getChildren that admits).
    let raw_op = |earlier: bool| -> Op {
        let (zk, gate_dir, leases_dir, checkpoint, rounds) =
            (&zk, &gate_dir, &leases_dir, &checkpoint, &rounds);
        Box::new(move || {
            // As long as a uuid, as fencelock's and Curator's `_c_<uuid>` tags are.
            let round = rounds.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let id = format!("{round:036x}");
            Box::pin(async move {
                let ephemeral = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
                let gate = format!("{gate_dir}/_c_{id}-lock-");
                let (_, seq) = zk.create(&gate, b"", &ephemeral).await.unwrap();
                // The gate's turn: its children and the checkpoint in one multi-read.
                let mut reader = zk.new_multi_reader();
                reader.add_get_children(gate_dir).unwrap();
                reader.add_get_data(checkpoint).unwrap();
                reader.commit().await.unwrap();
                let lease = format!("{leases_dir}/_c_{id}-lease-");
                let (_, lease_seq) = zk.create(&lease, b"", &ephemeral).await.unwrap();
                if earlier {
                    zk.get_data(leases_dir).await.unwrap();
                    zk.list_children(leases_dir).await.unwrap();
                    drop(zk.list_and_watch_children(leases_dir).await.unwrap());
                } else {
                    let mut reader = zk.new_multi_reader();
                    reader.add_get_data(leases_dir).unwrap();
                    reader.add_get_children(leases_dir).unwrap();
                    reader.commit().await.unwrap();
                }
                let (gate, lease) = (format!("{gate}{seq}"), format!("{lease}{lease_seq}"));
                zk.delete(&gate, None).await.unwrap();
                zk.delete(&lease, None).await.unwrap();
            })
        })
    };
    let (raw, earlier) = (raw_op(false), raw_op(true));
    let figures = interleaved(vec![ours, raw, earlier]).await;
    rows(
        &servers.label("zookeeper"),
        [
            "fencelock",
            "raw: gate create, gate multi-read, lease create, one multi-read of the count and the leases, gate delete; lease delete",
            "raw, as fencelock did before: getData + getChildren + a watched getChildren of the leases instead",
        ],
        &figures,
    );
}

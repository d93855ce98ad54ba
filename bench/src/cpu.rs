//! Client instructions per uncontended acquire + release, one client at a time, for a profile
//! (issue 20 item 1): `fencelock-bench cpu <etcd|zookeeper> <fencelock|raw|peer> <n>` runs a
//! warm-up, then `n` operations of that client only, against a single node it starts. Under
//! `valgrind --tool=callgrind`, (instructions at `n`) - (instructions at 0), divided by `n`, is
//! what one operation costs the client process (every thread: the caller, the runtime, the
//! client's connection tasks); `bench/cpu-profile` runs the seven pairs and prints the table.
//! For etcd, `same` is fencelock's own requests sent raw: fencelock's count minus its count is
//! what fencelock's client does besides sending them.
//! `FENCELOCK_BENCH_HOLD_MS` holds each lock that long before its release.

use crate::latency::{EtcdClients, ZkClients};
use crate::servers::Servers;

/// Operations before the counted ones, in both runs of a pair (connections, caches).
const WARMUP: usize = 20;

pub async fn run(store: &str, client: &str, n: usize) {
    // `FENCELOCK_BENCH_HOLD_MS=<ms>`: each op holds its lock that long (the caller's thread
    // sleeps), as a lock is held for some work, so that what the client does while a lock is
    // held (the held-key watch) is counted as it happens in use.
    if let Some(ms) = std::env::var("FENCELOCK_BENCH_HOLD_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
    {
        let _ = crate::latency::HOLD.set(std::time::Duration::from_millis(ms));
    }
    let servers = Servers::start(1);
    let which = ["fencelock", "raw", "peer", "same"]
        .iter()
        .position(|c| *c == client)
        .unwrap_or_else(|| {
            panic!("unknown client {client:?}: fencelock, raw, peer or same (etcd only)")
        });
    let (etcd, zk);
    let mut ops = match store {
        "etcd" => {
            etcd = EtcdClients::start(&servers).await;
            etcd.ops()
        }
        "zookeeper" => {
            zk = ZkClients::start(&servers).await;
            zk.ops()
        }
        other => panic!("unknown store {other:?}: etcd or zookeeper"),
    };
    assert!(which < ops.len(), "no client {client:?} for {store}");
    let mut op = ops.swap_remove(which);
    for _ in 0..WARMUP + n {
        op().await;
    }
}

//! Client instructions per uncontended acquire + release, one client at a time, for a profile
//! (issue 20 item 1): `fencelock-bench cpu <etcd|zookeeper> <fencelock|raw|peer> <n>` runs a
//! warm-up, then `n` operations of that client only, against a single node it starts. Under
//! `valgrind --tool=callgrind`, (instructions at `n`) - (instructions at 0), divided by `n`, is
//! what one operation costs the client process (every thread: the caller, the runtime, the
//! client's connection tasks); `bench/cpu-profile` runs the six pairs and prints the table.

use crate::latency::{EtcdClients, ZkClients};
use crate::servers::Servers;

/// Operations before the counted ones, in both runs of a pair (connections, caches).
const WARMUP: usize = 20;

pub async fn run(store: &str, client: &str, n: usize) {
    let servers = Servers::start(1);
    let which = ["fencelock", "raw", "peer"]
        .iter()
        .position(|c| *c == client)
        .unwrap_or_else(|| panic!("unknown client {client:?}: fencelock, raw or peer"));
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
    let mut op = ops.swap_remove(which);
    for _ in 0..WARMUP + n {
        op().await;
    }
}

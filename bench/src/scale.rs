//! Many locks held by one backend instance: memory, renewal traffic, acquire latency at load.

use std::time::{Duration, Instant};

use fencelock::{LockBackend, LockBackendExt, LockGuard};
use fencelock_testsupport::four_letter;

use crate::servers::Servers;
use crate::stats::{ms, percentiles};

const LOCKS: usize = 10_000;

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

async fn hold_many(backend: &dyn LockBackend) -> (Vec<LockGuard>, Duration, i64) {
    let before = rss_bytes();
    let mut guards = Vec::with_capacity(LOCKS);
    let mut tail = Vec::new();
    for i in 0..LOCKS {
        let start = Instant::now();
        guards.push(backend.lock(&format!("l{i}")).await.unwrap());
        if i >= LOCKS - 200 {
            tail.push(start.elapsed());
        }
    }
    let grown = i64::try_from(rss_bytes()).unwrap_or(0) - i64::try_from(before).unwrap_or(0);
    (
        guards,
        percentiles(&mut tail).0,
        grown / i64::try_from(LOCKS).unwrap_or(1),
    )
}

fn zk_received(servers: &Servers) -> u64 {
    four_letter(servers.zk.members[0].client_port, "srvr")
        .lines()
        .find_map(|l| l.strip_prefix("Received: "))
        .and_then(|n| n.trim().parse::<u64>().ok())
        .unwrap_or(0)
}

pub async fn run(servers: &Servers) {
    println!("\n### Scale: {LOCKS} locks held by one backend instance\n");
    println!(
        "| setup | client memory per held lock (RSS growth) | acquire p50 at that load | renewal traffic in 10 s, 1 lock held | the same, {LOCKS} held |\n|---|---|---|---|---|"
    );

    let backend = servers.etcd_backend(&Servers::prefix()).await;
    let keepalives = |s: &Servers| s.etcd.rpc_count(0, "LeaseKeepAlive");
    let one = backend.lock("one").await.unwrap();
    let k0 = keepalives(servers);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let idle = keepalives(servers) - k0;
    let (guards, p50, per_lock) = hold_many(&backend).await;
    let k1 = keepalives(servers);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let loaded = keepalives(servers) - k1;
    println!(
        "| {} | {per_lock} B | {} | {idle} keepalives | {loaded} keepalives |",
        servers.label("etcd"),
        ms(p50)
    );
    drop(guards);
    drop(one);

    let backend = servers.zk_backend(&Servers::base()).await;
    let one = backend.lock("one").await.unwrap();
    let r0 = zk_received(servers);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let idle = zk_received(servers) - r0;
    let (guards, p50, per_lock) = hold_many(&backend).await;
    let r1 = zk_received(servers);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let loaded = zk_received(servers) - r1;
    println!(
        "| {} | {per_lock} B | {} | {idle} requests (probes, pings) | {loaded} requests |",
        servers.label("zookeeper"),
        ms(p50)
    );
    drop(guards);
    drop(one);
}

//! Many locks held by one backend instance: memory, renewal traffic, acquire latency at load.

use std::time::{Duration, Instant};

use fencelock::{LockBackend, LockBackendExt, LockGuard};
use fencelock_testsupport::four_letter;

use crate::servers::Servers;
use crate::stats::{ms, percentiles};

const LOCKS: usize = 10_000;

/// Heap bytes live now, from the counting allocator: exact, unlike RSS, which the allocator's
/// reuse of memory freed by an earlier phase made negative in a first version.
///
/// `stats_alloc` already adds a realloc's growth to `bytes_allocated` (and its shrinking to
/// `bytes_deallocated`); `bytes_reallocated` is the same delta again, so it is not added: doing
/// so counted every transient buffer grown in place (h2 and prost frames, per acquire) as
/// live memory after it was freed.
fn live_heap() -> i128 {
    let stats = crate::ALLOCATOR.stats();
    let allocated = i128::try_from(stats.bytes_allocated).unwrap_or(i128::MAX);
    let freed = i128::try_from(stats.bytes_deallocated).unwrap_or(i128::MAX);
    allocated - freed
}

async fn hold_many(backend: &dyn LockBackend) -> (Vec<LockGuard>, Duration, i128) {
    let before = live_heap();
    let mut guards = Vec::with_capacity(LOCKS);
    let mut tail = Vec::new();
    for i in 0..LOCKS {
        let start = Instant::now();
        guards.push(backend.lock(&format!("l{i}")).await.unwrap());
        if i >= LOCKS - 200 {
            tail.push(start.elapsed());
        }
    }
    // Let the background work of the last grants (ZooKeeper's watcher bookkeeping, etcd's
    // response buffers) settle before reading.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let grown = live_heap() - before;
    (guards, percentiles(&mut tail).0, grown / LOCKS as i128)
}

fn zk_received(servers: &Servers) -> u64 {
    four_letter(servers.zk.members[0].client_port, "srvr")
        .lines()
        .find_map(|l| l.strip_prefix("Received: "))
        .and_then(|n| n.trim().parse::<u64>().ok())
        .unwrap_or(0)
}

/// From `connect` to the first grant on a fresh instance (its session opened by that
/// acquire), the median of a few; each instance is closed after.
async fn first_grant<B: LockBackend, F: std::future::Future<Output = B>>(
    connect: impl Fn() -> F,
) -> Duration {
    let mut took = Vec::new();
    for i in 0..STARTS {
        let start = Instant::now();
        let backend = connect().await;
        let guard = backend.lock(&format!("first{i}")).await.unwrap();
        took.push(start.elapsed());
        let _ = guard.release().await;
        backend.close().await.unwrap();
    }
    percentiles(&mut took).0
}

const STARTS: usize = 7;

pub async fn run(servers: &Servers) {
    println!("\n### Scale: {LOCKS} locks held by one backend instance\n");
    println!(
        "| setup | connect to first grant (median of {STARTS}) | client heap per held lock (counting allocator) | acquire p50 at that load | renewal traffic in 10 s, 1 lock held | the same, {LOCKS} held |\n|---|---|---|---|---|---|"
    );

    let startup = first_grant(|| {
        let prefix = Servers::prefix();
        async move { servers.etcd_backend(&prefix).await }
    })
    .await;
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
        "| {} | {} | {per_lock} B | {} | {idle} keepalives | {loaded} keepalives |",
        servers.label("etcd"),
        ms(startup),
        ms(p50)
    );
    drop(guards);
    drop(one);

    let startup = first_grant(|| {
        let base = Servers::base();
        async move { servers.zk_backend(&base).await }
    })
    .await;
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
        "| {} | {} | {per_lock} B | {} | {idle} requests (probes, pings) | {loaded} requests |",
        servers.label("zookeeper"),
        ms(startup),
        ms(p50)
    );
    drop(guards);
    drop(one);
}

#[cfg(test)]
mod tests {
    use super::live_heap;

    /// A buffer grown in place (realloc) and then freed leaves nothing live: transient buffers
    /// that grow during an acquire must not count as memory per held lock.
    #[test]
    fn a_buffer_grown_and_freed_leaves_no_live_heap() {
        let before = live_heap();
        let mut buffer: Vec<u8> = Vec::with_capacity(16);
        for size in [1 << 12, 1 << 16, 1 << 20] {
            buffer.reserve_exact(size - buffer.len());
            buffer.resize(size, 1);
        }
        std::hint::black_box(&buffer);
        drop(buffer);
        let left = live_heap() - before;
        // Other threads of the test harness may allocate a little meanwhile.
        assert!(left.abs() < 64 * 1024, "{left} bytes still counted live");
    }
}

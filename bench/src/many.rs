//! Many locks at once, as a service uses a lock library: K tasks in one process, each acquiring
//! and releasing a name of its own in a loop, for fencelock (one backend instance), the same
//! requests sent raw (one client) and the peer client (one client), at the same K. Then one
//! name contended by K tasks of one process: fencelock hands it on within the process (the
//! per-name turn), so its rate is measured against one task's raw loop, which is what a
//! handover that adds no round trip costs.
//!
//! Client CPU per operation is this process's user + system time (from `/proc/self/stat`, in
//! 10 ms ticks) over the operations: the servers are other processes.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fencelock::{LockBackend, LockBackendExt};
use zookeeper_client::{Acls, CreateMode};

use crate::latency::{etcd_peer, etcd_raw, unmarked, zk_peer, zk_raw};
use crate::servers::Servers;
use crate::stats::{cpu_time, ms, percentiles};

const KS: [usize; 4] = [1, 16, 256, 1024];
/// How long each client runs at each K.
const SPAN: Duration = Duration::from_secs(3);
/// The raw and peer etcd leases' TTL in seconds: longer than the whole run.
const LEASE: i64 = 600;

/// One acquire + release by task `i`.
type Op = Arc<dyn Fn(usize) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

struct Figures {
    per_sec: f64,
    p50: Duration,
    p99: Duration,
    cpu_per_op: Duration,
}

/// One timed stretch of `measure`: every sample, and the wall and CPU time it took.
#[derive(Default)]
struct Stretch {
    samples: Vec<Duration>,
    elapsed: Duration,
    cpu: Duration,
}

impl Stretch {
    /// Two stretches of the same client as one.
    fn and(mut self, other: Stretch) -> Stretch {
        self.samples.extend(other.samples);
        self.elapsed += other.elapsed;
        self.cpu += other.cpu;
        self
    }

    fn figures(mut self) -> Figures {
        let ops = self.samples.len().max(1);
        let (p50, p99) = percentiles(&mut self.samples);
        Figures {
            per_sec: ops as f64 / self.elapsed.as_secs_f64(),
            p50,
            p99,
            cpu_per_op: self.cpu / u32::try_from(ops).unwrap_or(u32::MAX),
        }
    }
}

/// Runs `k` tasks, each calling `op` in a loop for half of [`SPAN`] (a figure is two or more
/// such halves: `mirrored`).
async fn measure(k: usize, op: &Op) -> Stretch {
    // A round of each task first, so that no figure includes setup (sessions, directories).
    let warm: Vec<_> = (0..k).map(|i| tokio::spawn(op(i))).collect();
    for task in warm {
        task.await.unwrap();
    }
    let samples = Arc::new(Mutex::new(Vec::new()));
    let (start, cpu) = (Instant::now(), cpu_time());
    let tasks: Vec<_> = (0..k)
        .map(|i| {
            let (op, samples) = (Arc::clone(op), Arc::clone(&samples));
            tokio::spawn(async move {
                let mut mine = Vec::new();
                while start.elapsed() < SPAN / 2 {
                    let at = Instant::now();
                    op(i).await;
                    mine.push(at.elapsed());
                }
                samples.lock().unwrap().extend(mine);
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let (elapsed, cpu) = (start.elapsed(), cpu_time().saturating_sub(cpu));
    let samples = std::mem::take(&mut *samples.lock().unwrap());
    Stretch {
        samples,
        elapsed,
        cpu,
    }
}

fn row(setup: &str, names: &str, k: usize, client: &str, f: &Figures, base: f64) {
    println!(
        "| {setup} | {names} | {k} | {client} | {:.0} | {} | {} | {:.0} µs | {:.2}x |",
        f.per_sec,
        ms(f.p50),
        ms(f.p99),
        f.cpu_per_op.as_secs_f64() * 1e6,
        f.per_sec / base
    );
}

/// Halves of [`SPAN`] in a profile's one figure.
const PROFILE_HALVES: usize = 10;

/// `FENCELOCK_BENCH_PROFILE=<fencelock|raw|peer>:<K>`: that client alone on names of its own at
/// K, for one figure of [`PROFILE_HALVES`] halves and no other row, e.g. under `perf record`
/// (a profile of the whole table would mix the clients).
fn profile_target() -> Option<(String, usize)> {
    let target = std::env::var("FENCELOCK_BENCH_PROFILE").ok()?;
    let parsed = target
        .split_once(':')
        .and_then(|(client, k)| Some((client.to_owned(), k.parse().ok().filter(|&k| k > 0)?)));
    Some(parsed.unwrap_or_else(|| {
        panic!("FENCELOCK_BENCH_PROFILE={target:?}: <fencelock|raw|peer>:<K>, e.g. fencelock:256")
    }))
}

/// Each K: fencelock, raw and peer on names of their own; then, each K > 1, fencelock and the
/// peer on one name against one raw task's loop. Every figure is two halves taken in mirrored
/// order around the others of its K (raw, fencelock, peer, then peer, fencelock, raw), so that
/// servers that slow down as they take writes charge every client alike: on a 3-node etcd, the
/// same raw loop ran 20-30% slower after the own-name rows than before them (a probe: one name
/// contended by 16 tasks, 644 ops/s on a fresh cluster, 463-527 after 3 s of 1,024 tasks on
/// their own names). With `FENCELOCK_BENCH_PROFILE`, only that client's one figure.
async fn table(setup: &str, ours: Op, raw: Op, peer: Op, ours_one: Op, peer_one: Op) {
    if let Some((client, k)) = profile_target() {
        let op = match client.as_str() {
            "fencelock" => &ours,
            "raw" => &raw,
            "peer" => &peer,
            other => panic!("FENCELOCK_BENCH_PROFILE: unknown client {other:?}"),
        };
        let mut all = Stretch::default();
        for _ in 0..PROFILE_HALVES {
            all = all.and(measure(k, op).await);
        }
        let figures = all.figures();
        row(setup, "own", k, &client, &figures, figures.per_sec);
        return;
    }
    for k in KS {
        let [raw_figures, ours_figures, peer_figures] =
            mirrored([(k, &raw), (k, &ours), (k, &peer)]).await;
        let raw_rate = raw_figures.per_sec;
        row(setup, "own", k, "fencelock", &ours_figures, raw_rate);
        row(setup, "own", k, "raw", &raw_figures, raw_rate);
        row(setup, "own", k, "peer", &peer_figures, raw_rate);
    }
    for k in KS.into_iter().filter(|&k| k > 1) {
        let [reference, ours_figures, peer_figures] =
            mirrored([(1, &raw), (k, &ours_one), (k, &peer_one)]).await;
        let base = reference.per_sec;
        row(
            setup,
            "one",
            1,
            &format!("raw, one task (reference for K = {k})"),
            &reference,
            base,
        );
        row(setup, "one", k, "fencelock", &ours_figures, base);
        row(setup, "one", k, "peer", &peer_figures, base);
    }
}

/// Mirrored pairs of halves per figure: 1 unless `FENCELOCK_BENCH_ROUNDS` says more. With one
/// pair, ZooKeeper x1's own-name ratio at one K moved by up to 0.4 between runs of the same
/// code; more pairs average the servers' pauses (JVM collections, compactions) over more
/// alternations, at the cost of a longer run.
fn rounds() -> usize {
    crate::count_from_env("FENCELOCK_BENCH_ROUNDS", 1)
}

/// Each client's figure at its K, from [`rounds`] pairs of halves, each pair taken in mirrored
/// order (a, b, c, then c, b, a), so that a linear drift of the servers charges each alike.
async fn mirrored(runs: [(usize, &Op); 3]) -> [Figures; 3] {
    let mut all: [Stretch; 3] = Default::default();
    for _ in 0..rounds() {
        for (i, (k, op)) in runs.iter().enumerate() {
            all[i] = std::mem::take(&mut all[i]).and(measure(*k, op).await);
        }
        for (i, (k, op)) in runs.iter().enumerate().rev() {
            all[i] = std::mem::take(&mut all[i]).and(measure(*k, op).await);
        }
    }
    all.map(Stretch::figures)
}

pub async fn run(servers: &Servers) {
    println!(
        "\n### Many locks at once ({}; {:?} per figure; ratio: operations per second over the raw requests' at the same K, or for one name over one task's raw loop)\n",
        servers.member0(),
        SPAN * u32::try_from(rounds()).unwrap_or(u32::MAX)
    );
    println!(
        "| setup | names | K tasks | client | ops/s | p50 | p99 | client CPU per op | ops/s / raw |\n|---|---|---|---|---|---|---|---|---|"
    );
    // `FENCELOCK_BENCH_STORES=zookeeper` (or `etcd`) runs one store only, e.g. for a profile.
    let stores =
        std::env::var("FENCELOCK_BENCH_STORES").unwrap_or_else(|_| "etcd,zookeeper".into());
    if stores.contains("etcd") {
        etcd(servers).await;
    }
    if stores.contains("zookeeper") {
        zookeeper(servers).await;
    }
}

fn fencelock_ops(backend: Arc<dyn LockBackend>) -> (Op, Op) {
    let one = Arc::clone(&backend);
    let own: Op = Arc::new(move |i| {
        let backend = Arc::clone(&backend);
        Box::pin(async move {
            let guard = backend.lock(&format!("many{i}")).await.unwrap();
            let _ = guard.release().await.unwrap();
        })
    });
    let shared: Op = Arc::new(move |_| {
        let backend = Arc::clone(&one);
        Box::pin(async move {
            let guard = backend.lock("one").await.unwrap();
            let _ = guard.release().await.unwrap();
        })
    });
    (own, shared)
}

async fn etcd(servers: &Servers) {
    let prefix = Servers::prefix();
    let backend: Arc<dyn LockBackend> = Arc::new(servers.etcd_backend(&prefix).await);
    let (ours, ours_one) = fencelock_ops(backend);
    let client = etcd_client::Client::connect(servers.etcd_endpoint(), None)
        .await
        .unwrap();
    // Leases that outlast the whole run, so that nothing needs keeping alive.
    let lease = client.clone().lease_grant(LEASE, None).await.unwrap().id();
    let raw: Op = {
        let (client, prefix) = (client.clone(), prefix.clone());
        Arc::new(move |i| {
            let (mut client, key) = (client.clone(), format!("{prefix}raw{i}/{lease:x}"));
            Box::pin(async move { etcd_raw(&mut client, &key, lease, unmarked).await })
        })
    };
    let peer: Op = {
        let (client, prefix) = (client.clone(), prefix.clone());
        Arc::new(move |i| {
            let (mut client, name) = (client.clone(), format!("{prefix}peer{i}"));
            Box::pin(async move { etcd_peer(&mut client, name, lease, unmarked).await })
        })
    };
    // One name: each peer task needs a lease of its own (the lock RPC's key is the name plus
    // the lease, so tasks sharing a lease would share the key).
    let mut leases = Vec::new();
    for _ in 0..KS[KS.len() - 1] {
        leases.push(client.clone().lease_grant(LEASE, None).await.unwrap().id());
    }
    let peer_one: Op = {
        let (client, name) = (client.clone(), format!("{prefix}peer-one"));
        Arc::new(move |i| {
            let (mut client, name, lease) = (client.clone(), name.clone(), leases[i]);
            Box::pin(async move { etcd_peer(&mut client, name, lease, unmarked).await })
        })
    };
    table(&servers.label("etcd"), ours, raw, peer, ours_one, peer_one).await;
}

async fn zookeeper(servers: &Servers) {
    let base = Servers::base();
    let backend: Arc<dyn LockBackend> = Arc::new(servers.zk_backend(&base).await);
    let (ours, ours_one) = fencelock_ops(backend);
    let zk = zookeeper_client::Client::connect(&servers.zk_connect())
        .await
        .unwrap();
    let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
    for i in 0..KS[KS.len() - 1] {
        zk.mkdir(&format!("{base}/raw{i}"), &persistent)
            .await
            .unwrap();
    }
    let raw: Op = {
        let (zk, base) = (zk.clone(), base.clone());
        Arc::new(move |i| {
            let (zk, dir) = (zk.clone(), format!("{base}/raw{i}"));
            Box::pin(async move { zk_raw(&zk, &dir, unmarked).await })
        })
    };
    let peer: Op = {
        let (zk, base) = (zk.clone(), base.clone());
        Arc::new(move |i| {
            let (zk, dir) = (zk.clone(), format!("{base}/peer{i}"));
            Box::pin(async move { zk_peer(&zk, &dir, unmarked).await })
        })
    };
    let peer_one: Op = {
        let (zk, dir) = (zk.clone(), format!("{base}/peer-one"));
        Arc::new(move |_| {
            let (zk, dir) = (zk.clone(), dir.clone());
            Box::pin(async move { zk_peer(&zk, &dir, unmarked).await })
        })
    };
    table(
        &servers.label("zookeeper"),
        ours,
        raw,
        peer,
        ours_one,
        peer_one,
    )
    .await;
}

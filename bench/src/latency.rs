//! Uncontended acquire + release, against the same requests sent raw and against the peer
//! clients' own locks.
//!
//! The three run interleaved, round by round, in an order shuffled each round, after a
//! warm-up: a first version ran them one after the other and charged fencelock, which ran first,
//! with the servers' own warm-up (ZooKeeper's JIT above all), which made it look 1.8x slower than
//! the raw requests when it was not. A second rotated the first of each round, which put the
//! raw requests behind fencelock in two rounds of three and the peer in one: whatever an op
//! leaves running (fencelock's own-entry watch, the peer's background delete) landed on one
//! client more than the others. Shuffled, each op follows each other one equally often on
//! average.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use etcd_client::{
    Compare, CompareOp, GetOptions, LockOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
};
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
            granted();
            let _ = guard.release().await.unwrap();
        })
    })
}

/// p50 and p99 of each op, every op once per round, in an order shuffled each round (shared
/// with `semaphore`).
pub async fn interleaved(ops: Vec<Op<'_>>) -> Vec<(Duration, Duration)> {
    let figures = interleaved_split(ops).await;
    figures.into_iter().map(|f| (f.p50, f.p99)).collect()
}

/// When the running op was granted (set by [`granted`]): splits each op into its acquire and
/// its release. The ops run one at a time, so one mark serves them all.
static GRANTED: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);

/// Marks the grant of the op running now (the raw and peer ops, shared with `many`, take it
/// as an argument: `many`'s tasks run at once and pass [`unmarked`]).
fn granted() {
    *GRANTED.lock().unwrap() = Some(Instant::now());
    if let Some(hold) = HOLD.get() {
        // Blocks the caller's thread: what a held lock costs the client is its other threads'
        // work (the `cpu` profile counts instructions, not time).
        std::thread::sleep(*hold);
    }
}

/// How long each op holds its lock before the release (`cpu` with `FENCELOCK_BENCH_HOLD_MS`);
/// not at all unless set.
pub static HOLD: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();

/// A fixed-seed xorshift shuffle: the same orders in every run.
struct Shuffle(u64);

impl Shuffle {
    fn apply(&mut self, order: &mut [usize]) {
        for i in (1..order.len()).rev() {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            order.swap(i, (self.0 % (i as u64 + 1)) as usize);
        }
    }
}

/// No mark: for ops that run several at once.
pub fn unmarked() {}

/// One op's figures: p50 and p99 of the whole, and p50 of its acquire (up to the grant) and
/// of its release (from the grant) when it marked its grant.
struct Figures {
    p50: Duration,
    p99: Duration,
    halves: Option<(Duration, Duration)>,
}

async fn interleaved_split(mut ops: Vec<Op<'_>>) -> Vec<Figures> {
    let count = ops.len();
    let mut samples = vec![Vec::with_capacity(ROUNDS); count];
    let mut halves = vec![(Vec::with_capacity(ROUNDS), Vec::with_capacity(ROUNDS)); count];
    let mut order: Vec<usize> = (0..count).collect();
    let mut shuffle = Shuffle(0x9e37_79b9_7f4a_7c15);
    for round in 0..WARMUP + ROUNDS {
        shuffle.apply(&mut order);
        for &i in &order {
            *GRANTED.lock().unwrap() = None;
            let start = Instant::now();
            ops[i]().await;
            let end = Instant::now();
            if round >= WARMUP {
                samples[i].push(end - start);
                if let Some(at) = *GRANTED.lock().unwrap() {
                    halves[i].0.push(at - start);
                    halves[i].1.push(end - at);
                }
            }
        }
    }
    samples
        .iter_mut()
        .zip(&mut halves)
        .map(|(s, (acquire, release))| {
            let (p50, p99) = percentiles(s);
            let halves = (acquire.len() == s.len())
                .then(|| (percentiles(acquire).0, percentiles(release).0));
            Figures { p50, p99, halves }
        })
        .collect()
}

fn rows<const N: usize>(label: &str, what: [&str; N], figures: &[Figures]) {
    let (raw, peer, same) = (&figures[1], &figures[2], figures.get(3));
    let half = |f: &Figures, i: usize| -> Option<Duration> {
        f.halves.map(|h| if i == 0 { h.0 } else { h.1 })
    };
    for (what, f) in what.iter().zip(figures) {
        let [acquire, release] = [0, 1].map(|i| match (half(f, i), half(raw, i)) {
            (Some(ours), Some(limit)) => format!("{:.0} µs ({})", us(ours), ratio(ours, limit)),
            (Some(ours), None) => format!("{:.0} µs", us(ours)),
            _ => "-".into(),
        });
        println!(
            "| {label} | {what} | {} | {} | {acquire} | {release} | {} | {} | {} |",
            ms(f.p50),
            ms(f.p99),
            ratio(f.p50, raw.p50),
            ratio(f.p50, peer.p50),
            same.map_or_else(|| "-".into(), |same| ratio(f.p50, same.p50))
        );
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

pub async fn run(servers: &Servers) {
    println!(
        "\n### Uncontended acquire + release ({}; {ROUNDS} rounds after {WARMUP} warm-up, the clients interleaved)\n",
        servers.member0()
    );
    println!(
        "| setup | client | p50 | p99 | acquire p50 (/ raw) | release p50 (/ raw) | p50 / raw limit | p50 / peer | p50 / fencelock's requests sent raw |\n|---|---|---|---|---|---|---|---|---|"
    );
    etcd(servers).await;
    zookeeper(servers).await;
}

async fn etcd(servers: &Servers) {
    let clients = EtcdClients::start(servers).await;
    let figures = interleaved_split(clients.ops()).await;
    rows(
        &servers.label("etcd"),
        [
            "fencelock",
            "raw: 2 Txns",
            "peer: etcd-client lock/unlock RPCs",
            "fencelock's requests sent raw: 2 Txns",
        ],
        &figures,
    );
}

async fn zookeeper(servers: &Servers) {
    let clients = ZkClients::start(servers).await;
    let figures = interleaved_split(clients.ops()).await;
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
    same: SameRequests,
}

/// Where [`etcd_same`] queues: its own name, laid out as fencelock lays out a lock's.
pub struct SameRequests {
    prefix: String,
    key: String,
    checkpoint: String,
    /// A value of fencelock's form and length: the attempt's time and nonce, and the owner.
    value: String,
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
            same: SameRequests {
                prefix: format!("{prefix}same/"),
                key: format!("{prefix}same/{lease:x}"),
                checkpoint: format!("{prefix}.state/same/__checkpoint"),
                value: format!(
                    "1765000000000-0123456789abcdef {}",
                    fencelock::Owner::current().encode()
                ),
            },
        }
    }

    /// fencelock, raw, peer, and fencelock's own requests sent raw.
    pub fn ops(&self) -> Vec<Op<'_>> {
        let lease = self.lease;
        // The operations run one after another: the lock is never contended.
        let raw: Op = Box::new(move || {
            Box::pin(async move {
                let mut client = self.client.lock().await;
                etcd_raw(&mut client, &self.raw_key, lease, granted).await;
            })
        });
        let peer: Op = Box::new(move || {
            Box::pin(async move {
                let mut client = self.client.lock().await;
                etcd_peer(&mut client, self.peer_name.clone(), lease, granted).await;
            })
        });
        let same: Op = Box::new(move || {
            Box::pin(async move {
                let mut client = self.client.lock().await;
                etcd_same(&mut client, &self.same, lease).await;
            })
        });
        vec![fencelock_op(&self.backend), raw, peer, same]
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
        let raw: Op = Box::new(move || Box::pin(zk_raw(&self.zk, &self.dir, granted)));
        let peer: Op = Box::new(move || Box::pin(zk_peer(&self.zk, &self.peer_dir, granted)));
        vec![fencelock_op(&self.backend), raw, peer]
    }
}

/// The raw etcd lock (shared with `many`): a put of `key` under `lease` if it is absent, then a
/// delete of that very key (compared on its create revision); `granted` between the two.
pub async fn etcd_raw(client: &mut etcd_client::Client, key: &str, lease: i64, granted: fn()) {
    let put = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key,
            "",
            Some(PutOptions::new().with_lease(lease)),
        )]);
    let rev = client.txn(put).await.unwrap().header().unwrap().revision();
    granted();
    let delete = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, rev)])
        .and_then([TxnOp::delete(key, None)]);
    client.txn(delete).await.unwrap();
}

/// The requests fencelock's etcd lock sends for an uncontended acquire + release, sent raw:
/// the put of its key under `lease` (with a value as long as fencelock's) in one Txn with the
/// Range of the queue's first key and the read of the checkpoint, then the delete compared on
/// the key's create revision. Against [`etcd_raw`], what fencelock's requests cost the server;
/// against fencelock, what its client does besides sending them.
pub async fn etcd_same(client: &mut etcd_client::Client, at: &SameRequests, lease: i64) {
    let first = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1);
    let put = Txn::new()
        .when([Compare::create_revision(
            at.key.as_str(),
            CompareOp::Equal,
            0,
        )])
        .and_then([
            TxnOp::put(
                at.key.as_str(),
                at.value.as_str(),
                Some(PutOptions::new().with_lease(lease)),
            ),
            TxnOp::get(at.prefix.as_str(), Some(first)),
            TxnOp::get(at.checkpoint.as_str(), None),
        ])
        .or_else([TxnOp::get(at.key.as_str(), None)]);
    let resp = client.txn(put).await.unwrap();
    assert!(resp.succeeded(), "a leftover key at {}", at.key);
    let created = resp.header().unwrap().revision();
    granted();
    let delete = Txn::new()
        .when([Compare::create_revision(
            at.key.as_str(),
            CompareOp::Equal,
            created,
        )])
        .and_then([TxnOp::delete(at.key.as_str(), None)]);
    client.txn(delete).await.unwrap();
}

/// The etcd peer (shared with `many`): etcd-client's lock RPC on `name` under `lease`, then
/// unlock; `granted` between the two.
pub async fn etcd_peer(client: &mut etcd_client::Client, name: String, lease: i64, granted: fn()) {
    let options = LockOptions::new().with_lease(lease);
    let locked = client.lock(name, Some(options)).await.unwrap();
    granted();
    client.unlock(locked.key().to_vec()).await.unwrap();
}

/// The raw ZooKeeper lock (shared with `many`): a sequential node in `dir`, the listing that
/// finds it first, its delete; `granted` before the delete.
pub async fn zk_raw(zk: &zookeeper_client::Client, dir: &str, granted: fn()) {
    let mode = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    let (_, seq) = zk.create(&format!("{dir}/n-"), b"", &mode).await.unwrap();
    zk.list_children(dir).await.unwrap();
    granted();
    zk.delete(&format!("{dir}/n-{seq}"), None).await.unwrap();
}

/// The ZooKeeper peer (shared with `many`): zookeeper-client's `Client::lock` in `dir`, then
/// the delete of its node; `granted` between the two.
pub async fn zk_peer(zk: &zookeeper_client::Client, dir: &str, granted: fn()) {
    let options = ZkLockOptions::new(Acls::anyone_all())
        .with_ancestor_options(CreateMode::Persistent.with_acls(Acls::anyone_all()))
        .unwrap();
    let prefix = LockPrefix::new_curator(dir, "lock-").unwrap();
    let lock = zk.lock(prefix, b"", options).await.unwrap();
    granted();
    // Its drop deletes in the background; delete here to time a synchronous release.
    zk.delete(lock.lock_path(), None).await.unwrap();
}

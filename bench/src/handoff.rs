//! Contended handoff: N contenders (separate sessions) on one lock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{LockOptions, WatchOptions};
use fencelock::{LockBackend, LockBackendExt};
use fencelock_testsupport::four_letter;
use zookeeper_client::{Acls, CreateMode, LockOptions as ZkLockOptions, LockPrefix};

use crate::servers::Servers;
use crate::stats::{cpu_time, ms, percentiles, ratio};

/// Handoffs per row; `FENCELOCK_BENCH_HANDOFFS` sets another count (more for the CPU column,
/// which counts in 10 ms ticks).
fn handoffs_per_row() -> usize {
    std::env::var("FENCELOCK_BENCH_HANDOFFS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(150)
}

/// Notifications sent before the limit's samples: ZooKeeper's JVM kept getting faster for a few
/// hundred of them.
const WARMUP: usize = 300;

/// One point of the plot: setup, contenders, p50 handoff latency.
pub type Point = (String, usize, Duration);

enum Mark {
    Acquired(Instant),
    Releasing(Instant),
}

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// What a contender runs between its grant and its release.
type Held = Box<dyn FnOnce() + Send>;

/// One contender's turn: acquire the lock, run `Held`, release.
type Lock = Arc<dyn Fn(Held) -> BoxFuture<()> + Send + Sync>;

/// fencelock contenders: each a backend instance of its own (its own session).
fn fencelock_locks(backends: Vec<Arc<dyn LockBackend>>) -> Vec<Lock> {
    backends
        .into_iter()
        .map(|backend| -> Lock {
            Arc::new(move |held: Held| {
                let backend = Arc::clone(&backend);
                Box::pin(async move {
                    let guard = backend.lock("handoff").await.unwrap();
                    held();
                    let _ = guard.release().await.unwrap();
                })
            })
        })
        .collect()
}

/// etcd-client's lock RPC contenders: each its own connection and lease (long enough for the
/// run, so nothing keeps it alive).
async fn etcd_peer_locks(servers: &Servers, n: usize) -> Vec<Lock> {
    let name = format!("{}peer-handoff", Servers::prefix());
    let mut locks: Vec<Lock> = Vec::with_capacity(n);
    for _ in 0..n {
        let client = etcd_client::Client::connect(servers.etcd_endpoint(), None)
            .await
            .unwrap();
        let lease = client.clone().lease_grant(600, None).await.unwrap().id();
        let name = name.clone();
        locks.push(Arc::new(move |held: Held| {
            let (mut client, name) = (client.clone(), name.clone());
            Box::pin(async move {
                let options = LockOptions::new().with_lease(lease);
                let key = client
                    .lock(name, Some(options))
                    .await
                    .unwrap()
                    .key()
                    .to_vec();
                held();
                client.unlock(key).await.unwrap();
            })
        }));
    }
    locks
}

/// zookeeper-client's `Client::lock` contenders (Curator's node names): each its own session.
async fn zk_peer_locks(servers: &Servers, n: usize) -> Vec<Lock> {
    let dir = format!("{}/peer-handoff", Servers::base());
    let mut locks: Vec<Lock> = Vec::with_capacity(n);
    for _ in 0..n {
        let zk = zookeeper_client::Client::connect(&servers.zk_connect())
            .await
            .unwrap();
        let dir = dir.clone();
        locks.push(Arc::new(move |held: Held| {
            let (zk, dir) = (zk.clone(), dir.clone());
            Box::pin(async move {
                let options = ZkLockOptions::new(Acls::anyone_all())
                    .with_ancestor_options(CreateMode::Persistent.with_acls(Acls::anyone_all()))
                    .unwrap();
                let prefix = LockPrefix::new_curator(&dir, "lock-").unwrap();
                let lock = zk.lock(prefix, b"", options).await.unwrap();
                held();
                // Its drop deletes in the background; delete here for a synchronous release.
                zk.delete(lock.lock_path(), None).await.unwrap();
                drop(lock);
            })
        }));
    }
    locks
}

/// Curator `InterProcessMutex` contenders: `n` threads of one JVM, each with a client of its
/// own (its own session), after `WARMUP` grants to warm the JIT; the JVM measures as
/// [`contend`] does (release call to the next grant) and reports handoffs/s, p50 and p99. The
/// server requests are counted around the measured run (the warm-up included).
async fn curator_contend(servers: &Servers, n: usize, count: impl Fn() -> u64) -> Outcome {
    // Compiled once per run, not per row.
    static CLASSES: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    let classes = CLASSES.get_or_init(|| {
        let java = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("java");
        fencelock_testsupport::compile_java(&[java.join("CuratorHandoff.java")])
    });
    let path = format!("{}/curator-handoff-{n}", Servers::base());
    let args = [
        "CuratorHandoff".to_owned(),
        servers.zk_connect(),
        path,
        n.to_string(),
        handoffs_per_row().to_string(),
        WARMUP.to_string(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut jvm = fencelock_testsupport::JavaProgram::start(classes, &args);
    jvm.expect("READY", Duration::from_secs(60)).await;
    let before = count();
    jvm.send("go").await;
    let result = jvm.expect("RESULT", Duration::from_secs(120)).await;
    let after = count();
    let words: Vec<f64> = result
        .split_whitespace()
        .skip(1)
        .map(|w| w.parse().unwrap())
        .collect();
    let handoffs = words[3];
    Outcome {
        per_second: words[0],
        p50: Duration::from_nanos(words[1] as u64),
        p99: Duration::from_nanos(words[2] as u64),
        requests_per_handoff: (after - before) as f64 / (handoffs + WARMUP as f64),
    }
}

/// One row's measurements.
struct Outcome {
    per_second: f64,
    p50: Duration,
    p99: Duration,
    requests_per_handoff: f64,
}

async fn contend(locks: Vec<Lock>) -> (Vec<Duration>, Duration) {
    let total = handoffs_per_row();
    let marks = Arc::new(Mutex::new(Vec::new()));
    let grants = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = locks
        .into_iter()
        .map(|lock| {
            let (marks, grants) = (Arc::clone(&marks), Arc::clone(&grants));
            tokio::spawn(async move {
                // Bounded by `handoffs_per_row()` grants in all; then each task leaves at its
                // turn.
                loop {
                    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
                    let held: Held = {
                        let (marks, grants, done) =
                            (Arc::clone(&marks), Arc::clone(&grants), Arc::clone(&done));
                        Box::new(move || {
                            marks.lock().unwrap().push(Mark::Acquired(Instant::now()));
                            let last = grants.fetch_add(1, Ordering::SeqCst) >= total;
                            done.store(last, Ordering::SeqCst);
                            marks.lock().unwrap().push(Mark::Releasing(Instant::now()));
                        })
                    };
                    lock(held).await;
                    if done.load(Ordering::SeqCst) {
                        return;
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = started.elapsed();
    let marks = marks.lock().unwrap();
    let mut latencies = Vec::new();
    let mut releasing = None;
    for mark in marks.iter() {
        match mark {
            Mark::Releasing(at) => releasing = Some(*at),
            Mark::Acquired(at) => {
                if let Some(from) = releasing.take() {
                    latencies.push(at.saturating_duration_since(from));
                }
            }
        }
    }
    (latencies, elapsed)
}

/// The limits of one handoff, as p50s: one write plus one notification; and the same plus one
/// read by the notified client, which is what a new holder must spend before it may act (no
/// older contender left, its own key or node still there, the checkpoint).
#[derive(Clone, Copy)]
struct Limits {
    notify: Duration,
    notify_read: Duration,
}

fn limits(notify: &mut [Duration], notify_read: &mut [Duration]) -> Limits {
    Limits {
        notify: percentiles(notify).0,
        notify_read: percentiles(notify_read).0,
    }
}

/// etcd: one client puts, another is told by its watch (then reads the key).
async fn etcd_notify(servers: &Servers) -> Limits {
    let endpoints = servers.etcd_endpoint();
    let mut writer = etcd_client::Client::connect(&endpoints, None)
        .await
        .unwrap();
    let mut watcher = etcd_client::Client::connect(&endpoints, None)
        .await
        .unwrap();
    let key = format!("{}notify", Servers::prefix());
    let (mut notify, mut notify_read) = (Vec::new(), Vec::new());
    let mut stream = watcher
        .watch(key.as_str(), Some(WatchOptions::new()))
        .await
        .unwrap();
    let _ = stream.message().await; // the created response
    for i in 0..(WARMUP + 100) {
        let start = Instant::now();
        writer.put(key.as_str(), i.to_string(), None).await.unwrap();
        loop {
            let resp = stream.message().await.unwrap().unwrap();
            if !resp.events().is_empty() {
                break;
            }
        }
        let notified = start.elapsed();
        watcher.get(key.as_str(), None).await.unwrap();
        if i >= WARMUP {
            notify.push(notified);
            notify_read.push(start.elapsed());
        }
    }
    limits(&mut notify, &mut notify_read)
}

/// ZooKeeper: one client creates, another is told by its exists-watch (then reads the node).
async fn zk_notify(servers: &Servers) -> Limits {
    let connect = servers.zk_connect();
    let writer = zookeeper_client::Client::connect(&connect).await.unwrap();
    let watcher = zookeeper_client::Client::connect(&connect).await.unwrap();
    let base = Servers::base();
    writer
        .mkdir(&base, &CreateMode::Persistent.with_acls(Acls::anyone_all()))
        .await
        .unwrap();
    let (mut notify, mut notify_read) = (Vec::new(), Vec::new());
    for i in 0..(WARMUP + 100) {
        let path = format!("{base}/n{i}");
        let (_, watch) = watcher.check_and_watch_stat(&path).await.unwrap();
        let start = Instant::now();
        writer
            .create(
                &path,
                b"",
                &CreateMode::Persistent.with_acls(Acls::anyone_all()),
            )
            .await
            .unwrap();
        watch.changed().await;
        let notified = start.elapsed();
        watcher.get_data(&path).await.unwrap();
        if i >= WARMUP {
            notify.push(notified);
            notify_read.push(start.elapsed());
        }
    }
    limits(&mut notify, &mut notify_read)
}

fn zk_received(servers: &Servers) -> u64 {
    (0..servers.size)
        .map(|i| {
            four_letter(servers.zk.members[i].client_port, "srvr")
                .lines()
                .find_map(|l| l.strip_prefix("Received: "))
                .and_then(|n| n.trim().parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

pub async fn run(servers: &Servers) -> Vec<Point> {
    println!(
        "\n### Contended handoff ({} handoffs; latency = holder's release call to the next holder's acquire returning)\n",
        handoffs_per_row()
    );
    println!("Limits, measured just before each row: A = one write + one notification; B = A + one read by the notified client, the least a new holder can spend.\n");
    println!("Client CPU per handoff: this process's user + system time over the row (10 ms ticks; `FENCELOCK_BENCH_HANDOFFS=2000` for a finer figure); Curator's runs in its JVM, not counted.\n");
    println!("| setup | contenders | client | handoffs/s | p50 | p99 | A | p50 / A | B | p50 / B | server requests per handoff | client CPU per handoff |\n|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut points = Vec::new();
    // `FENCELOCK_BENCH_STORES=zookeeper` (or `etcd`) runs one store only, and
    // `FENCELOCK_BENCH_CLIENTS=fencelock` (or `peer`, `curator`) one client, e.g. for a profile.
    let stores =
        std::env::var("FENCELOCK_BENCH_STORES").unwrap_or_else(|_| "etcd,zookeeper".into());
    let clients = std::env::var("FENCELOCK_BENCH_CLIENTS")
        .unwrap_or_else(|_| "fencelock,peer,curator".into());
    // In the order given: a store's rows share its servers, and ZooKeeper's JVM is still
    // getting faster during the first client's rows, so `peer,fencelock` is the check that a
    // difference is not the order's.
    let rows = ["etcd", "zookeeper"].into_iter().flat_map(|backend| {
        clients
            .split(',')
            .map(str::trim)
            .filter(|client| {
                ["fencelock", "peer"].contains(client)
                    || (*client == "curator" && backend == "zookeeper")
            })
            .map(move |client| (backend, client))
            .collect::<Vec<_>>()
    });
    for (backend, client) in rows {
        if !stores.contains(backend) {
            continue;
        }
        let label = servers.label(backend);
        for n in [2usize, 8, 32] {
            if client == "curator" {
                let limit = zk_notify(servers).await;
                let row = curator_contend(servers, n, || zk_received(servers)).await;
                println!(
                    "| {label} | {n} | {client} | {:.0} | {} | {} | {} | {} | {} | {} | {:.1} requests | - |",
                    row.per_second,
                    ms(row.p50),
                    ms(row.p99),
                    ms(limit.notify),
                    ratio(row.p50, limit.notify),
                    ms(limit.notify_read),
                    ratio(row.p50, limit.notify_read),
                    row.requests_per_handoff
                );
                continue;
            }
            let locks = match (backend, client) {
                (_, "fencelock") => fencelock_locks(servers.contenders(backend, n).await),
                ("etcd", _) => etcd_peer_locks(servers, n).await,
                _ => zk_peer_locks(servers, n).await,
            };
            let count = |s: &Servers| -> (u64, u64, u64, u64) {
                if backend == "etcd" {
                    let sum = |m: &str| (0..s.size).map(|i| s.etcd.rpc_count(i, m)).sum();
                    let events = (0..s.size)
                        .map(|i| s.etcd.metric(i, "etcd_debugging_mvcc_events_total") as u64)
                        .sum();
                    (sum("Watch"), sum("Range"), sum("Txn"), events)
                } else {
                    (0, 0, zk_received(s), 0)
                }
            };
            // Measured next to each run: on this noisy machine a limit taken once per backend
            // drifted by up to 4x between runs.
            let limit = if backend == "etcd" {
                etcd_notify(servers).await
            } else {
                zk_notify(servers).await
            };
            let (before, cpu) = (count(servers), cpu_time());
            let (mut latencies, elapsed) = contend(locks).await;
            let cpu = cpu_time().saturating_sub(cpu);
            let after = count(servers);
            let handoffs = latencies.len().max(1) as f64;
            let (p50, p99) = percentiles(&mut latencies);
            let per = |a: u64, b: u64| (a - b) as f64 / handoffs;
            let requests = if backend == "etcd" {
                format!(
                    "{:.1} watch events sent; {:.1} watch registrations, {:.1} range, {:.1} txn",
                    per(after.3, before.3),
                    per(after.0, before.0),
                    per(after.1, before.1),
                    per(after.2, before.2)
                )
            } else {
                format!("{:.1} requests", per(after.2, before.2))
            };
            println!(
                "| {label} | {n} | {client} | {:.0} | {} | {} | {} | {} | {} | {} | {requests} | {:.0} µs |",
                handoffs / elapsed.as_secs_f64(),
                ms(p50),
                ms(p99),
                ms(limit.notify),
                ratio(p50, limit.notify),
                ms(limit.notify_read),
                ratio(p50, limit.notify_read),
                cpu.as_secs_f64() * 1e6 / handoffs
            );
            if client == "fencelock" {
                points.push((label.clone(), n, p50));
            }
        }
    }
    points
}
